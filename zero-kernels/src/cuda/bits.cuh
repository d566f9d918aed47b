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
