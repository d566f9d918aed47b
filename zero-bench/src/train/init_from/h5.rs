//! Consolidated HDF5 model files: `--init-from` reads one (through mod.rs), `--save-model`
//! writes one.
//!
//! Layout (what `zero-bench ckpt consolidate` writes and h5py reads as-is): one dataset
//! per tensor at the root of the file, named as docs/ARCHITECTURE.md lists them (`wte`, `wpe`,
//! `h.{i}.attn.c_attn.weight`, ...), 32-bit float, row-major, with the tensor's shape
//! ([out, in] for linear weights). A tensor the model holds in row blocks (`wte`) is one
//! dataset of its whole shape, read a block of rows at a time (a hyperslab).

use std::ops::Range;
use std::path::Path;

use anyhow::{bail, Context};
use hdf5::{Hyperslab, SliceOrIndex};
use zero_core::PartitionLayout;

use super::{Elem, Entry};

/// HDF5's message, shortened to one line (`zero_core::checkpoint::brief_hdf5`).
fn brief(e: hdf5::Error) -> anyhow::Error {
    anyhow::anyhow!(zero_core::checkpoint::brief_hdf5(&e.to_string()))
}

/// An open HDF5 model file and its datasets.
pub struct H5File {
    path: std::path::PathBuf,
    file: hdf5::File,
    entries: Vec<Entry>,
}

impl H5File {
    /// Open `path` and list its root datasets with their shapes and types (members that
    /// are not datasets are left out).
    pub fn open(path: &Path) -> anyhow::Result<H5File> {
        let file = hdf5::File::open(path)
            .map_err(brief)
            .with_context(|| format!("opening the model file {} (HDF5)", path.display()))?;
        let names = file
            .member_names()
            .map_err(brief)
            .with_context(|| format!("listing the tensors of {}", path.display()))?;
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            let Ok(ds) = file.dataset(&name) else {
                continue;
            };
            let dtype = ds
                .dtype()
                .map_err(brief)
                .with_context(|| format!("{}: reading the type of '{name}'", path.display()))?;
            let elem = if dtype.is::<f32>() {
                Ok(Elem::F32)
            } else {
                let found = dtype
                    .to_descriptor()
                    .map(|d| format!("{d:?}"))
                    .unwrap_or_else(|_| "an unknown type".into());
                Err(format!(
                    "{found}, expected 32-bit float (in h5py: \
                     f.create_dataset(name, data=x.astype('float32')))"
                ))
            };
            entries.push(Entry {
                shape: ds.shape(),
                name,
                elem,
            });
        }
        Ok(H5File {
            path: path.to_path_buf(),
            file,
            entries,
        })
    }

    /// The datasets at the root.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Elements `range` (flat, row-major) of dataset `entry` into `out`: only the rows that
    /// hold them are read.
    pub fn read(&self, entry: usize, range: Range<usize>, out: &mut [f32]) -> anyhow::Result<()> {
        let e = &self.entries[entry];
        if range.is_empty() {
            return Ok(());
        }
        let ds = self
            .file
            .dataset(&e.name)
            .map_err(brief)
            .with_context(|| format!("{}: opening '{}'", self.path.display(), e.name))?;
        let cols: usize = e.shape.iter().skip(1).product();
        let (values, first) = if e.shape.len() < 2 || cols == 0 {
            (ds.read_raw::<f32>(), 0)
        } else {
            let rows = range.start / cols..range.end.div_ceil(cols);
            let first = rows.start * cols;
            let mut sel = vec![SliceOrIndex::from(rows)];
            sel.extend(e.shape.iter().skip(1).map(|_| SliceOrIndex::from(..)));
            let read = ds
                .read_slice::<f32, _, ndarray::IxDyn>(Hyperslab::from(sel))
                .map(|a| a.iter().copied().collect());
            (read, first)
        };
        let values = values
            .map_err(brief)
            .with_context(|| format!("{}: reading '{}'", self.path.display(), e.name))?;
        let from = range.start - first;
        let got = values.get(from..from + range.len()).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: '{}' holds {} values, expected at least {}",
                self.path.display(),
                e.name,
                values.len() + first,
                range.end
            )
        })?;
        out.copy_from_slice(got);
        Ok(())
    }
}

/// Write `values` (every parameter's fp32 value, unpadded, in layout order, as
/// `Engine::full_master_f32` returns them) to `path` as a consolidated model file,
/// written under a temporary name and renamed over `path` when complete.
pub fn save(
    path: &Path,
    layout: &PartitionLayout,
    values: &[f32],
    step: u64,
) -> anyhow::Result<()> {
    // Replaces an earlier model file whole, or leaves it as it was.
    zero_core::checkpoint::write_whole(path, true, |tmp| {
        write_model(tmp, layout, values, step)
            .map_err(|e| zero_core::CheckpointError::Invalid(format!("{e:#}")))
    })
    .with_context(|| format!("writing the model file {}", path.display()))
}

fn write_model(
    path: &Path,
    layout: &PartitionLayout,
    values: &[f32],
    step: u64,
) -> anyhow::Result<()> {
    if values.len() != layout.numel() {
        bail!(
            "{} parameter values for a model of {}",
            values.len(),
            layout.numel()
        );
    }
    let file = hdf5::File::create(path)
        .map_err(brief)
        .with_context(|| format!("creating the model file {}", path.display()))?;
    file.new_attr::<u64>()
        .create("step")
        .and_then(|a| a.write_scalar(&step))
        .map_err(brief)
        .with_context(|| format!("{}: writing attribute 'step'", path.display()))?;
    // Start of each unit in `values` (units are concatenated without padding).
    let mut unit_start = Vec::with_capacity(layout.units.len());
    let mut at = 0;
    for unit in &layout.units {
        unit_start.push(at);
        at += unit.numel;
    }
    // One dataset per whole tensor: a split tensor's row blocks joined in row order.
    for t in layout.tensors() {
        let mut whole = Vec::with_capacity(t.numel());
        for &(i, _) in &t.parts {
            let p = &layout.params[i];
            let from = unit_start[p.unit] + p.offset;
            whole.extend_from_slice(&values[from..from + p.numel]);
        }
        file.new_dataset::<f32>()
            .shape(t.shape.clone())
            .create(t.name.as_str())
            .and_then(|ds| ds.write_raw(&whole))
            .map_err(brief)
            .with_context(|| format!("{}: writing '{}'", path.display(), t.name))?;
    }
    file.flush()
        .map_err(brief)
        .with_context(|| format!("flushing {}", path.display()))?;
    Ok(())
}
