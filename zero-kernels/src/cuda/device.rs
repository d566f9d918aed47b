//! [`CudaDevice`] as a [`Device`]: pooled device buffers, cudarc streams and events, and
//! every op as a queued copy, memset, kernel or cuBLASLt call. The checks are the CPU
//! devices' ([`crate::device::check`]), made on the host before anything is queued.
//!
//! Differences from the CPU devices, each forced by where the data lives:
//! - model ops run in f32 only (an f64 reference model stays on the CPU): another element
//!   type is a typed error;
//! - indices (token ids, targets) live on the device, so the kernels cannot report one
//!   out of range: they skip it. The models check their batches on the host before the
//!   upload (zero-models' `Gpt` does), which is where a user's bad token is caught;
//! - a host task (a collective of a host transport) first waits for its stream, then runs
//!   on the calling thread;
//! - started host work (a host-staged collective, [`Device::host_task_started`]) is
//!   waited for where it starts, or, with [`StagedOverlap::Overlap`], its stream waits
//!   on the GPU for a page-locked word that the host sets once the work has finished
//!   (`cuStreamWaitValue32`), so the host goes on queueing compute. The host looks at the
//!   work between the ops it queues, and finishes all of it before anything that blocks
//!   it on the device (`staged.rs`, `device/release.rs`).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{result, sys, CudaEvent, CudaStream, LaunchConfig, PushKernelArg};

use super::blas::Batch;
use super::pool::Block;
use super::{nn as launch, AttentionKernels, CudaDevice, MatmulPrecision};
use crate::adamw::{self, cuda::AdamWPtrs, AdamWCoeffs};
use crate::device::check::{self, same_len};
use crate::device::{
    Access, AdamWStep, AdamWViews, Buffer, DView, DViewMut, Device, HostWork, LayerNormGrads,
    LayerNormOut, LayerNormSaved, Location, MatMul, OverlapStats, Result, Retained, StagedOverlap,
    StagingMemory, View, ViewMut,
};
use crate::dtype::{DType, Element};
use crate::error::KernelError;
use crate::float::Float;
use crate::nn::{AttnShape, MatLayout, RopeShape, Scalar};
use crate::ptx::{accumulate_entry, cast_entry, quant4_entry, quant_entry};
use crate::twin::attention_products::{self as products, Buf};

/// A buffer in GPU memory, from its device's pool (the block returns there when the last
/// handle goes, reusable once no queued work can still touch it).
pub struct CudaBuf<T: Element> {
    block: Arc<Block>,
    len: usize,
    name: Arc<str>,
    id: u64,
    ordinal: usize,
    _elem: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for CudaBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaBuf<{}>('{}', {} elements on cuda:{})",
            T::DTYPE,
            self.name,
            self.len,
            self.ordinal
        )
    }
}

impl<T: Element> Buffer for CudaBuf<T> {
    type Elem = T;
    fn len(&self) -> usize {
        self.len
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn id(&self) -> u64 {
        self.id
    }
    fn location(&self) -> Location {
        Location::Cuda(self.ordinal)
    }
    /// The device address (not dereferenceable on the host).
    fn raw_ptr(&self) -> *mut T {
        self.block.ptr as *mut T
    }
}

/// A stream of a [`CudaDevice`], with the name it was created with.
#[derive(Clone)]
pub struct CudaStreamRef {
    inner: Arc<CudaStream>,
    name: Arc<str>,
}

impl std::fmt::Debug for CudaStreamRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaStream('{}')", self.name)
    }
}

impl CudaStreamRef {
    /// The cudarc stream (for NCCL and other libraries that queue on it).
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.inner
    }
    /// The name it was created with.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// An event of a [`CudaDevice`], and the stream it was recorded on (its `CUstream`'s
/// address: whether a stream that waits for it may stall behind started host work).
#[derive(Clone)]
pub struct CudaEventRef(Arc<CudaEvent>, u64);

impl std::fmt::Debug for CudaEventRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaEvent")
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Streams may wait for started host work (a step that failed half-way): finish
        // it and let them go, or the synchronisation below would never return.
        if let Err(e) = self.settle() {
            log::warn!("CUDA device: host work failed before shutdown: {e}");
        }
        // Queued copies may still read staging memory whose last handle goes with
        // `staged_uploads`, and kernels may still use pooled buffers: let them finish.
        if let Err(e) = self.ctx.synchronize() {
            log::warn!("CUDA device: synchronizing before shutdown: {e}");
        }
        self.staged_uploads.borrow_mut().clear();
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, freed (in its context) when dropped.
pub(super) struct PinnedHost {
    pub(super) ctx: Arc<cudarc::driver::CudaContext>,
    pub(super) ptr: *mut u64,
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // Nothing can use the memory any more: its StagingMemory is gone, and the device
        // held it for every queued copy until that copy ran (or, when it was dropped,
        // synchronized first).
        let freed = self.ctx.bind_to_thread().and_then(|()| {
            // SAFETY: `ptr` came from `malloc_host` and is freed once, here.
            unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) }
        });
        if let Err(e) = freed {
            log::warn!("freeing page-locked staging memory: {e}");
        }
    }
}

/// Device address of a view's first element.
fn addr<T: Element>(v: &View<'_, CudaBuf<T>>) -> CUdeviceptr {
    inside(v.buffer(), &v.range());
    v.buffer().block.ptr + (v.range().start * T::DTYPE.size_bytes()) as u64
}

/// Device address of a write view's first element.
fn addr_mut<T: Element>(v: &ViewMut<'_, CudaBuf<T>>) -> CUdeviceptr {
    inside(v.buffer(), &v.range());
    v.buffer().block.ptr + (v.range().start * T::DTYPE.size_bytes()) as u64
}

/// The view constructors keep a view inside its buffer; checked again (one compare) where
/// a view becomes a device address, so that a bug there stops before a kernel writes
/// past the allocation.
fn inside<T: Element>(buf: &CudaBuf<T>, r: &std::ops::Range<usize>) {
    assert!(
        r.start <= r.end && r.end <= buf.len(),
        "view {r:?} is not inside buffer '{}' of {} elements",
        buf.name(),
        buf.len()
    );
}

/// Model ops run in f32 on the GPU.
fn f32_only<F: Element>(op: &'static str) -> Result<()> {
    if F::DTYPE != DType::F32 {
        return Err(KernelError::BadShape {
            op,
            detail: format!(
                "the CUDA device runs model ops in f32, not {} (an f64 reference model runs on the host device)",
                F::DTYPE
            ),
        });
    }
    Ok(())
}

/// The kernel for values of `dtype` (f32 and bf16 have one), named by `entry`
/// ([`quant_entry`] for int8, [`quant4_entry`] for int4).
fn quant_kernel(
    op: &'static str,
    entry: fn(bool, DType) -> String,
    quantize: bool,
    dtype: DType,
) -> Result<String> {
    match dtype {
        DType::F32 | DType::BF16 => Ok(entry(quantize, dtype)),
        d => Err(unsupported(
            op,
            format!("{d} values have no GPU kernel (f32, bf16)"),
        )),
    }
}

