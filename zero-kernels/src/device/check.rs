//! The shape checks of every model op, written once for every device: each takes the
//! lengths of the op's views (and its shape arguments) and returns what the kernel needs
//! (usually the row count), or the typed error a caller sees. The CPU devices and the CUDA
//! device run the same checks, so a bad call fails the same way everywhere, before any
//! work is queued.

use super::{MatMul, Result};
use crate::error::KernelError;
use crate::nn::{checked_elems, AttnShape, MatLayout, RopeShape, Scalar};

/// `what` of `op` has `got` elements where `expected` were due.
pub(crate) fn same_len(
    op: &'static str,
    what: &'static str,
    got: usize,
    expected: usize,
) -> Result<()> {
    if got != expected {
        return Err(KernelError::LengthMismatch {
            what: op_what(op, what),
            got,
            expected,
        });
    }
    Ok(())
}

/// `"op: what"` as a `&'static str` for the error (a handful of fixed pairs, cached).
fn op_what(op: &'static str, what: &'static str) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static NAMES: OnceLock<Mutex<HashMap<(&'static str, &'static str), &'static str>>> =
        OnceLock::new();
    let names = NAMES.get_or_init(|| Mutex::new(HashMap::new()));
    match names.lock() {
        Ok(mut m) => m
            .entry((op, what))
            .or_insert_with(|| Box::leak(format!("{op}: {what}").into_boxed_str())),
        Err(_) => what,
    }
}

pub(crate) fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::BadShape { op, detail }
}

/// Rows of `width` in a view of `len` elements.
pub(crate) fn rows_of(op: &'static str, what: &str, len: usize, width: usize) -> Result<usize> {
    if width == 0 || !len.is_multiple_of(width) {
        return Err(shape_err(
            op,
            format!("{what} has {len} elements, not a whole number of rows of {width}"),
        ));
    }
    Ok(len / width)
}

/// Elements of the buffer of shape `dims` that `what` (its shape's formula, e.g.
/// `"qkv [B,T,3C]"`) of `op` must have; an error when that overflows (in release a
/// wrapped size could match a short view and send the kernel past it).
pub(crate) fn elems(op: &'static str, what: &str, dims: &[usize]) -> Result<usize> {
    checked_elems(dims).ok_or_else(|| {
        shape_err(
            op,
            format!("{what} of dims {dims:?} has more elements than usize counts"),
        )
    })
}

/// Strided view `what` of `op` fits a view of `len` elements of `F`: its span computed
/// without overflow and its strides valid `isize` offsets ([`MatLayout::check_fits`]).
pub(crate) fn view_fits<F>(op: &'static str, what: &str, l: &MatLayout, len: usize) -> Result<()> {
    l.check_fits::<F>(len)
        .map_err(|e| shape_err(op, format!("{what}'s {e}")))
}

/// Every id below `limit` (the host-side check of a lookup's indices).
pub(crate) fn ids_below(op: &'static str, what: &str, ids: &[u32], limit: usize) -> Result<()> {
    match ids.iter().position(|&i| i as usize >= limit) {
        None => Ok(()),
        Some(at) => Err(shape_err(
            op,
            format!(
                "{what}s[{at}] = {} is out of range (must be < {limit})",
                ids[at]
            ),
        )),
    }
}

pub(crate) fn matmul<F: Scalar>(mm: &MatMul<F>, a: usize, b: usize, c: usize) -> Result<()> {
    let (la, lb, lc) = (mm.a, mm.b, mm.c);
    if la.cols != lb.rows || la.rows != lc.rows || lb.cols != lc.cols {
        return Err(shape_err(
            "matmul",
            format!(
                "A {}x{} times B {}x{} into C {}x{}",
                la.rows, la.cols, lb.rows, lb.cols, lc.rows, lc.cols
            ),
        ));
    }
    for (what, l, len) in [("A", &la, a), ("B", &lb, b), ("C", &lc, c)] {
        view_fits::<F>("matmul", what, l, len)?;
    }
    Ok(())
}

/// Rows of a layer norm's forward (arguments: view lengths).
pub(crate) fn layernorm_forward(
    x: usize,
    out: usize,
    w: usize,
    b: usize,
    mean: usize,
    rstd: usize,
    width: usize,
) -> Result<usize> {
    let op = "layernorm_forward";
    let rows = rows_of(op, "x", x, width)?;
    same_len(op, "out", out, x)?;
    same_len(op, "w", w, width)?;
    same_len(op, "b", b, width)?;
    same_len(op, "mean", mean, rows)?;
    same_len(op, "rstd", rstd, rows)?;
    Ok(rows)
}

