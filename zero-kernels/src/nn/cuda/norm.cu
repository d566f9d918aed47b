// LayerNorm over rows of width C, the semantics of zero-kernels/src/nn/norm.rs, in the
// operation order of its CPU twin zero-kernels/src/twin/norm.rs (same bits): no atomics,
// every sum in a fixed order.
//
// Forward, one warp per row (WARPS rows per block): lane l sums x_j for j = l, l + 32, ..
// (from 0, j ascending), the xor butterfly 16, 8, 4, 2, 1 folds the 32 lane sums; mean =
// sum * inv_c; the same for (x_j - mean)^2 -> var = sum * inv_c; rstd = 1 / sqrt(var + eps);
// out_j = ((x_j - mean) rstd) w_j + b_j.
//
// Backward, one block of WARPS warps per chunk of CHUNK rows:
// - dx: warp w takes the chunk's rows w, w + WARPS, ..; n_j = (x_j - mean) rstd,
//   g_j = dout_j w_j; lane sums of g_j and g_j n_j as in the forward, butterflies, times
//   inv_c -> gm, gnm; dx_j += ((g_j - gm) - n_j gnm) rstd;
// - dw, db partials: thread t takes columns t, t + THREADS, ..; for the chunk's rows in
//   order (from 0) it adds dout_j n_j and dout_j and stores them as row `chunk` of the
//   partials (dw's [chunks, C], then db's [chunks, C]);
// then column_fold_f32 (rows.cu) adds the partials over chunks into dw, db.
#include "bits.cuh"

#define WARPS 8
#define THREADS (WARPS * 32)
#define CHUNK 32  // rows per backward block: zero_kernels::twin::rows::CHUNK_ROWS
#define FULL 0xFFFFFFFFu

__device__ __forceinline__ float warp_sum(float x) {
    for (int off = 16; off > 0; off /= 2) x = __fadd_rn(x, __shfl_xor_sync(FULL, x, off));
    return x;
}

extern "C" __global__ void layernorm_forward_f32(float* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                                 const float* __restrict__ x, const float* __restrict__ w,
                                                 const float* __restrict__ b, u64 rows, u32 C, float inv_c, float eps) {
    u32 lane = threadIdx.x % 32;
    for (u64 row = (u64)blockIdx.x * WARPS + threadIdx.x / 32; row < rows; row += (u64)gridDim.x * WARPS) {
        const float* xr = x + row * C;
        float s = 0.0f;
        for (u32 j = lane; j < C; j += 32) s = __fadd_rn(s, xr[j]);
        float m = __fmul_rn(warp_sum(s), inv_c);
        float v = 0.0f;
        for (u32 j = lane; j < C; j += 32) {
            float d = __fsub_rn(xr[j], m);
            v = __fadd_rn(v, __fmul_rn(d, d));
        }
        float var = __fmul_rn(warp_sum(v), inv_c);
        float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
        float* orow = out + row * C;
        for (u32 j = lane; j < C; j += 32) {
            orow[j] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[j], m), rs), w[j]), b[j]);
        }
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = rs;
        }
    }
}

// Grid: one block per chunk of CHUNK rows (grid.x = ceil(rows / CHUNK)), THREADS threads.
// `partial` holds 2 * chunks * C floats.
extern "C" __global__ void layernorm_backward_f32(float* __restrict__ dx, float* __restrict__ partial,
                                                  const float* __restrict__ dout, const float* __restrict__ x,
                                                  const float* __restrict__ w, const float* __restrict__ mean,
                                                  const float* __restrict__ rstd, u64 rows, u32 C, float inv_c) {
    u64 chunks = (rows + CHUNK - 1) / CHUNK;
    u64 chunk = blockIdx.x;
    u64 r0 = chunk * CHUNK;
    u64 r1 = r0 + CHUNK < rows ? r0 + CHUNK : rows;
    u32 lane = threadIdx.x % 32;
    for (u64 row = r0 + threadIdx.x / 32; row < r1; row += WARPS) {
        const float* xr = x + row * C;
        const float* dr = dout + row * C;
        float m = mean[row], rs = rstd[row];
        float gs = 0.0f, gns = 0.0f;
        for (u32 j = lane; j < C; j += 32) {
            float n = __fmul_rn(__fsub_rn(xr[j], m), rs);
            float g = __fmul_rn(dr[j], w[j]);
            gs = __fadd_rn(gs, g);
            gns = __fadd_rn(gns, __fmul_rn(g, n));
        }
        float gm = __fmul_rn(warp_sum(gs), inv_c);
        float gnm = __fmul_rn(warp_sum(gns), inv_c);
        float* dxr = dx + row * C;
        for (u32 j = lane; j < C; j += 32) {
            float n = __fmul_rn(__fsub_rn(xr[j], m), rs);
            float g = __fmul_rn(dr[j], w[j]);
            dxr[j] = __fadd_rn(dxr[j], __fmul_rn(__fsub_rn(__fsub_rn(g, gm), __fmul_rn(n, gnm)), rs));
        }
    }
    // Column partials of the chunk (its rows are in L1/L2 from the pass above).
    float* pw = partial + chunk * C;
    float* pb = partial + (chunks + chunk) * C;
    for (u32 j = threadIdx.x; j < C; j += THREADS) {
        float aw = 0.0f, ab = 0.0f;
#pragma unroll 8
        for (u64 row = r0; row < r1; row++) {
            float d = dout[row * C + j];
            float n = __fmul_rn(__fsub_rn(x[row * C + j], mean[row]), rstd[row]);
            aw = __fadd_rn(aw, __fmul_rn(d, n));
            ab = __fadd_rn(ab, d);
        }
        pw[j] = aw;
        pb[j] = ab;
    }
}
