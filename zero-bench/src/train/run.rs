//! One training run at one stage: a fresh model and engine, the configured steps, and
//! what the stage table needs (losses, mean step time, per-rank ledger totals and peak
//! RSS gathered to every rank). Everything here is collective: every rank calls it with
//! the same configuration and returns the same result (rank 0 prints and writes).

use std::path::Path;

use crate::config::{Config, LoadedConfig};
use crate::device::BenchDevice;
use anyhow::{anyhow, Context};
use zero_comm::{Communicator, NodeGroups, ReduceOp};
use zero_core::config::{DivergencePolicy, Stage};
use zero_core::ledger::{node_egress, CommPlan, Group, MemCategory, PaperFormula};
use zero_core::plan::{BufferPlan, PlanInputs};
use zero_core::Model;
use zero_core::{Engine, EngineError};
use zero_kernels::device::Device;
use zero_models::data::{Origin, Tokens};
use zero_models::{Gpt, Llama, ModelPreset, TokenBatch};

use super::checkpoints::{self, Resume};
use super::data::{Batches, DataWatch, Stamp};
use super::init_from::{self, InitFile};
use super::launch::{agree, Failure, PREEMPTED_EXIT_CODE};
use super::metrics::Metrics;
use super::progress::Progress;
use super::report::{self, CommOverlap, NodeTraffic, StageResult};
use super::rss;
use super::signals;
use crate::logging::{out, outln};

/// The ledger categories the paper's formula counts (padding belongs to them).
const STATE_CATEGORIES: [MemCategory; 6] = [
    MemCategory::Params,
    MemCategory::Grads,
    MemCategory::Master,
    MemCategory::AdamM,
    MemCategory::AdamV,
    MemCategory::Padding,
];

/// The model of a validated configuration, of either family (GPT-2 or Llama).
pub fn model_preset(config: &Config) -> anyhow::Result<ModelPreset> {
    let m = config.model_preset().map_err(|e| anyhow!(e))?;
    m.validate().context("model")?;
    Ok(m)
}

/// What every stage shares.
pub struct Shared<'a> {
    /// Token source.
    pub tokens: &'a Tokens,
    /// What it held when the run checked it (data.rs's `check`).
    pub tokens_at_start: Stamp,
    /// `--init-from`, opened and checked.
    pub init: Option<&'a InitFile>,
    /// `--save-model` (this run writes it).
    pub save_model: Option<&'a Path>,
    /// `--ckpt-dir`, `--save-every`, `--keep-last`, `--resume`.
    pub checkpoints: Checkpoints<'a>,
    /// No progress bar.
    pub plain: bool,
    /// A repeat round (`--rounds`): print no ledger and no progress.
    pub quiet: bool,
}

/// Where and when to save and resume sharded checkpoints.
#[derive(Clone, Copy)]
pub struct Checkpoints<'a> {
    /// Root directory (`--ckpt-dir`): a checkpoint after the last step, and on a stop
    /// signal, whatever `every` says.
    pub dir: Option<&'a Path>,
    /// Save every this many steps too (0: only after the last).
    pub every: u64,
    /// Checkpoints kept.
    pub keep_last: usize,
    /// The checkpoint to resume from, checked (`checkpoints::prepare`).
    pub resume: Option<&'a Resume>,
}

