//! The arguments of the `ckpt` tools, apart from the tools: `--help` lists them in every
//! build, the tools themselves need HDF5 (feature `hdf5`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// Tensor naming of the export (`zero_models::names::NameSet`, which `train --init-from`
/// reads with).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Names {
    /// docs/ARCHITECTURE.md names, [out, in] weights (nanoGPT's state dict without the prefix).
    Nanogpt,
    /// Hugging Face GPT2Model names, Conv1D weights transposed to [in, out].
    HfGpt2,
}

impl From<Names> for zero_models::names::NameSet {
    fn from(n: Names) -> Self {
        match n {
            Names::Nanogpt => zero_models::names::NameSet::Nanogpt,
            Names::HfGpt2 => zero_models::names::NameSet::HfGpt2,
        }
    }
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
    /// The file to write.
    pub out: PathBuf,
}

/// Arguments of `ckpt bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Directory to write into (a checkpoint root; plain files beside it).
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
