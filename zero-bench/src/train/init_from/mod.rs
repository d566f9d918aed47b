//! `--init-from`: start training from the weights of a model file. Three inputs, told
//! apart by the path and, failing that, by the file's first bytes:
//!
//! - a directory (or a `*.index.json` file): sharded safetensors, as Hugging Face writes
//!   them: `model.safetensors.index.json` whose `weight_map` names each tensor's shard
//!   (a directory without an index but with one `model.safetensors` is that file);
//! - `*.safetensors`, or a file that begins as one (an 8-byte length, then `{`): one
//!   safetensors file (st.rs);
//! - anything else: a consolidated HDF5 model file (h5.rs, feature `hdf5`), as `ckpt
//!   consolidate` and `--save-model` write it.
//!
//! Names: ours or Hugging Face's for the model's family (`zero_models::names`, the
//! mapping `ckpt export --names` writes with), whichever fits more of the model's tensors.
//! GPT-2: with or without a `transformer.` prefix; under HF names the four linear weights
//! of a block are stored [in, out] (Conv1D) and transposed on load. Llama: HF's
//! `LlamaForCausalLM` names, nothing transposed; a file without `lm_head.weight` is a
//! model with `tie_word_embeddings` (unless a `config.json` beside it says otherwise), and
//! our untied `output.weight` starts as a copy of `model.embed_tokens.weight`. Element
//! types: f32, and in safetensors also f16 and bf16 (widened to f32, which is exact).
//!
//! [`InitFile::open`] (every rank, before step 1) checks the file against the model and
//! lists, in one error, every tensor that is missing, misshaped (saying when it looks
//! transposed) or of a type we do not read. Tensors the model does not have are a
//! warning; the tied LM head and attention-mask buffers of a whole-model state dict are
//! one info line. [`InitFile::load_into`] goes through the engine's import interface
//! (`Engine::import_unit` per unit, then `finish_import`): each rank reads and converts
//! only the elements it keeps (`Engine::import_range`, its shard at stages 1-3), a row
//! block of `wte` from its rows; safetensors are memory-mapped, so a rank touches only the
//! pages it reads. Every value read is checked to be finite as it is read: a NaN or
//! infinity in the file is refused naming the tensor and the index of the first one, not
//! left to step 1 (whose inf/NaN gradient would blame the learning rate or the data). The
//! optimizer starts fresh (m = v = 0, step 0, the configured loss scale).

#[cfg(feature = "hdf5")]
mod h5;
mod st;

#[cfg(not(feature = "hdf5"))]
use super::without_hdf5::init_from_h5 as h5;

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use zero_comm::Communicator;
use zero_core::{Engine, LossScaler, ModelSpec, Tensor};
use zero_kernels::device::Device;
use zero_models::llama::LlamaConfig;
use zero_models::names::{self, Family, NameSet};
use zero_models::ModelPreset;

pub use h5::save;

/// The element types a model file may hold that `--init-from` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// 32-bit float.
    F32,
    /// IEEE half (safetensors `F16`).
    F16,
    /// bfloat16 (safetensors `BF16`).
    Bf16,
}

/// One tensor as a file holds it.
pub struct Entry {
    /// Its name in the file.
    pub name: String,
    /// Its shape in the file.
    pub shape: Vec<usize>,
    /// Its element type, or what it is instead (said in the error if the model needs it).
    pub elem: Result<Elem, String>,
}

/// The opened file, by format.
enum Source {
    H5(h5::H5File),
    St(st::StFile),
}

impl Source {
    fn entries(&self) -> &[Entry] {
        match self {
            Source::H5(f) => f.entries(),
            Source::St(f) => f.entries(),
        }
    }

    /// Elements `range` of entry `entry` (flat, row-major, in the file's orientation),
    /// widened to f32, into `out` (of `range.len()`).
    fn read(&self, entry: usize, range: Range<usize>, out: &mut [f32]) -> anyhow::Result<()> {
        match self {
            Source::H5(f) => f.read(entry, range, out),
            Source::St(f) => f.read(entry, range, out),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Source::H5(_) => "HDF5",
            Source::St(f) => f.kind(),
        }
    }
}

/// Where a tensor of the model is in the file.
struct Bound {
    entry: usize,
    /// The file holds it [cols, rows] (Conv1D under HF names).
    transposed: bool,
}

