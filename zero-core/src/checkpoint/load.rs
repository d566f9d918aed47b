//! Loading (collective), with resharding: a checkpoint written by N ranks at any stage
//! loads on M ranks at any stage. Each rank asks the engine what it keeps of a unit (its
//! shard at stages 1-3, the whole unit at stage 0), intersects that with the N saved
//! blocks (`PartitionLayout::reshard_from`), and reads only those hyperslabs, each
//! checked against the saved CRCs. Nothing is gathered; peak extra memory is one
//! hyperslab (at most one unit's shard plus two checksum blocks), and at most
//! `MAX_OPEN_SHARDS` shard files are open at once, however many ranks saved.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use zero_comm::Communicator;
use zero_kernels::device::Device;

use super::meta::Meta;
use super::shard::{cached_reader, ShardReader, KINDS};
use super::{CheckpointError, LATEST};
use crate::config::Stage;
use crate::engine::{Engine, EngineError, LossScaler};
use crate::layout::PartitionLayout;

/// What was loaded.
#[derive(Clone, Debug)]
pub struct LoadInfo {
    /// The step directory read.
    pub dir: PathBuf,
    /// Its metadata (step, world, stage, scaler, config...).
    pub meta: Meta,
}

/// The step directory `path` names: `path` itself when it holds a `meta.json`, else the
/// directory its `latest` pointer names.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    if path.join(super::META_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join(LATEST);
    let text = std::fs::read_to_string(&latest).map_err(|e| {
        if path.exists() {
            CheckpointError::Meta {
                path: latest.clone(),
                reason: format!(
                    "cannot read the checkpoint pointer ({e}), and '{}' is not a step directory either{}",
                    path.display(),
                    step_dirs_hint(path)
                ),
            }
        } else {
            CheckpointError::io("open checkpoint directory", path)(e)
        }
    })?;
    let name = text.trim();
    if name.is_empty() || name.contains('/') || name == ".." {
        return Err(CheckpointError::Meta {
            path: latest,
            reason: format!("names '{name}', not a step directory"),
        });
    }
    let dir = path.join(name);
    if dir.exists() {
        return Ok(dir);
    }
    // A save that replaced this step crashed after moving it aside (see `replaced_step`):
    // the moved copy is complete. The next save moves it back.
    if let Some(aside) = super::save::moved_aside(path, name) {
        log::warn!(
            "'{}' names '{name}', which a crashed save moved to '{}': reading that",
            latest.display(),
            aside.display()
        );
        return Ok(aside);
    }
    Err(CheckpointError::Meta {
        path: latest,
        reason: format!(
            "names '{name}', which does not exist{}",
            step_dirs_hint(path)
        ),
    })
}

/// "; complete step directories here: step-4, step-8 (pass one to --resume)", or "" when
/// there are none.
fn step_dirs_hint(root: &Path) -> String {
    let complete: Vec<String> = super::step_dirs(root)
        .into_iter()
        .map(|(_, name)| name)
        .filter(|name| root.join(name).join(super::META_FILE).is_file())
        .collect();
    if complete.is_empty() {
        return String::new();
    }
    format!(
        "; complete step directories here: {} (name one to load it)",
        complete.join(", ")
    )
}

/// Load the checkpoint at `path` (a step directory or a root with `latest`) into
/// `engine`, resharding as needed. Collective: on error every rank returns an error. One
/// found before any state moved (no checkpoint at `path`, another model's, ranks that
/// read different checkpoints under `path`: [`CheckpointError::Differs`]) leaves every
/// engine as it was, so the caller may train from scratch instead; one after (a shard
/// that fails its checksum) leaves every engine refusing steps, exports and saves
/// ([`EngineError::ImportPending`]) until a load succeeds.
pub fn load<D: Device, C: Communicator>(
    engine: &mut Engine<'_, D, C>,
    path: &Path,
) -> Result<LoadInfo, CheckpointError> {
    // Before any collective, as `save`: after a step failed part-way the ranks may be at
    // different ones (a new engine is to load the checkpoint).
    if let Some(step) = engine.interrupted() {
        return Err(EngineError::Interrupted { step }.into());
    }
    let comm = engine.communicator();
    // What is to be loaded, agreed before any state moves.
    let found = resolve(path).and_then(|dir| {
        let (meta, crc) = Meta::read_with_crc(&dir)?;
        meta.check_fits(engine.layout(), &dir)?;
        Ok((LoadInfo { dir, meta }, crc))
    });
    let (info, crc) = super::agree(comm, found, "load", path)?;
    same_checkpoint_on_every_rank(comm, &info, crc, path)?;
    // Every rank's engine counts as part-imported from here until the load succeeds
    // (Engine::begin_import), also one that fails before it imports a unit: no rank may
    // step while the others refuse.
    engine.begin_import();
    let filled = fill(engine, &info.dir, &info.meta);
    super::agree(comm, filled, "load", path)?;
    let m = &info.meta;
    if comm.rank() == 0 && m.seed != engine.config().seed {
        log::warn!(
            "checkpoint '{}' was initialised with seed {}, this run has seed {} (it matters only if the data order derives from it)",
            info.dir.display(),
            m.seed,
            engine.config().seed
        );
    }
    // What belongs to the precision comes from this run's configuration when the
    // precision changed: an fp32 checkpoint resumed in fp16 scales dynamically from the
    // configured initial scale, an fp16 one resumed in fp32 has no scaler.
    let precision = engine.config().precision.clone();
    let same_precision =
        m.precision == precision.dtype && m.scaler.enabled == precision.loss_scaling();
    let scaler = if same_precision {
        m.scaler.with_policy_of(&precision)
    } else {
        LossScaler::new(&precision)
    };
    let mut history = m.history.clone();
    history.push(format!(
        "after step {}: resumed from '{}' (saved by {} rank(s) at {:?}, {:?}) on {} rank(s) at {:?}, {:?}",
        m.step,
        info.dir.display(),
        m.world,
        m.stage,
        m.precision,
        comm.size(),
        engine.config().zero.stage,
        precision.dtype
    ));
    if !same_precision {
        let change = format!(
            "after step {}: precision {:?} (loss scaling {}) -> {:?} (loss scaling {}): the loss scaler restarts from this run's configuration (scale {})",
            m.step,
            m.precision,
            if m.scaler.enabled { "on" } else { "off" },
            precision.dtype,
            if scaler.enabled { "on" } else { "off" },
            scaler.scale
        );
        if comm.rank() == 0 {
            log::warn!("{change}");
        }
        history.push(change);
    }
    engine.finish_import(m.step, m.applied, scaler)?;
    engine.restore_run(m.loss_guard.clone(), history);
    if comm.rank() == 0 {
        log::info!(
            "loaded checkpoint '{}' (step {}, saved by {} ranks at {:?}, loaded on {} at {:?})",
            info.dir.display(),
            m.step,
            m.world,
            m.stage,
            comm.size(),
            engine.config().zero.stage
        );
    }
    Ok(info)
}

