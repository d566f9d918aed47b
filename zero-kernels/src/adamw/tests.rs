//! AdamW: every level and thread count against `reference` bit for bit, on random inputs
//! of every kind (inf, NaN, subnormal, huge); the unfused multi-pass step against the
//! fused one bit for bit; the f32 step against an f64 evaluation of the same formula
//! within a stated bound; segments, groups, decay flags and argument errors.

use super::*;
use crate::simd::Sink;
use crate::testutil::{execs, finite_f32, length, wild_f32};
use half::{bf16, f16};
use proptest::prelude::*;

/// Random shard: gradient, master, m, v (v must be >= 0 for AdamW; a negative v is only
/// a NaN source, which the wild tests cover through the gradient instead).
fn shard(
    elem: BoxedStrategy<f32>,
) -> impl Strategy<Value = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>)> {
    length().prop_flat_map(move |n| {
        let v = proptest::collection::vec;
        (
            v(elem.clone(), n),
            v(elem.clone(), n),
            v(elem.clone(), n),
            v(elem.clone().prop_map(f32::abs).boxed(), n),
        )
    })
}

fn hyper() -> impl Strategy<Value = (AdamWHyper, u64, f32)> {
    (
        1e-5f64..1e-1,
        0.0f64..0.999,
        0.9f64..0.99999,
        1e-10f64..1e-6,
        0.0f64..0.3,
        1u64..5000,
        1e-6f32..2.0,
    )
        .prop_map(|(lr, beta1, beta2, eps, weight_decay, t, s)| {
            (
                AdamWHyper {
                    lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                },
                t,
                s,
            )
        })
}

/// Bitwise equality, except that any NaN equals any NaN: LLVM may commute the operands of
/// a float add or multiply, which changes which NaN payload propagates (Rust does not
/// specify NaN payloads); every non-NaN result must match bit for bit.
fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

fn same16<H: Copy + Into<f32> + PartialEq>(a: &[H], b: &[H]) -> bool {
    let (a, b): (Vec<f32>, Vec<f32>) = (
        a.iter().map(|&x| x.into()).collect(),
        b.iter().map(|&x| x.into()).collect(),
    );
    same(&a, &b)
}

