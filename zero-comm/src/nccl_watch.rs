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
//! Either way it prints `rank R: NCCL watchdog: ...` naming the collective (sequence
//! number, kind, count, dtype), aborts the NCCL communicator (`ncclCommAbort`, which makes
//! its kernels return) and ends the job (`MPI_Abort` where MPI is up, else exit status 1:
//! [`crate::exit::abort`]). NCCL documents both calls as safe from another thread.

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

/// The communicator's handle, for the thread (NCCL allows the two calls used from any
/// thread).
struct Handle(sys::ncclComm_t);
// SAFETY: only ncclCommGetAsyncError and ncclCommAbort are called through it, which NCCL
// documents as callable from another thread while the communicator is in use.
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
                // Event queries need the GPU's context on this thread; without it the
                // watchdog still sees NCCL's errors.
                if let Err(e) = ctx.bind_to_thread() {
                    log::warn!("rank {world_rank}: NCCL watchdog: binding the GPU context: {e:?}");
                }
                watch(handle, world_rank, &name, timeout, &p, &s)
            })?;
        Ok(Watch {
            pending,
            stop,
            thread: Some(thread),
        })
    }

    /// A collective was queued; `done` completes after it.
    pub(crate) fn queued(&self, q: Queued) {
        if let Ok(mut p) = self.pending.lock() {
            p.push_back(q);
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
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
    pending: &Mutex<VecDeque<Queued>>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(POLL);
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
            let Ok(mut p) = pending.lock() else { return };
            // Drop the collectives that have finished (events complete in queue order on
            // one stream; on several, a finished one behind an unfinished one waits).
            while p.front().is_some_and(|q| q.done.is_complete()) {
                p.pop_front();
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
                "{d} on communicator '{name}' has not finished after {:.0} s (ZERO_COMM_TIMEOUT): a peer stopped or hangs",
                t.as_secs_f64()
            )),
            _ => None,
        };
        if let Some(why) = why {
            crate::exit::line_to_stderr(&format!(
                "rank {world_rank}: NCCL watchdog: {why}; aborting the communicator and the job"
            ));
            // SAFETY: as above; makes the communicator's kernels return.
            unsafe { sys::ncclCommAbort(comm.0) };
            crate::exit::abort_world(NCCL_WATCHDOG_EXIT_CODE);
        }
    }
}
