//! Host-staged work a [`super::CudaDevice`] leaves running behind GPU compute
//! ([`StagedOverlap::Overlap`]): the started work in flight (`device/release.rs`), the
//! page-locked word its streams wait on (`cuStreamWaitValue32_v2`), and which streams
//! may stall behind it. `device.rs` settles it before every host-blocking call and polls
//! it as each op is queued (docs/ARCHITECTURE.md, Communicators).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{result, CudaContext, CudaStream};

use super::device::PinnedHost;
use crate::device::release::Released;
use crate::device::{HostWork, OverlapStats, Result, Retained, StagedOverlap};
use crate::error::KernelError;

/// A page-locked host word that streams wait on and the host sets: the release word of
/// `device/release.rs`.
struct ReleaseWord {
    memory: PinnedHost,
    device: CUdeviceptr,
}

impl ReleaseWord {
    fn new(ctx: &Arc<CudaContext>) -> Result<ReleaseWord> {
        // cuStreamWaitValue32_v2 came with CUDA 11.7's driver; loading a missing symbol
        // would panic (dynamic loading), so an older driver is refused first.
        let version = super::CudaDevice::driver_version()?;
        if version < 11070 {
            return Err(KernelError::Cuda(format!(
                "the CUDA driver is version {}; stream waits on host memory (cuStreamWaitValue32_v2) need 11.7 or later",
                super::cuda_version_text(version)
            )));
        }
        ctx.bind_to_thread()?;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: a fresh allocation of 8 bytes (aligned for a u64), zeroed before any
        // stream can read it, freed only by `PinnedHost`'s Drop.
        let ptr = unsafe { result::malloc_host(8, flags) }? as *mut u64;
        unsafe { std::ptr::write_bytes(ptr, 0, 1) };
        let memory = PinnedHost {
            ctx: Arc::clone(ctx),
            ptr,
        };
        let mut device: CUdeviceptr = 0;
        // SAFETY: `ptr` is mapped page-locked memory of this context (DEVICEMAP).
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, ptr as *mut std::ffi::c_void, 0) }
            .result()?;
        Ok(ReleaseWord { memory, device })
    }

    /// Release every number up to `n` (cyclically) to the streams waiting on the word.
    fn set(&self, n: u32) {
        // SAFETY: the word is 8 aligned bytes the host owns for the device's life; the
        // GPU only reads it. Release: what the finished work wrote (the staging regions)
        // is visible before the number that lets a stream copy it.
        let word = unsafe { &*(self.memory.ptr as *const AtomicU32) };
        word.store(n, Ordering::Release);
    }
}

/// Work [`StagedWork::leave_running`] could not leave running (the stream wait was
/// refused): the host waits for it instead.
pub(super) struct Refused {
    pub(super) error: KernelError,
    pub(super) work: Box<dyn HostWork>,
    pub(super) retain: Vec<Retained>,
}

/// See the module documentation.
pub(super) struct StagedWork {
    mode: Cell<StagedOverlap>,
    released: RefCell<Released>,
    /// Made for the first work left running.
    word: RefCell<Option<ReleaseWord>>,
    /// Set when the driver refused a stream wait: the host waits in place from then on.
    wait_refused: Cell<bool>,
    /// The streams (`CUstream` addresses) that may stall behind the work in flight:
    /// those that wait for the word, and those that wait for their events.
    gated: RefCell<Vec<u64>>,
}

impl StagedWork {
    pub(super) fn new(mode: StagedOverlap) -> StagedWork {
        StagedWork {
            mode: Cell::new(mode),
            released: RefCell::new(Released::default()),
            word: RefCell::new(None),
            wait_refused: Cell::new(false),
            gated: RefCell::new(Vec::new()),
        }
    }

    pub(super) fn mode(&self) -> StagedOverlap {
        self.mode.get()
    }

    /// Choose the mode for work started from now on; the previous one.
    pub(super) fn set_mode(&self, mode: StagedOverlap) -> StagedOverlap {
        self.mode.replace(mode)
    }

    /// Whether work started now is left running.
    pub(super) fn overlapping(&self) -> bool {
        self.mode.get() == StagedOverlap::Overlap && !self.wait_refused.get()
    }

    /// Whether work is in flight.
    pub(super) fn busy(&self) -> bool {
        self.released.borrow().busy()
    }

    /// Whether a settle has nothing to do.
    pub(super) fn idle(&self) -> bool {
        self.released.borrow().idle()
    }

    /// The time accounting of the work left running.
    pub(super) fn stats(&self) -> OverlapStats {
        self.released.borrow().stats()
    }

    fn release_to(&self, n: u32) {
        if let Some(word) = self.word.borrow().as_ref() {
            word.set(n);
        }
    }

    /// Wait for all the work in flight and let its streams go; the first failure.
    pub(super) fn settle(&self) -> Result<()> {
        let settled = self.released.borrow_mut().settle(&|n| self.release_to(n));
        self.gated.borrow_mut().clear();
        settled
    }

    /// Let the streams of finished work go, as an op is queued on `stream`.
    pub(super) fn poll(&self, stream: &CudaStream) {
        let Ok(mut released) = self.released.try_borrow_mut() else {
            return;
        };
        if !released.busy() {
            return;
        }
        let behind = self.gated.borrow().contains(&(stream.cu_stream() as u64));
        released.poll(behind, &|n| self.release_to(n));
        if !released.busy() {
            self.gated.borrow_mut().clear();
        }
    }

    /// Stream `waiter` waits for an event recorded on stream `origin`: held by the word
    /// when `origin` is.
    pub(super) fn note_wait(&self, waiter: u64, origin: u64) {
        let mut gated = self.gated.borrow_mut();
        if gated.contains(&origin) && !gated.contains(&waiter) {
            gated.push(waiter);
        }
    }

    /// Leave `work` (started `issued` seconds ago) running: queue on `stream` a wait for
    /// the word to reach its number. A refused wait gives the work back and turns the
    /// device to waiting.
    pub(super) fn leave_running(
        &self,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        name: &'static str,
        work: Box<dyn HostWork>,
        retain: Vec<Retained>,
        issued: f64,
    ) -> std::result::Result<(), Box<Refused>> {
        if let Err(error) = self.queue_wait(ctx, stream) {
            self.wait_refused.set(true);
            return Err(Box::new(Refused {
                error,
                work,
                retain,
            }));
        }
        let held = stream.cu_stream() as u64;
        if !self.gated.borrow().contains(&held) {
            self.gated.borrow_mut().push(held);
        }
        self.released
            .borrow_mut()
            .push(name, work, retain, issued, &|n| self.release_to(n));
        Ok(())
    }

    /// Queue on `stream` a wait for the word to reach the next work's number.
    fn queue_wait(&self, ctx: &Arc<CudaContext>, stream: &CudaStream) -> Result<()> {
        if self.word.borrow().is_none() {
            let word = ReleaseWord::new(ctx)?;
            *self.word.borrow_mut() = Some(word);
        }
        let number = self.released.borrow().next_number();
        let word = self.word.borrow();
        let Some(word) = word.as_ref() else {
            return Err(KernelError::Cuda("the release word was not made".into()));
        };
        ctx.bind_to_thread()?;
        // SAFETY: the word is mapped page-locked memory that lives as long as the device,
        // which lets every waiting stream go before it is freed (`settle` in Drop).
        // GEQ compares cyclically: (int32_t)(word - number) >= 0.
        unsafe {
            sys::cuStreamWaitValue32_v2(
                stream.cu_stream(),
                word.device,
                number,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        }
        .result()?;
        Ok(())
    }
}
