//! The scalar oracle of the gradient statistics pass, and the definition of its summation
//! order, which every implementation follows so that results are bitwise reproducible:
//!
//! - element i's contribution is s_i = f64(g_i * scale)^2, with g_i * scale rounded to
//!   f32 (it is the value the optimizer will use) and the square exact in f64;
//! - the slice is cut into blocks of `BLOCK` elements from its start; inside a block,
//!   accumulator lane l (of 16) sums, in index order, the s_i with (i - block start) % 16
//!   == l, from 0.0; the 16 lanes are folded by `simd::reduce16` (`a[l] += a[l + w]` for
//!   w = 8, 4, 2, 1);
//! - the block sums are added in block order, from 0.0.
//!
//! Threads get whole blocks, SIMD levels fill the 16 lanes with 16 or 8 or 1 wide
//! registers: the order above is the same for all of them. Error: each f64 addition is
//! exact to 2^-53 relative, so the result is within n * 2^-53 * sum of the exact sum of
//! the rounded f32 values (the tests check a tighter, measured bound against a
//! compensated sum).

#[cfg(test)]
use crate::simd::{reduce16, SimdFloat};

/// Elements per block (a multiple of 16).
pub const BLOCK: usize = 4096;

#[cfg(test)] // the oracle of the tests; production code runs the fast paths
/// Sum of squares of `grad[i] * scale` in the order stated above. The value is +inf or
/// NaN exactly when some scaled element is (a finite f32 squared is at most ~1.2e77 and
/// 2^64 of those stay finite in f64), which is how non-finite gradients are detected.
pub(crate) fn sum_squares<G: SimdFloat>(grad: &[G], scale: f32) -> f64 {
    let mut total = 0.0f64;
    for block in grad.chunks(BLOCK) {
        let mut acc = [0.0f64; 16];
        for (i, g) in block.iter().enumerate() {
            let x = (g.to_f32() * scale) as f64;
            acc[i % 16] += x * x;
        }
        total += reduce16(acc);
    }
    total
}

/// Threads of the GPU's device-side finish (`gradstats_finish` in gradstats.cu).
pub const FINISH_THREADS: usize = 256;

/// The GPU's device-side total of block sums: lane l adds blocks l, l + 256, ... in order
/// from 0.0, then the lanes fold as `a[l] += a[l + w]` for w = 128, 64, .., 1. Equal to the
/// serial block-order total to f64 rounding; this is the twin the GPU check compares with.
pub fn finish_tree(sums: &[f64]) -> f64 {
    let mut acc = [0.0f64; FINISH_THREADS];
    for (b, s) in sums.iter().enumerate() {
        acc[b % FINISH_THREADS] += s;
    }
    let mut w = FINISH_THREADS / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

#[cfg(test)]
mod finish_tests {
    use super::*;

    #[test]
    fn the_device_side_total_tracks_the_serial_one() {
        let sums: Vec<f64> = (0..1000)
            .map(|i| (i as f64 * 0.37).sin().abs() * 1e3)
            .collect();
        let serial = sums.iter().fold(0.0, |a, s| a + s);
        let tree = finish_tree(&sums);
        assert!(
            (tree - serial).abs() <= 1e-13 * serial,
            "{tree} vs {serial}"
        );
        assert_eq!(finish_tree(&[]), 0.0);
        assert_eq!(finish_tree(&[2.5]), 2.5);
    }
}
