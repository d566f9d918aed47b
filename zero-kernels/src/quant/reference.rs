//! The definition of block-wise symmetric int8 quantization, one element at a time: what
//! every instruction-set level and the CUDA kernel must reproduce bit for bit.
//!
//! A block of B values x with amax = max |x| is sent as one f32 scale s = amax / 127 and B
//! int8 values q = clamp(round_half_even(x * (127 / amax)), -127, 127); the receiver reads
//! x' = q s. So |x - x'| <= s / 2 plus a few f32 roundings (argued in the tests), and -128
//! is never used, keeping the code symmetric (ZeRO++, Wang et al. 2023, section 4.1).
//!
//! amax comes from the bits: |x| is the bit pattern with the sign cleared, and for
//! non-negative floats the order of the patterns is the order of the values, NaN above
//! inf. An integer maximum is exact in any order, so vector levels and threads agree.
//!
//! Special blocks:
//! - amax = 0, or so small that 127 / amax overflows (amax < ~3.7e-37): every q is 0 and
//!   s = 0 (the block is read back as zeros; its error is below 3.7e-37);
//! - a NaN or infinity anywhere: every q is 0 and s = NaN, so the whole block is read back
//!   as NaN and the non-finite value is not hidden.

use crate::float::Float;

/// The largest |q|.
pub const Q_MAX: f32 = 127.0;

/// The bits of max |x| over `x` (0 for an empty block).
#[inline(always)]
pub fn amax_bits<T: Float>(x: &[T]) -> u32 {
    x.iter()
        .map(|v| v.to_f32().to_bits() & 0x7FFF_FFFF)
        .fold(0, u32::max)
}

/// The block's scale and the multiplier its values are quantized with, from amax's bits;
/// `None`: the block is sent as zeros with this scale (0 or NaN).
#[inline(always)]
pub fn scale_of(amax_bits: u32) -> Result<(f32, f32), f32> {
    let amax = f32::from_bits(amax_bits);
    if !amax.is_finite() {
        return Err(f32::NAN);
    }
    let inv = Q_MAX / amax;
    if amax == 0.0 || !inv.is_finite() {
        return Err(0.0);
    }
    Ok((amax / Q_MAX, inv))
}

/// 1.5 x 2^23: for |v| < 2^22, `v + ROUNDER` is the f32 whose last mantissa bits hold
/// round_half_even(v) (its ulp is 1, and IEEE addition rounds ties to even), so the code
/// is an integer subtraction from its bits. Plain adds and integer ops vectorise at every
/// level, where a rounding call or a saturating float-to-int cast would not.
const ROUNDER: f32 = 12_582_912.0;

/// One value's code at multiplier `inv`: clamp(round_half_even(x inv), -127, 127).
#[inline(always)]
pub fn quantize_one(x: f32, inv: f32) -> i8 {
    // |x inv| <= 127 (1 + 2^-22) at most: clamping first and rounding then gives the same
    // code as rounding first (both 127 at the top), and keeps v in the rounder's range.
    let v = (x * inv).clamp(-Q_MAX, Q_MAX) + ROUNDER;
    (v.to_bits() as i32 - ROUNDER.to_bits() as i32) as i8
}

/// One value read back; a NaN scale gives `f32::NAN`'s bits whatever the platform's
/// NaN propagation (the CUDA kernel writes the same bits).
#[inline(always)]
pub fn dequantize_one(q: i8, scale: f32) -> f32 {
    if scale.is_nan() {
        f32::NAN
    } else {
        f32::from(q) * scale
    }
}

/// Quantize one block: codes into `q` (same length as `x`), the scale returned.
#[inline(always)]
pub fn quantize_block<T: Float>(x: &[T], q: &mut [i8]) -> f32 {
    match scale_of(amax_bits(x)) {
        Ok((scale, inv)) => {
            for (qi, xi) in q.iter_mut().zip(x) {
                *qi = quantize_one(xi.to_f32(), inv);
            }
            scale
        }
        Err(scale) => {
            q.fill(0);
            scale
        }
    }
}

/// Quantize `x` in blocks of `block` (the last may be shorter): codes into `q`, one scale
/// per block into `scales`.
#[inline(always)]
pub fn quantize<T: Float>(x: &[T], block: usize, q: &mut [i8], scales: &mut [f32]) {
    for ((xb, qb), s) in x.chunks(block).zip(q.chunks_mut(block)).zip(scales) {
        *s = quantize_block(xb, qb);
    }
}

/// Read `q` back in blocks of `block` into `out`.
#[inline(always)]
pub fn dequantize<T: Float>(q: &[i8], scales: &[f32], block: usize, out: &mut [T]) {
    for ((qb, ob), &s) in q.chunks(block).zip(out.chunks_mut(block)).zip(scales) {
        for (o, &qi) in ob.iter_mut().zip(qb) {
            *o = T::from_f32(dequantize_one(qi, s));
        }
    }
}
