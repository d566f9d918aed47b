//! The `Communicator` abstraction: what the ZeRO engine calls, independent of the
//! transport. A backend implements the two unsafe entry points on a [`RawCall`] (blocking
//! `execute`, non-blocking `start`); the typed collectives are provided methods that check
//! lengths and element types once, for every backend, and lower to a `RawCall`.
//!
//! Conventions (rsmpi's): counts come from buffer lengths; `_into` takes a separate output;
//! reduce-scatter and all-gather use equal blocks (`send.len() == size * recv.len()` and
//! `recv.len() == size * send.len()`), block r belonging to rank r; all-to-all takes
//! `send.len() == recv.len()`, divisible by size: block r of `send` goes to rank r, block r
//! of `recv` comes from rank r.

use crate::buffer::{CommBuf, CommBufMut, Location};
use crate::config::HalfSum;
use crate::error::{CommError, Result};
use crate::nonblocking::{self, Scope};
use crate::stats::{CollectiveKind, CommStats};
use crate::{DType, Element};

/// The reduction of an all-reduce or reduce-scatter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum (halves per the communicator's [`HalfSum`]).
    Sum,
    /// Element-wise maximum.
    Max,
}

impl ReduceOp {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        }
    }
}

/// An untyped buffer: address, element count and where it lives.
#[derive(Clone, Copy, Debug)]
pub struct RawBuf {
    /// First byte.
    pub ptr: *mut u8,
    /// Elements (of the call's dtype).
    pub len: usize,
    /// Memory it lives in.
    pub location: Location,
}

impl RawBuf {
    pub(crate) fn of<B: CommBuf + ?Sized>(b: &B) -> Self {
        RawBuf {
            ptr: b.as_ptr() as *mut u8,
            len: b.len(),
            location: b.location(),
        }
    }
    pub(crate) fn of_mut<B: CommBufMut + ?Sized>(b: &mut B) -> Self {
        RawBuf {
            ptr: b.as_mut_ptr() as *mut u8,
            len: b.len(),
            location: b.location(),
        }
    }
}

/// One collective, lowered: what a backend executes. Lengths are already checked against
/// the communicator size by the typed layer.
#[derive(Clone, Copy, Debug)]
pub struct RawCall {
    /// Which collective.
    pub kind: CollectiveKind,
    /// Reduction (all-reduce, reduce-scatter).
    pub op: Option<ReduceOp>,
    /// Element type of both buffers.
    pub dtype: DType,
    /// Input; `None` = in place (the input is `recv`, or for all-gather this rank's block
    /// of `recv`). Unused by barrier and broadcast.
    pub send: Option<RawBuf>,
    /// Output (all-gather: the whole gathered buffer; reduce-scatter: this rank's block;
    /// broadcast: the buffer; all-to-all: the blocks received, rank order). Empty for
    /// barrier.
    pub recv: RawBuf,
    /// Root of a broadcast (communicator rank).
    pub root: usize,
}

impl RawCall {
    /// The element count the consistency check and the watchdog report: the input's.
    pub fn count(&self) -> usize {
        match (self.kind, self.send) {
            (_, Some(s)) => s.len,
            (CollectiveKind::AllGather, None) => self.recv.len,
            _ => self.recv.len,
        }
    }
}

/// A started non-blocking collective, owned by a [`Scope`] until it completes.
///
/// An error from [`InFlight::test`] or [`InFlight::wait`] must mean that the operation
/// no longer reads or writes the caller's buffers: a [`Scope`] hands them back then. An
/// implementation that cannot make sure of it ends the process instead of returning.
/// (For MPI's own non-blocking collectives, which cannot be cancelled, that is as far as
/// MPI_Test reports the request complete; our ring and staging are settled by us.)
pub trait InFlight {
    /// True when complete (drives MPI progress as a side effect).
    fn test(&mut self) -> Result<bool>;
    /// Block until complete, then finish any staging (e.g. round an f32 sum back to bf16).
    fn wait(&mut self) -> Result<()>;
}

/// A collective that completed inside `start` (transports without non-blocking calls:
/// thread ranks, NCCL waiting on its stream).
pub(crate) struct Done;

