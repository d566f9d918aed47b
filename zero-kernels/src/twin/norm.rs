//! CPU twin of `src/nn/cuda/norm.cu`: LayerNorm with the semantics (and signatures) of
//! [`crate::nn::layernorm_forward`] / [`crate::nn::layernorm_backward`], in the GPU
//! kernels' order:
//!
//! - forward, one warp per row: mean = (warp sum of x) * (1/C), var = (warp sum of
//!   (x - mean)^2) * (1/C), each a [`warp_strided_sum`] (lane l takes columns l, l + 32,
//!   .., then the xor butterfly); rstd = 1 / sqrt(var + eps); out = ((x - mean) rstd) w + b;
//! - backward: dx per row from the warp sums of g = dout w and g n (n = (x - mean) rstd);
//!   dw, db as column sums in chunks of [`CHUNK_ROWS`] rows ([`chunk_partials`]) folded
//!   over chunks ([`fold_columns`]).

use super::reduce::{fold_columns, warp_strided_sum};
use super::rows::{chunk_partials, CHUNK_ROWS};
use crate::nn::{Scalar, LN_EPS};

/// LayerNorm forward (**writes** `out`, `mean`, `rstd`), GPU order.
///
/// # Panics
/// As [`crate::nn::layernorm_forward`]: `mean`, `rstd` shorter than the rows, `w`, `b`
/// shorter than `c`.
pub fn layernorm_forward<F: Scalar>(
    out: &mut [F],
    mean: &mut [F],
    rstd: &mut [F],
    x: &[F],
    w: &[F],
    b: &[F],
    c: usize,
) {
    let inv_c = F::from_f64(1.0 / c as f64);
    let eps = F::from_f64(LN_EPS);
    for (r, (xr, or)) in x.chunks_exact(c).zip(out.chunks_exact_mut(c)).enumerate() {
        let m = warp_strided_sum(c, |j| xr[j]) * inv_c;
        let var = warp_strided_sum(c, |j| (xr[j] - m) * (xr[j] - m)) * inv_c;
        let s = F::ONE / (var + eps).sqrt();
        for j in 0..c {
            or[j] = (xr[j] - m) * s * w[j] + b[j];
        }
        mean[r] = m;
        rstd[r] = s;
    }
}