/// A model file whose tensors were checked against a model's spec.
pub struct InitFile {
    path: PathBuf,
    source: Source,
    names: NameSet,
    /// By our tensor name (a split tensor's whole name).
    bound: HashMap<String, Bound>,
    extra: Vec<String>,
    redundant: Vec<(&'static str, String)>,
    /// Our head was bound to the file's embedding (a Llama saved with tied embeddings).
    tied_head: bool,
}

/// What `--init-from PATH` points at.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// A safetensors index (`weight_map`) and its shards.
    Index(PathBuf),
    /// One safetensors file.
    Safetensors(PathBuf),
    /// An HDF5 model file (or something that is no model file: HDF5 says what).
    Hdf5(PathBuf),
}

/// Hugging Face's name of the index of a sharded safetensors model.
const INDEX_NAME: &str = "model.safetensors.index.json";
/// Hugging Face's name of a one-file safetensors model.
const SINGLE_NAME: &str = "model.safetensors";

fn kind_of(path: &Path) -> anyhow::Result<Kind> {
    if path.is_dir() {
        let index = path.join(INDEX_NAME);
        let single = path.join(SINGLE_NAME);
        return if index.is_file() {
            Ok(Kind::Index(index))
        } else if single.is_file() {
            Ok(Kind::Safetensors(single))
        } else {
            bail!(
                "{} is a directory without {INDEX_NAME} (sharded safetensors) or {SINGLE_NAME}",
                path.display()
            )
        };
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.ends_with(".index.json") {
        return Ok(Kind::Index(path.to_path_buf()));
    }
    if name.ends_with(".safetensors") {
        return Ok(Kind::Safetensors(path.to_path_buf()));
    }
    // By content: safetensors begins with its header's length (u64 LE), then the JSON
    // header's `{`; HDF5 files begin with their signature (or a user block before it).
    let mut head = [0u8; 9];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .with_context(|| format!("opening the model file {}", path.display()))?;
    if n == head.len() && head[8] == b'{' {
        return Ok(Kind::Safetensors(path.to_path_buf()));
    }
    Ok(Kind::Hdf5(path.to_path_buf()))
}

fn shape_str(s: &[usize]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// At most `n` of `items`, then ", ..." when there were more.
fn some_of(items: &[String], n: usize) -> String {
    let shown = items.len().min(n);
    format!(
        "{}{}",
        items[..shown].join(", "),
        if items.len() > shown { ", ..." } else { "" }
    )
}

/// How `entries` hold `tensors` under one name set.
struct Fit {
    names: NameSet,
    bound: HashMap<String, Bound>,
    /// Tensors present with their shape (in the set's orientation).
    shapes_match: usize,
    problems: Vec<String>,
    /// The head was bound to the embedding (see [`fit`]).
    tied_head: bool,
}

/// Hugging Face's `config.json` beside the model file (in the folder, or beside the
/// file), when there is one.
fn hf_config_path(path: &Path) -> Option<PathBuf> {
    let dir = if path.is_dir() { path } else { path.parent()? };
    Some(dir.join("config.json")).filter(|p| p.is_file())
}

/// What the file says of Hugging Face's `tie_word_embeddings`: Some(x) when a
/// `config.json` beside it sets it, None when there is none or it does not say.
fn tie_word_embeddings(path: &Path) -> Option<bool> {
    let text = std::fs::read_to_string(hf_config_path(path)?).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("tie_word_embeddings")?.as_bool()
}

/// Check a Llama model against the Hugging Face `config.json` beside `path`, if there is
/// one: the numbers the tensors' shapes do not show (heads and key/value heads of the
/// same widths, the rotary base, RMSNorm's epsilon, rope scaling) load a different
/// function when they differ, so each difference is listed in one error. Nothing to check
/// for GPT-2 or without a config.json.
pub fn check_hf_config(path: &Path, preset: &ModelPreset) -> anyhow::Result<()> {
    let ModelPreset::Llama(m) = preset else {
        return Ok(());
    };
    let Some(file) = hf_config_path(path) else {
        return Ok(());
    };
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} (beside the model file) is not JSON", file.display()))?;
    let differences = llama_config_differences(&json, m);
    if !differences.is_empty() {
        bail!(
            "{} does not describe the model (pick the preset of these weights, e.g. \
             llama2-7b or llama3-8b, or --set the sizes):\n  {}",
            file.display(),
            differences.join("\n  ")
        );
    }
    Ok(())
}

/// Each way `json` (a `LlamaConfig` of `transformers`) differs from `m`, with HF's
/// defaults for fields it leaves out.
fn llama_config_differences(json: &serde_json::Value, m: &LlamaConfig) -> Vec<String> {
    let int = |k: &str| json.get(k).and_then(|v| v.as_u64());
    let float = |k: &str| json.get(k).and_then(|v| v.as_f64());
    let heads = int("num_attention_heads");
    let mut out = Vec::new();
    let ints = [
        ("vocab_size", int("vocab_size"), m.vocab_size, "vocab_size"),
        ("hidden_size", int("hidden_size"), m.n_embd, "n_embd"),
        (
            "intermediate_size",
            int("intermediate_size"),
            m.ffn_hidden,
            "ffn_hidden",
        ),
        (
            "num_hidden_layers",
            int("num_hidden_layers"),
            m.n_layer,
            "n_layer",
        ),
        ("num_attention_heads", heads, m.n_head, "n_head"),
        (
            "num_key_value_heads",
            int("num_key_value_heads").or(heads),
            m.n_kv_head,
            "n_kv_head",
        ),
        ("head_dim", int("head_dim"), m.head_dim(), "head size C/H"),
    ];
    for (key, theirs, ours, name) in ints {
        if let Some(t) = theirs.filter(|&t| t != ours as u64) {
            out.push(format!("{key} = {t}, the model has {name} = {ours}"));
        }
    }
    // transformers' LlamaConfig defaults: rope_theta 10000, rms_norm_eps 1e-6.
    let floats = [
        (
            "rope_theta",
            float("rope_theta").unwrap_or(10_000.0),
            m.rope_theta,
            "rope_theta",
        ),
        (
            "rms_norm_eps",
            float("rms_norm_eps").unwrap_or(1e-6),
            m.norm_eps,
            "norm_eps",
        ),
    ];
    for (key, theirs, ours, name) in floats {
        if (theirs - ours).abs() > 1e-9 * ours.abs() {
            out.push(format!(
                "{key} = {theirs:e}, the model has {name} = {ours:e}"
            ));
        }
    }
    if let Some(r) = json.get("rope_scaling").filter(|r| !r.is_null()) {
        out.push(format!(
            "rope_scaling = {r}: scaled rotary frequencies (Llama 3.1 and later) are not \
             implemented; ours are theta^(-2i/hd) unscaled"
        ));
    }
    if let Some(act) = json.get("hidden_act").and_then(|v| v.as_str()) {
        if act != "silu" {
            out.push(format!(
                "hidden_act = {act:?}, the model's MLP is SwiGLU (silu)"
            ));
        }
    }
    for key in ["attention_bias", "mlp_bias"] {
        if json.get(key).and_then(|v| v.as_bool()) == Some(true) {
            out.push(format!(
                "{key} = true: the model's linear layers have no biases"
            ));
        }
    }
    out
}

/// Why a tensor's shape differs from the model's, when it is its transpose.
fn transposed_hint(set: NameSet, family: Family) -> &'static str {
    match (set, family) {
        (_, Family::Llama) => {
            "looks transposed: Llama's linear weights are stored [out, in] \
             (torch.nn.Linear), under Hugging Face's names as under ours"
        }
        (NameSet::HfGpt2, _) => {
            "looks transposed: under Hugging Face GPT-2 names the block's linear \
             weights are Conv1D's [in, out], and this one is stored [out, in] \
             (torch.nn.Linear), as our names (wte, wpe, ...) hold them"
        }
        _ => {
            "looks transposed: under these names weights are stored [out, in] \
             (torch.nn.Linear); a file in Conv1D's [in, out] must use Hugging Face \
             GPT-2 names (wte.weight, wpe.weight, ...), which are transposed on load"
        }
    }
}

