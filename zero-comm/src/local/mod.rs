//! The in-process backend: `N` ranks that are threads of one process, over host memory
//! or (feature `cuda`) the memory of one GPU they share.
//!
//! [`LocalComm::world`] makes the `N` communicators of a group (move each into its own
//! thread); [`run_local`] does that and runs a closure per rank.
//! [`LocalComm::world_on_nodes`] and [`run_local_on_nodes`] do the same for a world on
//! emulated nodes, with each rank's node groups ([`crate::NodeGroups`]) besides its world
//! communicator. The collectives, their buffer conventions, element types and accounting
//! are those of the MPI backend, so the engine and its tests run unchanged on either;
//! what differs:
//!
//! - **Deterministic reductions.** Sums and maxima are computed element-wise in rank
//!   order, `((x0 + x1) + x2) + ...`, by every rank on the same inputs, so every rank gets
//!   the same bits, and the same bits on every run:
//!   - f32, f64: IEEE addition in the type itself; a NaN sum is defined (the lowest
//!     rank's NaN operand, quieted; inf - inf the canonical NaN), where Rust would leave
//!     the payload to the code generator;
//!   - bf16, f16 with [`HalfSum::Op`]: each step converts both operands to f32, adds and
//!     rounds back to the half type (round-to-nearest-even), as the MPI backend's user op;
//!     with [`HalfSum::Upcast`]: summed in f32 in rank order and rounded once at the end;
//!   - integers: wrapping (two's complement) addition;
//!   - max of floats: the first maximal value in rank order (`-0.0` and `+0.0` compare
//!     equal, so the lower rank's zero is kept); a NaN beats every number and the lowest
//!     rank's NaN is returned bit for bit (the MPI backend's half max returns a canonical
//!     NaN instead, and MPI's built-in f32/f64 max leaves NaN to the implementation);
//!     max of integers: the usual order.
//! - **The consistency check is always on** (it costs nothing here): every rank deposits a
//!   fingerprint of its call (sequence number, collective, reduction, count, dtype, root,
//!   half mode) together with its input; if any rank's differs from rank 0's, every rank
//!   returns [`CommError::Mismatch`] naming rank 0 and the lowest differing rank, before
//!   any data moves. [`CommConfig::check`] is ignored. A mismatch leaves the group usable.
//! - **No rank waits forever.** With [`CommConfig::timeout`] set, a rank that waits longer
//!   than that for its peers returns [`CommError::Timeout`] naming the ranks that did not
//!   arrive (instead of the MPI backend's job abort). A rank whose communicator is dropped
//!   (its thread returned, maybe with an error, or panicked and unwound) has left: peers
//!   waiting for it, or starting a collective later, get [`CommError::PeerGone`] (naming
//!   the rank that left first). Any other failure inside a collective (a timeout, a buffer
//!   this backend refuses, a panic inside the backend) makes the group unusable: every
//!   later collective on any rank returns [`CommError::Poisoned`] naming the rank that
//!   failed and its error (reported in preference to `PeerGone`, since it says why), and
//!   ranks waiting at the point where a timeout fired report that [`CommError::Timeout`]
//!   themselves. A failed collective is not counted in the accounting. A length error of
//!   the typed methods is returned before the call reaches this backend: that rank never
//!   arrives, and its peers wait for it until it leaves or the timeout fires. Waiting is a
//!   Mutex + Condvar, no spinning. A communicator that is leaked (`mem::forget`) never
//!   leaves: set a timeout if that matters.
//! - **Non-blocking collectives complete at start.** [`Communicator::start`] runs the
//!   collective to completion and returns a request that is already complete. This is
//!   valid MPI semantics (every rank starts its non-blocking collectives in the same
//!   order, so starting one is a rendezvous like a blocking call). There is no overlap of
//!   communication with computation: [`crate::Pending::test`] is always true and waiting
//!   costs nothing.
//!
//! Data movement, per collective (the rendezvous is in `rendezvous.rs`):
//! 1. every rank publishes its input address and length, and waits for all to have done so;
//! 2. each rank computes its own output from the peers' inputs, reading them only: into a
//!    private temporary when its output is its own input (in-place all-reduce, or any half
//!    sum summed in f32), else straight into its output buffer, which no peer reads;
//! 3. every rank waits until all have finished reading;
//! 4. each rank copies its temporary into its output buffer and returns.
//!
//! **Device buffers** (feature `cuda`; without it they are refused with
//! [`CommError::Location`]): the buffers of a call may all be in the memory of one GPU,
//! `Location::Cuda(ordinal)`, the same on every rank (the consistency check compares it;
//! buffers of one call in two places are [`CommError::MixedLocations`]). The thread ranks
//! share the GPU's primary context, so a published device address is valid in every rank's
//! thread, and the protocol above is unchanged; the data moves on the GPU, on a stream of
//! the rank's own (opened at its first device collective, before point 1: a failure, such
//! as no driver, is a [`CommError::Device`] and poisons the group):
//! - step 2 queues device-to-device copies or one rank-order fold kernel (the same bits as
//!   the host fold, NaN payloads included: zero-kernels' `cuda::peer`), then *waits for the
//!   stream* before point 3, so no queued work reads a peer's input after it;
//! - step 4 copies the temporary (device scratch of the rank, in-place all-reduce only: an
//!   upcast half sum accumulates in registers) and waits again, so the result is complete
//!   when the collective returns (the engine runs collectives as host tasks that block).
//!
//! A device input must be complete when the collective is called (the stream that wrote
//! it synchronized, as [`crate::on_stream`]'s host tasks do); the GPU work is not ordered
//! after any stream of the caller's.
//!
//! A GPU failure on one rank poisons the group (that rank's stream has run dry when it
//! reports, so it reads nothing afterwards); the peers' own results of that collective are
//! unaffected.
//!
//! Cost: for an all-reduce every rank reduces the whole buffer (N-fold redundant
//! arithmetic, no staging through a shared buffer); a reduce-scatter reduces only the
//! rank's block. Plus two condvar rendezvous per collective (one for a barrier).
//!
//! ```
//! use zero_comm::{run_local, CommConfig, Communicator, ReduceOp};
//!
//! let results = run_local(3, CommConfig::default(), |comm| {
//!     let mut x = vec![comm.rank() as f32 + 1.0; 4];
//!     comm.all_reduce(&mut x[..], ReduceOp::Sum).map(|()| x)
//! });
//! for (rank, r) in results.into_iter().enumerate() {
//!     let x = r.expect("no rank panicked").expect("the all-reduce succeeded");
//!     assert_eq!(x, vec![6.0; 4], "rank {rank}");
//! }
//! ```

