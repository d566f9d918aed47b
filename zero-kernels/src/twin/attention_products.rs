//! Causal attention as strided batched matrix products and two row kernels: the
//! formulation the CUDA device runs with [`AttentionKernels::Products`]
//! (`cuda/nn/attention.rs`), where cuBLAS does the O(T^2 hs) work that the rows kernels
//! of `src/nn/cuda/attention.cu` do one warp per row. Same semantics as
//! [`crate::nn::attention_forward`] / [`crate::nn::attention_backward`]; the products
//! round differently, so a GPU run agrees with the twins to rounding, not bit for bit.
//!
//! Per (b, h) pair, with Q, K, V, dY the head's `[T, hs]` column blocks of `qkv` / `dy`
//! (leading dimension 3C or C) and P the pair's `[T, T]` matrix of `p`:
//!
//! ```text
//! forward:   P = Q K^T * scale;  softmax rows (causal, 0 above the diagonal);  Y = P V
//! backward:  W = dY V^T;  dV = P^T dY;  W = P (W - rowsum(P W)) (the softmax backward);
//!            dQ = W K * scale;  dK = W^T Q * scale
//! ```
//!
//! W is a workspace of T x T matrices. The pairs go to the products in batches along one
//! axis, heads (stride hs in `qkv`) or sequences (stride T*3C), with a loop over the
//! other: the longer axis is batched, so a GPT-2 step (B=16, H=12) takes 12 launches of
//! 16 products each. The full T x T products are computed (twice the causal FLOPs) and
//! the row kernels zero what lies above the diagonal, so P, dS and the outputs match the
//! causal definition. The backward's dV = P^T dY reads P above the diagonal too: it
//! relies on the zeros the forward wrote there (the Device contract: `p` as the forward
//! left it), where the rows kernels never read them.
//!
//! [`plan_forward`] and [`plan_backward`] list the steps; the CUDA launcher queues them
//! and the tests here run them on the CPU against the definition.

use super::attention::{softmax_backward_rows, softmax_rows};
use crate::error::KernelError;
use crate::nn::{AttnShape, Gemm, MatLayout, Scalar};

/// Which attention kernels a CUDA device runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionKernels {
    /// One warp per query or key row (`attention.cu`'s `attention_forward_f32`,
    /// `attention_backward_dq_f32`, `attention_backward_dkv_f32`): bit for bit the CPU
    /// twin's result.
    #[default]
    Rows,
    /// cuBLAS strided batched products and two row kernels (this module's plans).
    Products,
}

impl AttentionKernels {
    /// The environment variable that picks the kernels when a CUDA device opens.
    pub const ENV: &'static str = "ZERO_CUDA_ATTENTION";

    /// Parse `rows` or `products`.
    pub fn parse(s: &str) -> Option<AttentionKernels> {
        match s.trim().to_ascii_lowercase().as_str() {
            "rows" => Some(AttentionKernels::Rows),
            "products" => Some(AttentionKernels::Products),
            _ => None,
        }
    }

    /// The choice of [`AttentionKernels::ENV`]: the default when it is unset or empty,
    /// an error naming the variable when it holds anything but `rows` or `products`.
    pub fn from_env() -> Result<AttentionKernels, crate::KernelError> {
        crate::env::choice(
            Self::ENV,
            Self::parse,
            "rows (one warp per row, the CPU twin's bits), products (cuBLAS batched products)",
        )
    }

    /// What a device's description adds for this choice ("" for the default).
    pub fn description(self) -> &'static str {
        match self {
            AttentionKernels::Rows => "",
            AttentionKernels::Products => ", attention as batched products",
        }
    }

    /// The name [`AttentionKernels::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            AttentionKernels::Rows => "rows",
            AttentionKernels::Products => "products",
        }
    }
}

/// The buffers a step reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// `qkv` `[B, T, 3C]`.
    Qkv,
    /// `y` `[B, T, C]`.
    Y,
    /// `p` `[B, H, T, T]`.
    P,
    /// `dy` `[B, T, C]`.
    Dy,
    /// `dqkv` `[B, T, 3C]`.
    Dqkv,
    /// The backward's workspace: [`plan_backward`]'s `work_mats` T x T matrices.
    Work,
}

