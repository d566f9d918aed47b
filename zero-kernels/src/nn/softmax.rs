//! Softmax of one row with a causal prefix (the attention probabilities), forward and
//! backward, in place; and the same over a band of consecutive causal rows, which sums
//! several rows at a time (same bits as row by row; attention calls these).

use super::scalar::{interleaved_sums, Scalar, SUM_ROWS};

/// Softmax of one row in place, so it sums to 1: p_j = e^(z_j - max) / sum_k e^(z_k - max)
/// over the first `valid` columns (subtracting the max so no exponent overflows); the rest
/// are set to exactly 0 (the causal mask).
///
/// # Panics
/// If `valid > row.len()`.
#[inline(always)]
pub fn softmax_row_inplace<F: Scalar>(row: &mut [F], valid: usize) {
    let max = row_max(&row[..valid]);
    // The exponentials in a loop of their own, which vectorises; the sum stays a scalar
    // loop in column order (the same bits as summing as they are computed).
    row[..valid].iter_mut().for_each(|v| *v = (*v - max).exp());
    let mut sum = F::ZERO;
    row[..valid].iter().for_each(|&v| sum += v);
    let inv = F::ONE / sum;
    row[..valid].iter_mut().for_each(|v| *v *= inv);
    row[valid..].iter_mut().for_each(|v| *v = F::ZERO);
}

/// [`softmax_row_inplace`] of consecutive causal rows, with the same bits: `rows` holds
/// rows `first, first + 1, ...` of width `t`, and row `i` has `i + 1` valid columns.
/// [`SUM_ROWS`] rows at a time sum the prefix they share interleaved (each row in
/// column order), then each its own tail.
#[inline(always)]
pub(crate) fn softmax_causal_rows<F: Scalar>(rows: &mut [F], t: usize, first: usize) {
    let n = rows.len() / t;
    let full = n / SUM_ROWS * SUM_ROWS;
    for k in (0..full).step_by(SUM_ROWS) {
        let group = &mut rows[k * t..(k + SUM_ROWS) * t];
        softmax_causal_group::<F, SUM_ROWS>(group, t, first + k);
    }
    for k in full..n {
        softmax_causal_group::<F, 1>(&mut rows[k * t..(k + 1) * t], t, first + k);
    }
}

/// [`softmax_causal_rows`] of `G` rows.
#[inline(always)]
fn softmax_causal_group<F: Scalar, const G: usize>(rows: &mut [F], t: usize, first: usize) {
    for (g, row) in rows.chunks_exact_mut(t).take(G).enumerate() {
        let valid = first + g + 1;
        let max = row_max(&row[..valid]);
        row[..valid].iter_mut().for_each(|v| *v = (*v - max).exp());
    }
    let shared = first + 1;
    let mut sums: [F; G] = interleaved_sums(shared, |g, j| rows[g * t + j]);
    for (g, (row, sum)) in rows.chunks_exact_mut(t).zip(&mut sums).enumerate() {
        let valid = first + g + 1;
        row[shared..valid].iter().for_each(|&v| *sum += v);
        let inv = F::ONE / *sum;
        row[..valid].iter_mut().for_each(|v| *v *= inv);
        row[valid..].iter_mut().for_each(|v| *v = F::ZERO);
    }
}

/// [`softmax_row_backward_inplace`] of consecutive causal rows (as
/// [`softmax_causal_rows`]: `d` and `p` hold rows `first, ...` of width `t`), with the
/// same bits; the rows' dot products run interleaved.
#[inline(always)]
pub(crate) fn softmax_causal_rows_backward<F: Scalar>(
    d: &mut [F],
    p: &[F],
    t: usize,
    first: usize,
) {
    let n = d.len() / t;
    let full = n / SUM_ROWS * SUM_ROWS;
    for k in (0..full).step_by(SUM_ROWS) {
        let rows = k * t..(k + SUM_ROWS) * t;
        softmax_causal_group_backward::<F, SUM_ROWS>(&mut d[rows.clone()], &p[rows], t, first + k);
    }
    for k in full..n {
        let row = k * t..(k + 1) * t;
        softmax_causal_group_backward::<F, 1>(&mut d[row.clone()], &p[row], t, first + k);
    }
}

/// [`softmax_causal_rows_backward`] of `G` rows.
#[inline(always)]
fn softmax_causal_group_backward<F: Scalar, const G: usize>(
    d: &mut [F],
    p: &[F],
    t: usize,
    first: usize,
) {
    let shared = first + 1;
    let mut dots: [F; G] = interleaved_sums(shared, |g, j| p[g * t + j] * d[g * t + j]);
    let rows = d.chunks_exact_mut(t).zip(p.chunks_exact(t)).zip(&mut dots);
    for (g, ((d, p), dot)) in rows.enumerate() {
        let valid = first + g + 1;
        for j in shared..valid {
            *dot += p[j] * d[j];
        }
        for j in 0..valid {
            d[j] = p[j] * (d[j] - *dot);
        }
        d[valid..].iter_mut().for_each(|v| *v = F::ZERO);
    }
}

/// Lanes of [`row_max`]: one AVX-512 vector of f32.
const MAX_LANES: usize = 16;

