//! RMSNorm over rows of width C (Zhang & Sennrich 2019; Llama's `RMSNorm`): no mean, no
//! shift, `out = x * rstd * w` with rstd = 1/sqrt(mean(x^2) + eps).

use super::scalar::{interleaved_sums, Scalar, SUM_ROWS};

/// RMSNorm epsilon of the Llama presets (Meta's `norm_eps`, 1e-5).
pub const RMS_EPS: f64 = 1e-5;

/// RMSNorm over rows of width `c`: writes `out` `[rows, c]` and saves `rstd` `[rows]`
/// (1/sqrt(mean(x^2) + eps)) per row for the backward.
///
/// # Panics
/// If `rstd` has fewer than rows = `x.len() / c` elements or `w` fewer than `c`.
#[inline(always)]
pub fn rmsnorm_forward<F: Scalar>(
    out: &mut [F],
    rstd: &mut [F],
    x: &[F],
    w: &[F],
    c: usize,
    eps: f64,
) {
    // SUM_ROWS rows at a time, so that their sums run interleaved (each still in index
    // order), then the rows left over one by one.
    let rows = (x.len() / c).min(out.len() / c);
    let full = rows / SUM_ROWS * SUM_ROWS;
    for r in (0..full).step_by(SUM_ROWS) {
        rmsnorm_rows::<F, SUM_ROWS>(r, out, rstd, x, w, c, eps);
    }
    for r in full..rows {
        rmsnorm_rows::<F, 1>(r, out, rstd, x, w, c, eps);
    }
}

/// [`rmsnorm_forward`] of the `G` rows from `r0`.
#[inline(always)]
fn rmsnorm_rows<F: Scalar, const G: usize>(
    r0: usize,
    out: &mut [F],
    rstd: &mut [F],
    x: &[F],
    w: &[F],
    c: usize,
    eps: f64,
) {
    let inv_c = F::from_f64(1.0 / c as f64);
    let eps = F::from_f64(eps);
    let x = &x[r0 * c..(r0 + G) * c];
    let ss: [F; G] = interleaved_sums(c, |g, i| x[g * c + i] * x[g * c + i]);
    let out = &mut out[r0 * c..(r0 + G) * c];
    for (g, (xr, or)) in x.chunks_exact(c).zip(out.chunks_exact_mut(c)).enumerate() {
        let s = F::ONE / (ss[g] * inv_c + eps).sqrt();
        for i in 0..c {
            or[i] = xr[i] * s * w[i];
        }
        rstd[r0 + g] = s;
    }
}

/// RMSNorm backward. **Adds** into `dx` `[rows, c]` and `dw` `[c]`. With g = dout * w:
/// dx = rstd * g - x * rstd^3 * mean(g * x), dw = sum over rows of dout * x * rstd.
///
/// # Panics
/// As [`rmsnorm_forward`], for `rstd`, `w`, `dw` too short.
#[inline(always)]
pub fn rmsnorm_backward<F: Scalar>(
    dx: &mut [F],
    dw: &mut [F],
    dout: &[F],
    x: &[F],
    w: &[F],
    rstd: &[F],
    c: usize,
) {
    // SUM_ROWS rows at a time, as in the forward; `dw` still receives the rows in order.
    let rows = (dx.len() / c).min(x.len() / c).min(dout.len() / c);
    let full = rows / SUM_ROWS * SUM_ROWS;
    for r in (0..full).step_by(SUM_ROWS) {
        rmsnorm_backward_rows::<F, SUM_ROWS, true>(r, dx, dw, dout, x, w, rstd, c);
    }
    for r in full..rows {
        rmsnorm_backward_rows::<F, 1, true>(r, dx, dw, dout, x, w, rstd, c);
    }
}

/// The `dx` part of [`rmsnorm_backward`] alone (**adds** into `dx`; `dw` is left to
/// [`rmsnorm_backward_dw`]): the two together give the fused function's bits, since each
/// computes its outputs with the same operations in the same order. Threads split this
/// one by rows (each row's dx depends on that row alone).
#[inline(always)]
pub fn rmsnorm_backward_dx<F: Scalar>(
    dx: &mut [F],
    dout: &[F],
    x: &[F],
    w: &[F],
    rstd: &[F],
    c: usize,
) {
    let rows = (dx.len() / c).min(x.len() / c).min(dout.len() / c);
    let full = rows / SUM_ROWS * SUM_ROWS;
    let dw = &mut [][..];
    for r in (0..full).step_by(SUM_ROWS) {
        rmsnorm_backward_rows::<F, SUM_ROWS, false>(r, dx, dw, dout, x, w, rstd, c);
    }
    for r in full..rows {
        rmsnorm_backward_rows::<F, 1, false>(r, dx, dw, dout, x, w, rstd, c);
    }
}

