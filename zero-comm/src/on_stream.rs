//! Collectives on device buffers, ordered on a device stream: what the engine calls. A
//! backend that queues its own GPU work (NCCL) puts each on the device's native stream
//! ([`Communicator::enqueue`]); any other runs as a [`Device::host_task`] on the stream.
//! Either way it starts after the work queued there before and the work queued after sees
//! its result; other streams see it only after
//! waiting for an event recorded on this stream afterwards (the rule a stream-ordered
//! NCCL collective follows too, so code checked on the simulated device is right for
//! both). The communicator must be able to reach the buffers' memory: a host transport
//! (MPI, thread ranks) refuses device memory with [`CommError::Location`], unless it is
//! wrapped in a [`crate::StagedComm`]: then each collective copies the device buffers
//! into host staging on the stream, runs on the host copies and copies the result back
//! on the stream (`staged.rs` has the ordering).
//!
//! Lengths follow [`Communicator`]'s conventions (equal blocks, rank order).

use std::cell::RefCell;
use std::rc::Rc;

use zero_kernels::device::{Buffer, DView, DViewMut, Device, HostWork, Retained};
use zero_kernels::{Element, KernelError};

use crate::buffer::Location;
use crate::communicator::{lower, Communicator, InFlight, RawBuf, RawCall, ReduceOp};
use crate::error::{CommError, Result};
use crate::staged::Staging;

fn raw<B: Buffer>(buf: &B, range: std::ops::Range<usize>) -> RawBuf {
    // SAFETY: only address arithmetic; the range lies inside the buffer (views are
    // checked when made), and the address is dereferenced by the backend only while the
    // host task runs, or by work queued on the stream, which the device keeps the memory
    // for (`Device::native_stream`'s promise).
    let ptr = unsafe { buf.raw_ptr().add(range.start) } as *mut u8;
    RawBuf {
        ptr,
        len: range.len(),
        location: buf.location(),
    }
}

/// A started collective as the device sees it. A transport error is kept typed in
/// `error` for the call that started it (when the device waits there) and given to the
/// device as text (when it surfaces at a later call).
struct Polled {
    name: &'static str,
    work: Box<dyn InFlight>,
    error: Rc<RefCell<Option<CommError>>>,
}

/// Keep `e` typed for the starting call; the device gets its text.
fn keep(error: &RefCell<Option<CommError>>, task: &'static str, e: CommError) -> KernelError {
    let message = e.to_string();
    *error.borrow_mut() = Some(e);
    KernelError::HostWork { task, message }
}

impl HostWork for Polled {
    fn test(&mut self) -> std::result::Result<bool, KernelError> {
        self.work
            .test()
            .map_err(|e| keep(&self.error, self.name, e))
    }
    fn wait(&mut self) -> std::result::Result<(), KernelError> {
        self.work
            .wait()
            .map_err(|e| keep(&self.error, self.name, e))
    }
}

