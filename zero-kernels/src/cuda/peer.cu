// Rank-order reductions over the ranks' device buffers, for thread ranks sharing one GPU
// (zero-comm's LocalComm): bit for bit the host fold of zero-comm/src/local/reduce.rs.
// The Rust twin of every function here is zero-kernels/src/cuda/peer.rs (`twin`); keep
// the two in step.
//
// Each thread owns whole elements: for element i it computes
//     acc = first(x_0[off + i]); acc = step(acc, x_r[off + i]) for r = 1 .. k-1;
//     dst[i] = finish(acc)
// so the order of the operations never depends on the launch shape. Floats travel as
// their bits and are compared or added explicitly, so nothing canonicalises a NaN:
// - sums: IEEE addition with the host's defined NaN: a NaN operand comes back quieted,
//   the accumulator's (the lowest rank's) first; an invalid sum (inf - inf) is the
//   canonical quiet NaN. The GPU's own add would return 0x7FFFFFFF for every NaN;
// - max: the first maximal value in rank order, a NaN beats every number and the lowest
//   rank's NaN is kept unchanged.
#include "bits.cuh"

typedef unsigned char u8;

// Addition of two f32 bit patterns with the NaN of the header.
__device__ __forceinline__ u32 add_f32(u32 a, u32 b) {
    float fa = __uint_as_float(a), fb = __uint_as_float(b);
    if (fa != fa) return a | 0x00400000u;
    if (fb != fb) return b | 0x00400000u;
    float s = __fadd_rn(fa, fb);
    if (s != s) return 0x7FC00000u;
    return __float_as_uint(s);
}

__device__ __forceinline__ u64 add_f64(u64 a, u64 b) {
    double fa = __longlong_as_double((long long)a), fb = __longlong_as_double((long long)b);
    if (fa != fa) return a | 0x0008000000000000ull;
    if (fb != fb) return b | 0x0008000000000000ull;
    double s = __dadd_rn(fa, fb);
    if (s != s) return 0x7FF8000000000000ull;
    return (u64)__double_as_longlong(s);
}

// NaN first, then the first maximum in rank order (x wins only when strictly greater).
__device__ __forceinline__ u32 max_f32(u32 a, u32 b) {
    float fa = __uint_as_float(a), fb = __uint_as_float(b);
    if (fa != fa) return a;
    return (fb != fb || fb > fa) ? b : a;
}

__device__ __forceinline__ u64 max_f64(u64 a, u64 b) {
    double fa = __longlong_as_double((long long)a), fb = __longlong_as_double((long long)b);
    if (fa != fa) return a;
    return (fb != fb || fb > fa) ? b : a;
}

// The half types: NaN test on the bits, comparison through f32 (exact for every half).
__device__ __forceinline__ bool bf16_nan(u16 h) { return (h & 0x7FFFu) > 0x7F80u; }
__device__ __forceinline__ bool f16_nan(u16 h) { return (h & 0x7FFFu) > 0x7C00u; }

