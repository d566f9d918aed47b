//! One pre-LayerNorm transformer block (GPT-2), forward and backward:
//!   x2 = x + c_proj(attn(ln_1(x)));   x3 = x2 + mlp.c_proj(gelu(mlp.c_fc(ln_2(x2)))).
//! Linear layers are `y = x W^T + b` with W stored [out, in] (torch.nn.Linear). The block
//! reads its parameters from the unit's flat slice on each call and keeps no pointer to
//! them, so at stage 3 the slice may be freed between calls.

use crate::attention::{attention_backward, attention_forward, AttnShape};
use crate::gemm::{Gemm, Lay};
use crate::layout::{carve, carve_ref, Dims};
use crate::ops::{
    bias_backward, fill_rows, gelu_backward_inplace, gelu_forward, layernorm_backward,
    layernorm_forward,
};
use crate::real::Real;

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

/// `out = x W^T + (beta ? out : 0) + b`, for rows of x [rows, n_in] and W [n_out, n_in].
/// With `accumulate`, `out` already holds a residual and the projection is added to it.
#[allow(clippy::too_many_arguments)]
fn linear_forward<F: Real>(
    g: &Gemm,
    out: &mut [F],
    x: &[F],
    w: &[F],
    bias: &[F],
    rows: usize,
    n_in: usize,
    n_out: usize,
    accumulate: bool,
) {
    if accumulate {
        for r in out.chunks_exact_mut(n_out) {
            r.iter_mut().zip(bias).for_each(|(o, &b)| *o += b);
        }
    } else {
        fill_rows(out, bias);
    }
    g.run(
        F::ONE,
        x,
        Lay::rm(rows, n_in, n_in),
        w,
        Lay::rm(n_out, n_in, n_in).t(),
        F::ONE,
        out,
        Lay::rm(rows, n_out, n_out),
    );
}

/// Linear backward: `dw += dout^T x`, `db += sum dout`, and `dx = dout W` (written).
#[allow(clippy::too_many_arguments)]
fn linear_backward<F: Real>(
    g: &Gemm,
    dx: &mut [F],
    dw: &mut [F],
    db: &mut [F],
    dout: &[F],
    x: &[F],
    w: &[F],
    rows: usize,
    n_in: usize,
    n_out: usize,
) {
    g.run(
        F::ONE,
        dout,
        Lay::rm(rows, n_out, n_out).t(),
        x,
        Lay::rm(rows, n_in, n_in),
        F::ONE,
        dw,
        Lay::rm(n_out, n_in, n_in),
    );
    bias_backward(db, dout);
    g.run(
        F::ONE,
        dout,
        Lay::rm(rows, n_out, n_out),
        w,
        Lay::rm(n_out, n_in, n_in),
        F::ZERO,
        dx,
        Lay::rm(rows, n_in, n_in),
    );
}

/// Forward of one block: `x` is the block input [B,T,C]; `acts` its region of the arena.
pub fn block_forward<F: Real>(g: &Gemm, d: Dims, params: &[F], x: &[F], acts: &mut [F]) {
    let (bt, c) = (d.bt(), d.c);
    let [ln1w, ln1b, attw, attb, projw, projb, ln2w, ln2b, fcw, fcb, fpw, fpb] =
        carve_ref(params, block_param_sizes(c));
    let [ln1, ln1_mean, ln1_rstd, qkv, atty, att, res2, ln2, ln2_mean, ln2_rstd, fch, fcg, res3] =
        carve(acts, d.block_sizes());
    let shape = AttnShape {
        b: d.b,
        t: d.t,
        c,
        h: d.h,
    };
    layernorm_forward(ln1, ln1_mean, ln1_rstd, x, ln1w, ln1b, c);
    linear_forward(g, qkv, ln1, attw, attb, bt, c, 3 * c, false);
    attention_forward(g, atty, att, qkv, shape);
    res2.copy_from_slice(x);
    linear_forward(g, res2, atty, projw, projb, bt, c, c, true);
    layernorm_forward(ln2, ln2_mean, ln2_rstd, res2, ln2w, ln2b, c);
    linear_forward(g, fch, ln2, fcw, fcb, bt, c, 4 * c, false);
    gelu_forward(fcg, fch);
    res3.copy_from_slice(res2);
    linear_forward(g, res3, fcg, fpw, fpb, bt, 4 * c, c, true);
}

/// Backward of one block. On entry `scratch`'s first piece (dres) holds d(output); on exit
/// it holds d(input). Parameter gradients are added into `grads`.
pub fn block_backward<F: Real>(
    g: &Gemm,
    d: Dims,
    params: &[F],
    grads: &mut [F],
    x: &[F],
    acts: &[F],
    scratch: &mut [F],
) {
    let (bt, c) = (d.bt(), d.c);
    let [ln1w, _, attw, _, projw, _, ln2w, _, fcw, _, fpw, _] =
        carve_ref(params, block_param_sizes(c));
    let [dln1w, dln1b, dattw, dattb, dprojw, dprojb, dln2w, dln2b, dfcw, dfcb, dfpw, dfpb] =
        carve(grads, block_param_sizes(c));
    let [ln1, ln1_mean, ln1_rstd, qkv, atty, att, res2, ln2, ln2_mean, ln2_rstd, fch, fcg, _] =
        carve_ref(acts, d.block_sizes());
    let [dres, dln, dqkv, datty, dfch, dp] = carve(scratch, d.scratch_sizes());
    let shape = AttnShape {
        b: d.b,
        t: d.t,
        c,
        h: d.h,
    };
    // MLP: dres holds d(res3); res3 = res2 + fc_proj(gelu(fc(ln2(res2)))).
    linear_backward(g, dfch, dfpw, dfpb, dres, fcg, fpw, bt, 4 * c, c);
    gelu_backward_inplace(dfch, fch);
    linear_backward(g, dln, dfcw, dfcb, dfch, ln2, fcw, bt, c, 4 * c);
    layernorm_backward(dres, dln2w, dln2b, dln, res2, ln2w, ln2_mean, ln2_rstd, c);
    // Attention: dres now holds d(res2); res2 = x + c_proj(attn(ln1(x))).
    linear_backward(g, datty, dprojw, dprojb, dres, atty, projw, bt, c, c);
    attention_backward(g, dqkv, dp, datty, att, qkv, shape);
    linear_backward(g, dln, dattw, dattb, dqkv, ln1, attw, bt, c, 3 * c);
    layernorm_backward(dres, dln1w, dln1b, dln, x, ln1w, ln1_mean, ln1_rstd, c);
}
