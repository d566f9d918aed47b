//! The scalar the model kernels compute in: `f32` for training, `f64` for the reference
//! that gradient checks compare against. One generic body serves both, so the f64 model
//! that finite differences validate is the same code the engine runs in f32.
//!
//! (Named `Scalar`, not `Real`: the project has had too many traits called `Real`.)

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// A floating-point scalar with the few functions the model kernels use, and its GEMM
/// ([`super::sgemm`] for f32, `matrixmultiply`'s `dgemm` for f64).
pub trait Scalar:
    crate::dtype::Element
    + Copy
    + Default
    + Debug
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// The most negative finite value (softmax's running max starts here).
    const MIN: Self;
    /// Round from f64.
    fn from_f64(x: f64) -> Self;
    /// Widen to f64.
    fn to_f64(self) -> f64;
    /// e^x (for f32 the branch-free [`exp_f32`]).
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// tanh (for f32 the branch-free [`tanh_f32`], which vectorises; libm's does not).
    fn tanh(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// `C = alpha * A B + beta * C` with arbitrary strides (matrixmultiply's contract;
    /// `beta == 0` does not read C).
    ///
    /// # Safety
    /// The pointers with the given dimensions and strides must address valid memory, and
    /// `c` must not alias `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );

    /// [`Scalar::gemm_raw`] with the operands rounded to bf16 and f32 sums
    /// ([`super::gemm_bf16`]); f64 (the reference) has no such mode and multiplies exactly.
    ///
    /// # Safety
    /// As [`Scalar::gemm_raw`], and `kernel` is one this CPU runs.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw_bf16(
        kernel: super::gemm_bf16::Bf16Kernel,
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );

    /// The bf16-operand product on all of a pool's threads at once, where a kernel
    /// shares work across them ([`super::gemm_bf16::sgemm_bf16_shared`], f32); `None`
    /// for f64.
    const GEMM_BF16_SHARED: Option<GemmBf16Shared<Self>>;
}

/// [`super::gemm_bf16::sgemm_bf16_shared`]'s signature over a scalar type.
pub type GemmBf16Shared<F> = unsafe fn(
    &crate::par::Workers,
    super::gemm_bf16::Bf16Kernel,
    usize,
    usize,
    usize,
    F,
    *const F,
    isize,
    isize,
    *const F,
    isize,
    isize,
    F,
    *mut F,
    isize,
    isize,
) -> bool;

/// e^x for f32 without libm, branch-free so loops over it vectorise (Cephes `expf`):
/// x = n ln2 + r with |r| <= ln2/2, e^r by a degree-7 polynomial, 2^n by building the
/// exponent bits. Relative error ~2 ulp on [-87, 88]; inputs are clamped to that range.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    // Round x*log2(e) to nearest with the 1.5*2^23 trick (no SSE4.1 `round` needed).
    let shifted = x * std::f32::consts::LOG2_E + 12_582_912.0;
    let n = shifted - 12_582_912.0;
    // ln 2 split in two so n*C1 is exact (Cody-Waite).
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 5e-1;
    let y = p * r * r + r + 1.0;
    // 2^n from the bits of `shifted` = 1.5*2^23 + n (bits 0x4B40_0000 + n: the ulp is 1
    // there), in integer lanes, which vectorise; `n as i32` does not (its saturation runs
    // lane by lane). For every non-NaN x this is `(n as i32 + 127) << 23`; the mask keeps
    // a NaN x's scale a number, so the NaN passes through unchanged, as before.
    let biased = shifted.to_bits().wrapping_sub(0x4B40_0000 - 127) & 0xFF;
    y * f32::from_bits(biased << 23)
}

/// tanh for f32 as 1 - 2/(e^(2u) + 1) over [`exp_f32`]: absolute error ~2e-7, which is
/// what GELU needs (it uses 0.5 x (1 + tanh), an absolute not a relative quantity).
#[inline(always)]
pub fn tanh_f32(u: f32) -> f32 {
    1.0 - 2.0 / (exp_f32(2.0 * u) + 1.0)
}

/// Rows whose sums [`interleaved_sums`] runs together in the row kernels.
pub(crate) const SUM_ROWS: usize = 8;

/// `G` sums at once: sum `g` is `term(g, 0) + term(g, 1) + ... + term(g, len - 1)`, added
/// in index order from 0, so each has the bits of its own plain loop. A float sum cannot
/// be vectorised without reordering it, and one such loop waits on every add; the `G`
/// independent chains, interleaved, keep the adder busy instead (the row kernels sum `G`
/// rows at a time this way, and their remainder rows with `G = 1`).
#[inline(always)]
pub(crate) fn interleaved_sums<F: Scalar, const G: usize>(
    len: usize,
    mut term: impl FnMut(usize, usize) -> F,
) -> [F; G] {
    let mut sums = [F::ZERO; G];
    for j in 0..len {
        for (g, sum) in sums.iter_mut().enumerate() {
            *sum += term(g, j);
        }
    }
    sums
}

