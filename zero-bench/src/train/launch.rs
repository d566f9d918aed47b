//! Where `train` runs: under an MPI launcher (mpirun, srun) with one process per rank, or
//! as a single process. Also the rule for errors every rank sees alike: they are printed
//! once (by the lowest rank that hit them) and every rank exits with the same code
//! without a backtrace, instead of N copies of the message or a hung collective.

use anyhow::anyhow;
use zero_comm::{Communicator, MpiComm, MpiContext};

/// Environment variables set by the launchers we know for every rank they start:
/// Open MPI's mpirun, PMIx (srun --mpi=pmix, prterun), PMI-1/2 (MPICH hydra, srun
/// --mpi=pmi2) and MPICH's `MPI_LOCALNRANKS`.
const LAUNCHER_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALNRANKS",
];

/// Whether this process was started by an MPI launcher.
pub fn under_launcher() -> bool {
    LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

/// MPI, up: keep `ctx` alive for as long as `comm` is used.
pub struct Mpi {
    /// The world communicator.
    pub comm: MpiComm,
    /// Finalises MPI when dropped (after `comm`: fields drop in declaration order).
    pub _ctx: MpiContext,
}

/// Bring MPI up (a singleton world of 1 when not launched by mpirun/srun).
pub fn init_mpi() -> anyhow::Result<Mpi> {
    let (ctx, comm) = zero_comm::init().map_err(|e| anyhow!("cannot initialise MPI: {e}"))?;
    Ok(Mpi { comm, _ctx: ctx })
}

/// Why a command failed, and who says so.
pub struct Failure {
    /// The error (with context).
    pub error: anyhow::Error,
    /// Whether this rank prints it: exactly one rank does.
    pub print: bool,
}

impl Failure {
    /// An error every rank computed identically (a pure function of the command line and
    /// the config file): rank 0 prints it.
    pub fn same_everywhere(error: anyhow::Error, rank: usize) -> Failure {
        Failure {
            error,
            print: rank == 0,
        }
    }
}

/// Agree across ranks on a set-up step that may fail on some ranks only (a file missing
/// on one node): every rank learns whether any failed; the lowest failing rank prints its
/// error (tagged with the rank if it is not rank 0) and every rank returns a failure.
/// Collective: every rank must call it at the same point.
pub fn agree<T, C: Communicator>(comm: &C, result: anyhow::Result<T>) -> Result<T, Failure> {
    let rank = comm.rank();
    let first = match zero_comm::lowest_failing_rank(comm, result.is_err()) {
        Ok(first) => first,
        Err(e) => {
            // Cannot agree: report here (every rank may, the job is broken anyway).
            let error = match result {
                Err(mine) => mine.context(format!("and agreeing on it failed: {e}")),
                Ok(_) => anyhow!("rank {rank}: agreeing on set-up failed: {e}"),
            };
            return Err(Failure { error, print: true });
        }
    };
    match (result, first) {
        (Ok(v), None) => Ok(v),
        (Ok(_), Some(first)) => Err(Failure {
            error: anyhow!("rank {first} failed"),
            print: false,
        }),
        (Err(e), first) => Err(Failure {
            print: Some(rank) == first,
            error: if rank == 0 {
                e
            } else {
                e.context(format!("rank {rank}"))
            },
        }),
    }
}
