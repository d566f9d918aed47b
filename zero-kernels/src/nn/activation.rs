//! GELU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2's `gelu`, llm.c's
//! `gelu_forward` / `gelu_backward`), elementwise.

use super::scalar::Scalar;

/// sqrt(2/pi), the GELU tanh approximation's constant (Hendrycks & Gimpel 2016).
const GELU_S: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the approximation.
const GELU_K: f64 = 0.044_715;

/// GELU, tanh approximation, written into `out`: y = 0.5 x (1 + tanh(s (x + k x^3))),
/// s = sqrt(2/pi), k = 0.044715. Elements past the shorter slice are not touched.
#[inline(always)]
pub fn gelu_forward<F: Scalar>(out: &mut [F], x: &[F]) {
    let (s, k, half) = (F::from_f64(GELU_S), F::from_f64(GELU_K), F::from_f64(0.5));
    for (o, &v) in out.iter_mut().zip(x) {
        *o = half * v * (F::ONE + (s * (v + k * v * v * v)).tanh());
    }
}

/// GELU backward, in place (**writes**): `d <- d * gelu'(x)` with
/// gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 k x^2), t = tanh(s (x + k x^3)).
#[inline(always)]
pub fn gelu_backward_inplace<F: Scalar>(d: &mut [F], x: &[F]) {
    let (s, k, half) = (F::from_f64(GELU_S), F::from_f64(GELU_K), F::from_f64(0.5));
    let three = F::from_f64(3.0);
    for (g, &v) in d.iter_mut().zip(x) {
        let t = (s * (v + k * v * v * v)).tanh();
        let dt = s * (F::ONE + three * k * v * v);
        *g *= half * (F::ONE + t) + half * v * (F::ONE - t * t) * dt;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_matches_formula_and_backward_central_differences_f64() {
        let x: Vec<f64> = (0..41).map(|i| (i as f64 - 20.0) * 0.23).collect();
        let mut y = vec![0.0; x.len()];
        gelu_forward(&mut y, &x);
        let gelu = |v: f64| {
            0.5 * v
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
        };
        let mut d = vec![1.0; x.len()];
        gelu_backward_inplace(&mut d, &x);
        let h = 1e-5;
        for (i, &v) in x.iter().enumerate() {
            assert!((y[i] - gelu(v)).abs() < 1e-15, "gelu({v})");
            let fd = (gelu(v + h) - gelu(v - h)) / (2.0 * h);
            assert!((d[i] - fd).abs() < 1e-9, "gelu'({v}): {} vs {fd}", d[i]);
        }
    }

    #[test]
    fn f32_tracks_f64() {
        let x: Vec<f32> = (0..200).map(|i| (i as f32 - 100.0) * 0.07).collect();
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let (mut y, mut y64) = (vec![0.0f32; x.len()], vec![0.0f64; x.len()]);
        gelu_forward(&mut y, &x);
        gelu_forward(&mut y64, &x64);
        for (a, b) in y.iter().zip(&y64) {
            assert!((*a as f64 - b).abs() < 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}