/// The reference step for a gradient given as f32 values converted to `G`.
fn reference_run<G: crate::simd::SimdFloat, P: Sink + Default + Clone>(
    c: &AdamWCoeffs,
    g: &[G],
    p: &[f32],
    m: &[f32],
    v: &[f32],
    with_out: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<P>) {
    let (mut p, mut m, mut v) = (p.to_vec(), m.to_vec(), v.to_vec());
    let mut out = vec![P::default(); g.len()];
    reference::step(
        c,
        g,
        &mut p,
        &mut m,
        &mut v,
        with_out.then_some(&mut out[..]),
    );
    (p, m, v, out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn every_level_and_layout_matches_reference_bitwise(
        (g, p, m, v) in shard(wild_f32()),
        (h, t, s) in hyper(),
        decay in any::<bool>(),
    ) {
        let c = AdamWCoeffs::new(&h, t, s, decay).unwrap();
        let gb: Vec<bf16> = g.iter().map(|&x| bf16::from_f32(x)).collect();
        let gh: Vec<f16> = g.iter().map(|&x| f16::from_f32(x)).collect();
        for grad in [FloatSlice::F32(&g), FloatSlice::BF16(&gb), FloatSlice::F16(&gh)] {
            // The expected result, and the 16-bit copies, from the reference.
            let (wp, wm, wv, wb) = match grad {
                FloatSlice::F32(x) => reference_run::<_, bf16>(&c, x, &p, &m, &v, true),
                FloatSlice::BF16(x) => reference_run::<_, bf16>(&c, x, &p, &m, &v, true),
                FloatSlice::F16(x) => reference_run::<_, bf16>(&c, x, &p, &m, &v, true),
            };
            let wh: Vec<f16> = wp.iter().map(|&x| <f16 as crate::float::Float>::from_f32(x)).collect();
            for exec in execs() {
                for layout in 0..3 {
                    let (mut p2, mut m2, mut v2) = (p.clone(), m.clone(), v.clone());
                    let mut ob = vec![bf16::ZERO; g.len()];
                    let mut oh = vec![f16::ZERO; g.len()];
                    let out = match layout {
                        0 => None,
                        1 => Some(HalfSliceMut::BF16(&mut ob)),
                        _ => Some(HalfSliceMut::F16(&mut oh)),
                    };
                    run(&exec, &c, grad, AdamWState { master: &mut p2, m: &mut m2, v: &mut v2 }, out).unwrap();
                    prop_assert!(same(&p2, &wp), "master {:?} {:?} layout {}", exec, grad.dtype(), layout);
                    prop_assert!(same(&m2, &wm), "m {:?} {:?}", exec, grad.dtype());
                    prop_assert!(same(&v2, &wv), "v {:?} {:?}", exec, grad.dtype());
                    if layout == 1 {
                        prop_assert!(same16(&ob, &wb), "bf16 copy {:?}", exec);
                    }
                    if layout == 2 {
                        prop_assert!(same16(&oh, &wh), "f16 copy {:?}", exec);
                    }
                }
                // The unfused multi-pass step computes the same bits.
                let (mut p3, mut m3, mut v3) = (p.clone(), m.clone(), v.clone());
                let mut scratch = vec![0.0f32; g.len()];
                let mut ob = vec![bf16::ZERO; g.len()];
                unfused::run(&exec, &c, grad, AdamWState { master: &mut p3, m: &mut m3, v: &mut v3 },
                    Some(HalfSliceMut::BF16(&mut ob)), &mut scratch).unwrap();
                prop_assert!(same(&p3, &wp), "unfused master {:?}", exec);
                prop_assert!(same(&m3, &wm), "unfused m {:?}", exec);
                prop_assert!(same(&v3, &wv), "unfused v {:?}", exec);
                prop_assert!(same16(&ob, &wb), "unfused copy {:?}", exec);
            }
        }
    }

    /// Against f64: the same formula with f64 hyper-parameters and arithmetic. Bound, with
    /// u = 2^-24 and magnitudes A_m = beta1|m| + (1-beta1)|g|, A_v = beta2 v + (1-beta2) g^2:
    /// m within 8u A_m (g scaled: 1 rounding; beta, 1-beta to f32: 1 each; 2 products, 1
    /// sum), v within 16u A_v (g^2 adds 2 more), p within 16u (|p| + step_size A_m /
    /// denom) (decay, the numerator and the denominator each carry a few roundings; the
    /// denominator has no cancellation since v >= 0 and eps > 0), plus 1e-30 absolute for
    /// subnormal intermediates.
    #[test]
    fn close_to_f64(
        (g, p, m, v) in shard(finite_f32()),
        (h, t, s) in hyper(),
        decay in any::<bool>(),
    ) {
        let c = AdamWCoeffs::new(&h, t, s, decay).unwrap();
        let (mut p2, mut m2, mut v2) = (p.clone(), m.clone(), v.clone());
        run(&Exec::default(), &c, FloatSlice::F32(&g), AdamWState { master: &mut p2, m: &mut m2, v: &mut v2 }, None).unwrap();
        let u = 2f64.powi(-24);
        let ti = t as i32;
        let (b1, b2) = (h.beta1, h.beta2);
        for i in 0..g.len() {
            let gi = g[i] as f64 * s as f64;
            let (pi, mi, vi) = (p[i] as f64, m[i] as f64, v[i] as f64);
            let m64 = b1 * mi + (1.0 - b1) * gi;
            let v64 = b2 * vi + (1.0 - b2) * gi * gi;
            let denom = (v64 / (1.0 - b2.powi(ti))).sqrt() + h.eps;
            let step_size = h.lr / (1.0 - b1.powi(ti));
            let dec = if decay { 1.0 - h.lr * h.weight_decay } else { 1.0 };
            let p64 = pi * dec - step_size * m64 / denom;
            let am = b1 * mi.abs() + (1.0 - b1) * gi.abs();
            let av = b2 * vi + (1.0 - b2) * gi * gi;
            prop_assert!((m2[i] as f64 - m64).abs() <= 8.0 * u * am + 1e-30, "m i={} {} vs {}", i, m2[i], m64);
            prop_assert!((v2[i] as f64 - v64).abs() <= 16.0 * u * av + 1e-30, "v i={} {} vs {}", i, v2[i], v64);
            let bound = 16.0 * u * (pi.abs() + step_size * am / denom) + 1e-30;
            prop_assert!((p2[i] as f64 - p64).abs() <= bound, "p i={} {} vs {} (bound {:e})", i, p2[i], p64, bound);
        }
    }
}

#[test]
fn segments_use_their_group_and_decay_and_leave_padding_alone() {
    let n = 1000;
    let g: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.1)
        .collect();
    let p0: Vec<f32> = (0..n)
        .map(|i| ((i * 104729) % 97) as f32 / 40.0 - 1.2)
        .collect();
    let groups = [
        AdamWHyper::default(),
        AdamWHyper {
            lr: 1e-2,
            weight_decay: 0.0,
            ..Default::default()
        },
    ];
    let segments = [
        AdamWSegment {
            range: 0..300,
            group: 0,
            decay: true,
        },
        AdamWSegment {
            range: 300..301,
            group: 0,
            decay: false,
        },
        AdamWSegment {
            range: 320..900,
            group: 1,
            decay: true,
        },
    ];
    for exec in execs() {
        let (mut p, mut m, mut v) = (p0.clone(), vec![0.1f32; n], vec![0.2f32; n]);
        let mut out = vec![bf16::ZERO; n];
        step(
            &exec,
            &groups,
            &segments,
            3,
            0.5,
            FloatSlice::F32(&g),
            AdamWState {
                master: &mut p,
                m: &mut m,
                v: &mut v,
            },
            Some(HalfSliceMut::BF16(&mut out)),
        )
        .unwrap();
        for s in &segments {
            let c = AdamWCoeffs::new(&groups[s.group], 3, 0.5, s.decay).unwrap();
            for i in s.range.clone() {
                let (wp, wm, wv) = reference::update(&c, g[i], p0[i], 0.1, 0.2);
                assert_eq!(
                    (p[i].to_bits(), m[i].to_bits(), v[i].to_bits()),
                    (wp.to_bits(), wm.to_bits(), wv.to_bits()),
                    "i={i}"
                );
                assert_eq!(out[i], bf16::from_f32(wp), "copy i={i}");
            }
        }
        for i in (301..320).chain(900..n) {
            assert_eq!(
                (p[i], m[i], v[i], out[i]),
                (p0[i], 0.1, 0.2, bf16::ZERO),
                "padding i={i}"
            );
        }
    }
}

