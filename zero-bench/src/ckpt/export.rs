//! `ckpt export --safetensors`: the master weights as a safetensors file (what Hugging
//! Face tools load), streamed one tensor at a time: the safetensors writer asks each
//! tensor for its bytes only when it writes it, and we read it from the shard files then.
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
    shape: Vec<usize>,
    transpose: bool,
    source: &'a Source,
}

struct Source {
    dir: PathBuf,
    meta: Meta,
    files: RefCell<HashMap<usize, ShardReader>>,
    /// The first read error: the writer's `data()` cannot fail, so it is kept here and
    /// the output is deleted afterwards.
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
        self.shape.iter().product::<usize>() * 4
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let s = self.source;
        let read =
            checkpoint::read_tensor(&s.dir, &s.meta, &self.tensor, &mut s.files.borrow_mut());
        let values = match read {
            Ok(v) if self.transpose => transpose(&v, self.shape[1], self.shape[0]),
            Ok(v) => v,
            Err(e) => {
                s.error.borrow_mut().get_or_insert(e);
                vec![0.0; self.data_len() / 4]
            }
        };
        Cow::Owned(values.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
}

/// [rows, cols] row-major -> [cols, rows].
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
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

/// Run `ckpt export`.
pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    if !args.safetensors {
        bail!("choose a format: --safetensors (the only one for now)");
    }
    let dir = checkpoint::resolve(&args.dir)
        .with_context(|| format!("opening {}", args.dir.display()))?;
    let meta = Meta::read(&dir)?;
    let source = Source {
        dir,
        meta,
        files: RefCell::new(HashMap::new()),
        error: RefCell::new(None),
    };
    let layout_tensors = source.meta.layout.tensors();
    let family = Family::of(layout_tensors.iter().map(|t| t.name.as_str()));
    let set = resolve(args.names, family).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut tensors = Vec::new();
    for t in layout_tensors {
        let stored = names::stored(set, &t.name);
        let shape = stored.shape(&t.shape);
        tensors.push((
            stored.name,
            Lazy {
                tensor: t,
                shape,
                transpose: stored.transposed,
                source: &source,
            },
        ));
    }
    let n = tensors.len();
    let info = Some(HashMap::from([
        ("format".to_string(), "pt".to_string()),
        ("zero_rs_step".to_string(), source.meta.step.to_string()),
    ]));
    // Written under a temporary name and renamed when whole: the output is never partial.
    checkpoint::write_whole(&args.out, false, |tmp| {
        let written = safetensors::tensor::serialize_to_file(tensors, &info, tmp);
        if let Some(e) = source.error.borrow_mut().take() {
            return Err(e);
        }
        written.map_err(|e| CheckpointError::Invalid(format!("writing {}: {e}", tmp.display())))
    })
    .with_context(|| format!("exporting {} to {}", args.dir.display(), args.out.display()))?;
    println!(
        "wrote {n} tensors to {} (safetensors, {set} names)",
        args.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_swaps_rows_and_columns() {
        // [[1, 2, 3], [4, 5, 6]] -> [[1, 4], [2, 5], [3, 6]]
        let t = transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3);
        assert_eq!(t, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }
}