// One reduction: the accumulator type, how an input starts and joins it, how it ends.
struct SumF32 {
    typedef u32 T; typedef u32 Acc;
    static __device__ __forceinline__ Acc first(T x) { return x; }
    static __device__ __forceinline__ Acc step(Acc a, T x) { return add_f32(a, x); }
    static __device__ __forceinline__ T finish(Acc a) { return a; }
};
struct SumF64 {
    typedef u64 T; typedef u64 Acc;
    static __device__ __forceinline__ Acc first(T x) { return x; }
    static __device__ __forceinline__ Acc step(Acc a, T x) { return add_f64(a, x); }
    static __device__ __forceinline__ T finish(Acc a) { return a; }
};
// HalfSum::Op: every step widens both, adds in f32 and rounds back (nearest even).
struct SumBF16 {
    typedef u16 T; typedef u16 Acc;
    static __device__ __forceinline__ Acc first(T x) { return x; }
    static __device__ __forceinline__ Acc step(Acc a, T x) {
        return f32_to_bf16(__uint_as_float(add_f32(__float_as_uint(bf16_to_f32(a)), __float_as_uint(bf16_to_f32(x)))));
    }
    static __device__ __forceinline__ T finish(Acc a) { return a; }
};
struct SumF16 {
    typedef u16 T; typedef u16 Acc;
    static __device__ __forceinline__ Acc first(T x) { return x; }
    static __device__ __forceinline__ Acc step(Acc a, T x) {
        return f32_to_f16(__uint_as_float(add_f32(__float_as_uint(f16_to_f32(a)), __float_as_uint(f16_to_f32(x)))));
    }
    static __device__ __forceinline__ T finish(Acc a) { return a; }
};
// HalfSum::Upcast: sum in f32 in rank order, round once.
struct UpcastBF16 {
    typedef u16 T; typedef u32 Acc;
    static __device__ __forceinline__ Acc first(T x) { return __float_as_uint(bf16_to_f32(x)); }
    static __device__ __forceinline__ Acc step(Acc a, T x) { return add_f32(a, __float_as_uint(bf16_to_f32(x))); }
    static __device__ __forceinline__ T finish(Acc a) { return f32_to_bf16(__uint_as_float(a)); }
};
struct UpcastF16 {
    typedef u16 T; typedef u32 Acc;
    static __device__ __forceinline__ Acc first(T x) { return __float_as_uint(f16_to_f32(x)); }
    static __device__ __forceinline__ Acc step(Acc a, T x) { return add_f32(a, __float_as_uint(f16_to_f32(x))); }
    static __device__ __forceinline__ T finish(Acc a) { return f32_to_f16(__uint_as_float(a)); }
};
// Integer sums wrap (two's complement): unsigned arithmetic gives the bits of both.
template <typename U>
struct SumInt {
    typedef U T; typedef U Acc;
    static __device__ __forceinline__ Acc first(T x) { return x; }
    static __device__ __forceinline__ Acc step(Acc a, T x) { return (U)(a + x); }
    static __device__ __forceinline__ T finish(Acc a) { return a; }
};
struct MaxF32 {
    typedef u32 T; typedef u32 Acc;
    static __device__ __forceinline__ Acc first(T x) { return x; }
    static __device__ __forceinline__ Acc step(Acc a, T x) { return max_f32(a, x); }
    static __device__ __forceinline__ T finish(Acc a) { return a; }
};
struct MaxF64 {
    typedef u64 T; typedef u64 Acc;
    static __device__ __forceinline__ Acc first(T x) { return x; }
    static __device__ __forceinline__ Acc step(Acc a, T x) { return max_f64(a, x); }
    static __device__ __forceinline__ T finish(Acc a) { return a; }
};
struct MaxBF16 {
    typedef u16 T; typedef u16 Acc;
    static __device__ __forceinline__ Acc first(T x) { return x; }
    static __device__ __forceinline__ Acc step(Acc a, T x) {
        if (bf16_nan(a)) return a;
        return (bf16_nan(x) || bf16_to_f32(x) > bf16_to_f32(a)) ? x : a;
    }
    static __device__ __forceinline__ T finish(Acc a) { return a; }
};
struct MaxF16 {
    typedef u16 T; typedef u16 Acc;
    static __device__ __forceinline__ Acc first(T x) { return x; }
    static __device__ __forceinline__ Acc step(Acc a, T x) {
        if (f16_nan(a)) return a;
        return (f16_nan(x) || f16_to_f32(x) > f16_to_f32(a)) ? x : a;
    }
    static __device__ __forceinline__ T finish(Acc a) { return a; }
};
template <typename I>
struct MaxInt {
    typedef I T; typedef I Acc;
    static __device__ __forceinline__ Acc first(T x) { return x; }
    static __device__ __forceinline__ Acc step(Acc a, T x) { return x > a ? x : a; }
    static __device__ __forceinline__ T finish(Acc a) { return a; }
};

// dst[i] = fold over r of ((const T*)src[r])[off + i], i < n; src holds k >= 1 addresses.
template <typename Op>
__device__ __forceinline__ void fold(typename Op::T* dst, const u64* src, u32 k, u64 off, u64 n) {
    typedef typename Op::T T;
    FOR_EACH(i, n) {
        typename Op::Acc acc = Op::first(((const T*)src[0])[off + i]);
        for (u32 r = 1; r < k; ++r) acc = Op::step(acc, ((const T*)src[r])[off + i]);
        dst[i] = Op::finish(acc);
    }
}

#define FOLD(name, Op) \
    extern "C" __global__ void name(Op::T* d, const u64* s, u32 k, u64 off, u64 n) { fold<Op>(d, s, k, off, n); }

FOLD(fold_sum_f32, SumF32)
FOLD(fold_sum_f64, SumF64)
FOLD(fold_sum_bf16, SumBF16)
FOLD(fold_sum_f16, SumF16)
FOLD(fold_sum_upcast_bf16, UpcastBF16)
FOLD(fold_sum_upcast_f16, UpcastF16)
FOLD(fold_sum_u8, SumInt<u8>)
FOLD(fold_sum_u32, SumInt<u32>)
FOLD(fold_sum_i32, SumInt<u32>)
FOLD(fold_sum_i64, SumInt<u64>)
FOLD(fold_max_f32, MaxF32)
FOLD(fold_max_f64, MaxF64)
FOLD(fold_max_bf16, MaxBF16)
FOLD(fold_max_f16, MaxF16)
FOLD(fold_max_u8, MaxInt<u8>)
FOLD(fold_max_u32, MaxInt<u32>)
FOLD(fold_max_i32, MaxInt<int>)
FOLD(fold_max_i64, MaxInt<long long>)
