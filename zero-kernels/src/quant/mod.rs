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

/// A code width: what a value's code is stored as, how many units n values take, and
/// the one-element definitions of [`mod@reference`]. The threaded, per-ISA kernels below are
/// the same for both widths: a thread's chunk starts on a block boundary, so its codes
/// start at `units(start)` (int4 blocks are even: a whole byte) and its scales at
/// `start / block`.
pub(crate) trait Width {
    /// Stored code unit: an i8 code, or a byte of two int4 codes.
    type Code: Copy;
    /// What the code buffer is called in a length error.
    const CODES: &'static str;
    /// Code units of `n` values.
    fn units(n: usize) -> usize;
    /// Refuse a block this width cannot use.
    fn check_block(block: usize) -> Result<(), KernelError>;
    /// [`mod@reference`]'s quantization.
    fn quantize<T: Float>(x: &[T], block: usize, codes: &mut [Self::Code], scales: &mut [f32]);
    /// [`mod@reference`]'s read-back.
    fn dequantize<T: Float>(codes: &[Self::Code], scales: &[f32], block: usize, out: &mut [T]);
}

/// int8: one code a value.
pub(crate) struct Int8;

impl Width for Int8 {
    type Code = i8;
    const CODES: &'static str = "int8 codes";
    fn units(n: usize) -> usize {
        n
    }
    fn check_block(block: usize) -> Result<(), KernelError> {
        if block == 0 {
            return Err(KernelError::BadShape {
                op: "quantize",
                detail: "block size 0: give at least 1 value per scale".into(),
            });
        }
        Ok(())
    }
    #[inline(always)]
    fn quantize<T: Float>(x: &[T], block: usize, codes: &mut [i8], scales: &mut [f32]) {
        reference::quantize(x, block, codes, scales)
    }
    #[inline(always)]
    fn dequantize<T: Float>(codes: &[i8], scales: &[f32], block: usize, out: &mut [T]) {
        reference::dequantize(codes, scales, block, out)
    }
}

/// Check the lengths of a quantization of `n` values of width `W` in blocks of `block`:
/// `codes` code units and `scales` scales.
fn check_width<W: Width>(
    n: usize,
    block: usize,
    codes: usize,
    scales: usize,
) -> Result<(), KernelError> {
    W::check_block(block)?;
    let want = W::units(n);
    if codes != want {
        return Err(KernelError::LengthMismatch {
            what: W::CODES,
            got: codes,
            expected: want,
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

/// Check the lengths of a quantization of `n` values in blocks of `block`: `q` codes and
/// `scales` scales.
pub fn check_lengths(n: usize, block: usize, q: usize, scales: usize) -> Result<(), KernelError> {
    check_width::<Int8>(n, block, q, scales)
}

struct Quantize<T, W: Width> {
    x: *const T,
    codes: *mut W::Code,
    scales: *mut f32,
    n: usize,
    block: usize,
}

impl<T: Float, W: Width> Kernel for Quantize<T, W> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: the caller hands this chunk's disjoint ranges (n values from a block
        // boundary, their code units, whole blocks' scales).
        let x = std::slice::from_raw_parts(self.x, self.n);
        let c = std::slice::from_raw_parts_mut(self.codes, W::units(self.n));
        let s = std::slice::from_raw_parts_mut(self.scales, scale_count(self.n, self.block));
        W::quantize(x, self.block, c, s);
    }
}

struct Dequantize<T, W: Width> {
    codes: *const W::Code,
    scales: *const f32,
    out: *mut T,
    n: usize,
    block: usize,
}

impl<T: Float, W: Width> Kernel for Dequantize<T, W> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: as for `Quantize`.
        let c = std::slice::from_raw_parts(self.codes, W::units(self.n));
        let s = std::slice::from_raw_parts(self.scales, scale_count(self.n, self.block));
        let out = std::slice::from_raw_parts_mut(self.out, self.n);
        W::dequantize(c, s, self.block, out);
    }
}

/// [`quantize`] for any width.
fn quantize_width<T: Float, W: Width>(
    exec: &Exec,
    x: &[T],
    block: usize,
    codes: &mut [W::Code],
    scales: &mut [f32],
) -> Result<(), KernelError> {
    check_width::<W>(x.len(), block, codes.len(), scales.len())?;
    let (xp, cp, sp) = (
        SendPtr(x.as_ptr() as *mut T),
        SendPtr(codes.as_mut_ptr()),
        SendPtr(scales.as_mut_ptr()),
    );
    par::map(exec, x.len(), block, |r| {
        let k = Quantize::<T, W> {
            // SAFETY: chunks start at multiples of `block` and lie within the slices,
            // checked to hold n values, their code units and n / block (rounded up)
            // scales.
            x: unsafe { xp.at(r.start) } as *const T,
            codes: unsafe { cp.at(W::units(r.start)) },
            scales: unsafe { sp.at(r.start / block) },
            n: r.len(),
            block,
        };
        // SAFETY: an `Exec`'s level is available on this CPU; the pointers are valid.
        unsafe { dispatch(exec.isa(), k) }
    });
    Ok(())
}

/// [`dequantize`] for any width.
fn dequantize_width<T: Float, W: Width>(
    exec: &Exec,
    codes: &[W::Code],
    scales: &[f32],
    block: usize,
    out: &mut [T],
) -> Result<(), KernelError> {
    check_width::<W>(out.len(), block, codes.len(), scales.len())?;
    let (cp, sp, op) = (
        SendPtr(codes.as_ptr() as *mut W::Code),
        SendPtr(scales.as_ptr() as *mut f32),
        SendPtr(out.as_mut_ptr()),
    );
    par::map(exec, out.len(), block, |r| {
        let k = Dequantize::<T, W> {
            // SAFETY: as in `quantize_width`.
            codes: unsafe { cp.at(W::units(r.start)) } as *const W::Code,
            scales: unsafe { sp.at(r.start / block) } as *const f32,
            out: unsafe { op.at(r.start) },
            n: r.len(),
            block,
        };
        // SAFETY: as in `quantize_width`.
        unsafe { dispatch(exec.isa(), k) }
    });
    Ok(())
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
    quantize_width::<T, Int8>(exec, x, block, q, scales)
}

/// Read codes and scales made by [`quantize`] back into `out`.
pub fn dequantize<T: Float>(
    exec: &Exec,
    q: &[i8],
    scales: &[f32],
    block: usize,
    out: &mut [T],
) -> Result<(), KernelError> {
    dequantize_width::<T, Int8>(exec, q, scales, block, out)
}
