//! What `--ckpt-dir` and `--resume` need, checked on every rank before step 1, so that a
//! run that could not save, or should not resume, stops before it spends its allocation:
//!
//! - `--ckpt-dir`: rank 0 creates it; every rank writes and removes a probe file there
//!   (each rank writes its own shard into it later). A directory that cannot be created,
//!   a read-only filesystem, or one that a rank cannot see is an error naming the rank.
//!   Without `--save-every` the run saves once, after its last step.
//! - `--resume`: every rank reads the checkpoint's metadata. `train.steps` must be above
//!   the checkpoint's step, and the global batch (ranks x grad_accum x micro_batch rows
//!   of seq_len tokens) must be the checkpoint's unless `--allow-batch-change` says
//!   otherwise; the change is then logged and recorded in the next checkpoints.
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
}

impl Resume {
    /// Its step.
    pub fn step(&self) -> u64 {
        self.step
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
        (self.world * self.accum * self.rows, self.seq_len)
            == (other.world * other.accum * other.rows, other.seq_len)
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

    fn tokens(&self) -> usize {
        self.world * self.accum * self.rows * self.seq_len
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
    if let Some(dir) = &args.ckpt_dir {
        let created = match rank {
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
        // Another run's checkpoints: a fresh run, or one resumed from elsewhere, would
        // replace its steps one by one.
        let earlier = match (rank, &args.resume) {
            (0, None) => earlier_run(dir),
            (0, Some(from)) => resumed_elsewhere(dir, from),
            _ => Ok(()),
        };
        agree(comm, earlier)?;
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
            meta.step + steps.max(1)
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
    let ours = GlobalBatch::of(config, comm.size());
    let batch_change = match saved_batch(&meta) {
        Ok(theirs) if theirs == ours => None,
        Ok(theirs) if args.allow_batch_change => {
            let line = format!(
                "after step {}: global batch changed from {theirs} to {ours} (--allow-batch-change)",
                meta.step
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
    let info =
        checkpoint::load(engine, from).with_context(|| format!("resuming from {}", from.display()));
    let info = agree(comm, info)?;
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

/// Save a checkpoint of `engine` under the root `dir`, keeping the newest `keep_last`,
/// with `app_config` (this tool's configuration) in its metadata. Collective; returns
/// the step directory.
pub fn save<D: Device, E: Communicator>(
    engine: &Engine<'_, D, E>,
    dir: &Path,
    keep_last: usize,
    app_config: Option<&str>,
) -> anyhow::Result<PathBuf> {
    let opts = SaveOptions {
        keep_last,
        app_config,
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

/// Refuse `dir` when it holds an earlier run's checkpoints (a `latest` pointer) and this
/// run does not resume: its saves would replace that run's steps.
fn earlier_run(dir: &Path) -> anyhow::Result<()> {
    let latest = dir.join(checkpoint::LATEST);
    let Ok(text) = std::fs::read_to_string(&latest) else {
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
/// history's. A checkpoint of `dir` itself (its `latest`, or one of its `step-S`) is fine.
fn resumed_elsewhere(dir: &Path, from: &Path) -> anyhow::Result<()> {
    let Ok(text) = std::fs::read_to_string(dir.join(checkpoint::LATEST)) else {
        return Ok(());
    };
    // An unreadable --resume is reported where it is loaded, with its own message.
    let Ok(step_dir) = checkpoint::resolve(from) else {
        return Ok(());
    };
    // Through links: the root the step directory really is in.
    let step_dir = std::fs::canonicalize(&step_dir).unwrap_or(step_dir);
    let root = step_dir.parent().unwrap_or(Path::new("."));
    let root = if root.as_os_str().is_empty() {
        Path::new(".")
    } else {
        root
    };
    if super::outputs::same_file(root, dir) {
        return Ok(());
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

/// Write, sync and remove a small file in `dir`: this rank can save its shard there.
/// (The message does not name the rank: identical messages are printed once, with the
/// count of ranks that gave it.)
fn probe(dir: &Path, rank: usize) -> anyhow::Result<()> {
    super::outputs::try_file_in(dir, &format!(".write-test-rank-{rank}")).map_err(|e| {
        anyhow!(
            "--ckpt-dir {}: cannot write a file there ({e}); give a directory every rank can write (a read-only or missing mount?)",
            dir.display()
        )
    })
}
