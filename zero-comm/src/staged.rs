//! Host-staged collectives: device buffers through a transport that reaches only host
//! memory (plain MPI), by way of host staging buffers. The fallback that always works
//! (issue 14's "mpi-staged"): a GPU cluster whose MPI is not CUDA-aware and has no NCCL
//! still trains.
//!
//! [`StagedComm`] wraps any [`Communicator`] and carries a [`Staging`]: two slots
//! (double-buffered, alternating per collective, so a bucket's reduction and the next
//! bucket's never share one), each a send and a receive region. The stream-ordered
//! collectives ([`crate::on_stream`]) see [`Communicator::staging`] and then, on the
//! stream they were queued on (the engine's comm stream):
//!
//! ```text
//! comm stream: (work before) -> download device -> host send/recv region
//! host:        MPI collective on the host regions (the wrapped communicator: its
//!              accounting, consistency check and watchdog, unchanged)
//! comm stream: upload host recv region -> device -> (work after)
//! ```
//!
//! The download waits only for the comm stream's own past (what the engine's events
//! ordered before the collective), never for the compute stream, so compute keeps
//! running while a bucket is staged and reduced; the upload is queued on the comm stream
//! like any kernel, and other streams see it after an event, as with a stream-ordered
//! NCCL collective. On the simulated device every copy is hazard-checked like a kernel.
//!
//! Sizing: the regions are sized once ([`Staging::reserve`], which the engine calls with
//! its plan's largest collective before the first step) and a larger call is an error,
//! never a silent allocation in the middle of a step. [`Staging::held_bytes`] is what
//! they hold (4 regions); [`Staging::stats`] counts the bytes copied each way, kept apart
//! from [`crate::CommStats`], which counts network bytes only, the same for every
//! backend.
//!
//! Pinned memory: the regions are ordinary host memory here. On a CUDA device a pinned
//! (page-locked) region lets the copies run asynchronously at full PCIe speed; the
//! regions are one contiguous allocation each, so registering them with the driver is a
//! one-call change once the CUDA layer offers it (zero-kernels/src/cuda).

use std::cell::{Cell, RefCell};

use crate::communicator::{Communicator, InFlight, RawCall};
use crate::config::HalfSum;
use crate::error::{CommError, Result};
use crate::stats::CommStats;
use crate::Element;

/// One slot: a send and a receive region, 8-byte aligned (every [`crate::DType`] fits).
#[derive(Debug, Default)]
struct Slot {
    send: Vec<u64>,
    recv: Vec<u64>,
}

/// Bytes the staging copies moved (not network bytes: see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StagingStats {
    /// Device -> host bytes.
    pub to_host: u64,
    /// Host -> device bytes.
    pub to_device: u64,
    /// Staged collectives.
    pub calls: u64,
}

/// The host staging buffers of a [`StagedComm`] (see the module documentation).
#[derive(Debug, Default)]
pub struct Staging {
    slots: [RefCell<Slot>; 2],
    next: Cell<usize>,
    /// Bytes each region holds.
    capacity: Cell<usize>,
    to_host: Cell<u64>,
    to_device: Cell<u64>,
    calls: Cell<u64>,
}

/// Typed view of the first `len` elements of a region.
fn typed<T: Element>(region: &mut [u64], len: usize) -> &mut [T] {
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(region);
    let n = len * std::mem::size_of::<T>();
    // The region is u64-aligned and at least n bytes (checked by the caller), and every
    // Element has an alignment of at most 8, so this cast cannot fail.
    bytemuck::cast_slice_mut(&mut bytes[..n])
}

impl Staging {
    /// Empty staging (no region allocated until [`Staging::reserve`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Make every region hold at least `bytes` (allocated now, zeroed). Never shrinks:
    /// runs of several stages in one process keep the largest.
    pub fn reserve(&self, bytes: usize) {
        if bytes <= self.capacity.get() {
            return;
        }
        let words = bytes.div_ceil(8);
        for slot in &self.slots {
            let mut s = slot.borrow_mut();
            s.send = vec![0; words];
            s.recv = vec![0; words];
        }
        self.capacity.set(words * 8);
    }

