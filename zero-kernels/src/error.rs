//! The one error type of zero-kernels. Every variant carries the numbers that were wrong,
//! so a message read in a Slurm log says what to fix without a debugger.

use crate::isa::Isa;

/// Errors of the kernels and of the buffers they run on.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Two slices that must cover the same elements differ in length.
    #[error("length mismatch: {what} has {got} elements, expected {expected}")]
    LengthMismatch {
        /// Which argument was wrong.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length of the first slice of the call.
        expected: usize,
    },
    /// An instruction-set level was forced that this CPU does not have.
    #[error("instruction set {requested} requested but this CPU only supports up to {available}")]
    IsaUnavailable {
        /// The forced level.
        requested: Isa,
        /// The best level the CPU has.
        available: Isa,
    },
    /// An environment variable that picks kernels holds something else.
    #[error("{var}={value:?} is not one of {expected}: give one of those, or unset it")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// What it holds.
        value: String,
        /// What it may hold.
        expected: &'static str,
    },
    /// A thread count of zero.
    #[error("thread count must be at least 1, got {0}")]
    ZeroThreads(usize),
    /// An AdamW hyper-parameter outside its domain.
    #[error("invalid AdamW hyper-parameter {name} = {value}: {why}")]
    BadHyper {
        /// The parameter's name (`lr`, `beta1`, ...).
        name: &'static str,
        /// Its value.
        value: f64,
        /// The domain it must lie in.
        why: &'static str,
    },
    /// An AdamW segment that is out of bounds, overlaps the previous one or names a
    /// group that does not exist.
    #[error("invalid AdamW segment #{index} ({start}..{end}, group {group}): {why} (numel {numel}, {groups} groups)")]
    BadSegment {
        /// Position of the segment in the list.
        index: usize,
        /// Its first element.
        start: usize,
        /// One past its last element.
        end: usize,
        /// Its group index.
        group: usize,
        /// Length of the buffers.
        numel: usize,
        /// Number of groups given.
        groups: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The AdamW step counter must start at 1 (bias correction divides by 1 - beta^t).
    #[error("AdamW step must be >= 1 (bias correction 1 - beta^t is 0 at t = 0), got {0}")]
    ZeroStep(u64),
    /// No CUDA driver library (libcuda) could be loaded: not a GPU machine, or the driver
    /// is not on the library path.
    #[error("no CUDA driver: libcuda.so could not be loaded (is this a GPU machine? is the driver's directory on LD_LIBRARY_PATH?)")]
    NoCudaDriver,
    /// A CUDA device ordinal past the devices present.
    #[error("CUDA device {ordinal} requested but only {count} device(s) present")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices the driver reports.
        count: usize,
    },
    /// A CUDA kernel the checked-in PTX should define is missing from it.
    #[error("CUDA kernel '{0}' not found in the loaded PTX")]
    MissingKernel(String),
    /// A CUDA error (launch failure, out of memory, ...).
    #[error("CUDA: {0}")]
    Cuda(String),
    /// A device op's views do not fit together (overlapping write views, a split that
    /// overlaps, a 16-bit copy of fp32 parameters).
    #[error("bad views: {0}")]
    BadViews(String),
    /// A model op's shapes do not fit its views, or an index is out of range.
    #[error("{op}: {detail}")]
    BadShape {
        /// The op.
        op: &'static str,
        /// What does not fit, with the numbers.
        detail: String,
    },
    /// A buffer too large to allocate.
    #[error("cannot allocate buffer '{name}' of {bytes} bytes")]
    Alloc {
        /// The buffer's name.
        name: String,
        /// Bytes asked for.
        bytes: u128,
    },
    /// The simulated device found two accesses to a buffer that nothing orders (a missing
    /// event wait): the message names the buffer, both ops and both streams.
    #[error("{0}")]
    Hazard(String),
    /// A device failed (or refuses work after an earlier failure).
    #[error("device: {0}")]
    Device(String),
    /// Host work started on a stream failed when it was polled or waited for (the
    /// transport's own error, as text: it surfaces at a later call, as a GPU's
    /// asynchronous errors do).
    #[error("{task}: {message}")]
    HostWork {
        /// The task's name ("reduce_scatter").
        task: &'static str,
        /// What the transport said.
        message: String,
    },
    /// The crate was built without the `cuda` feature.
    #[error("zero-kernels was built without the `cuda` feature")]
    NotCompiledWithCuda,
}

#[cfg(feature = "cuda")]
impl From<cudarc::driver::DriverError> for KernelError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        KernelError::Cuda(e.to_string())
    }
}
