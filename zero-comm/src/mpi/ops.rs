//! MPI datatypes and reduction ops for our element types.
//!
//! MPI has no 16-bit float: bf16/f16 travel as MPI_UINT16_T (moves are bit-exact), and
//! their reductions are user-defined ops that convert each pair to f32, combine, and round
//! back to the half type (round-to-nearest-even, `half`'s conversion). MPI's built-in SUM
//! on u16 would add bit patterns, so it is never used for halves.

use crate::communicator::ReduceOp;
use crate::DType;
use half::{bf16, f16};
use mpi::ffi;
use std::os::raw::{c_int, c_void};
use std::sync::OnceLock;
use zero_kernels::{cast, Exec, Float};

/// The MPI datatype that carries `dtype`.
pub(crate) fn datatype(dtype: DType) -> ffi::MPI_Datatype {
    // SAFETY: reading MPI's predefined handles (initialised by the MPI library at load).
    unsafe {
        match dtype {
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::BF16 | DType::F16 => ffi::RSMPI_UINT16_T,
            DType::U8 => ffi::RSMPI_UINT8_T,
            DType::U32 => ffi::RSMPI_UINT32_T,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
        }
    }
}

/// MPI's two operand arrays as slices of `H`: `None` when there is nothing to combine.
///
/// # Safety
/// MPI calls back with `len` elements at both addresses (null allowed when `len` is 0).
unsafe fn operands<'a, H>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
) -> Option<(&'a [H], &'a mut [H])> {
    let n = if len.is_null() { 0 } else { *len };
    if n <= 0 || invec.is_null() || inoutvec.is_null() {
        return None;
    }
    let n = n as usize;
    Some((
        std::slice::from_raw_parts(invec as *const H, n),
        std::slice::from_raw_parts_mut(inoutvec as *mut H, n),
    ))
}

/// Combine `invec` into `inoutvec` element-wise through f32, for a half type `H`.
///
/// # Safety
/// As [`operands`].
unsafe fn combine<H: Copy>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    to: fn(H) -> f32,
    from: fn(f32) -> H,
    f: fn(f32, f32) -> f32,
) {
    if let Some((a, b)) = operands::<H>(invec, inoutvec, len) {
        for (x, y) in a.iter().zip(b.iter_mut()) {
            *y = from(f(to(*x), to(*y)));
        }
    }
}

/// `sum[i] = round(sum[i] + own[i])` through f32 for `n` elements of `H`: the vectorised
/// accumulation of `zero-kernels/src/cast/mod.rs` at this CPU's level, for the half types'
/// MPI sums and the ring's additions (`ring.rs`). Scalar conversions made the sums 6% of
/// a stage-3 step at V=50257. `x + y` and `y + x` are the same bits.
///
/// # Safety
/// `sum` and `own` address `n` elements each (`sum` writable, not overlapping `own`).
pub(super) unsafe fn add_into<H: Float>(sum: *mut H, own: *const H, n: usize) {
    static EXEC: OnceLock<Exec> = OnceLock::new();
    let summed = cast::accumulate_rounded(
        EXEC.get_or_init(Exec::default),
        std::slice::from_raw_parts_mut(sum, n),
        std::slice::from_raw_parts(own, n),
    );
    // Cannot fail: both slices are `n` long, built just above. (Nowhere to send an error
    // either: MPI's user-op callback returns nothing.)
    assert!(summed.is_ok(), "{summed:?}");
}

/// MPI's sum callback for a half type `H`: `inoutvec += invec` ([`add_into`]).
///
/// # Safety
/// As [`operands`].
unsafe fn sum_halves<H: Float>(invec: *mut c_void, inoutvec: *mut c_void, len: *mut c_int) {
    if let Some((a, b)) = operands::<H>(invec, inoutvec, len) {
        add_into(b.as_mut_ptr(), a.as_ptr(), a.len());
    }
}

// IEEE max that propagates NaN like `f32::max` does not; a NaN gradient must stay NaN so
// the overflow check sees it.
fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

unsafe extern "C" fn sum_bf16(
    a: *mut c_void,
    b: *mut c_void,
    n: *mut c_int,
    _: *mut ffi::MPI_Datatype,
) {
    sum_halves::<bf16>(a, b, n)
}
unsafe extern "C" fn max_bf16(
    a: *mut c_void,
    b: *mut c_void,
    n: *mut c_int,
    _: *mut ffi::MPI_Datatype,
) {
    combine::<bf16>(a, b, n, bf16::to_f32, bf16::from_f32, max_nan)
}
unsafe extern "C" fn sum_f16(
    a: *mut c_void,
    b: *mut c_void,
    n: *mut c_int,
    _: *mut ffi::MPI_Datatype,
) {
    sum_halves::<f16>(a, b, n)
}
unsafe extern "C" fn max_f16(
    a: *mut c_void,
    b: *mut c_void,
    n: *mut c_int,
    _: *mut ffi::MPI_Datatype,
) {
    combine::<f16>(a, b, n, f16::to_f32, f16::from_f32, max_nan)
}

/// The four user-defined half ops, created once after MPI_Init and freed by MPI_Finalize.
pub(crate) struct HalfOps {
    sum_bf16: ffi::MPI_Op,
    max_bf16: ffi::MPI_Op,
    sum_f16: ffi::MPI_Op,
    max_f16: ffi::MPI_Op,
}

