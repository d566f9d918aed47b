//! The CUDA device (feature `cuda`): a context, the kernels of the checked-in PTX, a
//! caching allocator and cuBLASLt, loaded at run time through cudarc with dynamic loading,
//! so this compiles without CUDA, and on a machine without a driver [`CudaDevice::new`]
//! returns [`KernelError::NoCudaDriver`] instead of letting cudarc panic.
//!
//! Two APIs over the same device:
//! - the [`crate::device::Device`] implementation (`device.rs`): [`CudaBuf`] buffers from
//!   the pool, any number of streams and events, every model and optimizer op, so the
//!   engine and the models run here unchanged;
//! - the older buffer-level API ([`DeviceBuffer`], `adamw::cuda`, `cast::cuda`,
//!   `gradstats::cuda`) on the device's default stream, used by the kernel check binary.

mod blas;
mod buffer;
mod device;
pub(crate) mod nn;
pub mod peer;
mod pool;
mod profile;
mod staged;

pub use blas::MatmulPrecision;
pub use device::{CudaBuf, CudaEventRef, CudaStreamRef};
pub use pool::PoolStats;
pub use profile::OpTime;

pub(crate) use buffer::check_len as buffer_check_len;
pub use buffer::{DeviceAdamWState, DeviceBuffer, DeviceElement, DeviceFloat, DeviceHalfMut};

pub use crate::device::StagedOverlap;
use crate::error::KernelError;
use crate::ptx::{PtxSource, PTX_ISA_MIN_DRIVER, SOURCES};
pub use crate::twin::attention_products::AttentionKernels;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DriverError, LaunchConfig};
use cudarc::nvrtc::Ptx;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

/// Threads per CUDA block of the elementwise kernels.
const THREADS: u32 = 256;

/// One GPU with every zero-kernels kernel loaded. Each thread rank opens its own (they
/// share the GPU's primary context); a device is used from the thread that opened it.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: HashMap<&'static str, CudaFunction>,
    pool: Arc<pool::Pool>,
    /// cuBLASLt, loaded at the first matrix product (the kernel checks need none).
    blas: RefCell<Option<blas::Blas>>,
    precision: Cell<MatmulPrecision>,
    /// Which attention kernels run ([`AttentionKernels::ENV`] at opening).
    attention: Cell<AttentionKernels>,
    next_id: Cell<u64>,
    /// The rotary kernels' cos/sin tables by (T, hd, theta's bits), computed on the host
    /// once per shape ([`nn::llama::rope_table`]) and uploaded into a temporary per call,
    /// so that no device memory outlives the op (the memory ledger counts none).
    rope_tables: RefCell<HashMap<RopeKey, Arc<Vec<f32>>>>,
    /// Every op times itself ([`CudaDevice::profile_ops`]).
    profiling: Cell<bool>,
    /// The timed ops' events, until [`CudaDevice::take_op_profile`].
    op_marks: RefCell<Vec<profile::OpMark>>,
    /// Staging memory held for queued [`crate::device::Device::upload_from_staging`]
    /// copies, each until the event recorded after its copy has completed.
    staged_uploads: RefCell<Vec<(cudarc::driver::CudaEvent, crate::device::Retained)>>,
    /// Host-staged work left running behind compute, and whether it is
    /// ([`StagedOverlap::ENV`] at opening).
    staged: staged::StagedWork,
}

