//! Device buffers: typed, length-checked owners of GPU memory that zero-comm (NCCL,
//! CUDA-aware MPI) and zero-core can hold as model-state shards. They wrap cudarc's
//! `CudaSlice` (reachable through [`DeviceBuffer::cuda_slice`] for libraries that take
//! one). All transfers and kernels go through the owning [`CudaDevice`]'s single stream, so
//! they are ordered without events.

use super::CudaDevice;
use crate::dtype::{DType, Element};
use crate::error::KernelError;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};

/// An element type that can live in a device buffer.
pub trait DeviceElement: Element + DeviceRepr + ValidAsZeroBits {}
impl<T: Element + DeviceRepr + ValidAsZeroBits> DeviceElement for T {}

/// `len` elements of `T` in GPU memory.
#[derive(Debug)]
pub struct DeviceBuffer<T: DeviceElement> {
    slice: CudaSlice<T>,
}

impl<T: DeviceElement> DeviceBuffer<T> {
    /// `n` zeros.
    pub fn zeros(dev: &CudaDevice, n: usize) -> Result<Self, KernelError> {
        if n == 0 {
            return Self::empty(dev);
        }
        Ok(DeviceBuffer {
            slice: dev.default_stream().alloc_zeros::<T>(n)?,
        })
    }

    /// A zero-length buffer (cuMemAlloc rejects 0 bytes; cudarc's `null` does not).
    fn empty(dev: &CudaDevice) -> Result<Self, KernelError> {
        Ok(DeviceBuffer {
            slice: dev.default_stream().null::<T>()?,
        })
    }

    /// A copy of host data.
    pub fn from_host(dev: &CudaDevice, src: &[T]) -> Result<Self, KernelError> {
        if src.is_empty() {
            return Self::empty(dev);
        }
        Ok(DeviceBuffer {
            slice: dev.default_stream().clone_htod(src)?,
        })
    }

    /// Copy the contents back to the host (waits for queued work).
    pub fn to_host(&self, dev: &CudaDevice) -> Result<Vec<T>, KernelError> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        Ok(dev.default_stream().clone_dtoh(&self.slice)?)
    }

    /// Overwrite the contents with host data of the same length.
    pub fn copy_from_host(&mut self, dev: &CudaDevice, src: &[T]) -> Result<(), KernelError> {
        check_len("src", src.len(), self.len())?;
        if src.is_empty() {
            return Ok(());
        }
        Ok(dev.default_stream().memcpy_htod(src, &mut self.slice)?)
    }

    /// Overwrite the contents with another device buffer of the same length.
    pub fn copy_from_device(
        &mut self,
        dev: &CudaDevice,
        src: &DeviceBuffer<T>,
    ) -> Result<(), KernelError> {
        check_len("src", src.len(), self.len())?;
        if src.is_empty() {
            return Ok(());
        }
        Ok(dev
            .default_stream()
            .memcpy_dtod(&src.slice, &mut self.slice)?)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// The cudarc slice (for NCCL and other cudarc users).
    pub fn cuda_slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// The cudarc slice, mutably.
    pub fn cuda_slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }

    /// Raw device address of element `offset` (kernels take raw pointers; everything runs
    /// on the device's one stream, so no event is needed to order the access).
    pub(crate) fn addr(&self, dev: &CudaDevice, offset: usize) -> u64 {
        let (ptr, _sync) = self.slice.device_ptr(dev.default_stream());
        ptr + (offset * std::mem::size_of::<T>()) as u64
    }
}

pub(crate) fn check_len(
    what: &'static str,
    got: usize,
    expected: usize,
) -> Result<(), KernelError> {
    if got != expected {
        return Err(KernelError::LengthMismatch {
            what,
            got,
            expected,
        });
    }
    Ok(())
}

/// A read-only device buffer of f32, bf16 or f16 (a gradient, a cast source).
#[derive(Clone, Copy, Debug)]
pub enum DeviceFloat<'a> {
    /// f32 elements.
    F32(&'a DeviceBuffer<f32>),
    /// bf16 elements.
    BF16(&'a DeviceBuffer<bf16>),
    /// f16 elements.
    F16(&'a DeviceBuffer<f16>),
}

impl DeviceFloat<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            DeviceFloat::F32(b) => b.len(),
            DeviceFloat::BF16(b) => b.len(),
            DeviceFloat::F16(b) => b.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            DeviceFloat::F32(_) => DType::F32,
            DeviceFloat::BF16(_) => DType::BF16,
            DeviceFloat::F16(_) => DType::F16,
        }
    }

    pub(crate) fn addr(&self, dev: &CudaDevice, offset: usize) -> u64 {
        match self {
            DeviceFloat::F32(b) => b.addr(dev, offset),
            DeviceFloat::BF16(b) => b.addr(dev, offset),
            DeviceFloat::F16(b) => b.addr(dev, offset),
        }
    }
}

/// A mutable device buffer of a 16-bit float type (the parameters' working copy).
#[derive(Debug)]
pub enum DeviceHalfMut<'a> {
    /// bf16 elements.
    BF16(&'a mut DeviceBuffer<bf16>),
    /// f16 elements.
    F16(&'a mut DeviceBuffer<f16>),
}

impl DeviceHalfMut<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            DeviceHalfMut::BF16(b) => b.len(),
            DeviceHalfMut::F16(b) => b.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            DeviceHalfMut::BF16(_) => DType::BF16,
            DeviceHalfMut::F16(_) => DType::F16,
        }
    }

    pub(crate) fn addr(&self, dev: &CudaDevice, offset: usize) -> u64 {
        match self {
            DeviceHalfMut::BF16(b) => b.addr(dev, offset),
            DeviceHalfMut::F16(b) => b.addr(dev, offset),
        }
    }
}

/// The f32 optimizer state of a shard on the device.
#[derive(Debug)]
pub struct DeviceAdamWState<'a> {
    /// fp32 master weights.
    pub master: &'a mut DeviceBuffer<f32>,
    /// First moment.
    pub m: &'a mut DeviceBuffer<f32>,
    /// Second moment.
    pub v: &'a mut DeviceBuffer<f32>,
}
