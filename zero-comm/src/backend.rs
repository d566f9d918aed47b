//! Choosing the transport at run time (issue 14): NCCL, CUDA-aware MPI, host-staged MPI,
//! plain MPI, or thread ranks in one process, and each rank's GPU.
//!
//! [`select`] is a pure function of what was asked ([`CommChoice`]) and what is true here
//! ([`Facts`]: where the buffers live, how many processes, whether NCCL was compiled in,
//! what the CUDA-aware probe said), so every rule and every refusal is testable without
//! a GPU or a launcher. `auto` prefers, for device buffers across processes, NCCL where
//! it is present, else CUDA-aware MPI where the probe says yes, else host staging
//! ([`crate::StagedComm`], which always works); host buffers take plain MPI. A backend
//! that was asked for and cannot run is an error that names what is missing and what to
//! do, never a silent fallback.
//!
//! [`probe_cuda_aware`] never assumes: it asks the library (`MPIX_Query_cuda_support`
//! through src/shim.c, where the MPI has Open MPI's cuda extension; Debian's Open MPI
//! 4.1 has it and answers 0) and reads the launch conventions (`OMPI_MCA_opal_cuda_support`,
//! `MPICH_GPU_SUPPORT_ENABLED`): the library's answer decides where there is one, and
//! an environment that turns support off wins over a library that has it.
//!
//! [`gpu_for_rank`]: each rank's GPU from its node-local rank (MPI_Comm_split_type
//! shared memory, [`crate::MpiComm::node_local`]).

use std::fmt;
use std::str::FromStr;

/// `--comm`: what the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CommChoice {
    /// Choose from the facts (see [`select`]).
    #[default]
    Auto,
    /// NCCL: stream-ordered collectives on GPU memory.
    Nccl,
    /// MPI given device pointers (a CUDA-aware build).
    MpiCuda,
    /// MPI on host copies of device buffers ([`crate::StagedComm`]).
    MpiStaged,
    /// MPI on host buffers.
    Mpi,
    /// Thread ranks of one process ([`crate::LocalComm`]).
    Local,
}

impl CommChoice {
    /// Every accepted spelling, for messages.
    pub const NAMES: &'static str = "auto, nccl, mpi-cuda, mpi-staged, mpi or local";
}

impl fmt::Display for CommChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CommChoice::Auto => "auto",
            CommChoice::Nccl => "nccl",
            CommChoice::MpiCuda => "mpi-cuda",
            CommChoice::MpiStaged => "mpi-staged",
            CommChoice::Mpi => "mpi",
            CommChoice::Local => "local",
        })
    }
}

impl FromStr for CommChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.trim() {
            "auto" => CommChoice::Auto,
            "nccl" => CommChoice::Nccl,
            "mpi-cuda" => CommChoice::MpiCuda,
            "mpi-staged" => CommChoice::MpiStaged,
            "mpi" => CommChoice::Mpi,
            "local" => CommChoice::Local,
            other => {
                return Err(format!(
                    "unknown --comm '{other}': give {}",
                    CommChoice::NAMES
                ))
            }
        })
    }
}

/// The transport chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// NCCL.
    Nccl,
    /// CUDA-aware MPI on device pointers.
    MpiCuda,
    /// MPI on host staging copies.
    MpiStaged,
    /// MPI on host buffers.
    Mpi,
    /// Thread ranks (here: the one rank of a single process).
    Local,
}

impl Backend {
    /// The `--comm` spelling.
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Nccl => "nccl",
            Backend::MpiCuda => "mpi-cuda",
            Backend::MpiStaged => "mpi-staged",
            Backend::Mpi => "mpi",
            Backend::Local => "local",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the engine's buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffers {
    /// Host memory (`--device host`).
    Host,
    /// A device's memory. `host_reachable`: the device's buffers are host memory after
    /// all (the simulated GPU), so a host transport could take them directly.
    Device {
        /// Host MPI can read the buffers as they are.
        host_reachable: bool,
    },
}

