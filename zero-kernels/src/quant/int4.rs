//! Block-wise symmetric int4 quantization on the host: the definition of
//! [`super::reference::quantize_int4`] compiled at each instruction-set level (the pair
//! loops vectorise inside the level's `#[target_feature]` function, see `crate::simd`) and
//! split over threads at block boundaries. A block holds an even number of values, so a
//! thread's first value is a low nibble and its first code byte is value / 2: the threads
//! write disjoint bytes. As for int8, every step is exact or one correctly rounded
//! operation on one element, so every level and thread count gives the reference's bits.

use super::{dequantize_width, quantize_width, reference, Width};
use crate::error::KernelError;
use crate::float::Float;
use crate::isa::Exec;

/// Code bytes for `n` int4 values: two per byte, the last one half used when n is odd.
pub fn code_bytes_int4(n: usize) -> usize {
    n.div_ceil(2)
}

/// int4: two codes a byte (value 2i in the low nibble of byte i).
pub(crate) struct Int4;

impl Width for Int4 {
    type Code = u8;
    const CODES: &'static str = "int4 code bytes (ceil(n / 2))";
    fn units(n: usize) -> usize {
        code_bytes_int4(n)
    }
    fn check_block(block: usize) -> Result<(), KernelError> {
        if block == 0 || !block.is_multiple_of(2) {
            return Err(KernelError::BadShape {
                op: "quantize_int4",
                detail: format!(
                    "block size {block}: int4 packs two values per byte, so a block must hold \
                     an even number of values (at least 2) to start on a byte"
                ),
            });
        }
        Ok(())
    }
    #[inline(always)]
    fn quantize<T: Float>(x: &[T], block: usize, codes: &mut [u8], scales: &mut [f32]) {
        reference::quantize_int4(x, block, codes, scales)
    }
    #[inline(always)]
    fn dequantize<T: Float>(codes: &[u8], scales: &[f32], block: usize, out: &mut [T]) {
        reference::dequantize_int4(codes, scales, block, out)
    }
}

/// Check an int4 quantization of `n` values in blocks of `block` (at least 2, even):
/// `codes` bytes ([`code_bytes_int4`]) and `scales` scales.
pub fn check_lengths_int4(
    n: usize,
    block: usize,
    codes: usize,
    scales: usize,
) -> Result<(), KernelError> {
    super::check_width::<Int4>(n, block, codes, scales)
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
    quantize_width::<T, Int4>(exec, x, block, codes, scales)
}

/// Read int4 codes and scales made by [`quantize_int4`] back into `out`.
pub fn dequantize_int4<T: Float>(
    exec: &Exec,
    codes: &[u8],
    scales: &[f32],
    block: usize,
    out: &mut [T],
) -> Result<(), KernelError> {
    dequantize_width::<T, Int4>(exec, codes, scales, block, out)
}
