//! `ckpt export --safetensors`: the master weights as a safetensors file (what Hugging
//! Face tools load), streamed one tensor at a time: the safetensors writer asks each
//! tensor for its bytes only when it writes it, and we read it from the shard files then.
//! Before the output is created, every name, shape and shard file is checked (the shards
//! as `ckpt consolidate` checks them: `Meta::open_shards`); a read that still fails stops
//! all further reading and the output is removed.
//!
//! `--names nanogpt` (default) keeps the names docs/ARCHITECTURE.md lists and [out, in] shapes.
//! `--names hf-gpt2` writes what `GPT2Model.from_pretrained` expects: `wte.weight`,
//! `wpe.weight`, and the four linear weights of each block transposed to Conv1D's
//! [in, out] (docs/ARCHITECTURE.md: HF's GPT-2 holds the transpose). The mapping is
//! `zero_models::names`, the one `train --init-from` reads with.
//! `--names hf-llama` (a Llama checkpoint) writes `LlamaForCausalLM`'s names
//! (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, ...,
//! `lm_head.weight`), nothing transposed. `--names hf` is the HF set of the checkpoint's
//! family; a set of the other family is refused.

use crate::logging::outln;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use safetensors::{Dtype, View};
use zero_core::checkpoint::{self, CheckpointError, Meta, ShardReader};
use zero_core::Tensor;
use zero_models::names::{self, Family, NameSet};

use super::args::{ExportArgs, Names};

/// One tensor, read from the shard files when the writer asks for its bytes.
struct Lazy<'a> {
    tensor: Tensor,
    /// The shape in the file ([cols, rows] when transposed).
    shape: Vec<usize>,
    /// Its bytes (checked not to overflow when built).
    data_len: usize,
    transpose: bool,
    source: &'a Source,
}

struct Source {
    dir: PathBuf,
    meta: Meta,
    files: RefCell<HashMap<usize, ShardReader>>,
    /// The first read error: the writer's `data()` cannot fail, so it is kept here,
    /// nothing more is read, and the output is deleted afterwards.
    error: RefCell<Option<CheckpointError>>,
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data_len(&self) -> usize {
        self.data_len
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let s = self.source;
        // After an error the file is discarded: no more reading, nothing to fill the disk
        // with (the writer takes short data as it comes).
        if s.error.borrow().is_some() {
            return Cow::Borrowed(&[]);
        }
        match self.bytes() {
            Ok(bytes) => Cow::Owned(bytes),
            Err(e) => {
                s.error.borrow_mut().get_or_insert(e);
                Cow::Borrowed(&[])
            }
        }
    }
}

impl Lazy<'_> {
    /// The tensor's bytes as the file holds them: read (and checked) from the shards,
    /// transposed if asked, little-endian.
    fn bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        let s = self.source;
        let name = &self.tensor.name;
        let values =
            checkpoint::read_tensor(&s.dir, &s.meta, &self.tensor, &mut s.files.borrow_mut())?;
        if values.len().checked_mul(4) != Some(self.data_len) {
            return Err(CheckpointError::Invalid(format!(
                "tensor '{name}': {} values read for shape {:?}",
                values.len(),
                self.shape
            )));
        }
        let values = match (self.transpose, self.shape.as_slice()) {
            (false, _) => values,
            // Our [rows, cols] is [cols, rows] in the file.
            (true, &[cols, rows]) => transpose(&values, rows, cols).ok_or_else(|| {
                CheckpointError::Invalid(format!(
                    "tensor '{name}': {} values do not make {rows} x {cols}",
                    values.len()
                ))
            })?,
            (true, shape) => {
                return Err(CheckpointError::Invalid(format!(
                    "tensor '{name}' of shape {shape:?}: only a 2-D tensor can be transposed"
                )))
            }
        };
        // The one buffer sized here: a tensor too large for memory is an error naming it.
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(self.data_len).map_err(|e| {
            CheckpointError::Invalid(format!(
                "tensor '{name}' ({} bytes): {e}; export on a machine with more memory",
                self.data_len
            ))
        })?;
        bytes.extend(values.iter().flat_map(|x| x.to_le_bytes()));
        Ok(bytes)
    }
}