impl InFlight for Done {
    fn test(&mut self) -> Result<bool> {
        Ok(true)
    }
    fn wait(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A group of ranks that run collectives together.
pub trait Communicator {
    /// This process's rank in the communicator.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// This process's rank in the world (for messages).
    fn world_rank(&self) -> usize;
    /// Name used in messages ("world", "node", "split(color=1)").
    fn name(&self) -> &str;
    /// Accounting so far.
    fn stats(&self) -> CommStats;
    /// Zero the accounting.
    fn reset_stats(&self);
    /// How half-precision sums are computed on this communicator.
    fn half_sum(&self) -> HalfSum;
    /// Change how half-precision sums are computed (every rank must agree).
    fn set_half_sum(&self, mode: HalfSum);

    /// Run `call` to completion.
    ///
    /// # Safety
    /// The buffers in `call` must be valid (reads for `send`, writes for `recv`) for the
    /// lengths given, and not aliased except as the call's in-place convention says.
    unsafe fn execute(&self, call: &RawCall) -> Result<()>;

    /// Start `call` and return without waiting.
    ///
    /// # Safety
    /// As [`Communicator::execute`], and the buffers must stay valid and untouched until
    /// the returned request has completed (a [`Scope`] guarantees this).
    unsafe fn start(&self, call: &RawCall) -> Result<Box<dyn InFlight>>;

    /// Queue `call` on the GPU stream `stream` (a `CUstream`'s address) and return without
    /// waiting, as a kernel is queued: it starts after the work queued there before, and
    /// the work queued after sees its result. `None` where this backend cannot (every
    /// host transport; NCCL's barrier): the caller runs the call as a host task of the
    /// stream instead. [`crate::on_stream`] tries this first on a device with native
    /// streams.
    ///
    /// # Safety
    /// As [`Communicator::execute`], with the buffers valid until `stream` has run the
    /// call; `stream` is a live stream of the GPU this communicator uses.
    unsafe fn enqueue(&self, _call: &RawCall, _stream: u64) -> Option<Result<()>> {
        None
    }

    /// Host staging for collectives on device buffers ([`crate::on_stream`]): `Some` for
    /// a [`crate::StagedComm`], which copies device buffers through host memory around
    /// each collective; `None` (every other backend) passes the buffers as they are.
    fn staging(&self) -> Option<&crate::staged::Staging> {
        None
    }

    /// Run non-blocking collectives: every request started in `f` has completed when this
    /// returns (see [`crate::nonblocking`] for why a scope).
    ///
    /// Returns `f`'s error when it returned one. Otherwise, when a collective that `f`
    /// started and did not wait for failed (its [`crate::Pending`] dropped, or left to
    /// the scope's end, which waits for it), the first such error: a failed collective
    /// leaves garbage in its output, so the scope must not return `Ok`. An error `f` was
    /// given by a wait is its own to return; one a test or [`Scope::progress`] gave is
    /// returned by the scope too unless `f` waited on that collective afterwards (the
    /// output is garbage whether or not `f` chose to go on).
    fn scope<'env, F, T, E>(&'env self, f: F) -> std::result::Result<T, E>
    where
        Self: Sized,
        F: for<'s> FnOnce(&'s Scope<'s, 'env, Self>) -> std::result::Result<T, E>,
        E: From<CommError>,
    {
        nonblocking::run_scope(self, f)
    }

    /// Block until every rank has arrived.
    fn barrier(&self) -> Result<()> {
        let call = lower::barrier();
        // SAFETY: a barrier touches no buffer.
        unsafe { self.execute(&call) }
    }

    /// Reduce `buf` across ranks in place.
    fn all_reduce<B: CommBufMut + ?Sized>(&self, buf: &mut B, op: ReduceOp) -> Result<()> {
        let call = lower::all_reduce(None, RawBuf::of_mut(buf), B::Elem::DTYPE, op);
        // SAFETY: `buf` is borrowed mutably for the whole call.
        unsafe { self.execute(&call) }
    }

