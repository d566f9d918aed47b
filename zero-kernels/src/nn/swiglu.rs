//! SwiGLU's gate (Shazeer 2020; Llama's `FeedForward`: `w2(silu(w1 x) * w3 x)`), the
//! elementwise part between the matrix products: `out = silu(a) * b`, silu(a) = a
//! sigmoid(a), with a = x w1^T and b = x w3^T.

use super::scalar::Scalar;

/// The logistic sigmoid 1/(1 + e^-a).
#[inline(always)]
fn sigmoid<F: Scalar>(a: F) -> F {
    F::ONE / (F::ONE + (F::ZERO - a).exp())
}

/// Writes `out = silu(a) * b` elementwise. Elements past the shortest slice are not
/// touched.
#[inline(always)]
pub fn swiglu_forward<F: Scalar>(out: &mut [F], a: &[F], b: &[F]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = a * sigmoid(a) * b;
    }
}

/// SwiGLU backward. **Writes** `da = dout * b * silu'(a)` and `db = dout * silu(a)`, with
/// silu'(a) = sigmoid(a) (1 + a (1 - sigmoid(a))).
#[inline(always)]
pub fn swiglu_backward<F: Scalar>(da: &mut [F], db: &mut [F], dout: &[F], a: &[F], b: &[F]) {
    for ((((da, db), &d), &a), &b) in da.iter_mut().zip(db.iter_mut()).zip(dout).zip(a).zip(b) {
        let s = sigmoid(a);
        *da = d * b * s * (F::ONE + a * (F::ONE - s));
        *db = d * a * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::testvals::{central_difference, vals};

    #[test]
    fn forward_f32_matches_f64_reference() {
        let (a, b) = (vals(57, 1), vals(57, 2));
        let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
        let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
        let mut o32 = vec![0.0f32; 57];
        swiglu_forward(&mut o32, &a32, &b32);
        for i in 0..57 {
            let want = a[i] / (1.0 + (-a[i]).exp()) * b[i];
            // f32 with a fast exp: a few ulps of values of order 1.
            assert!((o32[i] as f64 - want).abs() < 1e-5, "{i}");
        }
    }

    #[test]
    fn backward_matches_central_differences_f64() {
        let n = 23;
        let (a, b, g) = (vals(n, 3), vals(n, 4), vals(n, 5));
        let loss = |a: &[f64], b: &[f64]| {
            let mut o = vec![0.0; n];
            swiglu_forward(&mut o, a, b);
            o.iter().zip(&g).map(|(o, g)| o * g).sum::<f64>()
        };
        let (mut da, mut db) = (vec![9.0; n], vec![9.0; n]);
        swiglu_backward(&mut da, &mut db, &g, &a, &b);
        for i in 0..n {
            let want_a = central_difference(&a, i, |ae| loss(ae, &b));
            let want_b = central_difference(&b, i, |be| loss(&a, be));
            assert!((da[i] - want_a).abs() < 1e-8, "da[{i}]");
            assert!((db[i] - want_b).abs() < 1e-8, "db[{i}]");
        }
    }
}
