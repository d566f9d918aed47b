//! Quantization: every level and thread count against `reference`, bitwise; the error
//! bound of each block against an f64 recomputation; the special blocks.

use super::*;
use crate::testutil::{execs, wild_f32};
use half::bf16;
use proptest::prelude::*;

/// Bit patterns, NaN as one value (no arithmetic here makes a NaN payload, but the input
/// may carry any).
fn bits(x: &[f32]) -> Vec<u32> {
    x.iter()
        .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
        .collect()
}

fn run_all<T: Float>(x: &[T], block: usize) {
    let n = x.len();
    let mut q_ref = vec![0i8; n];
    let mut s_ref = vec![0f32; scale_count(n, block)];
    reference::quantize(x, block, &mut q_ref, &mut s_ref);
    let mut back_ref = vec![T::from_f32(0.0); n];
    reference::dequantize(&q_ref, &s_ref, block, &mut back_ref);
    for exec in execs() {
        let mut q = vec![0i8; n];
        let mut s = vec![0f32; scale_count(n, block)];
        quantize(&exec, x, block, &mut q, &mut s).expect("lengths fit");
        assert_eq!(q, q_ref, "codes at {exec:?}, block {block}");
        assert_eq!(bits(&s), bits(&s_ref), "scales at {exec:?}");
        let mut back = vec![T::from_f32(1.0); n];
        dequantize(&exec, &q, &s, block, &mut back).expect("lengths fit");
        let (b, r): (Vec<f32>, Vec<f32>) = (
            back.iter().map(|v| v.to_f32()).collect(),
            back_ref.iter().map(|v| v.to_f32()).collect(),
        );
        assert_eq!(bits(&b), bits(&r), "values at {exec:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_level_and_thread_count_gives_the_reference_bits(
        x in proptest::collection::vec(wild_f32(), 0..700),
        block in prop_oneof![Just(1usize), Just(7), Just(16), Just(256)],
    ) {
        run_all(&x, block);
        let h: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        run_all(&h, block);
    }

    /// |x - x'| <= amax / 254 + 4 eps amax per value of a finite block: the rounding to
    /// the nearest code is at most half a step s = amax / 127, and the f32 operations
    /// (s = amax / 127, inv = 127 / amax, x inv, q s: four roundings of relative size
    /// eps = 2^-24 each, on magnitudes <= 127 s ~ amax) add at most 4 eps amax.
    #[test]
    fn each_value_is_within_half_a_step_of_its_code(
        x in proptest::collection::vec(-1.0e6f32..1.0e6, 1..600),
        tiny in prop_oneof![Just(1.0f32), Just(1.0e-30), Just(1.0e30)],
        block in prop_oneof![Just(3usize), Just(64), Just(256)],
    ) {
        let x: Vec<f32> = x.iter().map(|v| v * tiny).collect();
        let n = x.len();
        let (mut q, mut s) = (vec![0i8; n], vec![0f32; scale_count(n, block)]);
        quantize(&Exec::default(), &x, block, &mut q, &mut s).expect("lengths fit");
        let mut back = vec![0f32; n];
        dequantize(&Exec::default(), &q, &s, block, &mut back).expect("lengths fit");
        for (b, xb) in x.chunks(block).enumerate() {
            let amax = xb.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
            let bound = amax / 254.0 + 4.0 * amax * f64::from(f32::EPSILON) / 2.0;
            for (i, &v) in xb.iter().enumerate() {
                let err = (f64::from(v) - f64::from(back[b * block + i])).abs();
                prop_assert!(err <= bound, "block {b} value {i}: {v} -> {}, error {err} > {bound}", back[b * block + i]);
            }
            // The largest value uses the whole range.
            if amax > 0.0 {
                let top = q[b * block..b * block + xb.len()].iter().map(|c| c.unsigned_abs()).max();
                prop_assert_eq!(top, Some(127));
            }
        }
    }
}

#[test]
fn special_blocks_read_back_as_zeros_or_nan() {
    let block = 4;
    let x = [
        0.0,
        -0.0,
        0.0,
        0.0, // all zero: scale 0
        1.0e-40,
        -2.0e-38,
        0.0,
        1.0e-45, // 127 / amax overflows: zeros
        1.0,
        f32::NAN,
        2.0,
        3.0, // a NaN: the block reads back as NaN
        f32::INFINITY,
        1.0,
        0.0,
        0.0, // an infinity: NaN too
        -5.0,
        5.0,
        2.5,
        0.0, // a tie at 63.5 rounds to even (64)
    ];
    let mut q = vec![0i8; x.len()];
    let mut s = vec![0f32; 5];
    quantize(&Exec::default(), &x, block, &mut q, &mut s).expect("lengths fit");
    assert_eq!(&s[..2], &[0.0, 0.0]);
    assert!(s[2].is_nan() && s[3].is_nan());
    assert_eq!(&q[..16], &[0; 16]);
    assert_eq!(&q[16..], &[-127, 127, 64, 0]);
    assert_eq!(s[4], 5.0 / 127.0);
    let mut back = vec![0f32; x.len()];
    dequantize(&Exec::default(), &q, &s, block, &mut back).expect("lengths fit");
    assert!(back[..8].iter().all(|v| *v == 0.0));
    assert!(back[8..16].iter().all(|v| v.is_nan()));
}

#[test]
fn wrong_lengths_and_a_zero_block_are_errors() {
    let e = Exec::default();
    let x = [1.0f32; 10];
    let (mut q, mut s) = (vec![0i8; 10], vec![0f32; 3]);
    assert!(quantize(&e, &x, 4, &mut q, &mut s).is_ok());
    assert!(quantize(&e, &x, 4, &mut q[..9], &mut s).is_err());
    assert!(quantize(&e, &x, 4, &mut q, &mut s[..2]).is_err());
    assert!(quantize(&e, &x, 0, &mut q, &mut s).is_err());
    let mut out = vec![0f32; 10];
    assert!(dequantize(&e, &q, &s[..2], 4, &mut out).is_err());
}

/// The rounder trick against the rounding it stands for, on every f32 in [-128, 128]
/// that is a multiple of 2^-10 (all the ties x.5 included) and on values just past them.
#[test]
fn codes_round_half_to_even_and_clamp() {
    for i in -(128 << 10)..=(128 << 10) {
        let v = i as f32 / 1024.0;
        for x in [
            v,
            f32::from_bits(v.to_bits() + 1),
            f32::from_bits(v.to_bits().saturating_sub(1)),
        ] {
            let want = x.round_ties_even().clamp(-127.0, 127.0) as i8;
            assert_eq!(reference::quantize_one(x, 1.0), want, "{x}");
        }
    }
}
