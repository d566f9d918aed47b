//! What the two CPU devices share: host-memory buffers, stream and event handles, and
//! every op written once as a [`CpuOp`] (a closure over the op's views plus the list of
//! what it reads and writes). [`super::HostDevice`] runs an op when it is queued;
//! [`super::SimDevice`] checks its accesses and queues it. The kernels inside are this
//! crate's CPU kernels, so both devices compute the same bits.
//!
//! Why the raw slices inside an op are sound: a buffer's memory is reachable only
//! through ops (and host transfers) of its device; a device runs one op at a time, on the
//! thread that owns it; and [`OpBuilder::finish`] refuses an op whose write range
//! overlaps any other range it touches in the same buffer, or that has a view not inside
//! its buffer. So while an op runs, its `&mut [T]` is the only reference to those
//! elements, and lies inside their allocation.

use std::cell::Cell;
use std::ops::Range;
use std::rc::Rc;

use super::{
    Access, AdamWStep, AdamWViews, Buffer, Device, HostWork, LayerNormGrads, LayerNormOut,
    LayerNormSaved, Location, MatMul, OverlapStats, Result, Retained, View, ViewMut,
};
use crate::adamw::{self, AdamWHyper, AdamWSegment, AdamWState};
use crate::dtype::{DType, Element};
use crate::error::KernelError;
use crate::float::Float;
use crate::isa::Exec;
use crate::nn::isa_ops as ops;
use crate::nn::{self, AttnShape, Gemm, RopeShape, Scalar};
use crate::par::{channels_per_part, rows_per_part, zip_parts};
use crate::quant;
use crate::simd::run_auto;
use crate::twin;
use crate::twin::attention_products::{self as products, AttentionKernels, Buf, HostBufs};

use super::check::{self, ids_below as check_ids, rows_of, same_len};
use super::populate::populate;
use crate::{cast, gradstats};

/// The host allocation behind a [`CpuBuffer`]: freed when the last handle (the owner's,
/// or a queued op's) goes.
struct Storage<T> {
    id: u64,
    name: Rc<str>,
    ptr: *mut T,
    len: usize,
}

impl<T> Drop for Storage<T> {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from `CpuBuffer::zeroed`: the global allocator with
        // `Layout::array::<T>(len)` (or dangling for a zero-sized one), which is a boxed
        // slice's memory layout.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr, self.len,
            )))
        };
    }
}

/// A buffer in host memory, of [`super::HostDevice`] or [`super::SimDevice`].
pub struct CpuBuffer<T: Element> {
    st: Rc<Storage<T>>,
}

impl<T: Element> std::fmt::Debug for CpuBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CpuBuffer<{}>('{}', {} elements)",
            T::DTYPE,
            self.st.name,
            self.st.len
        )
    }
}

impl<T: Element> CpuBuffer<T> {
    fn zeroed(id: u64, name: &str, len: usize) -> Result<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>());
        if bytes.is_none_or(|b| b > isize::MAX as usize) {
            return Err(KernelError::Alloc {
                name: name.to_string(),
                bytes: len as u128 * std::mem::size_of::<T>() as u128,
            });
        }
        let too_big = || KernelError::Alloc {
            name: name.to_string(),
            bytes: len as u128 * std::mem::size_of::<T>() as u128,
        };
        let layout = std::alloc::Layout::array::<T>(len).map_err(|_| too_big())?;
        let ptr = if layout.size() == 0 {
            std::ptr::NonNull::<T>::dangling().as_ptr()
        } else {
            // Fallible, unlike `vec![0; len]` (which aborts the process): a buffer the
            // host cannot hold is an error the caller reports. Zeroed pages come from the
            // OS, lazily as with `vec!` below 1 MiB, and `alloc` backs larger ones at once
            // (`populate.rs`); zero is a valid bit pattern of every Element (they are Pod).
            // SAFETY: `layout` has a non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
            if p.is_null() {
                return Err(too_big());
            }
            p
        };
        Ok(CpuBuffer {
            st: Rc::new(Storage {
                id,
                name: Rc::from(name),
                ptr,
                len,
            }),
        })
    }
}

impl<T: Element> Buffer for CpuBuffer<T> {
    type Elem = T;
    fn len(&self) -> usize {
        self.st.len
    }
    fn name(&self) -> &str {
        &self.st.name
    }
    fn id(&self) -> u64 {
        self.st.id
    }
    fn location(&self) -> Location {
        Location::Host
    }
    fn raw_ptr(&self) -> *mut T {
        self.st.ptr
    }
    fn retain(&self) -> Option<super::Retained> {
        Some(Box::new(Rc::clone(&self.st)))
    }
}

/// A stream of a CPU device.
#[derive(Clone, Debug)]
pub struct CpuStream {
    pub(crate) index: usize,
    pub(crate) name: Rc<str>,
}

impl CpuStream {
    /// The name it was created with.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// An event of a CPU device: the ops it completes after (stream index, op count) and,
/// on [`super::SimDevice`], the vector clock of that point.
#[derive(Clone, Debug, Default)]
pub struct CpuEvent {
    pub(crate) after: Vec<(usize, u64)>,
    pub(crate) clock: Vec<u64>,
}

/// One range of one buffer an op touches.
#[derive(Clone, Debug)]
pub(crate) struct OpAccess {
    pub(crate) id: u64,
    pub(crate) name: Rc<str>,
    pub(crate) range: Range<usize>,
}

/// A queued unit of work: the kernel and what it touches.
pub struct CpuOp {
    pub(crate) name: &'static str,
    pub(crate) reads: Vec<OpAccess>,
    pub(crate) writes: Vec<OpAccess>,
    pub(crate) run: Box<dyn FnOnce() -> Result<()>>,
}

/// Elements an op reads, held by the op (so the memory outlives the owner's handle).
struct Rd<T> {
    st: Rc<Storage<T>>,
    range: Range<usize>,
}

impl<T> Rd<T> {
    /// # Safety
    /// Only inside the op's run (see the module documentation).
    unsafe fn get(&self) -> &[T] {
        std::slice::from_raw_parts(self.st.ptr.add(self.range.start), self.range.len())
    }
}

/// Elements an op writes.
struct Wr<T> {
    st: Rc<Storage<T>>,
    range: Range<usize>,
}

impl<T> Wr<T> {
    /// # Safety
    /// Only inside the op's run (see the module documentation).
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.st.ptr.add(self.range.start), self.range.len())
    }
}

/// Collects an op's accesses, then checks them and wraps the kernel.
struct OpBuilder {
    name: &'static str,
    reads: Vec<OpAccess>,
    writes: Vec<OpAccess>,
    /// The first view that is not inside its buffer ([`OpBuilder::finish`] refuses it).
    outside: Option<KernelError>,
}

/// An error unless `range` lies inside its storage: what makes `Rd::get`/`Wr::get` and
/// `download`'s slice sound, checked where a view becomes a slice. View constructors
/// already ensure it; this is one compare per access in case one of them ever does not.
fn check_inside<T>(op: &str, st: &Storage<T>, range: &Range<usize>) -> Result<()> {
    if range.start <= range.end && range.end <= st.len {
        Ok(())
    } else {
        Err(KernelError::BadViews(format!(
            "{op}: view {range:?} is not inside buffer '{}' of {} elements",
            st.name, st.len
        )))
    }
}

impl OpBuilder {
    fn new(name: &'static str) -> Self {
        OpBuilder {
            name,
            reads: Vec::with_capacity(4),
            writes: Vec::with_capacity(2),
            outside: None,
        }
    }

    /// Notes a view outside its buffer; the op is then refused before it can run.
    fn note_outside<T>(&mut self, st: &Storage<T>, range: &Range<usize>) {
        if self.outside.is_none() {
            self.outside = check_inside(self.name, st, range).err();
        }
    }

    fn r<T: Element>(&mut self, v: &View<'_, CpuBuffer<T>>) -> Rd<T> {
        let st = Rc::clone(&v.buffer().st);
        self.note_outside(&st, &v.range());
        self.reads.push(OpAccess {
            id: st.id,
            name: Rc::clone(&st.name),
            range: v.range(),
        });
        Rd {
            st,
            range: v.range(),
        }
    }

