//! The definition of block-wise symmetric int8 and int4 quantization, one element at a
//! time: what every instruction-set level and the CUDA kernel must reproduce bit for bit.
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
    scale_for(amax_bits, Q_MAX)
}

/// [`scale_of`] for codes up to `q_max` (127 for int8, 7 for int4): scale amax / q_max,
/// multiplier q_max / amax; the special blocks are the same for every width.
#[inline(always)]
pub fn scale_for(amax_bits: u32, q_max: f32) -> Result<(f32, f32), f32> {
    let amax = f32::from_bits(amax_bits);
    if !amax.is_finite() {
        return Err(f32::NAN);
    }
    let inv = q_max / amax;
    if amax == 0.0 || !inv.is_finite() {
        return Err(0.0);
    }
    Ok((amax / q_max, inv))
}

/// 1.5 x 2^23: for |v| < 2^22, `v + ROUNDER` is the f32 whose last mantissa bits hold
/// round_half_even(v) (its ulp is 1, and IEEE addition rounds ties to even), so the code
/// is an integer subtraction from its bits. Plain adds and integer ops vectorise at every
/// level, where a rounding call or a saturating float-to-int cast would not.
const ROUNDER: f32 = 12_582_912.0;

/// One value's code at multiplier `inv`: clamp(round_half_even(x inv), -127, 127).
#[inline(always)]
pub fn quantize_one(x: f32, inv: f32) -> i8 {
    code_for(x, inv, Q_MAX)
}

/// [`quantize_one`] for codes up to `q_max` (at most 127): clamp(round_half_even(x inv),
/// -q_max, q_max).
#[inline(always)]
pub fn code_for(x: f32, inv: f32, q_max: f32) -> i8 {
    // |x inv| <= q_max (1 + 2^-22) at most: clamping first and rounding then gives the
    // same code as rounding first (both q_max at the top), and keeps v in the rounder's
    // range.
    let v = (x * inv).clamp(-q_max, q_max) + ROUNDER;
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

// ---- int4 -------------------------------------------------------------------------------
//
// The same definition with codes in [-7, 7]: s = amax / 7, q = clamp(round_half_even(x
// (7 / amax)), -7, 7), so |x - x'| <= s / 2 = amax / 14 plus the f32 roundings. Each code
// is a 4-bit two's-complement nibble, two to a byte: value 2i in the low nibble of byte i,
// value 2i + 1 in the high one; an odd count leaves the last high nibble 0. -8 is never
// used (symmetric, as int8's -128). A block holds an even number of values (checked by the
// callers), so every block starts on a byte: block b's codes are bytes b B/2 .. and the
// blocks can be split over threads. Special blocks as above (7 / amax overflows below
// amax ~2.1e-38).

/// The largest |q| of int4.
pub const Q4_MAX: f32 = 7.0;

/// Two codes in [-8, 7] as one byte: `lo` in bits 0-3, `hi` in bits 4-7.
#[inline(always)]
pub fn pack_int4(lo: i8, hi: i8) -> u8 {
    (lo as u8 & 0x0F) | ((hi as u8) << 4)
}

/// The two codes of a byte made by [`pack_int4`], sign-extended: (low, high).
#[inline(always)]
pub fn unpack_int4(byte: u8) -> (i8, i8) {
    // Shift the nibble to the top, then an arithmetic shift right copies its sign bit.
    (((byte << 4) as i8) >> 4, (byte as i8) >> 4)
}

/// Quantize one block to int4: `codes` holds `x.len().div_ceil(2)` bytes; the scale is
/// returned.
#[inline(always)]
pub fn quantize_block_int4<T: Float>(x: &[T], codes: &mut [u8]) -> f32 {
    match scale_for(amax_bits(x), Q4_MAX) {
        Ok((scale, inv)) => {
            let q = |v: &T| code_for(v.to_f32(), inv, Q4_MAX);
            // Whole pairs as arrays: no bounds checks, so the loop vectorises.
            let (pairs, odd) = x.as_chunks::<2>();
            for (c, [a, b]) in codes.iter_mut().zip(pairs) {
                *c = pack_int4(q(a), q(b));
            }
            if let (Some(v), Some(c)) = (odd.first(), codes.get_mut(x.len() / 2)) {
                *c = pack_int4(q(v), 0);
            }
            scale
        }
        Err(scale) => {
            codes.fill(0);
            scale
        }
    }
}

/// Quantize `x` to int4 in blocks of `block` values (even; the last block may be
/// shorter): `x.len().div_ceil(2)` code bytes into `codes`, one scale per block into
/// `scales`.
#[inline(always)]
pub fn quantize_int4<T: Float>(x: &[T], block: usize, codes: &mut [u8], scales: &mut [f32]) {
    let per = block / 2;
    for ((xb, cb), s) in x.chunks(block).zip(codes.chunks_mut(per)).zip(scales) {
        *s = quantize_block_int4(xb, cb);
    }
}

/// Read int4 `codes` back in blocks of `block` (even) into `out`: x' = q s.
#[inline(always)]
pub fn dequantize_int4<T: Float>(codes: &[u8], scales: &[f32], block: usize, out: &mut [T]) {
    let per = block / 2;
    for ((cb, ob), &s) in codes.chunks(per).zip(out.chunks_mut(block)).zip(scales) {
        let last = cb.get(ob.len() / 2).copied();
        let (pairs, odd) = ob.as_chunks_mut::<2>();
        for ([a, b], &c) in pairs.iter_mut().zip(cb) {
            let (lo, hi) = unpack_int4(c);
            *a = T::from_f32(dequantize_one(lo, s));
            *b = T::from_f32(dequantize_one(hi, s));
        }
        // An odd block (only the last) ends with a low nibble.
        if let (Some(o), Some(c)) = (odd.first_mut(), last) {
            *o = T::from_f32(dequantize_one(unpack_int4(c).0, s));
        }
    }
}
