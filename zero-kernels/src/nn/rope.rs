//! Rotary position embeddings (Su et al. 2021, RoFormer) with grouped-query attention's
//! key/value sharing (Ainslie et al. 2023), in one pass that turns separate `q` `[B,T,C]`,
//! `k` and `v` `[B,T,Ckv]` (C = H hd, Ckv = Hkv hd) into the packed `qkv` `[B,T,3C]` that
//! the multi-head attention kernel ([`super::attention`]) reads: q and k rotated by their
//! position t, and each of the Hkv key/value heads repeated for the H/Hkv query heads that
//! share it. GQA thus reuses the existing attention op on a full-width buffer; the
//! backward sums the repeated heads' gradients back into the shared head.
//!
//! Rotation layout: Hugging Face's `rotate_half` (the Llama of `transformers`), which pairs
//! element i of a head with element i + hd/2: for i < hd/2, angle = t theta^(-2i/hd),
//!
//! ```text
//! y[i]        = x[i] cos - x[i + hd/2] sin
//! y[i + hd/2] = x[i + hd/2] cos + x[i] sin
//! ```
//!
//! (Meta's reference code pairs 2i with 2i+1 instead; the two differ by a permutation of
//! each head's q and k rows, which the checkpoint converters apply.) The angles are
//! computed in f64 and rounded once to the scalar.

use super::scalar::Scalar;

/// Shapes of one rotary/GQA call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeShape {
    /// B.
    pub b: usize,
    /// T (this batch's sequence length; the position of row r is r mod T).
    pub t: usize,
    /// H: query heads.
    pub h: usize,
    /// Hkv: key/value heads (divides H).
    pub kv_h: usize,
    /// hd: channels per head (even).
    pub hd: usize,
    /// The rotary base theta (10000 in Llama 2, 500000 in Llama 3).
    pub theta: f64,
}

impl RopeShape {
    /// C = H hd.
    pub fn c(&self) -> usize {
        self.h * self.hd
    }

    /// Ckv = Hkv hd.
    pub fn c_kv(&self) -> usize {
        self.kv_h * self.hd
    }

    /// Check the heads: Hkv > 0 divides H, hd even and > 0, and the sizes fit `usize`.
    pub fn check(&self) -> Result<(), String> {
        if self.kv_h == 0 || !self.h.is_multiple_of(self.kv_h) {
            return Err(format!(
                "rope: {} kv heads do not divide {} query heads",
                self.kv_h, self.h
            ));
        }
        if self.hd == 0 || !self.hd.is_multiple_of(2) {
            return Err(format!("rope: head size {} is not even and > 0", self.hd));
        }
        // The sizes the kernels index by: qkv [B,T,3C], and k, v [B,T,Ckv] apart (with
        // H = 0 any Hkv divides it).
        let (b, t, hd) = (self.b, self.t, self.hd);
        if super::checked_elems(&[b, t, 3, self.h, hd]).is_none()
            || super::checked_elems(&[b, t, self.kv_h, hd]).is_none()
        {
            return Err(format!(
                "rope: the buffers of {self:?} have more elements than usize counts"
            ));
        }
        Ok(())
    }

    /// cos and sin per (t, i < hd/2), row-major `[T, hd/2]`: the angle t theta^(-2i/hd)
    /// in f64, rounded once. The GPU kernels read this table (uploaded) rather than
    /// computing it, so that every device rotates by the same bits.
    pub(crate) fn table<F: Scalar>(&self) -> (Vec<F>, Vec<F>) {
        let half = self.hd / 2;
        let mut cos = Vec::with_capacity(self.t * half);
        let mut sin = Vec::with_capacity(self.t * half);
        for t in 0..self.t {
            for i in 0..half {
                let freq = self.theta.powf(-((2 * i) as f64) / self.hd as f64);
                let (s, c) = (t as f64 * freq).sin_cos();
                cos.push(F::from_f64(c));
                sin.push(F::from_f64(s));
            }
        }
        (cos, sin)
    }
}

