//! Casts between f32 and the 16-bit float types, and accumulation of 16-bit gradients into
//! f32 — over whole slices, one pass each, at the best instruction-set level (or the one
//! an `Exec` forces), bitwise equal to `reference` on every level and thread count.

pub mod reference;

mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(test)]
mod tests;

use crate::error::KernelError;
use crate::float::Float;
use crate::isa::Exec;
use crate::par::{self, SendPtr};
use crate::simd::{dispatch, run_auto, AutoKernel, SimdFloat};
use crate::slices::{FloatSlice, HalfSliceMut};
use cpu::{Accumulate, Convert};

/// Elements per unit of work handed to a thread (any multiple of 16 would do).
const ALIGN: usize = 64;

fn check_len(what: &'static str, got: usize, expected: usize) -> Result<(), KernelError> {
    if got != expected {
        return Err(KernelError::LengthMismatch {
            what,
            got,
            expected,
        });
    }
    Ok(())
}

fn convert<A: SimdFloat, B: SimdFloat>(exec: &Exec, src: &[A], dst: &mut [B]) {
    let (s, d) = (SendPtr(src.as_ptr() as *mut A), SendPtr(dst.as_mut_ptr()));
    par::map(exec, src.len(), ALIGN, |r| {
        let k = Convert {
            // SAFETY: r lies within both slices (same length, checked by the caller).
            src: unsafe { s.at(r.start) } as *const A,
            dst: unsafe { d.at(r.start) },
            n: r.len(),
        };
        // SAFETY: exec's level is available; the chunks are disjoint.
        unsafe { dispatch(exec.isa(), k) }
    });
}

/// Round f32 values into a 16-bit buffer: `dst[i] = round_nearest_even(src[i])`.
pub fn narrow(exec: &Exec, src: &[f32], dst: HalfSliceMut<'_>) -> Result<(), KernelError> {
    check_len("dst", dst.len(), src.len())?;
    match dst {
        HalfSliceMut::BF16(d) => convert(exec, src, d),
        HalfSliceMut::F16(d) => convert(exec, src, d),
    }
    Ok(())
}

/// Widen f32, bf16 or f16 values into f32 (exact).
pub fn widen(exec: &Exec, src: FloatSlice<'_>, dst: &mut [f32]) -> Result<(), KernelError> {
    check_len("dst", dst.len(), src.len())?;
    match src {
        FloatSlice::F32(s) => convert(exec, s, dst),
        FloatSlice::BF16(s) => convert(exec, s, dst),
        FloatSlice::F16(s) => convert(exec, s, dst),
    }
    Ok(())
}

fn accumulate_typed<A: SimdFloat>(exec: &Exec, dst: &mut [f32], src: &[A]) {
    let (s, d) = (SendPtr(src.as_ptr() as *mut A), SendPtr(dst.as_mut_ptr()));
    par::map(exec, src.len(), ALIGN, |r| {
        let k = Accumulate {
            // SAFETY: r lies within both slices (same length, checked by the caller).
            src: unsafe { s.at(r.start) } as *const A,
            dst: unsafe { d.at(r.start) },
            n: r.len(),
        };
        // SAFETY: exec's level is available; the chunks are disjoint.
        unsafe { dispatch(exec.isa(), k) }
    });
}

/// `dst[i] = round(f32(dst[i]) + f32(src[i]))` into a `dst` of any float type (one
/// thread): the accumulation into 16-bit buffers that [`accumulate`] (f32 `dst`) leaves
/// out, written as plain Rust and compiled for `exec`'s level (also the sum MPI calls
/// back for halves, `zero-comm/src/mpi/ops.rs`). A [`KernelError::LengthMismatch`] when
/// `src` and `dst` differ in length, as its siblings.
pub fn accumulate_rounded<S: Float, T: Float>(
    exec: &Exec,
    dst: &mut [T],
    src: &[S],
) -> Result<(), KernelError> {
    check_len("src", src.len(), dst.len())?;
    run_auto(exec, AccumulateRounded(dst, src));
    Ok(())
}

/// [`accumulate_rounded`]'s body.
struct AccumulateRounded<'a, S, T>(&'a mut [T], &'a [S]);

impl<S: Float, T: Float> AutoKernel for AccumulateRounded<'_, S, T> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        for (d, &s) in self.0.iter_mut().zip(self.1) {
            *d = T::from_f32(d.to_f32() + s.to_f32());
        }
    }
}

/// Accumulate gradients into an f32 buffer: `dst[i] = dst[i] + f32(src[i])`, one f32
/// rounding per element (gradient accumulation over micro-steps).
pub fn accumulate(exec: &Exec, dst: &mut [f32], src: FloatSlice<'_>) -> Result<(), KernelError> {
    check_len("src", src.len(), dst.len())?;
    match src {
        FloatSlice::F32(s) => accumulate_typed(exec, dst, s),
        FloatSlice::BF16(s) => accumulate_typed(exec, dst, s),
        FloatSlice::F16(s) => accumulate_typed(exec, dst, s),
    }
    Ok(())
}