#[cfg(feature = "cuda")]
mod device;
#[cfg(not(feature = "cuda"))]
#[path = "device_off.rs"]
mod device;
#[cfg(test)]
mod nodes_tests;
mod rendezvous;
#[cfg(test)]
mod tests;

use crate::buffer::Location;
use crate::communicator::{Communicator, Done, InFlight, RawBuf, RawCall, ReduceOp};
use crate::config::{CommConfig, HalfSum};
use crate::error::{CommError, Result};
use crate::fingerprint::{describe, fingerprint};
use crate::nodes::NodeGroups;
use crate::reduce::{self, fold_into, layout, scratch_as, Elem, Half};
use crate::stats::{ring_bytes, CollectiveKind, CommStats, Counters};
use crate::DType;
use half::{bf16, f16};
use rendezvous::{Group, Here, Reading, Slot, NAME};
use std::cell::Cell;
use std::sync::Arc;

/// One rank of a group of threads in this process; see the [module documentation](self).
///
/// `Send` (move it into the rank's thread) but not `Sync` (one thread uses it). Dropping
/// it means this rank left the group.
pub struct LocalComm {
    rank: usize,
    size: usize,
    /// Rank in the world this group belongs to, and the group's name: for messages
    /// (a node or cross group of [`LocalComm::world_on_nodes`] names its world rank).
    world_rank: usize,
    name: &'static str,
    group: Arc<Group>,
    seq: Cell<u64>,
    counters: Counters,
    half_sum: Cell<HalfSum>,
    /// Temporary outputs, kept between calls (as u64 words: aligned for every dtype).
    scratch: Cell<Vec<u64>>,
    /// This rank's GPU data movement (feature `cuda`), opened at its first device call.
    device: device::DeviceState,
}

impl std::fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("seq", &self.seq.get())
            .finish()
    }
}

