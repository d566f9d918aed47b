//! Int4 quantization: every level and thread count and the CUDA kernel's twin against
//! `reference`, bitwise; the error bound of each block on seeded random data; values on the
//! grid come back exactly; the packing, the special blocks and the length errors.

use super::reference::{pack_int4, unpack_int4};
use super::*;
use crate::testutil::{execs, wild_f32};
use crate::twin;
use half::bf16;
use proptest::prelude::*;

/// Bit patterns, NaN as one value.
fn bits(x: &[f32]) -> Vec<u32> {
    x.iter()
        .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
        .collect()
}

fn floats<T: Float>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

fn run_all<T: Float>(x: &[T], block: usize) {
    let n = x.len();
    let mut c_ref = vec![0u8; code_bytes_int4(n)];
    let mut s_ref = vec![0f32; scale_count(n, block)];
    reference::quantize_int4(x, block, &mut c_ref, &mut s_ref);
    let mut back_ref = vec![T::from_f32(0.0); n];
    reference::dequantize_int4(&c_ref, &s_ref, block, &mut back_ref);
    for exec in execs() {
        // Stale bytes in the outputs must not survive.
        let mut c = vec![0xAAu8; code_bytes_int4(n)];
        let mut s = vec![1f32; scale_count(n, block)];
        quantize_int4(&exec, x, block, &mut c, &mut s).expect("lengths fit");
        assert_eq!(c, c_ref, "codes at {exec:?}, block {block}");
        assert_eq!(bits(&s), bits(&s_ref), "scales at {exec:?}");
        let mut back = vec![T::from_f32(1.0); n];
        dequantize_int4(&exec, &c, &s, block, &mut back).expect("lengths fit");
        assert_eq!(
            bits(&floats(&back)),
            bits(&floats(&back_ref)),
            "values at {exec:?}"
        );
    }
    // The CUDA kernels' twin (one thread block per quantization block).
    let mut c = vec![0x55u8; code_bytes_int4(n)];
    let mut s = vec![1f32; scale_count(n, block)];
    twin::quant::quantize_int4(x, block, &mut c, &mut s);
    assert_eq!(c, c_ref, "twin codes, block {block}");
    assert_eq!(bits(&s), bits(&s_ref), "twin scales");
    let mut back = vec![T::from_f32(1.0); n];
    twin::quant::dequantize_int4(&c_ref, &s_ref, block, &mut back);
    assert_eq!(
        bits(&floats(&back)),
        bits(&floats(&back_ref)),
        "twin values"
    );
    // An odd count leaves the last high nibble 0.
    if n % 2 == 1 {
        assert_eq!(c_ref[n / 2] >> 4, 0, "last high nibble of {n} values");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_level_thread_count_and_the_twin_give_the_reference_bits(
        x in proptest::collection::vec(wild_f32(), 0..1300),
        block in prop_oneof![Just(2usize), Just(6), Just(16), Just(256), Just(600)],
    ) {
        run_all(&x, block);
        let h: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        run_all(&h, block);
    }
}

/// SplitMix64: a fixed-seed stream for the property tests below.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// |x - x'| <= amax / 14 + 4 eps amax per value of a finite block, eps = 2^-24: rounding
/// to the nearest code is at most half a step s = amax / 7, and the f32 operations
/// (s = amax / 7, inv = 7 / amax, x inv, q s: four roundings of relative size eps on
/// magnitudes <= 7 s ~ amax) add at most 4 eps amax. Blocks of several sizes, odd n and n
/// smaller than a block, magnitudes from 1e-30 to 1e30; the largest |x| of a block gets
/// code +-7.
#[test]
fn each_value_is_within_half_a_step_of_its_code() {
    let mut rng = Rng(0x1234_5678);
    let eps = f64::from(f32::EPSILON) / 2.0;
    for case in 0..400 {
        let block = [2usize, 4, 6, 64, 256][case % 5];
        let n = match case % 4 {
            0 => 1 + (rng.next() % block as u64) as usize, // at most one block
            1 => 1 + 2 * (rng.next() % 300) as usize,      // odd
            _ => (rng.next() % 700) as usize,
        };
        let mag = [1.0f32, 1.0e-30, 1.0e30, 3.0e4][(rng.next() % 4) as usize];
        let x: Vec<f32> = (0..n).map(|_| rng.unit() * mag).collect();
        let (mut c, mut s) = (
            vec![0u8; code_bytes_int4(n)],
            vec![0f32; scale_count(n, block)],
        );
        quantize_int4(&Exec::default(), &x, block, &mut c, &mut s).expect("lengths fit");
        let mut back = vec![0f32; n];
        dequantize_int4(&Exec::default(), &c, &s, block, &mut back).expect("lengths fit");
        for (b, xb) in x.chunks(block).enumerate() {
            let amax = xb.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
            let bound = amax / 14.0 + 4.0 * eps * amax;
            let mut top = 0;
            for (i, &v) in xb.iter().enumerate() {
                let k = b * block + i;
                let err = (f64::from(v) - f64::from(back[k])).abs();
                assert!(
                    err <= bound,
                    "case {case}, block {b} value {i}: {v} -> {}, error {err} > {bound}",
                    back[k]
                );
                let (lo, hi) = unpack_int4(c[k / 2]);
                let q = if k.is_multiple_of(2) { lo } else { hi };
                assert!((-7..=7).contains(&q), "code {q}");
                top = top.max(q.unsigned_abs());
            }
            if amax > 0.0 {
                assert_eq!(
                    top, 7,
                    "case {case}, block {b}: the largest value uses code 7"
                );
            }
        }
    }
}

/// Values q s with s a power of two and a 7 in each block are on the grid: s = 7 s / 7 and
/// inv = 1 / s are exact, so are x inv = q and q s, and the round trip is exact.
#[test]
fn values_on_the_grid_come_back_exactly() {
    let mut rng = Rng(42);
    for e in (-120..=120).step_by(7) {
        let s = 2f32.powi(e);
        for &block in &[2usize, 8, 64] {
            let n = 3 * block + 1;
            let mut x: Vec<f32> = (0..n)
                .map(|_| ((rng.next() % 15) as i32 - 7) as f32 * s)
                .collect();
            for b in (0..n).step_by(block) {
                x[b] = if rng.next().is_multiple_of(2) {
                    7.0 * s
                } else {
                    -7.0 * s
                };
            }
            let (mut c, mut sc) = (
                vec![0u8; code_bytes_int4(n)],
                vec![0f32; scale_count(n, block)],
            );
            quantize_int4(&Exec::default(), &x, block, &mut c, &mut sc).expect("lengths fit");
            assert!(sc.iter().all(|&v| v == s), "scales at 2^{e}");
            let mut back = vec![0f32; n];
            dequantize_int4(&Exec::default(), &c, &sc, block, &mut back).expect("lengths fit");
            assert_eq!(bits(&back), bits(&x), "round trip at 2^{e}, block {block}");
        }
    }
}

#[test]
fn nibbles_pack_low_first_and_sign_extend() {
    for lo in -8i8..=7 {
        for hi in -8i8..=7 {
            let b = pack_int4(lo, hi);
            assert_eq!(unpack_int4(b), (lo, hi));
            assert_eq!(
                b & 0x0F,
                lo as u8 & 0x0F,
                "low nibble holds the first value"
            );
        }
    }
    assert_eq!(pack_int4(-7, 7), 0x79);
    assert_eq!(pack_int4(2, -2), 0xE2);
}

#[test]
fn special_blocks_read_back_as_zeros_or_nan() {
    let block = 6;
    #[rustfmt::skip]
    let x = [
        0.0, -0.0, 0.0, 0.0, 0.0, 0.0,             // all zero: scale 0
        1.0e-40, -2.0e-38, 0.0, 1.0e-45, 0.0, 0.0,  // 7 / amax overflows: zeros
        1.0, f32::NAN, 2.0, 3.0, 0.0, 0.0,          // a NaN: the block reads back as NaN
        f32::INFINITY, 1.0, 0.0, 0.0, 0.0, 0.0,     // an infinity: NaN too
        -7.0, 7.0, 3.5, 0.5, 2.5, -1.5,             // ties round to even: 4, 0, 2, -2
        1.0, -2.0, 0.5,                             // odd tail: x 3.5 = 3.5, -7, 1.75
    ];
    let n = x.len();
    let mut c = vec![0xFFu8; code_bytes_int4(n)];
    let mut s = vec![0f32; scale_count(n, block)];
    quantize_int4(&Exec::default(), &x, block, &mut c, &mut s).expect("lengths fit");
    assert_eq!(&s[..2], &[0.0, 0.0]);
    assert!(s[2].is_nan() && s[3].is_nan());
    assert_eq!(&c[..12], &[0; 12]);
    assert_eq!(&c[12..], &[0x79, 0x04, 0xE2, 0x94, 0x02]);
    assert_eq!(s[4], 1.0);
    assert_eq!(s[5], 2.0 / 7.0);
    let mut back = vec![0f32; n];
    dequantize_int4(&Exec::default(), &c, &s, block, &mut back).expect("lengths fit");
    assert!(back[..12].iter().all(|v| *v == 0.0));
    assert!(back[12..24].iter().all(|v| v.is_nan()));
    assert_eq!(&back[24..30], &[-7.0, 7.0, 4.0, 0.0, 2.0, -2.0]);
    assert_eq!(back[30], 4.0 * (2.0f32 / 7.0));
}

#[test]
fn odd_blocks_and_wrong_lengths_are_errors() {
    let e = Exec::default();
    let x = [1.0f32; 11];
    let (mut c, mut s) = (vec![0u8; 6], vec![0f32; 3]);
    assert_eq!(code_bytes_int4(11), 6);
    assert_eq!(code_bytes_int4(0), 0);
    assert!(quantize_int4(&e, &x, 4, &mut c, &mut s).is_ok());
    for block in [0, 1, 3, 7] {
        let err = quantize_int4(&e, &x, block, &mut c, &mut s)
            .expect_err("odd block")
            .to_string();
        assert!(
            err.contains(&format!("block size {block}")) && err.contains("even"),
            "{err}"
        );
    }
    let err = quantize_int4(&e, &x, 4, &mut c[..5], &mut s)
        .expect_err("short codes")
        .to_string();
    assert!(
        err.contains("int4 code bytes") && err.contains('5') && err.contains('6'),
        "{err}"
    );
    assert!(quantize_int4(&e, &x, 4, &mut [0u8; 11], &mut s).is_err());
    assert!(quantize_int4(&e, &x, 4, &mut c, &mut s[..2]).is_err());
    let mut out = vec![0f32; 11];
    assert!(dequantize_int4(&e, &c, &s, 4, &mut out).is_ok());
    assert!(dequantize_int4(&e, &c, &s[..2], 4, &mut out).is_err());
    assert!(dequantize_int4(&e, &c[..5], &s, 4, &mut out).is_err());
    assert!(dequantize_int4(&e, &c, &s, 5, &mut out).is_err());
}
