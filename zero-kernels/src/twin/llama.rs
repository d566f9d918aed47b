//! CPU twin of `src/nn/cuda/llama.cu`: Llama's RMSNorm, rotary/GQA and SwiGLU ops with
//! the semantics (and signatures) of [`crate::nn::rmsnorm_forward`] & co., in the GPU
//! kernels' order:
//!
//! - RMSNorm forward, one warp per row: rstd = 1 / sqrt((warp sum of x^2) (1/C) + eps), a
//!   [`warp_strided_sum`]; out = (x rstd) w. Backward: dx per row from the warp sum of
//!   (dout w) x; dw as column sums of (dout x) rstd in chunks of [`CHUNK_ROWS`] rows
//!   ([`chunk_partials`]) folded over chunks ([`fold_columns`]). Only the grouping of
//!   these sums differs from the CPU kernel, which adds in column (or row) order.
//! - Rotary/GQA: one GPU thread per (row, head, i < hd/2) pair of elements; each element is
//!   the CPU's operations in the CPU's order (the cos/sin table is the CPU's, uploaded), and
//!   the backward's sums over a key/value head's query heads run in head order from the
//!   first head's value, as the CPU's copy-then-add: the CPU kernel's bits exactly.
//! - SwiGLU: one element per thread, the CPU's operations (its Cephes exp included): the
//!   CPU kernel's bits exactly.

use super::reduce::{fold_columns, warp_strided_sum};
use super::rows::{chunk_partials, CHUNK_ROWS};
use crate::nn::{RopeShape, Scalar};

/// RMSNorm forward (**writes** `out` `[rows, c]`, `rstd` `[rows]`), GPU order.
///
/// # Panics
/// As [`crate::nn::rmsnorm_forward`]: `rstd` shorter than the rows, `w` than `c`.
pub fn rmsnorm_forward<F: Scalar>(
    out: &mut [F],
    rstd: &mut [F],
    x: &[F],
    w: &[F],
    c: usize,
    eps: f64,
) {
    let inv_c = F::from_f64(1.0 / c as f64);
    let eps = F::from_f64(eps);
    for (r, (xr, or)) in x.chunks_exact(c).zip(out.chunks_exact_mut(c)).enumerate() {
        let ss = warp_strided_sum(c, |j| xr[j] * xr[j]);
        let s = F::ONE / (ss * inv_c + eps).sqrt();
        for j in 0..c {
            or[j] = xr[j] * s * w[j];
        }
        rstd[r] = s;
    }
}

/// RMSNorm backward, GPU order. **Adds** into `dx` `[rows, c]` and `dw` `[c]`: with
/// m = mean((dout w) x), dx += (dout w) rstd - x (rstd^3 m), dw += column sums of
/// (dout x) rstd.
///
/// # Panics
/// As [`crate::nn::rmsnorm_backward`].
pub fn rmsnorm_backward<F: Scalar>(
    dx: &mut [F],
    dw: &mut [F],
    dout: &[F],
    x: &[F],
    w: &[F],
    rstd: &[F],
    c: usize,
) {
    let rows = dx.len().min(x.len()).min(dout.len()) / c;
    let inv_c = F::from_f64(1.0 / c as f64);
    for (r, dxr) in dx.chunks_exact_mut(c).take(rows).enumerate() {
        let (xr, dr, s) = (&x[r * c..][..c], &dout[r * c..][..c], rstd[r]);
        let m = warp_strided_sum(c, |j| dr[j] * w[j] * xr[j]) * inv_c;
        let k = s * s * s * m;
        for (j, d) in dxr.iter_mut().enumerate() {
            *d += dr[j] * w[j] * s - xr[j] * k;
        }
    }
    let chunks = rows.div_ceil(CHUNK_ROWS);
    let pw = chunk_partials(rows, c, |r, j| dout[r * c + j] * x[r * c + j] * rstd[r]);
    fold_columns(dw, &pw, chunks, c);
}

/// The rotation of one pair (x_i, x_{i+hd/2}) by (cos, sin).
fn rotate<F: Scalar>(a: F, b: F, c: F, s: F) -> (F, F) {
    (a * c - b * s, b * c + a * s)
}

