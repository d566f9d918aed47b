// Causal multi-head attention over a packed qkv [B, T, 3C] (q | k | v; head h at columns
// h*hs .. (h+1)*hs of each third, hs = C/H), the semantics of zero-kernels/src/nn/attention.rs,
// in the operation order of zero-kernels/src/twin/attention.rs (its CPU twin, same bits):
// no atomics, every sum in a fixed order.
//
// Forward, one warp per query row (b, h, i):
//   s_j = (sum_d q_i[d] k_j[d], d ascending) * scale for j <= i, lane l taking j = l, l+32, ..;
//   m = max_j s_j; e_j = exp_f32(s_j - m); sum = lane sums (j ascending) folded by the
//   xor butterfly 16, 8, 4, 2, 1; p_ij = e_j * (1/sum), 0 for j > i;
//   y_i[d] = sum_{j <= i} p_ij v_j[d] (j ascending), lane l taking d = l, l+32, ..
// Backward, per group of (b, h) pairs (the launcher loops; scratch holds one row sum per
// query row of the group):
//   dq kernel, one warp per query row i:  dp_ij = sum_d dy_i[d] v_j[d] (d ascending);
//     D_i = sum_j p_ij dp_ij (lane sums, butterfly), kept in scratch;
//     ds_ij = p_ij (dp_ij - D_i);  dq_i[d] = (sum_{j <= i} ds_ij k_j[d], j ascending) * scale
//   dkv kernel, one warp per key row j (recomputes dp_ij and ds_ij bit for bit):
//     dk_j[d] = (sum_{i >= j} ds_ij q_i[d], i ascending) * scale;
//     dv_j[d] = sum_{i >= j} p_ij dy_i[d] (i ascending).
//
// Memory access: where each lane takes its own row (the lane-per-key dot products of the
// scores and of dp), the rows are staged 32 rows x 32 dims at a time through the warp's
// shared-memory tile by coalesced loads (dot_rows), instead of 32 rows read element by
// element from global memory; the arithmetic and its order stay as above.
#include "bits.cuh"

#define WARPS 4           // warps (query or key rows) per block
#define DCHUNK 4          // d-accumulators per lane: dims d0 + lane + 32*c, c < DCHUNK
#define FULL 0xFFFFFFFFu

__device__ __forceinline__ float warp_sum(float x) {
    for (int off = 16; off > 0; off /= 2) x = __fadd_rn(x, __shfl_xor_sync(FULL, x, off));
    return x;
}

// Max that ignores NaN like the CPU's `if v > max`; its result is exact in any order.
__device__ __forceinline__ float warp_max(float x) {
    for (int off = 16; off > 0; off /= 2) {
        float o = __shfl_xor_sync(FULL, x, off);
        if (o > x) x = o;
    }
    return x;
}

// One warp's staging tile: 32 rows x 32 dims (+1 column so that lane l reading row l
// hits bank (l + d) mod 32: no conflicts).
typedef float Tile[32][33];

// Lane l (< nrows) returns sum_d a[d] * row_l[d], d ascending from 0.0f, row_l = rows +
// l * rstride: dot(a, row_l) of the CPU twin, same operations in the same order. The
// rows go through `tile` 32 dims at a time, each row read by one coalesced load. Every
// lane of the warp must call it (it synchronises the warp); lanes >= nrows get 0.
__device__ __forceinline__ float dot_rows(Tile& tile, const float* a, const float* rows, u64 rstride, u32 nrows, u32 n, u32 lane) {
    float acc = 0.0f;
    for (u32 d0 = 0; d0 < n; d0 += 32) {
        u32 w = n - d0 < 32 ? n - d0 : 32;
        if (lane < w)
            for (u32 r = 0; r < nrows; r++) tile[r][lane] = rows[r * rstride + d0 + lane];
        __syncwarp();
        if (lane < nrows)
            for (u32 dd = 0; dd < w; dd++) acc = __fadd_rn(acc, __fmul_rn(a[d0 + dd], tile[lane][dd]));
        __syncwarp();  // the tile is read before the next chunk overwrites it
    }
    return acc;
}