/// Rows of a layer norm's backward (arguments: view lengths).
#[allow(clippy::too_many_arguments)]
pub(crate) fn layernorm_backward(
    dout: usize,
    dx: usize,
    x: usize,
    dw: usize,
    db: usize,
    w: usize,
    mean: usize,
    rstd: usize,
    width: usize,
) -> Result<usize> {
    let op = "layernorm_backward";
    let rows = rows_of(op, "dout", dout, width)?;
    same_len(op, "dx", dx, dout)?;
    same_len(op, "x", x, dout)?;
    same_len(op, "dw", dw, width)?;
    same_len(op, "db", db, width)?;
    same_len(op, "w", w, width)?;
    same_len(op, "mean", mean, rows)?;
    same_len(op, "rstd", rstd, rows)?;
    Ok(rows)
}

/// Heads divide C and there is at least one position.
pub(crate) fn attention_shape(op: &'static str, s: &AttnShape) -> Result<()> {
    if s.h == 0 || !s.c.is_multiple_of(s.h) || s.t == 0 {
        return Err(shape_err(
            op,
            format!("{s:?}: heads must divide C and T must be > 0"),
        ));
    }
    Ok(())
}

/// Elements of qkv `[B,T,3C]`, y `[B,T,C]` and p `[B,H,T,T]`, all computed (an overflow
/// is the error, whatever the views' lengths) before any is compared.
fn attention_lens(op: &'static str, s: &AttnShape) -> Result<(usize, usize, usize)> {
    let (b, t, c, h) = (s.b, s.t, s.c, s.h);
    Ok((
        elems(op, "qkv [B,T,3C]", &[b, t, 3, c])?,
        elems(op, "y [B,T,C]", &[b, t, c])?,
        elems(op, "p [B,H,T,T]", &[b, h, t, t])?,
    ))
}

pub(crate) fn attention_forward(y: usize, p: usize, qkv: usize, s: &AttnShape) -> Result<()> {
    let op = "attention_forward";
    attention_shape(op, s)?;
    let (qkv_len, y_len, p_len) = attention_lens(op, s)?;
    same_len(op, "qkv", qkv, qkv_len)?;
    same_len(op, "y", y, y_len)?;
    same_len(op, "p", p, p_len)
}

pub(crate) fn attention_backward(
    dqkv: usize,
    scratch: usize,
    dy: usize,
    p: usize,
    qkv: usize,
    s: &AttnShape,
) -> Result<()> {
    let op = "attention_backward";
    attention_shape(op, s)?;
    let (qkv_len, dy_len, p_len) = attention_lens(op, s)?;
    same_len(op, "qkv", qkv, qkv_len)?;
    same_len(op, "dqkv", dqkv, qkv_len)?;
    same_len(op, "dy", dy, dy_len)?;
    same_len(op, "p", p, p_len)?;
    // T*T fits: T > 0 and H > 0, so it divides the B*H*T*T (nonzero dims) just checked.
    let t = s.t;
    if scratch < t * t {
        return Err(shape_err(
            op,
            format!("scratch of {scratch} elements < T*T = {}", t * t),
        ));
    }
    Ok(())
}

/// Rows of a softmax cross-entropy (forward: `losses` given; backward: `None`).
pub(crate) fn softmax_xent(
    op: &'static str,
    logits: usize,
    losses: Option<usize>,
    targets: usize,
    v: usize,
) -> Result<usize> {
    let rows = rows_of(op, "logits", logits, v)?;
    if let Some(l) = losses {
        same_len(op, "losses", l, rows)?;
    }
    same_len(op, "targets", targets, rows)?;
    Ok(rows)
}

pub(crate) fn mean(dst: usize, src: usize) -> Result<()> {
    same_len("mean", "dst", dst, 1)?;
    if src == 0 {
        return Err(shape_err("mean", "the mean of no elements".into()));
    }
    Ok(())
}

/// Rows of a row lookup: `out`/`dout` has `rows` rows of `width`, one id each; returns
/// (rows, table rows).
pub(crate) fn lookup(
    op: &'static str,
    rows_what: &'static str,
    rows_len: usize,
    ids: usize,
    table_what: &'static str,
    table_len: usize,
    width: usize,
) -> Result<(usize, usize)> {
    let rows = rows_of(op, rows_what, rows_len, width)?;
    same_len(op, "ids", ids, rows)?;
    let table_rows = rows_of(op, table_what, table_len, width)?;
    Ok((rows, table_rows))
}

