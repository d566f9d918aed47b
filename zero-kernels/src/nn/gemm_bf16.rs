//! Matrix products with bf16 operands and f32 accumulation, for `precision = "bf16"` on
//! the CPU: `C = alpha * A B + beta * C` with A, B and C f32 in memory (any strides, as
//! `matrixmultiply` takes them), A and B rounded to bf16 (round to nearest even) as they
//! are packed. This is what a GPU's bf16 tensor cores compute (the CUDA device's
//! `MatmulPrecision::Bf16`), and what PyTorch's CPU autocast does to a linear layer's
//! inputs.
//!
//! Layout (the BLIS scheme): K is cut into blocks ([`KC`]; for AMX equal blocks of at
//! most [`AMX_KC`]), N into blocks whose packed B stays in L2 ([`NC`]; for AMX
//! [`AMX_B_BLOCK_BYTES`]); per block B is packed once into panels of [`NR`] columns and
//! A into bands of rows, both as *pairs*: one u32 holds the bf16 of k = 2p (low half) and
//! k = 2p + 1 (high half), the operand layout of AVX-512 BF16's `vdpbf16ps` and of AMX's
//! `tdpbf16ps` ("VNNI" layout), which add both products of a pair to an f32 lane. The
//! AVX-512 BF16 and portable micro-kernels keep a tile of f32 sums in registers, then add
//! it into C: `beta C + alpha T` for the first K block, `C + alpha T` after. The AMX path
//! (`sgemm_amx`) also blocks N so a block of packed B stays in L2, and its micro-kernel
//! loads C's 32 x 32 block into the tiles, adds the K block's products and stores it
//! back, so each element of C is one chain of `tdpbf16ps` steps over all of k.
//!
//! Four micro-kernels, chosen at run time ([`Bf16Kernel::detect`]; `ZERO_BF16_KERNEL`
//! forces one, [`BF16_KERNEL_ENV`]):
//! - AMX `tdpbf16ps` ([`Bf16Kernel::Amx`]): an [`AMX_MR`] x [`NR`] = 32 x 32 tile held as
//!   2 x 2 tiles of 16 x 16 f32 (tmm0-3), fed by two A tiles (16 rows x 16 pairs, tmm4-5)
//!   and two B tiles (16 pairs x 16 columns, tmm6-7) per 32 values of k. B's panels are
//!   the same as the other kernels' (a B tile is 16 rows of a panel, 4 * NR bytes apart);
//!   A is packed row-major (each row's pairs contiguous, as a tile row needs) and both
//!   are padded with zero pairs to a multiple of 16 pairs. Packing for AMX is AVX-512
//!   (`vcvtne2ps2bf16` rounding 32 values at once and flushing subnormals, as the tiles
//!   do; 16 x 16 transposes for A = X^T and B = W^T). Reached
//!   through `asm!` (the AMX intrinsics are not stable Rust); needs CPUID leaf 7 EDX bits
//!   22 (AMX-BF16) and 24 (AMX-TILE), AVX-512F, BW and BF16, and Linux's permission for the
//!   tile data (`arch_prctl`, requested once per process). The tile configuration is per thread: each call loads it and
//!   releases the tiles when done, so every thread that runs a band of rows
//!   (`Gemm::run`) configures its own.
//! - AVX-512 BF16 `vdpbf16ps` ([`Bf16Kernel::Avx512Bf16`]): [`MR`] x [`NR`] = 8 x 32 in
//!   16 zmm registers.
//! - AVX2 + FMA ([`Bf16Kernel::Avx2`], for CPUs without AVX-512 BF16, such as AMD Zen 2
//!   and 3, Intel CPUs without AVX512_BF16): the f32 GEMM of `sgemm_avx2.rs` with A and B
//!   rounded to bf16 as it packs them (a bf16 is an f32 with a zero low half), so the
//!   products are the same and run at the f32 kernel's speed; each element of C is one
//!   FMA chain over k in order per K block, as that kernel sums.
//! - Portable ([`Bf16Kernel::Portable`]): adds the same products as `vdpbf16ps` in the
//!   same order (per pair, the odd k first, as the instruction's definition in Intel's
//!   SDM says).
//!
//! A product of two bf16 is exact in f32, so each step is one f32 addition with one
//! rounding: the portable and `vdpbf16ps` kernels agree bit for bit except on
//! subnormals (the instruction flushes them to zero; see the tests). The AVX2 kernel
//! adds the same products in k's order (not the odd k of a pair first) and in its own K
//! blocks, so it agrees with them within the f32 summation bound (tested). `tdpbf16ps` rounds
//! with its own order and internal rounding (SDM, TDPBF16PS: round to nearest even,
//! denormal inputs and outputs flushed), so it agrees with the others within the f32
//! summation bound, not bit for bit (tested against that bound).

use crate::par::{SendPtr, Workers};
use std::sync::OnceLock;

/// Rows of A per micro-tile of the AVX-512 BF16 and portable kernels.
pub const MR: usize = 8;
/// Rows of A per micro-tile of the AMX kernel (two 16-row tiles).
pub const AMX_MR: usize = 32;
/// Columns of B per micro-tile (two 16-lane registers, or two 16-column AMX tiles).
pub const NR: usize = 32;
/// K per packed block (even, so pairs never straddle blocks).
pub const KC: usize = 256;
/// Rows of A per packed band of the AVX-512 BF16 and portable kernels (a multiple of
/// MR): 8 panels, packed together so that where A = X^T each 256-byte run of a row of
/// X (a column of A) is read once (`pack_a`); each panel then passes over all of a
/// column block's panels of B in turn.
pub const MC: usize = 64;
/// Most columns per packed block of B of the AVX-512 BF16 and portable kernels: at [`KC`] a
/// block is 512 KiB, which stays in L2 (1 MiB per core on Zen 4, 1-2 MiB on Intel's
/// AVX-512 BF16 parts) while every panel of A passes over it. Unblocked, an N = 50257
/// product packed 26 MB per K block, streamed from memory once per 8-row panel of A:
/// `micro gemm` 1024 x 768 x 50257 ran at 136 GFLOP/s (189 at N = 768) and 1.45x on 2
/// threads, bound by memory.
pub const NC: usize = NR * 32;
/// Most K per packed block of the AMX kernel (K is cut into equal blocks of whole tiles,
/// at most this long): with C's 32 x 32 block held in the tiles through a K block, C is
/// read and written once per block, so blocks are long.
pub const AMX_KC: usize = 1024;
/// Bytes of packed B per block of columns of the AMX kernel: its `K block x N block`
/// bf16 stays in L2 (2 MiB per core on Sapphire Rapids) while every 32-row band of A
/// passes over it.
pub const AMX_B_BLOCK_BYTES: usize = 3 << 19;
/// Pairs of k per AMX tile row: 64 bytes, the widest a tile row holds.
const AMX_PAIRS: usize = 16;

/// The environment variable that forces a bf16 micro-kernel: `amx`, `avx512` or
/// `portable` (unset or empty: the fastest this CPU runs).
pub const BF16_KERNEL_ENV: &str = "ZERO_BF16_KERNEL";

/// A bf16 micro-kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bf16Kernel {
    /// AMX `tdpbf16ps` (Intel Sapphire Rapids and later, on Linux).
    Amx,
    /// AVX-512 BF16 `vdpbf16ps`.
    Avx512Bf16,
    /// The AVX2 + FMA f32 GEMM on operands rounded to bf16 as packed.
    Avx2,
    /// Plain f32 arithmetic in `vdpbf16ps`'s order (any CPU).
    Portable,
}

/// The x86 features the AVX-512 BF16 and AVX2 kernels need, each on its own (so tests
/// can mask one, as a virtual machine's CPUID can).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
// Detected only on x86_64; elsewhere only the tests build one.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct X86Features {
    avx512f: bool,
    avx512bf16: bool,
    avx2: bool,
    fma: bool,
}

impl X86Features {
    #[cfg(target_arch = "x86_64")]
    fn detect() -> Self {
        X86Features {
            avx512f: std::arch::is_x86_feature_detected!("avx512f"),
            avx512bf16: std::arch::is_x86_feature_detected!("avx512bf16"),
            avx2: std::arch::is_x86_feature_detected!("avx2"),
            fma: std::arch::is_x86_feature_detected!("fma"),
        }
    }
}

/// A bf16 micro-kernel that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Bf16KernelError {
    /// A name that is not a kernel.
    #[error("{0:?} is not a bf16 kernel: use amx, avx512, avx2 or portable")]
    Unknown(String),
    /// `ZERO_BF16_KERNEL` set to a name that is not a kernel.
    #[error(
        "{BF16_KERNEL_ENV}={0:?} is not a bf16 kernel: use amx, avx512, avx2 or portable (or unset it)"
    )]
    BadEnv(String),
    /// A kernel this CPU (or OS) does not run.
    #[error("bf16 kernel {requested} requested but this CPU runs at best {best}")]
    Unavailable {
        /// The forced kernel.
        requested: Bf16Kernel,
        /// The fastest this CPU runs.
        best: Bf16Kernel,
    },
}

impl Bf16Kernel {
    /// Every kernel, slowest first.
    pub const ALL: [Bf16Kernel; 4] = [
        Bf16Kernel::Portable,
        Bf16Kernel::Avx2,
        Bf16Kernel::Avx512Bf16,
        Bf16Kernel::Amx,
    ];

    /// The kernel this process uses: the one `ZERO_BF16_KERNEL` forces, else the fastest
    /// this CPU runs. Read once. A bad value is logged as an error and ignored (callers
    /// that can fail call [`Bf16Kernel::from_env`] first, as `zero-bench micro` does).
    pub fn detect() -> Self {
        static CHOSEN: OnceLock<Bf16Kernel> = OnceLock::new();
        *CHOSEN.get_or_init(|| match Bf16Kernel::from_env() {
            Ok(Some(k)) => k,
            Ok(None) => Bf16Kernel::best(),
            Err(e) => {
                let best = Bf16Kernel::best();
                log::error!("{e}; using {best}");
                best
            }
        })
    }

    /// The fastest kernel this CPU runs: AMX, then AVX-512 BF16, then AVX2, then portable.
    pub fn best() -> Self {
        if Bf16Kernel::Amx.is_available() {
            Bf16Kernel::Amx
        } else if Bf16Kernel::Avx512Bf16.is_available() {
            Bf16Kernel::Avx512Bf16
        } else if Bf16Kernel::Avx2.is_available() {
            Bf16Kernel::Avx2
        } else {
            Bf16Kernel::Portable
        }
    }

    /// Whether this CPU (and, for AMX, the OS) runs the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Bf16Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Bf16Kernel::Avx512Bf16 | Bf16Kernel::Avx2 => self.runs_with(X86Features::detect()),
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            Bf16Kernel::Amx => amx::usable(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Whether a CPU with `f` runs the kernel; AMX (which also needs the OS's grant)
    /// never here, see [`Bf16Kernel::is_available`].
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn runs_with(self, f: X86Features) -> bool {
        match self {
            Bf16Kernel::Portable => true,
            // The `vdpbf16ps` kernel packs its operands with AVX2 (`pack_v3`). Every AVX-512
            // BF16 chip has AVX2, but a hypervisor's CPUID mask can hide it.
            Bf16Kernel::Avx512Bf16 => f.avx512f && f.avx512bf16 && f.avx2,
            Bf16Kernel::Avx2 => f.avx2 && f.fma,
            Bf16Kernel::Amx => false,
        }
    }

    /// The kernels this CPU runs, slowest first (always includes `Portable`).
    pub fn available() -> Vec<Self> {
        Bf16Kernel::ALL
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }

    /// This kernel, or an error if this CPU does not run it (tests and benchmarks force
    /// each kernel this way, as `Exec::with_isa` forces an instruction-set level).
    pub fn force(self) -> Result<Self, Bf16KernelError> {
        if self.is_available() {
            Ok(self)
        } else {
            Err(Bf16KernelError::Unavailable {
                requested: self,
                best: Bf16Kernel::best(),
            })
        }
    }

    /// The kernel `ZERO_BF16_KERNEL` forces (`None` when unset or empty); an error for a
    /// name that is not a kernel or a kernel this CPU does not run.
    pub fn from_env() -> Result<Option<Self>, Bf16KernelError> {
        let Some(value) = crate::env::setting(BF16_KERNEL_ENV) else {
            return Ok(None);
        };
        let kernel = value
            .parse::<Bf16Kernel>()
            .map_err(|_| Bf16KernelError::BadEnv(value.clone()))?;
        kernel.force().map(Some)
    }

    /// Short name (what `ZERO_BF16_KERNEL` takes), for logs and benchmark tables.
    pub const fn name(self) -> &'static str {
        match self {
            Bf16Kernel::Amx => "amx",
            Bf16Kernel::Avx512Bf16 => "avx512",
            Bf16Kernel::Avx2 => "avx2",
            Bf16Kernel::Portable => "portable",
        }
    }
}

impl std::fmt::Display for Bf16Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Bf16Kernel {
    type Err = Bf16KernelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Bf16Kernel::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| Bf16KernelError::Unknown(s.to_string()))
    }
}

