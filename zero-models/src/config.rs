//! GPT-2 shapes (V, T, L, H, C), the named presets, and everything derived from a shape
//! alone: the [`ModelSpec`] (units, layers, parameter names as in DESIGN.md), parameter
//! counts and FLOPs per token. Nothing here allocates weights, so the planner can size a
//! 1.5B model on a laptop.

use zero_core::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};

/// Errors in a model configuration, with the offending numbers.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
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
    /// An unknown preset name.
    #[error("unknown model preset '{0}' (known: {known})", known = preset_names().join(", "))]
    UnknownPreset(String),
}

/// Names accepted by [`GptConfig::preset`]: the table lives in zero-core's config
/// (`zero_core::config::PRESETS`, which config files name), so the two never disagree.
pub fn preset_names() -> Vec<&'static str> {
    zero_core::config::PRESETS
        .iter()
        .map(|(name, _)| *name)
        .collect()
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
}

impl GptConfig {
    /// A named preset (see [`preset_names`]; shapes in `zero_core::config::PRESETS`):
    /// - `tiny`: V=32 T=8 L=2 H=2 C=16, for gradient checks and quick tests.
    /// - `small`: V=256 (bytes) T=256 L=4 H=4 C=256, ~3.3M parameters, for CPU benchmarks.
    /// - `gpt2-124m` .. `gpt2-1.5b`: the GPT-2 shapes with V=50257, T=1024.
    pub fn preset(name: &str) -> Result<Self, ConfigError> {
        zero_core::config::PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, d)| GptConfig::from_dims(d))
            .ok_or_else(|| ConfigError::UnknownPreset(name.to_string()))
    }

    /// The model of resolved config dimensions (`zero_core::config::resolve_model`).
    pub fn from_dims(d: &zero_core::config::ModelDims) -> Self {
        GptConfig {
            vocab_size: d.vocab_size,
            max_seq_len: d.context_len,
            n_layer: d.layers,
            n_head: d.heads,
            n_embd: d.width,
        }
    }

    /// Check the shape: all dimensions positive, H divides C, V fits u16 tokens.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("max_seq_len", self.max_seq_len),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero { name });
            }
        }
        if self.n_embd / self.n_head * self.n_head != self.n_embd {
            return Err(ConfigError::HeadsDontDivide {
                c: self.n_embd,
                h: self.n_head,
            });
        }
        if self.vocab_size > 65536 {
            return Err(ConfigError::VocabTooLarge(self.vocab_size));
        }
        Ok(())
    }

    /// Units and layers: units = [embed {wte, wpe}, h.0 .. h.{L-1}, ln_f]; layers =
    /// [embed (unit 0), block i (unit 1+i), head (units ln_f and embed: tied LM head)].
    pub fn spec(&self) -> ModelSpec {
        let (v, t, c, l) = (self.vocab_size, self.max_seq_len, self.n_embd, self.n_layer);
        let mut units = Vec::with_capacity(l + 2);
        units.push(UnitSpec {
            name: "embed".into(),
            params: vec![
                ParamSpec::new("wte", &[v, c]),
                ParamSpec::new("wpe", &[t, c]),
            ],
        });
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
        let mut layers = vec![LayerSpec {
            name: "embed".into(),
            units: vec![0],
        }];
        for i in 0..l {
            layers.push(LayerSpec {
                name: format!("h.{i}"),
                units: vec![1 + i],
            });
        }
        layers.push(LayerSpec {
            name: "head".into(),
            units: vec![l + 1, 0],
        });
        ModelSpec { units, layers }
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
