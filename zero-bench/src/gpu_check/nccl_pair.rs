//! Two processes on the one GPU through NCCL (issue 14): the check that the NCCL backend
//! trains the same steps as GPU path I's thread ranks, and what our NCCL path costs over
//! the bare library call.
//!
//! NCCL refuses two ranks of a communicator on one GPU ("Duplicate GPU detected") unless
//! each process claims its own host (`NCCL_HOSTID`); the ranks then talk over sockets on
//! the loopback interface (`NCCL_SOCKET_IFNAME=lo`): correct, not fast. Thread ranks
//! cannot do this (the host id is per process), so the check starts this binary twice
//! (the hidden `gpu-check nccl-rank`). Rank 0 makes the unique id and writes it to a file
//! in the output folder; rank 1 waits for it there: the hand-over a Slurm job without
//! PMIx uses (zero-comm/src/nccl_id.rs).
//!
//! For ZeRO-2 and ZeRO-3, fp32 and bf16, the losses of the two processes must match the
//! same run on two thread ranks of this GPU. With two ranks every sum is of two operands,
//! which is the same in either order, so the curves are expected to be equal; the
//! tolerance, [`train::FP32_TOL`] in both precisions, allows only the last bits of a
//! different reduction kernel (a bf16 sum done in lower precision, or the average taken
//! in another place, would be far over it).
//!
//! Each pair runs under [`RANK_TIMEOUT`], or what is left of the run's budget if less
//! (then a pair still running is cut short for lack of time, not failed); after a pair
//! hangs, the group's other pairs are not started (each would cost as much).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use serde::{Deserialize, Serialize};
use zero_comm::{NcclComm, ReduceOp};
use zero_core::{Precision, Stage};
use zero_kernels::cuda::CudaDevice;
use zero_kernels::device::{Buffer, Device};
use zero_models::data::MarkovSource;

use super::report::{figures, no_time, Check, Kind, Report};
use super::train::{self, Reference, Setup};
use super::{die_with_parent, log_tail, pair_limit, still_running, PairEnd};

/// Processes in the pair.
const RANKS: usize = 2;
/// How long a rank may take, start-up and NCCL's set-up included, before it is killed.
const RANK_TIMEOUT: Duration = Duration::from_secs(120);
/// The NCCL watchdog's limit per collective in the ranks (a step here takes milliseconds).
const WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);
/// Exit status of the rank that stops on purpose.
const DIED_ON_PURPOSE: i32 = 3;
/// Elements of the all-reduce the bandwidth line times (32 MiB of f32).
const BENCH_ELEMS: usize = 8 << 20;
/// Rounds of (ours, raw) pairs, and calls of each per round.
const BENCH_ROUNDS: usize = 5;
const BENCH_CALLS: usize = 3;

/// `gpu-check nccl-rank` (hidden): one rank of the pair, started by [`check`].
#[derive(Args, Debug)]
pub struct NcclRankArgs {
    /// The folder `gpu-check prepare` wrote (the run's setup).
    #[arg(long = "ref")]
    reference: PathBuf,
    /// This process's rank.
    #[arg(long)]
    rank: usize,
    /// Ranks in all.
    #[arg(long)]
    size: usize,
    /// The NCCL unique id's file: rank 0 writes it, the others wait for it.
    #[arg(long)]
    id_file: PathBuf,
    /// Where this rank writes its result (JSON).
    #[arg(long)]
    out: PathBuf,
    /// What to run: `train:STAGE:PRECISION:STEPS` or `bench`.
    #[arg(long)]
    job: String,
    /// Stop dead (exit status 3, no goodbye to NCCL) after this many training steps: the
    /// peer that the other rank's watchdog must notice.
    #[arg(long)]
    die_after: Option<usize>,
}

/// What a rank of the pair writes.
#[derive(Debug, Default, Serialize, Deserialize)]
struct RankResult {
    /// Losses per step (a training job).
    losses: Vec<f64>,
    /// Seconds per all-reduce through our path, one median per round (the bench).
    ours_s: Vec<f64>,
    /// Seconds per bare `ncclAllReduce` on the same buffer, one median per round.
    raw_s: Vec<f64>,
    /// The bench's collectives on host buffers (staged through device scratch, as
    /// zero-core's checkpoint agreement and weight gathers run them): what differed from
    /// the expected values, or the error; `None` when all held.
    host_collectives: Option<String>,
}

/// The pair's setup: the reference's run on [`RANKS`] ranks.
fn pair_setup(reference: &Reference) -> Setup {
    Setup {
        ranks: RANKS,
        ..reference.setup.clone()
    }
}

