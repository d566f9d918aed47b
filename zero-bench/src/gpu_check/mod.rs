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
//! Exit status: 0 every check passed (or was skipped), 2 a correctness check failed, 3
//! there is no GPU here (the reason is printed, starting `no GPU:`), 4 every correctness
//! check passed but a performance goal was missed, 1 anything else went wrong.

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
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use zero_kernels::device::{HostDevice, SimDevice};
use zero_kernels::twin::attention_products::AttentionKernels;

use crate::device::{BenchDevice, Opener};
use report::{Check, Kind, Report};

/// Exit status when a correctness check failed.
pub const EXIT_FAILED: i32 = 2;
/// Exit status when there is no GPU to check.
pub const EXIT_NO_GPU: i32 = 3;
/// Exit status when only performance goals were missed (every correctness check passed).
pub const EXIT_PERFORMANCE: i32 = 4;

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
    /// Seconds after which the remaining long checks are skipped (the script kills the
    /// run at 480).
    #[arg(long, default_value_t = 420.0)]
    budget_s: f64,
    /// Run only these groups (comma-separated): kernel, adamw-bandwidth, gpt-fwd-bwd,
    /// llama-fwd-bwd, train-4-ranks, staged, nccl-2-procs (with nccl-bandwidth),
    /// train-tcp, throughput, attention-products.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

/// The groups of checks, in the order they run (`--only`).
const GROUPS: &[&str] = &[
    "kernel",
    "adamw-bandwidth",
    "gpt-fwd-bwd",
    "llama-fwd-bwd",
    "train-4-ranks",
    "staged",
    "nccl-2-procs",
    tcp_pair::GROUP,
    "throughput",
    PRODUCTS_GROUP,
];

/// The group of the attention of batched products (`ZERO_CUDA_ATTENTION=products`).
pub const PRODUCTS_GROUP: &str = "attention-products";

impl RunArgs {
    /// Whether `--only` leaves group `g` in.
    fn wants(&self, g: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == g)
    }
}

