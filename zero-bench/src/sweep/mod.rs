//! `zero-bench sweep`: scaling sweeps over (N, stage, model, precision, accumulation).
//!
//! - `sweep run` launches one job per (N, model, precision, A) point through a launcher
//!   template (`scripts/mpirun.sh {n}`, `srun --mpi=pmix -n {n}`; `{N}` works too);
//!   each job runs every listed stage (`train --stages ... --json`) and leaves one
//!   result file per point;
//! - `sweep collect DIR` reads the result files a `sweep run` or slurm/sweep.sbatch left.
//!
//! Both then write `sweep.csv`, `sweep.json` and the plots (`memory`, `throughput`,
//! `comm`, each `.png` and `.svg`) into the output directory. A stage that did not
//! finish is a failed row of the table (with why), left out of the plots. Results:
//! point.rs (names), launch.rs (jobs), table.rs (rows), plot.rs (figures).

pub(crate) mod child;
pub mod launch;
mod plot;
mod point;
mod table;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};

use crate::config::load;
use crate::logging::{out, outln};
use point::Resolved;
use table::Row;

/// `zero-bench sweep` subcommands.
#[derive(Subcommand, Debug)]
pub enum SweepCommand {
    /// Run one job per (N, model, precision, A) point, every stage in each, then write
    /// the table and plots.
    Run(Box<RunArgs>),
    /// Gather the per-point result files in DIR (from `sweep run` or slurm/sweep.sbatch)
    /// into the table and plots.
    Collect(CollectArgs),
    /// Print the labels a configuration gives the dimensions a sweep leaves to it:
    /// `<model> <precision> <grad_accum>` (slurm/sweep.sbatch names its files with them).
    Resolve(ResolveArgs),
}

/// Options of `sweep resolve`.
#[derive(Args, Debug)]
pub struct ResolveArgs {
    /// Training configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Configuration override (as train --set), repeatable.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
}

/// Options of `sweep run`.
#[derive(Args, Debug)]
#[command(after_long_help = RUN_EXAMPLES)]
pub struct RunArgs {
    /// World sizes to run (the smallest is the base of the scaling efficiency: a series
    /// whose run there failed has none).
    #[arg(long, value_name = "LIST", value_delimiter = ',', required = true)]
    pub ranks: Vec<usize>,
    /// ZeRO stages each job runs in turn (train --stages).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "0,1,2,3"
    )]
    pub stages: Vec<u8>,
    /// Model presets (tiny, small, gpt2-124m, ...), each with its own dimensions (train
    /// --model: over the configuration's); default: the configuration's model.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub models: Vec<String>,
    /// Precisions (fp32, bf16, fp16); default: the configuration's.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub precisions: Vec<String>,
    /// Gradient accumulation steps; default: the configuration's.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub grad_accum: Vec<usize>,
    /// How to start N ranks: a command whose {N} is replaced by the world size ({N} and
    /// its lower-case form are both accepted), split at whitespace; `zero-bench train
    /// ...` follows it.
    #[arg(long, value_name = "TEMPLATE", default_value = "scripts/mpirun.sh {n}")]
    pub launcher: String,
    /// Training configuration file for every job (train --config).
    #[arg(long, value_name = "FILE", value_parser = crate::config::utf8_path)]
    pub config: Option<PathBuf>,
    /// Optimizer steps per stage (train --steps); the first is warm-up, not timed when
    /// there are others (with 1, the time is the warm-up step's).
    #[arg(long, value_name = "N")]
    pub steps: Option<usize>,
    /// Configuration override for every job (train --set), repeatable.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// Kernel threads per rank (train --threads), the same at every N so that the points
    /// compare (`auto`: what train's default gives each job, which may differ with N).
    #[arg(long, value_name = "K|auto", default_value = "1", value_parser = crate::train::parse_threads)]
    pub threads: crate::train::ThreadsSetting,
    /// Directory for the result files, job logs, table and plots.
    #[arg(long, value_name = "DIR", default_value = "sweep-out", value_parser = crate::config::utf8_path)]
    pub out: PathBuf,
    /// Stop a job (one point, all its stages) that runs longer than this many seconds:
    /// SIGTERM to the launcher, then SIGKILL to it and its ranks 10 s later (the stages
    /// it finished stay in the table).
    #[arg(long, value_name = "SECONDS", default_value_t = 1800,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
}