#[test]
fn bad_arguments_are_errors_with_the_numbers() {
    let h = AdamWHyper::default();
    let e = AdamWCoeffs::new(&h, 0, 1.0, true).unwrap_err();
    assert!(e.to_string().contains("got 0"), "{e}");
    let e = AdamWCoeffs::new(&AdamWHyper { beta2: 1.0, ..h }, 1, 1.0, true).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid AdamW hyper-parameter beta2 = 1: must lie in [0, 1)"
    );
    let e = check_segments(
        &[
            AdamWSegment {
                range: 0..5,
                group: 0,
                decay: true,
            },
            AdamWSegment {
                range: 4..6,
                group: 0,
                decay: true,
            },
        ],
        1,
        10,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("segment #1 (4..6, group 0): overlaps"),
        "{e}"
    );
    let e = check_segments(
        &[AdamWSegment {
            range: 0..11,
            group: 0,
            decay: true,
        }],
        1,
        10,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("past the end") && e.to_string().contains("numel 10"),
        "{e}"
    );
    let e = check_segments(
        &[AdamWSegment {
            range: 0..1,
            group: 2,
            decay: true,
        }],
        2,
        10,
    )
    .unwrap_err();
    assert!(e.to_string().contains("no such group"), "{e}");
    let (mut p, mut m, mut v) = (vec![0.0f32; 4], vec![0.0f32; 3], vec![0.0f32; 4]);
    let e = run(
        &Exec::default(),
        &AdamWCoeffs::new(&h, 1, 1.0, true).unwrap(),
        FloatSlice::F32(&[0.0; 4]),
        AdamWState {
            master: &mut p,
            m: &mut m,
            v: &mut v,
        },
        None,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "length mismatch: m has 3 elements, expected 4"
    );
}