/// AMX through inline assembly: detection, the tile configuration, the micro-kernel.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx {
    use super::{a_row_stride, AMX_MR, AMX_PAIRS, NR};
    use std::arch::asm;
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    use std::sync::OnceLock;

    /// `arch_prctl` request for permission to use an extended state component (Linux,
    /// `asm/prctl.h`).
    const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
    /// The XSAVE state component of the AMX tile data (SDM Vol. 1, 13.1: component 18).
    const XFEATURE_XTILEDATA: libc::c_ulong = 18;

    /// CPUID says AMX-TILE and AMX-BF16 and Linux grants the tile data to this process
    /// (asked once; the grant is process-wide, so threads started later have it too).
    pub(super) fn usable() -> bool {
        static USABLE: OnceLock<bool> = OnceLock::new();
        *USABLE.get_or_init(|| {
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            // CPUID leaf 7 exists when leaf 0 reports it (SDM Vol. 2, CPUID).
            if __cpuid(0).eax < 7 {
                return false;
            }
            // Leaf 7 subleaf 0, EDX: bit 22 AMX-BF16, bit 24 AMX-TILE.
            let edx = __cpuid_count(7, 0).edx;
            if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
                return false;
            }
            // The packing around the tiles is AVX-512 with BF16's conversions (every AMX
            // CPU has them).
            if !std::arch::is_x86_feature_detected!("avx512f")
                || !std::arch::is_x86_feature_detected!("avx512bw")
                || !std::arch::is_x86_feature_detected!("avx512bf16")
            {
                return false;
            }
            // SAFETY: arch_prctl with this request takes two integers and reads or writes
            // no memory of ours; a kernel without AMX support returns an error.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            rc == 0
        })
    }

    /// The tiles of this thread, configured for the micro-kernel; released on drop.
    pub(super) struct Tiles(());

    impl Tiles {
        /// Load the tile configuration (palette 1; tmm0-7 all 16 rows x 64 bytes).
        ///
        /// # Safety
        /// [`usable`] returned true.
        pub(super) unsafe fn configure() -> Tiles {
            // LDTILECFG's 64-byte operand (SDM Vol. 2, LDTILECFG): byte 0 the palette,
            // byte 1 the start row, bytes 16 + 2t the bytes per row of tmm t (u16), byte
            // 48 + t its rows.
            #[repr(C, align(64))]
            struct Config([u8; 64]);
            let mut cfg = Config([0; 64]);
            cfg.0[0] = 1;
            for t in 0..8 {
                cfg.0[16 + 2 * t] = 64;
                cfg.0[48 + t] = 16;
            }
            // SAFETY: AMX is usable (the caller's contract); the operand is 64 readable
            // bytes, a valid palette-1 configuration.
            unsafe {
                asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly, preserves_flags));
            }
            Tiles(())
        }
    }

    impl Drop for Tiles {
        fn drop(&mut self) {
            // SAFETY: the tiles were configured by `configure` (AMX usable); TILERELEASE
            // returns them to the init state, touching no memory.
            unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) }
        }
    }

    /// `C[r][j] += sum over pairs of A[r] . B[j]` for a 32 x 32 block of C (`load`), or
    /// `C[r][j] = sum ...` (not `load`: the tiles start from zero, C is not read). `a` is
    /// row-major (`a[r * lda + p]`, `lda = a_row_stride(pairs)`), `b` one packed panel
    /// (`b[p * NR + j]`), `c` the block's first element with rows `ldc` elements apart. Each element's sum is one
    /// chain of `tdpbf16ps` steps in k order, whatever block of C it lies in. `next_c` is
    /// the block the caller runs next (rows `next_ldc` apart; any address, it is only
    /// prefetched): C streams from memory, so its lines are fetched while this block's
    /// products run.
    ///
    /// # Safety
    /// `_tiles` is this thread's (tiles configured); `pairs` is a multiple of
    /// [`AMX_PAIRS`]; `a` holds `AMX_MR * lda` values, `b` `pairs * NR`; `c` addresses
    /// 32 rows of 32 writable f32, `ldc` apart.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn kernel(
        _tiles: &Tiles,
        pairs: usize,
        a: &[u32],
        b: &[u32],
        c: *mut f32,
        ldc: usize,
        load: bool,
        next_c: *const f32,
        next_ldc: usize,
    ) {
        debug_assert!(pairs.is_multiple_of(AMX_PAIRS));
        let lda = a_row_stride(pairs);
        assert!(a.len() >= AMX_MR * lda && b.len() >= pairs * NR);
        // Row strides in bytes.
        let (sa, sb, sc) = (lda * 4, NR * 4, ldc * 4);
        // tmm(2h + q): C rows 16h.., columns 16q..
        // SAFETY: the tiles are configured; the four 16 x 16 f32 quarters of the block
        // (rows `sc` bytes apart) lie in C (the caller's contract); TILEZERO touches no
        // memory.
        unsafe {
            if load {
                asm!(
                    "tileloadd tmm0, [{c0} + {sc}*1]",
                    "tileloadd tmm1, [{c1} + {sc}*1]",
                    "tileloadd tmm2, [{c2} + {sc}*1]",
                    "tileloadd tmm3, [{c3} + {sc}*1]",
                    c0 = in(reg) c,
                    c1 = in(reg) c.add(16),
                    c2 = in(reg) c.add(16 * ldc),
                    c3 = in(reg) c.add(16 * ldc + 16),
                    sc = in(reg) sc,
                    options(nostack, readonly, preserves_flags)
                );
            } else {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem, preserves_flags)
                );
            }
        }
        let steps = pairs / AMX_PAIRS;
        // 64 lines of the next C block (32 rows of 128 bytes), spread over the steps.
        let c_lines = 2 * AMX_MR;
        for (step, p0) in (0..pairs).step_by(AMX_PAIRS).enumerate() {
            for line in step * c_lines / steps..(step + 1) * c_lines / steps {
                let at = next_c.wrapping_add((line / 2) * next_ldc + (line % 2) * 16);
                _mm_prefetch::<_MM_HINT_T0>(at as *const i8);
            }
            // tmm4/5: rows 0-15/16-31 of A, pairs p0..p0 + 16 (64 bytes per row, rows
            // `sa` apart); tmm6/7: pairs p0..p0 + 16 of columns 0-15/16-31 of the panel.
            // tmm(2h + q) += tmm(4 + h) . tmm(6 + q). Each tile is loaded just before
            // its first use, so loads overlap the products already issued.
            // SAFETY: every row read lies inside `a` and `b` (lengths asserted above:
            // rows up to 31 of A at pairs < `pairs`, pairs < `pairs` of B).
            unsafe {
                let a0 = a.as_ptr().add(p0);
                let a1 = a.as_ptr().add(16 * lda + p0);
                let b0 = b.as_ptr().add(p0 * NR);
                let b1 = b0.add(16);
                // The B rows two steps ahead into L1 (2 KiB, contiguous in the panel): B
                // streams from L2 while A's band stays in L1.
                let ahead = (b0 as *const u8).wrapping_add(2 * AMX_PAIRS * NR * 4);
                for line in 0..AMX_PAIRS * NR * 4 / 64 {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line) as *const i8);
                }
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) a0,
                    a1 = in(reg) a1,
                    b0 = in(reg) b0,
                    b1 = in(reg) b1,
                    sa = in(reg) sa,
                    sb = in(reg) sb,
                    options(nostack, readonly, preserves_flags)
                );
            }
        }
        // SAFETY: as for the loads above.
        unsafe {
            asm!(
                "tilestored [{c0} + {sc}*1], tmm0",
                "tilestored [{c1} + {sc}*1], tmm1",
                "tilestored [{c2} + {sc}*1], tmm2",
                "tilestored [{c3} + {sc}*1], tmm3",
                c0 = in(reg) c,
                c1 = in(reg) c.add(16),
                c2 = in(reg) c.add(16 * ldc),
                c3 = in(reg) c.add(16 * ldc + 16),
                sc = in(reg) sc,
                options(nostack, preserves_flags)
            );
        }
    }
}

/// `x` rounded to bf16 (nearest even; NaN stays a quiet NaN), as its bits. Branch-free,
/// so the packing loops vectorise (equal to `half::bf16::from_f32`: tested).
#[inline(always)]
pub(super) fn to_bf16(x: f32) -> u32 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x40;
    if x.is_nan() {
        quiet_nan
    } else {
        rounded
    }
}

/// A pair's u32 from the bf16 of k (low half) and k + 1 (high half).
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    to_bf16(lo) | (to_bf16(hi) << 16)
}

/// [`to_bf16`] after flushing a subnormal `x` to zero (keeping its sign): the rounding of
/// AVX-512 BF16's `vcvtne2ps2bf16`, which the AMX packing uses, for its scalar edges.
#[inline(always)]
fn amx_bf16(x: f32) -> u32 {
    to_bf16(if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    })
}

/// [`pair`] with [`amx_bf16`]'s rounding.
#[inline(always)]
fn amx_pair(lo: f32, hi: f32) -> u32 {
    amx_bf16(lo) | (amx_bf16(hi) << 16)
}

/// The AMX path's packing in AVX-512 (every CPU with AMX has AVX-512F, BW and BF16):
/// rounding 32 f32 at once (`vcvtne2ps2bf16`, [`amx_bf16`]'s rounding), pairing, and the
/// 16 x 16 transposes that turn columns of a transposed operand into the rows a tile
/// needs.
#[cfg(target_arch = "x86_64")]
mod pack512 {
    use std::arch::x86_64::*;

    /// `vcvtne2ps2bf16` on `low` and `high` (`__m512`): u16 lanes 0..16 the bf16 of `low`,
    /// 16..32 those of `high`, rounded to nearest even like [`super::to_bf16`], except
    /// that subnormal inputs become zero (the instruction's fixed DAZ/FTZ; SDM,
    /// VCVTNE2PS2BF16) — as `tdpbf16ps` itself treats subnormal operands, so only AMX's
    /// packing uses it. One instruction for 32 values where the integer rounding took
    /// eight per 16, which made the packing of A as costly as half the tile arithmetic on
    /// the classifier's products. A macro around `asm!`, so that the instruction sits in
    /// the packing loops themselves: the intrinsic was left out of line there, a call per
    /// 32 values (a helper function either has the target features and cannot be
    /// `inline(always)`, or lacks them and keeps the intrinsic out of line).
    macro_rules! round_two {
        ($low:expr, $high:expr) => {{
            let (low, high): (std::arch::x86_64::__m512, std::arch::x86_64::__m512) = ($low, $high);
            let halves: std::arch::x86_64::__m512i;
            // Intel order: the destination's low half from the last source.
            std::arch::asm!(
                "vcvtne2ps2bf16 {halves}, {high}, {low}",
                halves = lateout(zmm_reg) halves,
                high = in(zmm_reg) high,
                low = in(zmm_reg) low,
                options(pure, nomem, nostack, preserves_flags),
            );
            halves
        }};
    }

    /// Lane i: the pair of `lo[i]` (low half) and `hi[i]` (high half), for `lo` and `hi`
    /// addressing 16 readable f32 each.
    macro_rules! pair_lanes {
        ($lo:expr, $hi:expr) => {{
            let halves = $crate::nn::gemm_bf16::pack512::round_two!(
                std::arch::x86_64::_mm512_loadu_ps($lo),
                std::arch::x86_64::_mm512_loadu_ps($hi)
            );
            // u16 lane 2i takes lo[i] (lane i), lane 2i + 1 takes hi[i] (lane 16 + i).
            let interleave = std::arch::x86_64::_mm512_set_epi16(
                31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                20, 4, 19, 3, 18, 2, 17, 1, 16, 0,
            );
            std::arch::x86_64::_mm512_permutexvar_epi16(interleave, halves)
        }};
    }

    /// Lane p: the pair of `run[2p]` and `run[2p + 1]` (u16 lane t holds `run[t]`), for a
    /// `run` addressing 32 readable f32.
    macro_rules! pairs_of_run {
        ($run:expr) => {{
            let run: *const f32 = $run;
            $crate::nn::gemm_bf16::pack512::round_two!(
                std::arch::x86_64::_mm512_loadu_ps(run),
                std::arch::x86_64::_mm512_loadu_ps(run.add(16))
            )
        }};
    }

    pub(super) use {pair_lanes, pairs_of_run, round_two};

    /// Transpose 16 x 16 u32 in place: `rows[i]` lane j becomes `rows[j]` lane i
    /// (interleave 32-bit, then 64-bit lanes, then 128-bit quarters twice).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose(r: &mut [__m512i; 16]) {
        let mut t = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        for g in 0..4 {
            let b = 4 * g;
            r[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
            r[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
            r[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
            r[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
        }
        for h in 0..2 {
            let b = 8 * h;
            for i in 0..4 {
                t[b + i] = _mm512_shuffle_i32x4::<0x88>(r[b + i], r[b + i + 4]);
                t[b + i + 4] = _mm512_shuffle_i32x4::<0xDD>(r[b + i], r[b + i + 4]);
            }
        }
        for i in 0..8 {
            r[i] = _mm512_shuffle_i32x4::<0x88>(t[i], t[i + 8]);
            r[i + 8] = _mm512_shuffle_i32x4::<0xDD>(t[i], t[i + 8]);
        }
    }

    /// Store 16 u32 lanes at `dst`.
    ///
    /// # Safety
    /// AVX-512F; `dst` addresses 16 writable u32.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn store(dst: *mut u32, v: __m512i) {
        _mm512_storeu_si512(dst as *mut _, v)
    }
}

/// Packed AMX operands in 64-byte lines: every tile row (64 bytes) then starts on a cache
/// line (the panels' and bands' rows are multiples of 64 bytes apart). A row split across
/// two lines made `tileloadd` about 3x slower here, the products waiting on it.
#[derive(Default)]
struct TileRows(Vec<Line>);

/// One cache line of u32 (the element type of [`TileRows`]).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u32; 16]);

impl TileRows {
    /// The first `len` u32, as they are (a buffer reused between calls: the packing
    /// writes every value it later reads, or zeroes them).
    fn sized(&mut self, len: usize) -> &mut [u32] {
        self.0.resize(len.div_ceil(16), Line([0; 16]));
        // SAFETY: the vector holds len.div_ceil(16) * 16 >= len initialised u32,
        // contiguous (a `Line` is 64 bytes of u32, no padding).
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u32, len) }
    }
}

/// u32 from one row of an AMX A band to the next: one 64-byte line more than its `pairs`.
/// A power-of-two stride (512 pairs: 2 KiB) puts the 32 rows a tile step reads in 2 of
/// L1's 64 sets, more lines than its 12 ways hold; one line more spreads them over 32.
fn a_row_stride(pairs: usize) -> usize {
    pairs + AMX_PAIRS
}

/// Pairs per AMX-packed block of `kc` values of k, padded with zero pairs to a multiple
/// of [`AMX_PAIRS`] (AMX's whole tiles).
fn amx_pairs(kc: usize) -> usize {
    kc.div_ceil(2).next_multiple_of(AMX_PAIRS)
}

