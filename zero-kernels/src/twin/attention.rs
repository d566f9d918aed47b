//! CPU twin of `src/nn/cuda/attention.cu`: causal multi-head attention with the semantics
//! of [`crate::nn::attention_forward`] / [`crate::nn::attention_backward`] (packed `qkv`
//! `[B,T,3C]`, `y` `[B,T,C]`, `p` `[B,H,T,T]` zero above the diagonal, `dqkv` written),
//! in the GPU kernels' operation order:
//!
//! - forward, one warp per query row i: s_j = dot(q_i, k_j) * scale (dot: d ascending from
//!   0); lane l keeps the running max and the sum of e_j = exp(s_j - m) over
//!   j = l, l+32, ..; the 32 lane values fold by the xor butterfly (16, 8, 4, 2, 1);
//!   p_ij = e_j * (1/sum); `y_i[d] = sum_{j <= i} p_ij v_j[d]`, j ascending;
//! - backward, in groups of at most T (b, h) pairs so the row sums fit a T*T scratch:
//!   dp_ij = dot(dy_i, v_j); D_i = butterfly of the lane sums of p_ij dp_ij (kept in the
//!   scratch); ds_ij = p_ij (dp_ij - D_i); dq_i = (sum_{j <= i} ds_ij k_j) * scale,
//!   dk_j = (sum_{i >= j} ds_ij q_i) * scale, dv_j = sum_{i >= j} p_ij dy_i, each sum in
//!   ascending order.
//!
//! Same signatures as the `nn` kernels less the GEMM handle (there is no GEMM here).

use crate::nn::{AttnShape, Scalar};

/// Lanes of a warp.
const LANES: usize = 32;

/// The xor butterfly of a warp (lane l adds lane l ^ off for off = 16, 8, 4, 2, 1), as
/// lane 0 sees it; IEEE addition commutes, so every lane ends with these bits.
pub(crate) fn butterfly_sum<F: Scalar>(mut a: [F; LANES]) -> F {
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for l in 0..n {
            a[l] += a[l + n];
        }
    }
    a[0]
}

/// The warp max butterfly as lane 0 computes it: keep the partner's value when it is
/// greater. Its inputs are never NaN (each lane's running max starts at `F::MIN` and skips
/// NaN, as the CPU's `if v > max`), so every lane ends with the same maximum up to the
/// sign of a zero, which no later step can see (`exp(s - m)` is the same for m = +0 and
/// m = -0; tested).
pub(crate) fn butterfly_max<F: Scalar>(mut a: [F; LANES]) -> F {
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for l in 0..n {
            if a[l + n] > a[l] {
                a[l] = a[l + n];
            }
        }
    }
    a[0]
}

/// `sum_d a[d] b[d]`, d ascending from 0 (each product rounded, then added).
fn dot<F: Scalar>(a: &[F], b: &[F]) -> F {
    let mut acc = F::ZERO;
    for (&x, &y) in a.iter().zip(b) {
        acc += x * y;
    }
    acc
}

/// 1/sqrt(hs) rounded to `F` (the launcher passes the same f32).
fn scale_of<F: Scalar>(hs: usize) -> F {
    F::from_f64(1.0 / (hs as f64).sqrt())
}

fn check(s: &AttnShape) {
    assert!(
        s.h > 0 && s.c.is_multiple_of(s.h),
        "attention: C = {} is not a positive multiple of H = {}",
        s.c,
        s.h
    );
}

/// Pairs (b, h) per backward group: the row sums of a group (pairs x T) fit a T*T scratch.
pub(crate) fn backward_group(s: &AttnShape) -> usize {
    (s.b * s.h).min(s.t).max(1)
}

/// Row i of P from its scaled scores `prow[..=i]` and their maximum `m`: e_j = exp(s_j -
/// m), summed per lane (j mod 32) and folded by the butterfly; p_ij = e_j * (1/sum) for
/// j <= i, 0 above the diagonal. The softmax of `attention_forward_f32` and of
/// `attention_softmax_rows_f32`.
fn normalise_row<F: Scalar>(prow: &mut [F], i: usize, m: F) {
    let mut sums = [F::ZERO; LANES];
    for j in 0..=i {
        let e = (prow[j] - m).exp();
        prow[j] = e;
        sums[j % LANES] += e;
    }
    let inv = F::ONE / butterfly_sum(sums);
    prow[..=i].iter_mut().for_each(|x| *x *= inv);
    prow[i + 1..].iter_mut().for_each(|x| *x = F::ZERO);
}

