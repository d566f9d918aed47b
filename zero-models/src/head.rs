//! The tied LM head over one row block of `wte` (see `GptConfig::vocab_blocks`): the
//! logits of the block's vocabulary rows, and, after the last block, the cross-entropy.
//!
//! The logits `[B*T, V]` live in the arena's `probs` region, row-major; block k writes
//! columns `first .. first + rows` of every row (a strided view, leading dimension V), so
//! the blocks together fill the whole matrix and the softmax after the last block sees
//! every column. The backward runs the blocks in reverse: the last block turns the
//! probabilities into `dlogits` in place and writes `dln`, the others add into it.

use std::ops::Range;

use zero_core::model::Compute;
use zero_kernels::device::{DView, DViewMut, Device, MatMul, Scalar};
use zero_kernels::nn::MatLayout;

use crate::layout::Dims;

/// Columns `cols` of the `[B*T, V]` logits as a strided layout, and the offset its view
/// starts at.
fn columns(d: Dims, cols: &Range<usize>) -> (MatLayout, usize) {
    (MatLayout::rm(d.bt(), cols.len(), d.v), cols.start)
}

/// `logits[:, cols] = lnf W^T` for the block's rows `W` [cols.len(), C].
pub fn logits_forward<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    d: Dims,
    lnf: DView<'_, D, F>,
    w: DView<'_, D, F>,
    logits: DViewMut<'_, D, F>,
    cols: &Range<usize>,
) -> zero_kernels::Result<()> {
    let (layout, at) = columns(d, cols);
    let mm = MatMul {
        alpha: F::ONE,
        beta: F::ZERO,
        a: MatLayout::rm(d.bt(), d.c, d.c),
        b: MatLayout::rm(cols.len(), d.c, d.c).t(),
        c: layout,
    };
    let end = logits.len();
    cx.dev.matmul(
        cx.stream,
        mm,
        lnf,
        w.slice(0..cols.len() * d.c),
        logits.slice_mut(at..end),
    )
}

/// The backward of [`logits_forward`] on `dlogits` (the probabilities already turned into
/// the loss gradient): `dW += dlogits[:, cols]^T lnf`, and `dln = dlogits[:, cols] W`
/// (`overwrite`: the first block of the backward) or `dln += ...` (the others).
#[allow(clippy::too_many_arguments)]
pub fn logits_backward<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    d: Dims,
    dlogits: DView<'_, D, F>,
    lnf: DView<'_, D, F>,
    w: DView<'_, D, F>,
    dw: DViewMut<'_, D, F>,
    dln: DViewMut<'_, D, F>,
    cols: &Range<usize>,
    overwrite: bool,
) -> zero_kernels::Result<()> {
    let (dev, s) = (cx.dev, cx.stream);
    let (layout, at) = columns(d, cols);
    let dlogits = dlogits.slice(at..dlogits.len());
    let (n, c) = (cols.len(), d.c);
    let mm = MatMul {
        alpha: F::ONE,
        beta: F::ONE,
        a: layout.t(),
        b: MatLayout::rm(d.bt(), c, c),
        c: MatLayout::rm(n, c, c),
    };
    dev.matmul(s, mm, dlogits.clone(), lnf, dw.slice_mut(0..n * c))?;
    let mm = MatMul {
        alpha: F::ONE,
        beta: if overwrite { F::ZERO } else { F::ONE },
        a: layout,
        b: MatLayout::rm(n, c, c),
        c: MatLayout::rm(d.bt(), c, c),
    };
    dev.matmul(s, mm, dlogits, w.slice(0..n * c), dln)
}