impl HalfOps {
    /// Create the ops (MPI must be initialised). Returns the MPI error code on failure.
    pub(crate) fn create() -> Result<Self, c_int> {
        fn make(f: ffi::MPI_User_function) -> Result<ffi::MPI_Op, c_int> {
            let mut op = std::mem::MaybeUninit::<ffi::MPI_Op>::uninit();
            // SAFETY: MPI_Op_create writes one handle; the function pointers are
            // `extern "C"` with the MPI_User_function signature and never unwind.
            let rc = unsafe { ffi::MPI_Op_create(f, 1, op.as_mut_ptr()) };
            if rc != 0 {
                return Err(rc);
            }
            // SAFETY: written by MPI_Op_create on success.
            Ok(unsafe { op.assume_init() })
        }
        Ok(HalfOps {
            sum_bf16: make(Some(sum_bf16))?,
            max_bf16: make(Some(max_bf16))?,
            sum_f16: make(Some(sum_f16))?,
            max_f16: make(Some(max_f16))?,
        })
    }

    /// The MPI op for `op` on `dtype` (halves: ours; others: MPI's built-in).
    pub(crate) fn op(&self, op: ReduceOp, dtype: DType) -> ffi::MPI_Op {
        match (dtype, op) {
            (DType::BF16, ReduceOp::Sum) => self.sum_bf16,
            (DType::BF16, ReduceOp::Max) => self.max_bf16,
            (DType::F16, ReduceOp::Sum) => self.sum_f16,
            (DType::F16, ReduceOp::Max) => self.max_f16,
            // SAFETY: predefined handles.
            (_, ReduceOp::Sum) => unsafe { ffi::RSMPI_SUM },
            (_, ReduceOp::Max) => unsafe { ffi::RSMPI_MAX },
        }
    }
}

/// Widen `len` halves at `src` to f32.
///
/// # Safety
/// `src` must hold `len` elements of `dtype` (a half type).
pub(crate) unsafe fn upcast(src: *const u8, len: usize, dtype: DType) -> Vec<f32> {
    if len == 0 {
        return Vec::new();
    }
    match dtype {
        DType::BF16 => std::slice::from_raw_parts(src as *const bf16, len)
            .iter()
            .map(|x| x.to_f32())
            .collect(),
        _ => std::slice::from_raw_parts(src as *const f16, len)
            .iter()
            .map(|x| x.to_f32())
            .collect(),
    }
}

/// Round `src` back into `len` halves at `dst` (round-to-nearest-even).
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` elements of `dtype` (a half type).
pub(crate) unsafe fn round_back(src: &[f32], dst: *mut u8, dtype: DType) {
    if src.is_empty() {
        return;
    }
    match dtype {
        DType::BF16 => {
            let d = std::slice::from_raw_parts_mut(dst as *mut bf16, src.len());
            for (o, x) in d.iter_mut().zip(src) {
                *o = bf16::from_f32(*x);
            }
        }
        _ => {
            let d = std::slice::from_raw_parts_mut(dst as *mut f16, src.len());
            for (o, x) in d.iter_mut().zip(src) {
                *o = f16::from_f32(*x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_sum_accumulates_in_f32_and_rounds_once_per_step() {
        // 256 + 1 is not a bf16 (8-bit significand): round-to-nearest-even gives 256.
        let a = [
            bf16::from_f32(1.0),
            bf16::from_f32(0.5),
            bf16::from_f32(-3.0),
        ];
        let mut b = [
            bf16::from_f32(256.0),
            bf16::from_f32(0.25),
            bf16::from_f32(1.0),
        ];
        let mut n: c_int = 3;
        // SAFETY: both arrays hold 3 bf16; the datatype argument is unused.
        unsafe {
            sum_bf16(
                a.as_ptr() as *mut c_void,
                b.as_mut_ptr() as *mut c_void,
                &mut n,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(b.map(|x| x.to_f32()), [256.0, 0.75, -2.0]);
        let x = [f16::from_f32(-1.0), f16::from_f32(f32::NAN)];
        let mut y = [f16::from_f32(-2.0), f16::from_f32(1.0)];
        let mut n: c_int = 2;
        // SAFETY: both arrays hold 2 f16.
        unsafe {
            max_f16(
                x.as_ptr() as *mut c_void,
                y.as_mut_ptr() as *mut c_void,
                &mut n,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(y[0].to_f32(), -1.0);
        assert!(y[1].is_nan(), "max must propagate NaN");
        // Zero length with null pointers is a no-op.
        let mut zero: c_int = 0;
        // SAFETY: len 0: nothing is read or written.
        unsafe {
            sum_f16(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut zero,
                std::ptr::null_mut(),
            )
        };
    }

    #[test]
    fn upcast_round_back_round_trips() {
        let h: Vec<bf16> = (0..9)
            .map(|i| bf16::from_f32(i as f32 * 0.375 - 1.0))
            .collect();
        // SAFETY: `h` holds 9 bf16.
        let f = unsafe { upcast(h.as_ptr() as *const u8, h.len(), DType::BF16) };
        let mut back = vec![bf16::ZERO; 9];
        // SAFETY: `back` holds 9 bf16.
        unsafe { round_back(&f, back.as_mut_ptr() as *mut u8, DType::BF16) };
        assert_eq!(back, h);
    }
}
