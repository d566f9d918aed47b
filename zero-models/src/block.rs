//! One pre-LayerNorm transformer block (GPT-2), forward and backward, as device ops:
//!   x2 = x + c_proj(attn(ln_1(x)));   x3 = x2 + mlp.c_proj(gelu(mlp.c_fc(ln_2(x2)))).
//! Linear layers are `y = x W^T + b` with W stored [out, in] (torch.nn.Linear). The block
//! reads its parameters from the unit's flat view on each call and keeps no view of them,
//! so at stage 3 the memory behind them may be reused between calls.
//!
//! The forward is two parts: [`block_internals`] (every activation the backward reads,
//! from the input) and the last projection into the output. A checkpointed block runs the
//! first part again in its backward, on the same input and parameters: the same ops in
//! the same order, so the same bits.

use zero_core::model::Compute;
use zero_kernels::device::{
    DView, DViewMut, Device, LayerNormGrads, LayerNormOut, LayerNormSaved, MatMul, Scalar,
};
use zero_kernels::nn::{AttnShape, MatLayout};

use crate::layout::Dims;

/// Element counts of a block unit's parameters, in the order of `GptConfig::spec`.
pub fn block_param_sizes(c: usize) -> [usize; 12] {
    [
        c,
        c,
        3 * c * c,
        3 * c,
        c * c,
        c,
        c,
        c,
        4 * c * c,
        4 * c,
        4 * c * c,
        c,
    ]
}

fn rm(rows: usize, cols: usize) -> MatLayout {
    MatLayout::rm(rows, cols, cols)
}

/// `out = x W^T + b`, or `out += x W^T + b` with `accumulate` (out already holds the
/// residual), for rows of x [rows, n_in] and W [n_out, n_in].
#[allow(clippy::too_many_arguments)]
fn linear_forward<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    mut out: DViewMut<'_, D, F>,
    x: DView<'_, D, F>,
    w: DView<'_, D, F>,
    bias: DView<'_, D, F>,
    rows: usize,
    n_in: usize,
    n_out: usize,
    accumulate: bool,
) -> zero_kernels::Result<()> {
    let (dev, s) = (cx.dev, cx.stream);
    if accumulate {
        dev.add_rows(s, out.reborrow(), bias)?;
    } else {
        dev.fill_rows(s, out.reborrow(), bias)?;
    }
    let mm = MatMul {
        alpha: F::ONE,
        beta: F::ONE,
        a: rm(rows, n_in),
        b: rm(n_out, n_in).t(),
        c: rm(rows, n_out),
    };
    dev.matmul(s, mm, x, w, out)
}

/// Linear backward: `dw += dout^T x`, `db += sum dout`, and `dx = dout W` (written).
#[allow(clippy::too_many_arguments)]
fn linear_backward<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    dx: DViewMut<'_, D, F>,
    dw: DViewMut<'_, D, F>,
    db: DViewMut<'_, D, F>,
    dout: DView<'_, D, F>,
    x: DView<'_, D, F>,
    w: DView<'_, D, F>,
    rows: usize,
    n_in: usize,
    n_out: usize,
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
    dev.bias_backward(s, db, dout.clone())?;
    let mm = MatMul {
        alpha: F::ONE,
        beta: F::ZERO,
        a: rm(rows, n_out),
        b: rm(n_out, n_in),
        c: rm(rows, n_in),
    };
    dev.matmul(s, mm, dout, w, dx)
}

/// Forward of one block: `x` is the block input [B,T,C]; `acts` receives its internal
/// activations (`Dims::block_sizes`), `out` its output [B,T,C].
pub fn block_forward<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    d: Dims,
    params: DView<'_, D, F>,
    x: DView<'_, D, F>,
    mut acts: DViewMut<'_, D, F>,
    mut out: DViewMut<'_, D, F>,
) -> zero_kernels::Result<()> {
    block_internals(cx, d, params.clone(), x, acts.reborrow())?;
    let (bt, c) = (d.bt(), d.c);
    let [.., fpw, fpb] = params.carve(block_param_sizes(c));
    let [.., res2, _, _, _, _, fcg] = acts.as_view().carve(d.block_sizes());
    // x3 = x2 + mlp.c_proj(gelu(...)).
    cx.dev.copy(cx.stream, res2, out.reborrow())?;
    linear_forward(cx, out, fcg, fpw, fpb, bt, 4 * c, c, true)
}

