//! `zero-bench tune`: choose stage, micro-batch, accumulation, bucket size and (stage 3)
//! prefetch and persistence for a model, a world size, a global batch and a memory
//! budget, by prediction first and measurement after.
//!
//! 1. Enumerate the candidates: every stage x every micro-batch B that divides the
//!    per-rank batch (A = global / (N B)) x bucket sizes x (stage 3) prefetch and
//!    persistence thresholds.
//! 2. Drop those whose memory plan (the engine's own, `train --dry-run`'s) exceeds the
//!    budget.
//! 3. Predict each step time: compute from the model's forward+backward measured here on
//!    one micro-batch of B rows (in this process, as `micro model` times it), plus the
//!    optimizer over this rank's share at the AdamW rate measured here, plus the
//!    communication from the ledger's collectives and an alpha-beta model whose alpha and
//!    beta come from a reduce-scatter probe under the real launcher (`micro comm`).
//! 4. Run `--top` candidates (the best predicted of each stage first, then the next
//!    best overall) and the configuration as given, a few steps each, interleaved over
//!    `--rounds`, under the real launcher.
//! 5. Write the fastest measured as a TOML configuration, and the table of predicted vs
//!    measured times with how often the predicted order agrees with the measured one
//!    (pairs of candidates ordered alike).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use clap::Args;
use serde::Serialize;
use zero_core::config::Stage;
use zero_core::ledger::{human_bytes, CommPlan};
use zero_core::model::Compute;
use zero_kernels::device::{Device, HostDevice};
use zero_kernels::Exec;
use zero_models::init::SplitMix64;
use zero_models::LayeredLm;
use zero_models::{upload_units, Gpt, Llama, ModelPreset, TokenBatch};

use crate::config::{load, Config};
use crate::logging::{out, outln};
use crate::sweep::launch::{launcher_words, run_logged, Interrupted};
use crate::train::budget;

/// Options of `zero-bench tune`.
#[derive(Args, Debug)]
#[command(after_long_help = EXAMPLES)]
pub struct TuneArgs {
    /// Training configuration file (the model, data, precision and optimizer; what tune
    /// chooses overrides its `[zero]` and `[train]` batch keys).
    #[arg(long, value_name = "FILE", value_parser = crate::config::utf8_path)]
    pub config: Option<PathBuf>,
    /// Override one configuration value (as train --set), repeatable.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// N: the world size to tune for (the launcher starts this many ranks).
    #[arg(long, value_name = "N")]
    pub world: usize,
    /// Sequences per optimizer step over all ranks (N x A x B). Default: the
    /// configuration's.
    #[arg(long, value_name = "SEQUENCES")]
    pub global_batch: Option<usize>,
    /// Memory each rank may plan for (12GiB, 500MB). Default: this machine's available
    /// memory divided by N (all ranks on this node; on a cluster give the per-rank
    /// memory of the nodes you will run on).
    #[arg(long, value_name = "SIZE", value_parser = crate::plan::parse_mem)]
    pub mem_limit: Option<u64>,
    /// Share of the budget kept free (as train --mem-headroom).
    #[arg(long, default_value = "10%", value_parser = crate::plan::parse_fraction)]
    pub mem_headroom: f64,
    /// Candidates to measure, best predicted first (the configuration as given is
    /// measured too).
    #[arg(long, default_value_t = 4)]
    pub top: usize,
    /// Steps each measured run takes (the first is warm-up, not timed).
    #[arg(long, default_value_t = 6)]
    pub steps: usize,
    /// Rounds over the measured candidates (interleaved); each candidate's time is the
    /// median over rounds.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// How to start N ranks: a command whose {N} (or its lower-case form) is replaced by
    /// the world size, as sweep run's.
    #[arg(long, value_name = "TEMPLATE", default_value = "scripts/mpirun.sh {n}")]
    pub launcher: String,
    /// Directory for the runs' reports and logs, the table and the chosen configuration.
    #[arg(long, value_name = "DIR", default_value = "tune-out", value_parser = crate::config::utf8_path)]
    pub out: PathBuf,
    /// Stop a run that takes longer than this many seconds: SIGTERM to the launcher,
    /// then SIGKILL to it and its ranks 10 s later.
    #[arg(long, value_name = "SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// Ranks the launcher puts on one node (default: all N, as on this machine): with
    /// more ranks than cores, each rank's compute is predicted that much slower.
    #[arg(long, value_name = "R")]
    pub ranks_per_node: Option<usize>,
    /// Cores of one node (default: this machine's).
    #[arg(long, value_name = "C")]
    pub cores_per_node: Option<usize>,
}

const EXAMPLES: &str = "\
Examples:
  # 4 ranks on this machine, 16 sequences per step, within 2 GiB per rank:
  zero-bench tune --config configs/demo.toml --world 4 --global-batch 16 --mem-limit 2GiB
  # Inside a Slurm allocation:
  zero-bench tune --config my.toml --world 16 --mem-limit 60GiB \\
      --launcher \"srun --mpi=pmix --kill-on-bad-exit=1 -n {N}\"";

/// One configuration tune considers.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// Stage 0-3.
    pub stage: usize,
    /// B.
    pub micro_batch: usize,
    /// A.
    pub grad_accum: usize,
    /// zero.bucket_elems (None: the default budget).
    pub bucket_elems: Option<usize>,
    /// zero.prefetch.
    pub prefetch: usize,
    /// zero.persistence_threshold.
    pub persistence_threshold: usize,
    /// The configuration as given (the baseline).
    pub given: bool,
    /// Plan bytes per rank.
    pub plan_bytes: u64,
    /// Predicted step time: compute + optimizer + communication, seconds.
    pub predicted_s: f64,
    /// Its communication part.
    pub predicted_comm_s: f64,
    /// Measured step times, one per round (mean over the timed steps of a run).
    pub measured_s: Vec<f64>,
    /// Why its run failed (it is not run again, nor chosen).
    pub failed: Option<String>,
}