/// Rows of a positional (periodic) table op.
pub(crate) fn periodic(
    op: &'static str,
    rows_what: &'static str,
    rows_len: usize,
    table_len: usize,
    period: usize,
    width: usize,
) -> Result<usize> {
    let rows = rows_of(op, rows_what, rows_len, width)?;
    let table = elems(op, "table [period, width]", &[period, width])?;
    if period == 0 || table_len != table {
        return Err(shape_err(
            op,
            format!("table of {table_len} elements is not period {period} x width {width}"),
        ));
    }
    Ok(rows)
}

/// Rows of a causal shift over whole sequences.
pub(crate) fn shift(
    op: &'static str,
    src_what: &'static str,
    src: usize,
    dst_what: &'static str,
    dst: usize,
    seq_len: usize,
    width: usize,
) -> Result<usize> {
    let rows = rows_of(op, src_what, src, width)?;
    same_len(op, dst_what, dst, src)?;
    if seq_len == 0 || !rows.is_multiple_of(seq_len) {
        return Err(shape_err(
            op,
            format!("{rows} rows are not whole sequences of {seq_len}"),
        ));
    }
    Ok(rows)
}

/// The AdamW views: state as long as the gradient, and a parameter copy (if any) 16-bit.
pub(crate) fn adamw(
    n: usize,
    master: usize,
    m: usize,
    v: usize,
    param: Option<(usize, crate::dtype::DType)>,
) -> Result<()> {
    same_len("adamw", "master", master, n)?;
    same_len("adamw", "m", m, n)?;
    same_len("adamw", "v", v, n)?;
    if let Some((len, dtype)) = param {
        same_len("adamw", "param", len, n)?;
        if dtype == crate::dtype::DType::F32 {
            return Err(KernelError::BadViews(
                "adamw: the parameter copy must be 16-bit (in fp32 training the master is the parameter)".into(),
            ));
        }
    }
    Ok(())
}

/// RMSNorm forward: `out` as `x`, `w` of `width`, `rstd` one per row. Returns the rows.
pub(crate) fn rmsnorm_forward(
    x: usize,
    out: usize,
    w: usize,
    rstd: usize,
    width: usize,
) -> Result<usize> {
    let op = "rmsnorm_forward";
    let rows = rows_of(op, "x", x, width)?;
    same_len(op, "out", out, x)?;
    same_len(op, "w", w, width)?;
    same_len(op, "rstd", rstd, rows)?;
    Ok(rows)
}

/// RMSNorm backward: `dx`, `x` as `dout`; `dw`, `w` of `width`; `rstd` one per row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm_backward(
    dout: usize,
    dx: usize,
    x: usize,
    dw: usize,
    w: usize,
    rstd: usize,
    width: usize,
) -> Result<usize> {
    let op = "rmsnorm_backward";
    let rows = rows_of(op, "dout", dout, width)?;
    same_len(op, "dx", dx, dout)?;
    same_len(op, "x", x, dout)?;
    same_len(op, "dw", dw, width)?;
    same_len(op, "w", w, width)?;
    same_len(op, "rstd", rstd, rows)?;
    Ok(rows)
}

/// Rotary/GQA: `qkv` `[B,T,3C]`, `q` `[B,T,C]`, `k`, `v` `[B,T,Ckv]`, heads that fit.
pub(crate) fn rope_gqa(
    op: &'static str,
    qkv: usize,
    q: usize,
    k: usize,
    v: usize,
    s: &RopeShape,
) -> Result<()> {
    s.check().map_err(|e| shape_err(op, e))?;
    // Sizes all computed first, as for attention (`check` refused overflows already).
    let (b, t, h, kv_h, hd) = (s.b, s.t, s.h, s.kv_h, s.hd);
    let qkv_len = elems(op, "qkv [B,T,3H hd]", &[b, t, 3, h, hd])?;
    let q_len = elems(op, "q [B,T,H hd]", &[b, t, h, hd])?;
    let kv_len = elems(op, "k, v [B,T,Hkv hd]", &[b, t, kv_h, hd])?;
    same_len(op, "qkv", qkv, qkv_len)?;
    same_len(op, "q", q, q_len)?;
    same_len(op, "k", k, kv_len)?;
    same_len(op, "v", v, kv_len)
}
