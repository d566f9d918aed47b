//! The element types the engine keeps parameters, gradients and buckets in (f32, bf16,
//! f16), and the few conversions between them that the step needs. The step is generic
//! over P (parameter/gradient dtype) and W (reduce dtype) through [`Real`]; buffers hold
//! a [`Store`] so the engine can allocate them from a run-time [`DType`].

use half::{bf16, f16};
use zero_kernels::{cast, DType, Element, Exec, FloatSlice, HalfSliceMut};

use super::EngineError;

/// A buffer of one of the engine's float types, allocated from a run-time dtype.
#[derive(Debug)]
pub enum Store {
    /// f32 elements.
    F32(Vec<f32>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// f16 elements.
    F16(Vec<f16>),
}

impl Store {
    /// `len` zeros of `dtype` (f32, bf16 or f16).
    pub fn zeros(dtype: DType, len: usize) -> Result<Store, EngineError> {
        Ok(match dtype {
            DType::F32 => Store::F32(vec![0.0; len]),
            DType::BF16 => Store::BF16(vec![bf16::ZERO; len]),
            DType::F16 => Store::F16(vec![f16::ZERO; len]),
            other => return Err(EngineError::Internal(format!("no float store of {other}"))),
        })
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Store::F32(_) => DType::F32,
            Store::BF16(_) => DType::BF16,
            Store::F16(_) => DType::F16,
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            Store::F32(v) => v.len(),
            Store::BF16(v) => v.len(),
            Store::F16(v) => v.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes actually allocated (capacity, not length: what the process holds).
    pub fn allocated_bytes(&self) -> u64 {
        let cap = match self {
            Store::F32(v) => v.capacity(),
            Store::BF16(v) => v.capacity(),
            Store::F16(v) => v.capacity(),
        };
        (cap * self.dtype().size_bytes()) as u64
    }

    /// Set every element to zero.
    pub fn fill_zero(&mut self) {
        match self {
            Store::F32(v) => v.fill(0.0),
            Store::BF16(v) => v.fill(bf16::ZERO),
            Store::F16(v) => v.fill(f16::ZERO),
        }
    }

    /// Read-only view for the kernels.
    pub fn float_slice(&self) -> FloatSlice<'_> {
        match self {
            Store::F32(v) => FloatSlice::F32(v),
            Store::BF16(v) => FloatSlice::BF16(v),
            Store::F16(v) => FloatSlice::F16(v),
        }
    }
}

/// f32, bf16 or f16: what parameters, gradients and buckets are made of.
pub trait Real: Element {
    /// Exact widening.
    fn to_f32(self) -> f32;
    /// Round to nearest even.
    fn from_f32(x: f32) -> Self;
    /// The kernels' view of a slice.
    fn float_slice(s: &[Self]) -> FloatSlice<'_>;
    /// The kernels' 16-bit mutable view (`None` for f32).
    fn half_mut(s: &mut [Self]) -> Option<HalfSliceMut<'_>>;
    /// This type's slice in a store (an engine bug if the dtype differs).
    fn of(s: &Store) -> Result<&[Self], EngineError>;
    /// This type's mutable slice in a store.
    fn of_mut(s: &mut Store) -> Result<&mut [Self], EngineError>;
}

fn wrong(s: &Store, want: DType) -> EngineError {
    EngineError::Internal(format!(
        "buffer holds {} where {want} was expected",
        s.dtype()
    ))
}

macro_rules! real {
    ($t:ty, $variant:ident, $half:expr, $to:expr, $from:expr) => {
        impl Real for $t {
            fn to_f32(self) -> f32 {
                $to(self)
            }
            fn from_f32(x: f32) -> Self {
                $from(x)
            }
            fn float_slice(s: &[Self]) -> FloatSlice<'_> {
                FloatSlice::$variant(s)
            }
            fn half_mut(s: &mut [Self]) -> Option<HalfSliceMut<'_>> {
                $half(s)
            }
            fn of(s: &Store) -> Result<&[Self], EngineError> {
                match s {
                    Store::$variant(v) => Ok(v),
                    _ => Err(wrong(s, <$t as Element>::DTYPE)),
                }
            }
            fn of_mut(s: &mut Store) -> Result<&mut [Self], EngineError> {
                match s {
                    Store::$variant(v) => Ok(v),
                    _ => Err(wrong(s, <$t as Element>::DTYPE)),
                }
            }
        }
    };
}

real!(f32, F32, |_| None, |x| x, |x| x);
real!(
    bf16,
    BF16,
    |s| Some(HalfSliceMut::BF16(s)),
    bf16::to_f32,
    bf16::from_f32
);
real!(
    f16,
    F16,
    |s| Some(HalfSliceMut::F16(s)),
    f16::to_f32,
    f16::from_f32
);

/// `dst = src` converted (exact widening, or round-to-nearest-even narrowing).
pub fn convert<S: Real, D: Real>(exec: &Exec, src: &[S], dst: &mut [D]) -> Result<(), EngineError> {
    debug_assert_eq!(src.len(), dst.len());
    if S::DTYPE == D::DTYPE {
        // Same type: a plain copy (bytemuck checks the sizes agree).
        dst.copy_from_slice(bytemuck::cast_slice(src));
        return Ok(());
    }
    match (D::half_mut(dst), S::DTYPE) {
        // Narrowing f32 -> 16-bit.
        (Some(h), DType::F32) => cast::narrow(exec, bytemuck::cast_slice(src), h)?,
        // Widening 16-bit -> f32.
        (None, _) => cast::widen(exec, S::float_slice(src), bytemuck::cast_slice_mut(dst))?,
        // 16-bit -> other 16-bit: through f32 (exact then one rounding).
        (Some(_), _) => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = D::from_f32(s.to_f32());
            }
        }
    }
    Ok(())
}

/// `dst += src` with one rounding to D per element (gradient accumulation).
pub fn accumulate<S: Real, D: Real>(
    exec: &Exec,
    dst: &mut [D],
    src: &[S],
) -> Result<(), EngineError> {
    debug_assert_eq!(src.len(), dst.len());
    if D::DTYPE == DType::F32 {
        cast::accumulate(exec, bytemuck::cast_slice_mut(dst), S::float_slice(src))?;
    } else {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = D::from_f32(d.to_f32() + s.to_f32());
        }
    }
    Ok(())
}
