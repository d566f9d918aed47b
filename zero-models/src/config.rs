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
    #[error("{name} = {value} is past its bound {max}: {why}; give a smaller {name}")]
    TooLarge {
        /// Which dimension.
        name: &'static str,
        /// The value given.
        value: usize,
        /// Its bound.
        max: usize,
        /// Why the bound is there ([`bound_reason`]).
        why: &'static str,
    },
    /// A shape whose parameter count does not fit a `usize` (each dimension in bounds,
    /// their products not).
    #[error(
        "the parameter count of this shape overflows {bits}-bit sizes; give smaller \
         dimensions"
    )]
    ParamsOverflow {
        /// `usize::BITS`.
        bits: u32,
    },
}

/// The largest value of each model dimension: far past any model trained today, and small
/// enough that parameter counts (L x C x F <= 2^48, V x C <= 2^37) cannot overflow 64
/// bits, nor a spec of a mistyped number of layers or of vocabulary rows (the tables are
/// split into V / vocab_block_rows units) fill the memory. V's bound, 2^20, is 8 times
/// Llama 3's 128256, for both families (token ids past 65535 come from llm.c's uint32
/// "llama-3" token files). (Activation sizes, which also grow with the
/// micro-batch, are checked when a model is built: `arena_fits` in lm.rs.)
pub const DIM_BOUNDS: &[(&str, usize)] = &[
    ("vocab_size", 1 << 20),
    ("n_layer", 1 << 12),
    ("n_embd", 1 << 17),
    ("ffn_hidden", 1 << 19),
    ("max_seq_len", 1 << 22),
    ("n_head", 1 << 17),
    ("n_kv_head", 1 << 17),
    (VOCAB_BLOCKS, MAX_VOCAB_BLOCKS),
];

/// The most token-table blocks a model is split into (both families): the default rows
/// per block grow so that a large vocabulary of a narrow model stays within it.
pub const MAX_VOCAB_BLOCKS: usize = 1 << 12;

/// The name [`DIM_BOUNDS`] bounds the number of token-table blocks by (V divided by
/// `vocab_block_rows`, rounded up).
pub const VOCAB_BLOCKS: &str = "vocab_size / vocab_block_rows";

/// Why dimension `name` has its [`DIM_BOUNDS`] entry, in words (for the error).
pub fn bound_reason(name: &str) -> &'static str {
    match name {
        "vocab_size" => {
            "8 times Llama 3's 128256 tokens, far past any tokenizer in use; the token \
             tables are built as vocab_size / vocab_block_rows units, so a mistyped \
             vocab_size would exhaust the memory before the run starts"
        }
        VOCAB_BLOCKS => {
            "each block of the token table is a unit of its own, and the planner weighs \
             every tied block against the layers between its two uses, so thousands of \
             them take minutes to plan; the default rows keep within the bound (give a \
             larger vocab_block_rows, or leave it to its default)"
        }
        _ => {
            "beyond any model trained today, and the parameter and activation counts \
             would overflow"
        }
    }
}

