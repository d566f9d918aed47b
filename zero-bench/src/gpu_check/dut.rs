//! The device under test: what the checks need of a device beyond [`Device`] (is it
//! simulated, can it switch its matrix products to bf16, how much memory is free), for
//! the CUDA device, the simulated GPU of the dry run, and the host (the references).

use zero_kernels::device::{Device, HostDevice, SimDevice};

/// A device the checks run on.
pub trait CheckDevice: Device {
    /// A simulated device: its timings are not measurements of anything.
    fn simulated(&self) -> bool;
    /// Matrix products on bf16 tensor cores (fp32 accumulation) from now on, or back to
    /// fp32; false where the device has no such mode (the CPU devices).
    fn set_bf16_matmul(&self, on: bool) -> bool;
    /// Free device memory in bytes, where the device can tell.
    fn free_memory(&self) -> Option<u64> {
        None
    }
}

impl CheckDevice for SimDevice {
    fn simulated(&self) -> bool {
        true
    }
    fn set_bf16_matmul(&self, _on: bool) -> bool {
        false
    }
}

impl CheckDevice for HostDevice {
    fn simulated(&self) -> bool {
        false
    }
    fn set_bf16_matmul(&self, _on: bool) -> bool {
        false
    }
}

/// Opens one device per thread rank (a device is used from the thread that opened it);
/// the argument is the rank.
pub type Opener<D> = dyn Fn(usize) -> zero_kernels::Result<D> + Sync;

#[cfg(feature = "cuda")]
pub mod cuda {
    //! The CUDA device under test.

    use zero_kernels::cuda::{CudaDevice, MatmulPrecision};
    use zero_kernels::KernelError;

    use super::CheckDevice;

    impl CheckDevice for CudaDevice {
        fn simulated(&self) -> bool {
            false
        }
        fn set_bf16_matmul(&self, on: bool) -> bool {
            self.set_matmul_precision(if on {
                MatmulPrecision::Bf16
            } else {
                MatmulPrecision::F32
            });
            true
        }
        fn free_memory(&self) -> Option<u64> {
            self.memory_info().ok().map(|(free, _)| free as u64)
        }
    }

    /// GPU 0, or why not. `Err(Ok(reason))`: there is no GPU here (no driver, no
    /// device), which the caller reports as such; `Err(Err(e))`: a GPU that failed.
    pub fn open_first() -> Result<CudaDevice, Result<String, KernelError>> {
        match CudaDevice::new(0) {
            Ok(d) => Ok(d),
            Err(e @ (KernelError::NoCudaDriver | KernelError::NoSuchDevice { .. })) => {
                Err(Ok(e.to_string()))
            }
            Err(e) => Err(Err(e)),
        }
    }

    /// A device name for the report.
    pub fn describe(dev: &CudaDevice) -> String {
        match dev.name() {
            Ok(n) => format!("cuda:0 {n}"),
            Err(_) => "cuda:0".to_string(),
        }
    }
}