/// `batch` matrices of one layout in a buffer: the first at `offset` elements, each next
/// one `stride` elements further.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    /// The buffer.
    pub buf: Buf,
    /// Elements before the first matrix.
    pub offset: usize,
    /// One matrix.
    pub layout: MatLayout,
    /// Elements from one matrix to the next.
    pub stride: usize,
}

impl Operand {
    /// One past the last element the batch touches (0 for an empty matrix); `None` when
    /// that overflows (a plan no buffer can hold).
    pub fn end(&self, batch: usize) -> Option<usize> {
        extent(self.offset, batch, self.stride, self.layout.checked_span()?)
    }
}

/// One past the last element of `count` blocks of `span` elements, the first at `offset`
/// and each next `stride` further (0 when there is nothing); `None` when that overflows.
fn extent(offset: usize, count: usize, stride: usize, span: usize) -> Option<usize> {
    if count == 0 || span == 0 {
        return Some(0);
    }
    (count - 1)
        .checked_mul(stride)?
        .checked_add(offset)?
        .checked_add(span)
}

/// `C_k = alpha A_k B_k` for k < `batch` (C overwritten).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Product {
    /// The products' scale (the CUDA launcher rounds it to f32, as the rows kernels'
    /// scale is).
    pub alpha: f64,
    /// How many products.
    pub batch: usize,
    /// A.
    pub a: Operand,
    /// B.
    pub b: Operand,
    /// C.
    pub c: Operand,
}

/// One step of a plan, in queue order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// A batch of products.
    Product(Product),
    /// `attention_softmax_rows_f32` ([`super::attention::softmax_rows`]) on `mats`
    /// consecutive T x T matrices of P from element `offset`.
    Softmax {
        /// Elements of P before the first matrix.
        offset: usize,
        /// Matrices.
        mats: usize,
    },
    /// `attention_softmax_backward_rows_f32` ([`super::attention::softmax_backward_rows`]):
    /// the first `mats` matrices of the workspace, with P's matrices from `p_offset`,
    /// `p_stride` apart.
    SoftmaxBackward {
        /// Matrices.
        mats: usize,
        /// Elements of P before the first matrix.
        p_offset: usize,
        /// Elements from one of P's matrices to the next.
        p_stride: usize,
    },
}

/// The (b, h) pairs as an outer loop and a batched inner axis.
#[derive(Clone, Copy, Debug)]
struct Axes {
    s: AttnShape,
    /// The batched axis is the heads (else the sequences).
    heads_inner: bool,
}

impl Axes {
    fn new(s: AttnShape) -> Axes {
        Axes {
            s,
            heads_inner: s.h >= s.b,
        }
    }
    fn outer(&self) -> usize {
        if self.heads_inner {
            self.s.b
        } else {
            self.s.h
        }
    }
    fn inner(&self) -> usize {
        if self.heads_inner {
            self.s.h
        } else {
            self.s.b
        }
    }
    /// The pair of outer index `o` and inner index `i`.
    fn pair(&self, o: usize, i: usize) -> (usize, usize) {
        if self.heads_inner {
            (o, i)
        } else {
            (i, o)
        }
    }
    fn hs(&self) -> usize {
        self.s.c / self.s.h
    }
    /// Head h's `[T, hs]` block of part `part` (0 q, 1 k, 2 v) of sequence b in a
    /// `[B, T, 3C]` buffer, batched along the inner axis.
    fn qkv(&self, buf: Buf, part: usize, (b, h): (usize, usize)) -> Operand {
        let AttnShape { t, c, .. } = self.s;
        Operand {
            buf,
            offset: b * t * 3 * c + part * c + h * self.hs(),
            layout: MatLayout::rm(t, self.hs(), 3 * c),
            stride: if self.heads_inner {
                self.hs()
            } else {
                t * 3 * c
            },
        }
    }
    /// Head h's `[T, hs]` block of sequence b in a `[B, T, C]` buffer.
    fn rows(&self, buf: Buf, (b, h): (usize, usize)) -> Operand {
        let AttnShape { t, c, .. } = self.s;
        Operand {
            buf,
            offset: b * t * c + h * self.hs(),
            layout: MatLayout::rm(t, self.hs(), c),
            stride: if self.heads_inner { self.hs() } else { t * c },
        }
    }
    /// Pair (b, h)'s `[T, T]` matrix of P.
    fn p(&self, (b, h): (usize, usize)) -> Operand {
        let AttnShape { t, h: heads, .. } = self.s;
        Operand {
            buf: Buf::P,
            offset: (b * heads + h) * t * t,
            layout: MatLayout::rm(t, t, t),
            stride: if self.heads_inner {
                t * t
            } else {
                heads * t * t
            },
        }
    }
    /// The workspace's matrices from the first.
    fn work(&self) -> Operand {
        let t = self.s.t;
        Operand {
            buf: Buf::Work,
            offset: 0,
            layout: MatLayout::rm(t, t, t),
            stride: t * t,
        }
    }
}

