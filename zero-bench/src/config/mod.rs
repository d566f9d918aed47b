//! The configuration of `zero-bench train` (and of the sweeps and `plan` that build on
//! it): a typed TOML file plus `--set section.key=value` command-line overrides,
//! validated in one place ([`Config::validate`]) with every problem reported at once.
//!
//! Sections: `[model]`, `[data]` and `[train]` are this tool's own (the GPT of
//! zero-models, its token data, how long to run and log); `[zero]`, `[precision]`,
//! `[optim]` and `[divergence]` are zero-core's engine sections as they are, and [`Config::engine`] turns the
//! whole into the engine's [`EngineConfig`] (grad_accum and seed from `[train]`, the
//! cosine's horizon from `train.steps` unless `optim.decay_steps` says otherwise).
//!
//! Every field has a default, so an empty file is a valid small run. Unknown keys are
//! errors (serde `deny_unknown_fields`: the message names the key and the valid ones).
//! Loading ([`load()`]) records where every leaf came from (default, file, command line) so
//! the resolved configuration can be printed at start with its provenance.

use serde::{Deserialize, Serialize};
use zero_core::config::{DivergenceConfig, EngineConfig, OptimConfig, PrecisionConfig, ZeroConfig};
use zero_models::{GptConfig, LlamaConfig, ModelPreset, PRESETS};

mod load;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use load::load_str;
pub use load::{load, LoadedConfig, Source};

/// Errors of loading or validating a configuration.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// Why (in the message, so not also a `source()`: printed once).
        cause: std::io::Error,
    },
    /// The TOML is malformed, a value has the wrong type, or a key is unknown.
    #[error("config error in {origin}: {message}")]
    Parse {
        /// The file path, or "command line".
        origin: String,
        /// The parser's message (names the key and, for unknown keys, the valid ones).
        message: String,
    },
    /// A `--set` argument that is not `section.key=value`.
    #[error("bad override '{arg}': {reason}; write it as --set section.key=value, e.g. --set zero.stage=2")]
    BadOverride {
        /// The argument as given.
        arg: String,
        /// What is wrong.
        reason: String,
    },
    /// Values that are out of range or do not go together; one line per problem.
    #[error("invalid configuration:\n  - {}", problems.join("\n  - "))]
    Invalid {
        /// Each problem, with the offending numbers and what to do.
        problems: Vec<String>,
    },
}

/// The whole configuration of a training run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Model size.
    pub model: ModelConfig,
    /// Training data.
    pub data: DataConfig,
    /// Steps, batch shape, seed, logging.
    pub train: TrainConfig,
    /// ZeRO stage and its buffers (zero-core's section).
    pub zero: ZeroConfig,
    /// Mixed precision and loss scaling (zero-core's section).
    pub precision: PrecisionConfig,
    /// AdamW and the learning-rate schedule (zero-core's section).
    pub optim: OptimConfig,
    /// The loss guard: what a non-finite or spiking loss does (zero-core's section).
    pub divergence: DivergenceConfig,
}

impl Config {
    /// The engine's configuration: `[zero]`, `[precision]`, `[optim]` as they are, with
    /// `grad_accum` and `seed` from `[train]` and, for `warmup_cosine`, the decay horizon
    /// `train.steps` unless `optim.decay_steps` is set.
    pub fn engine(&self) -> EngineConfig {
        let mut optim = self.optim.clone();
        if optim.schedule == zero_core::config::Schedule::WarmupCosine
            && optim.decay_steps.is_none()
        {
            optim.decay_steps = Some(self.train.steps);
        }
        EngineConfig {
            zero: self.zero.clone(),
            precision: self.precision.clone(),
            optim,
            divergence: self.divergence.clone(),
            grad_accum: self.train.grad_accum,
            seed: self.train.seed,
        }
    }

    /// The model of either family ([`resolve_any`]).
    pub fn model_preset(&self) -> Result<ModelPreset, String> {
        resolve_any(&self.model)
    }
}

