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
