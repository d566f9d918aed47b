//! What the engine is configured with: only what ZeRO needs, [`EngineConfig`] (stage and
//! its buffers, precision and loss scaling, AdamW and its schedule, gradient
//! accumulation, the initialisation seed), validated in one place
//! ([`EngineConfig::validate`], every problem reported at once with its numbers).
//!
//! The application's own settings (the model, the data, how many steps to run, logging)
//! are its business: `zero-bench` reads a TOML file with `[zero]`, `[precision]` and
//! `[optim]` sections that are these types, beside sections of its own.

use serde::{Deserialize, Serialize};
use zero_kernels::DType;

#[cfg(test)]
mod tests;
mod validate;

/// Values that are out of range or do not go together: one line per problem, each with
/// the offending numbers and what to do.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  - {}", problems.join("\n  - "))]
pub struct ConfigError {
    /// Each problem.
    pub problems: Vec<String>,
}

/// Everything the ZeRO engine is configured with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// ZeRO stage and its buffers.
    pub zero: ZeroConfig,
    /// Mixed precision and loss scaling.
    pub precision: PrecisionConfig,
    /// AdamW and the learning-rate schedule.
    pub optim: OptimConfig,
    /// What a diverging loss (non-finite, or a spike) does.
    pub divergence: DivergenceConfig,
    /// A: micro-batches accumulated per optimizer step (each rank passes this many to
    /// [`crate::Engine::step`]).
    pub grad_accum: usize,
    /// Seed of the parameters' initialisation (the same on every rank, so every world
    /// size and stage starts from the same model).
    pub seed: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            zero: ZeroConfig::default(),
            precision: PrecisionConfig::default(),
            optim: OptimConfig::default(),
            divergence: DivergenceConfig::default(),
            grad_accum: 1,
            seed: 1337,
        }
    }
}

/// ZeRO stage: what is partitioned across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub enum Stage {
    /// Plain data parallel (all-reduce of full gradients), the baseline.
    Zero0,
    /// Optimizer states (fp32 master, m, v) partitioned.
    Zero1,
    /// + gradients partitioned.
    Zero2,
    /// + parameters partitioned.
    Zero3,
}

impl Stage {
    /// All stages, in order.
    pub const ALL: [Stage; 4] = [Stage::Zero0, Stage::Zero1, Stage::Zero2, Stage::Zero3];

    /// The stage number 0-3.
    pub const fn number(self) -> usize {
        match self {
            Stage::Zero0 => 0,
            Stage::Zero1 => 1,
            Stage::Zero2 => 2,
            Stage::Zero3 => 3,
        }
    }
}

impl TryFrom<i64> for Stage {
    type Error = String;
    fn try_from(v: i64) -> Result<Self, String> {
        match v {
            0 => Ok(Stage::Zero0),
            1 => Ok(Stage::Zero1),
            2 => Ok(Stage::Zero2),
            3 => Ok(Stage::Zero3),
            _ => Err(format!(
                "zero.stage = {v} is not a ZeRO stage; use 0, 1, 2 or 3"
            )),
        }
    }
}

impl From<Stage> for i64 {
    fn from(s: Stage) -> i64 {
        s.number() as i64
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZeRO-{}", self.number())
    }
}