/// The answer of the CUDA-aware probe, with where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaAware {
    /// `MPIX_Query_cuda_support()`: `None` where the library cannot be asked.
    pub library: Option<bool>,
    /// The environment convention that was set, with its value.
    pub env: Option<(&'static str, bool)>,
}

impl CudaAware {
    /// Whether device pointers may go to MPI: the library's answer where there is one,
    /// else the environment's; an environment that turns support off always wins.
    pub fn yes(&self) -> bool {
        match (self.library, self.env) {
            (_, Some((_, false))) => false,
            (Some(lib), _) => lib,
            (None, Some((_, env))) => env,
            (None, None) => false,
        }
    }

    /// What the probe saw, for the log and for errors.
    pub fn describe(&self) -> String {
        let lib = match self.library {
            Some(true) => "MPIX_Query_cuda_support() = 1".to_string(),
            Some(false) => "MPIX_Query_cuda_support() = 0".to_string(),
            None => "the MPI library cannot be asked (no MPIX_Query_cuda_support)".to_string(),
        };
        match self.env {
            Some((var, v)) => format!("{lib}, {var} = {}", if v { "on" } else { "off" }),
            None => lib,
        }
    }
}

/// What is true here, for [`select`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// Where the engine's buffers live.
    pub buffers: Buffers,
    /// Processes in the job (MPI world size).
    pub processes: usize,
    /// This binary has the NCCL backend (cudarc's `nccl` feature).
    pub nccl_compiled: bool,
    /// The NCCL library can be loaded here (as `libnccl.so`).
    pub nccl_present: bool,
    /// The CUDA-aware probe.
    pub cuda_aware: CudaAware,
    /// The run reduces 16-bit floats (bf16/fp16 gradients reduced in their own type):
    /// a CUDA-aware MPI cannot, its sums of those run in host code (`mpi/mod.rs`).
    pub half_reductions: bool,
}

/// A backend that was asked for and cannot run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// The backend is not in this build.
    #[error("--comm {asked}: {missing}; {todo}")]
    Missing {
        /// What was asked for.
        asked: CommChoice,
        /// What is missing.
        missing: String,
        /// What to do.
        todo: String,
    },
    /// The backend does not apply to these buffers or this launch.
    #[error("--comm {asked}: {why}; {todo}")]
    Mismatch {
        /// What was asked for.
        asked: CommChoice,
        /// Why it does not apply.
        why: String,
        /// What to do.
        todo: String,
    },
    /// More ranks on a node than GPUs visible to them.
    #[error("{ranks} ranks on this node but {gpus} GPU(s) visible: each rank needs its own GPU; launch at most {gpus} rank(s) per node (srun --ntasks-per-node / --gpus-per-task, mpirun --npernode) or make more GPUs visible (CUDA_VISIBLE_DEVICES)")]
    TooFewGpus {
        /// Ranks on the node.
        ranks: usize,
        /// GPUs visible.
        gpus: usize,
    },
}

