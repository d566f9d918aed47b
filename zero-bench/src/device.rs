//! The devices zero-bench runs on: `train --device` and the GPU check. What they need of
//! a device beyond [`Device`] (is it simulated, can it switch its matrix products to
//! bf16, how much memory is free) for the host, the CUDA device, and the simulated GPU
//! (a test tool: the CUDA kernels' CPU twins, with CUDA's stream rules checked).

use std::fmt;
use std::str::FromStr;

use zero_kernels::device::{Device, HostDevice, SimDevice};
use zero_kernels::twin::attention_products::AttentionKernels;

/// `--device`: where `train` computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// This CPU (`--threads` GEMM threads per rank).
    #[default]
    Host,
    /// CUDA GPU number N (a build with the `cuda` feature).
    Cuda(usize),
    /// `cuda`: the GPU of this rank's node-local rank ([`zero_comm::gpu_for_rank`]).
    CudaLocal,
    /// The simulated GPU: a test tool, slow, and its timings measure nothing.
    SimGpu,
}

impl DeviceChoice {
    /// Where the engine's buffers live, for choosing the transport.
    pub fn buffers(self) -> zero_comm::backend::Buffers {
        use zero_comm::backend::Buffers;
        match self {
            DeviceChoice::Host => Buffers::Host,
            // The simulated GPU stands for a GPU (auto stages), though its buffers are
            // host memory (so `--comm mpi` can take them as they are, for comparison).
            DeviceChoice::SimGpu => Buffers::Device {
                host_reachable: true,
            },
            DeviceChoice::Cuda(_) | DeviceChoice::CudaLocal => Buffers::Device {
                host_reachable: false,
            },
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Host => write!(f, "host"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceChoice::CudaLocal => write!(f, "cuda"),
            DeviceChoice::SimGpu => write!(f, "sim-gpu"),
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "unknown device '{s}': give host, cuda, cuda:N (GPU number N) or sim-gpu (the simulated GPU, a test tool)"
            )
        };
        match s.trim() {
            "host" | "cpu" => Ok(DeviceChoice::Host),
            "cuda" => Ok(DeviceChoice::CudaLocal),
            "sim-gpu" => Ok(DeviceChoice::SimGpu),
            other => match other.strip_prefix("cuda:") {
                Some(n) => n.parse().map(DeviceChoice::Cuda).map_err(|_| bad()),
                None => Err(bad()),
            },
        }
    }
}

/// A device zero-bench runs on.
pub trait BenchDevice: Device {
    /// A simulated device: its timings are not measurements of anything.
    fn simulated(&self) -> bool;
    /// Free device memory in bytes, where the device can tell.
    fn free_memory(&self) -> Option<u64> {
        None
    }
    /// Start or stop timing every op on the device; false where it cannot.
    fn profile_ops(&self, _on: bool) -> bool {
        false
    }
    /// The ops timed since profiling started, largest first: (op, calls, milliseconds).
    fn take_op_profile(&self) -> anyhow::Result<Vec<(String, usize, f64)>> {
        Ok(Vec::new())
    }
    /// Run these attention kernels from now on; the previous choice, or `None` where the
    /// device has one kind only (the host, a simulated device that is not a GPU).
    fn set_attention_kernels(&self, _k: AttentionKernels) -> Option<AttentionKernels> {
        None
    }
    /// Leave started host work (host-staged collectives) running behind the ops that
    /// follow (`true`), or wait for each where it starts; the previous choice.
    fn set_overlap(&self, on: bool) -> bool;
    /// The CPU threads this rank's host-side work may use (`--threads`): the kernels' on
    /// the host; 1 where the device computes elsewhere.
    fn host_threads(&self) -> usize {
        1
    }
}

impl BenchDevice for SimDevice {
    fn simulated(&self) -> bool {
        true
    }
    fn set_attention_kernels(&self, k: AttentionKernels) -> Option<AttentionKernels> {
        SimDevice::set_attention_kernels(self, k)
    }
    fn set_overlap(&self, on: bool) -> bool {
        let before = self.overlap();
        SimDevice::set_overlap(self, on);
        before
    }
}

impl BenchDevice for HostDevice {
    fn simulated(&self) -> bool {
        false
    }
    fn host_threads(&self) -> usize {
        self.threads()
    }
    fn set_overlap(&self, on: bool) -> bool {
        let before = self.overlap();
        HostDevice::set_overlap(self, on);
        before
    }
}

/// Opens one device per thread rank (a device is used from the thread that opened it);
/// the argument is the rank.
pub type Opener<D> = dyn Fn(usize) -> zero_kernels::Result<D> + Sync;

#[cfg(feature = "cuda")]
pub mod cuda {
    //! The CUDA device under test.

    use zero_kernels::cuda::{CudaDevice, StagedOverlap};
    use zero_kernels::twin::attention_products::AttentionKernels;
    use zero_kernels::KernelError;

    use super::BenchDevice;

    impl BenchDevice for CudaDevice {
        fn simulated(&self) -> bool {
            false
        }
        fn free_memory(&self) -> Option<u64> {
            self.memory_info().ok().map(|(free, _)| free as u64)
        }
        fn profile_ops(&self, on: bool) -> bool {
            CudaDevice::profile_ops(self, on);
            true
        }
        fn take_op_profile(&self) -> anyhow::Result<Vec<(String, usize, f64)>> {
            Ok(CudaDevice::take_op_profile(self)?
                .into_iter()
                .map(|t| (t.name.to_string(), t.calls, t.ms))
                .collect())
        }
        fn set_attention_kernels(&self, k: AttentionKernels) -> Option<AttentionKernels> {
            Some(CudaDevice::set_attention_kernels(self, k))
        }
        fn set_overlap(&self, on: bool) -> bool {
            let mode = if on {
                StagedOverlap::Overlap
            } else {
                StagedOverlap::Wait
            };
            self.set_staged_overlap(mode) == StagedOverlap::Overlap
        }
    }

    /// GPU `ordinal` for `train --device cuda:N`, with an error that says what to do.
    pub fn open(ordinal: usize) -> anyhow::Result<CudaDevice> {
        CudaDevice::new(ordinal).map_err(|e| {
            let hint = match e {
                KernelError::NoCudaDriver => {
                    "run on a GPU node, or train with --device host"
                }
                KernelError::NoSuchDevice { .. } => {
                    "give --device cuda:N with N below the count (CUDA_VISIBLE_DEVICES renumbers them)"
                }
                KernelError::BadEnv { .. } => "fix or unset that environment variable",
                _ => "check the driver with nvidia-smi",
            };
            anyhow::anyhow!("--device cuda:{ordinal}: {e}; {hint}")
        })
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