/// An error for the first of `dims` that is 0, else for the first past its
/// [`DIM_BOUNDS`] entry (a name without one has no upper bound).
pub(crate) fn check_dims(dims: &[(&'static str, usize)]) -> Result<(), GptConfigError> {
    if let Some(&(name, _)) = dims.iter().find(|(_, v)| *v == 0) {
        return Err(GptConfigError::Zero { name });
    }
    for &(name, value) in dims {
        let bound = DIM_BOUNDS.iter().find(|(n, _)| *n == name);
        if let Some(&(_, max)) = bound.filter(|(_, max)| value > *max) {
            let why = bound_reason(name);
            return Err(GptConfigError::TooLarge {
                name,
                value,
                max,
                why,
            });
        }
    }
    Ok(())
}

/// `a * b` for a size formed from configuration values; `None` on overflow.
pub(crate) fn mul(a: Option<usize>, b: usize) -> Option<usize> {
    a?.checked_mul(b)
}

/// `a + b` for a size formed from configuration values; `None` on overflow.
pub(crate) fn add(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    a?.checked_add(b?)
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
            .unwrap_or_else(|| {
                let worth = self.n_embd.saturating_mul(12).saturating_add(13);
                worth.max(self.vocab_size.div_ceil(MAX_VOCAB_BLOCKS))
            })
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

    /// How many blocks `wte` has: `vocab_blocks().len()`, without building the list.
    pub fn vocab_block_count(&self) -> usize {
        self.vocab_size.max(1).div_ceil(self.block_rows())
    }

    /// The layers in forward order: lookups of blocks 1.., embed, blocks, head, logits of
    /// blocks 1.. (see [`GptLayer`]).
    pub fn layers(&self) -> Vec<GptLayer> {
        GptLayer::sequence(self.n_layer, self.vocab_block_count())
    }

    /// Check the shape: all dimensions positive and within [`DIM_BOUNDS`], H divides C, the
    /// parameter count fits a `usize`.
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
        check_dims(&[(VOCAB_BLOCKS, self.vocab_block_count())])?;
        if self.checked_num_params().is_none() {
            return Err(GptConfigError::ParamsOverflow { bits: usize::BITS });
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
        // The block count once, not per layer (2k + L layers: O(k^2) otherwise).
        let k = self.vocab_block_count();
        let layers = GptLayer::sequence(l, k)
            .into_iter()
            .map(|layer| LayerSpec {
                name: match layer {
                    GptLayer::Lookup(k) => format!("embed.{k}"),
                    GptLayer::Embed => "embed".into(),
                    GptLayer::Block(i) => format!("h.{i}"),
                    GptLayer::Head => "head".into(),
                    GptLayer::Logits(k) => format!("head.{k}"),
                },
                units: Self::units_of(layer, k, l),
                backward_reads_params: layer.backward_reads_params(),
            })
            .collect();
        ModelSpec { units, layers }
    }

    /// The units a layer reads, as indices into [`GptConfig::spec`]'s units.
    pub fn layer_units(&self, layer: GptLayer) -> Vec<usize> {
        Self::units_of(layer, self.vocab_block_count(), self.n_layer)
    }

    /// [`GptConfig::layer_units`] with `k` blocks of `wte` and `l` transformer blocks.
    fn units_of(layer: GptLayer, k: usize, l: usize) -> Vec<usize> {
        match layer {
            GptLayer::Lookup(b) | GptLayer::Logits(b) => vec![b],
            GptLayer::Embed => vec![0],
            GptLayer::Block(i) => vec![k + i],
            GptLayer::Head => vec![k + l, 0],
        }
    }

    /// Ψ: parameter count, without building the spec; `usize::MAX` for a shape whose
    /// count overflows (which [`GptConfig::validate`] refuses).
    pub fn num_params(&self) -> usize {
        self.checked_num_params().unwrap_or(usize::MAX)
    }

    /// Ψ, `None` when it overflows a `usize`.
    pub fn checked_num_params(&self) -> Option<usize> {
        let (v, t, c, l) = (self.vocab_size, self.max_seq_len, self.n_embd, self.n_layer);
        let c = Some(c);
        // V C + T C + L (12 C^2 + 13 C) + 2 C
        let block = add(mul(mul(c, 12), c?), mul(c, 13));
        let sum = add(mul(c, v), mul(c, t));
        add(add(sum, mul(block, l)), mul(c, 2))
    }

    /// Training FLOPs per token of forward + backward at sequence length `seq_len`,
    /// the estimate of nanoGPT's `estimate_mfu` (PaLM appendix B):
    /// `6 * (Ψ - T_max*C) + 12 * L * C * seq_len`.
    /// The first term is 2 FLOPs per weight per token forward and 4 backward, over every
    /// weight used in a matmul (`wpe` is a lookup, so it is left out; `wte` counts once,
    /// as the LM head). The second is attention's QK^T and PV, counted over the full
    /// T x T square (the causal half is not subtracted, as nanoGPT and PaLM do).
    pub fn flops_per_token(&self, seq_len: usize) -> f64 {
        let positions = self.max_seq_len.saturating_mul(self.n_embd);
        let matmul_params = self.num_params().saturating_sub(positions) as f64;
        6.0 * matmul_params + 12.0 * self.n_layer as f64 * self.n_embd as f64 * seq_len as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block count is the length of the block list, for every remainder.
    #[test]
    fn vocab_block_count_is_the_number_of_blocks() {
        for v in [1, 2, 7, 31, 32, 33, 64, 257] {
            for rows in [1, 2, 3, 8, 32, 100, 1000] {
                let mut g = GptConfig::preset("tiny").expect("preset");
                g.vocab_size = v;
                g.vocab_block_rows = Some(rows);
                assert_eq!(g.vocab_block_count(), g.vocab_blocks().len(), "{v} {rows}");
                let mut l = crate::LlamaConfig::preset("llama-tiny").expect("preset");
                l.vocab_size = v;
                l.vocab_block_rows = Some(rows);
                assert_eq!(l.vocab_block_count(), l.vocab_blocks().len(), "{v} {rows}");
            }
        }
    }

    /// Specs of as many one-row table blocks as the bound allows (2k + L layers) come out
    /// whole. They are built with the block count computed once: the block list was
    /// rebuilt per layer, O(k^2), 4 s for GPT-2's 65536 blocks and minutes for a
    /// Llama's 262144, against 0.1 s and 0.6 s now (the times are printed, not asserted:
    /// the machines are shared).
    #[test]
    fn a_spec_of_many_vocab_blocks_comes_out_whole() {
        let timed = |build: &dyn Fn() -> ModelSpec| {
            let start = std::time::Instant::now();
            let spec = build();
            (spec, start.elapsed())
        };
        let mut g = GptConfig::preset("tiny").expect("preset");
        g.vocab_size = 4096;
        g.vocab_block_rows = Some(1);
        g.validate().expect("valid");
        let (spec, took) = timed(&|| g.spec());
        eprintln!("GPT-2 spec of 4096 blocks: {took:?}");
        let k = 4096;
        assert_eq!(spec.units.len(), k + g.n_layer + 1);
        assert_eq!(spec.layers.len(), 2 * k + g.n_layer);
        let head = spec.layers.iter().find(|l| l.name == "head").expect("head");
        assert_eq!(head.units, vec![k + g.n_layer, 0]);
        let last = spec.layers.last().expect("layers");
        assert_eq!(
            (last.name.as_str(), &last.units[..]),
            ("head.4095", &[k - 1][..])
        );

        let mut l = crate::LlamaConfig::preset("llama-tiny").expect("preset");
        let k = 1 << 12;
        l.vocab_size = k;
        l.vocab_block_rows = Some(1);
        l.validate().expect("valid");
        let (spec, took) = timed(&|| l.spec());
        eprintln!("Llama spec of {k} blocks: {took:?}");
        assert_eq!(spec.units.len(), 2 * k + l.n_layer);
        assert_eq!(spec.layers.len(), 2 * k + l.n_layer);
        let last = spec.layers.last().expect("layers");
        assert_eq!(last.units, vec![2 * k + l.n_layer - 1]);
    }

    /// GPT-2's vocabulary is bounded as a Llama's (2^20: ids past 65535 come from llm.c's
    /// uint32 token files); past that bound the error names the key, the value, the bound
    /// and why.
    #[test]
    fn a_gpt_vocabulary_past_every_bound_names_the_bound() {
        let mut g = GptConfig::preset("tiny").expect("preset");
        g.vocab_size = 65537;
        g.validate().expect("a vocabulary past u16 is valid");
        // More table blocks than the planner takes in reasonable time: named, with the
        // way out.
        g.vocab_block_rows = Some(1);
        let e = g.validate().expect_err("65537 one-row blocks");
        assert!(
            matches!(
                e,
                GptConfigError::TooLarge {
                    name: VOCAB_BLOCKS,
                    value: 65537,
                    max: 4096,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("give a larger vocab_block_rows"),
            "{e}"
        );
        g.vocab_block_rows = None;
        g.vocab_size = 1_000_000_000_000;
        let e = g.validate().expect_err("past the bound");
        assert!(
            matches!(
                e,
                GptConfigError::TooLarge {
                    name: "vocab_size",
                    max: 1_048_576,
                    ..
                }
            ),
            "{e}"
        );
    }

    /// Parameter counts of shapes past the bounds are `None`, not wrapped sums.
    #[test]
    fn parameter_counts_that_overflow_are_none() {
        let mut g = GptConfig::preset("tiny").expect("preset");
        assert_eq!(g.checked_num_params(), Some(g.num_params()));
        g.vocab_size = usize::MAX / 4;
        assert_eq!(g.checked_num_params(), None);
        assert_eq!(g.num_params(), usize::MAX);
        assert!(g.flops_per_token(8).is_finite());
        assert!(g.validate().is_err());
    }
}
