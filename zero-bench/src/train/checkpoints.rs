//! What `--ckpt-dir` and `--resume` need, checked on every rank before step 1, so that a
//! run that could not save, or should not resume, stops before it spends its allocation:
//!
//! - `--ckpt-dir`: rank 0 creates it and locks it for the whole run (`flock` on
//!   `.zero-lock`, which names the holder), so a second job given the same directory is
//!   refused instead of replacing this one's steps; a file system without locks gets a
//!   warning. Every rank writes and removes a probe file there (each rank writes its own
//!   shard into it later), and finds a file rank 0 wrote (node-local storage mounted
//!   under the same path on every node would pass the probe and fail at the first save).
//!   A directory that cannot be created, a read-only filesystem, or one that a rank
//!   cannot see is an error naming the rank. Without `--save-every` the run saves once,
//!   after its last step.
//! - `--resume`: every rank reads the checkpoint's metadata, and the ranks compare it
//!   (its step and a hash of `meta.json`, which holds every shard's checksums): ranks
//!   that read different checkpoints under one path (a stale node-local copy) are
//!   refused, naming them, rather than loading a mix. `train.steps` must be above
//!   the checkpoint's step, and the global batch (ranks x grad_accum x micro_batch rows
//!   of seq_len tokens) must be the checkpoint's unless `--allow-batch-change` says
//!   otherwise; the change is then logged and recorded in the next checkpoints, and the
//!   data order goes on from where the checkpoint's had got to (each checkpoint records
//!   its data position: [`DataPosition`]).
//!
//! Loading and saving during the run go through here too ([`load`], [`save`]): this module
//! and `init_from` are all of `train` that needs HDF5 (a build without it has stand-ins
//! that refuse the options: `without_hdf5.rs`).
//!
//! Step numbers count from 1 everywhere: the checkpoint `step-S` holds the state after
//! step S (its metadata's `step`), and a resumed run continues with step S + 1.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use zero_comm::Communicator;
use zero_core::checkpoint::{self, Meta, SaveOptions};
use zero_core::Engine;
use zero_kernels::device::Device;
use zero_models::data::Origin;

use super::launch::{agree, Failure};
use super::TrainArgs;
use crate::config::{Config, LoadedConfig};

/// What the run learned of the checkpoint it resumes.
pub struct Resume {
    /// The step directory.
    pub dir: PathBuf,
    /// Its step (the state after that many steps).
    pub step: u64,
    /// The global batch change allowed by `--allow-batch-change`, as a history line.
    pub batch_change: Option<String>,
    /// Where the data order had got to after its step: the resumed run reads on from there.
    pub origin: Origin,
    /// Rank 0, resuming an earlier step of `--ckpt-dir` itself: the root and the
    /// `--resume` path as given, whose later steps [`load`] moves aside once the load
    /// succeeded ([`set_aside_later_steps`]).
    branch: Option<(PathBuf, PathBuf)>,
}

impl Resume {
    /// Its step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Its step directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where its data order had got to.
    pub fn origin(&self) -> Origin {
        self.origin
    }
}

/// A checkpoint's data position, recorded as its application state (JSON): the order of
/// the run that saved it, after its step, as the [`Origin`] a resumed run starts from.
/// Rows and tokens are decimal strings (they are u128).
#[derive(serde::Serialize, serde::Deserialize)]
struct DataPosition {
    /// The step index it applies to (the checkpoint's step: the next step's 0-based index).
    step_index: u64,
    /// Global row index of that step's first row.
    row: String,
    /// Its first token, before wrapping.
    token: String,
}

/// The application state zero-bench records in each checkpoint.
#[derive(serde::Serialize, serde::Deserialize)]
struct AppState {
    data_position: DataPosition,
}

/// `origin` as the application state of a checkpoint.
pub fn app_state(origin: Origin) -> String {
    let state = AppState {
        data_position: DataPosition {
            step_index: origin.index,
            row: origin.row.to_string(),
            token: origin.token.to_string(),
        },
    };
    // Plain strings and integers: serialising cannot fail.
    serde_json::to_string(&state).unwrap_or_default()
}

/// The data position `meta` records, checked against its step.
fn recorded_origin(meta: &Meta) -> anyhow::Result<Option<Origin>> {
    let Some(text) = meta.app_state.as_deref() else {
        return Ok(None);
    };
    let state: AppState = serde_json::from_str(text).context("its app_state")?;
    let p = state.data_position;
    if p.step_index != meta.step {
        bail!(
            "its data position is for step index {}, the checkpoint is at step {}",
            p.step_index,
            meta.step
        );
    }
    // A real run reads far fewer than 2^96 rows or tokens; a larger number is an edited
    // or damaged record, and would overflow the order's arithmetic.
    let number = |what: &str, s: &str| {
        s.parse::<u128>()
            .ok()
            .filter(|&n| n < 1u128 << 96)
            .with_context(|| format!("its data position's {what} {s:?} is no count below 2^96"))
    };
    Ok(Some(Origin {
        index: p.step_index,
        row: number("row", &p.row)?,
        token: number("token", &p.token)?,
    }))
}

