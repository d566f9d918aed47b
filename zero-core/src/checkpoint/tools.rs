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
use super::shard::{ShardReader, KINDS};
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
/// the shard files of the checkpoint in `dir`, checked; `files` caches open readers.
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
        let reader = match files.entry(r) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let reader = ShardReader::open(&dir.join(rank_file(r)))?;
                reader.check_identity(r, meta.world, meta.step, &dir.join(super::META_FILE))?;
                v.insert(reader)
            }
        };
        let crcs = meta.crcs(r, p.unit, 0).unwrap_or(&[]);
        out.extend(reader.read_checked(p.unit, 0, from, unit.shard_len, crcs, meta.block_elems)?);
        at = block_end;
    }
    Ok(out)
}

/// The most elements reserved ahead on a size `meta.json` claims (64 MiB of f32).
const RESERVE_BOUND: usize = 1 << 24;

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

/// The temporary name an output is written under before it is renamed to `out`: in
/// the same directory (so the rename is atomic), hidden, with the process id.
pub fn partial_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map_or("output".into(), |n| n.to_string_lossy().into_owned());
    out.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// Write `out` through [`partial_path`]: `write` fills the temporary file; it is renamed
/// to `out` only when complete, and removed on failure, so `out` is either as before or
/// whole. An existing `out` is an error unless `overwrite` (then it is replaced whole).
/// A symbolic link is written through (its target replaced; [`crate::files::replace_target`]),
/// and a device, FIFO or socket is refused.
pub fn write_whole<T>(
    out: &Path,
    overwrite: bool,
    write: impl FnOnce(&Path) -> Result<T, CheckpointError>,
) -> Result<T, CheckpointError> {
    let out =
        &crate::files::replace_target(out).map_err(|e| CheckpointError::Invalid(e.to_string()))?;
    if out.exists() && !overwrite {
        return Err(CheckpointError::Invalid(format!(
            "'{}' exists; not overwriting it",
            out.display()
        )));
    }
    let tmp = partial_path(out);
    let result = write(&tmp).and_then(|v| {
        if out.exists() && !overwrite {
            return Err(CheckpointError::Invalid(format!(
                "'{}' appeared while it was being written; not overwriting it",
                out.display()
            )));
        }
        std::fs::rename(&tmp, out)
            .map(|_| v)
            .map_err(CheckpointError::io("rename into place", out))
    });
    if result.is_err() && tmp.exists() {
        if let Err(e) = std::fs::remove_file(&tmp) {
            log::warn!("could not remove the partial '{}': {e}", tmp.display());
        }
    }
    result
}

/// Write the master weights of the checkpoint at `path` as one HDF5 file of named fp32
/// tensors at `out` (created; an existing file is an error, and `out` appears only when
/// complete: [`write_whole`]). Returns the tensors written.
pub fn consolidate(path: &Path, out: &Path) -> Result<usize, CheckpointError> {
    let dir = super::resolve(path)?;
    let meta = Meta::read(&dir)?;
    write_whole(out, false, |tmp| write_consolidated(&dir, &meta, tmp))
}

fn write_consolidated(dir: &Path, meta: &Meta, out: &Path) -> Result<usize, CheckpointError> {
    let file = hdf5::File::create_excl(out).map_err(CheckpointError::h5(out, "(file)"))?;
    file.new_attr::<u64>()
        .create("step")
        .and_then(|a| a.write_scalar(&meta.step))
        .map_err(CheckpointError::h5(out, "attribute step"))?;
    let mut files = HashMap::new();
    let tensors = meta.layout.tensors();
    for t in &tensors {
        let values = read_tensor(dir, meta, t, &mut files)?;
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
