//! Launchers of the elementwise kernels (`src/nn/cuda/elementwise.cu`, CPU twin
//! [`crate::twin::elementwise`]): GELU forward and backward, `dst += src`, `dst *= a`.
//! Launch: grid-stride, 256 threads per block, one element per thread
//! ([`CudaDevice::elementwise`]). Each element is the CPU's operations in the CPU's
//! order, so the results are [`crate::nn`]'s bits.

use std::sync::Arc;

use cudarc::driver::{CudaStream, PushKernelArg};

use crate::cuda::CudaDevice;
use crate::error::KernelError;

/// Queue `name(float* a, const float* b, u64 n)` over n elements.
fn binary(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    name: &str,
    a: u64,
    b: u64,
    n: usize,
) -> Result<(), KernelError> {
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let f = dev.kernel(name)?;
    let mut l = stream.launch_builder(f);
    l.arg(&a).arg(&b).arg(&n64);
    // SAFETY: (float* a, const float* b, u64 n) is the signature of gelu_forward_f32,
    // gelu_backward_f32 and add_f32 (the only names passed here); element i < n of `a`
    // is written from element i of `a` and `b`, within the caller's lengths.
    unsafe { l.launch(CudaDevice::elementwise(n)) }?;
    Ok(())
}

/// Queue `out = gelu(x)` over n elements ([`crate::nn::gelu_forward`]).
///
/// The caller guarantees that `out` and `x` hold n f32 each and do not overlap.
pub(crate) fn gelu_forward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    out: u64,
    x: u64,
    n: usize,
) -> Result<(), KernelError> {
    binary(dev, stream, "gelu_forward_f32", out, x, n)
}

/// Queue `d *= gelu'(x)` in place over n elements ([`crate::nn::gelu_backward_inplace`]).
///
/// The caller guarantees that `d` and `x` hold n f32 each and do not overlap.
pub(crate) fn gelu_backward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    d: u64,
    x: u64,
    n: usize,
) -> Result<(), KernelError> {
    binary(dev, stream, "gelu_backward_f32", d, x, n)
}

/// Queue `dst += src` over n elements ([`crate::nn::add_into`]).
///
/// The caller guarantees that `dst` and `src` hold n f32 each and do not overlap.
pub(crate) fn add(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dst: u64,
    src: u64,
    n: usize,
) -> Result<(), KernelError> {
    binary(dev, stream, "add_f32", dst, src, n)
}

/// Queue `dst *= a` over n elements ([`crate::nn::scale_into`]).
///
/// The caller guarantees that `dst` holds n f32.
pub(crate) fn scale(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dst: u64,
    a: f32,
    n: usize,
) -> Result<(), KernelError> {
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let f = dev.kernel("scale_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&dst).arg(&a).arg(&n64);
    // SAFETY: (float* dst, float a, u64 n) is the kernel's signature; element i < n of
    // dst is read and written by one thread.
    unsafe { l.launch(CudaDevice::elementwise(n)) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::rows::gpu::{device, down, same_bits, up, vals};
    use super::*;
    use crate::twin::elementwise as twin;

    #[test]
    fn gpu_elementwise_ops_equal_their_twins() {
        let Some(dev) = device() else { return };
        let s = dev.default_stream().clone();
        for n in [1, 31, 1000, 1 << 20] {
            let mut x = vals(n, n as u64);
            // Saturated tanh, signed zeros and specials.
            for (i, v) in [30.0, -30.0, 0.0, -0.0, f32::INFINITY, f32::NAN, 1e-40]
                .iter()
                .enumerate()
            {
                if i < n {
                    x[i] = *v;
                }
            }
            let d0 = vals(n, n as u64 + 1);
            let (xb, db) = (up(&dev, &x), up(&dev, &d0));
            let (xa, da) = (xb.addr(&dev, 0), db.addr(&dev, 0));

            let out = up(&dev, &d0);
            gelu_forward(&dev, &s, out.addr(&dev, 0), xa, n).expect("gelu_forward");
            let mut want = d0.clone();
            twin::gelu_forward(&mut want, &x);
            same_bits("gelu_forward", &down(&dev, &out), &want);

            let d = up(&dev, &d0);
            gelu_backward(&dev, &s, d.addr(&dev, 0), xa, n).expect("gelu_backward");
            let mut want = d0.clone();
            twin::gelu_backward_inplace(&mut want, &x);
            same_bits("gelu_backward", &down(&dev, &d), &want);

            add(&dev, &s, da, xa, n).expect("add");
            let mut want = d0.clone();
            twin::add_into(&mut want, &x);
            same_bits("add", &down(&dev, &db), &want);

            scale(&dev, &s, da, -1.7, n).expect("scale");
            twin::scale_into(&mut want, -1.7);
            same_bits("scale", &down(&dev, &db), &want);
        }
    }
}
