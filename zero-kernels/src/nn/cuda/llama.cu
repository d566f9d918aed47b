// Llama's model ops, the semantics of zero-kernels/src/nn/{rmsnorm,rope,swiglu}.rs, in the
// operation order of their CPU twin zero-kernels/src/twin/llama.rs (same bits): no
// atomics, every sum in a fixed order.
//
// RMSNorm (as norm.cu's LayerNorm, without the mean):
// - forward, one warp per row (WARPS rows per block): lane l sums x_j^2 for j = l, l + 32,
//   .. (from 0, j ascending), the xor butterfly 16, 8, 4, 2, 1 folds the lane sums;
//   rstd = 1 / sqrt(sum * inv_c + eps); out_j = (x_j rstd) w_j;
// - backward, one block of WARPS warps per chunk of CHUNK rows: warp w takes the chunk's
//   rows w, w + WARPS, ..; m = (warp sum of (dout_j w_j) x_j) * inv_c, k = ((rstd rstd)
//   rstd) m, dx_j += (dout_j w_j) rstd - x_j k; then thread t sums (dout_j x_j) rstd over
//   the chunk's rows (ascending, from 0) for columns t, t + THREADS, .. into row `chunk` of
//   the partials [chunks, C]; column_fold_f32 (rows.cu) adds them over chunks into dw.
//
// Rotary embeddings + GQA (rotate_half pairing: element i of a head with i + hd/2). The
// cos/sin table [T, hd/2] (cos first, then sin) is computed on the host in f64 and rounded
// once, as the CPU kernel does, and uploaded: the GPU's sin/cos would differ in the last
// bit. Rotation y_i = x_i cos - x_{i+h} sin, y_{i+h} = x_{i+h} cos + x_i sin (h = hd/2);
// its transpose dx_i = dy_i cos + dy_{i+h} sin, dx_{i+h} = dy_{i+h} cos - dy_i sin.
// - forward, one thread per (row, query head j, i < h): the q pair of head j, the k pair of
//   key/value head j / g (g = H / Hkv), and the v pair copied;
// - backward, one thread per (row, key/value head m, i < h): dq pairs of the g query heads
//   j = m g .. m g + g - 1; dk and dv pairs summed over those heads in j order, starting
//   from the first head's value (the CPU's copy-then-add).
//
// SwiGLU: out = (a sigmoid(a)) b, sigmoid(a) = 1 / (1 + exp(0 - a)) over bits.cuh's
// exp_f32 (the CPU's Cephes exp); backward da = ((dout b) s) (1 + a (1 - s)),
// db = (dout a) s. Grid-stride, one element per thread.
#include "bits.cuh"

#define WARPS 8
#define THREADS (WARPS * 32)
#define CHUNK 32  // rows per backward block: zero_kernels::twin::rows::CHUNK_ROWS
#define FULL 0xFFFFFFFFu

__device__ __forceinline__ float warp_sum(float x) {
    for (int off = 16; off > 0; off /= 2) x = __fadd_rn(x, __shfl_xor_sync(FULL, x, off));
    return x;
}

extern "C" __global__ void rmsnorm_forward_f32(float* __restrict__ out, float* __restrict__ rstd,
                                               const float* __restrict__ x, const float* __restrict__ w,
                                               u64 rows, u32 C, float inv_c, float eps) {
    u32 lane = threadIdx.x % 32;
    for (u64 row = (u64)blockIdx.x * WARPS + threadIdx.x / 32; row < rows; row += (u64)gridDim.x * WARPS) {
        const float* xr = x + row * C;
        float ss = 0.0f;
        for (u32 j = lane; j < C; j += 32) ss = __fadd_rn(ss, __fmul_rn(xr[j], xr[j]));
        float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fmul_rn(warp_sum(ss), inv_c), eps)));
        float* orow = out + row * C;
        for (u32 j = lane; j < C; j += 32) orow[j] = __fmul_rn(__fmul_rn(xr[j], rs), w[j]);
        if (lane == 0) rstd[row] = rs;
    }
}

// Grid: one block per chunk of CHUNK rows (grid.x = ceil(rows / CHUNK)), THREADS threads.
// `partial` holds chunks * C floats.
extern "C" __global__ void rmsnorm_backward_f32(float* __restrict__ dx, float* __restrict__ partial,
                                                const float* __restrict__ dout, const float* __restrict__ x,
                                                const float* __restrict__ w, const float* __restrict__ rstd,
                                                u64 rows, u32 C, float inv_c) {
    u64 chunk = blockIdx.x;
    u64 r0 = chunk * CHUNK;
    u64 r1 = r0 + CHUNK < rows ? r0 + CHUNK : rows;
    u32 lane = threadIdx.x % 32;
    for (u64 row = r0 + threadIdx.x / 32; row < r1; row += WARPS) {
        const float* xr = x + row * C;
        const float* dr = dout + row * C;
        float rs = rstd[row];
        float gx = 0.0f;
        for (u32 j = lane; j < C; j += 32) gx = __fadd_rn(gx, __fmul_rn(__fmul_rn(dr[j], w[j]), xr[j]));
        float m = __fmul_rn(warp_sum(gx), inv_c);
        float k = __fmul_rn(__fmul_rn(__fmul_rn(rs, rs), rs), m);
        float* dxr = dx + row * C;
        for (u32 j = lane; j < C; j += 32) {
            float g = __fmul_rn(__fmul_rn(dr[j], w[j]), rs);
            dxr[j] = __fadd_rn(dxr[j], __fsub_rn(g, __fmul_rn(xr[j], k)));
        }
    }
    // Column partials of the chunk (its rows are in L1/L2 from the pass above).
    float* pw = partial + chunk * C;
    for (u32 j = threadIdx.x; j < C; j += THREADS) {
        float aw = 0.0f;
#pragma unroll 8
        for (u64 row = r0; row < r1; row++) {
            aw = __fadd_rn(aw, __fmul_rn(__fmul_rn(dout[row * C + j], x[row * C + j]), rstd[row]));
        }
        pw[j] = aw;
    }
}

