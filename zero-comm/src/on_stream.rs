//! Collectives on device buffers, ordered on a device stream: what the engine calls. Each
//! runs as a [`Device::host_task`] on the stream, so it starts after the work queued there
//! before and the work queued after sees its result; other streams see it only after
//! waiting for an event recorded on this stream afterwards (the rule a stream-ordered
//! NCCL collective follows too, so code checked on the simulated device is right for
//! both). The communicator must be able to reach the buffers' memory: a host transport
//! (MPI, thread ranks) refuses device memory with [`CommError::Location`].
//!
//! Lengths follow [`Communicator`]'s conventions (equal blocks, rank order).

use zero_kernels::device::{Buffer, DView, DViewMut, Device};
use zero_kernels::Element;

use crate::communicator::{lower, Communicator, RawBuf, RawCall, ReduceOp};
use crate::error::{CommError, Result};

fn raw<B: Buffer>(buf: &B, range: std::ops::Range<usize>) -> RawBuf {
    // SAFETY: only address arithmetic; the range lies inside the buffer (views are
    // checked when made), and the address is dereferenced by the backend only while the
    // host task runs.
    let ptr = unsafe { buf.raw_ptr().add(range.start) } as *mut u8;
    RawBuf {
        ptr,
        len: range.len(),
        location: buf.location(),
    }
}

fn run<C: Communicator, D: Device>(
    comm: &C,
    dev: &D,
    stream: &D::Stream,
    name: &'static str,
    reads: &[zero_kernels::device::Access<'_>],
    writes: &[zero_kernels::device::Access<'_>],
    call: RawCall,
) -> Result<()> {
    dev.host_task(stream, name, reads, writes, || {
        // SAFETY: the views behind `call` are borrowed for this function; the device
        // runs nothing else on them while the task runs (it is ordered on `stream`
        // and checked against the other streams by the device's rules).
        unsafe { comm.execute(&call) }
    })
    .map_err(|e| CommError::device(comm.world_rank(), name, e.to_string()))?
}

/// Reduce `buf` across ranks in place.
pub fn all_reduce<C: Communicator, D: Device, T: Element>(
    comm: &C,
    dev: &D,
    stream: &D::Stream,
    buf: DViewMut<'_, D, T>,
    op: ReduceOp,
) -> Result<()> {
    let call = lower::all_reduce(None, raw(buf.buffer(), buf.range()), T::DTYPE, op);
    run(comm, dev, stream, "all_reduce", &[], &[buf.access()], call)
}

/// Reduce `send` (size x block) across ranks; this rank receives block `rank` in `recv`.
pub fn reduce_scatter<C: Communicator, D: Device, T: Element>(
    comm: &C,
    dev: &D,
    stream: &D::Stream,
    send: DView<'_, D, T>,
    recv: DViewMut<'_, D, T>,
    op: ReduceOp,
) -> Result<()> {
    lower::check_blocks(comm, "reduce_scatter", send.len(), recv.len())?;
    let call = lower::reduce_scatter(
        raw(send.buffer(), send.range()),
        raw(recv.buffer(), recv.range()),
        T::DTYPE,
        op,
    );
    run(
        comm,
        dev,
        stream,
        "reduce_scatter",
        &[send.access()],
        &[recv.access()],
        call,
    )
}

/// Gather every rank's `send` block into `recv` (size x block, rank order).
pub fn all_gather<C: Communicator, D: Device, T: Element>(
    comm: &C,
    dev: &D,
    stream: &D::Stream,
    send: DView<'_, D, T>,
    recv: DViewMut<'_, D, T>,
) -> Result<()> {
    lower::check_blocks(comm, "all_gather", recv.len(), send.len())?;
    let call = lower::all_gather(
        Some(raw(send.buffer(), send.range())),
        raw(recv.buffer(), recv.range()),
        T::DTYPE,
    );
    run(
        comm,
        dev,
        stream,
        "all_gather",
        &[send.access()],
        &[recv.access()],
        call,
    )
}

/// All-gather in place: this rank's block already sits at `rank * len / size` in `buf`.
pub fn all_gather_in_place<C: Communicator, D: Device, T: Element>(
    comm: &C,
    dev: &D,
    stream: &D::Stream,
    buf: DViewMut<'_, D, T>,
) -> Result<()> {
    lower::check_divisible(comm, "all_gather_in_place", buf.len())?;
    let call = lower::all_gather(None, raw(buf.buffer(), buf.range()), T::DTYPE);
    run(comm, dev, stream, "all_gather", &[], &[buf.access()], call)
}

/// Copy `buf` of rank `root` into `buf` of every rank.
pub fn broadcast<C: Communicator, D: Device, T: Element>(
    comm: &C,
    dev: &D,
    stream: &D::Stream,
    buf: DViewMut<'_, D, T>,
    root: usize,
) -> Result<()> {
    lower::check_root(comm, "broadcast", root)?;
    let call = lower::broadcast(raw(buf.buffer(), buf.range()), T::DTYPE, root);
    run(comm, dev, stream, "broadcast", &[], &[buf.access()], call)
}