/// 1/sqrt(hs).
fn scale(s: &AttnShape) -> f64 {
    1.0 / ((s.c / s.h) as f64).sqrt()
}

fn product(alpha: f64, batch: usize, a: Operand, b: Operand, c: Operand) -> Step {
    Step::Product(Product {
        alpha,
        batch,
        a,
        b,
        c,
    })
}

/// The forward's steps: `y` and `p` from `qkv`. Empty for an empty shape.
///
/// # Panics
/// If H is 0 or does not divide C (the device's shape check comes first).
pub fn plan_forward(s: AttnShape) -> Vec<Step> {
    assert!(
        s.h > 0 && s.c.is_multiple_of(s.h),
        "attention: H must divide C: {s:?}"
    );
    if s.b == 0 || s.t == 0 || s.c == 0 {
        return Vec::new();
    }
    let ax = Axes::new(s);
    let n = ax.inner();
    let mut steps = Vec::with_capacity(2 * ax.outer() + 1);
    for o in 0..ax.outer() {
        let first = ax.pair(o, 0);
        let k = ax.qkv(Buf::Qkv, 1, first);
        let kt = Operand {
            layout: k.layout.t(),
            ..k
        };
        steps.push(product(
            scale(&s),
            n,
            ax.qkv(Buf::Qkv, 0, first),
            kt,
            ax.p(first),
        ));
    }
    steps.push(Step::Softmax {
        offset: 0,
        mats: s.b * s.h,
    });
    for o in 0..ax.outer() {
        let first = ax.pair(o, 0);
        let v = ax.qkv(Buf::Qkv, 2, first);
        steps.push(product(1.0, n, ax.p(first), v, ax.rows(Buf::Y, first)));
    }
    steps
}

/// How many T x T workspace matrices the backward uses with `budget_bytes` of f32
/// workspace: as many pairs as one batch has, at least 1, at most what fits.
pub fn work_mats(s: AttnShape, budget_bytes: usize) -> usize {
    if s.h == 0 {
        return 1;
    }
    let per = (s.t * s.t * std::mem::size_of::<f32>()).max(1);
    (budget_bytes / per).clamp(1, Axes::new(s).inner().max(1))
}

/// The backward's steps: `dqkv` (written) from `dy`, `p`, `qkv`, with a workspace of
/// `work_mats` T x T matrices (at least 1). Empty for an empty shape.
///
/// # Panics
/// If H is 0 or does not divide C, or `work_mats` is 0.
pub fn plan_backward(s: AttnShape, work_mats: usize) -> Vec<Step> {
    assert!(
        s.h > 0 && s.c.is_multiple_of(s.h),
        "attention: H must divide C: {s:?}"
    );
    assert!(
        work_mats > 0,
        "attention: the backward needs a workspace matrix"
    );
    if s.b == 0 || s.t == 0 || s.c == 0 {
        return Vec::new();
    }
    let ax = Axes::new(s);
    let sc = scale(&s);
    let mut steps = Vec::new();
    for o in 0..ax.outer() {
        for i0 in (0..ax.inner()).step_by(work_mats) {
            let n = work_mats.min(ax.inner() - i0);
            let first = ax.pair(o, i0);
            let (q, k, v) = (
                ax.qkv(Buf::Qkv, 0, first),
                ax.qkv(Buf::Qkv, 1, first),
                ax.qkv(Buf::Qkv, 2, first),
            );
            let (dq, dk, dv) = (
                ax.qkv(Buf::Dqkv, 0, first),
                ax.qkv(Buf::Dqkv, 1, first),
                ax.qkv(Buf::Dqkv, 2, first),
            );
            let (dy, p, w) = (ax.rows(Buf::Dy, first), ax.p(first), ax.work());
            let t = |x: Operand| Operand {
                layout: x.layout.t(),
                ..x
            };
            // W = dY V^T; dV = P^T dY (P is 0 above the diagonal: only i >= j add).
            steps.push(product(1.0, n, dy, t(v), w));
            steps.push(product(1.0, n, t(p), dy, dv));
            steps.push(Step::SoftmaxBackward {
                mats: n,
                p_offset: p.offset,
                p_stride: p.stride,
            });
            // dQ = dS K * scale; dK = dS^T Q * scale (dS is 0 above the diagonal).
            steps.push(product(sc, n, w, k, dq));
            steps.push(product(sc, n, t(w), q, dk));
        }
    }
    steps
}