/// The block's internal activations from its input `x`, written into `acts`
/// (`Dims::block_sizes`): everything up to, not including, the output. The forward, and
/// the recomputation of a checkpointed block in the backward.
pub fn block_internals<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    d: Dims,
    params: DView<'_, D, F>,
    x: DView<'_, D, F>,
    acts: DViewMut<'_, D, F>,
) -> zero_kernels::Result<()> {
    let (dev, s) = (cx.dev, cx.stream);
    let (bt, c) = (d.bt(), d.c);
    let [ln1w, ln1b, attw, attb, projw, projb, ln2w, ln2b, fcw, fcb, ..] =
        params.carve(block_param_sizes(c));
    let [mut ln1, ln1_mean, ln1_rstd, mut qkv, mut atty, att, mut res2, mut ln2, ln2_mean, ln2_rstd, mut fch, fcg] =
        acts.carve(d.block_sizes());
    let shape = AttnShape {
        b: d.b,
        t: d.t,
        c,
        h: d.h,
    };
    let out = LayerNormOut {
        out: ln1.reborrow(),
        mean: ln1_mean,
        rstd: ln1_rstd,
    };
    dev.layernorm_forward(s, out, x.clone(), ln1w, ln1b, c)?;
    linear_forward(
        cx,
        qkv.reborrow(),
        ln1.as_view(),
        attw,
        attb,
        bt,
        c,
        3 * c,
        false,
    )?;
    dev.attention_forward(s, atty.reborrow(), att, qkv.as_view(), shape)?;
    dev.copy(s, x, res2.reborrow())?;
    linear_forward(
        cx,
        res2.reborrow(),
        atty.as_view(),
        projw,
        projb,
        bt,
        c,
        c,
        true,
    )?;
    let out = LayerNormOut {
        out: ln2.reborrow(),
        mean: ln2_mean,
        rstd: ln2_rstd,
    };
    dev.layernorm_forward(s, out, res2.as_view(), ln2w, ln2b, c)?;
    linear_forward(
        cx,
        fch.reborrow(),
        ln2.as_view(),
        fcw,
        fcb,
        bt,
        c,
        4 * c,
        false,
    )?;
    dev.gelu_forward(s, fcg, fch.as_view())
}

/// Backward of one block from its input `x` and internal activations `acts`
/// (`Dims::block_sizes`). On entry `scratch`'s first piece (dres) holds d(output); on
/// exit it holds d(input). Parameter gradients are added into `grads`.
pub fn block_backward<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    d: Dims,
    params: DView<'_, D, F>,
    grads: DViewMut<'_, D, F>,
    x: DView<'_, D, F>,
    acts: DView<'_, D, F>,
    scratch: DViewMut<'_, D, F>,
) -> zero_kernels::Result<()> {
    let (dev, s) = (cx.dev, cx.stream);
    let (bt, c) = (d.bt(), d.c);
    let [ln1w, _, attw, _, projw, _, ln2w, _, fcw, _, fpw, _] = params.carve(block_param_sizes(c));
    let [dln1w, dln1b, dattw, dattb, dprojw, dprojb, dln2w, dln2b, dfcw, dfcb, dfpw, dfpb] =
        grads.carve(block_param_sizes(c));
    let [ln1, ln1_mean, ln1_rstd, qkv, atty, att, res2, ln2, ln2_mean, ln2_rstd, fch, fcg] =
        acts.carve(d.block_sizes());
    let [mut dres, mut dln, mut dqkv, mut datty, mut dfch, dp] = scratch.carve(d.scratch_sizes());
    let shape = AttnShape {
        b: d.b,
        t: d.t,
        c,
        h: d.h,
    };
    // MLP: dres holds d(res3); res3 = res2 + fc_proj(gelu(fc(ln2(res2)))).
    linear_backward(
        cx,
        dfch.reborrow(),
        dfpw,
        dfpb,
        dres.as_view(),
        fcg,
        fpw,
        bt,
        4 * c,
        c,
    )?;
    dev.gelu_backward(s, dfch.reborrow(), fch)?;
    linear_backward(
        cx,
        dln.reborrow(),
        dfcw,
        dfcb,
        dfch.as_view(),
        ln2,
        fcw,
        bt,
        c,
        4 * c,
    )?;
    let grads2 = LayerNormGrads {
        dx: dres.reborrow(),
        dw: dln2w,
        db: dln2b,
    };
    let saved = LayerNormSaved {
        x: res2,
        w: ln2w,
        mean: ln2_mean,
        rstd: ln2_rstd,
    };
    dev.layernorm_backward(s, grads2, dln.as_view(), saved, c)?;
    // Attention: dres now holds d(res2); res2 = x + c_proj(attn(ln1(x))).
    linear_backward(
        cx,
        datty.reborrow(),
        dprojw,
        dprojb,
        dres.as_view(),
        atty,
        projw,
        bt,
        c,
        c,
    )?;
    dev.attention_backward(s, dqkv.reborrow(), dp, datty.as_view(), att, qkv, shape)?;
    linear_backward(
        cx,
        dln.reborrow(),
        dattw,
        dattb,
        dqkv.as_view(),
        ln1,
        attw,
        bt,
        c,
        3 * c,
    )?;
    let grads1 = LayerNormGrads {
        dx: dres,
        dw: dln1w,
        db: dln1b,
    };
    let saved = LayerNormSaved {
        x,
        w: ln1w,
        mean: ln1_mean,
        rstd: ln1_rstd,
    };
    dev.layernorm_backward(s, grads1, dln.as_view(), saved, c)
}
