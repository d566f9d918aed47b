//! The f32 GEMM, `C = alpha * A B + beta * C` over arbitrary strides (`matrixmultiply`'s
//! contract): an AVX-512F kernel of this crate where the CPU has it, else its AVX2 + FMA
//! kernel (`sgemm_avx2.rs`), else `matrixmultiply::sgemm`, chosen at run time
//! ([`SgemmKernel::detect`]; `ZERO_SGEMM` forces one).
//!
//! Why a kernel of our own: `matrixmultiply`'s AVX-512 micro-kernel is 16x16, one
//! broadcast load for every FMA, and reached 151-182 GFLOP/s single-threaded on the model's
//! shapes on this project's build machine against ~215-226 for oneDNN. This one ran
//! 1.02-1.18x `matrixmultiply` there, except K = 256 with N >= 768 (0.96-1.0x)
//! (`zero-bench micro gemm`: columns "f32 sgemm" and "f32 matrixmultiply"), and the small
//! GPT's fp32 training step in 9% less time (`micro model --preset small`).
//!
//! The AVX-512 kernel is the BLIS loop nest (Van Zee & van de Geijn, "BLIS: A Framework for
//! Rapidly Instantiating BLAS Functionality", TOMS 2015, section 2): N in blocks of [`NC`]
//! columns, K in blocks of at most [`KC`] (B's block packed once), M in blocks of [`MC`]
//! rows, then each MR-row tile of A against the block's NR-column panels of B (the A
//! tile stays in L1, B streams from L2), and an [`MR`] x [`NR`] = 14 x 32 micro-tile in
//! 28 zmm accumulators: per k, two 16-lane loads of packed B, 14 broadcasts of A and 28
//! FMAs, so the two FMA ports, not loads, bound the loop (its ceiling with everything in
//! L1 was ~235 GFLOP/s here). A whose rows are contiguous in k (the activations of a
//! forward or backward product) is read in place, row by row, as oneDNN's kernels do,
//! unless its row stride puts the 14 rows' lines in one L1 set ([`reads_a_in_place`]);
//! any other A is packed into MR-row panels.
//!
//! Numerics: C(i, j) is one FMA chain over k in order within each K block, the blocks
//! added in order (`C = fma(alpha, acc, beta * C)` after the first, `fma(alpha, acc, C)`
//! after the next); K blocks never depend on i or on how many rows a call has, and rows
//! past M are zero padding whose lanes are discarded, so a row band computed alone (as
//! `Gemm::run` splits C among threads) has the bits it has in the whole product.
//! `beta == 0` does not read C (NaN there is overwritten), as `matrixmultiply`.

use std::sync::OnceLock;

/// The environment variable that forces the f32 GEMM: `avx512`, `avx2` or
/// `matrixmultiply` (unset or empty: the fastest this CPU runs).
pub const SGEMM_KERNEL_ENV: &str = "ZERO_SGEMM";

/// Rows of the micro-tile (broadcasts of A per k).
pub const MR: usize = 14;
/// Columns of the micro-tile (two zmm of packed B per k).
pub const NR: usize = 32;
/// Longest K block. Every K block after the first reads and writes C again, which costs
/// more than streaming the panels from L2 (a KC x NR panel of B, 96 KiB, and an MR x KC
/// one of A, 42 KiB, at 184 bytes per 28 FMAs); so K is cut into as few blocks as this
/// allows, of equal length ([`k_block`]). Measured on the model's shapes, 256 to 1024 did
/// alike within the noise of the build machine, with fewer C passes for the longer.
pub const KC: usize = 768;
/// Rows per A block (MC x KC, 504 KiB: the unit A is packed in; each MR-row tile of it
/// is read from L2 once, then from L1 for the block's NC columns).
pub const MC: usize = MR * 12;
/// Columns per packed-B block (KC x NC, 3 MiB: L2/L3; streamed once per MR-row tile of A).
/// NR * 16 was as fast on the small GPT's shapes but up to 10% slower on GPT-2's weight
/// gradients (likely because A is packed again for each N block).
pub const NC: usize = NR * 32;

/// The K block length for a product of depth k: the fewest blocks of at most [`KC`], of
/// equal length rounded up to 16 (whole in-register transposes when packing). A function
/// of k alone, never of M, so every row band blocks K alike.
pub fn k_block(k: usize) -> usize {
    let blocks = k.div_ceil(KC).max(1);
    k.div_ceil(blocks).next_multiple_of(16).clamp(16, KC)
}

/// The fewest ways of the L1 data caches this kernel meets (AMD Zen 4: 32 KiB, 8 ways;
/// Intel since Ice Lake: 48 KiB, 12 ways), both with 64 sets of 64-byte lines.
pub const L1_WAYS: usize = 8;

