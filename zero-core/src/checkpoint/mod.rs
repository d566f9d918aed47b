//! Sharded HDF5 checkpoints: atomic save, exact resume, resharding on load, and the
//! offline tools (verify, consolidate) that read the shard files without MPI.
//!
//! On disk (`<root>` is the directory a run saves into):
//! ```text
//! <root>/latest                   "step-<S>\n", replaced atomically (write latest.tmp, rename)
//! <root>/step-<S>/meta.json       rank 0: format, versions, N, stage, precision, step,
//!                                 scaler, config (TOML), partition layout, CRC32 of every
//!                                 block of every dataset of every rank file
//! <root>/step-<S>/rank-<r:05>.h5  rank r, zero-padded (rank-00000.h5, rank-00001.h5, ...):
//!                                 /unit<u>/{master,adam_m,adam_v}, fp32, the rank's
//!                                 block r*shard_len..(r+1)*shard_len of unit u
//! <root>/tmp-step-<S>-<nonce>/    a save in progress (or a dead one: ignored by load,
//!                                 removed by the next save or by `clean_partial`, best
//!                                 effort: one that cannot be removed is logged and left)
//! <root>/old-step-<S>-<nonce>/    step-<S> moved aside by a save replacing it: put back
//!                                 when `latest` names step-<S> and it is missing (the
//!                                 replace was interrupted), else stale and removed
//! ```
//!
//! Invariants:
//! - A checkpoint is one shard per rank at every stage (stage 0 writes each rank's block
//!   of its full buffers, see `engine/state.rs`), so every rank writes Ψ·12/N bytes in
//!   parallel and the files do not depend on the stage that wrote them.
//! - A step directory exists only once every rank has written, flushed and fsynced its
//!   file and rank 0 its metadata: the temporary directory is renamed into place after a
//!   collective agreement, and `latest` moves after that. A crash at any moment leaves the
//!   previous `latest` naming a complete checkpoint.
//! - Nothing is gathered on one rank: save streams unit by unit from the live buffers,
//!   load reads only the hyperslabs the new layout needs (`PartitionLayout::reshard_from`).
//! - Every read is checked: each dataset carries CRC32s of blocks of [`BLOCK_ELEMS`]
//!   elements in the metadata, and a read verifies the blocks it touches.
//! - Loads and the offline tools keep at most [`MAX_OPEN_SHARDS`] shard files open at
//!   once, whatever N (a stage-0 load reads all N).
//!
//! Use from a training loop (every call is collective; the directory must be on a
//! filesystem every rank sees):
//! ```ignore
//! let mut engine = Engine::new(&config, &comm, &device, &model)?;
//! if let Some(dir) = resume {            // a root (follows `latest`) or a step directory
//!     checkpoint::load(&mut engine, dir)?; // any N, any stage; sets step/applied/scaler
//! }
//! for s in engine.steps_done()..steps {
//!     engine.step(&mut model, &batches_for(s))?;   // data position = step index
//!     if (s + 1) % save_every == 0 {
//!         checkpoint::save(&engine, dir, &SaveOptions { keep_last, ..Default::default() })?;
//!     }
//! }
//! ```

mod error;
mod load;
mod meta;
mod save;
mod shard;
#[cfg(test)]
mod tests;
mod tools;

pub use crate::files::partial_path;
pub use error::{brief_hdf5, CheckpointError};
pub use load::{load, resolve, LoadInfo};
pub use meta::{Meta, FORMAT_NAME, FORMAT_VERSION};
pub use save::{clean_partial, point_latest, save, sync_dir, Cleaned, SaveOptions};
pub use shard::{block_crcs, ShardReader, ShardWriter, BLOCK_ELEMS, KINDS, MAX_OPEN_SHARDS};
pub use tools::{
    consolidate, read_consolidated, read_param, read_tensor, verify, write_whole, VerifyReport,
};

/// The metadata file's name inside a step directory.
pub const META_FILE: &str = "meta.json";
/// The pointer file naming the newest complete step directory.
pub const LATEST: &str = "latest";

/// A number for names no earlier run used (a save's temporary directory, a marker
/// file): the time in nanoseconds mixed with the process id, non-negative.
pub fn fresh_nonce() -> i64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    (t ^ ((std::process::id() as i64) << 32)) & i64::MAX
}

/// The `step-<S>` directories in `root` as (S, name), by step; none when `root` cannot
/// be read.
pub fn step_dirs(root: &std::path::Path) -> Vec<(u64, String)> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut steps: Vec<(u64, String)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            Some((name.strip_prefix("step-")?.parse().ok()?, name))
        })
        .collect();
    steps.sort();
    steps
}

/// Name of rank `r`'s shard file: `rank-<r>.h5` with `r` zero-padded to 5 digits
/// (`rank-00000.h5`).
pub fn rank_file(rank: usize) -> String {
    format!("rank-{rank:05}.h5")
}

/// Agree across ranks on a part of a save or load that each rank (or rank 0 alone) did:
/// `Ok` on every rank, or on every rank [`CheckpointError::Ranks`] carrying each failing
/// rank's own message, so that whoever reports it says what failed where. On one rank the
/// error is returned as it is. Collective.
pub(crate) fn agree<T, C: zero_comm::Communicator>(
    comm: &C,
    result: Result<T, CheckpointError>,
    what: &'static str,
    path: &std::path::Path,
) -> Result<T, CheckpointError> {
    let mine = result.as_ref().err().map(|e| e.to_string());
    let failures = zero_comm::gather_failures(comm, mine.as_deref())?;
    match result {
        Ok(v) if failures.is_empty() => Ok(v),
        Err(e) if comm.size() == 1 => Err(e),
        _ => Err(CheckpointError::Ranks {
            what,
            path: path.to_path_buf(),
            failures,
        }),
    }
}

/// Name of the step directory of step `step`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step}")
}