/// Where the data order of the run that saved `meta` had got to after its step: as it
/// recorded, else (a checkpoint from before positions were recorded) as its global batch
/// `theirs` read from step 0, else the order's start with this run's batch (as then).
fn data_origin(meta: &Meta, theirs: Option<GlobalBatch>, rank: usize) -> Origin {
    let derived = || match theirs {
        Some(b) => {
            let row = (meta.step as u128).saturating_mul(b.rows_per_step());
            Origin {
                index: meta.step,
                row,
                token: row.saturating_mul(b.seq_len as u128),
            }
        }
        None => Origin::default(),
    };
    match recorded_origin(meta) {
        Ok(Some(origin)) => origin,
        Ok(None) => derived(),
        Err(why) => {
            if rank == 0 {
                log::warn!(
                    "the checkpoint's recorded data position is unreadable ({why:#}); reading on from where its global batch puts step {}",
                    meta.step
                );
            }
            derived()
        }
    }
}

impl std::fmt::Display for Resume {
    /// "DIR (step S)".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (step {})", self.dir.display(), self.step)
    }
}

/// The global batch of a run: N ranks x A micro-steps x B rows of T tokens. Two are the
/// same when they have as many rows of as many tokens: the data order depends only on
/// N x A x B (train/data.rs), so 8 ranks x A = 1 and 4 ranks x A = 2 read the same data.
#[derive(Clone, Copy, Debug)]
struct GlobalBatch {
    world: usize,
    accum: usize,
    rows: usize,
    seq_len: usize,
}

impl PartialEq for GlobalBatch {
    fn eq(&self, other: &Self) -> bool {
        (self.rows_per_step(), self.seq_len) == (other.rows_per_step(), other.seq_len)
    }
}

impl GlobalBatch {
    fn of(config: &Config, world: usize) -> Self {
        GlobalBatch {
            world,
            accum: config.train.grad_accum,
            rows: config.train.micro_batch,
            seq_len: config.train.seq_len,
        }
    }

    /// N x A x B, saturating: a checkpoint's recorded sizes are not yet validated here.
    fn rows_per_step(&self) -> u128 {
        (self.world as u128)
            .saturating_mul(self.accum as u128)
            .saturating_mul(self.rows as u128)
    }

    fn tokens(&self) -> u128 {
        self.rows_per_step().saturating_mul(self.seq_len as u128)
    }
}

impl std::fmt::Display for GlobalBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rank(s) x grad_accum {} x micro_batch {} rows x seq_len {} = {} tokens per step",
            self.world,
            self.accum,
            self.rows,
            self.seq_len,
            self.tokens()
        )
    }
}

