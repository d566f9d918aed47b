//! Gradient statistics in one pass: unscale (multiply by 1/loss-scale), detect inf/NaN and
//! sum the squares (for global-norm clipping), over a rank's gradient shard. The engine
//! then all-reduces the sum and the flag across ranks; the unscale itself can stay folded
//! into AdamW's `grad_scale` (use [`stats`]), or be written back for f32 gradients
//! ([`unscale_in_place`]).
//!
//! The sum of squares is accumulated in f64 in the fixed order of [`mod@reference`], so it is
//! bitwise identical for every instruction-set level and thread count.

pub mod reference;

mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(test)]
mod tests;

use crate::isa::Exec;
use crate::par::{self, SendPtr};
use crate::simd::{dispatch, SimdFloat};
use crate::slices::FloatSlice;
use reference::BLOCK;

/// What one pass over a gradient shard found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradStats {
    /// Sum over the shard of (g * scale)^2, in f64 (inf or NaN when `nonfinite`).
    pub sum_squares: f64,
    /// True when some g * scale is inf or NaN (the step must be skipped on every rank).
    pub nonfinite: bool,
}

impl GradStats {
    fn from_sum(sum_squares: f64) -> GradStats {
        GradStats {
            sum_squares,
            nonfinite: !sum_squares.is_finite(),
        }
    }
}

/// How the per-block sums become the total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Total {
    /// Serially in block order, from 0.0 (the host's order, [`mod@reference`]).
    Serial,
    /// As the GPU's device-side finish adds them ([`reference::finish_tree`]): the CUDA
    /// kernel's twin, equal to `Serial` to f64 rounding.
    GpuTree,
}

/// `grad` is valid for `n` reads, `out` null or valid for `n` writes (it may be `grad`).
fn block_sums<G: SimdFloat>(
    exec: &Exec,
    grad: *const G,
    n: usize,
    out: *mut f32,
    scale: f32,
    order: Total,
) -> f64 {
    let g = SendPtr(grad as *mut G);
    let o = SendPtr(out);
    let parts = par::map(exec, n, BLOCK, |r| {
        // SAFETY: r lies within grad (and out, when not null, has grad's length); chunks
        // start at block boundaries and are disjoint; exec's level is available.
        unsafe {
            let k = cpu::BlockSums {
                g: g.at(r.start) as *const G,
                out: if o.0.is_null() { o.0 } else { o.at(r.start) },
                scale,
                n: r.len(),
            };
            dispatch(exec.isa(), k)
        }
    });
    match order {
        // Block sums in block order, from 0.0 (the order `reference` defines).
        Total::Serial => parts.iter().flatten().fold(0.0f64, |total, s| total + s),
        Total::GpuTree => {
            let sums: Vec<f64> = parts.into_iter().flatten().collect();
            reference::finish_tree(&sums)
        }
    }
}

/// Sum of squares and non-finite flag of `grad * scale`, reading the gradient only.
pub fn stats(exec: &Exec, grad: FloatSlice<'_>, scale: f32) -> GradStats {
    stats_totalled(exec, grad, scale, Total::Serial)
}

/// [`stats`] with the block sums totalled in `order`.
pub fn stats_totalled(exec: &Exec, grad: FloatSlice<'_>, scale: f32, order: Total) -> GradStats {
    let null = std::ptr::null_mut();
    GradStats::from_sum(match grad {
        FloatSlice::F32(g) => block_sums(exec, g.as_ptr(), g.len(), null, scale, order),
        FloatSlice::BF16(g) => block_sums(exec, g.as_ptr(), g.len(), null, scale, order),
        FloatSlice::F16(g) => block_sums(exec, g.as_ptr(), g.len(), null, scale, order),
    })
}

/// Multiply an f32 gradient by `scale` in place and return the statistics of the result,
/// in the same pass.
pub fn unscale_in_place(exec: &Exec, grad: &mut [f32], scale: f32) -> GradStats {
    // One raw pointer for reading and writing: each element is read before it is
    // written, by the same thread.
    let p = grad.as_mut_ptr();
    GradStats::from_sum(block_sums(
        exec,
        p as *const f32,
        grad.len(),
        p,
        scale,
        Total::Serial,
    ))
}
