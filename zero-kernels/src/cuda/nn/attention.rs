//! Launchers of the attention kernels (`src/nn/cuda/attention.cu`, CPU twin
//! [`crate::twin::attention`]): one warp per query row (forward, backward dq) or key row
//! (backward dk, dv), [`WARPS`] warps per block, every sum in a fixed order, no atomics;
//! or the plans of [`crate::twin::attention_products`] ([`run_products`]): cuBLASLt
//! batched products and two row kernels.

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::cuda::blas::Batch;
use crate::cuda::CudaDevice;
use crate::error::KernelError;
use crate::nn::AttnShape;
use crate::twin::attention::backward_group;
use crate::twin::attention_products::{matrices_end, missing, reaches, slot, Buf, Operand, Step};

/// Warps (rows) per block; must match WARPS in attention.cu.
const WARPS: u64 = 4;

fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::BadShape { op, detail }
}

/// The shape as the kernels' u32 arguments (B, T, C, H), or an error when one does not fit.
fn dims(op: &'static str, s: &AttnShape) -> Result<[u32; 4], KernelError> {
    if s.h == 0 || !s.c.is_multiple_of(s.h) {
        return Err(shape_err(op, format!("{s:?}: H must divide C")));
    }
    let fit = |x: usize| u32::try_from(x).map_err(|_| shape_err(op, format!("{s:?}: too large")));
    Ok([fit(s.b)?, fit(s.t)?, fit(s.c)?, fit(s.h)?])
}

/// One warp per row: `rows` rows in blocks of [`WARPS`] warps (grid.x < 2^31).
fn warp_rows(op: &'static str, rows: u64) -> Result<LaunchConfig, KernelError> {
    let blocks = rows.div_ceil(WARPS);
    let blocks = u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| shape_err(op, format!("{rows} rows need more than 2^31 blocks")))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Queue the forward on `stream`: `y` `[B,T,C]` and `p` `[B,H,T,T]` from `qkv` `[B,T,3C]`
