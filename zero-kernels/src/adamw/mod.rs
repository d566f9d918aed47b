//! Fused mixed-precision AdamW over a rank's shard: one pass reads the gradient (f32, bf16
//! or f16) and the f32 master weights, m and v, and writes master, m, v and, optionally,
//! the rounded 16-bit working copy of the parameters.
//!
//! A shard spans several parameters, each with its own group (lr, betas, eps, weight
//! decay) and decay flag (decided by the parameter's identity, never by the shard's shape:
//! docs/ARCHITECTURE.md, "Optimizer conventions"), so a step takes a list of [`AdamWSegment`]s:
//! disjoint, sorted ranges of the shard; elements in no segment (padding) are left as
//! they are. Results are bitwise identical for every instruction-set level, thread count
//! and the CUDA kernel, and equal to [`reference::update`] applied element by element
//! (NaN results are NaN everywhere, payload unspecified: see `simd.rs`). Against the same
//! formula evaluated in f64 the error is a few f32 roundings of the terms' magnitudes;
//! the bound and its argument are in `tests.rs` (`close_to_f64`).

pub mod reference;
pub mod roofline;
pub mod unfused;

mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(test)]
mod tests;

use crate::error::KernelError;
use crate::isa::Exec;
use crate::par::{self, SendPtr};
use crate::simd::{dispatch, NoSink, SimdFloat, Sink};
use crate::slices::{FloatSlice, HalfSliceMut};
use std::ops::Range;

/// Hyper-parameters of one parameter group (`torch.optim.AdamW` names and meaning).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWHyper {
    /// Learning rate (already scheduled for this step).
    pub lr: f64,
    /// Decay rate of the first moment.
    pub beta1: f64,
    /// Decay rate of the second moment.
    pub beta2: f64,
    /// Added to sqrt(v_hat) in the denominator.
    pub eps: f64,
    /// Decoupled weight decay (applied only to segments with `decay: true`).
    pub weight_decay: f64,
}

