//! CPU twin of `src/nn/cuda/xent.cu`: softmax cross-entropy forward and backward and the
//! loss mean, with the semantics of [`crate::nn::softmax_xent_forward`],
//! [`crate::nn::softmax_xent_backward`] and [`crate::nn::mean_into`], in the GPU kernels'
//! order:
//!
//! - forward, one block of [`THREADS`] threads per row: thread l takes columns l,
//!   l + THREADS, ..; the max and the sum of e^(z_j - m) (j ascending per thread) fold
//!   within each warp by the xor butterfly, then over the 32 warp values by the same
//!   butterfly; `loss = ln(sum) - (z_target - m)` with [`ln_f32`] in f32; then every
//!   `p_j = e^(z_j - m) * (1/sum)`;
//! - backward: `(p_j - [j == target]) * scale`, elementwise (the CPU's order: same bits);
//! - mean: [`MEAN_THREADS`] f64 partial sums (thread l: elements l, l + MEAN_THREADS, ..),
//!   folded `acc[l] += acc[l + w]` for w = MEAN_THREADS/2 .. 1, divided by n, rounded.
//!
//! Targets: a target >= V leaves its row alone and gives a NaN loss (forward) and only
//! the scaling (backward), as on the GPU, which cannot report it; callers validate targets
//! on the host first, so this never happens in a correct program.

use super::attention::{butterfly_max, butterfly_sum};
use crate::dtype::DType;
use crate::nn::Scalar;

/// Threads per row of the forward kernel (32 warps).
pub const THREADS: usize = 1024;
/// Threads of the mean kernel.
pub const MEAN_THREADS: usize = 256;

/// ln x for f32 without libm, branch-free (Cephes `logf`), bit for bit `ln_f32` of
/// `src/cuda/bits.cuh` (libm's `logf` and the GPU's `logf` differ in the last ulp):
/// x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln(m) = f - f^2/2 + f^3 P(f) with f = m - 1,
/// plus e ln2 with ln2 split in two so e*C1 is exact. Error about 1 ulp. Subnormals are
/// scaled by 2^23 first; NaN or x < 0 give NaN, ±0 gives -inf, +inf gives +inf.
// The literals are Cephes' as printed in bits.cuh; both round to the same f32.
#[allow(clippy::excessive_precision)]
pub fn ln_f32(x: f32) -> f32 {
    let bits = x.to_bits();
    let sub = bits < 0x0080_0000; // +0 or a positive subnormal
    let xs = if sub { x * 8_388_608.0 } else { x };
    let b = xs.to_bits();
    let e = ((b >> 23) & 0xFF) as i32 - 126 - if sub { 23 } else { 0 };
    let m = f32::from_bits((b & 0x007F_FFFF) | 0x3F00_0000); // [0.5, 1)
    let small = m < 0.707_106_77;
    let e = if small { e - 1 } else { e };
    let f = if small { (m + m) - 1.0 } else { m - 1.0 };
    let z = f * f;
    let mut y = 7.037_683_629_2e-2 * f - 1.151_461_031_0e-1;
    y = y * f + 1.167_699_874_0e-1;
    y = y * f - 1.242_014_084_6e-1;
    y = y * f + 1.424_932_278_7e-1;
    y = y * f - 1.666_805_766_5e-1;
    y = y * f + 2.000_071_476_5e-1;
    y = y * f - 2.499_999_399_3e-1;
    y = y * f + 3.333_333_117_4e-1;
    y = (y * f) * z;
    let fe = e as f32;
    y += fe * -2.121_944_4e-4;
    y -= z * 0.5;
    let mut r = (f + y) + fe * 0.693_359_4;
    if x == 0.0 {
        r = f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        r = x;
    }
    if x.is_nan() || x < 0.0 {
        r = f32::NAN;
    }
    r
}

