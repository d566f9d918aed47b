//! Casts: the bit recipes of `reference` against the `half` crate (an independent
//! implementation), exhaustively where the domain is 16-bit; every level and thread count
//! against `reference`, bitwise, on random slices with every kind of value.

use super::*;
use crate::testutil::{execs, length, wild_f32};
use half::{bf16, f16};
use proptest::prelude::*;

#[test]
fn widening_matches_half_for_every_16_bit_pattern() {
    for h in 0..=u16::MAX {
        let (b, f) = (bf16::from_bits(h), f16::from_bits(h));
        // bf16 NaN: `half` quiets it; ours is the plain shift (as the SIMD and CUDA paths).
        let want_b = if b.is_nan() {
            (h as u32) << 16
        } else {
            b.to_f32().to_bits()
        };
        assert_eq!(
            reference::bf16_bits_to_f32(h).to_bits(),
            want_b,
            "bf16 {h:#06x}"
        );
        let ours = reference::f16_bits_to_f32(h);
        if f.is_nan() {
            // NaN: sign and payload kept, quiet bit set (what vcvtph2ps does).
            let want = ((h as u32 & 0x8000) << 16) | 0x7FC0_0000 | ((h as u32 & 0x3FF) << 13);
            assert_eq!(ours.to_bits(), want, "f16 NaN {h:#06x}");
        } else {
            assert_eq!(ours.to_bits(), f.to_f32().to_bits(), "f16 {h:#06x}");
        }
    }
}

/// Narrowing every 16-bit value's f32 image and the midpoints between neighbours (the
/// ties) must round as `half` does: exact values back to themselves, ties to even.
#[test]
fn narrowing_matches_half_on_a_sweep_of_f32_bit_patterns() {
    let mut bits: u32 = 0;
    loop {
        let x = f32::from_bits(bits);
        let (b, f) = (bf16::from_f32(x), f16::from_f32(x));
        assert_eq!(
            reference::f32_to_bf16_bits(x),
            b.to_bits(),
            "bf16 of {bits:#010x}"
        );
        assert_eq!(
            reference::f32_to_f16_bits(x),
            f.to_bits(),
            "f16 of {bits:#010x}"
        );
        match bits.checked_add(997) {
            Some(b) => bits = b,
            None => break,
        }
    }
    for h in 0..0x7C00u16 {
        // Midpoint of f16 h and h+1 (exact in f32): rounds to the even one of the two.
        let lo = reference::f16_bits_to_f32(h) as f64;
        let hi = reference::f16_bits_to_f32(h + 1) as f64;
        let mid = ((lo + hi) / 2.0) as f32;
        let even = if h % 2 == 0 { h } else { h + 1 };
        assert_eq!(
            reference::f32_to_f16_bits(mid),
            even,
            "f16 tie above {h:#06x}"
        );
        assert_eq!(
            reference::f32_to_f16_bits(-mid),
            even | 0x8000,
            "f16 tie below -{h:#06x}"
        );
    }
}

#[test]
fn length_mismatch_is_an_error_with_the_numbers() {
    let exec = Exec::default();
    let mut dst = vec![bf16::ZERO; 3];
    let err = narrow(&exec, &[1.0; 4], HalfSliceMut::BF16(&mut dst)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "length mismatch: dst has 3 elements, expected 4"
    );
}

/// `accumulate_rounded` refuses slices of different lengths (as `accumulate` does)
/// instead of summing the shorter prefix, and leaves `dst` as it was.
#[test]
fn accumulate_rounded_refuses_a_length_mismatch() {
    let exec = Exec::default();
    let mut dst = vec![bf16::ONE; 10];
    let err = accumulate_rounded(&exec, &mut dst, &[1.0f32; 7]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "length mismatch: src has 7 elements, expected 10"
    );
    assert!(dst.iter().all(|&x| x == bf16::ONE));
    let err = accumulate_rounded(&exec, &mut dst[..2], &[f16::ONE; 3]).unwrap_err();
    assert!(matches!(
        err,
        KernelError::LengthMismatch {
            what: "src",
            got: 3,
            expected: 2
        }
    ));
    accumulate_rounded(&exec, &mut dst, &[bf16::ONE; 10]).unwrap();
    assert!(dst.iter().all(|&x| x.to_f32() == 2.0));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_level_narrows_like_reference(src in length().prop_flat_map(|n| proptest::collection::vec(wild_f32(), n))) {
        let mut want_b = vec![bf16::ZERO; src.len()];
        let mut want_f = vec![f16::ZERO; src.len()];
        reference::narrow(&src, &mut want_b);
        reference::narrow(&src, &mut want_f);
        for exec in execs() {
            let mut b = vec![bf16::ZERO; src.len()];
            let mut f = vec![f16::ZERO; src.len()];
            narrow(&exec, &src, HalfSliceMut::BF16(&mut b)).unwrap();
            narrow(&exec, &src, HalfSliceMut::F16(&mut f)).unwrap();
            for i in 0..src.len() {
                prop_assert_eq!(b[i].to_bits(), want_b[i].to_bits(), "bf16 {:?} i={} x={:e}", exec, i, src[i]);
                prop_assert_eq!(f[i].to_bits(), want_f[i].to_bits(), "f16 {:?} i={} x={:e}", exec, i, src[i]);
            }
        }
    }

    #[test]
    fn every_level_widens_and_accumulates_like_reference(
        (bits, acc) in length().prop_flat_map(|n| (
            proptest::collection::vec(any::<u16>(), n),
            proptest::collection::vec(wild_f32(), n),
        ))
    ) {
        let b: Vec<bf16> = bits.iter().map(|&h| bf16::from_bits(h)).collect();
        let f: Vec<f16> = bits.iter().map(|&h| f16::from_bits(h)).collect();
        let n = bits.len();
        for exec in execs() {
            for src in [FloatSlice::BF16(&b), FloatSlice::F16(&f), FloatSlice::F32(&acc)] {
                let mut want = vec![0.0f32; n];
                let mut got = vec![0.0f32; n];
                match src {
                    FloatSlice::BF16(s) => reference::widen(s, &mut want),
                    FloatSlice::F16(s) => reference::widen(s, &mut want),
                    FloatSlice::F32(s) => reference::widen(s, &mut want),
                }
                widen(&exec, src, &mut got).unwrap();
                let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                prop_assert!(same, "widen {:?} {:?}", exec, src.dtype());

                let mut want = acc.clone();
                let mut got = acc.clone();
                match src {
                    FloatSlice::BF16(s) => reference::accumulate(&mut want, s),
                    FloatSlice::F16(s) => reference::accumulate(&mut want, s),
                    FloatSlice::F32(s) => reference::accumulate(&mut want, s),
                }
                accumulate(&exec, &mut got, src).unwrap();
                let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()
                    || (a.is_nan() && b.is_nan()));
                prop_assert!(same, "accumulate {:?} {:?}", exec, src.dtype());
            }
        }
    }
}
