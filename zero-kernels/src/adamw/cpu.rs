//! The fused AdamW pass, vectorised: each element's gradient, master, m and v are read
//! once and master, m, v (and the 16-bit copy) written once — 28 bytes per parameter for
//! bf16 gradient and copy, the memory-bandwidth floor of the step. The operations per lane
//! are those of `reference::update`, in the same order.

use super::{reference, AdamWCoeffs};
use crate::simd::{Kernel, Simd, SimdFloat, Sink};

/// One contiguous run of `n` elements. With `COPY` the arithmetic is replaced by trivial
/// adds (the "Adam-shaped copy" of `roofline.rs`): same loads and stores, no math.
pub(crate) struct Step<G, P, const COPY: bool> {
    pub c: AdamWCoeffs,
    pub g: *const G,
    pub p: *mut f32,
    pub m: *mut f32,
    pub v: *mut f32,
    pub out: *mut P,
    pub n: usize,
}

impl<G: SimdFloat, P: Sink, const COPY: bool> Kernel for Step<G, P, COPY> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let c = &self.c;
        let gs = S::splat(c.grad_scale);
        let b1 = S::splat(c.beta1);
        let omb1 = S::splat(c.one_minus_beta1);
        let b2 = S::splat(c.beta2);
        let omb2 = S::splat(c.one_minus_beta2);
        let ibc2 = S::splat(c.inv_sqrt_bias2);
        let eps = S::splat(c.eps);
        let decay = S::splat(c.decay);
        let step = S::splat(c.step_size);
        let mut i = 0;
        if COPY {
            while i + S::LANES <= self.n {
                let g = G::load::<S>(self.g.add(i));
                let m = S::add(S::load(self.m.add(i)), g);
                let v = S::add(S::load(self.v.add(i)), g);
                let p = S::add(S::load(self.p.add(i)), g);
                S::store(self.m.add(i), m);
                S::store(self.v.add(i), v);
                S::store(self.p.add(i), p);
                P::put::<S>(self.out.add(i), p);
                i += S::LANES;
            }
            while i < self.n {
                let g = (*self.g.add(i)).to_f32();
                *self.m.add(i) += g;
                *self.v.add(i) += g;
                *self.p.add(i) += g;
                P::put1(self.out.add(i), *self.p.add(i));
                i += 1;
            }
            return;
        }
        while i + S::LANES <= self.n {
            let g = S::mul(G::load::<S>(self.g.add(i)), gs);
            let m = S::add(S::mul(b1, S::load(self.m.add(i))), S::mul(omb1, g));
            let v = S::add(
                S::mul(b2, S::load(self.v.add(i))),
                S::mul(omb2, S::mul(g, g)),
            );
            let denom = S::add(S::mul(S::sqrt(v), ibc2), eps);
            let p = S::sub(
                S::mul(S::load(self.p.add(i)), decay),
                S::div(S::mul(step, m), denom),
            );
            S::store(self.m.add(i), m);
            S::store(self.v.add(i), v);
            S::store(self.p.add(i), p);
            P::put::<S>(self.out.add(i), p);
            i += S::LANES;
        }
        while i < self.n {
            let (p, m, v) = reference::update(
                c,
                (*self.g.add(i)).to_f32(),
                *self.p.add(i),
                *self.m.add(i),
                *self.v.add(i),
            );
            *self.p.add(i) = p;
            *self.m.add(i) = m;
            *self.v.add(i) = v;
            P::put1(self.out.add(i), p);
            i += 1;
        }
    }
}