/// The `dw` part of [`rmsnorm_backward`] for the channels `first .. first + dw.len()`
/// (**adds**), over all rows of `dout`, `x` (width `c`). Each channel receives its rows in
/// row order with the fused function's terms, so a split of the channels over threads
/// gives the fused bits: no sum crosses a split.
#[inline(always)]
pub fn rmsnorm_backward_dw<F: Scalar>(
    dw: &mut [F],
    dout: &[F],
    x: &[F],
    rstd: &[F],
    c: usize,
    first: usize,
) {
    let rows = (x.len() / c).min(dout.len() / c);
    let width = dw.len();
    assert!(
        first + width <= c,
        "rmsnorm_backward_dw: channels {first}..{} of {c}",
        first + width
    );
    for r in 0..rows {
        let (xr, dr) = (
            &x[r * c + first..][..width],
            &dout[r * c + first..][..width],
        );
        let s = rstd[r];
        for i in 0..width {
            dw[i] += dr[i] * xr[i] * s;
        }
    }
}

/// [`rmsnorm_backward`] of the `G` rows from `r0`; `dw` only with `DW` (without, it may be
/// empty).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rmsnorm_backward_rows<F: Scalar, const G: usize, const DW: bool>(
    r0: usize,
    dx: &mut [F],
    dw: &mut [F],
    dout: &[F],
    x: &[F],
    w: &[F],
    rstd: &[F],
    c: usize,
) {
    let inv_c = F::from_f64(1.0 / c as f64);
    let (x, dout) = (&x[r0 * c..(r0 + G) * c], &dout[r0 * c..(r0 + G) * c]);
    let w = &w[..c];
    let gx_sums: [F; G] = interleaved_sums(c, |g, i| dout[g * c + i] * w[i] * x[g * c + i]);
    let dx = &mut dx[r0 * c..(r0 + G) * c];
    for (g, ((dxr, xr), dr)) in dx
        .chunks_exact_mut(c)
        .zip(x.chunks_exact(c))
        .zip(dout.chunks_exact(c))
        .enumerate()
    {
        let s = rstd[r0 + g];
        let gx_mean = gx_sums[g] * inv_c;
        let k = s * s * s * gx_mean;
        for i in 0..c {
            dxr[i] += dr[i] * w[i] * s - xr[i] * k;
            if DW {
                dw[i] += dr[i] * xr[i] * s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dx_by_rows_and_dw_by_channels_give_the_fused_bits() {
        // 19 rows of 37: dx in row parts of 7 and 3, dw in channel parts of 16 and 1.
        let (rows, c) = (19, 37);
        let x: Vec<f32> = crate::testutil::vals(rows * c, 1, 6.0, 0.5);
        let dout: Vec<f32> = crate::testutil::vals(rows * c, 2, 2.0, 0.0);
        let w = crate::testutil::vals(c, 3, 1.0, 1.0);
        let (mut y, mut rstd) = (vec![0.0f32; rows * c], vec![0.0f32; rows]);
        rmsnorm_forward(&mut y, &mut rstd, &x, &w, c, RMS_EPS);
        let (mut dx, mut dw) = (dout.clone(), vec![0.5f32; c]);
        rmsnorm_backward(&mut dx, &mut dw, &dout, &x, &w, &rstd, c);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (row_part, channel_part) in [(7, 16), (3, 1), (rows, c)] {
            let (mut sdx, mut sdw) = (dout.clone(), vec![0.5f32; c]);
            for r in (0..rows).step_by(row_part) {
                let (rs, cs) = (
                    r..(r + row_part).min(rows),
                    r * c..(r + row_part).min(rows) * c,
                );
                let (d, xr) = (&dout[cs.clone()], &x[cs.clone()]);
                rmsnorm_backward_dx(&mut sdx[cs], d, xr, &w, &rstd[rs], c);
            }
            for (k, dw) in sdw.chunks_mut(channel_part).enumerate() {
                rmsnorm_backward_dw(dw, &dout, &x, &rstd, c, k * channel_part);
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
        }
    }

    #[test]
    fn rows_summed_together_give_the_bits_of_one_row_at_a_time() {
        // 19 rows: two groups of SUM_ROWS and 3 left over; one row per call is the plain
        // per-row loop (G = 1).
        let (rows, c) = (19, 37);
        let x: Vec<f32> = crate::testutil::vals(rows * c, 1, 6.0, 0.5);
        let dout: Vec<f32> = crate::testutil::vals(rows * c, 2, 2.0, 0.0);
        let w = crate::testutil::vals(c, 3, 1.0, 1.0);
        let run = |per_call: usize| {
            let (mut y, mut rstd) = (vec![0.0f32; rows * c], vec![0.0f32; rows]);
            let (mut dx, mut dw) = (dout.clone(), vec![0.5f32; c]);
            for r in (0..rows).step_by(per_call) {
                let end = (r + per_call).min(rows);
                let (rs, cs) = (r..end, r * c..end * c);
                let (yr, rr) = (&mut y[cs.clone()], &mut rstd[rs.clone()]);
                rmsnorm_forward(yr, rr, &x[cs.clone()], &w, c, RMS_EPS);
                let (d, xr) = (&dout[cs.clone()], &x[cs.clone()]);
                rmsnorm_backward(&mut dx[cs], &mut dw, d, xr, &w, &rstd[rs], c);
            }
            [y, rstd, dx, dw].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
        };
        assert_eq!(run(rows), run(1));
    }
    use crate::nn::testvals::{central_difference, vals};

    #[test]
    fn forward_f32_matches_f64_reference() {
        let (rows, c) = (5, 13);
        let (x, w) = (vals(rows * c, 1), vals(c, 2));
        let (mut o, mut s) = (vec![0.0; rows * c], vec![0.0; rows]);
        rmsnorm_forward(&mut o, &mut s, &x, &w, c, RMS_EPS);
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let w32: Vec<f32> = w.iter().map(|&v| v as f32).collect();
        let (mut o32, mut s32) = (vec![0.0f32; rows * c], vec![0.0f32; rows]);
        rmsnorm_forward(&mut o32, &mut s32, &x32, &w32, c, RMS_EPS);
        for r in 0..rows {
            // The reference, written out: x / sqrt(mean(x^2) + eps) * w.
            let xr = &x[r * c..][..c];
            let ms = xr.iter().map(|v| v * v).sum::<f64>() / c as f64;
            for i in 0..c {
                let want = xr[i] / (ms + RMS_EPS).sqrt() * w[i];
                assert!((o[r * c + i] - want).abs() < 1e-14);
                // f32: a few ulps of values of order 1.
                assert!((o32[r * c + i] as f64 - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn backward_adds_and_matches_central_differences_f64() {
        let (rows, c) = (3, 7);
        let (x, w, g) = (vals(rows * c, 3), vals(c, 4), vals(rows * c, 5));
        let loss = |x: &[f64], w: &[f64]| {
            let (mut o, mut s) = (vec![0.0; rows * c], vec![0.0; rows]);
            rmsnorm_forward(&mut o, &mut s, x, w, c, RMS_EPS);
            o.iter().zip(&g).map(|(o, g)| o * g).sum::<f64>()
        };
        let (mut o, mut s) = (vec![0.0; rows * c], vec![0.0; rows]);
        rmsnorm_forward(&mut o, &mut s, &x, &w, c, RMS_EPS);
        let (mut dx, mut dw) = (vec![1.0; rows * c], vec![2.0; c]);
        rmsnorm_backward(&mut dx, &mut dw, &g, &x, &w, &s, c);
        for (i, got) in dx.iter().enumerate() {
            let want = central_difference(&x, i, |xe| loss(xe, &w));
            assert!((got - 1.0 - want).abs() < 1e-8, "dx[{i}]");
        }
        for (i, got) in dw.iter().enumerate() {
            let want = central_difference(&w, i, |we| loss(&x, we));
            assert!((got - 2.0 - want).abs() < 1e-8, "dw[{i}]");
        }
    }
}