    /// Reduce `send` across ranks into `recv` (same length).
    fn all_reduce_into<S, R>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()>
    where
        S: CommBuf + ?Sized,
        R: CommBufMut<Elem = S::Elem> + ?Sized,
    {
        lower::check_same(self, "all_reduce", send.len(), recv.len())?;
        let call = lower::all_reduce(
            Some(RawBuf::of(send)),
            RawBuf::of_mut(recv),
            S::Elem::DTYPE,
            op,
        );
        // SAFETY: both borrowed for the call; `&`/`&mut` rule out aliasing.
        unsafe { self.execute(&call) }
    }

    /// Reduce `send` (size x block) across ranks; this rank receives block `rank` in `recv`.
    fn reduce_scatter<S, R>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()>
    where
        S: CommBuf + ?Sized,
        R: CommBufMut<Elem = S::Elem> + ?Sized,
    {
        lower::check_blocks(self, "reduce_scatter", send.len(), recv.len())?;
        let call =
            lower::reduce_scatter(RawBuf::of(send), RawBuf::of_mut(recv), S::Elem::DTYPE, op);
        // SAFETY: both borrowed for the call.
        unsafe { self.execute(&call) }
    }

    /// Gather every rank's `send` block into `recv` (size x block, rank order).
    fn all_gather<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: CommBuf + ?Sized,
        R: CommBufMut<Elem = S::Elem> + ?Sized,
    {
        lower::check_blocks(self, "all_gather", recv.len(), send.len())?;
        let call = lower::all_gather(Some(RawBuf::of(send)), RawBuf::of_mut(recv), S::Elem::DTYPE);
        // SAFETY: both borrowed for the call.
        unsafe { self.execute(&call) }
    }

    /// All-gather in place: this rank's block already sits at `rank * len/size` in `buf`.
    fn all_gather_in_place<B: CommBufMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        lower::check_divisible(self, "all_gather_in_place", buf.len())?;
        let call = lower::all_gather(None, RawBuf::of_mut(buf), B::Elem::DTYPE);
        // SAFETY: `buf` borrowed mutably for the call.
        unsafe { self.execute(&call) }
    }

    /// Copy `buf` of rank `root` into `buf` of every rank.
    fn broadcast<B: CommBufMut + ?Sized>(&self, buf: &mut B, root: usize) -> Result<()> {
        lower::check_root(self, "broadcast", root)?;
        let call = lower::broadcast(RawBuf::of_mut(buf), B::Elem::DTYPE, root);
        // SAFETY: `buf` borrowed mutably for the call.
        unsafe { self.execute(&call) }
    }

    /// Exchange equal blocks: block r of `send` goes to rank r, block r of `recv` comes
    /// from rank r (`send.len() == recv.len()`, divisible by the size).
    fn all_to_all<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: CommBuf + ?Sized,
        R: CommBufMut<Elem = S::Elem> + ?Sized,
    {
        lower::check_all_to_all(self, send.len(), recv.len())?;
        let call = lower::all_to_all(RawBuf::of(send), RawBuf::of_mut(recv), S::Elem::DTYPE);
        // SAFETY: both borrowed for the call; `&`/`&mut` rule out aliasing.
        unsafe { self.execute(&call) }
    }
}

/// Building `RawCall`s and checking lengths: shared by the blocking methods and the scope.
pub(crate) mod lower {
    use super::*;

    fn empty() -> RawBuf {
        RawBuf {
            ptr: std::ptr::NonNull::<u64>::dangling().as_ptr() as *mut u8,
            len: 0,
            location: Location::Host,
        }
    }

    pub(crate) fn barrier() -> RawCall {
        RawCall {
            kind: CollectiveKind::Barrier,
            op: None,
            dtype: DType::U8,
            send: None,
            recv: empty(),
            root: 0,
        }
    }

    pub(crate) fn all_reduce(
        send: Option<RawBuf>,
        recv: RawBuf,
        dtype: DType,
        op: ReduceOp,
    ) -> RawCall {
        RawCall {
            kind: CollectiveKind::AllReduce,
            op: Some(op),
            dtype,
            send,
            recv,
            root: 0,
        }
    }

    pub(crate) fn reduce_scatter(
        send: RawBuf,
        recv: RawBuf,
        dtype: DType,
        op: ReduceOp,
    ) -> RawCall {
        RawCall {
            kind: CollectiveKind::ReduceScatter,
            op: Some(op),
            dtype,
            send: Some(send),
            recv,
            root: 0,
        }
    }

