//! Gradient statistics on the GPU (kernels in `gradstats.cu`): one f64 per 4096-element
//! block computed on the device in the CPU's order, then added on the host in block order,
//! so the sum equals the CPU's [`super::stats`] bit for bit.

use super::reference::{BLOCK, FINISH_THREADS};
use super::GradStats;
use crate::cuda::{CudaDevice, DeviceBuffer, DeviceFloat};
use crate::dtype::DType;
use crate::error::KernelError;
use crate::ptx::gradstats_entry;
use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

/// Must match BLOCKS_PER_CTA in gradstats.cu (16 threads per block).
const BLOCKS_PER_CTA: usize = 8;

fn run(
    dev: &CudaDevice,
    name: &str,
    g: u64,
    n: usize,
    scale: f32,
) -> Result<GradStats, KernelError> {
    let blocks = n.div_ceil(BLOCK);
    if blocks == 0 {
        return Ok(GradStats {
            sum_squares: 0.0,
            nonfinite: false,
        });
    }
    let sums = DeviceBuffer::<f64>::zeros(dev, blocks)?;
    let f = dev.kernel(name)?;
    let (s, n64) = (sums.addr(dev, 0), n as u64);
    let cfg = LaunchConfig {
        grid_dim: (blocks.div_ceil(BLOCKS_PER_CTA) as u32, 1, 1),
        block_dim: ((BLOCKS_PER_CTA * 16) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = dev.default_stream().launch_builder(f);
    l.arg(&g).arg(&scale).arg(&s).arg(&n64);
    // SAFETY: (gradient pointer, f32 scale, f64 sums pointer, u64 n) is the signature of
    // every gradstats kernel; `g` holds n elements and `sums` one f64 per block.
    unsafe { l.launch(cfg) }?;
    let host = sums.to_host(dev)?;
    // Block sums in block order, from 0.0 (reference.rs).
    let total = host.iter().fold(0.0f64, |acc, &x| acc + x);
    Ok(GradStats {
        sum_squares: total,
        nonfinite: !total.is_finite(),
    })
}

/// Sum of squares and non-finite flag of `grad * scale` (GPU [`super::stats`]).
pub fn stats(
    dev: &CudaDevice,
    grad: DeviceFloat<'_>,
    scale: f32,
) -> Result<GradStats, KernelError> {
    run(
        dev,
        &gradstats_entry(grad.dtype(), false),
        grad.addr(dev, 0),
        grad.len(),
        scale,
    )
}

/// Multiply an f32 gradient by `scale` in place, with its statistics (GPU
/// [`super::unscale_in_place`]).
pub fn unscale_in_place(
    dev: &CudaDevice,
    grad: &mut DeviceBuffer<f32>,
    scale: f32,
) -> Result<GradStats, KernelError> {
    run(
        dev,
        &gradstats_entry(DType::F32, true),
        grad.addr(dev, 0),
        grad.len(),
        scale,
    )
}

/// Queue the statistics of `n` elements at `grad` (type `dtype`) times `scale` into
/// `out[0..2]` on `stream`, all on the device (Device::grad_stats): per-block sums into
/// `sums` (one f64 per 4096-element block, [`sums_len`] of them), then the fixed-tree
/// total ([`super::reference::finish_tree`]) and the non-finite flag.
#[allow(clippy::too_many_arguments)]
pub(crate) fn stats_on(
    dev: &CudaDevice,
    stream: &CudaStream,
    dtype: DType,
    grad: u64,
    n: usize,
    scale: f32,
    sums: u64,
    out: u64,
) -> Result<(), KernelError> {
    let blocks = sums_len(n);
    if blocks > 0 {
        let f = dev.kernel(&gradstats_entry(dtype, false))?;
        let n64 = n as u64;
        let cfg = LaunchConfig {
            grid_dim: (blocks.div_ceil(BLOCKS_PER_CTA) as u32, 1, 1),
            block_dim: ((BLOCKS_PER_CTA * 16) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = stream.launch_builder(f);
        l.arg(&grad).arg(&scale).arg(&sums).arg(&n64);
        // SAFETY: the gradstats signature; `grad` holds n elements, `sums` one f64 per block.
        unsafe { l.launch(cfg) }?;
    }
    let f = dev.kernel("gradstats_finish")?;
    let b64 = blocks as u64;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (FINISH_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = stream.launch_builder(f);
    l.arg(&sums).arg(&b64).arg(&out);
    // SAFETY: (f64 sums, u64 count, f64 out[2]); with no blocks the kernel reads no sum.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Block sums the device-side statistics of `n` elements need.
pub(crate) fn sums_len(n: usize) -> usize {
    n.div_ceil(BLOCK)
}
