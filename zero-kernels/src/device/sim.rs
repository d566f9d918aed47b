//! A simulated device, for tests: CPU kernels, but run the way a GPU runs them, and
//! checked.
//!
//! - Every op is queued on its stream and runs later, when the host needs a result
//!   (a download, an event or stream sync, a host task, started host work), in a **seeded random
//!   interleaving** of the streams that respects only what the rules order: queue order
//!   within a stream and the events a stream waited for. Only the ops the awaited point
//!   depends on run; the rest stay queued.
//! - Every access is **checked when it is queued**: each op carries a vector clock (one
//!   component per stream, one for the host) of everything ordered before it, and each
//!   buffer remembers, per range, the last write and the reads since. An op that touches
//!   a range another agent wrote (or, for a write, read) without that access being in its
//!   clock fails with [`KernelError::Hazard`] naming the buffer, both ops and both
//!   streams. The check does not depend on the interleaving, so a missing
//!   [`Device::wait_event`](super::Device::wait_event) is found on the first run.
//! - A host task ([`Device::host_task`](super::Device::host_task): the collectives of a
//!   host transport) runs at once, after the ops ordered before it on its stream; it is
//!   an op of that stream, and the host learns nothing from it. Other streams must wait
//!   for an event to see its results, as they must for a stream-ordered NCCL collective,
//!   so the engine's ordering is checked for the GPU's rules, not the host's.
//!
//! - Started host work ([`Device::host_task_started`](super::Device::host_task_started):
//!   a non-blocking collective) is started at once, after the ops ordered before it on
//!   its stream, and left running ([`SimDevice::set_overlap`], on by default). What its
//!   stream queues afterwards waits behind it, as behind a GPU stream's wait on a host
//!   flag, while the other streams' ops run: the scheduler takes that stream's next op
//!   only once the work tests finished (`MPI_Test`, polled also whenever an op is
//!   queued), and blocks on it only when nothing else can run. So ops that follow a
//!   collective on its stream are checked to run only after it, whenever it finishes,
//!   and the time a rank blocked on communication is measured ([`Device::overlap_stats`]
//!   (super::Device::overlap_stats)), as on the host device.
//!
//! After the first error the device refuses every further call (the state of its buffers
//! is then meaningless).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::rc::Rc;
use std::time::Instant;

use super::cpu::{overlap, CpuEvent, CpuOp, CpuQueue, CpuStream, Ids, OpAccess};
use super::{Access, HostWork, OverlapStats, Result, Retained};
use crate::error::KernelError;
use crate::isa::Exec;
use crate::nn::Gemm;
use crate::twin::attention_products::AttentionKernels;

/// The host's index in a vector clock; stream i is agent i + 1.
const HOST: usize = 0;

/// A vector clock: component a = how many of agent a's steps are known to have happened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Clock(Vec<u64>);

impl Clock {
    fn get(&self, agent: usize) -> u64 {
        self.0.get(agent).copied().unwrap_or(0)
    }
    fn set(&mut self, agent: usize, v: u64) {
        if self.0.len() <= agent {
            self.0.resize(agent + 1, 0);
        }
        self.0[agent] = v;
    }
    fn join(&mut self, other: &Clock) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (a, &b) in self.0.iter_mut().zip(&other.0) {
            *a = (*a).max(b);
        }
    }
    /// Everything this clock has seen, `other` has seen too.
    fn le(&self, other: &Clock) -> bool {
        self.0.iter().enumerate().all(|(i, &v)| v <= other.get(i))
    }
}

struct Queued {
    #[cfg(test)]
    name: &'static str,
    seq: u64,
    clock: Clock,
    after: Vec<(usize, u64)>,
    /// The started host work this op stands for: it may run only once the work has
    /// finished (see the module documentation).
    started: Option<Rc<Started>>,
    run: Box<dyn FnOnce() -> Result<()>>,
}

/// Host work in flight ([`super::Device::host_task_started`]), with what it holds.
struct Started {
    name: &'static str,
    /// `None` once finished (or failed: then leaked, see [`Started::finish`]).
    work: RefCell<Option<Box<dyn HostWork>>>,
    /// The buffers it touches, kept allocated until it has finished.
    retain: RefCell<Vec<Retained>>,
    since: Instant,
    /// Start order (the oldest is blocked on first).
    order: u64,
}

