//! The CPU as a device, eager: every op runs on the calling thread when it is queued, so
//! streams and events order nothing (everything is already in program order) and cost
//! nothing. The kernels are this crate's vectorised CPU kernels ([`Exec`]: instruction
//! set picked at run time, threads opt-in).
//!
//! One exception, overlap ([`HostDevice::set_overlap`], on by default): host work that
//! finishes later ([`Device::host_task_started`]: a non-blocking MPI collective) is
//! started and left running. Until it has finished, the ops queued on its stream wait in
//! a list behind it, and ops on other streams run at once, as before: compute runs while
//! the collective is in flight. Work started on a stream behind other work starts at once
//! too, when nothing in flight or queued on that stream writes an element it touches or
//! touches an element it writes (at most [`MAX_IN_FLIGHT`] at once): running it early
//! then changes no result, and the host does not wait. (A stage-3 backward starts the
//! next layer's gather right after this layer's reduce-scatter and the op that lands
//! it; waiting there for the reduce-scatter held compute up.) This relies on every piece
//! of started work declaring each buffer range it reads or writes (`zero-comm`'s
//! `on_stream` declares exactly the ranges it hands to MPI); [`super::SimDevice`] starts
//! work only after its stream's past, so it cannot check that. Open MPI moves a host
//! collective forward only inside MPI calls, so before every op it runs the device polls the work in flight (`MPI_Test`);
//! when one has finished, the ops waiting behind it run. Events name the started work
//! they come after; waiting for one (or a host task, or a read, on that stream) blocks
//! until it has finished. These are the GPU's ordering rules, which the engine is
//! checked against on [`super::SimDevice`], so what is correct there is correct here.
//!
//! [`Device::host_task_started`]: super::Device::host_task_started

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ops::Range;
use std::time::Instant;

use super::cpu::{CpuEvent, CpuOp, CpuQueue, CpuStream, Ids, OpAccess};
use super::{Access, HostWork, OverlapStats, Result, Retained};
use crate::isa::Exec;
use crate::nn::Gemm;

/// Most pieces of started work one stream keeps in flight; one more waits for the oldest.
/// Open MPI progresses several non-blocking collectives at once; a handful covers a
/// layer's gathers and reduce-scatters.
pub(crate) const MAX_IN_FLIGHT: usize = 4;

/// Elements of one buffer that started work reads or writes.
struct Touch {
    id: u64,
    range: Range<usize>,
    write: bool,
}

impl Touch {
    fn new(id: u64, range: &Range<usize>, write: bool) -> Touch {
        Touch {
            id,
            range: range.clone(),
            write,
        }
    }

    /// Both touch the same elements and at least one writes them: a race if both ran at
    /// once.
    fn conflicts(&self, other: &Touch) -> bool {
        self.id == other.id
            && (self.write || other.write)
            && self.range.start < other.range.end
            && other.range.start < self.range.end
    }
}

/// Host work in flight on one stream, and the ops queued there behind it.
struct Started {
    name: &'static str,
    work: Box<dyn HostWork>,
    /// The buffers the work reads and writes, kept allocated until it has finished.
    retain: Vec<Retained>,
    /// What it reads and writes, for starting the next work before it has finished.
    touches: Vec<Touch>,
    since: Instant,
    waiting: Vec<CpuOp>,
}

/// A stream's started work: what is in flight (oldest first, each with the ops queued
/// behind it, which run when it and all before it have finished), and how many have
/// started and finished.
#[derive(Default)]
struct StreamWork {
    in_flight: VecDeque<Started>,
    started: u64,
    finished: u64,
}

/// The CPU, running every op when it is queued.
pub struct HostDevice {
    exec: Exec,
    gemm: Gemm,
    ids: Ids,
    streams: RefCell<Vec<StreamWork>>,
    /// Any stream has work in flight (the fast path of every op skips the poll).
    busy: Cell<bool>,
    overlap: Cell<bool>,
    overlap_stats: Cell<OverlapStats>,
    /// f32 products with bf16 operands ([`super::Device::set_bf16_products`]).
    bf16_products: Cell<bool>,
}

impl std::fmt::Debug for HostDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostDevice")
            .field("exec", &self.exec)
            .field("gemm", &self.gemm)
            .field("overlap", &self.overlap.get())
            .field("bf16_products", &self.bf16_products.get())
            .finish_non_exhaustive()
    }
}

