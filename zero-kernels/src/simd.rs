//! The vector vocabulary every CPU kernel body is written in, once, generically: `Simd` is
//! implemented by `Scalar` (1 lane), `V3` (AVX2+FMA+F16C, 8 f32 lanes) and `V4` (AVX-512,
//! 16 lanes). A kernel body is an `#[inline(always)]` generic function; a thin
//! `#[target_feature]` wrapper per level instantiates it, so LLVM compiles the body with
//! that level's instructions (the pattern of pulp/gemm), chosen at run time.
//!
//! Why every level gives the same bits: each lane runs the same IEEE-754 operations in the
//! same order as the scalar code (add, sub, mul, div, sqrt are correctly rounded in SSE,
//! AVX and AVX-512 alike), and no level uses fused multiply-add: a scalar fallback without
//! FMA hardware would need a slow software `fma`, and the kernels are memory-bound, so
//! separate multiply and add cost nothing measurable. 16-bit conversions follow the bit
//! recipes of `cast::reference` exactly (hardware `vcvtps2ph`/`vcvtph2ps` for f16, which
//! implement the same rules; integer rounding for bf16).
//!
//! One exception: which NaN payload an arithmetic operation returns. Rust (LLVM) may
//! commute the operands of an add or multiply, so a NaN result is NaN on every path but
//! its payload bits are unspecified; the tests compare "bitwise, any NaN equals any NaN".
//! Pure conversions (the `cast` module) keep NaN payloads exactly.

use crate::cast::reference as cref;
use crate::float::Float;
use crate::isa::{Exec, Isa};
use half::{bf16, f16};

/// One instruction-set level: a vector of `LANES` f32 and its operations. All functions are
/// `unsafe`: the caller must run on a CPU with the level's features and pass pointers valid
/// for `LANES` elements.
pub(crate) trait Simd: Copy {
    /// f32 lanes per vector.
    const LANES: usize;
    /// A vector of `LANES` f32.
    type F: Copy;
    /// 16 f64 accumulator lanes (sum of squares), lane `l` holding the elements `i` with
    /// `i % 16 == l` of a block.
    type Acc: Copy;

    unsafe fn splat(x: f32) -> Self::F;
    unsafe fn load(p: *const f32) -> Self::F;
    unsafe fn store(p: *mut f32, v: Self::F);
    unsafe fn load_bf16(p: *const u16) -> Self::F;
    unsafe fn load_f16(p: *const u16) -> Self::F;
    unsafe fn store_bf16(p: *mut u16, v: Self::F);
    unsafe fn store_f16(p: *mut u16, v: Self::F);
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn sub(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn div(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn sqrt(a: Self::F) -> Self::F;

    unsafe fn acc_zero() -> Self::Acc;
    /// `acc[base + l] += f64(x[l])^2` for each lane `l` (the square of an f32 is exact in
    /// f64: 24 + 24 significand bits < 53). `base` is a multiple of `LANES` below 16.
    unsafe fn acc_sq(acc: Self::Acc, x: Self::F, base: usize) -> Self::Acc;
    unsafe fn acc_to_array(acc: Self::Acc) -> [f64; 16];
}

/// A float element type a kernel reads or writes: f32, bf16 or f16 ([`Float`] gives the
/// scalar conversions; this adds the vector loads and stores).
pub(crate) trait SimdFloat: Float + Copy + Send + Sync + 'static {
    /// # Safety
    /// `p` valid for `S::LANES` reads, CPU has `S`'s features.
    unsafe fn load<S: Simd>(p: *const Self) -> S::F;
    /// # Safety
    /// `p` valid for `S::LANES` writes, CPU has `S`'s features.
    unsafe fn store<S: Simd>(p: *mut Self, v: S::F);
}

impl SimdFloat for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::F {
        S::load(p)
    }
    #[inline(always)]
    unsafe fn store<S: Simd>(p: *mut Self, v: S::F) {
        S::store(p, v)
    }
}

impl SimdFloat for bf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::F {
        S::load_bf16(p as *const u16)
    }
    #[inline(always)]
    unsafe fn store<S: Simd>(p: *mut Self, v: S::F) {
        S::store_bf16(p as *mut u16, v)
    }
}

