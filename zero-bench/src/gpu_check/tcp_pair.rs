//! `zero-bench train` as two processes joined without MPI (`ZERO_RENDEZVOUS`, zero-comm's
//! `socket.rs`): what a GPU cluster whose srun has no PMI runs. The whole command line,
//! not a harness: configuration agreement, NCCL's unique id over the TCP world, the GPU
//! of each rank, the engine, the report.
//!
//! Both processes share the one GPU (`ZERO_SHARE_GPUS=1`; each its own `NCCL_HOSTID`,
//! sockets on `lo`, as in `nccl_pair.rs`). The same ZeRO-2 fp32 run goes once with
//! `--comm nccl` and once with `--comm mpi-staged` (device buffers staged through host
//! memory and reduced by rank 0 of the TCP world); with two ranks every sum is `a + b`
//! in both, so the curves must agree to [`train::FP32_TOL`]. On the simulated GPU (the dry
//! run) NCCL is not there: `--comm mpi` on its host-reachable buffers stands in for it,
//! and must give the staged run's bits.
//!
//! The staged run goes twice: with the host waiting for each collective
//! (`ZERO_CUDA_STAGED=wait`; `--no-overlap` on the simulated GPU) and through the overlap
//! path (`ZERO_CUDA_STAGED=overlap`: the GPU's stream waits on the device for the host's
//! release word, `zero-kernels/src/device/release.rs`; the simulated GPU's default). Same
//! collectives, same values: the curves must be equal bit for bit. The TCP world's
//! collectives finish when they start, so nothing runs behind compute here (its step
//! times and overlap lines are reported, not judged); `overlap.rs` measures the overlap.
//!
//! Each pair runs under [`PAIR_TIMEOUT`], or what is left of the run's budget if less
//! (a pair then still running is cut short for lack of time, not failed); the budget is
//! looked at again before each pair, and the overlapped pair is not started when the
//! waiting one, which it is compared with, gave nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use super::report::{figures, no_time, Check, Kind, Report};
use super::{die_with_parent, log_tail, pair_limit, still_running, train, PairEnd};

/// The group's name (`--only`).
pub const GROUP: &str = "train-tcp";
/// Processes in the pair.
const RANKS: usize = 2;
/// How long a pair may take, CUDA and NCCL set-up included.
const PAIR_TIMEOUT: Duration = Duration::from_secs(120);

/// The run both pairs train: the README's demo model (built-in corpus).
const CONFIG: &str = r#"# gpu-check train-tcp: the demo model
[model]
preset = "small"
vocab_size = 64
context_len = 64
layers = 2
width = 128

[data]
path = "builtin"

[train]
micro_batch = 4
seq_len = 64
seed = 1337
log_every = 1

[optim]
lr = 3e-3
schedule = "warmup_cosine"
warmup_steps = 2
min_lr = 3e-4
weight_decay = 0.1
grad_clip = 1.0

[zero]
stage = 2
"#;

/// How one pair runs: its folder's name, `--comm`, and what else it is given.
struct Pair<'a> {
    label: &'a str,
    comm: &'a str,
    args: &'a [&'a str],
    env: &'a [(&'a str, &'a str)],
}

/// What one pair's rank 0 reported.
struct PairRun {
    losses: Vec<f64>,
    /// The share of the communication that ran behind compute, where the run says.
    hidden: Option<f64>,
    /// Mean step time.
    step_seconds: Option<f64>,
}

/// Run one pair for at most `limit` (`by_budget`: the run's budget set it); what its
/// rank 0 reported.
fn run_pair(
    exe: &Path,
    dir: &Path,
    device: &str,
    pair: &Pair<'_>,
    steps: usize,
    (limit, by_budget): (Duration, bool),
) -> Result<PairRun, PairEnd> {
    let mut children = Vec::new();
    let ran = start_and_wait(exe, dir, device, pair, steps, limit, &mut children);
    // Nothing of the pair stays on the GPU.
    stop(&mut children);
    let (ended, json) = ran.map_err(PairEnd::Failed)?;
    // A rank that failed first: the other may only be waiting for it.
    let failed = ended
        .iter()
        .enumerate()
        .find_map(|(r, e)| e.filter(|s| !s.success()).map(|s| (r, s)));
    if let Some((r, s)) = failed {
        let tail = log_tail(&children[r].1);
        return Err(PairEnd::Failed(anyhow!("rank {r} exited with {s}: {tail}")));
    }
    if let Some(r) = ended.iter().position(Option::is_none) {
        return Err(still_running(r, limit, by_budget, &children[r].1));
    }
    read_report(&json).map_err(PairEnd::Failed)
}