impl Default for AdamWHyper {
    /// nanoGPT / llm.c defaults: lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1.
    fn default() -> Self {
        AdamWHyper {
            lr: 6e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

/// A contiguous range of the shard that belongs to one group, with decay on or off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdamWSegment {
    /// Element range within the shard.
    pub range: Range<usize>,
    /// Index into the groups passed to [`step`].
    pub group: usize,
    /// Whether weight decay applies (2-D weights and embeddings: yes; biases, norms: no).
    pub decay: bool,
}

/// The f32 constants of one step for one segment, computed once on the host in f64 and
/// rounded to f32 (what every implementation — scalar, SIMD, CUDA — multiplies by).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct AdamWCoeffs {
    /// Combined gradient multiplier: 1/loss-scale x clip coefficient. (The mean over
    /// the N x A micro-batches is taken earlier: the engine weighs each micro-batch's
    /// loss by 1/(N A) in its backward.)
    pub grad_scale: f32,
    /// beta1.
    pub beta1: f32,
    /// 1 - beta1.
    pub one_minus_beta1: f32,
    /// beta2.
    pub beta2: f32,
    /// 1 - beta2.
    pub one_minus_beta2: f32,
    /// lr / (1 - beta1^t).
    pub step_size: f32,
    /// 1 / sqrt(1 - beta2^t).
    pub inv_sqrt_bias2: f32,
    /// eps.
    pub eps: f32,
    /// 1 - lr * weight_decay with decay on, 1 with decay off (p * 1 is exact).
    pub decay: f32,
}

impl AdamWCoeffs {
    /// The constants of step `t` (counted from 1) for one group and decay flag.
    pub fn new(
        h: &AdamWHyper,
        t: u64,
        grad_scale: f32,
        decay: bool,
    ) -> Result<AdamWCoeffs, KernelError> {
        let bad = |name, value, why| KernelError::BadHyper { name, value, why };
        if t == 0 {
            return Err(KernelError::ZeroStep(t));
        }
        if !(h.lr.is_finite() && h.lr >= 0.0) {
            return Err(bad("lr", h.lr, "must be finite and >= 0"));
        }
        for (name, b) in [("beta1", h.beta1), ("beta2", h.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(bad(name, b, "must lie in [0, 1)"));
            }
        }
        if !(h.eps.is_finite() && h.eps > 0.0) {
            return Err(bad("eps", h.eps, "must be finite and > 0"));
        }
        if !(h.weight_decay.is_finite() && h.weight_decay >= 0.0) {
            return Err(bad(
                "weight_decay",
                h.weight_decay,
                "must be finite and >= 0",
            ));
        }
        if !(grad_scale.is_finite() && grad_scale >= 0.0) {
            return Err(bad(
                "grad_scale",
                grad_scale as f64,
                "must be finite and >= 0",
            ));
        }
        // beta^t by repeated squaring in f64 (powi is exact enough: t < 2^31 in practice).
        let ti = t.min(i32::MAX as u64) as i32;
        let bias1 = 1.0 - h.beta1.powi(ti);
        let bias2 = 1.0 - h.beta2.powi(ti);
        let c = AdamWCoeffs {
            grad_scale,
            beta1: h.beta1 as f32,
            one_minus_beta1: (1.0 - h.beta1) as f32,
            beta2: h.beta2 as f32,
            one_minus_beta2: (1.0 - h.beta2) as f32,
            step_size: (h.lr / bias1) as f32,
            inv_sqrt_bias2: (1.0 / bias2.sqrt()) as f32,
            eps: h.eps as f32,
            decay: if decay {
                (1.0 - h.lr * h.weight_decay) as f32
            } else {
                1.0
            },
        };
        // The checks above are in f64, but every kernel computes with these f32 values: an
        // eps that rounds to 0 makes 0/0 = NaN where m = v = 0 (a parameter whose gradient
        // is 0), and an infinite factor makes inf * 0 = NaN; either ruins the master
        // weights for good. The betas' f32 forms stay in [0, 1] and make no NaN.
        if !(c.eps > 0.0 && c.eps.is_finite()) {
            return Err(bad(
                "eps",
                h.eps,
                "rounds to 0 or to infinity in f32 (the kernels compute in f32): must lie between about 7e-46 and 3.4e38",
            ));
        }
        if !c.step_size.is_finite() {
            return Err(bad(
                "lr",
                h.lr,
                "lr / (1 - beta1^t), the step size, overflows f32 (the kernels compute in f32)",
            ));
        }
        if !c.inv_sqrt_bias2.is_finite() {
            return Err(bad(
                "beta2",
                h.beta2,
                "1 / sqrt(1 - beta2^t) overflows f32 (the kernels compute in f32)",
            ));
        }
        if !c.decay.is_finite() {
            return Err(bad(
                "weight_decay",
                h.weight_decay,
                "1 - lr * weight_decay overflows f32 (the kernels compute in f32)",
            ));
        }
        Ok(c)
    }
}

/// The f32 optimizer state of a shard: master weights and both moments, same length.
#[derive(Debug)]
pub struct AdamWState<'a> {
    /// fp32 master weights.
    pub master: &'a mut [f32],
    /// First moment.
    pub m: &'a mut [f32],
    /// Second moment.
    pub v: &'a mut [f32],
}

impl AdamWState<'_> {
    fn check(&self, n: usize) -> Result<(), KernelError> {
        for (what, got) in [
            ("master", self.master.len()),
            ("m", self.m.len()),
            ("v", self.v.len()),
        ] {
            if got != n {
                return Err(KernelError::LengthMismatch {
                    what,
                    got,
                    expected: n,
                });
            }
        }
        Ok(())
    }
}

/// Check that segments are sorted, disjoint, in bounds and name existing groups.
pub fn check_segments(
    segments: &[AdamWSegment],
    groups: usize,
    numel: usize,
) -> Result<(), KernelError> {
    let mut prev_end = 0;
    for (index, s) in segments.iter().enumerate() {
        let why = if s.range.start > s.range.end {
            Some("start after end")
        } else if s.range.end > numel {
            Some("past the end of the buffers")
        } else if s.range.start < prev_end {
            Some("overlaps or precedes the previous segment (segments must be sorted and disjoint)")
        } else if s.group >= groups {
            Some("no such group")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(KernelError::BadSegment {
                index,
                start: s.range.start,
                end: s.range.end,
                group: s.group,
                numel,
                groups,
                why,
            });
        }
        prev_end = s.range.end;
    }
    Ok(())
}

