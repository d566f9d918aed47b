//! zero-models: the GPT-2 reference model and data loading.
//!
//! - [`GptConfig`]: shapes and presets, the [`zero_core::ModelSpec`], parameter and FLOP
//!   counts, all without allocating weights.
//! - [`Gpt`]: forward and backward by hand on CPU (f32 for training, f64 as reference),
//!   implementing [`zero_core::Model`] layer by layer.
//! - [`data`]: token files (nanoGPT and llm.c `.bin`), the sequential batch order, a
//!   built-in synthetic corpus, byte tokenisation.
//!
//! Driving the model as the engine does, one layer at a time, each call handed only the
//! parameters of the units that layer uses:
//!
//! ```
//! use zero_core::{Batch, Model};
//! use zero_models::data::{MarkovSource, Sequential};
//! use zero_models::{Gpt, GptConfig};
//!
//! let mut cfg = GptConfig::preset("tiny").unwrap();
//! cfg.vocab_size = 64; // the built-in corpus has 64 symbols
//! let (rows, t) = (2, cfg.max_seq_len);
//! let mut model = Gpt::<f32>::new(cfg, rows, 1).unwrap();
//! let params = model.init_params(0); // one flat buffer per unit
//! let mut grads = model.zero_grads();
//! let corpus = MarkovSource::default_corpus(10_000, cfg.vocab_size).unwrap();
//! let (mut x, mut y) = (Vec::new(), Vec::new());
//! Sequential::new(rows, t, 1, 1, 0).unwrap().fill(&corpus, 0, 0, &mut x, &mut y).unwrap();
//! model.begin_micro_step(&Batch { rows, seq_len: t, inputs: &x, targets: &y }).unwrap();
//! let spec = model.spec().clone();
//! for (l, layer) in spec.layers.iter().enumerate() {
//!     let p: Vec<&[f32]> = layer.units.iter().map(|&u| params[u].as_slice()).collect();
//!     model.forward_layer(l, &p).unwrap();
//! }
//! assert!((model.loss() - (cfg.vocab_size as f32).ln()).abs() < 0.1);
//! // Backward in reverse; the head (units [ln_f, embed]) adds into wte's gradient too.
//! let head = spec.layers.len() - 1;
//! let (embed, rest) = grads.split_at_mut(1);
//! let p = [params[spec.units.len() - 1].as_slice(), params[0].as_slice()];
//! let mut g = [rest.last_mut().unwrap().as_mut_slice(), embed[0].as_mut_slice()];
//! model.backward_layer(head, &p, &mut g, 1.0 / (rows * t) as f32).unwrap();
//! ```
#![deny(missing_docs)]

mod attention;
mod block;
pub mod config;
pub mod data;
pub mod gemm;
pub mod gpt;
pub mod init;
mod layout;
mod ops;
pub mod real;

pub use config::{preset_names, ConfigError, GptConfig};
pub use gpt::{activation_bytes_for, Gpt};
pub use real::Real;
