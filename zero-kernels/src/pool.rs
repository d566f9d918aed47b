//! The kernel threads of one device: `threads - 1` workers kept for the device's life
//! that, between batches of jobs, spin for a while before they sleep.
//!
//! Why not a general pool (rayon, which this replaced): a training step hands the threads
//! several hundred short batches (every split GEMM and row op), one after another, with a
//! few microseconds of serial work between them. rayon's idle workers sleep after about
//! 32 rounds of `sched_yield` (tens of microseconds), so nearly every batch woke a
//! sleeping thread through a futex, and on a virtual machine a halted vCPU takes tens of
//! microseconds to run again: measured on the V=4096 GPT (bf16, 1 process x 2 threads),
//! ~870 futex calls and ~500 context switches per step, and the two threads together
//! idle ~12% of the step. OpenMP runtimes spin for the same reason (`KMP_BLOCKTIME`,
//! `GOMP_SPINCOUNT`). Here a worker spins (yielding, so an oversubscribed host still
//! runs everyone) for [`SPIN_ENV`] microseconds, default [`DEFAULT_SPIN_US`], then sleeps
//! on a condition variable until the next batch.
//!
//! A batch lives on its caller's stack: the caller publishes it, runs jobs itself, waits
//! until every job has finished and no worker is still looking at the batch, and only
//! then returns, which is what makes handing the workers a borrowed closure sound.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock, TryLockError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The environment variable that sets how long (microseconds) an idle kernel thread spins
/// for the next batch before it sleeps; 0 sleeps at once.
pub const SPIN_ENV: &str = "ZERO_POOL_SPIN_US";
/// Default spin before sleeping, microseconds: longer than the gaps between the kernels
/// of a step, short next to a step.
pub const DEFAULT_SPIN_US: u64 = 2000;

/// The spin time, read from [`SPIN_ENV`] once per process (a bad value is warned about
/// and the default used: a tuning knob must not stop a run).
fn spin_time() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = match std::env::var(SPIN_ENV) {
            Ok(v) if !v.trim().is_empty() => v.trim().parse::<u64>().unwrap_or_else(|_| {
                log::warn!(
                    "{SPIN_ENV}={v:?} is not a number of microseconds; using {DEFAULT_SPIN_US}"
                );
                DEFAULT_SPIN_US
            }),
            _ => DEFAULT_SPIN_US,
        };
        Duration::from_micros(us)
    })
}

/// A pool of `threads` threads in all (`threads - 1` workers) for one device (`Workers`),
/// also made the pool of the chunked kernels (`Exec` threads: casts, AdamW) that run on
/// the calling thread with that count (see [`pool_of_this_thread`]), so a device's GEMMs
/// and its other kernels share one team of spinning threads, as an OpenMP runtime's do.
/// Each device has its own (thread ranks in one process run side by side). `None` for
/// one thread, or when the OS refuses threads (warned; callers then spawn scoped
/// threads per call).
pub(crate) fn device_pool(threads: usize) -> Option<Arc<SpinPool>> {
    if threads <= 1 {
        return None;
    }
    match SpinPool::new(threads - 1) {
        Ok(p) => {
            let pool = Arc::new(p);
            THIS_THREADS_POOLS.with(|pools| {
                let mut pools = pools.borrow_mut();
                pools.retain(|(k, w)| *k != threads && w.strong_count() > 0);
                pools.push((threads, Arc::downgrade(&pool)));
            });
            Some(pool)
        }
        Err(e) => {
            log::warn!("no pool of {threads} kernel threads ({e}); threads are spawned per call");
            None
        }
    }
}

/// The live pool of `threads` threads made last on this thread ([`device_pool`]), if any:
/// the one a chunked kernel called here with that many threads runs on.
pub(crate) fn pool_of_this_thread(threads: usize) -> Option<Arc<SpinPool>> {
    THIS_THREADS_POOLS.with(|pools| {
        pools
            .borrow()
            .iter()
            .rev()
            .find(|(k, _)| *k == threads)
            .and_then(|(_, w)| w.upgrade())
    })
}

