//! zero-models: the GPT-2 and Llama reference models and token data.
//!
//! - [`GptConfig`]: shapes and presets, the [`zero_core::ModelSpec`], parameter and FLOP
//!   counts, all without allocating weights.
//! - [`Gpt`]: forward and backward by hand on any [`zero_kernels::device::Device`] (f32
//!   for training, f64 as reference on the host), implementing [`zero_core::Model`]
//!   layer by layer, every op a device op (GEMM, LayerNorm, GELU, attention,
//!   cross-entropy, row ops; their CPU kernels are [`zero_kernels::nn`]).
//! - [`Llama`]: the Llama family (RMSNorm, rotary embeddings, grouped-query attention,
//!   SwiGLU, untied head) on the same device ops plus three of its own; presets
//!   [`LLAMA_PRESETS`], and [`ModelPreset`] looks a name up in either table.
//! - [`data`]: token files (nanoGPT and llm.c `.bin`), the sequential batch order, a
//!   built-in synthetic corpus, tokenisation of text (bytes or GPT-2's BPE, streamed).
//! - [`names`]: tensor names in files (ours, Meta's, Hugging Face's GPT-2 and Llama),
//!   both ways.
//!
//! Driving the model as the engine does, one layer at a time, each call handed only the
//! parameters of the units that layer uses (here on the host device):
//!
//! ```
//! use zero_core::model::Compute;
//! use zero_kernels::device::{Buffer, Device, HostDevice};
//! use zero_models::data::{MarkovSource, Sequential};
//! use zero_models::{upload_units, Gpt, GptConfig, LayeredLm, TokenBatch};
//!
//! let dev = HostDevice::new();
//! let stream = dev.stream("compute").unwrap();
//! let cx = Compute { dev: &dev, stream: &stream };
//! let mut cfg = GptConfig::preset("tiny").unwrap();
//! cfg.vocab_size = 64; // the built-in corpus has 64 symbols
//! let (rows, t) = (2, cfg.max_seq_len);
//! let mut model = Gpt::<HostDevice, f32>::new(&dev, cfg, rows).unwrap();
//! let params = upload_units(cx, &model.init_params(0), "param").unwrap(); // a buffer per unit
//! let mut grads = upload_units(cx, &model.zero_grads(), "grad").unwrap();
//! let corpus = MarkovSource::default_corpus(10_000, cfg.vocab_size).unwrap();
//! let (mut x, mut y) = (Vec::new(), Vec::new());
//! Sequential::new(rows, t, 1, 1, 0).unwrap().fill(&corpus, 0, 0, &mut x, &mut y).unwrap();
//! let batch = TokenBatch { rows, seq_len: t, inputs: &x, targets: &y };
//! let loss = model.forward_backward(cx, &batch, &params, &mut grads, 1.0 / (rows * t) as f32).unwrap();
//! assert!((loss - (cfg.vocab_size as f64).ln()).abs() < 0.1);
//! ```
#![deny(missing_docs)]

mod block;
pub mod config;
pub mod data;
pub mod gpt;
mod head;
pub mod init;
mod layout;
pub mod llama;
mod lm;
pub mod names;
mod units;

pub use config::{preset_names, GptConfig, GptConfigError, GptLayer, ModelPreset, PRESETS};
pub use gpt::{activation_bytes_for, Gpt, GptError, TokenBatch};
pub use llama::{Llama, LlamaConfig, LLAMA_PRESETS};
pub use lm::{LayeredLm, TokenLayer};
pub use units::{download_units, upload_units};
/// The scalar the model computes in (f32, f64): [`zero_kernels::nn::Scalar`].
pub use zero_kernels::nn::Scalar;

/// The model's matrix multiply, which now lives in [`zero_kernels::nn::gemm`]; re-exported
/// here under its old path so `zero_models::gemm::{Gemm, Lay}` keeps working.
pub mod gemm {
    /// The old name of [`MatLayout`].
    pub use zero_kernels::nn::gemm::MatLayout as Lay;
    pub use zero_kernels::nn::gemm::{Gemm, MatLayout};
}
