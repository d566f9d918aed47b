//! Fused AdamW on the GPU (kernel in `adamw.cu`): same arguments and, element by element,
//! the same bits as the CPU [`super::run`] / [`super::step`].

use super::{check_segments, AdamWCoeffs, AdamWHyper, AdamWSegment};
use crate::cuda::buffer_check_len as check_len;
use crate::cuda::{CudaDevice, DeviceAdamWState, DeviceFloat, DeviceHalfMut};
use crate::dtype::DType;
use crate::error::KernelError;
use crate::ptx::adamw_entry;
use cudarc::driver::{CudaStream, DeviceRepr, PushKernelArg};
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
    let at = range.start;
    let ptrs = AdamWPtrs {
        grad: grad.addr(dev, at),
        master: state.master.addr(dev, at),
        m: state.m.addr(dev, at),
        v: state.v.addr(dev, at),
        // A null copy pointer selects nothing: the `_none` kernels never touch it.
        param: param.as_ref().map_or(0, |p| p.addr(dev, at)),
    };
    launch_raw(
        dev,
        dev.default_stream(),
        c,
        (grad.dtype(), param.as_ref().map(|p| p.dtype())),
        ptrs,
        range.len(),
    )
}

/// Device addresses of one AdamW launch's first elements (`param` 0: no 16-bit copy).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdamWPtrs {
    pub(crate) grad: u64,
    pub(crate) master: u64,
    pub(crate) m: u64,
    pub(crate) v: u64,
    pub(crate) param: u64,
}

/// Queue the fused kernel for the (gradient, copy) types over `n` elements at `ptrs` on
/// `stream`; the caller checked that every address holds `n` elements of its type.
pub(crate) fn launch_raw(
    dev: &CudaDevice,
    stream: &CudaStream,
    c: &AdamWCoeffs,
    (grad, param): (DType, Option<DType>),
    ptrs: AdamWPtrs,
    n: usize,
) -> Result<(), KernelError> {
    if n == 0 {
        return Ok(());
    }
    let f = dev.kernel(&adamw_entry(grad, param))?;
    let n64 = n as u64;
    let AdamWPtrs {
        grad: g,
        master: p,
        m,
        v,
        param: out,
    } = ptrs;
    let mut b = stream.launch_builder(f);
    b.arg(c).arg(&g).arg(&p).arg(&m).arg(&v).arg(&out).arg(&n64);
    // SAFETY: the arguments match the kernel's signature (adamw.cu); every pointer is valid
    // for `n` elements past it (the caller's contract), and nothing else writes them.
    // Four elements per thread where aligned (adamw.cu); grid-stride covers the rest.
    unsafe { b.launch(CudaDevice::elementwise(n.div_ceil(4))) }?;
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
    // Every segment's constants first (as the CPU step): a group that fails refuses the
    // step before any launch.
    let coeffs = segments
        .iter()
        .map(|s| AdamWCoeffs::new(&groups[s.group], t, grad_scale, s.decay))
        .collect::<Result<Vec<_>, _>>()?;
    for (s, c) in segments.iter().zip(&coeffs) {
        launch(dev, c, &grad, &state, &param, s.range.clone())?;
    }
    Ok(())
}
