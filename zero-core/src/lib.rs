//! zero-core: the ZeRO engine.
#![deny(missing_docs)]

pub use zero_kernels::DType;
