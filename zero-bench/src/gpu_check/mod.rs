//! `zero-bench gpu-check`: the GPU check, in two halves (scripts/gpu-check.sh runs both).
//!
//! - `prepare --out DIR`, here: the host's 4-thread-rank training curves (stages 0-3,
//!   fp32 and bf16) into `DIR/reference.json`, carried to the GPU machine with the
//!   binary.
//! - `run --ref DIR --out DIR`, on the GPU machine: every check, one line each (`ok`,
//!   `FAIL`, `skip` and the figures) as it finishes, then a summary; the results as JSON
//!   in `--out` (rewritten after every check). `--device sim` is the dry run: the same
//!   checks on the simulated GPU (`SimDevice::gpu_twin`) against the host, timings
//!   labelled as not measurements.
//!
//! Each group of checks runs in a process of its own (this binary, `run --group-child`),
//! under a time limit: a hang, a crash or a CUDA error (which sticks to a process's
//! context) costs that group only, and `--budget-s` bounds the whole run. The groups run
//! cheapest and most telling first (the kernels, the models, the throughput figures),
//! the pairs of processes and the overlap path (never yet run on a GPU) last, and each
//! group leaves a little of the budget ([`GROUP_SHARE_S`]) to the groups after it.
//!
//! Exit status: 0 every check passed (or was skipped for a reason other than time), 2 a
//! correctness check failed, 3 there is no GPU here (the reason is printed, starting
//! `no GPU:`), 4 every correctness check passed but a performance goal was missed, 124
//! nothing failed but the budget ran out before every check ran (the `skip` lines that
//! say "out of time"), 1 anything else went wrong.

mod environment;
mod kernels;
mod model;
#[cfg(feature = "nccl")]
mod nccl_pair;
mod overlap;
mod perf;
mod report;
mod stats;
mod tcp_pair;
mod train;

use crate::logging::outln;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use zero_kernels::device::{HostDevice, SimDevice};
use zero_kernels::twin::attention_products::AttentionKernels;

use crate::device::{BenchDevice, Opener};
use report::{no_time, Check, Head, Kind, Report, Saved};

/// Exit status when a correctness check failed.
pub const EXIT_FAILED: i32 = 2;
/// Exit status when there is no GPU to check.
pub const EXIT_NO_GPU: i32 = 3;
/// Exit status when only performance goals were missed (every correctness check passed).
pub const EXIT_PERFORMANCE: i32 = 4;
/// Exit status when nothing failed but checks were left out for lack of time (the
/// script's `timeout` gives the same when it kills the run).
pub const EXIT_INCOMPLETE: i32 = 124;

/// `gpu-check` subcommands.
#[derive(Subcommand, Debug)]
pub enum GpuCheckCommand {
    /// Before carrying the binary: the CPU reference runs the GPU's are compared with.
    Prepare(PrepareArgs),
    /// On the GPU machine (`--device sim`: the dry run here): every check, one line each.
    Run(RunArgs),
    /// One rank of the two-process NCCL check (`run` starts two; not for use by hand).
    #[cfg(feature = "nccl")]
    #[command(hide = true)]
    NcclRank(nccl_pair::NcclRankArgs),
}

/// `gpu-check prepare`.
#[derive(Args, Debug)]
pub struct PrepareArgs {
    /// Folder for reference.json (created).
    #[arg(long)]
    out: PathBuf,
    /// Optimizer steps of each reference run.
    #[arg(long, default_value_t = 20)]
    steps: usize,
}

/// The device under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// CUDA device 0.
    Cuda,
    /// The simulated GPU (the CUDA kernels' CPU twins): the dry run.
    Sim,
}

impl DeviceArg {
    fn name(self) -> &'static str {
        match self {
            DeviceArg::Cuda => "cuda",
            DeviceArg::Sim => "sim",
        }
    }
}