thread_local! {
    /// The pools made on this thread, by thread count (weak: a device's drop frees its
    /// pool).
    static THIS_THREADS_POOLS: std::cell::RefCell<Vec<(usize, Weak<SpinPool>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// One batch of jobs `0..jobs`, run by whoever claims them first.
struct Batch {
    /// The caller's closure with its lifetime erased; valid while the batch is published
    /// or any worker is inside it (the caller waits for both before it returns).
    run: *const (dyn Fn(usize) + Sync),
    jobs: usize,
    next: AtomicUsize,
    finished: AtomicUsize,
    /// The first panic of a job, carried to the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Batch {
    /// Claim and run jobs until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= self.jobs {
                return;
            }
            // SAFETY: `run` outlives every access (see `Batch::run`).
            let run = unsafe { &*self.run };
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(i))) {
                let mut first = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                if first.is_none() {
                    *first = Some(p);
                } else {
                    // Only the first is carried; a later payload is not dropped here,
                    // where a payload whose drop panics would end this thread mid-batch.
                    std::mem::forget(p);
                }
            }
            self.finished.fetch_add(1, SeqCst);
        }
    }
}

/// What the caller and the workers share.
struct Shared {
    /// Bumped once per published batch (and on shutdown).
    epoch: AtomicUsize,
    /// The batch in flight, or null.
    batch: AtomicPtr<Batch>,
    /// Workers between reading `batch` and leaving it.
    visitors: AtomicUsize,
    /// Workers asleep on `wake`.
    sleepers: AtomicUsize,
    stop: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    spin: Duration,
}

