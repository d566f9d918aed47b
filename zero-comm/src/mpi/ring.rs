//! Non-blocking reduce-scatter of host sums as a ring of point-to-point messages.
//!
//! Open MPI 4.1's `MPI_Ireduce_scatter_block` (libnbc) reduces the whole buffer to rank 0
//! along a binomial tree and then scatters it: rank 0 adds every element (log2 N times
//! the buffer) while the others wait for it. On 2 ranks of a stage-3 step at V=50257 in
//! bf16 that put all of the gradient sums (6% of the step) on rank 0 and none on rank 1.
//! A ring spreads them (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms",
//! 2009; NCCL's ring): in N - 1 steps each rank sends one block's partial sum to its right
//! neighbour, receives another block's from its left and adds its own input to it, so
//! each rank adds and sends (N - 1)/N of the buffer, the bytes `stats.rs` counts. Block b
//! ends on rank b, summed from rank b + 1's input onwards around the ring; with 2 ranks
//! that is `x + y`, which is the same bits in either order.
//!
//! The transfers move with MPI's progress (the progress thread's polls, `progress.rs`);
//! the sums run on the owner's thread, vectorised (`zero-kernels/src/cast/mod.rs`), when
//! it tests or waits, and each finished step posts the next. So with N > 2 (N - 1 steps)
//! a ring moves one step per test of its owner, where MPI's own schedules also move from
//! the progress thread alone; the host device tests before every op it runs
//! (`zero-kernels/src/device/host.rs`; the oldest work of each stream), and a ring
//! finishes only while every rank keeps testing or waits for it: ranks must wait for
//! their collectives in the same order, as the engine's do. The messages travel on a
//! communicator of their own (duplicated with the collective one), tagged with the
//! collective's sequence number, so rings in flight together never match each other's
//! messages.

use super::ops::add_into;
use crate::DType;
use mpi::ffi;
use std::os::raw::{c_int, c_void};

/// With more than 2 ranks, the smallest block (elements per rank) that goes round the
/// ring; smaller ones are MPI's (`MpiComm::launch`).
pub(super) const MIN_BLOCK_PAST_TWO_RANKS: usize = 1 << 14;

/// The element types the ring sums (their sums run here, not in MPI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Element {
    F32,
    BF16,
    F16,
}

impl Element {
    /// The ring's element for `dtype`, if it sums that type.
    pub(super) fn of(dtype: DType) -> Option<Element> {
        match dtype {
            DType::F32 => Some(Element::F32),
            DType::BF16 => Some(Element::BF16),
            DType::F16 => Some(Element::F16),
            _ => None,
        }
    }

    fn bytes(self) -> usize {
        match self {
            Element::F32 => 4,
            Element::BF16 | Element::F16 => 2,
        }
    }
}

/// What a ring's MPI call returned when it failed: the call's name and MPI's error code.
pub(super) type RingError = (&'static str, c_int);

/// Where a ring runs and what it sums: `size` ranks on `comm` (this one `rank`), blocks
/// of `block` elements of `element`, sent as `datatype`, tagged `tag`.
pub(super) struct RingSpec {
    pub(super) comm: ffi::MPI_Comm,
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) block: usize,
    pub(super) element: Element,
    pub(super) datatype: ffi::MPI_Datatype,
    pub(super) tag: c_int,
}

/// One reduce-scatter in flight: `size` blocks at `input`, this rank's summed block into
/// `output`.
pub(super) struct Ring {
    spec: RingSpec,
    input: *const u8,
    output: *mut u8,
    /// Partial sums between steps, two blocks used in turn (one sent while the other
    /// receives); u32 so that f32 and 16-bit views of them are aligned.
    partial: [Vec<u32>; 2],
    /// The step whose messages are in flight (0..size - 1).
    step: usize,
    /// Its send and its receive.
    requests: [ffi::MPI_Request; 2],
    /// The error that stopped the ring, returned again by every later call: its
    /// neighbours wait for a step it will never send.
    failed: Option<RingError>,
}

/// A ring that could not start: the MPI call's error, and whether its first step's
/// messages were all taken back ([`Ring::settle`]); when not, MPI may still write the
/// receive's buffer (the output with 2 ranks, else a partial block, leaked then).
pub(super) struct StartFailure {
    pub(super) error: RingError,
    pub(super) settled: bool,
}

