//! The NCCL backend (feature `nccl`: cudarc's NCCL bindings, loaded at run time): a
//! communicator over GPU memory between processes (issue 14). Compiled in CI; it runs
//! only on a GPU machine (`zero-bench gpu-check` runs two processes on one GPU).
//!
//! - Set-up: rank 0 makes the unique id, every rank gets it ([`crate::nccl_id`]: over MPI,
//!   or from an environment variable or a file where MPI cannot start), then
//!   `ncclCommInitRank` on the GPU the rank trains on ([`NcclComm::new`]).
//!   [`NcclComm::over`] does it over a bootstrap communicator (MPI's world, or the TCP
//!   world): every rank first prepares its GPU and the ranks agree that all did, so a
//!   rank that failed there stops them all before any waits in `ncclCommInitRank`;
//!   `ZERO_COMM_TIMEOUT` bounds that call (a peer that died in it ends the job).
//! - Stream order: the engine's collectives ([`crate::on_stream`]) are queued on the
//!   engine's own CUDA stream ([`Communicator::enqueue`]), like a kernel: they start after
//!   the work queued there before, the work queued after sees their result, and the host
//!   never waits for them (other streams wait on the engine's events, as for kernels).
//!   Called directly ([`Communicator::execute`]), a collective runs on this communicator's
//!   own stream and is waited for.
//! - The watchdog (`nccl_watch.rs`): an NCCL error (a dead peer) or a collective over the
//!   timeout ends the job in seconds, naming the collective, rather than leaving every
//!   rank in a kernel that waits forever.
//! - Accounting: the ring-algorithm bytes of [`crate::stats`], as for MPI.
//! - Host buffers: NCCL moves device memory only. A collective called directly on host
//!   buffers (zero-core's control collectives: agreeing on a failure, a checkpoint's
//!   checksums and metadata, gathering the whole weights for `--save-model`) is staged
//!   through device scratch allocated for the call: copied in, run on this communicator's
//!   stream, copied back ([`NcclComm::execute`]). A step's collectives are on device
//!   buffers and never take this path; one buffer on the host and one on the device is
//!   refused (`CommError::Location`). The scratch is allocated per call: a rank that
//!   cannot allocate it fails the call before NCCL, and its peers wait in the collective
//!   until the watchdog (`ZERO_COMM_TIMEOUT`) ends the job, naming it.
//! - Errors: `CommError::Nccl` naming the rank, the collective and NCCL's message.
//!   bf16/f16 sums are NCCL's native ones (`HalfSum` does not apply).

use std::cell::Cell;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{result, sys};

use crate::buffer::Location;
use crate::communicator::{Communicator, Done, InFlight, RawBuf, RawCall, ReduceOp};
use crate::config::{CommConfig, HalfSum};
use crate::error::{CommError, Result};
use crate::nccl_id::{UniqueId, UNIQUE_ID_BYTES};
use crate::nccl_watch::{Queued, Watch, NCCL_WATCHDOG_EXIT_CODE};
use crate::stats::{ring_bytes, CollectiveKind, CommStats, Counters};
use crate::DType;

/// What to do when [`present`] says no.
pub const NOT_PRESENT: &str =
    "the NCCL library cannot be loaded: it is looked for as libnccl.so on the \
     library path; install NCCL, or where only libnccl.so.2 exists (pip's nvidia-nccl wheel) \
     put a link libnccl.so -> libnccl.so.2 in a folder on LD_LIBRARY_PATH";

/// Whether the NCCL library can be loaded here.
pub fn present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// A fresh unique id (rank 0 calls this; [`crate::nccl_id::exchange`] hands it over).
pub fn unique_id() -> std::result::Result<UniqueId, String> {
    if !present() {
        return Err(NOT_PRESENT.into());
    }
    let id = result::get_uniqueid().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
    let mut out = [0u8; UNIQUE_ID_BYTES];
    for (o, &c) in out.iter_mut().zip(id.internal.iter()) {
        *o = c as u8;
    }
    Ok(UniqueId(out))
}