impl Default for HostDevice {
    fn default() -> Self {
        HostDevice::new()
    }
}

impl HostDevice {
    /// The best instruction set of this CPU, one thread (under MPI every rank owns a core).
    pub fn new() -> Self {
        HostDevice::with_exec(Exec::default(), 1)
    }

    /// The best instruction set of this CPU, every op on `threads` threads (0 is taken as
    /// 1): matrix products split C's rows, attention the heads of all its sequences (or,
    /// with fewer than half as many as threads, each product's rows), the row-wise ops
    /// their rows, the vectorised kernels their chunks. No result depends on the count.
    pub fn with_threads(threads: usize) -> Self {
        let threads = threads.max(1);
        let exec = Exec::default();
        let exec = exec.with_threads(threads).unwrap_or(exec);
        HostDevice::with_exec(exec, threads)
    }

    /// Threads the matrix products run on (the caller's included).
    pub fn threads(&self) -> usize {
        self.gemm.threads()
    }

    /// Kernels as `exec` says, matrix products on `gemm_threads` threads.
    pub fn with_exec(exec: Exec, gemm_threads: usize) -> Self {
        HostDevice {
            exec,
            gemm: Gemm::new(gemm_threads),
            ids: Ids::default(),
            streams: RefCell::new(Vec::new()),
            busy: Cell::new(false),
            overlap: Cell::new(true),
            overlap_stats: Cell::new(OverlapStats::default()),
            bf16_products: Cell::new(false),
        }
    }

    /// The kernels' execution settings.
    pub fn exec(&self) -> &Exec {
        &self.exec
    }

    /// Leave started host work (non-blocking collectives) running behind the ops that
    /// follow (`true`, the default), or wait for each where it is started (`false`:
    /// communication never overlaps compute; for measuring what overlap hides).
    pub fn set_overlap(&self, on: bool) {
        self.overlap.set(on);
    }

    /// Whether started host work is left running ([`HostDevice::set_overlap`]).
    pub fn overlap(&self) -> bool {
        self.overlap.get()
    }

    fn account(&self, exposed: f64, total: f64) {
        let mut s = self.overlap_stats.get();
        s.exposed_seconds += exposed;
        s.total_seconds += total;
        self.overlap_stats.set(s);
    }

    /// Poll every stream's work in flight; run the ops behind what has finished.
    fn progress(&self) -> Result<()> {
        if !self.busy.get() {
            return Ok(());
        }
        let n = self.streams.borrow().len();
        for s in 0..n {
            while self.advance(s, false)? {}
        }
        Ok(())
    }

    /// Finish stream `s`'s oldest work in flight (`block`), or poll it once; when
    /// finished, run the ops queued behind it. Whether one finished.
    fn advance(&self, s: usize, block: bool) -> Result<bool> {
        let taken = self
            .streams
            .borrow_mut()
            .get_mut(s)
            .and_then(|w| w.in_flight.pop_front());
        let Some(mut started) = taken else {
            return Ok(false);
        };
        let t0 = Instant::now();
        let finished = if block {
            started.work.wait().map(|()| true)
        } else {
            started.work.test()
        };
        let finished = match finished {
            Ok(f) => f,
            Err(e) => {
                // The transport may still hold the buffers' addresses (and its own
                // staging): never free them. The ops queued behind are dropped unrun.
                // The work started after it stays in flight, to be waited for as usual.
                std::mem::forget(started);
                if let Some(w) = self.streams.borrow_mut().get_mut(s) {
                    w.finished += 1;
                }
                self.refresh_busy();
                return Err(e);
            }
        };
        if !finished {
            if let Some(w) = self.streams.borrow_mut().get_mut(s) {
                w.in_flight.push_front(started);
            }
            return Ok(false);
        }
        let blocked = if block {
            t0.elapsed().as_secs_f64()
        } else {
            0.0
        };
        self.account(blocked, started.since.elapsed().as_secs_f64());
        drop(started.retain);
        if let Some(w) = self.streams.borrow_mut().get_mut(s) {
            w.finished += 1;
        }
        self.refresh_busy();
        let name = started.name;
        for op in started.waiting {
            (op.run)().map_err(|e| match e {
                crate::error::KernelError::HostWork { .. } => e,
                e => {
                    crate::error::KernelError::Device(format!("an op queued behind '{name}': {e}"))
                }
            })?;
        }
        Ok(true)
    }