/// `y = R(t) x` for one head (see the module doc).
#[inline(always)]
fn rotate<F: Scalar>(y: &mut [F], x: &[F], cos: &[F], sin: &[F]) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        y[i] = a * cos[i] - b * sin[i];
        y[i + half] = b * cos[i] + a * sin[i];
    }
}

/// `dx (+)= R(t)^T dy` for one head (the rotation's transpose), adding when `add`.
#[inline(always)]
fn rotate_back<F: Scalar>(dx: &mut [F], dy: &[F], cos: &[F], sin: &[F], add: bool) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = (dy[i], dy[i + half]);
        let (u, v) = (a * cos[i] + b * sin[i], b * cos[i] - a * sin[i]);
        if add {
            dx[i] += u;
            dx[i + half] += v;
        } else {
            dx[i] = u;
            dx[i + half] = v;
        }
    }
}

/// Forward: **writes** `qkv` `[B,T,3C]` from `q` `[B,T,C]`, `k`, `v` `[B,T,Ckv]`: query
/// head j = R(t) q_j, key head j = R(t) k_{j/g}, value head j = v_{j/g}, g = H/Hkv.
///
/// # Panics
/// If a slice is shorter than the shape says or the heads do not fit ([`RopeShape::check`]).
#[inline(always)]
pub fn rope_gqa_forward<F: Scalar>(qkv: &mut [F], q: &[F], k: &[F], v: &[F], s: RopeShape) {
    if let Err(e) = s.check() {
        panic!("{e}");
    }
    let (c, ckv, hd, half) = (s.c(), s.c_kv(), s.hd, s.hd / 2);
    let group = s.h / s.kv_h;
    let (cos, sin) = s.table::<F>();
    for r in 0..s.b * s.t {
        let tab = (r % s.t) * half..(r % s.t + 1) * half;
        let (cs, sn) = (&cos[tab.clone()], &sin[tab]);
        let row = &mut qkv[r * 3 * c..(r + 1) * 3 * c];
        let (qr, kr, vr) = (
            &q[r * c..(r + 1) * c],
            &k[r * ckv..(r + 1) * ckv],
            &v[r * ckv..(r + 1) * ckv],
        );
        for j in 0..s.h {
            let kv = j / group;
            let (src_q, src_k) = (&qr[j * hd..][..hd], &kr[kv * hd..][..hd]);
            rotate(&mut row[j * hd..][..hd], src_q, cs, sn);
            rotate(&mut row[c + j * hd..][..hd], src_k, cs, sn);
            row[2 * c + j * hd..][..hd].copy_from_slice(&vr[kv * hd..][..hd]);
        }
    }
}