/// Pack rows `kb..kb + kc` of B (`n` columns) into panels of NR columns, pair-major:
/// `out[(panel * pairs + p) * NR + j]` holds columns `panel * NR + j` of k = kb + 2p and
/// kb + 2p + 1, `pairs = kc.div_ceil(2)`. Missing columns and the odd k past `kc` are
/// zero. `vector`: on AVX2 where the layout allows
/// ([`pack_v3`]), the same values 8 pairs at a time.
///
/// # Safety
/// `b` with strides `rsb`, `csb` addresses a valid K x n matrix with K >= kb + kc.
#[allow(clippy::too_many_arguments)]
unsafe fn pack_b(
    out: &mut Vec<u32>,
    b: *const f32,
    rsb: isize,
    csb: isize,
    kb: usize,
    kc: usize,
    n: usize,
    vector: bool,
) {
    let pairs = kc.div_ceil(2);
    let panels = n.div_ceil(NR);
    // Every slot of columns < n is written below (the pairs with both halves, then the
    // odd k's with a zero high half); only the last panel's columns past n are zeroed
    // here, rather than the whole buffer (before N was blocked, 26 MB per K block at the
    // classifier's N = 50257: 1.5-1.7% of a bf16 training step's samples).
    out.resize(panels * pairs * NR, 0);
    let full = kc / 2; // pairs with both halves
    if let Some(last) = out.chunks_exact_mut(pairs * NR).last() {
        let width = n - (panels - 1) * NR;
        for slots in last.chunks_exact_mut(NR) {
            slots[width..].fill(0);
        }
    }
    let at = |k: usize, j: usize| *b.offset(k as isize * rsb + j as isize * csb);
    #[cfg(target_arch = "x86_64")]
    let vector = vector && pack_v3::b_full_pairs(out, b, rsb, csb, kb, full, n, pairs);
    #[cfg(not(target_arch = "x86_64"))]
    let vector = vector && false; // no vector packing there
    if vector {
        // The pairs with both halves are packed; the odd k's pair below.
    } else if csb == 1 {
        // Rows of B contiguous: walk each pair of rows once, start to end, panel by panel.
        for p in 0..full {
            let k = kb + 2 * p;
            let lo = std::slice::from_raw_parts(b.offset(k as isize * rsb), n);
            let hi = std::slice::from_raw_parts(b.offset((k + 1) as isize * rsb), n);
            for (panel, (l, h)) in lo.chunks(NR).zip(hi.chunks(NR)).enumerate() {
                let dst = &mut out[(panel * pairs + p) * NR..][..l.len()];
                for ((slot, &l), &h) in dst.iter_mut().zip(l).zip(h) {
                    *slot = pair(l, h);
                }
            }
        }
    }
    for panel in 0..panels {
        let j0 = panel * NR;
        let width = NR.min(n - j0);
        let dst = &mut out[panel * pairs * NR..][..pairs * NR];
        if vector || csb == 1 {
            // Packed above.
        } else if rsb == 1 {
            // Columns of B contiguous (B = W^T): each column's run of k converts in pairs.
            for j in 0..width {
                let col = std::slice::from_raw_parts(b.offset((j0 + j) as isize * csb).add(kb), kc);
                for (p, two) in col.chunks_exact(2).enumerate() {
                    dst[p * NR + j] = pair(two[0], two[1]);
                }
            }
        } else {
            for p in 0..full {
                for j in 0..width {
                    dst[p * NR + j] = pair(at(kb + 2 * p, j0 + j), at(kb + 2 * p + 1, j0 + j));
                }
            }
        }
        if kc % 2 == 1 {
            // K odd: the last pair's high half is zero.
            for j in 0..width {
                dst[full * NR + j] = to_bf16(at(kb + 2 * full, j0 + j));
            }
        }
    }
}

/// Pack rows `i0..i0 + rows` of A, columns `kb..kb + kc`, into panels of MR rows,
/// pair-major: `out[(q * pairs + p) * MR + r]` holds row `i0 + q * MR + r`,
/// `pairs = kc.div_ceil(2)`. A last panel's missing rows and the odd k past `kc` are
/// zero. `vector`: on AVX2 where the layout allows ([`pack_v3`]), the same values 8
/// pairs at a time; where A = X^T, pair by pair across all the band's whole panels, so
/// that each line of a row of X is read once (a panel at a time read 32 bytes of each
/// 64-byte line, and X's row stride, a multiple of 4 KiB, evicted the line from L1 and
/// L2 before the next panel came for the rest).
///
/// # Safety
/// `a` with strides `rsa`, `csa` addresses a valid matrix holding those rows and columns.
#[allow(clippy::too_many_arguments)]
unsafe fn pack_a(
    out: &mut [u32],
    a: *const f32,
    rsa: isize,
    csa: isize,
    i0: usize,
    rows: usize,
    kb: usize,
    kc: usize,
    vector: bool,
) {
    let pairs = kc.div_ceil(2);
    let whole = rows / MR;
    assert!(
        out.len() >= rows.div_ceil(MR) * pairs * MR,
        "pack_a: buffer too short"
    );
    #[cfg(target_arch = "x86_64")]
    let across = vector && pack_v3::a_across(out, a, rsa, csa, i0, whole, kb, kc / 2, pairs);
    #[cfg(not(target_arch = "x86_64"))]
    let across = false; // no vector packing there
    for (q, out) in out
        .chunks_exact_mut(pairs * MR)
        .take(rows.div_ceil(MR))
        .enumerate()
    {
        let r0 = i0 + q * MR;
        let mr = MR.min(rows - q * MR);
        pack_a_panel(
            out,
            a,
            rsa,
            csa,
            r0,
            mr,
            kb,
            kc,
            vector,
            across && q < whole,
        );
    }
}

/// [`pack_a`] for one panel, rows `i0..i0 + mr` (mr <= MR); `packed`: its full pairs
/// are in `out` already.
///
/// # Safety
/// As [`pack_a`].
#[allow(clippy::too_many_arguments)]
unsafe fn pack_a_panel(
    out: &mut [u32],
    a: *const f32,
    rsa: isize,
    csa: isize,
    i0: usize,
    mr: usize,
    kb: usize,
    kc: usize,
    vector: bool,
    packed: bool,
) {
    let pairs = kc.div_ceil(2);
    let at = |i: usize, k: usize| *a.offset(i as isize * rsa + k as isize * csa);
    let full = kc / 2;
    if mr < MR {
        out[..pairs * MR].fill(0);
    }
    #[cfg(target_arch = "x86_64")]
    let vector = packed || vector && pack_v3::a_full_pairs(out, a, rsa, csa, i0, mr, kb, full);
    #[cfg(not(target_arch = "x86_64"))]
    let vector = packed || vector && false; // no vector packing there
    if vector {
        // The pairs with both halves are packed; the odd k's pair below.
    } else if csa == 1 {
        // Rows of A contiguous: each row's run of k converts in pairs.
        for r in 0..mr {
            let row = std::slice::from_raw_parts(a.offset((i0 + r) as isize * rsa).add(kb), kc);
            for (p, two) in row.chunks_exact(2).enumerate() {
                out[p * MR + r] = pair(two[0], two[1]);
            }
        }
    } else {
        for p in 0..full {
            for r in 0..mr {
                out[p * MR + r] = pair(at(i0 + r, kb + 2 * p), at(i0 + r, kb + 2 * p + 1));
            }
        }
    }
    if full < pairs {
        for r in 0..mr {
            out[full * MR + r] = to_bf16(at(i0 + r, kb + 2 * full));
        }
    }
}

/// Pack rows `i0..i0 + mr` (mr <= AMX_MR) of A, columns `kb..kb + kc`, row-major for
/// AMX's A tiles: `out[r * a_row_stride(pairs) + p]`, `pairs = amx_pairs(kc)`.
/// Missing rows, the odd k past `kc` and the padding pairs are zero. The two layouts the model
/// passes take AVX-512 over whole blocks of 16 pairs (16 rows x 16 pairs for A = X^T);
/// the rest, and other strides, convert one pair at a time (same values, [`amx_bf16`]).
///
/// # Safety
/// `a` with strides `rsa`, `csa` addresses a valid matrix holding those rows and columns;
/// AVX-512F, BW and BF16 (every AMX CPU has them).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_a_amx(
    out: &mut [u32],
    a: *const f32,
    rsa: isize,
    csa: isize,
    i0: usize,
    mr: usize,
    kb: usize,
    kc: usize,
) {
    let pairs = amx_pairs(kc);
    let at = |i: usize, k: usize| *a.offset(i as isize * rsa + k as isize * csa);
    let full = kc / 2;
    let lda = a_row_stride(pairs);
    let out = &mut out[..AMX_MR * lda];
    if mr < AMX_MR || 2 * pairs > kc {
        out.fill(0);
    }
    // Pairs 0..done of rows 0..rows_done are packed by the vector paths below.
    let (mut done, mut rows_done) = (0, 0);
    let vec_pairs = full - full % AMX_PAIRS;
    if csa == 1 {
        // Rows of A contiguous: 32 values of a row give 16 pairs.
        for r in 0..mr {
            let row = a.offset((i0 + r) as isize * rsa).add(kb);
            for p0 in (0..vec_pairs).step_by(AMX_PAIRS) {
                pack512::store(
                    out.as_mut_ptr().add(r * lda + p0),
                    pack512::pairs_of_run!(row.add(2 * p0)),
                );
            }
        }
        (done, rows_done) = (vec_pairs, mr);
    } else if rsa == 1 {
        // Columns of A contiguous (A = X^T): 16 rows of one pair from two column runs,
        // 16 such pairs transposed into 16 rows of 16 pairs.
        rows_done = mr - mr % 16;
        for p0 in (0..vec_pairs).step_by(AMX_PAIRS) {
            for r0 in (0..rows_done).step_by(16) {
                let mut v = [std::arch::x86_64::_mm512_setzero_si512(); 16];
                for (q, vq) in v.iter_mut().enumerate() {
                    let lo = a.add(i0 + r0).offset((kb + 2 * (p0 + q)) as isize * csa);
                    *vq = pack512::pair_lanes!(lo, lo.offset(csa));
                }
                pack512::transpose(&mut v);
                for (r, vr) in v.iter().enumerate() {
                    pack512::store(out.as_mut_ptr().add((r0 + r) * lda + p0), *vr);
                }
            }
        }
        done = vec_pairs;
    }
    for r in 0..mr {
        let first = if r < rows_done { done } else { 0 };
        for p in first..full {
            out[r * lda + p] = amx_pair(at(i0 + r, kb + 2 * p), at(i0 + r, kb + 2 * p + 1));
        }
        if kc % 2 == 1 {
            out[r * lda + full] = amx_bf16(at(i0 + r, kb + 2 * full));
        }
    }
}

/// [`pack_b`]'s layout for AMX (pairs padded to whole tiles; `out` holds at least the
/// panels' `n.div_ceil(NR) * pairs * NR` values, from a 64-byte line), with
/// AVX-512 over whole blocks of 16 pairs x 16 columns in the two layouts the model passes
/// (B row-major, B = W^T).
///
/// # Safety
/// As [`pack_b`]; AVX-512F, BW and BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_b_amx(
    out: &mut [u32],
    b: *const f32,
    rsb: isize,
    csb: isize,
    kb: usize,
    kc: usize,
    n: usize,
) {
    let pairs = amx_pairs(kc);
    let panels = n.div_ceil(NR);
    let out = &mut out[..panels * pairs * NR];
    if !n.is_multiple_of(NR) || 2 * pairs > kc {
        // Missing columns, the odd k and the padding pairs stay zero; otherwise every
        // slot is written below.
        out.fill(0);
    }
    let at = |k: usize, j: usize| *b.offset(k as isize * rsb + j as isize * csb);
    let full = kc / 2;
    let vec_pairs = full - full % AMX_PAIRS;
    // Other strides: every column one pair at a time below.
    let vec_cols = if csb == 1 || rsb == 1 { n - n % 16 } else { 0 };
    let dst = out.as_mut_ptr();
    // Column j, pair p of the block: out[(j / NR * pairs + p) * NR + j % NR].
    let slot = |p: usize, j: usize| (j / NR * pairs + p) * NR + j % NR;
    if csb == 1 {
        // Rows of B contiguous: each pair of rows walked start to end, 16 columns at once.
        for p in 0..full {
            let lo = b.offset((kb + 2 * p) as isize * rsb);
            for j0 in (0..vec_cols).step_by(16) {
                let v = pack512::pair_lanes!(lo.add(j0), lo.add(j0).offset(rsb));
                pack512::store(dst.add(slot(p, j0)), v);
            }
        }
    } else {
        // Columns of B contiguous (B = W^T): 16 pairs of a column from one run of 32
        // values; 16 columns transposed into 16 pairs of 16 columns.
        for j0 in (0..vec_cols).step_by(16) {
            for p0 in (0..vec_pairs).step_by(AMX_PAIRS) {
                let mut v = [std::arch::x86_64::_mm512_setzero_si512(); 16];
                for (j, vj) in v.iter_mut().enumerate() {
                    *vj =
                        pack512::pairs_of_run!(b.offset((j0 + j) as isize * csb).add(kb + 2 * p0));
                }
                pack512::transpose(&mut v);
                for (p, vp) in v.iter().enumerate() {
                    pack512::store(dst.add(slot(p0 + p, j0)), *vp);
                }
            }
        }
    }
    // Pairs 0..vec_done of columns 0..vec_cols are packed above.
    let vec_done = if csb == 1 { full } else { vec_pairs };
    for j in 0..n {
        let first = if j < vec_cols { vec_done } else { 0 };
        for p in first..full {
            out[slot(p, j)] = amx_pair(at(kb + 2 * p, j), at(kb + 2 * p + 1, j));
        }
        if kc % 2 == 1 {
            out[slot(full, j)] = amx_bf16(at(kb + 2 * full, j));
        }
    }
}

/// One bf16 value of a pair, widened to f32 (exact).
#[inline(always)]
fn half_of(pair: u32, high: bool) -> f32 {
    let bits = if high { pair >> 16 } else { pair & 0xFFFF };
    f32::from_bits(bits << 16)
}

/// The portable micro-kernel: `tile[r * NR + j] = sum over pairs of A[r] . B[j]`, per
/// pair the odd k first, each product added with one rounding (as `vdpbf16ps`).
fn kernel_portable(pairs: usize, a: &[u32], b: &[u32], tile: &mut [f32]) {
    let tile = &mut tile[..MR * NR];
    tile.fill(0.0);
    for p in 0..pairs {
        let (ap, bp) = (&a[p * MR..][..MR], &b[p * NR..][..NR]);
        for (r, &ar) in ap.iter().enumerate() {
            let (a_lo, a_hi) = (half_of(ar, false), half_of(ar, true));
            let row = &mut tile[r * NR..][..NR];
            for (acc, &bj) in row.iter_mut().zip(bp) {
                *acc += a_hi * half_of(bj, true);
                *acc += a_lo * half_of(bj, false);
            }
        }
    }
}