/// The maximum of `v` as the loop `if x > max { max = x }` from `F::MIN` finds it (NaNs
/// skipped), kept in [`MAX_LANES`] interleaved lanes (element j in lane j % 16, then the
/// lanes and the tail in order) so that it vectorises: the plain loop is one chain of
/// dependent compares. Max is exact, so both give the same value, up to the sign of a
/// zero maximum (each keeps the first zero it meets); the callers only compute `x - max`
/// with it, whose exponential (and `ln(sum) - (x - max)`) is the same for +0 and -0
/// (tested; the GPU order's `butterfly_max` rests on the same fact).
#[inline(always)]
pub(crate) fn row_max<F: Scalar>(v: &[F]) -> F {
    let mut lanes = [F::MIN; MAX_LANES];
    let mut blocks = v.chunks_exact(MAX_LANES);
    for block in &mut blocks {
        for (m, &x) in lanes.iter_mut().zip(block) {
            if x > *m {
                *m = x;
            }
        }
    }
    let mut max = F::MIN;
    for &x in lanes.iter().chain(blocks.remainder()) {
        if x > max {
            max = x;
        }
    }
    max
}

/// Softmax backward over one row, in place (**writes**): `d <- p * (d - sum(p * d))` over
/// the first `valid` columns, 0 beyond (masked positions get no gradient).
///
/// # Panics
/// If `valid` exceeds `d.len()` or `p.len()`.
#[inline(always)]
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
    use crate::nn::xent::softmax_xent_forward;

    #[test]
    fn causal_rows_summed_together_give_the_bits_of_one_row_at_a_time() {
        // Bands starting at several rows, 0 to 2 groups of SUM_ROWS and a remainder.
        let t = 45;
        for (first, n) in [(0, 3), (0, 8), (5, 19), (13, 32), (40, 5)] {
            let z: Vec<f32> = crate::testutil::vals(n * t, first as u64, 20.0, 0.0);
            let dy: Vec<f32> = crate::testutil::vals(n * t, 99, 2.0, 0.0);
            let (mut p, mut p1) = (z.clone(), z.clone());
            softmax_causal_rows(&mut p, t, first);
            let (mut d, mut d1) = (dy.clone(), dy.clone());
            softmax_causal_rows_backward(&mut d, &p, t, first);
            for k in 0..n {
                let row = k * t..(k + 1) * t;
                softmax_row_inplace(&mut p1[row.clone()], first + k + 1);
                softmax_row_backward_inplace(&mut d1[row.clone()], &p1[row], first + k + 1);
            }
            assert_eq!(bits(&p), bits(&p1), "forward, rows {first}..{}", first + n);
            assert_eq!(bits(&d), bits(&d1), "backward, rows {first}..{}", first + n);
        }
    }

    /// The running max the kernels took before [`row_max`].
    fn running_max(v: &[f32]) -> f32 {
        let mut max = f32::MIN;
        v.iter().for_each(|&x| {
            if x > max {
                max = x
            }
        });
        max
    }

    /// Bits, every NaN as one.
    fn bits(v: &[f32]) -> Vec<u32> {
        let one = |x: &f32| if x.is_nan() { u32::MAX } else { x.to_bits() };
        v.iter().map(one).collect()
    }

    #[test]
    fn lane_max_gives_the_running_maxs_softmax_and_loss_bits() {
        // Rows whose maximum is often a zero of either sign (first met at any lane), with
        // NaN, -inf and the f32 range end; lengths across the 16 lanes and their tail.
        let pool = [
            -0.0f32,
            0.0,
            -1.5,
            f32::NAN,
            -3.0,
            f32::NEG_INFINITY,
            f32::MIN,
            2.5,
        ];
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for len in 1..80 {
            for trial in 0..24 {
                let row: Vec<f32> = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        // Half the rows have no positive value: their max is a zero.
                        pool[(state >> 33) as usize % (pool.len() - trial % 2)]
                    })
                    .collect();
                let (lane, running) = (row_max(&row), running_max(&row));
                assert!(lane == running, "len {len}: {lane} vs {running}");
                // The softmax with each maximum (the rest of the body as it is).
                let softmax = |max: f32| {
                    let e: Vec<f32> = row.iter().map(|&x| (x - max).exp()).collect();
                    let mut sum = 0.0f32;
                    e.iter().for_each(|&x| sum += x);
                    let loss = sum.ln() - (row[len / 2] - max);
                    (e, loss)
                };
                let ((e1, l1), (e2, l2)) = (softmax(lane), softmax(running));
                assert_eq!(bits(&e1), bits(&e2), "len {len}: exponentials");
                assert_eq!(bits(&[l1]), bits(&[l2]), "len {len}: loss");
                // And the kernels themselves run on such rows.
                let mut p = row.clone();
                softmax_row_inplace(&mut p, len);
                let (mut z, mut l) = (row.clone(), [0.0f32]);
                softmax_xent_forward(&mut z, &mut l, &[(len / 2) as u32], len);
                assert_eq!(bits(&p), bits(&z), "len {len}: softmax vs cross-entropy");
            }
        }
    }

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
