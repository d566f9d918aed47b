// The classifier's softmax cross-entropy and the loss mean, the semantics of
// zero-kernels/src/nn/xent.rs, in the operation order of zero-kernels/src/twin/xent.rs
// (its CPU twin, same bits): no atomics, every sum in a fixed order.
//
// Forward, one block of THREADS threads per row of V logits z (thread l takes columns
// l, l + THREADS, ..): m = max z (exact in any order); sum = per-thread sums of
// exp_f32(z_j - m) (j ascending), folded within each warp by the xor butterfly
// 16, 8, 4, 2, 1, then the 32 warp sums by the same butterfly; loss = ln_f32(sum) -
// (z_target - m); p_j = exp_f32(z_j - m) * (1/sum) (recomputed, not stored in between).
// A target >= V (the host validates targets; this only keeps the kernel in bounds)
// leaves the row alone and writes a NaN loss.
// Backward, elementwise: d_j = (p_j - [j == target]) * scale.
// Mean, one block of MEAN_THREADS: thread l adds src[l], src[l + MEAN_THREADS], .. in f64
// from 0; the fixed fold acc[l] += acc[l + w] for w = MEAN_THREADS/2 .. 1; dst = f32(total / n).
#include "bits.cuh"

#define THREADS 1024  // 32 warps: the cross-warp fold is one more warp butterfly
#define MEAN_THREADS 256
#define FULL 0xFFFFFFFFu

__device__ __forceinline__ float warp_sum(float x) {
    for (int off = 16; off > 0; off /= 2) x = __fadd_rn(x, __shfl_xor_sync(FULL, x, off));
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    for (int off = 16; off > 0; off /= 2) {
        float o = __shfl_xor_sync(FULL, x, off);
        if (o > x) x = o;
    }
    return x;
}

// Block-wide fold of one value per thread (all threads get the result): warps first,
// then warp w's result as lane w of warp 0.
template <bool MAX>
__device__ __forceinline__ float block_fold(float x, float* shared) {
    u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    x = MAX ? warp_max(x) : warp_sum(x);
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    if (warp == 0) {
        float w = shared[lane];
        w = MAX ? warp_max(w) : warp_sum(w);
        if (lane == 0) shared[32] = w;
    }
    __syncthreads();
    float r = shared[32];
    __syncthreads();  // `shared` may be reused right after
    return r;
}

extern "C" __global__ void softmax_xent_forward_f32(float* z, float* losses, const u32* targets, u32 V) {
    __shared__ float shared[33];
    u64 row = blockIdx.x;
    u32 tgt = targets[row];
    if (tgt >= V) {  // uniform over the block
        if (threadIdx.x == 0) losses[row] = __int_as_float(0x7FC00000);
        return;
    }
    float* zr = z + row * V;
    float m = -3.40282347e38f;  // f32::MIN, as the CPU starts its max
    for (u32 j = threadIdx.x; j < V; j += THREADS) {
        float x = zr[j];
        if (x > m) m = x;
    }
    m = block_fold<true>(m, shared);
    float s = 0.0f;
    for (u32 j = threadIdx.x; j < V; j += THREADS) s = __fadd_rn(s, exp_f32(__fsub_rn(zr[j], m)));
    float sum = block_fold<false>(s, shared);
    // Thread 0 reads the target logit before the barrier ahead of the overwrite below
    // (block_fold ends with one).
    if (threadIdx.x == 0) losses[row] = __fsub_rn(ln_f32(sum), __fsub_rn(zr[tgt], m));
    __syncthreads();
    float inv = __fdiv_rn(1.0f, sum);
    for (u32 j = threadIdx.x; j < V; j += THREADS) zr[j] = __fmul_rn(exp_f32(__fsub_rn(zr[j], m)), inv);
}

extern "C" __global__ void softmax_xent_backward_f32(float* d, const u32* targets, u64 rows, u32 V, float scale) {
    FOR_EACH(i, rows * V) {
        u64 row = i / V;
        u32 j = (u32)(i - row * V);
        float x = d[i];
        if (j == targets[row]) x = __fsub_rn(x, 1.0f);
        d[i] = __fmul_rn(x, scale);
    }
}

extern "C" __global__ void mean_f32(float* dst, const float* src, u64 n) {
    __shared__ double acc[MEAN_THREADS];
    u32 l = threadIdx.x;
    double a = 0.0;
    for (u64 i = l; i < n; i += MEAN_THREADS) a = __dadd_rn(a, (double)src[i]);
    acc[l] = a;
    __syncthreads();
    for (u32 w = MEAN_THREADS / 2; w > 0; w /= 2) {
        double mine = acc[l];
        double other = l < w ? acc[l + w] : 0.0;
        __syncthreads();
        if (l < w) acc[l] = __dadd_rn(mine, other);
        __syncthreads();
    }
    if (l == 0) dst[0] = __double2float_rn(__ddiv_rn(acc[0], (double)n));
}
