//! GPT-2 tensor names in files, both ways: the one mapping that `zero-bench ckpt export
//! --names` writes with and `zero-bench train --init-from` reads with, so the two cannot
//! drift apart.
//!
//! - [`NameSet::Nanogpt`]: our names (docs/ARCHITECTURE.md, "GPT-2 names"; nanoGPT's
//!   state dict without its `transformer.` prefix): `wte`, `wpe`, `h.{i}.ln_1.weight`,
//!   ..., linear weights [out, in] as `torch.nn.Linear` holds them.
//! - [`NameSet::HfGpt2`]: Hugging Face's `GPT2Model`: `wte.weight`, `wpe.weight`, the
//!   block and `ln_f` names unchanged, and the four linear weights of each block
//!   (`attn.c_attn`, `attn.c_proj`, `mlp.c_fc`, `mlp.c_proj`) stored transposed, [in, out],
//!   as its `Conv1D` holds them.
//!
//! Whole-model state dicts (Hugging Face's `GPT2LMHeadModel`, nanoGPT's `GPT`) put
//! [`PREFIX`] before these names and add tensors that carry nothing to load
//! ([`redundant`]).

/// A naming of GPT-2's tensors in files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameSet {
    /// Our names, linear weights [out, in].
    Nanogpt,
    /// Hugging Face `GPT2Model` names, block linear weights [in, out] (Conv1D).
    HfGpt2,
}

impl NameSet {
    /// Both sets, ours first.
    pub const ALL: [NameSet; 2] = [NameSet::Nanogpt, NameSet::HfGpt2];

    /// How the command line spells it (`--names`).
    pub fn label(self) -> &'static str {
        match self {
            NameSet::Nanogpt => "nanogpt",
            NameSet::HfGpt2 => "hf-gpt2",
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

/// `h.{i}.{rest}` -> `rest`.
fn block_member(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("h.")?;
    let (layer, member) = rest.split_once('.')?;
    layer.bytes().all(|b| b.is_ascii_digit()).then_some(member)
}

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
    }
}

/// Why a tensor of a GPT-2 file (its name without [`PREFIX`]) has nothing to load, or
/// None when it is not one of those: the LM head (tied to `wte`) and the attention-mask
/// buffers that older `transformers` versions (and nanoGPT without flash attention) saved.
pub fn redundant(name: &str) -> Option<&'static str> {
    match name {
        "lm_head.weight" => Some("the LM head, tied to wte"),
        _ => match block_member(name) {
            Some("attn.bias") | Some("attn.masked_bias") => Some("attention-mask buffers"),
            _ => None,
        },
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
        assert!(redundant("lm_head.weight").is_some());
        assert!(redundant("h.3.attn.bias").is_some());
        assert!(redundant("h.3.attn.masked_bias").is_some());
        assert!(redundant("h.3.attn.c_attn.bias").is_none());
        assert!(redundant("wte.weight").is_none());
        assert!(redundant("h.x.attn.bias").is_none());
    }
}