/// The most distinct cache lines that the first elements of `rows` rows, `stride` floats
/// apart, put in one L1 set (rows taken to start on a line): an L1 of 64 sets of 64-byte
/// lines maps addresses 4 KiB apart to the same set. Read in place, the micro-kernel's
/// rows stream side by side, a line of each per 16 k; at a row stride that is a multiple
/// of 1024 floats (K = 1024, 2048 or 3072: GPT-2's 4C, most Llama widths) all 14 lines
/// land in one set and evict each other before their 16 k are used. `micro gemm`, 1
/// thread, Zen 4, M = 1024, N = 384, old / new binary: K = 1024 ran at 62-78 GFLOP/s read
/// in place against 93-98 packed (K = 1040, read in place: 98-107); at a stride of 2 KiB
/// (7 lines a set) it ran at full speed.
pub fn rows_share_l1_set(stride: isize, rows: usize) -> usize {
    const SETS: i128 = 64;
    const LINE: i128 = 64;
    let line_of = |row: usize| (row as i128 * stride as i128 * 4).div_euclid(LINE);
    let mut per_set = [0usize; SETS as usize];
    for row in 0..rows {
        let line = line_of(row);
        // Each line once (no allocation: this runs on every product).
        if (0..row).all(|earlier| line_of(earlier) != line) {
            per_set[line.rem_euclid(SETS) as usize] += 1;
        }
    }
    per_set.into_iter().max().unwrap_or(0)
}

/// Whether A, `rsa` and `csa` floats per row and column, is read in place by the AVX-512
/// kernel: rows contiguous in k whose [`MR`] lines spread over L1's sets
/// ([`rows_share_l1_set`]). Any other A is packed.
pub fn reads_a_in_place(rsa: isize, csa: isize) -> bool {
    csa == 1 && rows_share_l1_set(rsa, MR) <= L1_WAYS
}

/// An f32 GEMM implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SgemmKernel {
    /// `matrixmultiply::sgemm` (any CPU).
    MatrixMultiply,
    /// This crate's AVX2 + FMA kernel (`sgemm_avx2.rs`).
    Avx2,
    /// This module's AVX-512F kernel.
    Avx512,
}

/// An f32 GEMM that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SgemmKernelError {
    /// A name that is not a kernel.
    #[error("{0:?} is not an f32 GEMM: use avx512, avx2 or matrixmultiply")]
    Unknown(String),
    /// `ZERO_SGEMM` set to a name that is not a kernel.
    #[error(
        "{SGEMM_KERNEL_ENV}={0:?} is not an f32 GEMM: use avx512, avx2 or matrixmultiply (or unset it)"
    )]
    BadEnv(String),
    /// A kernel this CPU does not run.
    #[error("f32 GEMM {requested} requested but this CPU runs at best {best}")]
    Unavailable {
        /// The forced kernel.
        requested: SgemmKernel,
        /// The fastest this CPU runs.
        best: SgemmKernel,
    },
}

impl SgemmKernel {
    /// Every kernel, slowest first.
    pub const ALL: [SgemmKernel; 3] = [
        SgemmKernel::MatrixMultiply,
        SgemmKernel::Avx2,
        SgemmKernel::Avx512,
    ];

    /// The kernel this process uses: the one `ZERO_SGEMM` forces, else the fastest this CPU
    /// runs. Read once. A bad value is logged as an error and ignored (callers that can
    /// fail call [`SgemmKernel::from_env`] first, as `zero-bench micro` does).
    pub fn detect() -> Self {
        static CHOSEN: OnceLock<SgemmKernel> = OnceLock::new();
        *CHOSEN.get_or_init(|| match SgemmKernel::from_env() {
            Ok(Some(k)) => k,
            Ok(None) => SgemmKernel::best(),
            Err(e) => {
                let best = SgemmKernel::best();
                log::error!("{e}; using {best}");
                best
            }
        })
    }

    /// The fastest kernel this CPU runs.
    pub fn best() -> Self {
        if SgemmKernel::Avx512.is_available() {
            SgemmKernel::Avx512
        } else if SgemmKernel::Avx2.is_available() {
            SgemmKernel::Avx2
        } else {
            SgemmKernel::MatrixMultiply
        }
    }

    /// Whether this CPU runs the kernel.
    pub fn is_available(self) -> bool {
        match self {
            SgemmKernel::MatrixMultiply => true,
            #[cfg(target_arch = "x86_64")]
            SgemmKernel::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            SgemmKernel::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The kernels this CPU runs, slowest first.
    pub fn available() -> Vec<Self> {
        SgemmKernel::ALL
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }

    /// This kernel, or an error if this CPU does not run it.
    pub fn force(self) -> Result<Self, SgemmKernelError> {
        if self.is_available() {
            Ok(self)
        } else {
            Err(SgemmKernelError::Unavailable {
                requested: self,
                best: SgemmKernel::best(),
            })
        }
    }

    /// The kernel `ZERO_SGEMM` forces (`None` when unset or empty); an error for a name
    /// that is not a kernel or a kernel this CPU does not run.
    pub fn from_env() -> Result<Option<Self>, SgemmKernelError> {
        let Some(value) = crate::env::setting(SGEMM_KERNEL_ENV) else {
            return Ok(None);
        };
        let kernel = value
            .parse::<SgemmKernel>()
            .map_err(|_| SgemmKernelError::BadEnv(value.clone()))?;
        kernel.force().map(Some)
    }

    /// Short name (what `ZERO_SGEMM` takes), for logs and benchmark tables.
    pub const fn name(self) -> &'static str {
        match self {
            SgemmKernel::MatrixMultiply => "matrixmultiply",
            SgemmKernel::Avx2 => "avx2",
            SgemmKernel::Avx512 => "avx512",
        }
    }
}

impl std::fmt::Display for SgemmKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SgemmKernel {
    type Err = SgemmKernelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        SgemmKernel::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| SgemmKernelError::Unknown(s.to_string()))
    }
}

