//! Causal multi-head self-attention over a packed `qkv` `[B, T, 3C]` (q | k | v, head h at
//! columns h*hs .. (h+1)*hs of each third, hs = C/H):
//!   S = Q K^T / sqrt(hs);  P = softmax(S) over keys j <= i (causal);  Y = P V,
//! written into `y` `[B, T, C]` with heads side by side. P is kept `[B, H, T, T]` for the
//! backward. Matrix products run in row bands of `BAND` queries, and each band only
//! touches keys up to its last query, so the masked upper triangle is mostly skipped.
//! (llm.c's `attention_forward` / `attention_backward`, with the products as GEMMs.)
//!
//! Both functions panic when a slice is shorter than its shape says or `C` is not a
//! multiple of `H` (bugs in the calling layer, never user input).

use std::ops::Range;

use super::gemm::{Gemm, MatLayout};
use super::isa_ops::{AttentionBackwardHeads, AttentionForwardHeads};
use super::scalar::Scalar;
use super::softmax::{softmax_causal_rows, softmax_causal_rows_backward};
use crate::isa::Exec;
use crate::par::SendPtr;
use crate::simd::run_auto;

/// Queries per band of the causal products.
const BAND: usize = 64;

/// Shapes of one attention call (llm.c's names).
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

/// Heads must split C evenly (a model's config validates this; the kernel checks again),
/// and the buffers' sizes fit `usize`: the threaded paths write `y`/`dqkv` through raw
/// pointers at offsets bounded by those sizes.
fn check_heads(s: &AttnShape) {
    let AttnShape { b, t, c, h } = *s;
    assert!(
        h > 0 && c.is_multiple_of(h),
        "attention: C = {c} is not a positive multiple of H = {h}"
    );
    assert!(
        super::checked_elems(&[b, t, 3, c]).is_some()
            && super::checked_elems(&[b, h, t, t]).is_some(),
        "attention: the buffers of {s:?} have more elements than usize counts"
    );
}

/// Query bands: (first row, one past last row).
fn bands(t: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..t).step_by(BAND).map(move |r0| (r0, (r0 + BAND).min(t)))
}

/// Where a run of heads ([`forward_heads`], [`backward_heads`]) writes its outputs (Y in
/// the forward; dQ, dK and dV in the backward). A *unit* is one head of one sequence,
/// numbered as P's blocks are: `u = bi * H + hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeadsOut {
    /// The model's rows: `y` `[B, T, C]` (`dqkv` `[B, T, 3C]`), head `hi` at columns
    /// `hi * hs` (of each third).
    Model,
    /// A buffer of the run's own, unit after unit from its first: `[T, hs]` per unit
    /// forward, `[T, 3 hs]` (dQ | dK | dV) backward. A head's columns of the model's rows
    /// interleave with the other heads', so a thread of several that split the heads
    /// computes a unit here, then copies its rows into place.
    Own,
}

/// Forward: writes `y` `[B,T,C]` and `p` `[B,H,T,T]` (P's upper triangle is written 0) from
/// `qkv` `[B,T,3C]`. With several threads the heads of all sequences (`B * H` units) are
/// split between them, each computed exactly as on one thread, so a single sequence (a
/// micro-batch of 1) uses the threads too and each packs only its own heads' operands.
/// With fewer than half as many units as threads, one thread runs them and splits each
/// product (where large enough) over the threads instead.
/// The softmax rows run at this CPU's best instruction-set level (same bits at every level).
pub fn attention_forward<F: Scalar>(g: &Gemm, y: &mut [F], p: &mut [F], qkv: &[F], s: AttnShape) {
    attention_forward_at(&Exec::default(), g, y, p, qkv, s)
}

/// Units (heads of sequences) per thread's run, as even as whole units go; `None`: run
/// them on one thread, its products on all of `g`'s (one thread, or fewer than half as
/// many units as threads). A judgement, measured on 2 threads only: a unit on each of at
/// least half the threads beats every thread packing all of K and V for a few rows of
/// each product.
fn units_per_part(g: &Gemm, units: usize) -> Option<usize> {
    let threads = g.threads();
    (threads > 1 && units > 1 && 2 * units >= threads).then(|| units.div_ceil(threads.min(units)))
}

