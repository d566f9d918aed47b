//! Causal multi-head self-attention over a packed `qkv` [B, T, 3C] (q | k | v, head h at
//! columns h*hs .. (h+1)*hs of each third, hs = C/H):
//!   S = Q K^T / sqrt(hs);  P = softmax(S) over keys j <= i (causal);  Y = P V,
//! written into `y` [B, T, C] with heads side by side. P is kept [B, H, T, T] for the
//! backward. Matrix products run in row bands of `BAND` queries, and each band only
//! touches keys up to its last query, so the masked upper triangle is mostly skipped.

use crate::gemm::{Gemm, Lay};
use crate::ops::{softmax_row_backward_inplace, softmax_row_inplace};
use crate::real::Real;

/// Queries per band of the causal products.
const BAND: usize = 64;

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    /// B.
    pub b: usize,
    /// T (this batch's sequence length).
    pub t: usize,
    /// C.
    pub c: usize,
    /// H.
    pub h: usize,
}

/// Query bands: (first row, one past last row).
fn bands(t: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..t).step_by(BAND).map(move |r0| (r0, (r0 + BAND).min(t)))
}

/// Forward: writes `y` [B,T,C] and `p` [B,H,T,T].
pub fn attention_forward<F: Real>(g: &Gemm, y: &mut [F], p: &mut [F], qkv: &[F], s: AttnShape) {
    let AttnShape { b, t, c, h } = s;
    let hs = c / h;
    let scale = F::from_f64(1.0 / (hs as f64).sqrt());
    for bi in 0..b {
        for hi in 0..h {
            let base = bi * t * 3 * c + hi * hs;
            let (q, k, v) = (&qkv[base..], &qkv[base + c..], &qkv[base + 2 * c..]);
            let pm = &mut p[(bi * h + hi) * t * t..][..t * t];
            for (r0, r1) in bands(t) {
                // S[r0..r1, 0..r1] = scale * Q[r0..r1] K[0..r1]^T
                g.run(
                    scale,
                    &q[r0 * 3 * c..],
                    Lay::rm(r1 - r0, hs, 3 * c),
                    k,
                    Lay::rm(r1, hs, 3 * c).t(),
                    F::ZERO,
                    &mut pm[r0 * t..],
                    Lay::rm(r1 - r0, r1, t),
                );
                for i in r0..r1 {
                    softmax_row_inplace(&mut pm[i * t..(i + 1) * t], i + 1);
                }
                // Y[r0..r1] = P[r0..r1, 0..r1] V[0..r1]
                g.run(
                    F::ONE,
                    &pm[r0 * t..],
                    Lay::rm(r1 - r0, r1, t),
                    v,
                    Lay::rm(r1, hs, 3 * c),
                    F::ZERO,
                    &mut y[bi * t * c + hi * hs + r0 * c..],
                    Lay::rm(r1 - r0, hs, c),
                );
            }
        }
    }
}

/// Backward: writes (not adds) `dqkv` [B,T,3C] from `dy` [B,T,C]; `dp` is a T*T scratch.
pub fn attention_backward<F: Real>(
    g: &Gemm,
    dqkv: &mut [F],
    dp: &mut [F],
    dy: &[F],
    p: &[F],
    qkv: &[F],
    s: AttnShape,
) {
    let AttnShape { b, t, c, h } = s;
    let hs = c / h;
    let scale = F::from_f64(1.0 / (hs as f64).sqrt());
    let dp = &mut dp[..t * t];
    for bi in 0..b {
        for hi in 0..h {
            let base = bi * t * 3 * c + hi * hs;
            let (q, k, v) = (&qkv[base..], &qkv[base + c..], &qkv[base + 2 * c..]);
            let pm = &p[(bi * h + hi) * t * t..][..t * t];
            let dyh = &dy[bi * t * c + hi * hs..];
            for (r0, r1) in bands(t) {
                // dP[r0..r1, 0..r1] = dY[r0..r1] V[0..r1]^T, then through the softmax.
                g.run(
                    F::ONE,
                    &dyh[r0 * c..],
                    Lay::rm(r1 - r0, hs, c),
                    v,
                    Lay::rm(r1, hs, 3 * c).t(),
                    F::ZERO,
                    &mut dp[r0 * t..],
                    Lay::rm(r1 - r0, r1, t),
                );
                for i in r0..r1 {
                    let row = i * t..(i + 1) * t;
                    softmax_row_backward_inplace(&mut dp[row.clone()], &pm[row], i + 1);
                }
                // dQ[r0..r1] = scale * dS[r0..r1, 0..r1] K[0..r1]
                g.run(
                    scale,
                    &dp[r0 * t..],
                    Lay::rm(r1 - r0, r1, t),
                    k,
                    Lay::rm(r1, hs, 3 * c),
                    F::ZERO,
                    &mut dqkv[base + r0 * 3 * c..],
                    Lay::rm(r1 - r0, hs, 3 * c),
                );
            }
            // Keys/values j in [j0, j1) receive from queries i >= j0 only (dS, P are 0
            // above the diagonal).
            for (j0, j1) in bands(t) {
                let a_t = Lay {
                    rows: j1 - j0,
                    cols: t - j0,
                    rs: 1,
                    cs: t,
                };
                // dK[j0..j1] = scale * dS[j0.., j0..j1]^T Q[j0..]
                g.run(
                    scale,
                    &dp[j0 * t + j0..],
                    a_t,
                    &q[j0 * 3 * c..],
                    Lay::rm(t - j0, hs, 3 * c),
                    F::ZERO,
                    &mut dqkv[base + c + j0 * 3 * c..],
                    Lay::rm(j1 - j0, hs, 3 * c),
                );
                // dV[j0..j1] = P[j0.., j0..j1]^T dY[j0..]
                g.run(
                    F::ONE,
                    &pm[j0 * t + j0..],
                    a_t,
                    &dyh[j0 * c..],
                    Lay::rm(t - j0, hs, c),
                    F::ZERO,
                    &mut dqkv[base + 2 * c + j0 * 3 * c..],
                    Lay::rm(j1 - j0, hs, 3 * c),
                );
            }
        }
    }
}
