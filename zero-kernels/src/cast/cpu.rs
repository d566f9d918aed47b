//! Vectorised casts and accumulation, one generic body per operation (see `simd.rs`):
//! SIMD over whole vectors, then the scalar recipe of `reference.rs` for the tail — the
//! same bits either way.

use crate::simd::{Kernel, Simd, SimdFloat, Sink};

/// `dst[i] = B(src[i])` with round-to-nearest-even where B is narrower.
pub(crate) struct Convert<A, B> {
    pub src: *const A,
    pub dst: *mut B,
    pub n: usize,
}

impl<A: SimdFloat, B: SimdFloat + Sink> Kernel for Convert<A, B> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let mut i = 0;
        while i + S::LANES <= self.n {
            B::put::<S>(self.dst.add(i), A::load::<S>(self.src.add(i)));
            i += S::LANES;
        }
        while i < self.n {
            *self.dst.add(i) = B::from_f32((*self.src.add(i)).to_f32());
            i += 1;
        }
    }
}

/// `dst[i] = dst[i] + f32(src[i])`.
pub(crate) struct Accumulate<A> {
    pub dst: *mut f32,
    pub src: *const A,
    pub n: usize,
}

impl<A: SimdFloat> Kernel for Accumulate<A> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let mut i = 0;
        while i + S::LANES <= self.n {
            let d = self.dst.add(i);
            S::store(d, S::add(S::load(d), A::load::<S>(self.src.add(i))));
            i += S::LANES;
        }
        while i < self.n {
            *self.dst.add(i) += (*self.src.add(i)).to_f32();
            i += 1;
        }
    }
}
