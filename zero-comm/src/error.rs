//! The one error type of zero-comm. Every variant names the rank that saw it, so a line in
//! a 512-rank log says where it came from.

use crate::buffer::Location;
use crate::stats::CollectiveKind;
use crate::DType;

/// Result of a zero-comm call.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// What went wrong in a collective or in setting MPI up.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// An MPI call returned an error code (communicators use MPI_ERRORS_RETURN, so MPI
    /// errors come back here instead of aborting inside the library).
    #[error(
        "rank {rank}: {}{call} on communicator '{comm}' failed with MPI error {code}: {message}",
        in_collective(.collective)
    )]
    Mpi {
        /// Rank (in the world) that saw the error.
        rank: usize,
        /// The MPI function.
        call: &'static str,
        /// The collective it was part of (a non-blocking one tested or waited for, or one
        /// issued); `None` for calls outside the numbered collectives (set-up).
        collective: Option<CollectiveCall>,
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
    /// A `ZERO_COMM_*` variable holds a value that is not allowed
    /// ([`crate::CommConfig::from_env`]). Read before MPI is up, so the process is named
    /// by its launcher's rank and its host.
    #[error("{process}: {detail}")]
    Config {
        /// `rank 3 (OMPI_COMM_WORLD_RANK) on host n2`, or the pid and host without a
        /// launcher rank.
        process: String,
        /// The variable, its value and what is allowed.
        detail: String,
    },
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
    /// Buffers of one call in different memories (host and a GPU, or two GPUs): a
    /// backend that can reach each still needs one place to move the data between.
    #[error("rank {rank}: {op}: one call's buffers are in {first:?} and {other:?} memory; the {backend} backend needs all of them in one")]
    MixedLocations {
        /// Rank in the world.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// Where the call's first buffer lives.
        first: Location,
        /// Where another of its buffers lives.
        other: Location,
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
    /// A rank waited at a rendezvous longer than [`crate::CommConfig::timeout`] (the
    /// in-process backend, [`crate::LocalComm`], which reports instead of aborting).
    #[error(
        "rank {rank}: {op} #{seq} on '{comm}' timed out after {waited_s:.1} s waiting for {}",
        never_arrived(.missing)
    )]
    Timeout {
        /// Rank that waited.
        rank: usize,
        /// Name of the communicator.
        comm: String,
        /// Sequence number of the waiting rank's call.
        seq: u64,
        /// The collective.
        op: &'static str,
        /// How long it waited, in seconds.
        waited_s: f64,
        /// Communicator ranks that had not arrived, ascending.
        missing: Vec<usize>,
    },
    /// A peer's communicator was dropped (its thread ended, returned an error or panicked)
    /// before it joined the collective this rank is in.
    #[error("rank {rank}: {op} #{seq} on '{comm}': rank {peer} left the group (its thread ended or panicked) before joining")]
    PeerGone {
        /// Rank that reports it.
        rank: usize,
        /// Name of the communicator.
        comm: String,
        /// Sequence number of the reporting rank's call.
        seq: u64,
        /// The collective.
        op: &'static str,
        /// The rank that left (communicator rank; the lowest one if several did).
        peer: usize,
    },
    /// An earlier collective failed on some rank (timeout, invalid buffer, panic inside
    /// the collective), which left the group unusable: every later collective is refused
    /// instead of waiting for a rank that will not come.
    #[error("rank {rank}: {op} #{seq} on '{comm}' refused: the group is unusable since rank {by} failed: {reason}")]
    Poisoned {
        /// Rank that reports it.
        rank: usize,
        /// Name of the communicator.
        comm: String,
        /// Sequence number of the reporting rank's call.
        seq: u64,
        /// The collective.
        op: &'static str,
        /// The rank whose failure poisoned the group.
        by: usize,
        /// That rank's error.
        reason: String,
    },
    /// A host-staged collective ([`crate::StagedComm`]) larger than the staging buffers
    /// were sized for: they are sized once, before the first step, for the largest
    /// collective of the plan ([`crate::Staging::reserve`]).
    #[error("rank {rank}: {op} needs {need} bytes of host staging but the staging buffers hold {have} bytes each; reserve them for the largest collective first (Staging::reserve)")]
    Staging {
        /// Rank in the world.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// Bytes the call needs in one staging buffer.
        need: usize,
        /// Bytes each staging buffer holds.
        have: usize,
    },
    /// The ranks cannot be arranged as a node-major world of equal nodes
    /// ([`crate::NodeGroups`]): what was found, and what to do.
    #[error("rank {rank}: node groups of '{comm}': {detail}")]
    Nodes {
        /// Rank in the world.
        rank: usize,
        /// The communicator being divided.
        comm: String,
        /// What was found and what to do, with the numbers.
        detail: String,
    },
    /// A connection of the TCP backend ([`crate::SocketComm`]) failed inside a
    /// collective: the peer's process ended, or the network dropped the connection.
    #[error("rank {rank}: {op} #{seq} on '{comm}': the connection to rank {peer} failed: {cause}")]
    Link {
        /// Rank that saw it.
        rank: usize,
        /// Communicator name.
        comm: String,
        /// Sequence number of the collective.
        seq: u64,
        /// The collective.
        op: &'static str,
        /// The rank at the other end.
        peer: usize,
        /// What the socket said.
        cause: String,
    },
    /// Joining the TCP world ([`crate::socket::Rendezvous`]) failed.
    #[error("rank {rank}: joining the TCP world at {at}: {detail}")]
    Rendezvous {
        /// Rank that saw it.
        rank: usize,
        /// The rendezvous address (`ZERO_RENDEZVOUS`).
        at: String,
        /// What went wrong and what to do.
        detail: String,
    },
    /// An NCCL call failed (feature `nccl`).
    #[error("rank {rank}: NCCL {op} failed: {message}")]
    Nccl {
        /// Rank in the world.
        rank: usize,
        /// The collective (or `init`).
        op: &'static str,
        /// NCCL's error.
        message: String,
    },
    /// The device a stream-ordered collective was queued on failed (or its simulator
    /// found an ordering hazard): [`crate::on_stream`].
    #[error("rank {rank}: {op} on the device: {message}")]
    Device {
        /// Rank in the world.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// The device's error.
        message: String,
    },
}