/// How a run that cannot go on ends: an error every rank agreed on (a clean exit, rank 0
/// prints) or one this rank alone hit (the job is aborted from here: another rank may
/// be waiting in a collective).
enum Stop {
    Agreed(Failure),
    Local(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(e: anyhow::Error) -> Self {
        Stop::Local(e)
    }
}

/// Gather one number per rank to every rank, in rank order.
fn gather_u64<C: Communicator>(comm: &C, x: u64) -> anyhow::Result<Vec<u64>> {
    let mine = [x as i64];
    let mut all = vec![0i64; comm.size()];
    comm.all_gather(&mine[..], &mut all[..])
        .context("gathering per-rank figures")?;
    Ok(all.into_iter().map(|v| v.max(0) as u64).collect())
}

/// Train `loaded.config` on `dev` from scratch (or from `--init-from`), the engine's
/// collectives on `engine_comm` (`comm` itself, or on a GPU a communicator that reaches
/// its memory; agreement and reports go through `comm`). Set-up errors (the same on
/// every rank, or agreed on) come back as a [`Failure`]; errors during training abort
/// the job from the rank that hit them (another rank may be inside a collective).
pub fn train<C: Communicator, E: Communicator, D: BenchDevice>(
    comm: &C,
    engine_comm: &E,
    nodes: Option<&NodeGroups<E>>,
    dev: &D,
    loaded: &LoadedConfig,
    shared: &Shared<'_>,
    metrics: &mut Option<Metrics>,
) -> Result<StageResult, Failure> {
    let t = &loaded.config.train;
    rss::reset_peak();
    signals::setting_up();

    let family = agree(comm, model_preset(&loaded.config))?;
    match family {
        ModelPreset::Gpt(gpt) => {
            let model = agree(
                comm,
                Gpt::<D, f32>::new(dev, gpt, t.micro_batch)
                    .map(|m| m.with_init_threads(dev.host_threads()))
                    .context("building the model"),
            )?;
            train_model(
                comm,
                engine_comm,
                nodes,
                dev,
                loaded,
                shared,
                metrics,
                model,
            )
        }
        ModelPreset::Llama(llama) => {
            let model = agree(
                comm,
                Llama::<D, f32>::new(dev, llama, t.micro_batch)
                    .map(|m| m.with_init_threads(dev.host_threads()))
                    .context("building the model"),
            )?;
            train_model(
                comm,
                engine_comm,
                nodes,
                dev,
                loaded,
                shared,
                metrics,
                model,
            )
        }
    }
}

/// [`train`] on a built model of either family.
#[allow(clippy::too_many_arguments)]
fn train_model<C, E, D, M>(
    comm: &C,
    engine_comm: &E,
    nodes: Option<&NodeGroups<E>>,
    dev: &D,
    loaded: &LoadedConfig,
    shared: &Shared<'_>,
    metrics: &mut Option<Metrics>,
    mut model: M,
) -> Result<StageResult, Failure>
where
    C: Communicator,
    E: Communicator,
    D: BenchDevice,
    M: for<'a> Model<D, Batch<'a> = TokenBatch<'a>>,
{
    let rank = comm.rank();
    let world = comm.size();
    let config = &loaded.config;
    let stage = config.zero.stage;
    // Set-up: engine (allocates exactly the plan; in bf16 it switches the device's
    // matrix products to bf16 operands with f32 sums), initial weights.
    let setup_started = std::time::Instant::now();
    let setup = (|| -> anyhow::Result<_> {
        let engine = match nodes {
            Some(g) => Engine::on_nodes(&config.engine(), engine_comm, g, dev, &model),
            None => Engine::new(&config.engine(), engine_comm, dev, &model),
        }
        .context("creating the engine")?;
        let origin = shared.checkpoints.resume.map(|r| r.origin());
        let batches = Batches::new(config, world, rank, origin.unwrap_or_default())?;
        Ok((engine, batches))
    })();
    let (mut engine, mut batches) = agree(comm, setup)?;
    let seconds = setup_started.elapsed().as_secs_f64();
    if rank == 0 && !shared.quiet && seconds >= 1.0 {
        // Drawing a large model's initial values takes a while (about 22 ns a value per
        // thread; each rank draws its 1/N block only): say where the time went.
        log::info!("{stage}: engine built and initial values drawn in {seconds:.1} s");
    }
    if let Some(init) = shared.init {
        // Reads are checked on every rank before this (InitFile::open), so a failure here
        // is an I/O error mid-way: agree, since finish_import's gathers follow.
        let load = init.load_into(&mut engine);
        agree(comm, load)?;
        if rank == 0 && !shared.quiet {
            log::info!(
                "{stage}: weights loaded from {} ({}; optimizer state fresh)",
                init.path().display(),
                init.describe()
            );
        }
    }

    if let Some(resume) = shared.checkpoints.resume {
        checkpoints::load(comm, &mut engine, resume, shared.quiet)?;
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
        Err(Stop::Agreed(f)) => Err(f),
        Err(Stop::Local(e)) => {
            zero_comm::abort(&format!("error: {}", crate::logging::chain(&e)), 1)
        }
    }
}

/// An engine error of a step: agreed on every rank when the engine decided it from agreed
/// values (a non-finite gradient without loss scaling, fp16 stuck at its floor, a
/// divergent loss under `divergence.policy = "stop"` or skipped too long:
/// [`EngineError::is_agreed_stop`]), else this rank's own.
fn step_error(e: EngineError, rank: usize, stage: Stage, number: u64) -> Stop {
    if e.is_agreed_stop() {
        // The engine's message names the step.
        let e = anyhow::Error::new(e).context(format!("{stage}: training stopped"));
        Stop::Agreed(Failure::same_everywhere(e, rank))
    } else {
        Stop::Local(anyhow::Error::new(e).context(format!("{stage} step {number}")))
    }
}

fn run_steps<C, E, D, M>(
    comm: &C,
    loaded: &LoadedConfig,
    shared: &Shared<'_>,
    metrics: &mut Option<Metrics>,
    model: &mut M,
    engine: &mut Engine<'_, D, E>,
    batches: &mut Batches,
) -> Result<StageResult, Stop>
where
    C: Communicator,
    E: Communicator,
    D: Device,
    M: for<'a> Model<D, Batch<'a> = TokenBatch<'a>>,
{
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
        outln!("\n=== {stage}: {steps} steps on {world} rank(s) ===");
        out!("{}", report::ledger(&plan, &totals));
        out!("{}", report::comm(&comm_plan, &plan));
    }

