//! `zero-bench micro comm`: bus bandwidth of our reduce-scatter, all-gather and all-reduce
//! next to the raw MPI call (rsmpi's safe API on MPI_COMM_WORLD) on the same buffers in
//! the same run. Run it under mpirun/srun.
//!
//! Definitions are nccl-tests' (doc/PERFORMANCE.md): `size` is the full buffer in bytes
//! (all-reduce: the buffer; reduce-scatter: the whole input; all-gather: the whole
//! output), `time` the time of one call (from a barrier, max over ranks),
//! `algbw = size / time`, and `busbw = algbw * 2(N-1)/N` for all-reduce and
//! `algbw * (N-1)/N` for reduce-scatter and all-gather: the rate each rank's link would
//! need under a ring algorithm, comparable across N. Ours and raw alternate call by call
//! (order swapped every pair, so a slow moment of a shared machine hits both alike); the
//! median call of each is reported, with the ratio ours/raw of busbw (= raw/ours time).
//! Bandwidths are in GB/s (10^9 bytes per second). Every row of `--csv` and `--json`
//! also says what "ours" and "raw" ran (`ours`, `comm`, `device`, `baseline`) and
//! whether its times measure anything (`measured`: false on the simulated GPU).
//! One rank is refused: it has no communication to measure.
//!
//! `--self-test` first runs every collective on every dtype against serial answers
//! (zero_comm::selftest) and fails the command if any rank saw a wrong value.

use anyhow::{bail, Context, Result};
use half::{bf16, f16};
use serde::Serialize;
use zero_comm::rsmpi::collective::{CommunicatorCollectives, SystemOperation, UserOperation};
use zero_comm::rsmpi::topology::SimpleCommunicator;
use zero_comm::{selftest, CollectiveKind, Communicator, DType, Element, MpiComm, ReduceOp};

use super::comm_args::CommArgs;
use super::comm_device::{self, Baseline};
use crate::device::DeviceChoice;
use crate::logging::outln;

pub(super) use super::comm_args::Op;

impl Op {
    /// The collective, as the watchdog names it.
    pub(super) fn kind(self) -> CollectiveKind {
        match self {
            Op::AllReduce => CollectiveKind::AllReduce,
            Op::ReduceScatter => CollectiveKind::ReduceScatter,
            Op::AllGather => CollectiveKind::AllGather,
        }
    }

    /// nccl-tests' bus-bandwidth factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            _ => (n - 1.0) / n,
        }
    }
}

/// One row of the table.
#[derive(Serialize, Debug, Clone)]
pub(super) struct Row {
    op: &'static str,
    dtype: String,
    ranks: usize,
    size_bytes: usize,
    count: usize,
    pairs: usize,
    ours_us: f64,
    raw_us: f64,
    ours_algbw_gbs: f64,
    ours_busbw_gbs: f64,
    raw_algbw_gbs: f64,
    raw_busbw_gbs: f64,
    ratio: f64,
    /// What the "ours" columns ran: `zero-comm` (our communicator) or `raw-mpi` (the A/A
    /// control, `--raw-vs-raw`).
    ours: &'static str,
    /// The transport of "ours": `mpi`, `tcp`, or the device backend (`mpi-staged`, ...).
    comm: String,
    /// Where the buffers live: `host`, `sim-gpu`, `cuda`, `cuda:N`.
    device: String,
    /// What the "raw" columns ran: `mpi-host` (rsmpi on host buffers) or `nccl-bare`.
    baseline: &'static str,
    /// False on the simulated GPU, whose times measure nothing.
    measured: bool,
}

/// What a run's rows measured: the labels every row of `--csv` and `--json` carries, so
/// that an A/A control or a simulated GPU cannot pass for a real ours-vs-MPI result.
struct Setup {
    ours: &'static str,
    comm: String,
    device: String,
    baseline: &'static str,
    measured: bool,
}

impl Setup {
    fn of(args: &CommArgs) -> Result<Setup> {
        let host = args.device == DeviceChoice::Host;
        let choice = device_options(args)?;
        Ok(Setup {
            ours: if args.raw_vs_raw {
                "raw-mpi"
            } else {
                "zero-comm"
            },
            comm: if args.tcp {
                "tcp".to_string()
            } else {
                choice.to_string()
            },
            device: args.device.to_string(),
            baseline: if !host && choice == zero_comm::CommChoice::Nccl {
                "nccl-bare"
            } else {
                "mpi-host"
            },
            measured: args.device != DeviceChoice::SimGpu,
        })
    }

