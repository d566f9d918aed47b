// Block-wise symmetric int8 and int4 quantization on the GPU, the definition of
// zero-kernels/src/quant/reference.rs step for step, so the bits equal the CPU's:
// amax is an integer maximum of |x|'s bit patterns (exact in any order), the scale and the
// multiplier are one correctly rounded division each (__fdiv_rn), a code is
// clamp(x * inv) + 1.5 x 2^23 read back from its bits, a value q * s one __fmul_rn.
// One thread block per quantization block; its threads stride over the block's values.
#include "bits.cuh"

#define Q_MAX 127.0f
#define Q4_MAX 7.0f
#define ROUNDER 12582912.0f
#define CANONICAL_NAN 0x7FC00000u

// reference::code_for: clamp(round_half_even(x inv), -q_max, q_max).
__device__ __forceinline__ int code_of(float x, float inv, float q_max) {
    float v = __fadd_rn(fminf(fmaxf(__fmul_rn(x, inv), -q_max), q_max), ROUNDER);
    return (int)__float_as_uint(v) - (int)__float_as_uint(ROUNDER);
}

__device__ __forceinline__ u32 abs_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

// reference::scale_for: the block's scale; *inv gets q_max / amax and *codes whether the
// values get codes (false: the block is sent as zeros with scale 0 or NaN).
__device__ __forceinline__ float scale_for(u32 amax_bits, float q_max, float* inv, bool* codes) {
    float amax = __uint_as_float(amax_bits);
    *inv = __fdiv_rn(q_max, amax);
    // Non-finite blocks read back as NaN, those whose q_max / amax overflows as zeros.
    bool finite = amax_bits < 0x7F800000u;
    bool zeros = finite && (amax_bits == 0 || __float_as_uint(*inv) >= 0x7F800000u);
    *codes = finite && !zeros;
    return !finite ? __uint_as_float(CANONICAL_NAN) : zeros ? 0.0f : __fdiv_rn(amax, q_max);
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
            m = max(m, abs_bits(load(x, start + i)));
        }
        atomicMax(&amax_bits, m);
        __syncthreads();
        float inv;
        bool codes;
        float scale = scale_for(amax_bits, Q_MAX, &inv, &codes);
        for (u64 i = threadIdx.x; i < len; i += blockDim.x) {
            q[start + i] = codes ? (signed char)code_of(load(x, start + i), inv, Q_MAX) : 0;
        }
        if (threadIdx.x == 0) scales[b] = scale;
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
        store(out, i, isnan(s) ? __uint_as_float(CANONICAL_NAN) : __fmul_rn((float)q[i], s));
    }
}

// Int4 (reference.rs, int4 section): a block holds an even number of values (checked by
// the launcher), so block b's codes start at byte b * block / 2. Thread t of the block owns
// bytes t, t + blockDim.x, .. (values 2j, 2j + 1 of byte j: low nibble first); the
// block maximum as above, then each thread packs its bytes. Twin: src/twin/quant.rs.
template <typename T>
__device__ __forceinline__ void quantize_int4_blocks(const T* x, unsigned char* c, float* scales,
                                                     u64 n, u64 block) {
    __shared__ u32 amax_bits;
    for (u64 b = blockIdx.x; b * block < n; b += gridDim.x) {
        u64 start = b * block;
        u64 len = min(block, n - start);
        u64 bytes = (len + 1) / 2;
        if (threadIdx.x == 0) amax_bits = 0;
        __syncthreads();
        u32 m = 0;
        for (u64 j = threadIdx.x; j < bytes; j += blockDim.x) {
            m = max(m, abs_bits(load(x, start + 2 * j)));
            if (2 * j + 1 < len) m = max(m, abs_bits(load(x, start + 2 * j + 1)));
        }
        atomicMax(&amax_bits, m);
        __syncthreads();
        float inv;
        bool codes;
        float scale = scale_for(amax_bits, Q4_MAX, &inv, &codes);
        for (u64 j = threadIdx.x; j < bytes; j += blockDim.x) {
            u32 lo = 0, hi = 0;  // an odd count's last high nibble stays 0
            if (codes) {
                lo = (u32)code_of(load(x, start + 2 * j), inv, Q4_MAX) & 0xFu;
                if (2 * j + 1 < len) hi = (u32)code_of(load(x, start + 2 * j + 1), inv, Q4_MAX) & 0xFu;
            }
            c[start / 2 + j] = (unsigned char)(lo | (hi << 4));
        }
        if (threadIdx.x == 0) scales[b] = scale;
        __syncthreads();
    }
}

template <typename T>
__device__ __forceinline__ void dequantize_int4_values(const unsigned char* c, const float* scales,
                                                       T* out, u64 n, u64 block) {
    FOR_EACH(i, n) {
        float s = scales[i / block];
        // The nibble moved to the top of an int, then an arithmetic shift sign-extends it.
        int code = ((int)((u32)c[i / 2] << (28 - 4 * (u32)(i & 1)))) >> 28;
        store(out, i, isnan(s) ? __uint_as_float(CANONICAL_NAN) : __fmul_rn((float)code, s));
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
extern "C" __global__ void quantize_int4_f32(const F32* x, unsigned char* c, float* s, u64 n, u64 block) {
    quantize_int4_blocks(x, c, s, n, block);
}
extern "C" __global__ void quantize_int4_bf16(const BF16* x, unsigned char* c, float* s, u64 n, u64 block) {
    quantize_int4_blocks(x, c, s, n, block);
}
extern "C" __global__ void dequantize_int4_f32(const unsigned char* c, const float* s, F32* out, u64 n, u64 block) {
    dequantize_int4_values(c, s, out, n, block);
}
extern "C" __global__ void dequantize_int4_bf16(const unsigned char* c, const float* s, BF16* out, u64 n, u64 block) {
    dequantize_int4_values(c, s, out, n, block);
}
