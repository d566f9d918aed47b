//! GPT-2 shapes (V, T, L, H, C), the named presets (the one table of them), and
//! everything derived from a shape alone: the [`ModelSpec`] (units, layers, parameter
//! names as docs/ARCHITECTURE.md lists them), parameter counts and FLOPs per token.
//! Nothing here allocates weights, so the planner can size a 1.5B model on a laptop.

use std::ops::Range;

use zero_core::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};

/// Errors in a model configuration, with the offending numbers.
#[derive(Debug, thiserror::Error)]
pub enum GptConfigError {
    /// A dimension that must be positive is zero.
    #[error("{name} must be > 0, got 0")]
    Zero {
        /// Which dimension.
        name: &'static str,
    },
    /// C is not a multiple of H.
    #[error("n_embd C={c} is not divisible by n_head H={h}")]
    HeadsDontDivide {
        /// C.
        c: usize,
        /// H.
        h: usize,
    },
    /// The vocabulary does not fit the u16 token files.
    #[error("vocab_size V={0} exceeds 65536, the range of the u16 token files")]
    VocabTooLarge(usize),
    /// A Llama shape that does not fit together (the message has the numbers).
    #[error("{0}")]
    Llama(String),
    /// An unknown preset name.
    #[error("unknown model preset '{0}' (known: {known})", known = preset_names().join(", "))]
    UnknownPreset(String),
    /// Activations past what any host holds, whose sizes could overflow.
    #[error(
        "the activations of {rows} rows x {seq_len} tokens with these widths would pass \
         2^62 bytes; give fewer rows (micro_batch) or a shorter context"
    )]
    ActivationsTooLarge {
        /// Rows of a micro-batch.
        rows: usize,
        /// Tokens of a row (the context).
        seq_len: usize,
    },
    /// A dimension past its bound ([`DIM_BOUNDS`]).
    #[error(
        "{name} = {value} is past its bound {max}: beyond any model trained today, and \
         the parameter and activation counts would overflow; give a smaller {name}"
    )]
    TooLarge {
        /// Which dimension.
        name: &'static str,
        /// The value given.
        value: usize,
        /// Its bound.
        max: usize,
    },
}

/// The largest value of each model dimension: far past any model trained today, and small
/// enough that parameter counts (L x C x F <= 2^48) cannot overflow 64 bits, nor a spec
/// of a mistyped number of layers fill the memory. (Activation sizes, which also grow
/// with the micro-batch, are checked when a model is built: `arena_fits` in lm.rs.)
pub const DIM_BOUNDS: &[(&str, usize)] = &[
    ("n_layer", 1 << 12),
    ("n_embd", 1 << 17),
    ("ffn_hidden", 1 << 19),
    ("max_seq_len", 1 << 22),
    ("n_head", 1 << 17),
    ("n_kv_head", 1 << 17),
];

/// An error for the first of `dims` that is 0, else for the first past its
/// [`DIM_BOUNDS`] entry (a name without one has no upper bound).
pub(crate) fn check_dims(dims: &[(&'static str, usize)]) -> Result<(), GptConfigError> {
    if let Some(&(name, _)) = dims.iter().find(|(_, v)| *v == 0) {
        return Err(GptConfigError::Zero { name });
    }
    for &(name, value) in dims {
        let bound = DIM_BOUNDS.iter().find(|(n, _)| *n == name);
        if let Some(&(_, max)) = bound.filter(|(_, max)| value > *max) {
            return Err(GptConfigError::TooLarge { name, value, max });
        }
    }
    Ok(())
}

/// Named shapes, the one table of them (`zero-bench` config files name them): `tiny`
/// (gradient checks), `small` (byte-level, CPU runs), and the GPT-2 shapes. Each is
/// (name, V, T, L, H, C).
pub const PRESETS: &[(&str, GptConfig)] = &[
    ("tiny", shape(32, 8, 2, 2, 16)),
    ("small", shape(256, 256, 4, 4, 256)),
    ("gpt2-124m", shape(50257, 1024, 12, 12, 768)),
    ("gpt2-350m", shape(50257, 1024, 24, 16, 1024)),
    ("gpt2-774m", shape(50257, 1024, 36, 20, 1280)),
    ("gpt2-1.5b", shape(50257, 1024, 48, 25, 1600)),
];

const fn shape(v: usize, t: usize, l: usize, h: usize, c: usize) -> GptConfig {
    GptConfig {
        vocab_size: v,
        max_seq_len: t,
        n_layer: l,
        n_head: h,
        n_embd: c,
        vocab_block_rows: None,
        checkpoint_every: 0,
    }
}

/// Names of every preset, GPT-2's ([`PRESETS`]) then Llama's
/// ([`crate::llama::LLAMA_PRESETS`]); [`ModelPreset::lookup`] takes them all.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS
        .iter()
        .map(|(name, _)| *name)
        .chain(crate::llama::LLAMA_PRESETS.iter().map(|(name, _)| *name))
        .collect()
}

/// A preset of either model family: the one lookup that knows both tables, and what the
/// planner and the training tool need from a shape without knowing the family.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ModelPreset {
    /// A GPT-2 shape ([`PRESETS`]).
    Gpt(GptConfig),
    /// A Llama shape ([`crate::llama::LLAMA_PRESETS`]).
    Llama(crate::llama::LlamaConfig),
}

