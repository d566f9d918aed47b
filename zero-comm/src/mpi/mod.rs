//! The MPI backend: `MpiComm`, a communicator over host memory.
//!
//! Calls go straight to the MPI C API (rsmpi's `ffi`) on the caller's buffers, so an f32
//! collective costs what the raw MPI call costs plus bookkeeping (a sequence number, the
//! accounting counters, and the watchdog's and check's work when enabled); rsmpi's safe
//! layer is bypassed because it discards MPI's return codes and has no MPI_IN_PLACE.
//! Every communicator we create uses MPI_ERRORS_RETURN, so each error code becomes a
//! `CommError::Mpi` with the rank in it. Half sums in `HalfSum::Upcast` mode stage through
//! f32 copies; everything else is zero-copy. Non-blocking reduce-scatters of sums run as
//! a ring of point-to-point messages (`ring.rs`), which spreads the additions over the
//! ranks where Open MPI's puts them all on rank 0.

pub(crate) mod check;
mod nodes;
pub(crate) mod ops;
pub(crate) mod progress;
mod ring;

use crate::buffer::Location;
use crate::communicator::{Communicator, InFlight, RawBuf, RawCall, ReduceOp};
use crate::config::{CommConfig, HalfSum};
use crate::error::{CollectiveCall, CommError, Result};
use crate::stats::{ring_bytes, CollectiveKind, CommStats, Counters};
use crate::watchdog::{set_up_comm, WatchSpec, WatchToken, Watchdog, Watched};
use mpi::ffi;
use ops::HalfOps;
use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a failed collective's other requests are waited for before the job is ended
/// instead (`MpiRequest::settle`): a message to a peer that failed too never completes,
/// and without a bound the error would wait for the watchdog, or forever without one.
pub(crate) const SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// Test `requests` until MPI has released every one (each is nulled when it completes)
/// or [`SETTLE_LIMIT`] has passed; true when none is left. A test that fails leaves its
/// request's state unknown: false.
///
/// # Safety
/// Each request is a live handle of this process (or MPI_REQUEST_NULL), not used
/// elsewhere meanwhile.
pub(crate) unsafe fn wait_bounded(requests: &mut [ffi::MPI_Request]) -> bool {
    let start = Instant::now();
    loop {
        let mut left = false;
        for r in requests.iter_mut() {
            if *r == ffi::RSMPI_REQUEST_NULL {
                continue;
            }
            let mut done: c_int = 0;
            if ffi::MPI_Test(r, &mut done, ffi::RSMPI_STATUS_IGNORE) != 0 {
                return false;
            }
            left |= done == 0;
        }
        if !left {
            return true;
        }
        if start.elapsed() >= SETTLE_LIMIT {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Address handed to MPI for empty output buffers (count 0: never written).
static EMPTY: u64 = 0;

extern "C" {
    fn zero_comm_mpi_in_place() -> *mut c_void;
}

/// State every communicator of one MPI initialisation shares.
pub(crate) struct Shared {
    pub(crate) world_rank: usize,
    pub(crate) config: CommConfig,
    pub(crate) ops: HalfOps,
    pub(crate) in_place: *mut c_void,
    pub(crate) watchdog: Option<Arc<Watchdog>>,
    /// Drives MPI's progress while non-blocking collectives are in flight (`progress.rs`).
    pub(crate) progress: Option<Arc<progress::ProgressThread>>,
}

/// A communicator over MPI (host memory). Not `Send`: MPI handles stay on the thread that
/// made them.
pub struct MpiComm {
    raw: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    // Rc: cloned into every request and error without allocating.
    name: Rc<str>,
    shared: Rc<Shared>,
    seq: Cell<u64>,
    /// Sequence numbers of the raw calls run through [`MpiComm::watched`].
    raw_seq: Cell<u64>,
    /// Sequence numbers of the set-up calls run through [`MpiComm::watched_set_up`].
    set_up_seq: Cell<u64>,
    counters: Counters,
    half_sum: Cell<HalfSum>,
    /// Device pointers go to MPI as they are (`--comm mpi-cuda`, after the CUDA-aware
    /// probe said yes: backend.rs).
    device_pointers: Cell<bool>,
    /// A duplicate of `raw` for the point-to-point messages of ring reduce-scatters
    /// (`ring.rs`), apart from anything a caller sends on `raw` (`as_raw`).
    ring_raw: ffi::MPI_Comm,
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

pub(crate) fn mpi_error_string(code: c_int) -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters as MPI_Error_string needs.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr() as *mut _, &mut len) };
    if rc != 0 {
        return format!("unknown MPI error {code}");
    }
    buf.truncate(len.max(0) as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

impl MpiComm {
    /// Run `f`, an MPI call made outside this communicator (a benchmark's raw baseline on
    /// the same ranks), under the watchdog as a `kind` of `count` x `dtype`: a peer that
    /// never joins it ends the job as in one of ours. Reported on `<name> (raw MPI)`,
    /// with its own sequence numbers.
    pub fn watched<R>(
        &self,
        kind: CollectiveKind,
        count: usize,
        dtype: crate::DType,
        f: impl FnOnce() -> R,
    ) -> R {
        let _watch = self.shared.watchdog.as_ref().map(|dog| {
            let seq = self.raw_seq.get();
            self.raw_seq.set(seq + 1);
            let what = Watched::Collective { kind, count, dtype };
            dog.enter(&format!("{} (raw MPI)", self.name), seq, what)
        });
        f()
    }

    /// Run `f`, a blocking MPI `call` of the set-up that is collective over this
    /// communicator (creating a communicator from it, the node-group exchange), under the
    /// watchdog: a rank that never makes it ends the job as in a collective, where it
    /// would otherwise hold every other rank with no time limit.
    pub(crate) fn watched_set_up<R>(
        &self,
        call: &'static str,
        purpose: &'static str,
        f: impl FnOnce() -> R,
    ) -> R {
        let seq = self.set_up_seq.get();
        self.set_up_seq.set(seq + 1);
        let _watch = enter_set_up(&self.shared, &self.name, seq, call, purpose);
        f()
    }

    /// Wrap a communicator handle we own (freed on drop), switching it to ERRORS_RETURN.
    pub(crate) fn adopt(raw: ffi::MPI_Comm, name: String, shared: Rc<Shared>) -> Result<Self> {
        let world_rank = shared.world_rank;
        let err = |call: &'static str, code: c_int| CommError::Mpi {
            rank: world_rank,
            call,
            collective: None,
            comm: name.clone(),
            code,
            message: mpi_error_string(code),
        };
        let (mut rank, mut size) = (0 as c_int, 0 as c_int);
        // SAFETY: `raw` is a valid communicator handle; the out-pointers are locals.
        unsafe {
            let rc = ffi::MPI_Comm_set_errhandler(raw, ffi::RSMPI_ERRORS_RETURN);
            if rc != 0 {
                return Err(err("MPI_Comm_set_errhandler", rc));
            }
            let rc = ffi::MPI_Comm_rank(raw, &mut rank);
            if rc != 0 {
                return Err(err("MPI_Comm_rank", rc));
            }
            let rc = ffi::MPI_Comm_size(raw, &mut size);
            if rc != 0 {
                return Err(err("MPI_Comm_size", rc));
            }
        }
        let mut ring_raw = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        // The new communicator's first set-up call (#0): every rank of it makes this one.
        let watch = enter_set_up(
            &shared,
            &name,
            0,
            "MPI_Comm_dup",
            "a second handle for the ring's messages",
        );
        // SAFETY: collective over `raw` (every caller of adopt is collective over it);
        // MPI writes one handle, which inherits `raw`'s error handler.
        let rc = unsafe { ffi::MPI_Comm_dup(raw, ring_raw.as_mut_ptr()) };
        drop(watch);
        if rc != 0 {
            return Err(err("MPI_Comm_dup", rc));
        }
        // SAFETY: written on success.
        let ring_raw = unsafe { ring_raw.assume_init() };
        let half_sum = shared.config.half_sum;
        Ok(MpiComm {
            raw,
            rank: rank as usize,
            size: size as usize,
            name: Rc::from(name.as_str()),
            shared,
            seq: Cell::new(0),
            raw_seq: Cell::new(0),
            set_up_seq: Cell::new(1),
            counters: Counters::default(),
            half_sum: Cell::new(half_sum),
            device_pointers: Cell::new(false),
            ring_raw,
        })
    }

    /// Hand device pointers to MPI as they are: only for a CUDA-aware MPI library
    /// ([`crate::backend::probe_cuda_aware`] said yes). Half-precision reductions stay
    /// refused on device memory: their sums run in host code (ops.rs).
    pub fn set_device_pointers(&self, on: bool) {
        self.device_pointers.set(on);
    }

    /// The raw MPI handle (for calls zero-comm does not wrap; keep it valid: do not free).
    pub fn as_raw(&self) -> ffi::MPI_Comm {
        self.raw
    }

    /// Number of collectives issued so far on this communicator (the next one's sequence
    /// number).
    pub fn sequence(&self) -> u64 {
        self.seq.get()
    }

    pub(crate) fn check_rc(&self, call: &'static str, rc: c_int) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        Err(CommError::Mpi {
            rank: self.shared.world_rank,
            call,
            collective: None,
            comm: self.name.to_string(),
            code: rc,
            message: mpi_error_string(rc),
        })
    }

    /// The ranks of this communicator on this node (MPI_COMM_TYPE_SHARED), in rank order.
    pub fn node_local(&self) -> Result<MpiComm> {
        let mut new = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        // SAFETY: collective over `self.raw`; MPI writes one handle.
        let rc = self.watched_set_up(
            "MPI_Comm_split_type",
            "finding the ranks on this node",
            || unsafe {
                ffi::MPI_Comm_split_type(
                    self.raw,
                    ffi::RSMPI_COMM_TYPE_SHARED,
                    self.rank as c_int,
                    ffi::RSMPI_INFO_NULL,
                    new.as_mut_ptr(),
                )
            },
        );
        self.check_rc("MPI_Comm_split_type", rc)?;
        // SAFETY: written on success.
        let raw = unsafe { new.assume_init() };
        let name = if &*self.name == "world" {
            "node".to_string()
        } else {
            format!("{}/node", self.name)
        };
        MpiComm::adopt(raw, name, Rc::clone(&self.shared))
    }

    /// Split into sub-groups (collective over this communicator): ranks passing the same
    /// `color` form one group, ordered by `key` then by rank; `None` joins no group and
    /// gets `Ok(None)`.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<MpiComm>> {
        let c = match color {
            Some(c) if c <= i32::MAX as u32 => c as c_int,
            Some(c) => {
                return Err(CommError::Size {
                    rank: self.shared.world_rank,
                    op: "split",
                    comm: self.name.to_string(),
                    detail: format!("color {c} exceeds {}", i32::MAX),
                })
            }
            // SAFETY: predefined constant.
            None => unsafe { ffi::RSMPI_UNDEFINED },
        };
        let mut new = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        // SAFETY: collective over `self.raw`; MPI writes one handle.
        let rc = self.watched_set_up("MPI_Comm_split", "splitting into groups", || unsafe {
            ffi::MPI_Comm_split(self.raw, c, key, new.as_mut_ptr())
        });
        self.check_rc("MPI_Comm_split", rc)?;
        // SAFETY: written on success.
        let raw = unsafe { new.assume_init() };
        // SAFETY: comparing with the predefined null handle.
        if raw == unsafe { ffi::RSMPI_COMM_NULL } {
            return Ok(None);
        }
        let name = format!("{}/split({})", self.name, c);
        MpiComm::adopt(raw, name, Rc::clone(&self.shared)).map(Some)
    }

    fn loc_check(&self, call: &RawCall) -> Result<()> {
        let bad = call
            .send
            .iter()
            .chain(std::iter::once(&call.recv))
            .find(|b| b.location != Location::Host);
        let half_reduction = call.op.is_some() && call.dtype.size_bytes() == 2;
        match bad {
            Some(_) if self.device_pointers.get() && !half_reduction => Ok(()),
            Some(b) => Err(CommError::Location {
                rank: self.shared.world_rank,
                op: call.kind.name(),
                location: b.location,
                backend: "host MPI",
            }),
            None => Ok(()),
        }
    }

    fn count(&self, call: &RawCall, n: usize) -> Result<c_int> {
        mpi_count_fits(self.shared.world_rank, &self.name, call, n)
    }

    /// Everything before the data moves: sequence number, consistency check, accounting,
    /// watchdog registration.
    fn begin(&self, call: &RawCall) -> Result<(bool, Option<WatchSpec>)> {
        self.loc_check(call)?;
        // Refused before the sequence number and the accounting move, so a refused call
        // leaves no trace (every rank refuses it alike: the lengths are the same).
        self.count(call, mpi_count(call.kind, call.recv.len, self.size))?;
        let upcast = call.dtype.is_half()
            && call.op == Some(ReduceOp::Sum)
            && self.half_sum.get() == HalfSum::Upcast;
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let spec = self.shared.watchdog.as_ref().map(|dog| WatchSpec {
            dog: Arc::clone(dog),
            comm: self.name.to_string(),
            seq,
            kind: call.kind,
            count: call.count(),
            dtype: call.dtype,
        });
        if self.shared.config.check {
            // The check's exchange blocks too: a rank that never arrives is a hang. (Not
            // recorded as completed: the collective itself has not run yet.)
            let _watch = spec.as_ref().map(WatchSpec::enter_unrecorded);
            check::check(self, seq, call, upcast)?;
        }
        let elem = if upcast { 4 } else { call.dtype.size_bytes() } as u64;
        let basis = match call.kind {
            CollectiveKind::ReduceScatter => call.send.map_or(0, |s| s.len),
            _ => call.recv.len,
        } as u64;
        let (sent, received) = ring_bytes(call.kind, self.size, self.rank, basis * elem, call.root);
        self.counters.record(call.kind, sent, received);
        Ok((upcast, spec))
    }

    /// Issue `call` (blocking when `req` is None, else non-blocking into `*req`) on buffers
    /// already in MPI's wire types.
    ///
    /// # Safety
    /// Buffers valid as `Communicator::execute`/`start` require.
    unsafe fn issue(
        &self,
        call: &RawCall,
        dt: ffi::MPI_Datatype,
        mpi_op: ffi::MPI_Op,
        send: Option<*const c_void>,
        recv: *mut c_void,
        req: Option<&mut ffi::MPI_Request>,
    ) -> Result<()> {
        let in_place = self.shared.in_place as *const c_void;
        // An empty Vec<u8>'s dangling address is 0x1, which is Open MPI's MPI_IN_PLACE:
        // give MPI a real (never written: count 0) address for empty outputs.
        let recv = if call.recv.len == 0 {
            std::ptr::addr_of!(EMPTY) as *mut c_void
        } else {
            recv
        };
        // Two empty buffers may share a dangling address, which MPI rejects as aliasing
        // (MPI_ERR_BUFFER); with nothing to move, in place is the same call.
        let sendp = match send {
            Some(p) if call.recv.len > 0 => p,
            _ => in_place,
        };
        // What MPI receives per call: for an all-gather and an all-to-all the block per
        // rank, not the whole output (checked in `begin`).
        let n = self.count(call, mpi_count(call.kind, call.recv.len, self.size))?;
        let (rc, name) = match (call.kind, req) {
            (CollectiveKind::Barrier, None) => (ffi::MPI_Barrier(self.raw), "MPI_Barrier"),
            (CollectiveKind::Barrier, Some(r)) => (ffi::MPI_Ibarrier(self.raw, r), "MPI_Ibarrier"),
            (CollectiveKind::AllReduce, None) => (
                ffi::MPI_Allreduce(sendp, recv, n, dt, mpi_op, self.raw),
                "MPI_Allreduce",
            ),
            (CollectiveKind::AllReduce, Some(r)) => (
                ffi::MPI_Iallreduce(sendp, recv, n, dt, mpi_op, self.raw, r),
                "MPI_Iallreduce",
            ),
            (CollectiveKind::ReduceScatter, None) => (
                ffi::MPI_Reduce_scatter_block(sendp, recv, n, dt, mpi_op, self.raw),
                "MPI_Reduce_scatter_block",
            ),
            (CollectiveKind::ReduceScatter, Some(r)) => (
                ffi::MPI_Ireduce_scatter_block(sendp, recv, n, dt, mpi_op, self.raw, r),
                "MPI_Ireduce_scatter_block",
            ),
            (CollectiveKind::AllGather, None) => (
                ffi::MPI_Allgather(sendp, n, dt, recv, n, dt, self.raw),
                "MPI_Allgather",
            ),
            (CollectiveKind::AllGather, Some(r)) => (
                ffi::MPI_Iallgather(sendp, n, dt, recv, n, dt, self.raw, r),
                "MPI_Iallgather",
            ),
            // Equal blocks: `size` of them in both buffers (checked by the typed layer).
            (CollectiveKind::AllToAll, None) => (
                ffi::MPI_Alltoall(sendp, n, dt, recv, n, dt, self.raw),
                "MPI_Alltoall",
            ),
            (CollectiveKind::AllToAll, Some(r)) => (
                ffi::MPI_Ialltoall(sendp, n, dt, recv, n, dt, self.raw, r),
                "MPI_Ialltoall",
            ),
            (CollectiveKind::Broadcast, None) => (
                ffi::MPI_Bcast(recv, n, dt, call.root as c_int, self.raw),
                "MPI_Bcast",
            ),
            (CollectiveKind::Broadcast, Some(r)) => (
                ffi::MPI_Ibcast(recv, n, dt, call.root as c_int, self.raw, r),
                "MPI_Ibcast",
            ),
        };
        if rc == 0 {
            return Ok(());
        }
        Err(self.collective_err(name, rc, self.issued(call)))
    }

    /// `call`, the collective `begin` has just numbered, as errors name it.
    fn issued(&self, call: &RawCall) -> CollectiveCall {
        CollectiveCall {
            kind: call.kind,
            seq: self.seq.get().wrapping_sub(1),
            count: call.count(),
            dtype: call.dtype,
        }
    }

    /// MPI's `call` failed with `rc` inside `collective`.
    fn collective_err(
        &self,
        call: &'static str,
        rc: c_int,
        collective: CollectiveCall,
    ) -> CommError {
        CommError::Mpi {
            rank: self.shared.world_rank,
            call,
            collective: Some(collective),
            comm: self.name.to_string(),
            code: rc,
            message: mpi_error_string(rc),
        }
    }

    /// Lower `call` to MPI, staging halves through f32 when summing by upcast; blocking
    /// when `nonblocking` is false.
    unsafe fn run(&self, call: &RawCall, nonblocking: bool) -> Result<MpiRequest> {
        let (upcast, spec) = self.begin(call)?;
        // Blocking: watched for the whole call; non-blocking: while waited on (see WatchSpec).
        // Recorded as completed only once it succeeded (below).
        let watch = if nonblocking {
            None
        } else {
            spec.as_ref().map(WatchSpec::enter_unrecorded)
        };
        let mut req = MpiRequest {
            // SAFETY: predefined constant.
            raw: ffi::RSMPI_REQUEST_NULL,
            ring: None,
            stage: None,
            watch: if nonblocking { spec } else { None },
            progress: match nonblocking {
                true => self.shared.progress.as_ref().map(|p| p.track()),
                false => None,
            },
            done: !nonblocking,
            world_rank: self.shared.world_rank,
            comm: Rc::clone(&self.name),
            collective: self.issued(call),
            failed: None,
        };
        if upcast {
            // Sum in f32: widen the input, reduce with MPI's SUM, round back at completion.
            let input = call.send.unwrap_or(call.recv);
            // Owned by the request before MPI sees it: a launch that fails with a message
            // still in flight leaves it to the request's drop, which leaks it.
            let stage = req.stage.insert(Stage {
                result_in_input: call.kind == CollectiveKind::AllReduce,
                tmp_in: ops::upcast(input.ptr, input.len, call.dtype),
                tmp_out: vec![0f32; call.recv.len],
                out: call.recv,
                dtype: call.dtype,
            });
            let (send, recv) = match call.kind {
                // In place on the f32 copy.
                CollectiveKind::AllReduce => (None, stage.tmp_in.as_mut_ptr() as *mut c_void),
                _ => (
                    Some(stage.tmp_in.as_ptr() as *const c_void),
                    stage.tmp_out.as_mut_ptr() as *mut c_void,
                ),
            };
            let ring = Some(ring::Element::F32);
            self.launch(
                call,
                ring,
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_SUM,
                send,
                recv,
                &mut req,
            )?;
        } else {
            let dt = ops::datatype(call.dtype);
            let op = call
                .op
                .map_or(ffi::RSMPI_SUM, |o| self.shared.ops.op(o, call.dtype));
            let send = call.send.map(|s: RawBuf| s.ptr as *const c_void);
            let ring = match call.op.unwrap_or(ReduceOp::Sum) {
                ReduceOp::Sum => ring::Element::of(call.dtype),
                _ => None,
            };
            self.launch(
                call,
                ring,
                dt,
                op,
                send,
                call.recv.ptr as *mut c_void,
                &mut req,
            )?;
        }
        if !nonblocking {
            req.finish();
        }
        if let Some(watch) = watch {
            watch.completed();
        }
        Ok(req)
    }

    /// Issue `call` into `req`: a non-blocking reduce-scatter of a sum the ring adds
    /// (`ring` the element it sums) runs as a ring over `ring_raw` (`ring.rs`) on host
    /// buffers, everything else goes to MPI ([`MpiComm::issue`]; blocking when `req` is
    /// finished already, i.e. `req.done`).
    ///
    /// # Safety
    /// As [`MpiComm::issue`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch(
        &self,
        call: &RawCall,
        ring: Option<ring::Element>,
        dt: ffi::MPI_Datatype,
        mpi_op: ffi::MPI_Op,
        send: Option<*const c_void>,
        recv: *mut c_void,
        req: &mut MpiRequest,
    ) -> Result<()> {
        let nonblocking = !req.done;
        let on_host = call.recv.location == Location::Host
            && call.send.is_none_or(|b| b.location == Location::Host);
        // Past 2 ranks, small blocks stay with MPI: there the time is latency, and the
        // ring's N - 1 steps, each waiting for its owner's next test, cost more than rank
        // 0's additions (the 4-rank demo's stage 2 step: 10.6 ms ring, 9.7 ms MPI's).
        let big_enough = self.size == 2 || call.recv.len >= ring::MIN_BLOCK_PAST_TWO_RANKS;
        let ring = ring.filter(|_| {
            nonblocking
                && call.kind == CollectiveKind::ReduceScatter
                && !self.shared.config.mpi_reduce_scatter
                && self.size > 1
                && call.recv.len > 0
                && big_enough
                && on_host
        });
        match (ring, send) {
            (Some(element), Some(input)) => {
                let block = self.count(call, call.recv.len)?;
                // Tags are at least 0..=32767 (MPI_TAG_UB): the sequence number within
                // that keeps the rings in flight together apart.
                let tag = (self.seq.get().wrapping_sub(1) % 32768) as c_int;
                let spec = ring::RingSpec {
                    comm: self.ring_raw,
                    rank: self.rank,
                    size: self.size,
                    block: block as usize,
                    element,
                    datatype: dt,
                    tag,
                };
                match ring::Ring::start(spec, input, recv) {
                    Ok(started) => {
                        req.ring = Some(started);
                        Ok(())
                    }
                    Err(failure) => {
                        let (name, rc) = failure.error;
                        let e = req.err(name, rc);
                        // The f32 staging (upcast) is leaked by `run` when not settled.
                        if !failure.settled && req.stage.is_none() {
                            req.abort_in_use(&e);
                        }
                        Err(e)
                    }
                }
            }
            _ => {
                let rptr = if nonblocking {
                    Some(&mut req.raw)
                } else {
                    None
                };
                self.issue(call, dt, mpi_op, send, recv, rptr)
            }
        }
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        // Freeing after MPI_Finalize is erroneous; MPI freed it then anyway.
        if !mpi::environment::is_finalized() {
            // SAFETY: we own these handles (created by dup/split) and drop them once.
            unsafe {
                ffi::MPI_Comm_free(&mut self.ring_raw);
                ffi::MPI_Comm_free(&mut self.raw);
            }
        }
    }
}

