//! The consistency check: before a collective, every rank all-gathers a fingerprint of the
//! call it is about to make (sequence number, collective, reduction, count, dtype, root).
//! Ranks that disagree would hang or corrupt data inside MPI; here every rank sees the
//! same table, so every rank returns the same error naming the lowest rank that differs
//! from rank 0, and both calls, before any data moves.

use super::MpiComm;
use crate::communicator::Communicator;
use crate::communicator::{RawCall, ReduceOp};
use crate::error::{CommError, Result};
use crate::stats::CollectiveKind;
use crate::DType;
use mpi::ffi;

pub(crate) const FIELDS: usize = 7;

pub(crate) fn fingerprint(seq: u64, call: &RawCall, upcast: bool) -> [i64; FIELDS] {
    let op = match call.op {
        None => 0,
        Some(ReduceOp::Sum) => 1,
        Some(ReduceOp::Max) => 2,
    };
    let dtype = DType::ALL
        .iter()
        .position(|d| *d == call.dtype)
        .unwrap_or(DType::ALL.len()) as i64;
    [
        seq as i64,
        call.kind.code(),
        op,
        call.count() as i64,
        dtype,
        call.root as i64,
        upcast as i64,
    ]
}

pub(crate) fn describe(f: &[i64]) -> String {
    let kind = CollectiveKind::from_code(f[1]).map_or("unknown collective", |k| k.name());
    let op = match f[2] {
        1 => "(sum)",
        2 => "(max)",
        _ => "",
    };
    let dtype = DType::ALL
        .get(f[4] as usize)
        .map_or("?".to_string(), |d| d.to_string());
    let mut s = format!("#{} {kind}{op} of {} x {dtype}", f[0], f[3]);
    if CollectiveKind::from_code(f[1]) == Some(CollectiveKind::Broadcast) {
        s.push_str(&format!(" from root {}", f[5]));
    }
    if f[6] != 0 {
        s.push_str(" summed as f32");
    }
    s
}

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
