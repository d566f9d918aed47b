//! Host-staged collectives: device buffers through a transport that reaches only host
//! memory (plain MPI), by way of host staging buffers. The fallback that always works
//! (issue 14's "mpi-staged"): a GPU cluster whose MPI is not CUDA-aware and has no NCCL
//! still trains.
//!
//! [`StagedComm`] wraps any [`Communicator`] and carries a [`Staging`]: two slots
//! (double-buffered, alternating per collective), each a send and a receive region of
//! host memory from the device ([`Device::alloc_staging`]: page-locked on a GPU, so that
//! the copies are asynchronous DMAs). The stream-ordered collectives
//! ([`crate::on_stream`]) see [`Communicator::staging`] and then, on the stream they were
//! queued on (the engine's comm stream):
//!
//! ```text
//! comm stream: (work before) -> download device -> host send/recv region
//! host:        start the collective on the host regions, non-blocking (the wrapped
//!              communicator's: its accounting, consistency check and watchdog)
//! comm stream: [waits for the collective] -> upload host recv region -> device
//! ```
//!
//! - **Overlap.** The collective is started as host work on the stream
//!   ([`Device::host_task_started`]) and the upload is queued behind it
//!   ([`Device::upload_from_staging`] reads the region when the stream reaches it), so the
//!   host goes back to queueing compute while the collective runs. MPI's progress comes
//!   from the transport's progress thread (`mpi/progress.rs`) and from the device's polls
//!   between ops. A device that overlaps started work (the host device, the simulated
//!   GPU, a CUDA device with `ZERO_CUDA_STAGED=overlap`, whose stream waits on the GPU
//!   for a word the host sets: `zero-kernels/src/device/release.rs`) runs compute on
//!   other streams meanwhile; one that waits for started work in place (a CUDA device by
//!   default) still runs these same steps, in order.
//! - **Double buffering.** Collective k uses slot k mod 2, so the next collective's
//!   download never writes the region the previous one is still reducing or uploading
//!   from. Before a slot is used again, the host waits for an event recorded after that
//!   slot's last upload: a region is never written while a copy or a collective may still
//!   read it, whichever streams the collectives were queued on. A collective that failed
//!   (its lease never released, or released but its work leaked by the device, which
//!   `Lease::settled` tells) leaves the transport possibly holding the regions: its
//!   slot takes fresh ones.
//! - **Order.** The download waits only for the comm stream's own past (what the engine's
//!   events ordered before the collective), never for the compute stream. The upload is
//!   queued on the comm stream like any kernel, and other streams see it after an event,
//!   as with a stream-ordered NCCL collective. On the simulated device every copy's
//!   device side is hazard-checked like a kernel; the host regions are not tracked
//!   there: the slots' events (above) are what orders them.
//!
//! Sizing: the regions are sized once ([`Staging::reserve`], which the engine calls with
//! its plan's largest collective before the first step) and a larger call is an error,
//! never a silent allocation in the middle of a step. [`Staging::held_bytes`] is what
//! they hold (4 regions); [`Staging::stats`] counts the bytes copied each way, kept apart
//! from [`crate::CommStats`], which counts network bytes only, the same for every
//! backend.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use zero_kernels::device::{Device, StagingMemory};

use crate::communicator::{Communicator, InFlight, RawCall};
use crate::config::HalfSum;
use crate::error::{CommError, Result};
use crate::stats::CommStats;
use crate::Element;

/// How far a slot's last use got.
#[derive(Default)]
enum LastUse {
    /// Never used since its regions were made.
    #[default]
    None,
    /// Queued completely: the device's event (boxed: the staging serves any device)
    /// recorded after the upload, which device (its address) recorded it, and whether
    /// the device let go of the collective normally ([`Settled`]).
    Queued {
        device: usize,
        event: Box<dyn Any>,
        settled: Rc<Cell<bool>>,
    },
    /// Leased and not released: its collective or upload failed part-way, and either
    /// may still touch the regions.
    Unsettled,
}

/// One slot: a send and a receive region, and how far its last use got.
#[derive(Default)]
struct Slot {
    send: Option<Rc<StagingMemory>>,
    recv: Option<Rc<StagingMemory>>,
    last_use: LastUse,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let last = match self.last_use {
            LastUse::None => "none",
            LastUse::Queued { .. } => "queued",
            LastUse::Unsettled => "unsettled",
        };
        f.debug_struct("Slot")
            .field("send", &self.send)
            .field("recv", &self.recv)
            .field("last_use", &last)
            .finish()
    }
}