impl Candidate {
    /// The `--set` overrides that make this candidate from the base configuration, on
    /// `world` ranks. The bucket size is always given: "default" is the default at this
    /// world size (`apply`'s `None`, what the plan, the prediction and best.toml have),
    /// not the base configuration's `zero.bucket_elems`, which the run would inherit.
    fn overrides(&self, base: &Config, world: usize) -> Vec<String> {
        vec![
            format!("zero.stage={}", self.stage),
            format!("train.micro_batch={}", self.micro_batch),
            format!("train.grad_accum={}", self.grad_accum),
            format!("zero.prefetch={}", self.prefetch),
            format!("zero.persistence_threshold={}", self.persistence_threshold),
            format!(
                "zero.bucket_elems={}",
                self.apply(base).zero.bucket_elems_for(world)
            ),
        ]
    }

    fn apply(&self, base: &Config) -> Config {
        let mut c = base.clone();
        c.zero.stage = Stage::try_from(self.stage as i64).unwrap_or(c.zero.stage);
        c.train.micro_batch = self.micro_batch;
        c.train.grad_accum = self.grad_accum;
        c.zero.bucket_elems = self.bucket_elems;
        c.zero.prefetch = self.prefetch;
        c.zero.persistence_threshold = self.persistence_threshold;
        c
    }

