//! Test helpers shared by the kernels' tests: every execution configuration the machine
//! can run, and seeded generators of awkward f32 inputs.

use crate::isa::{Exec, Isa};
use proptest::prelude::*;

/// Every level this CPU has, each on 1 and on 3 threads (3: chunk counts that do not
/// divide the lengths evenly).
pub(crate) fn execs() -> Vec<Exec> {
    let mut v = Vec::new();
    for isa in Isa::available() {
        for threads in [1, 3] {
            let e = Exec::default()
                .with_isa(isa)
                .and_then(|e| e.with_threads(threads));
            match e {
                Ok(e) => v.push(e),
                Err(err) => panic!("available level rejected: {err}"),
            }
        }
    }
    v
}

/// Values that break careless kernels: zeros, subnormals, the f32 and 16-bit range ends,
/// rounding ties, inf and NaN (quiet and signalling, both signs).
pub(crate) const SPECIALS: [f32; 20] = [
    0.0,
    -0.0,
    1.0e-45,
    -1.4e-45,
    1.1754942e-38,
    f32::MIN_POSITIVE,
    5.9604645e-8,
    2.9802322e-8,
    6.1035156e-5,
    65504.0,
    65520.0,
    -65536.0,
    f32::MAX,
    f32::MIN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    f32::from_bits(0x3F80_8000), // 1 + 2^-8: a bf16 tie
    -3.0e38,
    f32::from_bits(0x7F80_0001),
];

/// Any f32 at all: specials, raw bit patterns (every class), moderate values.
pub(crate) fn wild_f32() -> BoxedStrategy<f32> {
    prop_oneof![
        2 => proptest::sample::select(SPECIALS.to_vec()),
        3 => any::<u32>().prop_map(f32::from_bits),
        3 => -1.0e3f32..1.0e3,
    ]
    .boxed()
}

/// Finite values over a wide magnitude range (1e-30 .. 1e15, both signs, zero and
/// subnormals), for accuracy checks against f64 where f32 intermediates must not overflow.
pub(crate) fn finite_f32() -> BoxedStrategy<f32> {
    prop_oneof![
        1 => Just(0.0f32),
        1 => (1u32..0x0080_0000).prop_map(f32::from_bits),
        6 => (-30.0f64..15.0, any::<bool>()).prop_map(|(e, neg)| {
            let x = 10f64.powf(e) as f32;
            if neg { -x } else { x }
        }),
    ]
    .boxed()
}

/// Lengths that hit every tail: 0, 1, around the SIMD widths and a block, and longer.
pub(crate) fn length() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..=40, 4090usize..4110, 8000usize..9000]
}

/// `n` seeded values in `shift + scale * [-0.5, 0.5)` (xorshift), for the twins' tests.
pub(crate) fn vals(n: usize, seed: u64, scale: f32, shift: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale + shift
        })
        .collect()
}

/// `v` widened to f64.
pub(crate) fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}
