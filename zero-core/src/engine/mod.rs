//! The ZeRO engine: one rank's share of data-parallel training, at stage 0-3.
//!
//! [`Engine::new`] lays the model out ([`PartitionLayout`]), plans this rank's buffers
//! ([`BufferPlan`], the same code as the dry run), allocates exactly those and fills
//! them from the model's initialiser (the same values on every rank and for every N).
//! [`Engine::step`] (in `step.rs`) runs one optimizer step over A micro-batches and
//! returns what happened ([`StepReport`]): loss, gradient norm, skipped or not, the
//! bytes each collective moved, the memory held by category.
//!
//! Invariant: for the same seed, data and world size, every stage computes the same
//! step; the stage only decides which buffers are full and which are this rank's shard.

mod buffers;
mod passes;
pub mod real;
mod reduce;
pub mod scaler;
pub mod state;
mod step;

use std::collections::BTreeMap;

use zero_comm::{CommError, CommStats, Communicator};
use zero_kernels::{DType, Exec, KernelError};

use crate::config::{Config, Stage};
use crate::layout::{LayoutError, PartitionLayout};
use crate::ledger::{BufferPlan, MemCategory, PlanError, PlanInputs};
use crate::model::{Model, ModelError};
use crate::spec::ModelSpec;
use buffers::Buffers;
use real::{convert, Real};
pub use scaler::LossScaler;

