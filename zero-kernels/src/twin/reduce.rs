//! Reduction orders of the CUDA kernels, in Rust: the building blocks the twins use to
//! reproduce a kernel's sums bit for bit.
//!
//! - [`warp_tree_sum`] / [`warp_tree_max`]: a warp's xor butterfly
//!   (`x += __shfl_xor_sync(full, x, off)` for off = 16, 8, 4, 2, 1);
//! - [`lane_sums`]: the per-lane partial sums of a strided loop (lane l takes j = l,
//!   l + 32, .. ascending, from 0);
//! - [`warp_strided_sum`]: the two together, a warp's sum of n terms;
//! - [`pairwise_fold`]: the shared-memory tree of a block (`a[i] += a[i + half]` for
//!   half = n/2, .., 1);
//! - [`fold_columns`]: the second pass of a deterministic column sum (`column_fold_f32`
//!   in `src/nn/cuda/rows.cu`): per-chunk partial sums added over chunks.

use crate::nn::Scalar;

/// Lanes of a warp.
pub const LANES: usize = 32;

/// The xor butterfly of a warp as every lane ends it: lane l adds lane l ^ off for off =
/// 16, 8, 4, 2, 1. IEEE addition commutes, so lane l's value equals lane 0's, which is
/// `a[i] + a[i + half]` for i < half, half = 16, .., 1.
pub fn warp_tree_sum<F: Scalar>(lanes: [F; LANES]) -> F {
    pairwise_fold(lanes, |a, b| a + b)
}

/// The warp max butterfly: a lane keeps its partner's value when it is greater (so NaN
/// is ignored unless it is lane 0's from the start, as the CPU's `if v > max`).
pub fn warp_tree_max<F: Scalar>(lanes: [F; LANES]) -> F {
    pairwise_fold(lanes, |a, b| if b > a { b } else { a })
}

/// `a[i] = op(a[i], a[i + half])` for i < half, half = N/2, .., 1 (N a power of two);
/// returns `a[0]`. A warp butterfly and a block's shared-memory tree both reduce this way.
pub fn pairwise_fold<F: Copy, const N: usize>(mut a: [F; N], op: impl Fn(F, F) -> F) -> F {
    assert!(
        N.is_power_of_two(),
        "pairwise_fold: {N} is not a power of two"
    );
    let mut half = N / 2;
    while half > 0 {
        for i in 0..half {
            a[i] = op(a[i], a[i + half]);
        }
        half /= 2;
    }
    a[0]
}

/// The partial sums of a loop strided by the warp: lane l adds `term(j)` for j = l,
/// l + 32, .. < n, in that order, starting from 0.
pub fn lane_sums<F: Scalar>(n: usize, mut term: impl FnMut(usize) -> F) -> [F; LANES] {
    let mut acc = [F::ZERO; LANES];
    for j in 0..n {
        acc[j % LANES] += term(j);
    }
    acc
}

/// A warp's sum of `term(0..n)`: [`lane_sums`] folded by [`warp_tree_sum`].
pub fn warp_strided_sum<F: Scalar>(n: usize, term: impl FnMut(usize) -> F) -> F {
    warp_tree_sum(lane_sums(n, term))
}

/// Warps of `column_fold_f32` (rows.cu's FOLD_WARPS).
pub const FOLD_WARPS: usize = 8;

/// `dst[col] += ` the sum over k of `partial[k * width + col]` (k < `chunks`), in the
/// order of `column_fold_f32`: warp w adds chunks w, w + [`FOLD_WARPS`], .. ascending from
/// 0, then [`pairwise_fold`] of the [`FOLD_WARPS`] warp sums, then one addition to `dst`.
///
/// # Panics
/// If `partial` is shorter than `chunks * width` or `dst` than `width`.
pub fn fold_columns<F: Scalar>(dst: &mut [F], partial: &[F], chunks: usize, width: usize) {
    assert!(
        partial.len() >= chunks * width && dst.len() >= width,
        "fold_columns: buffers too short"
    );
    for (col, d) in dst[..width].iter_mut().enumerate() {
        let sums: [F; FOLD_WARPS] = std::array::from_fn(|w| {
            let mut acc = F::ZERO;
            for k in (w..chunks).step_by(FOLD_WARPS) {
                acc += partial[k * width + col];
            }
            acc
        });
        *d += pairwise_fold(sums, |a, b| a + b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The butterfly simulated lane by lane (every lane reading its partner's old value),
    /// as the hardware does it: all lanes end equal to [`warp_tree_sum`].
    #[test]
    fn tree_equals_a_lane_by_lane_butterfly() {
        let a: [f32; LANES] =
            std::array::from_fn(|i| (i as f32 * 0.37 - 5.1) * 1.0e3f32.powi(i as i32 % 3));
        let mut x = a;
        let mut off = 16;
        while off > 0 {
            let old = x;
            for l in 0..LANES {
                x[l] = old[l] + old[l ^ off];
            }
            off /= 2;
        }
        let want = warp_tree_sum(a);
        for v in x {
            assert_eq!(v.to_bits(), want.to_bits());
        }
        let exact: f64 = a.iter().map(|&v| v as f64).sum();
        assert!(
            (want as f64 - exact).abs() <= 1e-5 * a.iter().map(|v| v.abs() as f64).sum::<f64>()
        );
    }

    #[test]
    fn max_and_strided_sum() {
        let a: [f32; LANES] = std::array::from_fn(|i| ((i * 7) % 32) as f32 - 3.0);
        assert_eq!(warp_tree_max(a), 28.0);
        let s: f64 = warp_strided_sum(100, |j| j as f64);
        assert_eq!(s, 4950.0);
        let l = lane_sums(33, |j| j as f64);
        assert_eq!((l[0], l[1], l[31]), (32.0, 1.0, 31.0));
        assert_eq!(
            pairwise_fold([1u32, 2, 3, 4, 5, 6, 7, 8], |a, b| a * 10 + b),
            2178
        );
        // 3 columns, 11 chunks: column c gets sum_k (k + c), added onto 0.5.
        let (chunks, width) = (11, 3);
        let partial: Vec<f64> = (0..chunks * width)
            .map(|e| (e / width + e % width) as f64)
            .collect();
        let mut dst = vec![0.5; width];
        fold_columns(&mut dst, &partial, chunks, width);
        assert_eq!(dst, vec![55.5, 66.5, 77.5]);
    }
}