// Row i of P, in place, from the scaled scores prow[j <= i] and each lane's running max m
// over its j = lane, lane+32, ..: m folded by the butterfly, e_j = exp(s_j - m) summed per
// lane and folded, p_ij = e_j * (1/sum) for j <= i, 0 above the diagonal (the twin's
// normalise_row). Lane l reads and writes only its own j, so the caller needs no warp
// synchronisation before; every lane of the warp must call it.
__device__ __forceinline__ void softmax_row(float* prow, u32 i, u32 T, float m, u32 lane) {
    m = warp_max(m);
    float sum = 0.0f;
    for (u32 j = lane; j <= i; j += 32) {
        float e = exp_f32(__fsub_rn(prow[j], m));
        prow[j] = e;
        sum = __fadd_rn(sum, e);
    }
    sum = warp_sum(sum);
    float inv = __fdiv_rn(1.0f, sum);
    for (u32 j = lane; j < T; j += 32) prow[j] = j <= i ? __fmul_rn(prow[j], inv) : 0.0f;
}

extern "C" __global__ void attention_forward_f32(float* y, float* p, const float* qkv, u32 B, u32 T, u32 C, u32 H, float scale) {
    u32 lane = threadIdx.x % 32;
    u64 row = (u64)blockIdx.x * WARPS + threadIdx.x / 32;  // (b*H + h)*T + i
    if (row >= (u64)B * H * T) return;                      // whole warps leave together
    u32 i = (u32)(row % T);
    u64 pair = row / T;
    u32 h = (u32)(pair % H);
    u64 b = pair / H;
    u32 hs = C / H;
    u64 stride = 3 * (u64)C;
    const float* base = qkv + b * T * stride + (u64)h * hs;  // q of token 0 of this head
    const float* q = base + i * stride;
    float* prow = p + row * T;

    __shared__ Tile tiles[WARPS];
    Tile& tile = tiles[threadIdx.x / 32];
    float m = -3.40282347e38f;  // f32::MIN, as the CPU starts its max
    for (u32 j0 = 0; j0 <= i; j0 += 32) {  // lane l takes j = j0 + l
        u32 j = j0 + lane;
        u32 nrows = i - j0 + 1 < 32 ? i - j0 + 1 : 32;
        float qk = dot_rows(tile, q, base + j0 * stride + C, stride, nrows, hs, lane);
        if (j <= i) {
            float s = __fmul_rn(qk, scale);
            prow[j] = s;
            if (s > m) m = s;
        }
    }
    softmax_row(prow, i, T, m, lane);
    __syncwarp();  // every lane's p_ij visible to the whole warp

    float* yrow = y + (b * T + i) * C + (u64)h * hs;
    for (u32 d = lane; d < hs; d += 32) {
        const float* v = base + 2 * (u64)C + d;
        float acc = 0.0f;
        for (u32 j = 0; j <= i; j++) acc = __fadd_rn(acc, __fmul_rn(prow[j], v[j * stride]));
        yrow[d] = acc;
    }
}

