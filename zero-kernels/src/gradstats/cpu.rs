//! The vectorised gradient statistics pass over one run of whole blocks: scale, optionally
//! write back, square into 16 f64 lanes, fold — in the order `reference.rs` defines.

use super::reference::BLOCK;
use crate::simd::{reduce16, Kernel, Simd, SimdFloat};

/// Block sums of `(g[i] * scale)^2` over `n` elements starting at a block boundary;
/// `out` (if not null) receives `g[i] * scale` (in-place unscale of an f32 gradient).
pub(crate) struct BlockSums<G> {
    pub g: *const G,
    pub out: *mut f32,
    pub scale: f32,
    pub n: usize,
}

impl<G: SimdFloat> Kernel for BlockSums<G> {
    type Out = Vec<f64>;
    #[inline(always)]
    unsafe fn run<S: Simd>(self) -> Vec<f64> {
        let mut sums = Vec::with_capacity(self.n.div_ceil(BLOCK));
        let scale = S::splat(self.scale);
        let write = !self.out.is_null();
        let mut start = 0;
        while start < self.n {
            let end = (start + BLOCK).min(self.n);
            let mut acc = S::acc_zero();
            let mut i = start;
            while i + 16 <= end {
                let mut j = 0;
                while j < 16 {
                    let x = S::mul(G::load::<S>(self.g.add(i + j)), scale);
                    if write {
                        S::store(self.out.add(i + j), x);
                    }
                    acc = S::acc_sq(acc, x, j);
                    j += S::LANES;
                }
                i += 16;
            }
            let mut lanes = S::acc_to_array(acc);
            while i < end {
                let x = (*self.g.add(i)).to_f32() * self.scale;
                if write {
                    *self.out.add(i) = x;
                }
                let d = x as f64;
                lanes[(i - start) % 16] += d * d;
                i += 1;
            }
            sums.push(reduce16(lanes));
            start = end;
        }
        sums
    }
}
