//! Casts and accumulation on the GPU (kernels in `cast.cu`): the same bits as the CPU
//! [`super::narrow`], [`super::widen`] and [`super::accumulate`].

use crate::cuda::buffer_check_len as check_len;
use crate::cuda::{CudaDevice, DeviceBuffer, DeviceFloat, DeviceHalfMut};
use crate::dtype::DType;
use crate::error::KernelError;
use crate::ptx::{accumulate_entry, cast_entry};
use cudarc::driver::{CudaStream, PushKernelArg};

/// Launch `name(a, b, n)` on the device's default stream.
fn launch2(dev: &CudaDevice, name: &str, a: u64, b: u64, n: usize) -> Result<(), KernelError> {
    launch2_on(dev, dev.default_stream(), name, a, b, n)
}

/// Queue `name(a, b, n)` on `stream`: every cast kernel takes (pointer, pointer, u64 n);
/// the caller checked both addresses hold `n` elements of the types the name says.
pub(crate) fn launch2_on(
    dev: &CudaDevice,
    stream: &CudaStream,
    name: &str,
    a: u64,
    b: u64,
    n: usize,
) -> Result<(), KernelError> {
    if n == 0 {
        return Ok(());
    }
    let f = dev.kernel(name)?;
    let n64 = n as u64;
    let mut l = stream.launch_builder(f);
    l.arg(&a).arg(&b).arg(&n64);
    // SAFETY: the signature above, and the caller's length contract.
    unsafe { l.launch(CudaDevice::elementwise(n)) }?;
    Ok(())
}

/// Round f32 values into a 16-bit buffer (round to nearest even).
pub fn narrow(
    dev: &CudaDevice,
    src: &DeviceBuffer<f32>,
    dst: DeviceHalfMut<'_>,
) -> Result<(), KernelError> {
    check_len("dst", dst.len(), src.len())?;
    launch2(
        dev,
        &cast_entry(true, dst.dtype()),
        src.addr(dev, 0),
        dst.addr(dev, 0),
        src.len(),
    )
}

/// Widen 16-bit values into f32 (exact). An f32 source is a plain device copy.
pub fn widen(
    dev: &CudaDevice,
    src: DeviceFloat<'_>,
    dst: &mut DeviceBuffer<f32>,
) -> Result<(), KernelError> {
    check_len("dst", dst.len(), src.len())?;
    match src {
        DeviceFloat::F32(s) => dst.copy_from_device(dev, s),
        _ => launch2(
            dev,
            &cast_entry(false, src.dtype()),
            src.addr(dev, 0),
            dst.addr(dev, 0),
            src.len(),
        ),
    }
}

/// `dst[i] = dst[i] + f32(src[i])`.
pub fn accumulate(
    dev: &CudaDevice,
    dst: &mut DeviceBuffer<f32>,
    src: DeviceFloat<'_>,
) -> Result<(), KernelError> {
    check_len("src", src.len(), dst.len())?;
    let kind: DType = src.dtype();
    launch2(
        dev,
        &accumulate_entry(DType::F32, kind),
        dst.addr(dev, 0),
        src.addr(dev, 0),
        src.len(),
    )
}
