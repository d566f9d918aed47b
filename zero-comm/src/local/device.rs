//! Feature `cuda`: steps 2-4 of the protocol (module documentation of [`super`]) for
//! buffers in the memory of the GPU the thread ranks share, through zero-kernels'
//! [`PeerMover`]: copies and rank-order folds on a stream of this rank's own, waited for
//! before point 2 (no queued work reads a peer's input after it) and before returning (the
//! result is complete when the collective returns).

use super::rendezvous::{Reading, Slot};
use super::LocalComm;
use crate::communicator::{RawCall, ReduceOp};
use crate::error::{CommError, Result};
use crate::stats::CollectiveKind;
use std::cell::RefCell;
use zero_kernels::cuda::peer::{Fold, PeerMover};
use zero_kernels::KernelError;

/// Whether this build moves data between device buffers.
pub(super) const ENABLED: bool = true;

/// One rank's GPU data movement: opened at its first device collective, kept.
#[derive(Debug, Default)]
pub(super) struct DeviceState {
    mover: RefCell<Option<PeerMover>>,
}

impl DeviceState {
    /// Make sure a mover for GPU `ordinal` is open (called before point 1, so a failure
    /// leaves no peer reading this rank's buffers).
    pub(super) fn open(&self, rank: usize, op: &'static str, ordinal: usize) -> Result<()> {
        let mut m = self.mover.borrow_mut();
        if m.as_ref().is_some_and(|m| m.ordinal() == ordinal) {
            return Ok(());
        }
        let mover = PeerMover::new(ordinal).map_err(|e| {
            CommError::device(
                rank,
                op,
                format!("the local backend cannot open cuda:{ordinal} for rank {rank}: {e}"),
            )
        })?;
        *m = Some(mover);
        Ok(())
    }

    /// Steps 2-4 on the GPU. Any failure poisons the group; point 2 is passed in every
    /// case, after this rank's stream ran dry.
    ///
    /// # Safety
    /// As [`LocalComm::move_data`], with every rank's buffers in the memory of the GPU
    /// [`DeviceState::open`] opened (validated per rank, compared across ranks by the
    /// check).
    pub(super) unsafe fn move_data(
        &self,
        comm: &LocalComm,
        call: &RawCall,
        peers: &[Slot],
        upcast: bool,
        reading: Reading,
    ) -> Result<()> {
        let op = call.kind.name();
        let guard = self.mover.borrow();
        let Some(m) = guard.as_ref() else {
            let e = KernelError::Device("no GPU opened before the collective".to_string());
            return Err(fail(comm, op, e, Some(reading)));
        };
        // SAFETY: this function's contract.
        let queued = unsafe { queue_reads(m, comm, call, peers, upcast) };
        // Waited for also when queueing failed: what was queued may still read peers.
        let synced = m.sync();
        let tmp = match queued.and_then(|t| synced.map(|()| t)) {
            Ok(t) => t,
            Err(e) => return Err(fail(comm, op, e, Some(reading))),
        };
        // Point 2: our stream is idle, nothing of ours reads a peer's input any more.
        reading.finish();
        if let Some((tmp, bytes)) = tmp {
            // SAFETY: every rank passed point 2, so no one reads our `recv` any more; it
            // holds `bytes` (the temporary's size), writable (contract), and the
            // temporary is scratch of this rank, not a user buffer.
            let copied = unsafe { m.copy(call.recv.ptr as u64, tmp, bytes) };
            if let Err(e) = copied.and_then(|()| m.sync()) {
                return Err(fail(comm, op, e, None));
            }
        }
        Ok(())
    }
}

/// A GPU failure on this rank: poison the group (it says why), pass point 2 if not yet.
fn fail(comm: &LocalComm, op: &'static str, e: KernelError, reading: Option<Reading>) -> CommError {
    let err = CommError::device(
        comm.world_rank,
        op,
        format!("the local backend's device copy failed: {e}"),
    );
    comm.group.poison(comm.rank, err.to_string());
    if let Some(r) = reading {
        r.finish();
    }
    err
}