/// [`attention_forward`] with the non-GEMM work compiled for `exec`'s level.
pub(crate) fn attention_forward_at<F: Scalar>(
    exec: &Exec,
    g: &Gemm,
    y: &mut [F],
    p: &mut [F],
    qkv: &[F],
    s: AttnShape,
) {
    let AttnShape { b, t, c, h } = s;
    check_heads(&s);
    let units = b * h;
    // t == 0 or c == 0 (no rows, or an empty model width) has nothing to split: chunks
    // of 0 would panic.
    let per = match units_per_part(g, units) {
        Some(per) if t > 0 && c > 0 => per,
        _ => {
            let out = HeadsOut::Model;
            let op = AttentionForwardHeads(g, y, out, p, qkv, s, 0..units);
            return run_auto(exec, op);
        }
    };
    let hs = c / h;
    assert!(y.len() >= b * t * c, "attention: y shorter than B*T*C");
    let jobs: Vec<_> = p[..units * t * t]
        .chunks_mut(per * t * t)
        .enumerate()
        .map(|(i, p)| (i * per, p))
        .collect();
    let one = g.on_one_thread();
    let y_at = SendPtr(y.as_mut_ptr());
    g.workers().run(jobs, |(u0, p)| {
        let mut own = vec![F::ZERO; t * hs];
        for (u, pm) in (u0..).zip(p.chunks_exact_mut(t * t)) {
            let out = HeadsOut::Own;
            run_auto(
                exec,
                AttentionForwardHeads(&one, &mut own, out, pm, qkv, s, u..u + 1),
            );
            let (bi, hi) = (u / h, u % h);
            // SAFETY: y holds B*T*C (asserted); columns hi*hs.. of sequence bi's rows are
            // unit u's alone, and the units are split between the threads; nothing else
            // touches y until the run returns.
            unsafe { unit_into_place(&own, hs, 1, y_at.at(bi * t * c + hi * hs), c, 0) };
        }
    });
}

/// Copies one unit's outputs from its own buffer ([`HeadsOut::Own`]: rows of `parts`
/// runs of `hs`) into the model's rows, `ld` apart from `to`: run `part` of row r to
/// `to + r * ld + part * part_stride`.
///
/// # Safety
/// Those places lie inside one buffer, and no other thread reads or writes them while
/// this runs (they are the unit's own columns).
unsafe fn unit_into_place<F: Copy>(
    own: &[F],
    hs: usize,
    parts: usize,
    to: *mut F,
    ld: usize,
    part_stride: usize,
) {
    for (r, row) in own.chunks_exact(parts * hs).enumerate() {
        for (part, run) in row.chunks_exact(hs).enumerate() {
            // SAFETY: the caller's contract; `own` is a separate allocation.
            unsafe {
                let at = to.add(r * ld + part * part_stride);
                std::ptr::copy_nonoverlapping(run.as_ptr(), at, hs);
            }
        }
    }
}

/// [`attention_forward`] for `units` on this thread (its products on `g`'s threads): `p`
/// holds those units' P from the first (`[units.len(), T, T]`), `qkv` every sequence,
/// `y` is as `out` says.
#[inline(always)]
pub(crate) fn forward_heads<F: Scalar>(
    g: &Gemm,
    y: &mut [F],
    out: HeadsOut,
    p: &mut [F],
    qkv: &[F],
    s: AttnShape,
    units: Range<usize>,
) {
    let AttnShape { t, c, h, .. } = s;
    let hs = c / h;
    let scale = F::from_f64(1.0 / (hs as f64).sqrt());
    for (i, u) in units.enumerate() {
        let (bi, hi) = (u / h, u % h);
        let base = bi * t * 3 * c + hi * hs;
        let (q, k, v) = (&qkv[base..], &qkv[base + c..], &qkv[base + 2 * c..]);
        let pm = &mut p[i * t * t..][..t * t];
        let (yh, ldy) = match out {
            HeadsOut::Model => (&mut y[bi * t * c + hi * hs..], c),
            HeadsOut::Own => (&mut y[i * t * hs..], hs),
        };
        for (r0, r1) in bands(t) {
            // S[r0..r1, 0..r1] = scale * Q[r0..r1] K[0..r1]^T
            g.run(
                scale,
                &q[r0 * 3 * c..],
                MatLayout::rm(r1 - r0, hs, 3 * c),
                k,
                MatLayout::rm(r1, hs, 3 * c).t(),
                F::ZERO,
                &mut pm[r0 * t..],
                MatLayout::rm(r1 - r0, r1, t),
            );
            softmax_causal_rows(&mut pm[r0 * t..r1 * t], t, r0);
            // Y[r0..r1] = P[r0..r1, 0..r1] V[0..r1]
            g.run(
                F::ONE,
                &pm[r0 * t..],
                MatLayout::rm(r1 - r0, r1, t),
                v,
                MatLayout::rm(r1, hs, 3 * c),
                F::ZERO,
                &mut yh[r0 * ldy..],
                MatLayout::rm(r1 - r0, hs, ldy),
            );
        }
    }
}