/// A device's identity for the events a slot keeps: its address while it is borrowed.
fn device_id<D: Device>(dev: &D) -> usize {
    dev as *const D as *const u8 as usize
}

/// The regions one staged collective uses (a slot, leased by [`Staging::lease`]).
pub(crate) struct Lease {
    index: usize,
    /// The send region.
    pub(crate) send: Rc<StagingMemory>,
    /// The receive region.
    pub(crate) recv: Rc<StagingMemory>,
    /// Set when the collective's [`Settled`] is dropped.
    settled: Rc<Cell<bool>>,
}

impl Lease {
    /// What the collective's started host work retains beside the regions: the device
    /// drops it when the work has finished, and leaks it when the work failed (the
    /// transport may still hold the regions), which is how [`Staging::lease`] tells a
    /// failed collective's slot, whose regions it must not reuse, from a finished one.
    /// It relies on every device dropping finished work's retained values by the time
    /// [`Device::sync_event`] returns for an event recorded after that work (each one
    /// does: the host and simulated devices when the work finishes, a CUDA device in
    /// the settle that `sync_event` starts with).
    pub(crate) fn settled(&self) -> Settled {
        Settled(Rc::clone(&self.settled))
    }
}

/// Marks a lease's collective as let go normally when dropped ([`Lease::settled`]).
pub(crate) struct Settled(Rc<Cell<bool>>);

impl Drop for Settled {
    fn drop(&mut self) {
        self.0.set(true);
    }
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
    to_host: Cell<u64>,
    to_device: Cell<u64>,
    calls: Cell<u64>,
}

impl Staging {
    /// Empty staging (no region allocated until [`Staging::reserve`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Make every region hold at least `bytes`, allocated now by `dev`
    /// ([`Device::alloc_staging`]: page-locked on a GPU) and zeroed. Never shrinks: runs of
    /// several stages in one process keep the largest. Regions replaced here stay
    /// allocated while queued work still uses them.
    pub fn reserve<D: Device>(&self, dev: &D, bytes: usize) -> zero_kernels::Result<()> {
        if bytes <= self.capacity() {
            return Ok(());
        }
        let mut fresh = Vec::with_capacity(2 * self.slots.len());
        for _ in 0..2 * self.slots.len() {
            fresh.push(Rc::new(dev.alloc_staging(bytes)?));
        }
        let mut fresh = fresh.into_iter();
        for slot in &self.slots {
            let mut s = slot.borrow_mut();
            s.send = fresh.next();
            s.recv = fresh.next();
            s.last_use = LastUse::None;
        }
        Ok(())
    }

    /// Every region, or `None` before [`Staging::reserve`].
    fn regions(&self) -> Option<Vec<Rc<StagingMemory>>> {
        let mut all = Vec::with_capacity(2 * self.slots.len());
        for slot in &self.slots {
            let s = slot.borrow();
            all.push(Rc::clone(s.send.as_ref()?));
            all.push(Rc::clone(s.recv.as_ref()?));
        }
        Some(all)
    }

    /// Bytes each region holds (the smallest; 0 before [`Staging::reserve`]).
    pub fn capacity(&self) -> usize {
        let regions = self.regions().unwrap_or_default();
        regions.iter().map(|m| m.bytes()).min().unwrap_or(0)
    }

    /// Whether the regions are page-locked (a GPU's staging; false on the CPU devices,
    /// and before [`Staging::reserve`]).
    pub fn pinned(&self) -> bool {
        self.regions()
            .is_some_and(|all| all.iter().all(|m| m.pinned()))
    }