    fn w<T: Element>(&mut self, v: &ViewMut<'_, CpuBuffer<T>>) -> Wr<T> {
        let st = Rc::clone(&v.buffer().st);
        self.note_outside(&st, &v.range());
        self.writes.push(OpAccess {
            id: st.id,
            name: Rc::clone(&st.name),
            range: v.range(),
        });
        Wr {
            st,
            range: v.range(),
        }
    }

    /// Refuse a write that overlaps another access of the op in the same buffer (what
    /// makes the raw slices sound), then wrap the kernel.
    fn finish(self, run: impl FnOnce() -> Result<()> + 'static) -> Result<CpuOp> {
        if let Some(e) = self.outside {
            return Err(e);
        }
        for (i, w) in self.writes.iter().enumerate() {
            let others = self.reads.iter().chain(
                self.writes
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, a)| a),
            );
            for o in others {
                if o.id == w.id && overlap(&o.range, &w.range) {
                    return Err(KernelError::BadViews(format!(
                        "{}: writes {:?} of buffer '{}' while also touching {:?} of it",
                        self.name, w.range, w.name, o.range
                    )));
                }
            }
        }
        Ok(CpuOp {
            name: self.name,
            reads: self.reads,
            writes: self.writes,
            run: Box::new(run),
        })
    }
}

