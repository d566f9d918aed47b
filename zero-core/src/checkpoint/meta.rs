//! The metadata of one checkpoint (`meta.json`, written by rank 0 last): what was saved,
//! by which version, on how many ranks, and the CRC32 of every block of every dataset.
//! It is the source of truth on load: the shard files are checked against it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::shard::KINDS;
use super::{CheckpointError, BLOCK_ELEMS};
use crate::config::{EngineConfig, Precision, Stage};
use crate::engine::guard::LossGuard;
use crate::engine::LossScaler;
use crate::layout::PartitionLayout;

/// Format name written in every checkpoint.
pub const FORMAT_NAME: &str = "zero-rs sharded checkpoint";
/// Version of the on-disk format (bumped on any incompatible change; 2: the engine's
/// configuration and the application's are recorded apart).
pub const FORMAT_VERSION: u32 = 2;

/// Everything rank 0 records about a checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Meta {
    /// [`FORMAT_NAME`].
    pub format: String,
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// Version of zero-rs that wrote it.
    pub zero_rs_version: String,
    /// Steps run when saved (skipped included): the next step's index and the data
    /// position (batches are a function of the step index and the seed).
    pub step: u64,
    /// AdamW steps applied (Adam's bias-correction t).
    pub applied: u64,
    /// The initialisation seed ([`EngineConfig::seed`]).
    pub seed: u64,
    /// N: ranks that wrote it (one file each).
    pub world: usize,
    /// ZeRO stage of the run that wrote it (informative: the files do not depend on it).
    pub stage: Stage,
    /// Training precision of that run (the files always hold fp32).
    pub precision: Precision,
    /// The loss scaler's state.
    pub scaler: LossScaler,
    /// The partition layout of the N ranks (parameter names, offsets, shapes, shards).
    pub layout: PartitionLayout,
    /// The engine's configuration of the run.
    pub engine: EngineConfig,
    /// The application's own configuration as it gave it (zero-bench: its TOML), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_config: Option<String>,
    /// The application's own state to resume with, as it gave it ([`SaveOptions::app_state`];
    /// zero-bench: where its data order had got to, so that a changed batch goes on from
    /// there).
    ///
    /// [`SaveOptions::app_state`]: super::SaveOptions::app_state
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_state: Option<String>,
    /// What happened to the training beyond its steps, oldest first (resumes, precision
    /// and batch changes): [`crate::Engine::history`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<String>,
    /// The loss guard's recent losses and divergence count.
    #[serde(default)]
    pub loss_guard: LossGuard,
    /// Elements per checksummed block.
    pub block_elems: usize,
    /// CRC32 (IEEE) per block: `crc32[rank][unit * 3 + kind][block]`, `kind` in
    /// [`KINDS`] order, over the little-endian bytes of the fp32 elements.
    pub crc32: Vec<Vec<Vec<u32>>>,
}

impl Meta {
    /// Metadata of a checkpoint of `config` with `layout` at `step` (checksums empty).
    pub fn new(
        config: &EngineConfig,
        layout: &PartitionLayout,
        step: u64,
        applied: u64,
        scaler: &LossScaler,
        app_config: Option<&str>,
    ) -> Meta {
        Meta {
            format: FORMAT_NAME.into(),
            format_version: FORMAT_VERSION,
            zero_rs_version: env!("CARGO_PKG_VERSION").into(),
            step,
            applied,
            seed: config.seed,
            world: layout.world,
            stage: config.zero.stage,
            precision: config.precision.dtype,
            scaler: scaler.clone(),
            layout: layout.clone(),
            engine: config.clone(),
            app_config: app_config.map(str::to_string),
            app_state: None,
            history: Vec::new(),
            loss_guard: LossGuard::default(),
            block_elems: BLOCK_ELEMS,
            crc32: Vec::new(),
        }
    }

    /// The checksums of `rank`'s dataset `kind` of unit `unit`; `None` where there are
    /// none, `kind` past [`KINDS`] included.
    pub fn crcs(&self, rank: usize, unit: usize, kind: usize) -> Option<&[u32]> {
        // Checked: `unit * 3 + kind` with kind 3 is the next unit's master.
        if kind >= KINDS.len() {
            return None;
        }
        self.crc32
            .get(rank)
            .and_then(|r| r.get(unit * KINDS.len() + kind))
            .map(|v| v.as_slice())
    }

    /// Bytes of fp32 data in the shard files (all ranks).
    pub fn data_bytes(&self) -> u64 {
        (self.layout.shard_numel() * self.world * KINDS.len() * 4) as u64
    }

