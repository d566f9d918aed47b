//! A collective call's fingerprint (sequence number, collective, reduction, count, dtype,
//! root, half mode) and its description in words: what the consistency check of either
//! backend compares across ranks. Kept apart from the MPI backend so that the in-process
//! backend has it in a build without MPI.

use crate::communicator::{RawCall, ReduceOp};
use crate::stats::CollectiveKind;
use crate::DType;

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
