//! The NCCL watchdog (feature `nccl`): a thread per [`crate::NcclComm`] that ends the job
//! when NCCL cannot finish, instead of letting every rank hang in a GPU kernel that waits
//! for a peer forever.
//!
//! Every collective queued on a stream is followed by an event; the thread polls, every
//! [`POLL`]:
//! - `ncclCommGetAsyncError`: a peer that died or a network error (NCCL notices a closed
//!   socket or a failed transfer within seconds);
//! - the oldest queued collective's event: not complete after the communicator's timeout
//!   (`ZERO_COMM_TIMEOUT`), as the MPI watchdog judges.
//!
//! (The time counts from when the collective was queued, so it includes the work queued
//! before it on the stream; a step shorter than the timeout never trips it.) A CUDA error
//! while querying an event (a broken context) ends the job the same way.
//!
//! Either way it prints `rank R: NCCL watchdog: ...` naming the collective (sequence
//! number, kind, count, dtype), aborts the NCCL communicator (`ncclCommAbort`, which makes
//! its kernels return) and ends the job (`MPI_Abort` where MPI is up, else exit status 1:
//! [`crate::exit::abort_world`]). `ncclCommGetAsyncError` is meant for polling from
//! another thread; `ncclCommAbort` may race with the main thread's calls on the same
//! communicator, which NCCL does not promise to survive, but the process ends at once
//! either way.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent};
use cudarc::nccl::sys;

use crate::DType;

/// How often the thread looks.
const POLL: Duration = Duration::from_millis(50);

/// Exit status when the watchdog ends the job.
pub const NCCL_WATCHDOG_EXIT_CODE: i32 = 1;

/// A queued collective, until its event completes.
pub(crate) struct Queued {
    pub seq: u64,
    pub op: &'static str,
    pub count: usize,
    pub dtype: DType,
    pub done: CudaEvent,
    pub at: Instant,
}

/// The communicator's handle, for the thread.
struct Handle(sys::ncclComm_t);
// SAFETY: only ncclCommGetAsyncError (made for polling from another thread) and, just
// before the process ends, ncclCommAbort are called through it; the owner joins the
// thread before destroying the communicator.
unsafe impl Send for Handle {}

/// The watchdog of one communicator: stops (and is joined) when dropped.
pub(crate) struct Watch {
    pending: Arc<Mutex<VecDeque<Queued>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// Watch `comm` (rank `world_rank`, named `name` in messages) with `timeout` per
    /// collective (`None`: only NCCL's own errors).
    pub(crate) fn start(
        comm: sys::ncclComm_t,
        ctx: Arc<CudaContext>,
        world_rank: usize,
        name: String,
        timeout: Option<Duration>,
    ) -> std::io::Result<Watch> {
        let pending: Arc<Mutex<VecDeque<Queued>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let handle = Handle(comm);
        let (p, s) = (Arc::clone(&pending), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name(format!("nccl-watchdog-{world_rank}"))
            .spawn(move || {
                // Event queries need the GPU's context on this thread.
                let bound = ctx.bind_to_thread().map_err(|e| format!("{e:?}"));
                watch(handle, world_rank, &name, timeout, bound, &p, &s)
            })?;
        Ok(Watch {
            pending,
            stop,
            thread: Some(thread),
        })
    }

    /// A collective was queued; `done` completes after it.
    pub(crate) fn queued(&self, q: Queued) {
        match self.pending.lock() {
            Ok(mut p) => p.push_back(q),
            // Only a panic on the watchdog thread poisons it; that thread is gone.
            Err(_) => log::warn!("NCCL watchdog: its thread has died; collectives go unwatched"),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// NCCL's text for a result code.
fn error_text(r: sys::ncclResult_t) -> String {
    // SAFETY: NCCL returns a static string for every code.
    let p = unsafe { sys::ncclGetErrorString(r) };
    if p.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: a NUL-terminated static string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// NCCL's last error message on `comm` (more detail than the code).
fn last_error(comm: sys::ncclComm_t) -> String {
    // SAFETY: NCCL returns a string it owns, valid until the next call on this thread.
    let p = unsafe { sys::ncclGetLastError(comm) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NUL-terminated, read at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn describe(q: &Queued) -> String {
    format!(
        "{} #{} of {} {} elements, queued {:.1} s ago",
        q.op,
        q.seq,
        q.count,
        q.dtype.name(),
        q.at.elapsed().as_secs_f64()
    )
}

/// The thread's loop: returns when `stop` is set; ends the job on an NCCL error or a
/// collective over its time.
fn watch(
    comm: Handle,
    world_rank: usize,
    name: &str,
    timeout: Option<Duration>,
    bound: Result<(), String>,
    pending: &Mutex<VecDeque<Queued>>,
    stop: &AtomicBool,
) {
    let fire = |why: String| -> ! {
        crate::exit::line_to_stderr(&format!(
            "rank {world_rank}: NCCL watchdog: {why}; aborting the communicator and the job"
        ));
        // SAFETY: a live communicator; makes its kernels return before the process ends.
        unsafe { sys::ncclCommAbort(comm.0) };
        crate::exit::abort_world(NCCL_WATCHDOG_EXIT_CODE)
    };
    if let Err(e) = bound {
        fire(format!(
            "cannot use the GPU's context on its thread ({e}), so it cannot watch '{name}'"
        ));
    }
    while !stop.load(Ordering::Relaxed) {
        // Woken early by the owner's drop.
        std::thread::park_timeout(POLL);
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut status = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator (the owner joins this thread before destroying it).
        let r = unsafe { sys::ncclCommGetAsyncError(comm.0, &mut status) };
        let failed = [r, status].into_iter().find(|s| {
            !matches!(
                s,
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
            )
        });
        let oldest = {
            let Ok(mut p) = pending.lock() else {
                log::warn!("rank {world_rank}: NCCL watchdog: its queue is poisoned; it stops");
                return;
            };
            // Drop the collectives that have finished (events complete in queue order on
            // one stream; on several, a finished one behind an unfinished one waits).
            loop {
                match p.front().map(|q| q.done.try_is_complete()) {
                    Some(Ok(true)) => {
                        p.pop_front();
                    }
                    Some(Err(e)) => {
                        let d = p.front().map(describe).unwrap_or_default();
                        drop(p);
                        fire(format!("the GPU reported {e:?} while {d} on '{name}' ran"));
                    }
                    _ => break,
                }
            }
            p.front().map(|q| (describe(q), q.at.elapsed()))
        };
        let why = match (failed, &oldest, timeout) {
            (Some(code), _, _) => Some(format!(
                "NCCL reported an error on communicator '{name}': {} ({}){}",
                error_text(code),
                last_error(comm.0),
                oldest
                    .as_ref()
                    .map(|(d, _)| format!("; waiting in {d}"))
                    .unwrap_or_default()
            )),
            (None, Some((d, waited)), Some(t)) if *waited > t => Some(format!(
                "{d} on communicator '{name}' has not finished {:.0} s after it was queued (ZERO_COMM_TIMEOUT): a peer stopped or hangs",
                t.as_secs_f64()
            )),
            _ => None,
        };
        if let Some(why) = why {
            fire(why);
        }
    }
}