/// Options of `sweep collect`.
#[derive(Args, Debug)]
pub struct CollectArgs {
    /// Directory holding the per-point files `n<N>_<model>_<precision>_a<A>.json`.
    pub dir: PathBuf,
    /// Where to write the table and plots (default: DIR).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Table only these points (`n<N>_<model>_<precision>_a<A>`, comma-separated): one
    /// sweep's in a directory that holds other sweeps' results too (slurm/sweep.sbatch
    /// passes its own). A listed point without a result file is a failed row per stage
    /// (those of --stages, else those the other points' runs were asked for).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub points: Vec<String>,
    /// The stages the listed points' jobs were asked for (comma-separated, as `sweep run
    /// --stages`): the failed rows of a point without a result file, known even where no
    /// listed point left one (slurm/sweep.sbatch passes its STAGES).
    #[arg(long, value_name = "LIST", value_delimiter = ',', requires = "points")]
    pub stages: Vec<u8>,
}

const RUN_EXAMPLES: &str = "\
Examples:
  # 1, 2 and 4 ranks on this machine, all stages, the tiny preset:
  zero-bench sweep run --ranks 1,2,4 --config configs/tiny.toml --out sweep-tiny

  # Inside a Slurm allocation (salloc -N 2 --ntasks-per-node=4), two models, bf16:
  zero-bench sweep run --ranks 1,2,4,8 --models small,gpt2-124m --precisions bf16 \\
      --config configs/demo.toml --launcher \"srun --mpi=pmix --kill-on-bad-exit=1 -n {N}\"

  # Redraw the table and plots of an earlier sweep (or of slurm/sweep.sbatch's output):
  zero-bench sweep collect sweep-tiny";

/// Run a `sweep` subcommand.
pub fn run(cmd: SweepCommand) -> anyhow::Result<()> {
    crate::logging::init(None);
    match cmd {
        SweepCommand::Run(args) => run_sweep(&args),
        SweepCommand::Collect(args) => {
            check_stages(&args.stages)?;
            let found = table::collect(&args.dir, &args.points, &args.stages)?;
            let bad = found.unreadable.len();
            if found.rows.is_empty() {
                bail!(
                    "no readable result file in {}:\n  {}",
                    args.dir.display(),
                    found.unreadable.join("\n  ")
                );
            }
            write_outputs(&found.rows, args.out.as_deref().unwrap_or(&args.dir))?;
            let mut problems = Vec::new();
            if bad > 0 {
                problems.push(format!(
                    "{bad} result file(s) could not be read (the table has the others):\n  {}",
                    found.unreadable.join("\n  ")
                ));
            }
            if !found.missing.is_empty() {
                problems.push(format!(
                    "{} point(s) have no result file (failed rows in the table):\n  {}",
                    found.missing.len(),
                    found.missing.join("\n  ")
                ));
            }
            if !found.incomplete.is_empty() {
                problems.push(format!(
                    "{} point(s) stopped before their last stage (the table has the stages that \
                     finished and marks the others failed):\n  {}",
                    found.incomplete.len(),
                    found.incomplete.join("\n  ")
                ));
            }
            if !problems.is_empty() {
                bail!("{}", problems.join("\n"));
            }
            Ok(())
        }
        SweepCommand::Resolve(args) => {
            let r = Resolved::of(&load(args.config.as_deref(), &args.set)?.config)?;
            outln!("{} {} {}", r.model, r.precision, r.grad_accum);
            Ok(())
        }
    }
}