/// `gpu-check run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The folder `gpu-check prepare` wrote.
    #[arg(long = "ref")]
    reference: PathBuf,
    /// Folder for gpu-check.json (created).
    #[arg(long)]
    out: PathBuf,
    /// The device under test.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cuda)]
    device: DeviceArg,
    /// Small sizes and few steps (the dry run in tests).
    #[arg(long)]
    quick: bool,
    /// Seconds after which no check starts (the checks left are reported as not run
    /// for lack of time, exit status 124) and a check still running is cut short; the
    /// script passes its timeout less 60 s.
    #[arg(long, default_value_t = 420.0)]
    budget_s: f64,
    /// Run only these groups (comma-separated): kernel, adamw-bandwidth, gpt-fwd-bwd,
    /// llama-fwd-bwd, throughput, train-4-ranks, attention-products, nccl-2-procs (with
    /// nccl-bandwidth), train-tcp, staged.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Run this one group here and write OUT/groups/GROUP.json (`run` starts one process
    /// per group; not for use by hand).
    #[arg(long, hide = true)]
    group_child: Option<String>,
}

/// The groups of checks, in the order they run (`--only`): the cheap and telling ones
/// first, the headline figures before the pairs of processes that may hang, the overlap
/// path that has not yet run on a GPU last.
const GROUPS: &[&str] = &[
    "kernel",
    "adamw-bandwidth",
    "gpt-fwd-bwd",
    "llama-fwd-bwd",
    "throughput",
    "train-4-ranks",
    PRODUCTS_GROUP,
    "nccl-2-procs",
    tcp_pair::GROUP,
    "staged",
];

/// Seconds of the budget each group keeps for itself while the groups before it run:
/// a group that hangs cannot take the time of the ones after it (it is cut off, or its
/// remaining checks skipped, that much early).
const GROUP_SHARE_S: &[(&str, f64)] = &[
    ("kernel", 10.0),
    ("adamw-bandwidth", 5.0),
    ("gpt-fwd-bwd", 10.0),
    ("llama-fwd-bwd", 10.0),
    ("throughput", 25.0),
    ("train-4-ranks", 20.0),
    (PRODUCTS_GROUP, 20.0),
    ("nccl-2-procs", 30.0),
    (tcp_pair::GROUP, 30.0),
    ("staged", 20.0),
];

/// Seconds a group's process may run past its time (the check it started before the
/// time ran out finishing) before it is killed.
const GROUP_GRACE_S: f64 = 30.0;
/// A group is not started with less time than this left.
const MIN_GROUP_S: f64 = 5.0;

/// The group of the attention of batched products (`ZERO_CUDA_ATTENTION=products`).
pub const PRODUCTS_GROUP: &str = "attention-products";

impl RunArgs {
    /// Whether `--only` leaves group `g` in.
    fn wants(&self, g: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == g)
    }
}

/// What every group needs besides the device: the arguments, the folders (absolute:
/// the pairs' processes run elsewhere) and the reference.
struct Ctx<'a> {
    a: &'a RunArgs,
    /// When this process started: the budget's clock (it covers opening the device).
    started: Instant,
    out: PathBuf,
    reference_dir: PathBuf,
    reference: &'a train::Reference,
}

impl Ctx<'_> {
    /// Training steps compared.
    fn steps(&self) -> usize {
        if self.a.quick {
            train::QUICK_STEPS
        } else {
            self.reference.setup.steps
        }
    }
}

/// Run a `gpu-check` subcommand.
pub fn run(cmd: GpuCheckCommand) -> anyhow::Result<()> {
    // The budget counts from here, before the device is opened (its PTX compiled, cold
    // the first time): the run must end, with its summary, within the script's timeout.
    let started = Instant::now();
    crate::logging::init(None);
    match cmd {
        GpuCheckCommand::Prepare(a) => prepare(&a),
        GpuCheckCommand::Run(a) => {
            let code = run_checks(&a, started)?;
            std::io::stdout().flush().ok();
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
        #[cfg(feature = "nccl")]
        GpuCheckCommand::NcclRank(a) => nccl_pair::rank_main(&a),
    }
}

fn prepare(a: &PrepareArgs) -> anyhow::Result<()> {
    if a.steps < train::QUICK_STEPS {
        anyhow::bail!(
            "--steps {} is fewer than the {} a quick run compares",
            a.steps,
            train::QUICK_STEPS
        );
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let t0 = std::time::Instant::now();
    let r = train::prepare(&a.out, a.steps)?;
    outln!(
        "gpu-check prepare: {} reference curves in {:.1} s -> {}",
        r.curves.len(),
        t0.elapsed().as_secs_f64(),
        a.out.join(train::REFERENCE_FILE).display()
    );
    Ok(())
}

/// Say there is no GPU, and why; the exit status tells the script.
fn no_gpu(reason: &str) -> i32 {
    outln!("no GPU: {reason}");
    EXIT_NO_GPU
}

/// `path` made absolute (against the current folder), for processes that run elsewhere.
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("making {} absolute", path.display()))
}