/// Run a `gpu-check` subcommand.
pub fn run(cmd: GpuCheckCommand) -> anyhow::Result<()> {
    crate::logging::init(None);
    match cmd {
        GpuCheckCommand::Prepare(a) => prepare(&a),
        GpuCheckCommand::Run(a) => {
            let code = run_checks(&a)?;
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

fn run_checks(a: &RunArgs) -> anyhow::Result<i32> {
    if let Some(bad) = a.only.iter().find(|o| !GROUPS.contains(&o.as_str())) {
        anyhow::bail!(
            "--only {bad}: not a group; give some of {}",
            GROUPS.join(", ")
        );
    }
    // Every group but attention-products checks the rows kernels, bit for bit against
    // their twins: a choice of products in the environment would fail them (and the
    // processes of nccl-2-procs would inherit it). Still single-threaded here.
    if let Some(v) = std::env::var_os(AttentionKernels::ENV) {
        outln!(
            "gpu-check: ignoring {}={}: the attention-products group checks that choice",
            AttentionKernels::ENV,
            v.to_string_lossy()
        );
        std::env::remove_var(AttentionKernels::ENV);
    }
    let reference = train::Reference::load(&a.reference)?;
    match a.device {
        DeviceArg::Sim => {
            let open = |rank: usize| Ok(SimDevice::gpu_twin(0x5157 + rank as u64));
            let desc = zero_kernels::device::Device::describe(&SimDevice::gpu_twin(0x5157));
            all_checks(&open, desc, a, &reference)
        }
        DeviceArg::Cuda => cuda(a, &reference),
    }
}

#[cfg(feature = "cuda")]
fn cuda(a: &RunArgs, reference: &train::Reference) -> anyhow::Result<i32> {
    match crate::device::cuda::open_first() {
        Ok(dev) => {
            let desc = crate::device::cuda::describe(&dev);
            drop(dev);
            let open = |_rank: usize| zero_kernels::cuda::CudaDevice::new(0);
            all_checks(&open, desc, a, reference)
        }
        Err(Ok(reason)) => Ok(no_gpu(&reason)),
        Err(Err(e)) => Err(anyhow::Error::new(e).context("opening CUDA device 0")),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda(_a: &RunArgs, _reference: &train::Reference) -> anyhow::Result<i32> {
    Ok(no_gpu(
        "this zero-bench was built without the `cuda` feature \
         (the carried GPU build: cargo build -p zero-bench --release --no-default-features \
         --features nccl)",
    ))
}

/// Every check on the device `open` gives, in order of cost; returns the exit status.
fn all_checks<D: BenchDevice>(
    open: &Opener<D>,
    desc: String,
    a: &RunArgs,
    reference: &train::Reference,
) -> anyhow::Result<i32> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let dut = open(0).context("opening the device under test")?;
    let sim = dut.simulated();
    let mut report = Report::new(desc.clone(), sim, a.quick, &a.reference, &a.out);
    outln!(
        "gpu-check: {desc}{}; reference {} ({} curves from {})",
        if a.quick { ", quick" } else { "" },
        a.reference.display(),
        reference.curves.len(),
        reference.device
    );

    // 1. Every kernel against its reference.
    let shape = if a.quick {
        kernels::Shape::QUICK
    } else {
        kernels::Shape::FULL
    };
    if a.wants("kernel") && sim {
        let host = HostDevice::new();
        kernels::check_all(&dut, &host, kernels::Against::Host, &shape, &mut report)?;
    } else if a.wants("kernel") {
        let twin = SimDevice::gpu_twin(0x7477);
        kernels::check_all(&dut, &twin, kernels::Against::Twin, &shape, &mut report)?;
    }

    // 2. AdamW bandwidth.
    let (n, rounds, iters) = match (sim, a.quick) {
        (false, _) => (64 << 20, 7, 10),
        (true, false) => (1 << 20, 3, 2),
        (true, true) => (1 << 16, 3, 2),
    };
    if a.wants("adamw-bandwidth") {
        perf::adamw_bandwidth(&dut, n, rounds, iters, &mut report)?;
    }

    // 3. GPT-2 and Llama forward and backward against the host.
    let gpt_case = if a.quick {
        model::Case {
            preset: "small",
            rows: 1,
            seq_len: 64,
        }
    } else {
        model::Case {
            preset: "gpt2-124m",
            rows: 1,
            seq_len: 64,
        }
    };
    if a.wants("gpt-fwd-bwd") {
        guarded(
            &mut report,
            a.budget_s,
            "gpt-fwd-bwd",
            gpt_case.preset,
            |r| model::check(&dut, &gpt_case, None, r),
        )?;
    }
    // Llama (its RMSNorm, rotary/GQA and SwiGLU kernels) against the host.
    let case = model::Case {
        preset: if a.quick { "llama-tiny" } else { "llama-small" },
        rows: 2,
        seq_len: 64,
    };
    if a.wants("llama-fwd-bwd") {
        guarded(&mut report, a.budget_s, "llama-fwd-bwd", case.preset, |r| {
            model::check(&dut, &case, None, r)
        })?;
    }
    drop(dut);

    // 4. The 4-thread-rank curves against the prepared reference.
    let steps = if a.quick {
        train::QUICK_STEPS
    } else {
        reference.setup.steps
    };
    let curves = if a.wants("train-4-ranks") {
        train::check(open, reference, steps, a.budget_s, &mut report)?
    } else {
        Vec::new()
    };

    // Host staging (issue 14's mpi-staged path, thread ranks instead of MPI) against
    // the direct thread ranks.
    if a.wants("staged") {
        let setup = &reference.setup;
        train::staged_check(open, setup, steps, &curves, a.budget_s, &mut report)?;
        // The overlap of started host work behind GPU compute, by itself.
        let what = "host work behind compute";
        guarded(&mut report, a.budget_s, "staged", what, |r| {
            overlap::check(open, r).or_else(|e| {
                r.add(
                    Check::new("staged", what.to_string(), Kind::Correctness)
                        .fail(format!("{e:#}")),
                )
            })
        })?;
    }

    // 5. Two processes through NCCL (issue 14) against two thread ranks.
    if a.wants("nccl-2-procs") {
        nccl_pair(a, reference, steps, sim, &mut report)?;
    }

    // `train` as two processes joined without MPI (ZERO_RENDEZVOUS): NCCL against
    // staging through host memory.
    if a.wants(tcp_pair::GROUP) {
        guarded(
            &mut report,
            a.budget_s,
            tcp_pair::GROUP,
            "two train processes",
            |r| tcp_pair::check(&a.out, sim, steps, r),
        )?;
    }

    // 6. Throughput, 124M and 350M. 7. Attention as batched products (the kernels, the
    // GPT-2 forward/backward and 124M's throughput) last, so that a fault there (a CUDA
    // error sticks to the process's context) costs no other check.
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
    if a.wants("throughput") {
        for preset in ["gpt2-124m", "gpt2-350m"] {
            let tp = throughput(preset, None);
            guarded(&mut report, a.budget_s, "throughput", preset, |r| {
                perf::throughput(open, &tp, r)
            })?;
        }
    }
    if a.wants(PRODUCTS_GROUP) {
        let dut = open(0).context("opening the device under test")?;
        // The heads batched (B <= H), then the sequences (B > H, as in training GPT-2).
        let sequences = kernels::Shape {
            b: shape.h + 4,
            ..shape
        };
        let (ops, g) = (&kernels::Op::PRODUCTS, PRODUCTS_GROUP);
        guarded(&mut report, a.budget_s, g, "attention kernels", |r| {
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
        guarded(&mut report, a.budget_s, g, gpt_case.preset, |r| {
            model::check(&dut, &gpt_case, products, r)
        })?;
        drop(dut);
        let tp = throughput("gpt2-124m", products);
        guarded(&mut report, a.budget_s, g, tp.preset, |r| {
            perf::throughput(open, &tp, r)
        })?;
    }

    report.save(true)?;
    let s = report.summary();
    outln!(
        "summary: {} ok, {} FAIL ({} of them performance goals), {} skip in {:.1} s -> {}",
        s.ok,
        s.fail,
        s.fail_performance,
        s.skip,
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
    if code == EXIT_PERFORMANCE {
        outln!("every correctness check passed; only performance goals were missed");
    }
    Ok(code)
}

/// 0 when nothing failed, [`EXIT_PERFORMANCE`] when only performance goals did, else
/// [`EXIT_FAILED`].
fn exit_status(s: &report::Summary) -> i32 {
    if s.fail == 0 {
        0
    } else if s.fail == s.fail_performance {
        EXIT_PERFORMANCE
    } else {
        EXIT_FAILED
    }
}

/// The two-process NCCL checks where they can run: a CUDA device in a build with NCCL.
fn nccl_pair(
    a: &RunArgs,
    reference: &train::Reference,
    steps: usize,
    sim: bool,
    report: &mut Report,
) -> anyhow::Result<()> {
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
        nccl_pair::check(&a.reference, reference, steps, &a.out, a.budget_s, report)
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = (a, reference, steps);
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

/// Run a long group unless the budget is spent (then one `skip` line says so).
fn guarded(
    report: &mut Report,
    budget_s: f64,
    group: &'static str,
    what: &str,
    f: impl FnOnce(&mut Report) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if report.elapsed() > budget_s {
        let c = Check::new(group, what.to_string(), Kind::Correctness);
        return report.add(c.skip(format!("out of time (budget {budget_s:.0} s)")));
    }
    f(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A missed performance goal alone is told apart from a correctness failure.
    #[test]
    fn exit_status_tells_performance_from_correctness() {
        let summary = |fail, fail_performance| report::Summary {
            ok: 3,
            fail,
            fail_performance,
            skip: 1,
        };
        assert_eq!(exit_status(&summary(0, 0)), 0);
        assert_eq!(exit_status(&summary(2, 2)), EXIT_PERFORMANCE);
        assert_eq!(exit_status(&summary(3, 2)), EXIT_FAILED);
        assert_eq!(exit_status(&summary(1, 0)), EXIT_FAILED);
    }
}
