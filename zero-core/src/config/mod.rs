//! The training configuration: a typed TOML file plus `--set section.key=value` command
//! line overrides, validated in one place ([`Config::validate`]).
//!
//! Every field has a default, so an empty file is a valid tiny run. Unknown keys are
//! errors (serde `deny_unknown_fields`: the message names the key and the valid ones).
//! Loading ([`load`]) records where every leaf came from (default, file, command line)
//! so the resolved configuration can be printed at start with its provenance.

use serde::{Deserialize, Serialize};
use zero_kernels::DType;

mod load;
#[cfg(test)]
mod tests;
mod validate;

pub use load::{load, load_str, LoadedConfig, Source};

/// Errors of loading or validating a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
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

/// The whole configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Model size.
    pub model: ModelConfig,
    /// Training data.
    pub data: DataConfig,
    /// Steps, batch shape, seed, logging.
    pub train: TrainConfig,
    /// ZeRO stage and its buffers.
    pub zero: ZeroConfig,
    /// Mixed precision and loss scaling.
    pub precision: PrecisionConfig,
    /// AdamW and the learning-rate schedule.
    pub optim: OptimConfig,
}

/// Dimensions of a GPT-2-style model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDims {
    /// V: vocabulary size.
    pub vocab_size: usize,
    /// Maximum sequence length (positions of `wpe`).
    pub context_len: usize,
    /// L: transformer blocks.
    pub layers: usize,
    /// Attention heads (must divide `width`).
    pub heads: usize,
    /// C: channels.
    pub width: usize,
}

/// Named model sizes, the one table of them (`zero_models::GptConfig::preset` reads it):
/// `tiny` (gradient checks), `small` (byte-level, CPU runs), and the GPT-2 shapes.
pub const PRESETS: &[(&str, ModelDims)] = &[
    ("tiny", dims(32, 8, 2, 2, 16)),
    ("small", dims(256, 256, 4, 4, 256)),
    ("gpt2-124m", dims(50257, 1024, 12, 12, 768)),
    ("gpt2-350m", dims(50257, 1024, 24, 16, 1024)),
    ("gpt2-774m", dims(50257, 1024, 36, 20, 1280)),
    ("gpt2-1.5b", dims(50257, 1024, 48, 25, 1600)),
];

const fn dims(v: usize, t: usize, l: usize, h: usize, c: usize) -> ModelDims {
    ModelDims {
        vocab_size: v,
        context_len: t,
        layers: l,
        heads: h,
        width: c,
    }
}

/// `[model]`: a preset, optionally with some dimensions overridden, or all five
/// dimensions given explicitly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Preset name (see [`PRESETS`]): tiny, small, gpt2-124m, gpt2-350m, gpt2-774m,
    /// gpt2-1.5b. Unset: all five dimensions below must be given.
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

/// ZeRO stage: what is partitioned across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub enum Stage {
    /// Plain data parallel (all-reduce of full gradients), the baseline.
    Zero0,
    /// Optimizer states (fp32 master, m, v) partitioned.
    Zero1,
    /// + gradients partitioned.
    Zero2,
    /// + parameters partitioned.
    Zero3,
}

impl Stage {
    /// All stages, in order.
    pub const ALL: [Stage; 4] = [Stage::Zero0, Stage::Zero1, Stage::Zero2, Stage::Zero3];

    /// The stage number 0-3.
    pub const fn number(self) -> usize {
        match self {
            Stage::Zero0 => 0,
            Stage::Zero1 => 1,
            Stage::Zero2 => 2,
            Stage::Zero3 => 3,
        }
    }
}

impl TryFrom<i64> for Stage {
    type Error = String;
    fn try_from(v: i64) -> Result<Self, String> {
        match v {
            0 => Ok(Stage::Zero0),
            1 => Ok(Stage::Zero1),
            2 => Ok(Stage::Zero2),
            3 => Ok(Stage::Zero3),
            _ => Err(format!(
                "zero.stage = {v} is not a ZeRO stage; use 0, 1, 2 or 3"
            )),
        }
    }
}

impl From<Stage> for i64 {
    fn from(s: Stage) -> i64 {
        s.number() as i64
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZeRO-{}", self.number())
    }
}

/// `[zero]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZeroConfig {
    /// 0 (data parallel), 1 (optimizer states), 2 (+ gradients), 3 (+ parameters).
    pub stage: Stage,
    /// Stages 2/3: reduce-scatter gradients at every micro-step (true: lean in memory)
    /// or accumulate full gradients locally and reduce once per step (false: lean in
    /// communication). Unset: true for stages 2/3, false for 0/1 (which must be false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reduce_every_micro_step: Option<bool>,
    /// Capacity of each of the two gradient-reduction buckets, in elements (rounded up
    /// to a multiple of N x align and capped at the largest unit).
    pub bucket_elems: usize,
    /// Stage 3: layers whose units are gathered ahead of the one computing.
    pub prefetch: usize,
    /// Stage 3: units with fewer elements than this stay gathered (not partitioned for
    /// compute; updated by one all-gather per step). 0: none.
    pub persistence_threshold: usize,
    /// Shard alignment in elements (32 = 64 bytes for 16-bit elements).
    pub align: usize,
}

impl Default for ZeroConfig {
    fn default() -> Self {
        ZeroConfig {
            stage: Stage::Zero2,
            reduce_every_micro_step: None,
            bucket_elems: 1 << 24,
            prefetch: 1,
            persistence_threshold: 0,
            align: crate::layout::DEFAULT_ALIGN,
        }
    }
}

impl ZeroConfig {
    /// The effective reduce policy (the default follows the stage).
    pub fn reduce_every_micro_step(&self) -> bool {
        self.reduce_every_micro_step
            .unwrap_or(self.stage >= Stage::Zero2)
    }
}