/// Check `--ckpt-dir` and `--resume` on every rank (collective). Returns what a resume
/// starts from.
pub fn prepare<C: Communicator>(
    comm: &C,
    args: &TrainArgs,
    loaded: &[LoadedConfig],
) -> Result<Option<Resume>, Failure> {
    let rank = comm.rank();
    let mut branch = None;
    if let Some(dir) = &args.ckpt_dir {
        let created = match rank {
            0 if dir.exists() && !dir.is_dir() => Err(anyhow!(
                "--ckpt-dir {} is a file, not a directory; give a directory (it is created if missing)",
                dir.display()
            )),
            0 => std::fs::create_dir_all(dir).with_context(|| {
                format!(
                    "--ckpt-dir {}: cannot create it; give a directory on a filesystem every rank can write",
                    dir.display()
                )
            }),
            _ => Ok(()),
        };
        agree(comm, created)?;
        agree(comm, probe(dir, rank))?;
        agree(comm, if rank == 0 { lock(dir) } else { Ok(()) })?;
        seen_by_every_rank(comm, dir)?;
        // Another run's checkpoints: a fresh run, or one resumed from elsewhere, would
        // replace its steps one by one.
        let earlier = match (rank, &args.resume) {
            (0, None) => earlier_run(dir).map(|()| false),
            (0, Some(from)) => resumed_elsewhere(dir, from),
            _ => Ok(false),
        };
        if agree(comm, earlier)? {
            branch = args.resume.clone().map(|from| (dir.clone(), from));
        }
        if rank == 0 && args.save_every == 0 {
            log::info!(
                "--ckpt-dir {} without --save-every: one checkpoint after the last step (and one if SIGTERM/SIGUSR1 stops the run)",
                dir.display()
            );
        }
    }
    let Some(path) = &args.resume else {
        return Ok(None);
    };
    let read = checkpoint::resolve(path)
        .and_then(|dir| Meta::read(&dir).map(|m| (dir, m)))
        .with_context(|| format!("--resume {}", path.display()));
    let (dir, meta) = agree(comm, read)?;
    same_checkpoint_on_every_rank(comm, path, &dir, &meta)?;
    // The checks below depend only on the metadata and the configuration, the same on
    // every rank: rank 0 reports.
    let same = |e: anyhow::Error| Failure::same_everywhere(e, rank);
    let config = &loaded[0].config;
    let steps = config.train.steps as u64;
    if steps <= meta.step {
        return Err(same(anyhow!(
            "the checkpoint {} is at step {}, and train.steps is {steps}: there is nothing left to train; give --steps above {} (e.g. --steps {})",
            dir.display(),
            meta.step,
            meta.step,
            meta.step.saturating_add(steps.max(1))
        )));
    }
    // A cosine schedule decays to train.steps unless told otherwise: resuming with more
    // steps stretches the curve from here on (the learning rate jumps up).
    let (saved, now) = (&meta.engine.optim, &config.engine().optim);
    if rank == 0
        && now.schedule == zero_core::config::Schedule::WarmupCosine
        && saved.schedule == now.schedule
        && saved.decay_steps != now.decay_steps
    {
        let show = |d: Option<usize>| d.map_or("none".to_string(), |d| d.to_string());
        log::warn!(
            "the checkpoint's cosine schedule decays over {} steps, this run's over {} (train.steps unless optim.decay_steps is set): the learning rate changes course after step {}; pass --set optim.decay_steps={} to keep the checkpoint's schedule",
            show(saved.decay_steps),
            show(now.decay_steps),
            meta.step,
            show(saved.decay_steps)
        );
    }
    if let Some(why) = shape_change(&meta, config) {
        return Err(same(anyhow!(
            "the checkpoint {} holds a model with {why}: its parameters do not fit this run's model; resume with the checkpoint's model settings, or train this model afresh with another --ckpt-dir",
            dir.display()
        )));
    }
    if let Some(why) = architecture_change(&meta, config) {
        return Err(same(anyhow!(
            "the checkpoint {} was trained with {why}: the parameters' shapes are alike, so it would load, but the model would compute something else than it learned; resume with the checkpoint's setting (or train afresh)",
            dir.display()
        )));
    }
    if rank == 0 {
        if let Some(change) = data_change(&meta, config) {
            log::warn!(
                "the checkpoint {} was trained with {change}: the data position it saved is applied to this run's data as it is (the new data read on from the old one's row); resume with the checkpoint's setting to go on with the same data",
                dir.display()
            );
        }
    }
    let ours = GlobalBatch::of(config, comm.size());
    let theirs = saved_batch(&meta);
    let origin = data_origin(&meta, theirs.as_ref().ok().copied(), rank);
    let batch_change = match theirs {
        Ok(theirs) if theirs == ours => None,
        Ok(theirs) if args.allow_batch_change => {
            let line = format!(
                "after step {}: global batch changed from {theirs} to {ours} (--allow-batch-change); the data reads on from global row {}, token {}",
                meta.step, origin.row, origin.token
            );
            if rank == 0 {
                log::warn!("{line}");
            }
            Some(line)
        }
        Ok(theirs) => {
            return Err(same(anyhow!(
                "the checkpoint {} was trained with a global batch of {theirs}; this run has {ours}. \
                 The data order and the optimizer's dynamics follow the global batch: launch as many \
                 ranks with the same train.grad_accum, train.micro_batch and train.seq_len, or pass \
                 --allow-batch-change to go on with the new batch (logged, and recorded in the \
                 checkpoints that follow)",
                dir.display()
            )))
        }
        Err(why) => {
            if rank == 0 {
                log::warn!(
                    "cannot compare the global batch with the checkpoint's ({why}); resuming as asked"
                );
            }
            None
        }
    };
    Ok(Some(Resume {
        dir,
        step: meta.step,
        batch_change,
        origin,
        branch,
    }))
}

