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
//! Errors: a failed collective hands its buffer back too (the error is returned), so a
//! request reports an error only once MPI no longer uses its buffers (the
//! [`InFlight`] contract; the MPI backend cancels and completes the collective's other
//! requests, or ends the process where MPI keeps one). A collective that fails without
//! being waited for (its [`Pending`] dropped, or left to the scope's end) is not lost:
//! [`Communicator::scope`] returns the first such error when `f` itself returned `Ok`.
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
use crate::error::{CommError, Result};
use crate::Element;
use std::cell::RefCell;
use std::marker::PhantomData;

/// The scope's requests, and the first error of one nobody waited for.
#[derive(Default)]
struct Slots {
    requests: RefCell<Vec<Option<Box<dyn InFlight>>>>,
    unseen: RefCell<Option<CommError>>,
}

impl Slots {
    fn take(&self, slot: usize) -> Option<Box<dyn InFlight>> {
        self.requests.borrow_mut()[slot].take()
    }

    /// Keep the first error of a collective not waited for, for the scope to return;
    /// later ones are logged (the first one fails the scope already).
    fn unseen(&self, e: CommError, how: &str) {
        let mut first = self.unseen.borrow_mut();
        if first.is_none() {
            *first = Some(e);
        } else {
            log::error!("non-blocking collective {how} failed too: {e}");
        }
    }

    /// Wait for every request still outstanding, keeping their errors.
    fn finish(&self) {
        let pending: Vec<Box<dyn InFlight>> = self
            .requests
            .borrow_mut()
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for mut req in pending {
            if let Err(e) = req.wait() {
                self.unseen(e, "left unwaited");
            }
        }
    }
}

/// Where non-blocking collectives are started; see the module documentation.
pub struct Scope<'s, 'env: 's, C: Communicator> {
    comm: &'env C,
    slots: Slots,
    // Invariant in both lifetimes, as std::thread::Scope.
    _scope: PhantomData<&'s mut &'s ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// A started collective. [`Pending::wait`] completes it and returns the output buffer.
/// Dropping it without waiting waits; if the collective failed, the scope returns that
/// error (see [`Communicator::scope`]).
#[must_use = "wait on a pending collective to see its result and error"]
pub struct Pending<'s, T> {
    slots: &'s Slots,
    slot: usize,
    out: Option<T>,
}

impl<T> Pending<'_, T> {
    /// Block until the collective completed; the output buffer comes back.
    pub fn wait(mut self) -> Result<T> {
        if let Some(mut req) = self.slots.take(self.slot) {
            // Sound to drop the request and give the borrow back on an error too: an
            // error means MPI no longer uses the buffers (the InFlight contract).
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
        match self.slots.requests.borrow_mut()[self.slot].as_mut() {
            Some(req) => req.test(),
            None => Ok(true),
        }
    }
}

impl<T> Drop for Pending<'_, T> {
    fn drop(&mut self) {
        if let Some(mut req) = self.slots.take(self.slot) {
            if let Err(e) = req.wait() {
                self.slots.unseen(e, "dropped without wait");
            }
        }
    }
}

/// [`Communicator::scope`]: `f`'s error when it returned one, else the first error of a
/// collective it did not wait for, else `f`'s value.
pub(crate) fn run_scope<'env, C, F, T, E>(comm: &'env C, f: F) -> std::result::Result<T, E>
where
    C: Communicator,
    F: for<'s> FnOnce(&'s Scope<'s, 'env, C>) -> std::result::Result<T, E>,
    E: From<CommError>,
{
    let scope = Scope {
        comm,
        slots: Slots::default(),
        _scope: PhantomData,
        _env: PhantomData,
    };
    // Waits for whatever is still outstanding, also when `f` unwinds.
    struct Finish<'a>(&'a Slots);
    impl Drop for Finish<'_> {
        fn drop(&mut self) {
            self.0.finish();
        }
    }
    let out = {
        let _finish = Finish(&scope.slots);
        f(&scope)
    };
    let unseen = scope.slots.unseen.take();
    match (out, unseen) {
        (Ok(_), Some(e)) => Err(e.into()),
        (Err(e), Some(also)) => {
            // `f`'s own error is what it saw first; this one would be lost otherwise.
            log::error!("non-blocking collective not waited for failed too: {also}");
            Err(e)
        }
        (out, None) => out,
    }
}

