// Casts and accumulation on the GPU, the recipes of zero-kernels/src/cast/reference.rs
// (bits.cuh): results equal the CPU's bit for bit.
#include "bits.cuh"

template <typename A, typename B>
__device__ __forceinline__ void convert(const A* src, B* dst, u64 n) {
    FOR_EACH(i, n) { store(dst, i, load(src, i)); }
}

template <typename A>
__device__ __forceinline__ void accumulate(float* dst, const A* src, u64 n) {
    FOR_EACH(i, n) { dst[i] = __fadd_rn(dst[i], load(src, i)); }
}

extern "C" __global__ void narrow_bf16(const F32* s, BF16* d, u64 n) { convert(s, d, n); }
extern "C" __global__ void narrow_f16(const F32* s, F16* d, u64 n) { convert(s, d, n); }
extern "C" __global__ void widen_bf16(const BF16* s, F32* d, u64 n) { convert(s, d, n); }
extern "C" __global__ void widen_f16(const F16* s, F32* d, u64 n) { convert(s, d, n); }
extern "C" __global__ void accumulate_f32(float* d, const F32* s, u64 n) { accumulate(d, s, n); }
extern "C" __global__ void accumulate_bf16(float* d, const BF16* s, u64 n) { accumulate(d, s, n); }
extern "C" __global__ void accumulate_f16(float* d, const F16* s, u64 n) { accumulate(d, s, n); }
