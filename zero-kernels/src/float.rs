//! The floating-point types model states are stored in: f32, bf16 and f16. Parameters,
//! gradients, reduction buckets and gather slots are one of these; the fp32 master
//! weights and Adam's moments are always f32.
//!
//! Conversions use the one bit recipe of [`crate::cast::reference`] (round to nearest
//! even, subnormals, inf and NaN kept), the same on every CPU path and in the CUDA
//! kernels, so a value rounded by the host and by a kernel has the same bits.

use crate::cast::reference as cref;
use crate::device::{DView, DViewMut, Device, FloatBuffer, FloatView, FloatViewMut};
use crate::dtype::Element;
use crate::slices::{FloatSlice, HalfSliceMut};
use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// f32, bf16 or f16. Sealed: the engine matches on its [`Element::DTYPE`] exhaustively.
pub trait Float: Element + sealed::Sealed {
    /// Exact widening to f32.
    fn to_f32(self) -> f32;
    /// Rounding from f32 (to nearest even; exact for f32).
    fn from_f32(x: f32) -> Self;
    /// The kernels' read-only view of a slice of this type.
    fn float_slice(s: &[Self]) -> FloatSlice<'_>;
    /// The kernels' mutable 16-bit view (`None` for f32).
    fn half_mut(s: &mut [Self]) -> Option<HalfSliceMut<'_>>;
    /// This type's buffer in a [`FloatBuffer`] (`None` when it holds another type).
    fn pick<D: Device + ?Sized>(b: &FloatBuffer<D>) -> Option<&D::Buf<Self>>;
    /// This type's buffer in a [`FloatBuffer`], mutably.
    fn pick_mut<D: Device + ?Sized>(b: &mut FloatBuffer<D>) -> Option<&mut D::Buf<Self>>;
    /// A buffer of this type as a [`FloatBuffer`].
    fn wrap<D: Device + ?Sized>(b: D::Buf<Self>) -> FloatBuffer<D>;
    /// A view of this type as a [`FloatView`].
    fn wrap_view<'a, D: Device + ?Sized>(v: DView<'a, D, Self>) -> FloatView<'a, D>;
    /// This type's view in a [`FloatView`] (`None` when it holds another type).
    fn pick_view<'a, D: Device + ?Sized>(v: FloatView<'a, D>) -> Option<DView<'a, D, Self>>;
    /// A write view of this type as a [`FloatViewMut`].
    fn wrap_view_mut<'a, D: Device + ?Sized>(v: DViewMut<'a, D, Self>) -> FloatViewMut<'a, D>;
    /// This type's write view in a [`FloatViewMut`] (`None` when it holds another type).
    fn pick_view_mut<'a, D: Device + ?Sized>(
        v: FloatViewMut<'a, D>,
    ) -> Option<DViewMut<'a, D, Self>>;
}

macro_rules! float_buffers {
    ($variant:ident) => {
        fn pick<D: Device + ?Sized>(b: &FloatBuffer<D>) -> Option<&D::Buf<Self>> {
            match b {
                FloatBuffer::$variant(x) => Some(x),
                _ => None,
            }
        }
        fn pick_mut<D: Device + ?Sized>(b: &mut FloatBuffer<D>) -> Option<&mut D::Buf<Self>> {
            match b {
                FloatBuffer::$variant(x) => Some(x),
                _ => None,
            }
        }
        fn wrap<D: Device + ?Sized>(b: D::Buf<Self>) -> FloatBuffer<D> {
            FloatBuffer::$variant(b)
        }
        fn wrap_view<'a, D: Device + ?Sized>(v: DView<'a, D, Self>) -> FloatView<'a, D> {
            FloatView::$variant(v)
        }
        fn pick_view<'a, D: Device + ?Sized>(v: FloatView<'a, D>) -> Option<DView<'a, D, Self>> {
            match v {
                FloatView::$variant(x) => Some(x),
                _ => None,
            }
        }
        fn wrap_view_mut<'a, D: Device + ?Sized>(v: DViewMut<'a, D, Self>) -> FloatViewMut<'a, D> {
            FloatViewMut::$variant(v)
        }
        fn pick_view_mut<'a, D: Device + ?Sized>(
            v: FloatViewMut<'a, D>,
        ) -> Option<DViewMut<'a, D, Self>> {
            match v {
                FloatViewMut::$variant(x) => Some(x),
                _ => None,
            }
        }
    };
}

impl Float for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    fn float_slice(s: &[Self]) -> FloatSlice<'_> {
        FloatSlice::F32(s)
    }
    fn half_mut(_: &mut [Self]) -> Option<HalfSliceMut<'_>> {
        None
    }
    float_buffers!(F32);
}

impl Float for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        cref::bf16_bits_to_f32(self.to_bits())
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_bits(cref::f32_to_bf16_bits(x))
    }
    fn float_slice(s: &[Self]) -> FloatSlice<'_> {
        FloatSlice::BF16(s)
    }
    fn half_mut(s: &mut [Self]) -> Option<HalfSliceMut<'_>> {
        Some(HalfSliceMut::BF16(s))
    }
    float_buffers!(BF16);
}

impl Float for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        cref::f16_bits_to_f32(self.to_bits())
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_bits(cref::f32_to_f16_bits(x))
    }
    fn float_slice(s: &[Self]) -> FloatSlice<'_> {
        FloatSlice::F16(s)
    }
    fn half_mut(s: &mut [Self]) -> Option<HalfSliceMut<'_>> {
        Some(HalfSliceMut::F16(s))
    }
    float_buffers!(F16);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_to_nearest_even_like_half() {
        for bits in (0u32..=u32::MAX).step_by(65_537) {
            let x = f32::from_bits(bits);
            if x.is_nan() {
                assert!(bf16::from_f32(x).to_f32().is_nan());
                continue;
            }
            assert_eq!(<bf16 as Float>::from_f32(x), bf16::from_f32(x), "{x:e}");
            assert_eq!(<f16 as Float>::from_f32(x), f16::from_f32(x), "{x:e}");
            let h = <bf16 as Float>::from_f32(x);
            assert_eq!(Float::to_f32(h), h.to_f32());
        }
    }
}