/// Training precision of parameters and gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// fp32 everywhere; the parameters are the master weights.
    Fp32,
    /// bf16 parameters and gradients, fp32 master, m, v.
    Bf16,
    /// fp16 parameters and gradients with dynamic loss scaling, fp32 master, m, v.
    Fp16,
}

impl Precision {
    /// Element type of the working parameters and gradients.
    pub const fn param_dtype(self) -> DType {
        match self {
            Precision::Fp32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::Fp16 => DType::F16,
        }
    }
}

/// Element type gradients are reduced in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GradReduceDtype {
    /// The 16-bit gradient type (summed with a user-defined op).
    Half,
    /// Upcast to fp32 for the reduction (twice the bytes, more accurate sums).
    F32,
}

/// `[precision]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrecisionConfig {
    /// fp32 | bf16 | fp16.
    pub dtype: Precision,
    /// half | f32. Unset: half for bf16/fp16, f32 for fp32 (where half is an error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_reduce_dtype: Option<GradReduceDtype>,
    /// Dynamic loss scaling. Unset: on for fp16 (required), off otherwise (only fp16
    /// may use it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scaling: Option<bool>,
    /// Initial loss scale.
    pub initial_scale: f64,
    /// Factor the scale grows by after `growth_interval` clean steps.
    pub growth_factor: f64,
    /// Clean (non-overflowing) steps before the scale grows.
    pub growth_interval: usize,
    /// Factor the scale shrinks by on overflow.
    pub backoff_factor: f64,
    /// Overflows tolerated before the scale shrinks (each overflowing step is skipped).
    pub hysteresis: usize,
    /// The scale never goes below this.
    pub min_scale: f64,
}

impl Default for PrecisionConfig {
    fn default() -> Self {
        PrecisionConfig {
            dtype: Precision::Bf16,
            grad_reduce_dtype: None,
            loss_scaling: None,
            initial_scale: 65536.0,
            growth_factor: 2.0,
            growth_interval: 1000,
            backoff_factor: 0.5,
            hysteresis: 2,
            min_scale: 1.0,
        }
    }
}

impl PrecisionConfig {
    /// Element type gradients travel in (resolved default).
    pub fn reduce_dtype(&self) -> DType {
        match (self.dtype, self.grad_reduce_dtype) {
            (Precision::Fp32, _) | (_, Some(GradReduceDtype::F32)) => DType::F32,
            (p, _) => p.param_dtype(),
        }
    }

    /// Whether dynamic loss scaling is on (resolved default).
    pub fn loss_scaling(&self) -> bool {
        self.loss_scaling.unwrap_or(self.dtype == Precision::Fp16)
    }
}

/// Learning-rate schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// `lr` at every step.
    Constant,
    /// Linear warmup over `warmup_steps`, then cosine decay to `min_lr` at the last step.
    WarmupCosine,
}

/// `[optim]`: AdamW as torch.optim.AdamW computes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// (beta1, beta2).
    pub betas: [f64; 2],
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay (2-D tensors only).
    pub weight_decay: f64,
    /// Clip the global gradient norm to this; 0 disables clipping.
    pub grad_clip: f64,
    /// constant | warmup_cosine.
    pub schedule: Schedule,
    /// warmup_cosine: steps of linear warmup.
    pub warmup_steps: usize,
    /// warmup_cosine: learning rate at the last step.
    pub min_lr: f64,
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            lr: 1e-3,
            betas: [0.9, 0.95],
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            schedule: Schedule::Constant,
            warmup_steps: 0,
            min_lr: 0.0,
        }
    }
}

impl OptimConfig {
    /// Learning rate of step `step` (0-based) of `total_steps` (nanoGPT's schedule:
    /// warmup `lr * (step + 1) / warmup`, then `min_lr + 0.5 (1 + cos(pi r)) (lr -
    /// min_lr)` with r the fraction of the decay done).
    pub fn lr_at(&self, step: usize, total_steps: usize) -> f64 {
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::WarmupCosine => {
                if step < self.warmup_steps {
                    return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
                }
                let decay_steps = total_steps.saturating_sub(self.warmup_steps).max(1);
                let r = ((step - self.warmup_steps) as f64 / decay_steps as f64).min(1.0);
                let coeff = 0.5 * (1.0 + (std::f64::consts::PI * r).cos());
                self.min_lr + coeff * (self.lr - self.min_lr)
            }
        }
    }
}

/// Resolve the model dimensions: the preset's, with the explicitly set fields on top.
pub fn resolve_model(m: &ModelConfig) -> Result<ModelDims, String> {
    let base = match &m.preset {
        Some(name) => Some(
            PRESETS
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, d)| *d)
                .ok_or_else(|| {
                    let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
                    format!(
                        "model.preset = \"{name}\" is not a preset; use one of {}, or unset it and give vocab_size, context_len, layers, heads and width",
                        names.join(", ")
                    )
                })?,
        ),
        None => None,
    };
    let pick = |v: Option<usize>, b: Option<usize>, key: &str| {
        v.or(b).ok_or_else(|| {
            format!("model.{key} is not set and there is no model.preset; set model.preset (e.g. \"small\") or all of vocab_size, context_len, layers, heads, width")
        })
    };
    Ok(ModelDims {
        vocab_size: pick(m.vocab_size, base.map(|d| d.vocab_size), "vocab_size")?,
        context_len: pick(m.context_len, base.map(|d| d.context_len), "context_len")?,
        layers: pick(m.layers, base.map(|d| d.layers), "layers")?,
        heads: pick(m.heads, base.map(|d| d.heads), "heads")?,
        width: pick(m.width, base.map(|d| d.width), "width")?,
    })
}