impl LocalComm {
    /// The `n` communicators of a new group (`n >= 1`); element `r` is rank `r`. Of
    /// `config`, the timeout and the half-sum mode are used (the consistency check is
    /// always on).
    pub fn world(n: usize, config: CommConfig) -> Result<Vec<LocalComm>> {
        if n == 0 {
            return Err(CommError::Size {
                rank: 0,
                op: "world",
                comm: NAME.to_string(),
                detail: "a local group needs at least one rank, got 0".to_string(),
            });
        }
        Ok(Self::group((0..n).collect(), NAME, &config))
    }

    /// The communicators of one new group whose rank r is world rank `world_ranks[r]`
    /// (non-empty).
    fn group(world_ranks: Vec<usize>, name: &'static str, config: &CommConfig) -> Vec<LocalComm> {
        let n = world_ranks.len();
        let group = Arc::new(Group::new(n, config.timeout));
        world_ranks
            .into_iter()
            .enumerate()
            .map(|(rank, world_rank)| LocalComm {
                rank,
                size: n,
                world_rank,
                name,
                group: Arc::clone(&group),
                seq: Cell::new(0),
                counters: Counters::default(),
                half_sum: Cell::new(config.half_sum),
                scratch: Cell::new(Vec::new()),
                device: device::DeviceState::default(),
            })
            .collect()
    }

    /// A node-major world of `n` ranks on `n / ranks_per_node` emulated nodes (see
    /// [`crate::nodes`]): element r is world rank r's world communicator (named "local")
    /// and its node groups, `node` (named "node", L = `ranks_per_node` ranks) and `cross`
    /// (named "cross", one rank per node). Each node and each cross group is a group of
    /// its own; every communicator reports its world rank in messages. `ranks_per_node`
    /// must divide `n` (both at least 1).
    pub fn world_on_nodes(
        n: usize,
        ranks_per_node: usize,
        config: CommConfig,
    ) -> Result<Vec<(LocalComm, NodeGroups<LocalComm>)>> {
        let l = ranks_per_node;
        if n == 0 || l == 0 || !n.is_multiple_of(l) {
            return Err(CommError::Nodes {
                rank: 0,
                comm: NAME.to_string(),
                detail: format!(
                    "{l} ranks per node does not divide the world's {n} ranks into equal nodes; give a positive divisor of {n}"
                ),
            });
        }
        let m = n / l;
        let world = Self::world(n, config.clone())?;
        // Node m holds world ranks m L .. m L + L - 1: node-major, so already in world order.
        let node: Vec<LocalComm> = (0..m)
            .flat_map(|node_m| {
                Self::group((0..l).map(|j| node_m * l + j).collect(), "node", &config)
            })
            .collect();
        // Cross group j holds world ranks j, L + j, 2L + j, ...: interleaved, so sorted.
        let mut cross: Vec<LocalComm> = (0..l)
            .flat_map(|j| {
                Self::group(
                    (0..m).map(|node_m| node_m * l + j).collect(),
                    "cross",
                    &config,
                )
            })
            .collect();
        cross.sort_by_key(|c| c.world_rank);
        Ok(world
            .into_iter()
            .zip(node.into_iter().zip(cross))
            .map(|(w, (node, cross))| (w, NodeGroups { node, cross }))
            .collect())
    }

    /// Number of collectives issued so far on this communicator (the next one's sequence
    /// number).
    pub fn sequence(&self) -> u64 {
        self.seq.get()
    }

    fn size_err(&self, call: &RawCall, detail: String) -> CommError {
        CommError::Size {
            rank: self.world_rank,
            op: call.kind.name(),
            comm: self.name.to_string(),
            detail,
        }
    }

    /// Where the call's buffers live: all in one place, one this backend reaches.
    fn location(&self, call: &RawCall) -> Result<Location> {
        let first = call.send.unwrap_or(call.recv).location;
        if call.recv.location != first {
            return Err(CommError::MixedLocations {
                rank: self.world_rank,
                op: call.kind.name(),
                first,
                other: call.recv.location,
                backend: NAME,
            });
        }
        match first {
            Location::Host => Ok(first),
            Location::Cuda(_) if device::ENABLED => Ok(first),
            Location::Cuda(_) => Err(CommError::Location {
                rank: self.world_rank,
                op: call.kind.name(),
                location: first,
                backend: NAME,
            }),
        }
    }

