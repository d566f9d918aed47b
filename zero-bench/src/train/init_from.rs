//! Consolidated HDF5 model files: `--init-from` reads one, `--save-model` writes one.
//!
//! Layout (what `zero-bench ckpt consolidate` writes and h5py reads as-is): one dataset
//! per tensor at the root of the file, named as docs/ARCHITECTURE.md lists them (`wte`, `wpe`,
//! `h.{i}.attn.c_attn.weight`, ...), 32-bit float, row-major, with the tensor's shape
//! ([out, in] for linear weights). A tensor the model holds in row blocks (`wte`) is one
//! dataset of its whole shape, read block by block. Every tensor of the model must be
//! present with its exact shape; tensors the model does not have are ignored with a
//! warning.
//!
//! Loading goes through the engine's import interface (`Engine::import_unit`, then
//! `finish_import`): each rank copies only the elements it keeps (its shard at stages
//! 1-3), one unit at a time, so memory beyond the engine's is one unit of f32. The
//! optimizer starts fresh (m = v = 0, step 0, the configured loss scale).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use hdf5::{Hyperslab, SliceOrIndex};
use zero_comm::Communicator;
use zero_core::layout::ParamLayout;
use zero_core::{Engine, LossScaler, ModelSpec, PartitionLayout};
use zero_kernels::device::Device;

/// An HDF5 model file whose tensors were checked against a model's spec.
pub struct InitFile {
    path: PathBuf,
    file: hdf5::File,
}

fn shape_str(s: &[usize]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

impl InitFile {
    /// Open `path` and check that it holds every tensor of `spec` (a tensor split into
    /// row blocks is one dataset of its whole shape), as f32 with the right shape.
    /// Returns the names of tensors in the file the model does not use.
    pub fn open(path: &Path, spec: &ModelSpec) -> anyhow::Result<(InitFile, Vec<String>)> {
        let file = hdf5::File::open(path)
            .with_context(|| format!("opening the model file {} (HDF5)", path.display()))?;
        let names = file
            .member_names()
            .with_context(|| format!("listing the tensors of {}", path.display()))?;
        let tensors = spec.tensors();
        let mut missing = Vec::new();
        for t in &tensors {
            if !names.contains(&t.name) {
                missing.push(format!("{} {}", t.name, shape_str(&t.shape)));
                continue;
            }
            let ds = file.dataset(&t.name).with_context(|| {
                format!(
                    "{}: '{}' is not a dataset (expected f32 {})",
                    path.display(),
                    t.name,
                    shape_str(&t.shape)
                )
            })?;
            let found = ds.shape();
            if found != t.shape {
                let mut reversed = found.clone();
                reversed.reverse();
                let transposed = found.len() == 2 && reversed == t.shape;
                bail!(
                    "{}: tensor '{}' has shape {}, the model expects {}; {}",
                    path.display(),
                    t.name,
                    shape_str(&found),
                    shape_str(&t.shape),
                    if transposed {
                        "weights are stored [out, in] (torch.nn.Linear); a Hugging Face \
                         GPT-2 (Conv1D) export must transpose them"
                    } else {
                        "the file is for a different model size (check model.* in the config)"
                    }
                );
            }
            let dtype = ds
                .dtype()
                .with_context(|| format!("{}: reading the type of '{}'", path.display(), t.name))?;
            if !dtype.is::<f32>() {
                let found = dtype
                    .to_descriptor()
                    .map(|d| format!("{d:?}"))
                    .unwrap_or_else(|_| "an unknown type".into());
                bail!(
                    "{}: tensor '{}' is {found}, expected 32-bit float (in h5py: \
                     f.create_dataset(name, data=x.astype('float32')))",
                    path.display(),
                    t.name
                );
            }
        }
        if !missing.is_empty() {
            let shown = missing.len().min(8);
            bail!(
                "{} lacks {} of the model's {} tensors: {}{}",
                path.display(),
                missing.len(),
                tensors.len(),
                missing[..shown].join(", "),
                if missing.len() > shown { ", ..." } else { "" }
            );
        }
        let extra: Vec<String> = names
            .into_iter()
            .filter(|n| tensors.iter().all(|t| &t.name != n))
            .collect();
        Ok((
            InitFile {
                path: path.to_path_buf(),
                file,
            },
            extra,
        ))
    }

    /// The values of one parameter: its whole dataset, or for a row block its rows of the
    /// tensor's dataset (a hyperslab, so a split table is never read whole).
    fn read_param(&self, p: &ParamLayout) -> anyhow::Result<Vec<f32>> {
        let name = p.row_block.as_ref().map_or(p.name.as_str(), |b| &b.tensor);
        let ds = self
            .file
            .dataset(name)
            .with_context(|| format!("{}: opening '{name}'", self.path.display()))?;
        let values: Vec<f32> = match &p.row_block {
            None => ds.read_raw::<f32>(),
            Some(b) => {
                let rows = p.shape.first().copied().unwrap_or(0);
                let mut sel = vec![SliceOrIndex::from(b.first_row..b.first_row + rows)];
                sel.extend(p.shape.iter().skip(1).map(|_| SliceOrIndex::from(..)));
                ds.read_slice::<f32, _, ndarray::IxDyn>(Hyperslab::from(sel))
                    .map(|a| a.iter().copied().collect())
            }
        }
        .with_context(|| format!("{}: reading '{}'", self.path.display(), p.name))?;
        if values.len() != p.numel {
            bail!(
                "{}: '{}' holds {} values, expected {}",
                self.path.display(),
                p.name,
                values.len(),
                p.numel
            );
        }
        Ok(values)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Set the engine's parameters (master and working copies) to the file's, unit by
    /// unit. Collective: every rank calls it.
    pub fn load_into<D: Device, C: Communicator>(
        &self,
        engine: &mut Engine<'_, D, C>,
    ) -> anyhow::Result<()> {
        let layout = engine.layout().clone();
        for (u, unit) in layout.units.iter().enumerate() {
            // The unit's flat buffer: parameters at their offsets, zero padding after.
            let mut flat = vec![0.0f32; unit.padded_len];
            for p in &layout.params[unit.params.clone()] {
                flat[p.offset..p.offset + p.numel].copy_from_slice(&self.read_param(p)?);
            }
            // The master of what this rank keeps; Adam's moments start at zero.
            let kept = engine
                .import_range(u)
                .map_err(|e| anyhow!("loading unit '{}': {e}", unit.name))?;
            let zeros = vec![0.0f32; kept.len()];
            engine
                .import_unit(u, &flat[kept], &zeros, &zeros)
                .map_err(|e| anyhow!("loading unit '{}': {e}", unit.name))?;
        }
        let scaler = LossScaler::new(&engine.config().precision);
        engine
            .finish_import(0, 0, scaler)
            .map_err(|e| anyhow!("finishing the load of {}: {e}", self.path.display()))
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
        .with_context(|| format!("creating the model file {}", path.display()))?;
    file.new_attr::<u64>()
        .create("step")
        .and_then(|a| a.write_scalar(&step))
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
            .with_context(|| format!("{}: writing '{}'", path.display(), t.name))?;
    }
    file.flush()
        .with_context(|| format!("flushing {}", path.display()))?;
    Ok(())
}