    fn refresh_busy(&self) {
        let busy = self
            .streams
            .borrow()
            .iter()
            .any(|w| !w.in_flight.is_empty());
        self.busy.set(busy);
    }

    /// Block until stream `s` has finished its `n`-th started work (and ran what queued
    /// behind it).
    fn finish_through(&self, s: usize, n: u64) -> Result<()> {
        while self.streams.borrow().get(s).is_some_and(|w| w.finished < n) {
            if !self.advance(s, true)? {
                break;
            }
        }
        Ok(())
    }

    /// Block until stream `s` has no work in flight (and ran what queued behind it).
    fn drain(&self, s: usize) -> Result<()> {
        let started = self.streams.borrow().get(s).map_or(0, |w| w.started);
        self.finish_through(s, started)
    }

    /// Block until `event`'s work has finished, except on stream `skip`.
    fn wait_until(&self, event: &CpuEvent, skip: Option<usize>) -> Result<()> {
        for &(s, started) in &event.after {
            if Some(s) != skip {
                self.finish_through(s, started)?;
            }
        }
        Ok(())
    }

    /// Whether work touching `touches` may start on stream `s` now, ahead of the work in
    /// flight there and the ops queued behind it: none of them writes an element the new
    /// work touches or touches one it writes (so the order between them changes no
    /// result). Otherwise the host waits for the stream's work first, in stream order,
    /// as a GPU stream would.
    fn may_start_now(&self, s: usize, touches: &[Touch]) -> bool {
        let streams = self.streams.borrow();
        let Some(w) = streams.get(s) else {
            return true;
        };
        let clear = |t: &Touch| touches.iter().all(|n| !t.conflicts(n));
        let op_touch = |a: &OpAccess, write: bool| Touch::new(a.id, &a.range, write);
        w.in_flight.iter().all(|started| {
            started.touches.iter().all(clear)
                && started.waiting.iter().all(|op| {
                    (op.reads.iter().map(|a| op_touch(a, false)))
                        .chain(op.writes.iter().map(|a| op_touch(a, true)))
                        .all(|t| clear(&t))
                })
        })
    }

    /// Work in flight on stream `s`.
    fn in_flight(&self, s: usize) -> usize {
        self.streams
            .borrow()
            .get(s)
            .map_or(0, |w| w.in_flight.len())
    }

    fn drain_all(&self) -> Result<()> {
        let n = self.streams.borrow().len();
        for s in 0..n {
            self.drain(s)?;
        }
        Ok(())
    }
}

/// Wait for `work` here; if it fails, the transport may still hold the buffers'
/// addresses (and its own staging), so neither is ever freed.
fn wait_or_leak(mut work: Box<dyn HostWork>, retain: Vec<Retained>) -> Result<()> {
    match work.wait() {
        Ok(()) => Ok(()),
        Err(e) => {
            std::mem::forget((work, retain));
            Err(e)
        }
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        // Work still in flight (a step that failed half-way) holds buffer addresses:
        // finish all of it on every stream, whatever failed before it or on another.
        let n = self.streams.borrow().len();
        for s in 0..n {
            while let Err(e) = self.drain(s) {
                log::warn!("host device: work in flight failed while shutting down: {e}");
            }
        }
    }
}

