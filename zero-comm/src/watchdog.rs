//! The watchdog: a thread that aborts the job when a collective has not finished within
//! the configured timeout, after printing which one (communicator, sequence number,
//! collective, element count, dtype). Every rank stuck in the same collective fires at
//! about the same moment; each waits a short grace period before MPI_Abort so that the
//! others' lines get printed too.

use crate::stats::CollectiveKind;
use crate::DType;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Exit code of a job the watchdog aborted.
pub const WATCHDOG_EXIT_CODE: i32 = 3;

/// Time the firing rank waits before aborting, so peers stuck in the same call print.
const GRACE: Duration = Duration::from_millis(1000);

#[derive(Clone, Debug)]
struct Entry {
    comm: String,
    seq: u64,
    kind: CollectiveKind,
    count: usize,
    dtype: DType,
    started: Instant,
}

/// Collectives in flight on this rank, watched by one thread.
#[derive(Debug)]
pub(crate) struct Watchdog {
    world_rank: usize,
    timeout: Duration,
    next_id: AtomicU64,
    in_flight: Mutex<HashMap<u64, Entry>>,
    stop: AtomicBool,
}

/// What to watch for one collective; [`WatchSpec::enter`] starts the clock. Blocking
/// calls are watched for their whole duration; non-blocking ones only while the caller
/// waits on them, so a long compute phase overlapping a request is not mistaken for a hang.
pub(crate) struct WatchSpec {
    pub(crate) dog: Arc<Watchdog>,
    pub(crate) comm: String,
    pub(crate) seq: u64,
    pub(crate) kind: CollectiveKind,
    pub(crate) count: usize,
    pub(crate) dtype: DType,
}

impl WatchSpec {
    /// Watch from now until the token is dropped.
    pub(crate) fn enter(&self) -> WatchToken {
        self.dog
            .enter(&self.comm, self.seq, self.kind, self.count, self.dtype)
    }
}

/// Removes its collective from the watch list when dropped (i.e. when it completed).
pub(crate) struct WatchToken {
    dog: Arc<Watchdog>,
    id: u64,
}

impl Drop for WatchToken {
    fn drop(&mut self) {
        if let Ok(mut m) = self.dog.in_flight.lock() {
            m.remove(&self.id);
        }
    }
}

impl Watchdog {
    /// Start the watching thread.
    pub(crate) fn start(world_rank: usize, timeout: Duration) -> std::io::Result<Arc<Self>> {
        let dog = Arc::new(Watchdog {
            world_rank,
            timeout,
            next_id: AtomicU64::new(0),
            in_flight: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        });
        let d = Arc::clone(&dog);
        // Poll often enough that the abort comes within ~10% of the timeout.
        let poll = (timeout / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
        std::thread::Builder::new()
            .name("zero-comm-watchdog".into())
            .spawn(move || d.run(poll))?;
        Ok(dog)
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Watch one collective until the token is dropped.
    pub(crate) fn enter(
        self: &Arc<Self>,
        comm: &str,
        seq: u64,
        kind: CollectiveKind,
        count: usize,
        dtype: DType,
    ) -> WatchToken {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let e = Entry {
            comm: comm.to_string(),
            seq,
            kind,
            count,
            dtype,
            started: Instant::now(),
        };
        if let Ok(mut m) = self.in_flight.lock() {
            m.insert(id, e);
        }
        WatchToken {
            dog: Arc::clone(self),
            id,
        }
    }

    fn run(&self, poll: Duration) {
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(poll);
            let late: Option<Entry> = match self.in_flight.lock() {
                Ok(m) => m
                    .values()
                    .filter(|e| e.started.elapsed() > self.timeout)
                    .min_by_key(|e| e.seq)
                    .cloned(),
                Err(_) => None,
            };
            if let Some(e) = late {
                if self.stop.load(Ordering::Relaxed) {
                    return;
                }
                crate::init::line_to_stderr(&format!(
                    "rank {}: watchdog: {} #{} on '{}' ({} x {}) has not finished after {:.1} s \
                     (timeout {:.1} s); aborting the job",
                    self.world_rank,
                    e.kind,
                    e.seq,
                    e.comm,
                    e.count,
                    e.dtype,
                    e.started.elapsed().as_secs_f64(),
                    self.timeout.as_secs_f64()
                ));
                let _ = std::io::stderr().flush();
                std::thread::sleep(GRACE);
                crate::init::abort_world(WATCHDOG_EXIT_CODE);
            }
        }
    }
}