    /// Bytes each region holds.
    pub fn capacity(&self) -> usize {
        self.capacity.get()
    }

    /// Host bytes the staging holds: 2 slots x (send + receive).
    pub fn held_bytes(&self) -> u64 {
        4 * self.capacity.get() as u64
    }

    /// What [`Staging::held_bytes`] is after [`Staging::reserve`]`(bytes)` on a fresh
    /// staging (regions are whole 8-byte words): for plans made before any exists.
    pub fn held_bytes_for(bytes: usize) -> u64 {
        4 * (bytes.div_ceil(8) * 8) as u64
    }

    /// Copies so far.
    pub fn stats(&self) -> StagingStats {
        StagingStats {
            to_host: self.to_host.get(),
            to_device: self.to_device.get(),
            calls: self.calls.get(),
        }
    }

    /// Zero the copy counters.
    pub fn reset_stats(&self) {
        self.to_host.set(0);
        self.to_device.set(0);
        self.calls.set(0);
    }

    /// Count a device -> host copy of `n` elements of `T`.
    pub(crate) fn count_to_host<T: Element>(&self, n: usize) {
        self.to_host
            .set(self.to_host.get() + (n * std::mem::size_of::<T>()) as u64);
    }

    /// Count a host -> device copy of `n` elements of `T`.
    pub(crate) fn count_to_device<T: Element>(&self, n: usize) {
        self.to_device
            .set(self.to_device.get() + (n * std::mem::size_of::<T>()) as u64);
    }

    /// Run `f` on the next slot's regions, typed: `send_len` and `recv_len` elements.
    pub(crate) fn with_slot<T: Element, R>(
        &self,
        rank: usize,
        op: &'static str,
        send_len: usize,
        recv_len: usize,
        f: impl FnOnce(&mut [T], &mut [T]) -> Result<R>,
    ) -> Result<R> {
        let need = send_len.max(recv_len) * std::mem::size_of::<T>();
        let have = self.capacity.get();
        if need > have {
            return Err(CommError::Staging {
                rank,
                op,
                need,
                have,
            });
        }
        let i = self.next.get();
        self.next.set((i + 1) % self.slots.len());
        let mut slot = self.slots[i]
            .try_borrow_mut()
            .map_err(|_| CommError::Staging {
                rank,
                op,
                need,
                have: 0,
            })?;
        let slot = &mut *slot;
        self.calls.set(self.calls.get() + 1);
        f(
            typed::<T>(&mut slot.send, send_len),
            typed::<T>(&mut slot.recv, recv_len),
        )
    }
}

/// A communicator whose stream-ordered collectives on device buffers go through host
/// staging ([`Staging`]); every collective itself runs on the wrapped communicator.
#[derive(Debug)]
pub struct StagedComm<C> {
    inner: C,
    staging: Staging,
}

impl<C: Communicator> StagedComm<C> {
    /// Stage the collectives of `inner` (staging sized later: [`Staging::reserve`]).
    pub fn new(inner: C) -> Self {
        StagedComm {
            inner,
            staging: Staging::new(),
        }
    }

    /// The wrapped communicator.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// The staging buffers.
    pub fn buffers(&self) -> &Staging {
        &self.staging
    }
}

impl<C: Communicator> Communicator for StagedComm<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn world_rank(&self) -> usize {
        self.inner.world_rank()
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn stats(&self) -> CommStats {
        self.inner.stats()
    }
    fn reset_stats(&self) {
        self.inner.reset_stats()
    }
    fn half_sum(&self) -> HalfSum {
        self.inner.half_sum()
    }
    fn set_half_sum(&self, mode: HalfSum) {
        self.inner.set_half_sum(mode)
    }
    unsafe fn execute(&self, call: &RawCall) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.inner.execute(call) }
    }
    unsafe fn start(&self, call: &RawCall) -> Result<Box<dyn InFlight>> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.inner.start(call) }
    }
    fn staging(&self) -> Option<&Staging> {
        Some(&self.staging)
    }
}
