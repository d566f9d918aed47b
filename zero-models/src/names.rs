//! Tensor names in files, both ways: the one mapping that `zero-bench ckpt export
//! --names` writes with and `zero-bench train --init-from` reads with, so the two cannot
//! drift apart. GPT-2 has two name sets besides ours, Llama one ([`Family`]).
//!
//! - [`NameSet::Nanogpt`]: our names (docs/ARCHITECTURE.md, "GPT-2 names"; nanoGPT's
//!   state dict without its `transformer.` prefix): `wte`, `wpe`, `h.{i}.ln_1.weight`,
//!   ..., linear weights [out, in] as `torch.nn.Linear` holds them.
//! - [`NameSet::HfGpt2`]: Hugging Face's `GPT2Model`: `wte.weight`, `wpe.weight`, the
//!   block and `ln_f` names unchanged, and the four linear weights of each block
//!   (`attn.c_attn`, `attn.c_proj`, `mlp.c_fc`, `mlp.c_proj`) stored transposed, [in, out],
//!   as its `Conv1D` holds them.
//! - [`NameSet::HfLlama`]: Hugging Face's `LlamaForCausalLM` (`model.embed_tokens.weight`,
//!   `model.layers.{i}.self_attn.q_proj.weight`, ..., `model.norm.weight`,
//!   `lm_head.weight`) for our Llama's Meta names (`tok_embeddings.weight`,
//!   `layers.{i}.attention.wq.weight`, ..., zero-models/src/llama/config.rs). Both hold
//!   linear weights [out, in] (`torch.nn.Linear`), so nothing is transposed; and q/k need
//!   no permutation because our rotary embedding pairs channels as HF's `rotate_half` does
//!   (zero-kernels/src/nn/rope.rs; tests/tests/llama_safetensors_cli.rs checks the whole
//!   forward against a numpy HF Llama).
//!
//! Whole-model state dicts (Hugging Face's `GPT2LMHeadModel`, nanoGPT's `GPT`) put
//! [`PREFIX`] before these names and add tensors that carry nothing to load
//! ([`redundant`]).

/// A model family, as its tensor names tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// GPT-2 (`wte`, `h.{i}.*`).
    Gpt2,
    /// Llama (`tok_embeddings.weight`, `layers.{i}.*`).
    Llama,
}

impl Family {
    /// The family of a model with these (whole) tensor names: Llama when it has
    /// `tok_embeddings.weight`, GPT-2 otherwise.
    pub fn of<'a>(mut names: impl Iterator<Item = &'a str>) -> Family {
        if names.any(|n| n == "tok_embeddings.weight") {
            Family::Llama
        } else {
            Family::Gpt2
        }
    }

    /// The name sets for this family, ours first.
    pub fn name_sets(self) -> [NameSet; 2] {
        match self {
            Family::Gpt2 => [NameSet::Nanogpt, NameSet::HfGpt2],
            Family::Llama => [NameSet::Nanogpt, NameSet::HfLlama],
        }
    }

    /// Hugging Face's name set for this family.
    pub fn hf(self) -> NameSet {
        match self {
            Family::Gpt2 => NameSet::HfGpt2,
            Family::Llama => NameSet::HfLlama,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::Gpt2 => "GPT-2",
            Family::Llama => "Llama",
        })
    }
}

/// A naming of a model's tensors in files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameSet {
    /// Our names (docs/ARCHITECTURE.md; Meta's for Llama), linear weights [out, in].
    Nanogpt,
    /// Hugging Face `GPT2Model` names, block linear weights [in, out] (Conv1D).
    HfGpt2,
    /// Hugging Face `LlamaForCausalLM` names, linear weights [out, in].
    HfLlama,
}

impl NameSet {
    /// Every set, ours first.
    pub const ALL: [NameSet; 3] = [NameSet::Nanogpt, NameSet::HfGpt2, NameSet::HfLlama];

    /// How the command line spells it (`--names`).
    pub fn label(self) -> &'static str {
        match self {
            NameSet::Nanogpt => "nanogpt",
            NameSet::HfGpt2 => "hf-gpt2",
            NameSet::HfLlama => "hf-llama",
        }
    }

    /// The family whose tensors it names; None for ours, which name every family.
    pub fn family(self) -> Option<Family> {
        match self {
            NameSet::Nanogpt => None,
            NameSet::HfGpt2 => Some(Family::Gpt2),
            NameSet::HfLlama => Some(Family::Llama),
        }
    }
}

