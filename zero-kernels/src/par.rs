//! Optional multi-threading of a kernel over contiguous chunks, on the pool of the device
//! made on this thread with that many threads ([`crate::pool`]), else on scoped threads. Chunk
//! starts are multiples of the kernel's block size, and every kernel's result for an
//! element depends only on that element (or, for reductions, on fixed blocks; sums over
//! rows, as the layer norm and bias gradients are, split by channels, each channel summing
//! all rows in row order), so the thread count never changes a bit of the output.

use crate::isa::Exec;
use crate::pool::{device_pool, pool_of_this_thread, SpinPool};
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Below this many elements per thread, a split costs more than it saves (tests split
/// anything, to exercise the chunking).
pub(crate) const MIN_PER_THREAD: usize = if cfg!(test) { 1 } else { 1 << 16 };

/// A raw pointer that may cross into the kernel threads. Each thread touches a disjoint
/// chunk, which is what makes sharing it sound.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub *mut T);
// SAFETY: used only to hand disjoint index ranges of one live buffer to kernel threads
// that are all done before the buffer's borrow ends.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer advanced by `i` elements.
    ///
    /// # Safety
    /// `i` is within the buffer (or one past its end).
    #[inline(always)]
    pub(crate) unsafe fn at(self, i: usize) -> *mut T {
        self.0.add(i)
    }
}

/// Run `f` on the chunks of `0..n` and return its results in chunk order.
pub(crate) fn map<R: Send>(
    exec: &Exec,
    n: usize,
    align: usize,
    f: impl Fn(Range<usize>) -> R + Sync,
) -> Vec<R> {
    let bounds = exec.chunks(n, align, MIN_PER_THREAD);
    let ranges: Vec<Range<usize>> = bounds.windows(2).map(|w| w[0]..w[1]).collect();
    if ranges.len() <= 1 {
        return ranges.into_iter().map(&f).collect();
    }
    // Each chunk's result lands in its own slot, so the order is the chunks'.
    let out: Vec<Mutex<Option<R>>> = ranges.iter().map(|_| Mutex::new(None)).collect();
    let run_chunk = |i: usize| {
        let r = f(ranges[i].clone());
        *out[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    };
    match pool_of_this_thread(exec.threads()) {
        Some(pool) => pool.run(ranges.len(), &run_chunk),
        None => run_parts((0..ranges.len()).collect(), run_chunk),
    }
    out.into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every chunk ran")
        })
        .collect()
}

/// Rows per part when `rows` rows of about `work_per_row` element operations each go to
/// at most `threads` threads: fewer parts when a part would be too small to pay for its
/// thread (the ops that split this way compute each row alone, so the split changes no
/// bit).
pub(crate) fn rows_per_part(threads: usize, rows: usize, work_per_row: usize) -> usize {
    let by_size = (rows.saturating_mul(work_per_row) / MIN_PER_THREAD).max(1);
    let parts = threads.min(by_size).min(rows).max(1);
    rows.div_ceil(parts).max(1)
}

/// Elements per part when `len` elements go to at most `parts` parts: a multiple of 16
/// (a 64-byte line of f32), so no two threads write the same cache line of a channel
/// vector; fewer parts when `len` is short.
pub(crate) fn channels_per_part(parts: usize, len: usize) -> usize {
    (len.div_ceil(parts.max(1)).div_ceil(16) * 16).max(1)
}

/// Pairs the k-th job of `a` with the k-th of `b`, either side `None` past its end: one
/// thread's share of two splits of one op (e.g. rows of dx and channels of dw).
pub(crate) fn zip_parts<A, B>(a: Vec<A>, b: Vec<B>) -> Vec<(Option<A>, Option<B>)> {
    let n = a.len().max(b.len());
    let (mut a, mut b) = (a.into_iter(), b.into_iter());
    (0..n).map(|_| (a.next(), b.next())).collect()
}

/// Run `f` on every job: the first on this thread, the others on scoped threads spawned
/// for the call (for work outside a device's kernels, which run on the device's pool).
/// Where the OS refuses a thread (a thread limit reached), that job and the ones after
/// it run on this thread after the first: the same result, only slower.
pub fn run_parts<J: Send>(jobs: Vec<J>, f: impl Fn(J) + Sync) {
    if jobs.len() <= 1 {
        jobs.into_iter().for_each(f);
        return;
    }
    let slots = JobSlots::new(jobs);
    let run_slot = |i: usize| {
        if let Some(job) = slots.take(i) {
            f(job)
        }
    };
    std::thread::scope(|s| {
        let run_slot = &run_slot;
        let mut handles = Vec::with_capacity(slots.len() - 1);
        let mut refused_from = slots.len();
        for i in 1..slots.len() {
            match std::thread::Builder::new().spawn_scoped(s, move || run_slot(i)) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    log::debug!("kernel parts {i}.. run on the calling thread ({e})");
                    refused_from = i;
                    break;
                }
            }
        }
        run_slot(0);
        (refused_from..slots.len()).for_each(run_slot);
        for h in handles {
            if let Err(e) = h.join() {
                // A kernel thread only panics on a bug; carry the panic to the caller.
                std::panic::resume_unwind(e);
            }
        }
    });
}

/// Jobs handed out by index, each exactly once, whichever thread asks first.
struct JobSlots<J>(Vec<Mutex<Option<J>>>);

impl<J> JobSlots<J> {
    fn new(jobs: Vec<J>) -> Self {
        JobSlots(jobs.into_iter().map(|j| Mutex::new(Some(j))).collect())
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// Job `i`, or None once it was taken.
    fn take(&self, i: usize) -> Option<J> {
        self.0[i].lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The threads one device's kernels run on: the calling thread plus `threads - 1` workers
/// of a pool kept for the device's life ([`crate::pool`]: they spin between batches), so
/// a kernel split costs a hand-off through shared memory, not a thread spawn or a
/// wake-up. Cloning shares the pool; the chunked kernels (`par::map`) called on the thread
/// that made it, with its thread count, run on it too.
#[derive(Clone)]
pub struct Workers {
    threads: usize,
    pool: Option<Arc<SpinPool>>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Workers({})", self.threads)
    }
}

impl Workers {
    /// `threads` threads in all (0 is taken as 1). If the pool cannot be made (the OS
    /// refuses threads), kernels fall back to scoped threads per call, with a warning.
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        Workers {
            threads,
            pool: device_pool(threads),
        }
    }

    /// Threads in all, the caller's included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Run `f` on every job, on this thread and the pool's workers (or scoped threads
    /// without a pool). Returns when all are done; a panic in a job is carried to the
    /// caller.
    pub(crate) fn run<J: Send>(&self, jobs: Vec<J>, f: impl Fn(J) + Sync) {
        let Some(pool) = &self.pool else {
            return run_parts(jobs, f);
        };
        if jobs.len() <= 1 {
            jobs.into_iter().for_each(f);
            return;
        }
        let slots = JobSlots::new(jobs);
        pool.run(slots.len(), &|i| {
            if let Some(job) = slots.take(i) {
                f(job)
            }
        });
    }
}
