//! Block-wise symmetric int8 quantization of weights and gradients for communication
//! (ZeRO++'s qwZ and qgZ): each block of B values becomes B int8 codes and one f32 scale,
//! so a block of B f32 crosses the network as B + 4 bytes instead of 4B (bf16: 2B). The
//! definition, one element at a time, is [`mod@reference`]; these are the same steps compiled
//! at each instruction-set level (the loops are written so LLVM vectorises them inside the
//! level's `#[target_feature]` function, see `crate::simd`) and split over threads at
//! block boundaries. Every step is exact or one correctly rounded IEEE operation on one
//! element (the block maximum is an integer maximum of bit patterns), so every level and
//! thread count gives the reference's bits: tested.
//!
//! Int4 ([`quantize_int4`]) is the same with codes in [-7, 7] packed two to a byte: a
//! block of B values crosses as B / 2 + 4 bytes (blocks hold an even number of values).

mod int4;
pub mod reference;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_int4;

pub use int4::{check_lengths_int4, code_bytes_int4, dequantize_int4, quantize_int4};

use crate::error::KernelError;
use crate::float::Float;
use crate::isa::Exec;
use crate::par::{self, SendPtr};
use crate::simd::{dispatch, Kernel, Simd};

/// The default block: 256 values per scale (ZeRO++ uses blocks of a few hundred; the
/// scales then cost 4/256 = 1.6% of the int8 bytes).
pub const DEFAULT_BLOCK: usize = 256;

/// Scales for `n` values in blocks of `block`.
pub fn scale_count(n: usize, block: usize) -> usize {
    n.div_ceil(block.max(1))
}

/// Check the lengths of a quantization of `n` values in blocks of `block`: `q` codes and
/// `scales` scales.
pub fn check_lengths(n: usize, block: usize, q: usize, scales: usize) -> Result<(), KernelError> {
    if block == 0 {
        return Err(KernelError::BadShape {
            op: "quantize",
            detail: "block size 0: give at least 1 value per scale".into(),
        });
    }
    if q != n {
        return Err(KernelError::LengthMismatch {
            what: "int8 codes",
            got: q,
            expected: n,
        });
    }
    let want = scale_count(n, block);
    if scales != want {
        return Err(KernelError::LengthMismatch {
            what: "scales",
            got: scales,
            expected: want,
        });
    }
    Ok(())
}

struct Quantize<T> {
    x: *const T,
    q: *mut i8,
    scales: *mut f32,
    n: usize,
    block: usize,
}

impl<T: Float> Kernel for Quantize<T> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: the caller hands this chunk's disjoint ranges (n values, whole blocks).
        let x = std::slice::from_raw_parts(self.x, self.n);
        let q = std::slice::from_raw_parts_mut(self.q, self.n);
        let scales = std::slice::from_raw_parts_mut(self.scales, scale_count(self.n, self.block));
        reference::quantize(x, self.block, q, scales);
    }
}

struct Dequantize<T> {
    q: *const i8,
    scales: *const f32,
    out: *mut T,
    n: usize,
    block: usize,
}

impl<T: Float> Kernel for Dequantize<T> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: as for `Quantize`.
        let q = std::slice::from_raw_parts(self.q, self.n);
        let scales = std::slice::from_raw_parts(self.scales, scale_count(self.n, self.block));
        let out = std::slice::from_raw_parts_mut(self.out, self.n);
        reference::dequantize(q, scales, self.block, out);
    }
}

/// Quantize `x` in blocks of `block` values: `q` gets one code per value, `scales` one
/// scale per block (the last block may be shorter).
pub fn quantize<T: Float>(
    exec: &Exec,
    x: &[T],
    block: usize,
    q: &mut [i8],
    scales: &mut [f32],
) -> Result<(), KernelError> {
    check_lengths(x.len(), block, q.len(), scales.len())?;
    let (xp, qp, sp) = (
        SendPtr(x.as_ptr() as *mut T),
        SendPtr(q.as_mut_ptr()),
        SendPtr(scales.as_mut_ptr()),
    );
    par::map(exec, x.len(), block, |r| {
        let k = Quantize {
            // SAFETY: chunks start at multiples of `block` and lie within the slices,
            // checked to hold n values and n / block (rounded up) scales.
            x: unsafe { xp.at(r.start) } as *const T,
            q: unsafe { qp.at(r.start) },
            scales: unsafe { sp.at(r.start / block) },
            n: r.len(),
            block,
        };
        // SAFETY: an `Exec`'s level is available on this CPU; the pointers are valid.
        unsafe { dispatch(exec.isa(), k) }
    });
    Ok(())
}

/// Read codes and scales made by [`quantize`] back into `out`.
pub fn dequantize<T: Float>(
    exec: &Exec,
    q: &[i8],
    scales: &[f32],
    block: usize,
    out: &mut [T],
) -> Result<(), KernelError> {
    check_lengths(out.len(), block, q.len(), scales.len())?;
    let (qp, sp, op) = (
        SendPtr(q.as_ptr() as *mut i8),
        SendPtr(scales.as_ptr() as *mut f32),
        SendPtr(out.as_mut_ptr()),
    );
    par::map(exec, out.len(), block, |r| {
        let k = Dequantize {
            // SAFETY: as in `quantize`.
            q: unsafe { qp.at(r.start) } as *const i8,
            scales: unsafe { sp.at(r.start / block) } as *const f32,
            out: unsafe { op.at(r.start) },
            n: r.len(),
            block,
        };
        // SAFETY: as in `quantize`.
        unsafe { dispatch(exec.isa(), k) }
    });
    Ok(())
}
