//! Element-wise reductions in a fixed rank order: `out = ((x0 ∘ x1) ∘ x2) ∘ ... ∘ x(N-1)`.
//!
//! The loops run rank-major over cache-sized chunks (acc = x0; acc = acc ∘ x1; ...), which
//! performs, for every element, exactly the operations of the rank-order expression in
//! the same order, so the bits are those of the serial sum however the loop is blocked.
//!
//! - f32, f64: IEEE addition in the type itself, with a defined NaN (Rust leaves the
//!   payload of a NaN sum to the code generator, which may swap the operands): a NaN
//!   operand comes back quieted, the accumulator's (the lowest rank's) first; an invalid
//!   sum (inf - inf) is the canonical quiet NaN (`f32::NAN`'s bits). The GPU fold of the
//!   thread ranks on device buffers (zero-kernels' `cuda/peer.cu`) does the same.
//! - bf16, f16, [`crate::HalfSum::Op`]: each step converts both operands to f32, adds and
//!   rounds back to the half type (round-to-nearest-even), as the MPI backend's user op.
//!   [`crate::HalfSum::Upcast`]: [`fold_upcast`] sums in f32 in rank order, [`narrow`]
//!   rounds once.
//! - Integers: wrapping addition (two's complement), as MPI's SUM on the hardware.
//! - Max of floats: the first maximal value in rank order; `-0.0` and `+0.0` compare equal,
//!   so the lower rank's zero is kept; a NaN wins over every number, and the lowest rank's
//!   NaN is the one kept, payload and sign unchanged (the MPI backend's half max returns a
//!   canonical NaN instead). Max of integers: `Ord::max`.

use crate::communicator::ReduceOp;
use crate::{DType, Element};
use half::{bf16, f16};

/// Elements per chunk: a few chunks of every rank stay in L1 while they are combined.
const CHUNK: usize = 2048;

/// An element type with the reductions above.
pub(crate) trait Elem: Element {
    /// `acc + x` (per-step rounding for halves).
    fn sum(acc: Self, x: Self) -> Self;
    /// `max(acc, x)` as documented in the module header.
    fn max(acc: Self, x: Self) -> Self;
}

/// A 16-bit float, summable through f32.
pub(crate) trait Half: Elem {
    fn widen(self) -> f32;
    fn narrow(x: f32) -> Self;
}

// NaN-first, first-maximum-wins, in the element's own comparison.
macro_rules! float_max {
    ($acc:expr, $x:expr, $nan:expr, $gt:expr) => {{
        let (acc, x) = ($acc, $x);
        if $nan(acc) {
            acc
        } else if $nan(x) || $gt(x, acc) {
            x
        } else {
            acc
        }
    }};
}

/// `acc + x` with the NaN of the module documentation.
#[inline]
pub(crate) fn add_f32(acc: f32, x: f32) -> f32 {
    let s = acc + x;
    if !s.is_nan() {
        s
    } else if acc.is_nan() {
        f32::from_bits(acc.to_bits() | 0x0040_0000)
    } else if x.is_nan() {
        f32::from_bits(x.to_bits() | 0x0040_0000)
    } else {
        f32::from_bits(0x7fc0_0000)
    }
}

/// As [`add_f32`], for f64.
#[inline]
pub(crate) fn add_f64(acc: f64, x: f64) -> f64 {
    let s = acc + x;
    if !s.is_nan() {
        s
    } else if acc.is_nan() {
        f64::from_bits(acc.to_bits() | 0x0008_0000_0000_0000)
    } else if x.is_nan() {
        f64::from_bits(x.to_bits() | 0x0008_0000_0000_0000)
    } else {
        f64::from_bits(0x7ff8_0000_0000_0000)
    }
}