    /// Everything that can be wrong with a call on this rank alone; where its buffers are.
    fn validate(&self, call: &RawCall) -> Result<Location> {
        let bufs = || call.send.iter().chain(std::iter::once(&call.recv));
        let location = self.location(call)?;
        let n = self.size;
        let (send, recv) = (call.send.map(|s| s.len), call.recv.len);
        let bad = match call.kind {
            CollectiveKind::AllReduce => match send {
                Some(s) if s != recv => Some(format!("send has {s} elements but recv has {recv}")),
                _ => None,
            },
            CollectiveKind::ReduceScatter => match send {
                None => Some("reduce_scatter needs a separate input (send)".to_string()),
                Some(s) if recv.checked_mul(n) != Some(s) => Some(format!(
                    "full buffer of {s} elements != {n} ranks x block of {recv}"
                )),
                _ => None,
            },
            CollectiveKind::AllGather => match send {
                Some(s) if s.checked_mul(n) != Some(recv) => Some(format!(
                    "full buffer of {recv} elements != {n} ranks x block of {s}"
                )),
                None if recv % n != 0 => Some(format!(
                    "buffer of {recv} elements is not divisible into {n} equal blocks"
                )),
                _ => None,
            },
            CollectiveKind::AllToAll => match send {
                None => Some("all_to_all needs a separate input (send)".to_string()),
                Some(s) if s != recv => Some(format!("send has {s} elements but recv has {recv}")),
                Some(s) if s % n != 0 => Some(format!(
                    "buffer of {s} elements is not divisible into {n} equal blocks"
                )),
                _ => None,
            },
            CollectiveKind::Broadcast => {
                if call.root >= n {
                    return Err(CommError::Root {
                        rank: self.world_rank,
                        op: call.kind.name(),
                        comm: self.name.to_string(),
                        root: call.root,
                        size: n,
                    });
                }
                None
            }
            CollectiveKind::Barrier => None,
        };
        if let Some(detail) = bad {
            return Err(self.size_err(call, detail));
        }
        let (size, align) = layout(call.dtype);
        for b in bufs().filter(|b| b.len > 0) {
            if b.ptr.is_null() || !(b.ptr as usize).is_multiple_of(align) {
                return Err(self.size_err(
                    call,
                    format!("buffer at {:p} is not aligned for {}", b.ptr, call.dtype),
                ));
            }
            if b.len
                .checked_mul(size)
                .is_none_or(|x| x > isize::MAX as usize)
            {
                return Err(self.size_err(call, format!("{} elements overflow", b.len)));
            }
        }
        Ok(location)
    }

    /// What this rank publishes for its peers to read: `(address, elements)`.
    fn input_of(&self, call: &RawCall) -> (*const u8, usize) {
        match call.kind {
            CollectiveKind::AllGather => match call.send {
                Some(s) => (s.ptr as *const u8, s.len),
                None => {
                    let block = call.recv.len / self.size;
                    let off = self.rank * block * call.dtype.size_bytes();
                    // In bounds of `recv` (block `rank` of `size`), checked by `validate`.
                    (call.recv.ptr.wrapping_add(off) as *const u8, block)
                }
            },
            CollectiveKind::Barrier => (std::ptr::null(), 0),
            _ => {
                let b: RawBuf = call.send.unwrap_or(call.recv);
                (b.ptr as *const u8, b.len)
            }
        }
    }

    /// Every rank has the same table, so every rank reaches the same verdict.
    fn check(&self, here: &Here, peers: &[Slot]) -> Result<()> {
        let Some((first, rest)) = peers.split_first() else {
            return Ok(());
        };
        for (i, p) in rest.iter().enumerate() {
            if p.fp != first.fp || p.len != first.len || p.location != first.location {
                let (mut a, mut b) = (describe(&first.fp), describe(&p.fp));
                if p.location != first.location {
                    // Host and device (or two GPUs): the ranks could not read each other.
                    a.push_str(&format!(" on {:?} memory", first.location));
                    b.push_str(&format!(" on {:?} memory", p.location));
                } else if p.fp == first.fp {
                    // Same call, different input length (mixing in-place and separate
                    // all-gathers with different blocks).
                    a.push_str(&format!(" with a {}-element input", first.len));
                    b.push_str(&format!(" with a {}-element input", p.len));
                }
                return Err(CommError::Mismatch {
                    rank: self.world_rank,
                    comm: self.name.to_string(),
                    seq: here.seq,
                    rank_a: 0,
                    call_a: a,
                    rank_b: i + 1,
                    call_b: b,
                });
            }
        }
        Ok(())
    }

