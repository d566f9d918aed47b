//! Llama shapes (V, T, L, H, Hkv, C, F, theta, eps), the named Llama presets (a sibling of
//! GPT-2's [`crate::config::PRESETS`]: GPT-2's shape struct has no room for the key/value
//! heads, the MLP width or the rotary base), and everything derived from a shape alone:
//! the [`ModelSpec`], parameter counts and FLOPs per token. Nothing allocates weights.
//! [`crate::ModelPreset`] is the one lookup that knows both tables.

use std::ops::Range;

use zero_core::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};

use crate::config::{add, mul, GptConfigError};

/// Named Llama shapes: `llama-tiny` (gradient checks, CPU runs), `llama-small` (bytes,
/// the size of GPT-2's `small`, for CPU benchmarks), the published Llama 2
/// and Llama 3 shapes (Meta's `params.json`; the MLP width is the one the published
/// weights have), and `llama-7b`/`-13b`/`-70b` as aliases of the Llama 2 ones.
pub const LLAMA_PRESETS: &[(&str, LlamaConfig)] = &[
    ("llama-tiny", llama(64, 64, 2, 4, 2, 16, 40, 10_000.0)),
    ("llama-small", llama(256, 256, 4, 4, 2, 256, 688, 10_000.0)),
    (
        "llama2-7b",
        llama(32000, 4096, 32, 32, 32, 4096, 11008, 10_000.0),
    ),
    (
        "llama2-13b",
        llama(32000, 4096, 40, 40, 40, 5120, 13824, 10_000.0),
    ),
    (
        "llama2-70b",
        llama(32000, 4096, 80, 64, 8, 8192, 28672, 10_000.0),
    ),
    (
        "llama3-8b",
        llama(128256, 8192, 32, 32, 8, 4096, 14336, 500_000.0),
    ),
    (
        "llama3-70b",
        llama(128256, 8192, 80, 64, 8, 8192, 28672, 500_000.0),
    ),
    (
        "llama-7b",
        llama(32000, 4096, 32, 32, 32, 4096, 11008, 10_000.0),
    ),
    (
        "llama-13b",
        llama(32000, 4096, 40, 40, 40, 5120, 13824, 10_000.0),
    ),
    (
        "llama-70b",
        llama(32000, 4096, 80, 64, 8, 8192, 28672, 10_000.0),
    ),
];

#[allow(clippy::too_many_arguments)]
const fn llama(
    v: usize,
    t: usize,
    l: usize,
    h: usize,
    kv: usize,
    c: usize,
    f: usize,
    theta: f64,
) -> LlamaConfig {
    LlamaConfig {
        vocab_size: v,
        max_seq_len: t,
        n_layer: l,
        n_head: h,
        n_kv_head: kv,
        n_embd: c,
        ffn_hidden: f,
        rope_theta: theta,
        norm_eps: crate::llama::RMS_EPS,
        vocab_block_rows: None,
        checkpoint_every: 0,
    }
}

/// The shape of a Llama model (Meta's `ModelArgs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaConfig {
    /// V: vocabulary size (rows of `tok_embeddings` and of the untied `output`).
    pub vocab_size: usize,
    /// T: maximum sequence length (positions are rotary: no table).
    pub max_seq_len: usize,
    /// L: transformer blocks.
    pub n_layer: usize,
    /// H: query heads.
    pub n_head: usize,
    /// Hkv: key/value heads (divides H; H/Hkv query heads share one, grouped-query
    /// attention; Hkv = H is multi-head attention).
    pub n_kv_head: usize,
    /// C: width of the residual stream.
    pub n_embd: usize,
    /// F: hidden width of the SwiGLU MLP.
    pub ffn_hidden: usize,
    /// The rotary base theta (10000 in Llama 2, 500000 in Llama 3).
    pub rope_theta: f64,
    /// RMSNorm's epsilon (1e-5).
    pub norm_eps: f64,
    /// Rows of `tok_embeddings` and of `output` per unit: each table is split into row
    /// blocks of this many rows, gathered, used and reduced on its own (as GPT-2's `wte`,
    /// `crate::GptConfig::vocab_block_rows`). `None`: one transformer block's worth of
    /// elements, 2 + 2C + 2Ckv + 3F rows (Llama 3's 128256-row tables split, Llama 2's
    /// 32000 do not).
    pub vocab_block_rows: Option<usize>,
    /// Activation checkpointing: blocks 0, k, 2k, ... keep only their output and
    /// recompute their internals in the backward (`super::layout`); 0 keeps everything.
    pub checkpoint_every: usize,
}