/// `[zero]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZeroConfig {
    /// 0 (data parallel), 1 (optimizer states), 2 (+ gradients), 3 (+ parameters).
    pub stage: Stage,
    /// Stages 2/3: reduce-scatter gradients at every micro-step (true: lean in memory)
    /// or accumulate full gradients locally and reduce once per step (false: lean in
    /// communication). Unset: true for stages 2/3, false for 0/1 (which must be false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reduce_every_micro_step: Option<bool>,
    /// Capacity of each of the two gradient-reduction buckets, in elements (rounded up
    /// to a multiple of N x align and capped at the largest unit). Unset: a memory
    /// budget that grows with N, [`ZeroConfig::bucket_elems_for`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket_elems: Option<usize>,
    /// Stage 3: layers whose units are gathered ahead of the one computing.
    pub prefetch: usize,
    /// Stage 3: units with fewer elements than this stay gathered (not partitioned for
    /// compute; updated by one all-gather per step). 0: none.
    pub persistence_threshold: usize,
    /// A unit used again later (a tied table) stays resident in between, gathered and,
    /// with sharded gradients, accumulating its gradient, when the layers in between use
    /// at most this many elements of other units; beyond that it is released: gathered
    /// again and its gradient reduced after each use (see zero-core/src/plan/uses.rs).
    /// 0: release every unit between uses; `usize::MAX`: keep every unit.
    pub reuse_distance: usize,
    /// Shard alignment in elements (32 = 64 bytes for 16-bit elements).
    pub align: usize,
    /// Gather parameters as block-wise int8 codes plus one f32 scale per `quant_block`
    /// values (ZeRO++'s qwZ, Wang et al. 2023): stage 3's gathers before each layer, or
    /// stages 1/2's gather of the updated parameters (16-bit training only: in fp32 those
    /// are the master). About a quarter of fp32's bytes, half of bf16's. Only the
    /// gathered compute copy is rounded; the master weights and the optimizer stay
    /// exact. Off by default.
    pub quantize_weights: bool,
    /// Values per scale of quantized communication (`zero_kernels::quant`).
    pub quant_block: usize,
    /// Stage 3: keep a second copy of the gathered 16-bit (or f32) weights partitioned
    /// over the ranks of each node, and gather the backward's units from it inside the
    /// node (ZeRO++'s hpZ, Wang et al. 2023, section 4.2): no backward gather crosses
    /// nodes, for at most Ψ/L more parameter memory per rank (L ranks per node). Needs the node
    /// groups (`Engine::on_nodes`). Off by default.
    pub hierarchical_weights: bool,
    /// Reduce gradients (the reduce-scatter of stages 1-3) as block-wise int8 codes in
    /// two all-to-alls, inside the node and then across nodes, dequantizing and summing
    /// in f32 after each (ZeRO++'s qgZ, section 4.3); one f32 scale per `quant_block`
    /// values. Needs the node groups (`Engine::on_nodes`). Off by default.
    pub quantize_grads: bool,
    /// Bits per gradient code of qgZ: 8 (int8) or 4 (int4, two codes a byte, one f32
    /// scale per `quant_block` values: half the code bytes, 8/7 x 127/7 = 18x coarser
    /// steps). int4 needs an even `quant_block`.
    pub grad_quant_bits: usize,
    /// Ranks per node for the hierarchical switches: 0 finds the nodes from the launch
    /// (the Slurm node of each rank inside an srun step, else MPI's shared-memory
    /// split); L > 0 makes nodes of L consecutive ranks (emulating nodes on one host).
    /// A plan made without a launch (`plan`, `train --dry-run` outside mpirun/srun)
    /// takes 0 as one node of all ranks.
    pub ranks_per_node: usize,
}

impl Default for ZeroConfig {
    fn default() -> Self {
        ZeroConfig {
            stage: Stage::Zero2,
            reduce_every_micro_step: None,
            bucket_elems: None,
            prefetch: 1,
            persistence_threshold: 0,
            reuse_distance: DEFAULT_REUSE_DISTANCE,
            align: crate::layout::DEFAULT_ALIGN,
            quantize_weights: false,
            quant_block: zero_kernels::quant::DEFAULT_BLOCK,
            hierarchical_weights: false,
            quantize_grads: false,
            grad_quant_bits: 8,
            ranks_per_node: 0,
        }
    }
}

/// The default bucket: 4Mi elements (8 MiB of bf16), or 64Ki elements per rank when
/// that is more, so that the piece a rank receives from a reduce-scatter stays >= 64Ki
/// elements (128 KiB of bf16) at any N and messages stay bandwidth-bound.
pub const DEFAULT_BUCKET_ELEMS: usize = 1 << 22;
/// The smallest piece per rank the default bucket keeps.
pub const MIN_PIECE_ELEMS: usize = 1 << 16;
/// The default reuse distance, 4Mi elements: a gap of a few layers of a small model
/// keeps the unit (no extra traffic, and stages agree bit for bit with stage 0); a gap
/// of tens of millions of parameters (a table tied between the first and the last layer
/// of a model of a hundred million parameters or more) releases it.
pub const DEFAULT_REUSE_DISTANCE: usize = 1 << 22;