// dq and the softmax row sums D_i for the (b, h) pairs pair0 .. pair0 + npairs.
extern "C" __global__ void attention_backward_dq_f32(float* dqkv, float* dsum, const float* dy, const float* p, const float* qkv, u32 pair0, u32 npairs, u32 T, u32 C, u32 H, float scale) {
    u32 lane = threadIdx.x % 32;
    u64 local = (u64)blockIdx.x * WARPS + threadIdx.x / 32;  // (pair - pair0)*T + i
    if (local >= (u64)npairs * T) return;
    u32 i = (u32)(local % T);
    u64 pair = pair0 + local / T;
    u32 h = (u32)(pair % H);
    u64 b = pair / H;
    u32 hs = C / H;
    u64 stride = 3 * (u64)C;
    const float* base = qkv + b * T * stride + (u64)h * hs;
    const float* prow = p + (pair * T + i) * T;
    const float* dyi = dy + (b * T + i) * C + (u64)h * hs;

    __shared__ Tile tiles[WARPS];
    Tile& tile = tiles[threadIdx.x / 32];
    float part = 0.0f;
    for (u32 j0 = 0; j0 <= i; j0 += 32) {  // lane l takes j = j0 + l
        u32 j = j0 + lane;
        u32 nrows = i - j0 + 1 < 32 ? i - j0 + 1 : 32;
        float dp = dot_rows(tile, dyi, base + j0 * stride + 2 * (u64)C, stride, nrows, hs, lane);
        if (j <= i) part = __fadd_rn(part, __fmul_rn(prow[j], dp));
    }
    float D = warp_sum(part);
    if (lane == 0) dsum[local] = D;

    float* dq = dqkv + (b * T + i) * stride + (u64)h * hs;
    for (u32 d0 = 0; d0 < hs; d0 += 32 * DCHUNK) {
        float acc[DCHUNK];
        for (int c = 0; c < DCHUNK; c++) acc[c] = 0.0f;
        for (u32 j0 = 0; j0 <= i; j0 += 32) {
            u32 j = j0 + lane;
            u32 n = i - j0 + 1 < 32 ? i - j0 + 1 : 32;
            float dp = dot_rows(tile, dyi, base + j0 * stride + 2 * (u64)C, stride, n, hs, lane);
            float ds = 0.0f;
            if (j <= i) ds = __fmul_rn(prow[j], __fsub_rn(dp, D));
            for (u32 kk = 0; kk < n; kk++) {
                float dsk = __shfl_sync(FULL, ds, kk);
                const float* k = base + (u64)(j0 + kk) * stride + C;
                for (int c = 0; c < DCHUNK; c++) {
                    u32 d = d0 + lane + 32 * c;
                    if (d < hs) acc[c] = __fadd_rn(acc[c], __fmul_rn(dsk, k[d]));
                }
            }
        }
        for (int c = 0; c < DCHUNK; c++) {
            u32 d = d0 + lane + 32 * c;
            if (d < hs) dq[d] = __fmul_rn(acc[c], scale);
        }
    }
}

