//! The one error type of zero-comm. Every variant names the rank that saw it, so a line in
//! a 512-rank log says where it came from.

use crate::buffer::Location;
use crate::DType;

/// Result of a zero-comm call.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// What went wrong in a collective or in setting MPI up.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// An MPI call returned an error code (communicators use MPI_ERRORS_RETURN, so MPI
    /// errors come back here instead of aborting inside the library).
    #[error(
        "rank {rank}: {call} on communicator '{comm}' failed with MPI error {code}: {message}"
    )]
    Mpi {
        /// Rank (in the world) that saw the error.
        rank: usize,
        /// The MPI function.
        call: &'static str,
        /// Name of the communicator.
        comm: String,
        /// MPI error code.
        code: i32,
        /// MPI_Error_string of the code.
        message: String,
    },
    /// MPI could not be initialised (or was initialised twice).
    #[error("MPI initialisation failed: {0}")]
    Init(String),
    /// Buffer lengths that do not fit the collective.
    #[error("rank {rank}: {op} on '{comm}': {detail}")]
    Size {
        /// Rank in the world.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// Name of the communicator.
        comm: String,
        /// What does not fit, with the numbers.
        detail: String,
    },
    /// A root or colour outside the communicator.
    #[error("rank {rank}: {op} on '{comm}': root {root} out of range for {size} ranks")]
    Root {
        /// Rank in the world.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// Name of the communicator.
        comm: String,
        /// Requested root.
        root: usize,
        /// Communicator size.
        size: usize,
    },
    /// A buffer in memory this backend cannot reach (e.g. a CUDA buffer on host MPI).
    #[error("rank {rank}: {op}: buffer in {location:?} memory is not supported by the {backend} backend")]
    Location {
        /// Rank in the world.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// Where the buffer lives.
        location: Location,
        /// Backend name.
        backend: &'static str,
    },
    /// A reduction this dtype has no meaning for.
    #[error("rank {rank}: {op} with {reduce} is not defined for {dtype}")]
    Unsupported {
        /// Rank in the world.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// The reduction.
        reduce: &'static str,
        /// Element type.
        dtype: DType,
    },
    /// The consistency check found ranks issuing different collectives.
    #[error("rank {rank}: collective mismatch on '{comm}' at call #{seq}: rank {rank_a} issued {call_a} but rank {rank_b} issued {call_b}")]
    Mismatch {
        /// Rank (world) that reports it.
        rank: usize,
        /// Name of the communicator.
        comm: String,
        /// Sequence number of the reporting rank's call.
        seq: u64,
        /// First rank (communicator rank).
        rank_a: usize,
        /// What the first rank issued.
        call_a: String,
        /// Second rank (communicator rank).
        rank_b: usize,
        /// What the second rank issued.
        call_b: String,
    },
}
