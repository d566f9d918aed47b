//! Per-unit parameter or gradient buffers on a device, for driving the model outside the
//! engine (gradient checks, benchmarks, examples): one flat buffer per unit.

use zero_core::model::Compute;
use zero_kernels::device::{Buffer, Device, Scalar};
use zero_kernels::KernelError;

/// One device buffer per unit, holding `host[u]`.
pub fn upload_units<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    host: &[Vec<F>],
    name: &str,
) -> Result<Vec<D::Buf<F>>, KernelError> {
    host.iter()
        .enumerate()
        .map(|(u, h)| {
            let mut b = cx.dev.alloc::<F>(h.len(), &format!("{name} {u}"))?;
            cx.dev.upload(cx.stream, h, b.view_mut())?;
            Ok(b)
        })
        .collect()
}

/// Host copies of per-unit buffers (after the work queued on the stream).
pub fn download_units<D: Device, F: Scalar>(
    cx: Compute<'_, D>,
    bufs: &[D::Buf<F>],
) -> Result<Vec<Vec<F>>, KernelError> {
    bufs.iter()
        .map(|b| {
            let mut h = vec![F::ZERO; b.len()];
            cx.dev.download(cx.stream, b.view(), &mut h)?;
            Ok(h)
        })
        .collect()
}