impl ModelPreset {
    /// The preset called `name`, in either table.
    pub fn lookup(name: &str) -> Result<Self, GptConfigError> {
        match crate::llama::LlamaConfig::preset(name) {
            Some(l) => Ok(ModelPreset::Llama(l)),
            None => GptConfig::preset(name).map(ModelPreset::Gpt),
        }
    }

    /// Check the shape.
    pub fn validate(&self) -> Result<(), GptConfigError> {
        match self {
            ModelPreset::Gpt(g) => g.validate(),
            ModelPreset::Llama(l) => l.validate(),
        }
    }

    /// Units and layers.
    pub fn spec(&self) -> ModelSpec {
        match self {
            ModelPreset::Gpt(g) => g.spec(),
            ModelPreset::Llama(l) => l.spec(),
        }
    }

    /// Ψ.
    pub fn num_params(&self) -> usize {
        match self {
            ModelPreset::Gpt(g) => g.num_params(),
            ModelPreset::Llama(l) => l.num_params(),
        }
    }

    /// Training FLOPs per token at `seq_len`.
    pub fn flops_per_token(&self, seq_len: usize) -> f64 {
        match self {
            ModelPreset::Gpt(g) => g.flops_per_token(seq_len),
            ModelPreset::Llama(l) => l.flops_per_token(seq_len),
        }
    }

    /// T: the context length.
    pub fn max_seq_len(&self) -> usize {
        match self {
            ModelPreset::Gpt(g) => g.max_seq_len,
            ModelPreset::Llama(l) => l.max_seq_len,
        }
    }

    /// V.
    pub fn vocab_size(&self) -> usize {
        match self {
            ModelPreset::Gpt(g) => g.vocab_size,
            ModelPreset::Llama(l) => l.vocab_size,
        }
    }

    /// The same shape with activation checkpointing every `k` blocks (0: off).
    pub fn with_checkpoint_every(self, k: usize) -> Self {
        match self {
            ModelPreset::Gpt(g) => ModelPreset::Gpt(GptConfig {
                checkpoint_every: k,
                ..g
            }),
            ModelPreset::Llama(l) => ModelPreset::Llama(crate::LlamaConfig {
                checkpoint_every: k,
                ..l
            }),
        }
    }

    /// Bytes of the model's activation arena for micro-batches of `rows` x `seq_len`
    /// ([`crate::activation_bytes_for`], [`crate::llama::activation_bytes_for`]).
    pub fn activation_bytes(&self, rows: usize, seq_len: usize, elem_bytes: usize) -> usize {
        match self {
            ModelPreset::Gpt(g) => crate::gpt::activation_bytes_for(g, rows, seq_len, elem_bytes),
            ModelPreset::Llama(l) => {
                crate::llama::activation_bytes_for(l, rows, seq_len, elem_bytes)
            }
        }
    }
}