/// `[model]`: a preset, optionally with some dimensions overridden, or all five
/// dimensions given explicitly (a GPT-2). A Llama preset also takes `n_kv_head`,
/// `ffn_hidden` and `rope_theta` (the names of zero-models' `LlamaConfig`), which a GPT-2
/// refuses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Preset name (see [`PRESETS`]): tiny, small, gpt2-124m, gpt2-350m, gpt2-774m,
    /// gpt2-1.5b; or a Llama ([`zero_models::LLAMA_PRESETS`]): llama-tiny, llama-small,
    /// llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b, llama-7b/13b/70b. Unset: all five
    /// dimensions below must be given (a GPT-2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// Vocabulary size (overrides the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    /// Maximum sequence length (overrides the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_len: Option<usize>,
    /// Transformer blocks (overrides the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    /// Attention heads (overrides the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heads: Option<usize>,
    /// Channels (overrides the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<usize>,
    /// Llama only: key/value heads Hkv, a divisor of `heads` (heads / Hkv query heads
    /// share one: grouped-query attention; Hkv = heads is multi-head attention). Unset:
    /// the preset's; with `heads` changed, a multi-head preset's (llama2-7b, -13b) follows
    /// it and a grouped one keeps its Hkv, which must then divide the new `heads`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_kv_head: Option<usize>,
    /// Llama only: F, the hidden width of the SwiGLU MLP. Unset: the preset's, which is
    /// the published one for the preset's `width` (no formula covers them all); a changed
    /// `width` needs it given too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ffn_hidden: Option<usize>,
    /// Llama only: the rotary base theta (> 1). Unset: the preset's (10000 for Llama 2
    /// and the small presets, 500000 for Llama 3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Rows of the token table `wte` per unit (partitioned, gathered and reduced on its
    /// own). Default: 12 x width + 13, one transformer block's worth of elements, so the
    /// table never widens a layer's working set beyond a block's. A Llama splits both its
    /// tables (`tok_embeddings`, `output`) so, by default into one block's worth too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_block_rows: Option<usize>,
    /// Activation checkpointing: every k-th transformer block (blocks 0, k, 2k, ...)
    /// keeps only its input for the backward and recomputes the rest there, so the
    /// activation arena holds one block's internals instead of one per such block. 0 (the
    /// default): off; 1: every block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<usize>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            preset: Some("small".into()),
            vocab_size: None,
            context_len: None,
            layers: None,
            heads: None,
            width: None,
            n_kv_head: None,
            ffn_hidden: None,
            rope_theta: None,
            vocab_block_rows: None,
            checkpoint_every: None,
        }
    }
}

/// Order in which training sequences are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataOrder {
    /// Consecutive windows, in file order (wrapping around).
    Sequential,
    /// Random windows drawn from a generator seeded by `train.seed`.
    Shuffled,
}

/// `[data]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Token file path, or "builtin" for the corpus compiled into zero-models.
    pub path: String,
    /// sequential | shuffled.
    pub order: DataOrder,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            path: "builtin".into(),
            order: DataOrder::Shuffled,
        }
    }
}

/// `[train]`. The global batch of one step is N (ranks) x A x B x T tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Optimizer steps to run.
    pub steps: usize,
    /// B: sequences per micro-batch per rank.
    pub micro_batch: usize,
    /// T: tokens per sequence (at most the model's context length).
    pub seq_len: usize,
    /// A: micro-batches accumulated per optimizer step.
    pub grad_accum: usize,
    /// Seed of initialisation and data order (the same on every rank).
    pub seed: u64,
    /// Log a line every this many steps (rank 0).
    pub log_every: usize,
    /// Per-step metrics as JSON lines to this file (rank 0); unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_file: Option<String>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 20,
            micro_batch: 4,
            seq_len: 64,
            grad_accum: 1,
            seed: 1337,
            log_every: 1,
            metrics_file: None,
        }
    }
}