/// A communicator over NCCL (see the module documentation).
pub struct NcclComm {
    raw: sys::ncclComm_t,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Stopped before the communicator is destroyed (`Drop`).
    watch: Option<Watch>,
    /// Collectives queued so far (the watchdog's sequence numbers).
    seq: Cell<u64>,
    /// One f32 on the GPU: NCCL has no barrier, so a barrier is an all-reduce of it.
    barrier: CudaSlice<f32>,
    rank: usize,
    size: usize,
    world_rank: usize,
    name: String,
    counters: Counters,
    half_sum: Cell<HalfSum>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

/// NCCL's name of an element type (every one of ours has one).
fn dtype_of(d: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match d {
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
        DType::BF16 => T::ncclBfloat16,
        DType::F16 => T::ncclFloat16,
        DType::U8 => T::ncclUint8,
        DType::U32 => T::ncclUint32,
        DType::I32 => T::ncclInt32,
        DType::I64 => T::ncclInt64,
    }
}

/// What a rank sets up on its own before NCCL: the GPU's context, the communicator's
/// stream, the barrier's scratch.
struct Prepared {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    barrier: CudaSlice<f32>,
}

impl NcclComm {
    /// Rank `rank` of `size` on GPU `ordinal`, joined through `id` (every rank passes the
    /// same). `world_rank` is for messages; `config.timeout` is the watchdog's limit per
    /// collective (NCCL's own errors end the job whatever it is) and bounds
    /// `ncclCommInitRank`. A rank that fails before NCCL (its GPU, a stream) leaves its
    /// peers waiting in `ncclCommInitRank` until that bound: where the ranks share a
    /// communicator, [`NcclComm::over`] stops them all first.
    pub fn new(
        ordinal: usize,
        id: &UniqueId,
        rank: usize,
        size: usize,
        world_rank: usize,
        config: &CommConfig,
    ) -> Result<Self> {
        let prepared = Self::prepare(ordinal, world_rank)?;
        Self::join(prepared, id, rank, size, world_rank, config)
    }

    /// Rank `bootstrap.rank()` of `bootstrap.size()` on GPU `ordinal`, set up through
    /// `bootstrap` (collective over it): every rank prepares its GPU, then the ranks agree
    /// over `bootstrap` that all did and rank 0's unique id goes to every rank
    /// ([`crate::nccl_id::agree_and_exchange`]), and only then does any rank enter the
    /// blocking `ncclCommInitRank`. A rank that fails before NCCL (its GPU, a stream,
    /// memory, or rank 0 the id) thus fails every rank with an error naming it, instead
    /// of leaving the others in NCCL. A rank that dies during `ncclCommInitRank` leaves
    /// the others there until `config.timeout` (`ZERO_COMM_TIMEOUT`), which then ends the
    /// job naming the call. `config` as in [`NcclComm::new`].
    pub fn over<C: Communicator>(
        bootstrap: &C,
        ordinal: usize,
        config: &CommConfig,
    ) -> Result<Self> {
        let world_rank = bootstrap.world_rank();
        let prepared = Self::prepare(ordinal, world_rank);
        let ready = prepared.as_ref().map(|_| ()).map_err(|e| {
            let why = match e {
                CommError::Nccl { message, .. } => message.clone(),
                e => e.to_string(),
            };
            // A group's ranks are not the world's: name this one in the world too.
            match bootstrap.rank() == world_rank {
                true => why,
                false => format!("(world rank {world_rank}) {why}"),
            }
        });
        let id = crate::nccl_id::agree_and_exchange(bootstrap, ready, unique_id).map_err(|e| {
            use crate::nccl_id::IdError;
            match e {
                IdError::Comm(c) => c,
                IdError::SetUp { comm, failures, .. } => CommError::Nccl {
                    rank: world_rank,
                    op: "init",
                    message: crate::nccl_id::set_up_failed(&comm, &failures),
                },
                e => CommError::Nccl {
                    rank: world_rank,
                    op: "init",
                    message: e.to_string(),
                },
            }
        })?;
        // (Prepared on this rank: else the agreement failed above.)
        Self::join(
            prepared?,
            &id,
            bootstrap.rank(),
            bootstrap.size(),
            world_rank,
            config,
        )
    }

