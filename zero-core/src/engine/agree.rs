//! What every rank must agree on before the update: whether some gradient overflowed
//! (then every rank skips the step), the global gradient norm (clipping), and the loss
//! of the global batch. One all-reduce of three f64 on the comm stream, after each rank
//! has summed its own shard:
//!
//! - squared norm: each element of the reduced gradient lives on exactly one rank (its
//!   shard, or its block of the full buffer), so the sum over ranks of the per-shard
//!   sums of squares is the full gradient's (summed in f64, units in order);
//! - overflow: any inf/NaN on any rank (a flag summed);
//! - loss: the sum of the N x A micro-batch means, divided by N x A.

use zero_comm::{on_stream, Communicator, ReduceOp};
use zero_kernels::device::{Buffer, Device};
use zero_kernels::Float;

use super::buffers::Buffers;
use super::{Core, EngineError};

/// The agreed outcome of the micro-steps, the same on every rank.
#[derive(Clone, Copy, Debug)]
pub(super) struct Agreed {
    /// Mean loss over the global batch.
    pub loss: f64,
    /// Global L2 norm of the (unscaled) gradient.
    pub grad_norm: f64,
    /// Some gradient was inf/NaN on some rank.
    pub overflow: bool,
}

/// Reduce this rank's view of the step with every other rank's (see the module doc).
pub(super) fn agree<G: Float, D: Device, C: Communicator>(
    core: &Core<'_, D, C>,
    bufs: &mut Buffers<D>,
    micro_steps: usize,
    loss_scale: f64,
) -> Result<Agreed, EngineError> {
    let (dev, compute, comm) = (core.dev, &core.streams.compute, &core.streams.comm);
    bufs.reducer.finish(core)?;
    let inv_scale = (1.0 / loss_scale) as f32;
    let grads = bufs.grads.get::<G>()?;
    for (u, at) in core.plan.placements.iter().enumerate() {
        dev.grad_stats(
            compute,
            grads.slice(at.norm_grads.clone()),
            inv_scale,
            bufs.grad_stats.slice_mut(2 * u..2 * u + 2),
        )?;
    }
    let mut stats = vec![0.0f64; bufs.grad_stats.len()];
    dev.download(compute, bufs.grad_stats.view(), &mut stats)?;
    let mut losses = vec![0.0f32; micro_steps];
    dev.download(compute, bufs.losses.slice(0..micro_steps), &mut losses)?;
    let sum_squares: f64 = stats.chunks_exact(2).map(|s| s[0]).sum();
    let nonfinite = stats.chunks_exact(2).any(|s| s[1] != 0.0);
    let loss_sum: f64 = losses.iter().map(|&l| l as f64).sum();
    let mine = [sum_squares, if nonfinite { 1.0 } else { 0.0 }, loss_sum];
    dev.upload(comm, &mine, bufs.agreement.view_mut())?;
    on_stream::all_reduce(
        core.comm,
        dev,
        comm,
        bufs.agreement.view_mut(),
        ReduceOp::Sum,
    )?;
    let mut agreed = [0.0f64; 3];
    dev.download(comm, bufs.agreement.view(), &mut agreed)?;
    let n = core.comm.size();
    Ok(Agreed {
        loss: agreed[2] / (n * micro_steps) as f64,
        grad_norm: agreed[0].sqrt(),
        overflow: agreed[1] > 0.0 || !agreed[0].is_finite(),
    })
}
