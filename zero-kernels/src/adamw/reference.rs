//! The scalar AdamW update, element by element: the test oracle, and the tail of every
//! vectorised path (which runs exactly these operations in this order, lane by lane).
//!
//! torch.optim.AdamW (decoupled weight decay, Loshchilov & Hutter 2019, Alg. 2), in f32:
//!   g  = g_raw * grad_scale                      (1/loss-scale x clip; g_raw is already the mean)
//!   m  = beta1 * m + (1 - beta1) * g
//!   v  = beta2 * v + (1 - beta2) * g^2
//!   p  = p * (1 - lr * wd) - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//! with 1/sqrt(1 - beta2^t) precomputed, so the denominator is one multiply (torch divides;
//! the two differ by at most one f32 rounding of sqrt(v_hat)). No fused multiply-add.

use super::AdamWCoeffs;
#[cfg(test)]
use crate::simd::{SimdFloat, Sink};

/// One element: returns the new (master, m, v).
#[inline(always)]
pub fn update(c: &AdamWCoeffs, g_raw: f32, p: f32, m: f32, v: f32) -> (f32, f32, f32) {
    let g = g_raw * c.grad_scale;
    let m = c.beta1 * m + c.one_minus_beta1 * g;
    let v = c.beta2 * v + c.one_minus_beta2 * (g * g);
    let denom = v.sqrt() * c.inv_sqrt_bias2 + c.eps;
    let p = p * c.decay - (c.step_size * m) / denom;
    (p, m, v)
}

#[cfg(test)] // the oracle of the tests; production code runs the fast paths
/// The reference step over one contiguous run of elements; `out`, when given, receives the
/// rounded 16-bit copy of the new master weights.
pub(crate) fn step<G: SimdFloat, P: Sink>(
    c: &AdamWCoeffs,
    grad: &[G],
    master: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    mut out: Option<&mut [P]>,
) {
    for i in 0..grad.len() {
        let (p, mi, vi) = update(c, grad[i].to_f32(), master[i], m[i], v[i]);
        master[i] = p;
        m[i] = mi;
        v[i] = vi;
        if let Some(o) = out.as_deref_mut() {
            // SAFETY: i < o.len() (same length as grad, checked by the caller).
            unsafe { P::put1(o.as_mut_ptr().add(i), p) };
        }
    }
}
