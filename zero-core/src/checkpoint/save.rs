//! The save protocol (collective: every rank calls [`save`] with the same arguments).
//!
//! 1. Rank 0 creates `<root>`, removes dead `tmp-step-*` directories of earlier crashed
//!    saves (best effort: what it cannot remove is logged and left, see [`clean_partial`]),
//!    creates `tmp-step-<S>-<nonce>/` and broadcasts the nonce (or its failure).
//! 2. Every rank streams its blocks unit by unit into `rank-<r:05>.h5` (no gather), then
//!    flushes, closes and fsyncs the file.
//! 3. Agreement: an all-reduce of "failed" flags; if any rank failed, nobody publishes
//!    and rank 0 removes the temporary directory (the previous checkpoint is untouched).
//! 4. The block CRCs are all-gathered (a few bytes per 256 KiB) and rank 0 writes
//!    `meta.json`, fsyncs it and the directory, renames the directory to `step-<S>`,
//!    writes `latest.tmp`, fsyncs, renames it over `latest`, fsyncs `<root>`, and prunes
//!    old steps beyond `keep_last`. The outcome is broadcast so every rank returns it.
//!
//! A crash anywhere before the final rename of `latest` leaves `latest` naming the
//! previous complete checkpoint; a crash between the two renames leaves a complete
//! `step-<S>` that `latest` does not name yet (still loadable by its path).

use std::path::{Path, PathBuf};

use zero_comm::Communicator;
use zero_kernels::device::Device;

use super::meta::Meta;
use super::shard::{ShardWriter, BLOCK_ELEMS, KINDS};
use super::{rank_file, step_dir_name, CheckpointError, LATEST, META_FILE};
use crate::engine::{Engine, EngineError};

/// How to save.
pub struct SaveOptions<'a> {
    /// Complete checkpoints to keep (the newest ones; at least 1).
    pub keep_last: usize,
    /// The application's own configuration, recorded in the metadata as given
    /// (`zero-bench` passes its TOML), so a checkpoint says how it was trained.
    pub app_config: Option<&'a str>,
    /// The application's own state at this step, recorded as given and read back as
    /// [`Meta::app_state`] (zero-bench records its data position: a resumed run with
    /// another global batch reads on from it). The same on every rank.
    pub app_state: Option<&'a str>,
    /// Called on this rank after each unit is written (progress, fault injection in tests).
    pub after_unit: Option<&'a dyn Fn(usize)>,
}

impl Default for SaveOptions<'_> {
    fn default() -> Self {
        SaveOptions {
            keep_last: 3,
            app_config: None,
            app_state: None,
            after_unit: None,
        }
    }
}

/// Write `bytes` to `path` and fsync it.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(CheckpointError::io("create", path))?;
    f.write_all(bytes)
        .map_err(CheckpointError::io("write", path))?;
    f.sync_all().map_err(CheckpointError::io("fsync", path))
}

/// fsync a directory (makes renames and creations inside it durable).
pub fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(CheckpointError::io("fsync directory", dir))
}

/// Point `root`'s `latest` at its step directory `name`, atomically and durably (written
/// beside, synced, renamed over, the directory synced): a crash leaves the old pointer
/// or the new one.
pub fn point_latest(root: &Path, name: &str) -> Result<(), CheckpointError> {
    let latest_tmp = root.join(format!("{LATEST}.tmp"));
    write_synced(&latest_tmp, format!("{name}\n").as_bytes())?;
    let latest = root.join(LATEST);
    std::fs::rename(&latest_tmp, &latest).map_err(CheckpointError::io("rename", &latest_tmp))?;
    sync_dir(root)
}

/// What [`clean_partial`] did. Every failure was also logged as a warning.
#[derive(Debug, Default)]
pub struct Cleaned {
    /// Directories removed: dead `tmp-step-*` of crashed saves, stale `old-step-*` copies.
    pub removed: Vec<PathBuf>,
    /// Step directories put back from the copy an interrupted save had moved aside.
    pub restored: Vec<PathBuf>,
    /// What could not be listed, removed or put back (left as it is), each with why.
    pub failed: Vec<CheckpointError>,
}

impl Cleaned {
    fn fail(&mut self, e: CheckpointError) {
        log::warn!("checkpoint clean-up: {e} (left in place)");
        self.failed.push(e);
    }
}