    /// Steps 2-4 of the module documentation, after point 1 and the check.
    ///
    /// # Safety
    /// `call` satisfies [`Communicator::execute`]'s contract and passed `validate`; `peers`
    /// are the slots of this collective, which passed `check` (every rank's input has the
    /// same length as ours, and every rank is blocked in this collective until `reading`
    /// is finished, keeping its input alive and unmodified until then).
    unsafe fn move_data(&self, call: &RawCall, peers: &[Slot], upcast: bool, reading: Reading) {
        let es = call.dtype.size_bytes();
        let recv = call.recv;
        match call.kind {
            // Not reached (`execute` returns first); every rank would take this arm alike.
            CollectiveKind::Barrier => reading.finish(),
            CollectiveKind::Broadcast => {
                let root = peers[call.root];
                if self.rank != call.root && recv.len > 0 {
                    // SAFETY: root's buffer holds `recv.len` elements (same count, checked)
                    // and is not written until every rank passed point 2; ours is
                    // writable (contract) and read by no peer (only the root's is read);
                    // two ranks' buffers never overlap (each is this rank's exclusive
                    // `&mut`, or a `&` no rank writes).
                    std::ptr::copy_nonoverlapping(root.ptr, recv.ptr, recv.len * es);
                }
                reading.finish();
            }
            CollectiveKind::AllGather => {
                let in_place = call.send.is_none();
                let block = recv.len / self.size;
                if block > 0 {
                    for (q, s) in peers.iter().enumerate() {
                        if in_place && q == self.rank {
                            continue; // already in place
                        }
                        // SAFETY: rank q's input is `block` elements (checked), unmodified
                        // until point 2. We write block q of our own output: in place,
                        // peers read only block `rank` of it, which we skip; otherwise
                        // peers read only our `send`, which does not overlap `recv`
                        // (contract). Block q is in bounds (`recv.len == size * block`).
                        std::ptr::copy_nonoverlapping(
                            s.ptr,
                            recv.ptr.add(q * block * es),
                            block * es,
                        );
                    }
                }
                reading.finish();
            }
            CollectiveKind::AllToAll => {
                let block = recv.len / self.size;
                if block > 0 {
                    for (q, s) in peers.iter().enumerate() {
                        // SAFETY: rank q's input (its `send`) holds `size * block` elements
                        // (same length as ours, checked), unmodified until point 2; we read
                        // its block `rank` and write block q of our own `recv`, which no
                        // peer reads (they read `send`s, which overlap no `recv`: contract).
                        std::ptr::copy_nonoverlapping(
                            s.ptr.add(self.rank * block * es),
                            recv.ptr.add(q * block * es),
                            block * es,
                        );
                    }
                }
                reading.finish();
            }
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter => {
                let op = call.op.unwrap_or(ReduceOp::Sum);
                match call.dtype {
                    DType::F32 => self.reduce::<f32>(call, peers, op, reading),
                    DType::F64 => self.reduce::<f64>(call, peers, op, reading),
                    DType::BF16 if upcast => self.reduce_upcast::<bf16>(call, peers, reading),
                    DType::BF16 => self.reduce::<bf16>(call, peers, op, reading),
                    DType::F16 if upcast => self.reduce_upcast::<f16>(call, peers, reading),
                    DType::F16 => self.reduce::<f16>(call, peers, op, reading),
                    DType::U8 => self.reduce::<u8>(call, peers, op, reading),
                    DType::U32 => self.reduce::<u32>(call, peers, op, reading),
                    DType::I32 => self.reduce::<i32>(call, peers, op, reading),
                    DType::I64 => self.reduce::<i64>(call, peers, op, reading),
                }
            }
        }
    }

    /// The element range of every rank's input this rank reduces: `(offset, len)`.
    fn my_range(&self, call: &RawCall) -> (usize, usize) {
        match call.kind {
            CollectiveKind::ReduceScatter => (self.rank * call.recv.len, call.recv.len),
            _ => (0, call.recv.len),
        }
    }