    pub(crate) fn all_gather(send: Option<RawBuf>, recv: RawBuf, dtype: DType) -> RawCall {
        RawCall {
            kind: CollectiveKind::AllGather,
            op: None,
            dtype,
            send,
            recv,
            root: 0,
        }
    }

    pub(crate) fn broadcast(buf: RawBuf, dtype: DType, root: usize) -> RawCall {
        RawCall {
            kind: CollectiveKind::Broadcast,
            op: None,
            dtype,
            send: None,
            recv: buf,
            root,
        }
    }

    pub(crate) fn all_to_all(send: RawBuf, recv: RawBuf, dtype: DType) -> RawCall {
        RawCall {
            kind: CollectiveKind::AllToAll,
            op: None,
            dtype,
            send: Some(send),
            recv,
            root: 0,
        }
    }

    fn size_err<C: Communicator + ?Sized>(c: &C, op: &'static str, detail: String) -> CommError {
        CommError::Size {
            rank: c.world_rank(),
            op,
            comm: c.name().to_string(),
            detail,
        }
    }

    pub(crate) fn check_same<C: Communicator + ?Sized>(
        c: &C,
        op: &'static str,
        send: usize,
        recv: usize,
    ) -> Result<()> {
        if send != recv {
            return Err(size_err(
                c,
                op,
                format!("send has {send} elements but recv has {recv}"),
            ));
        }
        Ok(())
    }

    /// `full == size * block`.
    pub(crate) fn check_blocks<C: Communicator + ?Sized>(
        c: &C,
        op: &'static str,
        full: usize,
        block: usize,
    ) -> Result<()> {
        let n = c.size();
        if block.checked_mul(n) != Some(full) {
            return Err(size_err(
                c,
                op,
                format!("full buffer of {full} elements != {n} ranks x block of {block}"),
            ));
        }
        Ok(())
    }

    pub(crate) fn check_divisible<C: Communicator + ?Sized>(
        c: &C,
        op: &'static str,
        len: usize,
    ) -> Result<()> {
        let n = c.size();
        if (len / n) * n != len {
            return Err(size_err(
                c,
                op,
                format!("buffer of {len} elements is not divisible into {n} equal blocks"),
            ));
        }
        Ok(())
    }

    /// `send.len() == recv.len()`, divisible into `size` blocks.
    pub(crate) fn check_all_to_all<C: Communicator + ?Sized>(
        c: &C,
        send: usize,
        recv: usize,
    ) -> Result<()> {
        check_same(c, "all_to_all", send, recv)?;
        check_divisible(c, "all_to_all", send)
    }

    pub(crate) fn check_root<C: Communicator + ?Sized>(
        c: &C,
        op: &'static str,
        root: usize,
    ) -> Result<()> {
        if root >= c.size() {
            return Err(CommError::Root {
                rank: c.world_rank(),
                op,
                comm: c.name().to_string(),
                root,
                size: c.size(),
            });
        }
        Ok(())
    }
}

/// A borrowed communicator is one (a [`crate::StagedComm`] over the world communicator
/// that the rest of the program keeps using).
impl<C: Communicator + ?Sized> Communicator for &C {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn world_rank(&self) -> usize {
        (**self).world_rank()
    }
    fn name(&self) -> &str {
        (**self).name()
    }
    fn stats(&self) -> CommStats {
        (**self).stats()
    }
    fn reset_stats(&self) {
        (**self).reset_stats()
    }
    fn half_sum(&self) -> HalfSum {
        (**self).half_sum()
    }
    fn set_half_sum(&self, mode: HalfSum) {
        (**self).set_half_sum(mode)
    }
    unsafe fn execute(&self, call: &RawCall) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).execute(call) }
    }
    unsafe fn start(&self, call: &RawCall) -> Result<Box<dyn InFlight>> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).start(call) }
    }
    unsafe fn enqueue(&self, call: &RawCall, stream: u64) -> Option<Result<()>> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).enqueue(call, stream) }
    }
    fn staging(&self) -> Option<&crate::staged::Staging> {
        (**self).staging()
    }
}