/// Run one rank of the pair (the hidden subcommand).
pub fn rank_main(a: &NcclRankArgs) -> anyhow::Result<()> {
    let reference = Reference::load(&a.reference)?;
    let setup = Setup {
        ranks: a.size,
        ..reference.setup.clone()
    };
    let dev = CudaDevice::new(0).context("opening CUDA device 0")?;
    let id = if a.rank == 0 {
        let id = zero_comm::nccl::unique_id().map_err(|e| anyhow!(e))?;
        zero_comm::nccl_id::write_file(&a.id_file, &id)?;
        id
    } else {
        zero_comm::nccl_id::wait_for_file(&a.id_file, Duration::from_secs(60))?
    };
    let config = zero_comm::CommConfig {
        timeout: Some(WATCHDOG_TIMEOUT),
        ..zero_comm::CommConfig::default()
    };
    let comm = NcclComm::new(0, &id, a.rank, a.size, a.rank, &config)?;
    let result = match a.job.split(':').collect::<Vec<_>>()[..] {
        ["train", stage, precision, steps] => {
            let stage: i64 = stage.parse().context("the job's stage")?;
            let stage = Stage::try_from(stage).map_err(anyhow::Error::msg)?;
            let precision = train::precision_of(precision)?;
            let steps: usize = steps.parse().context("the job's steps")?;
            let tokens = MarkovSource::default_corpus(setup.corpus_tokens, setup.vocab)
                .context("building the built-in corpus")?;
            let cfg = setup.engine(stage, precision);
            let losses = match a.die_after {
                Some(n) => {
                    train::train_rank(&comm, &dev, &setup, &cfg, &tokens, n)
                        .map_err(|e| anyhow!(e))?;
                    eprintln!(
                        "rank {}: stopping dead after {n} steps (the dead-peer check)",
                        a.rank
                    );
                    // SAFETY: _exit ends the process at once, as a crash would.
                    unsafe { libc::_exit(DIED_ON_PURPOSE) }
                }
                None => train::train_rank(&comm, &dev, &setup, &cfg, &tokens, steps)
                    .map_err(|e| anyhow!(e))?,
            };
            RankResult {
                losses,
                ..RankResult::default()
            }
        }
        ["bench"] => RankResult {
            host_collectives: host_collectives(&comm).err(),
            ..bench(&comm, &dev)?
        },
        _ => bail!("--job {}: give train:STAGE:PRECISION:STEPS or bench", a.job),
    };
    let text = serde_json::to_string(&result)?;
    std::fs::write(&a.out, text).with_context(|| format!("writing {}", a.out.display()))?;
    Ok(())
}

/// Median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// NCCL's all-reduce of [`BENCH_ELEMS`] f32 at `ptr`, in place, without our layers.
///
/// # Safety
/// `ptr` is this GPU's memory of BENCH_ELEMS f32 that nothing else touches meanwhile.
unsafe fn bare_all_reduce(comm: &NcclComm, ptr: *mut u8) -> zero_comm::Result<()> {
    let kind = zero_comm::CollectiveKind::AllReduce;
    // SAFETY: the caller's contract.
    unsafe { comm.bare(kind, ptr, ptr, BENCH_ELEMS, zero_kernels::DType::F32) }
}

/// Time a sum all-reduce of [`BENCH_ELEMS`] f32 through our path (the engine's:
/// `on_stream::all_reduce` on the device's stream, then waiting for it) and through the
/// bare NCCL call, on the same buffer, in interleaved rounds.
fn bench(comm: &NcclComm, dev: &CudaDevice) -> anyhow::Result<RankResult> {
    let stream = dev.stream("nccl-bench")?;
    let mut buf = dev.alloc::<f32>(BENCH_ELEMS, "nccl-bench")?;
    dev.fill(&stream, buf.view_mut(), 1.0)?;
    dev.synchronize()?;
    let ours = |buf: &mut <CudaDevice as Device>::Buf<f32>| -> anyhow::Result<()> {
        zero_comm::on_stream::all_reduce(comm, dev, &stream, buf.view_mut(), ReduceOp::Sum)?;
        dev.synchronize()?;
        Ok(())
    };
    // One of each first: NCCL connects its channels on the first call.
    ours(&mut buf)?;
    let ptr = buf.raw_ptr() as *mut u8;
    // SAFETY: `buf` is this GPU's memory of BENCH_ELEMS f32, idle (its stream synced).
    unsafe { bare_all_reduce(comm, ptr) }?;
    let mut result = RankResult::default();
    for _ in 0..BENCH_ROUNDS {
        let mut t = Vec::new();
        for _ in 0..BENCH_CALLS {
            let t0 = Instant::now();
            ours(&mut buf)?;
            t.push(t0.elapsed().as_secs_f64());
        }
        result.ours_s.push(median(t));
        let mut t = Vec::new();
        for _ in 0..BENCH_CALLS {
            let t0 = Instant::now();
            // SAFETY: as above.
            unsafe { bare_all_reduce(comm, ptr) }?;
            t.push(t0.elapsed().as_secs_f64());
        }
        result.raw_s.push(median(t));
    }
    Ok(result)
}