/// Remove the temporary directories of saves that never completed (a crashed run), except
/// `keep` (the save in progress), and the stale copies of replaced steps; put back the
/// copy of a step whose replacement was interrupted (`latest` names the step, which is
/// missing). Best effort: garbage that cannot be removed is logged and left, never an
/// error, so that it cannot stop later saves. Not collective: call it on one rank, with
/// no save running in `root`.
pub fn clean_partial(root: &Path, keep: Option<&Path>) -> Cleaned {
    let mut done = Cleaned::default();
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return done,
        Err(e) => {
            done.fail(CheckpointError::io("list", root)(e));
            return done;
        }
    };
    // Only the step `latest` names can have lost its directory to an interrupted replace;
    // an `old-step-S-*` of any other S (`step-S` pruned since, or replaced in full) is stale.
    let named = latest_name(root);
    let mut restore = None;
    if let Ok(Some(name)) = &named {
        if !root.join(name).exists() {
            restore = moved_aside(root, name);
        }
    }
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                done.fail(CheckpointError::io("list", root)(e));
                continue;
            }
        };
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if Some(path.as_path()) == keep || !path.is_dir() {
            continue;
        }
        if let Some(step_dir) = replaced_step(&name) {
            let original = root.join(step_dir);
            if restore.as_ref() == Some(&path) {
                // The only copy of the step `latest` names: a save crashed between moving
                // it aside and renaming the new one in.
                log::warn!(
                    "restoring checkpoint '{}' from '{}' (a save replacing it was interrupted)",
                    original.display(),
                    path.display()
                );
                match std::fs::rename(&path, &original) {
                    Ok(()) => done.restored.push(original),
                    // `resolve` still reads the moved copy, so nothing is lost.
                    Err(e) => done.fail(CheckpointError::io("restore", &path)(e)),
                }
                continue;
            }
            if named.is_err() {
                // Without `latest` we cannot tell a stale copy from the only one: keep it.
                log::warn!(
                    "checkpoint clean-up: keeping '{}' ('{}' is unreadable, so it may be the only copy of {step_dir})",
                    path.display(),
                    root.join(LATEST).display()
                );
                continue;
            }
        }
        if name.starts_with("tmp-step-") || name.starts_with("old-step-") {
            log::warn!("removing incomplete checkpoint '{}'", path.display());
            match std::fs::remove_dir_all(&path) {
                Ok(()) => done.removed.push(path),
                Err(e) => done.fail(CheckpointError::io("remove", &path)(e)),
            }
        }
    }
    done
}