/// `--stages` holds ZeRO stages, each once.
fn check_stages(stages: &[u8]) -> anyhow::Result<()> {
    if let Some(s) = stages.iter().find(|&&s| s > 3) {
        bail!("--stages contains {s}: ZeRO stages are 0, 1, 2 and 3");
    }
    // A stage listed twice would run twice in every job, two rows of one (N, stage).
    point::no_repeats(stages, "--stages", "stage")
}

fn run_sweep(args: &RunArgs) -> anyhow::Result<()> {
    check_stages(&args.stages)?;
    if args.stages.is_empty() {
        bail!("--stages is empty: give the stages each job runs, e.g. --stages 0,1,2,3");
    }
    // Check the launcher before creating or starting anything.
    launch::launcher_words(&args.launcher, 1)?;
    let mut train_args = Vec::new();
    if let Some(c) = &args.config {
        train_args.extend(["--config".to_string(), c.display().to_string()]);
    }
    let stages: Vec<String> = args.stages.iter().map(|s| s.to_string()).collect();
    train_args.extend(["--stages".to_string(), stages.join(",")]);
    if let Some(s) = args.steps {
        train_args.extend(["--steps".to_string(), s.to_string()]);
    }
    train_args.extend(["--threads".to_string(), args.threads.to_string()]);
    // The metrics file the configuration names, with the user's --set: each job then
    // writes its own beside its result (below), given by --metrics.
    let metrics_file = load(args.config.as_deref(), &args.set)
        .ok()
        .and_then(|l| l.config.train.metrics_file);
    // A --set of a key the jobs' own flags give is left out: the flag would win over it
    // anyway (--stages, --steps, the point's --model, --precision, --grad-accum, and
    // --metrics where the configuration names a metrics file), and each job would warn.
    let given_by_flags = |key: &str| match key {
        "zero.stage" => true,
        "train.metrics_file" => metrics_file.is_some(),
        "train.steps" => args.steps.is_some(),
        "model.preset" => !args.models.is_empty(),
        "precision.dtype" => !args.precisions.is_empty(),
        "train.grad_accum" => !args.grad_accum.is_empty(),
        _ => false,
    };
    for s in args
        .set
        .iter()
        .filter(|s| !given_by_flags(crate::train::set_key(s)))
    {
        train_args.extend(["--set".to_string(), s.clone()]);
    }
    train_args.push("--no-progress".into());
    let checked = check_points(args, &train_args)?;
    let points = checked.points;
    let config = &checked.config;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating the output directory {}", args.out.display()))?;
    let program = std::env::current_exe().context("finding the zero-bench binary")?;
    let job = launch::Job {
        launcher: &args.launcher,
        program: &program,
        train_args: &train_args,
        dir: &args.out,
        timeout: Duration::from_secs(args.timeout),
        // The configuration's metrics file is the user's: every job would truncate it
        // and write its own steps over the one before. Each job writes its own beside
        // its result instead (kept, not dropped: the user asked for the step lines).
        own_metrics: metrics_file.is_some() || config.train.metrics_file.is_some(),
    };
    if let Some(m) = metrics_file.as_ref().or(config.train.metrics_file.as_ref()) {
        eprintln!(
            "[sweep] train.metrics_file {m:?} is left as it is: each point's job writes its steps to {}",
            args.out.join("<point>.metrics.jsonl").display()
        );
    }
    // The table and plots of an earlier sweep into this directory go now: one left
    // beside this run's result files (this run failing or stopped before its own table)
    // would contradict them.
    remove_outputs(&args.out)?;
    // This run's points only: result files of other sweeps in the same directory are
    // left out (`sweep collect` reads them all).
    let mut outcomes: Vec<table::Outcome> = Vec::new();
    let mut failed = Vec::new();
    for (i, p) in points.iter().enumerate() {
        eprintln!("[sweep {}/{}] {p}", i + 1, points.len());
        let file = job.result_path(p);
        // A launcher that exits 0 is not the last word: its job's report may say that it
        // stopped (a wrapper that loses the status, srun after some launch failures).
        let ended = job.run(p).and_then(|()| match table::stopped_in(&file) {
            Ok(None) => Ok(()),
            Ok(Some(why)) => {
                bail!("{p}: the launcher exited 0, but the job's report says it stopped: {why}")
            }
            Err(e) => Err(e.context(format!(
                "{p}: the launcher exited 0, but its report cannot be read"
            ))),
        });
        match ended {
            Ok(()) => outcomes.push(table::Outcome {
                file,
                failure: None,
            }),
            // Ctrl-C, SIGTERM, SIGHUP or SIGQUIT: the job was stopped; the sweep stops
            // with it, after tabling what finished (the stopped point's finished stages
            // too: train rewrites its report after each).
            Err(e) if e.is::<launch::Interrupted>() => {
                let stopped = e.downcast_ref::<launch::Interrupted>();
                let finished = stopped.is_some_and(|i| i.finished);
                let signal = stopped.map_or("a signal", |i| i.signal);
                outcomes.push(table::Outcome {
                    file,
                    failure: (!finished).then(|| format!("interrupted by {signal}")),
                });
                let tabled = match table::rows_from(&outcomes, &args.stages) {
                    Ok(rows) if rows.iter().any(table::Row::finished) => {
                        write_outputs(&rows, &args.out).map(|()| {
                            format!(
                                "the table has the stages that finished ({})",
                                args.out.display()
                            )
                        })
                    }
                    Ok(_) => Ok("no stage finished".to_string()),
                    Err(e) => Err(e),
                };
                let tabled = tabled.unwrap_or_else(|w| {
                    format!(
                        "tabling what finished failed: {}",
                        crate::logging::chain(&w)
                    )
                });
                return Err(e.context(format!(
                    "sweep interrupted at point {} of {} ({} point(s) finished; {tabled})",
                    i + 1,
                    points.len(),
                    outcomes.iter().filter(|o| o.failure.is_none()).count(),
                )));
            }
            Err(e) => {
                let why = crate::logging::chain(&e);
                eprintln!("[sweep] {why}");
                // The row names the point; its reason need not repeat it.
                let own = why
                    .strip_prefix(&format!("{p}: "))
                    .unwrap_or(&why)
                    .to_string();
                outcomes.push(table::Outcome {
                    file,
                    failure: Some(own),
                });
                failed.push(why);
            }
        }
    }
    let rows = table::rows_from(&outcomes, &args.stages)?;
    let finished = rows.iter().filter(|r| r.finished()).count();
    if finished == 0 {
        // The failed rows still make the table (no plots): it says what failed where.
        write_outputs(&rows, &args.out)?;
        bail!("every point failed:\n  {}", failed.join("\n  "));
    }
    write_outputs(&rows, &args.out)?;
    if !failed.is_empty() {
        bail!(
            "{} of {} point(s) failed (the table has the {finished} stage(s) that finished \
             and marks the others failed):\n  {}",
            failed.len(),
            points.len(),
            failed.join("\n  ")
        );
    }
    Ok(())
}