/// One AdamW step `t` (from 1) over a shard: every segment updated with its group's
/// hyper-parameters and decay flag, the gradient multiplied by `grad_scale` on the way
/// in, and `param` (if given) overwritten with the rounded new master weights.
#[allow(clippy::too_many_arguments)]
pub fn step(
    exec: &Exec,
    groups: &[AdamWHyper],
    segments: &[AdamWSegment],
    t: u64,
    grad_scale: f32,
    grad: FloatSlice<'_>,
    state: AdamWState<'_>,
    mut param: Option<HalfSliceMut<'_>>,
) -> Result<(), KernelError> {
    let n = grad.len();
    state.check(n)?;
    if let Some(p) = &param {
        if p.len() != n {
            return Err(KernelError::LengthMismatch {
                what: "param",
                got: p.len(),
                expected: n,
            });
        }
    }
    check_segments(segments, groups.len(), n)?;
    let coeffs = segments
        .iter()
        .map(|s| AdamWCoeffs::new(&groups[s.group], t, grad_scale, s.decay))
        .collect::<Result<Vec<_>, _>>()?;
    let AdamWState { master, m, v } = state;
    for (s, c) in segments.iter().zip(&coeffs) {
        let r = s.range.clone();
        run(
            exec,
            c,
            grad.slice(r.clone()),
            AdamWState {
                master: &mut master[r.clone()],
                m: &mut m[r.clone()],
                v: &mut v[r.clone()],
            },
            param.as_mut().map(|p| p.slice_mut(r.clone())),
        )?;
    }
    Ok(())
}

/// The fused update over one contiguous run with one set of constants (every element of
/// the slices). [`step`] calls this per segment.
pub fn run(
    exec: &Exec,
    c: &AdamWCoeffs,
    grad: FloatSlice<'_>,
    state: AdamWState<'_>,
    param: Option<HalfSliceMut<'_>>,
) -> Result<(), KernelError> {
    let n = grad.len();
    state.check(n)?;
    match (grad, param) {
        (g, None) => run_grad::<_, false>(exec, c, g, state, NoSink::ptr()),
        (g, Some(HalfSliceMut::BF16(p))) => {
            check_param(p.len(), n)?;
            run_grad::<_, false>(exec, c, g, state, p.as_mut_ptr())
        }
        (g, Some(HalfSliceMut::F16(p))) => {
            check_param(p.len(), n)?;
            run_grad::<_, false>(exec, c, g, state, p.as_mut_ptr())
        }
    }
}

pub(crate) fn check_param(got: usize, n: usize) -> Result<(), KernelError> {
    if got != n {
        return Err(KernelError::LengthMismatch {
            what: "param",
            got,
            expected: n,
        });
    }
    Ok(())
}

/// `out` is valid for `grad.len()` writes or is `NoSink`'s dangling pointer; the state's
/// lengths have been checked against `grad`.
pub(crate) fn run_grad<P: Sink, const COPY: bool>(
    exec: &Exec,
    c: &AdamWCoeffs,
    grad: FloatSlice<'_>,
    state: AdamWState<'_>,
    out: *mut P,
) -> Result<(), KernelError> {
    match grad {
        FloatSlice::F32(g) => run_typed::<_, _, COPY>(exec, c, g, state, out),
        FloatSlice::BF16(g) => run_typed::<_, _, COPY>(exec, c, g, state, out),
        FloatSlice::F16(g) => run_typed::<_, _, COPY>(exec, c, g, state, out),
    }
    Ok(())
}

/// `out` is valid for `grad.len()` writes or is `NoSink`'s dangling pointer.
fn run_typed<G: SimdFloat, P: Sink, const COPY: bool>(
    exec: &Exec,
    c: &AdamWCoeffs,
    grad: &[G],
    state: AdamWState<'_>,
    out: *mut P,
) {
    let g = SendPtr(grad.as_ptr() as *mut G);
    let (p, m, v) = (
        SendPtr(state.master.as_mut_ptr()),
        SendPtr(state.m.as_mut_ptr()),
        SendPtr(state.v.as_mut_ptr()),
    );
    let o = SendPtr(out);
    par::map(exec, grad.len(), 64, |r| {
        // SAFETY: every buffer has grad.len() elements (checked by the callers), `r` lies
        // within that, chunks are disjoint, and exec's level is available.
        unsafe {
            let k = cpu::Step::<G, P, COPY> {
                c: *c,
                g: g.at(r.start) as *const G,
                p: p.at(r.start),
                m: m.at(r.start),
                v: v.at(r.start),
                out: o.at(r.start),
                n: r.len(),
            };
            dispatch(exec.isa(), k)
        }
    });
}