/// Backward: **writes** (not adds) `dqkv` `[B,T,3C]` from `dy` `[B,T,C]`, with `p` `[B,H,T,T]`
/// and `qkv` as the forward left and saw them; `dp` is a scratch of at least T*T elements.
/// dV = P^T dY; dS = softmax'(dP = dY V^T); dQ = dS K / sqrt(hs); dK = dS^T Q / sqrt(hs).
/// Threads split the units as in [`attention_forward`] (where they do, each part past the
/// first gets a T*T scratch of its own). Levels as in [`attention_forward`].
pub fn attention_backward<F: Scalar>(
    g: &Gemm,
    dqkv: &mut [F],
    dp: &mut [F],
    dy: &[F],
    p: &[F],
    qkv: &[F],
    s: AttnShape,
) {
    attention_backward_at(&Exec::default(), g, dqkv, dp, dy, p, qkv, s)
}

/// [`attention_backward`] with the non-GEMM work compiled for `exec`'s level.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_at<F: Scalar>(
    exec: &Exec,
    g: &Gemm,
    dqkv: &mut [F],
    dp: &mut [F],
    dy: &[F],
    p: &[F],
    qkv: &[F],
    s: AttnShape,
) {
    let AttnShape { b, t, c, h } = s;
    check_heads(&s);
    let units = b * h;
    // t == 0 or c == 0 (no rows, or an empty model width) has nothing to split: chunks
    // of 0 would panic.
    let per = match units_per_part(g, units) {
        Some(per) if t > 0 && c > 0 => per,
        _ => {
            let out = HeadsOut::Model;
            let op = AttentionBackwardHeads(g, dqkv, out, dp, dy, p, qkv, s, 0..units);
            return run_auto(exec, op);
        }
    };
    let hs = c / h;
    assert!(
        dqkv.len() >= b * t * 3 * c,
        "attention: dqkv shorter than B*T*3C"
    );
    let parts = units.div_ceil(per);
    let mut scratch: Vec<Vec<F>> = (1..parts).map(|_| vec![F::ZERO; t * t]).collect();
    let scratches = std::iter::once(&mut dp[..t * t]).chain(scratch.iter_mut().map(|v| &mut v[..]));
    let jobs: Vec<_> = (0..units).step_by(per).zip(scratches).collect();
    let one = g.on_one_thread();
    let dqkv_at = SendPtr(dqkv.as_mut_ptr());
    g.workers().run(jobs, |(u0, dp)| {
        let mut own = vec![F::ZERO; t * 3 * hs];
        for u in u0..(u0 + per).min(units) {
            let p = &p[u * t * t..(u + 1) * t * t];
            let out = HeadsOut::Own;
            let op = AttentionBackwardHeads(&one, &mut own, out, &mut *dp, dy, p, qkv, s, u..u + 1);
            run_auto(exec, op);
            let (bi, hi) = (u / h, u % h);
            // SAFETY: dqkv holds B*T*3C (asserted); columns part*C + hi*hs.. of sequence
            // bi's rows are unit u's alone, as in the forward.
            unsafe {
                let to = dqkv_at.at(bi * t * 3 * c + hi * hs);
                unit_into_place(&own, hs, 3, to, 3 * c, c);
            }
        }
    });
}