/// The element types the cast, accumulate, grad_stats and AdamW kernels exist for
/// (cast.cu, gradstats.cu, adamw.cu).
const KERNEL_FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// An unsupported-type error, before any entry name is formed, when one of `dtypes` has
/// no kernel of `op`: otherwise the missing entry (`widen_f64`, `sumsq_f64`) would read
/// as a broken PTX build. ([`Float`] is only f32, bf16 and f16 today, so this guards
/// against a wider `Float` reaching these ops.)
fn float_kernel(op: &'static str, dtypes: &[DType]) -> Result<()> {
    match dtypes.iter().find(|d| !KERNEL_FLOATS.contains(d)) {
        Some(d) => Err(unsupported(
            op,
            format!("{d} values have no GPU kernel (f32, bf16, f16)"),
        )),
        None => Ok(()),
    }
}

fn unsupported(op: &'static str, detail: String) -> KernelError {
    KernelError::BadShape { op, detail }
}

impl CudaDevice {
    /// A temporary of `len` elements for work queued on `stream`: it returns to the pool
    /// once that work has run. It is **not zeroed** (a memset of each temporary cost up
    /// to 256 MiB of writes per attention backward): every user writes each element
    /// before it reads it. They are: the rope table (uploaded whole), the grad_stats block
    /// sums (`sums[b]` written by block b's kernel, read by the finish), the
    /// layernorm/rmsnorm/bias partial sums (every chunk's row stored, then folded), and
    /// the attention products workspace (each batch of matrices written by a product
    /// with beta 0, which cuBLAS never reads, before the softmax backward reads it).
    fn scratch<'s, T: Element>(
        &self,
        stream: &'s CudaStreamRef,
        len: usize,
        name: &str,
    ) -> Result<Scratch<'s>> {
        let bytes = len * T::DTYPE.size_bytes();
        let block = Block::uninit(&self.pool, bytes, name, &|| self.settle())?;
        Ok(Scratch {
            block,
            stream: &stream.inner,
        })
    }

    fn bind(&self) -> Result<()> {
        Ok(self.ctx.bind_to_thread()?)
    }

    /// Before the host blocks on the device: wait for the started host work, release
    /// its streams, and report the first failure among it (`staged.rs`). Nothing to do
    /// (the host waiting where work starts, the default) costs one look.
    pub(crate) fn settle(&self) -> Result<()> {
        if self.staged.idle() {
            return Ok(());
        }
        let settled = self.staged.settle();
        // Nothing waits for the word now: let go of what finished uploads held (an
        // upload always follows started work, so `upload_from_staging` rarely can).
        self.staged_uploads
            .borrow_mut()
            .retain(|(done, _)| !done.is_complete());
        settled
    }

    /// A product (or a strided batch of them) through cuBLASLt at the device's matmul
    /// precision, loading cuBLASLt at the first. The callers checked the operands.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        &self,
        stream: &Arc<CudaStream>,
        alpha: f32,
        beta: f32,
        a: (CUdeviceptr, MatLayout),
        b: (CUdeviceptr, MatLayout),
        c: (CUdeviceptr, MatLayout),
        batch: Batch,
    ) -> Result<()> {
        self.bind()?;
        let mut blas = self.blas.borrow_mut();
        if blas.is_none() {
            *blas = Some(super::blas::Blas::new(&self.pool, &|| self.settle())?);
        }
        let Some(blas) = blas.as_ref() else {
            return Err(KernelError::Cuda("cuBLASLt did not load".into()));
        };
        let note_wait = |waiter, origin| self.staged.note_wait(waiter, origin);
        blas.gemm(
            stream,
            &note_wait,
            self.precision.get(),
            alpha,
            beta,
            a,
            b,
            c,
            batch,
        )
    }

    /// The rotary kernels' cos/sin table of `shape` in a temporary, uploaded on `stream`
    /// (from the host's copy, which lives as long as the device, so the asynchronous copy
    /// never reads freed memory).
    fn rope_table_on<'s>(
        &self,
        stream: &'s CudaStreamRef,
        shape: &RopeShape,
    ) -> Result<Scratch<'s>> {
        let host = self.rope_table(shape);
        let table = self.scratch::<f32>(stream, host.len(), "rope cos/sin table")?;
        if !host.is_empty() {
            // A copy from pageable memory may block the host until its stream has
            // reached it, and the stream may wait for started host work: settle first.
            self.settle()?;
            self.bind()?;
            // SAFETY: the temporary holds host.len() f32; the host table is kept in the
            // device's cache, never changed or freed while the device lives.
            unsafe {
                result::memcpy_htod_async(table.ptr(), host.as_slice(), stream.inner.cu_stream())
            }?;
        }
        Ok(table)
    }
}

/// A temporary block (not zeroed) released after the work queued on its stream so far.
struct Scratch<'a> {
    block: Block,
    stream: &'a Arc<CudaStream>,
}

impl Scratch<'_> {
    fn ptr(&self) -> CUdeviceptr {
        self.block.ptr
    }
    /// Hand the block back, reusable after the work queued on the stream until now.
    fn done(self) -> Result<()> {
        let ev = self.stream.record_event(None)?;
        self.block.release_after(Arc::new(ev));
        Ok(())
    }
}

impl Device for CudaDevice {
    type Buf<T: Element> = CudaBuf<T>;
    type Stream = CudaStreamRef;
    type Event = CudaEventRef;

    fn set_bf16_products(&self, on: bool) -> bool {
        self.set_matmul_precision(if on {
            MatmulPrecision::Bf16
        } else {
            MatmulPrecision::F32
        });
        true
    }

    fn describe(&self) -> String {
        let name = self.ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let cc = self
            .ctx
            .compute_capability()
            .map(|(a, b)| format!("sm_{a}{b}"))
            .unwrap_or_default();
        let precision = match self.precision.get() {
            MatmulPrecision::F32 => "fp32 matmul",
            MatmulPrecision::Bf16 => "bf16 matmul",
        };
        let attention = self.attention.get().description();
        let staged = match self.staged.mode() {
            StagedOverlap::Wait => "",
            StagedOverlap::Overlap => ", staged collectives overlap",
        };
        format!(
            "cuda:{} ({name}, {cc}, {precision}{attention}{staged})",
            self.ctx.ordinal()
        )
    }

    fn location(&self) -> Location {
        Location::Cuda(self.ctx.ordinal())
    }