/// Start `call` as host work on `stream` ([`Device::host_task_started`]): on a device
/// that overlaps (the host device, the simulated GPU, a CUDA device told to), it runs
/// behind the ops queued after it, polled between them; elsewhere the device waits for
/// it in place. `retain`
/// holds the buffers it touches, kept allocated while it is in flight.
#[allow(clippy::too_many_arguments)]
fn run<C: Communicator, D: Device>(
    comm: &C,
    dev: &D,
    stream: &D::Stream,
    name: &'static str,
    reads: &[zero_kernels::device::Access<'_>],
    writes: &[zero_kernels::device::Access<'_>],
    retain: Vec<Option<Retained>>,
    call: RawCall,
) -> Result<()> {
    if let Some(native) = dev.native_stream(stream) {
        // SAFETY: `native` is `stream` itself, so the collective is ordered like a kernel
        // that reads and writes these views; the device keeps their memory until the
        // work queued on it has run (`Device::native_stream`'s promise).
        if let Some(queued) = unsafe { comm.enqueue(&call, native) } {
            drop(retain);
            return queued;
        }
    }
    let on_host = call
        .send
        .iter()
        .chain(std::iter::once(&call.recv))
        .all(|b| b.location == Location::Host);
    if !on_host {
        // Device pointers (CUDA-aware MPI): MPI supports them in blocking collectives,
        // not necessarily in non-blocking ones (Open MPI 4 reduces those on the host).
        // A GPU's host task waits in place anyway (started work may overlap; a
        // collective on device memory is not that), so nothing overlaps less.
        return dev
            .host_task(stream, name, reads, writes, || {
                // SAFETY: ordered on `stream` like a kernel reading and writing these
                // views; the views are borrowed by the caller for this call.
                unsafe { comm.execute(&call) }
            })
            .map_err(|e| CommError::device(comm.world_rank(), name, e.to_string()))?;
    }
    let error: Rc<RefCell<Option<CommError>>> = Rc::default();
    let started = dev.host_task_started(
        stream,
        name,
        reads,
        writes,
        retain.into_iter().flatten().collect(),
        || {
            // SAFETY: the device orders the collective on `stream` like a kernel that
            // reads and writes these views, so nothing else touches them until it has
            // finished, and `retain` keeps their memory allocated until then.
            match unsafe { comm.start(&call) } {
                Ok(work) => Ok(Box::new(Polled {
                    name,
                    work,
                    error: Rc::clone(&error),
                }) as Box<dyn HostWork>),
                Err(e) => Err(keep(&error, name, e)),
            }
        },
    );
    started.map_err(|e| {
        error
            .borrow_mut()
            .take()
            .unwrap_or_else(|| CommError::device(comm.world_rank(), name, e.to_string()))
    })
}

/// Reduce `buf` across ranks in place.
pub fn all_reduce<C: Communicator, D: Device, T: Element>(
    comm: &C,
    dev: &D,
    stream: &D::Stream,
    buf: DViewMut<'_, D, T>,
    op: ReduceOp,
) -> Result<()> {
    if let Some(st) = comm.staging() {
        return staged::all_reduce(comm, st, dev, stream, buf, op);
    }
    let call = lower::all_reduce(None, raw(buf.buffer(), buf.range()), T::DTYPE, op);
    let retain = vec![buf.buffer().retain()];
    run(
        comm,
        dev,
        stream,
        "all_reduce",
        &[],
        &[buf.access()],
        retain,
        call,
    )
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
    if let Some(st) = comm.staging() {
        return staged::with_input(
            comm,
            st,
            dev,
            stream,
            "reduce_scatter",
            send,
            recv,
            |s, r| lower::reduce_scatter(s, r, T::DTYPE, op),
        );
    }
    let call = lower::reduce_scatter(
        raw(send.buffer(), send.range()),
        raw(recv.buffer(), recv.range()),
        T::DTYPE,
        op,
    );
    let retain = vec![send.buffer().retain(), recv.buffer().retain()];
    run(
        comm,
        dev,
        stream,
        "reduce_scatter",
        &[send.access()],
        &[recv.access()],
        retain,
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
    if let Some(st) = comm.staging() {
        return staged::with_input(comm, st, dev, stream, "all_gather", send, recv, |s, r| {
            lower::all_gather(Some(s), r, T::DTYPE)
        });
    }
    let call = lower::all_gather(
        Some(raw(send.buffer(), send.range())),
        raw(recv.buffer(), recv.range()),
        T::DTYPE,
    );
    let retain = vec![send.buffer().retain(), recv.buffer().retain()];
    run(
        comm,
        dev,
        stream,
        "all_gather",
        &[send.access()],
        &[recv.access()],
        retain,
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
    if let Some(st) = comm.staging() {
        return staged::all_gather_in_place(comm, st, dev, stream, buf);
    }
    let call = lower::all_gather(None, raw(buf.buffer(), buf.range()), T::DTYPE);
    let retain = vec![buf.buffer().retain()];
    run(
        comm,
        dev,
        stream,
        "all_gather",
        &[],
        &[buf.access()],
        retain,
        call,
    )
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
    if let Some(st) = comm.staging() {
        return staged::broadcast(comm, st, dev, stream, buf, root);
    }
    let call = lower::broadcast(raw(buf.buffer(), buf.range()), T::DTYPE, root);
    let retain = vec![buf.buffer().retain()];
    run(
        comm,
        dev,
        stream,
        "broadcast",
        &[],
        &[buf.access()],
        retain,
        call,
    )
}

/// Exchange equal blocks: block r of `send` goes to rank r, block r of `recv` comes from
/// rank r (`send.len() == recv.len()`, divisible by the size).
pub fn all_to_all<C: Communicator, D: Device, T: Element>(
    comm: &C,
    dev: &D,
    stream: &D::Stream,
    send: DView<'_, D, T>,
    recv: DViewMut<'_, D, T>,
) -> Result<()> {
    lower::check_all_to_all(comm, send.len(), recv.len())?;
    if let Some(st) = comm.staging() {
        return staged::with_input(comm, st, dev, stream, "all_to_all", send, recv, |s, r| {
            lower::all_to_all(s, r, T::DTYPE)
        });
    }
    let call = lower::all_to_all(
        raw(send.buffer(), send.range()),
        raw(recv.buffer(), recv.range()),
        T::DTYPE,
    );
    let retain = vec![send.buffer().retain(), recv.buffer().retain()];
    run(
        comm,
        dev,
        stream,
        "all_to_all",
        &[send.access()],
        &[recv.access()],
        retain,
        call,
    )
}

/// The host-staged versions (`staged.rs`): download on `stream` into a leased slot, the
/// collective started on the host regions through the communicator's own (host) path
/// as host work on `stream`, the upload queued behind it. The collectives on the regions
/// are the same calls with the same lengths as the direct path, so [`crate::CommStats`]
/// counts the same bytes; the copies are counted apart ([`Staging::stats`]).
mod staged {
    use super::*;
    use zero_kernels::device::StagingMemory;

    /// What goes down into the slot before the collective.
    enum Down<'a, D: Device, T: Element> {
        /// Nothing (a broadcast's receivers).
        Nothing,
        /// A separate input, into the send region.
        Input(DView<'a, D, T>),
        /// These elements of the output itself, into the same place of the receive
        /// region (in-place collectives).
        Output(std::ops::Range<usize>),
    }

    /// `len` elements (of the call's type) of `region` as an untyped host buffer.
    fn host_buf(region: &StagingMemory, len: usize) -> RawBuf {
        RawBuf {
            ptr: region.as_ptr(),
            len,
            location: Location::Host,
        }
    }

    /// One staged collective (see the module documentation of `staged.rs`): `down` into
    /// the slot, `call(send region, receive region)` started on the host,
    /// the receive region's first `up.len()` elements back into `up`. `send_len`: the
    /// elements of the send region the call reads (0: the call has no separate input).
    #[allow(clippy::too_many_arguments)]
    fn staged_call<C: Communicator, D: Device, T: Element>(
        comm: &C,
        st: &Staging,
        dev: &D,
        stream: &D::Stream,
        name: &'static str,
        down: Down<'_, D, T>,
        send_len: usize,
        up: DViewMut<'_, D, T>,
        call: impl FnOnce(Option<RawBuf>, RawBuf) -> RawCall,
    ) -> Result<()> {
        let rank = comm.world_rank();
        let dev_err = |e: KernelError| CommError::device(rank, name, format!("host staging: {e}"));
        let len = up.len();
        let need = send_len.max(len) * std::mem::size_of::<T>();
        let lease = st.lease(dev, rank, name, need)?;
        // The slice of the region a download fills.
        let host = |memory: &StagingMemory, at: usize, n: usize| {
            // SAFETY: the lease checked the region holds `need` bytes, which covers
            // at + n elements (inputs fill the send region from 0, outputs lie inside
            // `up`); the slot's last use has completed, so nothing else touches it.
            unsafe { std::slice::from_raw_parts_mut((memory.as_ptr() as *mut T).add(at), n) }
        };
        let down_len = match down {
            Down::Nothing => 0,
            Down::Input(view) => {
                let n = view.len();
                dev.download(stream, view, host(&lease.send, 0, n))
                    .map_err(dev_err)?;
                n
            }
            Down::Output(range) => {
                let (at, n) = (range.start, range.len());
                dev.download(stream, up.as_view().slice(range), host(&lease.recv, at, n))
                    .map_err(dev_err)?;
                n
            }
        };
        st.count_to_host::<T>(down_len);
        let send = (send_len > 0).then(|| host_buf(&lease.send, send_len));
        let raw_call = call(send, host_buf(&lease.recv, len));
        let retain: Vec<Option<Retained>> = vec![
            Some(Box::new(Rc::clone(&lease.send))),
            Some(Box::new(Rc::clone(&lease.recv))),
            Some(Box::new(lease.settled())),
        ];
        // Host memory only: the device orders it on `stream` and leaves it running where
        // it can. No device buffer is touched until the upload.
        run(comm, dev, stream, name, &[], &[], retain, raw_call)?;
        // SAFETY: the receive region holds `len` elements of T (checked by the lease), is
        // aligned for every element type (whole 8-byte words), and only the collective
        // just started writes it, which the stream orders before this copy; the slot is
        // not leased again before the event recorded below has completed.
        unsafe {
            dev.upload_from_staging(
                stream,
                lease.recv.as_ptr() as *const T,
                up,
                Box::new(Rc::clone(&lease.recv)),
            )
        }
        .map_err(dev_err)?;
        st.count_to_device::<T>(len);
        let after = dev.record(stream).map_err(dev_err)?;
        st.release(dev, lease, after);
        Ok(())
    }

    pub(super) fn all_reduce<C: Communicator, D: Device, T: Element>(
        comm: &C,
        st: &Staging,
        dev: &D,
        stream: &D::Stream,
        buf: DViewMut<'_, D, T>,
        op: ReduceOp,
    ) -> Result<()> {
        // Reduced in place in the receive region.
        let down = Down::Output(0..buf.len());
        staged_call(
            comm,
            st,
            dev,
            stream,
            "all_reduce",
            down,
            0,
            buf,
            |_, recv| lower::all_reduce(None, recv, T::DTYPE, op),
        )
    }

    /// A collective with a separate input: `send` down into the send region, `call(send
    /// region, receive region)`, the receive region up into `recv`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn with_input<C: Communicator, D: Device, T: Element>(
        comm: &C,
        st: &Staging,
        dev: &D,
        stream: &D::Stream,
        name: &'static str,
        send: DView<'_, D, T>,
        recv: DViewMut<'_, D, T>,
        call: impl FnOnce(RawBuf, RawBuf) -> RawCall,
    ) -> Result<()> {
        let n = send.len();
        let down = Down::Input(send);
        // An empty input has no send region: the (empty) receive region stands in.
        staged_call(comm, st, dev, stream, name, down, n, recv, |s, r| {
            call(s.unwrap_or(r), r)
        })
    }

    /// Only this rank's block goes down; the whole gathered buffer comes back up.
    pub(super) fn all_gather_in_place<C: Communicator, D: Device, T: Element>(
        comm: &C,
        st: &Staging,
        dev: &D,
        stream: &D::Stream,
        buf: DViewMut<'_, D, T>,
    ) -> Result<()> {
        let block = buf.len() / comm.size();
        let own = comm.rank() * block..(comm.rank() + 1) * block;
        staged_call(
            comm,
            st,
            dev,
            stream,
            "all_gather",
            Down::Output(own),
            0,
            buf,
            |_, r| lower::all_gather(None, r, T::DTYPE),
        )
    }

    /// Only the root's buffer goes down.
    pub(super) fn broadcast<C: Communicator, D: Device, T: Element>(
        comm: &C,
        st: &Staging,
        dev: &D,
        stream: &D::Stream,
        buf: DViewMut<'_, D, T>,
        root: usize,
    ) -> Result<()> {
        let down = if comm.rank() == root {
            Down::Output(0..buf.len())
        } else {
            Down::Nothing
        };
        staged_call(comm, st, dev, stream, "broadcast", down, 0, buf, |_, r| {
            lower::broadcast(r, T::DTYPE, root)
        })
    }
}
