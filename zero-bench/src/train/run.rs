//! One training run at one stage: a fresh model and engine, the configured steps, and
//! what the stage table needs (losses, mean step time, per-rank ledger totals and peak
//! RSS gathered to every rank). Everything here is collective: every rank calls it with
//! the same configuration and returns the same result (rank 0 prints and writes).

use std::path::Path;

use crate::config::{Config, LoadedConfig};
use anyhow::{anyhow, Context};
use zero_comm::{Communicator, ReduceOp};
use zero_core::checkpoint::{self, SaveOptions};
use zero_core::ledger::{CommPlan, MemCategory, PaperFormula};
use zero_core::Engine;
use zero_kernels::device::HostDevice;
use zero_kernels::Exec;
use zero_models::data::Tokens;
use zero_models::{Gpt, GptConfig};

use super::data::Batches;
use super::init_from::{self, InitFile};
use super::launch::{agree, Failure};
use super::metrics::Metrics;
use super::progress::Progress;
use super::report::{self, StageResult};
use super::rss;

/// The ledger categories the paper's formula counts (padding belongs to them).
const STATE_CATEGORIES: [MemCategory; 6] = [
    MemCategory::Params,
    MemCategory::Grads,
    MemCategory::Master,
    MemCategory::AdamM,
    MemCategory::AdamV,
    MemCategory::Padding,
];

/// The model shape of a validated configuration.
pub fn gpt_config(config: &Config) -> anyhow::Result<GptConfig> {
    let g = config.gpt().map_err(|e| anyhow!(e))?;
    g.validate().context("model")?;
    Ok(g)
}

/// What every stage shares.
pub struct Shared<'a> {
    /// Token source.
    pub tokens: &'a Tokens,
    /// `--init-from`, opened and checked.
    pub init: Option<&'a InitFile>,
    /// `--save-model` (this run writes it).
    pub save_model: Option<&'a Path>,
    /// `--ckpt-dir`, `--save-every`, `--keep-last`, `--resume`.
    pub checkpoints: Checkpoints<'a>,
    /// GEMM threads per rank.
    pub threads: usize,
    /// No progress bar.
    pub plain: bool,
    /// A repeat round (`--rounds`): print no ledger and no progress.
    pub quiet: bool,
}

/// Where and when to save and resume sharded checkpoints.
#[derive(Clone, Copy, Debug)]
pub struct Checkpoints<'a> {
    /// Root directory (`--ckpt-dir`).
    pub dir: Option<&'a Path>,
    /// Save every this many steps and after the last (0: never).
    pub every: u64,
    /// Checkpoints kept.
    pub keep_last: usize,
    /// Resume from this root or step directory.
    pub resume: Option<&'a Path>,
}

/// Gather one number per rank to every rank, in rank order.
fn gather_u64<C: Communicator>(comm: &C, x: u64) -> anyhow::Result<Vec<u64>> {
    let mine = [x as i64];
    let mut all = vec![0i64; comm.size()];
    comm.all_gather(&mine[..], &mut all[..])
        .context("gathering per-rank figures")?;
    Ok(all.into_iter().map(|v| v.max(0) as u64).collect())
}

/// Train `loaded.config` from scratch (or from `--init-from`). Set-up errors (the same
/// on every rank, or agreed on) come back as a [`Failure`]; errors during training abort
/// the job from the rank that hit them (another rank may be inside a collective).
pub fn train<C: Communicator>(
    comm: &C,
    loaded: &LoadedConfig,
    shared: &Shared<'_>,
    metrics: &mut Option<Metrics>,
) -> Result<StageResult, Failure> {
    let (rank, world) = (comm.rank(), comm.size());
    let config = &loaded.config;
    let stage = config.zero.stage;
    let t = &config.train;
    rss::reset_peak();

    // Set-up: device, model, engine (allocates exactly the plan), initial weights. The
    // device is the CPU, its GEMMs on --threads threads.
    let dev = HostDevice::with_exec(Exec::default(), shared.threads);
    let setup = (|| -> anyhow::Result<_> {
        let gpt = gpt_config(config)?;
        let model =
            Gpt::<HostDevice, f32>::new(&dev, gpt, t.micro_batch).context("building the model")?;
        let engine =
            Engine::new(&config.engine(), comm, &dev, &model).context("creating the engine")?;
        let batches = Batches::new(config, world, rank)?;
        Ok((model, engine, batches))
    })();
    let (mut model, mut engine, mut batches) = agree(comm, setup)?;
    if let Some(init) = shared.init {
        // Reads are checked on every rank before this (InitFile::open), so a failure here
        // is an I/O error mid-way: agree, since finish_import's gathers follow.
        let load = init.load_into(&mut engine);
        agree(comm, load)?;
        if rank == 0 && !shared.quiet {
            log::info!(
                "{stage}: weights loaded from {} (optimizer state fresh)",
                init.path().display()
            );
        }
    }

    if let Some(from) = shared.checkpoints.resume {
        // Collective; an error is returned on every rank (CheckpointError::Peer elsewhere).
        let info = checkpoint::load(&mut engine, from)
            .with_context(|| format!("resuming from {}", from.display()));
        let info = agree(comm, info)?;
        if rank == 0 && !shared.quiet {
            log::info!(
                "{stage}: resumed from {} at step {} (saved by {} rank(s) at {}, {})",
                from.display(),
                info.meta.step,
                info.meta.world,
                info.meta.stage,
                if info.meta.world == world && info.meta.stage == stage {
                    "same layout"
                } else {
                    "resharded on load"
                }
            );
        }
    }

    match run_steps(
        comm,
        loaded,
        shared,
        metrics,
        &mut model,
        &mut engine,
        &mut batches,
    ) {
        Ok(r) => Ok(r),
        Err(e) => zero_comm::abort(&format!("error: {e:#}"), 1),
    }
}