/// The workspace the backward may take with [`work_mats`]: f32 T x T matrices, as many as
/// fit in this many bytes, at least one (a GPT-2 step, T = 1024 with 16 sequences
/// batched, takes 64 MiB).
pub const WORK_BYTES: usize = 256 << 20;

/// A buffer of a host run: read only, or the one some step writes.
enum Slot<'a, F> {
    Read(&'a [F]),
    Write(&'a mut [F]),
}

/// The buffers of a plan's run on the host ([`run_on_host`]), by [`Buf`].
pub struct HostBufs<'a, F> {
    slots: [Option<Slot<'a, F>>; 6],
}

/// The index of `b` in a table of the six buffers.
pub(crate) fn slot(b: Buf) -> usize {
    match b {
        Buf::Qkv => 0,
        Buf::Y => 1,
        Buf::P => 2,
        Buf::Dy => 3,
        Buf::Dqkv => 4,
        Buf::Work => 5,
    }
}

impl<'a, F> Default for HostBufs<'a, F> {
    fn default() -> Self {
        HostBufs {
            slots: [None, None, None, None, None, None],
        }
    }
}

impl<'a, F> HostBufs<'a, F> {
    /// `buf` is `data`, read only.
    pub fn read(mut self, buf: Buf, data: &'a [F]) -> Self {
        self.slots[slot(buf)] = Some(Slot::Read(data));
        self
    }

    /// `buf` is `data`, which steps may write.
    pub fn write(mut self, buf: Buf, data: &'a mut [F]) -> Self {
        self.slots[slot(buf)] = Some(Slot::Write(data));
        self
    }

    fn input(&self, b: Buf) -> Result<&[F], KernelError> {
        match &self.slots[slot(b)] {
            Some(Slot::Read(d)) => Ok(d),
            Some(Slot::Write(d)) => Ok(d),
            None => Err(missing(HOST_OP, b)),
        }
    }

    /// Take the written buffer `b` out (put it back with [`HostBufs::put`]).
    fn take(&mut self, b: Buf) -> Result<&'a mut [F], KernelError> {
        match self.slots[slot(b)].take() {
            Some(Slot::Write(d)) => Ok(d),
            None => Err(missing(HOST_OP, b)),
            read => {
                self.slots[slot(b)] = read;
                Err(KernelError::BadShape {
                    op: HOST_OP,
                    detail: format!("the plan writes {b:?}, which this call only reads"),
                })
            }
        }
    }

    fn put(&mut self, b: Buf, d: &'a mut [F]) {
        self.slots[slot(b)] = Some(Slot::Write(d));
    }
}

/// The error of a plan that names a buffer the call has not (`op`: the Device op).
pub(crate) fn missing(op: &'static str, b: Buf) -> KernelError {
    KernelError::BadShape {
        op,
        detail: format!("the plan names {b:?}, which this call has not"),
    }
}

/// `end` (one past the last element a step touches; `None`: it overflowed) lies inside a
/// buffer of `len` (`op`: the Device op, for the error).
pub(crate) fn reaches(
    op: &'static str,
    b: Buf,
    end: Option<usize>,
    len: usize,
) -> Result<(), KernelError> {
    let detail = match end {
        Some(end) if end <= len => return Ok(()),
        Some(end) => format!("{b:?}: the plan reaches element {end} of {len}"),
        None => format!("{b:?}: the plan's extent overflows"),
    };
    Err(KernelError::BadShape { op, detail })
}

/// The op name the host runner's errors carry.
const HOST_OP: &str = "attention";

/// The product's shapes agree (A m x k, B k x n, C m x n).
fn shapes_agree(pr: &Product) -> Result<(), KernelError> {
    let (a, b, c) = (pr.a.layout, pr.b.layout, pr.c.layout);
    if a.cols != b.rows || a.rows != c.rows || b.cols != c.cols {
        return Err(KernelError::BadShape {
            op: HOST_OP,
            detail: format!(
                "a product of {}x{} and {}x{} into {}x{}",
                a.rows, a.cols, b.rows, b.cols, c.rows, c.cols
            ),
        });
    }
    Ok(())
}

