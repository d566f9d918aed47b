//! The f32 GEMM for CPUs with AVX2 and FMA but not AVX-512F (AMD Zen 2 and 3, Intel
//! Haswell to Comet Lake): [`super::sgemm`]'s BLIS loop nest with a [`MR`] x [`NR`] =
//! 6 x 16 micro-tile in 12 ymm accumulators. Per k:
//! two 8-lane loads of packed B, 6 broadcasts of A, 12 FMAs. Twelve independent sums
//! cover the FMA latency (4-5 cycles at two FMAs a cycle), and 8 loads per 12 FMAs fit
//! two load ports, so the FMA ports bound the loop.
//!
//! `matrixmultiply`'s AVX2 kernel (8 x 8, 8 accumulators) ran at 58-67 GFLOP/s on the
//! model's shapes on a Zen 2 core whose FMA peak measured 100 GFLOP/s; see the README's
//! results table for this kernel's.
//!
//! With `bf16` set it is also the bf16 product of `gemm_bf16.rs` on these CPUs
//! (`Bf16Kernel::Avx2`): A and B are rounded to bf16 (nearest even) as they are packed
//! (A's rows contiguous in k into a row block, then read as A's own rows are), and the
//! kernel runs on those exact f32 values.
//!
//! Numerics as the AVX-512 kernel's (`sgemm.rs`): C(i, j) is one FMA chain over k in
//! order within each K block ([`k_block`], a function of k alone), then
//! `C = fma(alpha, acc, beta * C)` (`alpha * acc` when beta is 0; C not read), later
//! blocks with beta = 1. Tiles never mix rows, so a band of rows computed alone has the
//! bits it has in the whole product.

use super::sgemm::{k_block, with_packs, Tile};
use crate::simd::bf16_bits_v3;
use std::arch::x86_64::*;

/// Rows of the micro-tile (broadcasts of A per k).
const MR: usize = 6;
/// Columns of the micro-tile (two ymm of packed B per k).
const NR: usize = 16;
/// Rows per A block: the tile's MR x KC panel of A (18 KiB at KC = 768) stays in L1 over
/// the block's B panels; the block (216 KiB) in L2.
const MC: usize = MR * 12;
/// Columns per packed-B block (NC x KC: 3 MiB at KC = 768, from L3; each NR x KC panel,
/// 48 KiB, streams from L2 once per A tile).
const NC: usize = NR * 64;

/// See [`super::sgemm`]; with `bf16`, of A and B rounded to bf16.
///
/// # Safety
/// As [`super::sgemm`], with AVX2 and FMA available and m, k, n > 0.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn sgemm(
    bf16: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    rsa: isize,
    csa: isize,
    b: *const f32,
    rsb: isize,
    csb: isize,
    beta: f32,
    c: *mut f32,
    rsc: isize,
    csc: isize,
) {
    let kb = k_block(k).min(k);
    // The A block, and for bf16 its rounded rows and a short last panel.
    let a_rows = MC.min(m.next_multiple_of(MR)) + if bf16 { MR } else { 0 };
    let b_floats = NC.min(n.next_multiple_of(NR)) * kb;
    with_packs(a_rows * kb, b_floats, |pa, pb| {
        // SAFETY: forwarded contract; the buffers hold the blocks (sizes above).
        unsafe {
            blocked(
                bf16, m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, pa, pb,
            )
        }
    })
}