/// Match the model's tensors (of `family`) to the file's entries under `set`. `by_name`:
/// the file's names without the `transformer.` prefix. `tie`: what the file's config
/// says of `tie_word_embeddings` (None: nothing), for a Llama file without
/// `lm_head.weight`.
fn fit(
    set: NameSet,
    family: Family,
    tensors: &[Tensor],
    entries: &[Entry],
    by_name: &HashMap<&str, usize>,
    tie: Option<bool>,
) -> Fit {
    let mut bound = HashMap::new();
    let mut missing = Vec::new();
    let mut problems = Vec::new();
    let mut shapes_match = 0;
    let mut tied_head = false;
    for t in tensors {
        let stored = names::stored(set, &t.name);
        let want = stored.shape(&t.shape);
        let mut found = by_name.get(stored.name.as_str()).copied();
        // Hugging Face does not save a tied head: it is the embedding (same [V, C]).
        if found.is_none()
            && set == NameSet::HfLlama
            && stored.name == names::HF_LLAMA_HEAD
            && tie != Some(false)
        {
            found = by_name.get(names::HF_LLAMA_EMBED).copied();
            tied_head = found.is_some();
        }
        let Some(i) = found else {
            let why = if stored.name == names::HF_LLAMA_HEAD && tie == Some(false) {
                " (config.json: tie_word_embeddings = false)"
            } else {
                ""
            };
            missing.push(format!("{} {}{why}", stored.name, shape_str(&want)));
            continue;
        };
        let e = &entries[i];
        if e.shape == want {
            shapes_match += 1;
        } else {
            let mut reversed = e.shape.clone();
            reversed.reverse();
            let hint = if e.shape.len() == 2 && reversed == want {
                transposed_hint(set, family)
            } else {
                "the file is for a different model size (check model.* in the config)"
            };
            problems.push(format!(
                "tensor '{}' has shape {}, the model expects {}: {hint}",
                e.name,
                shape_str(&e.shape),
                shape_str(&want)
            ));
        }
        if let Err(what) = &e.elem {
            problems.push(format!("tensor '{}' is {what}", e.name));
        }
        bound.insert(
            t.name.clone(),
            Bound {
                entry: i,
                transposed: stored.transposed,
            },
        );
    }
    if !missing.is_empty() {
        problems.insert(
            0,
            format!(
                "lacks {} of the model's {} tensors: {}",
                missing.len(),
                tensors.len(),
                missing.join(", ")
            ),
        );
    }
    Fit {
        names: set,
        bound,
        shapes_match,
        problems,
        tied_head,
    }
}