impl CpuQueue for HostDevice {
    fn exec(&self) -> &Exec {
        &self.exec
    }
    fn gemm(&self) -> &Gemm {
        &self.gemm
    }
    fn next_id(&self) -> u64 {
        self.ids.next()
    }
    fn describe_queue(&self) -> String {
        let products = if self.bf16_products.get() {
            match crate::nn::gemm_bf16::Bf16Kernel::detect() {
                crate::nn::gemm_bf16::Bf16Kernel::Avx512Bf16 => ", bf16 products (avx512bf16)",
                crate::nn::gemm_bf16::Bf16Kernel::Avx2 => ", bf16 products (avx2)",
                crate::nn::gemm_bf16::Bf16Kernel::Portable => ", bf16 products (portable)",
                crate::nn::gemm_bf16::Bf16Kernel::Amx => ", bf16 products (amx)",
            }
        } else {
            ""
        };
        format!(
            "host ({}, {} thread(s){products})",
            self.exec.isa(),
            self.exec.threads().max(self.gemm.threads())
        )
    }
    fn bf16_products(&self) -> bool {
        self.bf16_products.get()
    }
    fn set_bf16_products(&self, on: bool) -> bool {
        self.bf16_products.set(on);
        true
    }
    fn new_stream(&self, name: &str) -> Result<CpuStream> {
        let mut streams = self.streams.borrow_mut();
        let index = streams.len();
        streams.push(StreamWork::default());
        Ok(CpuStream {
            index,
            name: name.into(),
        })
    }
    fn submit(&self, stream: &CpuStream, op: CpuOp) -> Result<()> {
        self.progress()?;
        let mut streams = self.streams.borrow_mut();
        let in_flight = streams
            .get_mut(stream.index)
            .and_then(|w| w.in_flight.back_mut());
        if let Some(started) = in_flight {
            started.waiting.push(op);
            return Ok(());
        }
        drop(streams);
        (op.run)()
    }
    fn record_event(&self, stream: &CpuStream) -> Result<CpuEvent> {
        let streams = self.streams.borrow();
        // After the work started on this stream so far (and so the ops queued behind it).
        let after = match streams.get(stream.index) {
            Some(w) if w.started > w.finished => vec![(stream.index, w.started)],
            _ => Vec::new(),
        };
        Ok(CpuEvent {
            after,
            clock: Vec::new(),
        })
    }
    fn wait_for(&self, stream: &CpuStream, event: &CpuEvent) -> Result<()> {
        // Another stream's later ops run when they are queued, so the host waits now; on
        // the event's own stream they queue behind its work anyway.
        self.wait_until(event, Some(stream.index))
    }
    fn sync(&self, event: &CpuEvent) -> Result<()> {
        self.wait_until(event, None)
    }
    fn sync_all(&self) -> Result<()> {
        self.drain_all()
    }
    fn run_host_task(
        &self,
        stream: &CpuStream,
        _name: &'static str,
        _reads: &[Access<'_>],
        _writes: &[Access<'_>],
        task: &mut dyn FnMut(),
    ) -> Result<()> {
        self.progress()?;
        self.drain(stream.index)?;
        task();
        Ok(())
    }
    fn host_read(&self, stream: &CpuStream, _name: &'static str, _read: &Access<'_>) -> Result<()> {
        self.drain(stream.index)
    }
    fn run_started_task(
        &self,
        stream: &CpuStream,
        name: &'static str,
        reads: &[Access<'_>],
        writes: &[Access<'_>],
        retain: Vec<Retained>,
        start: &mut dyn FnMut() -> Result<Box<dyn HostWork>>,
    ) -> Result<()> {
        self.progress()?;
        let touch = |a: &Access<'_>, write: bool| Touch::new(a.id, &a.range, write);
        let touches: Vec<Touch> = (reads.iter().map(|a| touch(a, false)))
            .chain(writes.iter().map(|a| touch(a, true)))
            .collect();
        // Work starts where the program reaches it (every rank starts its collectives in
        // program order, as MPI requires): at once when nothing on the stream before it
        // conflicts with it, else once the stream's work has finished.
        if !self.may_start_now(stream.index, &touches) {
            self.drain(stream.index)?;
        }
        while self.in_flight(stream.index) >= MAX_IN_FLIGHT {
            self.advance(stream.index, true)?;
        }
        let t0 = Instant::now();
        let work = start()?;
        let issued = t0.elapsed().as_secs_f64();
        let mut stats = self.overlap_stats.get();
        stats.tasks += 1;
        self.overlap_stats.set(stats);
        if !self.overlap.get() {
            let t1 = Instant::now();
            wait_or_leak(work, retain)?;
            let waited = issued + t1.elapsed().as_secs_f64();
            self.account(waited, waited);
            return Ok(());
        }
        self.account(issued, issued);
        let mut streams = self.streams.borrow_mut();
        let Some(w) = streams.get_mut(stream.index) else {
            drop(streams);
            return wait_or_leak(work, retain);
        };
        w.started += 1;
        w.in_flight.push_back(Started {
            name,
            work,
            retain,
            touches,
            since: Instant::now(),
            waiting: Vec::new(),
        });
        drop(streams);
        self.busy.set(true);
        Ok(())
    }
    fn overlap_stats(&self) -> OverlapStats {
        self.overlap_stats.get()
    }
}