/// Load the checkpoint `resume` names into `engine` (collective; every rank gets each
/// failing rank's own error, `CheckpointError::Ranks`). Rank 0 logs where from unless
/// `quiet`.
pub fn load<C: Communicator, E: Communicator, D: Device>(
    comm: &C,
    engine: &mut Engine<'_, D, E>,
    resume: &Resume,
    quiet: bool,
) -> Result<(), Failure> {
    let (rank, world) = (comm.rank(), comm.size());
    let stage = engine.config().zero.stage;
    let from = &resume.dir;
    let info = checkpoint::load(engine, from).map_err(|e| {
        // An earlier step of the same run is somewhere to go on from when this one is
        // damaged; one that does not fit this model has the others' shapes too.
        let unfit = matches!(e, checkpoint::CheckpointError::Incompatible { .. });
        let hint = if unfit {
            String::new()
        } else {
            earlier_checkpoints(from, resume.step)
        };
        anyhow::Error::new(e).context(format!("resuming from {}{hint}", from.display()))
    });
    let info = agree(comm, info)?;
    // Only now, with the state loaded on every rank, does the run branch: a resume refused
    // or failed above leaves the root as it was.
    let moved = match &resume.branch {
        Some((root, given)) => set_aside_later_steps(root, from, given, resume.step),
        None => Ok(()),
    };
    agree(comm, moved)?;
    if let Some(change) = &resume.batch_change {
        engine.record(change.clone());
    }
    if rank == 0 && !quiet {
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
    Ok(())
}

/// For an error loading `step_dir`: the complete checkpoints before it in its root, newest
/// first, as somewhere to resume from instead (" (earlier checkpoints in ROOT: step-8,
/// step-4; --resume ROOT/step-8)"), or nothing.
fn earlier_checkpoints(step_dir: &Path, step: u64) -> String {
    let Some(root) = step_dir.parent() else {
        return String::new();
    };
    let mut earlier: Vec<(u64, String)> = checkpoint::step_dirs(root)
        .into_iter()
        .filter(|(s, name)| *s < step && root.join(name).join(checkpoint::META_FILE).is_file())
        .collect();
    earlier.reverse();
    match earlier.first() {
        None => String::new(),
        Some((_, newest)) => format!(
            " (earlier checkpoints in {}: {}; --resume {} to go on from the newest)",
            root.display(),
            earlier
                .iter()
                .map(|(_, n)| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            root.join(newest).display()
        ),
    }
}

/// Save a checkpoint of `engine` under the root `dir`, keeping the newest `keep_last`,
/// with `app_config` (this tool's configuration) and `data` (where the data order has got
/// to) in its metadata. Collective; returns the step directory.
pub fn save<D: Device, E: Communicator>(
    engine: &Engine<'_, D, E>,
    dir: &Path,
    keep_last: usize,
    app_config: Option<&str>,
    data: Origin,
) -> anyhow::Result<PathBuf> {
    let state = app_state(data);
    let opts = SaveOptions {
        keep_last,
        app_config,
        app_state: Some(&state),
        ..Default::default()
    };
    Ok(checkpoint::save(engine, dir, &opts)?)
}

/// The global batch a checkpoint was trained with: N and A from its engine record, B and
/// T from this tool's configuration saved beside it.
fn saved_batch(meta: &Meta) -> anyhow::Result<GlobalBatch> {
    let text = meta
        .app_config
        .as_deref()
        .ok_or_else(|| anyhow!("the checkpoint records no zero-bench configuration"))?;
    let saved: Config = toml::from_str(text).context("its recorded configuration")?;
    Ok(GlobalBatch {
        world: meta.world,
        accum: meta.engine.grad_accum,
        rows: saved.train.micro_batch,
        seq_len: saved.train.seq_len,
    })
}

/// What of the model's architecture differs from the checkpoint's in what the parameters'
/// shapes do not show (so loading cannot catch it): the head counts, a Llama's RoPE base
/// and norm epsilon. `None` when alike, or when the checkpoint records no readable
/// configuration (the shapes are still checked on load).
fn architecture_change(meta: &Meta, config: &Config) -> Option<String> {
    use zero_models::ModelPreset;
    let saved: Config = toml::from_str(meta.app_config.as_deref()?).ok()?;
    let (theirs, ours) = (saved.model_preset().ok()?, config.model_preset().ok()?);
    let heads = |a: usize, b: usize| {
        (a != b).then(|| format!("heads {a}, and this run has {b} (--set model.heads={a})"))
    };
    match (theirs, ours) {
        (ModelPreset::Gpt(t), ModelPreset::Gpt(o)) => heads(t.n_head, o.n_head),
        (ModelPreset::Llama(t), ModelPreset::Llama(o)) => {
            heads(t.n_head, o.n_head).or_else(|| {
                // The key that gives each (the norm epsilon comes with the preset).
                let preset = saved.model.preset.clone().unwrap_or_default();
                [
                    (
                        "kv heads",
                        "n_kv_head",
                        t.n_kv_head as f64,
                        o.n_kv_head as f64,
                    ),
                    ("RoPE base", "rope_theta", t.rope_theta, o.rope_theta),
                    ("norm epsilon", "", t.norm_eps, o.norm_eps),
                ]
                .into_iter()
                .find(|(_, _, a, b)| a != b)
                .map(|(what, key, a, b)| match key {
                    "" => format!("{what} {a}, and this run has {b} (model.preset = \"{preset}\")"),
                    key => format!("{what} {a}, and this run has {b} (--set model.{key}={a})"),
                })
            })
        }
        (t, o) => Some(format!(
            "a {} model, and this run has a {} model",
            family(&t),
            family(&o)
        )),
    }
}

/// The model dimensions that size parameters, where the checkpoint's model and this
/// run's differ, in `[model]` keys with the setting that fits the checkpoint ("vocab_size
/// 64, and this run has 128 (--set model.vocab_size=64)"): the load would refuse the
/// first parameter whose shape differs, naming tensors rather than keys. `None` when
/// alike, across families (named by [`architecture_change`]), or when the checkpoint
/// records no readable configuration.
fn shape_change(meta: &Meta, config: &Config) -> Option<String> {
    use zero_models::ModelPreset;
    let saved: Config = toml::from_str(meta.app_config.as_deref()?).ok()?;
    let dims = |m: &ModelPreset| -> Vec<(&'static str, usize)> {
        match m {
            // GPT-2's positions are learned: its context length sizes a table.
            ModelPreset::Gpt(g) => vec![
                ("vocab_size", g.vocab_size),
                ("context_len", g.max_seq_len),
                ("layers", g.n_layer),
                ("width", g.n_embd),
            ],
            ModelPreset::Llama(l) => vec![
                ("vocab_size", l.vocab_size),
                ("layers", l.n_layer),
                ("width", l.n_embd),
                ("ffn_hidden", l.ffn_hidden),
            ],
        }
    };
    let (theirs, ours) = (saved.model_preset().ok()?, config.model_preset().ok()?);
    if std::mem::discriminant(&theirs) != std::mem::discriminant(&ours) {
        return None;
    }
    let changes: Vec<String> = dims(&theirs)
        .into_iter()
        .zip(dims(&ours))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((key, a), (_, b))| {
            format!("{key} {a}, and this run has {b} (--set model.{key}={a})")
        })
        .collect();
    (!changes.is_empty()).then(|| changes.join("; "))
}

/// The data settings the checkpoint was trained with, where this run's differ (the
/// token file, the order): `None` when alike, or when the checkpoint records no readable
/// configuration. Two names of one file (relative and absolute, a link) are alike.
fn data_change(meta: &Meta, config: &Config) -> Option<String> {
    let saved: Config = toml::from_str(meta.app_config.as_deref()?).ok()?;
    let (theirs, ours) = (&saved.data, &config.data);
    let same_file = theirs.path == ours.path
        || crate::outfile::same_file(Path::new(&theirs.path), Path::new(&ours.path));
    let mut changes = Vec::new();
    if !same_file {
        changes.push(format!(
            "data.path = {:?}, and this run reads {:?}",
            theirs.path, ours.path
        ));
    }
    if theirs.order != ours.order {
        let name = |o: &crate::config::DataOrder| format!("{o:?}").to_lowercase();
        changes.push(format!(
            "data.order = \"{}\", and this run has \"{}\" (--set data.order='\"{}\"')",
            name(&theirs.order),
            name(&ours.order),
            name(&theirs.order)
        ));
    }
    (!changes.is_empty()).then(|| changes.join("; "))
}

/// "GPT-2" or "Llama".
fn family(m: &zero_models::ModelPreset) -> &'static str {
    match m {
        zero_models::ModelPreset::Gpt(_) => "GPT-2",
        zero_models::ModelPreset::Llama(_) => "Llama",
    }
}

