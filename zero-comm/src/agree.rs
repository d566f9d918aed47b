//! Agreeing on a failure: every rank says whether its part failed, and every rank learns
//! the lowest rank that did (or that none did), so that all ranks take the same branch
//! afterwards: nobody waits in a collective that a failed rank will never join, and the
//! error names one rank consistently everywhere.

use crate::communicator::{Communicator, ReduceOp};
use crate::error::Result;

/// The lowest rank that passed `failed = true`, agreed on every rank (`None`: all
/// succeeded). Collective: one all-reduce of one f64.
pub fn lowest_failing_rank<C: Communicator>(comm: &C, failed: bool) -> Result<Option<usize>> {
    let n = comm.size();
    // max over (n - rank) of the failing ranks picks the lowest failing rank.
    let mut flag = [if failed {
        (n - comm.rank()) as f64
    } else {
        0.0
    }];
    comm.all_reduce(&mut flag[..], ReduceOp::Max)?;
    Ok((flag[0] > 0.0).then(|| n - flag[0] as usize))
}

/// Every rank's `values` (each passes as many), gathered, as rank 0's and those of the
/// ranks whose values differ from them, in rank order: for checking that the ranks hold
/// the same thing (a file's size and checksum, a command line's CRC), with every rank
/// learning the same answer. Collective: one all-gather.
pub fn unlike_rank_0<C: Communicator>(comm: &C, values: &[i64]) -> Result<Unlike> {
    let k = values.len();
    let mut all = vec![0i64; k * comm.size()];
    comm.all_gather(values, &mut all[..])?;
    let mut ranks = all.chunks(k.max(1)).map(<[i64]>::to_vec);
    let root = ranks.next().unwrap_or_default();
    let others = ranks
        .enumerate()
        .map(|(i, v)| (i + 1, v))
        .filter(|(_, v)| *v != root)
        .collect();
    Ok(Unlike { root, others })
}

/// What [`unlike_rank_0`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unlike {
    /// Rank 0's values.
    pub root: Vec<i64>,
    /// (rank, its values) of each rank whose values differ from rank 0's.
    pub others: Vec<(usize, Vec<i64>)>,
}

impl Unlike {
    /// Every rank holds rank 0's values.
    pub fn none(&self) -> bool {
        self.others.is_empty()
    }

    /// Whether `rank` differs from rank 0.
    pub fn differs(&self, rank: usize) -> bool {
        self.others.iter().any(|(r, _)| *r == rank)
    }
}

/// The longest message [`gather_failures`] carries per rank, in bytes (longer ones are
/// cut at a character boundary and end in "...").
pub const MAX_FAILURE_BYTES: usize = 4096;

/// Every failing rank's own message, agreed on every rank, in rank order: each rank
/// passes its error text (`None`: it succeeded), and every rank gets the list, so that
/// whoever reports the failure (rank 0) can print what went wrong where, not just that
/// some rank failed. Collective: one all-reduce, then one all-gather of the longest
/// message's length per rank when any rank failed.
pub fn gather_failures<C: Communicator>(
    comm: &C,
    mine: Option<&str>,
) -> Result<Vec<(usize, String)>> {
    let bytes = mine.map(|m| truncate(m, MAX_FAILURE_BYTES));
    // Longest message + 1 (0: nobody failed); +1 tells an empty message from success.
    let mut width = [bytes.as_ref().map_or(0.0, |b| (b.len() + 1) as f64)];
    comm.all_reduce(&mut width[..], ReduceOp::Max)?;
    let width = width[0] as usize;
    if width == 0 {
        return Ok(Vec::new());
    }
    // Each rank's block: a flag byte (1: failed) then its message, zero-padded.
    let mut block = vec![0u8; width];
    if let Some(b) = &bytes {
        block[0] = 1;
        block[1..=b.len()].copy_from_slice(b);
    }
    let mut all = vec![0u8; width * comm.size()];
    comm.all_gather(&block[..], &mut all[..])?;
    Ok(all
        .chunks_exact(width)
        .enumerate()
        .filter(|(_, b)| b[0] == 1)
        .map(|(rank, b)| {
            let text = &b[1..];
            let end = text.iter().position(|&x| x == 0).unwrap_or(text.len());
            (rank, String::from_utf8_lossy(&text[..end]).into_owned())
        })
        .collect())
}

/// `s` as bytes, at most `max` (cut at a character boundary, "..." appended), with NUL
/// bytes replaced (they end a message on the wire).
fn truncate(s: &str, max: usize) -> Vec<u8> {
    let clean = s.replace('\0', " ");
    if clean.len() <= max {
        return clean.into_bytes();
    }
    let mut end = max - 3;
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &clean[..end]).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_learns_each_failing_ranks_message() {
        let results = crate::run_local(4, Default::default(), |comm| {
            let mine = match comm.rank() {
                1 => Some("rank one's reason: checksum mismatch in 'rank-00001.h5'".to_string()),
                3 => Some("x".repeat(10_000) + "é"),
                _ => None,
            };
            gather_failures(&comm, mine.as_deref())
        });
        for r in results {
            let got = r.unwrap().unwrap();
            assert_eq!(got.len(), 2);
            assert_eq!(got[0].0, 1);
            assert!(got[0].1.contains("checksum mismatch"));
            assert_eq!(got[1].0, 3);
            assert_eq!(got[1].1.len(), MAX_FAILURE_BYTES);
            assert!(got[1].1.ends_with("..."));
        }
        let none = crate::run_local(3, Default::default(), |comm| gather_failures(&comm, None));
        assert!(none.into_iter().all(|r| r.unwrap().unwrap().is_empty()));
    }

    #[test]
    fn every_rank_learns_which_ranks_differ_from_rank_0() {
        let results = crate::run_local(4, Default::default(), |comm| {
            let mine = if comm.rank() == 2 { [7, 9] } else { [7, 8] };
            unlike_rank_0(&comm, &mine)
        });
        for r in results {
            let got = r.unwrap().unwrap();
            assert_eq!(got.root, [7, 8]);
            assert_eq!(got.others, [(2, vec![7, 9])]);
            assert!(got.differs(2) && !got.differs(1) && !got.none());
        }
        let same = crate::run_local(3, Default::default(), |comm| unlike_rank_0(&comm, &[5]));
        assert!(same.into_iter().all(|r| r.unwrap().unwrap().none()));
    }
}
