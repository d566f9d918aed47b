//! The row-wise pieces of GPT-2 between the matrix multiplies, forward and backward
//! (llm.c's `train_gpt2.c` layer by layer). Backward functions accumulate (`+=`) into
//! parameter gradients and say in their doc whether they write or add input gradients.

use crate::real::Real;

/// LayerNorm epsilon (PyTorch's default, as GPT-2 uses).
pub const LN_EPS: f64 = 1e-5;

/// LayerNorm over rows of width `c`: `out = (x - mean) * rstd * w + b`,
/// rstd = 1/sqrt(var + eps) with the biased variance. Saves mean and rstd per row.
pub fn layernorm_forward<F: Real>(
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
        let mut m = F::ZERO;
        xr.iter().for_each(|&v| m += v);
        m *= inv_c;
        let mut var = F::ZERO;
        xr.iter().for_each(|&v| var += (v - m) * (v - m));
        var *= inv_c;
        let s = F::ONE / (var + eps).sqrt();
        for i in 0..c {
            or[i] = (xr[i] - m) * s * w[i] + b[i];
        }
        mean[r] = m;
        rstd[r] = s;
    }
}

/// LayerNorm backward. Adds into `dx`, `dw`, `db`. With n = (x - mean) * rstd and
/// g = dout * w: dx = rstd * (g - mean(g) - n * mean(g * n)).
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward<F: Real>(
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
    for (r, ((dxr, xr), dr)) in dx
        .chunks_exact_mut(c)
        .zip(x.chunks_exact(c))
        .zip(dout.chunks_exact(c))
        .enumerate()
    {
        let (m, s) = (mean[r], rstd[r]);
        let mut g_mean = F::ZERO;
        let mut gn_mean = F::ZERO;
        for i in 0..c {
            let n = (xr[i] - m) * s;
            let g = dr[i] * w[i];
            g_mean += g;
            gn_mean += g * n;
        }
        g_mean *= inv_c;
        gn_mean *= inv_c;
        for i in 0..c {
            let n = (xr[i] - m) * s;
            let g = dr[i] * w[i];
            dxr[i] += (g - g_mean - n * gn_mean) * s;
            dw[i] += dr[i] * n;
            db[i] += dr[i];
        }
    }
}

/// Set every row of `out` (width `b.len()`) to the bias, before a GEMM adds X W^T.
pub fn fill_rows<F: Real>(out: &mut [F], b: &[F]) {
    out.chunks_exact_mut(b.len())
        .for_each(|r| r.copy_from_slice(b));
}

/// `db += sum over rows of dout` (bias gradient of a linear layer).
pub fn bias_backward<F: Real>(db: &mut [F], dout: &[F]) {
    for r in dout.chunks_exact(db.len()) {
        db.iter_mut().zip(r).for_each(|(d, &g)| *d += g);
    }
}

/// sqrt(2/pi), the GELU tanh approximation's constant (Hendrycks & Gimpel 2016).
const GELU_S: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the approximation.
const GELU_K: f64 = 0.044_715;

/// GELU, tanh approximation: y = 0.5 x (1 + tanh(s (x + k x^3))).
pub fn gelu_forward<F: Real>(out: &mut [F], x: &[F]) {
    let (s, k, half) = (F::from_f64(GELU_S), F::from_f64(GELU_K), F::from_f64(0.5));
    for (o, &v) in out.iter_mut().zip(x) {
        *o = half * v * (F::ONE + (s * (v + k * v * v * v)).tanh());
    }
}

/// GELU backward, in place: `d <- d * gelu'(x)` with
/// gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 k x^2), t = tanh(s (x + k x^3)).
pub fn gelu_backward_inplace<F: Real>(d: &mut [F], x: &[F]) {
    let (s, k, half) = (F::from_f64(GELU_S), F::from_f64(GELU_K), F::from_f64(0.5));
    let three = F::from_f64(3.0);
    for (g, &v) in d.iter_mut().zip(x) {
        let t = (s * (v + k * v * v * v)).tanh();
        let dt = s * (F::ONE + three * k * v * v);
        *g *= half * (F::ONE + t) + half * v * (F::ONE - t * t) * dt;
    }
}

/// Softmax of one row in place, so it sums to 1. The first `valid` columns take part (the rest are set to exactly 0): the causal mask.
pub fn softmax_row_inplace<F: Real>(row: &mut [F], valid: usize) {
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

/// Softmax backward over one row, in place: `d <- p * (d - sum(p * d))` over the first
/// `valid` columns, 0 beyond (masked positions get no gradient).
pub fn softmax_row_backward_inplace<F: Real>(d: &mut [F], p: &[F], valid: usize) {
    let mut dot = F::ZERO;
    for j in 0..valid {
        dot += p[j] * d[j];
    }
    for j in 0..valid {
        d[j] = p[j] * (d[j] - dot);
    }
    d[valid..].iter_mut().for_each(|v| *v = F::ZERO);
}
