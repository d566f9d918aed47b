//! zero-comm: collectives over real MPI for the ZeRO engine.
//!
//! - [`init`] brings MPI up (MPI_THREAD_MULTIPLE), installs a panic hook that aborts the
//!   whole job naming the rank, and returns the world [`MpiComm`].
//! - [`LocalComm`] (module [`local`]): N ranks as threads of one process, with
//!   deterministic rank-order reductions, the consistency check always on, and timeouts
//!   and departed peers reported as errors instead of hangs; [`run_local`] runs a closure
//!   per rank.
//! - [`Communicator`]: rank/size, blocking all-reduce (sum, max), reduce-scatter,
//!   all-gather and all-to-all (equal blocks), broadcast, barrier on any [`CommBuf`] (host slices today,
//!   device buffers later); non-blocking versions in a [`Communicator::scope`].
//! - Element types: every [`DType`]; bf16/f16 sums per [`HalfSum`].
//! - [`on_stream`]: the same collectives on device buffers, ordered on a device stream
//!   (what the engine calls); [`lowest_failing_rank`] to agree on a failure.
//! - [`StagedComm`] (module [`staged`]): device buffers through a host-only transport by
//!   way of double-buffered host staging; [`backend`]: choosing the transport at run
//!   time (NCCL, CUDA-aware MPI, host-staged MPI, host MPI) and each rank's GPU.
//! - [`NodeGroups`] (module [`nodes`]): a node-major world's `node` and `cross`
//!   sub-communicators for hierarchical data parallelism ([`MpiComm::node_groups`],
//!   [`LocalComm::world_on_nodes`], [`run_local_on_nodes`]).
//! - Accounting per [`CollectiveKind`] ([`CommStats`], ring-algorithm bytes).
//! - Failure: typed [`CommError`]s with the rank; optional watchdog and consistency check
//!   ([`CommConfig`], `ZERO_COMM_TIMEOUT`, `ZERO_COMM_CHECK`).
//!
//! Feature `mpi` (default) builds the MPI backend ([`init`], `MpiComm`, the watchdog) and
//! links the MPI library; without it the crate is [`LocalComm`], [`SocketComm`] (the TCP
//! world: processes without MPI, module [`socket`]) and the rest, and links no MPI (the
//! carried GPU build of zero-bench).
#![deny(missing_docs)]

pub mod agree;
pub mod backend;
pub mod buffer;
pub mod communicator;
pub mod config;
pub mod error;
mod exit;
mod fingerprint;
#[cfg(feature = "mpi")]
mod heartbeat;
#[cfg(feature = "mpi")]
mod init;
pub mod local;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod nccl_id;
#[cfg(feature = "nccl")]
mod nccl_watch;
pub mod nodes;
pub mod nonblocking;
pub mod on_stream;
mod reduce;
pub mod selftest;
pub mod socket;
pub mod staged;
pub mod stats;
#[cfg(feature = "mpi")]
mod watchdog;

pub use agree::{gather_failures, lowest_failing_rank, unlike_rank_0, Unlike};
pub use backend::{
    gpu_for_rank, probe_cuda_aware, select, Backend, CommChoice, Facts, SelectError,
};
pub use buffer::{CommBuf, CommBufMut, Location};
pub use communicator::{Communicator, InFlight, RawBuf, RawCall, ReduceOp};
pub use config::{CommConfig, HalfSum};
pub use error::{CollectiveCall, CommError, Result};
pub use exit::{abort, line_to_stderr, PANIC_EXIT_CODE};
#[cfg(feature = "mpi")]
pub use init::{init, init_with, mpi_main, MpiContext};
pub use local::{run_local, run_local_on_nodes, LocalComm, RankPanic};
#[cfg(feature = "mpi")]
pub use mpi::MpiComm;
#[cfg(feature = "nccl")]
pub use nccl::NcclComm;
pub use nodes::NodeGroups;
pub use nonblocking::{Pending, Scope};
pub use socket::SocketComm;
pub use staged::{StagedComm, Staging, StagingStats};
pub use stats::{ring_bytes, CollectiveKind, CommStats, KindStats};
#[cfg(feature = "mpi")]
pub use watchdog::WATCHDOG_EXIT_CODE;
pub use zero_kernels::{DType, Element};

/// rsmpi, re-exported so callers use the same version (e.g. for raw baselines).
#[cfg(feature = "mpi")]
pub use ::mpi as rsmpi;