/// Start the pair's ranks (into `children`) and wait for them until `limit`: how each
/// ended (`None`: still running), and rank 0's report file.
fn start_and_wait(
    exe: &Path,
    dir: &Path,
    device: &str,
    pair: &Pair<'_>,
    steps: usize,
    limit: Duration,
    children: &mut Vec<(std::process::Child, PathBuf)>,
) -> anyhow::Result<(Vec<Option<std::process::ExitStatus>>, PathBuf)> {
    let comm = pair.comm;
    let run = dir.join(pair.label);
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).with_context(|| format!("creating {}", run.display()))?;
    let config = run.join("config.toml");
    std::fs::write(&config, CONFIG).with_context(|| format!("writing {}", config.display()))?;
    let json = run.join("report.json");
    for rank in 0..RANKS {
        let log = run.join(format!("rank{rank}.log"));
        let files = std::fs::File::create(&log).and_then(|f| Ok((f.try_clone()?, f)));
        let (out_file, err_file) = files.map_err(|e| anyhow!("creating {}: {e}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.arg("train")
            .arg("--config")
            .arg(&config)
            .args(["--steps", &steps.to_string(), "--precision", "fp32"])
            .args(["--device", device, "--comm", comm, "--no-progress"])
            .args(pair.args)
            .envs(pair.env.iter().copied())
            .current_dir(&run)
            .env(
                "ZERO_RENDEZVOUS",
                format!("file:{}", run.join("rendezvous").display()),
            )
            .env("ZERO_RANK", rank.to_string())
            .env("ZERO_WORLD_SIZE", RANKS.to_string())
            .env("ZERO_RENDEZVOUS_TIMEOUT", "60")
            .env("ZERO_COMM_TIMEOUT", "60")
            // Both on the one GPU; each process its own NCCL "host" (nccl_pair.rs).
            .env("ZERO_SHARE_GPUS", "1")
            .env("NCCL_HOSTID", format!("zero-gpu-check-tcp-rank{rank}"))
            .env("NCCL_SOCKET_IFNAME", "lo")
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(out_file)
            .stderr(err_file);
        if rank == 0 {
            cmd.arg("--json").arg(&json);
        }
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| anyhow!("starting rank {rank} ({}): {e}", exe.display()))?;
        children.push((child, log));
    }
    let start = Instant::now();
    let mut ended: Vec<Option<std::process::ExitStatus>> = vec![None; RANKS];
    // Until both ended, one failed (the other would wait for it until its own timeout),
    // or the limit.
    let failed =
        |ended: &[Option<std::process::ExitStatus>]| ended.iter().flatten().any(|s| !s.success());
    while ended.iter().any(Option::is_none) && !failed(&ended) && start.elapsed() < limit {
        for (r, (child, _)) in children.iter_mut().enumerate() {
            if ended[r].is_none() {
                // A rank that cannot be asked is taken as still running (killed below).
                ended[r] = child.try_wait().ok().flatten();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((ended, json))
}

/// What rank 0 of a pair reported in `json`.
fn read_report(json: &Path) -> anyhow::Result<PairRun> {
    let text =
        std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    let report: serde_json::Value = serde_json::from_str(&text)?;
    // Two processes that each trained alone would agree too: the world must be the pair.
    if report["world"].as_u64() != Some(RANKS as u64) {
        bail!(
            "the run's world was {} rank(s), not the {RANKS} processes",
            report["world"]
        );
    }
    let stage = &report["stages"][0];
    let losses = stage["losses"]
        .as_array()
        .ok_or_else(|| anyhow!("no losses in {}", json.display()))?
        .iter()
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| anyhow!("a loss that is not a number"))
        })
        .collect::<anyhow::Result<Vec<f64>>>()?;
    Ok(PairRun {
        losses,
        hidden: stage["overlap"]["hidden_fraction"].as_f64(),
        step_seconds: stage["mean_step_seconds"].as_f64(),
    })
}

