//! `micro comm --device sim-gpu|cuda --comm BACKEND`: the engine's collectives on device
//! buffers (`zero_comm::on_stream` through the backend, queued on a stream and waited
//! for) next to the baseline that backend stands in for, on buffers of the same size:
//!
//! - `nccl`: the bare NCCL call on the same device buffers (`NcclComm::bare`): what our
//!   layers cost over NCCL;
//! - `mpi-staged`, `mpi-cuda`: MPI on host buffers (rsmpi): what going through the GPU
//!   costs over an MPI job on host memory (the staging copies, or MPI's device path).
//!
//! On GPU clusters, running it once per backend gives NCCL against MPI in bus bandwidth
//! on device buffers (slurm/comm.sbatch). `sim-gpu` (the simulated GPU, a test tool)
//! runs the same code paths; its times measure nothing.

use anyhow::{bail, Context, Result};
use zero_comm::rsmpi::topology::SimpleCommunicator;
use zero_comm::{on_stream, Communicator, MpiComm, ReduceOp};
use zero_kernels::device::{Buffer, Device};

use super::comm::{bus_row, paired, plan, Op, Point, RawMpi, Row};
use super::comm_args::CommArgs;

/// What the "raw" column runs.
pub(super) enum Baseline<'a> {
    /// rsmpi on host buffers.
    HostMpi(&'a SimpleCommunicator),
    /// The bare NCCL call on the same device buffers.
    #[cfg(feature = "nccl")]
    BareNccl(&'a zero_comm::NcclComm),
}

impl Baseline<'_> {
    /// Said in the table's header.
    pub(super) fn describe(&self) -> &'static str {
        match self {
            Baseline::HostMpi(_) => "raw = MPI on host buffers of the same size",
            #[cfg(feature = "nccl")]
            Baseline::BareNccl(_) => "raw = the bare NCCL call on the same device buffers",
        }
    }
}

/// Every size and collective of `args` for element type `T` on device `dev`: ours
/// through `engine_comm`, raw as `baseline`.
pub(super) fn sweep<T: RawMpi, D: Device, C: Communicator>(
    args: &CommArgs,
    comm: &MpiComm,
    world: &SimpleCommunicator,
    dev: &D,
    engine_comm: &C,
    baseline: &Baseline<'_>,
) -> Result<Vec<Row>> {
    let n = comm.size();
    let elem = std::mem::size_of::<T>();
    let (ops, points) = plan(args, n, elem)?;
    let stream = dev.stream("micro-comm")?;
    let mut rows = Vec::new();
    for Point {
        count,
        block,
        pairs,
    } in points
    {
        let mut full_send = dev.alloc::<T>(count, "full send")?;
        let mut full_recv = dev.alloc::<T>(count, "full recv")?;
        let mut block_send = dev.alloc::<T>(block, "block send")?;
        let mut block_recv = dev.alloc::<T>(block, "block recv")?;
        for b in [
            &mut full_send,
            &mut full_recv,
            &mut block_send,
            &mut block_recv,
        ] {
            dev.fill(&stream, b.view_mut(), T::default())?;
        }
        dev.synchronize()?;
        let (host_send, mut host_full, mut host_block) = match baseline {
            Baseline::HostMpi(_) => (
                vec![T::default(); count],
                vec![T::default(); count],
                vec![T::default(); block],
            ),
            #[cfg(feature = "nccl")]
            Baseline::BareNccl(_) => (Vec::new(), Vec::new(), Vec::new()),
        };
        for &op in &ops {
            let what = || format!("{} of {count} x {}", op.name(), T::DTYPE);
            let (ours, raw) = paired(comm, world, args.warmup, pairs, |ours| {
                if ours {
                    match op {
                        // In place: the engine's all-reduces are (sums of zeros stay zero).
                        Op::AllReduce => on_stream::all_reduce(
                            engine_comm,
                            dev,
                            &stream,
                            full_recv.view_mut(),
                            ReduceOp::Sum,
                        ),
                        Op::ReduceScatter => on_stream::reduce_scatter(
                            engine_comm,
                            dev,
                            &stream,
                            full_send.view(),
                            block_recv.view_mut(),
                            ReduceOp::Sum,
                        ),
                        Op::AllGather => on_stream::all_gather(
                            engine_comm,
                            dev,
                            &stream,
                            block_send.view(),
                            full_recv.view_mut(),
                        ),
                    }
                    .with_context(what)?;
                    return dev.synchronize().with_context(what);
                }
                match baseline {
                    Baseline::HostMpi(w) => {
                        comm.watched(op.kind(), count, T::DTYPE, || match op {
                            Op::AllReduce => T::raw(w, op, &host_send, &mut host_full),
                            Op::ReduceScatter => T::raw(w, op, &host_send, &mut host_block),
                            Op::AllGather => T::raw(w, op, &host_send[..block], &mut host_full),
                        });
                        Ok(())
                    }
                    #[cfg(feature = "nccl")]
                    Baseline::BareNccl(nccl) => {
                        let p = |b: &D::Buf<T>| b.raw_ptr() as *mut u8;
                        let (kind, send, recv, cnt) = match op {
                            Op::AllReduce => (
                                zero_comm::CollectiveKind::AllReduce,
                                p(&full_recv),
                                p(&full_recv),
                                count,
                            ),
                            Op::ReduceScatter => (
                                zero_comm::CollectiveKind::ReduceScatter,
                                p(&full_send),
                                p(&block_recv),
                                block,
                            ),
                            Op::AllGather => (
                                zero_comm::CollectiveKind::AllGather,
                                p(&block_send),
                                p(&full_recv),
                                block,
                            ),
                        };
                        // SAFETY: this GPU's buffers of the lengths `kind` and `cnt` imply
                        // (allocated above), idle: ours waited for its stream.
                        unsafe { nccl.bare(kind, send, recv, cnt, T::DTYPE) }.with_context(what)
                    }
                }
            })?;
            let row = bus_row(op, T::DTYPE, n, count, elem, pairs, &ours, &raw);
            if comm.rank() == 0 {
                super::comm::print_row(&row);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// `--comm` with device buffers: which backends make sense here, or why not.
pub(super) fn check_backend(device_is_cuda: bool, choice: zero_comm::CommChoice) -> Result<()> {
    use zero_comm::CommChoice as C;
    match (device_is_cuda, choice) {
        (_, C::MpiStaged) | (true, C::MpiCuda) | (true, C::Nccl) => Ok(()),
        (false, c) => bail!(
            "--comm {c} with --device sim-gpu: the simulated GPU runs mpi-staged only (NCCL and CUDA-aware MPI need a real GPU)"
        ),
        (true, c) => bail!(
            "--comm {c} with device buffers: give mpi-staged, mpi-cuda or nccl (host buffers: --device host)"
        ),
    }
}