impl Ring {
    /// Start a ring (size > 1, block > 0) by posting its first step.
    ///
    /// # Safety
    /// `input` holds `size * block` elements and `output` `block`, valid (and not written
    /// by anyone else) until the ring finishes or is leaked; MPI is running.
    pub(super) unsafe fn start(
        spec: RingSpec,
        input: *const c_void,
        output: *mut c_void,
    ) -> Result<Ring, StartFailure> {
        let words = (spec.block * spec.element.bytes()).div_ceil(4);
        // Step s receives into partial[(s + 1) % 2] but the last into the output: N = 2
        // needs no partial block, N = 3 partial[1], N >= 4 both.
        let partial = std::array::from_fn(|i| match spec.size + i >= 4 {
            true => vec![0u32; words],
            false => Vec::new(),
        });
        let mut ring = Ring {
            spec,
            input: input as *const u8,
            output: output as *mut u8,
            partial,
            step: 0,
            // SAFETY: predefined constant.
            requests: [ffi::RSMPI_REQUEST_NULL; 2],
            failed: None,
        };
        if let Err(error) = ring.post() {
            let settled = ring.settle();
            if !settled {
                // Its partial blocks may still be a receive's target.
                std::mem::forget(ring);
            }
            return Err(StartFailure { error, settled });
        }
        Ok(ring)
    }

    /// Take back every message of this ring still in flight, after an error: cancel it
    /// and wait for it, for at most [`super::SETTLE_LIMIT`] (a receive not yet matched is
    /// cancelled; a send MPI will not cancel, as Open MPI does not, completes when its
    /// receiver takes it, or once buffered, and a receiver that failed too never does),
    /// so that no message reads or writes the caller's buffers after the error is
    /// returned. True when MPI holds no request of the ring any more; false when it kept
    /// one (a failing cancel or test, or the limit), whose buffer it may still use.
    ///
    /// # Safety
    /// As [`Ring::start`]; called by the ring's owner only.
    pub(super) unsafe fn settle(&mut self) -> bool {
        for r in self.requests.iter_mut() {
            // Completed requests were freed and nulled by their test or wait.
            if *r != ffi::RSMPI_REQUEST_NULL {
                ffi::MPI_Cancel(r);
            }
        }
        super::wait_bounded(&mut self.requests)
    }

    /// The block a rank sends at `step` ((rank - step - 1) mod N); it receives the block
    /// its left neighbour sends, ((rank - step - 2) mod N).
    fn sent_block(&self, rank: usize, step: usize) -> usize {
        (rank + 2 * self.spec.size - step - 1) % self.spec.size
    }

    fn input_block(&self, b: usize) -> *const u8 {
        // SAFETY (of the offset): b < size; the input holds size * block elements.
        self.input
            .wrapping_add(b * self.spec.block * self.spec.element.bytes())
    }

    /// Where `step` receives: the output at the last step, else a partial block.
    fn receive_buffer(&mut self, step: usize) -> *mut u8 {
        if step + 2 == self.spec.size {
            self.output
        } else {
            self.partial[(step + 1) % 2].as_mut_ptr() as *mut u8
        }
    }

    /// Post this step's send (the input's block at step 0, else the partial sum the last
    /// step made) and receive.
    unsafe fn post(&mut self) -> Result<(), RingError> {
        let step = self.step;
        let send: *const u8 = if step == 0 {
            self.input_block(self.sent_block(self.spec.rank, 0))
        } else {
            self.partial[step % 2].as_ptr() as *const u8
        };
        let recv = self.receive_buffer(step);
        let (left, right) = (
            (self.spec.rank + self.spec.size - 1) % self.spec.size,
            (self.spec.rank + 1) % self.spec.size,
        );
        let count = self.spec.block as c_int;
        let rc = ffi::MPI_Irecv(
            recv as *mut c_void,
            count,
            self.spec.datatype,
            left as c_int,
            self.spec.tag,
            self.spec.comm,
            &mut self.requests[1],
        );
        if rc != 0 {
            return Err(("MPI_Irecv", rc));
        }
        let rc = ffi::MPI_Isend(
            send as *const c_void,
            count,
            self.spec.datatype,
            right as c_int,
            self.spec.tag,
            self.spec.comm,
            &mut self.requests[0],
        );
        if rc != 0 {
            // Take the receive back before the error lets anyone free its buffer (if even
            // that fails, `settle` tells the caller, who leaks or ends the process).
            ffi::MPI_Cancel(&mut self.requests[1]);
            ffi::MPI_Wait(&mut self.requests[1], ffi::RSMPI_STATUS_IGNORE);
            return Err(("MPI_Isend", rc));
        }
        Ok(())
    }

    /// Add this rank's input to the block the finished step received.
    unsafe fn combine(&mut self) {
        let step = self.step;
        let own = self.input_block(
            self.sent_block((self.spec.rank + self.spec.size - 1) % self.spec.size, step),
        );
        let sum = self.receive_buffer(step);
        let n = self.spec.block;
        match self.spec.element {
            Element::F32 => add_into::<f32>(sum as _, own as _, n),
            Element::BF16 => add_into::<half::bf16>(sum as _, own as _, n),
            Element::F16 => add_into::<half::f16>(sum as _, own as _, n),
        }
    }