    fn label(&self, rows: &mut [Row]) {
        for r in rows {
            r.ours = self.ours;
            r.comm = self.comm.clone();
            r.device = self.device.clone();
            r.baseline = self.baseline;
            r.measured = self.measured;
        }
    }
}

/// The raw baseline: rsmpi's safe collectives, on the element type MPI knows.
pub(super) trait RawMpi: Element {
    fn raw(world: &SimpleCommunicator, op: Op, send: &[Self], recv: &mut [Self]);
}

macro_rules! raw_native {
    ($($t:ty),*) => {$(
        impl RawMpi for $t {
            fn raw(world: &SimpleCommunicator, op: Op, send: &[Self], recv: &mut [Self]) {
                match op {
                    Op::AllReduce => world.all_reduce_into(send, recv, SystemOperation::sum()),
                    Op::ReduceScatter => {
                        world.reduce_scatter_block_into(send, recv, SystemOperation::sum())
                    }
                    Op::AllGather => world.all_gather_into(send, recv),
                }
            }
        }
    )*};
}
raw_native!(f32, f64, u8, u32, i32, i64);

/// Halves: moved as u16, summed by an f32-accumulating closure op (measured on this project's build machines; docs/ARCHITECTURE.md).
fn raw_half<H: Element>(
    world: &SimpleCommunicator,
    op: Op,
    send: &[H],
    recv: &mut [H],
    to: fn(u16) -> f32,
    from: fn(f32) -> u16,
) {
    let send: &[u16] = bytemuck::cast_slice(send);
    let recv: &mut [u16] = bytemuck::cast_slice_mut(recv);
    let sum = UserOperation::commutative(move |a, b| {
        if let (Some(a), Some(b)) = (a.downcast::<u16>(), b.downcast::<u16>()) {
            for (x, y) in a.iter().zip(b.iter_mut()) {
                *y = from(to(*x) + to(*y));
            }
        }
    });
    match op {
        Op::AllReduce => world.all_reduce_into(send, recv, &sum),
        Op::ReduceScatter => world.reduce_scatter_block_into(send, recv, &sum),
        Op::AllGather => world.all_gather_into(send, recv),
    }
}

impl RawMpi for bf16 {
    fn raw(world: &SimpleCommunicator, op: Op, send: &[Self], recv: &mut [Self]) {
        raw_half(
            world,
            op,
            send,
            recv,
            |b| bf16::from_bits(b).to_f32(),
            |x| bf16::from_f32(x).to_bits(),
        )
    }
}

impl RawMpi for f16 {
    fn raw(world: &SimpleCommunicator, op: Op, send: &[Self], recv: &mut [Self]) {
        raw_half(
            world,
            op,
            send,
            recv,
            |b| f16::from_bits(b).to_f32(),
            |x| f16::from_f32(x).to_bits(),
        )
    }
}

/// Per-call times of ours (`call(true)`) and raw (`call(false)`) (max over ranks), interleaved call by call with
/// the order swapped every pair, each call started right after a barrier, so that a slow
/// moment of a shared machine hits both alike. `warmup` untimed pairs first.
pub(super) fn paired(
    comm: &MpiComm,
    world: &SimpleCommunicator,
    warmup: usize,
    pairs: usize,
    mut call: impl FnMut(bool) -> Result<()>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    for _ in 0..warmup {
        call(true)?;
        call(false)?;
    }
    let mut t = vec![0.0f64; 2 * pairs];
    for i in 0..pairs {
        for k in [i % 2, 1 - i % 2] {
            comm.watched(CollectiveKind::Barrier, 0, DType::U8, || world.barrier());
            let t0 = zero_comm::rsmpi::time();
            call(k == 0)?;
            t[2 * i + k] = zero_comm::rsmpi::time() - t0;
        }
    }
    let mut slowest = vec![0.0f64; 2 * pairs];
    comm.watched(CollectiveKind::AllReduce, t.len(), DType::F64, || {
        world.all_reduce_into(&t[..], &mut slowest[..], SystemOperation::max())
    });
    let ours_t = slowest.iter().step_by(2).copied().collect();
    let raw_t = slowest.iter().skip(1).step_by(2).copied().collect();
    Ok((ours_t, raw_t))
}