    let progress = Progress::new(
        rank == 0 && !shared.quiet,
        shared.plain,
        &stage.to_string(),
        (engine.steps_done(), steps),
        config.train.log_every,
    );
    let mut losses = Vec::with_capacity(steps);
    let mut seconds = Vec::with_capacity(steps);
    let mut overlaps = Vec::with_capacity(steps);
    let mut sent = 0u64;
    // On nodes (hpZ, qgZ): bytes on the node and cross-node groups.
    let mut group_sent: Option<(u64, u64)> = None;
    let mut skipped = 0u64;
    let t = &config.train;
    let tokens_per_step = (world * t.grad_accum * t.micro_batch * t.seq_len) as u64;
    let mut saver = Saver::new(shared.checkpoints, config);
    let mut watch = DataWatch::new(shared.tokens_at_start, engine.steps_done());
    // The token file's change seen after the last step: the run ends as it would, then fails.
    let mut changed_at_end = None;
    let last = steps as u64;
    // SIGTERM or SIGINT during the set-up (reading checkpoints or weights, planning,
    // allocating) ends the run before its first step: nothing was trained since the
    // checkpoint it resumed (if any), so nothing is saved or lost. SIGUSR1 waits for the
    // first step (signals.rs). (A SIGINT from here on is told "after this step": at
    // worst the run stops sooner.)
    signals::stepping();
    let at_start = signals::agreed(comm)?;
    if let Some(sig) = at_start.filter(|&s| signals::stops_set_up(s) && engine.steps_done() < last)
    {
        progress.finish();
        return Err(Stop::Agreed(saver.stopped_before_start(
            sig,
            stage,
            engine.steps_done(),
            rank,
        )));
    }
    // Steps are counted from 1: `done` is the number of the step just run, and the
    // checkpoint saved after it is `step-<done>` (its state after `done` steps).
    for index in engine.steps_done()..last {
        let b = batches.fill(shared.tokens, index)?;
        let r = engine
            .step(model, &b)
            .map_err(|e| step_error(e, rank, stage, index + 1))?;
        let done = r.step;
        if let Some(m) = metrics.as_mut() {
            let staging = engine.host_staging().map(|(held, _)| held);
            m.write(stage.number(), &r, tokens_per_step, staging);
        }
        progress.step(&r, tokens_per_step);
        losses.push(r.loss);
        seconds.push(r.seconds);
        overlaps.push(r.overlap);
        sent += r.comm.total().bytes_sent;
        if let Some(g) = &r.node_comm {
            let (node, cross) = group_sent.get_or_insert((0, 0));
            *node += g.node.total().bytes_sent;
            *cross += g.cross.total().bytes_sent;
        }
        skipped += r.skipped as u64;
        // Every rank learns whether any rank was told to stop (SIGTERM, SIGUSR1).
        let signal = signals::agreed(comm)?;
        let due = saver.due(done, last, signal.is_some());
        // The token file, looked at where a checkpoint is saved and after the last step
        // (DataWatch in data.rs).
        let data_changed = if due || done == last {
            watch.check(comm, shared.tokens, done).err()
        } else {
            None
        };
        // The run stops at the first change seen, so the checkpoint before this one
        // holds steps of the file as it was.
        let clean = saver.saved.clone();
        if due {
            saver.save(
                engine,
                done,
                rank,
                data_changed.is_none(),
                batches.origin_at(done),
            );
        }
        if let Some(changed) = data_changed {
            if done < last {
                progress.finish();
                return Err(Stop::Agreed(saver.data_changed(
                    changed,
                    clean.as_ref(),
                    watch.since(),
                    done,
                    last,
                )));
            }
            changed_at_end = Some((changed, clean));
        }
        if let Some(sig) = signal.filter(|_| done < last) {
            progress.finish();
            let stop = saver.stopped_by(sig, done, last, rank);
            if stop.code == PREEMPTED_EXIT_CODE && sig != libc::SIGINT && rank == 0 {
                saver.mark_stopped(done, sig);
            }
            return Err(Stop::Agreed(stop));
        }
    }
    progress.finish();
    // The model file first: when the last checkpoint failed, it may be the only copy of
    // the trained weights (on another filesystem).
    if let Some(path) = shared.save_model {
        let values = engine
            .full_master_f32()
            .context("gathering the final weights")?;
        if rank == 0 {
            init_from::save(path, engine.layout(), &values, engine.steps_done())?;
            log::info!("final weights written to {}", path.display());
        }
    }
    if let Some((changed, clean)) = changed_at_end {
        let mut failure = saver.data_changed(changed, clean.as_ref(), watch.since(), last, last);
        if let Some(path) = shared.save_model {
            failure.error = anyhow!(
                "{} The final weights were written to {} all the same.",
                crate::logging::chain(&failure.error),
                path.display()
            );
        }
        return Err(Stop::Agreed(failure));
    }
    if let Some(f) = saver.final_failure(last, rank) {
        return Err(Stop::Agreed(f));
    }
    if rank == 0 && (skipped > 0 || engine.divergences() > 0) {
        log::warn!(
            "{stage}: {skipped} of {} step(s) skipped (inf/NaN gradients{}), {} step(s) with a divergent loss (divergence.policy = {:?})",
            losses.len(),
            if config.divergence.policy == DivergencePolicy::SkipStep {
                " or divergent losses"
            } else {
                ""
            },
            engine.divergences(),
            config.divergence.policy
        );
    }