/// The directory `latest` in `root` names: `None` when there is no `latest`, an error
/// when it cannot be read.
fn latest_name(root: &Path) -> Result<Option<String>, std::io::Error> {
    match std::fs::read_to_string(root.join(LATEST)) {
        Ok(text) => Ok(Some(text.trim().to_string()).filter(|n| !n.is_empty())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The complete `old-<name>-<nonce>` copy of step directory `name` in `root` (one with its
/// metadata), if any; of several (a stale one that could not be removed and the one an
/// interrupted save moved aside), the one whose metadata was written last, which is the
/// copy the step directory held when the save was interrupted.
pub(crate) fn moved_aside(root: &Path, name: &str) -> Option<PathBuf> {
    std::fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| replaced_step(&e.file_name().to_string_lossy()) == Some(name))
        .filter_map(|e| {
            let meta = std::fs::metadata(e.path().join(META_FILE)).ok()?;
            meta.is_file().then(|| (meta.modified().ok(), e.path()))
        })
        .max()
        .map(|(_, path)| path)
}

/// The step directory name an `old-step-<S>-<nonce>` directory was moved aside from.
pub(crate) fn replaced_step(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("old-")?;
    let (step_dir, nonce) = rest.rsplit_once('-')?;
    let digits = step_dir.strip_prefix("step-")?;
    let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let all_hex = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_hexdigit());
    (all_digits(digits) && all_hex(nonce)).then_some(step_dir)
}

/// Save `engine`'s state as `<root>/step-<S>` (S = steps done) and point `latest` at it.
/// Collective. Returns the step directory.
pub fn save<D: Device, C: Communicator>(
    engine: &Engine<'_, D, C>,
    root: &Path,
    opts: &SaveOptions<'_>,
) -> Result<PathBuf, CheckpointError> {
    if opts.keep_last == 0 {
        return Err(CheckpointError::Invalid(
            "keep_last must be at least 1 (the checkpoint just written)".into(),
        ));
    }
    // Before any collective: after a step failed part-way the ranks may be at different
    // ones, and the state is half a step's.
    if let Some(step) = engine.interrupted() {
        return Err(EngineError::Interrupted { step }.into());
    }
    // Part old, part new state is not saved (every rank agrees: load marks them all).
    if engine.import_pending() {
        return Err(EngineError::ImportPending.into());
    }
    let comm = engine.communicator();
    let (rank, world) = (comm.rank(), comm.size());
    let step = engine.steps_done();

    // 1. Rank 0 prepares the temporary directory and broadcasts its nonce.
    let mut head = [0i64; 2];
    let mut prepared = Ok(());
    if rank == 0 {
        let nonce = super::fresh_nonce();
        let tmp = root.join(format!("tmp-step-{step}-{nonce:x}"));
        prepared = std::fs::create_dir_all(root)
            .map_err(CheckpointError::io("create directory", root))
            .and_then(|_| {
                // Best effort (logged): only what this checkpoint needs may fail the save.
                clean_partial(root, None);
                std::fs::create_dir(&tmp).map_err(CheckpointError::io("create directory", &tmp))
            });
        head = [1, nonce];
    }
    super::agree(comm, prepared, "save", root)?;
    comm.broadcast(&mut head[..], 0)?;
    let tmp = root.join(format!("tmp-step-{step}-{:x}", head[1]));

    // 2. Every rank writes its own file.
    let written = write_shard(engine, &tmp, opts);
    // 3. Agree before anything becomes visible.
    let crcs = match super::agree(comm, written, "save", &tmp) {
        Ok(crcs) => crcs,
        Err(e) => {
            if rank == 0 {
                if let Err(e) = std::fs::remove_dir_all(&tmp) {
                    log::warn!("could not remove '{}': {e}", tmp.display());
                }
            }
            // No rank returns before the partial directory is gone.
            comm.barrier()?;
            return Err(e);
        }
    };

    // 4. Checksums to rank 0, metadata, renames.
    let flat: Vec<i64> = crcs.iter().flatten().flatten().map(|&c| c as i64).collect();
    let mut all = vec![0i64; flat.len() * world];
    comm.all_gather(&flat[..], &mut all[..])?;
    let mut published = Ok(());
    let final_dir = root.join(step_dir_name(step));
    if rank == 0 {
        published = publish(engine, root, &tmp, &final_dir, &crcs, &all, head[1], opts);
        // (The temporary directory is gone when the failure came after its rename.)
        if published.is_err() && tmp.exists() {
            if let Err(e) = std::fs::remove_dir_all(&tmp) {
                log::warn!("could not remove '{}': {e}", tmp.display());
            }
        }
    }
    super::agree(comm, published, "save", root)?;
    if rank == 0 {
        log::info!(
            "saved checkpoint '{}' (step {step}, {world} ranks)",
            final_dir.display()
        );
    }
    Ok(final_dir)
}

/// This rank's file: every unit's block, streamed from the live buffers.
fn write_shard<D: Device, C: Communicator>(
    engine: &Engine<'_, D, C>,
    tmp: &Path,
    opts: &SaveOptions<'_>,
) -> Result<Vec<Vec<Vec<u32>>>, CheckpointError> {
    let comm = engine.communicator();
    let path = tmp.join(rank_file(comm.rank()));
    let mut w = ShardWriter::create(
        &path,
        comm.rank(),
        comm.size(),
        engine.steps_done(),
        BLOCK_ELEMS,
    )?;
    let mut crcs = Vec::with_capacity(engine.layout().units.len());
    for u in 0..engine.layout().units.len() {
        let s = engine.export_unit(u)?;
        crcs.push(w.write_unit(u, [&s.master, &s.adam_m, &s.adam_v])?);
        if let Some(hook) = opts.after_unit {
            hook(u);
        }
    }
    w.finish()?;
    Ok(crcs)
}

/// Rank 0: metadata, rename into place, move `latest`, prune.
#[allow(clippy::too_many_arguments)]
fn publish<D: Device, C: Communicator>(
    engine: &Engine<'_, D, C>,
    root: &Path,
    tmp: &Path,
    final_dir: &Path,
    own: &[Vec<Vec<u32>>],
    all: &[i64],
    nonce: i64,
    opts: &SaveOptions<'_>,
) -> Result<(), CheckpointError> {
    let keep_last = opts.keep_last;
    let world = engine.communicator().size();
    let mut meta = Meta::new(
        engine.config(),
        engine.layout(),
        engine.steps_done(),
        engine.steps_applied(),
        engine.scaler(),
        opts.app_config,
    );
    meta.app_state = opts.app_state.map(str::to_string);
    meta.history = engine.history().to_vec();
    meta.loss_guard = engine.loss_guard().clone();
    // Reshape the gathered CRCs like this rank's (every rank has the same block counts).
    let per_rank = all.len() / world;
    for r in 0..world {
        let mut it = all[r * per_rank..(r + 1) * per_rank]
            .iter()
            .map(|&c| c as u32);
        let datasets: Vec<Vec<u32>> = own
            .iter()
            .flatten()
            .map(|d| it.by_ref().take(d.len()).collect())
            .collect();
        meta.crc32.push(datasets);
    }
    debug_assert_eq!(
        meta.crc32[0].len(),
        engine.layout().units.len() * KINDS.len()
    );
    meta.write(&tmp.join(META_FILE))?;
    sync_dir(tmp)?;
    // Re-saving a step that exists (e.g. after a resume): move the old one aside first.
    let old = root.join(format!(
        "old-{}-{nonce:x}",
        step_dir_name(engine.steps_done())
    ));
    let replaced = final_dir.exists();
    if replaced {
        log::info!("replacing the checkpoint '{}'", final_dir.display());
        std::fs::rename(final_dir, &old).map_err(CheckpointError::io("rename", final_dir))?;
    }
    if let Err(e) = std::fs::rename(tmp, final_dir) {
        // Put the old checkpoint back: `latest` may name it. (A crash right here is
        // mended by `clean_partial` and followed by `resolve`, see `replaced_step`.)
        if replaced {
            if let Err(back) = std::fs::rename(&old, final_dir) {
                log::error!(
                    "could not move '{}' back to '{}': {back}",
                    old.display(),
                    final_dir.display()
                );
            }
        }
        return Err(CheckpointError::io("rename", tmp)(e));
    }
    sync_dir(root)?;
    let name = final_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    point_latest(root, &name)?;
    if replaced {
        if let Err(e) = std::fs::remove_dir_all(&old) {
            log::warn!("could not remove '{}': {e}", old.display());
        }
    }
    prune(root, keep_last, &name);
    Ok(())
}

/// Remove complete checkpoints beyond the newest `keep_last` up to `current` (never
/// `current`). Steps after `current` (left by a run that went further before this one
/// resumed from an earlier step) are neither counted nor removed, so a resumed run keeps
/// `keep_last` of its own. Failures are logged, not fatal: the new checkpoint is safe.
pub(super) fn prune(root: &Path, keep_last: usize, current: &str) {
    let all = super::step_dirs(root);
    let Some(now) = all.iter().find(|(_, n)| n == current).map(|(s, _)| *s) else {
        return;
    };
    let (steps, later): (Vec<_>, Vec<_>) = all.into_iter().partition(|(s, _)| *s <= now);
    if !later.is_empty() {
        let names: Vec<&str> = later.iter().map(|(_, n)| n.as_str()).collect();
        log::info!(
            "'{}' also holds {} past this run's step {now} (not counted by keep_last; `latest` names this run's '{current}', and a save of one of those steps replaces it)",
            root.display(),
            names.join(", ")
        );
    }
    let excess = steps.len().saturating_sub(keep_last);
    for (_, name) in steps.into_iter().take(excess) {
        if name == current {
            continue;
        }
        let path = root.join(&name);
        log::info!("removing old checkpoint '{}'", path.display());
        if let Err(e) = std::fs::remove_dir_all(&path) {
            log::warn!("could not remove '{}': {e}", path.display());
        }
    }
}
