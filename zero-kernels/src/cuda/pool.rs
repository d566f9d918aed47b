//! The caching allocator of [`super::CudaDevice`]: plain device allocations
//! (`cuMemAlloc`, no managed memory) kept in size classes and handed out again, because a
//! `cuMemAlloc`/`cuMemFree` pair synchronises the whole device and a training step
//! allocates temporaries.
//!
//! A freed block may still be in use by queued work on some stream. So it is not reusable
//! at once: a block released with an event (a temporary whose stream is known) becomes
//! free when that event has completed; a block released without one (a buffer whose
//! owner dropped it, used by unknown streams) becomes free at the next device-wide
//! synchronisation. When an allocation fails, the pool synchronises, returns every cached
//! block to the driver and tries once more.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{result, CudaContext, CudaEvent};

use crate::error::KernelError;

/// What an allocation runs before it waits for the whole device ([`Pool::alloc`]).
pub(crate) type Settle<'a> = &'a dyn Fn() -> Result<(), KernelError>;

/// Small blocks are rounded up to this many bytes (cuMemAlloc aligns to 256 anyway).
const SMALL_ROUND: usize = 512;
/// Blocks from 1 MiB up are rounded up to whole 2 MiB pages, so that a buffer reallocated
/// with a slightly different size finds its old block.
const LARGE_ROUND: usize = 2 << 20;

/// The size class a request of `bytes` is served from.
pub(crate) fn size_class(bytes: usize) -> usize {
    let round = if bytes >= (1 << 20) {
        LARGE_ROUND
    } else {
        SMALL_ROUND
    };
    bytes.max(1).div_ceil(round) * round
}

/// A block waiting until no queued work can touch it.
struct Pending {
    ptr: CUdeviceptr,
    bytes: usize,
    after: Option<Arc<CudaEvent>>,
}

#[derive(Default)]
struct PoolState {
    /// Reusable blocks by size class.
    free: BTreeMap<usize, Vec<CUdeviceptr>>,
    pending: Vec<Pending>,
    /// Bytes handed out and not released.
    in_use: usize,
    /// Bytes held from the driver (in use, pending or free).
    reserved: usize,
}

/// Counters of a pool, for logs and the memory ledger's check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes in live buffers (size classes, so at least the buffers' own bytes).
    pub in_use: usize,
    /// Bytes the pool holds from the driver.
    pub reserved: usize,
}