/// A table row from the per-call times of ours and raw (medians; nccl-tests' bandwidths).
#[allow(clippy::too_many_arguments)]
pub(super) fn bus_row(
    op: Op,
    dtype: DType,
    n: usize,
    count: usize,
    elem: usize,
    pairs: usize,
    ours: &[f64],
    raw: &[f64],
) -> Row {
    let (t_ours, t_raw) = (super::median(ours), super::median(raw));
    let bytes = (count * elem) as f64;
    let f = op.bus_factor(n);
    Row {
        op: op.name(),
        dtype: dtype.to_string(),
        ranks: n,
        size_bytes: count * elem,
        count,
        pairs,
        ours_us: t_ours * 1e6,
        raw_us: t_raw * 1e6,
        ours_algbw_gbs: bytes / t_ours / 1e9,
        ours_busbw_gbs: bytes / t_ours / 1e9 * f,
        raw_algbw_gbs: bytes / t_raw / 1e9,
        raw_busbw_gbs: bytes / t_raw / 1e9 * f,
        ratio: t_raw / t_ours,
        // Filled in by `Setup::label` before the rows are written.
        ours: "",
        comm: String::new(),
        device: String::new(),
        baseline: "",
        measured: true,
    }
}

/// One size of the sweep: the elements of the full buffer (divisible by N: whole blocks
/// for reduce-scatter and all-gather), of a block, and the timed pairs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Point {
    pub count: usize,
    pub block: usize,
    pub pairs: usize,
}

/// `--min-size 0` measures nothing sensible (and doubling 0 never grows): refused
/// before MPI starts, rather than raised without a word.
fn check_min_size(args: &CommArgs) -> Result<()> {
    if args.min_size == 0 {
        bail!(
            "--min-size 0: the smallest message must hold at least one element per rank; give a size in bytes such as 1KiB (the default) or 4"
        );
    }
    Ok(())
}

/// The collectives of `--ops`, and the sizes from `--min-size` doubling to `--max-size`
/// for `n` ranks and elements of `elem` bytes.
pub(super) fn plan(args: &CommArgs, n: usize, elem: usize) -> Result<(Vec<Op>, Vec<Point>)> {
    let ops = args.ops.clone();
    let (least, most) = args.pair_bounds()?;
    let mut points = Vec::new();
    let mut size = args.min_size.max(elem * n);
    while size <= args.max_size {
        let count = size / elem / n * n;
        let pairs = (args.bytes_per_point / (count * elem).max(1)).clamp(least, most);
        points.push(Point {
            count,
            block: count / n,
            pairs,
        });
        size = match size.checked_mul(2) {
            Some(s) => s,
            None => break,
        };
    }
    if points.is_empty() {
        bail!(
            "--max-size {} is below the smallest message measured here, one {elem}-byte element per rank ({} bytes on {n} ranks): give a larger --max-size",
            args.max_size,
            elem * n
        );
    }
    Ok((ops, points))
}