/// The five dimensions of the preset `name` of either family, as `[model]` keys (vocab_size,
/// context_len, layers, heads, width); `None` for a name that is no preset.
pub fn preset_dimensions(name: &str) -> Option<[(&'static str, usize); 5]> {
    let (v, t, l, h, c) = match ModelPreset::lookup(name).ok()? {
        ModelPreset::Llama(m) => (m.vocab_size, m.max_seq_len, m.n_layer, m.n_head, m.n_embd),
        ModelPreset::Gpt(m) => (m.vocab_size, m.max_seq_len, m.n_layer, m.n_head, m.n_embd),
    };
    Some([
        ("vocab_size", v),
        ("context_len", t),
        ("layers", l),
        ("heads", h),
        ("width", c),
    ])
}

/// Resolve a model of either family: a Llama preset (with vocab_size, context_len,
/// layers, heads, width, n_kv_head, ffn_hidden and rope_theta set on top), or a GPT-2 as
/// [`resolve_model`] resolves it. A Llama preset's values that go with its heads and
/// width follow them where the preset's rule says how ([`llama_kv_heads`]); where it does
/// not, the error names the preset's value and the key to give ([`llama_ffn_hidden`]).
pub fn resolve_any(m: &ModelConfig) -> Result<ModelPreset, String> {
    resolve_any_problems(m).map_err(|problems| problems.join("; "))
}

/// [`resolve_any`], with every problem of a Llama's heads, width, key/value heads and MLP
/// width as its own entry, so that one run names them all (fixing one suggestion at a
/// time would take the user a run per problem).
fn resolve_any_problems(m: &ModelConfig) -> Result<ModelPreset, Vec<String>> {
    let llama = m
        .preset
        .as_deref()
        .and_then(|name| LlamaConfig::preset(name).map(|base| (name, base)));
    let Some((name, base)) = llama else {
        return resolve_model(m).map(ModelPreset::Gpt).map_err(|e| vec![e]);
    };
    let n_head = m.heads.unwrap_or(base.n_head);
    let n_embd = m.width.unwrap_or(base.n_embd);
    let n_kv_head = llama_kv_heads(name, &base, m.n_kv_head, n_head);
    let ffn_hidden = llama_ffn_hidden(name, &base, m.ffn_hidden, n_embd);
    // Head counts the key/value heads allow: a multiple of those given, or of a grouped
    // preset's (a multi-head preset's follow the heads).
    let kv_allows = |h: usize| match m.n_kv_head {
        Some(k) => k > 0 && h.is_multiple_of(k),
        None => base.n_kv_head == base.n_head || h.is_multiple_of(base.n_kv_head.max(1)),
    };
    let mut problems: Vec<String> = llama_head_problem(n_head, n_embd, kv_allows)
        .into_iter()
        .collect();
    problems.extend(n_kv_head.as_ref().err().cloned());
    problems.extend(ffn_hidden.as_ref().err().cloned());
    let (Ok(n_kv_head), Ok(ffn_hidden), true) = (n_kv_head, ffn_hidden, problems.is_empty()) else {
        return Err(problems);
    };
    Ok(ModelPreset::Llama(LlamaConfig {
        vocab_size: m.vocab_size.unwrap_or(base.vocab_size),
        max_seq_len: m.context_len.unwrap_or(base.max_seq_len),
        n_layer: m.layers.unwrap_or(base.n_layer),
        n_head,
        n_kv_head,
        n_embd,
        ffn_hidden,
        rope_theta: m.rope_theta.unwrap_or(base.rope_theta),
        vocab_block_rows: m.vocab_block_rows,
        checkpoint_every: m.checkpoint_every.unwrap_or(0),
        ..base
    }))
}

/// A Llama's heads must cut its width into heads of even size (rotary embeddings rotate
/// pairs of a head's dimensions): the problem in `[model]` keys, with the head counts
/// nearest `n_head` that would do and that the key/value heads allow (`kv_allows`).
/// (Zero dimensions and dimensions past their bounds are the model's own check, which
/// names them.)
fn llama_head_problem(
    n_head: usize,
    n_embd: usize,
    kv_allows: impl Fn(usize) -> bool,
) -> Option<String> {
    let bound = |name: &str| {
        let mut bounds = zero_models::config::DIM_BOUNDS.iter();
        bounds.find(|(n, _)| *n == name).map_or(usize::MAX, |b| b.1)
    };
    let in_bounds =
        (1..=bound("n_head")).contains(&n_head) && (1..=bound("n_embd")).contains(&n_embd);
    let even_heads = |h: usize| n_embd.is_multiple_of(h) && (n_embd / h).is_multiple_of(2);
    if !in_bounds || even_heads(n_head) {
        return None;
    }
    let what = if !n_embd.is_multiple_of(n_head) {
        format!("model.heads = {n_head} does not divide model.width = {n_embd}")
    } else {
        format!(
            "model.width / model.heads = {n_embd}/{n_head} = {} is odd, and rotary \
             embeddings rotate pairs of a head's dimensions",
            n_embd / n_head
        )
    };
    // Head counts h with an even head size C/h that the key/value heads allow, nearest
    // n_head first.
    let mut fits: Vec<usize> = (1..=n_embd / 2)
        .filter(|&h| even_heads(h) && kv_allows(h))
        .collect();
    fits.sort_by_key(|h| (h.abs_diff(n_head), *h));
    let width = format!("give a width that is a multiple of {}", 2 * n_head);
    let hint = match fits.as_slice() {
        [] => width,
        [h] => format!("set model.heads to {h}, or {width}"),
        [a, b, ..] => {
            format!("set model.heads to one of the nearest that do ({a} or {b}), or {width}")
        }
    };
    Some(format!("{what}; {hint}"))
}

/// Hkv of a Llama from preset `name` (`base`) with `n_head` query heads: `given` if
/// set; else the preset's, or, for a multi-head preset (Hkv = H), `n_head` (the rule such
/// a preset has). A grouped preset's Hkv that does not divide a changed `n_head` is an
/// error naming it and `model.n_kv_head`.
fn llama_kv_heads(
    name: &str,
    base: &LlamaConfig,
    given: Option<usize>,
    n_head: usize,
) -> Result<usize, String> {
    let kv = base.n_kv_head;
    match given {
        Some(k) => Ok(k),
        None if n_head == base.n_head => Ok(kv),
        None if kv == base.n_head => Ok(n_head),
        None if n_head.is_multiple_of(kv) => Ok(kv),
        None => Err(format!(
            "model.heads = {n_head} does not go with preset \"{name}\"'s n_kv_head = {kv} \
             ({} query heads sharing {kv} key/value heads), which must divide it; set \
             model.n_kv_head to a divisor of {n_head} (e.g. --set model.n_kv_head={}), or \
             give model.heads a multiple of {kv}",
            base.n_head,
            gcd(n_head, kv)
        )),
    }
}

/// The greatest common divisor (Euclid's).
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// F of a Llama from preset `name` (`base`) with width `n_embd`: `given` if set, else the
/// preset's when the width is the preset's. The presets' F are the published widths,
/// which no one formula gives, so a changed width without F is an error naming the
/// preset's F and `model.ffn_hidden`, and suggesting the preset's F / C ratio.
fn llama_ffn_hidden(
    name: &str,
    base: &LlamaConfig,
    given: Option<usize>,
    n_embd: usize,
) -> Result<usize, String> {
    match given {
        Some(f) => Ok(f),
        // (A width of 0 is refused by validation, naming the width.)
        None if n_embd == base.n_embd || n_embd == 0 => Ok(base.ffn_hidden),
        None => {
            let (f, c) = (base.ffn_hidden as u128, base.n_embd as u128);
            let scaled = ((f * n_embd as u128 + c / 2) / c).max(1);
            Err(format!(
                "model.width = {n_embd} is not preset \"{name}\"'s width {c}, and the \
                 preset's MLP width ffn_hidden = {f} goes with width {c}; set \
                 model.ffn_hidden too (e.g. --set model.ffn_hidden={scaled}, the preset's \
                 ratio {f}/{c} at width {n_embd}; a run or checkpoint made before the key \
                 existed kept the preset's {f})"
            ))
        }
    }
}

/// Resolve the model shape: the preset's, with the explicitly set fields on top.
pub fn resolve_model(m: &ModelConfig) -> Result<GptConfig, String> {
    // A name that is no preset is said first, before the keys a GPT-2 refuses (a
    // mistyped Llama name is no GPT-2).
    let base = match &m.preset {
        Some(name) => Some(
            PRESETS
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, d)| *d)
                .ok_or_else(|| {
                    let names = zero_models::preset_names();
                    format!(
                        "model.preset = \"{name}\" is not a preset; use one of {}, or unset it and give vocab_size, context_len, layers, heads and width",
                        names.join(", ")
                    )
                })?,
        ),
        None => None,
    };
    let llama_only: Vec<&str> = [
        ("n_kv_head", m.n_kv_head.is_some()),
        ("ffn_hidden", m.ffn_hidden.is_some()),
        ("rope_theta", m.rope_theta.is_some()),
    ]
    .into_iter()
    .filter_map(|(key, set)| set.then_some(key))
    .collect();
    if !llama_only.is_empty() {
        let model = match &m.preset {
            Some(name) => format!("model.preset = \"{name}\" is a GPT-2"),
            None => "a model without a preset is a GPT-2".to_string(),
        };
        let keys: Vec<String> = llama_only.iter().map(|k| format!("model.{k}")).collect();
        return Err(format!(
            "{} (Llama only) set, but {model}, whose key/value heads are its heads, MLP is \
             4 x width and positions are learned (no rotary base); unset {}, or pick a \
             Llama preset (llama-tiny, llama-small, llama2-7b, ...)",
            keys.join(", "),
            keys.join(" and ")
        ));
    }
    let pick = |v: Option<usize>, b: Option<usize>, key: &str| {
        v.or(b).ok_or_else(|| {
            format!("model.{key} is not set and there is no model.preset; set model.preset (e.g. \"small\") or all of vocab_size, context_len, layers, heads, width")
        })
    };
    Ok(GptConfig {
        vocab_size: pick(m.vocab_size, base.map(|d| d.vocab_size), "vocab_size")?,
        max_seq_len: pick(m.context_len, base.map(|d| d.max_seq_len), "context_len")?,
        n_layer: pick(m.layers, base.map(|d| d.n_layer), "layers")?,
        n_head: pick(m.heads, base.map(|d| d.n_head), "heads")?,
        n_embd: pick(m.width, base.map(|d| d.n_embd), "width")?,
        vocab_block_rows: m.vocab_block_rows,
        checkpoint_every: m.checkpoint_every.unwrap_or(0),
    })
}

