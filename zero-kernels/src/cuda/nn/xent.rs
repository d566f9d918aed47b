//! Launchers of the classifier's loss kernels (`src/nn/cuda/xent.cu`, CPU twin
//! [`crate::twin::xent`]): softmax cross-entropy forward (one block of 1024 threads per
//! row), backward (elementwise) and the loss mean (one block, f64).

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::cuda::CudaDevice;
use crate::error::KernelError;
use crate::twin::xent::{MEAN_THREADS, THREADS};

fn vocab(op: &'static str, v: usize) -> Result<u32, KernelError> {
    u32::try_from(v).map_err(|_| KernelError::BadShape {
        op,
        detail: format!("V = {v} does not fit the kernel's u32"),
    })
}

/// Queue the forward on `stream`: `rows` rows of `v` logits at `logits` become
/// probabilities in place and `losses[row]` their cross-entropy against `targets[row]`
/// (the semantics of [`crate::nn::softmax_xent_forward`]; a target >= V gives a NaN loss
/// and an untouched row). Launch: one block of 1024 threads per row (grid.x = rows).
///
/// The caller guarantees that `logits` (rows*v f32), `losses` (rows f32) and `targets`
/// (rows u32) are device buffers of those lengths, the two written ones disjoint.
pub(crate) fn softmax_xent_forward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    logits: u64,
    losses: u64,
    targets: u64,
    rows: usize,
    v: usize,
) -> Result<(), KernelError> {
    let op = "softmax_xent_forward";
    let v32 = vocab(op, v)?;
    if rows == 0 || v == 0 {
        return Ok(());
    }
    let grid = u32::try_from(rows)
        .ok()
        .filter(|&r| r <= i32::MAX as u32)
        .ok_or_else(|| KernelError::BadShape {
            op,
            detail: format!("{rows} rows need more than 2^31 blocks"),
        })?;
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = dev.kernel("softmax_xent_forward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&logits).arg(&losses).arg(&targets).arg(&v32);
    // SAFETY: (float* z, float* losses, const u32* targets, u32 V) is the kernel's
    // signature; block `row` touches row `row` of z (skipped when its target >= V),
    // losses[row] and targets[row], all within the lengths the caller guarantees.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Queue the backward on `stream`: `rows` rows of `v` probabilities at `probs` become
/// `(p - onehot(target)) * scale` in place (the semantics of
/// [`crate::nn::softmax_xent_backward`]). Launch: grid-stride elementwise over rows*v.
///
/// The caller guarantees that `probs` (rows*v f32) and `targets` (rows u32) are device
/// buffers of those lengths.
#[allow(clippy::too_many_arguments)]
pub(crate) fn softmax_xent_backward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    probs: u64,
    targets: u64,
    rows: usize,
    v: usize,
    scale: f32,
) -> Result<(), KernelError> {
    let v32 = vocab("softmax_xent_backward", v)?;
    let n = rows * v;
    if n == 0 {
        return Ok(());
    }
    let rows64 = rows as u64;
    let f = dev.kernel("softmax_xent_backward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&probs)
        .arg(&targets)
        .arg(&rows64)
        .arg(&v32)
        .arg(&scale);
    // SAFETY: (float* d, const u32* targets, u64 rows, u32 V, float scale) is the kernel's
    // signature; each element i < rows*V is read and written by one thread, which reads
    // targets[i / V].
    unsafe { l.launch(CudaDevice::elementwise(n)) }?;
    Ok(())
}

/// Queue `dst[0] = mean(src[..n])` on `stream` (the semantics of [`crate::nn::mean_into`],
/// summed in f64 in the fixed order of [`crate::twin::xent::mean_f64`]; NaN for n = 0).
/// Launch: one block of 256 threads.
///
/// The caller guarantees that `dst` (1 f32) and `src` (n f32) are device buffers.
pub(crate) fn mean(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dst: u64,
    src: u64,
    n: usize,
) -> Result<(), KernelError> {
    let n64 = n as u64;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (MEAN_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = dev.kernel("mean_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&dst).arg(&src).arg(&n64);
    // SAFETY: (float* dst, const float* src, u64 n) is the kernel's signature; it reads
    // src[..n] and writes dst[0] (thread 0 only).
    unsafe { l.launch(cfg) }?;
    Ok(())
}