/// The element count MPI receives in one call of `kind` on `size` ranks whose output
/// holds `recv_len`: the whole output for an all-reduce, a broadcast and a reduce-scatter
/// (its output is this rank's block), one rank's block for an all-gather and an
/// all-to-all (MPI counts per rank, not the gathered whole), nothing for a barrier.
fn mpi_count(kind: CollectiveKind, recv_len: usize, size: usize) -> usize {
    match kind {
        CollectiveKind::Barrier => 0,
        CollectiveKind::AllGather | CollectiveKind::AllToAll => recv_len / size.max(1),
        CollectiveKind::AllReduce | CollectiveKind::ReduceScatter | CollectiveKind::Broadcast => {
            recv_len
        }
    }
}

/// `n`, MPI's count for `call`, as MPI's `int`; above `c_int::MAX` a `Size` error (for
/// world rank `rank` on `comm`) that says how to make it fit.
fn mpi_count_fits(rank: usize, comm: &str, call: &RawCall, n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| CommError::Size {
        rank,
        op: call.kind.name(),
        comm: comm.to_string(),
        detail: format!(
            "{n} {} elements{} exceed MPI's count limit of {} per call; split the data into collectives of at most that many (in the engine: a smaller zero.bucket_elems, or more ranks so that each holds a smaller partition)",
            call.dtype.name(),
            match call.kind {
                CollectiveKind::AllGather | CollectiveKind::AllToAll => " per rank",
                _ => "",
            },
            c_int::MAX
        ),
    })
}