    fn alloc<T: Element>(&self, len: usize, name: &str) -> Result<CudaBuf<T>> {
        let bytes = len
            .checked_mul(T::DTYPE.size_bytes())
            .ok_or_else(|| KernelError::Alloc {
                name: name.to_string(),
                bytes: len as u128 * T::DTYPE.size_bytes() as u128,
            })?;
        let block = Block::new(&self.pool, bytes, name, &|| self.settle())?;
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        Ok(CudaBuf {
            block: Arc::new(block),
            len,
            name: Arc::from(name),
            id,
            ordinal: self.ctx.ordinal(),
            _elem: PhantomData,
        })
    }

    fn stream(&self, name: &str) -> Result<CudaStreamRef> {
        Ok(CudaStreamRef {
            inner: self.ctx.new_stream()?,
            name: Arc::from(name),
        })
    }

    fn record(&self, stream: &CudaStreamRef) -> Result<CudaEventRef> {
        Ok(CudaEventRef(
            Arc::new(stream.inner.record_event(None)?),
            stream.inner.cu_stream() as u64,
        ))
    }

    fn wait_event(&self, stream: &CudaStreamRef, event: &CudaEventRef) -> Result<()> {
        self.staged
            .note_wait(stream.inner.cu_stream() as u64, event.1);
        Ok(stream.inner.wait(&event.0)?)
    }

    fn sync_event(&self, event: &CudaEventRef) -> Result<()> {
        self.settle()?;
        Ok(event.0.synchronize()?)
    }

    fn synchronize(&self) -> Result<()> {
        self.settle()?;
        self.ctx.synchronize()?;
        self.pool.after_synchronize();
        self.staged_uploads.borrow_mut().clear();
        Ok(())
    }

    fn native_stream(&self, stream: &CudaStreamRef) -> Option<u64> {
        Some(stream.inner.cu_stream() as u64)
    }