/// The packing of the `vdpbf16ps` and portable kernels on AVX2, 8 pairs at a time: the
/// same u32 as [`pair`] (the rounding is `simd.rs`'s `bf16_bits_v3`: nearest even, NaN
/// quieted, subnormals kept, as [`to_bf16`]), so both kernels see the same operands.
/// Scalar packing took as long as the products on a Zen 4 core (`perf`: 11.9% of the
/// samples in `sgemm_bf16`'s packing against 13.8% in the micro-kernel, K = 1536).
#[cfg(target_arch = "x86_64")]
mod pack_v3 {
    use super::super::sgemm_avx2::transpose8x8;
    use super::{pair, MR, NR};
    use crate::simd::bf16_bits_v3;
    use std::arch::x86_64::*;

    /// Lane j: the pair of `lo[j]` (k) and `hi[j]` (k + 1).
    #[inline(always)]
    unsafe fn pairs_across(lo: *const f32, hi: *const f32) -> __m256i {
        let lo = bf16_bits_v3(_mm256_loadu_ps(lo));
        let hi = bf16_bits_v3(_mm256_loadu_ps(hi));
        _mm256_or_si256(lo, _mm256_slli_epi32::<16>(hi))
    }

    /// Lane p: the pair of `x[2p]` and `x[2p + 1]` (16 consecutive values of k).
    #[inline(always)]
    unsafe fn pairs_along_v(x: *const f32) -> __m256i {
        let b0 = bf16_bits_v3(_mm256_loadu_ps(x));
        let b1 = bf16_bits_v3(_mm256_loadu_ps(x.add(8)));
        // Values below 2^16 pack to u16 without saturating, per 128-bit half: pairs
        // 0-1 and 4-5 below, 2-3 and 6-7 above; the permute puts them in order.
        let packed = _mm256_packus_epi32(b0, b1);
        _mm256_permute4x64_epi64::<0b11_01_10_00>(packed)
    }

    /// [`pairs_along_v`] as values.
    #[inline(always)]
    unsafe fn pairs_along(x: *const f32) -> [u32; 8] {
        let mut out = [0u32; 8];
        _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, pairs_along_v(x));
        out
    }

    /// Pairs 8 at a time along 8 runs of k at once (`run(s)`: the start of run s, at
    /// its pair `p`), transposed: `put(p, v)` gets lane s of `v` = run s's pair p. One
    /// 8 x 8 transpose of u32 (`sgemm_avx2.rs`'s) stores 8 lanes at once where one run at
    /// a time stores one.
    #[inline(always)]
    unsafe fn pairs_of_8_runs(
        run: impl Fn(usize) -> *const f32,
        full: usize,
        mut put: impl FnMut(usize, __m256i),
    ) -> usize {
        let mut p = 0;
        while p + 8 <= full {
            let mut r = [_mm256_setzero_si256(); 8];
            for (s, r_s) in r.iter_mut().enumerate() {
                *r_s = pairs_along_v(run(s).add(2 * p));
            }
            // Lane j of r[s] = run s's pair p + j; after: lane s of cols[j].
            let cols = transpose8x8(r.map(|v| _mm256_castsi256_ps(v)));
            for (j, col) in cols.into_iter().enumerate() {
                put(p + j, _mm256_castps_si256(col));
            }
            p += 8;
        }
        p
    }

    /// The first `full` pairs of a run of k (`x[2p]`, `x[2p + 1]`), 8 at a time, each
    /// handed to `put(p, pair)`.
    #[inline(always)]
    unsafe fn pairs_of_run(x: *const f32, full: usize, mut put: impl FnMut(usize, u32)) {
        let mut p = 0;
        while p + 8 <= full {
            for (t, v) in pairs_along(x.add(2 * p)).into_iter().enumerate() {
                put(p + t, v);
            }
            p += 8;
        }
        for p in p..full {
            put(p, pair(*x.add(2 * p), *x.add(2 * p + 1)));
        }
    }

    /// `pack_a`'s first `full` pairs of one panel where A's rows are contiguous (8 rows
    /// at once, transposed, or one row at a time where the panel has fewer); false,
    /// having done nothing, for other layouts.
    ///
    /// # Safety
    /// As `pack_a`; the CPU has AVX2.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn a_full_pairs(
        out: &mut [u32],
        a: *const f32,
        rsa: isize,
        csa: isize,
        i0: usize,
        mr: usize,
        kb: usize,
        full: usize,
    ) -> bool {
        if csa == 1 && mr == MR {
            let rows = |r: usize| a.offset((i0 + r) as isize * rsa).add(kb);
            let dst = out.as_mut_ptr();
            let done = pairs_of_8_runs(rows, full, |p, v| {
                _mm256_storeu_si256(dst.add(p * MR) as *mut __m256i, v)
            });
            for r in 0..MR {
                for p in done..full {
                    let row = rows(r);
                    out[p * MR + r] = pair(*row.add(2 * p), *row.add(2 * p + 1));
                }
            }
            true
        } else if csa == 1 {
            for r in 0..mr {
                let row = a.offset((i0 + r) as isize * rsa).add(kb);
                pairs_of_run(row, full, |p, v| out[p * MR + r] = v);
            }
            true
        } else {
            false
        }
    }

    /// `pack_a`'s first `full` pairs of its `panels` whole panels (`pairs` apart in
    /// `out`) where A's columns are contiguous (A = X^T: the 8 rows of a pair side by
    /// side), pair by pair across the panels; false, having done nothing, for other
    /// layouts.
    ///
    /// # Safety
    /// As `pack_a`; the CPU has AVX2.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn a_across(
        out: &mut [u32],
        a: *const f32,
        rsa: isize,
        csa: isize,
        i0: usize,
        panels: usize,
        kb: usize,
        full: usize,
        pairs: usize,
    ) -> bool {
        if rsa != 1 || csa == 1 {
            return false;
        }
        assert!(out.len() >= panels * pairs * MR);
        let rows = a.add(i0);
        let dst = out.as_mut_ptr();
        for p in 0..full {
            let lo = rows.offset((kb + 2 * p) as isize * csa);
            let hi = rows.offset((kb + 2 * p + 1) as isize * csa);
            for q in 0..panels {
                let v = pairs_across(lo.add(q * MR), hi.add(q * MR));
                _mm256_storeu_si256(dst.add((q * pairs + p) * MR) as *mut __m256i, v);
            }
        }
        true
    }

    /// `pack_b`'s first `full` pairs of every panel (`pairs` per panel in `out`, sized
    /// already) where B's rows are contiguous (a pair of rows, 8 columns at a time) or
    /// its columns are (B = W^T: 8 pairs along a column, spread over `NR` apart); false,
    /// having done nothing, for other layouts.
    ///
    /// # Safety
    /// As `pack_b`; the CPU has AVX2.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn b_full_pairs(
        out: &mut [u32],
        b: *const f32,
        rsb: isize,
        csb: isize,
        kb: usize,
        full: usize,
        n: usize,
        pairs: usize,
    ) -> bool {
        if csb == 1 {
            for p in 0..full {
                let lo = b.offset((kb + 2 * p) as isize * rsb);
                let hi = b.offset((kb + 2 * p + 1) as isize * rsb);
                for j0 in (0..n).step_by(NR) {
                    let dst = &mut out[((j0 / NR) * pairs + p) * NR..][..NR.min(n - j0)];
                    let mut j = 0;
                    while j + 8 <= dst.len() {
                        let v = pairs_across(lo.add(j0 + j), hi.add(j0 + j));
                        _mm256_storeu_si256(dst.as_mut_ptr().add(j) as *mut __m256i, v);
                        j += 8;
                    }
                    for (t, slot) in dst.iter_mut().enumerate().skip(j) {
                        *slot = pair(*lo.add(j0 + t), *hi.add(j0 + t));
                    }
                }
            }
            true
        } else if rsb == 1 {
            // 8 columns at a time, transposed: 8 pairs of each side by side.
            let eights = n / 8;
            for jj in (0..eights * 8).step_by(8) {
                let (panel, j) = (jj / NR, jj % NR);
                let cols = |s: usize| b.offset((jj + s) as isize * csb).add(kb);
                let dst = out[panel * pairs * NR..][..pairs * NR].as_mut_ptr();
                let done = pairs_of_8_runs(cols, full, |p, v| {
                    _mm256_storeu_si256(dst.add(p * NR + j) as *mut __m256i, v)
                });
                for s in 0..8 {
                    for p in done..full {
                        let col = cols(s);
                        *dst.add(p * NR + j + s) = pair(*col.add(2 * p), *col.add(2 * p + 1));
                    }
                }
            }
            for jj in eights * 8..n {
                let (panel, j) = (jj / NR, jj % NR);
                let col = b.offset(jj as isize * csb).add(kb);
                let dst = &mut out[panel * pairs * NR..][..pairs * NR];
                pairs_of_run(col, full, |p, v| dst[p * NR + j] = v);
            }
            true
        } else {
            false
        }
    }
}

/// How one K block's sums `t` enter C: `C + alpha t` after the first block, `alpha t`
/// (`beta = 0`) or `beta C + alpha t` for the first. A multiply, then an add, each
/// rounded (no fused multiply-add), in the `vdpbf16ps` kernel and after the portable
/// one alike.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Update {
    Add { alpha: f32 },
    Set { alpha: f32 },
    Blend { beta: f32, alpha: f32 },
}

impl Update {
    fn of_block(kb: usize, alpha: f32, beta: f32) -> Self {
        if kb > 0 {
            Update::Add { alpha }
        } else if beta == 0.0 {
            Update::Set { alpha }
        } else {
            Update::Blend { beta, alpha }
        }
    }

    fn apply(self, x: f32, t: f32) -> f32 {
        match self {
            Update::Add { alpha } => x + alpha * t,
            Update::Set { alpha } => alpha * t,
            Update::Blend { beta, alpha } => beta * x + alpha * t,
        }
    }

    /// `C = self(C, tile)` for `rows` x `width` of C at `c` (element strides `rsc`,
    /// `csc`), from the tile's rows of NR.
    ///
    /// # Safety
    /// Those elements of C are valid and writable.
    unsafe fn apply_tile(
        self,
        tile: &[f32],
        c: *mut f32,
        rsc: isize,
        csc: isize,
        rows: usize,
        width: usize,
    ) {
        for (r, t) in tile.chunks_exact(NR).take(rows).enumerate() {
            let t = &t[..width];
            let row = c.offset(r as isize * rsc);
            if csc == 1 {
                // A contiguous row of C: a loop that vectorises.
                let row = std::slice::from_raw_parts_mut(row, width);
                row.iter_mut()
                    .zip(t)
                    .for_each(|(x, &t)| *x = self.apply(*x, t));
            } else {
                for (j, &t) in t.iter().enumerate() {
                    let x = row.offset(j as isize * csc);
                    *x = self.apply(*x, t);
                }
            }
        }
    }
}

/// One micro-tile of C with contiguous rows: `rows` (<= MR) x `width` (<= NR) values at
/// `c`, rows `ldc` apart; `next` is where the next tile starts (rows `ldc` apart too;
/// possibly narrower, or past C's end), whose 8 x 2 lines the kernel prefetches while
/// it computes this one.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct CTile {
    c: *mut f32,
    ldc: usize,
    rows: usize,
    width: usize,
    next: *const f32,
}

/// The `vdpbf16ps` micro-kernel: the tile's 8 x 2 registers of 16 f32 sums over
/// `pairs`, then `update` straight into C (masked where the tile is narrower than NR).
///
/// Why C is written here and its next tile fetched ahead: the sums used to go through
/// a scratch tile to a scalar loop, and C's lines (a new 8 x 128 bytes per tile, from
/// L3 or memory once C outgrows L2) arrived only then, with the products stalled behind
/// them (`micro gemm` on a Zen 4 core, K = 384: 179 -> 191 GFLOP/s with this change).
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 BF16; `a` holds `pairs * MR` and `b` `pairs * NR`
/// values; `tile` addresses valid, writable C as described ([`CTile`]); `tile.next`
/// may be anything (it is only prefetched).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel_avx512bf16(pairs: usize, a: &[u32], b: &[u32], tile: CTile, update: Update) {
    use std::arch::x86_64::*;
    debug_assert!(a.len() >= pairs * MR && b.len() >= pairs * NR);
    debug_assert!(tile.rows <= MR && tile.width <= NR);
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // The next tile's 2 lines per row, one every `pairs / 16` pairs.
    let c_lines = 2 * MR;
    let every = (pairs / c_lines).max(1);
    for p in 0..pairs {
        if p % every == 0 && p / every < c_lines {
            let line = p / every;
            let at = tile
                .next
                .wrapping_add((line / 2) * tile.ldc + (line % 2) * 16);
            _mm_prefetch::<_MM_HINT_T0>(at as *const i8);
        }
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(pb.add(p * NR) as *const _));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(pb.add(p * NR + 16) as *const _));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let ar: __m512bh = std::mem::transmute(_mm512_set1_epi32(*pa.add(p * MR + r) as i32));
            acc_r[0] = _mm512_dpbf16_ps(acc_r[0], ar, b0);
            acc_r[1] = _mm512_dpbf16_ps(acc_r[1], ar, b1);
        }
    }
    // Lanes of each half-row inside the tile's width.
    let lanes = |half: usize| -> __mmask16 {
        let w = tile.width.saturating_sub(16 * half).min(16);
        ((1u32 << w) - 1) as __mmask16
    };
    let masks = [lanes(0), lanes(1)];
    for (r, acc_r) in acc.iter().enumerate().take(tile.rows) {
        for (half, (&t, &mask)) in acc_r.iter().zip(&masks).enumerate() {
            if mask == 0 {
                // No lane of this half inside the tile (its address may lie past C).
                continue;
            }
            let at = tile.c.add(r * tile.ldc + 16 * half);
            let value = match update {
                Update::Add { alpha } => {
                    let x = _mm512_maskz_loadu_ps(mask, at);
                    _mm512_add_ps(x, _mm512_mul_ps(_mm512_set1_ps(alpha), t))
                }
                Update::Set { alpha } => _mm512_mul_ps(_mm512_set1_ps(alpha), t),
                Update::Blend { beta, alpha } => {
                    let x = _mm512_maskz_loadu_ps(mask, at);
                    let bx = _mm512_mul_ps(_mm512_set1_ps(beta), x);
                    _mm512_add_ps(bx, _mm512_mul_ps(_mm512_set1_ps(alpha), t))
                }
            };
            _mm512_mask_storeu_ps(at, mask, value);
        }
    }
}