/// Everything that can stop the engine, with what and where.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A collective failed (the error names the rank and the collective).
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A kernel refused its inputs.
    #[error("kernel: {0}")]
    Kernel(#[from] KernelError),
    /// The model failed.
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// The model's spec cannot be laid out.
    #[error("layout: {0}")]
    Layout(#[from] LayoutError),
    /// The buffer plan cannot be made.
    #[error("memory plan: {0}")]
    Plan(#[from] PlanError),
    /// The model or batches do not fit the configuration.
    #[error("{0}")]
    Mismatch(String),
    /// An inf/NaN gradient where no loss scaler can recover (fp32, bf16): the step was
    /// not applied on any rank.
    #[error("step {step}: the gradient is inf/NaN on some rank (loss {loss}) in {precision} training, where loss scaling does not apply; the step was not applied. Lower optim.lr, check the data, or resume from the last checkpoint")]
    NonFinite {
        /// The step.
        step: u64,
        /// The agreed loss of the step.
        loss: f64,
        /// The precision (`fp32`, `bf16`).
        precision: String,
    },
    /// A broken engine invariant (a bug: please report it with the config).
    #[error("internal engine error: {0}")]
    Internal(String),
}

/// What one optimizer step did, on this rank (values agreed across ranks where noted).
#[derive(Clone, Debug)]
pub struct StepReport {
    /// Index of the step (0-based, counts skipped steps too).
    pub step: u64,
    /// Mean loss over the global batch (same on every rank).
    pub loss: f64,
    /// Global L2 norm of the gradient before clipping (same on every rank; inf/NaN on
    /// overflow).
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Loss scale used for this step (1 without scaling).
    pub loss_scale: f64,
    /// The step was skipped on every rank (inf/NaN gradient somewhere).
    pub skipped: bool,
    /// Tokens in the global batch (N x A x B x T).
    pub tokens: u64,
    /// Wall-clock seconds of the step on this rank.
    pub seconds: f64,
    /// Bytes and calls per collective kind this rank did during the step.
    pub comm: CommStats,
    /// Bytes held per memory category (measured from the allocations).
    pub memory: BTreeMap<MemCategory, u64>,
}

/// One rank's ZeRO engine.
pub struct Engine<'c, C: Communicator> {
    comm: &'c C,
    config: Config,
    spec: ModelSpec,
    layout: PartitionLayout,
    plan: BufferPlan,
    bufs: Buffers,
    scaler: LossScaler,
    exec: Exec,
    /// Steps run so far (skipped included): the data position and the lr schedule.
    step: u64,
    /// AdamW steps applied (skipped excluded): Adam's bias-correction t.
    applied: u64,
    activation_bytes: u64,
}

impl<'c, C: Communicator> Engine<'c, C> {
    /// Lay out `model`, plan and allocate this rank's buffers, and initialise parameters
    /// and master weights from `model.init_unit(config.train.seed, ..)`.
    pub fn new(config: &Config, comm: &'c C, model: &dyn Model) -> Result<Self, EngineError> {
        let spec = model.spec().clone();
        spec.validate().map_err(EngineError::Mismatch)?;
        let (rank, world) = (comm.rank(), comm.size());
        let layout = PartitionLayout::new(&spec, world, config.zero.align)?;
        let activation_bytes = model.activation_bytes() as u64;
        let inputs = PlanInputs::from_config(config, activation_bytes);
        let plan = BufferPlan::new(&spec, &layout, &inputs, rank)?;
        let bufs = Buffers::allocate(&plan, spec.units.len())?;
        let mut engine = Engine {
            comm,
            config: config.clone(),
            spec,
            layout,
            plan,
            bufs,
            scaler: LossScaler::new(&config.precision),
            exec: Exec::default(),
            step: 0,
            applied: 0,
            activation_bytes,
        };
        match engine.plan.param_dtype {
            DType::F32 => engine.init_params::<f32>(model)?,
            DType::BF16 => engine.init_params::<half::bf16>(model)?,
            DType::F16 => engine.init_params::<half::f16>(model)?,
            other => return Err(EngineError::Internal(format!("parameter dtype {other}"))),
        }
        Ok(engine)
    }

    /// Fill parameters, master weights and persistent units from the model's initialiser,
    /// one unit at a time (bounded extra memory: one unit of f32).
    fn init_params<P: Real>(&mut self, model: &dyn Model) -> Result<(), EngineError> {
        let (rank, stage) = (self.comm.rank(), self.config.zero.stage);
        let seed = self.config.train.seed;
        for (u, unit) in self.layout.units.iter().enumerate() {
            let mut full = vec![0.0f32; unit.padded_len];
            model.init_unit(seed, u, &mut full[..unit.numel]);
            let own = rank * unit.shard_len..(rank + 1) * unit.shard_len;
            let shard_at = unit.shard_offset..unit.shard_offset + unit.shard_len;
            let full_at = unit.unit_offset..unit.unit_offset + unit.padded_len;
            let params = P::of_mut(&mut self.bufs.params)?;
            if stage == Stage::Zero3 {
                convert(
                    &self.exec,
                    &full[own.clone()],
                    &mut params[shard_at.clone()],
                )?;
            } else {
                convert(&self.exec, &full, &mut params[full_at.clone()])?;
            }
            if let Some(master) = &mut self.bufs.master {
                if stage == Stage::Zero0 {
                    master[full_at].copy_from_slice(&full);
                } else {
                    master[shard_at].copy_from_slice(&full[own]);
                }
            }
            if let Some(p) = &mut self.bufs.persistent[u] {
                convert(&self.exec, &full, P::of_mut(p)?)?;
            }
        }
        Ok(())
    }

    /// The partition layout (saved in checkpoints).
    pub fn layout(&self) -> &PartitionLayout {
        &self.layout
    }

    /// This rank's buffer plan (the dry run's numbers).
    pub fn plan(&self) -> &BufferPlan {
        &self.plan
    }

    /// The model's units and layers.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The configuration the engine runs.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The loss scaler's state.
    pub fn scaler(&self) -> &LossScaler {
        &self.scaler
    }

    /// Steps run so far (skipped included).
    pub fn steps_done(&self) -> u64 {
        self.step
    }

    /// AdamW steps applied so far.
    pub fn steps_applied(&self) -> u64 {
        self.applied
    }

    /// Bytes held per memory category, measured from the allocations.
    pub fn memory(&self) -> BTreeMap<MemCategory, u64> {
        self.bufs
            .measured_by_category(&self.plan, self.activation_bytes)
    }

    /// Every allocated buffer: (role, dtype, elements, bytes).
    pub fn allocations(&self) -> Vec<(crate::ledger::BufferRole, DType, usize, u64)> {
        self.bufs.measured()
    }

    /// The fp32 value of every parameter (unpadded, in layout order), gathered to every
    /// rank: for tests and for export. Allocates Ψ floats; not for the training loop.
    pub fn full_params_f32(&self) -> Result<Vec<f32>, EngineError> {
        match self.plan.param_dtype {
            DType::F32 => self.full_params_as::<f32>(),
            DType::BF16 => self.full_params_as::<half::bf16>(),
            DType::F16 => self.full_params_as::<half::f16>(),
            other => Err(EngineError::Internal(format!("parameter dtype {other}"))),
        }
    }

    /// The fp32 master of every parameter (unpadded, layout order), gathered to every
    /// rank; in fp32 training the parameters themselves.
    pub fn full_master_f32(&self) -> Result<Vec<f32>, EngineError> {
        let rank = self.comm.rank();
        let mut out = Vec::with_capacity(self.layout.numel());
        for unit in &self.layout.units {
            let mut buf = vec![0.0f32; unit.padded_len];
            let own = rank * unit.shard_len..(rank + 1) * unit.shard_len;
            let shard_at = unit.shard_offset..unit.shard_offset + unit.shard_len;
            let full_at = unit.unit_offset..unit.unit_offset + unit.padded_len;
            let src: &[f32] = match &self.bufs.master {
                Some(m) => m,
                None => f32::of(&self.bufs.params)?,
            };
            if self.config.zero.stage == Stage::Zero0 {
                buf.copy_from_slice(&src[full_at]);
            } else if self.bufs.master.is_some() || self.config.zero.stage == Stage::Zero3 {
                buf[own.clone()].copy_from_slice(&src[shard_at]);
                self.comm.all_gather_in_place(&mut buf[..])?;
            } else {
                // fp32 stages 1/2: the full parameter buffer is already current.
                buf.copy_from_slice(&src[full_at]);
            }
            out.extend_from_slice(&buf[..unit.numel]);
        }
        Ok(out)
    }

    fn full_params_as<P: Real>(&self) -> Result<Vec<f32>, EngineError> {
        let rank = self.comm.rank();
        let params = P::of(&self.bufs.params)?;
        let mut out = Vec::with_capacity(self.layout.numel());
        for unit in &self.layout.units {
            let mut buf = vec![P::default(); unit.padded_len];
            if self.config.zero.stage == Stage::Zero3 {
                let own = rank * unit.shard_len..(rank + 1) * unit.shard_len;
                buf[own].copy_from_slice(
                    &params[unit.shard_offset..unit.shard_offset + unit.shard_len],
                );
                self.comm.all_gather_in_place(&mut buf[..])?;
            } else {
                buf.copy_from_slice(&params[unit.unit_offset..unit.unit_offset + unit.padded_len]);
            }
            out.extend(buf[..unit.numel].iter().map(|x| x.to_f32()));
        }
        Ok(out)
    }
}

/// Split `buf` into disjoint mutable sub-slices at `ranges` (any order, non-overlapping),
/// returned in the order given.
pub(crate) fn disjoint_mut<'a, T>(
    buf: &'a mut [T],
    ranges: &[std::ops::Range<usize>],
) -> Result<Vec<&'a mut [T]>, EngineError> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| ranges[i].start);
    let mut out: Vec<Option<&'a mut [T]>> = (0..ranges.len()).map(|_| None).collect();
    let mut rest = buf;
    let mut at = 0;
    for i in order {
        let r = &ranges[i];
        if r.start < at || r.end > at + rest.len() || r.start > r.end {
            return Err(EngineError::Internal(format!(
                "overlapping or out-of-bounds ranges {ranges:?}"
            )));
        }
        let tail = std::mem::take(&mut rest);
        let (_, from_start) = tail.split_at_mut(r.start - at);
        let (piece, after) = from_start.split_at_mut(r.len());
        out[i] = Some(piece);
        rest = after;
        at = r.end;
    }
    out.into_iter()
        .map(|p| p.ok_or_else(|| EngineError::Internal("range not assigned".into())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::disjoint_mut;

    #[test]
    fn disjoint_mut_splits_in_given_order() {
        let mut v: Vec<u32> = (0..10).collect();
        let parts = disjoint_mut(&mut v, &[6..8, 0..2, 3..4]).unwrap();
        assert_eq!(
            parts.iter().map(|p| p.to_vec()).collect::<Vec<_>>(),
            vec![vec![6, 7], vec![0, 1], vec![3]]
        );
        assert!(disjoint_mut(&mut v, &[0..3, 2..4]).is_err());
        let past_end = [8..11, 0..1];
        assert!(disjoint_mut(&mut v, &past_end).is_err());
    }
}
