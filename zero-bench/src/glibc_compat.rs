//! Keeps the binary within glibc 2.34, the GPU machines' (scripts/carry-check.sh checks).
//!
//! glibc 2.35 gave `hypotf` a new symbol version, so a binary linked on a newer glibc
//! needs `hypotf@GLIBC_2.35` (plotters' dashed lines call `f32::hypot`) and does not
//! start on an older one. Defining the symbol in the executable resolves those calls
//! here at link time, and libm's is not referenced. Being the executable's, it is also
//! the `hypotf` of any library in the process: it computes what glibc 2.35's own does.

/// `sqrt(x² + y²)` for f32, computed in f64 and rounded once (no overflow or underflow
/// for any f32), as glibc 2.35's `hypotf`. IEEE's special case: an infinity wins over a
/// NaN.
#[no_mangle]
pub extern "C" fn hypotf(x: f32, y: f32) -> f32 {
    if x.is_infinite() || y.is_infinite() {
        return f32::INFINITY;
    }
    let (x, y) = (f64::from(x), f64::from(y));
    (x * x + y * y).sqrt() as f32
}

#[cfg(test)]
mod tests {
    use super::hypotf;

    #[test]
    fn hypotf_matches_the_definition_and_the_special_cases() {
        assert_eq!(hypotf(3.0, 4.0), 5.0);
        assert_eq!(hypotf(-3.0, 0.0), 3.0);
        assert_eq!(hypotf(f32::MAX, f32::MAX), f32::INFINITY);
        // x² underflows in f32, not in f64.
        let tiny = hypotf(1e-30, 1e-30);
        assert!(
            (f64::from(tiny) / (2f64.sqrt() * 1e-30) - 1.0).abs() < 1e-6,
            "{tiny}"
        );
        assert_eq!(hypotf(f32::NEG_INFINITY, f32::NAN), f32::INFINITY);
        assert!(hypotf(1.0, f32::NAN).is_nan());
    }
}