/// The `vdpbf16ps` instruction's own rate, the reference `micro gemm` holds the GEMM
/// against: `steps` rounds of 24 independent chains on registers (no loads; more chains
/// than its latency times its throughput), 64 flops per instruction (16 lanes, 2
/// products each, multiplied and added). Returns the flops done and a sum of every
/// result (so none is optimised away); None where the CPU lacks AVX-512 BF16.
pub fn vdpbf16ps_chains(steps: usize) -> Option<(f64, f32)> {
    #[cfg(target_arch = "x86_64")]
    if Bf16Kernel::Avx512Bf16.is_available() {
        // SAFETY: the CPU has AVX-512F and AVX-512 BF16 (checked).
        let sum = unsafe { chains(steps) };
        return Some((steps as f64 * 24.0 * 64.0, sum));
    }
    let _ = steps;
    None
}

/// [`vdpbf16ps_chains`]' loop.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn chains(steps: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); 24];
    // bf16 pairs (1, 1) and (2^-20, 2^-20): the sums grow slowly and stay finite.
    let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(0x3F80_3F80));
    let mut b_bits = _mm512_set1_epi32(0x3580_3580);
    for _ in 0..steps {
        // An operand the compiler cannot see through (kept in a register), so the
        // loop is not folded.
        std::arch::asm!("/* {0} */", inout(zmm_reg) b_bits, options(nomem, nostack));
        let b: __m512bh = std::mem::transmute(b_bits);
        for x in acc.iter_mut() {
            *x = _mm512_dpbf16_ps(*x, a, b);
        }
    }
    acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum()
}

/// [`sgemm_bf16`] on AMX. Each element of C is one chain of `tdpbf16ps` steps over all
/// of k in order, started from C (`beta = alpha = 1`) or from zero. Where C's rows are
/// contiguous and the result is that sum S (`beta = 0`; then scaled when `alpha != 1`)
/// or C + S (`alpha = beta = 1`, the model's accumulating products), the chain runs in C
/// itself; otherwise in a scratch, then `C = beta C + alpha S`. The choice depends on
/// alpha, beta and C's strides only, never on the rows, so bands of rows on several
/// threads (`Gemm::run`) give the bits of the whole product.
///
/// # Safety
/// As [`sgemm_bf16`], with AMX usable; m, n, k > 0.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(clippy::too_many_arguments)]
unsafe fn sgemm_amx(
    workers: Option<&Workers>,
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
    let pc = SendPtr(c);
    // SAFETY (of each use): (i, j) inside C's m x n view (the caller's contract).
    let c_at = |i: usize, j: usize| pc.at(0).offset(i as isize * rsc + j as isize * csc);
    // Row-wise work after the sums, split over the threads as the sums were.
    let each_row = |f: &(dyn Fn(usize) + Sync)| match workers {
        Some(w) if w.threads() > 1 => {
            let per = m.div_ceil(w.threads());
            let parts: Vec<std::ops::Range<usize>> =
                (0..m).step_by(per).map(|i| i..(i + per).min(m)).collect();
            w.run(parts, |rows| rows.for_each(f));
        }
        _ => (0..m).for_each(f),
    };
    let sums = |from_s: bool, s: *mut f32, lds: usize| match workers {
        Some(w) if w.threads() > 1 && m > AMX_MR => {
            amx_sums_threaded(w, m, k, n, a, rsa, csa, b, rsb, csb, from_s, s, lds)
        }
        _ => amx_sums(m, k, n, a, rsa, csa, b, rsb, csb, from_s, s, lds),
    };
    let in_place = csc == 1 && rsc >= n as isize && (beta == 0.0 || (beta == 1.0 && alpha == 1.0));
    if in_place {
        sums(beta != 0.0, c, rsc as usize);
        if alpha != 1.0 {
            each_row(&|i| {
                // SAFETY: row i of C, n contiguous values (`in_place`); one job per row.
                let row = unsafe { std::slice::from_raw_parts_mut(c_at(i, 0), n) };
                row.iter_mut().for_each(|x| *x *= alpha);
            });
        }
        return;
    }
    let mut scratch = vec![0f32; m * n];
    sums(false, scratch.as_mut_ptr(), n);
    let scratch = &scratch;
    each_row(&|i| {
        for (j, &s) in scratch[i * n..][..n].iter().enumerate() {
            // SAFETY: element (i, j) of C; row i belongs to this job alone.
            unsafe {
                let x = c_at(i, j);
                *x = if beta == 0.0 {
                    alpha * s
                } else {
                    beta * *x + alpha * s
                };
            }
        }
    });
}

/// How [`amx_sums`] blocks a product (the BLIS loops, outermost first): K in equal blocks
/// of whole tiles, at most [`AMX_KC`] (`kcb` each but the last), so the chain of an
/// element runs through the blocks in k order; N in equal blocks of whole panels whose
/// packed B fits [`AMX_B_BLOCK_BYTES`] (`ncb`), packed once and kept in L2 while every
/// 32-row band of A passes over it. k and n alone decide them, never the rows.
#[derive(Clone, Copy)]
struct AmxBlocks {
    kcb: usize,
    ncb: usize,
}

impl AmxBlocks {
    fn new(k: usize, n: usize) -> Self {
        let kcb = k
            .div_ceil(k.div_ceil(AMX_KC))
            .next_multiple_of(2 * AMX_PAIRS);
        let nc_max = (AMX_B_BLOCK_BYTES / (2 * kcb) / NR * NR).max(NR);
        let ncb = n.div_ceil(n.div_ceil(nc_max)).next_multiple_of(NR);
        AmxBlocks { kcb, ncb }
    }

    /// Every (K block, N block) of a k x n B as `(kb, kc, jc, nc)`, in the order the
    /// chains need.
    fn blocks(self, k: usize, n: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
        (0..k).step_by(self.kcb).flat_map(move |kb| {
            (0..n)
                .step_by(self.ncb)
                .map(move |jc| (kb, self.kcb.min(k - kb), jc, self.ncb.min(n - jc)))
        })
    }
}

/// A 32 x 32 block of sums for the edges of S (aligned as tile rows like).
#[repr(C, align(64))]
struct Stage([f32; AMX_MR * NR]);

/// One block of [`amx_sums`]: rows `rows` of S, columns `jc..jc + nc`, over k in
/// `kb..kb + kc`, with that block of B packed in `b_packed` ([`pack_b_amx`]). Bands of
/// 32 rows of A (`32 x K block` bf16, up to 64 KiB, in L1 and L2) are packed into
/// `a_band` and reused over the panels; each 32 x 32 block of S is held in the tiles
/// through the K block ([`amx::kernel`]), started from S when `load`.
///
/// # Safety
/// As [`amx_sums`]; `tiles` is this thread's; `rows` lie in `0..m`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(clippy::too_many_arguments)]
unsafe fn amx_block(
    tiles: &amx::Tiles,
    a_band: &mut TileRows,
    stage: &mut Stage,
    rows: std::ops::Range<usize>,
    (a, rsa, csa): (*const f32, isize, isize),
    (kb, kc, jc, nc): (usize, usize, usize, usize),
    b_packed: &[u32],
    load: bool,
    s: *mut f32,
    lds: usize,
) {
    let pairs = amx_pairs(kc);
    let a_packed = a_band.sized(AMX_MR * a_row_stride(pairs));
    for i0 in rows.clone().step_by(AMX_MR) {
        let mr = AMX_MR.min(rows.end - i0);
        pack_a_amx(a_packed, a, rsa, csa, i0, mr, kb, kc);
        for (panel, bp) in b_packed[..nc.div_ceil(NR) * pairs * NR]
            .chunks_exact(pairs * NR)
            .enumerate()
        {
            let j0 = jc + panel * NR;
            let width = NR.min(jc + nc - j0);
            let block = s.add(i0 * lds + j0);
            // The next block: the next panel's, else the next band's first.
            let next = if j0 + NR < jc + nc {
                block.wrapping_add(NR)
            } else {
                s.wrapping_add((i0 + AMX_MR) * lds + jc)
            };
            if mr == AMX_MR && width == NR {
                amx::kernel(tiles, pairs, a_packed, bp, block, lds, load, next, lds);
                continue;
            }
            // An edge block runs through the stage: the same steps per element.
            if load {
                for r in 0..mr {
                    let row = std::slice::from_raw_parts(block.add(r * lds), width);
                    stage.0[r * NR..][..width].copy_from_slice(row);
                }
            }
            let staged = stage.0.as_mut_ptr();
            amx::kernel(tiles, pairs, a_packed, bp, staged, NR, load, next, lds);
            for r in 0..mr {
                let row = std::slice::from_raw_parts_mut(block.add(r * lds), width);
                row.copy_from_slice(&stage.0[r * NR..][..width]);
            }
        }
    }
}

/// `S (+)= bf16(A) bf16(B)` on AMX into the row-major `s` (rows `lds` apart), from S's
/// values (`from_s`) or from zero, on this thread: per block ([`AmxBlocks`]) B is packed
/// once, then [`amx_block`] runs every row. Packed operands start on cache lines
/// ([`TileRows`]).
///
/// # Safety
/// As [`sgemm_bf16`] for A and B; `s` addresses m rows of n writable f32, `lds` apart;
/// AMX usable.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(clippy::too_many_arguments)]
unsafe fn amx_sums(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rsa: isize,
    csa: isize,
    b: *const f32,
    rsb: isize,
    csb: isize,
    from_s: bool,
    s: *mut f32,
    lds: usize,
) {
    let tiles = amx::Tiles::configure();
    // This thread's packing buffers, kept between calls: a fresh 1.5 MiB block costs a
    // page fault per 4 KiB on every call, as much as a small product's arithmetic.
    let (mut b_packed, mut a_band) = PACKED.with(|p| p.take()).unwrap_or_default();
    let mut stage = Stage([0.0; AMX_MR * NR]);
    for (kb, kc, jc, nc) in AmxBlocks::new(k, n).blocks(k, n) {
        let pairs = amx_pairs(kc);
        let packed = b_packed.sized(nc.div_ceil(NR) * pairs * NR);
        pack_b_amx(packed, b.offset(jc as isize * csb), rsb, csb, kb, kc, nc);
        amx_block(
            &tiles,
            &mut a_band,
            &mut stage,
            0..m,
            (a, rsa, csa),
            (kb, kc, jc, nc),
            packed,
            from_s || kb > 0,
            s,
            lds,
        );
    }
    PACKED.with(|p| p.set(Some((b_packed, a_band))));
}

/// [`amx_sums`] on `workers`' threads, with one packed B shared by all of them (rather
/// than each band of rows packing the whole of B itself, which cost as much as a third
/// of the products on the model's shapes): per block, the threads pack a share of B's
/// panels each, then each runs its band of rows over all the panels. Every element is
/// still one chain in k order, so the bits are those of one thread.
///
/// # Safety
/// As [`amx_sums`].
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(clippy::too_many_arguments)]
unsafe fn amx_sums_threaded(
    workers: &Workers,
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rsa: isize,
    csa: isize,
    b: *const f32,
    rsb: isize,
    csb: isize,
    from_s: bool,
    s: *mut f32,
    lds: usize,
) {
    let threads = workers.threads();
    // Bands of whole 32-row blocks, as even as they go.
    let per_band = m.div_ceil(AMX_MR).div_ceil(threads) * AMX_MR;
    let bands: Vec<std::ops::Range<usize>> = (0..m)
        .step_by(per_band)
        .map(|r0| r0..(r0 + per_band).min(m))
        .collect();
    let (pa, pb, ps) = (SendPtr(a as *mut f32), SendPtr(b as *mut f32), SendPtr(s));
    let mut shared_b = SHARED_B.with(|p| p.take()).unwrap_or_default();
    for (kb, kc, jc, nc) in AmxBlocks::new(k, n).blocks(k, n) {
        let panel_len = amx_pairs(kc) * NR;
        let panels = nc.div_ceil(NR);
        let packed = shared_b.sized(panels * panel_len);
        // Pack: each thread a run of whole panels, into its own part of the buffer.
        let per_part = panels.div_ceil(threads);
        let parts: Vec<(usize, &mut [u32])> = packed
            .chunks_mut(per_part * panel_len)
            .enumerate()
            .map(|(i, part)| (i * per_part, part))
            .collect();
        workers.run(parts, |(p0, part)| {
            let cols = (part.len() / panel_len * NR).min(nc - p0 * NR);
            // SAFETY: columns jc + p0 * NR.. of B's rows kb..kb + kc lie in B (the
            // caller's contract); `part` holds those panels; AMX CPUs have AVX-512F/BW.
            unsafe {
                let from = pb.at(0).offset((jc + p0 * NR) as isize * csb);
                pack_b_amx(part, from, rsb, csb, kb, kc, cols);
            }
        });
        let packed: &[u32] = packed;
        workers.run(bands.clone(), |rows| {
            // SAFETY: each band writes its own rows of S; A and the packed B are only
            // read; AMX is usable on every thread of this process (the permission is
            // the process's, the tile configuration each thread's, made here).
            unsafe {
                let tiles = amx::Tiles::configure();
                let (b_own, mut a_band) = PACKED.with(|p| p.take()).unwrap_or_default();
                let mut stage = Stage([0.0; AMX_MR * NR]);
                amx_block(
                    &tiles,
                    &mut a_band,
                    &mut stage,
                    rows,
                    (pa.at(0), rsa, csa),
                    (kb, kc, jc, nc),
                    packed,
                    from_s || kb > 0,
                    ps.at(0),
                    lds,
                );
                PACKED.with(|p| p.set(Some((b_own, a_band))));
            }
        });
    }
    SHARED_B.with(|p| p.set(Some(shared_b)));
}