impl ZeroConfig {
    /// The effective reduce policy (the default follows the stage).
    pub fn reduce_every_micro_step(&self) -> bool {
        self.reduce_every_micro_step
            .unwrap_or(self.stage >= Stage::Zero2)
    }

    /// Whether a switch needs the node groups (hpZ or qgZ).
    pub fn hierarchical(&self) -> bool {
        self.hierarchical_weights || self.quantize_grads
    }

    /// The bucket capacity on `world` ranks: the configured one, or the default budget
    /// `max(4Mi, 64Ki x N)` elements.
    pub fn bucket_elems_for(&self, world: usize) -> usize {
        self.bucket_elems
            .unwrap_or_else(|| DEFAULT_BUCKET_ELEMS.max(MIN_PIECE_ELEMS.saturating_mul(world)))
    }
}

/// Training precision of parameters and gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// fp32 everywhere; the parameters are the master weights.
    Fp32,
    /// bf16 parameters and gradients, fp32 master, m, v.
    Bf16,
    /// fp16 parameters and gradients with dynamic loss scaling, fp32 master, m, v.
    Fp16,
}

impl Precision {
    /// Element type of the working parameters and gradients.
    pub const fn param_dtype(self) -> DType {
        match self {
            Precision::Fp32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::Fp16 => DType::F16,
        }
    }
}

/// Element type of a gradient sum in 16-bit training: the accumulator the micro-steps
/// add into (`precision.grad_accum_dtype`) or the reduction across ranks
/// (`precision.grad_reduce_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GradDtype {
    /// The 16-bit parameter type (a reduction sums it with a user-defined op).
    Half,
    /// fp32: twice the bytes, a sum rounded to 24 bits instead of 8 (bf16) or 11 (fp16).
    F32,
}

/// `[precision]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrecisionConfig {
    /// fp32 | bf16 | fp16.
    pub dtype: Precision,
    /// The dtype gradients are reduced across ranks in: half | f32. Unset: half for
    /// bf16/fp16, f32 for fp32 (where half is an error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_reduce_dtype: Option<GradDtype>,
    /// The dtype of the gradient accumulator the micro-steps add into: half | f32.
    /// Unset: half for bf16/fp16 (the ZeRO paper's 2 bytes a parameter; each of the A
    /// micro-steps rounds the running sum), f32 for fp32 (where half is an error). "f32"
    /// keeps the sum in fp32 (DeepSpeed's `grad_accum_dtype`) for 2 more bytes a
    /// parameter; with `grad_reduce_dtype = "f32"` too, the reductions are f32 as well
    /// (Megatron's `--accumulate-allreduce-grads-in-fp32`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_accum_dtype: Option<GradDtype>,
    /// Dynamic loss scaling. Unset: on for fp16 (required), off otherwise (only fp16
    /// may use it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scaling: Option<bool>,
    /// Initial loss scale.
    pub initial_scale: f64,
    /// Factor the scale grows by after `growth_interval` clean steps.
    pub growth_factor: f64,
    /// Clean (non-overflowing) steps before the scale grows.
    pub growth_interval: usize,
    /// Factor the scale shrinks by on overflow.
    pub backoff_factor: f64,
    /// Overflows tolerated before the scale shrinks (each overflowing step is skipped).
    pub hysteresis: usize,
    /// The scale never goes below this.
    pub min_scale: f64,
    /// Steps in a row that may overflow at `min_scale` before training stops with an
    /// error: at the floor, skipping more steps makes no progress.
    pub max_skips_at_min_scale: usize,
}

impl Default for PrecisionConfig {
    fn default() -> Self {
        PrecisionConfig {
            dtype: Precision::Bf16,
            grad_reduce_dtype: None,
            grad_accum_dtype: None,
            loss_scaling: None,
            initial_scale: 65536.0,
            growth_factor: 2.0,
            growth_interval: 1000,
            backoff_factor: 0.5,
            hysteresis: 2,
            min_scale: 1.0,
            max_skips_at_min_scale: 100,
        }
    }
}

impl PrecisionConfig {
    /// Element type gradients travel in (resolved default).
    pub fn reduce_dtype(&self) -> DType {
        match (self.dtype, self.grad_reduce_dtype) {
            (Precision::Fp32, _) | (_, Some(GradDtype::F32)) => DType::F32,
            (p, _) => p.param_dtype(),
        }
    }