/// f32 staging of a half sum (HalfSum::Upcast).
struct Stage {
    result_in_input: bool,
    tmp_in: Vec<f32>,
    tmp_out: Vec<f32>,
    out: RawBuf,
    dtype: crate::DType,
}

/// A started MPI collective (non-blocking), or a finished one (blocking).
struct MpiRequest {
    raw: ffi::MPI_Request,
    /// A reduce-scatter run as a ring (`ring.rs`) instead of `raw`.
    ring: Option<ring::Ring>,
    stage: Option<Stage>,
    watch: Option<WatchSpec>,
    /// Counted by the progress thread while in flight.
    progress: Option<progress::Tracked>,
    done: bool,
    world_rank: usize,
    comm: Rc<str>,
    /// Which collective this is, for its errors (a failed test or wait names it as the
    /// watchdog would).
    collective: CollectiveCall,
    /// The MPI call that failed in a test or wait and its code: every later test or wait
    /// returns it again (MPI has freed the request, and waiting on its null handle would
    /// report success over a collective that never finished).
    failed: Option<(&'static str, c_int)>,
}

impl MpiRequest {
    /// After MPI completed: round staged sums back, stop watching and record the
    /// collective as completed (found done by a test, it was never in a wait whose token
    /// records it).
    fn finish(&mut self) {
        if let Some(st) = self.stage.take() {
            let src = if st.result_in_input {
                &st.tmp_in
            } else {
                &st.tmp_out
            };
            // SAFETY: `out` is the caller's output buffer, still borrowed (scope or call).
            unsafe { ops::round_back(src, st.out.ptr, st.dtype) };
        }
        self.ring = None;
        if let Some(watch) = self.watch.take() {
            watch.completed();
        }
        self.progress = None;
        self.done = true;
    }

