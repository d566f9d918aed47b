// Row-wise model ops over row-major [rows, width] buffers, the semantics of
// zero-kernels/src/nn/rows.rs, in the operation order of the CPU twin
// zero-kernels/src/twin/rows.rs (same bits): no atomics, every sum in a fixed order.
//
// - Row kernels (fill, add, gather, periodic add, shift): blocks stride over rows, the
//   threads of a block over the row's columns (coalesced); each element is one operation.
// - Column sums (bias_backward; layernorm's dw, db): bias_partials_f32 sums each chunk of
//   CHUNK rows per column (rows ascending, from 0) into a [chunks, width] scratch;
//   column_fold_f32 then adds, per column, warp w's sum over chunks w, w + FOLD_WARPS, ..
//   (ascending, from 0), folds the FOLD_WARPS sums by the tree a[w] += a[w + h],
//   h = 4, 2, 1, and adds the total into the destination.
// - scatter_add_rows_f32 (dtable[ids[i] - first] += dout[i] in i order): one block per
//   position i; the block of the first i naming a row adds every dout[j] with the same id
//   into it, j ascending, starting from the row's value (the CPU's order exactly); later
//   positions naming the same row do nothing. No two blocks write one row.
// - periodic_rows_backward_f32: one thread per element of the table, adding dout rows
//   p, p + period, .. in order (the CPU's order exactly).
// Ids outside first .. first + nrows are skipped (the host validates ids; this only
// keeps the kernels in bounds).
#include "bits.cuh"

#define THREADS 256      // fixed block size of the column-sum and scatter kernels
#define WARPS (THREADS / 32)
#define CHUNK 32         // rows per partial sum: zero_kernels::twin::rows::CHUNK_ROWS
#define FOLD_WARPS 8     // zero_kernels::twin::reduce::FOLD_WARPS
#define SCATTER_IDS 4    // ids each thread compares per scatter pass
#define SCATTER_COLS 4   // columns each thread accumulates in registers per scatter pass
#define FULL 0xFFFFFFFFu

#define FOR_ROWS(r, rows) for (u64 r = blockIdx.x; r < (rows); r += gridDim.x)
#define FOR_COLS(j, width) for (u32 j = threadIdx.x; j < (width); j += blockDim.x)

__device__ __forceinline__ bool in_block(u32 id, u64 first, u64 nrows) {
    return (u64)id >= first && (u64)id - first < nrows;
}

extern "C" __global__ void fill_rows_f32(float* __restrict__ out, const float* __restrict__ row, u64 rows, u32 width) {
    FOR_ROWS(r, rows) FOR_COLS(j, width) out[r * width + j] = row[j];
}

extern "C" __global__ void add_rows_f32(float* __restrict__ out, const float* __restrict__ row, u64 rows, u32 width) {
    FOR_ROWS(r, rows) FOR_COLS(j, width) out[r * width + j] = __fadd_rn(out[r * width + j], row[j]);
}

// Grid (ceil(rows / CHUNK), ceil(width / THREADS)), THREADS threads: partial[chunk, col].
extern "C" __global__ void bias_partials_f32(float* __restrict__ partial, const float* __restrict__ dout, u64 rows, u32 width) {
    u64 chunk = blockIdx.x;
    u32 col = blockIdx.y * THREADS + threadIdx.x;
    if (col >= width) return;
    u64 r0 = chunk * CHUNK;
    u64 r1 = r0 + CHUNK < rows ? r0 + CHUNK : rows;
    float acc = 0.0f;
#pragma unroll 8
    for (u64 r = r0; r < r1; r++) acc = __fadd_rn(acc, dout[r * width + col]);
    partial[chunk * width + col] = acc;
}

// Grid (ceil(width / 32), sets), FOLD_WARPS * 32 threads: dst_s[col] += the fold of
// partial[s * chunks * width + k * width + col] over k (s = blockIdx.y: 0 -> dst0, 1 -> dst1).
extern "C" __global__ void column_fold_f32(float* dst0, float* dst1, const float* __restrict__ partial, u64 chunks, u32 width) {
    __shared__ float sums[FOLD_WARPS][32];
    u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    u32 col = blockIdx.x * 32 + lane;
    const float* p = partial + (u64)blockIdx.y * chunks * width;
    float acc = 0.0f;
    if (col < width) {
#pragma unroll 4
        for (u64 k = warp; k < chunks; k += FOLD_WARPS) acc = __fadd_rn(acc, p[k * width + col]);
    }
    sums[warp][lane] = acc;
    __syncthreads();
    for (u32 h = FOLD_WARPS / 2; h > 0; h /= 2) {
        if (warp < h) sums[warp][lane] = __fadd_rn(sums[warp][lane], sums[warp + h][lane]);
        __syncthreads();
    }
    if (warp == 0 && col < width) {
        float* dst = blockIdx.y == 0 ? dst0 : dst1;
        dst[col] = __fadd_rn(dst[col], sums[0][lane]);
    }
}