impl Started {
    fn finished(&self) -> bool {
        self.work.borrow().is_none()
    }

    /// Poll (`block` false) or wait for the work; when it has finished, release what it
    /// held and account its time. Whether it has finished. On an error the transport
    /// may still hold the buffers' addresses, so they are never freed.
    fn finish(&self, block: bool, stats: &Cell<OverlapStats>) -> Result<bool> {
        let mut slot = self.work.borrow_mut();
        let Some(work) = slot.as_mut() else {
            return Ok(true);
        };
        let t0 = Instant::now();
        let done = if block {
            work.wait().map(|()| true)
        } else {
            work.test()
        };
        let done = match done {
            Ok(done) => done,
            Err(e) => {
                std::mem::forget(slot.take());
                std::mem::forget(std::mem::take(&mut *self.retain.borrow_mut()));
                return Err(match e {
                    KernelError::HostWork { .. } => e,
                    e => KernelError::Device(format!("host work '{}': {e}", self.name)),
                });
            }
        };
        if done {
            *slot = None;
            self.retain.borrow_mut().clear();
            let mut st = stats.get();
            if block {
                st.exposed_seconds += t0.elapsed().as_secs_f64();
            }
            st.total_seconds += self.since.elapsed().as_secs_f64();
            stats.set(st);
        }
        Ok(done)
    }
}

struct SimStream {
    name: Rc<str>,
    queue: VecDeque<Queued>,
    /// The causal past of the next op queued here (own component: ops queued so far).
    clock: Clock,
    /// Events waited for since the last op: the next op runs only after them.
    pending: Vec<(usize, u64)>,
    queued: u64,
    done: u64,
}

/// One access remembered for a range of a buffer.
#[derive(Clone, Debug)]
struct Record {
    range: Range<usize>,
    write: bool,
    agent: usize,
    stamp: u64,
    op: &'static str,
}

struct History {
    records: Vec<Record>,
}

struct State {
    rng: u64,
    streams: Vec<SimStream>,
    /// What the host knows has happened (its own component counts its reads).
    host: Clock,
    buffers: HashMap<u64, History>,
    failed: Option<String>,
    ops_run: u64,
    /// (stream, op) in the order they ran (tests look at the interleavings).
    #[cfg(test)]
    trace: Vec<(usize, &'static str)>,
}

/// A simulated device: queued, randomly interleaved, hazard-checked (see the module
/// documentation). A test tool: it computes what [`super::HostDevice`] computes, slower.
pub struct SimDevice {
    exec: Exec,
    gemm: Gemm,
    ids: Ids,
    seed: u64,
    /// Model ops run the CUDA kernels' CPU twins ([`crate::twin`]) instead of the
    /// vectorised host kernels: a simulated *GPU*, arithmetic order included.
    gpu_order: bool,
    /// f32 products with bf16 operands ([`super::Device::set_bf16_products`]): the host
    /// GEMM's bf16 mode, standing in for a GPU's tensor cores.
    bf16_products: Cell<bool>,
    /// The simulated GPU's attention kernels ([`SimDevice::set_attention_kernels`]).
    attention: Cell<AttentionKernels>,
    state: RefCell<State>,
    /// Leave started host work running ([`SimDevice::set_overlap`]).
    overlap: Cell<bool>,
    /// Started host work not yet seen finished (polled when ops are queued).
    in_flight: RefCell<Vec<Rc<Started>>>,
    /// Host work started so far (each one's [`Started::order`]).
    started: Cell<u64>,
    overlap_stats: Cell<OverlapStats>,
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice")
            .field("seed", &self.seed)
            .finish()
    }
}

impl SimDevice {
    /// A simulated device whose interleavings come from `seed`.
    pub fn new(seed: u64) -> Self {
        SimDevice::with_exec(seed, Exec::default(), 1)
    }

    /// A simulated GPU: as [`SimDevice::new`], but the model ops run the CPU twins of
    /// the CUDA kernels ([`crate::twin`]), in the GPU kernels' arithmetic order, so a run
    /// here executes the logic of the GPU path (streams, events, kernels) without a GPU.
    /// Matrix products stay the host GEMM (cuBLAS's order is its own), with bf16 operands
    /// when the engine trains in bf16, as tensor cores take them.
    pub fn gpu_twin(seed: u64) -> Self {
        let mut dev = SimDevice::new(seed);
        dev.gpu_order = true;
        dev
    }

