//! Non-blocking collectives, made safe by a scope (the design of `std::thread::scope`).
//!
//! Why a scope: a started MPI collective keeps reading and writing the caller's buffers
//! until it completes. A handle whose `Drop` waits is not enough, because safe code may
//! `mem::forget` it and free the buffer while MPI still writes into it. So requests live
//! in the [`Scope`], not in the handle: `comm.scope(|s| ...)` waits for every request
//! still outstanding before it returns, and the buffers are borrowed for the scope's
//! lifetime `'s`, which outlives the closure, so none can be freed or touched while a
//! request may still use it. A [`Pending`] handle hands the buffer back on
//! [`Pending::wait`], so the caller can use it again inside the scope.
//!
//! Why not a worker thread: it would need MPI_THREAD_MULTIPLE traffic from two threads on
//! one communicator and a copy or a lock per buffer; with MPI's own non-blocking
//! collectives the engine posts reduce-scatters between units of the backward and waits
//! at the end. Progress: Open MPI's host collectives advance only inside MPI calls, so a
//! long compute phase should call [`Scope::progress`] (or [`Pending::test`]) between
//! units for the communication to actually overlap.
//!
//! ```no_run
//! use zero_comm::{Communicator, ReduceOp};
//! # fn main() -> zero_comm::Result<()> {
//! let (_mpi, comm) = zero_comm::init()?;
//! let grads = vec![1.0f32; 4 * comm.size()];
//! let mut shard = vec![0.0f32; 4];
//! comm.scope(|s| -> zero_comm::Result<()> {
//!     let h = s.reduce_scatter(&grads[..], &mut shard[..], ReduceOp::Sum)?;
//!     // ... the backward of the next unit runs here, calling s.progress() now and then ...
//!     s.progress()?;
//!     let shard = h.wait()?; // the buffer comes back
//!     assert_eq!(shard.len(), 4);
//!     Ok(())
//! })?;
//! # Ok(())
//! # }
//! ```

use crate::buffer::{CommBuf, CommBufMut};
use crate::communicator::{lower, Communicator, InFlight, RawBuf, ReduceOp};
use crate::error::Result;
use crate::Element;
use std::cell::RefCell;
use std::marker::PhantomData;

type Slots = RefCell<Vec<Option<Box<dyn InFlight>>>>;

/// Where non-blocking collectives are started; see the module documentation.
pub struct Scope<'s, 'env: 's, C: Communicator> {
    comm: &'env C,
    slots: Slots,
    // Invariant in both lifetimes, as std::thread::Scope.
    _scope: PhantomData<&'s mut &'s ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// A started collective. [`Pending::wait`] completes it and returns the output buffer.
/// Dropping it without waiting waits (and logs an error if the collective failed).
#[must_use = "wait on a pending collective to see its result and error"]
pub struct Pending<'s, T> {
    slots: &'s Slots,
    slot: usize,
    out: Option<T>,
}

impl<T> Pending<'_, T> {
    /// Block until the collective completed; the output buffer comes back.
    pub fn wait(mut self) -> Result<T> {
        let req = self.slots.borrow_mut()[self.slot].take();
        if let Some(mut req) = req {
            req.wait()?;
        }
        Ok(self
            .out
            .take()
            .expect("a Pending is waited at most once (wait takes self)"))
    }

    /// True when complete; drives MPI progress. Waiting afterwards is still required to
    /// get the buffer back (and costs nothing then).
    pub fn test(&mut self) -> Result<bool> {
        match self.slots.borrow_mut()[self.slot].as_mut() {
            Some(req) => req.test(),
            None => Ok(true),
        }
    }
}

impl<T> Drop for Pending<'_, T> {
    fn drop(&mut self) {
        let req = self.slots.borrow_mut()[self.slot].take();
        if let Some(mut req) = req {
            if let Err(e) = req.wait() {
                log::error!("non-blocking collective dropped without wait failed: {e}");
            }
        }
    }
}

pub(crate) fn run_scope<'env, C, F, T>(comm: &'env C, f: F) -> T
where
    C: Communicator,
    F: for<'s> FnOnce(&'s Scope<'s, 'env, C>) -> T,
{
    let scope = Scope {
        comm,
        slots: RefCell::new(Vec::new()),
        _scope: PhantomData,
        _env: PhantomData,
    };
    // Waits for whatever is still outstanding, also when `f` unwinds.
    struct Finish<'a>(&'a Slots);
    impl Drop for Finish<'_> {
        fn drop(&mut self) {
            let pending: Vec<Box<dyn InFlight>> = self
                .0
                .borrow_mut()
                .iter_mut()
                .filter_map(Option::take)
                .collect();
            for mut req in pending {
                if let Err(e) = req.wait() {
                    log::error!("non-blocking collective left unwaited failed: {e}");
                }
            }
        }
    }
    let _finish = Finish(&scope.slots);
    f(&scope)
}