macro_rules! impl_scalar {
    ($t:ty, $gemm:path, $gemm_bf16:path, $shared:expr, $exp:path, $tanh:path) => {
        impl Scalar for $t {
            const GEMM_BF16_SHARED: Option<GemmBf16Shared<Self>> = $shared;
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const MIN: Self = <$t>::MIN;
            #[inline(always)]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $tanh(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            unsafe fn gemm_raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                // SAFETY: forwarded contract; `Gemm::run` checked every index is in bounds.
                unsafe { $gemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
            }
            unsafe fn gemm_raw_bf16(
                kernel: super::gemm_bf16::Bf16Kernel,
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                // SAFETY: forwarded contract, as above.
                unsafe {
                    $gemm_bf16(
                        kernel, m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
                    )
                }
            }
        }
    };
}

/// f64 has no bf16 mode: the exact product (the reference stays the reference).
#[allow(clippy::too_many_arguments)]
unsafe fn dgemm_exact(
    _kernel: super::gemm_bf16::Bf16Kernel,
    m: usize,
    k: usize,
    n: usize,
    alpha: f64,
    a: *const f64,
    rsa: isize,
    csa: isize,
    b: *const f64,
    rsb: isize,
    csb: isize,
    beta: f64,
    c: *mut f64,
    rsc: isize,
    csc: isize,
) {
    // SAFETY: forwarded contract.
    unsafe { matrixmultiply::dgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
}

/// f32: this crate's AVX-512F or AVX2 + FMA GEMM where the CPU runs it, else `matrixmultiply`
/// ([`super::sgemm`]; `ZERO_SGEMM` forces one).
#[allow(clippy::too_many_arguments)]
unsafe fn sgemm_detected(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    rsa: isize,
    csa: isize,
    b: *const f32,
    rsb: isize,
    csb: isize,
    beta: f32,
    c: *mut f32,
    rsc: isize,
    csc: isize,
) {
    let kernel = super::sgemm::SgemmKernel::detect();
    // SAFETY: forwarded contract; `detect` returns a kernel this CPU runs.
    unsafe {
        super::sgemm::sgemm(
            kernel, m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
        )
    }
}

impl_scalar!(
    f32,
    sgemm_detected,
    super::gemm_bf16::sgemm_bf16,
    Some(super::gemm_bf16::sgemm_bf16_shared),
    exp_f32,
    tanh_f32
);
impl_scalar!(
    f64,
    matrixmultiply::dgemm,
    dgemm_exact,
    None,
    f64::exp,
    f64::tanh
);

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp_f32` as first written, with 2^n from `n as i32`.
    fn exp_f32_with_int_cast(x: f32) -> f32 {
        let x = x.clamp(-87.0, 88.0);
        let n = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
        let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
        let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
            * r
            + 1.666_666_5e-1)
            * r
            + 5e-1;
        let y = p * r * r + r + 1.0;
        y * f32::from_bits(((n as i32 + 127) << 23) as u32)
    }

    #[test]
    fn exp_builds_2_to_the_n_as_the_int_cast_did() {
        // Every 251st bit pattern (all classes: NaNs, infinities, subnormals) and every
        // 127th in [-1, 1], bit for bit, NaN payloads included.
        let strided = (0..=u32::MAX / 251).map(|i| i * 251);
        let near_zero = (0..0x3F80_0001u32)
            .step_by(127)
            .flat_map(|b| [b, b | 0x8000_0000]);
        for b in strided.chain(near_zero) {
            let x = f32::from_bits(b);
            let (got, want) = (exp_f32(x), exp_f32_with_int_cast(x));
            assert_eq!(got.to_bits(), want.to_bits(), "exp({x:e}) [{b:#x}]");
        }
    }

    #[test]
    fn fast_exp_and_tanh_match_libm() {
        let mut worst_exp = 0.0f64;
        let mut worst_tanh = 0.0f64;
        for i in -86_000..88_000 {
            let x = i as f32 * 1e-3;
            let want = (x as f64).exp();
            worst_exp = worst_exp.max(((exp_f32(x) as f64) - want).abs() / want);
            let u = x / 8.0;
            worst_tanh = worst_tanh.max(((tanh_f32(u) as f64) - (u as f64).tanh()).abs());
        }
        assert!(worst_exp < 5e-7, "exp relative error {worst_exp:e}");
        assert!(worst_tanh < 5e-7, "tanh absolute error {worst_tanh:e}");
        assert_eq!(tanh_f32(100.0), 1.0);
        assert_eq!(tanh_f32(-100.0), -1.0);
    }
}