/// LayerNorm backward, GPU order. **Adds** into `dx` `[rows, c]`, `dw` and `db` `[c]`:
/// dx += rstd ((g - mean(g)) - n mean(g n)), dw += column sums of dout n, db += column
/// sums of dout.
///
/// # Panics
/// As [`crate::nn::layernorm_backward`].
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward<F: Scalar>(
    dx: &mut [F],
    dw: &mut [F],
    db: &mut [F],
    dout: &[F],
    x: &[F],
    w: &[F],
    mean: &[F],
    rstd: &[F],
    c: usize,
) {
    let rows = dx.len().min(x.len()).min(dout.len()) / c;
    let inv_c = F::from_f64(1.0 / c as f64);
    let n_of = |r: usize, j: usize| (x[r * c + j] - mean[r]) * rstd[r];
    for (r, dxr) in dx.chunks_exact_mut(c).take(rows).enumerate() {
        let dr = &dout[r * c..][..c];
        let g_mean = warp_strided_sum(c, |j| dr[j] * w[j]) * inv_c;
        let gn_mean = warp_strided_sum(c, |j| dr[j] * w[j] * n_of(r, j)) * inv_c;
        for (j, d) in dxr.iter_mut().enumerate() {
            let n = n_of(r, j);
            let g = dr[j] * w[j];
            *d += (g - g_mean - n * gn_mean) * rstd[r];
        }
    }
    let chunks = rows.div_ceil(CHUNK_ROWS);
    let pw = chunk_partials(rows, c, |r, j| dout[r * c + j] * n_of(r, j));
    let pb = chunk_partials(rows, c, |r, j| dout[r * c + j]);
    fold_columns(dw, &pw, chunks, c);
    fold_columns(db, &pb, chunks, c);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn;
    use crate::testutil::{vals, wide};

    /// (rows, C): rows not a multiple of 32 or of a chunk, C below 32, not a multiple of
    /// 4 or 32, one row, GPT-2's 768.
    const SHAPES: [(usize, usize); 9] = [
        (1, 1),
        (1, 7),
        (2, 31),
        (3, 33),
        (5, 64),
        (31, 100),
        (33, 5),
        (70, 768),
        (129, 45),
    ];

    /// |a - b| <= tol (1 + |b|) elementwise, with the place of the first miss.
    fn close(what: &str, a: &[f32], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x as f64 - y).abs() <= tol * (1.0 + y.abs()),
                "{what}[{i}]: {x} vs {y}"
            );
        }
    }

    #[test]
    fn forward_tracks_the_cpu_kernel_and_f64() {
        for (seed, &(rows, c)) in SHAPES.iter().enumerate() {
            let seed = seed as u64;
            let x = vals(rows * c, seed, 4.0, 0.7);
            let w = vals(c, seed + 10, 1.0, 1.0);
            let b = vals(c, seed + 20, 0.5, 0.0);
            let mut t = (
                vec![0.0f32; rows * c],
                vec![0.0f32; rows],
                vec![0.0f32; rows],
            );
            layernorm_forward(&mut t.0, &mut t.1, &mut t.2, &x, &w, &b, c);
            let mut h = t.clone();
            nn::layernorm_forward(&mut h.0, &mut h.1, &mut h.2, &x, &w, &b, c);
            let mut e = (
                vec![0.0f64; rows * c],
                vec![0.0f64; rows],
                vec![0.0f64; rows],
            );
            nn::layernorm_forward(
                &mut e.0,
                &mut e.1,
                &mut e.2,
                &wide(&x),
                &wide(&w),
                &wide(&b),
                c,
            );
            close("out vs f64", &t.0, &e.0, 1e-5);
            close("mean vs f64", &t.1, &e.1, 1e-6);
            close("rstd vs f64", &t.2, &e.2, 1e-5);
            close("out vs cpu", &t.0, &wide(&h.0), 1e-5);
            close("rstd vs cpu", &t.2, &wide(&h.2), 1e-5);
            // Under 32 columns each lane holds at most one term: the butterfly adds them
            // in another order than the CPU's, but a single column is exact.
            if c == 1 {
                assert_eq!(t.0, h.0);
            }
        }
    }

    #[test]
    fn backward_tracks_the_cpu_kernel_and_f64() {
        for (seed, &(rows, c)) in SHAPES.iter().enumerate() {
            let seed = seed as u64 + 100;
            let x = vals(rows * c, seed, 4.0, 0.7);
            let w = vals(c, seed + 1, 1.0, 1.0);
            let b = vals(c, seed + 2, 0.5, 0.0);
            let dout = vals(rows * c, seed + 3, 2.0, 0.1);
            let (mut out, mut mean, mut rstd) = (
                vec![0.0f32; rows * c],
                vec![0.0f32; rows],
                vec![0.0f32; rows],
            );
            layernorm_forward(&mut out, &mut mean, &mut rstd, &x, &w, &b, c);
            // Start from nonzero gradients: the backward adds.
            let dx0 = vals(rows * c, seed + 4, 1.0, 0.0);
            let (dw0, db0) = (vals(c, seed + 5, 1.0, 0.0), vals(c, seed + 6, 1.0, 0.0));
            let mut t = (dx0.clone(), dw0.clone(), db0.clone());
            layernorm_backward(&mut t.0, &mut t.1, &mut t.2, &dout, &x, &w, &mean, &rstd, c);
            let mut h = (dx0.clone(), dw0.clone(), db0.clone());
            nn::layernorm_backward(&mut h.0, &mut h.1, &mut h.2, &dout, &x, &w, &mean, &rstd, c);
            // f64 from the same saved mean and rstd.
            let mut e = (wide(&dx0), wide(&dw0), wide(&db0));
            nn::layernorm_backward(
                &mut e.0,
                &mut e.1,
                &mut e.2,
                &wide(&dout),
                &wide(&x),
                &wide(&w),
                &wide(&mean),
                &wide(&rstd),
                c,
            );
            // dw, db sum `rows` terms of magnitude ~2: scale the tolerance with them.
            let sum_tol = 2e-6 * (rows as f64).max(1.0);
            close("dx vs f64", &t.0, &e.0, 1e-4);
            close("dw vs f64", &t.1, &e.1, sum_tol);
            close("db vs f64", &t.2, &e.2, sum_tol);
            close("dx vs cpu", &t.0, &wide(&h.0), 1e-4);
            close("dw vs cpu", &t.1, &wide(&h.1), sum_tol);
            close("db vs cpu", &t.2, &wide(&h.2), sum_tol);
        }
    }

    #[test]
    fn f64_twin_is_the_exact_layernorm() {
        // The generic twin in f64 agrees with the CPU kernel in f64 to ~1e-12: the
        // summation orders differ, the math does not.
        let (rows, c) = (37, 50);
        let x = wide(&vals(rows * c, 7, 4.0, 0.7));
        let w = wide(&vals(c, 8, 1.0, 1.0));
        let b = wide(&vals(c, 9, 0.5, 0.0));
        let dout = wide(&vals(rows * c, 10, 2.0, 0.1));
        let mut t = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
        let mut h = t.clone();
        layernorm_forward(&mut t.0, &mut t.1, &mut t.2, &x, &w, &b, c);
        nn::layernorm_forward(&mut h.0, &mut h.1, &mut h.2, &x, &w, &b, c);
        let mut gt = (vec![0.0; rows * c], vec![0.0; c], vec![0.0; c]);
        let mut gh = gt.clone();
        layernorm_backward(
            &mut gt.0, &mut gt.1, &mut gt.2, &dout, &x, &w, &t.1, &t.2, c,
        );
        nn::layernorm_backward(
            &mut gh.0, &mut gh.1, &mut gh.2, &dout, &x, &w, &h.1, &h.2, c,
        );
        for (a, b) in [(&t.0, &h.0), (&gt.0, &gh.0), (&gt.1, &gh.1), (&gt.2, &gh.2)] {
            for (x, y) in a.iter().zip(b.iter()) {
                assert!((x - y).abs() <= 1e-11 * (1.0 + y.abs()), "{x} vs {y}");
            }
        }
    }
}