    /// Move the ring on: test (or, when `block`, wait for) the step in flight; for each
    /// finished step add this rank's input and post the next. True when the output holds
    /// this rank's sum.
    ///
    /// # Safety
    /// As [`Ring::start`]; called by the ring's owner only.
    pub(super) unsafe fn advance(&mut self, block: bool) -> Result<bool, RingError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let result = self.advance_steps(block);
        if let Err(e) = result {
            self.failed = Some(e);
        }
        result
    }

    /// [`Ring::advance`]'s steps.
    unsafe fn advance_steps(&mut self, block: bool) -> Result<bool, RingError> {
        loop {
            if block {
                let rc =
                    ffi::MPI_Waitall(2, self.requests.as_mut_ptr(), ffi::RSMPI_STATUSES_IGNORE);
                if rc != 0 {
                    return Err(("MPI_Waitall", rc));
                }
            } else {
                let mut flag: c_int = 0;
                let rc = ffi::MPI_Testall(
                    2,
                    self.requests.as_mut_ptr(),
                    &mut flag,
                    ffi::RSMPI_STATUSES_IGNORE,
                );
                if rc != 0 {
                    return Err(("MPI_Testall", rc));
                }
                if flag == 0 {
                    return Ok(false);
                }
            }
            self.combine();
            self.step += 1;
            if self.step + 1 == self.spec.size {
                return Ok(true);
            }
            self.post()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::child;

    /// A failed step leaves its receive posted, here into the caller's output: `settle`
    /// cancels and completes it, so that no request stays active and a message that
    /// comes later does not land in memory the caller already has back.
    #[test]
    fn settling_takes_back_a_receive_still_in_flight() {
        if !child::is_child() {
            let out = child::run(
                "mpi::ring::tests::settling_takes_back_a_receive_still_in_flight",
                &[
                    ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
                    ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                ],
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{stderr}");
            return;
        }
        let _universe = ::mpi::initialize().expect("MPI starts as a singleton");
        let input = [1f32; 8];
        let mut output = [7f32; 4];
        let late = [9f32; 4];
        let mut drained = [0f32; 4];
        // SAFETY: MPI is up; every buffer outlives the requests on it, which complete
        // before the block ends; the communicator is ours and freed once.
        unsafe {
            let mut comm = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
            assert_eq!(
                ffi::MPI_Comm_dup(ffi::RSMPI_COMM_SELF, comm.as_mut_ptr()),
                0
            );
            let mut comm = comm.assume_init();
            let spec = RingSpec {
                comm,
                rank: 0,
                size: 2,
                block: 4,
                element: Element::F32,
                datatype: ffi::RSMPI_FLOAT,
                tag: 5,
            };
            let mut ring = Ring {
                spec,
                input: input.as_ptr() as *const u8,
                output: output.as_mut_ptr() as *mut u8,
                partial: [Vec::new(), Vec::new()],
                step: 0,
                requests: [ffi::RSMPI_REQUEST_NULL; 2],
                failed: None,
            };
            // The last step's receive (into the output) from a peer that has not sent.
            let rc = ffi::MPI_Irecv(
                output.as_mut_ptr() as *mut c_void,
                4,
                ffi::RSMPI_FLOAT,
                0,
                5,
                comm,
                &mut ring.requests[1],
            );
            assert_eq!(rc, 0);
            assert!(ring.settle(), "nothing left active");
            assert!(ring.requests.iter().all(|r| *r == ffi::RSMPI_REQUEST_NULL));
            // The message comes after all: it is not matched to the cancelled receive.
            let mut send = ffi::RSMPI_REQUEST_NULL;
            let rc = ffi::MPI_Isend(
                late.as_ptr() as *const c_void,
                4,
                ffi::RSMPI_FLOAT,
                0,
                5,
                comm,
                &mut send,
            );
            assert_eq!(rc, 0);
            let rc = ffi::MPI_Recv(
                drained.as_mut_ptr() as *mut c_void,
                4,
                ffi::RSMPI_FLOAT,
                0,
                5,
                comm,
                ffi::RSMPI_STATUS_IGNORE,
            );
            assert_eq!(rc, 0);
            assert_eq!(ffi::MPI_Wait(&mut send, ffi::RSMPI_STATUS_IGNORE), 0);
            ffi::MPI_Comm_free(&mut comm);
        }
        assert_eq!(output, [7f32; 4], "the output was left alone");
        assert_eq!(drained, late);
    }
}
