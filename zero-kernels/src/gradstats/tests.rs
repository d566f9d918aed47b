//! Gradient statistics: every level and thread count against `reference` bit for bit
//! (the summation order is fixed), the non-finite flag against a direct scan, the in-place
//! unscale against `g * scale`, and the sum against a compensated sum within the error
//! bound of the fixed order.

use super::*;
use crate::testutil::{execs, finite_f32, length, wild_f32};
use half::{bf16, f16};
use proptest::prelude::*;

fn same_sum(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_level_matches_reference_bitwise(
        g in length().prop_flat_map(|n| proptest::collection::vec(wild_f32(), n)),
        scale in prop_oneof![Just(1.0f32), 1e-6f32..4.0, Just(0.0f32)],
    ) {
        let gb: Vec<bf16> = g.iter().map(|&x| bf16::from_f32(x)).collect();
        let gh: Vec<f16> = g.iter().map(|&x| f16::from_f32(x)).collect();
        for grad in [FloatSlice::F32(&g), FloatSlice::BF16(&gb), FloatSlice::F16(&gh)] {
            let (want, any_bad) = match grad {
                FloatSlice::F32(x) => (reference::sum_squares(x, scale), x.iter().any(|v| !(v * scale).is_finite())),
                FloatSlice::BF16(x) => (reference::sum_squares(x, scale), x.iter().any(|v| !(v.to_f32() * scale).is_finite())),
                FloatSlice::F16(x) => (reference::sum_squares(x, scale), x.iter().any(|v| !(v.to_f32() * scale).is_finite())),
            };
            for exec in execs() {
                let s = stats(&exec, grad, scale);
                prop_assert!(same_sum(s.sum_squares, want), "{:?} {:?}: {} vs {}", exec, grad.dtype(), s.sum_squares, want);
                prop_assert_eq!(s.nonfinite, any_bad, "{:?} {:?}", exec, grad.dtype());
            }
        }
        for exec in execs() {
            let mut u = g.clone();
            let s = unscale_in_place(&exec, &mut u, scale);
            prop_assert!(same_sum(s.sum_squares, reference::sum_squares(&g, scale)), "{:?}", exec);
            let ok = u.iter().zip(&g).all(|(a, b)| { let w = b * scale; a.to_bits() == w.to_bits() || (a.is_nan() && w.is_nan()) });
            prop_assert!(ok, "unscaled values {:?}", exec);
        }
    }

    /// All terms are >= 0, so recursive summation errs by at most (depth) * 2^-53 * sum,
    /// depth = BLOCK/16 lane additions + 4 folds + one per block.
    #[test]
    fn close_to_compensated_sum(
        g in length().prop_flat_map(|n| proptest::collection::vec(finite_f32(), n)),
        scale in 1e-3f32..4.0,
    ) {
        let s = stats(&Exec::default(), FloatSlice::F32(&g), scale);
        // Neumaier's compensated sum of the exact f64 squares.
        let (mut sum, mut comp) = (0.0f64, 0.0f64);
        for &x in &g {
            let d = (x * scale) as f64;
            let t = sum + d * d;
            comp += if sum.abs() >= (d * d).abs() { (sum - t) + d * d } else { (d * d - t) + sum };
            sum = t;
        }
        let exact = sum + comp;
        let depth = (reference::BLOCK / 16 + 4 + g.len() / reference::BLOCK + 1) as f64;
        prop_assert!(!s.nonfinite);
        prop_assert!((s.sum_squares - exact).abs() <= depth * 2f64.powi(-53) * exact, "{} vs {}", s.sum_squares, exact);
    }
}

#[test]
fn one_inf_or_nan_anywhere_is_detected() {
    let n = 3 * reference::BLOCK + 5;
    for exec in execs() {
        for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            for at in [0, 17, reference::BLOCK, n - 1] {
                let mut g = vec![0.5f32; n];
                g[at] = bad;
                let s = stats(&exec, FloatSlice::F32(&g), 1.0);
                assert!(s.nonfinite, "{exec:?} {bad} at {at}");
            }
        }
        // Finite but overflowing once scaled: the optimizer would see inf, so it counts.
        let s = stats(&exec, FloatSlice::F32(&[3.0e38; 3]), 2.0);
        assert!(s.nonfinite, "{exec:?} overflow after scaling");
        let s = stats(&exec, FloatSlice::F32(&[3.0e38; 3]), 1.0);
        assert!(
            !s.nonfinite && s.sum_squares > 2.6e77,
            "{exec:?} large but finite"
        );
    }
}
