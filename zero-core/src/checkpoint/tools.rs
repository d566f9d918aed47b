//! Offline tools on a checkpoint directory (plain process, no MPI: they read the shard
//! files directly): verify every checksum, read one named parameter, consolidate the
//! master weights into one HDF5 file of named fp32 tensors, and read such a file back as
//! ndarray arrays.
//!
//! Consolidated format (what `train --init-from` reads and h5py opens as-is): one
//! dataset per parameter at the root, named as the model's spec names it (the reference
//! model's names are in docs/ARCHITECTURE.md), fp32, shaped as the
//! parameter ([out, in] for linear weights). Written one tensor at a time: peak memory is
//! the largest tensor.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::meta::Meta;
use super::shard::{cached_reader, ShardReader, KINDS, MAX_OPEN_SHARDS};
use super::{rank_file, CheckpointError};
use crate::spec::Tensor;

/// What [`verify`] found.
#[derive(Debug)]
pub struct VerifyReport {
    /// The step directory checked.
    pub dir: PathBuf,
    /// Its metadata.
    pub meta: Meta,
    /// Bytes of fp32 data read and checked.
    pub bytes_checked: u64,
    /// Every problem found (empty: every checksum holds).
    pub problems: Vec<CheckpointError>,
}

/// Read every dataset of every rank file of the checkpoint at `path` (a step directory
/// or a root with `latest`) and check every block against the metadata. Errors only when
/// the metadata itself is unreadable; bad files and datasets are listed in the report.
pub fn verify(path: &Path) -> Result<VerifyReport, CheckpointError> {
    let dir = super::resolve(path)?;
    let meta = Meta::read(&dir)?;
    let mut problems = Vec::new();
    let mut bytes_checked = 0u64;
    for r in 0..meta.world {
        let reader = match ShardReader::open(&dir.join(rank_file(r))).and_then(|f| {
            f.check_identity(r, meta.world, meta.step, &dir.join(super::META_FILE))?;
            Ok(f)
        }) {
            Ok(f) => f,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        for (u, unit) in meta.layout.units.iter().enumerate() {
            for kind in 0..KINDS.len() {
                let crcs = meta.crcs(r, u, kind).unwrap_or(&[]);
                match reader.read_checked(
                    u,
                    kind,
                    0..unit.shard_len,
                    unit.shard_len,
                    crcs,
                    meta.block_elems,
                ) {
                    Ok(v) => bytes_checked += (v.len() * 4) as u64,
                    Err(e) => problems.push(e),
                }
            }
        }
    }
    Ok(VerifyReport {
        dir,
        meta,
        bytes_checked,
        problems,
    })
}

/// Read parameter `index` of the layout (its master weights, flattened row-major) from
/// the shard files of the checkpoint in `dir`, checked; `files` caches open readers, at
/// most [`MAX_OPEN_SHARDS`] of them (each shard's identity is checked whenever opened).
pub fn read_param(
    dir: &Path,
    meta: &Meta,
    index: usize,
    files: &mut HashMap<usize, ShardReader>,
) -> Result<Vec<f32>, CheckpointError> {
    let p = meta.layout.params.get(index).ok_or_else(|| {
        CheckpointError::Invalid(format!(
            "parameter {index} out of range: the checkpoint has {}",
            meta.layout.params.len()
        ))
    })?;
    let unit = &meta.layout.units[p.unit];
    // Reserved up to a bound only: the size is the metadata's claim until the datasets
    // are read (checked there), so a corrupt one fails as an error, not an allocation.
    let mut out = Vec::with_capacity(p.numel.min(RESERVE_BOUND));
    let want = p.offset..p.offset + p.numel;
    let mut at = want.start;
    while at < want.end {
        let r = at / unit.shard_len;
        let block_end = ((r + 1) * unit.shard_len).min(want.end);
        let from = at - r * unit.shard_len..block_end - r * unit.shard_len;
        let reader = cached_reader(files, dir, meta, r)?;
        let crcs = meta.crcs(r, p.unit, 0).unwrap_or(&[]);
        out.extend(reader.read_checked(p.unit, 0, from, unit.shard_len, crcs, meta.block_elems)?);
        at = block_end;
    }
    Ok(out)
}

/// The most elements reserved ahead on a size `meta.json` claims (64 MiB of f32).
const RESERVE_BOUND: usize = 1 << 24;

// Here rather than in meta.rs: it is the offline tools' check (consolidate, export).
impl Meta {
    /// Open every rank file of this checkpoint (in `dir`) and check, before anything is
    /// read or written, that each is its rank's shard of this checkpoint, holds every
    /// unit's master weights at the length the metadata says, and is at least as large
    /// as those weights (so a `meta.json` claiming more than the shards hold fails here,
    /// naming the file, and never sizes a buffer). Reads only metadata, one file at a
    /// time. Returns the readers of the first [`MAX_OPEN_SHARDS`] ranks, by rank, to start
    /// [`read_tensor`]'s cache: the others are closed once checked, so a checkpoint of
    /// thousands of ranks does not exhaust the open-file limit (EMFILE).
    pub fn open_shards(&self, dir: &Path) -> Result<HashMap<usize, ShardReader>, CheckpointError> {
        let meta_path = dir.join(super::META_FILE);
        // Bytes of master weights in each rank's file (bounded: the layout is checked).
        let master_bytes = (self.layout.shard_numel() as u64).saturating_mul(4);
        let mut files = HashMap::new();
        for r in 0..self.world {
            let path = dir.join(rank_file(r));
            let reader = ShardReader::open(&path)?;
            reader.check_identity(r, self.world, self.step, &meta_path)?;
            let size = std::fs::metadata(&path)
                .map_err(CheckpointError::io("stat shard file", &path))?
                .len();
            if size < master_bytes {
                return Err(CheckpointError::Meta {
                    path: meta_path,
                    reason: format!(
                        "it puts {master_bytes} bytes of master weights in each rank file, but \
                         {} has {size} bytes: the file is truncated or the metadata was \
                         changed; use an intact checkpoint",
                        path.display()
                    ),
                });
            }
            for (u, unit) in self.layout.units.iter().enumerate() {
                // An empty read checks the dataset's existence and length, reading nothing.
                reader.read_checked(u, 0, 0..0, unit.shard_len, &[], self.block_elems)?;
            }
            // (Dropping a reader closes its file.)
            if files.len() < MAX_OPEN_SHARDS {
                files.insert(r, reader);
            }
        }
        Ok(files)
    }
}

/// Read a whole tensor (its master weights, row-major) from the shard files: its one
/// parameter, or the row blocks of a split tensor joined in row order (they tile its
/// rows; [`crate::PartitionLayout::tensors`]).
pub fn read_tensor(
    dir: &Path,
    meta: &Meta,
    tensor: &Tensor,
    files: &mut HashMap<usize, ShardReader>,
) -> Result<Vec<f32>, CheckpointError> {
    let mut values = Vec::with_capacity(tensor.numel().min(RESERVE_BOUND));
    for &(i, _) in &tensor.parts {
        values.extend(read_param(dir, meta, i, files)?);
    }
    Ok(values)
}

/// [`crate::files::write_whole`] with the checkpoint's error type.
pub fn write_whole<T>(
    out: &Path,
    overwrite: bool,
    write: impl FnOnce(&Path) -> Result<T, CheckpointError>,
) -> Result<T, CheckpointError> {
    crate::files::write_whole(out, overwrite, write)
}

/// Write the master weights of the checkpoint at `path` as one HDF5 file of named fp32
/// tensors at `out` (created; an existing file is an error, and `out` appears only when
/// complete: [`write_whole`]). Returns the tensors written.
pub fn consolidate(path: &Path, out: &Path) -> Result<usize, CheckpointError> {
    let dir = super::resolve(path)?;
    let meta = Meta::read(&dir)?;
    // A missing or wrong shard fails before anything is written.
    let mut files = meta.open_shards(&dir)?;
    write_whole(out, false, |tmp| {
        write_consolidated(&dir, &meta, tmp, &mut files)
    })
}

fn write_consolidated(
    dir: &Path,
    meta: &Meta,
    out: &Path,
    files: &mut HashMap<usize, ShardReader>,
) -> Result<usize, CheckpointError> {
    let file = hdf5::File::create_excl(out).map_err(CheckpointError::h5(out, "(file)"))?;
    file.new_attr::<u64>()
        .create("step")
        .and_then(|a| a.write_scalar(&meta.step))
        .map_err(CheckpointError::h5(out, "attribute step"))?;
    let tensors = meta.layout.tensors();
    for t in &tensors {
        let values = read_tensor(dir, meta, t, files)?;
        file.new_dataset::<f32>()
            .shape(t.shape.clone())
            .create(t.name.as_str())
            .and_then(|ds| ds.write_raw(&values))
            .map_err(CheckpointError::h5(out, &t.name))?;
    }
    file.flush().map_err(CheckpointError::h5(out, "(file)"))?;
    file.close().map_err(CheckpointError::h5(out, "(file)"))?;
    Ok(tensors.len())
}

/// Every dataset of a consolidated file (as [`consolidate`] writes it, or h5py) as an
/// fp32 ndarray of its shape, by name.
pub fn read_consolidated(
    path: &Path,
) -> Result<BTreeMap<String, ndarray::ArrayD<f32>>, CheckpointError> {
    let file = hdf5::File::open(path).map_err(CheckpointError::h5(path, "(file)"))?;
    let names = file
        .member_names()
        .map_err(CheckpointError::h5(path, "(root group)"))?;
    let mut out = BTreeMap::new();
    for name in names {
        let ds = file
            .dataset(&name)
            .map_err(CheckpointError::h5(path, &name))?;
        let shape = ds.shape();
        let values: Vec<f32> = ds.read_raw().map_err(CheckpointError::h5(path, &name))?;
        let array = ndarray::ArrayD::from_shape_vec(shape.clone(), values).map_err(|e| {
            CheckpointError::Invalid(format!(
                "{}: dataset '{name}' of shape {shape:?}: {e}",
                path.display()
            ))
        })?;
        out.insert(name, array);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::entry_names;

    fn write_text(out: &Path, overwrite: bool, text: &str) -> Result<(), CheckpointError> {
        write_whole(out, overwrite, |tmp| {
            std::fs::write(tmp, text).map_err(CheckpointError::io("write", tmp))
        })
    }

    /// Written, synced and renamed: the output whole, replaced whole, nothing else left;
    /// a failed write leaves the earlier file and no partial.
    #[test]
    fn write_whole_replaces_whole_and_leaves_no_partial() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("model.h5");
        write_text(&out, false, "one").unwrap();
        assert!(write_text(&out, false, "two").is_err());
        write_text(&out, true, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "two");
        assert_eq!(entry_names(tmp.path()).unwrap(), ["model.h5"]);
        let failed = write_whole(&out, true, |tmp| {
            std::fs::write(tmp, "half").map_err(CheckpointError::io("write", tmp))?;
            Err::<(), _>(CheckpointError::Invalid("disk full".into()))
        });
        assert!(failed.is_err());
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "two");
        assert_eq!(entry_names(tmp.path()).unwrap(), ["model.h5"]);
    }
}