/// The backend for `choice` given `facts`, and why (one line for rank 0's log).
pub fn select(choice: CommChoice, facts: &Facts) -> Result<(Backend, String), SelectError> {
    let device = matches!(facts.buffers, Buffers::Device { .. });
    let nccl_missing = || {
        SelectError::Missing {
        asked: choice,
        missing: "this binary was built without NCCL (cudarc's nccl feature)".into(),
        todo: "build zero-bench with the NCCL backend (`cargo build --release -p zero-bench --features nccl`; the carried GPU build without MPI and HDF5: `--no-default-features --features nccl`), or use --comm mpi-staged (always works) or mpi-cuda (a CUDA-aware MPI)".into(),
    }
    };
    match choice {
        CommChoice::Auto => Ok(match facts.buffers {
            Buffers::Host => (
                Backend::Mpi,
                "host buffers: MPI takes them as they are".to_string(),
            ),
            Buffers::Device { .. } if facts.processes == 1 => (
                Backend::Local,
                "one process: the collectives stay inside it".to_string(),
            ),
            Buffers::Device { .. } if facts.nccl_compiled && facts.nccl_present => (
                Backend::Nccl,
                "device buffers across processes, and NCCL is built in and present".to_string(),
            ),
            Buffers::Device { .. } if facts.cuda_aware.yes() && facts.half_reductions => (
                Backend::MpiStaged,
                format!(
                    "device buffers across processes, no NCCL, and MPI is CUDA-aware ({}) but sums 16-bit gradients only in host code: staging through host memory",
                    facts.cuda_aware.describe()
                ),
            ),
            Buffers::Device { .. } if facts.cuda_aware.yes() => (
                Backend::MpiCuda,
                format!(
                    "device buffers across processes, no NCCL, and MPI is CUDA-aware ({})",
                    facts.cuda_aware.describe()
                ),
            ),
            Buffers::Device { .. } => (
                Backend::MpiStaged,
                format!(
                    "device buffers across processes, no NCCL{}, and MPI is not CUDA-aware ({}): staging through host memory",
                    if facts.nccl_compiled { " library here" } else { " in this build" },
                    facts.cuda_aware.describe()
                ),
            ),
        }),
        CommChoice::Nccl => {
            if !device {
                return Err(SelectError::Mismatch {
                    asked: choice,
                    why: "NCCL moves GPU memory and this run's buffers are on the host".into(),
                    todo: "train on a GPU (--device cuda), or use --comm mpi".into(),
                });
            }
            if !facts.nccl_compiled {
                return Err(nccl_missing());
            }
            if !facts.nccl_present {
                return Err(SelectError::Missing {
                    asked: choice,
                    missing: "the NCCL library cannot be loaded (it is looked for as libnccl.so)".into(),
                    todo: "install NCCL, or where only libnccl.so.2 exists (pip's nvidia-nccl) put a link libnccl.so -> libnccl.so.2 in a folder on LD_LIBRARY_PATH; or use --comm mpi-staged (always works)".into(),
                });
            }
            Ok((Backend::Nccl, "asked for (--comm nccl)".into()))
        }
        CommChoice::MpiCuda => {
            if !device {
                return Err(SelectError::Mismatch {
                    asked: choice,
                    why: "CUDA-aware MPI is for GPU buffers and this run's buffers are on the host".into(),
                    todo: "use --comm mpi".into(),
                });
            }
            if !facts.cuda_aware.yes() {
                return Err(SelectError::Missing {
                    asked: choice,
                    missing: format!(
                        "this MPI library is not CUDA-aware ({})",
                        facts.cuda_aware.describe()
                    ),
                    todo: "use --comm mpi-staged (always works), or run with an MPI built with CUDA support (Open MPI --with-cuda, MPICH with MPICH_GPU_SUPPORT_ENABLED=1)".into(),
                });
            }
            if facts.half_reductions {
                return Err(SelectError::Mismatch {
                    asked: choice,
                    why: "this run reduces 16-bit gradients, and MPI sums bf16/fp16 only in host code, which cannot read GPU memory".into(),
                    todo: "use --comm mpi-staged, or reduce in f32 (precision.grad_reduce_dtype = \"f32\")".into(),
                });
            }
            Ok((
                Backend::MpiCuda,
                format!("asked for (--comm mpi-cuda; {})", facts.cuda_aware.describe()),
            ))
        }
        CommChoice::MpiStaged => Ok((
            Backend::MpiStaged,
            "asked for (--comm mpi-staged)".into(),
        )),
        CommChoice::Mpi => match facts.buffers {
            Buffers::Device {
                host_reachable: false,
            } => Err(SelectError::Mismatch {
                asked: choice,
                why: "host MPI cannot read GPU memory".into(),
                todo: "use --comm mpi-staged (always works), mpi-cuda (a CUDA-aware MPI) or nccl, or --comm auto to choose".into(),
            }),
            _ => Ok((Backend::Mpi, "asked for (--comm mpi)".into())),
        },
        CommChoice::Local => {
            if facts.processes > 1 {
                return Err(SelectError::Mismatch {
                    asked: choice,
                    why: format!(
                        "thread ranks live in one process and this job has {} processes",
                        facts.processes
                    ),
                    todo: "launch one process, or use --comm auto".into(),
                });
            }
            Ok((Backend::Local, "asked for (--comm local)".into()))
        }
    }
}