    /// Write to `path` and fsync it.
    pub(crate) fn write(&self, path: &Path) -> Result<(), CheckpointError> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| CheckpointError::Invalid(format!("metadata does not serialise: {e}")))?;
        super::save::write_synced(path, text.as_bytes())
    }

    /// Read and check `dir/meta.json`: format, version, and internal consistency.
    pub fn read(dir: &Path) -> Result<Meta, CheckpointError> {
        Self::read_with_crc(dir).map(|(meta, _)| meta)
    }

    /// [`Meta::read`], with the CRC32 of the file's bytes: the same for the same file
    /// in every process and build (what a load's ranks compare).
    pub(crate) fn read_with_crc(dir: &Path) -> Result<(Meta, u32), CheckpointError> {
        let path = dir.join(super::META_FILE);
        let bad = |reason: String| CheckpointError::Meta {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(CheckpointError::io("read", &path))?;
        let crc = crc32fast::hash(text.as_bytes());
        let meta: Meta =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid metadata: {e}")))?;
        if meta.format != FORMAT_NAME || meta.format_version != FORMAT_VERSION {
            return Err(bad(format!(
                "format '{}' version {}, this zero-rs reads '{FORMAT_NAME}' version {FORMAT_VERSION}",
                meta.format, meta.format_version
            )));
        }
        meta.layout
            .check_consistent()
            .map_err(|e| bad(e.to_string()))?;
        if meta.world != meta.layout.world || meta.world == 0 {
            return Err(bad(format!(
                "world {} but the layout is for {} ranks",
                meta.world, meta.layout.world
            )));
        }
        if meta.block_elems == 0 {
            return Err(bad("block_elems is 0".into()));
        }
        if meta.crc32.len() != meta.world {
            return Err(bad(format!(
                "checksums for {} ranks, world is {}",
                meta.crc32.len(),
                meta.world
            )));
        }
        for (r, per_rank) in meta.crc32.iter().enumerate() {
            if per_rank.len() != meta.layout.units.len() * KINDS.len() {
                return Err(bad(format!(
                    "rank {r}: checksums for {} datasets, the layout has {} units x {}",
                    per_rank.len(),
                    meta.layout.units.len(),
                    KINDS.len()
                )));
            }
            for (i, c) in per_rank.iter().enumerate() {
                let want = meta.layout.units[i / KINDS.len()]
                    .shard_len
                    .div_ceil(meta.block_elems);
                if c.len() != want {
                    return Err(bad(format!(
                        "rank {r} dataset {i}: {} checksums, expected {want}",
                        c.len()
                    )));
                }
            }
        }
        Ok((meta, crc))
    }

    /// Refuse a checkpoint whose model differs from `layout`'s, naming the difference.
    pub fn check_fits(&self, layout: &PartitionLayout, dir: &Path) -> Result<(), CheckpointError> {
        let incompatible = |reason: String| CheckpointError::Incompatible {
            path: PathBuf::from(dir),
            reason,
        };
        let (a, b) = (&self.layout, layout);
        for (i, (x, y)) in a.params.iter().zip(&b.params).enumerate() {
            if x.name != y.name || x.shape != y.shape || x.unit != y.unit || x.offset != y.offset {
                // The same tensor cut into other row blocks: say so, it is the usual cause.
                let tensor = |p: &crate::layout::ParamLayout| {
                    p.row_block
                        .as_ref()
                        .map_or(p.name.clone(), |r| r.tensor.clone())
                };
                let blocks = |l: &PartitionLayout, t: &str| {
                    l.tensors()
                        .into_iter()
                        .find(|x| x.name == t)
                        .map_or(0, |x| x.parts.len())
                };
                let t = tensor(x);
                let hint = if t == tensor(y) && blocks(a, &t) != blocks(b, &t) {
                    format!(
                        "; the checkpoint holds '{t}' in {} row block(s), the model in {}: build the model with the checkpoint's row blocks",
                        blocks(a, &t),
                        blocks(b, &t)
                    )
                } else {
                    String::new()
                };
                return Err(incompatible(format!(
                    "parameter {i}: checkpoint '{}' {:?} (unit {}, offset {}) vs model '{}' {:?} (unit {}, offset {}){hint}",
                    x.name, x.shape, x.unit, x.offset, y.name, y.shape, y.unit, y.offset
                )));
            }
        }
        if a.numel() != b.numel() || a.params.len() != b.params.len() {
            return Err(incompatible(format!(
                "the checkpoint holds {} tensors ({} elements), the model has {} ({})",
                a.params.len(),
                a.numel(),
                b.params.len(),
                b.numel()
            )));
        }
        a.check_same_params(b)
            .map_err(|e| incompatible(e.to_string()))
    }
}
