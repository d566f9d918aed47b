//! Fused AdamW on the GPU (kernel in `adamw.cu`): same arguments and, element by element,
//! the same bits as the CPU [`super::run`] / [`super::step`].

use super::{check_segments, AdamWCoeffs, AdamWHyper, AdamWSegment};
use crate::cuda::buffer_check_len as check_len;
use crate::cuda::{CudaDevice, DeviceAdamWState, DeviceFloat, DeviceHalfMut};
use crate::error::KernelError;
use crate::ptx::adamw_entry;
use cudarc::driver::{DeviceRepr, PushKernelArg};
use std::ops::Range;

// SAFETY: #[repr(C)], nine f32, the layout of `struct Coeffs` in adamw.cu.
unsafe impl DeviceRepr for AdamWCoeffs {}

fn check(
    grad: &DeviceFloat<'_>,
    state: &DeviceAdamWState<'_>,
    param: &Option<DeviceHalfMut<'_>>,
) -> Result<usize, KernelError> {
    let n = grad.len();
    check_len("master", state.master.len(), n)?;
    check_len("m", state.m.len(), n)?;
    check_len("v", state.v.len(), n)?;
    if let Some(p) = param {
        check_len("param", p.len(), n)?;
    }
    Ok(n)
}

/// Launch the kernel on `range` (checked by the caller to lie within every buffer).
fn launch(
    dev: &CudaDevice,
    c: &AdamWCoeffs,
    grad: &DeviceFloat<'_>,
    state: &DeviceAdamWState<'_>,
    param: &Option<DeviceHalfMut<'_>>,
    range: Range<usize>,
) -> Result<(), KernelError> {
    if range.is_empty() {
        return Ok(());
    }
    let f = dev.kernel(&adamw_entry(
        grad.dtype(),
        param.as_ref().map(|p| p.dtype()),
    ))?;
    let at = range.start;
    let g = grad.addr(dev, at);
    let (p, m, v) = (
        state.master.addr(dev, at),
        state.m.addr(dev, at),
        state.v.addr(dev, at),
    );
    // A null copy pointer selects nothing: the `_none` kernels never touch it.
    let out = param.as_ref().map_or(0, |p| p.addr(dev, at));
    let n = range.len() as u64;
    let mut b = dev.stream().launch_builder(f);
    b.arg(c).arg(&g).arg(&p).arg(&m).arg(&v).arg(&out).arg(&n);
    // SAFETY: the arguments match the kernel's signature (adamw.cu); every pointer is valid
    // for `n` elements past it (lengths checked), and the written buffers are borrowed
    // mutably by the caller.
    unsafe { b.launch(CudaDevice::elementwise(range.len())) }?;
    Ok(())
}

/// The fused update over whole buffers with one set of constants (GPU [`super::run`]).
pub fn run(
    dev: &CudaDevice,
    c: &AdamWCoeffs,
    grad: DeviceFloat<'_>,
    state: DeviceAdamWState<'_>,
    param: Option<DeviceHalfMut<'_>>,
) -> Result<(), KernelError> {
    let n = check(&grad, &state, &param)?;
    launch(dev, c, &grad, &state, &param, 0..n)
}

/// One AdamW step over a shard's segments (GPU [`super::step`]): one launch per segment.
#[allow(clippy::too_many_arguments)]
pub fn step(
    dev: &CudaDevice,
    groups: &[AdamWHyper],
    segments: &[AdamWSegment],
    t: u64,
    grad_scale: f32,
    grad: DeviceFloat<'_>,
    state: DeviceAdamWState<'_>,
    param: Option<DeviceHalfMut<'_>>,
) -> Result<(), KernelError> {
    let n = check(&grad, &state, &param)?;
    check_segments(segments, groups.len(), n)?;
    for s in segments {
        let c = AdamWCoeffs::new(&groups[s.group], t, grad_scale, s.decay)?;
        launch(dev, &c, &grad, &state, &param, s.range.clone())?;
    }
    Ok(())
}
