//! Optional multi-threading of a kernel over contiguous chunks (std::thread::scope). Chunk
//! starts are multiples of the kernel's block size, and every kernel's result for an
//! element depends only on that element (or, for reductions, on fixed blocks), so the
//! thread count never changes a bit of the output.

use crate::isa::Exec;
use std::ops::Range;

/// Below this many elements per thread, spawning costs more than it saves (tests split
/// anything, to exercise the chunking).
pub(crate) const MIN_PER_THREAD: usize = if cfg!(test) { 1 } else { 1 << 16 };

/// A raw pointer that may cross into the scoped threads. Each thread touches a disjoint
/// chunk, which is what makes sharing it sound.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub *mut T);
// SAFETY: used only to hand disjoint index ranges of one live buffer to scoped threads.
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
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = ranges[1..]
            .iter()
            .cloned()
            .map(|r| s.spawn(move || f(r)))
            .collect();
        let mut out = vec![f(ranges[0].clone())];
        for h in handles {
            match h.join() {
                Ok(r) => out.push(r),
                // A kernel thread only panics on a bug; carry the panic to the caller.
                Err(e) => std::panic::resume_unwind(e),
            }
        }
        out
    })
}