    fn measured(&self) -> Option<f64> {
        if self.failed.is_some() {
            return None;
        }
        let mut v = self.measured_s.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    fn label(&self) -> String {
        let mut s = format!(
            "ZeRO-{} B={} A={} bucket={}",
            self.stage,
            self.micro_batch,
            self.grad_accum,
            self.bucket_elems
                .map_or("default".to_string(), |b| b.to_string())
        );
        if self.stage == 3 {
            s += &format!(
                " prefetch={} persist={}",
                self.prefetch, self.persistence_threshold
            );
        }
        s
    }
}

/// What the machine measures for the predictions.
struct Rates {
    /// Seconds of one forward+backward per micro-batch size.
    fwd_bwd_s: Vec<(usize, f64)>,
    /// Seconds per parameter of one AdamW step on this rank's share.
    adam_s_per_param: f64,
    /// Alpha (seconds per ring step) and beta (bytes per second per rank); `None` at
    /// N = 1, where there is no link to measure.
    link: Option<(f64, f64)>,
    /// How much slower a rank computes when the node has fewer cores than ranks x
    /// threads (1 otherwise).
    contention: f64,
}

/// Run `zero-bench tune`.
pub fn run(args: &TuneArgs) -> anyhow::Result<()> {
    crate::logging::init(None);
    let n = args.world;
    if n == 0 {
        bail!("--world 0: tune for at least 1 rank");
    }
    // Every candidate's memory plan is made for N ranks (as `plan` and `train --dry-run`
    // make theirs); past this, tune would only multiply its way into nonsense.
    let most = crate::plan::units::MAX_RANKS;
    if n as u64 > most {
        bail!("--world {n}: tune plans for at most {most} ranks; give the world size of the job you will run");
    }
    if args.top == 0 || args.steps < 2 || args.rounds == 0 {
        bail!("--top must be >= 1, --steps >= 2 (the first is warm-up), --rounds >= 1");
    }
    launcher_words(&args.launcher, n)?;
    let loaded = load(args.config.as_deref(), &args.set)?;
    let base = loaded.config;
    let t = &base.train;
    let global = match args.global_batch {
        Some(g) => g,
        None => global_batch_of(n, t.grad_accum, t.micro_batch)?,
    };
    if global == 0 || !global.is_multiple_of(n) {
        bail!("--global-batch {global} is not a positive multiple of the world size {n}: every rank takes the same number of sequences");
    }
    let per_rank = global / n;
    let budget = match args.mem_limit {
        Some(b) => budget::Budget {
            bytes: (b as f64 * (1.0 - args.mem_headroom)) as u64,
            source: format!("--mem-limit {} less headroom", human_bytes(b as f64)),
        },
        None => {
            let (avail, what) = budget::host_available().ok_or_else(|| {
                anyhow!("cannot read this machine's available memory; give --mem-limit")
            })?;
            budget::Budget {
                bytes: (avail as f64 * (1.0 - args.mem_headroom) / n as f64) as u64,
                source: format!(
                    "{what} {} / {n} ranks, less headroom",
                    human_bytes(avail as f64)
                ),
            }
        }
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    outln!(
        "tune: N = {n}, global batch {global} sequences ({per_rank} per rank), budget {} per rank ({})",
        human_bytes(budget.bytes as f64),
        budget.source
    );

    // 1-2. Candidates that fit.
    let (mut cands, dropped) = drop_invalid(args, &base, enumerate(&base, per_rank)?);
    if let Some(line) = &dropped {
        outln!("{line}");
    }
    if cands.is_empty() {
        bail!("every candidate is invalid for this configuration: nothing to measure");
    }
    let total = cands.len();
    let mut fitting = Vec::new();
    for mut c in cands.drain(..) {
        let plan = budget::plan(&c.apply(&base), n, n - 1)?;
        c.plan_bytes = plan.plan.total_bytes();
        if c.plan_bytes <= budget.bytes || c.given {
            fitting.push((c, plan));
        }
    }
    let fits = fitting
        .iter()
        .filter(|(c, _)| c.plan_bytes <= budget.bytes)
        .count();
    outln!("{total} candidates, {fits} fit the budget");
    if fits == 0 {
        bail!(
            "no candidate fits {} per rank: use more ranks, a smaller model, or more memory",
            human_bytes(budget.bytes as f64)
        );
    }

    // 3. Predictions.
    let rates = measure_rates(args, &base, &fitting)?;
    outln!(
        "measured here: {}, AdamW {:.2} ns/param, compute x{:.1} for {} rank(s) on {} core(s); forward+backward: {}",
        link_text(rates.link),
        rates.adam_s_per_param * 1e9,
        rates.contention,
        args.ranks_per_node.unwrap_or(n),
        args.cores_per_node
            .or_else(|| std::thread::available_parallelism().ok().map(|c| c.get()))
            .unwrap_or(1),
        rates
            .fwd_bwd_s
            .iter()
            .map(|(b, s)| format!("B={b} {:.1} ms", s * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut cands: Vec<Candidate> = fitting
        .into_iter()
        .map(|(mut c, p)| {
            let fb = rates
                .fwd_bwd_s
                .iter()
                .find(|(b, _)| *b == c.micro_batch)
                .map_or(f64::NAN, |(_, s)| *s);
            let comm = CommPlan::new(&p.layout, &p.plan, c.grad_accum);
            // No link (N = 1): no communication either, so no time for it.
            let (alpha, beta) = rates.link.unwrap_or((0.0, f64::INFINITY));
            c.predicted_comm_s = comm.estimate_seconds(alpha, beta);
            // AdamW runs over this rank's share: everything at stage 0, 1/N of it above.
            let updated = if c.stage == 0 {
                p.layout.numel()
            } else {
                p.layout.shard_numel()
            };
            c.predicted_s = rates.contention
                * (c.grad_accum as f64 * fb + updated as f64 * rates.adam_s_per_param)
                + c.predicted_comm_s;
            c
        })
        .collect();
    cands.sort_by(|a, b| a.predicted_s.total_cmp(&b.predicted_s));

    // 4. Measure the best predicted of each stage first (so the measured set spans
    // what matters most), then the next best overall up to --top, and the configuration
    // as given; interleaved over the rounds.
    let fit = |i: &usize| cands[*i].plan_bytes <= budget.bytes;
    let mut chosen: Vec<usize> = Vec::new();
    for stage in 0..4 {
        if let Some(i) = (0..cands.len())
            .filter(fit)
            .find(|&i| cands[i].stage == stage)
        {
            chosen.push(i);
        }
    }
    chosen.sort_unstable();
    chosen.truncate(args.top);
    for i in (0..cands.len()).filter(fit) {
        if chosen.len() >= args.top {
            break;
        }
        if !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    if let Some(g) = cands.iter().position(|c| c.given) {
        if !chosen.contains(&g) {
            chosen.push(g);
        }
    }
    let program = std::env::current_exe().context("finding the zero-bench binary")?;
    let timeout = Duration::from_secs(args.timeout);
    // A metrics file the configuration names is the user's: every run here would
    // truncate it and write its own steps, each over the one before. Each run writes its
    // steps to a file of its own in --out instead (kept rather than dropped: the user
    // asked for the step lines, and a failed or slow candidate's are worth reading).
    let own_metrics = base.train.metrics_file.is_some();
    if let Some(m) = &base.train.metrics_file {
        eprintln!(
            "[tune] train.metrics_file {m:?} is left as it is: each run writes its steps to {}",
            run_metrics(&args.out.join("run-<i>-round-<r>.json")).display()
        );
    }
    for round in 0..args.rounds {
        for &i in &chosen {
            if cands[i].failed.is_some() {
                continue;
            }
            let c = &cands[i];
            let report = args.out.join(format!("run-{i}-round-{round}.json"));
            let mut words = launcher_words(&args.launcher, n)?;
            words.push(program.display().to_string());
            words.push("train".into());
            words.extend(train_words(args, &base, c, &report, own_metrics));
            eprintln!("[tune round {}/{}] {}", round + 1, args.rounds, c.label());
            let outcome = run_logged(&words, &report.with_extension("log"), timeout, &c.label())
                .and_then(|()| read_step_seconds(&report));
            match outcome {
                Ok(step_s) => cands[i].measured_s.push(step_s),
                // Ctrl-C or SIGTERM stops the whole tune, not just this candidate.
                Err(e) if e.is::<Interrupted>() => {
                    return Err(e.context(format!(
                        "tune interrupted in round {} of {}; the finished runs' reports are in {}",
                        round + 1,
                        args.rounds,
                        args.out.display()
                    )));
                }
                // One candidate failing (out of memory, a crash) leaves the others to
                // compare: it becomes a failed row of the table.
                Err(e) => {
                    let why = crate::logging::chain(&e);
                    eprintln!("[tune] {why}");
                    // The table names the candidate; the reason need not repeat it.
                    let label = format!("{}: ", cands[i].label());
                    let why = why.strip_prefix(&label).unwrap_or(&why);
                    cands[i].failed = Some(format!("round {}: {why}", round + 1));
                }
            }
        }
    }

    // 5. Report and the chosen configuration.
    let measured: Vec<&Candidate> = chosen.iter().map(|&i| &cands[i]).collect();
    let conc = concordance(&measured);
    let table = render(&measured, &conc);
    out!("{table}");
    let (alpha_s, beta_bytes_per_s) = rates.link.unzip();
    let mut json = serde_json::json!({
        "world": n, "global_batch": global, "budget_bytes": budget.bytes,
        "alpha_s": alpha_s, "beta_bytes_per_s": beta_bytes_per_s,
        "pairs_ordered_alike": conc.agree, "pairs": conc.pairs,
        "pairs_tied": conc.tied,
        "measured": measured,
    });
    let json_path = args.out.join("tune.json");
    let write_json = |json: &serde_json::Value| -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(json).context("serialising the tune report")?;
        crate::outfile::write_text(&json_path, &(text + "\n"))
    };
    let failed = measured.iter().filter(|c| c.failed.is_some()).count();
    let Some(best) = measured
        .iter()
        .filter(|c| c.plan_bytes <= budget.bytes)
        .filter_map(|c| Some((c, c.measured()?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| c)
    else {
        write_json(&json)?;
        // A best.toml of an earlier tune into this directory would read as this one's.
        let stale = args.out.join("best.toml");
        match std::fs::remove_file(&stale) {
            Ok(()) => eprintln!("[tune] removed the earlier {}", stale.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!(
                "[tune] could not remove the earlier {}: {e}",
                stale.display()
            ),
        }
        bail!(
            "no candidate within the budget ran successfully ({failed} of {} candidate(s) failed; \
             the table above and {} say why, the logs are in {})",
            measured.len(),
            json_path.display(),
            args.out.display()
        );
    };
    if failed > 0 {
        eprintln!(
            "[tune] {failed} of {} candidate(s) failed (marked in the table); chosen among the others",
            measured.len()
        );
    }
    let mut best_cfg = best.apply(&base);
    // best.toml is a set-up to train with, not a record of the runs here: the given
    // configuration's metrics file is left out (named in a comment), or the next run
    // with best.toml would overwrite whatever that file holds by then, as tune's runs
    // would have without their own files. The run started from it names its own.
    let metrics_note = match best_cfg.train.metrics_file.take() {
        Some(m) => format!(
            "# train.metrics_file ({} in the given configuration) is left out, so that no \
             earlier metrics are overwritten: give the run its own with --metrics FILE\n",
            toml::Value::String(m)
        ),
        None => String::new(),
    };
    let toml_path = args.out.join("best.toml");
    let text = format!(
        "# Chosen by zero-bench tune for N = {n}, {global} sequences per step, {} per rank:\n# {} (measured {:.2} ms per step)\n{metrics_note}{}",
        human_bytes(budget.bytes as f64),
        best.label(),
        best.measured().unwrap_or(f64::NAN) * 1e3,
        toml::to_string(&best_cfg).context("writing the chosen configuration")?
    );
    crate::outfile::write_text(&toml_path, &text)?;
    json["best"] = best.label().into();
    write_json(&json)?;
    if let Some(given) = measured.iter().find(|c| c.given && c.measured().is_some()) {
        outln!(
            "chosen: {} at {:.2} ms per step; the configuration as given ({}) {:.2} ms: {:.2}x",
            best.label(),
            best.measured().unwrap_or(f64::NAN) * 1e3,
            given.label(),
            given.measured().unwrap_or(f64::NAN) * 1e3,
            given.measured().unwrap_or(f64::NAN) / best.measured().unwrap_or(f64::NAN)
        );
    }
    outln!("written: {} {}", toml_path.display(), json_path.display());
    Ok(())
}

/// The global batch the configuration gives N ranks, N x A x B sequences, or an error
/// naming the product that does not fit and what to lower.
fn global_batch_of(n: usize, grad_accum: usize, micro_batch: usize) -> anyhow::Result<usize> {
    n.checked_mul(grad_accum)
        .and_then(|x| x.checked_mul(micro_batch))
        .ok_or_else(|| {
            anyhow!(
                "the global batch --world x train.grad_accum x train.micro_batch = {n} x \
                 {grad_accum} x {micro_batch} is more than {} sequences: lower \
                 train.micro_batch or train.grad_accum (--set train.micro_batch=B), or give \
                 --global-batch",
                usize::MAX
            )
        })
}

/// Where a run whose report is `report` (`run-<i>-round-<r>.json`) writes its step
/// metrics: `run-<i>-round-<r>.metrics.jsonl` beside it.
fn run_metrics(report: &Path) -> PathBuf {
    report.with_extension("metrics.jsonl")
}

/// The arguments after `zero-bench train` of candidate `c`'s measured run writing its
/// report to `report`: the configuration, the user's `--set`s, the candidate's overrides
/// and [`measurement_overrides`], then `--steps`; the run's own metrics file where the
/// configuration names one (`own_metrics`).
fn train_words(
    args: &TuneArgs,
    base: &Config,
    c: &Candidate,
    report: &Path,
    own_metrics: bool,
) -> Vec<String> {
    let mut words = Vec::new();
    if let Some(cfg) = &args.config {
        words.extend(["--config".into(), cfg.display().to_string()]);
    }
    // A --set of a key this job's own flags give (--steps, --metrics) is left out: the
    // flag would win over it anyway, and the job would warn.
    let given_by_flags =
        |key: &str| key == "train.steps" || (own_metrics && key == "train.metrics_file");
    let overrides = args
        .set
        .iter()
        .filter(|s| !given_by_flags(crate::train::set_key(s)))
        .cloned()
        .chain(c.overrides(base, args.world))
        .chain(measurement_overrides(base));
    for s in overrides {
        words.extend(["--set".into(), s]);
    }
    if own_metrics {
        // train's --metrics comes after (and so over) every --set and the file.
        words.extend([
            "--metrics".into(),
            run_metrics(report).display().to_string(),
        ]);
    }
    words.extend([
        "--steps".into(),
        args.steps.to_string(),
        // The threads the rates above were measured on (train's default, auto,
        // would give a rank more where the launcher leaves it more CPUs).
        "--threads".into(),
        "1".into(),
        "--no-progress".into(),
        "--json".into(),
        report.display().to_string(),
    ]);
    words
}

/// What a measured run sets besides the candidate so that its few `--steps` keep the
/// configuration's learning-rate schedule (which the step time does not depend on): a
/// warmup_cosine whose horizon is `train.steps` (no `optim.decay_steps`) gets that
/// horizon explicitly, or a warmup longer than `--steps` would be refused.
fn measurement_overrides(base: &Config) -> Vec<String> {
    if base.optim.schedule == zero_core::config::Schedule::WarmupCosine
        && base.optim.decay_steps.is_none()
    {
        vec![format!("optim.decay_steps={}", base.train.steps)]
    } else {
        Vec::new()
    }
}

/// Keep the candidates whose measured run the configuration allows: each run's `train`
/// arguments ([`train_words`]) are loaded and validated as train loads them. The rest
/// are returned as one line saying how many were dropped and why (`None`: none were).
fn drop_invalid(
    args: &TuneArgs,
    base: &Config,
    cands: Vec<Candidate>,
) -> (Vec<Candidate>, Option<String>) {
    let total = cands.len();
    let report = args.out.join("run-check.json");
    // (reason, how many, the first candidate it dropped)
    let mut reasons: Vec<(String, usize, String)> = Vec::new();
    let mut kept = Vec::with_capacity(total);
    for c in cands {
        let words = train_words(args, base, &c, &report, false);
        match crate::sweep::child::train_configs(&words) {
            Ok(_) => kept.push(c),
            Err(e) => {
                let why = crate::logging::chain(&e)
                    .replace("\n  - ", " ")
                    .replace('\n', " ");
                match reasons.iter_mut().find(|(r, _, _)| *r == why) {
                    Some(r) => r.1 += 1,
                    None => reasons.push((why, 1, c.label())),
                }
            }
        }
    }
    let dropped = total - kept.len();
    let line = (dropped > 0).then(|| {
        let why: Vec<String> = reasons
            .iter()
            .map(|(why, k, first)| format!("{k} like {first}: {why}"))
            .collect();
        format!(
            "{dropped} of {total} candidates dropped, the configuration rules them out ({})",
            why.join("; ")
        )
    });
    (kept, line)
}

/// Every candidate: stages x micro-batches dividing `per_rank` x buckets x (stage 3)
/// prefetch and persistence; the configuration as given is marked.
fn enumerate(base: &Config, per_rank: usize) -> anyhow::Result<Vec<Candidate>> {
    let micro: Vec<usize> = (1..=per_rank.min(64))
        .filter(|&b| per_rank.is_multiple_of(b))
        .collect();
    let buckets = [None, Some(1 << 20), Some(1 << 24)];
    let mut out = Vec::new();
    for stage in 0..4usize {
        for &b in &micro {
            for &bucket in &buckets {
                let stage3 = if stage == 3 {
                    vec![(1, 0), (2, 0), (1, 1 << 16), (2, 1 << 16)]
                } else {
                    vec![(base.zero.prefetch, base.zero.persistence_threshold)]
                };
                for (prefetch, persist) in stage3 {
                    out.push(Candidate {
                        stage,
                        micro_batch: b,
                        grad_accum: per_rank / b,
                        bucket_elems: bucket,
                        prefetch,
                        persistence_threshold: persist,
                        given: false,
                        plan_bytes: 0,
                        predicted_s: 0.0,
                        predicted_comm_s: 0.0,
                        measured_s: Vec::new(),
                        failed: None,
                    });
                }
            }
        }
    }
    let given = Candidate {
        stage: base.zero.stage.number(),
        micro_batch: base.train.micro_batch,
        grad_accum: base.train.grad_accum,
        bucket_elems: base.zero.bucket_elems,
        prefetch: base.zero.prefetch,
        persistence_threshold: base.zero.persistence_threshold,
        given: true,
        plan_bytes: 0,
        predicted_s: 0.0,
        predicted_comm_s: 0.0,
        measured_s: Vec::new(),
        failed: None,
    };
    // (Checked: with --global-batch, the configuration's A x B need not fit a usize.)
    if given.micro_batch.checked_mul(given.grad_accum) == Some(per_rank) {
        // The same point may be among the enumerated ones: mark it instead of adding it.
        match out.iter_mut().find(|c| {
            (
                c.stage,
                c.micro_batch,
                c.bucket_elems,
                c.prefetch,
                c.persistence_threshold,
            ) == (
                given.stage,
                given.micro_batch,
                given.bucket_elems,
                given.prefetch,
                given.persistence_threshold,
            )
        }) {
            Some(c) => c.given = true,
            None => out.push(given),
        }
    }
    Ok(out)
}

/// The rates the predictions use, measured on this machine.
fn measure_rates(
    args: &TuneArgs,
    base: &Config,
    cands: &[(Candidate, budget::RankPlan)],
) -> anyhow::Result<Rates> {
    // Either family (GPT-2 or Llama), as train builds it.
    let model = base.model_preset().map_err(|e| anyhow!(e))?;
    model.validate().context("model")?;
    let mut micro: Vec<usize> = cands.iter().map(|(c, _)| c.micro_batch).collect();
    micro.sort_unstable();
    micro.dedup();
    let dev = HostDevice::with_exec(Exec::default(), 1);
    let stream = dev.stream("compute")?;
    let cx = Compute {
        dev: &dev,
        stream: &stream,
    };
    let t = base.train.seq_len;
    let mut fwd_bwd_s = Vec::new();
    for &b in &micro {
        let best = match model {
            ModelPreset::Gpt(g) => {
                let mut m =
                    Gpt::<HostDevice, f32>::new(&dev, g, b).context("building the model")?;
                let (p, z) = (m.init_params(1), m.zero_grads());
                time_fwd_bwd(cx, &mut m, &p, &z, g.vocab_size, b, t)?
            }
            ModelPreset::Llama(l) => {
                let mut m =
                    Llama::<HostDevice, f32>::new(&dev, l, b).context("building the model")?;
                let (p, z) = (m.init_params(1), m.zero_grads());
                time_fwd_bwd(cx, &mut m, &p, &z, l.vocab_size, b, t)?
            }
        };
        fwd_bwd_s.push((b, best));
    }
    let adam_s_per_param = adam_rate()?;
    let link = probe_link(args)?;
    let cores = args
        .cores_per_node
        .or_else(|| std::thread::available_parallelism().ok().map(|c| c.get()))
        .unwrap_or(1);
    let ranks = args.ranks_per_node.unwrap_or(args.world);
    Ok(Rates {
        fwd_bwd_s,
        adam_s_per_param,
        link,
        contention: (ranks as f64 / cores.max(1) as f64).max(1.0),
    })
}

/// The fastest of 3 forward+backward passes of `model` (after a warm-up: the machine may
/// be shared) on one random micro-batch of `b` x `t` tokens.
fn time_fwd_bwd<M: LayeredLm<HostDevice, f32>>(
    cx: Compute<'_, HostDevice>,
    model: &mut M,
    init: &[Vec<f32>],
    zero: &[Vec<f32>],
    vocab: usize,
    b: usize,
    t: usize,
) -> anyhow::Result<f64> {
    let params = upload_units(cx, init, "param")?;
    let mut grads = upload_units(cx, zero, "grad")?;
    let mut rng = SplitMix64::new(7);
    let x: Vec<u32> = (0..b * t)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect();
    let batch = TokenBatch {
        rows: b,
        seq_len: t,
        inputs: &x,
        targets: &x,
    };
    let mut best = f64::INFINITY;
    for i in 0..4 {
        let t0 = Instant::now();
        model
            .forward_backward(cx, &batch, &params, &mut grads, 1e-3)
            .context("timing forward+backward")?;
        if i > 0 {
            best = best.min(t0.elapsed().as_secs_f64());
        }
    }
    Ok(best)
}

/// "alpha A us per ring step, beta B GB/s per rank", or n/a where nothing was measured.
fn link_text(link: Option<(f64, f64)>) -> String {
    match link {
        Some((alpha, beta)) => format!(
            "alpha {:.1} us per ring step, beta {:.2} GB/s per rank",
            alpha * 1e6,
            beta / 1e9
        ),
        None => "alpha and beta n/a (one rank: no communication)".into(),
    }
}

/// Seconds per parameter of the fused AdamW kernel (fp32 master, m, v; bf16 gradient and
/// working copy: what a mixed-precision rank streams), fastest of 3 over 4M parameters.
fn adam_rate() -> anyhow::Result<f64> {
    use zero_kernels::adamw::{self, AdamWCoeffs, AdamWHyper, AdamWState};
    use zero_kernels::{FloatSlice, HalfSliceMut};
    let n = 1 << 22;
    let (mut p, mut m, mut v) = (vec![0.1f32; n], vec![0f32; n], vec![0f32; n]);
    let g = vec![half::bf16::from_f32(0.01); n];
    let mut copy = vec![half::bf16::ZERO; n];
    let c = AdamWCoeffs::new(&AdamWHyper::default(), 1, 1.0, true)
        .map_err(|e| anyhow!("AdamW constants: {e}"))?;
    let exec = Exec::default();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t0 = Instant::now();
        let state = AdamWState {
            master: &mut p,
            m: &mut m,
            v: &mut v,
        };
        adamw::run(
            &exec,
            &c,
            FloatSlice::BF16(&g),
            state,
            Some(HalfSliceMut::BF16(&mut copy)),
        )
        .map_err(|e| anyhow!("timing AdamW: {e}"))?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(best / n as f64)
}

/// Alpha and beta of the link between `--world` ranks under the launcher: a reduce-scatter
/// sweep (`micro comm`), fitted as time = (N-1) alpha + bytes (N-1)/N / beta by least
/// squares over the sizes. `None` for one rank (nothing to measure).
fn probe_link(args: &TuneArgs) -> anyhow::Result<Option<(f64, f64)>> {
    let n = args.world;
    if n == 1 {
        return Ok(None);
    }
    let csv = args.out.join("probe-comm.csv");
    let mut words = launcher_words(&args.launcher, n)?;
    words.push(
        std::env::current_exe()
            .context("finding the zero-bench binary")?
            .display()
            .to_string(),
    );
    words.extend(
        [
            "micro",
            "comm",
            "--ops",
            "reduce_scatter",
            "--min-size",
            "4KiB",
            "--max-size",
            "16MiB",
            "--iters",
            "10",
            "--csv",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    words.push(csv.display().to_string());
    run_logged(
        &words,
        &csv.with_extension("log"),
        Duration::from_secs(args.timeout),
        "the communication probe",
    )?;
    let text =
        std::fs::read_to_string(&csv).with_context(|| format!("reading {}", csv.display()))?;
    // op,dtype,ranks,size_bytes,count,pairs,ours_us,...
    let pts: Vec<(f64, f64)> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Some((
                f.get(3)?.parse().ok()?,
                f.get(6)?.parse::<f64>().ok()? * 1e-6,
            ))
        })
        .collect();
    if pts.len() < 2 {
        bail!(
            "the communication probe wrote {} rows to {}",
            pts.len(),
            csv.display()
        );
    }
    // Bandwidth from the largest size (where latency is negligible), latency from the
    // smallest (less its bandwidth part): the two ends of time = (N-1) alpha +
    // bytes (N-1)/N / beta.
    let nf = n as f64;
    let (small, large) = (pts[0], pts[pts.len() - 1]);
    let beta = large.0 * (nf - 1.0) / nf / large.1.max(1e-12);
    let alpha = ((small.1 - small.0 * (nf - 1.0) / nf / beta) / (nf - 1.0)).max(0.0);
    Ok(Some((alpha, beta)))
}

/// A run's mean step time (after the warm-up step), from its `--json` report.
fn read_step_seconds(path: &Path) -> anyhow::Result<f64> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    v["stages"][0]["mean_step_seconds"]
        .as_f64()
        .ok_or_else(|| anyhow!("{} has no mean_step_seconds", path.display()))
}

/// How often prediction and measurement order the measured candidates alike.
#[derive(Debug, PartialEq)]
struct Concordance {
    /// Pairs ordered alike.
    agree: usize,
    /// Pairs both ordered strictly (the ones compared).
    pairs: usize,
    /// Pairs left out: predicted (or measured) equal, so neither agreeing nor not.
    tied: usize,
}

/// Whether two times are equal to within rounding (candidates differing only in what the
/// model does not see, as a bucket size at N = 1, predict the same time).
fn tie(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// [`Concordance`] over the candidates measured successfully.
fn concordance(c: &[&Candidate]) -> Concordance {
    let mut k = Concordance {
        agree: 0,
        pairs: 0,
        tied: 0,
    };
    for i in 0..c.len() {
        for j in i + 1..c.len() {
            let (Some(mi), Some(mj)) = (c[i].measured(), c[j].measured()) else {
                continue;
            };
            let (pi, pj) = (c[i].predicted_s, c[j].predicted_s);
            if tie(pi, pj) || tie(mi, mj) {
                k.tied += 1;
                continue;
            }
            k.pairs += 1;
            if (pi < pj) == (mi < mj) {
                k.agree += 1;
            }
        }
    }
    k
}

fn render(c: &[&Candidate], k: &Concordance) -> String {
    let mut o = String::new();
    // Ranks among the candidates that ran (a failed one has neither).
    let ran: Vec<&&Candidate> = c.iter().filter(|x| x.measured().is_some()).collect();
    let mut by_pred = ran.clone();
    by_pred.sort_by(|a, b| a.predicted_s.total_cmp(&b.predicted_s));
    let mut by_meas = ran.clone();
    by_meas.sort_by(|a, b| {
        a.measured()
            .unwrap_or(f64::INFINITY)
            .total_cmp(&b.measured().unwrap_or(f64::INFINITY))
    });
    let _ = writeln!(
        o,
        "{:<60} {:>11} {:>12} {:>11} {:>9} {:>9}",
        "candidate", "plan/rank", "predicted", "measured", "pred rank", "meas rank"
    );
    // 1 + how many that ran are strictly faster: equal times share a rank.
    let rank = |time: &dyn Fn(&Candidate) -> Option<f64>, cand: &Candidate| {
        let Some(mine) = cand.measured().and(time(cand)) else {
            return "-".to_string();
        };
        let faster = ran
            .iter()
            .filter_map(|x| time(x))
            .filter(|&t| t < mine && !tie(t, mine))
            .count();
        (faster + 1).to_string()
    };
    let failed = c.iter().filter(|x| x.failed.is_some());
    for cand in by_meas.iter().copied().chain(failed) {
        let measured = match cand.measured() {
            Some(m) => format!("{:>8.2} ms", m * 1e3),
            None => format!("{:>11}", "failed"),
        };
        let _ = writeln!(
            o,
            "{:<60} {:>11} {:>9.2} ms {} {:>9} {:>9}",
            format!(
                "{}{}",
                cand.label(),
                if cand.given { " (given)" } else { "" }
            ),
            human_bytes(cand.plan_bytes as f64),
            cand.predicted_s * 1e3,
            measured,
            rank(&|x| Some(x.predicted_s), cand),
            rank(&|x| x.measured(), cand)
        );
    }
    for cand in c.iter().filter(|x| x.failed.is_some()) {
        let _ = writeln!(
            o,
            "failed: {}: {}",
            cand.label(),
            cand.failed.as_deref().unwrap_or_default()
        );
    }
    if ran.is_empty() {
        let _ = writeln!(o, "no candidate ran successfully: nothing to compare");
        return o;
    }
    let tied = match k.tied {
        0 => String::new(),
        t => format!(" ({t} pair(s) with equal times left out)"),
    };
    let _ = writeln!(
        o,
        "predicted order matches the measured one for {} of {} pairs{tied}{}",
        k.agree,
        k.pairs,
        // Among candidates predicted equally fast, any one is "the predicted fastest".
        if by_meas.first().is_some_and(|m| {
            by_pred
                .first()
                .is_some_and(|p| tie(m.predicted_s, p.predicted_s))
        }) {
            "; the predicted fastest is the measured fastest"
        } else {
            "; the predicted fastest is not the measured fastest"
        }
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(predicted_ms: f64, measured_ms: &[f64]) -> Candidate {
        Candidate {
            stage: 1,
            micro_batch: 1,
            grad_accum: 1,
            bucket_elems: None,
            prefetch: 1,
            persistence_threshold: 0,
            given: false,
            plan_bytes: 1 << 20,
            predicted_s: predicted_ms * 1e-3,
            predicted_comm_s: 0.0,
            measured_s: measured_ms.iter().map(|m| m * 1e-3).collect(),
            failed: None,
        }
    }

    #[test]
    fn tied_predictions_are_left_out_of_the_pairs_not_counted_as_disagreements() {
        // Two predicted alike (a bucket size at N = 1), one slower; measured a < b < c.
        let (a, b, c) = (
            cand(10.0, &[10.0]),
            cand(10.0, &[11.0]),
            cand(20.0, &[30.0]),
        );
        let k = concordance(&[&a, &b, &c]);
        assert_eq!(
            k,
            Concordance {
                agree: 2,
                pairs: 2,
                tied: 1
            }
        );
        let text = render(&[&a, &b, &c], &k);
        let ranks: Vec<String> = text
            .lines()
            .skip(1)
            .take(3)
            .map(|l| {
                l.split_whitespace()
                    .rev()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        // (measured rank, predicted rank): a and b share the predicted first place.
        assert_eq!(ranks, ["1 1", "2 1", "3 3"], "{text}");
        assert!(
            text.contains("matches the measured one for 2 of 2 pairs (1 pair(s) with equal times left out); the predicted fastest is the measured fastest"),
            "{text}"
        );
        // The measured fastest is among those predicted fastest either way round.
        let b2 = cand(10.0, &[9.0]);
        assert!(render(&[&a, &b2, &c], &concordance(&[&a, &b2, &c]))
            .contains("the predicted fastest is the measured fastest"));
        // A strict disagreement still counts as one.
        let d = cand(5.0, &[40.0]);
        assert_eq!(
            concordance(&[&a, &d]),
            Concordance {
                agree: 0,
                pairs: 1,
                tied: 0
            }
        );
    }

    #[test]
    fn a_failed_candidate_is_a_row_with_its_reason_and_out_of_the_comparison() {
        let a = cand(10.0, &[12.0]);
        let mut f = cand(5.0, &[6.0]);
        f.failed = Some("round 2: ZeRO-1: the job failed: error: out of memory".into());
        assert_eq!(f.measured(), None);
        let k = concordance(&[&a, &f]);
        assert_eq!((k.agree, k.pairs, k.tied), (0, 0, 0));
        let text = render(&[&a, &f], &k);
        let rows: Vec<&str> = text.lines().collect();
        assert!(rows[1].contains("12.00 ms") && rows[1].trim_end().ends_with("1         1"));
        assert!(
            rows[2].contains("failed") && rows[2].trim_end().ends_with("-         -"),
            "{text}"
        );
        assert!(text.contains("failed: ZeRO-1 B=1 A=1 bucket=default: round 2: ZeRO-1: the job failed: error: out of memory"), "{text}");
        assert!(text.contains("for 0 of 0 pairs"), "{text}");
        let none = render(&[&f], &concordance(&[&f]));
        assert!(none.contains("no candidate ran successfully"), "{none}");
    }

    #[test]
    fn a_global_batch_past_usize_is_an_error_naming_the_product_not_a_wrapped_number() {
        assert_eq!(global_batch_of(4, 2, 3).unwrap(), 24);
        let e = global_batch_of(1_000_000, 1, 100_000_000_000_000)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "the global batch --world x train.grad_accum x train.micro_batch = 1000000 x 1 \
                 x 100000000000000 is more than {} sequences: lower train.micro_batch or \
                 train.grad_accum (--set train.micro_batch=B), or give --global-batch",
                usize::MAX
            )
        );
        // The first product alone may overflow too.
        assert!(global_batch_of(usize::MAX, 2, 1).is_err());
        // With --global-batch, a configuration whose A x B overflows is not the given
        // point (rather than wrapping into a match or panicking).
        let mut base = Config::default();
        base.train.micro_batch = usize::MAX / 2;
        base.train.grad_accum = 4;
        let c = enumerate(&base, 8).unwrap();
        assert!(!c.is_empty() && c.iter().all(|c| !c.given));
    }

    #[test]
    fn an_unmeasured_link_is_na_not_infinite() {
        assert_eq!(
            link_text(None),
            "alpha and beta n/a (one rank: no communication)"
        );
        assert_eq!(
            link_text(Some((2e-6, 3.5e9))),
            "alpha 2.0 us per ring step, beta 3.50 GB/s per rank"
        );
    }

    fn tune_args(set: &[&str], world: usize, steps: usize) -> TuneArgs {
        TuneArgs {
            config: None,
            set: set.iter().map(|s| s.to_string()).collect(),
            world,
            global_batch: None,
            mem_limit: None,
            mem_headroom: 0.1,
            top: 1,
            steps,
            rounds: 1,
            launcher: "unused {n}".into(),
            out: PathBuf::from("/nonexistent"),
            timeout: 1,
            ranks_per_node: None,
            cores_per_node: Some(1),
        }
    }

    /// The configurations candidate `c`'s measured run loads (one: no stage list).
    fn run_config(args: &TuneArgs, base: &Config, c: &Candidate) -> anyhow::Result<Config> {
        let words = train_words(args, base, c, Path::new("/nonexistent/r.json"), false);
        let run = crate::sweep::child::train_configs(&words)?;
        assert_eq!(run.configs.len(), 1);
        Ok(run.configs[0].1.config.clone())
    }

    const TINY: [&str; 3] = [
        "model.preset=tiny",
        "model.vocab_size=64",
        "train.seq_len=8",
    ];

    #[test]
    fn a_default_bucket_candidate_runs_the_default_bucket_not_the_files() {
        // The configuration sets its own bucket; "bucket=default" is the library's
        // default at N (what the plan, the prediction and best.toml have), and so is the
        // measured run's.
        for world in [1, 512] {
            let args = tune_args(&[&TINY[..], &["zero.bucket_elems=1000"]].concat(), world, 6);
            let base = load(None, &args.set).unwrap().config;
            let cands = enumerate(&base, 4).unwrap();
            let default = cands.iter().find(|c| c.bucket_elems.is_none()).unwrap();
            assert!(default.label().contains("bucket=default"));
            let ran = run_config(&args, &base, default).unwrap();
            let written = default.apply(&base);
            assert_eq!(
                written.zero.bucket_elems, None,
                "best.toml leaves the key out"
            );
            assert_eq!(
                ran.zero.bucket_elems_for(world),
                written.zero.bucket_elems_for(world),
                "N = {world}"
            );
            assert_ne!(ran.zero.bucket_elems_for(world), 1000);
            // The given one keeps the file's, and a chosen size is that size.
            let given = cands.iter().find(|c| c.given).unwrap();
            assert_eq!(
                run_config(&args, &base, given).unwrap().zero.bucket_elems,
                Some(1000)
            );
            let sized = cands
                .iter()
                .find(|c| c.bucket_elems == Some(1 << 20))
                .unwrap();
            assert_eq!(
                run_config(&args, &base, sized).unwrap().zero.bucket_elems,
                Some(1 << 20)
            );
        }
    }

    #[test]
    fn a_warmup_longer_than_the_measured_steps_keeps_the_configurations_schedule() {
        let set = [
            &TINY[..],
            &[
                "train.steps=1000",
                "optim.schedule=\"warmup_cosine\"",
                "optim.warmup_steps=100",
            ],
        ]
        .concat();
        let args = tune_args(&set, 1, 6);
        let base = load(None, &args.set).unwrap().config;
        for c in enumerate(&base, 4).unwrap() {
            let ran = run_config(&args, &base, &c)
                .unwrap_or_else(|e| panic!("{}: {}", c.label(), crate::logging::chain(&e)));
            assert_eq!(ran.train.steps, 6);
            // The schedule is the configuration's: warmup 100, cosine to step 1000.
            assert_eq!(ran.engine().optim, base.engine().optim);
            // best.toml is the configuration's, with no horizon of tune's.
            assert_eq!(c.apply(&base).optim.decay_steps, None);
        }
        // A horizon the configuration gives is left to it.
        let mut given = set.clone();
        given.push("optim.decay_steps=500");
        let args = tune_args(&given, 1, 6);
        let base = load(None, &args.set).unwrap().config;
        assert!(measurement_overrides(&base).is_empty());
        let c = &enumerate(&base, 4).unwrap()[0];
        assert_eq!(
            run_config(&args, &base, c).unwrap().optim.decay_steps,
            Some(500)
        );
    }

    #[test]
    fn candidates_the_configuration_rules_out_are_dropped_saying_why() {
        let set = [
            &TINY[..],
            &["zero.stage=3", "zero.hierarchical_weights=true"],
        ]
        .concat();
        let args = tune_args(&set, 1, 2);
        let base = load(None, &args.set).unwrap().config;
        let all = enumerate(&base, 4).unwrap();
        let below3 = all.iter().filter(|c| c.stage < 3).count();
        assert!(below3 > 0);
        let (kept, line) = drop_invalid(&args, &base, all.clone());
        assert_eq!(kept.len(), all.len() - below3);
        assert!(kept.iter().all(|c| c.stage == 3) && kept.iter().any(|c| c.given));
        let line = line.unwrap();
        assert!(
            line.starts_with(&format!("{below3} of {} candidates dropped", all.len())),
            "{line}"
        );
        assert!(
            line.contains("stage 2 gathers none") && line.contains("set zero.stage = 3"),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1, "{line}");
        // A configuration that allows every candidate drops none.
        let args = tune_args(&TINY, 1, 2);
        let base = load(None, &args.set).unwrap().config;
        let all = enumerate(&base, 4).unwrap();
        let (kept, line) = drop_invalid(&args, &base, all.clone());
        assert_eq!((kept.len(), line), (all.len(), None));
    }

    #[test]
    fn rates_are_measured_for_a_llama_as_for_a_gpt() {
        for preset in ["llama-tiny", "tiny"] {
            let mut base = Config::default();
            base.model.preset = Some(preset.into());
            base.train.seq_len = 8;
            let mut c = cand(0.0, &[]);
            c.micro_batch = 2;
            let plan = budget::plan(&c.apply(&base), 1, 0).unwrap();
            let args = tune_args(&[], 1, 2);
            let rates = measure_rates(&args, &base, &[(c, plan)]).unwrap();
            assert_eq!(rates.fwd_bwd_s.len(), 1, "{preset}");
            assert!(rates.fwd_bwd_s[0].1 > 0.0, "{preset}");
            assert!(rates.link.is_none());
        }
    }
}