/// What one layer of a Llama computes, in forward order ([`LlamaConfig::layers`]). Each
/// reads one unit ([`LlamaConfig::layer_unit`]): the tables are untied.
pub type LlamaLayer = crate::lm::TokenLayer;

impl LlamaConfig {
    /// A named preset (see [`LLAMA_PRESETS`]).
    pub fn preset(name: &str) -> Option<Self> {
        LLAMA_PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| *c)
    }

    /// C/H.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head.max(1)
    }

    /// Ckv = Hkv hd: the width of k and v.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head.saturating_mul(self.head_dim())
    }

    /// Check the shape: dimensions positive and within [`crate::config::DIM_BOUNDS`] (V <= 2^20,
    /// far above Llama 3's 128256), H divides C into even heads, Hkv divides H, theta > 1,
    /// eps > 0, and the parameter count fits a `usize`.
    pub fn validate(&self) -> Result<(), GptConfigError> {
        crate::config::check_dims(&[
            ("vocab_size", self.vocab_size),
            ("max_seq_len", self.max_seq_len),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_kv_head", self.n_kv_head),
            ("n_embd", self.n_embd),
            ("ffn_hidden", self.ffn_hidden),
        ])?;
        if self.vocab_block_rows == Some(0) {
            return Err(GptConfigError::Zero {
                name: "vocab_block_rows",
            });
        }
        crate::config::check_dims(&[(crate::config::VOCAB_BLOCKS, self.vocab_block_count())])?;
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(GptConfigError::HeadsDontDivide {
                c: self.n_embd,
                h: self.n_head,
            });
        }
        let problem = if !self.n_head.is_multiple_of(self.n_kv_head) {
            Some(format!(
                "n_kv_head Hkv={} does not divide n_head H={}",
                self.n_kv_head, self.n_head
            ))
        } else if !self.head_dim().is_multiple_of(2) {
            Some(format!(
                "the head size C/H = {}/{} = {} is odd; rotary embeddings rotate pairs",
                self.n_embd,
                self.n_head,
                self.head_dim()
            ))
        } else if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            Some(format!(
                "rope_theta = {} must be finite and > 1",
                self.rope_theta
            ))
        } else if self.norm_eps.is_nan() || self.norm_eps <= 0.0 {
            Some(format!("norm_eps = {} must be > 0", self.norm_eps))
        } else {
            None
        };
        match problem {
            Some(p) => Err(GptConfigError::Llama(p)),
            None if self.checked_num_params().is_none() => {
                Err(GptConfigError::ParamsOverflow { bits: usize::BITS })
            }
            None => Ok(()),
        }
    }

    /// Rows per table block ([`LlamaConfig::vocab_block_rows`], resolved).
    pub fn block_rows(&self) -> usize {
        let default = || {
            let (c, kv, f) = (Some(self.n_embd), self.kv_dim(), self.ffn_hidden);
            let widths = add(add(mul(c, 2), mul(Some(kv), 2)), mul(Some(f), 3));
            let worth = add(widths, Some(2)).unwrap_or(usize::MAX);
            worth.max(self.vocab_size.div_ceil(crate::config::MAX_VOCAB_BLOCKS))
        };
        self.vocab_block_rows.unwrap_or_else(default).max(1)
    }

    /// How many blocks each table has: `vocab_blocks().len()`, without building the list.
    pub fn vocab_block_count(&self) -> usize {
        self.vocab_size.max(1).div_ceil(self.block_rows())
    }

    /// The row ranges of the tables' blocks, in order (one range when not split).
    pub fn vocab_blocks(&self) -> Vec<Range<usize>> {
        let (v, r) = (self.vocab_size, self.block_rows());
        (0..v.max(1))
            .step_by(r)
            .map(|a| a..(a + r).min(v))
            .collect()
    }

    /// The layers in forward order: lookups of blocks 1.., embed, blocks, head, logits of
    /// blocks 1.. (see [`LlamaLayer`]).
    pub fn layers(&self) -> Vec<LlamaLayer> {
        LlamaLayer::sequence(self.n_layer, self.vocab_block_count())
    }

    /// The unit a layer reads, as an index into [`LlamaConfig::spec`]'s units (each layer
    /// reads one: the tables are untied).
    pub fn layer_unit(&self, layer: LlamaLayer) -> usize {
        Self::unit_of(layer, self.vocab_block_count(), self.n_layer)
    }

    /// [`LlamaConfig::layer_unit`] with `k` blocks per table and `l` transformer blocks.
    fn unit_of(layer: LlamaLayer, k: usize, l: usize) -> usize {
        match layer {
            LlamaLayer::Lookup(b) => b,
            LlamaLayer::Embed => 0,
            LlamaLayer::Block(i) => k + i,
            LlamaLayer::Head => k + l,
            LlamaLayer::Logits(b) => k + l + b,
        }
    }

    /// Units (Meta's tensor names): `tok_embeddings` {block 0 of the table}, one unit per
    /// further block (named as its rows, `tok_embeddings.weight[53250..106500]`),
    /// `layers.0` .. `layers.{L-1}`, `output` {`norm.weight`, block 0 of `output.weight`},
    /// one unit per further block of `output.weight`. Layers: [`LlamaConfig::layers`],
    /// named `embed.{k}`, `embed`, `layers.{i}`, `head`, `head.{k}`, each on one unit.
    /// With one block: units [tok_embeddings, layers.*, output], layers [embed, layers.*,
    /// head].
    pub fn spec(&self) -> ModelSpec {
        let (v, c, f, kv) = (self.vocab_size, self.n_embd, self.ffn_hidden, self.kv_dim());
        let rows = self.block_rows();
        let mut emb = ParamSpec::split_rows("tok_embeddings.weight", &[v, c], rows).into_iter();
        let mut out = ParamSpec::split_rows("output.weight", &[v, c], rows).into_iter();
        let mut units: Vec<UnitSpec> = emb
            .next()
            .map(|b| UnitSpec {
                name: "tok_embeddings".into(),
                params: vec![b],
            })
            .into_iter()
            .collect();
        units.extend(emb.map(|b| UnitSpec {
            name: b.name.clone(),
            params: vec![b],
        }));
        for i in 0..self.n_layer {
            let p = |s: &str, shape: &[usize]| ParamSpec::new(format!("layers.{i}.{s}"), shape);
            units.push(UnitSpec {
                name: format!("layers.{i}"),
                params: vec![
                    p("attention_norm.weight", &[c]),
                    p("attention.wq.weight", &[c, c]),
                    p("attention.wk.weight", &[kv, c]),
                    p("attention.wv.weight", &[kv, c]),
                    p("attention.wo.weight", &[c, c]),
                    p("ffn_norm.weight", &[c]),
                    p("feed_forward.w1.weight", &[f, c]),
                    p("feed_forward.w2.weight", &[c, f]),
                    p("feed_forward.w3.weight", &[f, c]),
                ],
            });
        }
        let mut head = vec![ParamSpec::new("norm.weight", &[c])];
        head.extend(out.next());
        units.push(UnitSpec {
            name: "output".into(),
            params: head,
        });
        units.extend(out.map(|b| UnitSpec {
            name: b.name.clone(),
            params: vec![b],
        }));
        // The block count once, not per layer (2k + L layers: O(k^2) otherwise).
        let (k, l) = (self.vocab_block_count(), self.n_layer);
        let layers = LlamaLayer::sequence(l, k)
            .into_iter()
            .map(|layer| LayerSpec {
                name: match layer {
                    LlamaLayer::Lookup(k) => format!("embed.{k}"),
                    LlamaLayer::Embed => "embed".into(),
                    LlamaLayer::Block(i) => format!("layers.{i}"),
                    LlamaLayer::Head => "head".into(),
                    LlamaLayer::Logits(k) => format!("head.{k}"),
                },
                units: vec![Self::unit_of(layer, k, l)],
                backward_reads_params: layer.backward_reads_params(),
            })
            .collect();
        ModelSpec { units, layers }
    }

    /// Ψ: parameter count, without building the spec; `usize::MAX` for a shape whose
    /// count overflows (which [`LlamaConfig::validate`] refuses).
    pub fn num_params(&self) -> usize {
        self.checked_num_params().unwrap_or(usize::MAX)
    }

    /// Ψ, `None` when it overflows a `usize`.
    pub fn checked_num_params(&self) -> Option<usize> {
        let (v, c, f, l) = (self.vocab_size, self.n_embd, self.ffn_hidden, self.n_layer);
        let kv = self.n_kv_head.checked_mul(self.head_dim());
        let c = Some(c);
        // 2 V C + L (2 C + 2 C^2 + 2 C Ckv + 3 C F) + C
        let block = add(mul(c, 2), mul(mul(c, 2), c?));
        let block = add(block, mul(mul(c, 2), kv?));
        let block = add(block, mul(mul(c, 3), f));
        add(add(mul(mul(c, 2), v), mul(block, l)), c)
    }

    /// Training FLOPs per token at sequence length `seq_len`, as
    /// [`crate::GptConfig::flops_per_token`] counts them: 6 per matmul weight (all but
    /// the embedding lookup and the norms) plus attention's `12 L C seq_len`.
    pub fn flops_per_token(&self, seq_len: usize) -> f64 {
        let norms = (2 * self.n_layer as u128 + 1) * self.n_embd as u128;
        let table = self.vocab_size as u128 * self.n_embd as u128;
        let matmul = (self.num_params() as u128).saturating_sub(table + norms);
        let (l, c) = (self.n_layer as f64, self.n_embd as f64);
        6.0 * matmul as f64 + 12.0 * l * c * seq_len as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Llama vocabulary is bounded (2^20, 8 x Llama 3's): 10^12 rows was accepted and
    /// then aborted allocating half a terabyte of table blocks.
    #[test]
    fn a_vocabulary_past_its_bound_is_refused_with_the_bound_and_why() {
        let mut m = LlamaConfig::preset("llama-tiny").expect("preset");
        m.vocab_size = 1_000_000_000_000;
        let e = m.validate().expect_err("past the bound");
        assert!(
            matches!(
                e,
                GptConfigError::TooLarge {
                    name: "vocab_size",
                    value: 1_000_000_000_000,
                    max: 1_048_576,
                    ..
                }
            ),
            "{e}"
        );
        let msg = e.to_string();
        for part in ["vocab_size = 1000000000000", "1048576", "128256", "memory"] {
            assert!(msg.contains(part), "'{part}' not in: {msg}");
        }
        m.vocab_size = 1_282_560_000;
        assert!(m.validate().is_err(), "Llama 3's V with three more zeros");
        // Up to the bound, and past GPT-2's u16 range: a Llama reads 32-bit tokens.
        m.vocab_size = 1 << 20;
        m.validate().expect("at the bound");
        m.vocab_size = 65537;
        m.validate().expect("past u16");
        LlamaConfig::preset("llama3-70b")
            .expect("preset")
            .validate()
            .expect("Llama 3's 128256 is inside the bound");
    }

    /// Parameter counts and FLOPs of shapes whose products overflow do not wrap.
    #[test]
    fn parameter_counts_that_overflow_are_none() {
        let mut m = LlamaConfig::preset("llama-tiny").expect("preset");
        assert_eq!(m.checked_num_params(), Some(m.num_params()));
        m.vocab_size = usize::MAX / 4;
        assert_eq!(m.checked_num_params(), None);
        assert_eq!(m.num_params(), usize::MAX);
        assert!(m.flops_per_token(8).is_finite());
        assert!(m.validate().is_err());
        let mut m = LlamaConfig::preset("llama-tiny").expect("preset");
        m.ffn_hidden = usize::MAX / 2;
        assert_eq!(m.checked_num_params(), None);
        assert!(m.block_rows() >= 1, "the default block size saturates");
    }
}