    /// This rank's own set-up, before NCCL: nothing here waits for another rank.
    fn prepare(ordinal: usize, world_rank: usize) -> Result<Prepared> {
        let err = |message: String| CommError::Nccl {
            rank: world_rank,
            op: "init",
            message,
        };
        if !present() {
            return Err(err(NOT_PRESENT.into()));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| err(format!("GPU {ordinal}: {e:?}")))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| err(format!("GPU {ordinal}: a stream: {e:?}")))?;
        let barrier = stream
            .alloc_zeros::<f32>(1)
            .map_err(|e| err(format!("GPU {ordinal}: the barrier's scratch: {e:?}")))?;
        Ok(Prepared {
            ctx,
            stream,
            barrier,
        })
    }

    /// `ncclCommInitRank` (blocking until every rank has called it; bounded by
    /// `config.timeout`), then the watchdog.
    fn join(
        prepared: Prepared,
        id: &UniqueId,
        rank: usize,
        size: usize,
        world_rank: usize,
        config: &CommConfig,
    ) -> Result<Self> {
        let Prepared {
            ctx,
            stream,
            barrier,
        } = prepared;
        let err = |op: &'static str, message: String| CommError::Nccl {
            rank: world_rank,
            op,
            message,
        };
        let mut internal = [0 as c_char; UNIQUE_ID_BYTES];
        for (o, &b) in internal.iter_mut().zip(id.0.iter()) {
            *o = b as c_char;
        }
        // NCCL has no timeout of its own here: a peer that died before or during its call
        // would hold this rank forever. There is no handle to abort yet, so the job ends.
        let deadline = config.timeout.and_then(|limit| {
            let started = crate::exit::Deadline::start(
                format!("nccl-init-deadline-{world_rank}"),
                limit,
                move || {
                    crate::exit::line_to_stderr(&format!(
                        "rank {world_rank}: NCCL watchdog: ncclCommInitRank (rank {rank} of {size}) has not returned after {:.0} s (ZERO_COMM_TIMEOUT): a peer never joined (it failed or died before or during its set-up: its log says why); ending the job",
                        limit.as_secs_f64()
                    ));
                    crate::exit::abort_world(NCCL_WATCHDOG_EXIT_CODE)
                },
            );
            match started {
                Ok(d) => Some(d),
                // Not a reason to fail this rank alone: its peers would wait for it in NCCL.
                Err(e) => {
                    log::warn!(
                        "rank {world_rank}: no thread to bound ncclCommInitRank ({e}): it goes unwatched"
                    );
                    None
                }
            }
        });
        let mut raw = std::mem::MaybeUninit::<sys::ncclComm_t>::uninit();
        // SAFETY: NCCL writes one handle; the id is plain bytes every rank shares.
        let init = unsafe {
            result::comm_init_rank(
                raw.as_mut_ptr(),
                size as c_int,
                sys::ncclUniqueId { internal },
                rank as c_int,
            )
        };
        drop(deadline);
        init.map_err(|e| err("ncclCommInitRank", format!("{e:?}")))?;
        // SAFETY: written on success.
        let raw = unsafe { raw.assume_init() };
        let name = "nccl".to_string();
        let watch = match Watch::start(
            raw,
            Arc::clone(&ctx),
            world_rank,
            name.clone(),
            config.timeout,
        ) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: our handle, nothing queued on it yet.
                let _ = unsafe { result::comm_destroy(raw) };
                return Err(err("init", format!("starting the watchdog thread: {e}")));
            }
        };
        Ok(NcclComm {
            raw,
            ctx,
            stream,
            watch: Some(watch),
            seq: Cell::new(0),
            barrier,
            rank,
            size,
            world_rank,
            name,
            counters: Counters::default(),
            half_sum: Cell::new(HalfSum::default()),
        })
    }

    /// The bare NCCL call, without our layers (the device's stream order, the checks, the
    /// accounting, the watchdog's events), on this communicator's stream and waited for:
    /// the baseline that `micro comm` and `gpu-check` measure our path against, on the
    /// same buffers. `count` is NCCL's: the buffer's elements for an all-reduce (sum,
    /// `send` may equal `recv`), the block each rank receives for a reduce-scatter (sum),
    /// the block each rank sends for an all-gather.
    ///
    /// # Safety
    /// `send` and `recv` are memory of this rank's GPU holding what `kind` and `count`
    /// imply in `dtype`, which nothing else touches until this returns.
    pub unsafe fn bare(
        &self,
        kind: CollectiveKind,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DType,
    ) -> Result<()> {
        let op = kind.name();
        let t = dtype_of(dtype);
        let (sp, rp) = (send as *const c_void, recv as *mut c_void);
        let s = self.stream.cu_stream() as sys::cudaStream_t;
        let sum = sys::ncclRedOp_t::ncclSum;
        // SAFETY: the caller's contract; the stream is synchronised before returning.
        let r = unsafe {
            match kind {
                CollectiveKind::AllReduce => result::all_reduce(sp, rp, count, t, sum, self.raw, s),
                CollectiveKind::ReduceScatter => {
                    result::reduce_scatter(sp, rp, count, t, sum, self.raw, s)
                }
                CollectiveKind::AllGather => result::all_gather(sp, rp, count, t, self.raw, s),
                _ => {
                    return Err(CommError::Nccl {
                        rank: self.world_rank,
                        op,
                        message: "the bare baseline has all_reduce, reduce_scatter and all_gather"
                            .into(),
                    })
                }
            }
        };
        r.map_err(|e| self.fail(op, e))?;
        self.stream.synchronize().map_err(|e| self.fail(op, e))
    }

    /// Queue `call` on `stream` (this GPU's) and follow it with an event for the watchdog;
    /// the accounting counts it now.
    ///
    /// # Safety
    /// As [`Communicator::execute`], and the buffers stay valid until the work queued on
    /// `stream` so far has run.
    unsafe fn queue(&self, call: &RawCall, stream: &CudaStream) -> Result<()> {
        let op = call.kind.name();
        if let Some(b) = call
            .send
            .iter()
            .chain(std::iter::once(&call.recv))
            .find(|b| b.len > 0 && !matches!(b.location, Location::Cuda(_)))
        {
            return Err(CommError::Location {
                rank: self.world_rank,
                op,
                location: b.location,
                backend: "NCCL",
            });
        }
        let t = dtype_of(call.dtype);
        if call.kind == CollectiveKind::AllToAll && call.send.is_none() {
            // Send and receive per peer would overwrite blocks not yet sent.
            return Err(CommError::Size {
                rank: self.world_rank,
                op,
                comm: self.name.clone(),
                detail: "all_to_all needs a separate input (send)".to_string(),
            });
        }
        let red = match call.op {
            Some(ReduceOp::Max) => sys::ncclRedOp_t::ncclMax,
            _ => sys::ncclRedOp_t::ncclSum,
        };
        let s = stream.cu_stream() as sys::cudaStream_t;
        let elem = call.dtype.size_bytes();
        let recv = call.recv.ptr as *mut c_void;
        let send = call.send.map(|b| b.ptr as *const c_void);
        // SAFETY: the caller guarantees the buffers (device memory, checked above) for the
        // lengths given, until the stream has run the collective.
        let r = unsafe {
            match call.kind {
                CollectiveKind::AllReduce => result::all_reduce(
                    send.unwrap_or(recv),
                    recv,
                    call.recv.len,
                    t,
                    red,
                    self.raw,
                    s,
                ),
                CollectiveKind::ReduceScatter => result::reduce_scatter(
                    send.unwrap_or(recv),
                    recv,
                    call.recv.len,
                    t,
                    red,
                    self.raw,
                    s,
                ),
                CollectiveKind::AllGather => {
                    let block = call.recv.len / self.size.max(1);
                    let own = (call.recv.ptr as *const u8).add(self.rank * block * elem);
                    result::all_gather(
                        send.unwrap_or(own as *const c_void),
                        recv,
                        block,
                        t,
                        self.raw,
                        s,
                    )
                }
                CollectiveKind::Broadcast => result::broadcast(
                    recv,
                    recv,
                    call.recv.len,
                    t,
                    call.root as c_int,
                    self.raw,
                    s,
                ),
                // NCCL has no all-to-all: one send and one receive per peer (itself
                // included, a local copy), grouped so NCCL runs them together and no pair
                // waits on another (NCCL's documented all-to-all pattern).
                CollectiveKind::AllToAll => {
                    let block = call.recv.len / self.size.max(1);
                    let (sp, rp) = (send.unwrap_or(recv) as *const u8, recv as *mut u8);
                    let queued = result::group_start().and_then(|mut status| {
                        for peer in 0..self.size {
                            let off = peer * block * elem;
                            result::send(
                                sp.add(off) as *const c_void,
                                block,
                                t,
                                peer as c_int,
                                self.raw,
                                s,
                            )?;
                            status = result::recv(
                                rp.add(off) as *mut c_void,
                                block,
                                t,
                                peer as c_int,
                                self.raw,
                                s,
                            )?;
                        }
                        Ok(status)
                    });
                    // The group is closed even when queueing failed, so NCCL leaves it.
                    let ended = result::group_end();
                    queued.and(ended)
                }
                CollectiveKind::Barrier => {
                    // The record is dropped after the all-reduce is queued, as cudarc asks.
                    let (p, _record) =
                        cudarc::driver::DevicePtr::device_ptr(&self.barrier, &self.stream);
                    result::all_reduce(
                        p as *const c_void,
                        p as *mut c_void,
                        1,
                        sys::ncclDataType_t::ncclFloat32,
                        sys::ncclRedOp_t::ncclSum,
                        self.raw,
                        s,
                    )
                }
            }
        };
        r.map_err(|e| self.fail(op, e))?;
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        let done = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| self.fail(op, e))?;
        if let Some(w) = &self.watch {
            w.queued(Queued {
                seq,
                op,
                count: call.count(),
                dtype: call.dtype,
                done,
                at: std::time::Instant::now(),
            });
        }
        let basis = match call.kind {
            CollectiveKind::ReduceScatter => call.send.map_or(0, |b| b.len),
            _ => call.recv.len,
        } as u64;
        let (sent, received) = ring_bytes(
            call.kind,
            self.size,
            self.rank,
            basis * elem as u64,
            call.root,
        );
        self.counters.record(call.kind, sent, received);
        Ok(())
    }

    /// Run `call`, whose buffers are all host memory, through device scratch on this
    /// communicator's stream (the module documentation's "Host buffers"); waits for it.
    ///
    /// # Safety
    /// As [`Communicator::execute`]: the buffers are valid host memory for their lengths.
    unsafe fn execute_staged(&self, call: &RawCall) -> Result<()> {
        let op = call.kind.name();
        let elem = call.dtype.size_bytes();
        let on_gpu = Location::Cuda(self.ctx.ordinal());
        let fail = |e: cudarc::driver::DriverError| self.fail(op, e);
        // Device copies of the buffers, with what they hold (an in-place collective's
        // input is in `recv`).
        let stage = |b: &RawBuf| -> Result<CudaSlice<u8>> {
            // SAFETY: the caller's guarantee: `len` elements of host memory.
            let host = unsafe { std::slice::from_raw_parts(b.ptr as *const u8, b.len * elem) };
            // (An empty buffer still needs a device address: one zeroed byte.)
            match host.is_empty() {
                true => self.stream.alloc_zeros::<u8>(1),
                false => self.stream.clone_htod(host),
            }
            .map_err(fail)
        };
        let mut recv = stage(&call.recv)?;
        let send = call.send.as_ref().map(stage).transpose()?;
        {
            // The records are dropped after the collective is queued, as cudarc asks.
            let (recv_ptr, _recv_record) =
                cudarc::driver::DevicePtrMut::device_ptr_mut(&mut recv, &self.stream);
            let send_ptr = send
                .as_ref()
                .map(|d| cudarc::driver::DevicePtr::device_ptr(d, &self.stream));
            let on_device = RawCall {
                recv: RawBuf {
                    ptr: recv_ptr as *mut u8,
                    location: on_gpu,
                    ..call.recv
                },
                send: call.send.zip(send_ptr.as_ref()).map(|(b, (p, _))| RawBuf {
                    ptr: *p as *mut u8,
                    location: on_gpu,
                    ..b
                }),
                ..*call
            };
            // SAFETY: the scratch buffers live until the stream is synchronised below.
            unsafe { self.queue(&on_device, &self.stream) }?;
        }
        let bytes = call.recv.len * elem;
        if bytes > 0 {
            // SAFETY: the caller's guarantee: `len` elements of host memory, writable.
            let host = unsafe { std::slice::from_raw_parts_mut(call.recv.ptr, bytes) };
            self.stream
                .memcpy_dtoh(&recv.slice(..bytes), host)
                .map_err(fail)?;
        }
        self.stream.synchronize().map_err(fail)
    }

    fn fail(&self, op: &'static str, e: impl std::fmt::Debug) -> CommError {
        CommError::Nccl {
            rank: self.world_rank,
            op,
            message: format!("{e:?}"),
        }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // A communicator NCCL reports broken (a peer died) may have collectives queued
        // that wait for that peer forever: abort it, which makes them return, instead of
        // waiting for the GPU or destroying it (both could block for good).
        let mut status = sys::ncclResult_t::ncclSuccess;
        // SAFETY: our live handle.
        let r = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut status) };
        let broken = [r, status].into_iter().any(|s| {
            !matches!(
                s,
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
            )
        });
        if broken {
            drop(self.watch.take());
            log::warn!(
                "rank {}: NCCL communicator '{}' is broken ({status:?}): aborting it",
                self.world_rank,
                self.name
            );
            // SAFETY: our handle; the watchdog thread has stopped.
            unsafe { sys::ncclCommAbort(self.raw) };
            return;
        }
        // Collectives queued on a borrowed stream may still run: finish them while the
        // watchdog still watches them (a peer dying now is noticed), then stop it.
        if let Err(e) = self.ctx.synchronize() {
            log::warn!(
                "rank {}: waiting for the GPU before ncclCommDestroy: {e:?}",
                self.world_rank
            );
        }
        drop(self.watch.take());
        // SAFETY: our handle; nothing is queued on it any more, no thread watches it.
        if let Err(e) = unsafe { result::comm_destroy(self.raw) } {
            log::warn!("rank {}: ncclCommDestroy: {e:?}", self.world_rank);
        }
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn world_rank(&self) -> usize {
        self.world_rank
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
        let on_host = |b: &RawBuf| b.location == Location::Host;
        if call.kind != CollectiveKind::Barrier
            && on_host(&call.recv)
            && call.send.as_ref().is_none_or(on_host)
        {
            // SAFETY: the caller's guarantees, forwarded.
            return unsafe { self.execute_staged(call) };
        }
        // SAFETY: the caller's guarantees; the stream is synchronised before returning.
        unsafe { self.queue(call, &self.stream) }?;
        self.stream
            .synchronize()
            .map_err(|e| self.fail(call.kind.name(), e))
    }

    unsafe fn enqueue(&self, call: &RawCall, stream: u64) -> Option<Result<()>> {
        if call.kind == CollectiveKind::Barrier {
            // A barrier is a host-side meeting: it runs on the host task path.
            return None;
        }
        // SAFETY: `stream` is a live CUDA stream of this GPU's context (the caller's
        // contract); the wrapper borrows it and never destroys it.
        let borrowed = unsafe {
            self.ctx
                .wrap_borrowed_stream(stream as cudarc::driver::sys::CUstream)
        };
        // SAFETY: the caller's guarantees, until `stream` has run the collective.
        Some(unsafe { self.queue(call, &borrowed) })
    }

    unsafe fn start(&self, call: &RawCall) -> Result<Box<dyn InFlight>> {
        // SAFETY: forwarded with the caller's guarantees; complete when it returns.
        unsafe { self.execute(call) }?;
        Ok(Box::new(Done))
    }
}