/// Remove the table and plots a sweep writes into `out`, where there are any.
fn remove_outputs(out: &Path) -> anyhow::Result<()> {
    let mut names = vec!["sweep.csv".to_string(), "sweep.json".to_string()];
    names.extend(plot_files());
    for name in names {
        let path = out.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("removing the earlier {}", path.display()))
            }
        }
    }
    Ok(())
}

/// The plots' file names.
fn plot_files() -> Vec<String> {
    plot::NAMES
        .iter()
        .flat_map(|n| [format!("{n}.png"), format!("{n}.svg")])
        .collect()
}

/// The points of a sweep, each checked as its job will run it.
struct Checked {
    /// Every point, labelled by what its job trains.
    points: Vec<point::Point>,
    /// The first point's configuration (at its first stage): what the configuration
    /// gives every point (its metrics file).
    config: crate::config::Config,
}

/// Load every point's configurations from the job's own `train` arguments (`train_args`,
/// common to all, then the point's flags), before any job starts: a point whose job
/// could only fail (a configuration invalid at one of its stages, its `--steps`, its
/// model, precision or accumulation) refuses the sweep, naming the point and why. The
/// labels of the dimensions left to the configuration are its values as the jobs have
/// them; a `--models` point whose `--set model.KEY` changes the preset's dimensions is
/// labelled by the dimensions it trains, not by the preset's name.
fn check_points(args: &RunArgs, train_args: &[String]) -> anyhow::Result<Checked> {
    let matrix = |resolved: &Resolved| {
        point::matrix(
            &args.ranks,
            &args.models,
            &args.precisions,
            &args.grad_accum,
            resolved,
        )
    };
    // The same points in the same order whatever the labels: the flags are the lists'.
    let mut unlabelled = matrix(&Resolved::unresolved())?;
    for p in unlabelled.iter_mut().filter(|p| p.from_config.grad_accum) {
        p.grad_accum = None;
    }
    let runs: Vec<anyhow::Result<child::ChildRun>> = unlabelled
        .iter()
        .map(|p| {
            let mut words = train_args.to_vec();
            words.extend(p.train_flags());
            child::train_configs(&words)
        })
        .collect();
    let first = runs
        .iter()
        .find_map(|r| r.as_ref().ok())
        .and_then(|r| r.configs.first())
        .map(|(_, loaded)| loaded.config.clone());
    // Named by the configuration's values as a point's job has them; where no point's
    // loads, as the bare configuration has them if it loads (else "config").
    let labels = match &first {
        Some(c) => Some(Resolved::of(c)?),
        None => load(args.config.as_deref(), &args.set)
            .ok()
            .and_then(|l| Resolved::of(&l.config).ok()),
    };
    let mut points = match &labels {
        Some(r) => matrix(r)?,
        None => unlabelled,
    };
    let mut bad = Vec::new();
    for (p, run) in points.iter_mut().zip(&runs) {
        match run {
            Ok(run) => p.label_model_as_trained(run)?,
            Err(e) => bad.push(format!("{p}: {}", crate::logging::chain(e))),
        }
    }
    if !bad.is_empty() {
        bail!(
            "{} of {} point(s) cannot run (nothing was started):\n  {}",
            bad.len(),
            points.len(),
            bad.join("\n  ")
        );
    }
    // Two presets changed into the same dimensions would be one point twice.
    for (i, p) in points.iter().enumerate() {
        if let Some(q) = points[..i].iter().find(|q| q.file_name() == p.file_name()) {
            bail!(
                "--models: the points {q} and {p} train the same model ({}: the --set \
                 model.KEY overrides give both the same dimensions) and would write the same \
                 result file; list each model once",
                p.model
            );
        }
    }
    let config = first.context("no point to run")?;
    Ok(Checked { points, config })
}

/// Write `sweep.csv`, `sweep.json` and the plots (of the finished rows; none, and no
/// earlier ones left, when no row finished) into `out`, print the table, and warn of
/// rows whose steps were skipped.
fn write_outputs(rows: &[Row], out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("creating the output directory {}", out.display()))?;
    let csv = out.join("sweep.csv");
    crate::outfile::write_text(&csv, &table::csv(rows))?;
    let json = out.join("sweep.json");
    let text = serde_json::to_string_pretty(rows).context("serialising the sweep table")?;
    crate::outfile::write_text(&json, &text)?;
    out!("{}", table::text(rows));
    outln!("table: {} {}", csv.display(), json.display());
    if rows.iter().any(Row::finished) {
        let plots = plot::write_all(rows, out)?;
        let names: Vec<String> = plots.iter().map(|p| p.display().to_string()).collect();
        outln!("plots: {}", names.join(" "));
    } else {
        for name in plot_files() {
            let _ = std::fs::remove_file(out.join(name));
        }
        outln!("plots: none (no stage finished)");
    }
    for w in table::skipped_warnings(rows) {
        log::warn!("{w}");
    }
    Ok(())
}
