// Gradient statistics on the GPU in the summation order of
// zero-kernels/src/gradstats/reference.rs, so the result equals the CPU's bit for bit:
// 16 threads per 4096-element block, thread l summing (in index order, in f64) the squares
// of elements block_start + l, + l + 16, ...; the 16 lane sums folded by the fixed tree
// (w = 8, 4, 2, 1) through shared memory; one f64 per block written out. The host adds the
// block sums in block order (they are few: n / 4096).
#include "bits.cuh"

#define BLOCK 4096
#define LANES 16
#define BLOCKS_PER_CTA 8  // 128 threads per CTA

template <typename G>
__device__ __forceinline__ void block_sums(const G* g, float* out, float scale, double* sums, u64 n) {
    __shared__ double acc[BLOCKS_PER_CTA][LANES];
    u32 local = threadIdx.x / LANES;
    u32 lane = threadIdx.x % LANES;
    u64 block = (u64)blockIdx.x * BLOCKS_PER_CTA + local;
    u64 start = block * BLOCK;
    double a = 0.0;
    if (start < n) {
        u64 end = start + BLOCK < n ? start + BLOCK : n;
        for (u64 i = start + lane; i < end; i += LANES) {
            float x = __fmul_rn(load(g, i), scale);
            if (out) out[i] = x;
            double d = (double)x;
            a = __dadd_rn(a, __dmul_rn(d, d));
        }
    }
    acc[local][lane] = a;
    __syncthreads();
    // Fixed fold: acc[l] += acc[l + w] for w = 8, 4, 2, 1 (reduce16 on the CPU).
    for (u32 w = LANES / 2; w > 0; w /= 2) {
        double mine = acc[local][lane];
        double other = lane < w ? acc[local][lane + w] : 0.0;
        __syncthreads();
        if (lane < w) acc[local][lane] = __dadd_rn(mine, other);
        __syncthreads();
    }
    if (lane == 0 && start < n) sums[block] = acc[local][0];
}

extern "C" __global__ void sumsq_f32(const F32* g, float scale, double* sums, u64 n) { block_sums(g, (float*)0, scale, sums, n); }
extern "C" __global__ void sumsq_bf16(const BF16* g, float scale, double* sums, u64 n) { block_sums(g, (float*)0, scale, sums, n); }
extern "C" __global__ void sumsq_f16(const F16* g, float scale, double* sums, u64 n) { block_sums(g, (float*)0, scale, sums, n); }
// In-place unscale of an f32 gradient (each element read, then written, by one thread).
extern "C" __global__ void unscale_f32(F32* g, float scale, double* sums, u64 n) { block_sums((const F32*)g, (float*)g, scale, sums, n); }

// The device-side total of the block sums (Device::grad_stats keeps the result on the
// GPU): one CTA of FINISH_THREADS threads, thread l adding blocks l, l + FINISH_THREADS, ...
// in order from 0.0, then the fixed fold acc[l] += acc[l + w] for w = FINISH_THREADS/2 .. 1.
// (The host path above adds the block sums serially; this order is stated in reference.rs
// as `finish_tree`, and the two agree to f64 rounding.) out[1] = 1 when the total is not
// finite (an inf or NaN gradient), else 0.
#define FINISH_THREADS 256
extern "C" __global__ void gradstats_finish(const double* sums, u64 blocks, double* out) {
    __shared__ double acc[FINISH_THREADS];
    u32 l = threadIdx.x;
    double a = 0.0;
    for (u64 b = l; b < blocks; b += FINISH_THREADS) a = __dadd_rn(a, sums[b]);
    acc[l] = a;
    __syncthreads();
    for (u32 w = FINISH_THREADS / 2; w > 0; w /= 2) {
        double mine = acc[l];
        double other = l < w ? acc[l + w] : 0.0;
        __syncthreads();
        if (l < w) acc[l] = __dadd_rn(mine, other);
        __syncthreads();
    }
    if (l == 0) {
        double total = acc[0];
        out[0] = total;
        out[1] = (total - total == 0.0) ? 0.0 : 1.0;
    }
}