impl InitFile {
    /// Open `path` and check that it holds every tensor of `spec` (a tensor split into
    /// row blocks is one tensor of its whole shape) with its shape and a type we read.
    /// Every rank calls it; it reads the file's headers only.
    pub fn open(path: &Path, spec: &ModelSpec) -> anyhow::Result<InitFile> {
        let source = match kind_of(path)? {
            Kind::Index(index) => Source::St(st::StFile::open_index(&index)?),
            Kind::Safetensors(file) => Source::St(st::StFile::open(&file)?),
            Kind::Hdf5(file) => Source::H5(h5::H5File::open(&file)?),
        };
        let entries = source.entries();
        let mut by_name: HashMap<&str, usize> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            let name = e.name.strip_prefix(names::PREFIX).unwrap_or(&e.name);
            by_name.entry(name).or_insert(i);
        }
        let tensors = spec.tensors();
        let family = Family::of(tensors.iter().map(|t| t.name.as_str()));
        let tie = tie_word_embeddings(path);
        // The name set of the family that fits more tensors with their shapes, then more
        // names; ours on a tie (GPT-2's differ in `wte`/`wpe` and in the orientation of
        // block weights, Llama's in every name).
        let mut best: Option<Fit> = None;
        for set in family.name_sets() {
            let f = fit(set, family, &tensors, entries, &by_name, tie);
            let score = (f.shapes_match, f.bound.len());
            if best
                .as_ref()
                .is_none_or(|b| score > (b.shapes_match, b.bound.len()))
            {
                best = Some(f);
            }
        }
        let mut fit = best.ok_or_else(|| anyhow!("no name set to match"))?;
        let used: HashSet<usize> = fit.bound.values().map(|b| b.entry).collect();
        let mut extra = Vec::new();
        let mut redundant = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if used.contains(&i) {
                continue;
            }
            let name = e.name.strip_prefix(names::PREFIX).unwrap_or(&e.name);
            match names::redundant(family, name) {
                Some(why) => redundant.push((why, e.name.clone())),
                None => extra.push(e.name.clone()),
            }
        }
        if !extra.is_empty() && (family == Family::Llama || !fit.problems.is_empty()) {
            // A Llama-like file with more tensors is another architecture (attention
            // biases, say): ignoring them would load a different function. GPT-2 files
            // keep the warning (tests/tests/safetensors_cli.rs), but an error lists them.
            let why = match family {
                Family::Llama => {
                    " (a Llama file holds only these names; more tensors mean another \
                     architecture, e.g. attention biases, whose weights would load wrong)"
                }
                Family::Gpt2 => "",
            };
            fit.problems.push(format!(
                "has {} tensor(s) the model does not have: {}{why}",
                extra.len(),
                extra.join(", ")
            ));
        }
        if !fit.problems.is_empty() {
            bail!(
                "{} ({}, {} names) does not fit the model ({family}):\n  {}",
                path.display(),
                source.kind(),
                fit.names,
                fit.problems.join("\n  ")
            );
        }
        Ok(InitFile {
            path: path.to_path_buf(),
            source,
            names: fit.names,
            bound: fit.bound,
            extra,
            redundant,
            tied_head: fit.tied_head,
        })
    }

    /// The file's path, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Format and names, for the log: "safetensors, hf-gpt2 names".
    pub fn describe(&self) -> String {
        format!("{}, {} names", self.source.kind(), self.names)
    }

    /// Tensors in the file that the model does not have (warned about, not loaded).
    pub fn extra(&self) -> &[String] {
        &self.extra
    }

    /// Log what is not loaded: the extra tensors (a warning listing them all) and the
    /// redundant ones of a whole-model state dict (one info line), and a head loaded from
    /// the embedding. Rank 0 calls it.
    pub fn log_unused(&self) {
        if self.tied_head {
            log::info!(
                "{}: no {}: a model with tied embeddings (tie_word_embeddings); output.weight \
                 starts as a copy of {} and trains untied",
                self.path.display(),
                names::HF_LLAMA_HEAD,
                names::HF_LLAMA_EMBED
            );
        }
        if !self.extra.is_empty() {
            log::warn!(
                "{}: ignoring {} tensor(s) the model does not have: {}",
                self.path.display(),
                self.extra.len(),
                self.extra.join(", ")
            );
        }
        if !self.redundant.is_empty() {
            let mut reasons: Vec<&str> = self.redundant.iter().map(|(why, _)| *why).collect();
            reasons.dedup();
            let groups: Vec<String> = reasons
                .iter()
                .map(|why| {
                    let names: Vec<String> = self
                        .redundant
                        .iter()
                        .filter(|(w, _)| w == why)
                        .map(|(_, n)| n.clone())
                        .collect();
                    format!("{why} ({})", some_of(&names, 3))
                })
                .collect();
            log::info!(
                "{}: not loading {} tensor(s) that hold nothing to load: {}",
                self.path.display(),
                self.redundant.len(),
                groups.join("; ")
            );
        }
    }

    /// Set the engine's parameters (master and working copies) to the file's, unit by
    /// unit, each rank only what it keeps. Collective: every rank calls it, and every
    /// rank reaches `finish_import` (an I/O error on one rank mid-way must not leave the
    /// others waiting in its agreement): that rank returns its own error, the others the
    /// engine's `PeerImport`, and every engine refuses steps until a load succeeds.
    pub fn load_into<D: Device, C: Communicator>(
        &self,
        engine: &mut Engine<'_, D, C>,
    ) -> anyhow::Result<()> {
        // From here every rank's engine counts as part-imported, also one that fails
        // before its first unit: finish_import then refuses on every rank alike.
        engine.begin_import();
        let imported = self.import_units(engine);
        let scaler = LossScaler::new(&engine.config().precision);
        let finished = engine
            .finish_import(0, 0, scaler)
            .map_err(|e| anyhow!("finishing the load of {}: {e}", self.path.display()));
        imported.and(finished)
    }

    /// This rank's part of every unit, read and imported (`load_into`).
    fn import_units<D: Device, C: Communicator>(
        &self,
        engine: &mut Engine<'_, D, C>,
    ) -> anyhow::Result<()> {
        let layout = engine.layout().clone();
        for (u, unit) in layout.units.iter().enumerate() {
            let kept = engine
                .import_range(u)
                .map_err(|e| anyhow!("loading unit '{}': {e}", unit.name))?;
            // The master of what this rank keeps (padding stays zero).
            let mut master = vec![0.0f32; kept.len()];
            let pieces = layout
                .pieces(u, kept)
                .map_err(|e| anyhow!("loading unit '{}': {e}", unit.name))?;
            for piece in pieces {
                let p = &layout.params[piece.param];
                let (tensor, first_row) = match &p.row_block {
                    Some(b) => (b.tensor.as_str(), b.first_row),
                    None => (p.name.as_str(), 0),
                };
                let b = self
                    .bound
                    .get(tensor)
                    .ok_or_else(|| anyhow!("internal: '{tensor}' was not matched to the file"))?;
                // Elements of the whole tensor (ours, row-major) this piece covers.
                let cols: usize = p.shape.iter().skip(1).product();
                let at = first_row * cols;
                let whole = at + piece.in_param.start..at + piece.in_param.end;
                let out = &mut master[piece.in_range.clone()];
                self.read_ours(b, cols, whole.clone(), out)
                    .with_context(|| format!("{}: reading '{}'", self.path.display(), p.name))?;
                // As it is read, not at step 1, where it would look like a bad lr.
                self.check_finite(b, cols, whole, out)?;
            }
            // Adam's moments start at zero.
            let zeros = vec![0.0f32; master.len()];
            engine
                .import_unit(u, &master, &zeros, &zeros)
                .map_err(|e| anyhow!("loading unit '{}': {e}", unit.name))?;
        }
        Ok(())
    }

    /// Elements `range` of a tensor of ours ([rows, cols] row-major) into `out`.
    fn read_ours(
        &self,
        b: &Bound,
        cols: usize,
        range: Range<usize>,
        out: &mut [f32],
    ) -> anyhow::Result<()> {
        if !b.transposed {
            return self.source.read(b.entry, range, out);
        }
        // The file holds [cols, rows]: our (r, c) is its (c, r). Only the four linear
        // weights of a block (one unit's worth) are stored so: read the whole tensor.
        let rows = self.source.entries()[b.entry].shape[1];
        let mut stored = vec![0.0f32; rows * cols];
        self.source.read(b.entry, 0..rows * cols, &mut stored)?;
        for (o, i) in out.iter_mut().zip(range) {
            *o = stored[(i % cols) * rows + i / cols];
        }
        Ok(())
    }

    /// Refuse `values`, elements `range` of a tensor of ours ([rows, cols]) as
    /// [`InitFile::read_ours`] read them, if one is NaN or infinite: naming the file, the
    /// file's tensor and the index of the first one in the file's orientation.
    fn check_finite(
        &self,
        b: &Bound,
        cols: usize,
        range: Range<usize>,
        values: &[f32],
    ) -> anyhow::Result<()> {
        let entry = &self.source.entries()[b.entry];
        let rows = if b.transposed { entry.shape[1] } else { 0 };
        // The file's row-major index of values[k].
        let flat = |k: usize| {
            let i = range.start + k;
            if b.transposed {
                (i % cols) * rows + i / cols
            } else {
                i
            }
        };
        match first_non_finite(values, flat, &entry.shape) {
            None => Ok(()),
            Some((value, at)) => bail!(
                "{}: tensor '{}' {} holds {value} at {at}, the first non-finite value this \
                 rank reads: training from it would fail at step 1. Repair the file where it \
                 was written (e.g. check torch.isfinite(t).all() before saving) or start from \
                 another one",
                self.path.display(),
                entry.name,
                shape_str(&entry.shape)
            ),
        }
    }
}