/// Its transpose.
fn rotate_back<F: Scalar>(a: F, b: F, c: F, s: F) -> (F, F) {
    (a * c + b * s, b * c - a * s)
}

/// Rotary/GQA forward (**writes** `qkv` `[B,T,3C]`), one GPU thread per (row r, query head
/// j, i < hd/2) in that index order: the q pair of head j, the k pair of key/value head
/// j / g, the v pair copied.
///
/// # Panics
/// As [`crate::nn::rope_gqa_forward`].
pub fn rope_gqa_forward<F: Scalar>(qkv: &mut [F], q: &[F], k: &[F], v: &[F], s: RopeShape) {
    if let Err(e) = s.check() {
        panic!("{e}");
    }
    let (c, ckv, hd, half) = (s.c(), s.c_kv(), s.hd, s.hd / 2);
    let group = s.h / s.kv_h;
    let (cos, sin) = s.table::<F>();
    for idx in 0..s.b * s.t * s.h * half {
        let (r, rem) = (idx / (s.h * half), idx % (s.h * half));
        let (j, i) = (rem / half, rem % half);
        let t = (r % s.t) * half + i;
        let (cs, sn) = (cos[t], sin[t]);
        let kv = (j / group) * hd;
        let (qs, ks, vs) = (
            &q[r * c + j * hd..][..hd],
            &k[r * ckv + kv..][..hd],
            &v[r * ckv + kv..][..hd],
        );
        let row = &mut qkv[r * 3 * c + j * hd..];
        (row[i], row[i + half]) = rotate(qs[i], qs[i + half], cs, sn);
        (row[c + i], row[c + i + half]) = rotate(ks[i], ks[i + half], cs, sn);
        (row[2 * c + i], row[2 * c + i + half]) = (vs[i], vs[i + half]);
    }
}

/// Rotary/GQA backward (**writes** `dq` `[B,T,C]`, `dk`, `dv` `[B,T,Ckv]`), one GPU thread
/// per (row r, key/value head m, i < hd/2): the dq pairs of query heads m g .. m g + g - 1;
/// the dk and dv pairs summed over them in that order, from the first head's value.
///
/// # Panics
/// As [`crate::nn::rope_gqa_backward`].
pub fn rope_gqa_backward<F: Scalar>(
    dq: &mut [F],
    dk: &mut [F],
    dv: &mut [F],
    dqkv: &[F],
    s: RopeShape,
) {
    if let Err(e) = s.check() {
        panic!("{e}");
    }
    let (c, ckv, hd, half) = (s.c(), s.c_kv(), s.hd, s.hd / 2);
    let group = s.h / s.kv_h;
    let (cos, sin) = s.table::<F>();
    for idx in 0..s.b * s.t * s.kv_h * half {
        let (r, rem) = (idx / (s.kv_h * half), idx % (s.kv_h * half));
        let (m, i) = (rem / half, rem % half);
        let t = (r % s.t) * half + i;
        let (cs, sn) = (cos[t], sin[t]);
        let row = &dqkv[r * 3 * c..][..3 * c];
        let mut acc = [F::ZERO; 4];
        for jj in 0..group {
            let o = (m * group + jj) * hd;
            let dqh = &mut dq[r * c + o..];
            (dqh[i], dqh[i + half]) = rotate_back(row[o + i], row[o + i + half], cs, sn);
            let (u, w) = rotate_back(row[c + o + i], row[c + o + i + half], cs, sn);
            let terms = [u, w, row[2 * c + o + i], row[2 * c + o + i + half]];
            for (a, t) in acc.iter_mut().zip(terms) {
                *a = if jj == 0 { t } else { *a + t };
            }
        }
        let o = r * ckv + m * hd;
        (dk[o + i], dk[o + i + half]) = (acc[0], acc[1]);
        (dv[o + i], dv[o + i + half]) = (acc[2], acc[3]);
    }
}

/// sigmoid(a) = 1 / (1 + exp(0 - a)).
fn sigmoid<F: Scalar>(a: F) -> F {
    F::ONE / (F::ONE + (F::ZERO - a).exp())
}

/// SwiGLU forward, **writes** `out = (a sigmoid(a)) b` elementwise.
pub fn swiglu_forward<F: Scalar>(out: &mut [F], a: &[F], b: &[F]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = a * sigmoid(a) * b;
    }
}