    /// On a simulated GPU ([`SimDevice::gpu_twin`]), run attention as the CUDA device
    /// does with `k` ([`AttentionKernels::Products`]: the plan of batched products on the
    /// host GEMM and the row kernels' twins); the previous choice, or `None` (nothing
    /// changed) on a device that is not a simulated GPU.
    pub fn set_attention_kernels(&self, k: AttentionKernels) -> Option<AttentionKernels> {
        self.gpu_order.then(|| self.attention.replace(k))
    }

    /// As [`SimDevice::new`], the kernels as `exec` says, GEMMs on `gemm_threads` threads.
    pub fn with_exec(seed: u64, exec: Exec, gemm_threads: usize) -> Self {
        SimDevice {
            exec,
            gemm: Gemm::new(gemm_threads),
            ids: Ids::default(),
            seed,
            gpu_order: false,
            bf16_products: Cell::new(false),
            attention: Cell::new(AttentionKernels::Rows),
            state: RefCell::new(State {
                rng: seed ^ 0x5DEE_CE66_D1CE_4E5B,
                streams: Vec::new(),
                host: Clock::default(),
                buffers: HashMap::new(),
                failed: None,
                ops_run: 0,
                #[cfg(test)]
                trace: Vec::new(),
            }),
            overlap: Cell::new(true),
            in_flight: RefCell::new(Vec::new()),
            started: Cell::new(0),
            overlap_stats: Cell::new(OverlapStats::default()),
        }
    }

    /// Leave started host work (non-blocking collectives) running behind the ops that
    /// follow (`true`, the default; see the module documentation), or wait for each
    /// where it is started (`false`: what overlap hides is then measured against this).
    pub fn set_overlap(&self, on: bool) {
        self.overlap.set(on);
    }

    /// Whether started host work is left running ([`SimDevice::set_overlap`]).
    pub fn overlap(&self) -> bool {
        self.overlap.get()
    }

    /// Poll the started work in flight, so that its finish is seen (and timed) near when
    /// it happens, and the transport progresses (`MPI_Test`).
    fn poll_started(&self) -> Result<()> {
        if self.in_flight.borrow().is_empty() {
            return Ok(());
        }
        let mut failed = None;
        // A poll reaches only the transport (`MPI_Test`), never this device, so the list
        // stays borrowed.
        for w in self.in_flight.borrow().iter() {
            if let Err(e) = w.finish(false, &self.overlap_stats) {
                failed.get_or_insert(e);
            }
        }
        self.in_flight.borrow_mut().retain(|w| !w.finished());
        match failed {
            Some(e) => Err(self.fail(e)),
            None => Ok(()),
        }
    }

    /// Ops run so far (tests check the simulation did run them).
    pub fn ops_run(&self) -> u64 {
        self.state.borrow().ops_run
    }

    /// (stream index, op name) of every op run so far, in order.
    #[cfg(test)]
    pub(crate) fn trace(&self) -> Vec<(usize, &'static str)> {
        self.state.borrow().trace.clone()
    }

    /// Ops queued and not yet run.
    pub fn ops_pending(&self) -> usize {
        self.state
            .borrow()
            .streams
            .iter()
            .map(|s| s.queue.len())
            .sum()
    }

    fn failed(&self) -> Result<()> {
        match &self.state.borrow().failed {
            Some(msg) => Err(KernelError::Device(format!(
                "the simulated device stopped after an earlier error: {msg}"
            ))),
            None => Ok(()),
        }
    }

    fn fail(&self, e: KernelError) -> KernelError {
        let mut st = self.state.borrow_mut();
        if st.failed.is_none() {
            st.failed = Some(e.to_string());
        }
        e
    }

