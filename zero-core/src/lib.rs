//! zero-core: the ZeRO engine.
#![deny(missing_docs)]

pub mod checkpoint;
pub mod config;
pub mod engine;
pub mod layout;
pub mod ledger;
pub mod model;
pub mod spec;
#[cfg(test)]
mod testutil;

pub use checkpoint::CheckpointError;
pub use config::{Config, ConfigError, LoadedConfig, Precision, Stage};
pub use engine::state::{UnitState, UnitStateMut};
pub use engine::{Engine, EngineError, LossScaler, StepReport};
pub use layout::{LayoutError, PartitionLayout};
pub use model::{Batch, Model, ModelError};
pub use spec::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};
pub use zero_kernels::DType;
