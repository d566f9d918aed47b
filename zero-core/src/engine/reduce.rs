//! Gradient reduction and parameter gathering on flat unit buffers.
//!
//! Layout facts used here (layout.rs): a unit's padded buffer is N blocks of `shard_len`
//! elements, block r belonging to rank r. A reduce-scatter chunk `c` (a range of the
//! shard, at most `piece_len` long) travels as N blocks packed in a bucket: block q holds
//! elements `q * shard_len + c` of the unit, converted to the reduce dtype W, so one
//! equal-block reduce-scatter leaves this rank the sum of its own chunk in a piece
//! (memory.rs, "Buckets").

use std::ops::Range;

use zero_comm::{Communicator, ReduceOp};
use zero_kernels::Exec;

use super::real::{accumulate, convert, Real};
use super::EngineError;
use crate::layout::UnitLayout;

/// One chunk of one unit's shard, in flight or queued for reduction.
#[derive(Clone, Debug)]
pub(super) struct Chunk {
    /// Unit index.
    pub unit: usize,
    /// Range within the unit's shard.
    pub range: Range<usize>,
}

/// Pack chunk `c` of the unit gradient `src` (the unit's padded buffer) into `bucket`.
pub(super) fn pack<S: Real, W: Real>(
    exec: &Exec,
    src: &[S],
    unit: &UnitLayout,
    c: &Range<usize>,
    world: usize,
    bucket: &mut [W],
) -> Result<(), EngineError> {
    let len = c.len();
    for q in 0..world {
        let from = q * unit.shard_len + c.start;
        convert(
            exec,
            &src[from..from + len],
            &mut bucket[q * len..(q + 1) * len],
        )?;
    }
    Ok(())
}

/// Reduce chunk `c` of `src` across ranks now (blocking) and add this rank's sum into
/// `shard` (the unit's gradient shard).
#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_chunk_now<C: Communicator, S: Real, W: Real, P: Real>(
    comm: &C,
    exec: &Exec,
    src: &[S],
    unit: &UnitLayout,
    c: &Range<usize>,
    bucket: &mut [W],
    piece: &mut [W],
    shard: &mut [P],
) -> Result<(), EngineError> {
    let (n, len) = (comm.size(), c.len());
    pack(exec, src, unit, c, n, bucket)?;
    comm.reduce_scatter(&bucket[..n * len], &mut piece[..len], ReduceOp::Sum)?;
    accumulate(exec, &mut shard[c.clone()], &piece[..len])
}

/// Stage 0: all-reduce each unit's full gradient (in W, chunked through the bucket when
/// W differs from P, in place otherwise).
pub(super) fn all_reduce_full<C: Communicator, P: Real, W: Real>(
    comm: &C,
    exec: &Exec,
    units: &[UnitLayout],
    chunks: impl Fn(usize) -> Vec<Range<usize>>,
    grads: &mut [P],
    bucket: &mut [W],
) -> Result<(), EngineError> {
    for unit in units {
        let g = &mut grads[unit.unit_offset..unit.unit_offset + unit.padded_len];
        if P::DTYPE == W::DTYPE {
            comm.all_reduce(g, ReduceOp::Sum)?;
            continue;
        }
        for c in chunks(unit.padded_len) {
            let b = &mut bucket[..c.len()];
            convert(exec, &g[c.clone()], b)?;
            comm.all_reduce(b, ReduceOp::Sum)?;
            convert(exec, b, &mut g[c])?;
        }
    }
    Ok(())
}

/// Stages 1-3 with full gradients: reduce-scatter each unit's full gradient so this
/// rank's block holds the sum (the other blocks keep stale local values, never read).
/// When W = P and the shard fits one piece, the unit buffer is sent as it is (its blocks
/// are already in rank order); otherwise chunks are packed through the bucket.
#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_scatter_full<C: Communicator, P: Real, W: Real>(
    comm: &C,
    exec: &Exec,
    units: &[UnitLayout],
    chunks: impl Fn(usize) -> Vec<Range<usize>>,
    grads: &mut [P],
    bucket: &mut [W],
    piece: &mut [W],
) -> Result<(), EngineError> {
    let (n, r) = (comm.size(), comm.rank());
    for unit in units {
        let s = unit.shard_len;
        let g = &mut grads[unit.unit_offset..unit.unit_offset + unit.padded_len];
        let own = r * s..(r + 1) * s;
        let cs = chunks(s);
        if P::DTYPE == W::DTYPE && cs.len() == 1 && piece.len() >= s {
            let whole: &[W] = bytemuck::cast_slice(&*g);
            comm.reduce_scatter(whole, &mut piece[..s], ReduceOp::Sum)?;
            convert(exec, &piece[..s], &mut g[own])?;
            continue;
        }
        for c in cs {
            let len = c.len();
            pack(exec, g, unit, &c, n, bucket)?;
            comm.reduce_scatter(&bucket[..n * len], &mut piece[..len], ReduceOp::Sum)?;
            let at = own.start + c.start;
            convert(exec, &piece[..len], &mut g[at..at + len])?;
        }
    }
    Ok(())
}
