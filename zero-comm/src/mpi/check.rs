//! The consistency check: before a collective, every rank all-gathers a fingerprint of the
//! call it is about to make (sequence number, collective, reduction, count, dtype, root).
//! Ranks that disagree would hang or corrupt data inside MPI; here every rank sees the
//! same table, so every rank returns the same error naming the lowest rank that differs
//! from rank 0, and both calls, before any data moves.

use super::MpiComm;
use crate::communicator::Communicator;
use crate::communicator::RawCall;
use crate::error::{CommError, Result};
use crate::fingerprint::{describe, fingerprint, FIELDS};
use mpi::ffi;

/// Exchange fingerprints and compare. Not counted in the accounting.
pub(super) fn check(comm: &MpiComm, seq: u64, call: &RawCall, upcast: bool) -> Result<()> {
    let mine = fingerprint(seq, call, upcast);
    let mut all = vec![0i64; FIELDS * comm.size];
    // SAFETY: `mine` holds FIELDS i64 and `all` FIELDS * size, as the counts say.
    let rc = unsafe {
        ffi::MPI_Allgather(
            mine.as_ptr() as *const _,
            FIELDS as i32,
            ffi::RSMPI_INT64_T,
            all.as_mut_ptr() as *mut _,
            FIELDS as i32,
            ffi::RSMPI_INT64_T,
            comm.raw,
        )
    };
    comm.check_rc("MPI_Allgather (consistency check)", rc)?;
    let first = &all[..FIELDS];
    for r in 1..comm.size {
        let other = &all[r * FIELDS..(r + 1) * FIELDS];
        if other != first {
            return Err(CommError::Mismatch {
                rank: comm.world_rank(),
                comm: comm.name.to_string(),
                seq,
                rank_a: 0,
                call_a: describe(first),
                rank_b: r,
                call_b: describe(other),
            });
        }
    }
    Ok(())
}