/// [rows, cols] row-major -> [cols, rows]; None unless `v` holds rows x cols values.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Option<Vec<f32>> {
    if rows.checked_mul(cols) != Some(v.len()) {
        return None;
    }
    let mut out = Vec::with_capacity(v.len());
    for c in 0..cols {
        out.extend(v.iter().skip(c).step_by(cols).take(rows));
    }
    Some(out)
}

/// The name set `names` asks for, for a checkpoint of `family`; an error for a set of
/// the other family.
fn resolve(names: Names, family: Family) -> Result<NameSet, String> {
    let set = match names {
        Names::Nanogpt => NameSet::Nanogpt,
        Names::Hf => family.hf(),
        Names::HfGpt2 => NameSet::HfGpt2,
        Names::HfLlama => NameSet::HfLlama,
    };
    match set.family() {
        Some(f) if f != family => Err(format!(
            "--names {set} names {f} tensors, and this checkpoint is a {family}; use \
             --names hf (here: {}) or nanogpt (ours)",
            family.hf()
        )),
        _ => Ok(set),
    }
}

/// Run `ckpt export`: every error says what was being exported where.
pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    if !args.safetensors {
        bail!("choose a format: --safetensors (the only one for now)");
    }
    export(args)
        .with_context(|| format!("exporting {} to {}", args.dir.display(), args.out.display()))
}