fn run_checks(a: &RunArgs, started: Instant) -> anyhow::Result<i32> {
    if let Some(bad) = a
        .only
        .iter()
        .chain(&a.group_child)
        .find(|o| !GROUPS.contains(&o.as_str()))
    {
        anyhow::bail!(
            "--only {bad}: not a group; give some of {}",
            GROUPS.join(", ")
        );
    }
    // Every group but attention-products checks the rows kernels, bit for bit against
    // their twins: a choice of products in the environment would fail them (and the
    // processes of the groups inherit what is left). Still single-threaded here.
    if let Some(v) = std::env::var_os(AttentionKernels::ENV) {
        outln!(
            "gpu-check: ignoring {}={}: the attention-products group checks that choice",
            AttentionKernels::ENV,
            v.to_string_lossy()
        );
        std::env::remove_var(AttentionKernels::ENV);
    }
    let reference = train::Reference::load(&a.reference)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let ctx = Ctx {
        a,
        started,
        out: absolute(&a.out)?,
        reference_dir: absolute(&a.reference)?,
        reference: &reference,
    };
    match a.device {
        DeviceArg::Sim => {
            let desc = zero_kernels::device::Device::describe(&SimDevice::gpu_twin(0x5157));
            match &a.group_child {
                Some(g) => {
                    let open = |rank: usize| Ok(SimDevice::gpu_twin(0x5157 + rank as u64));
                    group_child(&open, head(&ctx, desc, true), &ctx, g)
                }
                None => all_groups(head(&ctx, desc, true), &ctx),
            }
        }
        DeviceArg::Cuda => cuda(&ctx),
    }
}

/// The report's header.
fn head(ctx: &Ctx<'_>, device: String, simulated: bool) -> Head {
    // The group processes leave the versions to the run's own report.
    let environment = match ctx.a.group_child {
        Some(_) => serde_json::Value::Null,
        None => environment::describe(!simulated, ctx.a.budget_s),
    };
    Head {
        device,
        simulated,
        quick: ctx.a.quick,
        reference: ctx.reference_dir.clone(),
        budget_s: ctx.a.budget_s,
        environment,
    }
}