fn run_steps<C: Communicator>(
    comm: &C,
    loaded: &LoadedConfig,
    shared: &Shared<'_>,
    metrics: &mut Option<Metrics>,
    model: &mut Gpt<HostDevice, f32>,
    engine: &mut Engine<'_, HostDevice, C>,
    batches: &mut Batches,
) -> anyhow::Result<StageResult> {
    let (rank, world) = (comm.rank(), comm.size());
    let config = &loaded.config;
    let stage = config.zero.stage;
    let steps = config.train.steps;

    // The ledger, from the allocations, next to the formula (rank 0 prints).
    let memory = engine.memory();
    let totals = gather_u64(comm, memory.values().sum())?;
    let states = gather_u64(
        comm,
        STATE_CATEGORIES
            .iter()
            .map(|c| memory.get(c).copied().unwrap_or(0))
            .sum(),
    )?;
    let plan = engine.plan().clone();
    let comm_plan = CommPlan::new(engine.layout(), &plan, config.train.grad_accum);
    if rank == 0 && !shared.quiet {
        println!("\n=== {stage}: {steps} steps on {world} rank(s) ===");
        print!("{}", report::ledger(&plan, &totals));
        print!("{}", report::comm(&comm_plan, &plan));
    }

    let progress = Progress::new(
        rank == 0 && !shared.quiet,
        shared.plain,
        &stage.to_string(),
        steps,
        config.train.log_every,
    );
    let mut losses = Vec::with_capacity(steps);
    let mut seconds = Vec::with_capacity(steps);
    let mut sent = 0u64;
    let t = &config.train;
    let tokens_per_step = (world * t.grad_accum * t.micro_batch * t.seq_len) as u64;
    // What the checkpoint metadata records of this tool's own configuration.
    let app_config = toml::to_string(config).ok();
    let ckpt = shared.checkpoints;
    for s in engine.steps_done()..steps as u64 {
        let b = batches.fill(shared.tokens, s)?;
        let r = engine
            .step(model, &b)
            .with_context(|| format!("{stage} step {s}"))?;
        let done = s + 1;
        if let Some(dir) = ckpt.dir {
            if ckpt.every > 0 && (done % ckpt.every == 0 || done == steps as u64) {
                let opts = SaveOptions {
                    keep_last: ckpt.keep_last,
                    app_config: app_config.as_deref(),
                    ..Default::default()
                };
                // Every rank gets the same outcome. A failed save loses nothing: the
                // previous checkpoint and `latest` are untouched, so training goes on.
                match checkpoint::save(engine, dir, &opts) {
                    Ok(path) if rank == 0 => log::info!("checkpoint {}", path.display()),
                    Ok(_) => {}
                    Err(e) if rank == 0 => log::error!(
                        "checkpoint after step {done} failed: {e}; training goes on, the previous checkpoint is intact"
                    ),
                    Err(_) => {}
                }
            }
        }
        if let Some(m) = metrics.as_mut() {
            m.write(stage.number(), &r, tokens_per_step)?;
        }
        progress.step(&r, tokens_per_step);
        losses.push(r.loss);
        seconds.push(r.seconds);
        sent += r.comm.total().bytes_sent;
    }
    progress.finish();

    // Mean step time without the warm-up step, the slowest rank's.
    let timed = if seconds.len() > 1 {
        &seconds[1..]
    } else {
        &seconds[..]
    };
    let mut mean = [timed.iter().sum::<f64>() / timed.len().max(1) as f64];
    comm.all_reduce(&mut mean[..], ReduceOp::Max)
        .context("agreeing on the step time")?;
    let peak = gather_u64(comm, rss::peak_bytes().unwrap_or(0))?;

    if let Some(path) = shared.save_model {
        let values = engine
            .full_master_f32()
            .context("gathering the final weights")?;
        if rank == 0 {
            init_from::save(path, engine.layout(), &values, engine.steps_done())?;
            log::info!("final weights written to {}", path.display());
        }
    }

    let formula = PaperFormula::new(stage, plan.numel, world).total().to_f64();
    Ok(StageResult {
        stage: stage.number(),
        steps,
        final_loss: losses.last().copied().unwrap_or(f64::NAN),
        losses,
        tokens_per_step,
        mean_step_seconds: mean[0],
        round_step_seconds: vec![mean[0]],
        tokens_per_s: tokens_per_step as f64 / mean[0].max(f64::MIN_POSITIVE),
        step_time_ratio_to_stage0: None,
        ratio_target: None,
        ledger_bytes_per_rank: totals,
        state_bytes_per_rank: states,
        formula_bytes_per_rank: formula,
        peak_rss_bytes_per_rank: peak,
        comm_sent_bytes_per_step: sent / steps.max(1) as u64,
        comm_plan_bytes_per_step: comm_plan.sent_bytes(),
    })
}