impl CommError {
    /// A device refused or failed the host task a stream-ordered collective runs as.
    pub(crate) fn device(rank: usize, op: &'static str, message: String) -> CommError {
        CommError::Device { rank, op, message }
    }
}

/// One collective: what a failure inside it is reported with, as the watchdog names it
/// (`reduce_scatter #2282 (789792 x bf16)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectiveCall {
    /// The collective.
    pub kind: CollectiveKind,
    /// Its sequence number on its communicator.
    pub seq: u64,
    /// Its element count.
    pub count: usize,
    /// Its element type.
    pub dtype: DType,
}

impl std::fmt::Display for CollectiveCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} #{} ({} x {})",
            self.kind, self.seq, self.count, self.dtype
        )
    }
}

/// `reduce_scatter #2282 (789792 x bf16): ` ahead of an MPI error inside a collective.
fn in_collective(collective: &Option<CollectiveCall>) -> String {
    collective.map_or_else(String::new, |c| format!("{c}: "))
}

/// `rank 3 (it never arrived)`, `ranks 1-4, 7 (they never arrived)`.
fn never_arrived(ranks: &[usize]) -> String {
    let who = if ranks.len() == 1 { "it" } else { "they" };
    format!("{} ({who} never arrived)", rank_list(ranks))
}

/// `rank 3`, or `ranks 1-4, 7` (runs of consecutive ranks joined), at most
/// [`RANK_RUNS_SHOWN`] runs, then how many ranks more.
pub(crate) fn rank_list(ranks: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &r in ranks {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => runs.push((r, r)),
        }
    }
    let shown: Vec<String> = runs
        .iter()
        .take(RANK_RUNS_SHOWN)
        .map(|&(a, b)| match a == b {
            true => a.to_string(),
            false => format!("{a}-{b}"),
        })
        .collect();
    let hidden: usize = runs
        .iter()
        .skip(RANK_RUNS_SHOWN)
        .map(|&(a, b)| b - a + 1)
        .sum();
    let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
    match hidden {
        0 => format!("{noun} {}", shown.join(", ")),
        n => format!("{noun} {} and {n} more", shown.join(", ")),
    }
}

/// How many runs of ranks [`rank_list`] names: on 512 ranks the first few say enough.
const RANK_RUNS_SHOWN: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists_join_runs_and_stop_after_a_few() {
        assert_eq!(rank_list(&[3]), "rank 3");
        assert_eq!(rank_list(&[1, 2, 3, 4, 7]), "ranks 1-4, 7");
        let every_other: Vec<usize> = (1..40).step_by(2).collect();
        assert_eq!(
            rank_list(&every_other),
            "ranks 1, 3, 5, 7, 9, 11, 13, 15 and 12 more"
        );
        let most: Vec<usize> = (1..512).collect();
        assert_eq!(rank_list(&most), "ranks 1-511");
    }

    #[test]
    fn a_timeout_names_the_ranks_that_never_arrived() {
        let timeout = |missing: Vec<usize>| CommError::Timeout {
            rank: 0,
            comm: "local".into(),
            seq: 5,
            op: "all_gather",
            waited_s: 30.0,
            missing,
        };
        assert_eq!(
            timeout(vec![3]).to_string(),
            "rank 0: all_gather #5 on 'local' timed out after 30.0 s waiting for rank 3 (it never arrived)"
        );
        let many = timeout(vec![1, 2, 3, 4, 7]).to_string();
        assert!(
            many.ends_with("waiting for ranks 1-4, 7 (they never arrived)"),
            "{many}"
        );
    }

    #[test]
    fn an_mpi_error_in_a_collective_names_it() {
        let e = CommError::Mpi {
            rank: 3,
            call: "MPI_Waitall",
            collective: Some(CollectiveCall {
                kind: CollectiveKind::ReduceScatter,
                seq: 2282,
                count: 789_792,
                dtype: DType::BF16,
            }),
            comm: "world".into(),
            code: 15,
            message: "MPI_ERR_TRUNCATE".into(),
        };
        assert_eq!(
            e.to_string(),
            "rank 3: reduce_scatter #2282 (789792 x bf16): MPI_Waitall on communicator 'world' failed with MPI error 15: MPI_ERR_TRUNCATE"
        );
    }
}