#[cfg(feature = "cuda")]
fn cuda(ctx: &Ctx<'_>) -> anyhow::Result<i32> {
    if let Some(g) = &ctx.a.group_child {
        let open = |_rank: usize| zero_kernels::cuda::CudaDevice::new(0);
        return group_child(&open, head(ctx, "cuda:0".into(), false), ctx, g);
    }
    match crate::device::cuda::open_first() {
        Ok(dev) => {
            let desc = crate::device::cuda::describe(&dev);
            // Every group opens its own, in its own process.
            drop(dev);
            all_groups(head(ctx, desc, false), ctx)
        }
        Err(Ok(reason)) => Ok(no_gpu(&reason)),
        Err(Err(e)) => {
            // A GPU that does not open (an old driver refusing the PTX, a device in a
            // bad state) is the finding: said as a check, with the JSON written.
            let mut report = Report::new_at(
                head(ctx, "cuda:0".into(), false),
                ctx.out.join("gpu-check.json"),
                ctx.started,
            );
            print_header(&report, ctx);
            report.add(Check::new("device", "opening CUDA device 0", Kind::Correctness).fail(e))?;
            finish(&mut report)
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda(_ctx: &Ctx<'_>) -> anyhow::Result<i32> {
    Ok(no_gpu(
        "this zero-bench was built without the `cuda` feature \
         (the carried GPU build: cargo build -p zero-bench --release --no-default-features \
         --features nccl)",
    ))
}

fn print_header(report: &Report, ctx: &Ctx<'_>) {
    let head = report.head();
    let env = environment::line(&head.environment);
    outln!(
        "gpu-check: {}{}; reference {} ({} curves from {}); budget {:.0} s{}",
        head.device,
        if ctx.a.quick { ", quick" } else { "" },
        ctx.reference_dir.display(),
        ctx.reference.curves.len(),
        ctx.reference.device,
        ctx.a.budget_s,
        if env.is_empty() {
            String::new()
        } else {
            format!("; {env}")
        }
    );
}

/// Every wanted group, each in a process of its own, then the summary; the exit status.
fn all_groups(head: Head, ctx: &Ctx<'_>) -> anyhow::Result<i32> {
    let mut report = Report::new_at(head, ctx.out.join("gpu-check.json"), ctx.started);
    // The groups' files of an earlier run into the same folder go: what is there after
    // this run is this run's (`--only` or a group not started would leave old ones).
    let groups = ctx.out.join("groups");
    match std::fs::remove_dir_all(&groups) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", groups.display())),
    }
    // Written before the first check: a run killed in it still leaves its header.
    report.save(false)?;
    print_header(&report, ctx);
    let wanted: Vec<&str> = GROUPS.iter().copied().filter(|g| ctx.a.wants(g)).collect();
    for (i, g) in wanted.iter().enumerate() {
        let later: f64 = wanted[i + 1..].iter().map(|g| share(g)).sum();
        group_process(g, later, ctx, &mut report)?;
    }
    finish(&mut report)
}

/// What group `g` keeps for itself ([`GROUP_SHARE_S`]).
fn share(g: &str) -> f64 {
    GROUP_SHARE_S
        .iter()
        .find(|(name, _)| *name == g)
        .map_or(10.0, |(_, s)| *s)
}

/// Save the finished report, print the summary; the exit status.
fn finish(report: &mut Report) -> anyhow::Result<i32> {
    report.save(true)?;
    let s = report.summary();
    outln!(
        "summary: {} ok, {} FAIL ({} of them performance goals), {} skip ({} of them not run for lack of time) in {:.1} s -> {}",
        s.ok,
        s.fail,
        s.fail_performance,
        s.skip,
        s.out_of_time,
        report.elapsed(),
        report.json_path().display()
    );
    let failed: Vec<String> = report
        .checks()
        .iter()
        .filter(|c| c.status == report::Status::Fail)
        .map(|c| format!("{} {}", c.group, c.name))
        .collect();
    if !failed.is_empty() {
        outln!("failed: {}", failed.join("; "));
    }
    let code = exit_status(&s);
    if s.out_of_time > 0 {
        outln!(
            "INCOMPLETE: {} checks were not run (or cut short) for lack of time: what ran is judged above, the rest is unknown",
            s.out_of_time
        );
    }
    if code == EXIT_PERFORMANCE {
        outln!("every correctness check passed; only performance goals were missed");
    } else if code == EXIT_INCOMPLETE && s.fail_performance > 0 {
        outln!(
            "no correctness check that ran failed; {} performance goals were missed",
            s.fail_performance
        );
    }
    Ok(code)
}

/// [`EXIT_FAILED`] when a correctness check failed; else [`EXIT_INCOMPLETE`] when checks
/// were left out for time; else [`EXIT_PERFORMANCE`] when performance goals were missed;
/// else 0.
fn exit_status(s: &report::Summary) -> i32 {
    if s.fail > s.fail_performance {
        EXIT_FAILED
    } else if s.out_of_time > 0 {
        EXIT_INCOMPLETE
    } else if s.fail > 0 {
        EXIT_PERFORMANCE
    } else {
        0
    }
}

/// Have `cmd`'s process killed when the thread that starts it ends (this process
/// killed from outside, or a group's process killed for time): no rank or group is left
/// running on the GPU behind it.
pub(crate) fn die_with_parent(cmd: &mut Command) {
    crate::sweep::launch::die_with_parent(cmd, libc::SIGKILL);
}

/// Run group `g` in a process of its own, with the budget left less `later` (the shares
/// of the groups after it), at least its own share; its checks into `report` as it saves
/// them; a process that hangs past its time is killed and said to have.
fn group_process(g: &str, later: f64, ctx: &Ctx<'_>, report: &mut Report) -> anyhow::Result<()> {
    let budget = ctx.a.budget_s;
    let left = budget - report.elapsed();
    if left < MIN_GROUP_S {
        let c = Check::new(g, "the whole group", Kind::Correctness).out_of_time(no_time(budget));
        return report.adopt(vec![c]);
    }
    let group_budget = (left - later).max(share(g).min(left));
    let groups = ctx.out.join("groups");
    std::fs::create_dir_all(&groups).with_context(|| format!("creating {}", groups.display()))?;
    let json = groups.join(format!("{g}.json"));
    let _ = std::fs::remove_file(&json);
    let exe = std::env::current_exe().context("finding this binary")?;
    let mut cmd = Command::new(&exe);
    cmd.args(["gpu-check", "run", "--ref"])
        .arg(&ctx.reference_dir)
        .arg("--out")
        .arg(&ctx.out)
        .args(["--device", ctx.a.device.name()])
        .args(["--budget-s", &format!("{group_budget:.1}")])
        .args(["--group-child", g])
        .stdin(Stdio::null());
    if ctx.a.quick {
        cmd.arg("--quick");
    }
    die_with_parent(&mut cmd);
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let c = Check::new(g, "the group's process", Kind::Correctness)
                .fail(format!("starting {}: {e}", exe.display()));
            return report.adopt(vec![c]);
        }
    };
    let pid = child.id();
    report.start(format!("{g} (process {pid})"))?;
    let kill_after = Duration::from_secs_f64(group_budget + GROUP_GRACE_S);
    let mut seen = String::new();
    let mut last_read = Instant::now();
    // When the process last showed progress (a check done, a unit started): a unit
    // still running at the kill started then.
    let mut progress = started;
    let ended = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > kill_after {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        // Its checks so far into this report too (a run killed from outside keeps them).
        if last_read.elapsed() > Duration::from_secs(1) {
            last_read = Instant::now();
            if let Ok(text) = std::fs::read_to_string(&json) {
                if text != seen {
                    progress = Instant::now();
                    if let Ok(saved) = serde_json::from_str::<Saved>(&text) {
                        // Between its units, the group itself (a hang there is named too).
                        let running = Some(saved.running.map_or_else(
                            || format!("{g} (process {pid})"),
                            |r| format!("{g}: {r}"),
                        ));
                        report.set_pending(saved.checks, running)?;
                    }
                    seen = text;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let saved = Saved::load(&json);
    let (checks, running, finished) = match saved {
        Ok(s) => (s.checks, s.running, s.finished),
        Err(_) => (Vec::new(), None, false),
    };
    let name = match running {
        Some(r) => format!("{r} (the group's process)"),
        None => "the group's process".to_string(),
    };
    let seconds = started.elapsed().as_secs_f64();
    let check = Check::new(g, name, Kind::Correctness);
    let more = match ended {
        None => {
            // The part of the group's time the unit it was running had.
            let unit_time = group_budget - progress.duration_since(started).as_secs_f64();
            Some(killed(check, seconds, group_budget, unit_time, share(g)))
        }
        Some(status) if !status.success() || !finished => Some(check.fail(format!(
            "it ended with {status} before the group's end (its error, or the crash, is \
             printed above)"
        ))),
        Some(_) => None,
    };
    let more = more.map(|mut c| {
        c.seconds = seconds;
        c
    });
    report.set_pending(checks, None)?;
    report.adopt(more.into_iter().collect())
}

/// The line of a group's process killed `seconds` after it started, at its time
/// (`group_budget`) and the grace: a hang (FAIL) when the unit it was running had had at
/// least the group's `share` of that time (its own limit); else the budget cut it short
/// (not judged, the run incomplete), as a pair of processes cut short by the budget is
/// ([`still_running`]).
fn killed(check: Check, seconds: f64, group_budget: f64, unit_time: f64, share: f64) -> Check {
    if unit_time >= share {
        check.fail(format!(
            "still running {seconds:.0} s after it started, {GROUP_GRACE_S:.0} s past the \
             group's time ({group_budget:.0} s), in a unit that had {unit_time:.0} s of it \
             (the group's share: {share:.0} s): killed (a hang, or far slower than it should \
             be; its checks so far are above)"
        ))
    } else {
        check.out_of_time(format!(
            "cut short: still running {GROUP_GRACE_S:.0} s past the group's time \
             ({group_budget:.0} s of the budget), in a unit that had only {:.0} s of it, \
             less than the group's share ({share:.0} s): killed (not judged; its checks so \
             far are above, the rest did not run)",
            unit_time.max(0.0)
        ))
    }
}

/// `run --group-child G`: group `g` in this process, its report in OUT/groups/G.json.
fn group_child<D: BenchDevice>(
    open: &Opener<D>,
    head: Head,
    ctx: &Ctx<'_>,
    g: &str,
) -> anyhow::Result<i32> {
    let groups = ctx.out.join("groups");
    std::fs::create_dir_all(&groups).with_context(|| format!("creating {}", groups.display()))?;
    let mut report = Report::new_at(head, groups.join(format!("{g}.json")), ctx.started);
    report.save(false)?;
    run_group(open, g, ctx, &mut report)?;
    report.save(true)?;
    Ok(0)
}

/// The device under test for a group, or a FAIL line saying why not.
fn open_dut<D: BenchDevice>(
    open: &Opener<D>,
    group: &'static str,
    report: &mut Report,
) -> anyhow::Result<Option<D>> {
    // Named in the JSON while it opens: a device that hangs in its open is said to.
    report.start("opening the device")?;
    match open(0) {
        Ok(d) => Ok(Some(d)),
        Err(e) => {
            let c = Check::new(group, "opening the device under test", Kind::Correctness);
            report.add(c.fail(e))?;
            Ok(None)
        }
    }
}

/// The checks of group `g`, in this process.
fn run_group<D: BenchDevice>(
    open: &Opener<D>,
    g: &str,
    ctx: &Ctx<'_>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let a = ctx.a;
    let budget = a.budget_s;
    let sim = a.device == DeviceArg::Sim;
    let steps = ctx.steps();
    let shape = if a.quick {
        kernels::Shape::QUICK
    } else {
        kernels::Shape::FULL
    };
    let gpt_case = model::Case {
        preset: if a.quick { "small" } else { "gpt2-124m" },
        rows: 1,
        seq_len: 64,
    };
    let throughput = |preset: &'static str, attention: Option<AttentionKernels>| {
        if sim {
            perf::Throughput {
                preset,
                run_preset: "small",
                rows: 2,
                seq_len: if a.quick { 32 } else { 64 },
                warmup: 1,
                timed: 2,
                attention,
            }
        } else {
            perf::Throughput {
                preset,
                run_preset: preset,
                rows: 16,
                seq_len: 1024,
                warmup: 2,
                timed: 5,
                attention,
            }
        }
    };
    match g {
        // Every kernel against its reference.
        "kernel" => {
            let Some(dut) = open_dut(open, "kernel", report)? else {
                return Ok(());
            };
            if sim {
                let host = HostDevice::new();
                kernels::check_all(&dut, &host, kernels::Against::Host, &shape, report)
            } else {
                let twin = SimDevice::gpu_twin(0x7477);
                kernels::check_all(&dut, &twin, kernels::Against::Twin, &shape, report)
            }
        }
        // AdamW bandwidth.
        "adamw-bandwidth" => {
            let Some(dut) = open_dut(open, "adamw-bandwidth", report)? else {
                return Ok(());
            };
            let (n, rounds, iters) = match (sim, a.quick) {
                (false, _) => (64 << 20, 7, 10),
                (true, false) => (1 << 20, 3, 2),
                (true, true) => (1 << 16, 3, 2),
            };
            report.start("adamw-bandwidth")?;
            perf::adamw_bandwidth(&dut, n, rounds, iters, report)
        }
        // GPT-2 and Llama (its RMSNorm, rotary/GQA and SwiGLU kernels) forward and
        // backward against the host.
        "gpt-fwd-bwd" | "llama-fwd-bwd" => {
            let (group, case) = if g == "gpt-fwd-bwd" {
                ("gpt-fwd-bwd", gpt_case)
            } else {
                let case = model::Case {
                    preset: if a.quick { "llama-tiny" } else { "llama-small" },
                    rows: 2,
                    seq_len: 64,
                };
                ("llama-fwd-bwd", case)
            };
            let Some(dut) = open_dut(open, group, report)? else {
                return Ok(());
            };
            guarded(report, budget, group, case.preset, |r| {
                model::check(&dut, &case, None, r)
            })
        }
        // Throughput, 124M and 350M.
        "throughput" => {
            for preset in ["gpt2-124m", "gpt2-350m"] {
                let tp = throughput(preset, None);
                guarded(report, budget, "throughput", preset, |r| {
                    perf::throughput(open, &tp, r)
                })?;
            }
            Ok(())
        }
        // The 4-thread-rank curves against the prepared reference.
        "train-4-ranks" => {
            train::check(open, ctx.reference, steps, budget, report)?;
            Ok(())
        }
        // Attention as batched products: the kernels, the GPT-2 forward/backward and
        // 124M's throughput.
        PRODUCTS_GROUP => {
            let Some(dut) = open_dut(open, PRODUCTS_GROUP, report)? else {
                return Ok(());
            };
            // The heads batched (B <= H), then the sequences (B > H, as in training GPT-2).
            let sequences = kernels::Shape {
                b: shape.h + 4,
                ..shape
            };
            let (ops, g) = (&kernels::Op::PRODUCTS, PRODUCTS_GROUP);
            guarded(report, budget, g, "attention kernels", |r| {
                for s in [&shape, &sequences] {
                    if sim {
                        let host = HostDevice::new();
                        kernels::check_ops(&dut, &host, kernels::Against::Host, s, g, ops, r)?;
                    } else {
                        let twin = SimDevice::gpu_twin(0x7477);
                        kernels::check_ops(&dut, &twin, kernels::Against::Twin, s, g, ops, r)?;
                    }
                }
                Ok(())
            })?;
            let products = Some(AttentionKernels::Products);
            guarded(report, budget, g, gpt_case.preset, |r| {
                model::check(&dut, &gpt_case, products, r)
            })?;
            drop(dut);
            let tp = throughput("gpt2-124m", products);
            guarded(report, budget, g, tp.preset, |r| {
                perf::throughput(open, &tp, r)
            })
        }
        // Two processes through NCCL (issue 14) against two thread ranks.
        "nccl-2-procs" => nccl_pair(ctx, sim, report),
        // `train` as two processes joined without MPI (ZERO_RENDEZVOUS): NCCL against
        // staging through host memory.
        tcp_pair::GROUP => tcp_pair::check(&ctx.out, sim, steps, budget, report),
        // Host staging (issue 14's mpi-staged path, thread ranks instead of MPI) against
        // the direct thread ranks, the host waiting and then overlapped; then the
        // overlap of started host work behind GPU compute, by itself.
        "staged" => {
            let setup = &ctx.reference.setup;
            train::staged_check(open, setup, steps, budget, report)?;
            let what = "host work behind compute";
            guarded(report, budget, "staged", what, |r| {
                overlap::check(open, r).or_else(|e| {
                    r.add(
                        Check::new("staged", what.to_string(), Kind::Correctness)
                            .fail(format!("{e:#}")),
                    )
                })
            })
        }
        other => anyhow::bail!("no group {other}"),
    }
}

/// The two-process NCCL checks where they can run: a CUDA device in a build with NCCL.
fn nccl_pair(ctx: &Ctx<'_>, sim: bool, report: &mut Report) -> anyhow::Result<()> {
    let check = Check::new(
        "nccl-2-procs",
        "two processes on one GPU",
        Kind::Correctness,
    );
    if sim {
        return report.add(check.skip("NCCL needs a real GPU (the simulated GPU has none)"));
    }
    #[cfg(feature = "nccl")]
    {
        if !zero_comm::nccl::present() {
            return report.add(check.fail(zero_comm::nccl::NOT_PRESENT));
        }
        let _ = check;
        nccl_pair::check(
            &ctx.reference_dir,
            ctx.reference,
            ctx.steps(),
            &ctx.out,
            ctx.a.budget_s,
            report,
        )
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = ctx;
        report.add(check.skip(
            "this zero-bench was built without the `nccl` feature (scripts/carry-check.sh builds it)",
        ))
    }
}

/// The last lines of a process's log, for a failure's detail (the pairs of processes).
fn log_tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(4)..].join(" | ")
}

/// Run a long unit unless the budget is spent (then one `skip` line says so), naming it
/// in the JSON while it runs.
fn guarded(
    report: &mut Report,
    budget_s: f64,
    group: &'static str,
    what: &str,
    f: impl FnOnce(&mut Report) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if report.elapsed() > budget_s {
        let c = Check::new(group, what.to_string(), Kind::Correctness);
        return report.add(c.out_of_time(no_time(budget_s)));
    }
    report.start(format!("{group}/{what}"))?;
    f(report)
}

/// How long a pair of processes may run: its own `limit`, or what is left of the
/// budget if less; `None` when too little is left to start one. The flag: whether the
/// budget set it (a pair still running then was cut short, not hung).
pub(crate) fn pair_limit(
    report: &Report,
    budget_s: f64,
    limit: Duration,
) -> Option<(Duration, bool)> {
    let left = budget_s - report.elapsed();
    if left < MIN_GROUP_S {
        return None;
    }
    let left = Duration::from_secs_f64(left);
    Some(if left < limit {
        (left, true)
    } else {
        (limit, false)
    })
}

/// How a pair of processes that gave no results ended.
pub(crate) enum PairEnd {
    /// A rank failed, or the pair could not start: the error.
    Failed(anyhow::Error),
    /// A rank still ran at the pair's own limit (killed).
    Hung(String),
    /// A rank still ran when the run's budget ran out (killed): not judged.
    CutShort(String),
}

impl PairEnd {
    /// `check` as this ending says; `hung` is set to the check's name when the pair hung.
    pub(crate) fn judge(&self, check: Check, hung: &mut Option<String>) -> Check {
        match self {
            PairEnd::Failed(e) => check.fail(format!("{e:#}")),
            PairEnd::Hung(why) => {
                *hung = Some(check.name.clone());
                check.fail(why)
            }
            PairEnd::CutShort(why) => check.out_of_time(why.clone()),
        }
    }
}

/// How a pair's rank `r` still running at `limit` ended (`by_budget`: the run's budget
/// set the limit), with the end of its log.
pub(crate) fn still_running(r: usize, limit: Duration, by_budget: bool, log: &Path) -> PairEnd {
    let secs = limit.as_secs_f64();
    if by_budget {
        PairEnd::CutShort(format!(
            "cut short: rank {r} still running when the budget ran out ({secs:.0} s; killed): {}",
            log_tail(log)
        ))
    } else {
        PairEnd::Hung(format!(
            "rank {r} still running after {secs:.0} s (killed): {}",
            log_tail(log)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A missed performance goal alone is told apart from a correctness failure, and a
    /// run that left checks out for time from one that ran them all.
    #[test]
    fn exit_status_tells_the_outcomes_apart() {
        let summary = |fail, fail_performance, out_of_time| report::Summary {
            ok: 3,
            fail,
            fail_performance,
            skip: 1 + out_of_time,
            out_of_time,
        };
        assert_eq!(exit_status(&summary(0, 0, 0)), 0);
        assert_eq!(exit_status(&summary(2, 2, 0)), EXIT_PERFORMANCE);
        assert_eq!(exit_status(&summary(3, 2, 0)), EXIT_FAILED);
        assert_eq!(exit_status(&summary(1, 0, 0)), EXIT_FAILED);
        assert_eq!(exit_status(&summary(0, 0, 2)), EXIT_INCOMPLETE);
        assert_eq!(exit_status(&summary(1, 1, 2)), EXIT_INCOMPLETE);
        assert_eq!(exit_status(&summary(1, 0, 2)), EXIT_FAILED);
    }

    /// A group's process killed at its time is a hang only when the unit it was running
    /// had the group's whole share of that time; else the budget cut it short.
    #[test]
    fn a_group_cut_short_by_the_budget_is_not_a_hang() {
        let check = || Check::new("throughput", "x (the group's process)", Kind::Correctness);
        // A unit started with 3 s of a 25 s share left: not judged, the run incomplete.
        let cut = killed(check(), 55.0, 25.0, 3.0, 25.0);
        assert_eq!(cut.status, report::Status::Skip);
        assert!(cut.out_of_time, "{}", cut.detail);
        assert!(cut.detail.starts_with("cut short"), "{}", cut.detail);
        // A group given less than its share (the budget nearly spent): the same.
        let cut = killed(check(), 40.0, 10.0, 10.0, 25.0);
        assert!(cut.out_of_time && cut.status == report::Status::Skip);
        // A unit that had the whole share and more, still running: a hang.
        let hung = killed(check(), 130.0, 100.0, 80.0, 25.0);
        assert_eq!(hung.status, report::Status::Fail);
        assert!(!hung.out_of_time, "{}", hung.detail);
        assert!(hung.detail.contains("a hang"), "{}", hung.detail);
    }

    /// Every group has a share, and the shares leave most of the default budget to
    /// the groups themselves.
    #[test]
    fn every_group_keeps_a_share() {
        for g in GROUPS {
            assert!(GROUP_SHARE_S.iter().any(|(n, _)| n == g), "{g}");
        }
        let total: f64 = GROUP_SHARE_S.iter().map(|(_, s)| s).sum();
        assert!(total < 240.0, "{total}");
    }
}