/// The GPU of the rank `local_rank` of `local_ranks` on its node, with `visible` GPUs
/// visible to it: GPU `local_rank mod visible`. `per_task`: the launcher bound each rank
/// its own GPUs (Slurm's `--gpus-per-task` sets `SLURM_GPUS_PER_TASK`), so fewer visible
/// GPUs than ranks is expected (with one visible, each rank takes its own as GPU 0).
/// `share`: ranks may share GPUs (a test of several processes on one GPU,
/// `ZERO_SHARE_GPUS=1`). Otherwise more ranks than GPUs is an error.
pub fn gpu_for_rank(
    local_rank: usize,
    local_ranks: usize,
    visible: usize,
    per_task: bool,
    share: bool,
) -> Result<usize, SelectError> {
    if visible == 0 {
        return Err(SelectError::TooFewGpus {
            ranks: local_ranks,
            gpus: 0,
        });
    }
    if local_ranks > visible && !share && !per_task {
        return Err(SelectError::TooFewGpus {
            ranks: local_ranks,
            gpus: visible,
        });
    }
    Ok(local_rank % visible)
}

/// Read an on/off environment value ("1", "true", "yes", "on" and their opposites).
fn env_flag(var: &'static str) -> Option<(&'static str, bool)> {
    let v = std::env::var(var).ok()?;
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some((var, true)),
        "0" | "false" | "no" | "off" => Some((var, false)),
        _ => None,
    }
}

/// Probe whether MPI takes CUDA device pointers (see the module documentation). MPI must
/// be initialised (`MPIX_Query_cuda_support` is an MPI call).
pub fn probe_cuda_aware() -> CudaAware {
    let env =
        env_flag("OMPI_MCA_opal_cuda_support").or_else(|| env_flag("MPICH_GPU_SUPPORT_ENABLED"));
    CudaAware {
        library: library_cuda_support(),
        env,
    }
}

#[cfg(feature = "mpi")]
fn library_cuda_support() -> Option<bool> {
    extern "C" {
        fn zero_comm_cuda_support() -> std::os::raw::c_int;
    }
    // SAFETY: a query without arguments (src/shim.c); MPI is initialised by the caller.
    match unsafe { zero_comm_cuda_support() } {
        1 => Some(true),
        0 => Some(false),
        _ => None,
    }
}