/// SwiGLU backward, **writes** `da = ((dout b) s) (1 + a (1 - s))`, `db = (dout a) s`,
/// s = sigmoid(a).
pub fn swiglu_backward<F: Scalar>(da: &mut [F], db: &mut [F], dout: &[F], a: &[F], b: &[F]) {
    for ((((da, db), &d), &a), &b) in da.iter_mut().zip(db.iter_mut()).zip(dout).zip(a).zip(b) {
        let s = sigmoid(a);
        *da = d * b * s * (F::ONE + a * (F::ONE - s));
        *db = d * a * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn;
    use crate::testutil::{vals, wide};

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

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

    /// (rows, C): rows not a multiple of 32 or of a chunk, C below 32, not a multiple of
    /// 4 or 32, one row, Llama-tiny's and Llama 2 7B's widths.
    const SHAPES: [(usize, usize); 9] = [
        (1, 1),
        (1, 7),
        (2, 31),
        (3, 33),
        (5, 64),
        (31, 100),
        (33, 5),
        (70, 256),
        (40, 4096),
    ];

    // RMSNorm. The twin adds x^2 (and the backward's terms) per lane, then by the
    // butterfly; the CPU kernel adds them in column order. For the forward's sum of C
    // positive terms both orders are within C ulps of the exact sum (rounding errors of
    // random sign, ~sqrt(C) ulps in practice: 1.5e-6 relative at C = 4096), so rstd and
    // out agree to 1e-5 relative. The backward's m sums terms of both signs: dx is
    // compared absolutely to 1e-4 (1 + |dx|) with |x|, |dout|, |w| <= ~2, as LayerNorm's
    // twin test; dw sums `rows` terms of size ~2 in chunks then over chunks: 2e-6 rows.

    #[test]
    fn rmsnorm_forward_tracks_the_cpu_kernel_and_f64() {
        for (seed, &(rows, c)) in SHAPES.iter().enumerate() {
            let seed = seed as u64;
            let x = vals(rows * c, seed, 4.0, 0.7);
            let w = vals(c, seed + 10, 1.0, 1.0);
            let mut t = (vec![0.0f32; rows * c], vec![0.0f32; rows]);
            rmsnorm_forward(&mut t.0, &mut t.1, &x, &w, c, nn::RMS_EPS);
            let mut h = t.clone();
            nn::rmsnorm_forward(&mut h.0, &mut h.1, &x, &w, c, nn::RMS_EPS);
            let mut e = (vec![0.0f64; rows * c], vec![0.0f64; rows]);
            nn::rmsnorm_forward(&mut e.0, &mut e.1, &wide(&x), &wide(&w), c, nn::RMS_EPS);
            close("out vs f64", &t.0, &e.0, 1e-5);
            close("rstd vs f64", &t.1, &e.1, 1e-5);
            close("out vs cpu", &t.0, &wide(&h.0), 1e-5);
            close("rstd vs cpu", &t.1, &wide(&h.1), 1e-5);
            // One column: one term per sum, no order to differ in.
            if c == 1 {
                assert_eq!(bits(&t.0), bits(&h.0));
                assert_eq!(bits(&t.1), bits(&h.1));
            }
        }
    }

    #[test]
    fn rmsnorm_backward_tracks_the_cpu_kernel_and_f64() {
        for (seed, &(rows, c)) in SHAPES.iter().enumerate() {
            let seed = seed as u64 + 100;
            let x = vals(rows * c, seed, 4.0, 0.7);
            let w = vals(c, seed + 1, 1.0, 1.0);
            let dout = vals(rows * c, seed + 3, 2.0, 0.1);
            let (mut out, mut rstd) = (vec![0.0f32; rows * c], vec![0.0f32; rows]);
            rmsnorm_forward(&mut out, &mut rstd, &x, &w, c, nn::RMS_EPS);
            // Start from nonzero gradients: the backward adds.
            let (dx0, dw0) = (
                vals(rows * c, seed + 4, 1.0, 0.0),
                vals(c, seed + 5, 1.0, 0.0),
            );
            let mut t = (dx0.clone(), dw0.clone());
            rmsnorm_backward(&mut t.0, &mut t.1, &dout, &x, &w, &rstd, c);
            let mut h = (dx0.clone(), dw0.clone());
            nn::rmsnorm_backward(&mut h.0, &mut h.1, &dout, &x, &w, &rstd, c);
            // f64 from the same saved rstd.
            let mut e = (wide(&dx0), wide(&dw0));
            nn::rmsnorm_backward(
                &mut e.0,
                &mut e.1,
                &wide(&dout),
                &wide(&x),
                &wide(&w),
                &wide(&rstd),
                c,
            );
            let sum_tol = 2e-6 * (rows as f64).max(1.0);
            close("dx vs f64", &t.0, &e.0, 1e-4);
            close("dw vs f64", &t.1, &e.1, sum_tol);
            close("dx vs cpu", &t.0, &wide(&h.0), 1e-4);
            close("dw vs cpu", &t.1, &wide(&h.1), sum_tol);
        }
    }

    #[test]
    fn f64_rmsnorm_twin_is_the_exact_rmsnorm() {
        // In f64 the twin agrees with the CPU kernel to ~1e-12: the summation orders
        // differ, the math does not.
        let (rows, c) = (37, 50);
        let x = wide(&vals(rows * c, 7, 4.0, 0.7));
        let w = wide(&vals(c, 8, 1.0, 1.0));
        let dout = wide(&vals(rows * c, 10, 2.0, 0.1));
        let mut t = (vec![0.0; rows * c], vec![0.0; rows]);
        let mut h = t.clone();
        rmsnorm_forward(&mut t.0, &mut t.1, &x, &w, c, nn::RMS_EPS);
        nn::rmsnorm_forward(&mut h.0, &mut h.1, &x, &w, c, nn::RMS_EPS);
        let mut gt = (vec![0.0; rows * c], vec![0.0; c]);
        let mut gh = gt.clone();
        rmsnorm_backward(&mut gt.0, &mut gt.1, &dout, &x, &w, &t.1, c);
        nn::rmsnorm_backward(&mut gh.0, &mut gh.1, &dout, &x, &w, &h.1, c);
        for (a, b) in [(&t.0, &h.0), (&t.1, &h.1), (&gt.0, &gh.0), (&gt.1, &gh.1)] {
            for (x, y) in a.iter().zip(b.iter()) {
                assert!((x - y).abs() <= 1e-11 * (1.0 + y.abs()), "{x} vs {y}");
            }
        }
    }

    /// GQA (g = 2 and 4), plain multi-head (g = 1), one key/value head, odd T and B.
    fn rope_shapes() -> Vec<RopeShape> {
        let s = |b, t, h, kv_h, hd, theta| RopeShape {
            b,
            t,
            h,
            kv_h,
            hd,
            theta,
        };
        vec![
            s(2, 3, 4, 2, 6, 10000.0),
            s(1, 5, 4, 4, 8, 10000.0),
            s(3, 7, 8, 1, 2, 500000.0),
            s(2, 17, 8, 2, 32, 500000.0),
        ]
    }

    #[test]
    fn rope_equals_the_cpu_kernel_bitwise_and_tracks_f64() {
        for (n, s) in rope_shapes().into_iter().enumerate() {
            let seed = 200 + 10 * n as u64;
            let (c, ckv, bt) = (s.c(), s.c_kv(), s.b * s.t);
            let q = vals(bt * c, seed, 4.0, 0.3);
            let k = vals(bt * ckv, seed + 1, 4.0, -0.2);
            let v = vals(bt * ckv, seed + 2, 4.0, 0.1);
            let mut t = vec![f32::NAN; bt * 3 * c];
            rope_gqa_forward(&mut t, &q, &k, &v, s);
            let mut h = vec![0.0f32; bt * 3 * c];
            nn::rope_gqa_forward(&mut h, &q, &k, &v, s);
            assert_eq!(bits(&t), bits(&h), "forward {s:?}");
            let mut e = vec![0.0f64; bt * 3 * c];
            nn::rope_gqa_forward(&mut e, &wide(&q), &wide(&k), &wide(&v), s);
            // Two products of a rounded cos/sin and one sum: a few ulps of |x| <= 2.5.
            close("qkv vs f64", &t, &e, 1e-6);

            let g = vals(bt * 3 * c, seed + 3, 2.0, 0.0);
            let mut t = (
                vec![f32::NAN; bt * c],
                vec![f32::NAN; bt * ckv],
                vec![f32::NAN; bt * ckv],
            );
            rope_gqa_backward(&mut t.0, &mut t.1, &mut t.2, &g, s);
            let mut h = (
                vec![0.0f32; bt * c],
                vec![0.0f32; bt * ckv],
                vec![0.0; bt * ckv],
            );
            nn::rope_gqa_backward(&mut h.0, &mut h.1, &mut h.2, &g, s);
            assert_eq!(bits(&t.0), bits(&h.0), "dq {s:?}");
            assert_eq!(bits(&t.1), bits(&h.1), "dk {s:?}");
            assert_eq!(bits(&t.2), bits(&h.2), "dv {s:?}");
            let mut e = (vec![0.0; bt * c], vec![0.0; bt * ckv], vec![0.0; bt * ckv]);
            nn::rope_gqa_backward(&mut e.0, &mut e.1, &mut e.2, &wide(&g), s);
            // dk, dv sum g = H/Hkv terms of size <= ~1.5: g ulps of their sum.
            let tol = 1e-6 * (s.h / s.kv_h) as f64;
            close("dq vs f64", &t.0, &e.0, 1e-6);
            close("dk vs f64", &t.1, &e.1, tol);
            close("dv vs f64", &t.2, &e.2, tol);
        }
    }

    #[test]
    fn swiglu_equals_the_cpu_kernel_bitwise_and_tracks_f64() {
        // A sweep through the range, the tails where exp clamps, signed zeros, specials.
        let mut a: Vec<f32> = (-3000..3000).map(|i| i as f32 * 4.1e-3).collect();
        a.extend([-100.0, -88.5, -87.0, 88.0, 90.0, 0.0, -0.0, 1e-40, -1e-40]);
        a.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        let n = a.len();
        let b = vals(n, 7, 4.0, 0.0);
        let d = vals(n, 8, 2.0, 0.5);
        let (mut t, mut h) = (vec![0.0f32; n], vec![0.0f32; n]);
        swiglu_forward(&mut t, &a, &b);
        nn::swiglu_forward(&mut h, &a, &b);
        assert_eq!(bits(&t), bits(&h));
        let (mut ta, mut tb, mut ha, mut hb) = (t.clone(), t.clone(), h.clone(), h.clone());
        swiglu_backward(&mut ta, &mut tb, &d, &a, &b);
        nn::swiglu_backward(&mut ha, &mut hb, &d, &a, &b);
        assert_eq!(bits(&ta), bits(&ha));
        assert_eq!(bits(&tb), bits(&hb));
        // Against f64 (libm's exp) on the finite range: the Cephes exp's ~2 ulp and a few
        // roundings, relative to the operands' size.
        let keep: Vec<usize> = (0..n).filter(|&i| a[i].abs() < 50.0).collect();
        let pick = |v: &[f32]| keep.iter().map(|&i| v[i]).collect::<Vec<f32>>();
        let (a, b, d) = (pick(&a), pick(&b), pick(&d));
        let (t, ta, tb) = (pick(&t), pick(&ta), pick(&tb));
        let m = a.len();
        let (mut e, mut ea, mut eb) = (vec![0.0f64; m], vec![0.0f64; m], vec![0.0f64; m]);
        nn::swiglu_forward(&mut e, &wide(&a), &wide(&b));
        nn::swiglu_backward(&mut ea, &mut eb, &wide(&d), &wide(&a), &wide(&b));
        for i in 0..m {
            let scale = 1.0 + (a[i] as f64).abs() * (1.0 + (b[i] as f64).abs());
            let scale = scale * (1.0 + (d[i] as f64).abs());
            assert!(
                (t[i] as f64 - e[i]).abs() <= 1e-6 * scale,
                "out at a = {}",
                a[i]
            );
            assert!(
                (ta[i] as f64 - ea[i]).abs() <= 1e-6 * scale,
                "da at a = {}",
                a[i]
            );
            assert!(
                (tb[i] as f64 - eb[i]).abs() <= 1e-6 * scale,
                "db at a = {}",
                a[i]
            );
        }
    }
}
