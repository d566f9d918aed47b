//! zero-core: the ZeRO engine.
#![deny(missing_docs)]

pub mod model;
pub mod spec;

pub use model::{Batch, Model, ModelError};
pub use spec::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};
pub use zero_kernels::DType;
