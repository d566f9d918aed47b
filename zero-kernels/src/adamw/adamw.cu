// Fused AdamW on the GPU: the per-element operations of zero-kernels/src/adamw/reference.rs
// in the same order with IEEE-rounded intrinsics, so each element's result equals the CPU's
// bit for bit. Grid-stride, four consecutive elements per thread with 16-byte (f32) and
// 8-byte (16-bit) accesses where the arrays' alignment allows, else one element per
// thread: the step is memory-bound, and wide coalesced accesses are all it needs.
#include "bits.cuh"

// Must match zero_kernels::adamw::AdamWCoeffs (#[repr(C)], nine f32).
struct Coeffs {
    float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, inv_sqrt_bias2, eps, decay;
};

// One element: the new (p, m, v) from the gradient gi (already widened) and the old state.
__device__ __forceinline__ void step(const Coeffs& c, float g, float& p, float& m, float& v) {
    float gi = __fmul_rn(g, c.grad_scale);
    float mi = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, gi));
    float vi = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(c.one_minus_beta2, __fmul_rn(gi, gi)));
    float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_sqrt_bias2), c.eps);
    p = __fsub_rn(__fmul_rn(p, c.decay), __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
    m = mi;
    v = vi;
}

// Four consecutive elements at i (a multiple of 4) with one 16-byte access per f32 array
// and one 8-byte access per 16-bit one: fewer, wider memory transactions.
__device__ __forceinline__ void load4(const F32* g, u64 i, float x[4]) {
    float4 q = *reinterpret_cast<const float4*>(g + i);
    x[0] = q.x; x[1] = q.y; x[2] = q.z; x[3] = q.w;
}
__device__ __forceinline__ void load4(const BF16* g, u64 i, float x[4]) {
    uint2 q = *reinterpret_cast<const uint2*>(g + i);  // element i in the low half
    x[0] = bf16_to_f32((u16)(q.x & 0xFFFFu)); x[1] = bf16_to_f32((u16)(q.x >> 16));
    x[2] = bf16_to_f32((u16)(q.y & 0xFFFFu)); x[3] = bf16_to_f32((u16)(q.y >> 16));
}
__device__ __forceinline__ void load4(const F16* g, u64 i, float x[4]) {
    uint2 q = *reinterpret_cast<const uint2*>(g + i);
    x[0] = f16_to_f32((u16)(q.x & 0xFFFFu)); x[1] = f16_to_f32((u16)(q.x >> 16));
    x[2] = f16_to_f32((u16)(q.y & 0xFFFFu)); x[3] = f16_to_f32((u16)(q.y >> 16));
}
__device__ __forceinline__ void store4(NoOut*, u64, const float*) {}
__device__ __forceinline__ void store4(BF16* o, u64 i, const float x[4]) {
    uint2 q;
    q.x = (u32)f32_to_bf16(x[0]) | ((u32)f32_to_bf16(x[1]) << 16);
    q.y = (u32)f32_to_bf16(x[2]) | ((u32)f32_to_bf16(x[3]) << 16);
    *reinterpret_cast<uint2*>(o + i) = q;
}
__device__ __forceinline__ void store4(F16* o, u64 i, const float x[4]) {
    uint2 q;
    q.x = (u32)f32_to_f16(x[0]) | ((u32)f32_to_f16(x[1]) << 16);
    q.y = (u32)f32_to_f16(x[2]) | ((u32)f32_to_f16(x[3]) << 16);
    *reinterpret_cast<uint2*>(o + i) = q;
}

// Whether element 0 of every array allows the wide accesses (a view's offset may not).
template <typename G, typename P>
__device__ __forceinline__ bool wide(const G* g, const float* p, const float* m, const float* v, const P* out) {
    bool ok = (u64)p % 16 == 0 && (u64)m % 16 == 0 && (u64)v % 16 == 0 && (u64)g % (4 * sizeof(G)) == 0;
    return ok && (sizeof(P) == 1 || (u64)out % (4 * sizeof(P)) == 0);  // NoOut: no copy
}

// Element i alone (unaligned arrays, and the tail).
template <typename G, typename P>
__device__ __forceinline__ void one(const Coeffs& c, const G* g, float* p, float* m, float* v, P* out, u64 i) {
    float pi = p[i], mi = m[i], vi = v[i];
    step(c, load(g, i), pi, mi, vi);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    store(out, i, pi);
}

template <typename G, typename P>
__device__ __forceinline__ void adamw(Coeffs c, const G* g, float* p, float* m, float* v, P* out, u64 n) {
    if (!wide(g, p, m, v, out)) {
        FOR_EACH(i, n) one(c, g, p, m, v, out, i);
        return;
    }
    u64 quads = n / 4;
    FOR_EACH(k, quads) {
        u64 i = 4 * k;
        float gi[4];
        load4(g, i, gi);
        float4 p4 = *reinterpret_cast<const float4*>(p + i);
        float4 m4 = *reinterpret_cast<const float4*>(m + i);
        float4 v4 = *reinterpret_cast<const float4*>(v + i);
        step(c, gi[0], p4.x, m4.x, v4.x);
        step(c, gi[1], p4.y, m4.y, v4.y);
        step(c, gi[2], p4.z, m4.z, v4.z);
        step(c, gi[3], p4.w, m4.w, v4.w);
        *reinterpret_cast<float4*>(m + i) = m4;
        *reinterpret_cast<float4*>(v + i) = v4;
        *reinterpret_cast<float4*>(p + i) = p4;
        float po[4] = {p4.x, p4.y, p4.z, p4.w};
        store4(out, i, po);
    }
    // The last n mod 4 elements, one per thread.
    FOR_EACH(t, n - 4 * quads) one(c, g, p, m, v, out, 4 * quads + t);
}

#define ADAMW_ENTRY(name, G, P) \
    extern "C" __global__ void name(Coeffs c, const G* g, float* p, float* m, float* v, P* out, u64 n) { \
        adamw<G, P>(c, g, p, m, v, out, n); \
    }

ADAMW_ENTRY(adamw_f32_none, F32, NoOut)
ADAMW_ENTRY(adamw_f32_bf16, F32, BF16)
ADAMW_ENTRY(adamw_f32_f16, F32, F16)
ADAMW_ENTRY(adamw_bf16_none, BF16, NoOut)
ADAMW_ENTRY(adamw_bf16_bf16, BF16, BF16)
ADAMW_ENTRY(adamw_bf16_f16, BF16, F16)
ADAMW_ENTRY(adamw_f16_none, F16, NoOut)
ADAMW_ENTRY(adamw_f16_bf16, F16, BF16)
ADAMW_ENTRY(adamw_f16_f16, F16, F16)