impl<'s, 'env: 's, C: Communicator> Scope<'s, 'env, C> {
    /// The communicator the collectives run on.
    pub fn comm(&self) -> &'env C {
        self.comm
    }

    fn push<T>(&'s self, req: Box<dyn InFlight>, out: T) -> Pending<'s, T> {
        let mut slots = self.slots.requests.borrow_mut();
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
        for req in self.slots.requests.borrow_mut().iter_mut().flatten() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{run_local, CommStats, HalfSum, LocalComm, RawCall};

    /// Thread ranks whose started collectives run, then the one started as number
    /// `fails` fails when tested or waited for (a peer lost after the data moved).
    struct FailsOne<'a> {
        inner: &'a LocalComm,
        fails: usize,
        started: std::cell::Cell<usize>,
    }

    struct Outcome(Option<String>);
    impl InFlight for Outcome {
        fn test(&mut self) -> Result<bool> {
            self.wait().map(|()| true)
        }
        fn wait(&mut self) -> Result<()> {
            match &self.0 {
                Some(why) => Err(CommError::device(0, "all_reduce", why.clone())),
                None => Ok(()),
            }
        }
    }

    impl Communicator for FailsOne<'_> {
        fn rank(&self) -> usize {
            self.inner.rank()
        }
        fn size(&self) -> usize {
            self.inner.size()
        }
        fn world_rank(&self) -> usize {
            self.inner.world_rank()
        }
        fn name(&self) -> &str {
            "fails-one"
        }
        fn stats(&self) -> CommStats {
            self.inner.stats()
        }
        fn reset_stats(&self) {
            self.inner.reset_stats()
        }
        fn half_sum(&self) -> HalfSum {
            self.inner.half_sum()
        }
        fn set_half_sum(&self, mode: HalfSum) {
            self.inner.set_half_sum(mode)
        }
        unsafe fn execute(&self, call: &RawCall) -> Result<()> {
            self.inner.execute(call)
        }
        unsafe fn start(&self, call: &RawCall) -> Result<Box<dyn InFlight>> {
            self.inner.execute(call)?;
            let n = self.started.get();
            self.started.set(n + 1);
            let why = (n == self.fails).then(|| format!("collective {n} lost its peer"));
            Ok(Box::new(Outcome(why)))
        }
    }

    /// Run `body` on one thread rank whose collective number `fails` fails.
    fn with_failing(fails: usize, body: impl Fn(&FailsOne) -> String + Sync) -> String {
        let out = run_local(1, Default::default(), |comm| {
            body(&FailsOne {
                inner: &comm,
                fails,
                started: Default::default(),
            })
        });
        out.into_iter()
            .next()
            .and_then(|r| r.ok())
            .expect("the rank ran")
    }

    fn outcome(r: Result<()>) -> String {
        match r {
            Ok(()) => "ok".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_failed_collective_nobody_waited_for_fails_the_scope() {
        // Dropped without wait.
        let said = with_failing(0, |c| {
            let mut a = [1f32; 2];
            outcome(c.scope(|s| {
                let _ = s.all_reduce(&mut a[..], ReduceOp::Sum)?;
                Ok(())
            }))
        });
        assert!(said.contains("collective 0 lost its peer"), "{said}");
        // Left to the scope's end (its handle forgotten), after one that succeeded.
        let said = with_failing(1, |c| {
            let (mut a, mut b) = ([1f32; 2], [1f32; 2]);
            outcome(c.scope(|s| {
                let first = s.all_reduce(&mut a[..], ReduceOp::Sum)?;
                let second = s.all_reduce(&mut b[..], ReduceOp::Sum)?;
                std::mem::forget(first);
                std::mem::forget(second);
                Ok(())
            }))
        });
        assert!(said.contains("collective 1 lost its peer"), "{said}");
    }

    #[test]
    fn the_closures_own_error_wins_and_a_clean_scope_is_ok() {
        let said = with_failing(0, |c| {
            let mut a = [1f32; 2];
            outcome(c.scope(|s| {
                let _pending = s.all_reduce(&mut a[..], ReduceOp::Sum)?;
                Err(CommError::Init("the closure's own".into()))
            }))
        });
        assert!(said.contains("the closure's own"), "{said}");
        // Waited for: the caller saw the error and chose to go on.
        let said = with_failing(0, |c| {
            let mut a = [1f32; 2];
            outcome(c.scope(|s| {
                let seen = s.all_reduce(&mut a[..], ReduceOp::Sum)?.wait();
                assert!(seen.is_err());
                Ok(())
            }))
        });
        assert_eq!(said, "ok");
        let said = with_failing(usize::MAX, |c| {
            let mut a = [1f32; 2];
            outcome(c.scope(|s| {
                let _ = s.all_reduce(&mut a[..], ReduceOp::Sum)?;
                s.progress()
            }))
        });
        assert_eq!(said, "ok");
    }
}
