//! Accounting: per collective kind, the calls and the bytes this rank sends and receives
//! as the bandwidth-optimal (ring / chain) algorithm moves them, whatever algorithm MPI
//! picks underneath. These are the figures the ZeRO paper's communication volumes are
//! stated in (Rajbhandari et al., SC'20, section 7), so the engine can hold its own
//! traffic against the table in docs/ARCHITECTURE.md.
//!
//! With N ranks and B the bytes of the buffer named below (wire bytes: a half buffer
//! summed by upcasting travels as f32, so it counts twice its own size):
//! - all-reduce of B bytes: reduce-scatter + all-gather of N blocks of B/N,
//!   sent = received = 2 (N-1) B / N (rounded down when N does not divide 2(N-1)B);
//! - reduce-scatter, B = the full input (N blocks): sent = received = (N-1) B / N;
//! - all-gather, B = the full output (N blocks): sent = received = (N-1) B / N;
//! - broadcast of B bytes as a pipelined chain root -> root+1 -> ... -> root-1: every rank
//!   but the root receives B, every rank but the last in the chain sends B (N = 1: none);
//! - barrier: calls only, 0 bytes;
//! - all-to-all, B = the send buffer (N blocks, block r for rank r): every rank keeps its
//!   own block and exchanges the others directly, sent = received = (N-1) B / N.
//!
//! The consistency check's own exchange is not counted (it is not the algorithm's).

use std::cell::Cell;

/// Number of collective kinds (length of [`CollectiveKind::ALL`]).
const KINDS: usize = 6;

/// The collectives that are accounted separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollectiveKind {
    /// All-reduce (sum or max).
    AllReduce,
    /// Reduce-scatter into equal blocks.
    ReduceScatter,
    /// All-gather of equal blocks.
    AllGather,
    /// Broadcast from a root.
    Broadcast,
    /// Barrier.
    Barrier,
    /// All-to-all of equal blocks (last, so the earlier kinds keep their wire codes).
    AllToAll,
}

impl CollectiveKind {
    /// Every kind, in a fixed order (index of the stats arrays).
    pub const ALL: [CollectiveKind; KINDS] = [
        CollectiveKind::AllReduce,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllGather,
        CollectiveKind::Broadcast,
        CollectiveKind::Barrier,
        CollectiveKind::AllToAll,
    ];

    /// Snake-case name, as in logs and reports.
    pub const fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Barrier => "barrier",
            CollectiveKind::AllToAll => "all_to_all",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }

    /// Wire code used by the consistency check.
    pub(crate) const fn code(self) -> i64 {
        self as i64 + 1
    }

    pub(crate) fn from_code(code: i64) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.code() == code)
    }
}

impl std::fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Calls and bytes of one collective kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindStats {
    /// Number of calls issued (blocking and non-blocking).
    pub calls: u64,
    /// Bytes this rank sent, per the formulas in this module's header.
    pub bytes_sent: u64,
    /// Bytes this rank received, per the formulas in this module's header.
    pub bytes_received: u64,
}

/// A snapshot of a communicator's accounting. Subtract two snapshots to get one step's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommStats {
    kinds: [KindStats; KINDS],
}

impl CommStats {
    /// Figures of one kind.
    pub fn get(&self, kind: CollectiveKind) -> KindStats {
        self.kinds[kind.index()]
    }

    /// Sum over all kinds.
    pub fn total(&self) -> KindStats {
        self.kinds
            .iter()
            .fold(KindStats::default(), |a, k| KindStats {
                calls: a.calls + k.calls,
                bytes_sent: a.bytes_sent + k.bytes_sent,
                bytes_received: a.bytes_received + k.bytes_received,
            })
    }

    /// `(kind, figures)` for every kind.
    pub fn iter(&self) -> impl Iterator<Item = (CollectiveKind, KindStats)> + '_ {
        CollectiveKind::ALL.iter().map(move |&k| (k, self.get(k)))
    }
}

impl std::ops::Sub for CommStats {
    type Output = CommStats;
    /// `later - earlier`: what happened in between (saturating, so a reset in between
    /// gives zeros rather than wrapping).
    fn sub(self, earlier: CommStats) -> CommStats {
        let mut out = CommStats::default();
        for i in 0..out.kinds.len() {
            let (a, b) = (self.kinds[i], earlier.kinds[i]);
            out.kinds[i] = KindStats {
                calls: a.calls.saturating_sub(b.calls),
                bytes_sent: a.bytes_sent.saturating_sub(b.bytes_sent),
                bytes_received: a.bytes_received.saturating_sub(b.bytes_received),
            };
        }
        out
    }
}