/// Record `msg` unless `ok`.
fn need(p: &mut Vec<String>, ok: bool, msg: String) {
    if !ok {
        p.push(msg);
    }
}

impl Config {
    /// Check every value and combination (this tool's sections, then the engine's); all
    /// problems are reported at once.
    pub fn validate(&self) -> Result<(), LoadError> {
        let mut p: Vec<String> = Vec::new();
        let context_len = match resolve_any_problems(&self.model) {
            Ok(ModelPreset::Llama(l)) => {
                if let Err(e) = l.validate() {
                    p.push(format!("model: {e}"));
                }
                Some(l.max_seq_len)
            }
            Ok(ModelPreset::Gpt(d)) => {
                need(
                    &mut p,
                    d.vocab_size > 0 && d.max_seq_len > 0 && d.n_layer > 0 && d.n_embd > 0,
                    format!(
                        "model dimensions must be positive: vocab_size {}, context_len {}, layers {}, width {}",
                        d.vocab_size, d.max_seq_len, d.n_layer, d.n_embd
                    ),
                );
                need(
                    &mut p,
                    d.n_head > 0 && d.n_embd % d.n_head.max(1) == 0,
                    format!(
                        "model.heads ({}) must divide model.width ({}); pick heads among the divisors of the width",
                        d.n_head, d.n_embd
                    ),
                );
                need(
                    &mut p,
                    d.vocab_block_rows != Some(0),
                    "model.vocab_block_rows is 0; leave it unset (one transformer block's worth) or give at least 1 row".into(),
                );
                Some(d.max_seq_len)
            }
            Err(problems) => {
                p.extend(problems);
                None
            }
        };
        if let Some(context_len) = context_len {
            need(
                &mut p,
                self.train.seq_len <= context_len,
                format!(
                    "train.seq_len ({}) exceeds the model's context_len ({context_len}); lower train.seq_len or raise model.context_len",
                    self.train.seq_len
                ),
            );
        }
        need(
            &mut p,
            !self.data.path.is_empty(),
            "data.path is empty; give a token file or \"builtin\"".into(),
        );
        let t = &self.train;
        need(
            &mut p,
            t.steps > 0,
            "train.steps is 0; set it to at least 1".into(),
        );
        let tokens = t
            .micro_batch
            .checked_mul(t.seq_len)
            .and_then(|x| x.checked_mul(t.grad_accum));
        need(
            &mut p,
            tokens.is_some_and(|x| x > 0),
            format!(
                "micro_batch x seq_len x grad_accum = {} x {} x {} must be positive: every step needs tokens",
                t.micro_batch, t.seq_len, t.grad_accum
            ),
        );
        need(
            &mut p,
            t.log_every > 0,
            "train.log_every is 0; set it to at least 1".into(),
        );
        let mut engine = Vec::new();
        self.engine().collect_problems(&mut engine);
        // grad_accum = 0 is already reported above as a batch with no tokens.
        p.extend(engine.into_iter().filter(|e| !e.starts_with("grad_accum")));
        if p.is_empty() {
            Ok(())
        } else {
            Err(LoadError::Invalid { problems: p })
        }
    }
}

/// The parser of a path flag whose value goes on as text (into a `--set` override or a
/// child job's command line): taking `&str`, clap refuses a path that is not UTF-8
/// ("invalid UTF-8 was detected"), which would otherwise be changed on the way (U+FFFD)
/// and name another file.
pub fn utf8_path(s: &str) -> Result<std::path::PathBuf, String> {
    Ok(std::path::PathBuf::from(s))
}