// out[r] = block[ids[r] - first] for ids in first .. first + nrows; other rows untouched.
extern "C" __global__ void gather_rows_f32(float* __restrict__ out, const u32* __restrict__ ids, const float* __restrict__ block,
                                           u64 rows, u32 width, u64 first, u64 nrows) {
    FOR_ROWS(r, rows) {
        u32 id = ids[r];
        if (!in_block(id, first, nrows)) continue;
        const float* src = block + ((u64)id - first) * width;
        FOR_COLS(j, width) out[r * width + j] = src[j];
    }
}

// dblock[ids[i] - first] += dout[i], i ascending, for ids in first .. first + nrows.
// Grid: blocks stride over the n positions; THREADS threads.
extern "C" __global__ void scatter_add_rows_f32(float* __restrict__ dblock, const u32* __restrict__ ids,
                                                const float* __restrict__ dout, u64 n, u32 width, u64 first, u64 nrows) {
    __shared__ u32 masks[SCATTER_IDS][WARPS];
    u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    FOR_ROWS(i, n) {
        u32 id = ids[i];
        if (!in_block(id, first, nrows)) continue;  // uniform over the block
        // Does an earlier position name the same row? Then its block adds this one.
        int dup = 0;
        for (u64 base = 0; base < i && !dup; base += THREADS * SCATTER_IDS) {
            int found = 0;
#pragma unroll
            for (u32 k = 0; k < SCATTER_IDS; k++) {
                u64 j = base + k * THREADS + threadIdx.x;
                if (j < i && ids[j] == id) found = 1;
            }
            dup = __syncthreads_or(found);
        }
        if (dup) continue;
        float* trow = dblock + ((u64)id - first) * width;
        for (u32 c0 = 0; c0 < width; c0 += THREADS * SCATTER_COLS) {
            float acc[SCATTER_COLS];
#pragma unroll
            for (u32 k = 0; k < SCATTER_COLS; k++) {
                u32 col = c0 + k * THREADS + threadIdx.x;
                acc[k] = col < width ? trow[col] : 0.0f;
            }
            for (u64 base = i; base < n; base += THREADS * SCATTER_IDS) {
#pragma unroll
                for (u32 k = 0; k < SCATTER_IDS; k++) {
                    u64 j = base + k * THREADS + threadIdx.x;
                    u32 m = __ballot_sync(FULL, j < n && ids[j] == id);
                    if (lane == 0) masks[k][warp] = m;
                }
                __syncthreads();
                // Matches in ascending j: sub-chunk k, then warp, then lane.
                for (u32 k = 0; k < SCATTER_IDS; k++) {
                    for (u32 w = 0; w < WARPS; w++) {
                        u32 m = masks[k][w];
                        while (m) {
                            u32 bit = __ffs(m) - 1;
                            m &= m - 1;
                            const float* drow = dout + (base + k * THREADS + w * 32 + bit) * width;
#pragma unroll
                            for (u32 q = 0; q < SCATTER_COLS; q++) {
                                u32 col = c0 + q * THREADS + threadIdx.x;
                                if (col < width) acc[q] = __fadd_rn(acc[q], drow[col]);
                            }
                        }
                    }
                }
                __syncthreads();  // masks are rewritten next pass
            }
#pragma unroll
            for (u32 k = 0; k < SCATTER_COLS; k++) {
                u32 col = c0 + k * THREADS + threadIdx.x;
                if (col < width) trow[col] = acc[k];
            }
        }
    }
}

// out[r] += table[r % period].
extern "C" __global__ void add_periodic_rows_f32(float* __restrict__ out, const float* __restrict__ table, u64 rows, u32 width,
                                                 u64 period) {
    FOR_ROWS(r, rows) {
        const float* p = table + (r % period) * width;
        FOR_COLS(j, width) out[r * width + j] = __fadd_rn(out[r * width + j], p[j]);
    }
}

// dtable[p] += dout[i] for i = p, p + period, .. < rows, in order: one thread per element
// of the table (grid-stride over period * width).
extern "C" __global__ void periodic_rows_backward_f32(float* __restrict__ dtable, const float* __restrict__ dout, u64 rows,
                                                      u32 width, u64 period) {
    FOR_EACH(e, period * width) {
        u64 p = e / width;
        u64 j = e - p * width;
        float acc = dtable[e];
        for (u64 i = p; i < rows; i += period) acc = __fadd_rn(acc, dout[i * width + j]);
        dtable[e] = acc;
    }
}

// Per sequence of seq rows: out[t] = x[t - 1] for t >= 1, out[0] = 0.
extern "C" __global__ void shift_rows_forward_f32(float* __restrict__ out, const float* __restrict__ x, u64 rows, u32 width,
                                                  u64 seq) {
    FOR_ROWS(r, rows) {
        bool head = r % seq == 0;
        FOR_COLS(j, width) out[r * width + j] = head ? 0.0f : x[(r - 1) * width + j];
    }
}

// Per sequence: dx[t - 1] += dout[t] for t >= 1 (the last row of a sequence gets nothing).
extern "C" __global__ void shift_rows_backward_f32(float* __restrict__ dx, const float* __restrict__ dout, u64 rows, u32 width,
                                                   u64 seq) {
    FOR_ROWS(r, rows) {
        if (r % seq == seq - 1 || r + 1 >= rows) continue;
        FOR_COLS(j, width) dx[r * width + j] = __fadd_rn(dx[r * width + j], dout[(r + 1) * width + j]);
    }
}