    /// # Safety
    /// As [`LocalComm::move_data`], with `T` the call's dtype.
    unsafe fn reduce<T: Elem>(
        &self,
        call: &RawCall,
        peers: &[Slot],
        op: ReduceOp,
        reading: Reading,
    ) {
        let (off, len) = self.my_range(call);
        if call.send.is_some() {
            {
                // SAFETY: see `inputs`; our output is `recv`, writable (contract), read by
                // no peer (they read `send`s, which do not overlap any rank's `recv`:
                // each `recv` is its rank's exclusive `&mut` in the typed API, or
                // distinct per the raw contract), so a `&mut` to it aliases nothing.
                let out = slice_mut::<T>(call.recv.ptr, len);
                fold_into(&inputs::<T>(peers, off, len), out, op);
            }
            reading.finish();
        } else {
            // In place: peers are reading our `recv` until point 2; reduce into a private
            // temporary and write `recv` after it.
            let mut scratch = self.scratch.take();
            {
                let tmp = scratch_as::<T>(&mut scratch, len);
                fold_into(&inputs::<T>(peers, off, len), tmp, op);
                reading.finish();
                // SAFETY: every rank passed point 2, so no one reads our `recv` any more,
                // and the input slices (one of them over `recv`) are gone.
                slice_mut::<T>(call.recv.ptr, len).copy_from_slice(tmp);
            }
            self.scratch.set(scratch);
        }
    }

    /// A half sum in f32 (HalfSum::Upcast): accumulate into a private f32 temporary, round
    /// into `recv` once every rank finished reading (correct in place and not).
    ///
    /// # Safety
    /// As [`LocalComm::move_data`], with `H` the call's dtype.
    unsafe fn reduce_upcast<H: Half>(&self, call: &RawCall, peers: &[Slot], reading: Reading) {
        let (off, len) = self.my_range(call);
        let mut scratch = self.scratch.take();
        {
            let acc = scratch_as::<f32>(&mut scratch, len);
            reduce::fold_upcast(&inputs::<H>(peers, off, len), acc);
            reading.finish();
            // SAFETY: as in `reduce`'s in-place branch.
            reduce::narrow(acc, slice_mut::<H>(call.recv.ptr, len));
        }
        self.scratch.set(scratch);
    }
}

/// Elements `off..off + len` of every rank's input, in rank order.
///
/// # Safety
/// Every slot's input holds at least `off + len` elements of `T` (aligned, initialised),
/// not written by anyone while the returned slices live (until point 2).
unsafe fn inputs<'a, T>(peers: &[Slot], off: usize, len: usize) -> Vec<&'a [T]> {
    peers
        .iter()
        .map(|s| {
            if len == 0 {
                &[][..]
            } else {
                // SAFETY: per this function's contract.
                std::slice::from_raw_parts((s.ptr as *const T).add(off), len)
            }
        })
        .collect()
}

/// `len` elements of `T` at `p`, for writing.
///
/// # Safety
/// `p` is valid for writes of `len` elements of `T`, aligned, and nothing else accesses
/// them while the slice lives.
unsafe fn slice_mut<'a, T>(p: *mut u8, len: usize) -> &'a mut [T] {
    if len == 0 {
        &mut []
    } else {
        std::slice::from_raw_parts_mut(p as *mut T, len)
    }
}

impl Communicator for LocalComm {
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
        self.name
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
        let location = self.validate(call).and_then(|loc| {
            if let Location::Cuda(ordinal) = loc {
                // Before point 1, so a failure (no driver, ...) leaves no peer reading.
                self.device
                    .open(self.world_rank, call.kind.name(), ordinal)?;
            }
            Ok(loc)
        });
        let location = match location {
            Ok(l) => l,
            Err(e) => {
                // Our peers would wait for a call we do not make: make them fail instead.
                self.group.poison(self.rank, e.to_string());
                return Err(e);
            }
        };
        let upcast = call.dtype.is_half()
            && call.op == Some(ReduceOp::Sum)
            && self.half_sum.get() == HalfSum::Upcast;
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let here = Here {
            rank: self.rank,
            world_rank: self.world_rank,
            comm: self.name,
            seq,
            op: call.kind.name(),
        };
        let (ptr, len) = self.input_of(call);
        let slot = Slot {
            fp: fingerprint(seq, call, upcast),
            ptr,
            len,
            location,
        };
        let mut peers = Vec::with_capacity(self.size);
        // Point 1. From here until point 2 (`Reading`), our input stays published: the
        // caller's buffers are borrowed for the whole call (contract), and we do not
        // return before point 2 unless point 1 failed, in which case no rank passes it.
        self.group.arrive(&here, slot, &mut peers)?;
        self.check(&here, &peers)?;
        let elem = if upcast { 4 } else { call.dtype.size_bytes() } as u64;
        let basis = match call.kind {
            CollectiveKind::ReduceScatter => call.send.map_or(0, |s| s.len),
            _ => call.recv.len,
        } as u64;
        let (sent, received) = ring_bytes(call.kind, self.size, self.rank, basis * elem, call.root);
        self.counters.record(call.kind, sent, received);
        if call.kind == CollectiveKind::Barrier {
            // Nothing published to read: no point 2 (every rank agrees, by the check).
            return Ok(());
        }
        let reading = Reading::new(&self.group, self.rank);
        if location == Location::Host {
            // SAFETY: validated, checked, and every rank is between points 1 and 2 of this
            // collective until `Reading` finishes; see `move_data`.
            self.move_data(call, &peers, upcast, reading);
            Ok(())
        } else {
            // SAFETY: as above; every rank's buffers are on this GPU (checked).
            self.device.move_data(self, call, &peers, upcast, reading)
        }
    }

    unsafe fn start(&self, call: &RawCall) -> Result<Box<dyn InFlight>> {
        // Completes at start; see the module documentation.
        self.execute(call)?;
        Ok(Box::new(Done))
    }
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        self.group.depart(self.rank);
    }
}