/// The kernel's logarithm at `F`: [`ln_f32`] for f32 (the GPU's bits), `F::ln` otherwise.
fn ln<F: Scalar>(x: F) -> F {
    if F::DTYPE == DType::F32 {
        F::from_f64(ln_f32(x.to_f64() as f32) as f64)
    } else {
        x.ln()
    }
}

/// A block's fold of one value per thread: each warp's butterfly (lane 0's value), then
/// the butterfly of the 32 warp values.
fn block_fold<F: Scalar>(per_thread: &[F; THREADS], fold: fn([F; 32]) -> F) -> F {
    let warps: [F; 32] =
        std::array::from_fn(|w| fold(std::array::from_fn(|l| per_thread[w * 32 + l])));
    fold(warps)
}

fn check_len(len: usize, rows: usize, v: usize) {
    assert!(v > 0, "softmax cross-entropy: V must be positive");
    assert!(
        len == rows * v,
        "softmax cross-entropy: {len} logits for {rows} targets of V = {v}"
    );
}

/// Forward (GPU order): rows of `v` logits become probabilities in place; `losses[row]` =
/// the row's cross-entropy against `targets[row]` (see the module doc for targets >= V).
///
/// # Panics
/// If `v == 0` or the lengths disagree with `targets.len()` rows.
pub fn softmax_xent_forward<F: Scalar>(
    logits_to_probs: &mut [F],
    losses: &mut [F],
    targets: &[u32],
    v: usize,
) {
    check_len(logits_to_probs.len(), targets.len(), v);
    assert!(
        losses.len() == targets.len(),
        "softmax cross-entropy: {} losses for {} rows",
        losses.len(),
        targets.len()
    );
    let mut part = [F::ZERO; THREADS];
    for ((row, loss), &tgt) in logits_to_probs
        .chunks_exact_mut(v)
        .zip(losses.iter_mut())
        .zip(targets)
    {
        let tgt = tgt as usize;
        if tgt >= v {
            *loss = F::from_f64(f64::NAN);
            continue;
        }
        part.fill(F::MIN);
        for (j, &z) in row.iter().enumerate() {
            if z > part[j % THREADS] {
                part[j % THREADS] = z;
            }
        }
        let m = block_fold(&part, butterfly_max);
        part.fill(F::ZERO);
        for (j, &z) in row.iter().enumerate() {
            part[j % THREADS] += (z - m).exp();
        }
        let sum = block_fold(&part, butterfly_sum);
        *loss = ln(sum) - (row[tgt] - m);
        let inv = F::ONE / sum;
        row.iter_mut().for_each(|z| *z = (*z - m).exp() * inv);
    }
}

/// Backward (GPU order, here the CPU's too): probabilities become
/// `(p - onehot(target)) * scale` in place.
///
/// # Panics
/// If `v == 0` or the length is not `targets.len() * v`.
pub fn softmax_xent_backward<F: Scalar>(
    probs_to_dlogits: &mut [F],
    targets: &[u32],
    v: usize,
    scale: F,
) {
    check_len(probs_to_dlogits.len(), targets.len(), v);
    for (row, &tgt) in probs_to_dlogits.chunks_exact_mut(v).zip(targets) {
        for (j, x) in row.iter_mut().enumerate() {
            let d = if j == tgt as usize { *x - F::ONE } else { *x };
            *x = d * scale;
        }
    }
}

/// The mean of `src` in f64 (GPU order): [`MEAN_THREADS`] strided partial sums, the fixed
/// fold, then `/ len`. NaN for an empty `src`.
pub fn mean_f64<F: Scalar>(src: &[F]) -> f64 {
    let mut acc = [0.0f64; MEAN_THREADS];
    for (i, x) in src.iter().enumerate() {
        acc[i % MEAN_THREADS] += x.to_f64();
    }
    let mut w = MEAN_THREADS / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0] / src.len() as f64
}