    /// Run queued ops in `target`'s causal past (all of them for `None`), in a random
    /// order that respects stream order and waited events.
    fn run_until(&self, target: Option<&Clock>) -> Result<()> {
        loop {
            let op = {
                let st = self.state.borrow();
                let mut ready = Vec::new();
                let mut parked = Vec::new();
                let mut blocked = false;
                for (i, s) in st.streams.iter().enumerate() {
                    let Some(front) = s.queue.front() else {
                        continue;
                    };
                    if target.is_some_and(|t| !front.clock.le(t)) {
                        continue;
                    }
                    if !front.after.iter().all(|&(j, k)| st.streams[j].done >= k) {
                        blocked = true;
                    } else {
                        match &front.started {
                            Some(work) if !work.finished() => parked.push((i, Rc::clone(work))),
                            _ => ready.push(i),
                        }
                    }
                }
                drop(st);
                // Started work that has finished meanwhile lets its stream go on.
                let mut waiting = Vec::new();
                for (i, work) in parked {
                    if work
                        .finish(false, &self.overlap_stats)
                        .map_err(|e| self.fail(e))?
                    {
                        ready.push(i);
                    } else {
                        waiting.push((i, work));
                    }
                }
                // Nothing else can run: block on the oldest started work.
                if ready.is_empty() {
                    if let Some((i, work)) = waiting.iter().min_by_key(|(_, w)| w.order) {
                        work.finish(true, &self.overlap_stats)
                            .map_err(|e| self.fail(e))?;
                        ready.push(*i);
                    }
                }
                let mut st = self.state.borrow_mut();
                if ready.is_empty() {
                    if blocked {
                        drop(st);
                        return Err(self.fail(KernelError::Device(
                            "simulated device deadlock: queued ops wait for events that can never complete".into(),
                        )));
                    }
                    return Ok(());
                }
                let pick = ready[(next_random(&mut st.rng) % ready.len() as u64) as usize];
                let op = st.streams[pick].queue.pop_front();
                op.map(|op| (pick, op))
            };
            let Some((stream, op)) = op else {
                return Ok(());
            };
            let outcome = (op.run)();
            let mut st = self.state.borrow_mut();
            st.streams[stream].done = op.seq;
            st.ops_run += 1;
            #[cfg(test)]
            st.trace.push((stream, op.name));
            if let Err(e) = outcome {
                drop(st);
                return Err(self.fail(e));
            }
        }
    }

    /// Check `op`'s accesses and queue it on `stream`; `started`: the op stands for that
    /// started host work.
    fn queue(&self, stream: &CpuStream, op: CpuOp, started: Option<Rc<Started>>) -> Result<()> {
        self.failed()?;
        self.poll_started()?;
        let checked = {
            let mut st = self.state.borrow_mut();
            let st = &mut *st;
            let agent = stream.index + 1;
            let mut clock = Self::tail_clock(st, stream.index);
            let seq = st.streams[stream.index].queued + 1;
            clock.set(agent, seq);
            check_all(st, op.name, agent, seq, &clock, &op.reads, &op.writes).map(|()| {
                let s = &mut st.streams[stream.index];
                s.queued = seq;
                s.clock = clock.clone();
                let after = std::mem::take(&mut s.pending);
                s.queue.push_back(Queued {
                    #[cfg(test)]
                    name: op.name,
                    seq,
                    clock,
                    after,
                    started,
                    run: op.run,
                });
            })
        };
        checked.map_err(|e| self.fail(e))
    }
    /// The causal past of a point at the end of `stream` now (what a new op there would see).
    fn tail_clock(st: &State, stream: usize) -> Clock {
        let mut c = st.streams[stream].clock.clone();
        c.join(&st.host);
        c
    }
}

/// SplitMix64 step (the interleaving only needs to be seeded and well mixed).
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn agent_name(st: &State, agent: usize) -> String {
    if agent == HOST {
        "the host".into()
    } else {
        format!("stream '{}'", st.streams[agent - 1].name)
    }
}