impl SimdFloat for f16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::F {
        S::load_f16(p as *const u16)
    }
    #[inline(always)]
    unsafe fn store<S: Simd>(p: *mut Self, v: S::F) {
        S::store_f16(p as *mut u16, v)
    }
}

/// Where a kernel may write a rounded copy of its f32 result: a 16-bit buffer, or nowhere.
pub(crate) trait Sink: Copy + Send + Sync + 'static {
    /// # Safety
    /// As [`SimdFloat::store`].
    unsafe fn put<S: Simd>(p: *mut Self, v: S::F);
    /// # Safety
    /// `p` valid for one write (ignored by `NoSink`).
    unsafe fn put1(p: *mut Self, x: f32);
}

impl<T: SimdFloat> Sink for T {
    #[inline(always)]
    unsafe fn put<S: Simd>(p: *mut Self, v: S::F) {
        T::store::<S>(p, v)
    }
    #[inline(always)]
    unsafe fn put1(p: *mut Self, x: f32) {
        *p = T::from_f32(x)
    }
}

/// No 16-bit copy (pure fp32 training): the writes vanish at compile time.
#[derive(Clone, Copy)]
pub(crate) struct NoSink;

impl NoSink {
    /// A pointer that is never dereferenced (zero-sized type).
    pub(crate) fn ptr() -> *mut NoSink {
        std::ptr::NonNull::<NoSink>::dangling().as_ptr()
    }
}

// `NoSink` is not `SimdFloat`, so this impl does not overlap the blanket one.
impl Sink for NoSink {
    #[inline(always)]
    unsafe fn put<S: Simd>(_p: *mut Self, _v: S::F) {}
    #[inline(always)]
    unsafe fn put1(_p: *mut Self, _x: f32) {}
}

/// Fixed-order reduction of the 16 accumulator lanes: halve the width each step
/// (`a[l] += a[l + w]` for w = 8, 4, 2, 1), the order in which SIMD registers fold.
#[inline(always)]
pub(crate) fn reduce16(mut a: [f64; 16]) -> f64 {
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            a[l] += a[l + w];
        }
        w /= 2;
    }
    a[0]
}

/// The portable level: one lane, plain Rust floats.
#[derive(Clone, Copy)]
pub(crate) struct Scalar;

impl Simd for Scalar {
    const LANES: usize = 1;
    type F = f32;
    type Acc = [f64; 16];

