//! Typed views of the buffers the kernels read and write, named by dtype at run time so
//! that callers (the engine, which holds `DType`s in its config) pick a layout by `match`
//! rather than by generics.

use crate::dtype::DType;
use half::{bf16, f16};

/// A read-only slice of f32, bf16 or f16 elements (a gradient, a cast source).
#[derive(Clone, Copy, Debug)]
pub enum FloatSlice<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// bf16 elements.
    BF16(&'a [bf16]),
    /// f16 elements.
    F16(&'a [f16]),
}

impl<'a> FloatSlice<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            FloatSlice::F32(s) => s.len(),
            FloatSlice::BF16(s) => s.len(),
            FloatSlice::F16(s) => s.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            FloatSlice::F32(_) => DType::F32,
            FloatSlice::BF16(_) => DType::BF16,
            FloatSlice::F16(_) => DType::F16,
        }
    }

    /// The sub-slice `range` (panics if out of bounds, like slice indexing).
    pub fn slice(&self, range: std::ops::Range<usize>) -> FloatSlice<'a> {
        match *self {
            FloatSlice::F32(s) => FloatSlice::F32(&s[range]),
            FloatSlice::BF16(s) => FloatSlice::BF16(&s[range]),
            FloatSlice::F16(s) => FloatSlice::F16(&s[range]),
        }
    }
}

/// A mutable slice of a 16-bit float type (the working copy of the parameters, a cast
/// destination).
#[derive(Debug)]
pub enum HalfSliceMut<'a> {
    /// bf16 elements.
    BF16(&'a mut [bf16]),
    /// f16 elements.
    F16(&'a mut [f16]),
}

impl<'a> HalfSliceMut<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HalfSliceMut::BF16(s) => s.len(),
            HalfSliceMut::F16(s) => s.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HalfSliceMut::BF16(_) => DType::BF16,
            HalfSliceMut::F16(_) => DType::F16,
        }
    }

    /// Re-borrow the sub-slice `range` (panics if out of bounds, like slice indexing).
    pub fn slice_mut(&mut self, range: std::ops::Range<usize>) -> HalfSliceMut<'_> {
        match self {
            HalfSliceMut::BF16(s) => HalfSliceMut::BF16(&mut s[range]),
            HalfSliceMut::F16(s) => HalfSliceMut::F16(&mut s[range]),
        }
    }
}