    // Mean step time without the warm-up step, the slowest rank's.
    let timed = after_warm_up(&seconds);
    let mut mean = [timed.iter().sum::<f64>() / timed.len().max(1) as f64];
    comm.all_reduce(&mut mean[..], ReduceOp::Max)
        .context("agreeing on the step time")?;
    // Overlap: the same steps, the mean over ranks.
    let timed_overlap = after_warm_up(&overlaps);
    let per_timed_step = timed_overlap.len().max(1) as f64 * world as f64;
    let mut overlap_sums = timed_overlap.iter().fold([0.0f64; 3], |a, o| {
        [
            a[0] + o.tasks as f64,
            a[1] + o.total_seconds,
            a[2] + o.exposed_seconds,
        ]
    });
    comm.all_reduce(&mut overlap_sums[..], ReduceOp::Sum)
        .context("adding up the communication overlap")?;
    let [collectives, comm_seconds, exposed] = overlap_sums.map(|x| x / per_timed_step);
    let overlap = (collectives > 0.0).then(|| CommOverlap {
        collectives_per_step: collectives,
        comm_seconds_per_step: comm_seconds,
        exposed_seconds_per_step: exposed,
        hidden_fraction: report::hidden(exposed, comm_seconds),
    });
    let peak = gather_u64(comm, rss::peak_bytes().unwrap_or(0))?;