/// (the semantics of [`crate::nn::attention_forward`]). Launch: one warp per query row
/// (b, h, i), B*H*T warps, 4 per block. Scale 1/sqrt(C/H), rounded to f32 on the host.
///
/// The caller guarantees (SAFETY contract of the raw addresses) that `y`, `p` and `qkv`
/// are device addresses of f32 buffers of B*T*C, B*H*T*T and B*T*3C elements, `y` and `p`
/// not overlapping each other or `qkv`.
pub(crate) fn attention_forward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    y: u64,
    p: u64,
    qkv: u64,
    shape: AttnShape,
) -> Result<(), KernelError> {
    let op = "attention_forward";
    let [b, t, c, h] = dims(op, &shape)?;
    let rows = b as u64 * h as u64 * t as u64;
    if rows == 0 {
        return Ok(());
    }
    let cfg = warp_rows(op, rows)?;
    let scale = (1.0 / ((c / h) as f64).sqrt()) as f32;
    let f = dev.kernel("attention_forward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&y)
        .arg(&p)
        .arg(&qkv)
        .arg(&b)
        .arg(&t)
        .arg(&c)
        .arg(&h)
        .arg(&scale);
    // SAFETY: (float* y, float* p, const float* qkv, u32 B, T, C, H, float scale) is the
    // kernel's signature; the buffers have the lengths the shape implies (caller's
    // contract), and every thread touches only its row's elements of them.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Queue the backward on `stream`: **writes** `dqkv` `[B,T,3C]` from `dy` `[B,T,C]`, `p`
/// and `qkv` (the semantics of [`crate::nn::attention_backward`]). The (b, h) pairs go in
/// groups of min(B*H, T), two launches per group (dq: one warp per query row; dk, dv: one
/// warp per key row, 4 warps per block); `scratch` holds a group's softmax row sums
/// (pairs x T <= T*T floats), so the Device contract's T*T scratch suffices.
///
/// The caller guarantees that the addresses are f32 device buffers of the lengths the
/// shape implies (`scratch` at least T*T), `dqkv` and `scratch` overlapping nothing else.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dqkv: u64,
    scratch: u64,
    dy: u64,
    p: u64,
    qkv: u64,
    shape: AttnShape,
) -> Result<(), KernelError> {
    let op = "attention_backward";
    let [_, t, c, h] = dims(op, &shape)?;
    let pairs = shape.b * shape.h;
    if pairs == 0 || t == 0 {
        return Ok(());
    }
    let group = backward_group(&shape);
    let scale = (1.0 / ((c / h) as f64).sqrt()) as f32;
    let dq = dev.kernel("attention_backward_dq_f32")?;
    let dkv = dev.kernel("attention_backward_dkv_f32")?;
    for pair0 in (0..pairs).step_by(group) {
        let n = group.min(pairs - pair0);
        let cfg = warp_rows(op, n as u64 * t as u64)?;
        let fit =
            |x: usize| u32::try_from(x).map_err(|_| shape_err(op, format!("{shape:?}: too large")));
        let (pair0, n) = (fit(pair0)?, fit(n)?);
        for f in [dq, dkv] {
            let mut l = stream.launch_builder(f);
            l.arg(&dqkv)
                .arg(&scratch)
                .arg(&dy)
                .arg(&p)
                .arg(&qkv)
                .arg(&pair0)
                .arg(&n)
                .arg(&t)
                .arg(&c)
                .arg(&h)
                .arg(&scale);
            // SAFETY: (float* dqkv, float* dsum, const float* dy, p, qkv, u32 pair0,
            // npairs, T, C, H, float scale) is both kernels' signature; the buffers have
            // the shape's lengths and `scratch` >= npairs*T floats (npairs <= T, scratch
            // >= T*T: caller's contract). The dq kernel writes the dq columns and the row
            // sums, the dkv kernel (queued after it) reads the sums and writes dk, dv.
            unsafe { l.launch(cfg) }?;
        }
    }
    Ok(())
}

/// The device address and length (f32 elements) of each buffer a plan may name, by
/// [`Buf`] (`None`: not part of this call).
#[derive(Default)]
pub(crate) struct PlanBufs {
    slots: [Option<(u64, usize)>; 6],
}

impl PlanBufs {
    /// `buf` is at device address `ptr`, `len` f32 long.
    pub(crate) fn with(mut self, buf: Buf, ptr: u64, len: usize) -> Self {
        self.slots[slot(buf)] = Some((ptr, len));
        self
    }

    /// The address of element `offset` of `buf`, after checking that `end` (one past the
    /// last element an op touches) lies inside it.
    fn at(
        &self,
        op: &'static str,
        buf: Buf,
        offset: usize,
        end: Option<usize>,
    ) -> Result<u64, KernelError> {
        let (ptr, len) = self.slots[slot(buf)].ok_or_else(|| missing(op, buf))?;
        reaches(op, buf, end, len)?;
        Ok(ptr + (offset * std::mem::size_of::<f32>()) as u64)
    }
}

/// Queue a plan of [`crate::twin::attention_products`] on `stream`: each product through
/// cuBLASLt (at the device's matmul precision), each row step as its kernel.
pub(crate) fn run_products(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    op: &'static str,
    steps: &[Step],
    bufs: &PlanBufs,
    t: usize,
) -> Result<(), KernelError> {
    let fit = |x: usize| {
        u32::try_from(x).map_err(|_| shape_err(op, format!("{x} does not fit the kernel's u32")))
    };
    let tt = t * t;
    for step in steps {
        match *step {
            Step::Product(pr) => {
                let ptr = |x: &Operand| bufs.at(op, x.buf, x.offset, x.end(pr.batch));
                dev.gemm(
                    stream,
                    pr.alpha as f32,
                    0.0,
                    (ptr(&pr.a)?, pr.a.layout),
                    (ptr(&pr.b)?, pr.b.layout),
                    (ptr(&pr.c)?, pr.c.layout),
                    Batch {
                        count: pr.batch,
                        strides: [pr.a.stride, pr.b.stride, pr.c.stride],
                    },
                )?;
            }
            Step::Softmax { offset, mats } => {
                if mats == 0 || t == 0 {
                    continue;
                }
                let p = bufs.at(op, Buf::P, offset, matrices_end(offset, mats, tt, t))?;
                let cfg = warp_rows(op, mats as u64 * t as u64)?;
                let (mats, t) = (fit(mats)?, fit(t)?);
                let mut l = stream.launch_builder(dev.kernel("attention_softmax_rows_f32")?);
                l.arg(&p).arg(&mats).arg(&t);
                // SAFETY: (float* p, u32 mats, u32 T) is the kernel's signature; p holds
                // mats*T*T f32 from this address (checked above); each warp touches its row.
                unsafe { l.launch(cfg) }?;
            }
            Step::SoftmaxBackward {
                mats,
                p_offset,
                p_stride,
            } => {
                if mats == 0 || t == 0 {
                    continue;
                }
                let ds = bufs.at(op, Buf::Work, 0, matrices_end(0, mats, tt, t))?;
                let p_end = matrices_end(p_offset, mats, p_stride, t);
                let p = bufs.at(op, Buf::P, p_offset, p_end)?;
                let cfg = warp_rows(op, mats as u64 * t as u64)?;
                let (mats, t, p_stride) = (fit(mats)?, fit(t)?, p_stride as u64);
                let f = dev.kernel("attention_softmax_backward_rows_f32")?;
                let mut l = stream.launch_builder(f);
                l.arg(&ds).arg(&p).arg(&mats).arg(&p_stride).arg(&t);
                // SAFETY: (float* ds, const float* p, u32 mats, u64 p_stride, u32 T) is the
                // kernel's signature; ds holds mats*T*T f32 and P's mats matrices lie
                // inside p (checked above); the workspace and p do not overlap.
                unsafe { l.launch(cfg) }?;
            }
        }
    }
    Ok(())
}
