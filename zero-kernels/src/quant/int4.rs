//! Block-wise symmetric int4 quantization on the host: the definition of
//! [`super::reference::quantize_int4`] compiled at each instruction-set level (the pair
//! loops vectorise inside the level's `#[target_feature]` function, see `crate::simd`) and
//! split over threads at block boundaries. A block holds an even number of values, so a
//! thread's first value is a low nibble and its first code byte is value / 2: the threads
//! write disjoint bytes. As for int8, every step is exact or one correctly rounded
//! operation on one element, so every level and thread count gives the reference's bits.

use super::reference;
use super::scale_count;
use crate::error::KernelError;
use crate::float::Float;
use crate::isa::Exec;
use crate::par::{self, SendPtr};
use crate::simd::{dispatch, Kernel, Simd};

/// Code bytes for `n` int4 values: two per byte, the last one half used when n is odd.
pub fn code_bytes_int4(n: usize) -> usize {
    n.div_ceil(2)
}

/// Check an int4 quantization of `n` values in blocks of `block` (at least 2, even):
/// `codes` bytes ([`code_bytes_int4`]) and `scales` scales.
pub fn check_lengths_int4(
    n: usize,
    block: usize,
    codes: usize,
    scales: usize,
) -> Result<(), KernelError> {
    if block == 0 || !block.is_multiple_of(2) {
        return Err(KernelError::BadShape {
            op: "quantize_int4",
            detail: format!(
                "block size {block}: int4 packs two values per byte, so a block must hold \
                 an even number of values (at least 2) to start on a byte"
            ),
        });
    }
    let want = code_bytes_int4(n);
    if codes != want {
        return Err(KernelError::LengthMismatch {
            what: "int4 code bytes (ceil(n / 2))",
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

struct Quantize4<T> {
    x: *const T,
    codes: *mut u8,
    scales: *mut f32,
    n: usize,
    block: usize,
}

impl<T: Float> Kernel for Quantize4<T> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: the caller hands this chunk's disjoint ranges (n values from a block
        // boundary, their ceil(n / 2) bytes and whole blocks' scales).
        let x = std::slice::from_raw_parts(self.x, self.n);
        let c = std::slice::from_raw_parts_mut(self.codes, code_bytes_int4(self.n));
        let s = std::slice::from_raw_parts_mut(self.scales, scale_count(self.n, self.block));
        reference::quantize_int4(x, self.block, c, s);
    }
}

struct Dequantize4<T> {
    codes: *const u8,
    scales: *const f32,
    out: *mut T,
    n: usize,
    block: usize,
}

impl<T: Float> Kernel for Dequantize4<T> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: as for `Quantize4`.
        let c = std::slice::from_raw_parts(self.codes, code_bytes_int4(self.n));
        let s = std::slice::from_raw_parts(self.scales, scale_count(self.n, self.block));
        let out = std::slice::from_raw_parts_mut(self.out, self.n);
        reference::dequantize_int4(c, s, self.block, out);
    }
}

/// Quantize `x` to int4 in blocks of `block` values (even): `codes` gets
/// [`code_bytes_int4`] bytes (value 2i in the low nibble of byte i), `scales` one scale per
/// block (the last block may be shorter).
pub fn quantize_int4<T: Float>(
    exec: &Exec,
    x: &[T],
    block: usize,
    codes: &mut [u8],
    scales: &mut [f32],
) -> Result<(), KernelError> {
    check_lengths_int4(x.len(), block, codes.len(), scales.len())?;
    let (xp, cp, sp) = (
        SendPtr(x.as_ptr() as *mut T),
        SendPtr(codes.as_mut_ptr()),
        SendPtr(scales.as_mut_ptr()),
    );
    par::map(exec, x.len(), block, |r| {
        let k = Quantize4 {
            // SAFETY: chunks start at multiples of the (even) block, so at byte r.start / 2,
            // and lie within the slices, checked to hold n values, ceil(n / 2) bytes and
            // ceil(n / block) scales.
            x: unsafe { xp.at(r.start) } as *const T,
            codes: unsafe { cp.at(r.start / 2) },
            scales: unsafe { sp.at(r.start / block) },
            n: r.len(),
            block,
        };
        // SAFETY: an `Exec`'s level is available on this CPU; the pointers are valid.
        unsafe { dispatch(exec.isa(), k) }
    });
    Ok(())
}

/// Read int4 codes and scales made by [`quantize_int4`] back into `out`.
pub fn dequantize_int4<T: Float>(
    exec: &Exec,
    codes: &[u8],
    scales: &[f32],
    block: usize,
    out: &mut [T],
) -> Result<(), KernelError> {
    check_lengths_int4(out.len(), block, codes.len(), scales.len())?;
    let (cp, sp, op) = (
        SendPtr(codes.as_ptr() as *mut u8),
        SendPtr(scales.as_ptr() as *mut f32),
        SendPtr(out.as_mut_ptr()),
    );
    par::map(exec, out.len(), block, |r| {
        let k = Dequantize4 {
            // SAFETY: as in `quantize_int4`.
            codes: unsafe { cp.at(r.start / 2) } as *const u8,
            scales: unsafe { sp.at(r.start / block) } as *const f32,
            out: unsafe { op.at(r.start) },
            n: r.len(),
            block,
        };
        // SAFETY: as in `quantize_int4`.
        unsafe { dispatch(exec.isa(), k) }
    });
    Ok(())
}