    let formula = PaperFormula::for_precision(stage, config.precision.dtype, plan.numel, world)
        .total()
        .to_f64();
    let losses_run = losses.len();
    let per_step = |x: u64| x / (losses_run as u64).max(1);
    let node_traffic = match group_sent {
        Some((node, cross)) => Some(node_traffic(
            engine,
            &comm_plan,
            per_step(sent),
            (per_step(node), per_step(cross)),
        )?),
        None => None,
    };
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
        // Per step this run ran (a resumed run runs fewer than `steps`).
        comm_sent_bytes_per_step: sent / (losses_run as u64).max(1),
        skipped_steps: skipped,
        divergent_steps: engine.divergences(),
        comm_plan_bytes_per_step: comm_plan.sent_bytes(),
        nodes: node_traffic,
        overlap,
    })
}

/// The steps after the first (warm-up) one, when there are others.
fn after_warm_up<T>(steps: &[T]) -> &[T] {
    if steps.len() > 1 {
        &steps[1..]
    } else {
        steps
    }
}

/// The traffic of a run on nodes: measured per step (world,
/// (node, cross)) next to the ledger's, and what the ledger gives with the hierarchical
/// and quantized switches off.
fn node_traffic<D: Device, E: Communicator>(
    engine: &Engine<'_, D, E>,
    comm_plan: &CommPlan,
    world_sent: u64,
    (node_sent, cross_sent): (u64, u64),
) -> anyhow::Result<NodeTraffic> {
    let plan = engine.plan();
    let exact_inputs = PlanInputs {
        quant_block: None,
        grad_quant_block: None,
        hierarchical_weights: false,
        ..plan.inputs.clone()
    };
    let exact = BufferPlan::new(engine.spec(), engine.layout(), &exact_inputs, plan.rank)
        .context("planning the run without qwZ/hpZ/qgZ")?;
    let exact = CommPlan::new(engine.layout(), &exact, comm_plan.grad_accum);
    let (nodes, ranks_per_node) = (comm_plan.nodes(), comm_plan.ranks_per_node);
    Ok(NodeTraffic {
        ranks_per_node,
        nodes,
        node_sent_bytes_per_step: node_sent,
        cross_sent_bytes_per_step: cross_sent,
        node_plan_bytes_per_step: comm_plan.sent_bytes_on(Group::Node),
        cross_plan_bytes_per_step: comm_plan.sent_bytes_on(Group::Cross),
        // The control all-reduce is outside the ledger's lines.
        egress_bytes_per_step: node_egress(
            nodes,
            ranks_per_node,
            world_sent.saturating_sub(comm_plan.control_sent_bytes()),
            cross_sent,
        ),
        egress_plan_bytes_per_step: comm_plan.node_egress_bytes(),
        egress_exact_plan_bytes_per_step: exact.node_egress_bytes(),
    })
}

/// The file a run stopped by a signal leaves in `--ckpt-dir` (slurm/train.sbatch removes
/// it before each run and requeues the job when it finds it).
pub const STOPPED_MARKER: &str = "STOPPED";

/// The checkpoints of one run: when they are due, what the last one was, and what a run
/// that must stop or has ended says about them.
struct Saver<'a> {
    ckpt: Checkpoints<'a>,
    /// This tool's configuration, recorded in each checkpoint's metadata.
    app_config: Option<String>,
    /// The last checkpoint this run saved: (step, directory).
    saved: Option<(u64, std::path::PathBuf)>,
    /// The error of the last save, if it failed (cleared by a success).
    failed: Option<(u64, String)>,
}

impl<'a> Saver<'a> {
    fn new(ckpt: Checkpoints<'a>, config: &Config) -> Self {
        Saver {
            ckpt,
            app_config: toml::to_string(config).ok(),
            saved: None,
            failed: None,
        }
    }

    /// Whether step `done` ends with a checkpoint: every `every` steps, after the last,
    /// and when the run is stopped by a signal.
    fn due(&self, done: u64, last: u64, stopping: bool) -> bool {
        let every = self.ckpt.every;
        self.ckpt.dir.is_some()
            && (done == last || stopping || (every > 0 && done.is_multiple_of(every)))
    }

