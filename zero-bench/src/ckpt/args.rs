//! The arguments of the `ckpt` tools, apart from the tools: `--help` lists them in every
//! build, the tools themselves need HDF5 (feature `hdf5`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// Tensor naming of the export (`zero_models::names::NameSet`, which `train --init-from`
/// reads with).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Names {
    /// docs/ARCHITECTURE.md names (Meta's for a Llama), [out, in] weights (for GPT-2,
    /// nanoGPT's state dict without the prefix).
    Nanogpt,
    /// Hugging Face's names for the checkpoint's family: hf-gpt2 or hf-llama.
    Hf,
    /// Hugging Face GPT2Model names, Conv1D weights transposed to [in, out].
    HfGpt2,
    /// Hugging Face LlamaForCausalLM names (model.embed_tokens.weight, ..., lm_head.weight).
    HfLlama,
}

/// Arguments of `ckpt export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Write a safetensors file (the only format for now; required).
    #[arg(long)]
    pub safetensors: bool,
    /// Tensor names and orientation.
    #[arg(long, value_enum, default_value = "nanogpt")]
    pub names: Names,
    /// A checkpoint root (follows `latest`) or a step directory.
    pub dir: PathBuf,
    /// The file to write (must not exist; its directory must).
    pub out: PathBuf,
}

/// Arguments of `ckpt bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Directory to write into: the bench makes its own `zero-ckpt-bench/` inside it
    /// (refused if that exists) and removes it at the end, so a real checkpoint root is safe.
    #[arg(long)]
    pub dir: PathBuf,
    /// Transformer blocks.
    #[arg(long, default_value_t = 4)]
    pub n_layer: usize,
    /// Embedding width C.
    #[arg(long, default_value_t = 256)]
    pub n_embd: usize,
    /// Vocabulary V.
    #[arg(long, default_value_t = 8192)]
    pub vocab: usize,
    /// ZeRO stage of the engine (0-3).
    #[arg(long, default_value_t = 1)]
    pub stage: u8,
    /// Repetitions (the best of them is reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
}
