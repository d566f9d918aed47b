//! zero-core: the ZeRO engine, for any model, on any device, over any communicator.
//!
//! ZeRO (Rajbhandari et al., SC'20) partitions what data-parallel training replicates:
//! optimizer states (stage 1), gradients (stage 2) and parameters (stage 3), so per-rank
//! model-state memory falls as 1/N while every step stays the step of plain data
//! parallelism. The pieces:
//!
//! - [`Model`]: what a model provides (its [`ModelSpec`] of units and layers, an
//!   initialiser, a layer-by-layer forward and backward on device views, its own batch
//!   type). Implement it for your model.
//! - [`EngineConfig`]: stage, buckets, prefetch, precision, AdamW, accumulation.
//! - [`Engine`]: one rank's share of training, generic over the
//!   [`zero_kernels::device::Device`] the buffers live on and the
//!   [`zero_comm::Communicator`] the ranks talk over (MPI between processes,
//!   [`zero_comm::LocalComm`] between threads).
//! - [`plan`] and [`ledger`]: every byte each rank holds and sends, computed without
//!   allocating (the dry run), equal to what a run measures.
//! - `checkpoint` (feature `hdf5`, default): sharded HDF5 checkpoints that reshard to any
//!   N and stage. The only part that links a system library; the rest builds without it.
//!
//! Training a model of your own, here a linear regression `y = x . w`, at ZeRO-3 on two
//! thread ranks (the whole program; `zero-core/examples/` has an MLP classifier and a
//! character-level language model, and docs/ARCHITECTURE.md explains the design):
//!
//! ```
//! use zero_core::model::{Compute, Model, ModelError, UnitGrads, UnitParams};
//! use zero_core::{Engine, EngineConfig, LayerSpec, ModelSpec, ParamSpec, Stage, UnitSpec};
//! use zero_comm::Communicator;
//! use zero_kernels::device::{Buffer, DView, Device, HostDevice, MatLayout, MatMul};
//!
//! /// y = x w for rows x of 4 features; the loss is the mean squared error.
//! struct Linear<D: Device> { spec: ModelSpec, x: D::Buf<f32>, err: D::Buf<f32>, loss: D::Buf<f32> }
//! struct Batch<'a> { x: &'a [f32], y: &'a [f32] } // 8 rows
//!
//! impl<D: Device> Model<D> for Linear<D> {
//!     type Batch<'a> = Batch<'a>;
//!     fn spec(&self) -> &ModelSpec { &self.spec }
//!     fn init_unit(&self, _seed: u64, _unit: usize, out: &mut [f32]) { out.fill(0.0) }
//!     fn begin_micro_step(&mut self, cx: Compute<'_, D>, b: &Batch<'_>) -> Result<(), ModelError> {
//!         cx.dev.upload(cx.stream, b.x, self.x.view_mut())?;
//!         Ok(cx.dev.upload(cx.stream, b.y, self.err.view_mut())?) // err := y, for now
//!     }
//!     fn forward_layer(&mut self, cx: Compute<'_, D>, _l: usize, p: &[UnitParams<'_, D>]) -> Result<(), ModelError> {
//!         // err = x w - y (beta = -1 turns the y in err into -y), loss = mean(err^2) / 2
//!         let mm = MatMul { alpha: 1.0, beta: -1.0, a: MatLayout::rm(8, 4, 4), b: MatLayout::rm(4, 1, 1), c: MatLayout::rm(8, 1, 1) };
//!         cx.dev.matmul(cx.stream, mm, self.x.view(), p[0].param(0), self.err.view_mut())?;
//!         let dot = MatMul { alpha: 0.5 / 8.0, beta: 0.0, a: MatLayout::rm(1, 8, 8), b: MatLayout::rm(8, 1, 1), c: MatLayout::rm(1, 1, 1) };
//!         Ok(cx.dev.matmul(cx.stream, dot, self.err.view(), self.err.view(), self.loss.view_mut())?)
//!     }
//!     fn loss(&self) -> DView<'_, D, f32> { self.loss.view() }
//!     fn backward_layer(&mut self, cx: Compute<'_, D>, _l: usize, _p: &[UnitParams<'_, D>], g: &mut [UnitGrads<'_, D>], weight: f32) -> Result<(), ModelError> {
//!         // d(weight x loss)/dw = weight / 8 x^T err
//!         let mm = MatMul { alpha: weight / 8.0, beta: 1.0, a: MatLayout::rm(8, 4, 4).t(), b: MatLayout::rm(8, 1, 1), c: MatLayout::rm(4, 1, 1) };
//!         Ok(cx.dev.matmul(cx.stream, mm, self.x.view(), self.err.view(), g[0].param(0))?)
//!     }
//!     fn activation_bytes(&self) -> usize { 4 * (32 + 8 + 1) }
//! }
//!
//! let per_rank = zero_comm::run_local(2, Default::default(), |comm| {
//!     let dev = HostDevice::new();
//!     let spec = ModelSpec {
//!         units: vec![UnitSpec { name: "linear".into(), params: vec![ParamSpec::new("w", &[4, 1])] }],
//!         layers: vec![LayerSpec::new("linear", vec![0])],
//!     };
//!     let mut model = Linear::<HostDevice> { spec, x: dev.alloc(32, "x")?, err: dev.alloc(8, "err")?, loss: dev.alloc(1, "loss")? };
//!     let mut config = EngineConfig::default();
//!     config.zero.stage = Stage::Zero3;
//!     config.precision.dtype = zero_core::Precision::Fp32;
//!     config.optim.lr = 0.05;
//!     config.optim.weight_decay = 0.0;
//!     let mut engine = Engine::new(&config, &comm, &dev, &model)?;
//!     // Each rank sees its own rows of y = x . [1, 2, 3, 4].
//!     let x: Vec<f32> = (0..32).map(|i| ((i * 7 + comm.rank() * 5) % 11) as f32 / 11.0).collect();
//!     let y: Vec<f32> = x.chunks(4).map(|r| r[0] + 2.0 * r[1] + 3.0 * r[2] + 4.0 * r[3]).collect();
//!     let mut losses = Vec::new();
//!     for _ in 0..200 {
//!         losses.push(engine.step(&mut model, &[Batch { x: &x, y: &y }])?.loss);
//!     }
//!     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(losses)
//! });
//! let losses: Vec<Vec<f64>> = per_rank.into_iter().map(|r| r.unwrap().unwrap()).collect();
//! assert_eq!(losses[0], losses[1]); // every rank agrees on the global loss
//! assert!(losses[0][199] < 0.01 * losses[0][0]);
//! ```
#![deny(missing_docs)]

#[cfg(feature = "hdf5")]
pub mod checkpoint;
pub mod config;
pub mod engine;
pub mod files;
pub mod layout;
pub mod ledger;
pub mod model;
pub mod plan;
pub mod spec;
#[cfg(test)]
mod testutil;

#[cfg(feature = "hdf5")]
pub use checkpoint::CheckpointError;
pub use config::{ConfigError, EngineConfig, Precision, Stage};
pub use engine::state::UnitState;
pub use engine::{Engine, EngineError, LossScaler, NodeStats, StepReport, WaitPoint};
pub use layout::{LayoutError, PartitionLayout};
pub use model::{Model, ModelError};
pub use spec::{LayerSpec, ModelSpec, ParamSpec, RowBlock, Tensor, UnitSpec};
pub use zero_kernels::DType;