    /// Element type of the gradient accumulator (resolved default).
    pub fn grad_dtype(&self) -> DType {
        match (self.dtype, self.grad_accum_dtype) {
            (Precision::Fp32, _) | (_, Some(GradDtype::F32)) => DType::F32,
            (p, _) => p.param_dtype(),
        }
    }

    /// Whether dynamic loss scaling is on (resolved default).
    pub fn loss_scaling(&self) -> bool {
        self.loss_scaling.unwrap_or(self.dtype == Precision::Fp16)
    }
}

/// What happens when the loss diverges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivergencePolicy {
    /// Log the step and go on (the count is in [`crate::Engine::divergences`]).
    Warn,
    /// Stop with [`crate::EngineError::Diverged`], the step not applied.
    Stop,
    /// Do not apply the step (on every rank), log it, and go on.
    SkipStep,
}

/// `[divergence]`: the loss guard. A step's loss diverges when it is not finite, or
/// above `spike_factor` times the median of the last `window` losses (once
/// min(10, window) are known; skipped steps' losses are left out of the median). The
/// spike test needs a positive median (a cross-entropy, a squared error): against a
/// median at or below 0 (a loss that may be negative) no step is a spike, and
/// `spike_factor = 0` turns the test off; non-finite losses are always caught.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DivergenceConfig {
    /// warn | stop | skip_step.
    pub policy: DivergencePolicy,
    /// A loss above this multiple of the recent (positive) median is a spike; 0: no
    /// spike test.
    pub spike_factor: f64,
    /// Losses the median is taken over.
    pub window: usize,
    /// `skip_step`: steps in a row that may be skipped for their loss before training
    /// stops with an error (a lasting shift of the loss would skip every step).
    pub max_consecutive_skips: usize,
}

impl Default for DivergenceConfig {
    fn default() -> Self {
        DivergenceConfig {
            policy: DivergencePolicy::Warn,
            spike_factor: 3.0,
            window: 50,
            max_consecutive_skips: 20,
        }
    }
}

/// Learning-rate schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// `lr` at every step.
    Constant,
    /// Linear warmup over `warmup_steps`, then cosine decay to `min_lr` at the last step.
    WarmupCosine,
}

/// `[optim]`: AdamW as torch.optim.AdamW computes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// (beta1, beta2).
    pub betas: [f64; 2],
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay (2-D tensors only).
    pub weight_decay: f64,
    /// Clip the global gradient norm to this; 0 disables clipping.
    pub grad_clip: f64,
    /// constant | warmup_cosine.
    pub schedule: Schedule,
    /// warmup_cosine: steps of linear warmup.
    pub warmup_steps: usize,
    /// warmup_cosine: learning rate at the last step.
    pub min_lr: f64,
    /// warmup_cosine: the step at which the learning rate has decayed to `min_lr` (the
    /// run's length; `zero-bench train` sets it to `train.steps` unless given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay_steps: Option<usize>,
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            lr: 1e-3,
            betas: [0.9, 0.95],
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            schedule: Schedule::Constant,
            warmup_steps: 0,
            min_lr: 0.0,
            decay_steps: None,
        }
    }
}

impl OptimConfig {
    /// Learning rate of step `step` (0-based) (the usual warmup-cosine schedule: warmup
    /// `lr * (step + 1) / warmup`, then `min_lr + 0.5 (1 + cos(pi r)) (lr - min_lr)` with
    /// r the fraction of the decay to `decay_steps` done, held at `min_lr` after it).
    pub fn lr_at(&self, step: usize) -> f64 {
        let total_steps = self.decay_steps.unwrap_or(step);
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::WarmupCosine => {
                if step < self.warmup_steps {
                    return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
                }
                let decay_steps = total_steps.saturating_sub(self.warmup_steps).max(1);
                let r = ((step - self.warmup_steps) as f64 / decay_steps as f64).min(1.0);
                let coeff = 0.5 * (1.0 + (std::f64::consts::PI * r).cos());
                self.min_lr + coeff * (self.lr - self.min_lr)
            }
        }
    }
}
