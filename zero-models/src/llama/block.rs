//! One pre-RMSNorm Llama block, forward and backward, as device ops (Meta's
//! `TransformerBlock`):
//!   h   = x + wo(attn(rope(wq an), rope(wk an), wv an)),   an = attention_norm(x)
//!   out = h + w2(silu(w1 fn) * w3 fn),                      fn = ffn_norm(h)
//! Linear layers have no bias: `y = x W^T`, W stored [out, in]. q, k and v become the
//! packed `qkv` of the GPT-2 attention kernel through `rope_gqa_forward` (rotary
//! embeddings, and each key/value head repeated for the query heads that share it), so
//! grouped-query attention reuses the multi-head attention op; `rope_gqa_backward` sums
//! the repeated heads' gradients back. The block reads its parameters from the unit's flat
//! view on each call and keeps no view of them.

use zero_core::model::Compute;
use zero_kernels::device::{DView, DViewMut, Device, MatMul, RopeShape, Scalar};
use zero_kernels::nn::{AttnShape, MatLayout};

use super::layout::LlamaDims;

/// Element counts of a block unit's parameters, in the order of `LlamaConfig::spec`.
pub fn block_param_sizes(d: &LlamaDims) -> [usize; 9] {
    let (c, kv, f) = (d.c, d.kv, d.f);
    [c, c * c, kv * c, kv * c, c * c, c, f * c, c * f, f * c]
}

fn rm(rows: usize, cols: usize) -> MatLayout {
    MatLayout::rm(rows, cols, cols)
}

/// `out = x W^T` (`beta` 0) or `out += x W^T` (`beta` 1: out holds the residual), rows of
/// x [rows, n_in], W [n_out, n_in].
#[allow(clippy::too_many_arguments)]
fn linear<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    out: DViewMut<'_, D, F>,
    x: DView<'_, D, F>,
    w: DView<'_, D, F>,
    rows: usize,
    n_in: usize,
    n_out: usize,
    beta: F,
) -> zero_kernels::Result<()> {
    let mm = MatMul {
        alpha: F::ONE,
        beta,
        a: rm(rows, n_in),
        b: rm(n_out, n_in).t(),
        c: rm(rows, n_out),
    };
    cx.dev.matmul(cx.stream, mm, x, w, out)
}

/// Linear backward: `dw += dout^T x`, and `dx = dout W` (`beta` 0) or `dx += dout W`
/// (`beta` 1).
#[allow(clippy::too_many_arguments)]
fn linear_backward<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    dx: DViewMut<'_, D, F>,
    dw: DViewMut<'_, D, F>,
    dout: DView<'_, D, F>,
    x: DView<'_, D, F>,
    w: DView<'_, D, F>,
    (rows, n_in, n_out): (usize, usize, usize),
    beta: F,
) -> zero_kernels::Result<()> {
    let (dev, s) = (cx.dev, cx.stream);
    let mm = MatMul {
        alpha: F::ONE,
        beta: F::ONE,
        a: rm(rows, n_out).t(),
        b: rm(rows, n_in),
        c: rm(n_out, n_in),
    };
    dev.matmul(s, mm, dout.clone(), x, dw)?;
    let mm = MatMul {
        alpha: F::ONE,
        beta,
        a: rm(rows, n_out),
        b: rm(n_out, n_in),
        c: rm(rows, n_in),
    };
    dev.matmul(s, mm, dout, w, dx)
}

fn shapes(d: &LlamaDims) -> (AttnShape, RopeShape) {
    (
        AttnShape {
            b: d.b,
            t: d.t,
            c: d.c,
            h: d.h,
        },
        RopeShape {
            b: d.b,
            t: d.t,
            h: d.h,
            kv_h: d.kv_h,
            hd: d.c / d.h,
            theta: d.theta,
        },
    )
}

/// Forward of one block: `x` is the block input [B,T,C]; `acts` the internals
/// (`LlamaDims::internal_sizes`, the arena's block region or, for a checkpointed block,
/// the recompute region) and `out` the output `res3` [B,T,C].
pub fn block_forward<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    d: LlamaDims,
    params: DView<'_, D, F>,
    x: DView<'_, D, F>,
    mut acts: DViewMut<'_, D, F>,
    mut out: DViewMut<'_, D, F>,
) -> zero_kernels::Result<()> {
    block_internals(cx, d, params.clone(), x, acts.reborrow())?;
    let (bt, c, f) = (d.bt(), d.c, d.f);
    let [.., w2, _] = params.carve(block_param_sizes(&d));
    let [.., res2, _, _, _, _, g] = acts.as_view().carve(d.internal_sizes());
    // out = res2 + w2(g).
    cx.dev.copy(cx.stream, res2, out.reborrow())?;
    linear(cx, out, g, w2, bt, f, c, F::ONE)
}