impl Elem for f32 {
    #[inline]
    fn sum(acc: f32, x: f32) -> f32 {
        add_f32(acc, x)
    }
    #[inline]
    fn max(acc: f32, x: f32) -> f32 {
        float_max!(acc, x, f32::is_nan, |a: f32, b: f32| a > b)
    }
}

impl Elem for f64 {
    #[inline]
    fn sum(acc: f64, x: f64) -> f64 {
        add_f64(acc, x)
    }
    #[inline]
    fn max(acc: f64, x: f64) -> f64 {
        float_max!(acc, x, f64::is_nan, |a: f64, b: f64| a > b)
    }
}

macro_rules! half_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            #[inline]
            fn sum(acc: $t, x: $t) -> $t {
                <$t>::from_f32(add_f32(acc.to_f32(), x.to_f32()))
            }
            #[inline]
            fn max(acc: $t, x: $t) -> $t {
                // f32 holds every half value exactly, so the comparison is exact.
                float_max!(acc, x, |v: $t| v.is_nan(), |a: $t, b: $t| a.to_f32() > b.to_f32())
            }
        }
        impl Half for $t {
            #[inline]
            fn widen(self) -> f32 {
                self.to_f32()
            }
            #[inline]
            fn narrow(x: f32) -> $t {
                <$t>::from_f32(x)
            }
        }
    )*};
}
half_elem!(bf16, f16);

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            #[inline]
            fn sum(acc: $t, x: $t) -> $t {
                acc.wrapping_add(x)
            }
            #[inline]
            fn max(acc: $t, x: $t) -> $t {
                std::cmp::max(acc, x)
            }
        }
    )*};
}
int_elem!(u8, u32, i32, i64);

/// `out[i] = f(...f(f(inputs[0][i], inputs[1][i]), inputs[2][i])..., inputs[N-1][i])`.
/// Every input has `out.len()` elements (checked by the caller).
pub(crate) fn fold<T: Copy>(inputs: &[&[T]], out: &mut [T], f: impl Fn(T, T) -> T) {
    let Some((first, rest)) = inputs.split_first() else {
        return;
    };
    for (c, o) in out.chunks_mut(CHUNK).enumerate() {
        let lo = c * CHUNK;
        let hi = lo + o.len();
        o.copy_from_slice(&first[lo..hi]);
        for x in rest {
            for (a, &b) in o.iter_mut().zip(&x[lo..hi]) {
                *a = f(*a, b);
            }
        }
    }
}

/// `acc[i] = ((widen(x0[i]) + widen(x1[i])) + ...)` in f32, rank order.
pub(crate) fn fold_upcast<H: Half>(inputs: &[&[H]], acc: &mut [f32]) {
    let Some((first, rest)) = inputs.split_first() else {
        return;
    };
    for (c, o) in acc.chunks_mut(CHUNK).enumerate() {
        let lo = c * CHUNK;
        let hi = lo + o.len();
        for (a, &b) in o.iter_mut().zip(&first[lo..hi]) {
            *a = b.widen();
        }
        for x in rest {
            for (a, &b) in o.iter_mut().zip(&x[lo..hi]) {
                *a = add_f32(*a, b.widen());
            }
        }
    }
}

/// Round every f32 of `acc` to the half type (round-to-nearest-even), once.
pub(crate) fn narrow<H: Half>(acc: &[f32], out: &mut [H]) {
    for (o, &a) in out.iter_mut().zip(acc) {
        *o = H::narrow(a);
    }
}

/// One monomorphic loop per (type, op): the element op inlines and vectorises.
pub(crate) fn fold_into<T: Elem>(inputs: &[&[T]], out: &mut [T], op: ReduceOp) {
    match op {
        ReduceOp::Sum => fold(inputs, out, T::sum),
        ReduceOp::Max => fold(inputs, out, T::max),
    }
}