/// A rotary table's shape: (T, hd, the bits of theta).
type RopeKey = (usize, usize, u64);

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

    /// The CUDA version of the driver, as `cuDriverGetVersion` reports it (1000 * major +
    /// 10 * minor, e.g. 12040 for CUDA 12.4), or `NoCudaDriver`.
    pub fn driver_version() -> Result<i32, KernelError> {
        if !Self::driver_present() {
            return Err(KernelError::NoCudaDriver);
        }
        let mut version = 0;
        // SAFETY: writes one int; needs no context.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }.result()?;
        Ok(version)
    }

    /// Open device `ordinal` and load the kernels.
    pub fn new(ordinal: usize) -> Result<CudaDevice, KernelError> {
        let count = Self::count()?;
        if ordinal >= count {
            return Err(KernelError::NoSuchDevice { ordinal, count });
        }
        let attention = AttentionKernels::from_env()?;
        let staged = StagedOverlap::from_env()?;
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.default_stream();
        let mut kernels = HashMap::new();
        for s in SOURCES {
            let module = ctx
                .load_module(Ptx::from_src(s.ptx))
                .map_err(|e| module_load_error(s, e))?;
            for name in s.entries() {
                kernels.insert(name, module.load_function(name)?);
            }
        }
        log::debug!("CUDA device {ordinal}: {} kernels loaded", kernels.len());
        let pool = pool::Pool::new(Arc::clone(&ctx));
        Ok(CudaDevice {
            ctx,
            stream,
            kernels,
            pool,
            blas: RefCell::new(None),
            precision: Cell::new(MatmulPrecision::F32),
            attention: Cell::new(attention),
            next_id: Cell::new(1),
            rope_tables: RefCell::new(HashMap::new()),
            profiling: Cell::new(false),
            op_marks: RefCell::new(Vec::new()),
            staged_uploads: RefCell::new(Vec::new()),
            staged: staged::StagedWork::new(staged),
        })
    }

    /// How matrix products round their operands from now on ([`MatmulPrecision::Bf16`]
    /// for bf16 training: bf16 tensor cores, fp32 accumulation).
    pub fn set_matmul_precision(&self, p: MatmulPrecision) {
        self.precision.set(p);
    }

    /// The matrix products' precision.
    pub fn matmul_precision(&self) -> MatmulPrecision {
        self.precision.get()
    }

    /// Which attention kernels run from now on (the default comes from
    /// [`AttentionKernels::ENV`], else [`AttentionKernels::Rows`]); the previous choice.
    pub fn set_attention_kernels(&self, k: AttentionKernels) -> AttentionKernels {
        self.attention.replace(k)
    }

    /// The attention kernels that run.
    pub fn attention_kernels(&self) -> AttentionKernels {
        self.attention.get()
    }

    /// Whether host-staged collectives started from now on run behind compute (the
    /// default comes from [`StagedOverlap::ENV`], else [`StagedOverlap::Wait`]); the
    /// previous choice. Work already started is unaffected; after the driver refused a
    /// stream wait (logged) the device waits whatever this says. Settling is per device
    /// and synchronisation per context: with several devices on one GPU in one process,
    /// overlap only collectives that finish when they start (thread ranks), as
    /// docs/ARCHITECTURE.md explains.
    pub fn set_staged_overlap(&self, mode: StagedOverlap) -> StagedOverlap {
        self.staged.set_mode(mode)
    }

    /// Whether host-staged collectives run behind compute.
    pub fn staged_overlap(&self) -> StagedOverlap {
        self.staged.mode()
    }

    /// The caching allocator's counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// GPU memory (free, total) in bytes, as the driver reports it.
    pub fn memory_info(&self) -> Result<(usize, usize), KernelError> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// The cudarc context (for other crates: NCCL, CUDA-aware MPI).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream the buffer-level API ([`DeviceBuffer`], [`crate::adamw::cuda`], ...)
    /// queues on (the `Device` implementation takes its streams as arguments).
    pub fn default_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> Result<String, KernelError> {
        Ok(self.ctx.name()?)
    }

    /// Wait for all work queued on the default stream.
    pub fn synchronize_default(&self) -> Result<(), KernelError> {
        Ok(self.stream.synchronize()?)
    }

    pub(crate) fn kernel(&self, name: &str) -> Result<&CudaFunction, KernelError> {
        self.kernels
            .get(name)
            .ok_or_else(|| KernelError::MissingKernel(name.to_string()))
    }

    /// The cos/sin table of a rotary shape (computed at its first use).
    pub(crate) fn rope_table(&self, s: &crate::nn::RopeShape) -> Arc<Vec<f32>> {
        let key = (s.t, s.hd, s.theta.to_bits());
        Arc::clone(
            self.rope_tables
                .borrow_mut()
                .entry(key)
                .or_insert_with(|| Arc::new(nn::llama::rope_table(s))),
        )
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

/// "12.4" for the CUDA version 12040 of `cuDriverGetVersion`.
pub(crate) fn cuda_version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, version % 1000 / 10)
}

/// The error of loading module `s`: when the driver refused the PTX's ISA version, or is
/// older than the version needs, one that says which driver was found and which is needed.
fn module_load_error(s: &PtxSource, e: DriverError) -> KernelError {
    let unsupported = e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    let driver = CudaDevice::driver_version().ok();
    KernelError::Cuda(module_load_message(s, &e.to_string(), unsupported, driver))
}

/// [`module_load_error`]'s text, from the driver's error, whether it was
/// CUDA_ERROR_UNSUPPORTED_PTX_VERSION, and the driver's CUDA version when known.
fn module_load_message(
    s: &PtxSource,
    error: &str,
    unsupported_version: bool,
    driver: Option<i32>,
) -> String {
    let too_old = driver.is_some_and(|v| v < PTX_ISA_MIN_DRIVER);
    if !unsupported_version && !too_old {
        return format!("loading the kernels of {}: {error}", s.ptx_path);
    }
    let found = driver.map_or_else(
        || "a driver whose version could not be read".to_string(),
        |v| {
            format!(
                "a driver for CUDA {} (cuDriverGetVersion {v})",
                cuda_version_text(v)
            )
        },
    );
    format!(
        "loading the kernels of {}: {error}. The PTX declares ISA .version {}, which needs a driver for CUDA {} or later; found {found}. Update the NVIDIA driver (or regenerate the PTX with zero-kernels-ptx, which declares zero_kernels::ptx::PTX_ISA_VERSION)",
        s.ptx_path,
        s.isa_version().unwrap_or("(none)"),
        cuda_version_text(PTX_ISA_MIN_DRIVER)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_ptx_version_names_the_driver_found_and_the_one_needed() {
        let s = &SOURCES[0];
        let isa = s.isa_version().expect("a .version line");
        let msg = module_load_message(s, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", true, Some(12020));
        for part in [
            s.ptx_path,
            &format!(".version {isa}"),
            "CUDA 11.0 or later",
            "found a driver for CUDA 12.2 (cuDriverGetVersion 12020)",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg}");
        }
        // A driver older than the ISA needs, whatever the error code says.
        let msg = module_load_message(s, "CUDA_ERROR_INVALID_PTX", false, Some(10020));
        assert!(msg.contains("found a driver for CUDA 10.2"), "{msg}");
        // Any other failure is reported as it is, with the module.
        let msg = module_load_message(s, "CUDA_ERROR_OUT_OF_MEMORY", false, Some(12040));
        assert_eq!(
            msg,
            format!(
                "loading the kernels of {}: CUDA_ERROR_OUT_OF_MEMORY",
                s.ptx_path
            )
        );
    }

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