/// `dst = mean(src)`: [`mean_f64`] rounded to `F`.
pub fn mean_into<F: Scalar>(dst: &mut F, src: &[F]) {
    *dst = F::from_f64(mean_f64(src));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn;

    /// Deterministic logits in [-amp, amp), with a spike every 29th.
    fn logits(n: usize, seed: u64, amp: f64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|i| {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
                u * amp + if i % 29 == 0 { amp } else { 0.0 }
            })
            .collect()
    }

    /// (rows, V): one row, V < 32, V not a multiple of 32 or 1024, V past one block's
    /// threads, and a GPT-2-sized vocabulary.
    const SHAPES: [(usize, usize); 6] = [(1, 1), (3, 7), (5, 33), (2, 1000), (4, 2051), (2, 50257)];

    fn targets(rows: usize, v: usize) -> Vec<u32> {
        (0..rows).map(|r| ((r * 7919 + 3) % v) as u32).collect()
    }

    #[test]
    fn ln_f32_is_within_one_ulp_of_the_true_log() {
        let mut worst = 0.0f64;
        // Every 4099th positive finite f32, subnormals included.
        for bits in (1u32..0x7F80_0000).step_by(4099) {
            let v = f32::from_bits(bits);
            let want = (v as f64).ln();
            let ulp = (want as f32).abs().max(f32::MIN_POSITIVE);
            let ulp = f32::from_bits(ulp.to_bits() + 1) - ulp;
            worst = worst.max((ln_f32(v) as f64 - want).abs() / ulp as f64);
        }
        for i in 1..200_000 {
            let v = 0.5 + i as f32 * 1.0e-5; // around 1, where ln is small
            let want = (v as f64).ln();
            let ulp = (want as f32).abs().max(f32::MIN_POSITIVE);
            let ulp = f32::from_bits(ulp.to_bits() + 1) - ulp;
            worst = worst.max((ln_f32(v) as f64 - want).abs() / ulp as f64);
        }
        assert!(worst <= 1.5, "ln_f32 error {worst} ulp");
        assert_eq!(ln_f32(1.0), 0.0);
        assert_eq!(ln_f32(0.0), f32::NEG_INFINITY);
        assert_eq!(ln_f32(-0.0), f32::NEG_INFINITY);
        assert_eq!(ln_f32(f32::INFINITY), f32::INFINITY);
        assert!(ln_f32(-1.0).is_nan() && ln_f32(f32::NAN).is_nan());
        assert!(ln_f32(f32::NEG_INFINITY).is_nan());
    }

    #[test]
    fn forward_matches_the_cpu_kernel_and_f64() {
        for (n, &(rows, v)) in SHAPES.iter().enumerate() {
            for amp in [1.0, 20.0] {
                let z = logits(rows * v, n as u64, amp);
                let tg = targets(rows, v);
                let mut twin: Vec<f32> = z.iter().map(|&x| x as f32).collect();
                let mut cpu = twin.clone();
                let mut exact = z.clone();
                let (mut lt, mut lc, mut le) =
                    (vec![0.0f32; rows], vec![0.0f32; rows], vec![0.0; rows]);
                softmax_xent_forward(&mut twin, &mut lt, &tg, v);
                nn::softmax_xent_forward(&mut cpu, &mut lc, &tg, v);
                nn::softmax_xent_forward(&mut exact, &mut le, &tg, v);
                // Another summation order (and ln_f32 vs libm): the loss to a few ulp of
                // ln(sum), the probabilities to the sum's rounding.
                for r in 0..rows {
                    let tol = 5e-5 + 2e-6 * le[r].abs();
                    let what = format!("({rows}, {v}) amp {amp} loss[{r}]");
                    assert!(
                        (lt[r] - lc[r]).abs() as f64 <= tol,
                        "{what}: {} vs {}",
                        lt[r],
                        lc[r]
                    );
                    assert!(
                        (lt[r] as f64 - le[r]).abs() <= tol,
                        "{what}: {} vs {}",
                        lt[r],
                        le[r]
                    );
                }
                for (i, ((&t, &c), &e)) in twin.iter().zip(&cpu).zip(&exact).enumerate() {
                    let what = format!("({rows}, {v}) amp {amp} p[{i}]");
                    assert!((t - c).abs() <= 5e-5 * c.abs(), "{what}: {t} vs {c}");
                    assert!(
                        (t as f64 - e).abs() <= 5e-5 * e.abs() + 1e-37,
                        "{what}: {t} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn f64_twin_matches_the_f64_cpu_kernel() {
        for (n, &(rows, v)) in SHAPES.iter().enumerate() {
            let z = logits(rows * v, 50 + n as u64, 10.0);
            let tg = targets(rows, v);
            let (mut a, mut b) = (z.clone(), z.clone());
            let (mut la, mut lb) = (vec![0.0; rows], vec![0.0; rows]);
            softmax_xent_forward(&mut a, &mut la, &tg, v);
            nn::softmax_xent_forward(&mut b, &mut lb, &tg, v);
            for (x, w) in la.iter().zip(&lb).chain(a.iter().zip(&b)) {
                assert!((x - w).abs() <= 1e-13 * (1.0 + w.abs()), "{x} vs {w}");
            }
        }
    }

    #[test]
    fn huge_logits_stay_finite() {
        let mut z = vec![1.0e30f32, -1.0e30, 0.0, 88.0];
        let mut loss = [0.0f32];
        softmax_xent_forward(&mut z, &mut loss, &[1], 4);
        assert!(loss[0].is_finite() && loss[0] > 1.0e29, "{}", loss[0]);
        assert_eq!(z[0], 1.0);
    }

    #[test]
    fn backward_is_the_cpu_kernel_bit_for_bit() {
        for (n, &(rows, v)) in SHAPES.iter().enumerate() {
            let z = logits(rows * v, 90 + n as u64, 3.0);
            let tg = targets(rows, v);
            let mut p: Vec<f32> = z.iter().map(|&x| x as f32).collect();
            let mut l = vec![0.0f32; rows];
            softmax_xent_forward(&mut p, &mut l, &tg, v);
            let mut cpu = p.clone();
            softmax_xent_backward(&mut p, &tg, v, 0.37);
            nn::softmax_xent_backward(&mut cpu, &tg, v, 0.37);
            assert!(p.iter().zip(&cpu).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn target_past_v_gives_nan_and_stays_in_bounds() {
        let mut z = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut l = [0.0f32; 2];
        softmax_xent_forward(&mut z, &mut l, &[3, 0], 3);
        assert!(l[0].is_nan() && l[1].is_finite());
        assert_eq!(&z[..3], &[1.0, 2.0, 3.0]);
        softmax_xent_backward(&mut z, &[3, 0], 3, 2.0);
        assert_eq!(&z[..3], &[2.0, 4.0, 6.0]);
    }

    #[test]
    fn mean_matches_the_cpu_mean() {
        for n in [1usize, 2, 255, 256, 257, 1000, 16384, 20001] {
            let src: Vec<f32> = logits(n, n as u64, 5.0)
                .iter()
                .map(|&x| x.abs() as f32)
                .collect();
            let (mut a, mut b) = (0.0f32, 0.0f32);
            mean_into(&mut a, &src);
            nn::mean_into(&mut b, &src);
            // Both are f64 sums rounded to f32: they agree to one f32 rounding.
            assert!((a - b).abs() <= b.abs() * 1.2e-7, "n = {n}: {a} vs {b}");
            assert!((mean_f64(&src) - nn::mean_f64(&src)).abs() <= 1e-12 * b as f64);
        }
        assert!(mean_f64::<f32>(&[]).is_nan());
        // The fold's grouping: partials 0 and 128 meet first.
        let mut src = vec![0.0f64; 256];
        src[0] = 1.0e17;
        src[128] = -1.0e17;
        src[1] = 1.0;
        assert_eq!(mean_f64(&src) * 256.0, 1.0);
    }
}