impl std::fmt::Display for NameSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// How one of our tensors is stored under a [`NameSet`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The name in the file.
    pub name: String,
    /// The file holds the transpose of our [rows, cols] tensor: [cols, rows].
    pub transposed: bool,
}

impl Stored {
    /// The shape in the file of a tensor of ours of shape `shape`.
    pub fn shape(&self, shape: &[usize]) -> Vec<usize> {
        let mut s = shape.to_vec();
        if self.transposed {
            s.reverse();
        }
        s
    }
}

/// The linear weights of a block that Hugging Face's Conv1D holds as [in, out].
const CONV1D_WEIGHTS: [&str; 4] = [
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
];

/// The prefix a whole-model state dict (`GPT2LMHeadModel`, nanoGPT's `GPT`) puts before
/// the names of its transformer.
pub const PREFIX: &str = "transformer.";

/// `{prefix}{i}.{rest}` -> (`i`, `rest`).
fn layer_member<'a>(prefix: &str, name: &'a str) -> Option<(&'a str, &'a str)> {
    let rest = name.strip_prefix(prefix)?;
    let (layer, member) = rest.split_once('.')?;
    (!layer.is_empty() && layer.bytes().all(|b| b.is_ascii_digit())).then_some((layer, member))
}

/// `h.{i}.{rest}` -> `rest`.
fn block_member(name: &str) -> Option<&str> {
    layer_member("h.", name).map(|(_, m)| m)
}