    fn host_task<R>(
        &self,
        stream: &CudaStreamRef,
        name: &'static str,
        _reads: &[Access<'_>],
        _writes: &[Access<'_>],
        task: impl FnOnce() -> R,
    ) -> Result<R> {
        let _timed = self.begin_op(name, &stream.inner);
        // The work queued before has run when the stream is idle; the work queued after
        // is queued after `task` returns. That is the host task's whole contract.
        self.settle()?;
        stream.inner.synchronize()?;
        Ok(task())
    }

    fn host_task_started(
        &self,
        stream: &CudaStreamRef,
        name: &'static str,
        _reads: &[Access<'_>],
        _writes: &[Access<'_>],
        mut retain: Vec<Retained>,
        start: impl FnOnce() -> Result<Box<dyn HostWork>>,
    ) -> Result<()> {
        let _timed = self.begin_op(name, &stream.inner);
        // Starts after the work queued before it, as a host task does.
        self.settle()?;
        stream.inner.synchronize()?;
        let t0 = Instant::now();
        let mut work = start()?;
        if self.staged.overlapping() {
            let issued = t0.elapsed().as_secs_f64();
            match self
                .staged
                .leave_running(&self.ctx, &stream.inner, name, work, retain, issued)
            {
                Ok(()) => return Ok(()),
                Err(refused) => {
                    log::warn!(
                        "CUDA device: could not queue a stream wait for host-staged work ({}); this device waits for each host-staged collective where it starts from now on",
                        refused.error
                    );
                    (work, retain) = (refused.work, refused.retain);
                }
            }
        }
        if let Err(e) = work.wait() {
            // The transport may still hold the addresses: never free them.
            std::mem::forget((work, retain));
            return Err(e);
        }
        Ok(())
    }

    /// Started host work's time with overlap on: exposed is what held the host (the
    /// start calls, and waiting for the work in a settle), total from each start until
    /// the host saw the work finished. The host's view: a stream may also have stalled on
    /// the word, which this does not count. With the host waiting where work starts,
    /// nothing is counted (the GPU runs what was queued meanwhile, so the host's wait is
    /// not the GPU's), as before the overlap existed.
    fn overlap_stats(&self) -> OverlapStats {
        self.staged.stats()
    }

    fn upload<T: Element>(
        &self,
        stream: &CudaStreamRef,
        src: &[T],
        dst: DViewMut<'_, Self, T>,
    ) -> Result<()> {
        let _timed = self.begin_op("upload", &stream.inner);
        same_len("upload", "dst", dst.len(), src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        // A copy from pageable memory may block the host until its stream has reached
        // it, and the stream may wait for started host work: settle first.
        self.settle()?;
        self.bind()?;
        // SAFETY: dst holds src.len() elements. From pageable memory the driver copies
        // `src` to a staging buffer before returning, so it may be reused at once.
        unsafe { result::memcpy_htod_async(addr_mut(&dst), src, stream.inner.cu_stream()) }?;
        Ok(())
    }

    fn alloc_staging(&self, bytes: usize) -> Result<StagingMemory> {
        let words = bytes.div_ceil(8).max(1);
        // Allocating page-locked memory may synchronise the device.
        self.settle()?;
        self.bind()?;
        // Page-locked, and portable: usable by every context of the process.
        // SAFETY: a fresh allocation of `words * 8` bytes, zeroed before it is handed out
        // and freed only by `PinnedHost`'s Drop.
        let ptr =
            unsafe { result::malloc_host(words * 8, sys::CU_MEMHOSTALLOC_PORTABLE) }? as *mut u64;
        unsafe { std::ptr::write_bytes(ptr, 0, words) };
        let owner = PinnedHost {
            ctx: Arc::clone(&self.ctx),
            ptr,
        };
        // SAFETY: as above; `owner` frees it when the memory is dropped.
        Ok(unsafe { StagingMemory::from_device(ptr, words, true, Box::new(owner)) })
    }

    unsafe fn upload_from_staging<T: Element>(
        &self,
        stream: &CudaStreamRef,
        src: *const T,
        dst: DViewMut<'_, Self, T>,
        keep: Retained,
    ) -> Result<()> {
        let _timed = self.begin_op("upload_from_staging", &stream.inner);
        let bytes = dst.len() * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // Release what copies that have run held (not while a stream waits for started
        // work: freeing page-locked memory synchronises the device), then hold `keep`
        // until this one has.
        if !self.staged.busy() {
            self.staged_uploads
                .borrow_mut()
                .retain(|(done, _)| !done.is_complete());
        }
        // SAFETY: dst holds `bytes`; the caller keeps `src` valid and unwritten until the
        // copy has run, and `keep` (held below until the event after it completes) keeps
        // it allocated. From page-locked memory the copy is a DMA the stream runs later.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                addr_mut(&dst),
                src as *const std::ffi::c_void,
                bytes,
                stream.inner.cu_stream(),
            )
        }
        .result()?;
        let after = stream.inner.record_event(None)?;
        self.staged_uploads.borrow_mut().push((after, keep));
        Ok(())
    }

    fn download<T: Element>(
        &self,
        stream: &CudaStreamRef,
        src: DView<'_, Self, T>,
        dst: &mut [T],
    ) -> Result<()> {
        let _timed = self.begin_op("download", &stream.inner);
        same_len("download", "dst", dst.len(), src.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.settle()?;
        // SAFETY: src holds dst.len() elements; the host waits below before reading dst.
        unsafe { result::memcpy_dtoh_async(dst, addr(&src), stream.inner.cu_stream()) }?;
        Ok(stream.inner.synchronize()?)
    }

    fn fill<T: Element>(
        &self,
        stream: &CudaStreamRef,
        dst: DViewMut<'_, Self, T>,
        value: T,
    ) -> Result<()> {
        let _timed = self.begin_op("fill", &stream.inner);
        let n = dst.len();
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let (ptr, s) = (addr_mut(&dst), stream.inner.cu_stream());
        let bytes = bytemuck::bytes_of(&value);
        // SAFETY (all arms): dst holds n elements of bytes.len() bytes each.
        match *bytes {
            [b] => unsafe { result::memset_d8_async(ptr, b, n, s) }?,
            [a, b] => {
                unsafe { sys::cuMemsetD16Async(ptr, u16::from_ne_bytes([a, b]), n, s).result() }?
            }
            [a, b, c, d] => unsafe {
                sys::cuMemsetD32Async(ptr, u32::from_ne_bytes([a, b, c, d]), n, s).result()
            }?,
            _ if bytes[..4] == bytes[4..] => unsafe {
                let word = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                sys::cuMemsetD32Async(ptr, word, 2 * n, s).result()
            }?,
            _ => {
                // An 8-byte pattern with unequal halves (rare: f64/i64 constants).
                let host = vec![value; n];
                self.upload(stream, &host, dst)?;
                self.settle()?;
                return stream.inner.synchronize().map_err(Into::into);
            }
        }
        Ok(())
    }

    fn copy<T: Element>(
        &self,
        stream: &CudaStreamRef,
        src: DView<'_, Self, T>,
        dst: DViewMut<'_, Self, T>,
    ) -> Result<()> {
        let _timed = self.begin_op("copy", &stream.inner);
        same_len("copy", "dst", dst.len(), src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let bytes = src.len() * T::DTYPE.size_bytes();
        // SAFETY: both views hold `bytes`; a write view never overlaps a read view.
        unsafe {
            result::memcpy_dtod_async(addr_mut(&dst), addr(&src), bytes, stream.inner.cu_stream())
        }?;
        Ok(())
    }

    fn cast<S: Float, T: Float>(
        &self,
        stream: &CudaStreamRef,
        src: DView<'_, Self, S>,
        dst: DViewMut<'_, Self, T>,
    ) -> Result<()> {
        let _timed = self.begin_op("cast", &stream.inner);
        same_len("cast", "dst", dst.len(), src.len())?;
        if S::DTYPE == T::DTYPE {
            let bytes = src.len() * S::DTYPE.size_bytes();
            if bytes > 0 {
                self.bind()?;
                // SAFETY: as in `copy` (same element size).
                unsafe {
                    result::memcpy_dtod_async(
                        addr_mut(&dst),
                        addr(&src),
                        bytes,
                        stream.inner.cu_stream(),
                    )
                }?;
            }
            return Ok(());
        }
        let entry = match (S::DTYPE, T::DTYPE) {
            (DType::F32, half @ (DType::BF16 | DType::F16)) => cast_entry(true, half),
            (half @ (DType::BF16 | DType::F16), DType::F32) => cast_entry(false, half),
            (s, t) => {
                return Err(unsupported(
                    "cast",
                    format!("{s} to {t} has no GPU kernel (go through f32)"),
                ))
            }
        };
        crate::cast::cuda::launch2_on(
            self,
            &stream.inner,
            &entry,
            addr(&src),
            addr_mut(&dst),
            src.len(),
        )
    }

    fn accumulate<S: Float, T: Float>(
        &self,
        stream: &CudaStreamRef,
        dst: DViewMut<'_, Self, T>,
        src: DView<'_, Self, S>,
    ) -> Result<()> {
        let _timed = self.begin_op("accumulate", &stream.inner);
        same_len("accumulate", "src", src.len(), dst.len())?;
        float_kernel("accumulate", &[T::DTYPE, S::DTYPE])?;
        crate::cast::cuda::launch2_on(
            self,
            &stream.inner,
            &accumulate_entry(T::DTYPE, S::DTYPE),
            addr_mut(&dst),
            addr(&src),
            src.len(),
        )
    }

    fn quantize_int8<T: Float>(
        &self,
        stream: &CudaStreamRef,
        src: DView<'_, Self, T>,
        block: usize,
        codes: DViewMut<'_, Self, u8>,
        scales: DViewMut<'_, Self, f32>,
    ) -> Result<()> {
        let _timed = self.begin_op("quantize_int8", &stream.inner);
        let n = src.len();
        crate::quant::check_lengths(n, block, codes.len(), scales.len())?;
        let entry = quant_kernel("quantize_int8", quant_entry, true, T::DTYPE)?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let f = self.kernel(&entry)?;
        let (x, q, s) = (addr(&src), addr_mut(&codes), addr_mut(&scales));
        let (n64, b64) = (n as u64, block as u64);
        let mut l = stream.inner.launch_builder(f);
        l.arg(&x).arg(&q).arg(&s).arg(&n64).arg(&b64);
        // One thread block per quantization block (grid-stride beyond the cap).
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(block).min(1 << 16) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: quantize_{f32,bf16}(const T*, i8*, float*, u64 n, u64 block) in
        // quant.cu; the views hold n values, n codes and n / block (rounded up) scales.
        unsafe { l.launch(cfg) }?;
        Ok(())
    }

    fn dequantize_int8<T: Float>(
        &self,
        stream: &CudaStreamRef,
        codes: DView<'_, Self, u8>,
        scales: DView<'_, Self, f32>,
        block: usize,
        dst: DViewMut<'_, Self, T>,
    ) -> Result<()> {
        let _timed = self.begin_op("dequantize_int8", &stream.inner);
        let n = dst.len();
        crate::quant::check_lengths(n, block, codes.len(), scales.len())?;
        let entry = quant_kernel("dequantize_int8", quant_entry, false, T::DTYPE)?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let f = self.kernel(&entry)?;
        let (q, s, out) = (addr(&codes), addr(&scales), addr_mut(&dst));
        let (n64, b64) = (n as u64, block as u64);
        let mut l = stream.inner.launch_builder(f);
        l.arg(&q).arg(&s).arg(&out).arg(&n64).arg(&b64);
        // SAFETY: dequantize_{f32,bf16}(const i8*, const float*, T*, u64 n, u64 block) in
        // quant.cu; lengths checked above.
        unsafe { l.launch(CudaDevice::elementwise(n)) }?;
        Ok(())
    }

    fn quantize_int4<T: Float>(
        &self,
        stream: &CudaStreamRef,
        src: DView<'_, Self, T>,
        block: usize,
        codes: DViewMut<'_, Self, u8>,
        scales: DViewMut<'_, Self, f32>,
    ) -> Result<()> {
        let _timed = self.begin_op("quantize_int4", &stream.inner);
        let n = src.len();
        crate::quant::check_lengths_int4(n, block, codes.len(), scales.len())?;
        let entry = quant_kernel("quantize_int4", quant4_entry, true, T::DTYPE)?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let f = self.kernel(&entry)?;
        let (x, c, s) = (addr(&src), addr_mut(&codes), addr_mut(&scales));
        let (n64, b64) = (n as u64, block as u64);
        let mut l = stream.inner.launch_builder(f);
        l.arg(&x).arg(&c).arg(&s).arg(&n64).arg(&b64);
        // One thread block of twin::quant::THREADS per quantization block (grid-stride
        // beyond the cap), as the twin assumes.
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(block).min(1 << 16) as u32, 1, 1),
            block_dim: (crate::twin::quant::THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: quantize_int4_{f32,bf16}(const T*, u8*, float*, u64 n, u64 block) in
        // quant.cu; the views hold n values, ceil(n / 2) code bytes and ceil(n / block)
        // scales, and the block is even (checked above).
        unsafe { l.launch(cfg) }?;
        Ok(())
    }

    fn dequantize_int4<T: Float>(
        &self,
        stream: &CudaStreamRef,
        codes: DView<'_, Self, u8>,
        scales: DView<'_, Self, f32>,
        block: usize,
        dst: DViewMut<'_, Self, T>,
    ) -> Result<()> {
        let _timed = self.begin_op("dequantize_int4", &stream.inner);
        let n = dst.len();
        crate::quant::check_lengths_int4(n, block, codes.len(), scales.len())?;
        let entry = quant_kernel("dequantize_int4", quant4_entry, false, T::DTYPE)?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let f = self.kernel(&entry)?;
        let (c, s, out) = (addr(&codes), addr(&scales), addr_mut(&dst));
        let (n64, b64) = (n as u64, block as u64);
        let mut l = stream.inner.launch_builder(f);
        l.arg(&c).arg(&s).arg(&out).arg(&n64).arg(&b64);
        // SAFETY: dequantize_int4_{f32,bf16}(const u8*, const float*, T*, u64 n, u64 block)
        // in quant.cu; lengths checked above.
        unsafe { l.launch(CudaDevice::elementwise(n)) }?;
        Ok(())
    }

    fn grad_stats<G: Float>(
        &self,
        stream: &CudaStreamRef,
        grad: DView<'_, Self, G>,
        scale: f32,
        out: DViewMut<'_, Self, f64>,
    ) -> Result<()> {
        let _timed = self.begin_op("grad_stats", &stream.inner);
        same_len("grad_stats", "out", out.len(), 2)?;
        float_kernel("grad_stats", &[G::DTYPE])?;
        let n = grad.len();
        let sums = self.scratch::<f64>(
            stream,
            crate::gradstats::cuda::sums_len(n),
            "grad_stats block sums",
        )?;
        crate::gradstats::cuda::stats_on(
            self,
            &stream.inner,
            G::DTYPE,
            addr(&grad),
            n,
            scale,
            sums.ptr(),
            addr_mut(&out),
        )?;
        sums.done()
    }

    fn adamw<G: Float, P: Float>(
        &self,
        stream: &CudaStreamRef,
        step: &AdamWStep<'_>,
        grad: DView<'_, Self, G>,
        state: AdamWViews<'_, Self>,
        param: Option<DViewMut<'_, Self, P>>,
    ) -> Result<()> {
        let _timed = self.begin_op("adamw", &stream.inner);
        let n = grad.len();
        check::adamw(
            n,
            state.master.len(),
            state.m.len(),
            state.v.len(),
            param.as_ref().map(|p| (p.len(), P::DTYPE)),
        )?;
        adamw::check_segments(step.segments, step.groups.len(), n)?;
        float_kernel("adamw", &[G::DTYPE])?;
        if param.is_some() {
            float_kernel("adamw", &[P::DTYPE])?;
        }
        let elem = |base: CUdeviceptr, size: usize, at: usize| base + (at * size) as u64;
        let (g0, p0, m0, v0) = (
            addr(&grad),
            addr_mut(&state.master),
            addr_mut(&state.m),
            addr_mut(&state.v),
        );
        let out0 = param.as_ref().map(addr_mut);
        let half = param.as_ref().map(|_| P::DTYPE);
        // Every segment's constants first, as the CPU step does: a group whose values fail
        // (in f64 or once rounded to f32) then refuses the step before any launch.
        let coeffs = step
            .segments
            .iter()
            .map(|s| AdamWCoeffs::new(&step.groups[s.group], step.t, step.grad_scale, s.decay))
            .collect::<Result<Vec<_>>>()?;
        for (s, c) in step.segments.iter().zip(&coeffs) {
            let at = s.range.start;
            let ptrs = AdamWPtrs {
                grad: elem(g0, G::DTYPE.size_bytes(), at),
                master: elem(p0, 4, at),
                m: elem(m0, 4, at),
                v: elem(v0, 4, at),
                // A null copy pointer selects nothing: the `_none` kernels never touch it.
                param: out0.map_or(0, |o| elem(o, P::DTYPE.size_bytes(), at)),
            };
            adamw::cuda::launch_raw(
                self,
                &stream.inner,
                c,
                (G::DTYPE, half),
                ptrs,
                s.range.len(),
            )?;
        }
        Ok(())
    }

    fn matmul<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        mm: MatMul<F>,
        a: DView<'_, Self, F>,
        b: DView<'_, Self, F>,
        c: DViewMut<'_, Self, F>,
    ) -> Result<()> {
        let _timed = self.begin_op("matmul", &stream.inner);
        f32_only::<F>("matmul")?;
        check::matmul(&mm, a.len(), b.len(), c.len())?;
        self.gemm(
            &stream.inner,
            mm.alpha.to_f64() as f32,
            mm.beta.to_f64() as f32,
            (addr(&a), mm.a),
            (addr(&b), mm.b),
            (addr_mut(&c), mm.c),
            Batch::ONE,
        )
    }

    fn layernorm_forward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        out: LayerNormOut<'_, Self, F>,
        x: DView<'_, Self, F>,
        w: DView<'_, Self, F>,
        b: DView<'_, Self, F>,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("layernorm_forward", &stream.inner);
        f32_only::<F>("layernorm_forward")?;
        let rows = check::layernorm_forward(
            x.len(),
            out.out.len(),
            w.len(),
            b.len(),
            out.mean.len(),
            out.rstd.len(),
            width,
        )?;
        launch::norm::layernorm_forward(
            self,
            &stream.inner,
            addr_mut(&out.out),
            addr_mut(&out.mean),
            addr_mut(&out.rstd),
            addr(&x),
            addr(&w),
            addr(&b),
            rows,
            width,
        )
    }

    fn layernorm_backward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        grads: LayerNormGrads<'_, Self, F>,
        dout: DView<'_, Self, F>,
        saved: LayerNormSaved<'_, Self, F>,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("layernorm_backward", &stream.inner);
        f32_only::<F>("layernorm_backward")?;
        let rows = check::layernorm_backward(
            dout.len(),
            grads.dx.len(),
            saved.x.len(),
            grads.dw.len(),
            grads.db.len(),
            saved.w.len(),
            saved.mean.len(),
            saved.rstd.len(),
            width,
        )?;
        let scratch = self.scratch::<f32>(
            stream,
            launch::norm::layernorm_backward_scratch_len(rows, width),
            "layernorm_backward partial sums",
        )?;
        launch::norm::layernorm_backward(
            self,
            &stream.inner,
            addr_mut(&grads.dx),
            addr_mut(&grads.dw),
            addr_mut(&grads.db),
            scratch.ptr(),
            addr(&dout),
            addr(&saved.x),
            addr(&saved.w),
            addr(&saved.mean),
            addr(&saved.rstd),
            rows,
            width,
        )?;
        scratch.done()
    }

    // Llama's ops (`src/nn/cuda/llama.cu`, launchers in `nn/llama.rs`).

    fn rmsnorm_forward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        out: DViewMut<'_, Self, F>,
        rstd: DViewMut<'_, Self, F>,
        x: DView<'_, Self, F>,
        w: DView<'_, Self, F>,
        width: usize,
        eps: f64,
    ) -> Result<()> {
        let _timed = self.begin_op("rmsnorm_forward", &stream.inner);
        f32_only::<F>("rmsnorm_forward")?;
        let rows = check::rmsnorm_forward(x.len(), out.len(), w.len(), rstd.len(), width)?;
        launch::llama::rmsnorm_forward(
            self,
            &stream.inner,
            addr_mut(&out),
            addr_mut(&rstd),
            addr(&x),
            addr(&w),
            rows,
            width,
            eps,
        )
    }

    fn rmsnorm_backward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        dx: DViewMut<'_, Self, F>,
        dw: DViewMut<'_, Self, F>,
        dout: DView<'_, Self, F>,
        x: DView<'_, Self, F>,
        w: DView<'_, Self, F>,
        rstd: DView<'_, Self, F>,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("rmsnorm_backward", &stream.inner);
        f32_only::<F>("rmsnorm_backward")?;
        let rows = check::rmsnorm_backward(
            dout.len(),
            dx.len(),
            x.len(),
            dw.len(),
            w.len(),
            rstd.len(),
            width,
        )?;
        let scratch = self.scratch::<f32>(
            stream,
            launch::llama::rmsnorm_backward_scratch_len(rows, width),
            "rmsnorm_backward partial sums",
        )?;
        launch::llama::rmsnorm_backward(
            self,
            &stream.inner,
            addr_mut(&dx),
            addr_mut(&dw),
            scratch.ptr(),
            addr(&dout),
            addr(&x),
            addr(&w),
            addr(&rstd),
            rows,
            width,
        )?;
        scratch.done()
    }

