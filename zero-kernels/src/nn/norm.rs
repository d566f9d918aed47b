//! LayerNorm over rows of width C (Ba, Kiros & Hinton 2016; llm.c's `layernorm_forward` /
//! `layernorm_backward`), with the biased variance and PyTorch's epsilon, as GPT-2 uses.

use super::scalar::{interleaved_sums, Scalar, SUM_ROWS};

/// LayerNorm epsilon (PyTorch's default, as GPT-2 uses).
pub const LN_EPS: f64 = 1e-5;

/// LayerNorm over rows of width `c`: `out = (x - mean) * rstd * w + b`,
/// rstd = 1/sqrt(var + eps) with the biased variance. Writes `out` `[rows, c]` and saves
/// `mean` and `rstd` `[rows]` per row for the backward.
///
/// # Panics
/// If `mean` or `rstd` has fewer than rows = `x.len() / c` elements or `w`, `b` fewer than
/// `c`. Rows beyond the shorter of `x`, `out` are not touched.
#[inline(always)]
pub fn layernorm_forward<F: Scalar>(
    out: &mut [F],
    mean: &mut [F],
    rstd: &mut [F],
    x: &[F],
    w: &[F],
    b: &[F],
    c: usize,
) {
    // SUM_ROWS rows at a time, so that their sums run interleaved (each still in index
    // order), then the rows left over one by one.
    let rows = (x.len() / c).min(out.len() / c);
    let full = rows / SUM_ROWS * SUM_ROWS;
    for r in (0..full).step_by(SUM_ROWS) {
        layernorm_rows::<F, SUM_ROWS>(r, out, mean, rstd, x, w, b, c);
    }
    for r in full..rows {
        layernorm_rows::<F, 1>(r, out, mean, rstd, x, w, b, c);
    }
}

/// [`layernorm_forward`] of the `G` rows from `r0`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn layernorm_rows<F: Scalar, const G: usize>(
    r0: usize,
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
    let x = &x[r0 * c..(r0 + G) * c];
    let mut m: [F; G] = interleaved_sums(c, |g, i| x[g * c + i]);
    m.iter_mut().for_each(|m| *m *= inv_c);
    let var: [F; G] = interleaved_sums(c, |g, i| (x[g * c + i] - m[g]) * (x[g * c + i] - m[g]));
    let out = &mut out[r0 * c..(r0 + G) * c];
    for (g, (xr, or)) in x.chunks_exact(c).zip(out.chunks_exact_mut(c)).enumerate() {
        let s = F::ONE / (var[g] * inv_c + eps).sqrt();
        for i in 0..c {
            or[i] = (xr[i] - m[g]) * s * w[i] + b[i];
        }
        mean[r0 + g] = m[g];
        rstd[r0 + g] = s;
    }
}

/// LayerNorm backward. **Adds** into `dx` `[rows, c]`, `dw` `[c]` and `db` `[c]`. With
/// n = (x - mean) * rstd and g = dout * w: dx = rstd * (g - mean(g) - n * mean(g * n)),
/// dw = sum over rows of dout * n, db = sum over rows of dout.
///
/// # Panics
/// As [`layernorm_forward`], for `mean`, `rstd`, `w`, `dw`, `db` too short.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
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
    // SUM_ROWS rows at a time, as in the forward; `dw` and `db` still receive the rows in
    // order.
    let rows = (dx.len() / c).min(x.len() / c).min(dout.len() / c);
    let full = rows / SUM_ROWS * SUM_ROWS;
    for r in (0..full).step_by(SUM_ROWS) {
        layernorm_backward_rows::<F, SUM_ROWS, true>(r, dx, dw, db, dout, x, w, mean, rstd, c);
    }
    for r in full..rows {
        layernorm_backward_rows::<F, 1, true>(r, dx, dw, db, dout, x, w, mean, rstd, c);
    }
}

/// The `dx` part of [`layernorm_backward`] alone (**adds** into `dx`; `dw`, `db` are left
/// to [`layernorm_backward_params`]): the two together give the fused function's bits,
/// since each computes its outputs with the same operations in the same order. Threads
/// split this one by rows (each row's dx depends on that row alone).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn layernorm_backward_dx<F: Scalar>(
    dx: &mut [F],
    dout: &[F],
    x: &[F],
    w: &[F],
    mean: &[F],
    rstd: &[F],
    c: usize,
) {
    let rows = (dx.len() / c).min(x.len() / c).min(dout.len() / c);
    let full = rows / SUM_ROWS * SUM_ROWS;
    let (dw, db) = (&mut [][..], &mut [][..]);
    for r in (0..full).step_by(SUM_ROWS) {
        layernorm_backward_rows::<F, SUM_ROWS, false>(r, dx, dw, db, dout, x, w, mean, rstd, c);
    }
    for r in full..rows {
        layernorm_backward_rows::<F, 1, false>(r, dx, dw, db, dout, x, w, mean, rstd, c);
    }
}