    fn err(&self, call: &'static str, rc: c_int) -> CommError {
        CommError::Mpi {
            rank: self.world_rank,
            call,
            collective: Some(self.collective),
            comm: self.comm.to_string(),
            code: rc,
            message: mpi_error_string(rc),
        }
    }

    /// A test or wait failed in MPI's `call` with `rc`: the error to return, once MPI no
    /// longer uses the collective's buffers.
    ///
    /// Why: the buffers are the caller's, borrowed only until the error is returned (a
    /// [`crate::Scope`] hands them back), while a collective's other requests (the ring's
    /// second message, a collective MPI did not finish) may still read or write them. So
    /// every request still active is cancelled and completed, or waited out, first; where
    /// MPI keeps one anyway, returning would let safe code free memory MPI writes, and the
    /// process ends instead. Staged sums (upcast) run on buffers of the request's own,
    /// which its drop leaks: their error can be returned regardless.
    fn fail(&mut self, call: &'static str, rc: c_int) -> CommError {
        if self.failed.is_none() {
            self.failed = Some((call, rc));
            let settled = self.settle();
            if !settled && self.stage.is_none() {
                self.abort_in_use(&self.err(call, rc));
            }
            if settled {
                // Nothing of it is in flight: its staging and partial blocks may be freed.
                self.done = true;
                self.ring = None;
                self.watch = None;
                self.progress = None;
            }
        }
        self.err(call, rc)
    }

