//! Launchers of the LayerNorm kernels (`src/nn/cuda/norm.cu`, CPU twin
//! [`crate::twin::norm`]): the forward one warp per row; the backward one block per
//! chunk of [`CHUNK_ROWS`] rows (dx by a warp per row, then the chunk's column partial
//! sums of dw and db into a scratch), then `column_fold_f32` adding the partials over
//! chunks into dw and db. Every sum in a fixed order, no atomics.

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use super::rows::{column_fold, grid_dim, width_u32};
use crate::cuda::CudaDevice;
use crate::error::KernelError;
use crate::nn::LN_EPS;
use crate::twin::rows::CHUNK_ROWS;

/// Warps per block (norm.cu's and llama.cu's WARPS).
const WARPS: u64 = 8;

/// Floats of scratch [`layernorm_backward`] needs: dw's and db's partial sums, one per
/// chunk of [`CHUNK_ROWS`] rows and column.
pub(crate) fn layernorm_backward_scratch_len(rows: usize, c: usize) -> usize {
    2 * rows.div_ceil(CHUNK_ROWS) * c
}

/// 1/C rounded to f32, as the CPU kernels compute it.
pub(super) fn inv(c: usize) -> f32 {
    (1.0 / c as f64) as f32
}

/// The launch of a row-norm forward: one warp per row, [`WARPS`] per block (blocks
/// stride over rows past 2^31 - 1 blocks). Shared by LayerNorm and RMSNorm.
pub(super) fn warp_per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            (rows as u64).div_ceil(WARPS).min(i32::MAX as u64) as u32,
            1,
            1,
        ),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The launch of a row-norm backward: one block of [`WARPS`] warps per chunk of