/// Refuse, on every rank, a load whose ranks read different checkpoints: each imports
/// from its own `meta.json`, so a stale node-local copy would load as a mix of two
/// states. Compares each rank's step and `meta.json` CRC with rank 0's. Collective on
/// every rank alike (one all-gather; none on one rank), before any state moves.
fn same_checkpoint_on_every_rank<C: Communicator>(
    comm: &C,
    info: &LoadInfo,
    crc: u32,
    path: &Path,
) -> Result<(), CheckpointError> {
    if comm.size() == 1 {
        return Ok(());
    }
    // The step travels as i64 and back: the same bits on every rank.
    let mine = [info.meta.step as i64, i64::from(crc)];
    let unlike = zero_comm::unlike_rank_0(comm, &mine)?;
    if unlike.none() {
        return Ok(());
    }
    let step = |v: &[i64]| v.first().map_or(0, |&s| s as u64);
    Err(CheckpointError::Differs {
        path: path.to_path_buf(),
        dir: info.dir.clone(),
        root_step: step(&unlike.root),
        others: unlike.others.iter().map(|(r, v)| (*r, step(v))).collect(),
    })
}

/// Fill every unit this rank keeps from the saved blocks.
fn fill<D: Device, C: Communicator>(
    engine: &mut Engine<'_, D, C>,
    dir: &Path,
    meta: &Meta,
) -> Result<(), CheckpointError> {
    let rank = engine.communicator().rank();
    // The copies: into this rank's shard (stages 1-3), or into the whole unit (stage 0,
    // expressed as the single shard of a 1-rank layout of the same model).
    let copies = if engine.config().zero.stage == Stage::Zero0 {
        PartitionLayout::new(engine.spec(), 1, engine.layout().align)
            .and_then(|whole| whole.reshard_from(&meta.layout, 0))
    } else {
        engine.layout().reshard_from(&meta.layout, rank)
    }
    .map_err(|e| CheckpointError::Incompatible {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    // Bounded (`MAX_OPEN_SHARDS`): at stage 0 this rank reads every one of the N files.
    let mut files: HashMap<usize, ShardReader> = HashMap::new();
    let mut next = 0;
    for u in 0..engine.layout().units.len() {
        let kept = engine.import_range(u)?.len();
        let mut dst = [vec![0.0f32; kept], vec![0.0f32; kept], vec![0.0f32; kept]];
        while next < copies.len() && copies[next].unit == u {
            let c = &copies[next];
            next += 1;
            let reader = cached_reader(&mut files, dir, meta, c.from_rank)?;
            let len = meta.layout.units[u].shard_len;
            for (kind, (out, name)) in dst.iter_mut().zip(KINDS).enumerate() {
                let crcs =
                    meta.crcs(c.from_rank, u, kind)
                        .ok_or_else(|| CheckpointError::Meta {
                            path: dir.join(super::META_FILE),
                            reason: format!(
                                "no checksums for rank {} unit {u} {name}",
                                c.from_rank
                            ),
                        })?;
                let to = &mut out[c.to.clone()];
                reader.read_checked_into(
                    u,
                    kind,
                    c.from.clone(),
                    len,
                    crcs,
                    meta.block_elems,
                    to,
                )?;
            }
        }
        let [master, m, v] = &dst;
        engine.import_unit(u, master, m, v)?;
    }
    Ok(())
}