/// Where a run resumed from `resume` without `--ckpt-dir` saves: a root (a directory
/// with `latest`) is a run to continue, so `--resume ckpt` alone goes on saving there as
/// that run did. A step directory may be another run's (a base model to fine-tune, a
/// read-only copy): nothing is assumed, and the run saves nothing unless given
/// `--ckpt-dir`.
pub fn default_ckpt_dir(resume: &Path) -> Option<PathBuf> {
    resume
        .join(checkpoint::LATEST)
        .is_file()
        .then(|| resume.to_path_buf())
}

/// Refuse `dir` when it holds an earlier run's checkpoints (a `latest` pointer) and this
/// run does not resume: its saves would replace that run's steps.
fn earlier_run(dir: &Path) -> anyhow::Result<()> {
    let latest = dir.join(checkpoint::LATEST);
    let Ok(text) = std::fs::read_to_string(&latest) else {
        // Complete steps without a pointer: a run that died between its first checkpoint
        // and `latest`, or steps copied in by hand. Saves would replace them as well.
        let complete: Vec<String> = checkpoint::step_dirs(dir)
            .into_iter()
            .filter(|(_, name)| dir.join(name).join(checkpoint::META_FILE).is_file())
            .map(|(_, name)| name)
            .collect();
        if let Some(newest) = complete.last() {
            bail!(
                "--ckpt-dir {} holds complete checkpoints ({}) but no `latest` pointer (a run that died during its first save, or steps copied in): this run would save over them; pass --resume {} to continue from the newest, or give another --ckpt-dir (or remove them) to start afresh",
                dir.display(),
                complete.join(", "),
                dir.join(newest).display()
            );
        }
        return Ok(());
    };
    bail!(
        "--ckpt-dir {} already holds the checkpoints of an earlier run (latest: {}); pass --resume {} to continue that run, or give another --ckpt-dir (or remove that one) to start afresh",
        dir.display(),
        text.trim(),
        dir.display()
    )
}