    #[inline(always)]
    unsafe fn splat(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> f32 {
        *p
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: f32) {
        *p = v
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> f32 {
        cref::bf16_bits_to_f32(*p)
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> f32 {
        cref::f16_bits_to_f32(*p)
    }
    #[inline(always)]
    unsafe fn store_bf16(p: *mut u16, v: f32) {
        *p = cref::f32_to_bf16_bits(v)
    }
    #[inline(always)]
    unsafe fn store_f16(p: *mut u16, v: f32) {
        *p = cref::f32_to_f16_bits(v)
    }
    #[inline(always)]
    unsafe fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    unsafe fn sub(a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    unsafe fn mul(a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    unsafe fn div(a: f32, b: f32) -> f32 {
        a / b
    }
    #[inline(always)]
    unsafe fn sqrt(a: f32) -> f32 {
        a.sqrt()
    }
    #[inline(always)]
    unsafe fn acc_zero() -> [f64; 16] {
        [0.0; 16]
    }
    #[inline(always)]
    unsafe fn acc_sq(mut acc: [f64; 16], x: f32, base: usize) -> [f64; 16] {
        let d = x as f64;
        acc[base] += d * d;
        acc
    }
    #[inline(always)]
    unsafe fn acc_to_array(acc: [f64; 16]) -> [f64; 16] {
        acc
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{bf16_bits_v3, V3, V4};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Simd;
    use std::arch::x86_64::*;

    /// bf16 rounding of 8/16 f32 bit patterns held as i32 lanes: (b + 0x7FFF + ((b >> 16) & 1)) >> 16,
    /// NaN lanes replaced by (b >> 16) | 0x40 — the recipe of `f32_to_bf16_bits`.
    macro_rules! bf16_round {
        ($bits:expr, $add:ident, $and:ident, $srli:ident, $set1:ident) => {{
            let b = $bits;
            let lsb = $and($srli::<16>(b), $set1(1));
            $srli::<16>($add($add(b, $set1(0x7FFF)), lsb))
        }};
    }

    /// The bf16 bits of 8 f32 (nearest even, NaN quieted: `f32_to_bf16_bits`), one per
    /// 32-bit lane (values below 2^16). Also the AVX2 GEMM's rounding of bf16 operands
    /// (`nn/sgemm_avx2.rs`).
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    pub(crate) unsafe fn bf16_bits_v3(v: __m256) -> __m256i {
        let b = _mm256_castps_si256(v);
        let rounded = bf16_round!(
            b,
            _mm256_add_epi32,
            _mm256_and_si256,
            _mm256_srli_epi32,
            _mm256_set1_epi32
        );
        let nan = _mm256_or_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(0x40));
        let is_nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        _mm256_blendv_epi8(rounded, nan, is_nan)
    }

    /// AVX2 + FMA + F16C ("x86-64-v3"): 8 f32 lanes.
    #[derive(Clone, Copy)]
    pub(crate) struct V3;

    impl Simd for V3 {
        const LANES: usize = 8;
        type F = __m256;
        type Acc = [__m256d; 4];

        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            _mm256_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            _mm256_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> __m256 {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        }
        #[inline(always)]
        unsafe fn store_bf16(p: *mut u16, v: __m256) {
            let r = bf16_bits_v3(v);
            // Lanes hold values < 2^16, so unsigned saturation is exact; packus works per
            // 128-bit half, the permute puts the two halves' results side by side.
            let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(r, r));
            _mm_storeu_si128(p as *mut __m128i, _mm256_castsi256_si128(packed));
        }
        #[inline(always)]
        unsafe fn store_f16(p: *mut u16, v: __m256) {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(p as *mut __m128i, h);
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            _mm256_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn sub(a: __m256, b: __m256) -> __m256 {
            _mm256_sub_ps(a, b)
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            _mm256_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn div(a: __m256, b: __m256) -> __m256 {
            _mm256_div_ps(a, b)
        }
        #[inline(always)]
        unsafe fn sqrt(a: __m256) -> __m256 {
            _mm256_sqrt_ps(a)
        }
        #[inline(always)]
        unsafe fn acc_zero() -> [__m256d; 4] {
            [_mm256_setzero_pd(); 4]
        }
        #[inline(always)]
        unsafe fn acc_sq(mut acc: [__m256d; 4], x: __m256, base: usize) -> [__m256d; 4] {
            // Registers hold lanes 0-3, 4-7, 8-11, 12-15; `base` is 0 or 8.
            let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
            let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x));
            let k = base / 4;
            acc[k] = _mm256_add_pd(acc[k], _mm256_mul_pd(lo, lo));
            acc[k + 1] = _mm256_add_pd(acc[k + 1], _mm256_mul_pd(hi, hi));
            acc
        }
        #[inline(always)]
        unsafe fn acc_to_array(acc: [__m256d; 4]) -> [f64; 16] {
            let mut out = [0.0f64; 16];
            for (k, a) in acc.iter().enumerate() {
                _mm256_storeu_pd(out.as_mut_ptr().add(4 * k), *a);
            }
            out
        }
    }

    /// AVX-512 F/BW/DQ/VL ("x86-64-v4"): 16 f32 lanes.
    #[derive(Clone, Copy)]
    pub(crate) struct V4;

    impl Simd for V4 {
        const LANES: usize = 16;
        type F = __m512;
        type Acc = [__m512d; 2];

        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            _mm512_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            _mm512_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> __m512 {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> __m512 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
        }
        #[inline(always)]
        unsafe fn store_bf16(p: *mut u16, v: __m512) {
            let b = _mm512_castps_si512(v);
            let rounded = bf16_round!(
                b,
                _mm512_add_epi32,
                _mm512_and_si512,
                _mm512_srli_epi32,
                _mm512_set1_epi32
            );
            let nan = _mm512_or_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(0x40));
            let is_nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            let r = _mm512_mask_blend_epi32(is_nan, rounded, nan);
            _mm256_storeu_si256(p as *mut __m256i, _mm512_cvtepi32_epi16(r));
        }
        #[inline(always)]
        unsafe fn store_f16(p: *mut u16, v: __m512) {
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm256_storeu_si256(p as *mut __m256i, h);
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            _mm512_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn sub(a: __m512, b: __m512) -> __m512 {
            _mm512_sub_ps(a, b)
        }
        #[inline(always)]
        unsafe fn mul(a: __m512, b: __m512) -> __m512 {
            _mm512_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn div(a: __m512, b: __m512) -> __m512 {
            _mm512_div_ps(a, b)
        }
        #[inline(always)]
        unsafe fn sqrt(a: __m512) -> __m512 {
            _mm512_sqrt_ps(a)
        }
        #[inline(always)]
        unsafe fn acc_zero() -> [__m512d; 2] {
            [_mm512_setzero_pd(); 2]
        }
        #[inline(always)]
        unsafe fn acc_sq(acc: [__m512d; 2], x: __m512, _base: usize) -> [__m512d; 2] {
            // One vector is all 16 lanes: lanes 0-7 in acc[0], 8-15 in acc[1].
            let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
            let hi_bits = _mm512_extracti64x4_epi64::<1>(_mm512_castps_si512(x));
            let hi = _mm512_cvtps_pd(_mm256_castsi256_ps(hi_bits));
            [
                _mm512_add_pd(acc[0], _mm512_mul_pd(lo, lo)),
                _mm512_add_pd(acc[1], _mm512_mul_pd(hi, hi)),
            ]
        }
        #[inline(always)]
        unsafe fn acc_to_array(acc: [__m512d; 2]) -> [f64; 16] {
            let mut out = [0.0f64; 16];
            _mm512_storeu_pd(out.as_mut_ptr(), acc[0]);
            _mm512_storeu_pd(out.as_mut_ptr().add(8), acc[1]);
            out
        }
    }
}

/// A kernel body, written once over `S: Simd`. Implementations hold their pointers and
/// constants and mark `run` `#[inline(always)]`, so it is compiled inside the
/// `#[target_feature]` function of each level.
pub(crate) trait Kernel {
    /// What the kernel returns.
    type Out;
    /// # Safety
    /// The CPU has `S`'s features; the kernel's pointers are valid for its length.
    unsafe fn run<S: Simd>(self) -> Self::Out;
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_v3<K: Kernel>(k: K) -> K::Out {
    k.run::<V3>()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn run_v4<K: Kernel>(k: K) -> K::Out {
    k.run::<V4>()
}

/// A kernel body of safe code over borrowed slices, written in plain Rust (no `Simd`
/// vocabulary): compiled inside each level's `#[target_feature]` wrapper, LLVM
/// auto-vectorises its loops with that level's instructions. Rust neither contracts
/// `a * b + c` into a fused multiply-add nor reassociates float sums, so every level gives
/// the bits of the baseline build (reductions stay scalar loops, in index order).
/// Implementations mark `run` `#[inline(always)]` and call `#[inline(always)]` bodies, so
/// the whole body lands in the wrapper.
pub(crate) trait AutoKernel {
    /// What the kernel returns.
    type Out;
    /// The body (safe: the kernel holds only borrowed slices).
    fn run(self) -> Self::Out;
}

/// Adapts an [`AutoKernel`] to [`Kernel`] (it ignores the vector type).
struct Auto<K>(K);

impl<K: AutoKernel> Kernel for Auto<K> {
    type Out = K::Out;
    #[inline(always)]
    unsafe fn run<S: Simd>(self) -> K::Out {
        self.0.run()
    }
}

/// Run `k` compiled for `exec`'s level.
pub(crate) fn run_auto<K: AutoKernel>(exec: &Exec, k: K) -> K::Out {
    // SAFETY: an `Exec` only holds a level this CPU has (`Exec::with_isa` checks it), and
    // an `AutoKernel` holds borrowed slices, no raw pointers.
    unsafe { dispatch(exec.isa(), Auto(k)) }
}

/// Run `k` at level `isa`.
///
/// # Safety
/// `isa` is available on this CPU (an `Exec` guarantees it) and `k`'s pointers are valid.
#[inline]
pub(crate) unsafe fn dispatch<K: Kernel>(isa: Isa, k: K) -> K::Out {
    match isa {
        Isa::Scalar => k.run::<Scalar>(),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => run_v3(k),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => run_v4(k),
        #[cfg(not(target_arch = "x86_64"))]
        _ => k.run::<Scalar>(),
    }
}