/// Spins until `done()`, yielding to the OS scheduler after the first few rounds so a
/// thread that holds the work can run on an oversubscribed host.
fn spin_until(done: impl Fn() -> bool) {
    let mut rounds = 0u32;
    while !done() {
        if rounds < 64 {
            std::hint::spin_loop();
            rounds += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

fn worker(shared: &Shared) {
    let mut seen = shared.epoch.load(SeqCst);
    loop {
        let start = Instant::now();
        let mut rounds = 0u32;
        loop {
            let now = shared.epoch.load(SeqCst);
            // `stop` too: a worker that starts after the pool's drop bumped the epoch
            // reads that epoch as its first.
            if now != seen || shared.stop.load(SeqCst) {
                seen = now;
                break;
            }
            rounds = rounds.wrapping_add(1);
            if rounds.is_multiple_of(64) && start.elapsed() >= shared.spin {
                let mut guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
                // Counted before the epoch is read again: a caller that bumps the epoch
                // after this read sees the sleeper and notifies under the lock.
                shared.sleepers.fetch_add(1, SeqCst);
                while shared.epoch.load(SeqCst) == seen && !shared.stop.load(SeqCst) {
                    guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                shared.sleepers.fetch_sub(1, SeqCst);
                seen = shared.epoch.load(SeqCst);
                break;
            }
            if rounds < 256 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if shared.stop.load(SeqCst) {
            return;
        }
        shared.visitors.fetch_add(1, SeqCst);
        let batch = shared.batch.load(SeqCst);
        if !batch.is_null() {
            // SAFETY: a non-null batch read after registering as a visitor stays valid
            // until this worker leaves (the caller unpublishes it, then waits for
            // `visitors` to drain).
            unsafe { (*batch).work() };
        }
        shared.visitors.fetch_sub(1, SeqCst);
    }
}

/// `threads - 1` spinning workers (the caller is the other thread). One batch at a time:
/// a second caller while a batch runs (a job that splits again, or another thread using
/// the same device) runs its jobs itself, serially, rather than wait.
pub(crate) struct SpinPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    /// One batch at a time; a caller that finds it taken (a job that splits again,
    /// or a second thread) runs its jobs itself.
    busy: Mutex<()>,
}

impl SpinPool {
    /// A pool of `workers` threads named `zero-kernels-{i}`; an error when the OS refuses
    /// a thread (those already started are stopped).
    pub(crate) fn new(workers: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            batch: AtomicPtr::new(std::ptr::null_mut()),
            visitors: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            spin: spin_time(),
        });
        let mut pool = SpinPool {
            shared,
            handles: Vec::with_capacity(workers),
            busy: Mutex::new(()),
        };
        for i in 0..workers {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("zero-kernels-{i}"))
                .spawn(move || worker(&shared))?;
            pool.handles.push(handle);
        }
        Ok(pool)
    }

    /// Run `f(i)` for every `i` in `0..jobs` on the caller and the workers; returns when
    /// all are done. A panic in a job is carried to the caller once every job is over.
    pub(crate) fn run(&self, jobs: usize, f: &(dyn Fn(usize) + Sync)) {
        let _turn = match self.busy.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                (0..jobs).for_each(f);
                return;
            }
        };
        // SAFETY: only the lifetime is erased; this function does not return before the
        // batch is unpublished and no worker is inside it (below).
        let run: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
        let batch = Batch {
            run,
            jobs,
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            panic: Mutex::new(None),
        };
        let shared = &*self.shared;
        shared
            .batch
            .store(&batch as *const Batch as *mut Batch, SeqCst);
        shared.epoch.fetch_add(1, SeqCst);
        if shared.sleepers.load(SeqCst) > 0 {
            let _guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_all();
        }
        batch.work();
        spin_until(|| batch.finished.load(SeqCst) == jobs);
        shared.batch.store(std::ptr::null_mut(), SeqCst);
        spin_until(|| shared.visitors.load(SeqCst) == 0);
        let panic = batch.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = panic {
            std::panic::resume_unwind(p);
        }
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        {
            let _guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.epoch.fetch_add(1, SeqCst);
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            // A worker only runs jobs inside `catch_unwind`; nothing to report.
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_runs_once_per_batch_over_many_batches() {
        let pool = SpinPool::new(3).expect("threads");
        for jobs in [0usize, 1, 2, 4, 9] {
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..jobs).map(|_| AtomicUsize::new(0)).collect();
                pool.run(jobs, &|i| {
                    hits[i].fetch_add(1, SeqCst);
                });
                assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "jobs={jobs}");
            }
        }
    }

    #[test]
    fn a_panicking_job_reaches_the_caller_after_the_others_finish() {
        let pool = SpinPool::new(2).expect("threads");
        let done = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(6, &|i| {
                if i == 2 {
                    panic!("job 2");
                }
                done.fetch_add(1, SeqCst);
            })
        }));
        assert!(r.is_err());
        assert_eq!(done.load(SeqCst), 5);
        // The pool still works afterwards.
        let n = AtomicUsize::new(0);
        pool.run(4, &|_| {
            n.fetch_add(1, SeqCst);
        });
        assert_eq!(n.load(SeqCst), 4);
    }

    #[test]
    fn nested_and_concurrent_callers_run_their_jobs_themselves() {
        let pool = SpinPool::new(2).expect("threads");
        let n = AtomicUsize::new(0);
        pool.run(3, &|_| {
            pool.run(2, &|_| {
                n.fetch_add(1, SeqCst);
            });
        });
        assert_eq!(n.load(SeqCst), 6);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..100 {
                        pool.run(2, &|_| {
                            n.fetch_add(1, SeqCst);
                        });
                    }
                });
            }
        });
        assert_eq!(n.load(SeqCst), 6 + 600);
    }

    #[test]
    fn a_device_pool_serves_the_chunked_kernels_of_its_own_thread_while_it_lives() {
        let mine = device_pool(3).expect("threads");
        let found = pool_of_this_thread(3).expect("registered");
        assert!(Arc::ptr_eq(&found, &mine));
        drop(found);
        assert!(pool_of_this_thread(2).is_none());
        std::thread::scope(|s| {
            s.spawn(|| assert!(pool_of_this_thread(3).is_none()));
        });
        drop(mine);
        assert!(pool_of_this_thread(3).is_none());
        assert!(device_pool(1).is_none());
    }

    #[test]
    fn workers_that_slept_wake_for_the_next_batch() {
        let pool = SpinPool::new(2).expect("threads");
        // Longer than any spin a test environment sets: the workers are asleep.
        std::thread::sleep(pool.shared.spin + Duration::from_millis(20));
        let n = AtomicUsize::new(0);
        pool.run(8, &|_| {
            n.fetch_add(1, SeqCst);
        });
        assert_eq!(n.load(SeqCst), 8);
    }
}