/// Refuse `dir` when it holds a run's checkpoints (a `latest` pointer) and `--resume`
/// names a checkpoint outside it: its saves would replace that run's steps with another
/// history's. A checkpoint of `dir` itself (its `latest`, or one of its `step-S`) is fine:
/// `true`, the run may branch there ([`set_aside_later_steps`], once loaded).
fn resumed_elsewhere(dir: &Path, from: &Path) -> anyhow::Result<bool> {
    let Ok(text) = std::fs::read_to_string(dir.join(checkpoint::LATEST)) else {
        return Ok(false);
    };
    // An unreadable --resume is reported where it is loaded, with its own message.
    let Ok(step_dir) = checkpoint::resolve(from) else {
        return Ok(false);
    };
    // Through links: the root the step directory really is in.
    let step_dir = std::fs::canonicalize(&step_dir).unwrap_or(step_dir);
    let root = step_dir.parent().unwrap_or(Path::new("."));
    let root = if root.as_os_str().is_empty() {
        Path::new(".")
    } else {
        root
    };
    if crate::outfile::same_file(root, dir) {
        return Ok(true);
    }
    bail!(
        "--ckpt-dir {} holds the checkpoints of another run (latest: {}), and --resume {} is not one of them: its saves would replace that run's steps; pass --resume {} to continue that run, or give another --ckpt-dir (or remove that one) to continue from {}",
        dir.display(),
        text.trim(),
        from.display(),
        dir.display(),
        from.display()
    )
}

/// The run resumed step `step` (from `step_dir`, `--resume given`) of `dir` itself, and
/// `dir` holds later steps (a run that went on past it, resumed from an earlier step to
/// try something else): this run branches there, and its saves would replace those steps
/// one by one, leaving the two histories mixed in one root (and `keep_last` counting the
/// other run's steps). Called once the state is loaded on every rank (a refused resume
/// changes nothing): `latest` is pointed at `step-S` first (a step a crashed save left
/// as `old-step-S-*` is moved back to that name, or the next save's cleanup would remove
/// it), then the later steps are moved (renamed, nothing copied or lost) into
/// `dir/abandoned-after-step-S-<unix seconds>/`, where no resume finds them by accident.
/// A crash part way leaves `latest` naming the step this run started from.
fn set_aside_later_steps(
    dir: &Path,
    step_dir: &Path,
    given: &Path,
    step: u64,
) -> anyhow::Result<()> {
    let later: Vec<String> = checkpoint::step_dirs(dir)
        .into_iter()
        .filter(|(s, _)| *s > step)
        .map(|(_, name)| name)
        .collect();
    if later.is_empty() {
        return Ok(());
    }
    let fail = |what: &str, path: &Path, e: std::io::Error| {
        anyhow!(
            "--resume {} branches from step {step}, and --ckpt-dir {} holds later steps ({}) this run's saves would replace; {what} '{}' failed ({e}); move them out of the way yourself, or give another --ckpt-dir",
            given.display(),
            dir.display(),
            later.join(", "),
            path.display()
        )
    };
    let name = format!("step-{step}");
    let home = dir.join(&name);
    if !home.exists() {
        std::fs::rename(step_dir, &home).map_err(|e| fail("moving back", step_dir, e))?;
    }
    checkpoint::point_latest(dir, &name)
        .with_context(|| format!("--resume {}: pointing `latest` at {name}", given.display()))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = dir.join(format!("abandoned-after-step-{step}-{stamp}"));
    std::fs::create_dir(&aside).map_err(|e| fail("creating", &aside, e))?;
    for later_step in &later {
        let (old, new) = (dir.join(later_step), aside.join(later_step));
        std::fs::rename(&old, &new).map_err(|e| fail("moving", &old, e))?;
    }
    // The renames recorded on disk (a failure only risks them after a crash: warned).
    for d in [&aside, dir] {
        if let Err(e) = checkpoint::sync_dir(d) {
            log::warn!("{e}: a crash soon may undo the renames there");
        }
    }
    log::warn!(
        "--resume {} branches from step {step}: the later steps {} of the run that went on from there were moved to '{}' (this run's saves would have replaced them); `latest` names step {step}",
        given.display(),
        later.join(", "),
        aside.display()
    );
    Ok(())
}

