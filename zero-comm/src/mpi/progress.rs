//! A progress thread for non-blocking host collectives. Open MPI moves a non-blocking
//! collective (libnbc's schedules, shared-memory and TCP transfers) forward only while
//! some thread of the process is inside an MPI call. The host device polls the work in
//! flight before each op it runs (`zero-kernels/src/device/host.rs`), but one op (a large
//! matrix product) can take tens of milliseconds, and the peer ranks wait for this one's
//! next poll. While any request of this process is in flight, this thread calls
//! `MPI_Iprobe` on `MPI_COMM_SELF` (no message can match there, so it takes nothing from
//! anyone; the call runs the progress engine, which advances every request) every
//! `poll`, sleeping in between so it leaves the core to compute; with nothing in flight
//! it sleeps on a condition variable. MPI is initialised with `MPI_THREAD_MULTIPLE`
//! (`init.rs`), and the requests themselves are still tested and waited for by their
//! owner only. `micro overlap` measured the same scheme at 58-79% hidden against 28-38%
//! without it (README).

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use mpi::ffi;

#[derive(Debug, Default)]
struct Count {
    in_flight: usize,
    stop: bool,
}

#[derive(Debug, Default)]
struct State {
    count: Mutex<Count>,
    wake: Condvar,
}

impl State {
    fn update(&self, f: impl FnOnce(&mut Count)) {
        let mut c = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut c);
        self.wake.notify_all();
    }
}

/// The thread, and the count of requests in flight it serves.
#[derive(Debug)]
pub(crate) struct ProgressThread {
    state: Arc<State>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// One request in flight: counted from its start until this is dropped.
#[derive(Debug)]
pub(crate) struct Tracked(Arc<State>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0
            .update(|c| c.in_flight = c.in_flight.saturating_sub(1));
    }
}

impl ProgressThread {
    /// Start the thread (named `mpi-progress-<rank>`), asleep until a request starts.
    pub(crate) fn start(world_rank: usize, poll: Duration) -> std::io::Result<Self> {
        let state = Arc::new(State::default());
        let seen = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name(format!("mpi-progress-{world_rank}"))
            .spawn(move || run(&seen, poll))?;
        Ok(ProgressThread {
            state,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Count a request as in flight until the returned guard is dropped.
    pub(crate) fn track(&self) -> Tracked {
        self.state.update(|c| c.in_flight += 1);
        Tracked(Arc::clone(&self.state))
    }

    /// Stop the thread and wait for it (before MPI_Finalize).
    pub(crate) fn stop(&self) {
        self.state.update(|c| c.stop = true);
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(state: &State, poll: Duration) {
    loop {
        {
            let mut c = state.count.lock().unwrap_or_else(PoisonError::into_inner);
            while c.in_flight == 0 && !c.stop {
                c = state.wake.wait(c).unwrap_or_else(PoisonError::into_inner);
            }
            if c.stop {
                return;
            }
        }
        let mut flag = 0;
        // SAFETY: MPI is running with MPI_THREAD_MULTIPLE (the thread is stopped before
        // MPI_Finalize, by MpiContext's drop); MPI_COMM_SELF and the status constant are
        // predefined; `flag` is a local. No message can match on MPI_COMM_SELF.
        unsafe {
            ffi::MPI_Iprobe(
                ffi::RSMPI_ANY_SOURCE,
                ffi::RSMPI_ANY_TAG,
                ffi::RSMPI_COMM_SELF,
                &mut flag,
                ffi::RSMPI_STATUS_IGNORE,
            );
        }
        std::thread::sleep(poll);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracked_requests_are_counted_until_dropped() {
        let state = Arc::new(State::default());
        let p = ProgressThread {
            state: Arc::clone(&state),
            thread: Mutex::new(None),
        };
        let a = p.track();
        let b = p.track();
        assert_eq!(state.count.lock().map(|c| c.in_flight).ok(), Some(2));
        drop(a);
        drop(b);
        assert_eq!(state.count.lock().map(|c| c.in_flight).ok(), Some(0));
        p.stop();
        assert_eq!(state.count.lock().map(|c| c.stop).ok(), Some(true));
    }
}