    /// Save (collective; every rank gets the same outcome). A failed save loses nothing
    /// already saved: the previous checkpoint and `latest` are untouched, and training
    /// goes on; the end of the run reports it. After the token file changed under the
    /// run (`data_unchanged` false) no older checkpoint is removed: those hold steps of
    /// the file as it was. `data` is where the data order has got to (recorded, so that
    /// a resume with another global batch reads on from there).
    fn save<D: Device, E: Communicator>(
        &mut self,
        engine: &Engine<'_, D, E>,
        done: u64,
        rank: usize,
        data_unchanged: bool,
        data: Origin,
    ) {
        let Some(dir) = self.ckpt.dir else {
            return;
        };
        let keep_last = if data_unchanged {
            self.ckpt.keep_last
        } else {
            usize::MAX
        };
        match checkpoints::save(engine, dir, keep_last, self.app_config.as_deref(), data) {
            Ok(path) => {
                self.saved = Some((done, path));
                self.failed = None;
            }
            Err(e) => {
                if rank == 0 {
                    log::error!(
                        "checkpoint after step {done} failed: {e}; training goes on, {}",
                        self.last_good()
                    );
                }
                self.failed = Some((done, e.to_string()));
            }
        }
    }

    /// The token file changed under the run (`changed`, agreed by every rank), seen after
    /// step `done` of `last`; it was last seen as at the start after step `since`, and
    /// `clean` is this run's checkpoint before the change was seen. The run stops (exit
    /// status 1, whatever signal came with it: a job script must not requeue onto the new
    /// file unasked) and says which checkpoint holds which tokens.
    fn data_changed(
        &self,
        changed: Failure,
        clean: Option<&(u64, std::path::PathBuf)>,
        since: u64,
        done: u64,
        last: u64,
    ) -> Failure {
        let stops = if done < last {
            format!("so the run stops after step {done} of {last}")
        } else {
            "so the run fails, though it reached its last step".to_string()
        };
        let saved = match (&self.saved, self.ckpt.dir) {
            (Some((step, path)), Some(_)) if *step == done => {
                let before = match (clean, self.ckpt.resume) {
                    (Some((step, path)), _) => {
                        format!("--resume {} (step {step})", path.display())
                    }
                    (None, Some(r)) => format!(
                        "--resume {} (the checkpoint this run resumed)",
                        r.dir().display()
                    ),
                    (None, None) => "start again".to_string(),
                };
                format!(
                    "Checkpoint {} holds these steps, and no older checkpoint was removed: to go on with the new file, --resume {}; to train on the file as it was, put it back and {before}",
                    path.display(),
                    path.display()
                )
            }
            (_, Some(_)) => format!(
                "The checkpoint after step {done} could not be saved ({}); {}",
                self.failed
                    .as_ref()
                    .map_or("it was not attempted", |(_, e)| e.as_str()),
                self.last_good()
            ),
            (_, None) => "No --ckpt-dir was given, so no checkpoint holds them".to_string(),
        };
        let steps = if since + 1 == done {
            format!("step {done}")
        } else {
            format!("steps {}-{done}", since + 1)
        };
        Failure {
            error: anyhow!(
                "{}: {steps} may have read the new tokens, {stops}. {saved}. (Write a new token file under another name, not over data.path of a running job.)",
                crate::logging::chain(&changed.error)
            ),
            print: changed.print,
            code: 1,
        }
    }

    /// Leave `STOPPED_MARKER` in the checkpoint directory: a scheduler's signal stopped
    /// the run (after a step and its checkpoint, or before its first step, when the job
    /// resumes its latest checkpoint or starts afresh). A job script requeues on it even
    /// when the launcher reports another status than 85 (srun may kill ranks finishing
    /// their exit).
    fn mark_stopped(&self, done: u64, sig: i32) {
        if let Some(dir) = self.ckpt.dir {
            let path = dir.join(STOPPED_MARKER);
            let text = format!("stopped by {} after step {done}\n", signals::name(sig));
            if let Err(e) = std::fs::write(&path, text) {
                log::warn!("could not write {}: {e}", path.display());
            }
        }
    }

    /// Whether some checkpoint (this run's, or the one it resumed) can be resumed.
    fn resumable(&self) -> bool {
        self.saved.is_some() || self.ckpt.resume.is_some()
    }

