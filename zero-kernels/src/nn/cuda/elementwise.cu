// Elementwise model ops, the semantics and operation order of zero-kernels/src/nn/activation.rs
// (GELU, tanh approximation) and nn/rows.rs (add_into, scale_into), bit for bit: each
// element is a fixed sequence of IEEE-rounded operations, the CPU's (CPU twin:
// zero-kernels/src/twin/elementwise.rs). Grid-stride, one element per thread per pass,
// coalesced: these are memory-bound.
#include "bits.cuh"

// sqrt(2/pi) and 0.044715 rounded to f32 (nn::activation's GELU_S, GELU_K as f32; the
// twin's test checks these bit patterns).
#define GELU_S __uint_as_float(0x3F4C422Au)
#define GELU_K __uint_as_float(0x3D372713u)

// y = 0.5 x (1 + tanh(s (x + k x^3))), as ((0.5 x) (1 + tanh(s (x + ((k x) x) x)))).
extern "C" __global__ void gelu_forward_f32(float* __restrict__ out, const float* __restrict__ x, u64 n) {
    FOR_EACH(i, n) {
        float v = x[i];
        float cube = __fmul_rn(__fmul_rn(__fmul_rn(GELU_K, v), v), v);
        float t = tanh_f32(__fmul_rn(GELU_S, __fadd_rn(v, cube)));
        out[i] = __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, t));
    }
}

// d *= gelu'(x) = 0.5 (1 + t) + ((0.5 x) (1 - t t)) dt, dt = s (1 + ((3 k) x) x).
extern "C" __global__ void gelu_backward_f32(float* __restrict__ d, const float* __restrict__ x, u64 n) {
    float three_k = __fmul_rn(3.0f, GELU_K);
    FOR_EACH(i, n) {
        float v = x[i];
        float cube = __fmul_rn(__fmul_rn(__fmul_rn(GELU_K, v), v), v);
        float t = tanh_f32(__fmul_rn(GELU_S, __fadd_rn(v, cube)));
        float dt = __fmul_rn(GELU_S, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(three_k, v), v)));
        float left = __fmul_rn(0.5f, __fadd_rn(1.0f, t));
        float right = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, v), __fsub_rn(1.0f, __fmul_rn(t, t))), dt);
        d[i] = __fmul_rn(d[i], __fadd_rn(left, right));
    }
}

// dst += src.
extern "C" __global__ void add_f32(float* __restrict__ dst, const float* __restrict__ src, u64 n) {
    FOR_EACH(i, n) dst[i] = __fadd_rn(dst[i], src[i]);
}

// dst *= a.
extern "C" __global__ void scale_f32(float* dst, float a, u64 n) {
    FOR_EACH(i, n) dst[i] = __fmul_rn(dst[i], a);
}
