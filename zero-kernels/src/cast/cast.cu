// Casts and accumulation on the GPU, the recipes of zero-kernels/src/cast/reference.rs
// (bits.cuh): results equal the CPU's bit for bit.
#include "bits.cuh"

template <typename A, typename B>
__device__ __forceinline__ void convert(const A* src, B* dst, u64 n) {
    FOR_EACH(i, n) { store(dst, i, load(src, i)); }
}

// dst = round(dst + src) in dst's type: f32 gradient accumulation (one f32 rounding), or
// into a 16-bit buffer (`accumulate_rounded` in zero-kernels/src/cast/mod.rs).
template <typename D, typename S>
__device__ __forceinline__ void accumulate(D* dst, const S* src, u64 n) {
    FOR_EACH(i, n) { store(dst, i, __fadd_rn(load(dst, i), load(src, i))); }
}

extern "C" __global__ void narrow_bf16(const F32* s, BF16* d, u64 n) { convert(s, d, n); }
extern "C" __global__ void narrow_f16(const F32* s, F16* d, u64 n) { convert(s, d, n); }
extern "C" __global__ void widen_bf16(const BF16* s, F32* d, u64 n) { convert(s, d, n); }
extern "C" __global__ void widen_f16(const F16* s, F32* d, u64 n) { convert(s, d, n); }
extern "C" __global__ void accumulate_f32_f32(F32* d, const F32* s, u64 n) { accumulate(d, s, n); }
extern "C" __global__ void accumulate_f32_bf16(F32* d, const BF16* s, u64 n) { accumulate(d, s, n); }
extern "C" __global__ void accumulate_f32_f16(F32* d, const F16* s, u64 n) { accumulate(d, s, n); }
extern "C" __global__ void accumulate_bf16_f32(BF16* d, const F32* s, u64 n) { accumulate(d, s, n); }
extern "C" __global__ void accumulate_bf16_bf16(BF16* d, const BF16* s, u64 n) { accumulate(d, s, n); }
extern "C" __global__ void accumulate_bf16_f16(BF16* d, const F16* s, u64 n) { accumulate(d, s, n); }
extern "C" __global__ void accumulate_f16_f32(F16* d, const F32* s, u64 n) { accumulate(d, s, n); }
extern "C" __global__ void accumulate_f16_bf16(F16* d, const BF16* s, u64 n) { accumulate(d, s, n); }
extern "C" __global__ void accumulate_f16_f16(F16* d, const F16* s, u64 n) { accumulate(d, s, n); }
