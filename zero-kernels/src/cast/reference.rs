//! Scalar, bit-exact conversions between f32 and the 16-bit float types: the oracle for
//! every fast path (AVX2/AVX-512 and CUDA implement the same bit recipes).
//!
//! Rules (IEEE 754, round to nearest, ties to even): finite values round; values past the
//! largest finite 16-bit value round to inf; subnormal results are produced (no flush to
//! zero); inf stays inf; NaN stays NaN with its sign and top payload bits, and is quieted
//! (the quiet bit set), as x86 `vcvtps2ph` and CUDA's conversions do. Widening (16 -> 32
//! bits) is exact; a bf16 NaN keeps its bits exactly (it is a bit shift), an f16 NaN is
//! quieted (as `vcvtph2ps` does).

#[cfg(test)]
use crate::simd::SimdFloat;

/// f32 -> bf16 bits, round to nearest even. bf16 is the top half of an f32, so rounding is
/// adding 0x7FFF plus the lowest kept bit (the tie breaker) and truncating; the carry runs
/// into the exponent, which turns the largest values into inf as RNE requires.
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// bf16 bits -> f32 (exact: the bits become the top half).
#[inline(always)]
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 -> f16 bits, round to nearest even, with subnormals, overflow to inf and NaN kept.
#[inline(always)]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = (b >> 23) & 0xFF;
    let man = b & 0x7F_FFFF;
    if exp == 0xFF {
        // inf, or NaN: quiet bit set, top 10 payload bits kept.
        return if man == 0 {
            sign | 0x7C00
        } else {
            sign | 0x7E00 | (man >> 13) as u16
        };
    }
    let e = exp as i32 - 127; // unbiased exponent of x
    if e > 15 {
        return sign | 0x7C00; // |x| >= 2^16: past f16's range
    }
    if e >= -14 {
        // Normal f16: keep 10 of 23 mantissa bits; a carry out of the mantissa bumps the
        // exponent (and 65520 and above becomes inf = 0x7C00, as it must).
        let mut r = (((e + 15) as u32) << 10) | (man >> 13);
        let rem = man & 0x1FFF;
        if rem > 0x1000 || (rem == 0x1000 && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    if e < -25 {
        return sign; // below half the smallest subnormal 2^-24: rounds to (signed) zero
    }
    // Subnormal f16, counted in units of 2^-24: x = full * 2^(e-23) = full * 2^(e+1) units,
    // with full the 24-bit significand (exp != 0 here since e >= -25).
    let full = man | 0x80_0000;
    let shift = (-e - 1) as u32; // 14 ..= 24
    let mut r = full >> shift;
    let rem = full & ((1u32 << shift) - 1);
    let halfway = 1u32 << (shift - 1);
    if rem > halfway || (rem == halfway && (r & 1) == 1) {
        r += 1; // may carry into the smallest normal (0x0400), which is the right encoding
    }
    sign | r as u16
}

/// f16 bits -> f32 (exact; NaN quieted, payload kept).
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1F) as u32;
    let man = (h & 0x3FF) as u32;
    if exp == 0x1F {
        return if man == 0 {
            f32::from_bits(sign | 0x7F80_0000)
        } else {
            f32::from_bits(sign | 0x7FC0_0000 | (man << 13))
        };
    }
    if exp == 0 {
        // Zero or subnormal: man * 2^-24, exact in f32.
        let mag = man as f32 * f32::from_bits(0x3380_0000);
        return if sign != 0 { -mag } else { mag };
    }
    f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
}

#[cfg(test)] // the oracle of the tests; production code runs the fast paths
/// Reference cast from f32 into a 16-bit type, element by element.
pub(crate) fn narrow<H: SimdFloat>(src: &[f32], dst: &mut [H]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = H::from_f32(s);
    }
}

#[cfg(test)] // the oracle of the tests; production code runs the fast paths
/// Reference widening of any float element type into f32, element by element.
pub(crate) fn widen<H: SimdFloat>(src: &[H], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

#[cfg(test)] // the oracle of the tests; production code runs the fast paths
/// Reference accumulate: `dst[i] = dst[i] + f32(src[i])` (one f32 rounding per element).
pub(crate) fn accumulate<H: SimdFloat>(dst: &mut [f32], src: &[H]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += s.to_f32();
    }
}