/// [`attention_backward`] for `units` on this thread (its products on `g`'s threads):
/// `p` holds those units' P from the first, `dy` and `qkv` every sequence, `dqkv` is as
/// `out` says.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_heads<F: Scalar>(
    g: &Gemm,
    dqkv: &mut [F],
    out: HeadsOut,
    dp: &mut [F],
    dy: &[F],
    p: &[F],
    qkv: &[F],
    s: AttnShape,
    units: Range<usize>,
) {
    let AttnShape { t, c, h, .. } = s;
    let hs = c / h;
    let scale = F::from_f64(1.0 / (hs as f64).sqrt());
    let dp = &mut dp[..t * t];
    for (i, u) in units.enumerate() {
        let (bi, hi) = (u / h, u % h);
        let base = bi * t * 3 * c + hi * hs;
        let (q, k, v) = (&qkv[base..], &qkv[base + c..], &qkv[base + 2 * c..]);
        let pm = &p[i * t * t..][..t * t];
        let dyh = &dy[bi * t * c + hi * hs..];
        // Where this unit's dQ starts, dK and dV after it (`part` on), row stride `ld`.
        let (at, part, ld) = match out {
            HeadsOut::Model => (base, c, 3 * c),
            HeadsOut::Own => (i * t * 3 * hs, hs, 3 * hs),
        };
        for (r0, r1) in bands(t) {
            // dP[r0..r1, 0..r1] = dY[r0..r1] V[0..r1]^T, then through the softmax.
            g.run(
                F::ONE,
                &dyh[r0 * c..],
                MatLayout::rm(r1 - r0, hs, c),
                v,
                MatLayout::rm(r1, hs, 3 * c).t(),
                F::ZERO,
                &mut dp[r0 * t..],
                MatLayout::rm(r1 - r0, r1, t),
            );
            let rows = r0 * t..r1 * t;
            softmax_causal_rows_backward(&mut dp[rows.clone()], &pm[rows], t, r0);
            // dQ[r0..r1] = scale * dS[r0..r1, 0..r1] K[0..r1]
            g.run(
                scale,
                &dp[r0 * t..],
                MatLayout::rm(r1 - r0, r1, t),
                k,
                MatLayout::rm(r1, hs, 3 * c),
                F::ZERO,
                &mut dqkv[at + r0 * ld..],
                MatLayout::rm(r1 - r0, hs, ld),
            );
        }
        // Keys/values j in [j0, j1) receive from queries i >= j0 only (dS, P are 0
        // above the diagonal).
        for (j0, j1) in bands(t) {
            let a_t = MatLayout {
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
                MatLayout::rm(t - j0, hs, 3 * c),
                F::ZERO,
                &mut dqkv[at + part + j0 * ld..],
                MatLayout::rm(j1 - j0, hs, ld),
            );
            // dV[j0..j1] = P[j0.., j0..j1]^T dY[j0..]
            g.run(
                F::ONE,
                &pm[j0 * t + j0..],
                a_t,
                &dyh[j0 * c..],
                MatLayout::rm(t - j0, hs, c),
                F::ZERO,
                &mut dqkv[at + 2 * part + j0 * ld..],
                MatLayout::rm(j1 - j0, hs, ld),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(n: usize, seed: usize) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 53 + seed * 7) % 103) as f64 * 0.02 - 1.0)
            .collect()
    }

    /// The definition, one query at a time: y_i = sum_{j<=i} softmax_j(q_i.k_j / sqrt(hs)) v_j.
    fn naive(qkv: &[f64], s: AttnShape) -> Vec<f64> {
        let AttnShape { b, t, c, h } = s;
        let hs = c / h;
        let mut y = vec![0.0; b * t * c];
        for bi in 0..b {
            for hi in 0..h {
                let at = |row: usize, part: usize, i: usize| {
                    qkv[(bi * t + row) * 3 * c + part * c + hi * hs + i]
                };
                for qi in 0..t {
                    let sc: Vec<f64> = (0..=qi)
                        .map(|kj| {
                            (0..hs).map(|i| at(qi, 0, i) * at(kj, 1, i)).sum::<f64>()
                                / (hs as f64).sqrt()
                        })
                        .collect();
                    let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for i in 0..hs {
                        y[(bi * t + qi) * c + hi * hs + i] =
                            (0..=qi).map(|kj| e[kj] / z * at(kj, 2, i)).sum::<f64>();
                    }
                }
            }
        }
        y
    }

    /// T = 66 spans two query bands.
    const S: AttnShape = AttnShape {
        b: 2,
        t: 66,
        c: 4,
        h: 2,
    };

    #[test]
    fn forward_matches_definition_across_bands() {
        let qkv = vals(S.b * S.t * 3 * S.c, 1);
        let mut y = vec![0.0; S.b * S.t * S.c];
        let mut p = vec![7.0; S.b * S.h * S.t * S.t];
        attention_forward(&Gemm::new(1), &mut y, &mut p, &qkv, S);
        let want = naive(&qkv, S);
        for (i, (a, w)) in y.iter().zip(&want).enumerate() {
            assert!((a - w).abs() < 1e-13, "y[{i}]: {a} vs {w}");
        }
        // P is causal: zero above the diagonal, rows summing to 1.
        for (r, row) in p.chunks_exact(S.t).enumerate() {
            let i = r % S.t;
            assert!(row[i + 1..].iter().all(|&x| x == 0.0));
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-14);
        }
    }

    #[test]
    fn backward_writes_and_matches_central_differences_f64() {
        let s = AttnShape { b: 1, ..S };
        let qkv = vals(s.b * s.t * 3 * s.c, 2);
        let w = vals(s.b * s.t * s.c, 3);
        let loss = |qkv: &[f64]| {
            let mut y = vec![0.0; s.b * s.t * s.c];
            let mut p = vec![0.0; s.b * s.h * s.t * s.t];
            attention_forward(&Gemm::new(1), &mut y, &mut p, qkv, s);
            y.iter().zip(&w).map(|(y, w)| y * w).sum::<f64>()
        };
        let mut y = vec![0.0; s.b * s.t * s.c];
        let mut p = vec![0.0; s.b * s.h * s.t * s.t];
        attention_forward(&Gemm::new(1), &mut y, &mut p, &qkv, s);
        let mut dqkv = vec![5.0; qkv.len()]; // written, not added
        let mut dp = vec![0.0; s.t * s.t];
        attention_backward(&Gemm::new(1), &mut dqkv, &mut dp, &w, &p, &qkv, s);
        let h = 1e-5;
        for i in 0..qkv.len() {
            let (mut qp, mut qm) = (qkv.clone(), qkv.clone());
            qp[i] += h;
            qm[i] -= h;
            let fd = (loss(&qp) - loss(&qm)) / (2.0 * h);
            assert!(
                (dqkv[i] - fd).abs() < 1e-8,
                "dqkv[{i}]: {} vs {fd}",
                dqkv[i]
            );
        }
    }

    /// Every thread count gives one thread's bits (written into place), with bf16 and
    /// with exact f32 operands, and bf16 operands are not what exact f32 ones give.
    /// Three sequences of 2 heads (6 units: 3 + 3 on 2 threads, a run crossing
    /// sequences; 2 + 2 + 2 on 3 and 4), and one sequence of 3 heads (a micro-batch of 1:
    /// 2 + 1 on 2 threads, 1 + 1 + 1 on 3 and on 4, one thread idle). The fallback (one
    /// thread running all units) is the 1-thread run's own path.
    #[test]
    fn bf16_operands_give_the_same_bits_on_any_thread_count() {
        for (b, c, h) in [(3, 32, 2), (1, 48, 3)] {
            let s = AttnShape { b, t: 70, c, h };
            let qkv: Vec<f32> = vals(s.b * s.t * 3 * s.c, 4)
                .iter()
                .map(|&x| x as f32)
                .collect();
            let dy: Vec<f32> = vals(s.b * s.t * s.c, 5).iter().map(|&x| x as f32).collect();
            let run = |g: &Gemm| {
                let mut y = vec![f32::NAN; s.b * s.t * s.c];
                let mut p = vec![0f32; s.b * s.h * s.t * s.t];
                attention_forward(g, &mut y, &mut p, &qkv, s);
                let mut dqkv = vec![f32::NAN; qkv.len()];
                let mut dp = vec![0f32; s.t * s.t];
                attention_backward(g, &mut dqkv, &mut dp, &dy, &p, &qkv, s);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                (bits(&y), bits(&p), bits(&dqkv))
            };
            let one = run(&Gemm::new(1).with_bf16_operands(true));
            assert!(one
                .0
                .iter()
                .chain(&one.2)
                .all(|&x| !f32::from_bits(x).is_nan()));
            let exact = run(&Gemm::new(1));
            for threads in 2..=4 {
                let got = run(&Gemm::new(threads).with_bf16_operands(true));
                assert!(got == one, "bf16: B={b} H={h} on {threads} threads");
                let got = run(&Gemm::new(threads));
                assert!(got == exact, "f32: B={b} H={h} on {threads} threads");
            }
            assert_ne!(
                exact.0, one.0,
                "bf16 operands changed nothing in the forward"
            );
            assert_ne!(
                exact.2, one.2,
                "bf16 operands changed nothing in the backward"
            );
        }
    }

    #[test]
    #[should_panic(expected = "not a positive multiple of H")]
    fn rejects_heads_not_dividing_c() {
        let s = AttnShape {
            b: 1,
            t: 2,
            c: 6,
            h: 4,
        };
        let mut y = vec![0.0f32; 12];
        let mut p = vec![0.0f32; 16];
        attention_forward(&Gemm::new(1), &mut y, &mut p, &[0.0; 36], s);
    }
}