/// `mats` T x T matrices from `offset`, `stride` apart: one past their last element
/// (`None`: it overflows).
pub(crate) fn matrices_end(offset: usize, mats: usize, stride: usize, t: usize) -> Option<usize> {
    extent(offset, mats, stride, t.checked_mul(t)?)
}

/// Run a plan on the host (the simulated GPU's attention of batched products, and the
/// tests): each product with `g` (the host GEMM standing in for cuBLAS), each row step
/// with its kernel's twin ([`super::attention::softmax_rows`],
/// [`super::attention::softmax_backward_rows`]). Every operand is checked to lie inside
/// its buffer, as the CUDA launcher does.
pub fn run_on_host<F: Scalar>(
    g: &Gemm,
    steps: &[Step],
    t: usize,
    bufs: &mut HostBufs<'_, F>,
) -> Result<(), KernelError> {
    for step in steps {
        match *step {
            Step::Product(pr) => {
                shapes_agree(&pr)?;
                let (m, n) = (pr.c.layout.rows, pr.c.layout.cols);
                if pr.batch == 0 || m == 0 || n == 0 {
                    continue; // nothing to write (as cuBLAS is never called for it)
                }
                if pr.c.buf == pr.a.buf || pr.c.buf == pr.b.buf {
                    return Err(KernelError::BadShape {
                        op: HOST_OP,
                        detail: format!("a product reads {:?}, which it writes", pr.c.buf),
                    });
                }
                let c = bufs.take(pr.c.buf)?;
                let ran: Result<(), KernelError> = (|| {
                    let (a, b) = (bufs.input(pr.a.buf)?, bufs.input(pr.b.buf)?);
                    for (x, len) in [(&pr.a, a.len()), (&pr.b, b.len()), (&pr.c, c.len())] {
                        reaches(HOST_OP, x.buf, x.end(pr.batch), len)?;
                        // The strides too (the span is inside, by `end`): the GEMM
                        // panics on what this refuses.
                        x.layout
                            .check_fits::<F>(len)
                            .map_err(|e| KernelError::BadShape {
                                op: HOST_OP,
                                detail: format!("{:?}: {e}", x.buf),
                            })?;
                    }
                    for k in 0..pr.batch {
                        g.run(
                            F::from_f64(pr.alpha),
                            &a[pr.a.offset + k * pr.a.stride..],
                            pr.a.layout,
                            &b[pr.b.offset + k * pr.b.stride..],
                            pr.b.layout,
                            F::ZERO,
                            &mut c[pr.c.offset + k * pr.c.stride..],
                            pr.c.layout,
                        );
                    }
                    Ok(())
                })();
                bufs.put(pr.c.buf, c);
                ran?;
            }
            Step::Softmax { offset, mats } => {
                let p = bufs.take(Buf::P)?;
                let ran = reaches(
                    HOST_OP,
                    Buf::P,
                    matrices_end(offset, mats, t * t, t),
                    p.len(),
                );
                if ran.is_ok() && mats > 0 {
                    softmax_rows(&mut p[offset..], mats, t);
                }
                bufs.put(Buf::P, p);
                ran?;
            }
            Step::SoftmaxBackward {
                mats,
                p_offset,
                p_stride,
            } => {
                let work = bufs.take(Buf::Work)?;
                let ran: Result<(), KernelError> = (|| {
                    let p = bufs.input(Buf::P)?;
                    reaches(
                        HOST_OP,
                        Buf::Work,
                        matrices_end(0, mats, t * t, t),
                        work.len(),
                    )?;
                    reaches(
                        HOST_OP,
                        Buf::P,
                        matrices_end(p_offset, mats, p_stride, t),
                        p.len(),
                    )?;
                    if mats > 0 {
                        softmax_backward_rows(work, &p[p_offset..], mats, p_stride, t);
                    }
                    Ok(())
                })();
                bufs.put(Buf::Work, work);
                ran?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn;
    use crate::twin::attention::tests::{vals, SHAPES};

    /// The buffers of one attention call.
    struct Bufs<F> {
        qkv: Vec<F>,
        y: Vec<F>,
        p: Vec<F>,
        dy: Vec<F>,
        dqkv: Vec<F>,
        work: Vec<F>,
    }

    fn forward<F: Scalar>(bufs: &mut Bufs<F>, s: AttnShape) {
        let mut host = HostBufs::default()
            .read(Buf::Qkv, &bufs.qkv)
            .write(Buf::Y, &mut bufs.y)
            .write(Buf::P, &mut bufs.p);
        run_on_host(&Gemm::new(1), &plan_forward(s), s.t, &mut host).unwrap();
    }

    fn backward<F: Scalar>(bufs: &mut Bufs<F>, s: AttnShape, mats: usize) {
        let mut host = HostBufs::default()
            .read(Buf::Qkv, &bufs.qkv)
            .read(Buf::P, &bufs.p)
            .read(Buf::Dy, &bufs.dy)
            .write(Buf::Dqkv, &mut bufs.dqkv)
            .write(Buf::Work, &mut bufs.work);
        run_on_host(&Gemm::new(1), &plan_backward(s, mats), s.t, &mut host).unwrap();
    }

    /// The runner refuses a plan that names a buffer the call has not, writes one it
    /// only reads, or reaches past one, with an error rather than a panic.
    #[test]
    fn host_runner_checks_the_buffers() {
        let s = AttnShape {
            b: 2,
            t: 4,
            c: 4,
            h: 2,
        };
        let (qkv, mut y, mut p) = (vec![0f32; 2 * 4 * 12], vec![0f32; 32], vec![0f32; 64]);
        let g = Gemm::new(1);
        let mut no_y = HostBufs::default()
            .read(Buf::Qkv, &qkv)
            .write(Buf::P, &mut p);
        let e = run_on_host(&g, &plan_forward(s), s.t, &mut no_y).unwrap_err();
        assert!(e.to_string().contains("names Y"), "{e}");
        let mut short = vec![0f32; 63];
        let mut short_p = HostBufs::default()
            .read(Buf::Qkv, &qkv)
            .write(Buf::Y, &mut y)
            .write(Buf::P, &mut short);
        let e = run_on_host(&g, &plan_forward(s), s.t, &mut short_p).unwrap_err();
        assert!(e.to_string().contains("reaches element 64 of 63"), "{e}");
        let mut read_only = HostBufs::default()
            .read(Buf::Qkv, &qkv)
            .write(Buf::Y, &mut y)
            .read(Buf::P, &p);
        let e = run_on_host(&g, &plan_forward(s), s.t, &mut read_only).unwrap_err();
        assert!(e.to_string().contains("only reads"), "{e}");
    }

    /// Besides the twin's odd shapes: sequences batched (B > H) past a warp, and with
    /// several heads.
    const MORE: [AttnShape; 2] = [
        AttnShape {
            b: 5,
            t: 33,
            c: 3,
            h: 3,
        },
        AttnShape {
            b: 4,
            t: 37,
            c: 8,
            h: 2,
        },
    ];

    fn max_diff(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    }

    /// In f64, the plans give what the CPU kernels give (the definition; they are tested
    /// against it in `nn::attention`), for every workspace size from 1 matrix to a whole
    /// batch and a stale workspace and outputs (every element is written).
    #[test]
    fn plans_match_the_cpu_kernels_in_f64() {
        for (n, s) in SHAPES.into_iter().chain(MORE).enumerate() {
            let AttnShape { b, t, c, h } = s;
            let qkv = vals(b * t * 3 * c, n as u64, 1.0);
            let dy = vals(b * t * c, 100 + n as u64, 1.0);
            let g = Gemm::new(1);
            let (mut y0, mut p0) = (vec![0.0; b * t * c], vec![0.0; b * h * t * t]);
            nn::attention_forward(&g, &mut y0, &mut p0, &qkv, s);
            let (mut dqkv0, mut dp0) = (vec![0.0; b * t * 3 * c], vec![0.0; t * t]);
            nn::attention_backward(&g, &mut dqkv0, &mut dp0, &dy, &p0, &qkv, s);

            let inner = if h >= b { h } else { b };
            for mats in 1..=inner {
                let mut bufs = Bufs {
                    qkv: qkv.clone(),
                    y: vec![f64::NAN; b * t * c],
                    p: vec![f64::NAN; b * h * t * t],
                    dy: dy.clone(),
                    dqkv: vec![f64::NAN; b * t * 3 * c],
                    work: vec![f64::NAN; mats * t * t],
                };
                forward(&mut bufs, s);
                assert!(max_diff(&bufs.y, &y0) < 1e-13, "{s:?}: y");
                assert!(max_diff(&bufs.p, &p0) < 1e-13, "{s:?}: p");
                backward(&mut bufs, s, mats);
                let d = max_diff(&bufs.dqkv, &dqkv0);
                assert!(
                    d < 1e-12,
                    "{s:?}, {mats} workspace matrices: dqkv off by {d}"
                );
            }
        }
    }

    /// In f32 the plans agree with the rows kernels' twin (which the GPU's rows kernels
    /// equal bit for bit) to rounding: what gpu-check's tolerance for the products allows.
    #[test]
    fn plans_agree_with_the_rows_twin_in_f32() {
        let s = AttnShape {
            b: 2,
            t: 70,
            c: 64,
            h: 4,
        };
        let AttnShape { b, t, c, h } = s;
        let f32s = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let qkv = f32s(vals(b * t * 3 * c, 7, 1.0));
        let dy = f32s(vals(b * t * c, 8, 1.0));
        let (mut y0, mut p0) = (vec![0.0f32; b * t * c], vec![0.0f32; b * h * t * t]);
        crate::twin::attention::attention_forward(&mut y0, &mut p0, &qkv, s);
        let (mut dqkv0, mut scratch) = (vec![0.0f32; b * t * 3 * c], vec![0.0f32; t * t]);
        crate::twin::attention::attention_backward(&mut dqkv0, &mut scratch, &dy, &p0, &qkv, s);
        let mut bufs = Bufs {
            qkv,
            y: vec![0.0; b * t * c],
            p: vec![0.0; b * h * t * t],
            dy,
            dqkv: vec![0.0; b * t * 3 * c],
            work: vec![0.0; 3 * t * t],
        };
        forward(&mut bufs, s);
        backward(&mut bufs, s, 3);
        let rel = |a: &[f32], w: &[f32]| {
            let num: f64 = a.iter().zip(w).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let den: f64 = w.iter().map(|y| (*y as f64).powi(2)).sum();
            (num / den.max(1e-300)).sqrt()
        };
        assert!(rel(&bufs.y, &y0) < 1e-6, "y: {}", rel(&bufs.y, &y0));
        assert!(rel(&bufs.p, &p0) < 1e-6, "p: {}", rel(&bufs.p, &p0));
        assert!(
            rel(&bufs.dqkv, &dqkv0) < 1e-5,
            "dqkv: {}",
            rel(&bufs.dqkv, &dqkv0)
        );
    }

    /// GPT-2 124M's shape batches the 16 sequences (12 launches), a single sequence the
    /// heads; the workspace size follows the budget.
    #[test]
    fn batching_axis_and_workspace() {
        let gpt2 = AttnShape {
            b: 16,
            t: 1024,
            c: 768,
            h: 12,
        };
        let products = |v: &[Step]| v.iter().filter(|s| matches!(s, Step::Product(_))).count();
        let fwd = plan_forward(gpt2);
        assert_eq!(products(&fwd), 24);
        assert!(fwd.iter().all(|s| match s {
            Step::Product(p) => p.batch == 16,
            _ => true,
        }));
        assert_eq!(work_mats(gpt2, 64 << 20), 16);
        assert_eq!(work_mats(gpt2, 4 << 20), 1);
        assert_eq!(work_mats(gpt2, 0), 1);
        assert_eq!(products(&plan_backward(gpt2, 16)), 12 * 4);
        assert_eq!(products(&plan_backward(gpt2, 5)), 12 * 4 * 4);
        let one = AttnShape { b: 1, ..gpt2 };
        assert_eq!(products(&plan_forward(one)), 2);
        let empty = AttnShape { t: 0, ..gpt2 };
        assert!(plan_forward(empty).is_empty() && plan_backward(empty, 1).is_empty());
    }

    #[test]
    fn kernels_parse() {
        assert_eq!(
            AttentionKernels::parse(" Products"),
            Some(AttentionKernels::Products)
        );
        assert_eq!(
            AttentionKernels::parse("rows"),
            Some(AttentionKernels::Rows)
        );
        assert_eq!(AttentionKernels::parse("flash"), None);
        assert_eq!(AttentionKernels::default().name(), "rows");
    }
}