impl<'s, 'env: 's, C: Communicator> Scope<'s, 'env, C> {
    /// The communicator the collectives run on.
    pub fn comm(&self) -> &'env C {
        self.comm
    }

    fn push<T>(&'s self, req: Box<dyn InFlight>, out: T) -> Pending<'s, T> {
        let mut slots = self.slots.borrow_mut();
        slots.push(Some(req));
        Pending {
            slots: &self.slots,
            slot: slots.len() - 1,
            out: Some(out),
        }
    }

    /// Test every outstanding request once: call between compute phases so that MPI's
    /// host collectives advance while the caller computes.
    pub fn progress(&self) -> Result<()> {
        for req in self.slots.borrow_mut().iter_mut().flatten() {
            req.test()?;
        }
        Ok(())
    }

    /// Non-blocking barrier.
    pub fn barrier(&'s self) -> Result<Pending<'s, ()>> {
        let call = lower::barrier();
        // SAFETY: no buffers.
        let req = unsafe { self.comm.start(&call)? };
        Ok(self.push(req, ()))
    }

    /// Non-blocking in-place all-reduce.
    pub fn all_reduce<B: CommBufMut + ?Sized>(
        &'s self,
        buf: &'s mut B,
        op: ReduceOp,
    ) -> Result<Pending<'s, &'s mut B>> {
        let call = lower::all_reduce(None, RawBuf::of_mut(buf), B::Elem::DTYPE, op);
        // SAFETY: `buf` is borrowed for 's; the scope completes the request before 's ends.
        let req = unsafe { self.comm.start(&call)? };
        Ok(self.push(req, buf))
    }

    /// Non-blocking all-reduce of `send` into `recv`.
    pub fn all_reduce_into<S, R>(
        &'s self,
        send: &'s S,
        recv: &'s mut R,
        op: ReduceOp,
    ) -> Result<Pending<'s, &'s mut R>>
    where
        S: CommBuf + ?Sized,
        R: CommBufMut<Elem = S::Elem> + ?Sized,
    {
        lower::check_same(self.comm, "all_reduce", send.len(), recv.len())?;
        let call = lower::all_reduce(
            Some(RawBuf::of(send)),
            RawBuf::of_mut(recv),
            S::Elem::DTYPE,
            op,
        );
        // SAFETY: both borrowed for 's; completed before 's ends.
        let req = unsafe { self.comm.start(&call)? };
        Ok(self.push(req, recv))
    }

    /// Non-blocking reduce-scatter (equal blocks).
    pub fn reduce_scatter<S, R>(
        &'s self,
        send: &'s S,
        recv: &'s mut R,
        op: ReduceOp,
    ) -> Result<Pending<'s, &'s mut R>>
    where
        S: CommBuf + ?Sized,
        R: CommBufMut<Elem = S::Elem> + ?Sized,
    {
        lower::check_blocks(self.comm, "reduce_scatter", send.len(), recv.len())?;
        let call =
            lower::reduce_scatter(RawBuf::of(send), RawBuf::of_mut(recv), S::Elem::DTYPE, op);
        // SAFETY: both borrowed for 's; completed before 's ends.
        let req = unsafe { self.comm.start(&call)? };
        Ok(self.push(req, recv))
    }

    /// Non-blocking all-gather (equal blocks).
    pub fn all_gather<S, R>(
        &'s self,
        send: &'s S,
        recv: &'s mut R,
    ) -> Result<Pending<'s, &'s mut R>>
    where
        S: CommBuf + ?Sized,
        R: CommBufMut<Elem = S::Elem> + ?Sized,
    {
        lower::check_blocks(self.comm, "all_gather", recv.len(), send.len())?;
        let call = lower::all_gather(Some(RawBuf::of(send)), RawBuf::of_mut(recv), S::Elem::DTYPE);
        // SAFETY: both borrowed for 's; completed before 's ends.
        let req = unsafe { self.comm.start(&call)? };
        Ok(self.push(req, recv))
    }

    /// Non-blocking in-place all-gather.
    pub fn all_gather_in_place<B: CommBufMut + ?Sized>(
        &'s self,
        buf: &'s mut B,
    ) -> Result<Pending<'s, &'s mut B>> {
        lower::check_divisible(self.comm, "all_gather_in_place", buf.len())?;
        let call = lower::all_gather(None, RawBuf::of_mut(buf), B::Elem::DTYPE);
        // SAFETY: borrowed for 's; completed before 's ends.
        let req = unsafe { self.comm.start(&call)? };
        Ok(self.push(req, buf))
    }

    /// Non-blocking broadcast from `root`.
    pub fn broadcast<B: CommBufMut + ?Sized>(
        &'s self,
        buf: &'s mut B,
        root: usize,
    ) -> Result<Pending<'s, &'s mut B>> {
        lower::check_root(self.comm, "broadcast", root)?;
        let call = lower::broadcast(RawBuf::of_mut(buf), B::Elem::DTYPE, root);
        // SAFETY: borrowed for 's; completed before 's ends.
        let req = unsafe { self.comm.start(&call)? };
        Ok(self.push(req, buf))
    }

    /// Non-blocking all-to-all (equal blocks: block r of `send` to rank r).
    pub fn all_to_all<S, R>(
        &'s self,
        send: &'s S,
        recv: &'s mut R,
    ) -> Result<Pending<'s, &'s mut R>>
    where
        S: CommBuf + ?Sized,
        R: CommBufMut<Elem = S::Elem> + ?Sized,
    {
        lower::check_all_to_all(self.comm, send.len(), recv.len())?;
        let call = lower::all_to_all(RawBuf::of(send), RawBuf::of_mut(recv), S::Elem::DTYPE);
        // SAFETY: both borrowed for 's; completed before 's ends.
        let req = unsafe { self.comm.start(&call)? };
        Ok(self.push(req, recv))
    }
}
