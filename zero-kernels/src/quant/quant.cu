// Block-wise symmetric int8 quantization on the GPU, the definition of
// zero-kernels/src/quant/reference.rs step for step, so the bits equal the CPU's:
// amax is an integer maximum of |x|'s bit patterns (exact in any order), the scale and the
// multiplier are one correctly rounded division each (__fdiv_rn), a code is
// clamp(x * inv) + 1.5 x 2^23 read back from its bits, a value q * s one __fmul_rn.
// One thread block per quantization block; its threads stride over the block's values.
#include "bits.cuh"

#define Q_MAX 127.0f
#define ROUNDER 12582912.0f

__device__ __forceinline__ signed char code_of(float x, float inv) {
    float v = __fadd_rn(fminf(fmaxf(__fmul_rn(x, inv), -Q_MAX), Q_MAX), ROUNDER);
    return (signed char)((int)__float_as_uint(v) - (int)__float_as_uint(ROUNDER));
}

template <typename T>
__device__ __forceinline__ void quantize_blocks(const T* x, signed char* q, float* scales,
                                                u64 n, u64 block) {
    __shared__ u32 amax_bits;
    for (u64 b = blockIdx.x; b * block < n; b += gridDim.x) {
        u64 start = b * block;
        u64 len = min(block, n - start);
        if (threadIdx.x == 0) amax_bits = 0;
        __syncthreads();
        u32 m = 0;
        for (u64 i = threadIdx.x; i < len; i += blockDim.x) {
            m = max(m, __float_as_uint(load(x, start + i)) & 0x7FFFFFFFu);
        }
        atomicMax(&amax_bits, m);
        __syncthreads();
        float amax = __uint_as_float(amax_bits);
        float inv = __fdiv_rn(Q_MAX, amax);
        // As reference::scale_of: non-finite blocks read back as NaN, tiny ones as zeros.
        bool finite = amax_bits < 0x7F800000u;
        bool zeros = finite && (amax_bits == 0 || __float_as_uint(inv) >= 0x7F800000u);
        for (u64 i = threadIdx.x; i < len; i += blockDim.x) {
            q[start + i] = (finite && !zeros) ? code_of(load(x, start + i), inv) : 0;
        }
        if (threadIdx.x == 0) {
            scales[b] = !finite ? __uint_as_float(0x7FC00000u)
                        : zeros ? 0.0f
                                : __fdiv_rn(amax, Q_MAX);
        }
        __syncthreads();
    }
}

template <typename T>
__device__ __forceinline__ void dequantize_values(const signed char* q, const float* scales,
                                                  T* out, u64 n, u64 block) {
    // A NaN scale (a block with a NaN or infinity) reads back as the one NaN the CPU
    // writes: the GPU's own product would be its canonical NaN, other bits.
    FOR_EACH(i, n) {
        float s = scales[i / block];
        store(out, i, isnan(s) ? __uint_as_float(0x7FC00000u) : __fmul_rn((float)q[i], s));
    }
}

extern "C" __global__ void quantize_f32(const F32* x, signed char* q, float* s, u64 n, u64 block) {
    quantize_blocks(x, q, s, n, block);
}
extern "C" __global__ void quantize_bf16(const BF16* x, signed char* q, float* s, u64 n, u64 block) {
    quantize_blocks(x, q, s, n, block);
}
extern "C" __global__ void dequantize_f32(const signed char* q, const float* s, F32* out, u64 n, u64 block) {
    dequantize_values(q, s, out, n, block);
}
extern "C" __global__ void dequantize_bf16(const signed char* q, const float* s, BF16* out, u64 n, u64 block) {
    dequantize_values(q, s, out, n, block);
}