/// Write, sync and remove a small file in `dir`: this rank can save its shard there.
/// (The message does not name the rank: identical messages are printed once, with the
/// count of ranks that gave it.)
fn probe(dir: &Path, rank: usize) -> anyhow::Result<()> {
    super::outputs::try_file_in(dir, &format!(".write-test-rank-{rank}")).map_err(|e| {
        anyhow!(
            "--ckpt-dir {}: cannot write a file there ({e}); give a directory every rank can write (a read-only or missing mount?); without --ckpt-dir, --resume of a root saves into that root",
            dir.display()
        )
    })
}

/// The ranks' collectives failed while checking the set-up: they may be at different
/// points, so end the job here (as `agree` does) rather than wait in MPI_Finalize.
fn broken(e: zero_comm::CommError) -> Failure {
    zero_comm::abort(
        &format!("error: checking --ckpt-dir/--resume across ranks: {e}"),
        1,
    )
}

/// The name of the lock file in a checkpoint directory.
pub const LOCK_FILE: &str = ".zero-lock";

/// Directories this process holds locked (each until the process ends: the lock is the
/// open file). A second run in the same process reuses its lock.
static LOCKED: std::sync::Mutex<Vec<(PathBuf, std::fs::File)>> = std::sync::Mutex::new(Vec::new());

/// Lock `dir` for this job (rank 0): `flock` on `.zero-lock`, which then names the holder.
/// Another job holding it is an error that names that job; a file system that refuses
/// locks, a warning. (A mount whose locks are only node-local, NFS `nolock` or Lustre
/// `localflock`, accepts them silently: two jobs whose rank 0 runs on different nodes
/// are then not kept apart.)
fn lock(dir: &Path) -> anyhow::Result<()> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let mut held = LOCKED.lock().unwrap_or_else(|p| p.into_inner());
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    if held.iter().any(|(d, _)| *d == canonical) {
        return Ok(());
    }
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| {
            format!(
                "--ckpt-dir {}: cannot open its lock file {}",
                dir.display(),
                path.display()
            )
        })?;
    // SAFETY: flock(2) on a descriptor this function owns; no memory involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        let no_locks = [libc::ENOLCK, libc::EOPNOTSUPP, libc::ENOSYS, libc::EINVAL];
        if e.raw_os_error().is_some_and(|c| no_locks.contains(&c)) {
            log::warn!(
                "--ckpt-dir {}: its file system takes no locks ({e}); nothing stops another job from saving into the same directory, which would replace this run's steps",
                dir.display()
            );
            return Ok(());
        }
        if e.kind() == std::io::ErrorKind::WouldBlock {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            // A holder naming this Slurm job with a lower restart count is the instance
            // before a requeue (Slurm never runs two at once), whose lock a network file
            // system may keep for a while after its node failed (until the lock's lease
            // or the client's eviction ends). Go on, saying so. (The same instance, e.g.
            // two srun steps of one allocation, has the same count: refused.)
            if let Some((job, restart)) = slurm_instance() {
                let earlier = holder
                    .rsplit_once(&format!("Slurm job {job} restart "))
                    .and_then(|(_, n)| n.trim().parse::<u64>().ok())
                    .is_some_and(|n| n < restart);
                if earlier {
                    log::warn!(
                        "--ckpt-dir {}: its lock is still held by an earlier instance of this Slurm job ({holder}; requeued after a node failure?); going on without it",
                        dir.display()
                    );
                    return Ok(());
                }
            }
            bail!(
                "--ckpt-dir {} is in use by another job{}: two runs saving into one directory replace each other's steps. Give this run another --ckpt-dir, or wait for that job to end (its lock, {}, goes with it)",
                dir.display(),
                if holder.is_empty() { String::new() } else { format!(" ({holder})") },
                path.display()
            );
        }
        bail!(
            "--ckpt-dir {}: cannot lock {}: {e}",
            dir.display(),
            path.display()
        );
    }
    // Who holds it, for the message above (best effort: the lock is what counts).
    let job = slurm_instance().map_or(String::new(), |(j, r)| {
        format!(", Slurm job {j} restart {r}")
    });
    let _ = file.set_len(0).and_then(|_| file.rewind()).and_then(|_| {
        writeln!(
            file,
            "process {} on {}{job}",
            std::process::id(),
            zero_comm::socket::host_name()
        )
    });
    held.push((canonical, file));
    Ok(())
}