/// Check one access of `op` by `agent` (at `stamp`, knowing `clock`) against the buffer's
/// history, then record it.
#[allow(clippy::too_many_arguments)]
fn check_and_record(
    st: &mut State,
    op: &'static str,
    agent: usize,
    stamp: u64,
    clock: &Clock,
    id: u64,
    name: &str,
    range: &Range<usize>,
    write: bool,
) -> Result<()> {
    if range.is_empty() {
        return Ok(());
    }
    let history = st.buffers.entry(id).or_insert_with(|| History {
        records: Vec::new(),
    });
    let conflict = history
        .records
        .iter()
        .find(|r| (r.write || write) && overlap(&r.range, range) && clock.get(r.agent) < r.stamp)
        .cloned();
    if let Some(r) = conflict {
        let kind = match (r.write, write) {
            (true, false) => "read-after-write",
            (true, true) => "write-after-write",
            _ => "write-after-read",
        };
        let (me, them) = (agent_name(st, agent), agent_name(st, r.agent));
        let fix = if r.agent == HOST || agent == HOST {
            format!("the host must wait (sync) for {them} before it touches the buffer")
        } else {
            format!(
                "record an event on {them} after '{}' and wait for it on {me} before '{op}'",
                r.op
            )
        };
        return Err(KernelError::Hazard(format!(
            "{kind} hazard on buffer '{name}': '{op}' on {me} {} elements {:?}, but '{}' on {them} {} elements {:?} and nothing orders it before; {fix}",
            if write { "writes" } else { "reads" },
            range,
            r.op,
            if r.write { "wrote" } else { "read" },
            r.range,
        )));
    }
    let history = st.buffers.entry(id).or_insert_with(|| History {
        records: Vec::new(),
    });
    let covered = |r: &Record| r.range.start >= range.start && r.range.end <= range.end;
    if write {
        history.records.retain(|r| !covered(r));
    } else {
        history
            .records
            .retain(|r| r.write || r.agent != agent || !covered(r));
    }
    history.records.push(Record {
        range: range.clone(),
        write,
        agent,
        stamp,
        op,
    });
    Ok(())
}

fn check_all(
    st: &mut State,
    op: &'static str,
    agent: usize,
    stamp: u64,
    clock: &Clock,
    reads: &[OpAccess],
    writes: &[OpAccess],
) -> Result<()> {
    for a in reads {
        check_and_record(st, op, agent, stamp, clock, a.id, &a.name, &a.range, false)?;
    }
    for a in writes {
        check_and_record(st, op, agent, stamp, clock, a.id, &a.name, &a.range, true)?;
    }
    Ok(())
}

fn owned(accesses: &[Access<'_>]) -> Vec<OpAccess> {
    accesses
        .iter()
        .map(|a| OpAccess {
            id: a.id,
            name: Rc::from(a.name),
            range: a.range.clone(),
        })
        .collect()
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        // Started work still in flight (a step that failed half-way) holds buffer
        // addresses: wait for it before the buffers can go.
        for work in self.in_flight.take() {
            if let Err(e) = work.finish(true, &self.overlap_stats) {
                log::warn!("simulated device: host work in flight failed while shutting down: {e}");
            }
        }
    }
}