/// The shape of a GPT-2 model (nanoGPT's `GPTConfig`, llm.c's `GPT2Config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptConfig {
    /// V: vocabulary size (rows of `wte`; the LM head is tied to it).
    pub vocab_size: usize,
    /// T: maximum sequence length (rows of `wpe`).
    pub max_seq_len: usize,
    /// L: transformer blocks.
    pub n_layer: usize,
    /// H: attention heads per block.
    pub n_head: usize,
    /// C: width of the residual stream.
    pub n_embd: usize,
    /// Rows of `wte` per unit: the table (and so the tied head's logits) is split into
    /// row blocks of this many rows, each gathered, used and reduced on its own, so that
    /// no layer's working set is the whole table. `None`: 12C + 13 rows, one transformer
    /// block's worth of elements. A table of at most this many rows stays one tensor.
    pub vocab_block_rows: Option<usize>,
    /// Activation checkpointing: every k-th transformer block (blocks 0, k, 2k, ...)
    /// keeps only its output and recomputes its internal activations in its backward,
    /// which then need one block's worth of memory in all (`layout.rs`). 0: off; 1: every
    /// block. Not part of the shape: the spec and the parameters do not depend on it.
    pub checkpoint_every: usize,
}

/// What one layer of GPT-2 computes, in the spec's forward order ([`GptConfig::layers`]).
/// Block 0 of `wte` lives in unit `embed` with `wpe`, block k >= 1 in a unit of its own.
pub type GptLayer = crate::lm::TokenLayer;