/// This Slurm job's id and restart count (`SLURM_RESTART_COUNT`, 0 before a requeue);
/// `None` outside Slurm.
fn slurm_instance() -> Option<(String, u64)> {
    let job = std::env::var("SLURM_JOB_ID").ok()?;
    let restart = std::env::var("SLURM_RESTART_COUNT")
        .ok()
        .and_then(|r| r.trim().parse().ok())
        .unwrap_or(0);
    Some((job, restart))
}

/// Every rank finds a file that rank 0 wrote into `dir` (collective): the ranks share
/// the directory. Rank 0 writes a marker named by a fresh nonce and broadcasts the
/// nonce; the others look for it for up to 10 s (a network file system may take a
/// moment), and those that never see it fail, named.
fn seen_by_every_rank<C: Communicator>(comm: &C, dir: &Path) -> Result<(), Failure> {
    if comm.size() == 1 {
        return Ok(());
    }
    let rank = comm.rank();
    let mut id = [checkpoint::fresh_nonce()];
    comm.broadcast(&mut id[..], 0).map_err(broken)?;
    let marker = dir.join(format!(".shared-test-{:x}", id[0]));
    let written = match rank {
        0 => std::fs::File::create(&marker)
            .and_then(|f| f.sync_all())
            .with_context(|| {
                format!(
                    "--ckpt-dir {}: cannot write {}",
                    dir.display(),
                    marker.display()
                )
            }),
        _ => Ok(()),
    };
    agree(comm, written)?;
    // Listed rather than looked up: NFS caches a lookup's "no such file" for a while,
    // while a listing asks the server again once the directory changed.
    let listed = || {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .any(|e| Some(e.file_name().as_os_str()) == marker.file_name())
            })
            .unwrap_or(false)
    };
    let seen = if rank == 0 {
        Ok(())
    } else {
        let start = std::time::Instant::now();
        let mut found = listed();
        while !found && start.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(100));
            found = listed();
        }
        if found {
            Ok(())
        } else {
            Err(anyhow!(
                "--ckpt-dir {}: rank 0 wrote {} there, and this rank does not see it: the directory is not one directory shared by all ranks (node-local storage under the same path?), so rank 0's metadata and the other ranks' shards would never meet; give a directory on a file system every node shares",
                dir.display(),
                marker.display()
            ))
        }
    };
    let outcome = agree(comm, seen);
    if rank == 0 {
        let _ = std::fs::remove_file(&marker);
    }
    outcome
}

/// Every rank resolved `--resume` to the same checkpoint (collective): same step and the
/// same `meta.json` bytes (their CRC32; the file holds every shard's checksums). A rank that read another
/// fails, named, with rank 0's step and its own.
fn same_checkpoint_on_every_rank<C: Communicator>(
    comm: &C,
    given: &Path,
    dir: &Path,
    meta: &Meta,
) -> Result<(), Failure> {
    if comm.size() == 1 {
        return Ok(());
    }
    let meta_path = dir.join(checkpoint::META_FILE);
    let bytes = std::fs::read(&meta_path).with_context(|| {
        format!(
            "--resume {}: reading {}",
            given.display(),
            meta_path.display()
        )
    });
    // CRC32 of the bytes: the same in every process and build. A rank that cannot read
    // the file takes part with -1 and reports its own error.
    let crc = bytes.as_ref().map_or(-1, |b| crc32fast::hash(b) as i64);
    let mine = [meta.step as i64, crc];
    let unlike = zero_comm::unlike_rank_0(comm, &mine).map_err(broken)?;
    let root = &unlike.root;
    let result = if let Err(e) = bytes {
        Err(e)
    } else if !unlike.differs(comm.rank()) {
        Ok(())
    } else {
        Err(anyhow!(
            "--resume {}: this rank read {} (step {}), which is not the checkpoint rank 0 read (step {}{}): every rank must load the same files, or the model would be a mix of two states; put the checkpoint on a file system all nodes share, or refresh the node-local copies",
            given.display(),
            dir.display(),
            meta.step,
            root[0],
            if root[0] == mine[0] { ", another meta.json" } else { "" }
        ))
    };
    agree(comm, result)
}