/// Size and alignment of one element.
pub(crate) fn layout(dtype: DType) -> (usize, usize) {
    use std::mem::{align_of, size_of};
    match dtype {
        DType::F32 => (size_of::<f32>(), align_of::<f32>()),
        DType::F64 => (size_of::<f64>(), align_of::<f64>()),
        DType::BF16 => (size_of::<bf16>(), align_of::<bf16>()),
        DType::F16 => (size_of::<f16>(), align_of::<f16>()),
        DType::U8 => (size_of::<u8>(), align_of::<u8>()),
        DType::U32 => (size_of::<u32>(), align_of::<u32>()),
        DType::I32 => (size_of::<i32>(), align_of::<i32>()),
        DType::I64 => (size_of::<i64>(), align_of::<i64>()),
    }
}

/// The first `len` elements of `T` of the scratch words (grown as needed).
pub(crate) fn scratch_as<T: bytemuck::Pod>(v: &mut Vec<u64>, len: usize) -> &mut [T] {
    let words = (len * std::mem::size_of::<T>()).div_ceil(8);
    if v.len() < words {
        v.resize(words, 0);
    }
    // u64 words are aligned for, and a whole number of, every element type (1, 2, 4, 8
    // bytes), so the cast cannot fail.
    &mut bytemuck::cast_slice_mut::<u64, T>(&mut v[..words])[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_semantics() {
        let nan_a = f32::from_bits(0x7fc0_0001);
        let nan_b = f32::from_bits(0xffc0_0002);
        assert_eq!(<f32 as Elem>::max(2.0, 1.0), 2.0);
        assert_eq!(<f32 as Elem>::max(-0.0, 0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(<f32 as Elem>::max(0.0, -0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(<f32 as Elem>::max(1.0, nan_a).to_bits(), nan_a.to_bits());
        assert_eq!(<f32 as Elem>::max(nan_a, nan_b).to_bits(), nan_a.to_bits());
        assert_eq!(<f32 as Elem>::max(nan_b, 7.0).to_bits(), nan_b.to_bits());
        let h = |v: f32| bf16::from_f32(v);
        assert_eq!(<bf16 as Elem>::max(h(-1.0), h(-2.0)), h(-1.0));
        assert!(<bf16 as Elem>::max(h(1.0), bf16::NAN).is_nan());
        assert_eq!(<i32 as Elem>::max(-3, -7), -3);
        assert_eq!(<u8 as Elem>::sum(250, 10), 4);
        assert_eq!(<i64 as Elem>::sum(i64::MAX, 1), i64::MIN);
    }

    #[test]
    fn fold_is_rank_order_across_chunks() {
        // Three "ranks", a length that is not a multiple of the chunk.
        let n = CHUNK * 2 + 17;
        let xs: Vec<Vec<f32>> = (0..3)
            .map(|r| {
                (0..n)
                    .map(|i| ((i * 7 + r * 13) % 101) as f32 * 0.1)
                    .collect()
            })
            .collect();
        let refs: Vec<&[f32]> = xs.iter().map(|v| &v[..]).collect();
        let mut out = vec![0f32; n];
        fold(&refs, &mut out, <f32 as Elem>::sum);
        for i in 0..n {
            assert_eq!(
                out[i].to_bits(),
                ((xs[0][i] + xs[1][i]) + xs[2][i]).to_bits()
            );
        }
        // Per-step half rounding: 256 + 1 + 1 in bf16 is 256 stepwise, 258 once.
        let hs = [
            vec![bf16::from_f32(256.0)],
            vec![bf16::ONE],
            vec![bf16::ONE],
        ];
        let refs: Vec<&[bf16]> = hs.iter().map(|v| &v[..]).collect();
        let mut o = [bf16::ZERO];
        fold(&refs, &mut o, <bf16 as Elem>::sum);
        assert_eq!(o[0].to_f32(), 256.0);
        let mut acc = [0f32];
        fold_upcast(&refs, &mut acc);
        narrow(&acc, &mut o);
        assert_eq!(o[0].to_f32(), 258.0);
    }
}