impl GptConfig {
    /// A named preset (see [`PRESETS`]):
    /// - `tiny`: V=32 T=8 L=2 H=2 C=16, for gradient checks and quick tests.
    /// - `small`: V=256 (bytes) T=256 L=4 H=4 C=256, ~3.3M parameters, for CPU benchmarks.
    /// - `gpt2-124m` .. `gpt2-1.5b`: the GPT-2 shapes with V=50257, T=1024.
    pub fn preset(name: &str) -> Result<Self, GptConfigError> {
        PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, d)| *d)
            .ok_or_else(|| GptConfigError::UnknownPreset(name.to_string()))
    }

    /// Rows of `wte` per unit ([`GptConfig::vocab_block_rows`], resolved).
    pub fn block_rows(&self) -> usize {
        self.vocab_block_rows
            .unwrap_or(12 * self.n_embd + 13)
            .max(1)
    }

    /// The row ranges of `wte`'s blocks, in order (one range when it is not split).
    pub fn vocab_blocks(&self) -> Vec<Range<usize>> {
        let (v, r) = (self.vocab_size, self.block_rows());
        (0..v.max(1))
            .step_by(r)
            .map(|a| a..(a + r).min(v))
            .collect()
    }

    /// The layers in forward order: lookups of blocks 1.., embed, blocks, head, logits of
    /// blocks 1.. (see [`GptLayer`]).
    pub fn layers(&self) -> Vec<GptLayer> {
        GptLayer::sequence(self.n_layer, self.vocab_blocks().len())
    }

    /// Check the shape: all dimensions positive and within [`DIM_BOUNDS`], H divides C, V
    /// fits u16 tokens.
    pub fn validate(&self) -> Result<(), GptConfigError> {
        check_dims(&[
            ("vocab_size", self.vocab_size),
            ("max_seq_len", self.max_seq_len),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
            ("ffn_hidden", self.n_embd.saturating_mul(4)),
        ])?;
        if self.n_embd / self.n_head * self.n_head != self.n_embd {
            return Err(GptConfigError::HeadsDontDivide {
                c: self.n_embd,
                h: self.n_head,
            });
        }
        if self.vocab_block_rows == Some(0) {
            return Err(GptConfigError::Zero {
                name: "vocab_block_rows",
            });
        }
        if self.vocab_size > 65536 {
            return Err(GptConfigError::VocabTooLarge(self.vocab_size));
        }
        Ok(())
    }

    /// Units and layers. Units: `embed` {block 0 of `wte`, `wpe`}, one unit per further
    /// block of `wte` (named as its rows, `wte[4621..9242]`), `h.0` .. `h.{L-1}`, `ln_f`.
    /// Layers: [`GptConfig::layers`], named `embed.{k}`, `embed`, `h.{i}`, `head`,
    /// `head.{k}`; `head` reads `ln_f` and `embed`, `head.{k}` block k's unit (the tied LM
    /// head). With one block: units [embed {wte, wpe}, h.*, ln_f], layers [embed, h.*, head].
    pub fn spec(&self) -> ModelSpec {
        let (v, t, c, l) = (self.vocab_size, self.max_seq_len, self.n_embd, self.n_layer);
        let mut blocks = ParamSpec::split_rows("wte", &[v, c], self.block_rows()).into_iter();
        let mut units = Vec::with_capacity(l + 2);
        units.extend(blocks.next().map(|wte0| UnitSpec {
            name: "embed".into(),
            params: vec![wte0, ParamSpec::new("wpe", &[t, c])],
        }));
        units.extend(blocks.map(|b| UnitSpec {
            name: b.name.clone(),
            params: vec![b],
        }));
        for i in 0..l {
            let p = |s: &str, shape: &[usize]| ParamSpec::new(format!("h.{i}.{s}"), shape);
            units.push(UnitSpec {
                name: format!("h.{i}"),
                params: vec![
                    p("ln_1.weight", &[c]),
                    p("ln_1.bias", &[c]),
                    p("attn.c_attn.weight", &[3 * c, c]),
                    p("attn.c_attn.bias", &[3 * c]),
                    p("attn.c_proj.weight", &[c, c]),
                    p("attn.c_proj.bias", &[c]),
                    p("ln_2.weight", &[c]),
                    p("ln_2.bias", &[c]),
                    p("mlp.c_fc.weight", &[4 * c, c]),
                    p("mlp.c_fc.bias", &[4 * c]),
                    p("mlp.c_proj.weight", &[c, 4 * c]),
                    p("mlp.c_proj.bias", &[c]),
                ],
            });
        }
        units.push(UnitSpec {
            name: "ln_f".into(),
            params: vec![
                ParamSpec::new("ln_f.weight", &[c]),
                ParamSpec::new("ln_f.bias", &[c]),
            ],
        });
        let layers = self
            .layers()
            .into_iter()
            .map(|layer| LayerSpec {
                name: match layer {
                    GptLayer::Lookup(k) => format!("embed.{k}"),
                    GptLayer::Embed => "embed".into(),
                    GptLayer::Block(i) => format!("h.{i}"),
                    GptLayer::Head => "head".into(),
                    GptLayer::Logits(k) => format!("head.{k}"),
                },
                units: self.layer_units(layer),
                backward_reads_params: layer.backward_reads_params(),
            })
            .collect();
        ModelSpec { units, layers }
    }

    /// The units a layer reads, as indices into [`GptConfig::spec`]'s units.
    pub fn layer_units(&self, layer: GptLayer) -> Vec<usize> {
        let k = self.vocab_blocks().len();
        match layer {
            GptLayer::Lookup(b) | GptLayer::Logits(b) => vec![b],
            GptLayer::Embed => vec![0],
            GptLayer::Block(i) => vec![k + i],
            GptLayer::Head => vec![k + self.n_layer, 0],
        }
    }

    /// Ψ: parameter count, without building the spec.
    pub fn num_params(&self) -> usize {
        let (v, t, c, l) = (self.vocab_size, self.max_seq_len, self.n_embd, self.n_layer);
        v * c + t * c + l * (12 * c * c + 13 * c) + 2 * c
    }

    /// Training FLOPs per token of forward + backward at sequence length `seq_len`,
    /// the estimate of nanoGPT's `estimate_mfu` (PaLM appendix B):
    /// `6 * (Ψ - T_max*C) + 12 * L * C * seq_len`.
    /// The first term is 2 FLOPs per weight per token forward and 4 backward, over every
    /// weight used in a matmul (`wpe` is a lookup, so it is left out; `wte` counts once,
    /// as the LM head). The second is attention's QK^T and PV, counted over the full
    /// T x T square (the causal half is not subtracted, as nanoGPT and PaLM do).
    pub fn flops_per_token(&self, seq_len: usize) -> f64 {
        let matmul_params = (self.num_params() - self.max_seq_len * self.n_embd) as f64;
        6.0 * matmul_params + 12.0 * (self.n_layer * self.n_embd * seq_len) as f64
    }
}