thread_local! {
    /// Each thread's AMX packing buffers (B's block, A's band) between calls; taken out
    /// for a call, so a call made while they are out starts with new ones.
    static PACKED: std::cell::Cell<Option<(TileRows, TileRows)>> = const { std::cell::Cell::new(None) };
    /// The calling thread's buffer for the B that [`amx_sums_threaded`] packs for all
    /// its threads.
    static SHARED_B: std::cell::Cell<Option<TileRows>> = const { std::cell::Cell::new(None) };
    /// Each thread's packed B of the `vdpbf16ps` and portable kernels between calls
    /// ([`sgemm_bf16`]; taken out for a call, like [`PACKED`]).
    static PANEL_B: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
    /// Each thread's packed A for [`sgemm_bf16`]: a band of MC rows, or all rows where N
    /// has several column blocks; kept as [`PANEL_B`] is, and only grown.
    static PANEL_A: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The column blocks of an N-column product ([`NC`]): whole panels of [`NR`], their sizes
/// at most one panel apart (no thin last block), each at most NC wide.
fn column_blocks(n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let panels = n.div_ceil(NR);
    let blocks = panels.div_ceil(NC / NR);
    let start = move |i: usize| (i * panels / blocks * NR).min(n);
    (0..blocks).map(move |i| start(i)..start(i + 1))
}

/// `C = alpha * bf16(A) bf16(B) + beta * C`, f32 accumulation, with `kernel`.
/// matrixmultiply's `sgemm` contract: `a` is m x k, `b` k x n, `c` m x n, each with its
/// row and column strides; `beta == 0` overwrites C (NaN in C does not survive).
///
/// # Safety
/// The pointers with these dimensions and strides address valid memory; `c` does not
/// alias `a` or `b`; `kernel` is one this CPU runs ([`Bf16Kernel::is_available`]).
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm_bf16(
    kernel: Bf16Kernel,
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
    if m == 0 || n == 0 {
        return;
    }
    let c_at = |i: usize, j: usize| c.offset(i as isize * rsc + j as isize * csc);
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                let x = c_at(i, j);
                *x = if beta == 0.0 { 0.0 } else { beta * *x };
            }
        }
        return;
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if kernel == Bf16Kernel::Amx {
        sgemm_amx(
            None, m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
        );
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if kernel == Bf16Kernel::Avx2 {
        super::sgemm_avx2::sgemm(
            true, m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
        );
        return;
    }
    // The AVX-512 BF16 kernel packs with AVX2 (`is_available` requires it); the portable
    // kernel packs in scalar (any CPU).
    let vector = kernel == Bf16Kernel::Avx512Bf16;
    let c_at = |i: usize, j: usize| c.offset(i as isize * rsc + j as isize * csc);
    // Kept between calls: a packed block of B is up to 512 KiB (26 MB at the classifier's
    // N = 50257 before N was blocked), and a new one each call may be memory mapped
    // (glibc maps blocks this large), faulted in page by page and unmapped again, a TLB
    // shootdown across the pool's threads (V = 50257 bf16 step on 2 threads of a Zen 4,
    // measured then: 0.612-0.634 -> 0.610-0.616 s).
    let mut b_packed = PANEL_B.with(|p| p.take());
    // Several blocks of columns: A's rows are packed once per K block, all of them (the
    // buffer then keeps 512 bytes per row of the largest such call, 8 MiB at 16384 rows),
    // and each block of B passes under every panel of A from L2 (see [`NC`]).
    let whole_a = n > NC;
    // Kept too (a band of MC rows, or all of A's rows), only grown, and not zeroed:
    // `pack_a` writes every slot it packs (zeroing a new 32 KB each call was 1.2% of a
    // bf16 training step's samples, attention's small products calling it thousands of
    // times a step).
    let mut a_packed = PANEL_A.with(|p| p.take());
    let a_len = if whole_a {
        m.div_ceil(MR) * MR * KC.div_ceil(2)
    } else {
        MC * KC.div_ceil(2)
    };
    if a_packed.len() < a_len {
        a_packed.resize(a_len, 0);
    }
    let mut tile = [0f32; MR * NR];
    for kb in (0..k).step_by(KC) {
        let kc = KC.min(k - kb);
        let pairs = kc.div_ceil(2);
        let update = Update::of_block(kb, alpha, beta);
        if whole_a {
            // Band ib's panels start at panel ib / MR, each `pairs * MR` long.
            for ib in (0..m).step_by(MC) {
                let out = &mut a_packed[ib * pairs..];
                pack_a(out, a, rsa, csa, ib, MC.min(m - ib), kb, kc, vector);
            }
        }
        for cols in column_blocks(n) {
            let (jc, nc) = (cols.start, cols.len());
            let b_block = b.offset(jc as isize * csb);
            pack_b(&mut b_packed, b_block, rsb, csb, kb, kc, nc, vector);
            #[cfg(target_arch = "x86_64")]
            let block_panels = nc.div_ceil(NR);
            for ib in (0..m).step_by(MC) {
                let band = MC.min(m - ib);
                let a_band: &[u32] = if whole_a {
                    &a_packed[ib * pairs..]
                } else {
                    pack_a(&mut a_packed, a, rsa, csa, ib, band, kb, kc, vector);
                    &a_packed
                };
                let a_panels = a_band.chunks_exact(pairs * MR).take(band.div_ceil(MR));
                for (i0, ap) in (ib..).step_by(MR).zip(a_panels) {
                    let mr = MR.min(m - i0);
                    for (panel, bp) in b_packed.chunks_exact(pairs * NR).enumerate() {
                        let j0 = jc + panel * NR;
                        let width = NR.min(n - j0);
                        #[cfg(target_arch = "x86_64")]
                        if kernel == Bf16Kernel::Avx512Bf16 && csc == 1 && rsc > 0 {
                            // The next tile: the next panel, or the next rows' first in
                            // this block. (Past C's last tile it points outside C: only
                            // prefetched.)
                            let next = if panel + 1 < block_panels {
                                c.wrapping_offset(i0 as isize * rsc + (j0 + NR) as isize)
                            } else {
                                c.wrapping_offset((i0 + MR) as isize * rsc + jc as isize)
                            };
                            let ldc = rsc as usize;
                            let tile = CTile {
                                c: c_at(i0, j0),
                                ldc,
                                rows: mr,
                                width,
                                next,
                            };
                            kernel_avx512bf16(pairs, ap, bp, tile, update);
                            continue;
                        }
                        match kernel {
                            #[cfg(target_arch = "x86_64")]
                            Bf16Kernel::Avx512Bf16 => {
                                let (c, next) = (tile.as_mut_ptr(), tile.as_ptr());
                                let scratch = CTile {
                                    c,
                                    ldc: NR,
                                    rows: MR,
                                    width: NR,
                                    next,
                                };
                                kernel_avx512bf16(
                                    pairs,
                                    ap,
                                    bp,
                                    scratch,
                                    Update::Set { alpha: 1.0 },
                                )
                            }
                            _ => kernel_portable(pairs, ap, bp, &mut tile),
                        }
                        update.apply_tile(&tile, c_at(i0, j0), rsc, csc, mr, width);
                    }
                }
            }
        }
    }
    PANEL_B.with(|p| p.set(b_packed));
    PANEL_A.with(|p| p.set(a_packed));
}