/// Collectives on host buffers through NCCL, each against the values it must give: a
/// sum and a max (f64, in place), an all-gather (u32), a broadcast (u8), and the
/// failure agreement zero-core's checkpoints use (`zero_comm::gather_failures`).
fn host_collectives(comm: &NcclComm) -> Result<(), String> {
    use zero_comm::Communicator;
    let (rank, size) = (comm.rank(), comm.size());
    // Every collective runs even after one failed here, so that the peer is not left
    // waiting in the next one; the errors and wrong values are reported together.
    let mut wrong: Vec<String> = Vec::new();
    let mut judge = |what: &str, done: zero_comm::Result<bool>| match done {
        Ok(true) => {}
        Ok(false) => wrong.push(format!("{what}: wrong values")),
        Err(e) => wrong.push(format!("{what}: {e}")),
    };
    let total = (size * (size + 1) / 2) as f64;
    let mut sum = [rank as f64 + 1.0, 10.0 * (rank as f64 + 1.0)];
    let done = comm.all_reduce(&mut sum[..], ReduceOp::Sum);
    judge(
        "all_reduce sum",
        done.map(|()| sum == [total, 10.0 * total]),
    );
    let mut max = [rank as f64, -(rank as f64)];
    let done = comm.all_reduce(&mut max[..], ReduceOp::Max);
    judge(
        "all_reduce max",
        done.map(|()| max == [(size - 1) as f64, 0.0]),
    );
    let mine = [rank as u32 * 7, rank as u32 * 7 + 1];
    let mut gathered = vec![0u32; 2 * size];
    let expected: Vec<u32> = (0..size as u32).flat_map(|r| [r * 7, r * 7 + 1]).collect();
    let done = comm.all_gather(&mine[..], &mut gathered[..]);
    judge("all_gather", done.map(|()| gathered == expected));
    let mut bytes = if rank == 0 { *b"root" } else { [0u8; 4] };
    let done = comm.broadcast(&mut bytes[..], 0);
    judge("broadcast", done.map(|()| &bytes == b"root"));
    let failing = (rank == size - 1).then_some("the last rank fails on purpose");
    let expected = [(size - 1, "the last rank fails on purpose".to_string())];
    let done = zero_comm::gather_failures(comm, failing);
    judge("gather_failures", done.map(|f| f == expected));
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// A running rank of the pair: the child, its log and its result file.
struct Running {
    child: Child,
    log: PathBuf,
    out: PathBuf,
}

impl Drop for Running {
    /// A rank is never left behind (e.g. waiting in `ncclCommInitRank` for a peer that
    /// did not start): killing one that has ended does nothing.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the pair on `job` in `dir` (each rank's log and result there); rank 1 stops
/// itself after `die_after` steps when given (the dead-peer check).
fn spawn_pair(
    reference_dir: &Path,
    dir: &Path,
    job: &str,
    die_after: Option<usize>,
) -> anyhow::Result<Vec<Running>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let id_file = dir.join("nccl-id");
    // The id file must be this run's: a stale one would be read as the new id.
    let _ = std::fs::remove_file(&id_file);
    let exe = std::env::current_exe().context("finding this binary")?;
    let mut ranks = Vec::new();
    for rank in 0..RANKS {
        let log = dir.join(format!("rank{rank}.log"));
        let out = dir.join(format!("rank{rank}.json"));
        let _ = std::fs::remove_file(&out);
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(&exe);
        cmd.args(["gpu-check", "nccl-rank", "--ref"])
            .arg(reference_dir)
            .args(["--rank", &rank.to_string(), "--size", &RANKS.to_string()])
            .arg("--id-file")
            .arg(&id_file)
            .arg("--out")
            .arg(&out)
            .args(["--job", job])
            // Each process its own "host", so NCCL lets both use GPU 0 (module docs).
            .env("NCCL_HOSTID", format!("zero-gpu-check-rank{rank}"))
            .env("NCCL_SOCKET_IFNAME", "lo")
            .env(
                "NCCL_DEBUG",
                std::env::var("NCCL_DEBUG").unwrap_or("WARN".into()),
            )
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        if let (Some(n), 1) = (die_after, rank) {
            cmd.args(["--die-after", &n.to_string()]);
        }
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting rank {rank} ({})", exe.display()))?;
        ranks.push(Running { child, log, out });
    }
    Ok(ranks)
}

/// How each rank of a pair ended: its exit status and when (since the start), `None`
/// for one still running at the deadline (then killed).
type Endings = Vec<Option<(std::process::ExitStatus, Duration)>>;

/// Wait for the ranks until all have ended, or one failed when `stop_on_failure`, or
/// `deadline` passed; then kill what still runs, so no rank is left waiting in NCCL.
fn wait_pair(
    ranks: &mut [Running],
    deadline: Duration,
    stop_on_failure: bool,
) -> anyhow::Result<Endings> {
    let start = Instant::now();
    let mut ended: Endings = (0..ranks.len()).map(|_| None).collect();
    loop {
        for (r, run) in ranks.iter_mut().enumerate() {
            if ended[r].is_none() {
                if let Some(status) = run.child.try_wait()? {
                    ended[r] = Some((status, start.elapsed()));
                }
            }
        }
        let all = ended.iter().all(Option::is_some);
        let failed = ended.iter().flatten().any(|(s, _)| !s.success());
        if all || (stop_on_failure && failed) || start.elapsed() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for run in ranks.iter_mut() {
        let _ = run.child.kill();
        let _ = run.child.wait();
    }
    Ok(ended)
}

/// Run the pair on `job` for at most `limit` and return each rank's result; the first
/// failure (or a rank still running at the limit) is the error, with the end of that
/// rank's log.
fn run_pair(
    reference_dir: &Path,
    dir: &Path,
    job: &str,
    (limit, by_budget): (Duration, bool),
) -> Result<Vec<RankResult>, PairEnd> {
    let mut ranks = spawn_pair(reference_dir, dir, job, None).map_err(PairEnd::Failed)?;
    let ended = wait_pair(&mut ranks, limit, true).map_err(PairEnd::Failed)?;
    // A rank that failed first: the other, killed then, was only waiting for it.
    let failed = ended
        .iter()
        .enumerate()
        .find_map(|(r, e)| e.filter(|(s, _)| !s.success()).map(|(s, _)| (r, s)));
    if let Some((r, status)) = failed {
        return Err(PairEnd::Failed(anyhow!(
            "rank {r} exited with {status}: {}",
            log_tail(&ranks[r].log)
        )));
    }
    if let Some(r) = ended.iter().position(Option::is_none) {
        return Err(still_running(r, limit, by_budget, &ranks[r].log));
    }
    ranks
        .iter()
        .map(|run| {
            let text = std::fs::read_to_string(&run.out)
                .with_context(|| format!("reading {}", run.out.display()))?;
            Ok(serde_json::from_str(&text)?)
        })
        .collect::<anyhow::Result<_>>()
        .map_err(PairEnd::Failed)
}

/// Rank 1 of a training pair stops dead after a few steps; rank 0 must end within
/// seconds with the watchdog's message (not hang in NCCL): the time from rank 1's end
/// to rank 0's, at most [`WATCHDOG_TIMEOUT`] and a margin.
fn dead_peer(
    reference_dir: &Path,
    dir: &Path,
    steps: usize,
    (limit_s, by_budget): (Duration, bool),
    report: &mut Report,
) -> anyhow::Result<()> {
    let limit = WATCHDOG_TIMEOUT.as_secs_f64() + 10.0;
    let die_after = 3.min(steps.saturating_sub(1)).max(1);
    let check = Check::new(
        "nccl-2-procs",
        format!("dead peer: rank 1 stops after {die_after} steps"),
        Kind::Correctness,
    );
    report.start(format!("nccl-2-procs/{}", check.name))?;
    let t0 = Instant::now();
    let job = format!("train:3:fp32:{}", steps.max(die_after + 50));
    let mut check = match spawn_pair(reference_dir, dir, &job, Some(die_after))
        .and_then(|mut ranks| Ok((wait_pair(&mut ranks, limit_s, false)?, ranks)))
    {
        Err(e) => check.fail(format!("{e:#}")),
        // Rank 0 still running is the watchdog's failure, unless the budget cut it.
        Ok((ended, ranks)) if ended[0].is_none() && by_budget => {
            still_running(0, limit_s, true, &ranks[0].log).judge(check, &mut None)
        }
        Ok((ended, ranks)) => {
            let log0 = std::fs::read_to_string(&ranks[0].log).unwrap_or_default();
            let said = log0
                .lines()
                .find(|l| l.contains("NCCL watchdog:"))
                .map(str::to_string);
            match (&ended[0], &ended[1], said) {
                (Some((s0, end0)), Some((s1, end1)), Some(line)) if !s0.success() => {
                    let delay = end0.saturating_sub(*end1).as_secs_f64();
                    check.at_most(
                        delay,
                        limit,
                        format!(
                            "rank 1 ended ({s1}); rank 0 ended {delay:.1} s later ({s0}) <= {limit:.0} s, saying: {}",
                            line.chars().take(240).collect::<String>()
                        ),
                    )
                }
                (e0, e1, said) => check.fail(format!(
                    "rank 0 {}, rank 1 {}; rank 0 {}: {}",
                    e0.map_or("still running (killed)".to_string(), |(s, _)| format!(
                        "ended with {s}"
                    )),
                    e1.map_or("still running (killed)".to_string(), |(s, _)| format!(
                        "ended with {s}"
                    )),
                    if said.is_some() {
                        "named the watchdog"
                    } else {
                        "did not print the watchdog's line"
                    },
                    log_tail(&ranks[0].log)
                )),
            }
        }
    };
    check.seconds = t0.elapsed().as_secs_f64();
    report.add(check)
}

/// The pair's checks: ZeRO-2 and ZeRO-3 in fp32 and bf16 against two thread ranks on
/// this GPU, then the all-reduce's bus bandwidth, ours against bare NCCL.
pub fn check(
    reference_dir: &Path,
    reference: &Reference,
    steps: usize,
    out: &Path,
    deadline: f64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let setup = pair_setup(reference);
    let steps = steps.min(setup.steps);
    let open = |_rank: usize| CudaDevice::new(0);
    let dir = out.join("nccl-pair");
    // The check whose pair hung: the others are not started.
    let mut hung: Option<String> = None;
    let not_started = |hung: &str| format!("not run: the pair of \"{hung}\" hung (above)");
    for precision in [Precision::Fp32, Precision::Bf16] {
        for stage in [Stage::Zero2, Stage::Zero3] {
            let pname = train::precision_name(precision);
            let name = format!("{stage} {pname}, {RANKS} processes x {steps} steps");
            let check = Check::new("nccl-2-procs", name, Kind::Correctness);
            if let Some(h) = &hung {
                report.add(check.skip(not_started(h)))?;
                continue;
            }
            if pair_limit(report, deadline, RANK_TIMEOUT).is_none() {
                report.add(check.out_of_time(no_time(deadline)))?;
                continue;
            }
            report.start(format!("nccl-2-procs/{}", check.name))?;
            let t0 = Instant::now();
            let job = format!("train:{}:{pname}:{steps}", stage.number());
            let threads = train::curve(&open, &setup, (stage, precision, false), steps)
                .context("the thread-rank run");
            let pair = match (&threads, pair_limit(report, deadline, RANK_TIMEOUT)) {
                (Err(_), _) => Err(PairEnd::Failed(anyhow!("not run"))),
                (Ok(_), None) => Err(PairEnd::CutShort(no_time(deadline))),
                (Ok(_), Some(limit)) => run_pair(reference_dir, &dir, &job, limit),
            };
            let mut check = match (threads, pair) {
                (Err(e), _) => check.fail(format!("{e:#}")),
                (_, Err(end)) => end.judge(check, &mut hung),
                (Ok(threads), Ok(pair)) => {
                    // Equal curves expected in both precisions (module docs).
                    let tol = train::FP32_TOL;
                    let agree = pair.iter().all(|r| r.losses == pair[0].losses);
                    let got = &pair[0].losses;
                    let (worst, at) = train::max_rel(got, &threads, steps);
                    let worst = if agree { worst } else { f64::INFINITY };
                    let how = if agree {
                        train::rel_in_words(worst, at)
                    } else {
                        "the two processes' losses differ".to_string()
                    };
                    check
                        .at_most(
                            worst,
                            tol,
                            format!(
                                "NCCL vs {RANKS} thread ranks on this GPU: {how} <= {tol:.0e}; loss {:.4} -> {:.4}",
                                got.first().copied().unwrap_or(f64::NAN),
                                got.last().copied().unwrap_or(f64::NAN)
                            ),
                        )
                        .with_data(serde_json::json!({
                            "nccl": figures(got),
                            "nccl_rank1": figures(pair.get(1).map_or(&[][..], |r| &r.losses[..])),
                            "threads": figures(&threads),
                            "worst_step": at,
                        }))
                }
            };
            check.seconds = t0.elapsed().as_secs_f64();
            report.add(check)?;
        }
    }

    // A peer that dies: the watchdog ends the other rank.
    let c = Check::new("nccl-2-procs", "dead peer", Kind::Correctness);
    if let Some(h) = &hung {
        report.add(c.skip(not_started(h)))?;
    } else if let Some(limit) = pair_limit(report, deadline, RANK_TIMEOUT) {
        dead_peer(reference_dir, &dir, steps, limit, report)?;
    } else {
        report.add(c.out_of_time(no_time(deadline)))?;
    }

    // Bus bandwidth of an all-reduce: ours against bare NCCL on the same buffer.
    let bytes = (BENCH_ELEMS * 4) as f64;
    let name = format!(
        "all_reduce f32 {} MiB, {RANKS} processes",
        (BENCH_ELEMS * 4) >> 20
    );
    let check = Check::new("nccl-bandwidth", name, Kind::Performance);
    let host = Check::new("nccl-2-procs", "host buffers (staged)", Kind::Correctness);
    if let Some(h) = &hung {
        report.add(host.skip(not_started(h)))?;
        return report.add(check.skip(not_started(h)));
    }
    let Some(limit) = pair_limit(report, deadline, RANK_TIMEOUT) else {
        report.add(host.out_of_time(no_time(deadline)))?;
        return report.add(check.out_of_time(no_time(deadline)));
    };
    report.start(format!("nccl-2-procs/{}", check.name))?;
    let t0 = Instant::now();
    let bench = run_pair(reference_dir, &dir, "bench", limit);
    // Host buffers through NCCL (the same pair of processes): correctness of its own.
    let mut ignored = None;
    let (host, bench) = match bench {
        Ok(pair) => (host_judged(host, &pair), Ok(pair)),
        Err(end) => {
            let why = match &end {
                PairEnd::Failed(e) => format!("{e:#}"),
                PairEnd::Hung(w) | PairEnd::CutShort(w) => w.clone(),
            };
            let host = end.judge(host, &mut ignored);
            let cut = host.out_of_time;
            (host, Err((why, cut)))
        }
    };
    report.add(host)?;
    let mut check = match bench {
        Err((why, true)) => check.out_of_time(why),
        Err((why, false)) => check.fail(why),
        Ok(pair) => {
            // A collective ends on both ranks at once; rank 0's times stand for both.
            let r = &pair[0];
            let (ours, raw) = (median(r.ours_s.clone()), median(r.raw_s.clone()));
            // nccl-tests' bus bandwidth of an all-reduce: size/t * 2(n-1)/n.
            let factor = 2.0 * (RANKS as f64 - 1.0) / RANKS as f64;
            let (bw_ours, bw_raw) = (bytes / ours * factor / 1e9, bytes / raw * factor / 1e9);
            let ratio = bw_ours / bw_raw;
            check
                .at_least(
                    ratio,
                    0.9,
                    format!(
                        "busbw ours {bw_ours:.2} GB/s, bare NCCL {bw_raw:.2} GB/s: {ratio:.2} of bare (goal >= 0.9; sockets over loopback, not NVLink)"
                    ),
                )
                .with_data(serde_json::json!({
                    "ours_s": figures(&r.ours_s), "raw_s": figures(&r.raw_s),
                    "busbw_ours_gb_s": super::report::figure(bw_ours),
                    "busbw_bare_gb_s": super::report::figure(bw_raw),
                }))
        }
    };
    check.seconds = t0.elapsed().as_secs_f64();
    report.add(check)
}

/// The host-buffer collectives of the bench's pair: no value wrong on either rank.
fn host_judged(host: Check, pair: &[RankResult]) -> Check {
    let wrong = pair.iter().enumerate().find_map(|(r, p)| {
        p.host_collectives
            .as_ref()
            .map(|why| format!("rank {r}: {why}"))
    });
    match wrong {
        Some(why) => host.fail(why),
        None => host.at_most(
            0.0,
            0.0,
            "sum, max, all-gather, broadcast and the failure agreement on host buffers: no value wrong on either rank",
        ),
    }
}