pub(crate) fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// The execution side of a CPU device: how an op, a host task, a transfer, a stream and
/// an event are handled. Implemented by [`super::HostDevice`] (eagerly) and
/// [`super::SimDevice`] (queued, checked); every [`Device`] op is written once on top.
pub trait CpuQueue {
    /// How the vectorised kernels run (instruction set, threads).
    fn exec(&self) -> &Exec;
    /// The matrix multiply (threads).
    fn gemm(&self) -> &Gemm;
    /// A fresh buffer identity.
    fn next_id(&self) -> u64;
    /// For logs.
    fn describe_queue(&self) -> String;
    /// A new stream.
    fn new_stream(&self, name: &str) -> Result<CpuStream>;
    /// True when model ops run the CUDA kernels' CPU twins ([`crate::twin`]).
    fn gpu_order(&self) -> bool {
        false
    }
    /// Whether f32 matrix products round their operands to bf16 ([`Device::set_bf16_products`]).
    fn bf16_products(&self) -> bool {
        false
    }
    /// Switch bf16 operands on or off; false where the queue has no such mode.
    fn set_bf16_products(&self, on: bool) -> bool {
        let _ = on;
        false
    }
    /// The simulated GPU's attention kernels (the rows kernels' twins, or the plan of
    /// batched products); only a queue in [`CpuQueue::gpu_order`] has a choice.
    fn attention_kernels(&self) -> AttentionKernels {
        AttentionKernels::Rows
    }
    /// Queue (or run) `op` on `stream`.
    fn submit(&self, stream: &CpuStream, op: CpuOp) -> Result<()>;
    /// An event after everything queued on `stream`.
    fn record_event(&self, stream: &CpuStream) -> Result<CpuEvent>;
    /// Later work on `stream` waits for `event`.
    fn wait_for(&self, stream: &CpuStream, event: &CpuEvent) -> Result<()>;
    /// The host waits for `event`.
    fn sync(&self, event: &CpuEvent) -> Result<()>;
    /// The host waits for every stream.
    fn sync_all(&self) -> Result<()>;
    /// Run `task` on the host, ordered on `stream` and declared to read and write these.
    fn run_host_task(
        &self,
        stream: &CpuStream,
        name: &'static str,
        reads: &[Access<'_>],
        writes: &[Access<'_>],
        task: &mut dyn FnMut(),
    ) -> Result<()>;
    /// Make `read` valid for the host to read after `stream`'s work (waits), checked.
    fn host_read(&self, stream: &CpuStream, name: &'static str, read: &Access<'_>) -> Result<()>;
    /// Start host work ordered on `stream` ([`Device::host_task_started`]). This default
    /// runs it as a host task and waits for it there.
    fn run_started_task(
        &self,
        stream: &CpuStream,
        name: &'static str,
        reads: &[Access<'_>],
        writes: &[Access<'_>],
        retain: Vec<Retained>,
        start: &mut dyn FnMut() -> Result<Box<dyn HostWork>>,
    ) -> Result<()> {
        drop(retain);
        let mut out = Ok(());
        self.run_host_task(stream, name, reads, writes, &mut || {
            out = start().and_then(|mut work| work.wait());
        })?;
        out
    }
    /// Started host work's time so far ([`Device::overlap_stats`]).
    fn overlap_stats(&self) -> OverlapStats {
        OverlapStats::default()
    }
}

/// Allocated buffers get ids from this counter (per device).
#[derive(Debug, Default)]
pub(crate) struct Ids(Cell<u64>);

impl Ids {
    pub(crate) fn next(&self) -> u64 {
        let id = self.0.get() + 1;
        self.0.set(id);
        id
    }
}

/// Same dtype: reinterpret (for the generic-over-two-types kernels).
fn as_type<A: Element, B: Element>(s: &[A]) -> &[B] {
    bytemuck::cast_slice(s)
}

fn as_type_mut<A: Element, B: Element>(s: &mut [A]) -> &mut [B] {
    bytemuck::cast_slice_mut(s)
}

impl<Q: CpuQueue> Device for Q {
    type Buf<T: Element> = CpuBuffer<T>;
    type Stream = CpuStream;
    type Event = CpuEvent;

    fn describe(&self) -> String {
        self.describe_queue()
    }

    fn location(&self) -> Location {
        Location::Host
    }

    fn set_bf16_products(&self, on: bool) -> bool {
        CpuQueue::set_bf16_products(self, on)
    }

    fn alloc<T: Element>(&self, len: usize, name: &str) -> Result<CpuBuffer<T>> {
        let buffer = CpuBuffer::zeroed(self.next_id(), name, len)?;
        let bytes = len * std::mem::size_of::<T>();
        // SAFETY: the buffer was just allocated, `bytes` long; no op has it yet.
        unsafe {
            populate(
                self.gemm().workers(),
                buffer.raw_ptr() as *mut u8,
                bytes,
                name,
            )
        };
        Ok(buffer)
    }

    fn stream(&self, name: &str) -> Result<CpuStream> {
        self.new_stream(name)
    }

    fn record(&self, stream: &CpuStream) -> Result<CpuEvent> {
        self.record_event(stream)
    }

    fn wait_event(&self, stream: &CpuStream, event: &CpuEvent) -> Result<()> {
        self.wait_for(stream, event)
    }

    fn sync_event(&self, event: &CpuEvent) -> Result<()> {
        self.sync(event)
    }

    fn synchronize(&self) -> Result<()> {
        self.sync_all()
    }

    fn host_task<R>(
        &self,
        stream: &CpuStream,
        name: &'static str,
        reads: &[Access<'_>],
        writes: &[Access<'_>],
        task: impl FnOnce() -> R,
    ) -> Result<R> {
        let mut task = Some(task);
        let mut out = None;
        self.run_host_task(stream, name, reads, writes, &mut || {
            if let Some(t) = task.take() {
                out = Some(t());
            }
        })?;
        out.ok_or_else(|| KernelError::Device(format!("host task '{name}' did not run")))
    }

    fn host_task_started(
        &self,
        stream: &CpuStream,
        name: &'static str,
        reads: &[Access<'_>],
        writes: &[Access<'_>],
        retain: Vec<Retained>,
        start: impl FnOnce() -> Result<Box<dyn HostWork>>,
    ) -> Result<()> {
        let mut start = Some(start);
        self.run_started_task(
            stream,
            name,
            reads,
            writes,
            retain,
            &mut || match start.take() {
                Some(f) => f(),
                None => Err(KernelError::Device(format!(
                    "host task '{name}' was started twice"
                ))),
            },
        )
    }

    fn overlap_stats(&self) -> OverlapStats {
        CpuQueue::overlap_stats(self)
    }

    fn upload<T: Element>(
        &self,
        stream: &CpuStream,
        src: &[T],
        dst: ViewMut<'_, CpuBuffer<T>>,
    ) -> Result<()> {
        same_len("upload", "dst", dst.len(), src.len())?;
        let data = src.to_vec();
        let mut op = OpBuilder::new("upload");
        let dst = op.w(&dst);
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                unsafe { dst.get() }.copy_from_slice(&data);
                Ok(())
            })?,
        )
    }

    unsafe fn upload_from_staging<T: Element>(
        &self,
        stream: &CpuStream,
        src: *const T,
        dst: ViewMut<'_, CpuBuffer<T>>,
        keep: Retained,
    ) -> Result<()> {
        let n = dst.len();
        let mut op = OpBuilder::new("upload_from_staging");
        let dst = op.w(&dst);
        // The address travels as an integer: the op runs later, on this thread.
        let src = src as usize;
        self.submit(
            stream,
            op.finish(move || {
                let _keep = keep;
                // SAFETY: the caller keeps `n` elements at `src` allocated (`keep`, held
                // until here) and unwritten until this op has run; `dst` as in the
                // module documentation.
                let from = unsafe { std::slice::from_raw_parts(src as *const T, n) };
                unsafe { dst.get() }.copy_from_slice(from);
                Ok(())
            })?,
        )
    }

    fn download<T: Element>(
        &self,
        stream: &CpuStream,
        src: View<'_, CpuBuffer<T>>,
        dst: &mut [T],
    ) -> Result<()> {
        same_len("download", "dst", dst.len(), src.len())?;
        let st = &src.buffer().st;
        check_inside("download", st, &src.range())?;
        self.host_read(stream, "download", &src.access())?;
        // SAFETY: the device ran every op ordered before this read and runs none now.
        let data = unsafe { std::slice::from_raw_parts(st.ptr.add(src.range().start), src.len()) };
        dst.copy_from_slice(data);
        Ok(())
    }

    fn fill<T: Element>(
        &self,
        stream: &CpuStream,
        dst: ViewMut<'_, CpuBuffer<T>>,
        value: T,
    ) -> Result<()> {
        let mut op = OpBuilder::new("fill");
        let dst = op.w(&dst);
        let workers = self.gemm().workers().clone();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let dst = unsafe { dst.get() };
                // All-zero bytes (clearing gradients, the common case) go to memset, whose
                // large stores skip reading the lines first; other values element-wise.
                let zero = bytemuck::bytes_of(&value).iter().all(|&b| b == 0);
                let per = rows_per_part(workers.threads(), dst.len(), 1);
                let jobs: Vec<_> = dst.chunks_mut(per).collect();
                workers.run(jobs, |d| {
                    if zero {
                        bytemuck::cast_slice_mut::<T, u8>(d).fill(0);
                    } else {
                        d.fill(value);
                    }
                });
                Ok(())
            })?,
        )
    }

    fn copy<T: Element>(
        &self,
        stream: &CpuStream,
        src: View<'_, CpuBuffer<T>>,
        dst: ViewMut<'_, CpuBuffer<T>>,
    ) -> Result<()> {
        same_len("copy", "dst", dst.len(), src.len())?;
        let mut op = OpBuilder::new("copy");
        let (src, dst) = (op.r(&src), op.w(&dst));
        let workers = self.gemm().workers().clone();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (src, dst) = unsafe { (src.get(), dst.get()) };
                let per = rows_per_part(workers.threads(), dst.len(), 1);
                let jobs: Vec<_> = dst.chunks_mut(per).zip(src.chunks(per)).collect();
                workers.run(jobs, |(d, s)| d.copy_from_slice(s));
                Ok(())
            })?,
        )
    }

    fn cast<S: Float, T: Float>(
        &self,
        stream: &CpuStream,
        src: View<'_, CpuBuffer<S>>,
        dst: ViewMut<'_, CpuBuffer<T>>,
    ) -> Result<()> {
        same_len("cast", "dst", dst.len(), src.len())?;
        let exec = *self.exec();
        let mut op = OpBuilder::new("cast");
        let (src, dst) = (op.r(&src), op.w(&dst));
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (s, d) = unsafe { (src.get(), dst.get()) };
                convert(&exec, s, d)
            })?,
        )
    }

    fn accumulate<S: Float, T: Float>(
        &self,
        stream: &CpuStream,
        dst: ViewMut<'_, CpuBuffer<T>>,
        src: View<'_, CpuBuffer<S>>,
    ) -> Result<()> {
        same_len("accumulate", "src", src.len(), dst.len())?;
        let exec = *self.exec();
        let workers = self.gemm().workers().clone();
        let mut op = OpBuilder::new("accumulate");
        let (src, dst) = (op.r(&src), op.w(&dst));
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (s, d) = unsafe { (src.get(), dst.get()) };
                if T::DTYPE == DType::F32 {
                    cast::accumulate(&exec, as_type_mut(d), S::float_slice(s))
                } else {
                    // Elementwise: any split gives the same bits.
                    let per = rows_per_part(workers.threads(), d.len(), 1);
                    let jobs: Vec<_> = d.chunks_mut(per).zip(s.chunks(per)).collect();
                    // The first job's error, if any (none while the lengths agree, as
                    // checked above, since both sides are chunked alike).
                    let failed = std::sync::OnceLock::new();
                    workers.run(jobs, |(d, s)| {
                        if let Err(e) = cast::accumulate_rounded(&exec, d, s) {
                            let _ = failed.set(e);
                        }
                    });
                    failed.into_inner().map_or(Ok(()), Err)
                }
            })?,
        )
    }

    fn quantize_int8<T: Float>(
        &self,
        stream: &CpuStream,
        src: View<'_, CpuBuffer<T>>,
        block: usize,
        codes: ViewMut<'_, CpuBuffer<u8>>,
        scales: ViewMut<'_, CpuBuffer<f32>>,
    ) -> Result<()> {
        quant::check_lengths(src.len(), block, codes.len(), scales.len())?;
        let exec = *self.exec();
        let mut op = OpBuilder::new("quantize_int8");
        let (src, codes, scales) = (op.r(&src), op.w(&codes), op.w(&scales));
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (x, q, s) = unsafe { (src.get(), codes.get(), scales.get()) };
                // The GPU's order and the host's are the same (the block maximum is exact
                // in any order): one kernel serves both, and the simulated GPU.
                quant::quantize(&exec, x, block, bytemuck::cast_slice_mut(q), s)
            })?,
        )
    }

    fn dequantize_int8<T: Float>(
        &self,
        stream: &CpuStream,
        codes: View<'_, CpuBuffer<u8>>,
        scales: View<'_, CpuBuffer<f32>>,
        block: usize,
        dst: ViewMut<'_, CpuBuffer<T>>,
    ) -> Result<()> {
        quant::check_lengths(dst.len(), block, codes.len(), scales.len())?;
        let exec = *self.exec();
        let mut op = OpBuilder::new("dequantize_int8");
        let (codes, scales, dst) = (op.r(&codes), op.r(&scales), op.w(&dst));
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (q, s, out) = unsafe { (codes.get(), scales.get(), dst.get()) };
                quant::dequantize(&exec, bytemuck::cast_slice(q), s, block, out)
            })?,
        )
    }

    fn quantize_int4<T: Float>(
        &self,
        stream: &CpuStream,
        src: View<'_, CpuBuffer<T>>,
        block: usize,
        codes: ViewMut<'_, CpuBuffer<u8>>,
        scales: ViewMut<'_, CpuBuffer<f32>>,
    ) -> Result<()> {
        quant::check_lengths_int4(src.len(), block, codes.len(), scales.len())?;
        let exec = *self.exec();
        let gpu = self.gpu_order();
        let mut op = OpBuilder::new("quantize_int4");
        let (src, codes, scales) = (op.r(&src), op.w(&codes), op.w(&scales));
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (x, c, s) = unsafe { (src.get(), codes.get(), scales.get()) };
                if gpu {
                    twin::quant::quantize_int4(x, block, c, s);
                    Ok(())
                } else {
                    quant::quantize_int4(&exec, x, block, c, s)
                }
            })?,
        )
    }

    fn dequantize_int4<T: Float>(
        &self,
        stream: &CpuStream,
        codes: View<'_, CpuBuffer<u8>>,
        scales: View<'_, CpuBuffer<f32>>,
        block: usize,
        dst: ViewMut<'_, CpuBuffer<T>>,
    ) -> Result<()> {
        quant::check_lengths_int4(dst.len(), block, codes.len(), scales.len())?;
        let exec = *self.exec();
        let gpu = self.gpu_order();
        let mut op = OpBuilder::new("dequantize_int4");
        let (codes, scales, dst) = (op.r(&codes), op.r(&scales), op.w(&dst));
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (c, s, out) = unsafe { (codes.get(), scales.get(), dst.get()) };
                if gpu {
                    twin::quant::dequantize_int4(c, s, block, out);
                    Ok(())
                } else {
                    quant::dequantize_int4(&exec, c, s, block, out)
                }
            })?,
        )
    }

    fn grad_stats<G: Float>(
        &self,
        stream: &CpuStream,
        grad: View<'_, CpuBuffer<G>>,
        scale: f32,
        out: ViewMut<'_, CpuBuffer<f64>>,
    ) -> Result<()> {
        same_len("grad_stats", "out", out.len(), 2)?;
        let exec = *self.exec();
        // A simulated GPU totals the block sums as the CUDA kernel does.
        let order = if self.gpu_order() {
            gradstats::Total::GpuTree
        } else {
            gradstats::Total::Serial
        };
        let mut op = OpBuilder::new("grad_stats");
        let (grad, out) = (op.r(&grad), op.w(&out));
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (g, o) = unsafe { (grad.get(), out.get()) };
                let s = gradstats::stats_totalled(&exec, G::float_slice(g), scale, order);
                o[0] = s.sum_squares;
                o[1] = if s.nonfinite { 1.0 } else { 0.0 };
                Ok(())
            })?,
        )
    }

    fn adamw<G: Float, P: Float>(
        &self,
        stream: &CpuStream,
        step: &AdamWStep<'_>,
        grad: View<'_, CpuBuffer<G>>,
        state: AdamWViews<'_, Self>,
        param: Option<ViewMut<'_, CpuBuffer<P>>>,
    ) -> Result<()> {
        let n = grad.len();
        check::adamw(
            n,
            state.master.len(),
            state.m.len(),
            state.v.len(),
            param.as_ref().map(|p| (p.len(), P::DTYPE)),
        )?;
        adamw::check_segments(step.segments, step.groups.len(), n)?;
        let exec = *self.exec();
        let groups: Vec<AdamWHyper> = step.groups.to_vec();
        let segments: Vec<AdamWSegment> = step.segments.to_vec();
        let (t, grad_scale) = (step.t, step.grad_scale);
        let mut op = OpBuilder::new("adamw");
        let grad = op.r(&grad);
        let (master, m, v) = (op.w(&state.master), op.w(&state.m), op.w(&state.v));
        let param = param.map(|p| op.w(&p));
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let g = unsafe { grad.get() };
                let st = unsafe {
                    AdamWState {
                        master: master.get(),
                        m: m.get(),
                        v: v.get(),
                    }
                };
                let p = param.as_ref().and_then(|p| P::half_mut(unsafe { p.get() }));
                adamw::step(
                    &exec,
                    &groups,
                    &segments,
                    t,
                    grad_scale,
                    G::float_slice(g),
                    st,
                    p,
                )
            })?,
        )
    }

    fn matmul<F: Scalar>(
        &self,
        stream: &CpuStream,
        mm: MatMul<F>,
        a: View<'_, CpuBuffer<F>>,
        b: View<'_, CpuBuffer<F>>,
        c: ViewMut<'_, CpuBuffer<F>>,
    ) -> Result<()> {
        check::matmul(&mm, a.len(), b.len(), c.len())?;
        let (la, lb, lc) = (mm.a, mm.b, mm.c);
        let gemm = self.gemm().with_bf16_operands(self.bf16_products());
        let mut op = OpBuilder::new("matmul");
        let (a, b, c) = (op.r(&a), op.r(&b), op.w(&c));
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (a, b, c) = unsafe { (a.get(), b.get(), c.get()) };
                gemm.run(mm.alpha, a, la, b, lb, mm.beta, c, lc);
                Ok(())
            })?,
        )
    }

    fn layernorm_forward<F: Scalar>(
        &self,
        stream: &CpuStream,
        out: LayerNormOut<'_, Self, F>,
        x: View<'_, CpuBuffer<F>>,
        w: View<'_, CpuBuffer<F>>,
        b: View<'_, CpuBuffer<F>>,
        width: usize,
    ) -> Result<()> {
        let op_name = "layernorm_forward";
        check::layernorm_forward(
            x.len(),
            out.out.len(),
            w.len(),
            b.len(),
            out.mean.len(),
            out.rstd.len(),
            width,
        )?;
        let mut op = OpBuilder::new(op_name);
        let (x, w, b) = (op.r(&x), op.r(&w), op.r(&b));
        let (o, mean, rstd) = (op.w(&out.out), op.w(&out.mean), op.w(&out.rstd));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (o, mean, rstd) = unsafe { (o.get(), mean.get(), rstd.get()) };
                let (x, w, b) = unsafe { (x.get(), w.get(), b.get()) };
                if gpu {
                    twin::norm::layernorm_forward(o, mean, rstd, x, w, b, width);
                } else {
                    // Rows are independent: split them over the threads.
                    let rows = x.len() / width.max(1);
                    let per = rows_per_part(workers.threads(), rows, width * 4);
                    let jobs: Vec<_> = o[..rows * width]
                        .chunks_mut(per * width)
                        .zip(mean[..rows].chunks_mut(per))
                        .zip(rstd[..rows].chunks_mut(per))
                        .zip(x[..rows * width].chunks(per * width))
                        .collect();
                    workers.run(jobs, |(((o, mean), rstd), x)| {
                        run_auto(&exec, ops::LayerNormForward(o, mean, rstd, x, w, b, width))
                    });
                }
                Ok(())
            })?,
        )
    }

    fn layernorm_backward<F: Scalar>(
        &self,
        stream: &CpuStream,
        grads: LayerNormGrads<'_, Self, F>,
        dout: View<'_, CpuBuffer<F>>,
        saved: LayerNormSaved<'_, Self, F>,
        width: usize,
    ) -> Result<()> {
        let op_name = "layernorm_backward";
        check::layernorm_backward(
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
        let mut op = OpBuilder::new(op_name);
        let (dout, x, w) = (op.r(&dout), op.r(&saved.x), op.r(&saved.w));
        let (mean, rstd) = (op.r(&saved.mean), op.r(&saved.rstd));
        let (dx, dw, db) = (op.w(&grads.dx), op.w(&grads.dw), op.w(&grads.db));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (dx, dw, db) = unsafe { (dx.get(), dw.get(), db.get()) };
                let (dout, x, w) = unsafe { (dout.get(), x.get(), w.get()) };
                let (mean, rstd) = unsafe { (mean.get(), rstd.get()) };
                let rows = dx.len().min(x.len()).min(dout.len()) / width.max(1);
                // Two sums and the dx pass per row, then the parameter pass.
                let per = rows_per_part(workers.threads(), rows, width * 8);
                if gpu {
                    twin::norm::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, width);
                } else if per >= rows {
                    let op = ops::LayerNormBackward(dx, dw, db, dout, x, w, mean, rstd, width);
                    run_auto(&exec, op);
                } else {
                    // Rows split dx (a row's dx depends on that row alone); channels split
                    // dw and db, each channel summing every row in row order as the fused
                    // pass does. No sum crosses a split: the bits of one thread.
                    let n = rows * width;
                    let row_parts: Vec<_> = dx[..n]
                        .chunks_mut(per * width)
                        .zip(dout[..n].chunks(per * width))
                        .zip(x[..n].chunks(per * width))
                        .zip(mean[..rows].chunks(per).zip(rstd[..rows].chunks(per)))
                        .collect();
                    let cols = channels_per_part(row_parts.len(), width);
                    let channel_parts: Vec<_> = dw[..width]
                        .chunks_mut(cols)
                        .zip(db[..width].chunks_mut(cols))
                        .enumerate()
                        .collect();
                    let (dout, x) = (&dout[..n], &x[..n]);
                    let jobs = zip_parts(row_parts, channel_parts);
                    workers.run(jobs, |(row_part, channel_part)| {
                        if let Some((((dx, dout), x), (mean, rstd))) = row_part {
                            let op = ops::LayerNormBackwardDx(dx, dout, x, w, mean, rstd, width);
                            run_auto(&exec, op);
                        }
                        if let Some((k, (dw, db))) = channel_part {
                            let first = k * cols;
                            let op = ops::LayerNormBackwardParams(
                                dw, db, dout, x, mean, rstd, width, first,
                            );
                            run_auto(&exec, op);
                        }
                    });
                }
                Ok(())
            })?,
        )
    }

    fn gelu_forward<F: Scalar>(
        &self,
        stream: &CpuStream,
        out: ViewMut<'_, CpuBuffer<F>>,
        x: View<'_, CpuBuffer<F>>,
    ) -> Result<()> {
        same_len("gelu_forward", "out", out.len(), x.len())?;
        let mut op = OpBuilder::new("gelu_forward");
        let (x, out) = (op.r(&x), op.w(&out));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (out, x) = unsafe { (out.get(), x.get()) };
                if gpu {
                    twin::elementwise::gelu_forward(out, x);
                } else {
                    let per = rows_per_part(workers.threads(), out.len(), 16);
                    let jobs: Vec<_> = out.chunks_mut(per).zip(x.chunks(per)).collect();
                    workers.run(jobs, |(o, x)| run_auto(&exec, ops::GeluForward(o, x)));
                }
                Ok(())
            })?,
        )
    }

    fn gelu_backward<F: Scalar>(
        &self,
        stream: &CpuStream,
        d: ViewMut<'_, CpuBuffer<F>>,
        x: View<'_, CpuBuffer<F>>,
    ) -> Result<()> {
        same_len("gelu_backward", "d", d.len(), x.len())?;
        let mut op = OpBuilder::new("gelu_backward");
        let (x, d) = (op.r(&x), op.w(&d));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (d, x) = unsafe { (d.get(), x.get()) };
                if gpu {
                    twin::elementwise::gelu_backward_inplace(d, x);
                } else {
                    let per = rows_per_part(workers.threads(), d.len(), 16);
                    let jobs: Vec<_> = d.chunks_mut(per).zip(x.chunks(per)).collect();
                    workers.run(jobs, |(d, x)| run_auto(&exec, ops::GeluBackward(d, x)));
                }
                Ok(())
            })?,
        )
    }

    fn attention_forward<F: Scalar>(
        &self,
        stream: &CpuStream,
        y: ViewMut<'_, CpuBuffer<F>>,
        p: ViewMut<'_, CpuBuffer<F>>,
        qkv: View<'_, CpuBuffer<F>>,
        shape: AttnShape,
    ) -> Result<()> {
        check::attention_forward(y.len(), p.len(), qkv.len(), &shape)?;
        let gemm = self.gemm().with_bf16_operands(self.bf16_products());
        let exec = *self.exec();
        let mut op = OpBuilder::new("attention_forward");
        let (qkv, y, p) = (op.r(&qkv), op.w(&y), op.w(&p));
        let gpu = self.gpu_order();
        let products = gpu && self.attention_kernels() == AttentionKernels::Products;
        self.submit(
            stream,
            op.finish(move || {
                if products {
                    // SAFETY: see the module documentation.
                    let (y, p, qkv) = unsafe { (y.get(), p.get(), qkv.get()) };
                    let mut bufs = HostBufs::default()
                        .read(Buf::Qkv, qkv)
                        .write(Buf::Y, y)
                        .write(Buf::P, p);
                    let steps = products::plan_forward(shape);
                    return products::run_on_host(&gemm, &steps, shape.t, &mut bufs);
                }
                // SAFETY: see the module documentation.
                unsafe {
                    if gpu {
                        twin::attention::attention_forward(y.get(), p.get(), qkv.get(), shape)
                    } else {
                        nn::attention::attention_forward_at(
                            &exec,
                            &gemm,
                            y.get(),
                            p.get(),
                            qkv.get(),
                            shape,
                        )
                    }
                };
                Ok(())
            })?,
        )
    }

    fn attention_backward<F: Scalar>(
        &self,
        stream: &CpuStream,
        dqkv: ViewMut<'_, CpuBuffer<F>>,
        scratch: ViewMut<'_, CpuBuffer<F>>,
        dy: View<'_, CpuBuffer<F>>,
        p: View<'_, CpuBuffer<F>>,
        qkv: View<'_, CpuBuffer<F>>,
        shape: AttnShape,
    ) -> Result<()> {
        let name = "attention_backward";
        check::attention_backward(
            dqkv.len(),
            scratch.len(),
            dy.len(),
            p.len(),
            qkv.len(),
            &shape,
        )?;
        let gemm = self.gemm().with_bf16_operands(self.bf16_products());
        let exec = *self.exec();
        let mut op = OpBuilder::new(name);
        let (dy, p, qkv) = (op.r(&dy), op.r(&p), op.r(&qkv));
        let (dqkv, scratch) = (op.w(&dqkv), op.w(&scratch));
        let gpu = self.gpu_order();
        let products = gpu && self.attention_kernels() == AttentionKernels::Products;
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (dqkv, scratch) = unsafe { (dqkv.get(), scratch.get()) };
                let (dy, p, qkv) = unsafe { (dy.get(), p.get(), qkv.get()) };
                if products {
                    // The CUDA device's workspace, here a vector of as many matrices
                    // (an error, as on the GPU, where memory runs out).
                    let mats = products::work_mats(shape, products::WORK_BYTES);
                    let len = mats * shape.t * shape.t;
                    let mut work = Vec::new();
                    work.try_reserve_exact(len)
                        .map_err(|_| KernelError::Alloc {
                            name: "attention workspace".into(),
                            bytes: (len * std::mem::size_of::<F>()) as u128,
                        })?;
                    work.resize(len, F::ZERO);
                    let mut bufs = HostBufs::default()
                        .read(Buf::Qkv, qkv)
                        .read(Buf::P, p)
                        .read(Buf::Dy, dy)
                        .write(Buf::Dqkv, dqkv)
                        .write(Buf::Work, &mut work);
                    let steps = products::plan_backward(shape, mats);
                    return products::run_on_host(&gemm, &steps, shape.t, &mut bufs);
                }
                if gpu {
                    twin::attention::attention_backward(dqkv, scratch, dy, p, qkv, shape)
                } else {
                    nn::attention::attention_backward_at(
                        &exec, &gemm, dqkv, scratch, dy, p, qkv, shape,
                    )
                }
                Ok(())
            })?,
        )
    }

    fn softmax_xent_forward<F: Scalar>(
        &self,
        stream: &CpuStream,
        logits: ViewMut<'_, CpuBuffer<F>>,
        losses: ViewMut<'_, CpuBuffer<F>>,
        targets: View<'_, CpuBuffer<u32>>,
        v: usize,
    ) -> Result<()> {
        let name = "softmax_xent_forward";
        check::softmax_xent(name, logits.len(), Some(losses.len()), targets.len(), v)?;
        let mut op = OpBuilder::new(name);
        let targets = op.r(&targets);
        let (logits, losses) = (op.w(&logits), op.w(&losses));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let t = unsafe { targets.get() };
                check_ids(name, "target", t, v)?;
                let (logits, losses) = unsafe { (logits.get(), losses.get()) };
                if gpu {
                    twin::xent::softmax_xent_forward(logits, losses, t, v);
                } else {
                    // Rows are independent: split them over the threads.
                    let per = rows_per_part(workers.threads(), t.len(), v * 8);
                    let jobs: Vec<_> = logits
                        .chunks_mut(per * v)
                        .zip(losses.chunks_mut(per))
                        .zip(t.chunks(per))
                        .collect();
                    workers.run(jobs, |((z, l), t)| {
                        run_auto(&exec, ops::SoftmaxXentForward(z, l, t, v))
                    });
                }
                Ok(())
            })?,
        )
    }

    fn softmax_xent_backward<F: Scalar>(
        &self,
        stream: &CpuStream,
        probs: ViewMut<'_, CpuBuffer<F>>,
        targets: View<'_, CpuBuffer<u32>>,
        v: usize,
        scale: F,
    ) -> Result<()> {
        let name = "softmax_xent_backward";
        check::softmax_xent(name, probs.len(), None, targets.len(), v)?;
        let mut op = OpBuilder::new(name);
        let targets = op.r(&targets);
        let probs = op.w(&probs);
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let t = unsafe { targets.get() };
                check_ids(name, "target", t, v)?;
                let probs = unsafe { probs.get() };
                if gpu {
                    twin::xent::softmax_xent_backward(probs, t, v, scale);
                } else {
                    let per = rows_per_part(workers.threads(), t.len(), v);
                    let jobs: Vec<_> = probs.chunks_mut(per * v).zip(t.chunks(per)).collect();
                    workers.run(jobs, |(p, t)| {
                        run_auto(&exec, ops::SoftmaxXentBackward(p, t, v, scale))
                    });
                }
                Ok(())
            })?,
        )
    }

    fn mean<F: Scalar>(
        &self,
        stream: &CpuStream,
        dst: ViewMut<'_, CpuBuffer<F>>,
        src: View<'_, CpuBuffer<F>>,
    ) -> Result<()> {
        check::mean(dst.len(), src.len())?;
        let mut op = OpBuilder::new("mean");
        let (src, dst) = (op.r(&src), op.w(&dst));
        let gpu = self.gpu_order();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                unsafe {
                    (if gpu {
                        twin::xent::mean_into
                    } else {
                        nn::mean_into
                    })(&mut dst.get()[0], src.get())
                };
                Ok(())
            })?,
        )
    }

    fn fill_rows<F: Scalar>(
        &self,
        stream: &CpuStream,
        out: ViewMut<'_, CpuBuffer<F>>,
        row: View<'_, CpuBuffer<F>>,
    ) -> Result<()> {
        rows_of("fill_rows", "out", out.len(), row.len())?;
        let mut op = OpBuilder::new("fill_rows");
        let (row, out) = (op.r(&row), op.w(&out));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (out, row) = unsafe { (out.get(), row.get()) };
                if gpu {
                    twin::rows::fill_rows(out, row);
                } else {
                    // Copies: any split by rows gives the same bits.
                    let width = row.len();
                    let per = rows_per_part(workers.threads(), out.len() / width.max(1), width);
                    let jobs: Vec<_> = out.chunks_mut((per * width).max(1)).collect();
                    workers.run(jobs, |o| nn::fill_rows(o, row));
                }
                Ok(())
            })?,
        )
    }

    fn add_rows<F: Scalar>(
        &self,
        stream: &CpuStream,
        out: ViewMut<'_, CpuBuffer<F>>,
        row: View<'_, CpuBuffer<F>>,
    ) -> Result<()> {
        rows_of("add_rows", "out", out.len(), row.len())?;
        let mut op = OpBuilder::new("add_rows");
        let (row, out) = (op.r(&row), op.w(&out));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (out, row) = unsafe { (out.get(), row.get()) };
                if gpu {
                    twin::rows::add_rows(out, row);
                } else {
                    let width = row.len();
                    let per = rows_per_part(workers.threads(), out.len() / width.max(1), width);
                    let jobs: Vec<_> = out.chunks_mut((per * width).max(1)).collect();
                    workers.run(jobs, |o| run_auto(&exec, ops::AddRows(o, row)));
                }
                Ok(())
            })?,
        )
    }

    fn bias_backward<F: Scalar>(
        &self,
        stream: &CpuStream,
        db: ViewMut<'_, CpuBuffer<F>>,
        dout: View<'_, CpuBuffer<F>>,
    ) -> Result<()> {
        rows_of("bias_backward", "dout", dout.len(), db.len())?;
        let mut op = OpBuilder::new("bias_backward");
        let (dout, db) = (op.r(&dout), op.w(&db));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (db, dout) = unsafe { (db.get(), dout.get()) };
                let width = db.len().max(1);
                let rows = dout.len() / width;
                let per = rows_per_part(workers.threads(), rows, width);
                if gpu {
                    twin::rows::bias_backward(db, dout);
                } else if per >= rows {
                    run_auto(&exec, ops::BiasBackward(db, dout));
                } else {
                    // Channels split db, each channel summing every row in row order as
                    // one thread does: the bits of one thread.
                    let cols = channels_per_part(rows.div_ceil(per), width);
                    let jobs: Vec<_> = db.chunks_mut(cols).enumerate().collect();
                    workers.run(jobs, |(k, db)| {
                        run_auto(&exec, ops::BiasBackwardChannels(db, dout, width, k * cols))
                    });
                }
                Ok(())
            })?,
        )
    }

    fn gather_rows<F: Scalar>(
        &self,
        stream: &CpuStream,
        out: ViewMut<'_, CpuBuffer<F>>,
        ids: View<'_, CpuBuffer<u32>>,
        table: View<'_, CpuBuffer<F>>,
        width: usize,
    ) -> Result<()> {
        let name = "gather_rows";
        let (_, table_rows) = check::lookup(
            name,
            "out",
            out.len(),
            ids.len(),
            "table",
            table.len(),
            width,
        )?;
        let mut op = OpBuilder::new(name);
        let (ids, table, out) = (op.r(&ids), op.r(&table), op.w(&out));
        let gpu = self.gpu_order();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let i = unsafe { ids.get() };
                check_ids(name, "id", i, table_rows)?;
                unsafe {
                    (if gpu {
                        twin::rows::gather_rows
                    } else {
                        nn::gather_rows
                    })(out.get(), i, table.get(), width)
                };
                Ok(())
            })?,
        )
    }

    fn scatter_add_rows<F: Scalar>(
        &self,
        stream: &CpuStream,
        dtable: ViewMut<'_, CpuBuffer<F>>,
        ids: View<'_, CpuBuffer<u32>>,
        dout: View<'_, CpuBuffer<F>>,
        width: usize,
    ) -> Result<()> {
        let name = "scatter_add_rows";
        let (_, table_rows) = check::lookup(
            name,
            "dout",
            dout.len(),
            ids.len(),
            "dtable",
            dtable.len(),
            width,
        )?;
        let mut op = OpBuilder::new(name);
        let (ids, dout, dtable) = (op.r(&ids), op.r(&dout), op.w(&dtable));
        let gpu = self.gpu_order();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let i = unsafe { ids.get() };
                check_ids(name, "id", i, table_rows)?;
                unsafe {
                    (if gpu {
                        twin::rows::scatter_add_rows
                    } else {
                        nn::scatter_add_rows
                    })(dtable.get(), i, dout.get(), width)
                };
                Ok(())
            })?,
        )
    }

    fn gather_rows_block<F: Scalar>(
        &self,
        stream: &CpuStream,
        out: ViewMut<'_, CpuBuffer<F>>,
        ids: View<'_, CpuBuffer<u32>>,
        block: View<'_, CpuBuffer<F>>,
        first: usize,
        width: usize,
    ) -> Result<()> {
        let name = "gather_rows_block";
        check::lookup(
            name,
            "out",
            out.len(),
            ids.len(),
            "block",
            block.len(),
            width,
        )?;
        let mut op = OpBuilder::new(name);
        let (ids, block, out) = (op.r(&ids), op.r(&block), op.w(&out));
        let gpu = self.gpu_order();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                unsafe {
                    (if gpu {
                        twin::rows::gather_rows_block
                    } else {
                        nn::gather_rows_block
                    })(out.get(), ids.get(), block.get(), first, width)
                };
                Ok(())
            })?,
        )
    }

    fn scatter_add_rows_block<F: Scalar>(
        &self,
        stream: &CpuStream,
        dblock: ViewMut<'_, CpuBuffer<F>>,
        ids: View<'_, CpuBuffer<u32>>,
        dout: View<'_, CpuBuffer<F>>,
        first: usize,
        width: usize,
    ) -> Result<()> {
        let name = "scatter_add_rows_block";
        check::lookup(
            name,
            "dout",
            dout.len(),
            ids.len(),
            "dblock",
            dblock.len(),
            width,
        )?;
        let mut op = OpBuilder::new(name);
        let (ids, dout, dblock) = (op.r(&ids), op.r(&dout), op.w(&dblock));
        let gpu = self.gpu_order();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                unsafe {
                    (if gpu {
                        twin::rows::scatter_add_rows_block
                    } else {
                        nn::scatter_add_rows_block
                    })(dblock.get(), ids.get(), dout.get(), first, width)
                };
                Ok(())
            })?,
        )
    }

    fn add_periodic_rows<F: Scalar>(
        &self,
        stream: &CpuStream,
        out: ViewMut<'_, CpuBuffer<F>>,
        table: View<'_, CpuBuffer<F>>,
        period: usize,
        width: usize,
    ) -> Result<()> {
        let name = "add_periodic_rows";
        check::periodic(name, "out", out.len(), table.len(), period, width)?;
        let mut op = OpBuilder::new(name);
        let (table, out) = (op.r(&table), op.w(&out));
        let gpu = self.gpu_order();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                unsafe {
                    (if gpu {
                        twin::rows::add_periodic_rows
                    } else {
                        nn::add_periodic_rows
                    })(out.get(), table.get(), period, width)
                };
                Ok(())
            })?,
        )
    }

    fn periodic_rows_backward<F: Scalar>(
        &self,
        stream: &CpuStream,
        dtable: ViewMut<'_, CpuBuffer<F>>,
        dout: View<'_, CpuBuffer<F>>,
        period: usize,
        width: usize,
    ) -> Result<()> {
        let name = "periodic_rows_backward";
        check::periodic(name, "dout", dout.len(), dtable.len(), period, width)?;
        let mut op = OpBuilder::new(name);
        let (dout, dtable) = (op.r(&dout), op.w(&dtable));
        let gpu = self.gpu_order();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                unsafe {
                    (if gpu {
                        twin::rows::periodic_rows_backward
                    } else {
                        nn::periodic_rows_backward
                    })(dtable.get(), dout.get(), period, width)
                };
                Ok(())
            })?,
        )
    }

    fn shift_rows_forward<F: Scalar>(
        &self,
        stream: &CpuStream,
        out: ViewMut<'_, CpuBuffer<F>>,
        x: View<'_, CpuBuffer<F>>,
        seq_len: usize,
        width: usize,
    ) -> Result<()> {
        let name = "shift_rows_forward";
        check::shift(name, "x", x.len(), "out", out.len(), seq_len, width)?;
        let mut op = OpBuilder::new(name);
        let (x, out) = (op.r(&x), op.w(&out));
        let gpu = self.gpu_order();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                unsafe {
                    (if gpu {
                        twin::rows::shift_rows_forward
                    } else {
                        nn::shift_rows_forward
                    })(out.get(), x.get(), seq_len, width)
                };
                Ok(())
            })?,
        )
    }

    fn shift_rows_backward<F: Scalar>(
        &self,
        stream: &CpuStream,
        dx: ViewMut<'_, CpuBuffer<F>>,
        dout: View<'_, CpuBuffer<F>>,
        seq_len: usize,
        width: usize,
    ) -> Result<()> {
        let name = "shift_rows_backward";
        check::shift(name, "dout", dout.len(), "dx", dx.len(), seq_len, width)?;
        let mut op = OpBuilder::new(name);
        let (dout, dx) = (op.r(&dout), op.w(&dx));
        let gpu = self.gpu_order();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                unsafe {
                    (if gpu {
                        twin::rows::shift_rows_backward
                    } else {
                        nn::shift_rows_backward
                    })(dx.get(), dout.get(), seq_len, width)
                };
                Ok(())
            })?,
        )
    }

    // Llama's ops (RMSNorm, rotary/GQA, SwiGLU): in `gpu_order` the twins of
    // `src/nn/cuda/llama.cu` ([`twin::llama`]); RMSNorm's sums are grouped as the GPU's
    // warps group them, the other two give the CPU kernels' bits either way.

    fn rmsnorm_forward<F: Scalar>(
        &self,
        stream: &CpuStream,
        out: ViewMut<'_, CpuBuffer<F>>,
        rstd: ViewMut<'_, CpuBuffer<F>>,
        x: View<'_, CpuBuffer<F>>,
        w: View<'_, CpuBuffer<F>>,
        width: usize,
        eps: f64,
    ) -> Result<()> {
        check::rmsnorm_forward(x.len(), out.len(), w.len(), rstd.len(), width)?;
        let mut op = OpBuilder::new("rmsnorm_forward");
        let (x, w) = (op.r(&x), op.r(&w));
        let (o, rstd) = (op.w(&out), op.w(&rstd));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (o, rstd) = unsafe { (o.get(), rstd.get()) };
                let (x, w) = unsafe { (x.get(), w.get()) };
                if gpu {
                    twin::llama::rmsnorm_forward(o, rstd, x, w, width, eps);
                    return Ok(());
                }
                // Rows are independent: split them over the threads.
                let rows = x.len() / width.max(1);
                let per = rows_per_part(workers.threads(), rows, width * 4);
                let jobs: Vec<_> = o[..rows * width]
                    .chunks_mut(per * width)
                    .zip(rstd[..rows].chunks_mut(per))
                    .zip(x[..rows * width].chunks(per * width))
                    .collect();
                workers.run(jobs, |((o, rstd), x)| {
                    run_auto(&exec, ops::RmsNormForward(o, rstd, x, w, width, eps))
                });
                Ok(())
            })?,
        )
    }

    fn rmsnorm_backward<F: Scalar>(
        &self,
        stream: &CpuStream,
        dx: ViewMut<'_, CpuBuffer<F>>,
        dw: ViewMut<'_, CpuBuffer<F>>,
        dout: View<'_, CpuBuffer<F>>,
        x: View<'_, CpuBuffer<F>>,
        w: View<'_, CpuBuffer<F>>,
        rstd: View<'_, CpuBuffer<F>>,
        width: usize,
    ) -> Result<()> {
        check::rmsnorm_backward(
            dout.len(),
            dx.len(),
            x.len(),
            dw.len(),
            w.len(),
            rstd.len(),
            width,
        )?;
        let mut op = OpBuilder::new("rmsnorm_backward");
        let (dout, x, w, rstd) = (op.r(&dout), op.r(&x), op.r(&w), op.r(&rstd));
        let (dx, dw) = (op.w(&dx), op.w(&dw));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (dx, dw) = unsafe { (dx.get(), dw.get()) };
                let (dout, x, w, rstd) = unsafe { (dout.get(), x.get(), w.get(), rstd.get()) };
                let rows = dx.len().min(x.len()).min(dout.len()) / width.max(1);
                // One sum and the dx pass per row, then the dw pass.
                let per = rows_per_part(workers.threads(), rows, width * 6);
                if gpu {
                    twin::llama::rmsnorm_backward(dx, dw, dout, x, w, rstd, width);
                } else if per >= rows {
                    run_auto(&exec, ops::RmsNormBackward(dx, dw, dout, x, w, rstd, width));
                } else {
                    // Rows split dx (a row's dx depends on that row alone); channels split
                    // dw, each channel summing every row in row order as the fused pass
                    // does. No sum crosses a split: the bits of one thread.
                    let n = rows * width;
                    let row_parts: Vec<_> = dx[..n]
                        .chunks_mut(per * width)
                        .zip(dout[..n].chunks(per * width))
                        .zip(x[..n].chunks(per * width))
                        .zip(rstd[..rows].chunks(per))
                        .collect();
                    let cols = channels_per_part(row_parts.len(), width);
                    let channel_parts: Vec<_> = dw[..width].chunks_mut(cols).enumerate().collect();
                    let (dout, x) = (&dout[..n], &x[..n]);
                    let jobs = zip_parts(row_parts, channel_parts);
                    workers.run(jobs, |(row_part, channel_part)| {
                        if let Some((((dx, dout), x), rstd)) = row_part {
                            let op = ops::RmsNormBackwardDx(dx, dout, x, w, rstd, width);
                            run_auto(&exec, op);
                        }
                        if let Some((k, dw)) = channel_part {
                            let op = ops::RmsNormBackwardDw(dw, dout, x, rstd, width, k * cols);
                            run_auto(&exec, op);
                        }
                    });
                }
                Ok(())
            })?,
        )
    }

    fn rope_gqa_forward<F: Scalar>(
        &self,
        stream: &CpuStream,
        qkv: ViewMut<'_, CpuBuffer<F>>,
        q: View<'_, CpuBuffer<F>>,
        k: View<'_, CpuBuffer<F>>,
        v: View<'_, CpuBuffer<F>>,
        shape: RopeShape,
    ) -> Result<()> {
        let name = "rope_gqa_forward";
        check::rope_gqa(name, qkv.len(), q.len(), k.len(), v.len(), &shape)?;
        let mut op = OpBuilder::new(name);
        let (q, k, v, qkv) = (op.r(&q), op.r(&k), op.r(&v), op.w(&qkv));
        let gpu = self.gpu_order();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (qkv, q, k, v) = unsafe { (qkv.get(), q.get(), k.get(), v.get()) };
                if gpu {
                    twin::llama::rope_gqa_forward(qkv, q, k, v, shape);
                } else {
                    run_auto(&exec, ops::RopeGqaForward(qkv, q, k, v, shape));
                }
                Ok(())
            })?,
        )
    }

    fn rope_gqa_backward<F: Scalar>(
        &self,
        stream: &CpuStream,
        dq: ViewMut<'_, CpuBuffer<F>>,
        dk: ViewMut<'_, CpuBuffer<F>>,
        dv: ViewMut<'_, CpuBuffer<F>>,
        dqkv: View<'_, CpuBuffer<F>>,
        shape: RopeShape,
    ) -> Result<()> {
        let name = "rope_gqa_backward";
        check::rope_gqa(name, dqkv.len(), dq.len(), dk.len(), dv.len(), &shape)?;
        let mut op = OpBuilder::new(name);
        let (dqkv, dq, dk, dv) = (op.r(&dqkv), op.w(&dq), op.w(&dk), op.w(&dv));
        let gpu = self.gpu_order();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (dq, dk, dv) = unsafe { (dq.get(), dk.get(), dv.get()) };
                let dqkv = unsafe { dqkv.get() };
                if gpu {
                    twin::llama::rope_gqa_backward(dq, dk, dv, dqkv, shape);
                } else {
                    run_auto(&exec, ops::RopeGqaBackward(dq, dk, dv, dqkv, shape));
                }
                Ok(())
            })?,
        )
    }

    fn swiglu_forward<F: Scalar>(
        &self,
        stream: &CpuStream,
        out: ViewMut<'_, CpuBuffer<F>>,
        a: View<'_, CpuBuffer<F>>,
        b: View<'_, CpuBuffer<F>>,
    ) -> Result<()> {
        same_len("swiglu_forward", "a", a.len(), out.len())?;
        same_len("swiglu_forward", "b", b.len(), out.len())?;
        let mut op = OpBuilder::new("swiglu_forward");
        let (a, b, out) = (op.r(&a), op.r(&b), op.w(&out));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (out, a, b) = unsafe { (out.get(), a.get(), b.get()) };
                if gpu {
                    twin::llama::swiglu_forward(out, a, b);
                    return Ok(());
                }
                let per = rows_per_part(workers.threads(), out.len(), 16);
                let jobs: Vec<_> = out
                    .chunks_mut(per)
                    .zip(a.chunks(per))
                    .zip(b.chunks(per))
                    .collect();
                workers.run(jobs, |((o, a), b)| {
                    run_auto(&exec, ops::SwigluForward(o, a, b))
                });
                Ok(())
            })?,
        )
    }

    fn swiglu_backward<F: Scalar>(
        &self,
        stream: &CpuStream,
        da: ViewMut<'_, CpuBuffer<F>>,
        db: ViewMut<'_, CpuBuffer<F>>,
        dout: View<'_, CpuBuffer<F>>,
        a: View<'_, CpuBuffer<F>>,
        b: View<'_, CpuBuffer<F>>,
    ) -> Result<()> {
        let name = "swiglu_backward";
        for (what, len) in [
            ("db", db.len()),
            ("dout", dout.len()),
            ("a", a.len()),
            ("b", b.len()),
        ] {
            same_len(name, what, len, da.len())?;
        }
        let mut op = OpBuilder::new(name);
        let (dout, a, b) = (op.r(&dout), op.r(&a), op.r(&b));
        let (da, db) = (op.w(&da), op.w(&db));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (da, db) = unsafe { (da.get(), db.get()) };
                let (dout, a, b) = unsafe { (dout.get(), a.get(), b.get()) };
                if gpu {
                    twin::llama::swiglu_backward(da, db, dout, a, b);
                    return Ok(());
                }
                let per = rows_per_part(workers.threads(), da.len(), 16);
                let jobs: Vec<_> = da
                    .chunks_mut(per)
                    .zip(db.chunks_mut(per))
                    .zip(dout.chunks(per))
                    .zip(a.chunks(per))
                    .zip(b.chunks(per))
                    .collect();
                workers.run(jobs, |((((da, db), d), a), b)| {
                    run_auto(&exec, ops::SwigluBackward(da, db, d, a, b))
                });
                Ok(())
            })?,
        )
    }

    fn add<F: Scalar>(
        &self,
        stream: &CpuStream,
        dst: ViewMut<'_, CpuBuffer<F>>,
        src: View<'_, CpuBuffer<F>>,
    ) -> Result<()> {
        same_len("add", "src", src.len(), dst.len())?;
        let mut op = OpBuilder::new("add");
        let (src, dst) = (op.r(&src), op.w(&dst));
        let gpu = self.gpu_order();
        let workers = self.gemm().workers().clone();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let (dst, src) = unsafe { (dst.get(), src.get()) };
                if gpu {
                    twin::elementwise::add_into(dst, src);
                } else {
                    let per = rows_per_part(workers.threads(), dst.len(), 1);
                    let jobs: Vec<_> = dst.chunks_mut(per).zip(src.chunks(per)).collect();
                    workers.run(jobs, |(d, s)| run_auto(&exec, ops::AddInto(d, s)));
                }
                Ok(())
            })?,
        )
    }

    fn scale<F: Scalar>(
        &self,
        stream: &CpuStream,
        dst: ViewMut<'_, CpuBuffer<F>>,
        a: F,
    ) -> Result<()> {
        let mut op = OpBuilder::new("scale");
        let dst = op.w(&dst);
        let gpu = self.gpu_order();
        let exec = *self.exec();
        self.submit(
            stream,
            op.finish(move || {
                // SAFETY: see the module documentation.
                let dst = unsafe { dst.get() };
                if gpu {
                    twin::elementwise::scale_into(dst, a);
                } else {
                    run_auto(&exec, ops::ScaleInto(dst, a));
                }
                Ok(())
            })?,
        )
    }
}

fn convert<S: Float, T: Float>(exec: &Exec, src: &[S], dst: &mut [T]) -> Result<()> {
    if S::DTYPE == T::DTYPE {
        dst.copy_from_slice(as_type(src));
        return Ok(());
    }
    match (S::DTYPE, T::DTYPE) {
        (DType::F32, _) => match T::half_mut(dst) {
            Some(h) => cast::narrow(exec, as_type(src), h),
            None => Err(KernelError::Device("cast: f32 to f32 is a copy".into())),
        },
        (_, DType::F32) => cast::widen(exec, S::float_slice(src), as_type_mut(dst)),
        _ => {
            // 16-bit -> the other 16-bit: through f32 (exact), then one rounding.
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = T::from_f32(s.to_f32());
            }
            Ok(())
        }
    }
}
