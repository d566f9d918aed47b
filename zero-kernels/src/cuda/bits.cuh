// Shared by every zero-kernels .cu file: the 16-bit float conversions and IEEE arithmetic,
// bit for bit the recipes of zero-kernels/src/cast/reference.rs (round to nearest even,
// subnormals kept, overflow to inf, NaN quieted with its payload's top bits). Integer code
// rather than cvt instructions, so that NaN payloads match the CPU too. All float math goes
// through the _rn intrinsics: never contracted into FMA, IEEE rounding, no flush to zero
// (the PTX is generated with --fmad=false --ftz=false --prec-div=true --prec-sqrt=true).
#pragma once

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Tag types naming the element type of a buffer in templates.
struct F32 { float x; };
struct BF16 { u16 b; };
struct F16 { u16 b; };
struct NoOut { char unused; };

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u32 b = __float_as_uint(x);
    if (x != x) return (u16)((b >> 16) | 0x40u);
    return (u16)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
    u32 sign = ((u32)(h & 0x8000u)) << 16;
    u32 exp = (h >> 10) & 0x1Fu;
    u32 man = h & 0x3FFu;
    if (exp == 0x1Fu) return __uint_as_float(man == 0 ? (sign | 0x7F800000u) : (sign | 0x7FC00000u | (man << 13)));
    if (exp == 0) {
        float mag = __fmul_rn((float)man, 5.9604644775390625e-8f);  // man * 2^-24, exact
        return sign ? -mag : mag;
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

__device__ __forceinline__ u16 f32_to_f16(float x) {
    u32 b = __float_as_uint(x);
    u16 sign = (u16)((b >> 16) & 0x8000u);
    u32 exp = (b >> 23) & 0xFFu;
    u32 man = b & 0x7FFFFFu;
    if (exp == 0xFFu) return man == 0 ? (u16)(sign | 0x7C00u) : (u16)(sign | 0x7E00u | (man >> 13));
    int e = (int)exp - 127;
    if (e > 15) return (u16)(sign | 0x7C00u);
    if (e >= -14) {
        u32 r = (((u32)(e + 15)) << 10) | (man >> 13);
        u32 rem = man & 0x1FFFu;
        if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r += 1;
        return (u16)(sign | r);
    }
    if (e < -25) return sign;
    u32 full = man | 0x800000u;
    u32 shift = (u32)(-e - 1);
    u32 r = full >> shift;
    u32 rem = full & ((1u << shift) - 1u);
    u32 halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u))) r += 1;
    return (u16)(sign | r);
}

__device__ __forceinline__ float load(const F32* p, u64 i) { return p[i].x; }
__device__ __forceinline__ float load(const BF16* p, u64 i) { return bf16_to_f32(p[i].b); }
__device__ __forceinline__ float load(const F16* p, u64 i) { return f16_to_f32(p[i].b); }

__device__ __forceinline__ void store(F32* p, u64 i, float x) { p[i].x = x; }
__device__ __forceinline__ void store(BF16* p, u64 i, float x) { p[i].b = f32_to_bf16(x); }
__device__ __forceinline__ void store(F16* p, u64 i, float x) { p[i].b = f32_to_f16(x); }
__device__ __forceinline__ void store(NoOut*, u64, float) {}

// Grid-stride loop over n elements.
#define FOR_EACH(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// e^x, bit for bit zero_kernels::nn::scalar::exp_f32 (Cephes expf): clamp to [-87, 88],
// n = round(x log2 e) by the 1.5*2^23 trick, r = x - n ln2 (ln2 split in two), e^r by a
// degree-7 polynomial, times 2^n built from exponent bits. Same constants, same op order.
__device__ __forceinline__ float exp_f32(float x) {
    if (x < -87.0f) x = -87.0f;
    if (x > 88.0f) x = 88.0f;
    float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f), 12582912.0f);
    float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.6933594f)), __fmul_rn(n, -2.1219444e-4f));
    float p = __fadd_rn(__fmul_rn(1.9875691e-4f, r), 1.3981999e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 8.333452e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 4.1665796e-2f);
    p = __fadd_rn(__fmul_rn(p, r), 1.6666665e-1f);
    p = __fadd_rn(__fmul_rn(p, r), 5e-1f);
    float y = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
    return __fmul_rn(y, __uint_as_float(((u32)(__float2int_rz(n) + 127)) << 23));
}

// tanh u = 1 - 2/(e^(2u) + 1) over exp_f32, bit for bit zero_kernels::nn::scalar::tanh_f32.
__device__ __forceinline__ float tanh_f32(float u) {
    return __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(exp_f32(__fmul_rn(2.0f, u)), 1.0f)));
}

// ln x, branch-free Cephes logf, bit for bit zero_kernels::twin::xent::ln_f32 (libm's
// logf differs from any GPU log in the last ulp, so both sides use this): x = m 2^e with
// m in [sqrt(1/2), sqrt(2)), ln(1 + f) by a degree-9 polynomial, plus e ln2 (ln2 split
// in two). Subnormals are scaled by 2^23 first; NaN or x < 0 -> NaN, 0 -> -inf, inf -> inf.
__device__ __forceinline__ float ln_f32(float x) {
    u32 bits = __float_as_uint(x);
    bool sub = bits < 0x00800000u;  // +0 or a positive subnormal
    float xs = sub ? __fmul_rn(x, 8388608.0f) : x;
    u32 b = __float_as_uint(xs);
    int e = (int)((b >> 23) & 0xFFu) - 126 - (sub ? 23 : 0);
    float m = __uint_as_float((b & 0x007FFFFFu) | 0x3F000000u);  // [0.5, 1)
    bool small = m < 0.70710677f;
    e = small ? e - 1 : e;
    float f = small ? __fsub_rn(__fadd_rn(m, m), 1.0f) : __fsub_rn(m, 1.0f);
    float z = __fmul_rn(f, f);
    float y = __fsub_rn(__fmul_rn(7.0376836292e-2f, f), 1.1514610310e-1f);
    y = __fadd_rn(__fmul_rn(y, f), 1.1676998740e-1f);
    y = __fsub_rn(__fmul_rn(y, f), 1.2420140846e-1f);
    y = __fadd_rn(__fmul_rn(y, f), 1.4249322787e-1f);
    y = __fsub_rn(__fmul_rn(y, f), 1.6668057665e-1f);
    y = __fadd_rn(__fmul_rn(y, f), 2.0000714765e-1f);
    y = __fsub_rn(__fmul_rn(y, f), 2.4999993993e-1f);
    y = __fadd_rn(__fmul_rn(y, f), 3.3333331174e-1f);
    y = __fmul_rn(__fmul_rn(y, f), z);
    float fe = __int2float_rn(e);
    y = __fadd_rn(y, __fmul_rn(fe, -2.12194440e-4f));
    y = __fsub_rn(y, __fmul_rn(z, 0.5f));
    float r = __fadd_rn(__fadd_rn(f, y), __fmul_rn(fe, 0.693359375f));
    if (x == 0.0f) r = __int_as_float(0xFF800000);               // -inf
    if (x == __int_as_float(0x7F800000)) r = x;                  // +inf
    if (!(x >= 0.0f)) r = __int_as_float(0x7FC00000);            // NaN, negative
    return r;
}