/// The block's internal activations from its input `x`, written into `acts`: everything
/// up to, not including, the output. The forward, and the recomputation of a checkpointed
/// block in its backward: the same ops in the same order on the same input, so the same
/// bits.
pub fn block_internals<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    d: LlamaDims,
    params: DView<'_, D, F>,
    x: DView<'_, D, F>,
    acts: DViewMut<'_, D, F>,
) -> zero_kernels::Result<()> {
    let (dev, s) = (cx.dev, cx.stream);
    let (bt, c, kv, f) = (d.bt(), d.c, d.kv, d.f);
    let [anw, wq, wk, wv, wo, fnw, w1, _, w3] = params.carve(block_param_sizes(&d));
    let [mut an, an_rstd, mut q, mut k, mut v, mut qkv, mut atty, att, mut res2, mut fnn, fn_rstd, mut h1, mut h3, g] =
        acts.carve(d.internal_sizes());
    let (attn, rope) = shapes(&d);
    let zero = F::ZERO;
    dev.rmsnorm_forward(s, an.reborrow(), an_rstd, x.clone(), anw, c, d.eps)?;
    linear(cx, q.reborrow(), an.as_view(), wq, bt, c, c, zero)?;
    linear(cx, k.reborrow(), an.as_view(), wk, bt, c, kv, zero)?;
    linear(cx, v.reborrow(), an.as_view(), wv, bt, c, kv, zero)?;
    dev.rope_gqa_forward(
        s,
        qkv.reborrow(),
        q.as_view(),
        k.as_view(),
        v.as_view(),
        rope,
    )?;
    dev.attention_forward(s, atty.reborrow(), att, qkv.as_view(), attn)?;
    dev.copy(s, x, res2.reborrow())?;
    linear(cx, res2.reborrow(), atty.as_view(), wo, bt, c, c, F::ONE)?;
    dev.rmsnorm_forward(s, fnn.reborrow(), fn_rstd, res2.as_view(), fnw, c, d.eps)?;
    linear(cx, h1.reborrow(), fnn.as_view(), w1, bt, c, f, zero)?;
    linear(cx, h3.reborrow(), fnn.as_view(), w3, bt, c, f, zero)?;
    dev.swiglu_forward(s, g, h1.as_view(), h3.as_view())
}

/// Backward of one block from its internals `acts` (`LlamaDims::internal_sizes`). On
/// entry `scratch`'s first piece (dres) holds d(output); on exit it holds d(input). Parameter gradients are added into `grads`.
pub fn block_backward<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    d: LlamaDims,
    params: DView<'_, D, F>,
    grads: DViewMut<'_, D, F>,
    x: DView<'_, D, F>,
    acts: DView<'_, D, F>,
    scratch: DViewMut<'_, D, F>,
) -> zero_kernels::Result<()> {
    let (dev, s) = (cx.dev, cx.stream);
    let (bt, c, kv, f) = (d.bt(), d.c, d.kv, d.f);
    let (zero, one) = (F::ZERO, F::ONE);
    let [anw, wq, wk, wv, wo, fnw, w1, w2, w3] = params.carve(block_param_sizes(&d));
    let [danw, dwq, dwk, dwv, dwo, dfnw, dw1, dw2, dw3] = grads.carve(block_param_sizes(&d));
    let [an, an_rstd, _, _, _, qkv, atty, att, res2, fnn, fn_rstd, h1, h3, g] =
        acts.carve(d.internal_sizes());
    let [mut dres, mut dln, mut dqkv, mut datty, mut dq, mut dk, mut dv, mut dh1, mut dh3, mut dg, dp] =
        scratch.carve(d.scratch_sizes());
    let (attn, rope) = shapes(&d);
    // MLP: dres holds d(res3); res3 = res2 + w2(swiglu(w1 fn, w3 fn)), fn = ffn_norm(res2).
    linear_backward(
        cx,
        dg.reborrow(),
        dw2,
        dres.as_view(),
        g,
        w2,
        (bt, f, c),
        zero,
    )?;
    dev.swiglu_backward(s, dh1.reborrow(), dh3.reborrow(), dg.as_view(), h1, h3)?;
    linear_backward(
        cx,
        dln.reborrow(),
        dw1,
        dh1.as_view(),
        fnn.clone(),
        w1,
        (bt, c, f),
        zero,
    )?;
    linear_backward(
        cx,
        dln.reborrow(),
        dw3,
        dh3.as_view(),
        fnn,
        w3,
        (bt, c, f),
        one,
    )?;
    dev.rmsnorm_backward(
        s,
        dres.reborrow(),
        dfnw,
        dln.as_view(),
        res2,
        fnw,
        fn_rstd,
        c,
    )?;
    // Attention: dres now holds d(res2); res2 = x + wo(attn(qkv)), qkv from an = norm(x).
    linear_backward(
        cx,
        datty.reborrow(),
        dwo,
        dres.as_view(),
        atty,
        wo,
        (bt, c, c),
        zero,
    )?;
    dev.attention_backward(s, dqkv.reborrow(), dp, datty.as_view(), att, qkv, attn)?;
    dev.rope_gqa_backward(
        s,
        dq.reborrow(),
        dk.reborrow(),
        dv.reborrow(),
        dqkv.as_view(),
        rope,
    )?;
    linear_backward(
        cx,
        dln.reborrow(),
        dwq,
        dq.as_view(),
        an.clone(),
        wq,
        (bt, c, c),
        zero,
    )?;
    linear_backward(
        cx,
        dln.reborrow(),
        dwk,
        dk.as_view(),
        an.clone(),
        wk,
        (bt, c, kv),
        one,
    )?;
    linear_backward(
        cx,
        dln.reborrow(),
        dwv,
        dv.as_view(),
        an,
        wv,
        (bt, c, kv),
        one,
    )?;
    dev.rmsnorm_backward(s, dres, danw, dln.as_view(), x, anw, an_rstd, c)
}