/// [`sgemm_bf16`] on all of `workers`' threads at once, where the kernel shares work
/// better that way than bands of rows each on their own thread: AMX, whose threads share
/// one packed B (`amx_sums_threaded`). Returns false, having done nothing, for the other
/// kernels (the caller splits rows). Same bits as one thread. (The `vdpbf16ps` kernel's
/// threads sharing one packed B ran `micro gemm`'s forward classifier, N = 50257, at
/// 284-305 against 240-279 GFLOP/s on 2 threads of a Zen 4, but a training step of the
/// V = 50257 GPT no faster, 0.667-0.680 against 0.623-0.662 s: bands of rows it is.)
///
/// # Safety
/// As [`sgemm_bf16`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm_bf16_shared(
    workers: &Workers,
    kernel: Bf16Kernel,
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
) -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if kernel == Bf16Kernel::Amx && m > 0 && n > 0 && k > 0 {
        let w = Some(workers);
        sgemm_amx(
            w, m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
        );
        return true;
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    let _ = (
        workers, kernel, m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// The AVX-512 BF16 kernel packs with AVX2, so a CPU (or a VM's CPUID mask) that
    /// shows AVX-512F and BF16 without AVX2 must not get it; nor the AVX2 kernel.
    #[test]
    fn avx512_bf16_kernel_needs_avx2_too() {
        let all = X86Features {
            avx512f: true,
            avx512bf16: true,
            avx2: true,
            fma: true,
        };
        assert!(Bf16Kernel::Avx512Bf16.runs_with(all));
        let no_avx2 = X86Features { avx2: false, ..all };
        assert!(!Bf16Kernel::Avx512Bf16.runs_with(no_avx2));
        assert!(!Bf16Kernel::Avx2.runs_with(no_avx2));
        assert!(Bf16Kernel::Portable.runs_with(no_avx2));
        assert!(!Bf16Kernel::Avx512Bf16.runs_with(X86Features {
            avx512bf16: false,
            ..all
        }));
        assert!(!Bf16Kernel::Avx2.runs_with(X86Features { fma: false, ..all }));
        // And this CPU: `is_available` (what `force` and `Gemm::with_bf16_kernel` check)
        // agrees with the features it detects.
        #[cfg(target_arch = "x86_64")]
        for k in [Bf16Kernel::Avx512Bf16, Bf16Kernel::Avx2] {
            assert_eq!(k.is_available(), k.runs_with(X86Features::detect()), "{k}");
            assert_eq!(k.force().is_ok(), k.is_available(), "{k}");
        }
    }

    /// The definition in f64 over the bf16-rounded operands, and `sum |a| |b|` per
    /// element (what the error bound scales with).
    fn reference(m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let r = |x: f32| bf16::from_f32(x).to_f32() as f64;
        let (ra, rb): (Vec<f64>, Vec<f64>) = (
            a.iter().map(|&x| r(x)).collect(),
            b.iter().map(|&x| r(x)).collect(),
        );
        let mut c = vec![0.0; m * n];
        let mut abs = vec![0.0; m * n];
        for i in 0..m {
            for p in 0..k {
                let x = ra[i * k + p];
                for j in 0..n {
                    c[i * n + j] += x * rb[p * n + j];
                    abs[i * n + j] += (x * rb[p * n + j]).abs();
                }
            }
        }
        (c, abs)
    }

    /// The error bound of a sum of k products computed in f32: each product of two bf16
    /// is exact in f32 (8 + 8 significand bits <= 24, no subnormal products in these
    /// tests), and the k products of a K block plus the `ceil(k / KC)` block sums added
    /// into C (none for AMX, whose sums run through the blocks as one chain) take at most
    /// `n = k + ceil(k / KC)` f32 additions, each rounded to nearest
    /// (u = 2^-24), in whatever order or tree a kernel sums them (`tdpbf16ps` pairs first,
    /// `vdpbf16ps` one at a time). For any summation tree |error| <= gamma_n sum |a| |b|,
    /// gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability, 4.2).
    fn bound(k: usize, sum_abs: f64) -> f64 {
        let u = f32::EPSILON as f64 / 2.0;
        let n = (k + k.div_ceil(KC)) as f64;
        n * u / (1.0 - n * u) * sum_abs
    }

    fn vals(len: usize, seed: u32) -> Vec<f32> {
        (0..len as u32)
            .map(|i| {
                let h = (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) >> 8;
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn run(kernel: Bf16Kernel, m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        assert!(
            kernel.is_available(),
            "{kernel} forced without the CPU for it"
        );
        let mut c = vec![f32::NAN; m * n];
        // SAFETY: row-major m x k, k x n, m x n over slices of those sizes; the kernel is
        // available (asserted).
        unsafe {
            sgemm_bf16(
                kernel,
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                k as isize,
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
    }

    /// Odd shapes: one element, K odd (a half pair), K past one block, edges in M and N.
    const SHAPES: [(usize, usize, usize); 6] = [
        (1, 1, 1),
        (3, 5, 7),
        (9, 33, 31),
        (17, 257, 65),
        (8, 600, 32),
        (40, 64, 100),
    ];

    /// AMX's edges: M and N around its 16-row / 16-column tiles and 32 x 32 micro-tile,
    /// K around its 32-value tile rows and the 256- and 1024-value blocks (odd, short of
    /// a tile, one past), and around the 16-pair blocks of the AVX-512 packing.
    /// K across AMX's blocks (2100: three of 704) and N across its column blocks
    /// (1400 > the 1344 columns whose packed B fits `AMX_B_BLOCK_BYTES` at 576 of k).
    const AMX_EDGES: [(usize, usize, usize); 16] = [
        (17, 1100, 1400),
        (33, 2100, 70),
        (17, 1025, 33),
        (33, 1023, 16),
        (16, 32, 16),
        (15, 31, 17),
        (31, 33, 33),
        (32, 32, 32),
        (33, 63, 47),
        (1, 1024, 1),
        (70, 2, 95),
        (64, 255, 64),
        (65, 513, 31),
        (2, 300, 130),
        (48, 96, 16),
        (100, 17, 3),
    ];

    /// The GPT-2 shapes the model multiplies (C = 256 `small`, 768 124M, 1024 350M; the
    /// MLP's 4C), with fewer rows than B*T to keep the f64 reference quick: every
    /// (K, N) pair of a layer's products.
    const MODEL_SHAPES: [(usize, usize, usize); 6] = [
        (64, 256, 768),
        (64, 1024, 256),
        (40, 768, 2304),
        (33, 3072, 768),
        (32, 1024, 1024),
        (48, 768, 3072),
    ];

    fn all_shapes() -> impl Iterator<Item = (usize, usize, usize)> {
        SHAPES.into_iter().chain(AMX_EDGES).chain(MODEL_SHAPES)
    }

    /// Skip line for tests that need a kernel this CPU lacks; true when it is here.
    /// A kernel named in `ZERO_REQUIRE_ISA` (comma-separated kernel names, e.g.
    /// `avx2,avx512,amx`) must be here: a runner known to have it proves its tests ran.
    fn have(kernel: Bf16Kernel) -> bool {
        let ok = kernel.is_available();
        if !ok {
            assert!(
                !required(kernel.name()),
                "ZERO_REQUIRE_ISA names {kernel}, and this CPU (or OS) does not run it"
            );
            eprintln!("SKIP: this CPU (or OS) does not run the {kernel} bf16 kernel");
        }
        ok
    }

    /// `ZERO_REQUIRE_ISA` lists `name`.
    fn required(name: &str) -> bool {
        std::env::var("ZERO_REQUIRE_ISA")
            .is_ok_and(|v| v.split(',').any(|w| w.trim().eq_ignore_ascii_case(name)))
    }

    #[test]
    fn matches_the_f64_product_of_the_rounded_operands() {
        for (m, k, n) in all_shapes() {
            let (a, b) = (vals(m * k, 1), vals(k * n, 2));
            let (want, abs) = reference(m, k, n, &a, &b);
            for kernel in Bf16Kernel::available() {
                let got = run(kernel, m, k, n, &a, &b);
                for ((g, w), s) in got.iter().zip(&want).zip(&abs) {
                    let tol = bound(k, *s);
                    assert!(
                        (*g as f64 - w).abs() <= tol,
                        "{kernel} {m}x{k}x{n}: {g} vs {w} (bound {tol:e})"
                    );
                }
            }
        }
    }

    #[test]
    fn amx_agrees_with_avx512_bf16_within_the_bound() {
        if !have(Bf16Kernel::Amx) || !have(Bf16Kernel::Avx512Bf16) {
            return;
        }
        let mut worst = 0.0f64; // largest |amx - avx512| / bound seen
        let mut differ = 0usize;
        let mut total = 0usize;
        for (m, k, n) in all_shapes() {
            let (a, b) = (vals(m * k, 11), vals(k * n, 12));
            let (_, abs) = reference(m, k, n, &a, &b);
            let x = run(Bf16Kernel::Amx, m, k, n, &a, &b);
            let v = run(Bf16Kernel::Avx512Bf16, m, k, n, &a, &b);
            for ((x, v), s) in x.iter().zip(&v).zip(&abs) {
                // Both within `bound` of the exact sum, so within twice it of each other.
                let tol = 2.0 * bound(k, *s);
                let d = (*x as f64 - *v as f64).abs();
                assert!(
                    d <= tol,
                    "{m}x{k}x{n}: amx {x} vs avx512 {v} (bound {tol:e})"
                );
                worst = worst.max(if tol > 0.0 { d / tol } else { 0.0 });
                differ += usize::from(x.to_bits() != v.to_bits());
                total += 1;
            }
        }
        eprintln!("amx vs avx512bf16: {differ} of {total} elements differ; worst |diff| = {worst:.3} x bound");
    }

    #[test]
    fn amx_on_many_threads_at_once_gives_the_same_bits() {
        // The tile configuration is per thread: bands on scoped threads, each configuring
        // its own tiles, give the bits of the whole product on one thread.
        if !have(Bf16Kernel::Amx) {
            return;
        }
        let (m, k, n) = (150, 700, 90);
        let (a, b) = (vals(m * k, 13), vals(k * n, 14));
        let whole = run(Bf16Kernel::Amx, m, k, n, &a, &b);
        let rows = 37;
        let parts: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..m)
                .step_by(rows)
                .map(|i0| {
                    let (a, b) = (&a, &b);
                    s.spawn(move || {
                        let mr = rows.min(m - i0);
                        run(Bf16Kernel::Amx, mr, k, n, &a[i0 * k..(i0 + mr) * k], b)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("band thread"))
                .collect()
        });
        let banded: Vec<f32> = parts.concat();
        assert!(whole
            .iter()
            .zip(&banded)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
    }

    /// The AVX2 packing of the `vdpbf16ps` kernel gives the scalar packing's u32 in all
    /// four layouts, on specials (NaN, infinities, subnormals, signed zeros, rounding
    /// ties) and random values, with K around its 8-pair steps and odd, partial row bands
    /// and N around the 32-column panels.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vector_packing_equals_scalar_packing() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            assert!(
                !required("avx2"),
                "ZERO_REQUIRE_ISA names avx2, and this CPU does not have it"
            );
            eprintln!("SKIP: this CPU does not have AVX2 (vector packing)");
            return;
        }
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE / 4.0,
            -f32::MIN_POSITIVE / 3.0,
            0.0,
            -0.0,
            f32::from_bits(0x3F80_8000), // a tie: rounds to even (down)
            f32::from_bits(0x3F81_8000), // a tie: rounds to even (up)
            f32::MAX,
            1.0 + f32::EPSILON,
        ];
        let (rows, cols) = (24, 70);
        let x: Vec<f32> = vals(rows * cols, 31)
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                if i % 5 == 0 {
                    specials[(i / 5) % specials.len()]
                } else {
                    v
                }
            })
            .collect();
        for kc in [1usize, 2, 15, 16, 17, 31, 33, 48] {
            // Bands of one panel, whole or not, and of several (a partial last one).
            let bands = [
                (0, 0, MR),
                (0, 3, MR),
                (0, 0, 5),
                (0, 5, 1),
                (0, 0, 24),
                (3, 2, 21),
                (1, 0, 16),
            ];
            for (i0, kb, band) in bands {
                // A rows contiguous (rows x cols, row-major) and A = X^T (columns
                // contiguous: x read as cols x rows, column-major).
                for (rsa, csa) in [(cols as isize, 1), (1, rows as isize)] {
                    let len = kc.div_ceil(2) * band.next_multiple_of(MR);
                    let (mut scalar, mut vector) = (vec![7u32; len], vec![9u32; len]);
                    // SAFETY: rows i0..i0 + band <= 24 and columns kb..kb + kc <= 53 of a
                    // 24 x 70 matrix in either layout lie inside x; AVX2 (checked).
                    unsafe {
                        pack_a(&mut scalar, x.as_ptr(), rsa, csa, i0, band, kb, kc, false);
                        pack_a(&mut vector, x.as_ptr(), rsa, csa, i0, band, kb, kc, true);
                    }
                    let at = format!("A ({rsa}, {csa}) rows {i0}+{band} kb {kb} kc {kc}");
                    assert_eq!(scalar, vector, "{at}");
                }
            }
            // B rows contiguous (K x n, row-major) and B = W^T (columns contiguous).
            for n in [1, 7, 8, 13, 33, 40]
                .into_iter()
                .filter(|n| kc * n <= x.len())
            {
                // Rows contiguous, columns contiguous (B = W^T), and neither (every
                // other element of a 2kc x 2n matrix; scalar packing only).
                for (rsb, csb) in [(n as isize, 1), (1, kc as isize), (2 * n as isize, 2)] {
                    if rsb == 2 * n as isize && 4 * kc * n > x.len() {
                        continue;
                    }
                    // Packed into a new buffer, and into buffers a previous call left
                    // NaN pairs in (the kept `PANEL_B`): every slot is written or zeroed.
                    let (mut scalar, mut vector) = (Vec::new(), vec![u32::MAX; 4096]);
                    let mut stale_scalar = vec![u32::MAX; 4096];
                    // SAFETY: a kc x n matrix in each layout inside x (kc * n <= x.len(),
                    // and the strided one's span checked above); AVX2 (checked).
                    unsafe {
                        pack_b(&mut scalar, x.as_ptr(), rsb, csb, 0, kc, n, false);
                        pack_b(&mut vector, x.as_ptr(), rsb, csb, 0, kc, n, true);
                        pack_b(&mut stale_scalar, x.as_ptr(), rsb, csb, 0, kc, n, false);
                    }
                    assert_eq!(scalar, vector, "B ({rsb}, {csb}) kc {kc} n {n}");
                    assert_eq!(scalar, stale_scalar, "B ({rsb}, {csb}) kc {kc} n {n}");
                }
            }
        }
    }

    /// `C = alpha A B + beta C` on row-major C for (alpha, beta) = (1, 1) (AMX's sums
    /// start from C), (0.5, 0) (then scaled) and (0.5, 2) (a scratch): within the bound of
    /// the exact value, and, on bands of rows computed apart, the same bits.
    #[test]
    fn accumulating_and_scaled_products_match_and_do_not_depend_on_bands() {
        let (m, k, n) = (70, 1100, 45);
        let (a, b, c0) = (vals(m * k, 21), vals(k * n, 22), vals(m * n, 23));
        let (ab, abs) = reference(m, k, n, &a, &b);
        let product = |kernel, alpha: f32, beta: f32, rows: std::ops::Range<usize>| {
            let mut c = c0[rows.start * n..rows.end * n].to_vec();
            // SAFETY: row-major rows.len() x k, k x n and rows.len() x n inside the
            // vectors; the kernel is one of `available()`.
            unsafe {
                sgemm_bf16(
                    kernel,
                    rows.len(),
                    k,
                    n,
                    alpha,
                    a[rows.start * k..].as_ptr(),
                    k as isize,
                    1,
                    b.as_ptr(),
                    n as isize,
                    1,
                    beta,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                )
            };
            c
        };
        for kernel in Bf16Kernel::available() {
            for (alpha, beta) in [(1.0f32, 1.0f32), (0.5, 0.0), (0.5, 2.0)] {
                let whole = product(kernel, alpha, beta, 0..m);
                for (i, &got) in whole.iter().enumerate() {
                    let want = alpha as f64 * ab[i] + beta as f64 * c0[i] as f64;
                    // The sum's bound over |alpha| sum |a b| + |beta c|, with two more
                    // roundings (the scaling and the add of beta C), doubled for slack.
                    let scale = alpha.abs() as f64 * abs[i] + (beta * c0[i]).abs() as f64;
                    let tol = 2.0 * bound(k + 2, scale);
                    assert!(
                        (got as f64 - want).abs() <= tol,
                        "{kernel} alpha {alpha} beta {beta} at {i}: {got} vs {want}"
                    );
                }
                let banded: Vec<f32> = (0..m)
                    .step_by(37)
                    .flat_map(|i0| product(kernel, alpha, beta, i0..(i0 + 37).min(m)))
                    .collect();
                assert!(
                    whole
                        .iter()
                        .zip(&banded)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{kernel} alpha {alpha} beta {beta}: bands differ"
                );
            }
        }
    }

    #[test]
    fn a_pool_gives_the_bits_of_one_thread() {
        use super::super::gemm::{Gemm, MatLayout};
        let kernels = [Bf16Kernel::Amx, Bf16Kernel::Avx512Bf16, Bf16Kernel::Avx2];
        // AMX's threads share one packed B; the others take bands of rows.
        // (m, k, n, A stored transposed, B stored transposed): two AMX N blocks (k =
        // 1100 gives K blocks of 576 and N blocks of at most 1344 columns), edge rows
        // and columns, odd k, A = X^T (weight gradients) and B = W^T (forward) layouts,
        // bands that begin inside a panel of 8 rows, a B of two panels (50 x 600 x 40:
        // enough work to be split).
        let cases = [
            (70, 1100, 1400, false, false),
            (1024, 384, 1536, false, true),
            (384, 1024, 1152, true, false),
            (33, 64, 600, false, false),
            (100, 31, 777, true, true),
            (50, 600, 40, true, false),
        ];
        for ((m, k, n, at, bt), kernel) in cases.into_iter().flat_map(|x| kernels.map(|k| (x, k))) {
            if !have(kernel) {
                continue;
            }
            let (a, b, c0) = (vals(m * k, 31), vals(k * n, 32), vals(m * n, 33));
            let la = if at {
                MatLayout::rm(k, m, m).t()
            } else {
                MatLayout::rm(m, k, k)
            };
            let lb = if bt {
                MatLayout::rm(n, k, k).t()
            } else {
                MatLayout::rm(k, n, n)
            };
            let lc = MatLayout::rm(m, n, n);
            for (alpha, beta) in [(1.0f32, 0.0f32), (1.0, 1.0), (0.5, 0.0), (0.5, 2.0)] {
                let run = |threads: usize| {
                    let mut c = c0.clone();
                    Gemm::new(threads)
                        .with_bf16_kernel(Some(kernel))
                        .run(alpha, &a, la, &b, lb, beta, &mut c, lc);
                    c
                };
                let one = run(1);
                for threads in [2, 3] {
                    let many = run(threads);
                    assert!(
                        one.iter()
                            .zip(&many)
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{kernel} {m}x{k}x{n} A^T {at} B^T {bt} alpha {alpha} beta {beta}: \
                         {threads} threads differ from one"
                    );
                }
            }
        }
    }

    /// Every way a product enters C, bit for bit alike on `vdpbf16ps` and the portable
    /// kernel: alpha and beta (the kernel multiplies and adds in its own registers, so a
    /// fused multiply-add there would differ), C's rows contiguous with and without
    /// padding (updated in the kernel, masked at the edges) or its columns contiguous
    /// (through the scratch tile), A = X^T and B = W^T, bands of MC rows and K blocks.
    #[test]
    fn the_vector_kernel_updates_c_as_the_portable_one_bit_for_bit() {
        if !have(Bf16Kernel::Avx512Bf16) {
            return;
        }
        let shapes = [(1, 1, 1), (9, 33, 31), (70, 300, 45), (130, 520, 100)];
        let scales = [
            (1.0f32, 0.0f32),
            (0.5, 0.0),
            (1.0, 1.0),
            (0.5, 2.0),
            (-0.75, 0.25),
        ];
        for (m, k, n) in shapes {
            let (a, b) = (vals(m * k, 41), vals(k * n, 42));
            // (row stride, column stride, length) of C.
            let c_layouts = [(n, 1, m * n), (n + 5, 1, m * (n + 5)), (1, m, m * n)];
            for (alpha, beta) in scales {
                for (rsc, csc, len) in c_layouts {
                    for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                        let (rsa, csa) = if a_t { (1, m) } else { (k, 1) };
                        let (rsb, csb) = if b_t { (1, k) } else { (n, 1) };
                        let c0 = vals(len, 43);
                        let run = |kernel| {
                            let mut c = c0.clone();
                            // SAFETY: A (m x k), B (k x n) and C (m x n) in the strides
                            // given lie inside their vectors; the kernels are available.
                            unsafe {
                                sgemm_bf16(
                                    kernel,
                                    m,
                                    k,
                                    n,
                                    alpha,
                                    a.as_ptr(),
                                    rsa as isize,
                                    csa as isize,
                                    b.as_ptr(),
                                    rsb as isize,
                                    csb as isize,
                                    beta,
                                    c.as_mut_ptr(),
                                    rsc as isize,
                                    csc as isize,
                                )
                            };
                            c
                        };
                        let (p, v) = (run(Bf16Kernel::Portable), run(Bf16Kernel::Avx512Bf16));
                        let at = format!(
                            "{m}x{k}x{n} alpha {alpha} beta {beta} C ({rsc}, {csc}) A^T {a_t} B^T {b_t}"
                        );
                        for (x, y) in p.iter().zip(&v) {
                            assert_eq!(x.to_bits(), y.to_bits(), "{at}: {x} vs {y}");
                        }
                        // A padded row's tail is not C's: left as it was.
                        for i in (0..m).filter(|_| csc == 1) {
                            for j in n..rsc {
                                assert_eq!(
                                    v[i * rsc + j].to_bits(),
                                    c0[i * rsc + j].to_bits(),
                                    "{at}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_vector_kernel_equals_the_portable_one_bit_for_bit() {
        if !have(Bf16Kernel::Avx512Bf16) {
            return;
        }
        for (m, k, n) in all_shapes() {
            let (a, b) = (vals(m * k, 3), vals(k * n, 4));
            let p = run(Bf16Kernel::Portable, m, k, n, &a, &b);
            let v = run(Bf16Kernel::Avx512Bf16, m, k, n, &a, &b);
            for (x, y) in p.iter().zip(&v) {
                assert_eq!(x.to_bits(), y.to_bits(), "{m}x{k}x{n}: {x} vs {y}");
            }
        }
    }

    /// N past [`NC`] is cut into column blocks, with A packed whole per K block: each
    /// block of C has the bits of the same columns multiplied alone (here 519 columns
    /// at a time, so A packed band by band), on the vector and the portable kernels, for
    /// every operand layout (A = X^T and B = W^T as the model passes them) and with C
    /// updated by alpha and beta. 77 rows: two MC bands and a ragged panel; K = 301: two
    /// K blocks and a half pair; N = 2098: 66 panels in 3 blocks of 22.
    #[test]
    fn column_blocks_give_the_bits_of_each_block_alone() {
        let (m, k, n) = (MC + 13, KC + 45, 2 * NC + 50);
        let widths: Vec<usize> = column_blocks(n).map(|b| b.len()).collect();
        assert_eq!(widths, [704, 704, 690], "the whole-A path takes 3 blocks");
        let (a, b, c0) = (vals(m * k, 21), vals(k * n, 22), vals(m * n, 23));
        let layouts = [
            (false, false, 1.0, 0.0),
            (true, true, 0.5, 2.0),
            (true, false, 1.0, 1.0),
            (false, true, -1.0, 0.5),
        ];
        for kernel in [Bf16Kernel::Portable, Bf16Kernel::Avx512Bf16] {
            if !have(kernel) {
                continue;
            }
            for (a_t, b_t, alpha, beta) in layouts {
                // A is m x k, stored as it is or as its k x m transpose; B likewise.
                let (rsa, csa) = if a_t {
                    (1, m as isize)
                } else {
                    (k as isize, 1)
                };
                let (rsb, csb) = if b_t {
                    (1, k as isize)
                } else {
                    (n as isize, 1)
                };
                // Columns j0..j0 + nc of C (m x n, row-major) from those of B.
                let product = |j0: usize, nc: usize, c: &mut [f32]| {
                    // SAFETY: A's and B's strides address their m * k and k * n slices;
                    // column j0 of B and of C starts inside them and nc columns fit.
                    unsafe {
                        sgemm_bf16(
                            kernel,
                            m,
                            k,
                            nc,
                            alpha,
                            a.as_ptr(),
                            rsa,
                            csa,
                            b.as_ptr().offset(j0 as isize * csb),
                            rsb,
                            csb,
                            beta,
                            c.as_mut_ptr().add(j0),
                            n as isize,
                            1,
                        )
                    }
                };
                let mut whole = c0.clone();
                product(0, n, &mut whole);
                let mut apart = c0.clone();
                let alone = NC / 2 + 7; // 519
                for j0 in (0..n).step_by(alone) {
                    product(j0, alone.min(n - j0), &mut apart);
                }
                let how = format!("{kernel} A^T {a_t} B^T {b_t} alpha {alpha} beta {beta}");
                for (i, (x, y)) in whole.iter().zip(&apart).enumerate() {
                    let at = (i / n, i % n);
                    assert_eq!(x.to_bits(), y.to_bits(), "{how} at {at:?}: {x} vs {y}");
                }
            }
        }
    }

    /// Column blocks cover 0..n once, in order, each a whole number of panels (the last
    /// may end at n), at most NC wide and at most one panel apart in size.
    #[test]
    fn column_blocks_partition_n_evenly() {
        for n in 1..=8 * NC + 3 {
            let blocks: Vec<_> = column_blocks(n).collect();
            assert_eq!(blocks.first().map(|b| b.start), Some(0), "n = {n}");
            assert_eq!(blocks.last().map(|b| b.end), Some(n), "n = {n}");
            for pair in blocks.windows(2) {
                assert_eq!(pair[0].end, pair[1].start, "n = {n}");
            }
            let panels: Vec<usize> = blocks.iter().map(|b| b.len().div_ceil(NR)).collect();
            let (least, most) = (panels.iter().min(), panels.iter().max());
            assert!(blocks
                .iter()
                .all(|b| b.start % NR == 0 && !b.is_empty() && b.len() <= NC));
            assert!(most.zip(least).is_some_and(|(a, b)| a - b <= 1), "n = {n}");
            assert_eq!(blocks.len() > 1, n > NC, "n = {n}");
        }
    }

    #[test]
    fn kernel_names_parse_and_unavailable_ones_are_refused() {
        for k in Bf16Kernel::ALL {
            assert_eq!(k.name().parse::<Bf16Kernel>(), Ok(k));
        }
        assert_eq!(" AVX512 ".parse::<Bf16Kernel>(), Ok(Bf16Kernel::Avx512Bf16));
        let e = "sse2".parse::<Bf16Kernel>().expect_err("not a kernel");
        assert_eq!(
            e.to_string(),
            "\"sse2\" is not a bf16 kernel: use amx, avx512, avx2 or portable"
        );
        let e = Bf16KernelError::BadEnv("sse2".into()).to_string();
        assert!(e.starts_with("ZERO_BF16_KERNEL=\"sse2\" is not"), "{e}");
        assert_eq!(Bf16Kernel::Portable.force(), Ok(Bf16Kernel::Portable));
        for k in Bf16Kernel::ALL {
            match k.force() {
                Ok(f) => assert!(f == k && Bf16Kernel::available().contains(&k)),
                Err(e) => assert_eq!(
                    e,
                    Bf16KernelError::Unavailable {
                        requested: k,
                        best: Bf16Kernel::best()
                    }
                ),
            }
        }
        assert_eq!(Bf16Kernel::available().last(), Some(&Bf16Kernel::best()));
    }

    #[test]
    fn rounding_equals_the_half_crate() {
        let mut bits = 0x1234_5678u32;
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            f32::INFINITY,
        ];
        let randoms = (0..200_000).map(|_| {
            bits = bits.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            f32::from_bits(bits)
        });
        for x in specials.into_iter().chain(randoms) {
            let want = bf16::from_f32(x);
            let got = bf16::from_bits(to_bf16(x) as u16);
            if want.is_nan() {
                assert!(got.is_nan(), "{x:e}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{x:e}");
            }
        }
    }

    /// AMX's packing rounds alike on its vector paths (`vcvtne2ps2bf16`) and its scalar
    /// edges ([`amx_bf16`]): ties to even, subnormals flushed (the largest one would round
    /// up to the smallest normal without the flush), NaN quieted, infinities kept.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn amx_packing_rounds_alike_on_every_path() {
        if !Bf16Kernel::Amx.is_available() {
            eprintln!("skipped: this CPU has no AMX");
            return;
        }
        let specials = [
            1.0f32 + f32::EPSILON * 64.0, // a tie: stays 1.0 (even)
            1.0 + f32::EPSILON * 192.0,   // a tie: rounds up to the even neighbour
            f32::from_bits(0x007F_FFFF),  // the largest subnormal
            -f32::from_bits(1),
            f32::MIN_POSITIVE,
            f32::from_bits(0x7F80_0001), // a signalling NaN
            f32::NEG_INFINITY,
            f32::MAX,
            -0.0,
        ];
        let mut bits = 0x9E37_79B9u32;
        // Whole blocks, then vector blocks and scalar edges in one call (an odd k: pairs
        // past the last 16 and the odd k alone; 29 rows: 13 transposed rows one by one).
        for (rows, k) in [(32, 64), (29, 69)] {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| {
                    bits = bits.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    match i % 3 {
                        0 => specials[(i / 3) % specials.len()],
                        _ => f32::from_bits(bits),
                    }
                })
                .collect();
            // x as rows x k row-major, transposed, and at stride 2 (the scalar path).
            let x_t: Vec<f32> = (0..k * rows)
                .map(|i| x[(i % rows) * k + i / rows])
                .collect();
            let x2: Vec<f32> = x.iter().flat_map(|&v| [v, 0.0]).collect();
            let pairs = amx_pairs(k);
            // Row r's pair p (the odd k alone in the low half).
            let want = |r: usize, p: usize| match 2 * p + 1 < k {
                true => amx_pair(x[r * k + 2 * p], x[r * k + 2 * p + 1]),
                false => amx_bf16(x[r * k + 2 * p]),
            };
            // A: out[r * a_row_stride + p] holds row r's pair p.
            let stride = a_row_stride(pairs);
            for (src, rs, cs) in [
                (&x, k as isize, 1isize),
                (&x_t, 1, rows as isize),
                (&x2, 2 * k as isize, 2),
            ] {
                let mut out = vec![0u32; AMX_MR * stride];
                // SAFETY: the strides address `rows x k` values of `src`; AMX CPUs have
                // AVX-512F, BW and BF16 (checked by `is_available`).
                unsafe { pack_a_amx(&mut out, src.as_ptr(), rs, cs, 0, rows, 0, k) };
                for r in 0..rows {
                    for p in 0..k.div_ceil(2) {
                        assert_eq!(
                            out[r * stride + p],
                            want(r, p),
                            "{rows} x {k}, A strides {rs} {cs}: row {r} pair {p}"
                        );
                    }
                }
            }
            // B = x^T (k x rows): column j's pair p is x's row j, pair p; in the packed
            // panel at (p, j).
            for (src, rs, cs) in [
                (&x_t, rows as isize, 1isize),
                (&x, 1, k as isize),
                (&x2, 2, 2 * k as isize),
            ] {
                let mut out = vec![0u32; rows.div_ceil(NR) * pairs * NR];
                // SAFETY: as above, `k x rows` values of `src`.
                unsafe { pack_b_amx(&mut out, src.as_ptr(), rs, cs, 0, k, rows) };
                for j in 0..rows {
                    for p in 0..k.div_ceil(2) {
                        assert_eq!(
                            out[(j / NR * pairs + p) * NR + j % NR],
                            want(j, p),
                            "{rows} x {k}, B strides {rs} {cs}: column {j} pair {p}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_operand_layout_packs_alike() {
        // The same product from A and B stored row-major, transposed, and with both
        // strides above 1 (every packing path): equal bit for bit.
        let (m, k, n) = (35, 37, 45);
        let (a, b) = (vals(m * k, 8), vals(k * n, 9));
        for kernel in Bf16Kernel::available() {
            let want = run(kernel, m, k, n, &a, &b);
            let a_t: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
            let b_t: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            // Strides 2 x: every other element of a doubled buffer.
            let a2: Vec<f32> = a.iter().flat_map(|&x| [x, f32::NAN]).collect();
            let b2: Vec<f32> = b.iter().flat_map(|&x| [x, f32::NAN]).collect();
            type Case<'a> = (&'a [f32], isize, isize, &'a [f32], isize, isize);
            let cases: [Case<'_>; 3] = [
                (&a_t, 1, m as isize, &b_t, 1, k as isize),
                (&a2, 2 * k as isize, 2, &b2, 2 * n as isize, 2),
                (&a, k as isize, 1, &b_t, 1, k as isize),
            ];
            for (ca, rsa, csa, cb, rsb, csb) in cases {
                let mut c = vec![0f32; m * n];
                // SAFETY: each case's strides address its buffer's m x k and k x n elements;
                // the kernel is one of `available()`.
                unsafe {
                    sgemm_bf16(
                        kernel,
                        m,
                        k,
                        n,
                        1.0,
                        ca.as_ptr(),
                        rsa,
                        csa,
                        cb.as_ptr(),
                        rsb,
                        csb,
                        0.0,
                        c.as_mut_ptr(),
                        n as isize,
                        1,
                    )
                };
                assert!(
                    c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{kernel}: strides {rsa} {csa} {rsb} {csb}"
                );
            }
        }
    }

    #[test]
    fn alpha_beta_and_strided_views() {
        // C^T (column-major) = 0.5 A B + 2 C, A given transposed.
        let (m, k, n) = (11, 300, 13);
        let a_t = vals(k * m, 5); // A stored k x m
        let b = vals(k * n, 6);
        let c0 = vals(m * n, 7);
        for kernel in Bf16Kernel::available() {
            let mut c = c0.clone();
            // SAFETY: the strides address k x m, k x n and n x m buffers of those sizes; the
            // kernel is one of `available()`.
            unsafe {
                sgemm_bf16(
                    kernel,
                    m,
                    k,
                    n,
                    0.5,
                    a_t.as_ptr(),
                    1,
                    m as isize,
                    b.as_ptr(),
                    n as isize,
                    1,
                    2.0,
                    c.as_mut_ptr(),
                    1,
                    m as isize,
                )
            };
            let a: Vec<f32> = (0..m * k).map(|i| a_t[(i % k) * m + i / k]).collect();
            let (ab, _) = reference(m, k, n, &a, &b);
            for i in 0..m {
                for j in 0..n {
                    let want = 0.5 * ab[i * n + j] + 2.0 * c0[j * m + i] as f64;
                    let got = c[j * m + i] as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{kernel}: {got} vs {want}"
                    );
                }
            }
        }
        // k = 0 with beta = 0 overwrites NaN.
        let mut z = [f32::NAN; 4];
        // SAFETY: k = 0 reads nothing; C is 2 x 2.
        unsafe {
            sgemm_bf16(
                Bf16Kernel::Portable,
                2,
                0,
                2,
                1.0,
                [].as_ptr(),
                0,
                0,
                [].as_ptr(),
                0,
                0,
                0.0,
                z.as_mut_ptr(),
                2,
                1,
            )
        };
        assert_eq!(z, [0.0; 4]);
    }
}