/// Hyper-parameters that pass the f64 checks but whose f32 constants would be 0 or
/// infinite (then NaN weights: 0/0 where m = v = 0, inf * 0) are errors naming the value.
#[test]
fn hyper_parameters_that_break_in_f32_are_errors() {
    let h = AdamWHyper::default();
    let err = |h: AdamWHyper, t: u64, decay: bool| match AdamWCoeffs::new(&h, t, 1.0, decay) {
        Err(KernelError::BadHyper { name, why, .. }) => (name, why),
        other => panic!("{h:?} at step {t}: {other:?}"),
    };
    // eps rounds to +0 in f32 below about 7e-46, to inf above f32::MAX.
    for eps in [1e-46, 6e-46, 1e39, f64::MAX] {
        let (name, why) = err(AdamWHyper { eps, ..h }, 1, true);
        assert_eq!(name, "eps");
        assert!(why.contains("in f32"), "{why}");
    }
    // lr / (1 - beta1^t): lr itself past f32::MAX, or a moderate lr over a tiny bias
    // correction (beta1 just under 1 at step 1).
    for (lr, beta1) in [
        (1e39, 0.0),
        (f64::MAX, 0.9),
        (1e30, 1.0 - f64::EPSILON / 2.0),
    ] {
        let (name, why) = err(AdamWHyper { lr, beta1, ..h }, 1, false);
        assert_eq!(name, "lr");
        assert!(why.contains("step size"), "{why}");
    }
    // 1 - lr * weight_decay below -f32::MAX, only where decay applies.
    let big = AdamWHyper {
        lr: 1e20,
        weight_decay: 1e20,
        ..h
    };
    assert_eq!(err(big, 3, true).0, "weight_decay");
    assert_eq!(AdamWCoeffs::new(&big, 3, 1.0, false).unwrap().decay, 1.0);
    let e = AdamWCoeffs::new(&AdamWHyper { eps: 1e-46, ..h }, 1, 1.0, true).unwrap_err();
    let e = e.to_string();
    assert!(
        e.contains("hyper-parameter eps = ") && e.contains("rounds to 0"),
        "{e}"
    );
    // The smallest eps that survives (f32's least subnormal) still works, and a step with
    // m = v = g = 0 then leaves the weights finite.
    let tiny = AdamWHyper { eps: 1e-45, ..h };
    assert!(AdamWCoeffs::new(&tiny, 1, 1.0, true).unwrap().eps > 0.0);
    let (mut p, mut m, mut v) = (vec![1.0f32; 3], vec![0.0f32; 3], vec![0.0f32; 3]);
    let seg = [AdamWSegment {
        range: 0..3,
        group: 0,
        decay: true,
    }];
    step(
        &Exec::default(),
        &[tiny],
        &seg,
        1,
        1.0,
        FloatSlice::F32(&[0.0; 3]),
        AdamWState {
            master: &mut p,
            m: &mut m,
            v: &mut v,
        },
        None,
    )
    .unwrap();
    assert!(p.iter().all(|x| x.is_finite()), "{p:?}");
    // The whole step refuses an eps that rounds to 0, before touching the state.
    let e = step(
        &Exec::default(),
        &[AdamWHyper { eps: 1e-46, ..h }],
        &seg,
        1,
        1.0,
        FloatSlice::F32(&[0.0; 3]),
        AdamWState {
            master: &mut p,
            m: &mut m,
            v: &mut v,
        },
        None,
    )
    .unwrap_err();
    assert!(
        matches!(e, KernelError::BadHyper { name: "eps", .. }),
        "{e}"
    );
    assert!(p.iter().all(|x| x.is_finite()), "{p:?}");
}

#[test]
fn shaped_copy_moves_the_same_streams() {
    let n = 37;
    let g: Vec<bf16> = (0..n).map(|i| bf16::from_f32(i as f32)).collect();
    for exec in execs() {
        let (mut p, mut m, mut v) = (vec![1.0f32; n], vec![2.0f32; n], vec![3.0f32; n]);
        let mut out = vec![bf16::ZERO; n];
        roofline::shaped_copy(
            &exec,
            FloatSlice::BF16(&g),
            AdamWState {
                master: &mut p,
                m: &mut m,
                v: &mut v,
            },
            Some(HalfSliceMut::BF16(&mut out)),
        )
        .unwrap();
        for i in 0..n {
            let x = i as f32;
            assert_eq!(
                (p[i], m[i], v[i], out[i].to_f32()),
                (1.0 + x, 2.0 + x, 3.0 + x, 1.0 + x),
                "{exec:?} i={i}"
            );
        }
    }
}