    /// After a failed test or wait: release every request of this collective MPI still
    /// holds; true when none is left.
    fn settle(&mut self) -> bool {
        // The cancels and waits below may wait for a peer: watched as a wait of this
        // collective is (a failed test was not watched yet), never recorded as completed.
        let _watch = self.watch.as_ref().map(WatchSpec::enter_unrecorded);
        if let Some(ring) = self.ring.as_mut() {
            // SAFETY: the ring's own requests, by its owner.
            return unsafe { ring.settle() };
        }
        // SAFETY: `raw` is this request's handle (null once MPI freed it, as Open MPI does
        // for a request whose test or wait reported its error); the status is ignored.
        // A non-blocking collective cannot be cancelled (MPI-3.1 5.12): wait it out, for
        // a while.
        unsafe { wait_bounded(std::slice::from_mut(&mut self.raw)) }
    }

    /// End the job: MPI may still write the caller's buffers of this collective after
    /// `error`, and returning it would let them be freed or reused.
    fn abort_in_use(&self, error: &CommError) -> ! {
        crate::exit::line_to_stderr(&format!(
            "{error}; MPI did not release the collective's other requests, which may still use the caller's buffers after an error is returned: ending the job instead"
        ));
        crate::exit::abort_world(1)
    }
}

impl Drop for MpiRequest {
    fn drop(&mut self) {
        // Dropped before it completed or was settled (a failed step): MPI may still write
        // the f32 staging, and MPI_Request_free is erroneous for a collective. Never
        // free it.
        if !self.done {
            if let Some(stage) = self.stage.take() {
                std::mem::forget(stage);
            }
            // Its messages may still read and write the partial blocks.
            if let Some(ring) = self.ring.take() {
                std::mem::forget(ring);
            }
        }
    }
}

impl InFlight for MpiRequest {
    fn test(&mut self) -> Result<bool> {
        if let Some((call, rc)) = self.failed {
            return Err(self.err(call, rc));
        }
        if self.done {
            return Ok(true);
        }
        if let Some(ring) = self.ring.as_mut() {
            // SAFETY: the ring's buffers are borrowed until it finishes (the collective's
            // contract); only the owner tests it.
            return match unsafe { ring.advance(false) } {
                Ok(true) => {
                    self.finish();
                    Ok(true)
                }
                Ok(false) => Ok(false),
                Err((call, rc)) => Err(self.fail(call, rc)),
            };
        }
        let mut flag: c_int = 0;
        // SAFETY: `raw` is an active request; the status is ignored.
        let rc = unsafe { ffi::MPI_Test(&mut self.raw, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        if rc != 0 {
            return Err(self.fail("MPI_Test", rc));
        }
        if flag != 0 {
            self.finish();
        }
        Ok(flag != 0)
    }

    fn wait(&mut self) -> Result<()> {
        if let Some((call, rc)) = self.failed {
            return Err(self.err(call, rc));
        }
        if self.done {
            return Ok(());
        }
        // Recorded as completed by `finish`, on success only.
        let _watch = self.watch.as_ref().map(WatchSpec::enter_unrecorded);
        if let Some(ring) = self.ring.as_mut() {
            // SAFETY: as in `test`.
            if let Err((call, rc)) = unsafe { ring.advance(true) } {
                return Err(self.fail(call, rc));
            }
            self.finish();
            return Ok(());
        }
        // SAFETY: `raw` is an active request; the status is ignored.
        let rc = unsafe { ffi::MPI_Wait(&mut self.raw, ffi::RSMPI_STATUS_IGNORE) };
        if rc != 0 {
            return Err(self.fail("MPI_Wait", rc));
        }
        self.finish();
        Ok(())
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn world_rank(&self) -> usize {
        self.shared.world_rank
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn stats(&self) -> CommStats {
        self.counters.snapshot()
    }
    fn reset_stats(&self) {
        self.counters.reset()
    }
    fn half_sum(&self) -> HalfSum {
        self.half_sum.get()
    }
    fn set_half_sum(&self, mode: HalfSum) {
        self.half_sum.set(mode)
    }

    unsafe fn execute(&self, call: &RawCall) -> Result<()> {
        // The common case (no f32 staging) straight to MPI: no request object at all.
        let upcast = call.dtype.is_half()
            && call.op == Some(ReduceOp::Sum)
            && self.half_sum.get() == HalfSum::Upcast;
        if upcast {
            return self.run(call, false).map(|_| ());
        }
        let (_, spec) = self.begin(call)?;
        let watch = spec.as_ref().map(WatchSpec::enter_unrecorded);
        let dt = ops::datatype(call.dtype);
        let op = call
            .op
            .map_or(ffi::RSMPI_SUM, |o| self.shared.ops.op(o, call.dtype));
        let send = call.send.map(|s: RawBuf| s.ptr as *const c_void);
        let issued = self.issue(call, dt, op, send, call.recv.ptr as *mut c_void, None);
        // A failed collective is not answered as completed.
        if let (Ok(()), Some(watch)) = (&issued, watch) {
            watch.completed();
        }
        issued
    }

    unsafe fn start(&self, call: &RawCall) -> Result<Box<dyn InFlight>> {
        Ok(Box::new(self.run(call, true)?))
    }
}

/// Watch MPI's `call` (set-up #`seq` on communicator `comm`, for `purpose`) until the
/// token is dropped; `None` without a watchdog.
fn enter_set_up(
    shared: &Shared,
    comm: &str,
    seq: u64,
    call: &'static str,
    purpose: &'static str,
) -> Option<WatchToken> {
    let dog = shared.watchdog.as_ref()?;
    Some(dog.enter(&set_up_comm(comm), seq, Watched::SetUp { call, purpose }))
}

/// MPI_IN_PLACE of the linked MPI library.
///
/// # Safety
/// Calls the C shim (returns a constant).
pub(crate) unsafe fn in_place() -> *mut c_void {
    zero_comm_mpi_in_place()
}

/// MPI_Abort on MPI_COMM_WORLD when MPI is running; returns when it is not (before init,
/// after finalize), for the caller to exit plainly.
pub(crate) fn abort_if_running(code: i32) {
    if ::mpi::environment::is_initialized() && !::mpi::environment::is_finalized() {
        // SAFETY: MPI is running; MPI_Abort does not return when it succeeds.
        unsafe {
            ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn call(kind: CollectiveKind, recv_len: usize) -> RawCall {
        RawCall {
            kind,
            op: None,
            dtype: DType::BF16,
            send: None,
            recv: RawBuf {
                ptr: std::ptr::null_mut(),
                len: recv_len,
                location: Location::Host,
            },
            root: 0,
        }
    }

    #[test]
    fn mpi_is_given_the_block_per_rank_and_refused_only_what_it_cannot_count() {
        use CollectiveKind as K;
        // A legal all-gather: 300M elements per rank on 8 ranks, 2.4G gathered.
        let n = 300_000_000usize;
        assert_eq!(mpi_count(K::AllGather, 8 * n, 8), n);
        assert_eq!(mpi_count(K::AllToAll, 8 * n, 8), n);
        assert_eq!(mpi_count(K::AllReduce, 8 * n, 8), 8 * n);
        assert_eq!(mpi_count(K::Broadcast, 8 * n, 8), 8 * n);
        assert_eq!(mpi_count(K::ReduceScatter, n, 8), n);
        assert_eq!(mpi_count(K::Barrier, 0, 8), 0);
        let gather = call(K::AllGather, 8 * n);
        let fits = mpi_count_fits(3, "world", &gather, mpi_count(K::AllGather, 8 * n, 8));
        assert_eq!(fits.unwrap(), n as c_int);
        let e = mpi_count_fits(3, "world", &call(K::AllReduce, 8 * n), 8 * n)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 3") && e.contains("2400000000 bf16 elements exceed"),
            "{e}"
        );
        assert!(e.contains("zero.bucket_elems"), "says what to do: {e}");
        let e = mpi_count_fits(0, "world", &call(K::AllGather, 0), 1 << 31)
            .unwrap_err()
            .to_string();
        assert!(e.contains("elements per rank exceed"), "{e}");
    }
}