/// The `dw`, `db` part of [`layernorm_backward`] for the channels `first .. first +
/// dw.len()` (**adds**; `db` as long as `dw`), over all rows of `dout`, `x` (width `c`).
/// Each channel receives its rows in row order with the fused function's `n`, so a split
/// of the channels over threads gives the fused bits: no sum crosses a split.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn layernorm_backward_params<F: Scalar>(
    dw: &mut [F],
    db: &mut [F],
    dout: &[F],
    x: &[F],
    mean: &[F],
    rstd: &[F],
    c: usize,
    first: usize,
) {
    let rows = (x.len() / c).min(dout.len() / c);
    let width = dw.len();
    assert!(
        db.len() == width && first + width <= c,
        "layernorm_backward_params: channels {first}..{} of {c}, db {}",
        first + width,
        db.len()
    );
    for r in 0..rows {
        let (xr, dr) = (
            &x[r * c + first..][..width],
            &dout[r * c + first..][..width],
        );
        let (m, s) = (mean[r], rstd[r]);
        for i in 0..width {
            let n = (xr[i] - m) * s;
            dw[i] += dr[i] * n;
            db[i] += dr[i];
        }
    }
}

/// [`layernorm_backward`] of the `G` rows from `r0`; `dw` and `db` only with `PARAMS`
/// (without, they may be empty).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn layernorm_backward_rows<F: Scalar, const G: usize, const PARAMS: bool>(
    r0: usize,
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
    let inv_c = F::from_f64(1.0 / c as f64);
    let (x, dout) = (&x[r0 * c..(r0 + G) * c], &dout[r0 * c..(r0 + G) * c]);
    let (m, s) = (&mean[r0..r0 + G], &rstd[r0..r0 + G]);
    let w = &w[..c];
    let mut g_mean: [F; G] = interleaved_sums(c, |g, i| dout[g * c + i] * w[i]);
    let mut gn_mean: [F; G] = interleaved_sums(c, |g, i| {
        let n = (x[g * c + i] - m[g]) * s[g];
        dout[g * c + i] * w[i] * n
    });
    g_mean.iter_mut().for_each(|v| *v *= inv_c);
    gn_mean.iter_mut().for_each(|v| *v *= inv_c);
    let dx = &mut dx[r0 * c..(r0 + G) * c];
    for (k, ((dxr, xr), dr)) in dx
        .chunks_exact_mut(c)
        .zip(x.chunks_exact(c))
        .zip(dout.chunks_exact(c))
        .enumerate()
    {
        let (m, s, g_mean, gn_mean) = (m[k], s[k], g_mean[k], gn_mean[k]);
        for i in 0..c {
            let n = (xr[i] - m) * s;
            let g = dr[i] * w[i];
            dxr[i] += (g - g_mean - n * gn_mean) * s;
            if PARAMS {
                dw[i] += dr[i] * n;
                db[i] += dr[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_summed_together_give_the_bits_of_one_row_at_a_time() {
        // 19 rows: two groups of SUM_ROWS and 3 left over; one row per call is the plain
        // per-row loop (G = 1).
        let (rows, c) = (19, 37);
        let x: Vec<f32> = crate::testutil::vals(rows * c, 1, 6.0, 0.5);
        let dout: Vec<f32> = crate::testutil::vals(rows * c, 2, 2.0, 0.0);
        let (w, b) = (
            crate::testutil::vals(c, 3, 1.0, 1.0),
            crate::testutil::vals(c, 4, 1.0, 0.0),
        );
        let fwd = |rows_per_call: usize| {
            let (mut y, mut mean, mut rstd) =
                (vec![0.0f32; rows * c], vec![0.0; rows], vec![0.0; rows]);
            let (mut dx, mut dw, mut db) = (dout.clone(), vec![0.5f32; c], vec![0.25f32; c]);
            for r in (0..rows).step_by(rows_per_call) {
                let (rs, cs) = (
                    r..(r + rows_per_call).min(rows),
                    r * c..((r + rows_per_call).min(rows)) * c,
                );
                layernorm_forward(
                    &mut y[cs.clone()],
                    &mut mean[rs.clone()],
                    &mut rstd[rs.clone()],
                    &x[cs.clone()],
                    &w,
                    &b,
                    c,
                );
                layernorm_backward(
                    &mut dx[cs.clone()],
                    &mut dw,
                    &mut db,
                    &dout[cs.clone()],
                    &x[cs],
                    &w,
                    &mean[rs.clone()],
                    &rstd[rs],
                    c,
                );
            }
            [y, mean, rstd, dx, dw, db].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
        };
        assert_eq!(fwd(rows), fwd(1));
    }

    #[test]
    fn dx_by_rows_and_params_by_channels_give_the_fused_bits() {
        // 19 rows of 37: dx in row parts of 7 (across the SUM_ROWS groups), dw and db in
        // channel parts of 16, 16, 5 and of 1 each; every part's bits are the fused pass's.
        let (rows, c) = (19, 37);
        let x: Vec<f32> = crate::testutil::vals(rows * c, 1, 6.0, 0.5);
        let dout: Vec<f32> = crate::testutil::vals(rows * c, 2, 2.0, 0.0);
        let w = crate::testutil::vals(c, 3, 1.0, 1.0);
        let b = crate::testutil::vals(c, 4, 1.0, 0.0);
        let (mut y, mut mean, mut rstd) =
            (vec![0.0f32; rows * c], vec![0.0; rows], vec![0.0; rows]);
        layernorm_forward(&mut y, &mut mean, &mut rstd, &x, &w, &b, c);
        let start = || (dout.clone(), vec![0.5f32; c], vec![0.25f32; c]);
        let (mut dx, mut dw, mut db) = start();
        layernorm_backward(&mut dx, &mut dw, &mut db, &dout, &x, &w, &mean, &rstd, c);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (row_part, channel_part) in [(7, 16), (3, 1), (rows, c)] {
            let (mut sdx, mut sdw, mut sdb) = start();
            for r in (0..rows).step_by(row_part) {
                let (rs, cs) = (
                    r..(r + row_part).min(rows),
                    r * c..(r + row_part).min(rows) * c,
                );
                let (d, xr) = (&dout[cs.clone()], &x[cs.clone()]);
                let (m, s) = (&mean[rs.clone()], &rstd[rs]);
                layernorm_backward_dx(&mut sdx[cs], d, xr, &w, m, s, c);
            }
            for (k, (dw, db)) in sdw
                .chunks_mut(channel_part)
                .zip(sdb.chunks_mut(channel_part))
                .enumerate()
            {
                layernorm_backward_params(dw, db, &dout, &x, &mean, &rstd, c, k * channel_part);
            }
            assert_eq!(
                bits(&sdx),
                bits(&dx),
                "dx, parts {row_part} x {channel_part}"
            );
            assert_eq!(
                bits(&sdw),
                bits(&dw),
                "dw, parts {row_part} x {channel_part}"
            );
            assert_eq!(
                bits(&sdb),
                bits(&db),
                "db, parts {row_part} x {channel_part}"
            );
        }
    }

    fn vals(n: usize, seed: usize) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 37 + seed * 11) % 89) as f64 * 0.03 - 1.2)
            .collect()
    }

    #[test]
    fn forward_normalises_each_row() {
        let (rows, c) = (3, 8);
        let x = vals(rows * c, 1);
        let (w, b) = (vec![1.0; c], vec![0.0; c]);
        let (mut out, mut mean, mut rstd) = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
        layernorm_forward(&mut out, &mut mean, &mut rstd, &x, &w, &b, c);
        for r in 0..rows {
            let o = &out[r * c..][..c];
            let m: f64 = o.iter().sum::<f64>() / c as f64;
            let var: f64 = o.iter().map(|v| v * v).sum::<f64>() / c as f64;
            assert!(m.abs() < 1e-14, "row {r} mean {m}");
            // var(out) = var / (var + eps), just under 1.
            let xr = &x[r * c..][..c];
            let xm = xr.iter().sum::<f64>() / c as f64;
            let xv = xr.iter().map(|v| (v - xm) * (v - xm)).sum::<f64>() / c as f64;
            assert!((var - xv / (xv + LN_EPS)).abs() < 1e-13);
            assert!((mean[r] - xm).abs() < 1e-15);
        }
    }

    #[test]
    fn backward_adds_and_matches_central_differences_f64() {
        // L = sum(g * LN(x; w, b)); the backward's dx, dw, db against (L(+h) - L(-h)) / 2h,
        // each starting from a nonzero buffer (the backward adds).
        let (rows, c) = (3, 5);
        let (x, w, b, g) = (vals(rows * c, 2), vals(c, 3), vals(c, 4), vals(rows * c, 5));
        let loss = |x: &[f64], w: &[f64], b: &[f64]| {
            let (mut o, mut m, mut s) = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
            layernorm_forward(&mut o, &mut m, &mut s, x, w, b, c);
            o.iter().zip(&g).map(|(o, g)| o * g).sum::<f64>()
        };
        let (mut o, mut m, mut s) = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
        layernorm_forward(&mut o, &mut m, &mut s, &x, &w, &b, c);
        let (mut dx, mut dw, mut db) = (vec![1.0; rows * c], vec![2.0; c], vec![3.0; c]);
        layernorm_backward(&mut dx, &mut dw, &mut db, &g, &x, &w, &m, &s, c);
        let h = 1e-5;
        let fd = |f: &dyn Fn(f64) -> f64| (f(h) - f(-h)) / (2.0 * h);
        for i in 0..x.len() {
            let want = fd(&|e| {
                let mut xe = x.clone();
                xe[i] += e;
                loss(&xe, &w, &b)
            });
            assert!(
                (dx[i] - 1.0 - want).abs() < 1e-8,
                "dx[{i}]: {} vs {want}",
                dx[i] - 1.0
            );
        }
        for i in 0..c {
            let want_w = fd(&|e| {
                let mut we = w.clone();
                we[i] += e;
                loss(&x, &we, &b)
            });
            let want_b = fd(&|e| {
                let mut be = b.clone();
                be[i] += e;
                loss(&x, &w, &be)
            });
            assert!((dw[i] - 2.0 - want_w).abs() < 1e-8, "dw[{i}]");
            assert!((db[i] - 3.0 - want_b).abs() < 1e-8, "db[{i}]");
        }
    }
}