/// The members of a Llama block: ours (Meta's) and Hugging Face's `LlamaDecoderLayer`'s.
const LLAMA_MEMBERS: [(&str, &str); 9] = [
    ("attention_norm.weight", "input_layernorm.weight"),
    ("attention.wq.weight", "self_attn.q_proj.weight"),
    ("attention.wk.weight", "self_attn.k_proj.weight"),
    ("attention.wv.weight", "self_attn.v_proj.weight"),
    ("attention.wo.weight", "self_attn.o_proj.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    // SwiGLU: w2(silu(w1 x) * w3 x) is down(silu(gate x) * up x).
    ("feed_forward.w1.weight", "mlp.gate_proj.weight"),
    ("feed_forward.w2.weight", "mlp.down_proj.weight"),
    ("feed_forward.w3.weight", "mlp.up_proj.weight"),
];

/// Hugging Face Llama's name of our (Meta-named) Llama tensor `ours`; None for a name
/// that is not a Llama tensor.
fn hf_llama(ours: &str) -> Option<String> {
    match ours {
        "tok_embeddings.weight" => Some("model.embed_tokens.weight".into()),
        "norm.weight" => Some("model.norm.weight".into()),
        "output.weight" => Some(HF_LLAMA_HEAD.into()),
        _ => {
            let (i, member) = layer_member("layers.", ours)?;
            let (_, hf) = LLAMA_MEMBERS.iter().find(|(m, _)| *m == member)?;
            Some(format!("model.layers.{i}.{hf}"))
        }
    }
}

/// Hugging Face Llama's LM head, which a model with `tie_word_embeddings` does not save
/// (it is `model.embed_tokens.weight`).
pub const HF_LLAMA_HEAD: &str = "lm_head.weight";
/// Hugging Face Llama's token embedding.
pub const HF_LLAMA_EMBED: &str = "model.embed_tokens.weight";

/// How our tensor `ours` (a name of docs/ARCHITECTURE.md) is stored under `set`.
pub fn stored(set: NameSet, ours: &str) -> Stored {
    match set {
        NameSet::Nanogpt => Stored {
            name: ours.to_string(),
            transposed: false,
        },
        NameSet::HfGpt2 => match ours {
            "wte" | "wpe" => Stored {
                name: format!("{ours}.weight"),
                transposed: false,
            },
            _ => Stored {
                name: ours.to_string(),
                transposed: block_member(ours).is_some_and(|m| CONV1D_WEIGHTS.contains(&m)),
            },
        },
        NameSet::HfLlama => Stored {
            name: hf_llama(ours).unwrap_or_else(|| ours.to_string()),
            transposed: false,
        },
    }
}

/// Why a tensor of a `family` file (its name without [`PREFIX`]) that the model did not
/// take has nothing to load, or None when it is not one of those: GPT-2's LM head (tied
/// to `wte`) and the attention-mask buffers that older `transformers` versions (and
/// nanoGPT without flash attention) saved; Llama's rotary `inv_freq` buffers (older
/// `transformers`), which are a function of `rope_theta`.
pub fn redundant(family: Family, name: &str) -> Option<&'static str> {
    match family {
        Family::Gpt2 => match name {
            "lm_head.weight" => Some("the LM head, tied to wte"),
            _ => match block_member(name) {
                Some("attn.bias") | Some("attn.masked_bias") => Some("attention-mask buffers"),
                _ => None,
            },
        },
        Family::Llama => {
            let member = layer_member("model.layers.", name).or(layer_member("layers.", name));
            match member {
                Some((_, "self_attn.rotary_emb.inv_freq")) => {
                    Some("rotary inv_freq buffers (computed from rope_theta)")
                }
                _ => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_names_transpose_only_block_linear_weights() {
        let hf = |n: &str| {
            let s = stored(NameSet::HfGpt2, n);
            (s.name, s.transposed)
        };
        assert_eq!(hf("wte"), ("wte.weight".into(), false));
        assert_eq!(hf("wpe"), ("wpe.weight".into(), false));
        assert_eq!(
            hf("h.0.attn.c_attn.weight"),
            ("h.0.attn.c_attn.weight".into(), true)
        );
        assert_eq!(
            hf("h.11.mlp.c_proj.weight"),
            ("h.11.mlp.c_proj.weight".into(), true)
        );
        assert_eq!(
            hf("h.0.attn.c_attn.bias"),
            ("h.0.attn.c_attn.bias".into(), false)
        );
        assert_eq!(hf("h.0.ln_1.weight"), ("h.0.ln_1.weight".into(), false));
        assert_eq!(hf("ln_f.bias"), ("ln_f.bias".into(), false));
        let ours = stored(NameSet::Nanogpt, "h.1.mlp.c_fc.weight");
        assert_eq!(ours.name, "h.1.mlp.c_fc.weight");
        assert!(!ours.transposed);
        assert_eq!(
            stored(NameSet::HfGpt2, "h.1.mlp.c_fc.weight").shape(&[128, 32]),
            vec![32, 128]
        );
    }

    #[test]
    fn buffers_and_the_tied_head_are_redundant() {
        let gpt = |n| redundant(Family::Gpt2, n);
        assert!(gpt("lm_head.weight").is_some());
        assert!(gpt("h.3.attn.bias").is_some());
        assert!(gpt("h.3.attn.masked_bias").is_some());
        assert!(gpt("h.3.attn.c_attn.bias").is_none());
        assert!(gpt("wte.weight").is_none());
        assert!(gpt("h.x.attn.bias").is_none());
        let llama = |n| redundant(Family::Llama, n);
        assert!(llama("model.layers.7.self_attn.rotary_emb.inv_freq").is_some());
        assert!(llama("lm_head.weight").is_none());
        assert!(llama("model.layers.7.self_attn.q_proj.weight").is_none());
    }

    #[test]
    fn hf_llama_names_every_llama_tensor_once_untransposed() {
        let cfg = crate::llama::LlamaConfig::preset("llama-tiny").unwrap();
        let tensors = cfg.spec().tensors();
        let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(Family::of(names.iter().copied()), Family::Llama);
        let mut hf: Vec<String> = Vec::new();
        for t in &tensors {
            let s = stored(NameSet::HfLlama, &t.name);
            assert!(!s.transposed);
            assert_eq!(s.shape(&t.shape), t.shape);
            hf.push(s.name);
        }
        hf.sort();
        let want = [
            "lm_head.weight",
            "model.embed_tokens.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.mlp.down_proj.weight",
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.post_attention_layernorm.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.v_proj.weight",
        ];
        assert_eq!(hf.len(), 2 + 2 * 9 + 1, "{hf:?}");
        for w in want {
            assert!(hf.iter().any(|h| h == w), "no {w} in {hf:?}");
        }
        assert!(hf.iter().any(|h| h == "model.layers.1.mlp.up_proj.weight"));
        assert!(hf.contains(&"model.norm.weight".to_string()));
        assert_eq!(
            stored(NameSet::HfLlama, "layers.12.feed_forward.w1.weight").name,
            "model.layers.12.mlp.gate_proj.weight"
        );
        // Not a Llama name: unchanged (never a model tensor of this set).
        assert_eq!(stored(NameSet::HfLlama, "wte").name, "wte");
        assert_eq!(Family::of(["wte", "wpe"].into_iter()), Family::Gpt2);
    }
}