/// The first value of `values` that is NaN or infinite, with its index in the file's
/// tensor of shape `shape` (`[row, col]`, or `[i]` for a vector): `flat(k)` is the file's
/// row-major index of `values[k]`.
fn first_non_finite(
    values: &[f32],
    flat: impl Fn(usize) -> usize,
    shape: &[usize],
) -> Option<(f32, String)> {
    let k = values.iter().position(|v| !v.is_finite())?;
    // Unravel the flat index over the file's shape, last dimension fastest.
    let mut rest = flat(k);
    let mut index = vec![0; shape.len().max(1)];
    for (d, &n) in shape.iter().enumerate().rev() {
        index[d] = rest % n.max(1);
        rest /= n.max(1);
    }
    if shape.is_empty() {
        index[0] = rest;
    }
    Some((values[k], shape_str(&index)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, shape: &[usize]) -> Entry {
        Entry {
            name: name.into(),
            shape: shape.to_vec(),
            elem: Ok(Elem::F32),
        }
    }

    fn tensor(name: &str, shape: &[usize]) -> Tensor {
        Tensor {
            name: name.into(),
            shape: shape.to_vec(),
            parts: Vec::new(),
        }
    }

    fn by_name(entries: &[Entry]) -> HashMap<&str, usize> {
        entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.as_str(), i))
            .collect()
    }

    #[test]
    fn every_problem_is_listed_with_a_transposed_hint() {
        let tensors = [
            tensor("wte", &[64, 32]),
            tensor("h.0.mlp.c_fc.weight", &[128, 32]),
            tensor("h.0.mlp.c_fc.bias", &[128]),
            tensor("ln_f.bias", &[32]),
        ];
        let mut entries = vec![
            entry("wte", &[64, 32]),
            entry("h.0.mlp.c_fc.weight", &[32, 128]),
            entry("h.0.mlp.c_fc.bias", &[100]),
        ];
        entries[0].elem = Err("F64".into());
        let f = fit(
            NameSet::Nanogpt,
            Family::Gpt2,
            &tensors,
            &entries,
            &by_name(&entries),
            None,
        );
        assert_eq!(f.problems.len(), 4, "{:?}", f.problems);
        assert!(f.problems[0].contains("lacks 1 of the model's 4 tensors: ln_f.bias [32]"));
        assert!(f.problems[1].contains("'wte' is F64"));
        assert!(f.problems[2].contains("looks transposed"));
        assert!(f.problems[3].contains("different model size"));
    }

    #[test]
    fn hf_names_bind_transposed_block_weights() {
        let tensors = [
            tensor("wte", &[64, 32]),
            tensor("h.0.mlp.c_fc.weight", &[128, 32]),
        ];
        let entries = [
            entry("wte.weight", &[64, 32]),
            entry("h.0.mlp.c_fc.weight", &[32, 128]),
        ];
        let by = by_name(&entries);
        let f = fit(NameSet::HfGpt2, Family::Gpt2, &tensors, &entries, &by, None);
        assert!(f.problems.is_empty(), "{:?}", f.problems);
        assert!(f.bound["h.0.mlp.c_fc.weight"].transposed);
        assert!(!f.bound["wte"].transposed);
        let ours = fit(
            NameSet::Nanogpt,
            Family::Gpt2,
            &tensors,
            &entries,
            &by,
            None,
        );
        assert_eq!(ours.shapes_match, 0);
    }

    #[test]
    fn a_llama_file_without_its_head_is_tied_unless_its_config_says_not() {
        let tensors = [
            tensor("tok_embeddings.weight", &[64, 16]),
            tensor("layers.0.attention.wk.weight", &[8, 16]),
            tensor("output.weight", &[64, 16]),
        ];
        let entries = [
            entry("model.embed_tokens.weight", &[64, 16]),
            entry("model.layers.0.self_attn.k_proj.weight", &[16, 8]),
        ];
        let by = by_name(&entries);
        let f = fit(
            NameSet::HfLlama,
            Family::Llama,
            &tensors,
            &entries,
            &by,
            None,
        );
        assert!(f.tied_head);
        assert_eq!(f.bound["output.weight"].entry, 0);
        assert_eq!(f.problems.len(), 1, "{:?}", f.problems);
        assert!(f.problems[0].contains("'model.layers.0.self_attn.k_proj.weight' has shape [16, 8], the model expects [8, 16]: looks transposed: Llama's"));
        let f = fit(
            NameSet::HfLlama,
            Family::Llama,
            &tensors,
            &entries,
            &by,
            Some(false),
        );
        assert!(!f.tied_head);
        assert!(f.problems[0].contains(
            "lacks 1 of the model's 3 tensors: lm_head.weight [64, 16] (config.json: tie_word_embeddings = false)"
        ));
    }

    #[test]
    fn a_hf_config_is_checked_against_the_llama_model() {
        let m = LlamaConfig::preset("llama3-8b").unwrap();
        let meta = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
            "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_scaling": null,
            "rope_theta": 500000.0, "tie_word_embeddings": false, "vocab_size": 128256,
            "max_position_embeddings": 8192
        });
        assert!(llama_config_differences(&meta, &m).is_empty());
        let mut v31 = meta.clone();
        v31["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
        v31["num_key_value_heads"] = serde_json::json!(32);
        v31["rope_theta"] = serde_json::json!(10000.0);
        let d = llama_config_differences(&v31, &m);
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].contains("num_key_value_heads = 32, the model has n_kv_head = 8"));
        assert!(d[1].contains("rope_theta = 1e4, the model has rope_theta = 5e5"));
        assert!(d[2].contains("rope_scaling"));
        // HF's default epsilon (1e-6) when the file leaves it out.
        let mut no_eps = meta;
        no_eps.as_object_mut().unwrap().remove("rms_norm_eps");
        let d = llama_config_differences(&no_eps, &m);
        assert_eq!(d, ["rms_norm_eps = 1e-6, the model has norm_eps = 1e-5"]);
    }

    /// audit36 F5: a NaN or infinity in the file is refused as it is read, naming the
    /// file, the tensor and the index of the first one (in the file's orientation).
    #[test]
    fn non_finite_weights_are_refused_naming_tensor_and_index() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        let f32s = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
        // wte [2, 3] with a NaN at [1, 1]; a Conv1D weight stored [3, 2] (ours [2, 3])
        // with an infinity at the file's [2, 0], our [0, 2]; a bias [3] with a bf16 NaN.
        let nan_bf16 = half::bf16::NAN.to_bits().to_le_bytes().to_vec();
        let mut bias = half::bf16::from_f32(1.0).to_bits().to_le_bytes().to_vec();
        bias.extend_from_slice(&bias.clone());
        bias.extend_from_slice(&nan_bf16);
        st::tests::write(
            &p,
            &[
                (
                    "wte",
                    "F32",
                    vec![2, 3],
                    f32s(&[0.0, 1.0, 2.0, 3.0, f32::NAN, 5.0]),
                ),
                (
                    "h.0.mlp.c_fc.weight",
                    "F32",
                    vec![3, 2],
                    f32s(&[0.0, 1.0, 2.0, 3.0, f32::INFINITY, 5.0]),
                ),
                ("h.0.mlp.c_fc.bias", "BF16", vec![3], bias),
            ],
        );
        let source = Source::St(st::StFile::open(&p).unwrap());
        let at = |name: &str| {
            source
                .entries()
                .iter()
                .position(|e| e.name == name)
                .unwrap()
        };
        let bound = |name: &str, transposed| Bound {
            entry: at(name),
            transposed,
        };
        let (wte, fc, bias) = (
            bound("wte", false),
            bound("h.0.mlp.c_fc.weight", true),
            bound("h.0.mlp.c_fc.bias", false),
        );
        let file = InitFile {
            path: p.clone(),
            source,
            names: NameSet::HfGpt2,
            bound: HashMap::new(),
            extra: Vec::new(),
            redundant: Vec::new(),
            tied_head: false,
        };
        let mut out = [0.0f32; 6];
        // The finite rows and columns load.
        file.read_ours(&wte, 3, 0..3, &mut out[..3]).unwrap();
        assert_eq!(out[..3], [0.0, 1.0, 2.0]);
        file.check_finite(&wte, 3, 0..3, &out[..3]).unwrap();
        file.read_ours(&fc, 3, 3..6, &mut out[..3]).unwrap();
        assert_eq!(out[..3], [1.0, 3.0, 5.0]);
        file.check_finite(&fc, 3, 3..6, &out[..3]).unwrap();
        let refused = |b: &Bound, cols, range: Range<usize>| {
            let mut out = vec![0.0f32; range.len()];
            // The read itself succeeds; the check refuses.
            file.read_ours(b, cols, range.clone(), &mut out).unwrap();
            let e = file.check_finite(b, cols, range, &out).unwrap_err();
            format!("{e:#}")
        };
        let e = refused(&wte, 3, 2..6);
        assert!(e.contains(&p.display().to_string()), "{e}");
        assert!(e.contains("tensor 'wte' [2, 3] holds NaN at [1, 1]"), "{e}");
        assert!(e.contains("Repair the file"), "{e}");
        let e = refused(&fc, 3, 0..6);
        assert!(
            e.contains("tensor 'h.0.mlp.c_fc.weight' [3, 2] holds inf at [2, 0]"),
            "{e}"
        );
        let e = refused(&bias, 1, 0..3);
        assert!(
            e.contains("'h.0.mlp.c_fc.bias' [3] holds NaN at [2]"),
            "{e}"
        );
        // The index unravels over any shape; a scalar is [0].
        let v = [1.0, f32::NEG_INFINITY];
        assert_eq!(
            first_non_finite(&v, |k| 28 + k, &[2, 3, 5]),
            Some((f32::NEG_INFINITY, "[1, 2, 4]".to_string()))
        );
        assert_eq!(first_non_finite(&v[..1], |k| k, &[2]), None);
        assert_eq!(
            first_non_finite(&[f32::NAN], |k| k, &[]).map(|(_, at)| at),
            Some("[0]".to_string())
        );
    }

    #[test]
    fn the_kind_follows_the_path_then_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(kind_of(d).is_err());
        std::fs::write(d.join(SINGLE_NAME), b"").unwrap();
        assert_eq!(kind_of(d).unwrap(), Kind::Safetensors(d.join(SINGLE_NAME)));
        std::fs::write(d.join(INDEX_NAME), b"{}").unwrap();
        assert_eq!(kind_of(d).unwrap(), Kind::Index(d.join(INDEX_NAME)));
        let st = d.join("weights.bin");
        std::fs::write(&st, b"\x02\0\0\0\0\0\0\0{}").unwrap();
        assert_eq!(kind_of(&st).unwrap(), Kind::Safetensors(st.clone()));
        let h5 = d.join("model.h5");
        std::fs::write(&h5, b"\x89HDF\r\n\x1a\n\0\0").unwrap();
        assert_eq!(kind_of(&h5).unwrap(), Kind::Hdf5(h5.clone()));
    }
}
