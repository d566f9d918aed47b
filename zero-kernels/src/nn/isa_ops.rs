//! The model's elementwise and row ops as [`AutoKernel`]s, so a device runs them compiled
//! for its instruction-set level (`run_auto(exec, GeluForward(out, x))`) instead of the
//! baseline x86-64 (SSE2) the crate is built for. Each op is a tuple struct of the nn
//! function's arguments; `run` calls that function, which is `#[inline(always)]` (as are
//! its helpers: `exp`, `tanh`, the softmax rows), so LLVM compiles the whole body inside
//! each level's `#[target_feature]` wrapper and vectorises it with AVX2 or AVX-512. The
//! bodies reorder no float operation, so every level gives the baseline's bits (see
//! [`AutoKernel`]). A float sum does not vectorise without reordering it, so the row ops
//! take their maxima in 16 lanes (`softmax::row_max`, exact) and sum 8 rows at a time,
//! each in index order (`scalar::interleaved_sums`), instead of one row's chain of
//! dependent adds.
//!
//! The gathers, scatters and copies of `rows` are left out: they move memory and compute
//! nothing, so a wider vector gains nothing.

use super::attention::{self, AttnShape};
use super::gemm::Gemm;
use super::rope::RopeShape;
use super::scalar::Scalar;
use super::{activation, norm, rmsnorm, rows, swiglu, xent};
use crate::simd::AutoKernel;