/// [`CHUNK_ROWS`] rows; also the chunk count, the rows of the partial sums the column fold
/// adds up.
pub(super) fn block_per_chunk(
    op: &'static str,
    rows: usize,
) -> Result<(u64, LaunchConfig), KernelError> {
    let chunks = rows.div_ceil(CHUNK_ROWS) as u64;
    let cfg = LaunchConfig {
        grid_dim: (grid_dim(op, chunks, i32::MAX as u64)?, 1, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    Ok((chunks, cfg))
}

/// Queue the forward on `stream` ([`crate::nn::layernorm_forward`]): `out` `[rows, c]`,
/// `mean` and `rstd` `[rows]` from `x` `[rows, c]`, `w`, `b` `[c]`. Launch: one warp per
/// row, 8 per block (blocks stride over rows past 2^31 - 1 blocks).
///
/// The caller guarantees that the addresses are f32 device buffers of those lengths, the
/// written ones overlapping nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layernorm_forward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    out: u64,
    mean: u64,
    rstd: u64,
    x: u64,
    w: u64,
    b: u64,
    rows: usize,
    c: usize,
) -> Result<(), KernelError> {
    let c32 = width_u32("layernorm_forward", c)?;
    if rows == 0 || c == 0 {
        return Ok(());
    }
    let (rows64, cfg) = (rows as u64, warp_per_row(rows));
    let (inv_c, eps) = (inv(c), LN_EPS as f32);
    let f = dev.kernel("layernorm_forward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&out)
        .arg(&mean)
        .arg(&rstd)
        .arg(&x)
        .arg(&w)
        .arg(&b)
        .arg(&rows64)
        .arg(&c32)
        .arg(&inv_c)
        .arg(&eps);
    // SAFETY: (float* out, mean, rstd, const float* x, w, b, u64 rows, u32 C, float inv_c,
    // float eps) is the kernel's signature; the warp of row r < rows reads x row r, w, b
    // and writes out row r, mean[r], rstd[r], within the caller's lengths.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Queue the backward on `stream` ([`crate::nn::layernorm_backward`], in the order of
/// [`crate::twin::norm::layernorm_backward`]): **adds** into `dx` `[rows, c]`, `dw` and
/// `db` `[c]`, from `dout`, `x` `[rows, c]`, `w` `[c]` and the forward's `mean`, `rstd`
/// `[rows]`. Launch: `layernorm_backward_f32`, one block of 8 warps per chunk of
/// [`CHUNK_ROWS`] rows (grid ceil(rows/32)); then `column_fold_f32`, grid
/// (ceil(c/32), 2), for dw and db.
///
/// The caller guarantees that the addresses are f32 device buffers of those lengths,
/// `scratch` at least [`layernorm_backward_scratch_len`]`(rows, c)`, and that `dx`, `dw`,
/// `db` and `scratch` overlap nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layernorm_backward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dx: u64,
    dw: u64,
    db: u64,
    scratch: u64,
    dout: u64,
    x: u64,
    w: u64,
    mean: u64,
    rstd: u64,
    rows: usize,
    c: usize,
) -> Result<(), KernelError> {
    let op = "layernorm_backward";
    let c32 = width_u32(op, c)?;
    if rows == 0 || c == 0 {
        return Ok(());
    }
    let (chunks, cfg) = block_per_chunk(op, rows)?;
    let (rows64, inv_c) = (rows as u64, inv(c));
    let f = dev.kernel("layernorm_backward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&dx)
        .arg(&scratch)
        .arg(&dout)
        .arg(&x)
        .arg(&w)
        .arg(&mean)
        .arg(&rstd)
        .arg(&rows64)
        .arg(&c32)
        .arg(&inv_c);
    // SAFETY: (float* dx, float* partial, const float* dout, x, w, mean, rstd, u64 rows,
    // u32 C, float inv_c) is the kernel's signature; block k reads and writes the rows of
    // chunk k (< rows) of dx, reads those of dout, x, mean, rstd and w, and writes
    // partial rows k and chunks + k (< 2*chunks*C = the scratch length).
    unsafe { l.launch(cfg) }?;
    column_fold(dev, stream, op, [dw, db], 2, scratch, chunks, c32)
}

#[cfg(test)]
mod tests {
    use super::super::rows::gpu::{device, down, same_bits, up, vals};
    use super::*;
    use crate::cuda::DeviceBuffer;
    use crate::twin::norm as twin;

    #[test]
    fn gpu_layernorm_equals_its_twin() {
        let Some(dev) = device() else { return };
        let s = dev.default_stream().clone();
        for (k, &(rows, c)) in [(1, 1), (3, 7), (33, 31), (70, 100), (1000, 768), (4099, 45)]
            .iter()
            .enumerate()
        {
            let seed = k as u64 * 10;
            let x: Vec<f32> = vals(rows * c, seed).iter().map(|v| v * 3.0 + 0.5).collect();
            let (w, b) = (vals(c, seed + 1), vals(c, seed + 2));
            let (xb, wb, bb) = (up(&dev, &x), up(&dev, &w), up(&dev, &b));
            let out = DeviceBuffer::<f32>::zeros(&dev, rows * c).expect("alloc");
            let mean = DeviceBuffer::<f32>::zeros(&dev, rows).expect("alloc");
            let rstd = DeviceBuffer::<f32>::zeros(&dev, rows).expect("alloc");
            let a = |buf: &DeviceBuffer<f32>| buf.addr(&dev, 0);
            layernorm_forward(
                &dev,
                &s,
                a(&out),
                a(&mean),
                a(&rstd),
                a(&xb),
                a(&wb),
                a(&bb),
                rows,
                c,
            )
            .expect("forward");
            let mut want = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
            twin::layernorm_forward(&mut want.0, &mut want.1, &mut want.2, &x, &w, &b, c);
            same_bits("layernorm out", &down(&dev, &out), &want.0);
            same_bits("layernorm mean", &down(&dev, &mean), &want.1);
            same_bits("layernorm rstd", &down(&dev, &rstd), &want.2);

            let dout = vals(rows * c, seed + 3);
            let (dx0, dw0, db0) = (
                vals(rows * c, seed + 4),
                vals(c, seed + 5),
                vals(c, seed + 6),
            );
            let (gb, dxb, dwb, dbb) = (
                up(&dev, &dout),
                up(&dev, &dx0),
                up(&dev, &dw0),
                up(&dev, &db0),
            );
            let scratch = DeviceBuffer::<f32>::zeros(&dev, layernorm_backward_scratch_len(rows, c))
                .expect("alloc");
            layernorm_backward(
                &dev,
                &s,
                a(&dxb),
                a(&dwb),
                a(&dbb),
                a(&scratch),
                a(&gb),
                a(&xb),
                a(&wb),
                a(&mean),
                a(&rstd),
                rows,
                c,
            )
            .expect("backward");
            let (mut dx, mut dw, mut db) = (dx0, dw0, db0);
            twin::layernorm_backward(
                &mut dx, &mut dw, &mut db, &dout, &x, &w, &want.1, &want.2, c,
            );
            same_bits("layernorm dx", &down(&dev, &dxb), &dx);
            same_bits("layernorm dw", &down(&dev, &dwb), &dw);
            same_bits("layernorm db", &down(&dev, &dbb), &db);
        }
    }
}