impl CpuQueue for SimDevice {
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
        if self.gpu_order {
            let attention = self.attention.get().description();
            format!(
                "simulated GPU (seed {}, CUDA kernels' CPU twins{attention})",
                self.seed
            )
        } else {
            format!("simulated device (seed {}, {})", self.seed, self.exec.isa())
        }
    }
    fn gpu_order(&self) -> bool {
        self.gpu_order
    }
    fn bf16_products(&self) -> bool {
        self.bf16_products.get()
    }
    fn set_bf16_products(&self, on: bool) -> bool {
        self.bf16_products.set(on);
        true
    }
    fn attention_kernels(&self) -> AttentionKernels {
        self.attention.get()
    }

    fn new_stream(&self, name: &str) -> Result<CpuStream> {
        self.failed()?;
        let mut st = self.state.borrow_mut();
        let index = st.streams.len();
        st.streams.push(SimStream {
            name: Rc::from(name),
            queue: VecDeque::new(),
            clock: Clock::default(),
            pending: Vec::new(),
            queued: 0,
            done: 0,
        });
        Ok(CpuStream {
            index,
            name: Rc::from(name),
        })
    }

    fn submit(&self, stream: &CpuStream, op: CpuOp) -> Result<()> {
        self.queue(stream, op, None)
    }

    fn record_event(&self, stream: &CpuStream) -> Result<CpuEvent> {
        self.failed()?;
        let st = self.state.borrow();
        let s = &st.streams[stream.index];
        let mut after = s.pending.clone();
        after.push((stream.index, s.queued));
        Ok(CpuEvent {
            after,
            clock: s.clock.0.clone(),
        })
    }

    fn wait_for(&self, stream: &CpuStream, event: &CpuEvent) -> Result<()> {
        self.failed()?;
        let mut st = self.state.borrow_mut();
        let s = &mut st.streams[stream.index];
        s.clock.join(&Clock(event.clock.clone()));
        s.pending.extend(event.after.iter().copied());
        Ok(())
    }

    fn sync(&self, event: &CpuEvent) -> Result<()> {
        self.failed()?;
        let target = Clock(event.clock.clone());
        self.run_until(Some(&target))?;
        self.state.borrow_mut().host.join(&target);
        Ok(())
    }

    fn sync_all(&self) -> Result<()> {
        self.failed()?;
        self.run_until(None)?;
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        for s in &st.streams {
            st.host.join(&s.clock);
        }
        Ok(())
    }

    fn run_host_task(
        &self,
        stream: &CpuStream,
        name: &'static str,
        reads: &[Access<'_>],
        writes: &[Access<'_>],
        task: &mut dyn FnMut(),
    ) -> Result<()> {
        self.failed()?;
        let target = Self::tail_clock(&self.state.borrow(), stream.index);
        self.run_until(Some(&target))?;
        let checked = {
            let mut st = self.state.borrow_mut();
            let st = &mut *st;
            let agent = stream.index + 1;
            let seq = st.streams[stream.index].queued + 1;
            let mut clock = target;
            clock.set(agent, seq);
            check_all(st, name, agent, seq, &clock, &owned(reads), &owned(writes)).map(|()| {
                let s = &mut st.streams[stream.index];
                s.queued = seq;
                s.done = seq;
                s.clock = clock;
                s.pending.clear();
            })
        };
        checked.map_err(|e| self.fail(e))?;
        task();
        Ok(())
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
        let count = |exposed: f64| {
            let mut st = self.overlap_stats.get();
            st.tasks += 1;
            st.exposed_seconds += exposed;
            st.total_seconds += exposed;
            self.overlap_stats.set(st);
        };
        if !self.overlap.get() {
            // Wait in place: a host task (timed from the start call: the stream's past,
            // which the host task runs first, is compute, not communication).
            let mut retain = Some(retain);
            let mut out = Ok(());
            let mut lost = false;
            let mut took = 0.0;
            self.run_host_task(stream, name, reads, writes, &mut || {
                let t0 = Instant::now();
                out = start().and_then(|mut work| {
                    work.wait().inspect_err(|_| {
                        // The transport may still hold the buffers' addresses: never
                        // free them.
                        std::mem::forget((work, retain.take()));
                        lost = true;
                    })
                });
                took = t0.elapsed().as_secs_f64();
            })?;
            count(took);
            return match out {
                Err(e) if lost => Err(self.fail(e)),
                out => out,
            };
        }
        self.failed()?;
        // The work reads what its stream's past wrote: run that first.
        let target = Self::tail_clock(&self.state.borrow(), stream.index);
        self.run_until(Some(&target))?;
        let t0 = Instant::now();
        let work = start()?;
        count(t0.elapsed().as_secs_f64());
        let started = Rc::new(Started {
            name,
            work: RefCell::new(Some(work)),
            retain: RefCell::new(retain),
            since: Instant::now(),
            order: self.started.get(),
        });
        self.started.set(self.started.get() + 1);
        let marker = Rc::clone(&started);
        let op = CpuOp {
            name,
            reads: owned(reads),
            writes: owned(writes),
            run: Box::new(move || {
                // The scheduler runs this op only once the work has finished.
                if marker.finished() {
                    Ok(())
                } else {
                    Err(KernelError::Device(format!(
                        "simulated device: '{}' ran before its host work finished",
                        marker.name
                    )))
                }
            }),
        };
        if let Err(e) = self.queue(stream, op, Some(Rc::clone(&started))) {
            // Never leave the transport writing into buffers that may go now.
            let _ = started.finish(true, &self.overlap_stats);
            return Err(e);
        }
        self.in_flight.borrow_mut().push(started);
        Ok(())
    }

    fn overlap_stats(&self) -> OverlapStats {
        self.overlap_stats.get()
    }

    fn host_read(&self, stream: &CpuStream, name: &'static str, read: &Access<'_>) -> Result<()> {
        self.failed()?;
        let target = Self::tail_clock(&self.state.borrow(), stream.index);
        self.run_until(Some(&target))?;
        let checked = {
            let mut st = self.state.borrow_mut();
            let st = &mut *st;
            st.host.join(&target);
            let stamp = st.host.get(HOST) + 1;
            st.host.set(HOST, stamp);
            let clock = st.host.clone();
            check_and_record(
                st,
                name,
                HOST,
                stamp,
                &clock,
                read.id,
                read.name,
                &read.range,
                false,
            )
        };
        checked.map_err(|e| self.fail(e))
    }
}
