//! Buffers and views whose float type is chosen at run time (f32, bf16 or f16): the
//! engine allocates parameters, gradients, buckets and gather slots from the
//! configuration's dtypes and works on them through typed code ([`FloatBuffer::get`]).

use half::{bf16, f16};

use super::{Buffer, DView, DViewMut, Device, Result};
use crate::dtype::DType;
use crate::error::KernelError;
use crate::float::Float;

/// A device buffer of f32, bf16 or f16.
pub enum FloatBuffer<D: Device + ?Sized> {
    /// f32 elements.
    F32(D::Buf<f32>),
    /// bf16 elements.
    BF16(D::Buf<bf16>),
    /// f16 elements.
    F16(D::Buf<f16>),
}

impl<D: Device + ?Sized> std::fmt::Debug for FloatBuffer<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FloatBuffer::F32(b) => b.fmt(f),
            FloatBuffer::BF16(b) => b.fmt(f),
            FloatBuffer::F16(b) => b.fmt(f),
        }
    }
}

impl<D: Device> FloatBuffer<D> {
    /// `len` zeros of `dtype` (f32, bf16 or f16).
    pub fn alloc(dev: &D, dtype: DType, len: usize, name: &str) -> Result<Self> {
        Ok(match dtype {
            DType::F32 => FloatBuffer::F32(dev.alloc(len, name)?),
            DType::BF16 => FloatBuffer::BF16(dev.alloc(len, name)?),
            DType::F16 => FloatBuffer::F16(dev.alloc(len, name)?),
            other => {
                return Err(KernelError::BadViews(format!(
                    "buffer '{name}': {other} is not a float type of model state"
                )))
            }
        })
    }
}

impl<D: Device + ?Sized> FloatBuffer<D> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            FloatBuffer::F32(_) => DType::F32,
            FloatBuffer::BF16(_) => DType::BF16,
            FloatBuffer::F16(_) => DType::F16,
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            FloatBuffer::F32(b) => b.len(),
            FloatBuffer::BF16(b) => b.len(),
            FloatBuffer::F16(b) => b.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the allocation holds.
    pub fn allocated_bytes(&self) -> u64 {
        match self {
            FloatBuffer::F32(b) => b.allocated_bytes(),
            FloatBuffer::BF16(b) => b.allocated_bytes(),
            FloatBuffer::F16(b) => b.allocated_bytes(),
        }
    }

    /// The buffer's name.
    pub fn name(&self) -> &str {
        match self {
            FloatBuffer::F32(b) => b.name(),
            FloatBuffer::BF16(b) => b.name(),
            FloatBuffer::F16(b) => b.name(),
        }
    }

    /// The buffer as `T` (an error naming both types when it holds another).
    pub fn get<T: Float>(&self) -> Result<&D::Buf<T>> {
        let dtype = self.dtype();
        T::pick(self).ok_or_else(|| wrong(self.name(), dtype, T::DTYPE))
    }

    /// The buffer as `T`, mutably.
    pub fn get_mut<T: Float>(&mut self) -> Result<&mut D::Buf<T>> {
        let dtype = self.dtype();
        let name = self.name().to_string();
        T::pick_mut(self).ok_or_else(|| wrong(&name, dtype, T::DTYPE))
    }
}

fn wrong(name: &str, has: DType, want: DType) -> KernelError {
    KernelError::BadViews(format!(
        "buffer '{name}' holds {has} where {want} was expected"
    ))
}

/// A read view of f32, bf16 or f16 elements.
pub enum FloatView<'a, D: Device + ?Sized> {
    /// f32 elements.
    F32(DView<'a, D, f32>),
    /// bf16 elements.
    BF16(DView<'a, D, bf16>),
    /// f16 elements.
    F16(DView<'a, D, f16>),
}

/// The same view as another float type, when the two are the same type (for code
/// generic over two float types that takes a shortcut when they coincide).
pub fn same_type<'a, D: Device, A: Float, B: Float>(v: DView<'a, D, A>) -> Option<DView<'a, D, B>> {
    B::pick_view::<D>(A::wrap_view::<D>(v))
}

/// A write view of f32, bf16 or f16 elements.
pub enum FloatViewMut<'a, D: Device + ?Sized> {
    /// f32 elements.
    F32(DViewMut<'a, D, f32>),
    /// bf16 elements.
    BF16(DViewMut<'a, D, bf16>),
    /// f16 elements.
    F16(DViewMut<'a, D, f16>),
}

/// The same write view as another float type, when the two are the same type.
pub fn same_type_mut<'a, D: Device, A: Float, B: Float>(
    v: DViewMut<'a, D, A>,
) -> Option<DViewMut<'a, D, B>> {
    B::pick_view_mut::<D>(A::wrap_view_mut::<D>(v))
}