/// Backward: **writes** `dq` `[B,T,C]`, `dk`, `dv` `[B,T,Ckv]` from `dqkv` `[B,T,3C]`:
/// dq_j = R(t)^T dqkv_q,j; dk_m = sum over the g query heads j of group m of
/// R(t)^T dqkv_k,j; dv_m = the same sum of dqkv_v,j (in j order).
///
/// # Panics
/// As [`rope_gqa_forward`].
#[inline(always)]
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
    for r in 0..s.b * s.t {
        let tab = (r % s.t) * half..(r % s.t + 1) * half;
        let (cs, sn) = (&cos[tab.clone()], &sin[tab]);
        let row = &dqkv[r * 3 * c..(r + 1) * 3 * c];
        let dqr = &mut dq[r * c..(r + 1) * c];
        let dkr = &mut dk[r * ckv..(r + 1) * ckv];
        let dvr = &mut dv[r * ckv..(r + 1) * ckv];
        for j in 0..s.h {
            let (kv, first) = (j / group, j % group == 0);
            rotate_back(
                &mut dqr[j * hd..][..hd],
                &row[j * hd..][..hd],
                cs,
                sn,
                false,
            );
            rotate_back(
                &mut dkr[kv * hd..][..hd],
                &row[c + j * hd..][..hd],
                cs,
                sn,
                !first,
            );
            let (dst, src) = (&mut dvr[kv * hd..][..hd], &row[2 * c + j * hd..][..hd]);
            if first {
                dst.copy_from_slice(src);
            } else {
                dst.iter_mut().zip(src).for_each(|(d, &x)| *d += x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::testvals::{central_difference, vals};

    fn shape() -> RopeShape {
        RopeShape {
            b: 2,
            t: 3,
            h: 4,
            kv_h: 2,
            hd: 6,
            theta: 10000.0,
        }
    }

    #[test]
    fn forward_matches_f64_reference_and_f32() {
        let s = shape();
        let (c, ckv, bt) = (s.c(), s.c_kv(), s.b * s.t);
        let (q, k, v) = (vals(bt * c, 1), vals(bt * ckv, 2), vals(bt * ckv, 3));
        let mut qkv = vec![0.0; bt * 3 * c];
        rope_gqa_forward(&mut qkv, &q, &k, &v, s);
        let to32 = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let mut qkv32 = vec![0.0f32; bt * 3 * c];
        rope_gqa_forward(&mut qkv32, &to32(&q), &to32(&k), &to32(&v), s);
        // The reference: the rotation written out per element, as complex multiplication
        // of (x[i], x[i + hd/2]) by e^{i t theta^(-2i/hd)}.
        let (hd, half) = (s.hd, s.hd / 2);
        for r in 0..bt {
            let t = (r % s.t) as f64;
            for j in 0..s.h {
                let m = j / (s.h / s.kv_h);
                for i in 0..half {
                    let ang = t * s.theta.powf(-(2.0 * i as f64) / hd as f64);
                    let rot = |x: &[f64], base: usize| {
                        let (a, b) = (x[base + i], x[base + i + half]);
                        (a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin())
                    };
                    let (q0, q1) = rot(&q, r * c + j * hd);
                    let (k0, k1) = rot(&k, r * ckv + m * hd);
                    let o = r * 3 * c + j * hd;
                    for (at, want) in [
                        (o + i, q0),
                        (o + i + half, q1),
                        (o + c + i, k0),
                        (o + c + i + half, k1),
                        (o + 2 * c + i, v[r * ckv + m * hd + i]),
                    ] {
                        assert!((qkv[at] - want).abs() < 1e-14, "qkv[{at}]");
                        // f32: a rounding of the angle's cos/sin and of two products.
                        assert!((qkv32[at] as f64 - want).abs() < 1e-5, "qkv32[{at}]");
                    }
                }
            }
        }
    }

    #[test]
    fn backward_matches_central_differences_f64() {
        let s = shape();
        let (c, ckv, bt) = (s.c(), s.c_kv(), s.b * s.t);
        let (q, k, v) = (vals(bt * c, 4), vals(bt * ckv, 5), vals(bt * ckv, 6));
        let g = vals(bt * 3 * c, 7);
        let loss = |q: &[f64], k: &[f64], v: &[f64]| {
            let mut o = vec![0.0; bt * 3 * c];
            rope_gqa_forward(&mut o, q, k, v, s);
            o.iter().zip(&g).map(|(o, g)| o * g).sum::<f64>()
        };
        let (mut dq, mut dk, mut dv) =
            (vec![9.0; bt * c], vec![9.0; bt * ckv], vec![9.0; bt * ckv]);
        rope_gqa_backward(&mut dq, &mut dk, &mut dv, &g, s);
        for (i, got) in dq.iter().enumerate() {
            let want = central_difference(&q, i, |e| loss(e, &k, &v));
            assert!((got - want).abs() < 1e-8, "dq[{i}]");
        }
        for i in 0..k.len() {
            let want_k = central_difference(&k, i, |e| loss(&q, e, &v));
            let want_v = central_difference(&v, i, |e| loss(&q, &k, e));
            assert!((dk[i] - want_k).abs() < 1e-8, "dk[{i}]");
            assert!((dv[i] - want_v).abs() < 1e-8, "dv[{i}]");
        }
    }
}