fn export(args: &ExportArgs) -> anyhow::Result<()> {
    // The output first: a directory missing or a file there is said before any reading.
    zero_core::files::check_output(&args.out, false)?;
    let dir = checkpoint::resolve(&args.dir)
        .with_context(|| format!("opening {}", args.dir.display()))?;
    let meta = Meta::read(&dir)?;
    let layout_tensors = meta.layout.tensors();
    let family = Family::of(layout_tensors.iter().map(|t| t.name.as_str()));
    let set = resolve(args.names, family).map_err(|e| anyhow::anyhow!("{e}"))?;
    // Everything that can be checked is checked before the output is created.
    let mut planned = Vec::new();
    for t in layout_tensors {
        let stored = names::stored(set, &t.name);
        if stored.transposed && t.shape.len() != 2 {
            bail!(
                "tensor '{}' has shape {:?}, but --names {set} stores it transposed as a \
                 2-D Conv1D weight: the checkpoint is not of the GPT-2 model these names are \
                 for; export it with --names nanogpt",
                t.name,
                t.shape
            );
        }
        let shape = stored.shape(&t.shape);
        let data_len = shape
            .iter()
            .try_fold(4usize, |n, &d| n.checked_mul(d))
            .with_context(|| {
                format!(
                    "tensor '{}' of shape {shape:?}: more bytes than memory can address; \
                     the checkpoint's metadata is damaged",
                    t.name
                )
            })?;
        planned.push((stored, t, shape, data_len));
    }
    // The shards as `ckpt consolidate` checks them: present, of this checkpoint, holding
    // what the metadata says (so no tensor's size is a bare claim of meta.json).
    let files = meta
        .open_shards(&dir)
        .with_context(|| format!("checking the shard files of {}", dir.display()))?;
    let source = Source {
        dir,
        meta,
        files: RefCell::new(files),
        error: RefCell::new(None),
    };
    let tensors: Vec<_> = planned
        .into_iter()
        .map(|(stored, tensor, shape, data_len)| {
            (
                stored.name,
                Lazy {
                    tensor,
                    shape,
                    data_len,
                    transpose: stored.transposed,
                    source: &source,
                },
            )
        })
        .collect();
    let n = tensors.len();
    let info = Some(HashMap::from([
        ("format".to_string(), "pt".to_string()),
        ("zero_rs_step".to_string(), source.meta.step.to_string()),
    ]));
    // Written under a temporary name and put in place when whole (never over a file that
    // appeared meanwhile): the output is never partial. Errors name the output, not the
    // hidden temporary file.
    checkpoint::write_whole(&args.out, false, |tmp| {
        let written = safetensors::tensor::serialize_to_file(tensors, &info, tmp);
        if let Some(e) = source.error.borrow_mut().take() {
            return Err(e);
        }
        written.map_err(|e| match e {
            safetensors::SafeTensorError::IoError(cause) => CheckpointError::Io {
                what: "write",
                path: args.out.clone(),
                cause,
            },
            // Its Display is its Debug form.
            e => CheckpointError::Invalid(format!("writing {}: {e:?}", args.out.display())),
        })
    })?;
    outln!(
        "wrote {n} tensors to {} (safetensors, {set} names)",
        args.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use zero_core::checkpoint::{rank_file, ShardWriter, META_FILE};
    use zero_core::files::entry_names;
    use zero_core::{
        EngineConfig, LayerSpec, LossScaler, ModelSpec, ParamSpec, PartitionLayout, UnitSpec,
    };

    use super::*;

    #[test]
    fn transpose_swaps_rows_and_columns() {
        // [[1, 2, 3], [4, 5, 6]] -> [[1, 4], [2, 5], [3, 6]]
        let t = transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3);
        assert_eq!(t, Some(vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]));
        assert_eq!(transpose(&[1.0, 2.0, 3.0], 2, 3), None);
        assert_eq!(transpose(&[], 0, 0), Some(vec![]));
    }

    /// A one-unit model of `params` (name, shape) on 2 ranks.
    fn layout(params: &[(&str, &[usize])]) -> PartitionLayout {
        let spec = ModelSpec {
            units: vec![UnitSpec {
                name: "u".into(),
                params: params.iter().map(|(n, s)| ParamSpec::new(*n, s)).collect(),
            }],
            layers: vec![LayerSpec::new("l", vec![0])],
        };
        PartitionLayout::new(&spec, 2, 1).unwrap()
    }

    /// Write a checkpoint of `layout` at step 7 into `dir`, element i of the flat buffer
    /// holding i; its metadata.
    fn write_checkpoint(dir: &Path, layout: &PartitionLayout) -> Meta {
        std::fs::create_dir_all(dir).unwrap();
        let config = EngineConfig::default();
        let scaler = LossScaler::new(&config.precision);
        let mut meta = Meta::new(&config, layout, 7, 7, &scaler, None);
        for r in 0..layout.world {
            let mut w = ShardWriter::create(
                &dir.join(rank_file(r)),
                r,
                layout.world,
                7,
                meta.block_elems,
            )
            .unwrap();
            let mut crcs = Vec::new();
            for (u, unit) in layout.units.iter().enumerate() {
                let v: Vec<f32> = (r * unit.shard_len..(r + 1) * unit.shard_len)
                    .map(|i| i as f32)
                    .collect();
                crcs.extend(w.write_unit(u, [&v, &v, &v]).unwrap());
            }
            w.finish().unwrap();
            meta.crc32.push(crcs);
        }
        write_meta(dir, &meta);
        meta
    }

    fn write_meta(dir: &Path, meta: &Meta) {
        let text = serde_json::to_string_pretty(meta).unwrap();
        std::fs::write(dir.join(META_FILE), text).unwrap();
    }

    fn export(dir: &Path, out: &Path, names: Names) -> anyhow::Result<()> {
        run(&ExportArgs {
            safetensors: true,
            names,
            dir: dir.to_path_buf(),
            out: out.to_path_buf(),
        })
    }

    /// Export `dir` into a fresh `out/` under `tmp` with `names`, expecting an error: its
    /// text, once no output is left behind.
    fn refused(dir: &Path, tmp: &Path, names: Names) -> String {
        let out = tmp.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let err = format!(
            "{:#}",
            export(dir, &out.join("m.safetensors"), names).unwrap_err()
        );
        assert!(entry_names(&out).unwrap().is_empty(), "{err}");
        err
    }

    const GPT2: [(&str, &[usize]); 2] = [("wte", &[3, 2]), ("h.0.attn.c_attn.weight", &[2, 3])];

    #[test]
    fn hf_gpt2_export_transposes_the_conv1d_weights() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("step-7");
        write_checkpoint(&dir, &layout(&GPT2));
        let out = tmp.path().join("out").join("m.safetensors");
        std::fs::create_dir(tmp.path().join("out")).unwrap();
        export(&dir, &out, Names::HfGpt2).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let values = |name: &str| -> (Vec<usize>, Vec<f32>) {
            let t = st.tensor(name).unwrap();
            let v = t
                .data()
                .chunks(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (t.shape().to_vec(), v)
        };
        assert_eq!(
            values("wte.weight"),
            (vec![3, 2], vec![0., 1., 2., 3., 4., 5.])
        );
        // [[6, 7, 8], [9, 10, 11]] stored as its transpose.
        assert_eq!(
            values("h.0.attn.c_attn.weight"),
            (vec![3, 2], vec![6., 9., 7., 10., 8., 11.])
        );
        assert_eq!(
            entry_names(&tmp.path().join("out")).unwrap(),
            ["m.safetensors"]
        );
    }

    #[test]
    fn a_missing_shard_fails_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("step-7");
        write_checkpoint(&dir, &layout(&GPT2));
        std::fs::remove_file(dir.join(rank_file(1))).unwrap();
        let err = refused(&dir, tmp.path(), Names::Nanogpt);
        assert!(err.contains(&rank_file(1)), "{err}");
    }

    #[test]
    fn a_conv1d_name_that_is_not_2d_is_refused_with_hf_gpt2() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("step-7");
        write_checkpoint(
            &dir,
            &layout(&[("wte", &[3, 2]), ("h.0.attn.c_attn.weight", &[6])]),
        );
        let err = refused(&dir, tmp.path(), Names::HfGpt2);
        assert!(
            err.contains("h.0.attn.c_attn.weight") && err.contains("--names nanogpt"),
            "{err}"
        );
        // Our own names need no transpose: that export works.
        export(&dir, &tmp.path().join("out/m.safetensors"), Names::Nanogpt).unwrap();
    }

    /// A read that fails while the file is written (a checksum that does not hold): the
    /// error reported, naming the dataset, and no output left.
    #[test]
    fn a_bad_block_fails_the_export_and_leaves_no_output() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("step-7");
        let mut meta = write_checkpoint(&dir, &layout(&GPT2));
        meta.crc32[1][0][0] ^= 1;
        write_meta(&dir, &meta);
        let err = refused(&dir, tmp.path(), Names::Nanogpt);
        assert!(
            err.contains("checksum mismatch") && err.contains(&rank_file(1)),
            "{err}"
        );
    }

    /// The output is checked before the checkpoint is read: a missing directory, and an
    /// existing file (kept as it was), are said with the export's context.
    #[test]
    fn a_missing_directory_or_an_existing_output_is_refused_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("step-7");
        write_checkpoint(&dir, &layout(&GPT2));
        let err = format!(
            "{:#}",
            export(&dir, &tmp.path().join("nodir/m.st"), Names::Nanogpt).unwrap_err()
        );
        assert!(
            err.starts_with("exporting ") && err.contains("nodir' does not exist; create it first"),
            "{err}"
        );
        assert!(!err.contains(".partial-"), "{err}");
        let out = tmp.path().join("m.st");
        std::fs::write(&out, b"mine").unwrap();
        let err = format!("{:#}", export(&dir, &out, Names::Nanogpt).unwrap_err());
        assert!(err.contains("exists; not overwriting it"), "{err}");
        assert_eq!(std::fs::read(&out).unwrap(), b"mine");
        // A damaged meta.json is reported as part of the export too.
        std::fs::write(dir.join(META_FILE), "{").unwrap();
        let err = format!(
            "{:#}",
            export(&dir, &tmp.path().join("m2.st"), Names::Nanogpt).unwrap_err()
        );
        assert!(err.starts_with("exporting "), "{err}");
    }

    /// A `meta.json` claiming a tensor far larger than the shards (2^40 elements): an
    /// error naming what is wrong, not an allocation failure.
    #[test]
    fn a_metadata_claiming_a_huge_tensor_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("step-7");
        let mut meta = write_checkpoint(&dir, &layout(&GPT2));
        let huge = layout(&[("wte", &[1 << 20, 1 << 20])]);
        meta.layout = huge.clone();
        // Checksum blocks as large, so that the checksum lists stay consistent and short.
        meta.block_elems = 1 << 40;
        meta.crc32 = vec![vec![vec![0]; 3]; 2];
        write_meta(&dir, &meta);
        let err = refused(&dir, tmp.path(), Names::Nanogpt);
        assert!(err.contains(&rank_file(0)), "{err}");
    }
}
