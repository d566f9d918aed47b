// Fused AdamW on the GPU: the per-element operations of zero-kernels/src/adamw/reference.rs
// in the same order with IEEE-rounded intrinsics, so each element's result equals the CPU's
// bit for bit. One thread per element (grid-stride): the step is memory-bound, coalesced
// loads of g, p, m, v and stores of p, m, v and the 16-bit copy are all it needs.
#include "bits.cuh"

// Must match zero_kernels::adamw::AdamWCoeffs (#[repr(C)], nine f32).
struct Coeffs {
    float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, inv_sqrt_bias2, eps, decay;
};

template <typename G, typename P>
__device__ __forceinline__ void adamw(Coeffs c, const G* g, float* p, float* m, float* v, P* out, u64 n) {
    FOR_EACH(i, n) {
        float gi = __fmul_rn(load(g, i), c.grad_scale);
        float mi = __fadd_rn(__fmul_rn(c.beta1, m[i]), __fmul_rn(c.one_minus_beta1, gi));
        float vi = __fadd_rn(__fmul_rn(c.beta2, v[i]), __fmul_rn(c.one_minus_beta2, __fmul_rn(gi, gi)));
        float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_sqrt_bias2), c.eps);
        float pi = __fsub_rn(__fmul_rn(p[i], c.decay), __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        store(out, i, pi);
    }
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