    /// Host bytes the staging holds: 2 slots x (send + receive).
    pub fn held_bytes(&self) -> u64 {
        4 * self.capacity() as u64
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

    /// The next slot, for a collective that needs `need` bytes in each region, once the
    /// slot's last upload has run (the host waits for it on `dev`).
    pub(crate) fn lease<D: Device>(
        &self,
        dev: &D,
        rank: usize,
        op: &'static str,
        need: usize,
    ) -> Result<Lease> {
        let have = self.capacity();
        if need > have {
            return Err(CommError::Staging {
                rank,
                op,
                need,
                have,
            });
        }
        let index = self.next.get();
        self.next.set((index + 1) % self.slots.len());
        let mut slot = self.slots[index].borrow_mut();
        let fail =
            |why: String| CommError::device(rank, op, format!("host staging: slot {index}: {why}"));
        // The host waits until nothing can still read or write the slot's regions.
        let failed_before = match &slot.last_use {
            LastUse::None => false,
            LastUse::Queued {
                device,
                event,
                settled,
            } => {
                let event = event
                    .downcast_ref::<D::Event>()
                    .filter(|_| *device == device_id(dev))
                    .ok_or_else(|| {
                        fail(
                            "last used through another device; give each device its own StagedComm"
                                .into(),
                        )
                    })?;
                dev.sync_event(event).map_err(|e| fail(e.to_string()))?;
                // Finished work has been let go by now; failed work, which a device that
                // overlaps reports only later, has not.
                !settled.get()
            }
            LastUse::Unsettled => true,
        };
        if failed_before {
            // The use before failed part-way: everything this device queued must have
            // run, and a failed collective may have left the transport holding the
            // regions (its handles to them are leaked, never freed), so the slot takes
            // fresh ones.
            log::warn!(
                "rank {rank}: host staging: slot {index} takes fresh regions (the collective that used it last failed)"
            );
            dev.synchronize()
                .map_err(|e| fail(format!("after an earlier failure: {e}")))?;
            if let Some(bytes) = slot.send.as_ref().map(|m| m.bytes()) {
                let fresh = || -> Result<Option<Rc<StagingMemory>>> {
                    let memory = dev.alloc_staging(bytes).map_err(|e| fail(e.to_string()))?;
                    Ok(Some(Rc::new(memory)))
                };
                slot.send = fresh()?;
                slot.recv = fresh()?;
            }
        }
        slot.last_use = LastUse::Unsettled;
        let (Some(send), Some(recv)) = (&slot.send, &slot.recv) else {
            return Err(CommError::Staging {
                rank,
                op,
                need,
                have: 0,
            });
        };
        self.calls.set(self.calls.get() + 1);
        Ok(Lease {
            index,
            send: Rc::clone(send),
            recv: Rc::clone(recv),
            settled: Rc::new(Cell::new(false)),
        })
    }

    /// The lease's collective and upload are queued on `dev`; `after` is an event it
    /// recorded after the upload: the slot is used again once it has completed. A lease
    /// never released (an error part-way), or one whose work the device leaked (it
    /// failed after the release), leaves the slot to a full synchronisation and fresh
    /// regions.
    pub(crate) fn release<D: Device>(&self, dev: &D, lease: Lease, after: D::Event) {
        self.slots[lease.index].borrow_mut().last_use = LastUse::Queued {
            device: device_id(dev),
            event: Box::new(after),
            settled: lease.settled,
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{on_stream, run_local, LocalComm, ReduceOp};
    use zero_kernels::device::{Buffer, HostDevice, SimDevice};

    /// Thread ranks whose started collectives finish their transfer but fail when waited
    /// for (a peer that died after the data moved): a device that overlaps sees the
    /// failure only after it has queued the upload and the slot was released.
    struct FailsLate<'a>(&'a LocalComm);

    struct Late;
    impl InFlight for Late {
        fn test(&mut self) -> Result<bool> {
            Ok(false)
        }
        fn wait(&mut self) -> Result<()> {
            Err(CommError::device(0, "all_reduce", "peer 1 is gone".into()))
        }
    }

    impl Communicator for FailsLate<'_> {
        fn rank(&self) -> usize {
            self.0.rank()
        }
        fn size(&self) -> usize {
            self.0.size()
        }
        fn world_rank(&self) -> usize {
            self.0.world_rank()
        }
        fn name(&self) -> &str {
            "fails-late"
        }
        fn stats(&self) -> CommStats {
            self.0.stats()
        }
        fn reset_stats(&self) {
            self.0.reset_stats()
        }
        fn half_sum(&self) -> HalfSum {
            self.0.half_sum()
        }
        fn set_half_sum(&self, mode: HalfSum) {
            self.0.set_half_sum(mode)
        }
        unsafe fn execute(&self, call: &RawCall) -> Result<()> {
            self.0.execute(call)
        }
        unsafe fn start(&self, call: &RawCall) -> Result<Box<dyn InFlight>> {
            self.0.execute(call)?;
            Ok(Box::new(Late))
        }
    }

    /// Slot 0's regions (send, receive), to tell reuse from fresh ones.
    fn slot0(st: &Staging) -> (Rc<StagingMemory>, Rc<StagingMemory>) {
        let slot = st.slots[0].borrow();
        match (&slot.send, &slot.recv) {
            (Some(s), Some(r)) => (Rc::clone(s), Rc::clone(r)),
            _ => panic!("slot 0 has no regions"),
        }
    }

    /// Collectives that finish keep their slots' regions (no allocation per collective),
    /// on the host device with and without overlap and on the simulated GPU.
    #[test]
    fn finished_collectives_keep_their_regions_on_every_device() {
        fn reused<D: Device>(open: impl Fn() -> D + Sync) -> bool {
            let out = run_local(1, Default::default(), |comm| {
                let dev = open();
                let staged = StagedComm::new(&comm);
                let st = staged.buffers();
                st.reserve(&dev, 16).expect("staging allocated");
                let side = dev.stream("comm").expect("a stream");
                let mut buf = dev.alloc::<f32>(4, "buf").expect("a buffer");
                let before = slot0(st);
                for _ in 0..5 {
                    on_stream::all_reduce(&staged, &dev, &side, buf.view_mut(), ReduceOp::Sum)
                        .expect("a collective");
                }
                dev.synchronize().expect("synchronized");
                let after = slot0(st);
                Rc::ptr_eq(&before.0, &after.0) && Rc::ptr_eq(&before.1, &after.1)
            });
            out.into_iter().all(|r| r.expect("rank ran"))
        }
        for overlap in [true, false] {
            let host = || {
                let dev = HostDevice::new();
                dev.set_overlap(overlap);
                dev
            };
            assert!(reused(host), "host device, overlap {overlap}");
            let sim = || {
                let dev = SimDevice::gpu_twin(11);
                dev.set_overlap(overlap);
                dev
            };
            assert!(reused(sim), "simulated GPU, overlap {overlap}");
        }
    }

    #[test]
    fn a_slot_whose_collective_failed_after_its_release_takes_fresh_regions() {
        let out = run_local(1, Default::default(), |comm| {
            let staged = StagedComm::new(FailsLate(&comm));
            // The host device overlaps started work and, unlike the simulated GPU, stays
            // usable after a failure (a caller may retry).
            let dev = HostDevice::new();
            dev.set_overlap(true);
            let st = staged.buffers();
            st.reserve(&dev, 16).expect("staging allocated");
            let side = dev.stream("comm").expect("a stream");
            let mut buf = dev.alloc::<f32>(4, "buf").expect("a buffer");
            let before = slot0(st);
            // Started and left running: the failure is not seen yet.
            let first = on_stream::all_reduce(&staged, &dev, &side, buf.view_mut(), ReduceOp::Sum);
            let released = matches!(st.slots[0].borrow().last_use, LastUse::Queued { .. });
            // Slot 1: its download waits for the first collective, which fails.
            let second = on_stream::all_reduce(&staged, &dev, &side, buf.view_mut(), ReduceOp::Sum);
            // Slot 0 again.
            let third = on_stream::all_reduce(&staged, &dev, &side, buf.view_mut(), ReduceOp::Sum);
            let after = slot0(st);
            let reused = Rc::ptr_eq(&before.0, &after.0) || Rc::ptr_eq(&before.1, &after.1);
            (
                first.is_ok(),
                released,
                second.map_err(|e| e.to_string()),
                third.map_err(|e| e.to_string()),
                reused,
            )
        });
        let (first, released, second, third, reused) =
            out.into_iter().next().expect("one rank").expect("rank ran");
        assert!(
            first && released,
            "the first collective was started and released"
        );
        let e = second.expect_err("the failure surfaces at the next collective");
        assert!(e.contains("peer 1 is gone"), "{e}");
        assert!(
            !reused,
            "the failed collective's regions were reused: {third:?}"
        );
    }
}