/// The loop nest: N in NC blocks, K in equal blocks, M in MC blocks, then each MR-row
/// tile of A against the block's NR-column panels of B.
///
/// # Safety
/// As [`sgemm`]; `pa` holds MC x KC floats ((MC + MR) x KC with `bf16`) and `pb`
/// KC x NC (or the smaller blocks this call uses).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn blocked(
    bf16: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    rsa: isize,
    csa: isize,
    b: *const f32,
    rsb: isize,
    csb: isize,
    beta: f32,
    c: *mut f32,
    rsc: isize,
    csc: isize,
    pa: *mut f32,
    pb: *mut f32,
) {
    let kb = k_block(k);
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(kb) {
            let kc = kb.min(k - pc);
            // The first K block applies beta; the later ones add into C.
            let beta = if pc == 0 { beta } else { 1.0 };
            // SAFETY: rows pc..pc + kc and columns jc..jc + nc are inside B.
            unsafe {
                let b = b.offset(pc as isize * rsb + jc as isize * csb);
                pack_b(bf16, kc, nc, b, rsb, csb, pb)
            };
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                let mut a_block = a.offset(ic as isize * rsa + pc as isize * csa);
                let (mut rs_block, mut round, mut panels) = (rsa, bf16, pa);
                if bf16 && csa == 1 {
                    // Rounded row by row (vectorised) into `pa`, then read in place as
                    // unrounded rows are; the short last panel goes after them.
                    // SAFETY: the block's rows lie in A; `pa` holds them and one panel.
                    unsafe { round_rows(mc, kc, a_block, rsa, pa) };
                    (a_block, rs_block, round, panels) = (pa, kc as isize, false, pa.add(mc * kc));
                }
                // Rows of A contiguous in k are read in place, MR row streams; only a
                // last tile of fewer than MR rows is packed (its missing rows are zeros).
                let packed_from = if csa == 1 { mc / MR * MR } else { 0 };
                // SAFETY: rows packed_from..mc, columns 0..kc of the block are in A (or
                // its rounded rows); with no rows to pack the pointer is not read
                // (`wrapping_offset`).
                unsafe {
                    pack_a(
                        round,
                        mc - packed_from,
                        kc,
                        a_block.wrapping_offset(packed_from as isize * rs_block),
                        rs_block,
                        csa,
                        panels,
                    )
                };
                for ir in (0..mc).step_by(MR) {
                    let rows = MR.min(mc - ir);
                    for jr in (0..nc).step_by(NR) {
                        let tile = Tile {
                            rows,
                            cols: NR.min(nc - jr),
                            c: c.offset((ic + ir) as isize * rsc + (jc + jr) as isize * csc),
                            rsc,
                            csc,
                        };
                        let pb = pb.add(jr * kc);
                        // SAFETY: the panels lie in A or the packed blocks; the tile in C.
                        unsafe {
                            if ir < packed_from {
                                let rows = a_block.offset(ir as isize * rs_block);
                                micro_kernel::<true, MR>(kc, rows, rs_block, pb, alpha, beta, tile)
                            } else {
                                let panel = panels.add((ir - packed_from) * kc);
                                packed_tile(kc, panel, pb, alpha, beta, tile)
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `x`, or `x` rounded to bf16 (nearest even) when `bf16`.
#[inline(always)]
fn operand(bf16: bool, x: f32) -> f32 {
    if bf16 {
        f32::from_bits(super::gemm_bf16::to_bf16(x) << 16)
    } else {
        x
    }
}

/// Rows 0..mc, columns 0..kc of A (rows contiguous in k) rounded to bf16 into `out`,
/// row after row (row stride kc).
///
/// # Safety
/// The rows address valid memory; `out` holds mc x kc floats and does not overlap them.
#[target_feature(enable = "avx2,fma")]
unsafe fn round_rows(mc: usize, kc: usize, a: *const f32, rsa: isize, out: *mut f32) {
    for i in 0..mc {
        // SAFETY: row i of the view and of `out` (contract).
        let (row, dst) = unsafe {
            (
                std::slice::from_raw_parts(a.offset(i as isize * rsa), kc),
                std::slice::from_raw_parts_mut(out.add(i * kc), kc),
            )
        };
        for (x, &v) in dst.iter_mut().zip(row) {
            *x = operand(true, v);
        }
    }
}

/// Packs rows 0..mc, columns 0..kc of A into panels of MR rows: panel r holds element
/// (r MR + i, p) at `r MR kc + p MR + i`; rows past mc are zero.
///
/// # Safety
/// The view addresses valid memory; `out` holds mc rounded up to MR times kc floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_a(
    bf16: bool,
    mc: usize,
    kc: usize,
    a: *const f32,
    rsa: isize,
    csa: isize,
    out: *mut f32,
) {
    if mc == 0 {
        return;
    }
    if rsa == 1 {
        // SAFETY: forwarded contract; the caller runs on AVX2.
        unsafe {
            if bf16 {
                pack_a_columns::<true>(mc, kc, a, csa, out)
            } else {
                pack_a_columns::<false>(mc, kc, a, csa, out)
            }
        }
        return;
    }
    for r0 in (0..mc).step_by(MR) {
        let rows = MR.min(mc - r0);
        // SAFETY: inside the view and the buffer (contract).
        unsafe {
            let panel = std::slice::from_raw_parts_mut(out.add(r0 * kc), MR * kc);
            for (p, at) in panel.chunks_exact_mut(MR).enumerate() {
                for (i, x) in at.iter_mut().enumerate() {
                    *x = if i < rows {
                        operand(bf16, *a.offset((r0 + i) as isize * rsa + p as isize * csa))
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// [`pack_a`] for A with contiguous columns (A^T stored row-major, as dY^T in a weight
/// gradient): each k's mc values are one run, read once and dealt out to the panels
/// (walking a panel at a time would read a new line of A for every k). A whole panel's
/// six values per k move as one 4-float and one 2-float load and store (rounded to bf16
/// in registers with `BF16`): with the element-wise copy, weight gradients at N = 384 ran
/// 4-7% slower on a Zen 2 core.
///
/// # Safety
/// As [`pack_a`] with `rsa` = 1; the CPU has AVX2.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_a_columns<const BF16: bool>(
    mc: usize,
    kc: usize,
    a: *const f32,
    csa: isize,
    out: *mut f32,
) {
    let (whole, rest) = (mc / MR, mc % MR);
    for p in 0..kc {
        // SAFETY: column p of the view holds mc floats, and panel r's k step p MR
        // (contract); `_mm_loadu_si64` / `_mm_storeu_si64` move 2 floats (8 bytes).
        unsafe {
            let run = a.offset(p as isize * csa);
            for r in 0..whole {
                let (src, dst) = (run.add(r * MR), out.add((r * kc + p) * MR));
                let four = _mm_loadu_ps(src);
                let two = _mm_castsi128_ps(_mm_loadu_si64(src.add(4).cast()));
                let (four, two) = if BF16 {
                    let six = round_bf16(_mm256_set_m128(two, four));
                    (_mm256_castps256_ps128(six), _mm256_extractf128_ps::<1>(six))
                } else {
                    (four, two)
                };
                _mm_storeu_ps(dst, four);
                _mm_storeu_si64(dst.add(4).cast(), _mm_castps_si128(two));
            }
            if rest > 0 {
                let dst = std::slice::from_raw_parts_mut(out.add((whole * kc + p) * MR), MR);
                let part = std::slice::from_raw_parts(run.add(whole * MR), rest);
                for (x, &v) in dst.iter_mut().zip(part) {
                    *x = operand(BF16, v);
                }
                dst[rest..].fill(0.0);
            }
        }
    }
}

/// Eight floats rounded to bf16 as [`operand`] rounds one (the rounding of bf16 stores,
/// `simd.rs`), kept as the f32 values they are.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn round_bf16(v: __m256) -> __m256 {
    // SAFETY: AVX2 is enabled here.
    unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bf16_bits_v3(v))) }
}

/// Rows 0..lines of 8 floats, `stride` apart, transposed: element q of the result's
/// vector x is row q's float x (rows past `lines` are zeros).
///
/// # Safety
/// The `lines` rows of 8 floats are readable.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn transpose8(src: *const f32, stride: isize, lines: usize) -> [__m256; 8] {
    let mut r = [_mm256_setzero_ps(); 8];
    for (l, row) in r.iter_mut().enumerate().take(lines) {
        // SAFETY: row l < lines (contract).
        *row = unsafe { _mm256_loadu_ps(src.offset(l as isize * stride)) };
    }
    transpose8x8(r)
}

/// The 8 x 8 transpose of 32-bit lanes in registers: lane q of the result's vector x is
/// lane x of `r[q]`. (Inlined where AVX is enabled: it has no target feature of its own
/// so that callers without one can inline it into theirs.)
///
/// # Safety
/// The CPU has AVX.
#[inline(always)]
pub(super) unsafe fn transpose8x8(r: [__m256; 8]) -> [__m256; 8] {
    // Rows interleaved by 32 bits in pairs (0 1, 2 3, ...), then by 64 bits in pairs of
    // pairs: each 128-bit lane of u[x] (x < 4) then holds float x (low lane) or x + 4
    // (high lane) of rows 0..4, and u[4 + x] the same of rows 4..8; joining the lanes
    // gives the columns.
    let mut t = [_mm256_setzero_ps(); 8];
    for q in 0..4 {
        t[2 * q] = _mm256_unpacklo_ps(r[2 * q], r[2 * q + 1]);
        t[2 * q + 1] = _mm256_unpackhi_ps(r[2 * q], r[2 * q + 1]);
    }
    let mut u = [_mm256_setzero_ps(); 8];
    for g in 0..2 {
        let (lo, hi) = (t[4 * g], t[4 * g + 2]);
        let (lo2, hi2) = (t[4 * g + 1], t[4 * g + 3]);
        u[4 * g] = _mm256_shuffle_ps::<0x44>(lo, hi);
        u[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(lo, hi);
        u[4 * g + 2] = _mm256_shuffle_ps::<0x44>(lo2, hi2);
        u[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(lo2, hi2);
    }
    let mut out = [_mm256_setzero_ps(); 8];
    for x in 0..4 {
        out[x] = _mm256_permute2f128_ps::<0x20>(u[x], u[4 + x]);
        out[x + 4] = _mm256_permute2f128_ps::<0x31>(u[x], u[4 + x]);
    }
    out
}

/// Packs rows 0..kc, columns 0..nc of B into panels of NR columns: panel r holds
/// element (p, r NR + j) at `r NR kc + p NR + j`; columns past nc are zero.
///
/// # Safety
/// The view addresses valid memory; `out` holds kc times nc rounded up to NR floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_b(
    bf16: bool,
    kc: usize,
    nc: usize,
    b: *const f32,
    rsb: isize,
    csb: isize,
    out: *mut f32,
) {
    for j0 in (0..nc).step_by(NR) {
        let cols = NR.min(nc - j0);
        // SAFETY: inside the view and the buffer (contract).
        unsafe {
            let panel = std::slice::from_raw_parts_mut(out.add(j0 * kc), NR * kc);
            let src = b.offset(j0 as isize * csb);
            if csb == 1 {
                // Rows of B contiguous: NR-float copies, zeros past nc.
                for (p, dst) in panel.chunks_exact_mut(NR).enumerate() {
                    let row = std::slice::from_raw_parts(src.offset(p as isize * rsb), cols);
                    for (x, &v) in dst.iter_mut().zip(row) {
                        *x = operand(bf16, v);
                    }
                    dst[cols..].fill(0.0);
                }
            } else {
                let mut p0 = 0;
                if rsb == 1 {
                    // Columns contiguous in k (B^T stored row-major: the linear layers'
                    // weights): 8 k of 8 columns at a time, transposed in registers.
                    // With only the scalar gather below, the small GPT's bf16 step took 6%
                    // longer on a Zen 2 core (the gather also rounds each value).
                    while p0 + 8 <= kc {
                        for half in 0..2 {
                            let lines = cols.saturating_sub(8 * half).min(8);
                            let first = src.wrapping_offset((8 * half) as isize * csb);
                            let rows = transpose8(first.wrapping_add(p0), csb, lines);
                            for (p, v) in rows.into_iter().enumerate() {
                                let dst = panel.as_mut_ptr().add((p0 + p) * NR + 8 * half);
                                _mm256_storeu_ps(dst, if bf16 { round_bf16(v) } else { v });
                            }
                        }
                        p0 += 8;
                    }
                }
                // Columns (B^T's rows) read as NR streams, a value of each per k, so each
                // k's NR values are written at once (writing a column at a time at stride
                // NR touched a line per value).
                for (p, dst) in panel.chunks_exact_mut(NR).enumerate().skip(p0) {
                    for (j, x) in dst.iter_mut().enumerate() {
                        *x = if j < cols {
                            let col = src.wrapping_offset(j as isize * csb);
                            operand(bf16, *col.offset(p as isize * rsb))
                        } else {
                            0.0
                        };
                    }
                }
            }
        }
    }
}

/// k steps ahead that the micro-kernel prefetches packed B (one 64-byte line a step).
const PREFETCH_B: usize = 8;
/// k steps per iteration of the micro-kernel's loop.
const UNROLL: usize = 4;

/// A packed tile through the kernel with as many rows as it has, so a short last tile
/// costs its rows' FMAs; each element is the same FMA chain as in a full tile.
///
/// # Safety
/// As [`micro_kernel`] with `DIRECT` false.
#[target_feature(enable = "avx2,fma")]
unsafe fn packed_tile(kc: usize, a: *const f32, b: *const f32, alpha: f32, beta: f32, t: Tile) {
    // SAFETY: forwarded contract.
    unsafe {
        match t.rows {
            1 => micro_kernel::<false, 1>(kc, a, 1, b, alpha, beta, t),
            2 => micro_kernel::<false, 2>(kc, a, 1, b, alpha, beta, t),
            3 => micro_kernel::<false, 3>(kc, a, 1, b, alpha, beta, t),
            4 => micro_kernel::<false, 4>(kc, a, 1, b, alpha, beta, t),
            5 => micro_kernel::<false, 5>(kc, a, 1, b, alpha, beta, t),
            _ => micro_kernel::<false, MR>(kc, a, 1, b, alpha, beta, t),
        }
    }
}

/// One micro-tile: `acc = A_panel B_panel` over kc in 12 ymm, then into C. A is MR rows
/// of A itself, `rsa` apart, contiguous in k (`DIRECT`), or a packed panel (`rsa`
/// unused); either way each sum sees the same FMAs in the same order.
///
/// # Safety
/// `a` holds MR rows of kc floats (`DIRECT`) or kc x MR packed floats, `b` kc x NR packed
/// floats; the tile addresses valid C and has at most `ROWS` rows.
#[target_feature(enable = "avx2,fma")]
unsafe fn micro_kernel<const DIRECT: bool, const ROWS: usize>(
    kc: usize,
    a: *const f32,
    rsa: isize,
    b: *const f32,
    alpha: f32,
    beta: f32,
    t: Tile,
) {
    let mut acc = [_mm256_setzero_ps(); 2 * MR];
    macro_rules! step {
        ($p:expr) => {{
            let p = $p;
            // A hint: never faults, also past the panel's end.
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add((p + PREFETCH_B) * NR).cast());
            // SAFETY: k step p of both panels (contract).
            unsafe {
                let b0 = _mm256_loadu_ps(b.add(p * NR));
                let b1 = _mm256_loadu_ps(b.add(p * NR + 8));
                for i in 0..ROWS {
                    let ai = _mm256_broadcast_ss(&*if DIRECT {
                        a.offset(i as isize * rsa).add(p)
                    } else {
                        a.add(p * MR + i)
                    });
                    acc[2 * i] = _mm256_fmadd_ps(ai, b0, acc[2 * i]);
                    acc[2 * i + 1] = _mm256_fmadd_ps(ai, b1, acc[2 * i + 1]);
                }
            }
        }};
    }
    // Unrolled, each sum still takes k steps 0, 1, 2, ... in order.
    let mut p = 0;
    while p + UNROLL <= kc {
        for u in 0..UNROLL {
            step!(p + u);
        }
        p += UNROLL;
    }
    while p < kc {
        step!(p);
        p += 1;
    }
    let (valpha, vbeta) = (_mm256_set1_ps(alpha), _mm256_set1_ps(beta));
    if t.csc == 1 && t.cols == NR {
        // Whole rows of 16 contiguous floats: 8-lane updates.
        for i in 0..t.rows {
            for h in 0..2 {
                // SAFETY: row i, columns 8h..8h + 8 of the tile.
                unsafe {
                    let dst = t.c.offset(i as isize * t.rsc).add(8 * h);
                    let out = if beta == 0.0 {
                        _mm256_mul_ps(valpha, acc[2 * i + h])
                    } else {
                        let old = _mm256_mul_ps(vbeta, _mm256_loadu_ps(dst));
                        _mm256_fmadd_ps(valpha, acc[2 * i + h], old)
                    };
                    _mm256_storeu_ps(dst, out);
                }
            }
        }
        return;
    }
    // Any other tile: through a stack copy, the same operations per element.
    let mut sums = [0.0f32; MR * NR];
    for (i, pair) in acc.chunks_exact(2).enumerate() {
        // SAFETY: row i of the stack tile.
        unsafe {
            _mm256_storeu_ps(sums.as_mut_ptr().add(i * NR), pair[0]);
            _mm256_storeu_ps(sums.as_mut_ptr().add(i * NR + 8), pair[1]);
        }
    }
    // SAFETY: the tile (contract) and its sums, NR apart.
    unsafe { t.update_each(&sums, NR, alpha, beta) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`round_bf16`] on eight floats.
    #[target_feature(enable = "avx2,fma")]
    fn round8(x: [f32; 8]) -> [f32; 8] {
        let mut out = [0.0; 8];
        // SAFETY: 8 floats in and out.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), round_bf16(_mm256_loadu_ps(x.as_ptr()))) };
        out
    }

    #[test]
    fn vector_rounding_has_the_bits_of_the_scalar_one() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("no AVX2 + FMA here: the vector rounding is not used");
            return;
        }
        // Ties both ways, the largest finite values (which round to infinity), subnormals,
        // infinities and NaNs of both signs and payloads, then random bit patterns.
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            f32::from_bits(0x3F80_8000),
            f32::from_bits(0x3F81_8000),
            f32::from_bits(0x3F80_7FFF),
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-40,
            -1e-45,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001),
            f32::from_bits(0xFFC1_2345),
        ];
        let mut bits = 0x2545_F491_u32;
        let randoms = (0..100_000).map(|_| {
            bits = bits.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            f32::from_bits(bits)
        });
        let values: Vec<f32> = specials.into_iter().chain(randoms).collect();
        for eight in values.chunks_exact(8) {
            let x: [f32; 8] = std::array::from_fn(|i| eight[i]);
            // SAFETY: AVX2 and FMA checked above.
            let got = unsafe { round8(x) };
            for (g, v) in got.iter().zip(x) {
                let want = operand(true, v);
                assert_eq!(g.to_bits(), want.to_bits(), "{v:e} ({:#x})", v.to_bits());
            }
        }
    }
}