/// One GPU's pool (shared by the buffers it handed out, which return their blocks).
pub(crate) struct Pool {
    ctx: Arc<CudaContext>,
    state: Mutex<PoolState>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Pool {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Arc<Pool> {
        Arc::new(Pool {
            ctx,
            state: Mutex::new(PoolState::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding the lock leaves only counters half updated: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let st = self.lock();
        PoolStats {
            in_use: st.in_use,
            reserved: st.reserved,
        }
    }

    /// A block of at least `bytes` (its size class); `name` is for the error. `zeroed`:
    /// zeroed before this returns (a buffer, for any stream); else left as its last user
    /// left it (a temporary whose users write every byte they read: zeroing it cost a
    /// memset of the whole class per call, up to 256 MiB for the attention workspace).
    ///
    /// `settle` runs before the pool asks the driver for memory or waits for the device
    /// (when memory runs out): the device's started host work must be let go first, or a
    /// stream waiting for it would wait forever (`device/release.rs`).
    pub(crate) fn alloc(
        &self,
        bytes: usize,
        name: &str,
        zeroed: bool,
        settle: Settle<'_>,
    ) -> Result<(CUdeviceptr, usize), KernelError> {
        let class = size_class(bytes);
        self.ctx.bind_to_thread()?;
        let ptr = match self.take(class) {
            Some(p) => p,
            None => {
                // cuMemAlloc may synchronise the device: settle first.
                settle()?;
                match self.fresh(class) {
                    Ok(p) => p,
                    Err(_) => {
                        // Out of memory (or fragmented): wait for the device, hand every
                        // cached block back, try once more.
                        self.ctx.synchronize()?;
                        self.after_synchronize();
                        self.trim()?;
                        self.fresh(class).map_err(|e| {
                            let (free, total) = self.ctx.mem_get_info().unwrap_or((0, 0));
                            KernelError::Cuda(format!(
                                "cannot allocate '{name}' ({bytes} bytes): {e}; the GPU has {free} of {total} bytes free and this pool holds {} (reduce the micro-batch, raise the ZeRO stage, or use fewer ranks per GPU)",
                                self.stats().reserved
                            ))
                        })?
                    }
                }
            }
        };
        // Our streams are non-blocking (cudarc's `new_stream`): they do not wait for the
        // legacy default stream, where `cuMemsetD8` runs, and it returns before the memset
        // has run. So wait for it.
        if zeroed {
            // SAFETY: `ptr` addresses `class` bytes of this context; nothing else uses
            // them; the null stream is the context's legacy default stream.
            unsafe {
                result::memset_d8_sync(ptr, 0, class)?;
                result::stream::synchronize(std::ptr::null_mut())?;
            }
        }
        let mut st = self.lock();
        st.in_use += class;
        Ok((ptr, class))
    }

    /// A cached free block of exactly this class (after reclaiming finished temporaries).
    fn take(&self, class: usize) -> Option<CUdeviceptr> {
        let mut st = self.lock();
        reclaim_completed(&mut st);
        let list = st.free.get_mut(&class)?;
        let p = list.pop();
        if list.is_empty() {
            st.free.remove(&class);
        }
        p
    }

    fn fresh(&self, class: usize) -> Result<CUdeviceptr, KernelError> {
        // SAFETY: the context is bound to this thread (alloc binds it).
        let p = unsafe { result::malloc_sync(class) }?;
        self.lock().reserved += class;
        Ok(p)
    }

    /// Give a block back: reusable once `after` has completed, or, without an event, after
    /// the next device-wide synchronisation.
    pub(crate) fn release(&self, ptr: CUdeviceptr, bytes: usize, after: Option<Arc<CudaEvent>>) {
        let mut st = self.lock();
        st.in_use -= bytes;
        st.pending.push(Pending { ptr, bytes, after });
    }

    /// Called after the whole device has synchronised: every pending block is free.
    pub(crate) fn after_synchronize(&self) {
        let mut st = self.lock();
        let pending = std::mem::take(&mut st.pending);
        for p in pending {
            st.free.entry(p.bytes).or_default().push(p.ptr);
        }
    }

    /// Return every free block to the driver.
    fn trim(&self) -> Result<(), KernelError> {
        let mut st = self.lock();
        let free = std::mem::take(&mut st.free);
        for (class, ptrs) in free {
            for p in ptrs {
                // SAFETY: a free block is referenced by no buffer and no queued work.
                unsafe { result::free_sync(p) }?;
                st.reserved -= class;
            }
        }
        Ok(())
    }
}

/// Move pending temporaries whose event has completed to the free lists.
fn reclaim_completed(st: &mut PoolState) {
    let mut i = 0;
    while i < st.pending.len() {
        let done = st.pending[i]
            .after
            .as_ref()
            .is_some_and(|e| e.is_complete());
        if done {
            let p = st.pending.swap_remove(i);
            st.free.entry(p.bytes).or_default().push(p.ptr);
        } else {
            i += 1;
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // The last buffer is gone; wait for queued work, then free everything.
        if self.ctx.bind_to_thread().is_err() || self.ctx.synchronize().is_err() {
            return;
        }
        self.after_synchronize();
        if let Err(e) = self.trim() {
            log::warn!("freeing the CUDA pool: {e}");
        }
    }
}

/// A block of device memory from a [`Pool`], returned to it when dropped.
pub(crate) struct Block {
    pub(crate) ptr: CUdeviceptr,
    bytes: usize,
    pool: Arc<Pool>,
    /// Set for temporaries: the block is reusable once this event completes.
    after: Mutex<Option<Arc<CudaEvent>>>,
}

impl Block {
    /// A block zeroed before this returns, for any stream.
    pub(crate) fn new(
        pool: &Arc<Pool>,
        bytes: usize,
        name: &str,
        settle: Settle<'_>,
    ) -> Result<Block, KernelError> {
        Self::alloc(pool, bytes, name, true, settle)
    }

    /// A block that is not zeroed (it holds what its last user left): only for a user
    /// that writes every byte it reads before reading it.
    pub(crate) fn uninit(
        pool: &Arc<Pool>,
        bytes: usize,
        name: &str,
        settle: Settle<'_>,
    ) -> Result<Block, KernelError> {
        Self::alloc(pool, bytes, name, false, settle)
    }

    fn alloc(
        pool: &Arc<Pool>,
        bytes: usize,
        name: &str,
        zeroed: bool,
        settle: Settle<'_>,
    ) -> Result<Block, KernelError> {
        if bytes == 0 {
            return Ok(Block {
                ptr: 0,
                bytes: 0,
                pool: Arc::clone(pool),
                after: Mutex::new(None),
            });
        }
        let (ptr, class) = pool.alloc(bytes, name, zeroed, settle)?;
        Ok(Block {
            ptr,
            bytes: class,
            pool: Arc::clone(pool),
            after: Mutex::new(None),
        })
    }

    /// Free this temporary once `event` completes (the last work that uses it).
    pub(crate) fn release_after(&self, event: Arc<CudaEvent>) {
        *self.after.lock().unwrap_or_else(|e| e.into_inner()) = Some(event);
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let after = self
                .after
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            self.pool.release(self.ptr, self.bytes, after);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_and_group_large_blocks_by_pages() {
        assert_eq!(size_class(0), 512);
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class((1 << 20) - 1), 1 << 20);
        assert_eq!(size_class(1 << 20), 2 << 20);
        assert_eq!(size_class((2 << 20) + 1), 4 << 20);
    }
}
