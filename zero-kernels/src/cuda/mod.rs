//! The CUDA device the kernels run on (feature `cuda`): a context, its stream and the
//! kernels of the checked-in PTX, loaded at run time through cudarc with dynamic loading —
//! so this compiles without CUDA, and on a machine without a driver [`CudaDevice::new`]
//! returns [`KernelError::NoCudaDriver`] instead of letting cudarc panic.

mod buffer;

pub(crate) use buffer::check_len as buffer_check_len;
pub use buffer::{DeviceAdamWState, DeviceBuffer, DeviceElement, DeviceFloat, DeviceHalfMut};

use crate::error::KernelError;
use crate::ptx::SOURCES;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::Arc;

/// Threads per CUDA block of the elementwise kernels.
const THREADS: u32 = 256;

/// One GPU with every zero-kernels kernel loaded; all work goes to its default stream.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: HashMap<&'static str, CudaFunction>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ctx.ordinal())
            .field("kernels", &self.kernels.len())
            .finish()
    }
}

impl CudaDevice {
    /// True when the CUDA driver library can be loaded (checked before any cudarc call,
    /// which would panic without it).
    pub fn driver_present() -> bool {
        // SAFETY: only tries to dlopen the library.
        unsafe { cudarc::driver::sys::is_culib_present() }
    }

    /// Number of CUDA devices, or `NoCudaDriver`.
    pub fn count() -> Result<usize, KernelError> {
        if !Self::driver_present() {
            return Err(KernelError::NoCudaDriver);
        }
        Ok(CudaContext::device_count()?.max(0) as usize)
    }

    /// Open device `ordinal` and load the kernels.
    pub fn new(ordinal: usize) -> Result<CudaDevice, KernelError> {
        let count = Self::count()?;
        if ordinal >= count {
            return Err(KernelError::NoSuchDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.default_stream();
        let mut kernels = HashMap::new();
        for s in SOURCES {
            let module = ctx.load_module(Ptx::from_src(s.ptx))?;
            for name in s.entries() {
                kernels.insert(name, module.load_function(name)?);
            }
        }
        log::debug!("CUDA device {ordinal}: {} kernels loaded", kernels.len());
        Ok(CudaDevice {
            ctx,
            stream,
            kernels,
        })
    }

    /// The cudarc context (for other crates: NCCL, CUDA-aware MPI).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every kernel of this device is launched on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> Result<String, KernelError> {
        Ok(self.ctx.name()?)
    }

    /// Wait for all work queued on the stream.
    pub fn synchronize(&self) -> Result<(), KernelError> {
        Ok(self.stream.synchronize()?)
    }

    pub(crate) fn kernel(&self, name: &str) -> Result<&CudaFunction, KernelError> {
        self.kernels
            .get(name)
            .ok_or_else(|| KernelError::MissingKernel(name.to_string()))
    }

    /// Launch shape of a grid-stride elementwise kernel over `n` elements.
    pub(crate) fn elementwise(n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(THREADS as usize).clamp(1, i32::MAX as usize) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a driver (CI, this project's build machines) opening a device
    /// is an error naming the cause, not a cudarc panic; with one, it opens and loads every
    /// kernel of the PTX.
    #[test]
    fn opening_a_device_never_panics() {
        match CudaDevice::new(0) {
            Err(KernelError::NoCudaDriver) => {
                assert!(!CudaDevice::driver_present());
                let msg = KernelError::NoCudaDriver.to_string();
                assert!(msg.starts_with("no CUDA driver"), "{msg}");
            }
            Err(KernelError::NoSuchDevice { count, .. }) => assert_eq!(count, 0),
            Err(e) => panic!("unexpected error with a driver present: {e}"),
            Ok(dev) => {
                let wanted: usize = SOURCES.iter().map(|s| s.entries().len()).sum();
                assert_eq!(dev.kernels.len(), wanted);
            }
        }
    }
}