/// Measure every size and collective for element type `T`: `ours` (the MPI world's
/// communicator, or `--tcp`'s) against the raw MPI call.
fn sweep<T: RawMpi, C: Communicator>(
    args: &CommArgs,
    comm: &MpiComm,
    ours_comm: &C,
    world: &SimpleCommunicator,
) -> Result<Vec<Row>> {
    let n = comm.size();
    let elem = std::mem::size_of::<T>();
    let (ops, points) = plan(args, n, elem)?;
    let mut rows = Vec::new();
    for Point {
        count,
        block,
        pairs,
    } in points
    {
        let full_send = vec![T::default(); count];
        let mut full_recv = vec![T::default(); count];
        let block_send = vec![T::default(); block];
        let mut block_recv = vec![T::default(); block];
        for &op in &ops {
            let (ours, raw) = paired(comm, world, args.warmup, pairs, |ours| {
                if !ours || args.raw_vs_raw {
                    comm.watched(op.kind(), count, T::DTYPE, || match op {
                        Op::AllReduce => T::raw(world, op, &full_send, &mut full_recv),
                        Op::ReduceScatter => T::raw(world, op, &full_send, &mut block_recv),
                        Op::AllGather => T::raw(world, op, &block_send, &mut full_recv),
                    });
                    return Ok(());
                }
                match op {
                    Op::AllReduce => {
                        ours_comm.all_reduce_into(&full_send[..], &mut full_recv[..], ReduceOp::Sum)
                    }
                    Op::ReduceScatter => {
                        ours_comm.reduce_scatter(&full_send[..], &mut block_recv[..], ReduceOp::Sum)
                    }
                    Op::AllGather => ours_comm.all_gather(&block_send[..], &mut full_recv[..]),
                }
                .with_context(|| format!("{} of {count} x {}", op.name(), T::DTYPE))
            })?;
            let row = bus_row(op, T::DTYPE, n, count, elem, pairs, &ours, &raw);
            if comm.rank() == 0 {
                print_row(&row);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

fn print_header(n: usize, dtype: DType) {
    outln!(
        "# zero-bench micro comm: {n} ranks, {dtype}; busbw per nccl-tests; bandwidths in GB/s (1e9 B/s); ratio = ours/raw busbw"
    );
    outln!(
        "{:<15} {:>12} {:>6} {:>11} {:>13} {:>13} {:>11} {:>13} {:>7}",
        "collective",
        "size(B)",
        "pairs",
        "ours(us)",
        "ours bus GB/s",
        "ours alg GB/s",
        "raw(us)",
        "raw bus GB/s",
        "ratio"
    );
}

pub(super) fn print_row(r: &Row) {
    outln!(
        "{:<15} {:>12} {:>6} {:>11.1} {:>13.3} {:>13.3} {:>11.1} {:>13.3} {:>7.3}",
        r.op,
        r.size_bytes,
        r.pairs,
        r.ours_us,
        r.ours_busbw_gbs,
        r.ours_algbw_gbs,
        r.raw_us,
        r.raw_busbw_gbs,
        r.ratio
    );
}

fn write_outputs(args: &CommArgs, rows: &[Row]) -> Result<()> {
    if let Some(p) = &args.csv {
        // The labels come last: the measured columns keep their places.
        let mut s = String::from("op,dtype,ranks,size_bytes,count,pairs,ours_us,raw_us,ours_algbw_gbs,ours_busbw_gbs,raw_algbw_gbs,raw_busbw_gbs,ratio,ours,comm,device,baseline,measured\n");
        for r in rows {
            s.push_str(&format!(
                "{},{},{},{},{},{},{:.3},{:.3},{:.4},{:.4},{:.4},{:.4},{:.4},{},{},{},{},{}\n",
                r.op,
                r.dtype,
                r.ranks,
                r.size_bytes,
                r.count,
                r.pairs,
                r.ours_us,
                r.raw_us,
                r.ours_algbw_gbs,
                r.ours_busbw_gbs,
                r.raw_algbw_gbs,
                r.raw_busbw_gbs,
                r.ratio,
                r.ours,
                r.comm,
                r.device,
                r.baseline,
                r.measured
            ));
        }
        crate::outfile::write_text(p, &s).context("--csv")?;
    }
    if let Some(p) = &args.json {
        let s = serde_json::to_string_pretty(rows).context("serialising the table")?;
        crate::outfile::write_text(p, &(s + "\n")).context("--json")?;
    }
    Ok(())
}

/// From 1 MiB up: per collective the geometric mean of ours/raw, and the worst point
/// (printed, never asserted: the machine may be shared, see the module header).
fn summarise(rows: &[Row]) {
    for op in [Op::ReduceScatter, Op::AllGather, Op::AllReduce] {
        let big: Vec<f64> = rows
            .iter()
            .filter(|r| r.size_bytes >= 1 << 20 && r.op == op.name())
            .map(|r| r.ratio)
            .collect();
        if big.is_empty() {
            continue;
        }
        let geo = (big.iter().map(|r| r.ln()).sum::<f64>() / big.len() as f64).exp();
        let worst = big.iter().copied().fold(f64::INFINITY, f64::min);
        let below = big.iter().filter(|&&r| r < 0.97).count();
        outln!(
            "# {:<15} from 1 MiB up: ours/raw geomean {geo:.3}, worst {worst:.3}, {below} of {} points below 0.97",
            op.name(),
            big.len()
        );
    }
}

/// Every collective on every dtype against serial answers; returns the failures summed
/// over all ranks (the same number on every rank).
fn self_test(comm: &MpiComm) -> Result<u64> {
    let results = selftest::run(comm).context("self-test collective failed")?;
    for r in results.iter().filter(|r| !r.ok) {
        log::error!("self-test FAIL {}: {}", r.name, r.detail);
    }
    let failed = selftest::failures_everywhere(comm, &results).context("self-test tally")?;
    if comm.rank() == 0 {
        let verdict = if failed == 0 {
            "all passed".to_string()
        } else {
            format!("{failed} FAILED")
        };
        outln!(
            "# self-test: {} cases per rank x {} ranks (every collective x every dtype, \
             blocking and non-blocking, halves in both sum modes): {verdict}",
            results.len(),
            comm.size(),
        );
    }
    Ok(failed)
}

/// Every rank was given the same options that shape the run (the CRC32 of their text,
/// compared: [`zero_comm::unlike_rank_0`]): ranks given different sizes or collectives would wait in different calls. (Each rank may name its own GPU;
/// `--csv` and `--json` are rank 0's.) Collective.
fn same_arguments_on_every_rank<C: Communicator>(comm: &C, args: &CommArgs) -> Result<()> {
    let device = match args.device {
        DeviceChoice::Cuda(_) | DeviceChoice::CudaLocal => "cuda".to_string(),
        other => format!("{other:?}"),
    };
    let a = args;
    let text = format!(
        "{} {} {:?} {} {} {:?} {} {:?} {} {} {device} {:?} {}",
        a.min_size,
        a.max_size,
        a.dtype,
        a.iters,
        a.warmup,
        a.min_pairs,
        a.bytes_per_point,
        a.ops,
        a.self_test,
        a.raw_vs_raw,
        a.comm,
        a.tcp
    );
    let crc = crc32fast::hash(text.as_bytes()) as i64;
    let unlike = zero_comm::unlike_rank_0(comm, &[crc]).context("comparing the ranks' options")?;
    if !unlike.none() {
        bail!("the ranks were given different micro comm options: give every rank the same command line");
    }
    Ok(())
}

/// Run the benchmark.
pub fn run(args: &CommArgs) -> Result<()> {
    check_min_size(args)?;
    if args.min_size > args.max_size {
        bail!(
            "--min-size {} is larger than --max-size {}",
            args.min_size,
            args.max_size
        );
    }
    // A send and a receive buffer of the largest size, and the raw baseline's pair.
    crate::memory::need(
        &format!("--max-size {}", args.max_size),
        crate::memory::product(&[args.max_size as u64, 4]),
    )?;
    // Before MPI starts, so that a bad option is said once.
    let setup = Setup::of(args)?;
    args.pair_bounds()?;
    let (ctx, comm) = zero_comm::init().context("initialising MPI")?;
    crate::logging::init(Some((comm.rank(), comm.size())));
    let world = ctx.universe().world();
    // An error on one rank leaves the others waiting in a collective: take the whole job
    // down (MPI_Abort) rather than return from this rank alone.
    let or_abort = |e: anyhow::Error| -> ! {
        zero_comm::abort(&format!("error: {}", crate::logging::chain(&e)), 1)
    };
    same_arguments_on_every_rank(&comm, args).unwrap_or_else(|e| or_abort(e));
    // Rank 0's --csv and --json, checked before the sweep rather than after it.
    let outputs = [
        ("--csv", args.csv.as_deref()),
        ("--json", args.json.as_deref()),
    ];
    if let Err(f) = super::outputs::check_on_rank_0(&comm, &outputs) {
        super::outputs::exit(f, (comm, ctx))
    }
    // After the checks of the options and outputs, so that those are said as usual; the
    // same verdict on every rank (there is only one).
    if comm.size() == 1 {
        bail!(
            "micro comm on 1 rank: there is no communication to measure (every bus bandwidth would be 0 and the ratio would compare local copies); run it under mpirun/srun with at least 2 ranks"
        );
    }
    if args.self_test {
        let failed = self_test(&comm).unwrap_or_else(|e| or_abort(e));
        if failed > 0 {
            // Every rank knows the same count, so every rank stops here together.
            bail!("self-test: {failed} cases failed (see the FAIL lines above)");
        }
    }
    if comm.rank() == 0 {
        // With device buffers `device_sweep` prints it, under the baseline's line.
        if args.device == DeviceChoice::Host {
            print_header(comm.size(), args.dtype);
        }
        let least = args.dtype.size_bytes() * comm.size();
        if args.min_size < least {
            outln!(
                "# --min-size {} B is below one {} element per rank: sizes start at {least} B on {} ranks",
                args.min_size,
                args.dtype,
                comm.size()
            );
        }
        if args.raw_vs_raw {
            outln!("# A/A control (--raw-vs-raw): the 'ours' columns run the raw call too");
        }
    }
    if args.device != DeviceChoice::Host {
        let mut rows = on_device(args, &comm, &world).unwrap_or_else(|e| or_abort(e));
        setup.label(&mut rows);
        if comm.rank() == 0 {
            summarise(&rows);
            write_outputs(args, &rows).unwrap_or_else(|e| or_abort(e));
        }
        return Ok(());
    }
    let mut rows = if args.tcp {
        let tcp = tcp_world(&comm).unwrap_or_else(|e| or_abort(e));
        if comm.rank() == 0 {
            outln!("# ours: the TCP world (SocketComm, a star through rank 0); raw: MPI");
        }
        sweep_dtype(args, &comm, &tcp, &world)
    } else {
        sweep_dtype(args, &comm, &comm, &world)
    }
    .unwrap_or_else(|e| or_abort(e));
    setup.label(&mut rows);
    if comm.rank() == 0 {
        summarise(&rows);
        write_outputs(args, &rows).unwrap_or_else(|e| or_abort(e));
    }
    Ok(())
}

/// [`sweep`] for `--dtype`.
fn sweep_dtype<C: Communicator>(
    args: &CommArgs,
    comm: &MpiComm,
    ours: &C,
    world: &SimpleCommunicator,
) -> Result<Vec<Row>> {
    match args.dtype {
        DType::F32 => sweep::<f32, C>(args, comm, ours, world),
        DType::F64 => sweep::<f64, C>(args, comm, ours, world),
        DType::BF16 => sweep::<bf16, C>(args, comm, ours, world),
        DType::F16 => sweep::<f16, C>(args, comm, ours, world),
        DType::U8 => sweep::<u8, C>(args, comm, ours, world),
        DType::U32 => sweep::<u32, C>(args, comm, ours, world),
        DType::I32 => sweep::<i32, C>(args, comm, ours, world),
        DType::I64 => sweep::<i64, C>(args, comm, ours, world),
    }
}

/// `--tcp`: the MPI world's ranks joined again as a TCP world (rank 0 names a
/// rendezvous file in the working directory and broadcasts its name and token).
fn tcp_world(comm: &MpiComm) -> Result<zero_comm::SocketComm> {
    use zero_comm::socket::{Address, Rendezvous};
    // [token (u64), path bytes...]: rank 0's process id names both.
    let mut msg = [0u8; 512];
    if comm.rank() == 0 {
        let id = std::process::id();
        let path = std::env::current_dir()
            .context("the working directory (--tcp meets there)")?
            .join(format!(".zero-micro-comm-tcp-{id}"));
        let text = format!("{id}\n{}", path.display());
        if text.len() > msg.len() {
            bail!("--tcp: the working directory's path is too long for the rendezvous file");
        }
        msg[..text.len()].copy_from_slice(text.as_bytes());
    }
    comm.broadcast(&mut msg[..], 0)
        .context("--tcp: handing out the rendezvous")?;
    let text = String::from_utf8_lossy(&msg);
    let text = text.trim_end_matches('\0');
    let (token, path) = text
        .split_once('\n')
        .ok_or_else(|| anyhow::anyhow!("--tcp: no rendezvous from rank 0"))?;
    let rv = Rendezvous {
        rank: comm.rank(),
        size: comm.size(),
        address: Address::File(path.into()),
        token: format!("micro-comm-{token}"),
        timeout: std::time::Duration::from_secs(60),
    };
    let config = zero_comm::CommConfig::from_env()?;
    Ok(zero_comm::SocketComm::connect(&rv, &config)?)
}

/// `--device` and `--comm` agree (and `--dtype` with device buffers); the transport of
/// device buffers (`auto`: mpi-staged).
fn device_options(args: &CommArgs) -> Result<zero_comm::CommChoice> {
    use zero_comm::CommChoice;
    if args.device == DeviceChoice::Host {
        if !matches!(args.comm, CommChoice::Mpi | CommChoice::Auto) {
            bail!(
                "--comm {} is for device buffers: give --device sim-gpu or cuda (host buffers run MPI)",
                args.comm
            );
        }
        return Ok(CommChoice::Mpi);
    }
    if args.tcp {
        bail!("--tcp times the TCP world on host buffers: drop --device (or --tcp)");
    }
    // The device sweep has no A/A mode: refused rather than ignored without a word.
    if args.raw_vs_raw {
        bail!("--raw-vs-raw times raw MPI on host buffers on both sides: drop --device (or --raw-vs-raw)");
    }
    let choice = match args.comm {
        CommChoice::Auto => CommChoice::MpiStaged,
        c => c,
    };
    let cuda = matches!(args.device, DeviceChoice::Cuda(_) | DeviceChoice::CudaLocal);
    comm_device::check_backend(cuda, choice)?;
    if !matches!(args.dtype, DType::F32 | DType::BF16) {
        bail!(
            "--dtype {} with device buffers: give f32 or bf16 (the engine's)",
            args.dtype
        );
    }
    Ok(choice)
}

/// `--device sim-gpu|cuda`: the engine's collectives on device buffers
/// (`comm_device.rs`), f32 and bf16.
fn on_device(args: &CommArgs, comm: &MpiComm, world: &SimpleCommunicator) -> Result<Vec<Row>> {
    let choice = device_options(args)?;
    if comm.rank() == 0 {
        outln!(
            "# device buffers on {} through --comm {choice}",
            args.device
        );
    }
    match args.device {
        DeviceChoice::SimGpu => {
            let dev = zero_kernels::device::SimDevice::gpu_twin(0x5157 + comm.rank() as u64);
            if comm.rank() == 0 {
                outln!("# the simulated GPU (a test tool): its times measure nothing");
            }
            staged(args, comm, world, &dev)
        }
        _ => on_cuda(args, comm, world, choice),
    }
}

/// The header (the baseline, the columns) on rank 0, then the device sweep in the
/// element type of `--dtype` (f32 or bf16, checked by `device_options`).
fn device_sweep<D: zero_kernels::device::Device, C: Communicator>(
    args: &CommArgs,
    comm: &MpiComm,
    world: &SimpleCommunicator,
    dev: &D,
    engine_comm: &C,
    baseline: &Baseline<'_>,
) -> Result<Vec<Row>> {
    if comm.rank() == 0 {
        outln!("# {}", baseline.describe());
        print_header(comm.size(), args.dtype);
    }
    match args.dtype {
        DType::BF16 => {
            comm_device::sweep::<bf16, D, C>(args, comm, world, dev, engine_comm, baseline)
        }
        _ => comm_device::sweep::<f32, D, C>(args, comm, world, dev, engine_comm, baseline),
    }
}

/// Through host staging on `dev` (`--comm mpi-staged`), sized for the largest point.
fn staged<D: zero_kernels::device::Device>(
    args: &CommArgs,
    comm: &MpiComm,
    world: &SimpleCommunicator,
    dev: &D,
) -> Result<Vec<Row>> {
    let staged = zero_comm::StagedComm::new(comm);
    staged
        .buffers()
        .reserve(dev, args.max_size)
        .context("allocating the host staging buffers")?;
    device_sweep(args, comm, world, dev, &staged, &Baseline::HostMpi(world))
}

#[cfg(feature = "cuda")]
fn on_cuda(
    args: &CommArgs,
    comm: &MpiComm,
    world: &SimpleCommunicator,
    choice: zero_comm::CommChoice,
) -> Result<Vec<Row>> {
    let ordinal = match args.device {
        DeviceChoice::Cuda(o) => o,
        _ => crate::train::local_gpu(comm)?,
    };
    let dev = crate::device::cuda::open(ordinal)?;
    match choice {
        zero_comm::CommChoice::MpiStaged => staged(args, comm, world, &dev),
        zero_comm::CommChoice::MpiCuda => {
            comm.set_device_pointers(true);
            let rows = device_sweep(args, comm, world, &dev, comm, &Baseline::HostMpi(world));
            comm.set_device_pointers(false);
            rows
        }
        _ => nccl(args, comm, world, &dev, ordinal),
    }
}

#[cfg(not(feature = "cuda"))]
fn on_cuda(
    _args: &CommArgs,
    _comm: &MpiComm,
    _world: &SimpleCommunicator,
    _choice: zero_comm::CommChoice,
) -> Result<Vec<Row>> {
    bail!("--device cuda: this zero-bench was built without the `cuda` feature (cargo build -p zero-bench --release --features cuda)")
}

#[cfg(feature = "nccl")]
fn nccl(
    args: &CommArgs,
    comm: &MpiComm,
    world: &SimpleCommunicator,
    dev: &zero_kernels::cuda::CudaDevice,
    ordinal: usize,
) -> Result<Vec<Row>> {
    let config = zero_comm::CommConfig::from_env()?;
    let id = zero_comm::nccl_id::exchange(comm, zero_comm::nccl::unique_id)?;
    let nccl =
        zero_comm::NcclComm::new(ordinal, &id, comm.rank(), comm.size(), comm.rank(), &config)?;
    device_sweep(args, comm, world, dev, &nccl, &Baseline::BareNccl(&nccl))
}

#[cfg(all(feature = "cuda", not(feature = "nccl")))]
fn nccl(
    _args: &CommArgs,
    _comm: &MpiComm,
    _world: &SimpleCommunicator,
    _dev: &zero_kernels::cuda::CudaDevice,
    _ordinal: usize,
) -> Result<Vec<Row>> {
    bail!("--comm nccl: this zero-bench was built without the `nccl` feature (cargo build -p zero-bench --release --features nccl)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        c: CommArgs,
    }

    fn args(a: &[&str]) -> CommArgs {
        Cli::try_parse_from(std::iter::once("x").chain(a.iter().copied()))
            .map(|c| c.c)
            .expect("arguments parse")
    }

    #[test]
    fn a_zero_min_size_is_refused_with_the_option_named() {
        let err = check_min_size(&args(&["--min-size", "0"])).unwrap_err();
        assert!(err.to_string().contains("--min-size 0"), "{err}");
        assert!(check_min_size(&args(&["--min-size", "1"])).is_ok());
        assert!(check_min_size(&args(&[])).is_ok());
    }

    #[test]
    fn every_row_says_what_ours_and_raw_ran() {
        let labels = |a: &[&str]| {
            let setup = Setup::of(&args(a)).expect("a valid setup");
            let mut rows = vec![bus_row(
                Op::AllReduce,
                DType::F32,
                2,
                4,
                4,
                1,
                &[1.0],
                &[1.0],
            )];
            setup.label(&mut rows);
            let r = rows.remove(0);
            (r.ours, r.comm, r.device, r.baseline, r.measured)
        };
        let s = |x: &str| x.to_string();
        assert_eq!(
            labels(&[]),
            ("zero-comm", s("mpi"), s("host"), "mpi-host", true)
        );
        assert_eq!(
            labels(&["--raw-vs-raw"]),
            ("raw-mpi", s("mpi"), s("host"), "mpi-host", true)
        );
        assert_eq!(
            labels(&["--tcp"]),
            ("zero-comm", s("tcp"), s("host"), "mpi-host", true)
        );
        // The simulated GPU's times measure nothing, and its rows say so.
        assert_eq!(
            labels(&["--device", "sim-gpu"]),
            (
                "zero-comm",
                s("mpi-staged"),
                s("sim-gpu"),
                "mpi-host",
                false
            )
        );
        // The device sweep has no A/A mode: refused, not ignored.
        let err = Setup::of(&args(&["--device", "sim-gpu", "--raw-vs-raw"]))
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("--raw-vs-raw"), "{err}");
    }

    #[test]
    fn sizes_start_at_one_element_per_rank_and_double() {
        let (_, points) = plan(&args(&["--min-size", "3", "--max-size", "64"]), 2, 4).unwrap();
        let counts: Vec<usize> = points.iter().map(|p| p.count).collect();
        assert_eq!(counts, [2, 4, 8, 16]);
    }
}
