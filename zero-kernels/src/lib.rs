//! zero-kernels: where the bytes of the model state live and the math on them.
//!
//! The lowest layer of zero-rs. It knows nothing of ranks or stages: it holds typed
//! element buffers (host today, CUDA device buffers behind the `cuda` feature) and the
//! memory-bound kernels of an optimizer step.
#![deny(missing_docs)]

pub mod dtype;

pub use dtype::{DType, Element};