    fn rope_gqa_forward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        qkv: DViewMut<'_, Self, F>,
        q: DView<'_, Self, F>,
        k: DView<'_, Self, F>,
        v: DView<'_, Self, F>,
        shape: RopeShape,
    ) -> Result<()> {
        let _timed = self.begin_op("rope_gqa_forward", &stream.inner);
        let name = "rope_gqa_forward";
        f32_only::<F>(name)?;
        check::rope_gqa(name, qkv.len(), q.len(), k.len(), v.len(), &shape)?;
        let table = self.rope_table_on(stream, &shape)?;
        launch::llama::rope_gqa_forward(
            self,
            &stream.inner,
            addr_mut(&qkv),
            addr(&q),
            addr(&k),
            addr(&v),
            table.ptr(),
            shape,
        )?;
        table.done()
    }

    fn rope_gqa_backward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        dq: DViewMut<'_, Self, F>,
        dk: DViewMut<'_, Self, F>,
        dv: DViewMut<'_, Self, F>,
        dqkv: DView<'_, Self, F>,
        shape: RopeShape,
    ) -> Result<()> {
        let _timed = self.begin_op("rope_gqa_backward", &stream.inner);
        let name = "rope_gqa_backward";
        f32_only::<F>(name)?;
        check::rope_gqa(name, dqkv.len(), dq.len(), dk.len(), dv.len(), &shape)?;
        let table = self.rope_table_on(stream, &shape)?;
        launch::llama::rope_gqa_backward(
            self,
            &stream.inner,
            addr_mut(&dq),
            addr_mut(&dk),
            addr_mut(&dv),
            addr(&dqkv),
            table.ptr(),
            shape,
        )?;
        table.done()
    }

    fn swiglu_forward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        out: DViewMut<'_, Self, F>,
        a: DView<'_, Self, F>,
        b: DView<'_, Self, F>,
    ) -> Result<()> {
        let _timed = self.begin_op("swiglu_forward", &stream.inner);
        f32_only::<F>("swiglu_forward")?;
        same_len("swiglu_forward", "a", a.len(), out.len())?;
        same_len("swiglu_forward", "b", b.len(), out.len())?;
        launch::llama::swiglu_forward(
            self,
            &stream.inner,
            addr_mut(&out),
            addr(&a),
            addr(&b),
            out.len(),
        )
    }

    fn swiglu_backward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        da: DViewMut<'_, Self, F>,
        db: DViewMut<'_, Self, F>,
        dout: DView<'_, Self, F>,
        a: DView<'_, Self, F>,
        b: DView<'_, Self, F>,
    ) -> Result<()> {
        let _timed = self.begin_op("swiglu_backward", &stream.inner);
        let name = "swiglu_backward";
        f32_only::<F>(name)?;
        for (what, len) in [
            ("db", db.len()),
            ("dout", dout.len()),
            ("a", a.len()),
            ("b", b.len()),
        ] {
            same_len(name, what, len, da.len())?;
        }
        launch::llama::swiglu_backward(
            self,
            &stream.inner,
            addr_mut(&da),
            addr_mut(&db),
            addr(&dout),
            addr(&a),
            addr(&b),
            da.len(),
        )
    }

    fn gelu_forward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        out: DViewMut<'_, Self, F>,
        x: DView<'_, Self, F>,
    ) -> Result<()> {
        let _timed = self.begin_op("gelu_forward", &stream.inner);
        f32_only::<F>("gelu_forward")?;
        same_len("gelu_forward", "out", out.len(), x.len())?;
        launch::elementwise::gelu_forward(self, &stream.inner, addr_mut(&out), addr(&x), x.len())
    }

    fn gelu_backward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        d: DViewMut<'_, Self, F>,
        x: DView<'_, Self, F>,
    ) -> Result<()> {
        let _timed = self.begin_op("gelu_backward", &stream.inner);
        f32_only::<F>("gelu_backward")?;
        same_len("gelu_backward", "d", d.len(), x.len())?;
        launch::elementwise::gelu_backward(self, &stream.inner, addr_mut(&d), addr(&x), x.len())
    }

    fn attention_forward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        y: DViewMut<'_, Self, F>,
        p: DViewMut<'_, Self, F>,
        qkv: DView<'_, Self, F>,
        shape: AttnShape,
    ) -> Result<()> {
        let _timed = self.begin_op("attention_forward", &stream.inner);
        f32_only::<F>("attention_forward")?;
        check::attention_forward(y.len(), p.len(), qkv.len(), &shape)?;
        if self.attention.get() == AttentionKernels::Products {
            let bufs = launch::attention::PlanBufs::default()
                .with(Buf::Qkv, addr(&qkv), qkv.len())
                .with(Buf::Y, addr_mut(&y), y.len())
                .with(Buf::P, addr_mut(&p), p.len());
            let steps = products::plan_forward(shape);
            let op = "attention_forward";
            return launch::attention::run_products(
                self,
                &stream.inner,
                op,
                &steps,
                &bufs,
                shape.t,
            );
        }
        launch::attention::attention_forward(
            self,
            &stream.inner,
            addr_mut(&y),
            addr_mut(&p),
            addr(&qkv),
            shape,
        )
    }

    fn attention_backward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        dqkv: DViewMut<'_, Self, F>,
        scratch: DViewMut<'_, Self, F>,
        dy: DView<'_, Self, F>,
        p: DView<'_, Self, F>,
        qkv: DView<'_, Self, F>,
        shape: AttnShape,
    ) -> Result<()> {
        let _timed = self.begin_op("attention_backward", &stream.inner);
        f32_only::<F>("attention_backward")?;
        check::attention_backward(
            dqkv.len(),
            scratch.len(),
            dy.len(),
            p.len(),
            qkv.len(),
            &shape,
        )?;
        if self.attention.get() == AttentionKernels::Products {
            let op = "attention_backward";
            let mats = products::work_mats(shape, products::WORK_BYTES);
            let work =
                self.scratch::<f32>(stream, mats * shape.t * shape.t, "attention workspace")?;
            let bufs = launch::attention::PlanBufs::default()
                .with(Buf::Qkv, addr(&qkv), qkv.len())
                .with(Buf::P, addr(&p), p.len())
                .with(Buf::Dy, addr(&dy), dy.len())
                .with(Buf::Dqkv, addr_mut(&dqkv), dqkv.len())
                .with(Buf::Work, work.ptr(), mats * shape.t * shape.t);
            let steps = products::plan_backward(shape, mats);
            let run =
                launch::attention::run_products(self, &stream.inner, op, &steps, &bufs, shape.t);
            // The workspace goes back to the pool after what was queued, even on an error
            // (which is the one to report).
            let done = work.done();
            run?;
            return done;
        }
        launch::attention::attention_backward(
            self,
            &stream.inner,
            addr_mut(&dqkv),
            addr_mut(&scratch),
            addr(&dy),
            addr(&p),
            addr(&qkv),
            shape,
        )
    }

    fn softmax_xent_forward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        logits: DViewMut<'_, Self, F>,
        losses: DViewMut<'_, Self, F>,
        targets: DView<'_, Self, u32>,
        v: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("softmax_xent_forward", &stream.inner);
        let op = "softmax_xent_forward";
        f32_only::<F>(op)?;
        let rows = check::softmax_xent(op, logits.len(), Some(losses.len()), targets.len(), v)?;
        launch::xent::softmax_xent_forward(
            self,
            &stream.inner,
            addr_mut(&logits),
            addr_mut(&losses),
            addr(&targets),
            rows,
            v,
        )
    }

    fn softmax_xent_backward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        probs: DViewMut<'_, Self, F>,
        targets: DView<'_, Self, u32>,
        v: usize,
        scale: F,
    ) -> Result<()> {
        let _timed = self.begin_op("softmax_xent_backward", &stream.inner);
        let op = "softmax_xent_backward";
        f32_only::<F>(op)?;
        let rows = check::softmax_xent(op, probs.len(), None, targets.len(), v)?;
        launch::xent::softmax_xent_backward(
            self,
            &stream.inner,
            addr_mut(&probs),
            addr(&targets),
            rows,
            v,
            scale.to_f64() as f32,
        )
    }

    fn mean<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        dst: DViewMut<'_, Self, F>,
        src: DView<'_, Self, F>,
    ) -> Result<()> {
        let _timed = self.begin_op("mean", &stream.inner);
        f32_only::<F>("mean")?;
        check::mean(dst.len(), src.len())?;
        launch::xent::mean(self, &stream.inner, addr_mut(&dst), addr(&src), src.len())
    }

    fn fill_rows<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        out: DViewMut<'_, Self, F>,
        row: DView<'_, Self, F>,
    ) -> Result<()> {
        let _timed = self.begin_op("fill_rows", &stream.inner);
        f32_only::<F>("fill_rows")?;
        let rows = check::rows_of("fill_rows", "out", out.len(), row.len())?;
        launch::rows::fill_rows(
            self,
            &stream.inner,
            addr_mut(&out),
            addr(&row),
            rows,
            row.len(),
        )
    }

    fn add_rows<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        out: DViewMut<'_, Self, F>,
        row: DView<'_, Self, F>,
    ) -> Result<()> {
        let _timed = self.begin_op("add_rows", &stream.inner);
        f32_only::<F>("add_rows")?;
        let rows = check::rows_of("add_rows", "out", out.len(), row.len())?;
        launch::rows::add_rows(
            self,
            &stream.inner,
            addr_mut(&out),
            addr(&row),
            rows,
            row.len(),
        )
    }

    fn bias_backward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        db: DViewMut<'_, Self, F>,
        dout: DView<'_, Self, F>,
    ) -> Result<()> {
        let _timed = self.begin_op("bias_backward", &stream.inner);
        f32_only::<F>("bias_backward")?;
        let rows = check::rows_of("bias_backward", "dout", dout.len(), db.len())?;
        let scratch = self.scratch::<f32>(
            stream,
            launch::rows::bias_backward_scratch_len(rows, db.len()),
            "bias_backward partial sums",
        )?;
        launch::rows::bias_backward(
            self,
            &stream.inner,
            addr_mut(&db),
            scratch.ptr(),
            addr(&dout),
            rows,
            db.len(),
        )?;
        scratch.done()
    }

    fn gather_rows<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        out: DViewMut<'_, Self, F>,
        ids: DView<'_, Self, u32>,
        table: DView<'_, Self, F>,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("gather_rows", &stream.inner);
        let op = "gather_rows";
        f32_only::<F>(op)?;
        let (rows, table_rows) =
            check::lookup(op, "out", out.len(), ids.len(), "table", table.len(), width)?;
        launch::rows::gather_rows(
            self,
            &stream.inner,
            addr_mut(&out),
            addr(&ids),
            addr(&table),
            rows,
            width,
            table_rows,
        )
    }

    fn scatter_add_rows<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        dtable: DViewMut<'_, Self, F>,
        ids: DView<'_, Self, u32>,
        dout: DView<'_, Self, F>,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("scatter_add_rows", &stream.inner);
        let op = "scatter_add_rows";
        f32_only::<F>(op)?;
        let (rows, table_rows) = check::lookup(
            op,
            "dout",
            dout.len(),
            ids.len(),
            "dtable",
            dtable.len(),
            width,
        )?;
        launch::rows::scatter_add_rows(
            self,
            &stream.inner,
            addr_mut(&dtable),
            addr(&ids),
            addr(&dout),
            rows,
            width,
            table_rows,
        )
    }

    fn gather_rows_block<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        out: DViewMut<'_, Self, F>,
        ids: DView<'_, Self, u32>,
        block: DView<'_, Self, F>,
        first: usize,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("gather_rows_block", &stream.inner);
        let op = "gather_rows_block";
        f32_only::<F>(op)?;
        let (rows, block_rows) =
            check::lookup(op, "out", out.len(), ids.len(), "block", block.len(), width)?;
        launch::rows::gather_rows_block(
            self,
            &stream.inner,
            addr_mut(&out),
            addr(&ids),
            addr(&block),
            rows,
            width,
            first,
            block_rows,
        )
    }

    fn scatter_add_rows_block<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        dblock: DViewMut<'_, Self, F>,
        ids: DView<'_, Self, u32>,
        dout: DView<'_, Self, F>,
        first: usize,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("scatter_add_rows_block", &stream.inner);
        let op = "scatter_add_rows_block";
        f32_only::<F>(op)?;
        let (rows, block_rows) = check::lookup(
            op,
            "dout",
            dout.len(),
            ids.len(),
            "dblock",
            dblock.len(),
            width,
        )?;
        launch::rows::scatter_add_rows_block(
            self,
            &stream.inner,
            addr_mut(&dblock),
            addr(&ids),
            addr(&dout),
            rows,
            width,
            first,
            block_rows,
        )
    }

    fn add_periodic_rows<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        out: DViewMut<'_, Self, F>,
        table: DView<'_, Self, F>,
        period: usize,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("add_periodic_rows", &stream.inner);
        let op = "add_periodic_rows";
        f32_only::<F>(op)?;
        let rows = check::periodic(op, "out", out.len(), table.len(), period, width)?;
        launch::rows::add_periodic_rows(
            self,
            &stream.inner,
            addr_mut(&out),
            addr(&table),
            rows,
            width,
            period,
        )
    }

    fn periodic_rows_backward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        dtable: DViewMut<'_, Self, F>,
        dout: DView<'_, Self, F>,
        period: usize,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("periodic_rows_backward", &stream.inner);
        let op = "periodic_rows_backward";
        f32_only::<F>(op)?;
        let rows = check::periodic(op, "dout", dout.len(), dtable.len(), period, width)?;
        launch::rows::periodic_rows_backward(
            self,
            &stream.inner,
            addr_mut(&dtable),
            addr(&dout),
            rows,
            width,
            period,
        )
    }

    fn shift_rows_forward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        out: DViewMut<'_, Self, F>,
        x: DView<'_, Self, F>,
        seq_len: usize,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("shift_rows_forward", &stream.inner);
        let op = "shift_rows_forward";
        f32_only::<F>(op)?;
        let rows = check::shift(op, "x", x.len(), "out", out.len(), seq_len, width)?;
        launch::rows::shift_rows_forward(
            self,
            &stream.inner,
            addr_mut(&out),
            addr(&x),
            rows,
            width,
            seq_len,
        )
    }

    fn shift_rows_backward<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        dx: DViewMut<'_, Self, F>,
        dout: DView<'_, Self, F>,
        seq_len: usize,
        width: usize,
    ) -> Result<()> {
        let _timed = self.begin_op("shift_rows_backward", &stream.inner);
        let op = "shift_rows_backward";
        f32_only::<F>(op)?;
        let rows = check::shift(op, "dout", dout.len(), "dx", dx.len(), seq_len, width)?;
        launch::rows::shift_rows_backward(
            self,
            &stream.inner,
            addr_mut(&dx),
            addr(&dout),
            rows,
            width,
            seq_len,
        )
    }

    fn add<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        dst: DViewMut<'_, Self, F>,
        src: DView<'_, Self, F>,
    ) -> Result<()> {
        let _timed = self.begin_op("add", &stream.inner);
        f32_only::<F>("add")?;
        same_len("add", "src", src.len(), dst.len())?;
        launch::elementwise::add(self, &stream.inner, addr_mut(&dst), addr(&src), src.len())
    }

    fn scale<F: Scalar>(
        &self,
        stream: &CudaStreamRef,
        dst: DViewMut<'_, Self, F>,
        a: F,
    ) -> Result<()> {
        let _timed = self.begin_op("scale", &stream.inner);
        f32_only::<F>("scale")?;
        let n = dst.len();
        launch::elementwise::scale(self, &stream.inner, addr_mut(&dst), a.to_f64() as f32, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptx::{adamw_entry, gradstats_entry, SOURCES};

    #[test]
    fn types_without_a_kernel_are_refused_as_unsupported_not_as_a_missing_kernel() {
        for (op, types) in [
            ("accumulate", vec![DType::F32, DType::F64]),
            ("grad_stats", vec![DType::F64]),
            ("adamw", vec![DType::U8]),
        ] {
            let msg = float_kernel(op, &types)
                .expect_err("no kernel for it")
                .to_string();
            assert!(msg.starts_with(op), "{msg}");
            assert!(msg.contains("no GPU kernel (f32, bf16, f16)"), "{msg}");
        }
    }

    /// What the gate lets through has its kernels in the PTX.
    #[test]
    fn every_type_the_gate_accepts_has_its_kernels() {
        let all: Vec<&str> = SOURCES.iter().flat_map(|s| s.entries()).collect();
        for g in KERNEL_FLOATS {
            float_kernel("accumulate", &[g]).expect("accepted");
            let mut wanted = vec![gradstats_entry(g, false), adamw_entry(g, None)];
            for d in KERNEL_FLOATS {
                wanted.push(accumulate_entry(d, g));
                if d != DType::F32 {
                    wanted.push(adamw_entry(g, Some(d)));
                }
            }
            if g != DType::F32 {
                wanted.push(cast_entry(true, g));
                wanted.push(cast_entry(false, g));
            }
            for w in wanted {
                assert!(all.contains(&w.as_str()), "{w} missing from the PTX");
            }
        }
    }
}