/// Twin of `attention_softmax_rows_f32` (attention as products, see
/// [`super::attention_products`]): each row of `mats` consecutive T x T matrices holds
/// scaled scores; row i becomes its causal softmax, 0 above the diagonal. One warp per
/// row: lane l keeps the max of j = l, l+32, .. <= i (from `F::MIN`, skipping NaN), the
/// butterfly folds them, then the forward's normalisation (e_j = exp(s_j - m), ...).
///
/// # Panics
/// If `p` holds fewer than `mats * t * t` elements.
pub fn softmax_rows<F: Scalar>(p: &mut [F], mats: usize, t: usize) {
    for (r, prow) in p[..mats * t * t].chunks_exact_mut(t.max(1)).enumerate() {
        let i = r % t;
        let mut m = [F::MIN; LANES];
        for (j, &s) in prow[..=i].iter().enumerate() {
            if s > m[j % LANES] {
                m[j % LANES] = s;
            }
        }
        normalise_row(prow, i, butterfly_max(m));
    }
}

/// Twin of `attention_softmax_backward_rows_f32`: `ds` holds `mats` consecutive T x T
/// matrices of dP = dY V^T; each row i becomes dS_ij = p_ij (dp_ij - D_i) for j <= i and
/// 0 above the diagonal, with D_i = sum_{j <= i} p_ij dp_ij (lane sums over j mod 32,
/// then the butterfly, as the rows kernels' backward). Matrix m of P starts at
/// `m * p_stride`.
///
/// # Panics
/// If a slice is shorter than the shapes say.
pub fn softmax_backward_rows<F: Scalar>(
    ds: &mut [F],
    p: &[F],
    mats: usize,
    p_stride: usize,
    t: usize,
) {
    for (r, drow) in ds[..mats * t * t].chunks_exact_mut(t.max(1)).enumerate() {
        let i = r % t;
        let prow = &p[(r / t) * p_stride + i * t..][..t];
        let mut part = [F::ZERO; LANES];
        for j in 0..=i {
            part[j % LANES] += prow[j] * drow[j];
        }
        let dsum = butterfly_sum(part);
        for j in 0..=i {
            drow[j] = prow[j] * (drow[j] - dsum);
        }
        drow[i + 1..].iter_mut().for_each(|x| *x = F::ZERO);
    }
}

/// Forward (GPU order): writes `y` `[B,T,C]` and `p` `[B,H,T,T]` from `qkv` `[B,T,3C]`.
///
/// # Panics
/// If a slice is shorter than the shape says or H does not divide C.
pub fn attention_forward<F: Scalar>(y: &mut [F], p: &mut [F], qkv: &[F], s: AttnShape) {
    let AttnShape { b, t, c, h } = s;
    check(&s);
    let hs = c / h;
    let scale: F = scale_of(hs);
    let st = 3 * c;
    for bi in 0..b {
        for hi in 0..h {
            let base = bi * t * st + hi * hs;
            let q = |i: usize| &qkv[base + i * st..][..hs];
            let k = |j: usize| &qkv[base + j * st + c..][..hs];
            let v = |j: usize, d: usize| qkv[base + j * st + 2 * c + d];
            for i in 0..t {
                let prow = &mut p[((bi * h + hi) * t + i) * t..][..t];
                let mut m = [F::MIN; LANES];
                for j in 0..=i {
                    let sc = dot(q(i), k(j)) * scale;
                    prow[j] = sc;
                    if sc > m[j % LANES] {
                        m[j % LANES] = sc;
                    }
                }
                normalise_row(prow, i, butterfly_max(m));
                let yrow = &mut y[(bi * t + i) * c + hi * hs..][..hs];
                for (d, out) in yrow.iter_mut().enumerate() {
                    let mut acc = F::ZERO;
                    for (j, &pj) in prow[..=i].iter().enumerate() {
                        acc += pj * v(j, d);
                    }
                    *out = acc;
                }
            }
        }
    }
}

