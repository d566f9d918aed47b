//! Consolidated HDF5 model files: `--init-from` reads one, `--save-model` writes one.
//!
//! Layout (what `zero-bench ckpt consolidate` writes and h5py reads as-is): one dataset
//! per parameter at the root of the file, named as docs/ARCHITECTURE.md lists them (`wte`, `wpe`,
//! `h.{i}.attn.c_attn.weight`, ...), 32-bit float, row-major, with the parameter's shape
//! ([out, in] for linear weights). Every parameter of the model must be present with its
//! exact shape; tensors the model does not have are ignored with a warning.
//!
//! Loading goes through the engine's import interface (`Engine::import_unit`, then
//! `finish_import`): each rank copies only the elements it keeps (its shard at stages
//! 1-3), one unit at a time, so memory beyond the engine's is one unit of f32. The
//! optimizer starts fresh (m = v = 0, step 0, the configured loss scale).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use zero_comm::Communicator;
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
    /// Open `path` and check that it holds every parameter of `spec`, as f32 with the
    /// right shape. Returns the names of tensors in the file the model does not use.
    pub fn open(path: &Path, spec: &ModelSpec) -> anyhow::Result<(InitFile, Vec<String>)> {
        let file = hdf5::File::open(path)
            .with_context(|| format!("opening the model file {} (HDF5)", path.display()))?;
        let names = file
            .member_names()
            .with_context(|| format!("listing the tensors of {}", path.display()))?;
        let mut missing = Vec::new();
        for unit in &spec.units {
            for p in &unit.params {
                if !names.contains(&p.name) {
                    missing.push(format!("{} {}", p.name, shape_str(&p.shape)));
                    continue;
                }
                let ds = file.dataset(&p.name).with_context(|| {
                    format!(
                        "{}: '{}' is not a dataset (expected f32 {})",
                        path.display(),
                        p.name,
                        shape_str(&p.shape)
                    )
                })?;
                let found = ds.shape();
                if found != p.shape {
                    let mut reversed = found.clone();
                    reversed.reverse();
                    let transposed = found.len() == 2 && reversed == p.shape;
                    bail!(
                        "{}: tensor '{}' has shape {}, the model expects {}; {}",
                        path.display(),
                        p.name,
                        shape_str(&found),
                        shape_str(&p.shape),
                        if transposed {
                            "weights are stored [out, in] (torch.nn.Linear); a Hugging Face \
                             GPT-2 (Conv1D) export must transpose them"
                        } else {
                            "the file is for a different model size (check model.* in the config)"
                        }
                    );
                }
                let dtype = ds.dtype().with_context(|| {
                    format!("{}: reading the type of '{}'", path.display(), p.name)
                })?;
                if !dtype.is::<f32>() {
                    let found = dtype
                        .to_descriptor()
                        .map(|d| format!("{d:?}"))
                        .unwrap_or_else(|_| "an unknown type".into());
                    bail!(
                        "{}: tensor '{}' is {found}, expected 32-bit float (in h5py: \
                         f.create_dataset(name, data=x.astype('float32')))",
                        path.display(),
                        p.name
                    );
                }
            }
        }
        if !missing.is_empty() {
            let shown = missing.len().min(8);
            bail!(
                "{} lacks {} of the model's {} tensors: {}{}",
                path.display(),
                missing.len(),
                spec.units.iter().map(|u| u.params.len()).sum::<usize>(),
                missing[..shown].join(", "),
                if missing.len() > shown { ", ..." } else { "" }
            );
        }
        let extra: Vec<String> = names
            .into_iter()
            .filter(|n| spec.find(n).is_none())
            .collect();
        Ok((
            InitFile {
                path: path.to_path_buf(),
                file,
            },
            extra,
        ))
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
                let values: Vec<f32> = self
                    .file
                    .dataset(&p.name)
                    .and_then(|ds| ds.read_raw::<f32>())
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
                flat[p.offset..p.offset + p.numel].copy_from_slice(&values);
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
/// `Engine::full_master_f32` returns them) to `path` as a consolidated model file.
pub fn save(
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
    for p in &layout.params {
        let from = unit_start[p.unit] + p.offset;
        file.new_dataset::<f32>()
            .shape(p.shape.clone())
            .create(p.name.as_str())
            .and_then(|ds| ds.write_raw(&values[from..from + p.numel]))
            .with_context(|| format!("{}: writing '{}'", path.display(), p.name))?;
    }
    file.flush()
        .with_context(|| format!("flushing {}", path.display()))?;
    Ok(())
}