    /// Where the newest good checkpoint is, in words.
    fn last_good(&self) -> String {
        match (&self.saved, self.ckpt.resume) {
            (Some((step, path)), _) => format!(
                "the last good checkpoint is {} (step {step})",
                path.display()
            ),
            (None, Some(r)) => {
                format!("no checkpoint of this run was saved; the one it resumed from is {r}")
            }
            (None, None) => "no checkpoint of this run was saved".into(),
        }
    }

    /// The run was told to stop (signal `sig`) after step `done` of `last`.
    fn stopped_by(&self, sig: i32, done: u64, last: u64, rank: usize) -> Failure {
        let what = signals::name(sig);
        let code = signals::exit_code(sig);
        let mut failure = match (&self.saved, self.ckpt.dir) {
            (Some((step, path)), Some(dir)) if *step == done => Failure {
                error: anyhow!(
                    "stopped by {what} after step {done} of {last}; checkpoint saved in {}: continue with --resume {} (exit status {code})",
                    path.display(),
                    dir.display()
                ),
                print: rank == 0,
                code,
            },
            // Its checkpoint failed, but an older one can be resumed: the steps since are
            // lost, the run is not; a job script requeues on 85 as usual.
            (_, Some(dir)) if self.resumable() => Failure {
                error: anyhow!(
                    "stopped by {what} after step {done} of {last}, but its checkpoint could not be saved ({}); {}: continue with --resume {} (the steps since are lost; exit status {code})",
                    self.failed.as_ref().map_or("unknown error", |(_, e)| e.as_str()),
                    self.last_good(),
                    // Where this run saved nothing, its --ckpt-dir may hold no `latest`.
                    match (&self.saved, self.ckpt.resume) {
                        (None, Some(r)) => r.dir().display(),
                        _ => dir.display(),
                    }
                ),
                print: rank == 0,
                code,
            },
            (_, Some(_)) => Failure::same_everywhere(
                anyhow!(
                    "stopped by {what} after step {done} of {last}, but its checkpoint could not be saved ({}); {}",
                    self.failed.as_ref().map_or("unknown error", |(_, e)| e.as_str()),
                    self.last_good()
                ),
                rank,
            ),
            (_, None) => Failure::same_everywhere(
                anyhow!(
                    "stopped by {what} after step {done} of {last}; no --ckpt-dir was given, so the steps of this run are not saved (give --ckpt-dir to checkpoint on a stop signal)"
                ),
                rank,
            ),
        };
        // The user's stop (SIGINT) ends as 130 whether or not anything was saved.
        if sig == libc::SIGINT {
            failure.code = code;
        }
        failure
    }

    /// The run (of `stage`) was told to stop (signal `sig`) during its set-up, with
    /// `done` steps behind it (those of the checkpoint it resumed).
    fn stopped_before_start(&self, sig: i32, stage: Stage, done: u64, rank: usize) -> Failure {
        let what = signals::name(sig);
        let code = signals::exit_code(sig);
        // As after a step: the scheduler's signals leave the marker a job script requeues
        // on (it resumes `latest` where there is one, else starts afresh).
        if sig != libc::SIGINT && rank == 0 {
            self.mark_stopped(done, sig);
        }
        let again = match self.ckpt.resume {
            Some(r) => {
                format!(
                    "the checkpoint it resumed, {r}, is intact: continue with the same --resume"
                )
            }
            None => "start it again".into(),
        };
        Failure {
            error: anyhow!(
                "stopped by {what} during the set-up of {stage}, before its step {}: this run trained nothing, so it saved nothing; {again} (exit status {code})",
                done + 1
            ),
            print: rank == 0,
            code,
        }
    }

    /// A run that trained to its last step but could not save it fails (the exit status
    /// says the trained weights are not on disk).
    fn final_failure(&self, last: u64, rank: usize) -> Option<Failure> {
        self.ckpt.dir?;
        if self.saved.as_ref().is_some_and(|(step, _)| *step == last) {
            return None;
        }
        let why = self
            .failed
            .as_ref()
            .map_or("it was not attempted".to_string(), |(_, e)| e.clone());
        Some(Failure::same_everywhere(
            anyhow!(
                "training reached step {last}, but its checkpoint could not be saved: {why}; {}",
                self.last_good()
            ),
            rank,
        ))
    }
}