/// Backward (GPU order): **writes** `dqkv` `[B,T,3C]` from `dy` `[B,T,C]`, `p` and `qkv`
/// as the forward left and saw them; `scratch` (at least T*T) receives the softmax row
/// sums D of each group of (b, h) pairs, as on the GPU.
///
/// # Panics
/// If a slice is shorter than the shape says or H does not divide C.
pub fn attention_backward<F: Scalar>(
    dqkv: &mut [F],
    scratch: &mut [F],
    dy: &[F],
    p: &[F],
    qkv: &[F],
    s: AttnShape,
) {
    let AttnShape { b, t, c, h } = s;
    check(&s);
    let hs = c / h;
    let scale: F = scale_of(hs);
    let st = 3 * c;
    let group = backward_group(&s);
    let mut dp = vec![F::ZERO; t * t];
    for pair0 in (0..b * h).step_by(group) {
        let pairs = pair0..(pair0 + group).min(b * h);
        // The dq kernel: row sums first, then dq, per query row.
        for pair in pairs.clone() {
            let (bi, hi) = (pair / h, pair % h);
            let base = bi * t * st + hi * hs;
            let pm = &p[pair * t * t..][..t * t];
            let dyr = |i: usize| &dy[(bi * t + i) * c + hi * hs..][..hs];
            for i in 0..t {
                for j in 0..=i {
                    dp[i * t + j] = dot(dyr(i), &qkv[base + j * st + 2 * c..][..hs]);
                }
                let mut part = [F::ZERO; LANES];
                for j in 0..=i {
                    part[j % LANES] += pm[i * t + j] * dp[i * t + j];
                }
                let dsum = butterfly_sum(part);
                scratch[(pair - pair0) * t + i] = dsum;
                for j in 0..=i {
                    dp[i * t + j] = pm[i * t + j] * (dp[i * t + j] - dsum); // ds_ij
                }
                for d in 0..hs {
                    let mut acc = F::ZERO;
                    for j in 0..=i {
                        acc += dp[i * t + j] * qkv[base + j * st + c + d];
                    }
                    dqkv[base + i * st + d] = acc * scale;
                }
            }
            // The dkv kernel (it recomputes ds_ij with the same bits; here it is kept).
            for j in 0..t {
                for d in 0..hs {
                    let (mut ak, mut av) = (F::ZERO, F::ZERO);
                    for i in j..t {
                        ak += dp[i * t + j] * qkv[base + i * st + d];
                        av += pm[i * t + j] * dy[(bi * t + i) * c + hi * hs + d];
                    }
                    dqkv[base + j * st + c + d] = ak * scale;
                    dqkv[base + j * st + 2 * c + d] = av;
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::nn::{self, Gemm};

    /// Deterministic values in [-amp, amp) (a 64-bit LCG).
    pub(crate) fn vals(n: usize, seed: u64, amp: f64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
            })
            .collect()
    }

    fn f32s(v: &[f64]) -> Vec<f32> {
        v.iter().map(|&x| x as f32).collect()
    }

    /// Odd shapes: one token, one head, hs = 1, hs not a multiple of 4 or 32, T past one
    /// warp and past the CPU's 64-row band, more (b, h) pairs than T (several groups).
    pub(crate) const SHAPES: [AttnShape; 7] = [
        AttnShape {
            b: 1,
            t: 1,
            c: 4,
            h: 1,
        },
        AttnShape {
            b: 2,
            t: 5,
            c: 6,
            h: 3,
        },
        AttnShape {
            b: 1,
            t: 33,
            c: 3,
            h: 3,
        },
        AttnShape {
            b: 3,
            t: 4,
            c: 10,
            h: 2,
        },
        AttnShape {
            b: 1,
            t: 70,
            c: 12,
            h: 2,
        },
        AttnShape {
            b: 2,
            t: 37,
            c: 80,
            h: 2,
        },
        AttnShape {
            b: 1,
            t: 3,
            c: 264,
            h: 1,
        },
    ];

    fn close(what: &str, got: &[f32], want: &[f64], rel: f64, abs: f64) {
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let err = (g as f64 - w).abs();
            assert!(
                err <= abs + rel * w.abs(),
                "{what}[{i}]: {g} vs {w} (error {err:e})"
            );
        }
    }

    struct Run<F> {
        y: Vec<F>,
        p: Vec<F>,
        dqkv: Vec<F>,
    }

    fn run_twin<F: Scalar>(qkv: &[F], dy: &[F], s: AttnShape) -> Run<F> {
        let mut y = vec![F::from_f64(7.0); s.b * s.t * s.c];
        let mut p = vec![F::from_f64(7.0); s.b * s.h * s.t * s.t];
        attention_forward(&mut y, &mut p, qkv, s);
        let mut dqkv = vec![F::from_f64(5.0); qkv.len()]; // written, not added
        let mut scratch = vec![F::ZERO; s.t * s.t];
        attention_backward(&mut dqkv, &mut scratch, dy, &p, qkv, s);
        Run { y, p, dqkv }
    }

    fn run_cpu<F: Scalar>(qkv: &[F], dy: &[F], s: AttnShape) -> Run<F> {
        let g = Gemm::new(1);
        let mut y = vec![F::ZERO; s.b * s.t * s.c];
        let mut p = vec![F::ZERO; s.b * s.h * s.t * s.t];
        nn::attention_forward(&g, &mut y, &mut p, qkv, s);
        let mut dqkv = vec![F::ZERO; qkv.len()];
        let mut scratch = vec![F::ZERO; s.t * s.t];
        nn::attention_backward(&g, &mut dqkv, &mut scratch, dy, &p, qkv, s);
        Run { y, p, dqkv }
    }

    #[test]
    fn f32_twin_matches_the_cpu_kernel_and_f64() {
        for (n, &s) in SHAPES.iter().enumerate() {
            let qkv = vals(s.b * s.t * 3 * s.c, n as u64, 2.0);
            let dy = vals(s.b * s.t * s.c, 100 + n as u64, 1.0);
            let twin = run_twin(&f32s(&qkv), &f32s(&dy), s);
            let cpu = run_cpu(&f32s(&qkv), &f32s(&dy), s);
            let exact = run_cpu(&qkv, &dy, s);
            let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
            let tag = |w: &str| format!("{s:?} {w}");
            // Against the f32 CPU kernel (another summation order) and the f64 truth.
            close(&tag("y vs cpu"), &twin.y, &wide(&cpu.y), 1e-5, 1e-6);
            close(&tag("p vs cpu"), &twin.p, &wide(&cpu.p), 1e-5, 1e-7);
            close(
                &tag("dqkv vs cpu"),
                &twin.dqkv,
                &wide(&cpu.dqkv),
                1e-4,
                1e-5,
            );
            close(&tag("y vs f64"), &twin.y, &exact.y, 1e-5, 1e-6);
            close(&tag("p vs f64"), &twin.p, &exact.p, 1e-5, 1e-7);
            close(&tag("dqkv vs f64"), &twin.dqkv, &exact.dqkv, 1e-4, 1e-5);
            // Causal mask: exact zeros above the diagonal, as the CPU writes.
            for (r, row) in twin.p.chunks_exact(s.t).enumerate() {
                assert!(
                    row[r % s.t + 1..].iter().all(|&x| x == 0.0),
                    "{s:?} row {r}"
                );
            }
        }
    }

    #[test]
    fn f64_twin_matches_the_f64_cpu_kernel() {
        for (n, &s) in SHAPES.iter().enumerate() {
            let qkv = vals(s.b * s.t * 3 * s.c, 7 + n as u64, 3.0);
            let dy = vals(s.b * s.t * s.c, 200 + n as u64, 1.0);
            let twin = run_twin(&qkv, &dy, s);
            let cpu = run_cpu(&qkv, &dy, s);
            for (what, a, b) in [
                ("y", &twin.y, &cpu.y),
                ("p", &twin.p, &cpu.p),
                ("dqkv", &twin.dqkv, &cpu.dqkv),
            ] {
                for (i, (x, w)) in a.iter().zip(b.iter()).enumerate() {
                    assert!(
                        (x - w).abs() <= 1e-12 * (1.0 + w.abs()),
                        "{s:?} {what}[{i}]: {x} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn large_scores_do_not_overflow() {
        // Scores far beyond exp's range: the max shift keeps every e_j finite.
        let s = AttnShape {
            b: 1,
            t: 40,
            c: 8,
            h: 2,
        };
        let qkv = f32s(&vals(s.b * s.t * 3 * s.c, 3, 60.0));
        let dy = f32s(&vals(s.b * s.t * s.c, 4, 1.0));
        let r = run_twin(&qkv, &dy, s);
        assert!(r.y.iter().chain(&r.p).chain(&r.dqkv).all(|x| x.is_finite()));
        for (i, row) in r.p.chunks_exact(s.t).enumerate() {
            let sum: f64 = row.iter().map(|&x| x as f64).sum();
            assert!((sum - 1.0).abs() < 1e-5, "row {i} sums to {sum}");
        }
    }

    #[test]
    fn butterflies_fold_halves() {
        let a: [f64; 32] = std::array::from_fn(|i| (i * i) as f64);
        assert_eq!(
            butterfly_sum(a),
            (0..32).map(|i| (i * i) as f64).sum::<f64>()
        );
        let mut b = [-1.0f32; 32];
        b[19] = 4.0;
        b[3] = 2.0;
        assert_eq!(butterfly_max(b), 4.0);
        // Why lanes may disagree on the sign of a zero maximum without consequence.
        for s in [0.0f32, -0.0] {
            let (a, b) = (nn::exp_f32(s - 0.0), nn::exp_f32(s - -0.0));
            assert_eq!(
                (a.to_bits(), b.to_bits()),
                (1.0f32.to_bits(), 1.0f32.to_bits())
            );
        }
        // Non-associative on purpose: the fold's grouping shows in f32.
        let mut c = [0.0f32; 32];
        c[0] = 1.0e8;
        c[16] = -1.0e8;
        c[1] = 1.0;
        assert_eq!(butterfly_sum(c), 1.0);
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
        attention_forward(&mut [0.0f32; 12], &mut [0.0; 16], &[0.0; 36], s);
    }
}