/// `C = alpha * A B + beta * C` (A: m x k, B: k x n, C: m x n; element (i, j) of A at
/// `a + i*rsa + j*csa`, likewise B and C) with `kernel`. `beta == 0` does not read C.
///
/// # Safety
/// The pointers with the given dimensions and strides must address valid memory, `c`
/// must not alias `a` or `b`, and `kernel` is one this CPU runs
/// ([`SgemmKernel::is_available`]).
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm(
    kernel: SgemmKernel,
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
    match kernel {
        #[cfg(target_arch = "x86_64")]
        SgemmKernel::Avx512 if m > 0 && n > 0 && k > 0 => {
            // SAFETY: forwarded contract; the caller checked this CPU has AVX-512F.
            unsafe { avx512::sgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
        }
        #[cfg(target_arch = "x86_64")]
        SgemmKernel::Avx2 if m > 0 && n > 0 && k > 0 => {
            // SAFETY: forwarded contract; the caller checked this CPU has AVX2 and FMA.
            unsafe {
                let bf16 = false;
                super::sgemm_avx2::sgemm(
                    bf16, m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
                )
            }
        }
        // K = 0 (C = beta C) and empty C go to matrixmultiply, which handles them.
        _ => {
            // SAFETY: forwarded contract.
            unsafe {
                matrixmultiply::sgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
            }
        }
    }
}

/// 64 bytes of f32 at a 64-byte boundary: the packing buffers of this crate's kernels
/// (here and `sgemm_avx2.rs`) are vectors of these, so every packed panel starts on a
/// cache line and no vector load of a k step straddles two.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// This thread's packing buffers (A block, B block), kept between calls.
    static PACKS: std::cell::RefCell<(Vec<Line>, Vec<Line>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// A buffer of at least `floats` f32, 64-byte aligned.
#[cfg(target_arch = "x86_64")]
fn reserve(buf: &mut Vec<Line>, floats: usize) -> *mut f32 {
    let lines = floats.div_ceil(16);
    if buf.len() < lines {
        buf.resize(lines, Line([0.0; 16]));
    }
    buf.as_mut_ptr().cast()
}

/// `f` on this thread's packing buffers for A and B, of at least `a_floats` and `b_floats`
/// f32, 64-byte aligned. The kept buffers are never borrowed twice (no call re-enters),
/// but if they were, a fresh pair would do as well.
#[cfg(target_arch = "x86_64")]
pub(super) fn with_packs<R>(
    a_floats: usize,
    b_floats: usize,
    f: impl FnOnce(*mut f32, *mut f32) -> R,
) -> R {
    PACKS.with(|packs| {
        let mut fresh = (Vec::new(), Vec::new());
        let mut kept = packs.try_borrow_mut();
        let (pack_a, pack_b) = match kept.as_deref_mut() {
            Ok(p) => (&mut p.0, &mut p.1),
            Err(_) => (&mut fresh.0, &mut fresh.1),
        };
        f(reserve(pack_a, a_floats), reserve(pack_b, b_floats))
    })
}

/// Where a micro-tile of this crate's kernels goes: `rows` x `cols` of C.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub rows: usize,
    pub cols: usize,
    pub c: *mut f32,
    pub rsc: isize,
    pub csc: isize,
}

#[cfg(target_arch = "x86_64")]
impl Tile {
    /// `C = fma(alpha, sum, beta * C)` (`alpha * sum` when beta is 0; C not read) one
    /// element at a time, the sum of row i, column j at `sums[i * stride + j]`: the same
    /// operations as a kernel's vector update, for tiles it does not cover.
    ///
    /// # Safety
    /// The tile addresses valid C; `sums` holds `rows` rows of `cols` at that stride.
    pub(super) unsafe fn update_each(self, sums: &[f32], stride: usize, alpha: f32, beta: f32) {
        for i in 0..self.rows {
            for j in 0..self.cols {
                // SAFETY: element (i, j) of the tile (contract).
                unsafe {
                    let dst = self.c.offset(i as isize * self.rsc + j as isize * self.csc);
                    let sum = sums[i * stride + j];
                    *dst = if beta == 0.0 {
                        alpha * sum
                    } else {
                        alpha.mul_add(sum, beta * *dst)
                    };
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{k_block, reads_a_in_place, with_packs, Tile, MC, MR, NC, NR};
    use std::arch::x86_64::*;

    /// See [`super::sgemm`].
    ///
    /// # Safety
    /// As [`super::sgemm`], with AVX-512F available and m, k, n > 0.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn sgemm(
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
        let a_floats = MC.min(m.next_multiple_of(MR)) * kb;
        let b_floats = NC.min(n.next_multiple_of(NR)) * kb;
        with_packs(a_floats, b_floats, |pa, pb| {
            // SAFETY: forwarded contract; the buffers hold the blocks (sizes above).
            unsafe {
                blocked(
                    m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, pa, pb,
                )
            }
        })
    }

    /// The loop nest over blocks (see the module comment).
    ///
    /// # Safety
    /// As [`sgemm`]; `pa` holds MC x KC and `pb` KC x NC floats (or the smaller blocks
    /// this call uses).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn blocked(
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
        let in_place = reads_a_in_place(rsa, csa);
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            let kb = k_block(k);
            for pc in (0..k).step_by(kb) {
                let kc = kb.min(k - pc);
                // The first K block applies beta; the later ones add into C.
                let first = pc == 0;
                // SAFETY: rows pc..pc + kc and columns jc..jc + nc are inside B.
                unsafe {
                    pack_b(
                        kc,
                        nc,
                        b.offset(pc as isize * rsb + jc as isize * csb),
                        rsb,
                        csb,
                        pb,
                    )
                };
                for ic in (0..m).step_by(MC) {
                    let mc = MC.min(m - ic);
                    let a_block = a.offset(ic as isize * rsa + pc as isize * csa);
                    // Rows of A contiguous in k are read in place, 14 row streams, as
                    // oneDNN's kernels do: packing them (a transpose) cost ~0.35 ns per
                    // element, 10% of a 4096x256x256 product. Only a last panel of fewer
                    // than MR rows is packed (its zero rows must not be read from A), and
                    // all of it when its rows would crowd one L1 set (`reads_a_in_place`).
                    let packed_from = if in_place { mc / MR * MR } else { 0 };
                    // SAFETY: rows ic + packed_from..ic + mc and columns pc..pc + kc are
                    // inside A; the panels go to the start of `pa`, which holds them.
                    // With no rows left to pack the pointer may point past A
                    // (`wrapping_offset`), and nothing is read through it.
                    unsafe {
                        pack_a(
                            mc - packed_from,
                            kc,
                            a_block.wrapping_offset(packed_from as isize * rsa),
                            rsa,
                            csa,
                            pa,
                        )
                    };
                    // A micro-tile outside, B's micro-panels inside: the tile's MR x kc of A
                    // (21-43 KiB) stays in L1 over the block's nc / NR panels and only B
                    // streams from L2 (128 bytes per k, not 184 with A re-read per panel).
                    // With the B prefetch in `micro_kernel`: 1-9% faster on the small GPT's
                    // shapes at M = 1024, 15% on 4096x256x1024 (1 thread). Every tile is
                    // computed as before, so the bits are the same.
                    for ir in (0..mc).step_by(MR) {
                        let rows = MR.min(mc - ir);
                        for jr in (0..nc).step_by(NR) {
                            let cols = NR.min(nc - jr);
                            let tile = Tile {
                                rows,
                                cols,
                                c: c.offset((ic + ir) as isize * rsc + (jc + jr) as isize * csc),
                                rsc,
                                csc,
                            };
                            let beta = if first { beta } else { 1.0 };
                            let pb = pb.add(jr * kc);
                            // SAFETY: the panels lie in A or the packed blocks; the tile in C.
                            unsafe {
                                if ir < packed_from {
                                    let rows = a_block.offset(ir as isize * rsa);
                                    micro_kernel::<true, MR>(kc, rows, rsa, pb, alpha, beta, tile)
                                } else {
                                    let panel = pa.add((ir - packed_from) * kc);
                                    packed_tile(kc, panel, pb, alpha, beta, tile)
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Packs rows 0..mc, columns 0..kc of A into micro-panels of MR rows: panel r holds
    /// element (r*MR + i, p) at `r*MR*kc + p*MR + i`; rows past mc are zero.
    ///
    /// # Safety
    /// The view addresses valid memory; `out` holds mc rounded up to MR times kc floats.
    #[target_feature(enable = "avx512f")]
    unsafe fn pack_a(mc: usize, kc: usize, a: *const f32, rsa: isize, csa: isize, out: *mut f32) {
        for r0 in (0..mc).step_by(MR) {
            let rows = MR.min(mc - r0);
            // SAFETY: inside the view and the buffer (contract).
            unsafe {
                let panel = out.add(r0 * kc);
                let src = a.offset(r0 as isize * rsa);
                let mut p0 = 0;
                if csa == 1 {
                    // Rows contiguous in k: 16 x 16 blocks transposed in registers, each
                    // k's MR row values stored at once.
                    while p0 + 16 <= kc {
                        let cols = transpose16(src.add(p0), rsa, rows);
                        for (p, v) in cols.iter().enumerate() {
                            _mm512_mask_storeu_ps(panel.add((p0 + p) * MR), lane_mask(MR), *v);
                        }
                        p0 += 16;
                    }
                } else if rsa == 1 {
                    // Columns contiguous (A^T stored row-major, as in a weight gradient):
                    // each k's rows are one masked load, zeros past `rows`.
                    let mask = lane_mask(rows);
                    while p0 < kc {
                        let v = _mm512_maskz_loadu_ps(mask, src.offset(p0 as isize * csa));
                        _mm512_mask_storeu_ps(panel.add(p0 * MR), lane_mask(MR), v);
                        p0 += 1;
                    }
                }
                for p in p0..kc {
                    for i in 0..MR {
                        *panel.add(p * MR + i) = if i < rows {
                            *src.offset(i as isize * rsa + p as isize * csa)
                        } else {
                            0.0
                        };
                    }
                }
            }
        }
    }

    /// A 16 x 16 block transposed: `lines` (at most 16) rows of 16 floats at `src`, `stride`
    /// apart, rows past `lines` taken as zeros (not read); element l of the result's vector
    /// p is element p of row l. Three shuffle stages (32-bit, 64-bit, 128-bit lanes) and
    /// one across 128-bit lanes.
    ///
    /// # Safety
    /// The `lines` rows of 16 floats are readable.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn transpose16(src: *const f32, stride: isize, lines: usize) -> [__m512; 16] {
        let mut r = [_mm512_setzero_ps(); 16];
        for (l, row) in r.iter_mut().enumerate().take(lines) {
            // SAFETY: row l < lines (contract).
            *row = unsafe { _mm512_loadu_ps(src.offset(l as isize * stride)) };
        }
        let mut t = [_mm512_setzero_ps(); 16];
        // Pairs of rows interleaved by 32 bits: t[2q] = (r0 r1) low halves of each 128-bit
        // lane, t[2q + 1] the high halves (rows 2q, 2q + 1).
        for q in 0..8 {
            t[2 * q] = _mm512_unpacklo_ps(r[2 * q], r[2 * q + 1]);
            t[2 * q + 1] = _mm512_unpackhi_ps(r[2 * q], r[2 * q + 1]);
        }
        // Then by 64 bits: each 128-bit lane of r[4q + x] holds one k of rows 4q..4q + 4.
        for q in 0..4 {
            let (lo0, hi0) = (_mm512_castps_pd(t[4 * q]), _mm512_castps_pd(t[4 * q + 2]));
            let (lo1, hi1) = (
                _mm512_castps_pd(t[4 * q + 1]),
                _mm512_castps_pd(t[4 * q + 3]),
            );
            r[4 * q] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, hi0));
            r[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, hi0));
            r[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo1, hi1));
            r[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo1, hi1));
        }
        // 128-bit lanes: even lanes (0x88) and odd lanes (0xDD) of row groups 4 apart.
        for q in 0..2 {
            for x in 0..4 {
                t[8 * q + x] = _mm512_shuffle_f32x4::<0x88>(r[8 * q + x], r[8 * q + 4 + x]);
                t[8 * q + 4 + x] = _mm512_shuffle_f32x4::<0xDD>(r[8 * q + x], r[8 * q + 4 + x]);
            }
        }
        for x in 0..8 {
            r[x] = _mm512_shuffle_f32x4::<0x88>(t[x], t[8 + x]);
            r[8 + x] = _mm512_shuffle_f32x4::<0xDD>(t[x], t[8 + x]);
        }
        r
    }

    /// Packs rows 0..kc, columns 0..nc of B into micro-panels of NR columns: panel r holds
    /// element (p, r*NR + j) at `r*NR*kc + p*NR + j`; columns past nc are zero.
    ///
    /// # Safety
    /// The view addresses valid memory; `out` holds kc times nc rounded up to NR floats.
    #[target_feature(enable = "avx512f")]
    unsafe fn pack_b(kc: usize, nc: usize, b: *const f32, rsb: isize, csb: isize, out: *mut f32) {
        for j0 in (0..nc).step_by(NR) {
            let cols = NR.min(nc - j0);
            // SAFETY: inside the view and the buffer (contract).
            unsafe {
                let panel = out.add(j0 * kc);
                let src = b.offset(j0 as isize * csb);
                if csb == 1 {
                    // Rows of B are contiguous: masked 16-lane copies, zeros past nc.
                    let lo = lane_mask(cols);
                    let hi = lane_mask(cols.saturating_sub(16));
                    for p in 0..kc {
                        let row = src.offset(p as isize * rsb);
                        let dst = panel.add(p * NR);
                        _mm512_storeu_ps(dst, _mm512_maskz_loadu_ps(lo, row));
                        _mm512_storeu_ps(
                            dst.add(16),
                            _mm512_maskz_loadu_ps(hi, row.wrapping_add(16)),
                        );
                    }
                } else if rsb == 1 {
                    // Columns contiguous in k (B^T stored row-major, as the linear layers'
                    // weights): 16 x 16 blocks transposed in registers.
                    let mut p0 = 0;
                    while p0 + 16 <= kc {
                        for half in 0..2 {
                            let lines = cols.saturating_sub(16 * half).min(16);
                            let rows = transpose16(
                                src.wrapping_offset((16 * half) as isize * csb + p0 as isize),
                                csb,
                                lines,
                            );
                            for (p, v) in rows.iter().enumerate() {
                                _mm512_storeu_ps(panel.add((p0 + p) * NR + 16 * half), *v);
                            }
                        }
                        p0 += 16;
                    }
                    for j in 0..NR {
                        let col = src.wrapping_offset(j as isize * csb);
                        for p in p0..kc {
                            *panel.add(p * NR + j) = if j < cols { *col.add(p) } else { 0.0 };
                        }
                    }
                } else {
                    // Columns (B^T's rows) read in order, written at stride NR.
                    for j in 0..NR {
                        let col = src.wrapping_offset(j as isize * csb);
                        for p in 0..kc {
                            *panel.add(p * NR + j) = if j < cols {
                                *col.offset(p as isize * rsb)
                            } else {
                                0.0
                            };
                        }
                    }
                }
            }
        }
    }

    /// The first `lanes` (at most 16) of 16.
    #[inline(always)]
    fn lane_mask(lanes: usize) -> __mmask16 {
        if lanes >= 16 {
            0xFFFF
        } else {
            ((1u32 << lanes) - 1) as __mmask16
        }
    }

    /// k steps ahead that the micro-kernel prefetches packed B (it streams from L2 now that
    /// the A tile is the operand kept in L1): 1.5-3% on the small GPT's shapes.
    const PREFETCH_B: usize = 16;
    /// k steps per iteration of the packed-A micro-kernel's loop (fewer loop and address
    /// operations beside the 28 FMAs: ~1.5% on weight gradients); not for direct A, whose
    /// 14 row addresses then no longer fit in registers (LLVM spilled them: 0.57x).
    const UNROLL: usize = 4;

    /// A packed micro-tile through the kernel with as many rows as the tile has, so a last
    /// panel of fewer than MR rows (M = 1024: 2 rows after 73 full tiles) costs its rows'
    /// FMAs, not a full tile's. Each element of C is the same FMA chain as in a full tile.
    ///
    /// # Safety
    /// As [`micro_kernel`] with `DIRECT` false.
    #[target_feature(enable = "avx512f")]
    unsafe fn packed_tile(kc: usize, a: *const f32, b: *const f32, alpha: f32, beta: f32, t: Tile) {
        macro_rules! rows {
            ($($r:literal)*) => {
                match t.rows {
                    // SAFETY: forwarded contract.
                    $($r => unsafe { micro_kernel::<false, $r>(kc, a, 1, b, alpha, beta, t) },)*
                    _ => unsafe { micro_kernel::<false, MR>(kc, a, 1, b, alpha, beta, t) },
                }
            };
        }
        rows!(1 2 3 4 5 6 7 8 9 10 11 12 13)
    }

    /// One micro-tile: `acc = A_panel B_panel` over kc in 28 zmm, then
    /// `C = fma(alpha, acc, beta * C)` (`alpha * acc` when beta is 0; C not read). A is
    /// MR rows of A itself, `rsa` apart, contiguous in k (`DIRECT`), or a packed panel
    /// (`rsa` unused); either way each accumulator sees the same FMAs in the same order.
    ///
    /// # Safety
    /// `a` holds MR rows of kc floats (`DIRECT`) or kc x MR packed floats, `b` kc x NR
    /// packed floats; the tile addresses valid C and has at most `ROWS` rows (the first
    /// `ROWS` rows of A are read).
    #[target_feature(enable = "avx512f")]
    unsafe fn micro_kernel<const DIRECT: bool, const ROWS: usize>(
        kc: usize,
        a: *const f32,
        rsa: isize,
        b: *const f32,
        alpha: f32,
        beta: f32,
        t: Tile,
    ) {
        // The tile's rows of C are cold (a row band of C is touched once per K block):
        // ask for them now so they arrive while the k loop runs, not stall the update.
        for i in 0..t.rows {
            let row = t.c.wrapping_offset(i as isize * t.rsc);
            // A prefetch is a hint: it never faults, whatever the address (safe to call).
            _mm_prefetch::<_MM_HINT_T0>(row.cast());
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_offset(15 * t.csc).cast());
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_offset((t.cols as isize - 1) * t.csc).cast());
        }
        let mut acc = [_mm512_setzero_ps(); 2 * MR];
        macro_rules! step {
            ($p:expr) => {{
                let p = $p;
                // A hint: never faults, also past the panel's end.
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add((p + PREFETCH_B) * NR).cast());
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add((p + PREFETCH_B) * NR + 16).cast());
                // SAFETY: k step p of both panels (contract).
                unsafe {
                    let b0 = _mm512_loadu_ps(b.add(p * NR));
                    let b1 = _mm512_loadu_ps(b.add(p * NR + 16));
                    for i in 0..ROWS {
                        let ai = _mm512_set1_ps(if DIRECT {
                            *a.offset(i as isize * rsa).add(p)
                        } else {
                            *a.add(p * MR + i)
                        });
                        acc[2 * i] = _mm512_fmadd_ps(ai, b0, acc[2 * i]);
                        acc[2 * i + 1] = _mm512_fmadd_ps(ai, b1, acc[2 * i + 1]);
                    }
                }
            }};
        }
        // Each accumulator still takes k steps 0, 1, 2, ... in order: unrolling changes
        // no FMA's operands or order.
        let mut p = 0;
        while !DIRECT && p + UNROLL <= kc {
            for u in 0..UNROLL {
                step!(p + u);
            }
            p += UNROLL;
        }
        while p < kc {
            step!(p);
            p += 1;
        }
        let valpha = _mm512_set1_ps(alpha);
        let vbeta = _mm512_set1_ps(beta);
        if t.csc == 1 {
            // Rows of C are contiguous: 16-lane updates, masked past `cols`.
            let masks = [lane_mask(t.cols), lane_mask(t.cols.saturating_sub(16))];
            for i in 0..t.rows {
                for (h, &mask) in masks.iter().enumerate() {
                    // SAFETY: row i, lanes under `mask`, are inside the tile; masked-off
                    // lanes are neither read nor written and do not fault (AVX-512 fault
                    // suppression), so the pointer may lie past C there.
                    unsafe {
                        let dst = t.c.offset(i as isize * t.rsc).wrapping_add(16 * h);
                        let out = if beta == 0.0 {
                            _mm512_mul_ps(valpha, acc[2 * i + h])
                        } else {
                            let old = _mm512_mul_ps(vbeta, _mm512_maskz_loadu_ps(mask, dst));
                            _mm512_fmadd_ps(valpha, acc[2 * i + h], old)
                        };
                        _mm512_mask_storeu_ps(dst, mask, out);
                    }
                }
            }
        } else {
            // Any other layout: through a stack tile, the same operations per element.
            let mut tile = [0.0f32; MR * NR];
            for (i, pair) in acc.chunks_exact(2).enumerate() {
                // SAFETY: row i of the stack tile.
                unsafe {
                    _mm512_storeu_ps(tile.as_mut_ptr().add(i * NR), pair[0]);
                    _mm512_storeu_ps(tile.as_mut_ptr().add(i * NR + 16), pair[1]);
                }
            }
            // SAFETY: the tile (contract) and its sums, NR apart.
            unsafe { t.update_each(&tile, NR, alpha, beta) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in [-1, 1] from an index (no two neighbours alike).
    fn val(i: usize, salt: usize) -> f32 {
        (((i + salt).wrapping_mul(2_654_435_761) >> 9) % 2001) as f32 / 1000.0 - 1.0
    }

    /// Strides of an r x c view: row-major with `pad` extra per row, or column-major.
    fn strides(r: usize, c: usize, row_major: bool, pad: usize) -> (isize, isize, usize) {
        if row_major {
            ((c + pad) as isize, 1, r * (c + pad))
        } else {
            (1, (r + pad) as isize, c * (r + pad))
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check(
        kernel: SgemmKernel,
        m: usize,
        k: usize,
        n: usize,
        a_rm: bool,
        b_rm: bool,
        c_rm: bool,
        alpha: f32,
        beta: f32,
    ) {
        let (rsa, csa, la) = strides(m, k, a_rm, 3);
        let (rsb, csb, lb) = strides(k, n, b_rm, 1);
        let (rsc, csc, lc) = strides(m, n, c_rm, 2);
        let a: Vec<f32> = (0..la.max(1)).map(|i| val(i, 1)).collect();
        let b: Vec<f32> = (0..lb.max(1)).map(|i| val(i, 2)).collect();
        let init: Vec<f32> = (0..lc.max(1))
            .map(|i| if beta == 0.0 { f32::NAN } else { val(i, 3) })
            .collect();
        let mut c = init.clone();
        // SAFETY: the views lie in the vectors (strides above); kernel checked available.
        unsafe {
            sgemm(
                kernel,
                m,
                k,
                n,
                alpha,
                a.as_ptr(),
                rsa,
                csa,
                b.as_ptr(),
                rsb,
                csb,
                beta,
                c.as_mut_ptr(),
                rsc,
                csc,
            )
        };
        let at =
            |i: usize, j: usize, rs: isize, cs: isize| (i as isize * rs + j as isize * cs) as usize;
        // Higham's bound for a dot product of length k, plus alpha and beta's roundings:
        // |error| <= gamma_{k+2} (|alpha| sum |a||b| + |beta c|), gamma_n = n u / (1 - n u).
        let u = f32::EPSILON as f64 / 2.0;
        let gamma = (k + 2) as f64 * u / (1.0 - (k + 2) as f64 * u);
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut abs) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let t = a[at(i, p, rsa, csa)] as f64 * b[at(p, j, rsb, csb)] as f64;
                    exact += t;
                    abs += t.abs();
                }
                let old = if beta == 0.0 {
                    0.0
                } else {
                    init[at(i, j, rsc, csc)] as f64
                };
                let want = alpha as f64 * exact + beta as f64 * old;
                let bound = gamma * (alpha.abs() as f64 * abs + (beta as f64 * old).abs()) + 1e-30;
                let got = c[at(i, j, rsc, csc)] as f64;
                assert!(
                    (got - want).abs() <= bound,
                    "{kernel} {m}x{k}x{n} a_rm={a_rm} b_rm={b_rm} c_rm={c_rm} alpha={alpha} beta={beta} ({i},{j}): {got} vs {want} (bound {bound:e})"
                );
            }
        }
    }

    #[test]
    fn every_kernel_matches_f64_reference_on_edge_shapes_and_layouts() {
        let shapes = [
            (1, 1, 1),
            (3, 0, 5),
            (1, 7, 1),
            (14, 16, 32),
            (15, 17, 33),
            (13, 31, 47),
            (29, 300, 65),
            (50, 513, 70),
            (MR * 25, 40, NR * 2 + 3),
        ];
        for kernel in SgemmKernel::available() {
            for &(m, k, n) in &shapes {
                for layout in 0..8 {
                    let (a_rm, b_rm, c_rm) = (layout & 1 == 0, layout & 2 == 0, layout & 4 == 0);
                    check(kernel, m, k, n, a_rm, b_rm, c_rm, 1.0, 0.0);
                    check(kernel, m, k, n, a_rm, b_rm, c_rm, -0.5, 1.5);
                }
            }
        }
    }

    #[test]
    fn wide_n_and_long_k_cross_block_edges() {
        // More than one NC block and several K blocks, with ragged ends.
        for kernel in SgemmKernel::available() {
            check(kernel, 20, 2 * KC + 5, NC + 40, true, false, true, 1.0, 1.0);
        }
    }

    /// A row band computed alone has the bits it has in the whole product.
    #[test]
    fn row_bands_have_the_bits_of_the_whole() {
        for kernel in SgemmKernel::available() {
            for &(m, k, n, a_rm, b_rm) in &[
                (100, 600, 70, true, false),
                (61, 33, 129, false, true),
                (MR * 26 + 5, 300, 40, true, true),
            ] {
                let (rsa, csa, la) = strides(m, k, a_rm, 0);
                let (rsb, csb, lb) = strides(k, n, b_rm, 0);
                let a: Vec<f32> = (0..la).map(|i| val(i, 4)).collect();
                let b: Vec<f32> = (0..lb).map(|i| val(i, 5)).collect();
                let run = |r0: usize, r1: usize, c: &mut [f32]| {
                    // SAFETY: rows r0..r1 of A and C lie in their vectors.
                    unsafe {
                        sgemm(
                            kernel,
                            r1 - r0,
                            k,
                            n,
                            1.0,
                            a.as_ptr().offset(r0 as isize * rsa),
                            rsa,
                            csa,
                            b.as_ptr(),
                            rsb,
                            csb,
                            0.0,
                            c.as_mut_ptr().add(r0 * n),
                            n as isize,
                            1,
                        )
                    }
                };
                let mut whole = vec![0.0f32; m * n];
                run(0, m, &mut whole);
                for split in [1, 7, MR, m / 2, m - 1] {
                    let mut banded = vec![f32::NAN; m * n];
                    run(0, split, &mut banded);
                    run(split, m, &mut banded);
                    let same = whole
                        .iter()
                        .zip(&banded)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{kernel} {m}x{k}x{n}: split at {split} changed bits");
                }
            }
        }
    }

    #[test]
    fn rows_whose_lines_share_an_l1_set_are_counted() {
        assert_eq!(rows_share_l1_set(1024, MR), MR); // 4 KiB apart: one set
        assert_eq!(rows_share_l1_set(3072, MR), MR); // 12 KiB: one set
        assert_eq!(rows_share_l1_set(-1024, MR), MR);
        assert_eq!(rows_share_l1_set(512, MR), 7); // 2 KiB: two sets
        assert_eq!(rows_share_l1_set(1040, MR), 1); // 4 KiB + a line: one set each
        assert_eq!(rows_share_l1_set(384, MR), 2); // 1.5 KiB: eight sets
        assert_eq!(rows_share_l1_set(1, 0), 0);
        // One row broadcast (stride 0), or rows within one line: a single line.
        assert_eq!(rows_share_l1_set(0, MR), 1);
        assert_eq!(rows_share_l1_set(1, MR), 1);
        assert!(reads_a_in_place(1040, 1) && reads_a_in_place(0, 1));
        assert!(!reads_a_in_place(1024, 1) && !reads_a_in_place(1040, 2));
    }

    /// A whose rows crowd one L1 set is packed rather than read in place, with the same
    /// bits: the product at row stride 1024 (packed) equals that of the same A at 1040
    /// (read in place).
    #[test]
    fn crowded_rows_of_a_are_packed_with_the_same_bits() {
        // More than one MC block of rows, so the packing buffer is reused.
        let (m, k, n) = (MC + MR * 3 + 5, 1000, 70);
        for kernel in SgemmKernel::available() {
            let run = |lda: usize| {
                let mut a = vec![0.0f32; m * lda];
                for i in 0..m {
                    for p in 0..k {
                        a[i * lda + p] = val(i * k + p, 6);
                    }
                }
                let b: Vec<f32> = (0..k * n).map(|i| val(i, 7)).collect();
                let mut c = vec![f32::NAN; m * n];
                // SAFETY: A is m rows of lda >= k floats, B k x n, C m x n.
                unsafe {
                    sgemm(
                        kernel,
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        lda as isize,
                        1,
                        b.as_ptr(),
                        n as isize,
                        1,
                        0.0,
                        c.as_mut_ptr(),
                        n as isize,
                        1,
                    )
                };
                c
            };
            let (crowded, spread) = (run(1024), run(1040));
            assert!(!reads_a_in_place(1024, 1) && reads_a_in_place(1040, 1));
            let same = crowded
                .iter()
                .zip(&spread)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{kernel}: packed A changed the bits");
        }
    }

    #[test]
    fn k_blocks_cover_k_in_equal_whole_transposes() {
        for k in [1, 15, 16, 255, 256, 767, 768, 769, 1024, 3072, 4096, 10_000] {
            let kb = k_block(k);
            assert!(
                kb.is_multiple_of(16) && (16..=KC).contains(&kb),
                "k={k}: {kb}"
            );
            assert_eq!(k.div_ceil(kb), k.div_ceil(KC), "k={k}: fewest blocks");
        }
        assert_eq!(k_block(768), 768);
        assert_eq!(k_block(1024), 512);
    }

    #[test]
    fn kernel_names_parse_and_bad_ones_do_not() {
        for kernel in SgemmKernel::ALL {
            assert_eq!(kernel.name().parse::<SgemmKernel>(), Ok(kernel));
        }
        assert_eq!(" AVX512 ".parse::<SgemmKernel>(), Ok(SgemmKernel::Avx512));
        assert!("openblas".parse::<SgemmKernel>().is_err());
        assert!(SgemmKernel::MatrixMultiply.force().is_ok());
        assert!(SgemmKernel::available().contains(&SgemmKernel::best()));
    }
}