// q [rows, H hd], k, v [rows, Hkv hd] -> qkv [rows, 3 H hd]; table = cos [T, h] then
// sin [T, h] (h = hd / 2); the position of row r is r mod T.
extern "C" __global__ void rope_gqa_forward_f32(float* __restrict__ qkv, const float* __restrict__ q,
                                                const float* __restrict__ k, const float* __restrict__ v,
                                                const float* __restrict__ table, u64 rows, u32 T, u32 H,
                                                u32 group, u32 half) {
    u32 hd = 2 * half;
    u64 C = (u64)H * hd, Ckv = (u64)(H / group) * hd;
    u64 per_row = (u64)H * half;
    FOR_EACH(idx, rows * per_row) {
        u64 r = idx / per_row;
        u32 rem = (u32)(idx % per_row);
        u32 j = rem / half, i = rem % half;
        u64 t = (u64)(r % T) * half + i;
        float c = table[t], s = table[(u64)T * half + t];
        u64 kv = (u64)(j / group) * hd;
        const float* qs = q + r * C + (u64)j * hd;
        const float* ks = k + r * Ckv + kv;
        const float* vs = v + r * Ckv + kv;
        float* row = qkv + r * 3 * C + (u64)j * hd;
        float a = qs[i], b = qs[i + half];
        row[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        row[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
        a = ks[i];
        b = ks[i + half];
        row[C + i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        row[C + i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
        row[2 * C + i] = vs[i];
        row[2 * C + i + half] = vs[i + half];
    }
}

// dqkv [rows, 3 H hd] -> dq [rows, H hd], dk, dv [rows, Hkv hd] (written, not added).
extern "C" __global__ void rope_gqa_backward_f32(float* __restrict__ dq, float* __restrict__ dk,
                                                 float* __restrict__ dv, const float* __restrict__ dqkv,
                                                 const float* __restrict__ table, u64 rows, u32 T, u32 H,
                                                 u32 group, u32 half) {
    u32 hd = 2 * half;
    u32 kv_h = H / group;
    u64 C = (u64)H * hd, Ckv = (u64)kv_h * hd;
    u64 per_row = (u64)kv_h * half;
    FOR_EACH(idx, rows * per_row) {
        u64 r = idx / per_row;
        u32 rem = (u32)(idx % per_row);
        u32 m = rem / half, i = rem % half;
        u64 t = (u64)(r % T) * half + i;
        float c = table[t], s = table[(u64)T * half + t];
        const float* row = dqkv + r * 3 * C;
        float k0 = 0.0f, k1 = 0.0f, v0 = 0.0f, v1 = 0.0f;
        for (u32 jj = 0; jj < group; jj++) {
            u64 o = (u64)(m * group + jj) * hd;
            float a = row[o + i], b = row[o + i + half];
            float* dqh = dq + r * C + o;
            dqh[i] = __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s));
            dqh[i + half] = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));
            a = row[C + o + i];
            b = row[C + o + i + half];
            float u = __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s));
            float w = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));
            float x0 = row[2 * C + o + i], x1 = row[2 * C + o + i + half];
            if (jj == 0) {
                k0 = u;
                k1 = w;
                v0 = x0;
                v1 = x1;
            } else {
                k0 = __fadd_rn(k0, u);
                k1 = __fadd_rn(k1, w);
                v0 = __fadd_rn(v0, x0);
                v1 = __fadd_rn(v1, x1);
            }
        }
        u64 o = r * Ckv + (u64)m * hd;
        dk[o + i] = k0;
        dk[o + i + half] = k1;
        dv[o + i] = v0;
        dv[o + i + half] = v1;
    }
}

__device__ __forceinline__ float sigmoid_f32(float a) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f32(__fsub_rn(0.0f, a))));
}

extern "C" __global__ void swiglu_forward_f32(float* __restrict__ out, const float* __restrict__ a,
                                              const float* __restrict__ b, u64 n) {
    FOR_EACH(i, n) {
        float x = a[i];
        out[i] = __fmul_rn(__fmul_rn(x, sigmoid_f32(x)), b[i]);
    }
}

extern "C" __global__ void swiglu_backward_f32(float* __restrict__ da, float* __restrict__ db,
                                               const float* __restrict__ dout, const float* __restrict__ a,
                                               const float* __restrict__ b, u64 n) {
    FOR_EACH(i, n) {
        float x = a[i], d = dout[i];
        float s = sigmoid_f32(x);
        da[i] = __fmul_rn(__fmul_rn(__fmul_rn(d, b[i]), s), __fadd_rn(1.0f, __fmul_rn(x, __fsub_rn(1.0f, s))));
        db[i] = __fmul_rn(__fmul_rn(d, x), s);
    }
}
