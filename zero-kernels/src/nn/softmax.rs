//! Softmax of one row with a causal prefix (the attention probabilities), forward and
//! backward, in place.

use super::scalar::Scalar;

/// Softmax of one row in place, so it sums to 1: p_j = e^(z_j - max) / sum_k e^(z_k - max)
/// over the first `valid` columns (subtracting the max so no exponent overflows); the rest
/// are set to exactly 0 (the causal mask).
///
/// # Panics
/// If `valid > row.len()`.
pub fn softmax_row_inplace<F: Scalar>(row: &mut [F], valid: usize) {
    let mut max = F::MIN;
    row[..valid].iter().for_each(|&v| {
        if v > max {
            max = v
        }
    });
    let mut sum = F::ZERO;
    for v in row[..valid].iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = F::ONE / sum;
    row[..valid].iter_mut().for_each(|v| *v *= inv);
    row[valid..].iter_mut().for_each(|v| *v = F::ZERO);
}

/// Softmax backward over one row, in place (**writes**): `d <- p * (d - sum(p * d))` over
/// the first `valid` columns, 0 beyond (masked positions get no gradient).
///
/// # Panics
/// If `valid` exceeds `d.len()` or `p.len()`.
pub fn softmax_row_backward_inplace<F: Scalar>(d: &mut [F], p: &[F], valid: usize) {
    let mut dot = F::ZERO;
    for j in 0..valid {
        dot += p[j] * d[j];
    }
    for j in 0..valid {
        d[j] = p[j] * (d[j] - dot);
    }
    d[valid..].iter_mut().for_each(|v| *v = F::ZERO);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_row_sums_to_one_and_masks() {
        let mut row = [1.0f64, 3.0, -2.0, 7.0, 9.0];
        softmax_row_inplace(&mut row, 3);
        let s: f64 = row[..3].iter().sum();
        assert!((s - 1.0).abs() < 1e-15);
        assert_eq!(&row[3..], &[0.0, 0.0]);
        let e = [1.0f64.exp(), 3.0f64.exp(), (-2.0f64).exp()];
        let z: f64 = e.iter().sum();
        for j in 0..3 {
            assert!((row[j] - e[j] / z).abs() < 1e-15);
        }
    }

    #[test]
    fn softmax_row_backward_matches_central_differences() {
        // L = sum_j w_j softmax(z)_j over the first 4 of 6 columns: dL/dz by the backward
        // against (L(z + h e_i) - L(z - h e_i)) / 2h.
        let z = [0.3f64, -1.2, 2.0, 0.7, 5.0, -5.0];
        let w = [0.5f64, -2.0, 1.5, 3.0, 9.0, 9.0];
        let valid = 4;
        let loss = |z: &[f64]| {
            let mut p = z.to_vec();
            softmax_row_inplace(&mut p, valid);
            p.iter().zip(&w).map(|(p, w)| p * w).sum::<f64>()
        };
        let mut p = z.to_vec();
        softmax_row_inplace(&mut p, valid);
        let mut d = w.to_vec();
        softmax_row_backward_inplace(&mut d, &p, valid);
        let h = 1e-6;
        for i in 0..z.len() {
            let (mut zp, mut zm) = (z, z);
            zp[i] += h;
            zm[i] -= h;
            let fd = if i < valid {
                (loss(&zp) - loss(&zm)) / (2.0 * h)
            } else {
                0.0
            };
            assert!((d[i] - fd).abs() < 1e-8, "column {i}: {} vs {fd}", d[i]);
        }
    }
}