/// Bytes `(sent, received)` by communicator rank `rank` of `size` for one call of `kind`
/// on a buffer of `bytes` bytes (see the module header for which buffer and why).
pub fn ring_bytes(
    kind: CollectiveKind,
    size: usize,
    rank: usize,
    bytes: u64,
    root: usize,
) -> (u64, u64) {
    let n = size as u64;
    if n <= 1 {
        return (0, 0);
    }
    match kind {
        CollectiveKind::AllReduce => {
            let b = 2 * (n - 1) * bytes / n;
            (b, b)
        }
        CollectiveKind::ReduceScatter | CollectiveKind::AllGather | CollectiveKind::AllToAll => {
            let b = (n - 1) * bytes / n;
            (b, b)
        }
        CollectiveKind::Broadcast => {
            let last = (root + size - 1) % size;
            let sent = if rank == last { 0 } else { bytes };
            let received = if rank == root { 0 } else { bytes };
            (sent, received)
        }
        CollectiveKind::Barrier => (0, 0),
    }
}

/// Live counters of one communicator. Plain cells: a communicator is used from one
/// thread (it is neither `Send` nor `Sync`), so no atomic read-modify-write is needed on
/// the hot path.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    kinds: [Cell<KindStats>; KINDS],
}

impl Counters {
    pub(crate) fn record(&self, kind: CollectiveKind, sent: u64, received: u64) {
        let c = &self.kinds[kind.index()];
        let k = c.get();
        c.set(KindStats {
            calls: k.calls + 1,
            bytes_sent: k.bytes_sent + sent,
            bytes_received: k.bytes_received + received,
        });
    }

    pub(crate) fn snapshot(&self) -> CommStats {
        let mut s = CommStats::default();
        for (out, c) in s.kinds.iter_mut().zip(&self.kinds) {
            *out = c.get();
        }
        s
    }

    pub(crate) fn reset(&self) {
        for c in &self.kinds {
            c.set(KindStats::default());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_formulas() {
        // 4 ranks, 4096-byte all-reduce: 2*3/4 of the buffer each way.
        assert_eq!(
            ring_bytes(CollectiveKind::AllReduce, 4, 0, 4096, 0),
            (6144, 6144)
        );
        assert_eq!(
            ring_bytes(CollectiveKind::ReduceScatter, 4, 2, 4096, 0),
            (3072, 3072)
        );
        assert_eq!(
            ring_bytes(CollectiveKind::AllGather, 3, 1, 300, 0),
            (200, 200)
        );
        // Chain from root 1 over 3 ranks: 1 -> 2 -> 0.
        assert_eq!(ring_bytes(CollectiveKind::Broadcast, 3, 1, 10, 1), (10, 0));
        assert_eq!(ring_bytes(CollectiveKind::Broadcast, 3, 2, 10, 1), (10, 10));
        assert_eq!(ring_bytes(CollectiveKind::Broadcast, 3, 0, 10, 1), (0, 10));
        assert_eq!(ring_bytes(CollectiveKind::AllReduce, 1, 0, 10, 0), (0, 0));
        assert_eq!(ring_bytes(CollectiveKind::Barrier, 4, 0, 0, 0), (0, 0));
        // All-to-all: 3 of 4 blocks of 4096 bytes leave, 3 arrive.
        assert_eq!(
            ring_bytes(CollectiveKind::AllToAll, 4, 3, 4096, 0),
            (3072, 3072)
        );
        assert_eq!(ring_bytes(CollectiveKind::AllToAll, 1, 0, 64, 0), (0, 0));
    }

    #[test]
    fn wire_codes_are_stable() {
        // The consistency check compares codes across ranks: earlier kinds keep theirs.
        let codes: Vec<i64> = CollectiveKind::ALL.iter().map(|k| k.code()).collect();
        assert_eq!(codes, vec![1, 2, 3, 4, 5, 6]);
        for (i, k) in CollectiveKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
            assert_eq!(CollectiveKind::from_code(k.code()), Some(*k));
        }
        assert_eq!(CollectiveKind::AllToAll.name(), "all_to_all");
    }

    #[test]
    fn snapshots_diff() {
        let c = Counters::default();
        c.record(CollectiveKind::AllGather, 5, 7);
        let a = c.snapshot();
        c.record(CollectiveKind::AllGather, 1, 2);
        c.record(CollectiveKind::Barrier, 0, 0);
        let d = c.snapshot() - a;
        assert_eq!(
            d.get(CollectiveKind::AllGather),
            KindStats {
                calls: 1,
                bytes_sent: 1,
                bytes_received: 2
            }
        );
        assert_eq!(d.total().calls, 2);
        c.reset();
        assert_eq!(c.snapshot(), CommStats::default());
    }
}
