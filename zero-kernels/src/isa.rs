//! Instruction-set levels and how a kernel call is executed (which level, how many threads).
//!
//! The level is picked at run time (`is_x86_feature_detected!`), so a plain `cargo build`
//! takes the fast path on a machine that has it; tests force every level the machine has.
//! All levels give bitwise identical results (see `simd.rs` for why), so the choice is a
//! speed choice only.

use crate::error::KernelError;

/// An instruction-set level of the CPU kernels, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable scalar code (one element at a time).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C (8 f32 lanes; "x86-64-v3").
    Avx2,
    /// x86-64 AVX-512 F/BW/DQ/VL (16 f32 lanes; "x86-64-v4").
    Avx512,
}

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// The best level this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && Isa::Avx2.is_available_x86()
            {
                return Isa::Avx512;
            }
            if Isa::Avx2.is_available_x86() {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    #[cfg(target_arch = "x86_64")]
    fn is_available_x86(self) -> bool {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }

    /// The levels this CPU can run, lowest first (always includes `Scalar`).
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        Isa::ALL.into_iter().filter(|&i| i <= best).collect()
    }

    /// Short name for logs and benchmark tables.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a kernel call runs: the instruction-set level and the number of threads.
///
/// `Exec::default()` is the best level of this CPU on one thread: under MPI every rank
/// already owns a core, so threads are opt-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exec {
    isa: Isa,
    threads: usize,
}

impl Default for Exec {
    fn default() -> Self {
        Exec {
            isa: Isa::detect(),
            threads: 1,
        }
    }
}

impl Exec {
    /// Force an instruction-set level; an error if this CPU lacks it.
    pub fn with_isa(self, isa: Isa) -> Result<Exec, KernelError> {
        let available = Isa::detect();
        if isa > available {
            return Err(KernelError::IsaUnavailable {
                requested: isa,
                available,
            });
        }
        Ok(Exec { isa, ..self })
    }

    /// Split each call over `threads` threads (contiguous chunks; the process's pool for
    /// that count, `crate::pool`, else scoped threads). Results do not
    /// depend on the count.
    pub fn with_threads(self, threads: usize) -> Result<Exec, KernelError> {
        if threads == 0 {
            return Err(KernelError::ZeroThreads(threads));
        }
        Ok(Exec { threads, ..self })
    }

    /// The instruction-set level in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The thread count in use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Chunk boundaries for `n` elements: `threads` contiguous chunks whose starts are
    /// multiples of `align` (the kernels' block size, so that a chunk never splits a
    /// block), and no thread gets less than `min_per_thread` elements.
    pub(crate) fn chunks(&self, n: usize, align: usize, min_per_thread: usize) -> Vec<usize> {
        let by_size = (n / min_per_thread.max(1)).max(1);
        let t = self.threads.min(by_size).max(1);
        let per = n.div_ceil(t).div_ceil(align) * align;
        let mut bounds = vec![0];
        let mut at = 0;
        while at < n {
            at = (at + per).min(n);
            bounds.push(at);
        }
        if bounds.len() == 1 {
            bounds.push(0);
        }
        bounds
    }
}