/// Kill and reap every started rank.
fn stop(children: &mut [(std::process::Child, PathBuf)]) {
    for (child, _) in children.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The group's checks: the pair with the GPU's collectives (`nccl`; `mpi` on the
/// simulated GPU) against the pair staged through host memory, the host waiting for each
/// collective; then that staged pair against the staged pair overlapped.
pub fn check(
    out: &Path,
    sim: bool,
    steps: usize,
    deadline: f64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let (device, direct) = if sim {
        ("sim-gpu", "mpi")
    } else {
        ("cuda", "nccl")
    };
    let name =
        format!("ZeRO-2 fp32, {RANKS} train processes x {steps} steps: {direct} vs mpi-staged");
    let check = Check::new(GROUP, name, Kind::Correctness);
    let overlap_name = format!(
        "ZeRO-2 fp32, {RANKS} train processes x {steps} steps: mpi-staged, host waiting vs overlapped"
    );
    let overlap_check = Check::new(GROUP, overlap_name, Kind::Correctness);
    let skip = |why: &str, report: &mut Report| -> anyhow::Result<()> {
        report.add(check.clone().skip(why))?;
        report.add(overlap_check.clone().skip(why))
    };
    if cfg!(feature = "mpi") {
        // This build would ignore ZERO_RENDEZVOUS and refuse to train (world.rs).
        return skip(
            "this zero-bench joins processes through MPI; the TCP world is the build without MPI's (scripts/carry-check.sh builds it)",
            report,
        );
    }
    if !sim && !cfg!(feature = "nccl") {
        return skip(
            "this zero-bench was built without the `nccl` feature (scripts/carry-check.sh builds it)",
            report,
        );
    }
    let (waiting, overlapped) = if sim {
        (
            Pair {
                label: "mpi-staged-waiting",
                comm: "mpi-staged",
                args: &["--no-overlap"],
                env: &[],
            },
            Pair {
                label: "mpi-staged-overlapped",
                comm: "mpi-staged",
                args: &[],
                env: &[],
            },
        )
    } else {
        (
            Pair {
                label: "mpi-staged-waiting",
                comm: "mpi-staged",
                args: &[],
                env: &[("ZERO_CUDA_STAGED", "wait")],
            },
            Pair {
                label: "mpi-staged-overlapped",
                comm: "mpi-staged",
                args: &[],
                env: &[("ZERO_CUDA_STAGED", "overlap")],
            },
        )
    };
    let t0 = Instant::now();
    let dir = out.join(GROUP);
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            let why = format!("finding this binary: {e}");
            report.add(check.fail(&why))?;
            return report.add(overlap_check.fail(why));
        }
    };
    let direct_pair = Pair {
        label: direct,
        comm: direct,
        args: &[],
        env: &[],
    };
    let mut ignored = None;
    // One pair, when there is time for it.
    let pair = |p: &Pair<'_>, report: &mut Report| -> anyhow::Result<Result<PairRun, PairEnd>> {
        let Some(limit) = pair_limit(report, deadline, PAIR_TIMEOUT) else {
            return Ok(Err(PairEnd::CutShort(no_time(deadline))));
        };
        report.start(format!("{GROUP}/--comm {} ({})", p.comm, p.label))?;
        Ok(run_pair(&exe, &dir, device, p, steps, limit))
    };
    let a = pair(&direct_pair, report)?;
    let b = pair(&waiting, report)?;
    let mut check = match (&a, &b) {
        (Err(e), _) => e
            .judge(check, &mut ignored)
            .prefixed(&format!("--comm {direct}: ")),
        (_, Err(e)) => e
            .judge(check, &mut ignored)
            .prefixed("--comm mpi-staged, the host waiting: "),
        (Ok(a), Ok(b)) => {
            let (a, b) = (&a.losses, &b.losses);
            let (worst, at) = train::max_rel(a, b, steps);
            let how = train::rel_in_words(worst, at);
            check
                .at_most(
                    worst,
                    train::FP32_TOL,
                    format!(
                        "{direct} vs mpi-staged over the TCP world: {how} <= {:.0e}; loss {:.4} -> {:.4}",
                        train::FP32_TOL,
                        a.first().copied().unwrap_or(f64::NAN),
                        a.last().copied().unwrap_or(f64::NAN)
                    ),
                )
                .with_data(serde_json::json!({ direct: figures(a), "mpi-staged": figures(b) }))
        }
    };
    check.seconds = t0.elapsed().as_secs_f64();
    report.add(check)?;

    let t1 = Instant::now();
    let b = match b {
        Ok(b) => b,
        Err(PairEnd::CutShort(_)) => {
            return report.add(overlap_check.out_of_time(no_time(deadline)));
        }
        Err(_) => {
            return report.add(
                overlap_check.skip("not run: the waiting run it is compared with failed (above)"),
            );
        }
    };
    let c = pair(&overlapped, report)?;
    let mut check = match &c {
        Err(e) => e
            .judge(overlap_check, &mut ignored)
            .prefixed("--comm mpi-staged, overlapped: "),
        Ok(c) => {
            let (worst, at) = train::max_rel(&c.losses, &b.losses, steps);
            let how = train::rel_in_words(worst, at);
            let figures_of = |r: &PairRun| {
                format!(
                    "{} hidden, step {}",
                    r.hidden
                        .map_or("none".into(), |h| format!("{:.0}%", 100.0 * h)),
                    r.step_seconds
                        .map_or("?".into(), |t| format!("{:.1} ms", 1e3 * t)),
                )
            };
            overlap_check
                .at_most(
                    worst,
                    0.0,
                    format!(
                        "mpi-staged overlapped vs waiting: {how} <= 0 (bitwise); overlapped {}, waiting {}",
                        figures_of(c),
                        figures_of(&b),
                    ),
                )
                .with_data(serde_json::json!({
                    "waiting": figures(&b.losses), "overlapped": figures(&c.losses),
                    "hidden_waiting": b.hidden, "hidden_overlapped": c.hidden,
                    "step_s_waiting": b.step_seconds, "step_s_overlapped": c.step_seconds,
                }))
        }
    };
    check.seconds = t1.elapsed().as_secs_f64();
    report.add(check)
}
