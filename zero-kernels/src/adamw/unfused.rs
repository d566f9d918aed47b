//! The same AdamW step done the way a tensor library without a fused kernel does it: one
//! pass over memory per operation (widen, scale, decay, m, v, update, narrow), each
//! vectorised like the fused kernel. It is the baseline of `zero-bench micro adam` (the
//! fused/unfused speed-up) and a second oracle: every intermediate is an f32 stored and
//! reloaded exactly, so its results equal the fused step bit for bit.

use super::{AdamWCoeffs, AdamWState};
use crate::cast;
use crate::error::KernelError;
use crate::isa::Exec;
use crate::par::{self, SendPtr};
use crate::simd::{dispatch, Kernel, Simd};
use crate::slices::{FloatSlice, HalfSliceMut};

const SCALE: u8 = 0;
const DECAY: u8 = 1;
const MOMENT1: u8 = 2;
const MOMENT2: u8 = 3;
const UPDATE: u8 = 4;

/// One elementwise pass; `a` is updated in place from `a`, `b`, `c` (which pass reads
/// which is in `run`).
struct Pass<const K: u8> {
    c: AdamWCoeffs,
    a: *mut f32,
    b: *const f32,
    d: *const f32,
    n: usize,
}

impl<const K: u8> Kernel for Pass<K> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let c = &self.c;
        #[inline(always)]
        unsafe fn op<S: Simd, const K: u8>(c: &AdamWCoeffs, a: S::F, b: S::F, d: S::F) -> S::F {
            match K {
                SCALE => S::mul(a, S::splat(c.grad_scale)),
                DECAY => S::mul(a, S::splat(c.decay)),
                // a = m, b = g
                MOMENT1 => S::add(
                    S::mul(S::splat(c.beta1), a),
                    S::mul(S::splat(c.one_minus_beta1), b),
                ),
                // a = v, b = g
                MOMENT2 => S::add(
                    S::mul(S::splat(c.beta2), a),
                    S::mul(S::splat(c.one_minus_beta2), S::mul(b, b)),
                ),
                // a = p, b = m, d = v
                _ => {
                    let denom = S::add(
                        S::mul(S::sqrt(d), S::splat(c.inv_sqrt_bias2)),
                        S::splat(c.eps),
                    );
                    S::sub(a, S::div(S::mul(S::splat(c.step_size), b), denom))
                }
            }
        }
        let mut i = 0;
        while i + S::LANES <= self.n {
            let a = S::load(self.a.add(i));
            let b = if K >= MOMENT1 {
                S::load(self.b.add(i))
            } else {
                a
            };
            let d = if K == UPDATE {
                S::load(self.d.add(i))
            } else {
                a
            };
            S::store(self.a.add(i), op::<S, K>(c, a, b, d));
            i += S::LANES;
        }
        while i < self.n {
            let a = *self.a.add(i);
            let b = if K >= MOMENT1 { *self.b.add(i) } else { a };
            let d = if K == UPDATE { *self.d.add(i) } else { a };
            *self.a.add(i) = op::<crate::simd::Scalar, K>(c, a, b, d);
            i += 1;
        }
    }
}

fn pass<const K: u8>(exec: &Exec, c: &AdamWCoeffs, a: &mut [f32], b: &[f32], d: &[f32]) {
    let (pa, pb, pd) = (
        SendPtr(a.as_mut_ptr()),
        SendPtr(b.as_ptr() as *mut f32),
        SendPtr(d.as_ptr() as *mut f32),
    );
    par::map(exec, a.len(), 64, |r| {
        // SAFETY: a, b, d have the same length (checked by `step`) or are unread (empty
        // slices are passed only to passes that do not read them); chunks are disjoint.
        unsafe {
            let k = Pass::<K> {
                c: *c,
                a: pa.at(r.start),
                b: if b.is_empty() { pb.0 } else { pb.at(r.start) },
                d: if d.is_empty() { pd.0 } else { pd.at(r.start) },
                n: r.len(),
            };
            dispatch(exec.isa(), k)
        }
    });
}

/// AdamW in seven passes over memory; `scratch` (same length) receives the f32 gradient.
/// Same arguments and results as [`super::run`].
pub fn run(
    exec: &Exec,
    c: &AdamWCoeffs,
    grad: FloatSlice<'_>,
    state: AdamWState<'_>,
    param: Option<HalfSliceMut<'_>>,
    scratch: &mut [f32],
) -> Result<(), KernelError> {
    let n = grad.len();
    state.check(n)?;
    cast::widen(exec, grad, scratch)?;
    let AdamWState { master, m, v } = state;
    pass::<SCALE>(exec, c, scratch, &[], &[]);
    pass::<DECAY>(exec, c, master, &[], &[]);
    pass::<MOMENT1>(exec, c, m, scratch, &[]);
    pass::<MOMENT2>(exec, c, v, scratch, &[]);
    pass::<UPDATE>(exec, c, master, m, v);
    if let Some(p) = param {
        cast::narrow(exec, master, p)?;
    }
    Ok(())
}