/// Step 2: queue this rank's reads of its peers' inputs. Returns the temporary to copy
/// into `recv` after point 2 (in-place all-reduce): `(device address, bytes)`.
///
/// # Safety
/// As [`DeviceState::move_data`]; the caller waits for the stream before point 2.
unsafe fn queue_reads(
    m: &PeerMover,
    comm: &LocalComm,
    call: &RawCall,
    peers: &[Slot],
    upcast: bool,
) -> Result<Option<(u64, usize)>, KernelError> {
    let es = call.dtype.size_bytes();
    let recv = call.recv;
    let dst = recv.ptr as u64;
    match call.kind {
        // Not reached (`execute` returns first): nothing to move.
        CollectiveKind::Barrier => Ok(None),
        CollectiveKind::Broadcast => {
            if comm.rank != call.root {
                // SAFETY: the root's buffer holds `recv.len` elements (same count,
                // checked) and nobody writes it before point 2; ours is writable and
                // read by no peer; two ranks' buffers do not overlap (contract).
                unsafe { m.copy(dst, peers[call.root].ptr as u64, recv.len * es) }?;
            }
            Ok(None)
        }
        CollectiveKind::AllGather => {
            let in_place = call.send.is_none();
            let block = recv.len / comm.size;
            for (q, s) in peers.iter().enumerate() {
                if in_place && q == comm.rank {
                    continue; // already in place
                }
                let at = dst + (q * block * es) as u64;
                // SAFETY: as the host all-gather (`LocalComm::move_data`): rank q's input
                // is `block` elements, block q of our output is in bounds and read by no
                // peer (in place they read only block `rank`, which is skipped).
                unsafe { m.copy(at, s.ptr as u64, block * es) }?;
            }
            Ok(None)
        }
        CollectiveKind::AllToAll => {
            let block = recv.len / comm.size;
            for (q, s) in peers.iter().enumerate() {
                let at = dst + (q * block * es) as u64;
                let from = s.ptr as u64 + (comm.rank * block * es) as u64;
                // SAFETY: as the host all-to-all (`LocalComm::move_data`): rank q's `send`
                // holds `size * block` elements, block q of our `recv` is in bounds and
                // read by no peer (they read only `send`s).
                unsafe { m.copy(at, from, block * es) }?;
            }
            Ok(None)
        }
        CollectiveKind::AllReduce | CollectiveKind::ReduceScatter => {
            let (off, len) = comm.my_range(call);
            if len == 0 {
                return Ok(None);
            }
            let fold = match call.op.unwrap_or(ReduceOp::Sum) {
                ReduceOp::Sum if upcast => Fold::SumUpcast,
                ReduceOp::Sum => Fold::Sum,
                ReduceOp::Max => Fold::Max,
            };
            let srcs: Vec<u64> = peers.iter().map(|s| s.ptr as u64).collect();
            if call.send.is_some() {
                // SAFETY: every input holds `off + len` elements (checked lengths: the
                // whole buffer, or size x block for a reduce-scatter); our `recv` holds
                // `len`, is read by no peer and overlaps no `send` (contract).
                unsafe { m.fold(call.dtype, fold, dst, &srcs, off, len) }?;
                Ok(None)
            } else {
                // In place: peers read our `recv` until point 2; fold into scratch.
                let bytes = len * es;
                let tmp = m.scratch(bytes)?;
                // SAFETY: as above; the temporary is this rank's scratch of `bytes`
                // bytes, 8-byte aligned, overlapping no user buffer.
                unsafe { m.fold(call.dtype, fold, tmp, &srcs, off, len) }?;
                Ok(Some((tmp, bytes)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::{self, Elem, Half};
    use crate::DType;
    use half::{bf16, f16};
    use zero_kernels::cuda::peer::twin;

    /// Inputs of `k` ranks, `words` u64 each: random bits mixed with the values where the
    /// rules differ (signed zeros, infinities, NaNs with payloads, subnormals, extremes).
    fn inputs(dtype: DType, k: usize, words: usize, seed: u64) -> Vec<Vec<u64>> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let special: &[u64] = match dtype {
            DType::F32 => &[
                0,
                0x8000_0000,
                0x7f80_0000,
                0xff80_0000,
                0x7fc0_0001,
                0xffc0_1234,
                0x7f80_0005,
                0xff80_0007,
                1,
                0x8000_0001,
                0x7f7f_ffff,
                0xff7f_ffff,
                0x3f80_0000,
                0xbf80_0000,
                0x4b80_0000,
            ],
            DType::F64 => &[
                0,
                1 << 63,
                0x7ff0 << 48,
                0xfff0 << 48,
                (0x7ff8 << 48) | 9,
                (0xfff8 << 48) | 3,
                (0x7ff0 << 48) | 5,
                1,
                0x7fef_ffff_ffff_ffff,
                0x3ff0 << 48,
                0xbff0 << 48,
            ],
            DType::BF16 => &[
                0, 0x8000, 0x7f80, 0xff80, 0x7fc1, 0xffc2, 0x7f81, 0xff83, 1, 0x8001, 0x7f7f,
                0xff7f, 0x3f80, 0x4380, 0x3b80,
            ],
            DType::F16 => &[
                0, 0x8000, 0x7c00, 0xfc00, 0x7e01, 0xfe02, 0x7c01, 0xfc03, 1, 0x8001, 0x7bff,
                0xfbff, 0x3c00, 0x6400, 0x1400,
            ],
            _ => &[
                0,
                1,
                u64::MAX,
                1 << 63,
                (1 << 63) - 1,
                0x8000_0000,
                0x7fff_ffff,
                0x80,
                0xff,
            ],
        };
        let es = dtype.size_bytes();
        let mask = if es == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * es)) - 1
        };
        (0..k)
            .map(|_| {
                let mut bytes = Vec::with_capacity(words * 8);
                while bytes.len() < words * 8 {
                    let r = next();
                    let v = if r % 3 == 0 {
                        special[(r >> 8) as usize % special.len()]
                    } else if dtype.is_float() && r % 3 == 1 {
                        // Similar magnitudes, so sums round and cancel.
                        let base = special[special.len() - 1];
                        base ^ ((r >> 16) & 0xff)
                    } else {
                        r >> 5
                    };
                    bytes.extend_from_slice(&(v & mask).to_le_bytes()[..es]);
                }
                bytes
                    .chunks(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect()
            })
            .collect()
    }

    fn typed<T: bytemuck::Pod>(x: &[u64], off: usize, n: usize) -> &[T] {
        &bytemuck::cast_slice::<u64, T>(x)[off..off + n]
    }

    /// The host fold (what `LocalComm` computes on host buffers), as bytes.
    fn host<T: Elem + bytemuck::Pod>(xs: &[Vec<u64>], fold: Fold, off: usize, n: usize) -> Vec<u8> {
        let ins: Vec<&[T]> = xs.iter().map(|x| typed::<T>(x, off, n)).collect();
        let mut out = vec![T::zeroed(); n];
        match fold {
            Fold::Sum => reduce::fold(&ins, &mut out, T::sum),
            Fold::Max => reduce::fold(&ins, &mut out, T::max),
            Fold::SumUpcast => unreachable!("halves go through host_upcast"),
        }
        bytemuck::cast_slice(&out).to_vec()
    }

    fn host_upcast<H: Half + bytemuck::Pod>(xs: &[Vec<u64>], off: usize, n: usize) -> Vec<u8> {
        let ins: Vec<&[H]> = xs.iter().map(|x| typed::<H>(x, off, n)).collect();
        let mut acc = vec![0f32; n];
        reduce::fold_upcast(&ins, &mut acc);
        let mut out = vec![H::zeroed(); n];
        reduce::narrow(&acc, &mut out);
        bytemuck::cast_slice(&out).to_vec()
    }

    /// The kernels' order and element operations (checked on the GPU against the kernels
    /// themselves) give the host fold's bits, for every dtype and reduction.
    #[test]
    fn kernel_twin_equals_the_host_fold() {
        let cases = DType::ALL.into_iter().flat_map(|d| {
            let mut f = vec![Fold::Sum, Fold::Max];
            if d.is_half() {
                f.push(Fold::SumUpcast);
            }
            f.into_iter().map(move |f| (d, f))
        });
        for (dtype, fold) in cases {
            for (k, seed) in [(1, 3u64), (2, 5), (3, 7), (5, 11), (8, 13)] {
                let words = 97;
                let xs = inputs(
                    dtype,
                    k,
                    words,
                    seed.wrapping_mul(0x9e37_79b9) ^ dtype as u64,
                );
                let total = words * 8 / dtype.size_bytes();
                let (off, n) = (total / 5, total - total / 5 - 3);
                let want = match (dtype, fold) {
                    (DType::BF16, Fold::SumUpcast) => host_upcast::<bf16>(&xs, off, n),
                    (DType::F16, Fold::SumUpcast) => host_upcast::<f16>(&xs, off, n),
                    (DType::F32, _) => host::<f32>(&xs, fold, off, n),
                    (DType::F64, _) => host::<f64>(&xs, fold, off, n),
                    (DType::BF16, _) => host::<bf16>(&xs, fold, off, n),
                    (DType::F16, _) => host::<f16>(&xs, fold, off, n),
                    (DType::U8, _) => host::<u8>(&xs, fold, off, n),
                    (DType::U32, _) => host::<u32>(&xs, fold, off, n),
                    (DType::I32, _) => host::<i32>(&xs, fold, off, n),
                    (DType::I64, _) => host::<i64>(&xs, fold, off, n),
                };
                let srcs: Vec<&[u8]> = xs.iter().map(|x| bytemuck::cast_slice(x)).collect();
                let mut got = vec![0u8; want.len()];
                twin(dtype, fold, &mut got, &srcs, off, n).expect("twin");
                let es = dtype.size_bytes();
                if let Some(i) = (0..n).find(|&i| got[i * es..][..es] != want[i * es..][..es]) {
                    let ins: Vec<String> = srcs
                        .iter()
                        .map(|s| format!("{:02x?}", &s[(off + i) * es..][..es]))
                        .collect();
                    panic!(
                        "{dtype} {fold:?}, {k} ranks, element {i}: twin {:02x?}, host {:02x?}, inputs {ins:?}",
                        &got[i * es..][..es],
                        &want[i * es..][..es]
                    );
                }
            }
        }
    }
}