/// A rank of [`run_local`] that did not return a value: its closure panicked (or its
/// thread could not be started).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankPanic {
    /// The rank.
    pub rank: usize,
    /// The panic message (or why the thread did not start).
    pub message: String,
}

impl std::fmt::Display for RankPanic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} panicked: {}", self.rank, self.message)
    }
}

impl std::error::Error for RankPanic {}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(panic payload is not a string)".to_string()
    }
}

/// Run `f` on `n` ranks: a group of [`LocalComm`]s, each moved into its own scoped
/// thread named `rank-{r}`, all joined before returning. Element `r` of the result is
/// rank `r`'s return value, or [`RankPanic`] when its closure panicked; a panicking
/// rank does not hang the others (its communicator is dropped while unwinding, so they get
/// [`CommError::PeerGone`]). `n == 0` runs nothing and returns an empty vector.
///
/// See the [module documentation](self) for an example.
#[must_use = "run_local returns every rank's result and prints none of them: check each (a rank's error or panic is otherwise lost)"]
pub fn run_local<T, F>(n: usize, config: CommConfig, f: F) -> Vec<Result<T, RankPanic>>
where
    T: Send,
    F: Fn(LocalComm) -> T + Sync,
{
    let comms = match LocalComm::world(n, config) {
        Ok(c) => c,
        Err(_) => return Vec::new(), // only n == 0
    };
    run_ranks(comms, f)
}

/// [`run_local`] on a node-major world of `n` ranks, `ranks_per_node` to a node (see
/// [`LocalComm::world_on_nodes`]): `f` gets each rank's world communicator and its node
/// groups. A panicking rank drops all three of its communicators while unwinding, so its
/// peers in each group get [`CommError::PeerGone`] instead of hanging. Errors (before any
/// thread starts) as [`LocalComm::world_on_nodes`].
#[must_use = "run_local_on_nodes returns every rank's result and prints none of them: check each (a rank's error or panic is otherwise lost)"]
pub fn run_local_on_nodes<T, F>(
    n: usize,
    ranks_per_node: usize,
    config: CommConfig,
    f: F,
) -> Result<Vec<Result<T, RankPanic>>>
where
    T: Send,
    F: Fn(LocalComm, NodeGroups<LocalComm>) -> T + Sync,
{
    let ranks = LocalComm::world_on_nodes(n, ranks_per_node, config)?;
    Ok(run_ranks(ranks, |(world, groups)| f(world, groups)))
}

/// One scoped thread `rank-{r}` per element of `ranks`, running `f` on it; joined.
fn run_ranks<X, T, F>(ranks: Vec<X>, f: F) -> Vec<Result<T, RankPanic>>
where
    X: Send,
    T: Send,
    F: Fn(X) -> T + Sync,
{
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .enumerate()
            .map(|(r, comm)| {
                std::thread::Builder::new()
                    .name(format!("rank-{r}"))
                    .spawn_scoped(s, move || f(comm))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| match h {
                Ok(h) => h.join().map_err(|p| RankPanic {
                    rank,
                    message: panic_message(&*p),
                }),
                // The closure and its communicator were dropped: peers see it as gone.
                Err(e) => Err(RankPanic {
                    rank,
                    message: format!("its thread could not be spawned: {e}"),
                }),
            })
            .collect()
    })
}