/// Declares one op struct per nn function: `Name<'a, F>(arg: type, ...) => function;`.
macro_rules! isa_ops {
    ($(
        $(#[$doc:meta])*
        $name:ident<$lt:lifetime, $f:ident>($($arg:ident: $ty:ty),* $(,)?) => $body:path;
    )*) => {$(
        $(#[$doc])*
        pub(crate) struct $name<$lt, $f: Scalar>($(pub(crate) $ty),*);

        impl<$lt, $f: Scalar> AutoKernel for $name<$lt, $f> {
            type Out = ();
            #[inline(always)]
            fn run(self) {
                let $name($($arg),*) = self;
                $body($($arg),*)
            }
        }
    )*};
}

isa_ops! {
    /// [`activation::gelu_forward`].
    GeluForward<'a, F>(out: &'a mut [F], x: &'a [F]) => activation::gelu_forward;
    /// [`activation::gelu_backward_inplace`].
    GeluBackward<'a, F>(d: &'a mut [F], x: &'a [F]) => activation::gelu_backward_inplace;
    /// [`norm::layernorm_forward`].
    LayerNormForward<'a, F>(
        out: &'a mut [F],
        mean: &'a mut [F],
        rstd: &'a mut [F],
        x: &'a [F],
        w: &'a [F],
        b: &'a [F],
        c: usize,
    ) => norm::layernorm_forward;
    /// [`norm::layernorm_backward`].
    LayerNormBackward<'a, F>(
        dx: &'a mut [F],
        dw: &'a mut [F],
        db: &'a mut [F],
        dout: &'a [F],
        x: &'a [F],
        w: &'a [F],
        mean: &'a [F],
        rstd: &'a [F],
        c: usize,
    ) => norm::layernorm_backward;
    /// [`norm::layernorm_backward_dx`].
    LayerNormBackwardDx<'a, F>(
        dx: &'a mut [F],
        dout: &'a [F],
        x: &'a [F],
        w: &'a [F],
        mean: &'a [F],
        rstd: &'a [F],
        c: usize,
    ) => norm::layernorm_backward_dx;
    /// [`norm::layernorm_backward_params`].
    LayerNormBackwardParams<'a, F>(
        dw: &'a mut [F],
        db: &'a mut [F],
        dout: &'a [F],
        x: &'a [F],
        mean: &'a [F],
        rstd: &'a [F],
        c: usize,
        first: usize,
    ) => norm::layernorm_backward_params;
    /// [`xent::softmax_xent_forward`].
    SoftmaxXentForward<'a, F>(
        logits_to_probs: &'a mut [F],
        losses: &'a mut [F],
        targets: &'a [u32],
        v: usize,
    ) => xent::softmax_xent_forward;
    /// [`xent::softmax_xent_backward`].
    SoftmaxXentBackward<'a, F>(
        probs_to_dlogits: &'a mut [F],
        targets: &'a [u32],
        v: usize,
        scale: F,
    ) => xent::softmax_xent_backward;
    /// The heads of [`attention::attention_forward`] that one thread computes.
    AttentionForwardHeads<'a, F>(
        g: &'a Gemm,
        y: &'a mut [F],
        out: attention::HeadsOut,
        p: &'a mut [F],
        qkv: &'a [F],
        s: AttnShape,
        units: std::ops::Range<usize>,
    ) => attention::forward_heads;
    /// The heads of [`attention::attention_backward`] that one thread computes.
    AttentionBackwardHeads<'a, F>(
        g: &'a Gemm,
        dqkv: &'a mut [F],
        out: attention::HeadsOut,
        dp: &'a mut [F],
        dy: &'a [F],
        p: &'a [F],
        qkv: &'a [F],
        s: AttnShape,
        units: std::ops::Range<usize>,
    ) => attention::backward_heads;
    /// [`rmsnorm::rmsnorm_forward`].
    RmsNormForward<'a, F>(
        out: &'a mut [F],
        rstd: &'a mut [F],
        x: &'a [F],
        w: &'a [F],
        c: usize,
        eps: f64,
    ) => rmsnorm::rmsnorm_forward;
    /// [`rmsnorm::rmsnorm_backward`].
    RmsNormBackward<'a, F>(
        dx: &'a mut [F],
        dw: &'a mut [F],
        dout: &'a [F],
        x: &'a [F],
        w: &'a [F],
        rstd: &'a [F],
        c: usize,
    ) => rmsnorm::rmsnorm_backward;
    /// [`rmsnorm::rmsnorm_backward_dx`].
    RmsNormBackwardDx<'a, F>(
        dx: &'a mut [F],
        dout: &'a [F],
        x: &'a [F],
        w: &'a [F],
        rstd: &'a [F],
        c: usize,
    ) => rmsnorm::rmsnorm_backward_dx;
    /// [`rmsnorm::rmsnorm_backward_dw`].
    RmsNormBackwardDw<'a, F>(
        dw: &'a mut [F],
        dout: &'a [F],
        x: &'a [F],
        rstd: &'a [F],
        c: usize,
        first: usize,
    ) => rmsnorm::rmsnorm_backward_dw;
    /// [`super::rope::rope_gqa_forward`].
    RopeGqaForward<'a, F>(
        qkv: &'a mut [F],
        q: &'a [F],
        k: &'a [F],
        v: &'a [F],
        s: RopeShape,
    ) => super::rope::rope_gqa_forward;
    /// [`super::rope::rope_gqa_backward`].
    RopeGqaBackward<'a, F>(
        dq: &'a mut [F],
        dk: &'a mut [F],
        dv: &'a mut [F],
        dqkv: &'a [F],
        s: RopeShape,
    ) => super::rope::rope_gqa_backward;
    /// [`swiglu::swiglu_forward`].
    SwigluForward<'a, F>(out: &'a mut [F], a: &'a [F], b: &'a [F]) => swiglu::swiglu_forward;
    /// [`swiglu::swiglu_backward`].
    SwigluBackward<'a, F>(
        da: &'a mut [F],
        db: &'a mut [F],
        dout: &'a [F],
        a: &'a [F],
        b: &'a [F],
    ) => swiglu::swiglu_backward;
    /// [`rows::add_rows`].
    AddRows<'a, F>(out: &'a mut [F], row: &'a [F]) => rows::add_rows;
    /// [`rows::bias_backward`].
    BiasBackward<'a, F>(db: &'a mut [F], dout: &'a [F]) => rows::bias_backward;
    /// [`rows::bias_backward_channels`].
    BiasBackwardChannels<'a, F>(
        db: &'a mut [F],
        dout: &'a [F],
        width: usize,
        first: usize,
    ) => rows::bias_backward_channels;
    /// [`rows::add_into`].
    AddInto<'a, F>(dst: &'a mut [F], src: &'a [F]) => rows::add_into;
    /// [`rows::scale_into`].
    ScaleInto<'a, F>(dst: &'a mut [F], a: F) => rows::scale_into;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cast::accumulate_rounded;
    use crate::isa::{Exec, Isa};
    use crate::simd::run_auto;
    use crate::testutil::{vals, SPECIALS};
    use half::bf16;

    /// Bit patterns to compare, every NaN as one (an arithmetic NaN's payload is
    /// unspecified, see `simd.rs`).
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter()
            .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
            .collect()
    }

    /// `n` values in about [-4, 4] with the specials (inf, NaN, subnormals, the f32
    /// range ends) and exp's clamp points every 53rd element.
    fn awkward(n: usize, seed: u64) -> Vec<f32> {
        let extra = [-87.5, 88.5, -200.0, 200.0, 30.0, -30.0];
        let mut v = vals(n, seed, 8.0, 0.0);
        for (i, x) in v.iter_mut().enumerate().filter(|(i, _)| i % 53 == 7) {
            let k = i / 53;
            *x = if k % 3 == 2 {
                extra[k % extra.len()]
            } else {
                SPECIALS[k % SPECIALS.len()]
            };
        }
        v
    }

    /// Runs `op` at every level this CPU has and checks each level's outputs are the
    /// scalar level's, bit for bit.
    fn same_at_every_level(name: &str, op: impl Fn(&Exec) -> Vec<Vec<f32>>) {
        let scalar = Exec::default().with_isa(Isa::Scalar).expect("scalar");
        let want: Vec<Vec<u32>> = op(&scalar).iter().map(|v| bits(v)).collect();
        for isa in Isa::available() {
            let exec = Exec::default().with_isa(isa).expect("available level");
            let got: Vec<Vec<u32>> = op(&exec).iter().map(|v| bits(v)).collect();
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                if let Some(i) = (0..w.len()).find(|&i| g[i] != w[i]) {
                    panic!(
                        "{name} at {isa}: output {k}[{i}] = {:#x}, scalar level {:#x}",
                        g[i], w[i]
                    );
                }
                assert_eq!(g.len(), w.len(), "{name} at {isa}: output {k} length");
            }
        }
    }

    #[test]
    fn elementwise_ops_give_the_scalar_levels_bits() {
        let n = 1037; // not a multiple of any vector width: every tail runs
        let (x, a, b) = (awkward(n, 1), awkward(n, 2), awkward(n, 3));
        same_at_every_level("gelu", |e| {
            let mut y = vec![0.0; n];
            run_auto(e, GeluForward(&mut y, &x));
            let mut d = a.clone();
            run_auto(e, GeluBackward(&mut d, &x));
            vec![y, d]
        });
        same_at_every_level("swiglu", |e| {
            let mut y = vec![0.0; n];
            run_auto(e, SwigluForward(&mut y, &a, &b));
            let (mut da, mut db) = (vec![0.0; n], vec![0.0; n]);
            run_auto(e, SwigluBackward(&mut da, &mut db, &x, &a, &b));
            vec![y, da, db]
        });
        same_at_every_level("rows", |e| {
            let mut s = x.clone();
            run_auto(e, AddInto(&mut s, &a));
            run_auto(e, ScaleInto(&mut s, -1.7));
            let width = 61;
            let rows = n / width;
            let mut r = a[..rows * width].to_vec();
            run_auto(e, AddRows(&mut r, &b[..width]));
            let mut db = b[..width].to_vec();
            run_auto(e, BiasBackward(&mut db, &x[..rows * width]));
            let mut db_part = b[5..width].to_vec();
            run_auto(
                e,
                BiasBackwardChannels(&mut db_part, &x[..rows * width], width, 5),
            );
            vec![s, r, db, db_part]
        });
        same_at_every_level("accumulate into bf16", |e| {
            let mut d: Vec<bf16> = a.iter().map(|&v| bf16::from_f32(v)).collect();
            accumulate_rounded(e, &mut d, &x).unwrap();
            vec![d.iter().map(|v| v.to_f32()).collect()]
        });
    }

    #[test]
    fn row_ops_give_the_scalar_levels_bits() {
        let (rows, c) = (23, 67);
        let n = rows * c;
        let (x, dout) = (awkward(n, 4), awkward(n, 5));
        let (w, bias) = (vals(c, 6, 2.0, 1.0), vals(c, 7, 1.0, 0.0));
        same_at_every_level("layernorm", |e| {
            let (mut y, mut mean, mut rstd) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
            run_auto(
                e,
                LayerNormForward(&mut y, &mut mean, &mut rstd, &x, &w, &bias, c),
            );
            let (mut dx, mut dw, mut db) = (dout.clone(), vec![0.5; c], vec![0.25; c]);
            let (m, r) = (&mean, &rstd);
            run_auto(
                e,
                LayerNormBackward(&mut dx, &mut dw, &mut db, &dout, &x, &w, m, r, c),
            );
            let (mut sdx, mut sdw, mut sdb) = (dout.clone(), vec![0.5; c - 3], vec![0.25; c - 3]);
            run_auto(e, LayerNormBackwardDx(&mut sdx, &dout, &x, &w, m, r, c));
            run_auto(
                e,
                LayerNormBackwardParams(&mut sdw, &mut sdb, &dout, &x, m, r, c, 3),
            );
            vec![y, mean, rstd, dx, dw, db, sdx, sdw, sdb]
        });
        same_at_every_level("rmsnorm", |e| {
            let (mut y, mut rstd) = (vec![0.0; n], vec![0.0; rows]);
            run_auto(e, RmsNormForward(&mut y, &mut rstd, &x, &w, c, 1e-5));
            let (mut dx, mut dw) = (dout.clone(), vec![0.5; c]);
            run_auto(
                e,
                RmsNormBackward(&mut dx, &mut dw, &dout, &x, &w, &rstd, c),
            );
            let (mut sdx, mut sdw) = (dout.clone(), vec![0.5; c - 3]);
            run_auto(e, RmsNormBackwardDx(&mut sdx, &dout, &x, &w, &rstd, c));
            run_auto(e, RmsNormBackwardDw(&mut sdw, &dout, &x, &rstd, c, 3));
            vec![y, rstd, dx, dw, sdx, sdw]
        });
        // Logits of a realistic spread (the loss of NaN logits is NaN at every level, as
        // the elementwise test shows for exp), with extremes past exp's clamp.
        let v = 257;
        let mut logits = vals(rows * v, 8, 24.0, 0.0);
        logits[3] = 95.0;
        logits[v + 5] = -120.0;
        let targets: Vec<u32> = (0..rows as u32).map(|r| (r * 37) % v as u32).collect();
        same_at_every_level("softmax cross-entropy", |e| {
            let (mut p, mut loss) = (logits.clone(), vec![0.0; rows]);
            run_auto(e, SoftmaxXentForward(&mut p, &mut loss, &targets, v));
            let mut d = p.clone();
            run_auto(e, SoftmaxXentBackward(&mut d, &targets, v, 0.125));
            vec![p, loss, d]
        });
    }

    #[test]
    fn attention_and_rope_give_the_scalar_levels_bits() {
        // T = 70 crosses a query band; two threads split the 6 heads (2 sequences x 3).
        let s = AttnShape {
            b: 2,
            t: 70,
            c: 12,
            h: 3,
        };
        let (bt, c) = (s.b * s.t, s.c);
        let qkv = vals(bt * 3 * c, 9, 4.0, 0.0);
        let dy = vals(bt * c, 10, 2.0, 0.0);
        for threads in [1, 2] {
            let g = Gemm::new(threads);
            same_at_every_level("attention", |e| {
                let (mut y, mut p) = (vec![0.0; bt * c], vec![0.0; s.b * s.h * s.t * s.t]);
                attention::attention_forward_at(e, &g, &mut y, &mut p, &qkv, s);
                let (mut dqkv, mut dp) = (vec![0.0; bt * 3 * c], vec![0.0; s.t * s.t]);
                attention::attention_backward_at(e, &g, &mut dqkv, &mut dp, &dy, &p, &qkv, s);
                vec![y, p, dqkv]
            });
        }
        let r = RopeShape {
            b: 2,
            t: 9,
            h: 4,
            kv_h: 2,
            hd: 6,
            theta: 10_000.0,
        };
        let (bt, c, ckv) = (r.b * r.t, r.c(), r.c_kv());
        let (q, k, v) = (
            vals(bt * c, 11, 2.0, 0.0),
            vals(bt * ckv, 12, 2.0, 0.0),
            vals(bt * ckv, 13, 2.0, 0.0),
        );
        same_at_every_level("rope", |e| {
            let mut qkv = vec![0.0; bt * 3 * c];
            run_auto(e, RopeGqaForward(&mut qkv, &q, &k, &v, r));
            let (mut dq, mut dk, mut dv) =
                (vec![0.0; bt * c], vec![0.0; bt * ckv], vec![0.0; bt * ckv]);
            run_auto(e, RopeGqaBackward(&mut dq, &mut dk, &mut dv, &qkv, r));
            vec![qkv, dq, dk, dv]
        });
    }
}