#[cfg(not(feature = "mpi"))]
fn library_cuda_support() -> Option<bool> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(buffers: Buffers, processes: usize, nccl: bool, cuda_aware: Option<bool>) -> Facts {
        Facts {
            buffers,
            processes,
            nccl_compiled: nccl,
            nccl_present: nccl,
            cuda_aware: CudaAware {
                library: cuda_aware,
                env: None,
            },
            half_reductions: false,
        }
    }
    const GPU: Buffers = Buffers::Device {
        host_reachable: false,
    };
    const SIM: Buffers = Buffers::Device {
        host_reachable: true,
    };

    #[test]
    fn auto_prefers_nccl_then_cuda_aware_mpi_then_staging() {
        let pick = |f: &Facts| select(CommChoice::Auto, f).map(|(b, _)| b);
        assert_eq!(
            pick(&facts(Buffers::Host, 4, true, Some(true))),
            Ok(Backend::Mpi)
        );
        assert_eq!(pick(&facts(GPU, 1, true, Some(true))), Ok(Backend::Local));
        assert_eq!(pick(&facts(GPU, 2, true, Some(true))), Ok(Backend::Nccl));
        assert_eq!(
            pick(&facts(GPU, 2, false, Some(true))),
            Ok(Backend::MpiCuda)
        );
        assert_eq!(
            pick(&facts(GPU, 2, false, Some(false))),
            Ok(Backend::MpiStaged)
        );
        assert_eq!(pick(&facts(GPU, 2, false, None)), Ok(Backend::MpiStaged));
        // bf16 gradients reduced in bf16: a CUDA-aware MPI cannot sum them on the GPU.
        let half = Facts {
            half_reductions: true,
            ..facts(GPU, 2, false, Some(true))
        };
        assert_eq!(pick(&half), Ok(Backend::MpiStaged));
        let e = select(CommChoice::MpiCuda, &half).unwrap_err();
        assert!(e.to_string().contains("16-bit gradients"), "{e}");
        assert_eq!(
            pick(&facts(SIM, 2, false, Some(false))),
            Ok(Backend::MpiStaged)
        );
        let (_, why) = select(CommChoice::Auto, &facts(GPU, 2, false, Some(false))).unwrap();
        assert!(why.contains("MPIX_Query_cuda_support() = 0"), "{why}");
    }

    #[test]
    fn a_backend_asked_for_and_missing_is_a_clear_error() {
        let e = select(CommChoice::Nccl, &facts(GPU, 2, false, None)).unwrap_err();
        assert!(e.to_string().contains("built without NCCL"), "{e}");
        let no_lib = Facts {
            nccl_present: false,
            ..facts(GPU, 2, true, None)
        };
        let e = select(CommChoice::Nccl, &no_lib).unwrap_err();
        assert!(
            e.to_string().contains("NCCL library cannot be loaded"),
            "{e}"
        );
        assert_eq!(
            select(CommChoice::Auto, &no_lib).map(|(b, _)| b),
            Ok(Backend::MpiStaged)
        );
        assert!(e.to_string().contains("mpi-staged"), "{e}");
        let e = select(CommChoice::MpiCuda, &facts(GPU, 2, false, Some(false))).unwrap_err();
        assert!(e.to_string().contains("not CUDA-aware"), "{e}");
        assert!(
            e.to_string().contains("MPIX_Query_cuda_support() = 0"),
            "{e}"
        );
        let e = select(CommChoice::Mpi, &facts(GPU, 2, false, None)).unwrap_err();
        assert!(e.to_string().contains("cannot read GPU memory"), "{e}");
        assert!(select(CommChoice::Mpi, &facts(SIM, 2, false, None)).is_ok());
        let e = select(CommChoice::Local, &facts(Buffers::Host, 2, false, None)).unwrap_err();
        assert!(e.to_string().contains("2 processes"), "{e}");
        let e = select(CommChoice::Nccl, &facts(Buffers::Host, 2, true, None)).unwrap_err();
        assert!(e.to_string().contains("on the host"), "{e}");
        assert_eq!(
            select(CommChoice::MpiStaged, &facts(Buffers::Host, 2, false, None)).map(|(b, _)| b),
            Ok(Backend::MpiStaged)
        );
    }

    #[test]
    fn the_environment_can_turn_cuda_awareness_off_but_not_invent_it() {
        let p = |library, env| CudaAware { library, env }.yes();
        assert!(p(Some(true), None));
        assert!(!p(Some(true), Some(("OMPI_MCA_opal_cuda_support", false))));
        assert!(!p(Some(false), Some(("OMPI_MCA_opal_cuda_support", true))));
        assert!(p(None, Some(("MPICH_GPU_SUPPORT_ENABLED", true))));
        assert!(!p(None, None));
    }

    #[test]
    fn each_rank_takes_the_gpu_of_its_node_local_rank() {
        let g = |r, n, v| gpu_for_rank(r, n, v, false, false);
        assert_eq!(g(0, 4, 4), Ok(0));
        assert_eq!(g(3, 4, 8), Ok(3));
        assert_eq!(
            g(2, 4, 2),
            Err(SelectError::TooFewGpus { ranks: 4, gpus: 2 })
        );
        assert!(g(0, 1, 0).is_err());
        // Bound per task by the launcher: every rank sees its own GPU as 0.
        assert_eq!(gpu_for_rank(3, 4, 1, true, false), Ok(0));
        // An inherited SLURM_GPUS_PER_TASK with every GPU visible (mpirun inside sbatch):
        // still one GPU per rank, not all on GPU 0.
        assert_eq!(gpu_for_rank(3, 4, 4, true, false), Ok(3));
        // Sharing asked for: round robin.
        assert_eq!(gpu_for_rank(3, 4, 2, false, true), Ok(1));
        let e = g(2, 4, 2).unwrap_err().to_string();
        assert!(e.contains("4 ranks on this node but 2 GPU(s)"), "{e}");
    }
}