// dk and dv for the (b, h) pairs pair0 .. pair0 + npairs, from the row sums of the dq kernel.
extern "C" __global__ void attention_backward_dkv_f32(float* dqkv, const float* dsum, const float* dy, const float* p, const float* qkv, u32 pair0, u32 npairs, u32 T, u32 C, u32 H, float scale) {
    u32 lane = threadIdx.x % 32;
    u64 local = (u64)blockIdx.x * WARPS + threadIdx.x / 32;  // (pair - pair0)*T + j
    if (local >= (u64)npairs * T) return;
    u32 j = (u32)(local % T);
    u64 pl = local / T;
    u64 pair = pair0 + pl;
    u32 h = (u32)(pair % H);
    u64 b = pair / H;
    u32 hs = C / H;
    u64 stride = 3 * (u64)C;
    const float* base = qkv + b * T * stride + (u64)h * hs;
    const float* vj = base + j * stride + 2 * (u64)C;
    const float* pcol = p + pair * T * T + j;
    const float* dyh = dy + b * T * C + (u64)h * hs;
    const float* D = dsum + pl * T;

    __shared__ Tile tiles[WARPS];
    Tile& tile = tiles[threadIdx.x / 32];
    float* dk = dqkv + (b * T + j) * stride + C + (u64)h * hs;
    float* dv = dk + C;
    for (u32 d0 = 0; d0 < hs; d0 += 32 * DCHUNK) {
        float ak[DCHUNK], av[DCHUNK];
        for (int c = 0; c < DCHUNK; c++) { ak[c] = 0.0f; av[c] = 0.0f; }
        for (u32 i0 = j; i0 < T; i0 += 32) {
            u32 i = i0 + lane;
            u32 n = T - i0 < 32 ? T - i0 : 32;
            // dot(dy_i, v_j): the product commutes, so v_j may be the shared operand.
            float dp = dot_rows(tile, vj, dyh + (u64)i0 * C, C, n, hs, lane);
            float ds = 0.0f, pij = 0.0f;
            if (i < T) {
                pij = pcol[(u64)i * T];
                ds = __fmul_rn(pij, __fsub_rn(dp, D[i]));
            }
            for (u32 kk = 0; kk < n; kk++) {
                float dsk = __shfl_sync(FULL, ds, kk);
                float pk = __shfl_sync(FULL, pij, kk);
                const float* q = base + (u64)(i0 + kk) * stride;
                const float* dyk = dyh + (u64)(i0 + kk) * C;
                for (int c = 0; c < DCHUNK; c++) {
                    u32 d = d0 + lane + 32 * c;
                    if (d < hs) {
                        ak[c] = __fadd_rn(ak[c], __fmul_rn(dsk, q[d]));
                        av[c] = __fadd_rn(av[c], __fmul_rn(pk, dyk[d]));
                    }
                }
            }
        }
        for (int c = 0; c < DCHUNK; c++) {
            u32 d = d0 + lane + 32 * c;
            if (d < hs) {
                dk[d] = __fmul_rn(ak[c], scale);
                dv[d] = av[c];
            }
        }
    }
}

// Attention as batched products (zero-kernels/src/twin/attention_products.rs): cuBLAS
// computes the scores and the products, these two kernels the rows in between. Twins:
// softmax_rows and softmax_backward_rows in zero-kernels/src/twin/attention.rs.

// Each row of `mats` consecutive T x T matrices holds scaled scores; row i becomes its
// causal softmax (the forward kernel's: lane maxima over j = lane, lane+32, .. <= i from
// f32::MIN, the butterflies, e_j * (1/sum)), 0 above the diagonal. One warp per row.
extern "C" __global__ void attention_softmax_rows_f32(float* p, u32 mats, u32 T) {
    u32 lane = threadIdx.x % 32;
    u64 row = (u64)blockIdx.x * WARPS + threadIdx.x / 32;  // mat*T + i
    if (row >= (u64)mats * T) return;
    u32 i = (u32)(row % T);
    float* prow = p + row * T;
    float m = -3.40282347e38f;
    for (u32 j = lane; j <= i; j += 32) {
        float s = prow[j];
        if (s > m) m = s;
    }
    softmax_row(prow, i, T, m, lane);
}

// `ds` holds `mats` consecutive T x T matrices of dP = dY V^T; row i becomes
// ds_ij = p_ij (dp_ij - D_i) for j <= i, 0 above the diagonal, with D_i = sum_{j <= i}
// p_ij dp_ij (lane sums, butterfly). Matrix m of P starts at p + m * p_stride. One warp
// per row.
extern "C" __global__ void attention_softmax_backward_rows_f32(float* ds, const float* p, u32 mats, u64 p_stride, u32 T) {
    u32 lane = threadIdx.x % 32;
    u64 row = (u64)blockIdx.x * WARPS + threadIdx.x / 32;  // mat*T + i
    if (row >= (u64)mats * T) return;
    u32 i = (u32)(row % T);
    float* drow = ds + row * T;
    const float* prow = p + (row / T) * p_stride + (u64)i * T;
    float part = 0.0f;
    for (u32 j = lane; j <= i; j += 32) part = __fadd_rn(part, __fmul_rn(prow[j], drow[j]));
    float D = warp_sum(part);
    for (u32 j = lane; j < T; j += 32) drow[j] = j <= i ? __fmul_rn(prow[j], __fsub_rn(drow[j], D)) : 0.0f;
}
