//! One plan point (N, stage): the engine's own ledgers, computed without allocating.
//!
//! Nothing here is a formula of its own: the configuration goes through
//! `PlanInputs::from_config` (as `Engine::new` does), the layout through
//! `PartitionLayout::new`, memory through `BufferPlan` (the buffers the engine
//! allocates), the paper's value and every difference through `Explanation`, traffic
//! through `CommPlan` and its alpha-beta `estimate_seconds`. This file only adds the
//! fit test (plan total vs usable memory) and the optional compute-time estimate.

use crate::config::Config;
use anyhow::Context as _;
use serde::Serialize;
use zero_core::config::{GradDtype, PrecisionConfig};
use zero_core::ledger::{
    paper_volume_psi, CommPlan, CommPurpose, Explanation, Links, PaperFormula,
};
use zero_core::plan::{BufferPlan, PlanInputs};
use zero_core::{PartitionLayout, Precision, Stage};

use super::model::PlanModel;

/// Engine knobs shared by every point of a plan.
#[derive(Clone, Debug)]
pub struct Knobs {
    /// Training precision.
    pub precision: Precision,
    /// Reduce 16-bit gradients in f32.
    pub reduce_f32: bool,
    /// Accumulate 16-bit gradients in f32.
    pub accumulate_f32: bool,
    /// Stages 2/3 accumulate full gradients locally and reduce once per step.
    pub reduce_once: bool,
    /// A.
    pub grad_accum: usize,
    /// B.
    pub micro_batch: usize,
    /// T (presets: checked against the context length by `Config::validate`).
    pub seq_len: usize,
    /// Bucket capacity, elements.
    pub bucket_elems: Option<usize>,
    /// Reuse distance, elements (`zero.reuse_distance`).
    pub reuse_distance: usize,
    /// Stage-3 prefetch, layers.
    pub prefetch: usize,
    /// Stage-3 persistence threshold, elements.
    pub persistence_threshold: usize,
    /// Shard alignment, elements.
    pub align: usize,
    /// Per-GPU memory, bytes.
    pub gpu_mem: u64,
    /// Fraction of `gpu_mem` kept free for what the ledger does not hold.
    pub headroom: f64,
    /// Alpha: seconds per ring step of a collective.
    pub alpha_s: f64,
    /// Beta: bytes per second each rank sends.
    pub beta_bytes_per_s: f64,
    /// A rank's bandwidth inside its node, bytes/s.
    pub intra_bytes_per_s: f64,
    /// A node's bandwidth to the others, bytes/s.
    pub inter_bytes_per_s: f64,
    /// L (None: one node of N).
    pub ranks_per_node: Option<usize>,
    /// qwZ (where the stage and precision allow it).
    pub quantize_weights: bool,
    /// hpZ (stage 3).
    pub hierarchical_weights: bool,
    /// qgZ (stages 1-3).
    pub quantize_grads: bool,
    /// Values per scale of the quantized switches.
    pub quant_block: usize,
    /// Bits per qgZ code.
    pub grad_quant_bits: usize,
    /// Sustained per-GPU TFLOP/s for the compute estimate, if given.
    pub tflops: Option<f64>,
}

impl Knobs {
    /// The `[precision]` section these knobs give.
    pub fn precision_config(&self) -> PrecisionConfig {
        PrecisionConfig {
            dtype: self.precision,
            grad_reduce_dtype: self.reduce_f32.then_some(GradDtype::F32),
            grad_accum_dtype: self.accumulate_f32.then_some(GradDtype::F32),
            ..PrecisionConfig::default()
        }
    }

    /// Bytes the plan may use: `gpu_mem x (1 - headroom)`, rounded down.
    pub fn usable_bytes(&self) -> u64 {
        (self.gpu_mem as f64 * (1.0 - self.headroom)).floor() as u64
    }

    /// The configuration the engine would run with at `stage`.
    pub fn config(&self, model: &PlanModel, stage: Stage) -> anyhow::Result<Config> {
        let mut c = Config::default();
        c.zero.stage = stage;
        c.zero.bucket_elems = self.bucket_elems;
        c.zero.reuse_distance = self.reuse_distance;
        c.zero.prefetch = self.prefetch;
        c.zero.persistence_threshold = self.persistence_threshold;
        c.zero.align = self.align;
        if self.reduce_once && stage >= Stage::Zero2 {
            c.zero.reduce_every_micro_step = Some(false);
        }
        c.precision = self.precision_config();
        // The switches where they apply at this stage (as `--stage auto` does).
        c.zero.quantize_weights = self.quantize_weights
            && stage >= Stage::Zero1
            && (stage == Stage::Zero3 || self.precision != Precision::Fp32);
        c.zero.hierarchical_weights = self.hierarchical_weights && stage == Stage::Zero3;
        c.zero.quantize_grads = self.quantize_grads && stage >= Stage::Zero1;
        c.zero.quant_block = self.quant_block;
        c.zero.grad_quant_bits = self.grad_quant_bits;
        c.zero.ranks_per_node = self.ranks_per_node.unwrap_or(0);
        c.train.grad_accum = self.grad_accum;
        c.train.micro_batch = self.micro_batch;
        c.train.seq_len = self.seq_len;
        // A preset is a model the config knows: validate the whole configuration as a
        // run would. A synthetic model has no [model] section; its knobs were checked
        // when the command line was parsed.
        if model.preset.is_some() {
            c.model.preset = Some(model.name.clone());
            c.validate()
                .with_context(|| format!("the configuration of {stage} is invalid"))?;
        }
        Ok(c)
    }
}

/// One memory category of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct CategoryBytes {
    /// `params`, `grads`, ... (`MemCategory::name`).
    pub category: &'static str,
    /// Bytes on the reported rank.
    pub bytes: u64,
}

/// One difference between plan and formula.
#[derive(Clone, Debug, Serialize)]
pub struct DifferenceOut {
    /// Category the bytes belong to.
    pub category: &'static str,
    /// Plan minus formula for this reason (may be fractional, may be negative).
    pub bytes: f64,
    /// Why.
    pub reason: String,
}

/// One collective's traffic per step.
#[derive(Clone, Debug, Serialize)]
pub struct CommOut {
    /// `all_reduce`, `reduce_scatter`, `all_gather`, `all_to_all`.
    pub collective: &'static str,
    /// `grads`, `params_after_step`, `gather_forward`, `gather_backward`.
    pub purpose: &'static str,
    /// `world`, `node`, `cross`: the group it runs on.
    pub group: &'static str,
    /// Its alpha-beta seconds per step.
    pub seconds: f64,
    /// Wire element type.
    pub dtype: String,
    /// Calls per step.
    pub calls: u64,
    /// Sum of the calls' full buffer sizes, elements.
    pub elems: u64,
    /// Bytes each rank sends per step (and receives).
    pub sent_bytes: u64,
}

/// Everything reported for one (N, stage).
#[derive(Clone, Debug, Serialize)]
pub struct PointReport {
    /// N.
    pub world: usize,
    /// Stage 0-3.
    pub stage: usize,
    /// The rank whose ledger is reported (N - 1: its shards hold the units' padding;
    /// every rank's total is the same).
    pub rank: usize,
    /// The ZeRO formula for this stage at the plan's precision (`4Ψ + 4Ψ + 8Ψ/N` for
    /// fp32 stage 1: no master copy).
    pub formula: &'static str,
    /// Its model-state bytes per GPU.
    pub formula_bytes: f64,
    /// The paper's mixed-precision expression (K = 12), the same as `formula` for
    /// bf16/fp16.
    pub paper_formula: &'static str,
    /// Its bytes per GPU.
    pub paper_formula_bytes: f64,
    /// The plan: every buffer the engine allocates plus the activation arena.
    pub plan_bytes: u64,
    /// Bytes the plan may use (`gpu_mem x (1 - headroom)`).
    pub usable_bytes: u64,
    /// `plan_bytes <= usable_bytes`.
    pub fits: bool,
    /// The plan by category.
    pub categories: Vec<CategoryBytes>,
    /// Plan minus formula, reason by reason (they sum to `plan_bytes - formula_bytes`).
    pub differences: Vec<DifferenceOut>,
    /// Traffic per optimizer step, per collective.
    pub comm: Vec<CommOut>,
    /// L: ranks per node.
    pub ranks_per_node: usize,
    /// Bytes leaving each node per step (0 on one node).
    pub node_egress_bytes: u64,
    /// Bytes each rank sends per step over all data collectives.
    pub comm_sent_bytes: u64,
    /// the volume of docs/ARCHITECTURE.md's table: k Ψ (N-1)/N elements (k = 2, A+1, 3A or 2A+1), unpadded.
    pub paper_comm_elems: f64,
    /// Alpha-beta estimate of the communication time per step, seconds, no overlap.
    pub est_comm_seconds: f64,
    /// Its latency part (calls x ring steps x alpha), seconds.
    pub est_comm_latency_seconds: f64,
    /// Compute time per step from `--tflops`, seconds.
    pub est_compute_seconds: Option<f64>,
    /// The ledger as the engine prints it (`BufferPlan::render`).
    #[serde(skip)]
    pub plan_text: String,
    /// `Explanation::render`.
    #[serde(skip)]
    pub explanation_text: String,
}

fn purpose_name(p: CommPurpose) -> &'static str {
    match p {
        CommPurpose::Grads => "grads",
        CommPurpose::ParamsAfterStep => "params_after_step",
        CommPurpose::GatherForward => "gather_forward",
        CommPurpose::GatherBackward => "gather_backward",
    }
}

/// Plan one point on an already built layout (N = `layout.world`).
pub fn plan_point(
    model: &PlanModel,
    layout: &PartitionLayout,
    knobs: &Knobs,
    stage: Stage,
) -> anyhow::Result<PointReport> {
    let n = layout.world;
    let config = knobs.config(model, stage)?;
    // N <= L GPUs fit on one node.
    let l = knobs.ranks_per_node.map_or(n, |l| l.min(n));
    if !n.is_multiple_of(l) {
        anyhow::bail!(
            "--ranks-per-node {l} does not divide --gpus {n} into whole nodes; give GPU counts that are multiples of it (or at most {l})"
        );
    }
    let inputs = PlanInputs::from_config(&config.engine(), n, model.activation_bytes).on_nodes(l);
    let rank = n - 1;
    let plan = BufferPlan::new(&model.spec, layout, &inputs, rank)
        .with_context(|| format!("planning {stage} on N = {n}"))?;
    let expl = Explanation::new(&plan);
    let paper = PaperFormula::new(stage, plan.numel, n);
    let comm = CommPlan::new(layout, &plan, knobs.grad_accum);

    let links = Links {
        alpha_s: knobs.alpha_s,
        intra_bytes_per_s: knobs.intra_bytes_per_s,
        inter_bytes_per_s: knobs.inter_bytes_per_s,
    };
    let latency: f64 = comm
        .lines
        .iter()
        .map(|line| {
            let g = comm.group_size(line.group);
            (line.calls * line.collective.ring_steps(g) as u64) as f64 * knobs.alpha_s
        })
        .sum();
    let est_compute_seconds = knobs.tflops.map(|tf| {
        // Every GPU runs A micro-steps of B x T tokens per optimizer step.
        let tokens = (knobs.grad_accum * knobs.micro_batch * knobs.seq_len) as f64;
        model.flops_per_token * tokens / (tf * 1e12)
    });
    let plan_bytes = plan.total_bytes();
    let usable = knobs.usable_bytes();
    Ok(PointReport {
        world: n,
        stage: stage.number(),
        rank,
        formula: expl.formula.expression(),
        formula_bytes: expl.formula.total().to_f64(),
        paper_formula: paper.expression(),
        paper_formula_bytes: paper.total().to_f64(),
        plan_bytes,
        usable_bytes: usable,
        fits: plan_bytes <= usable,
        categories: plan
            .by_category()
            .into_iter()
            .map(|(c, bytes)| CategoryBytes {
                category: c.name(),
                bytes,
            })
            .collect(),
        differences: expl
            .items
            .iter()
            .map(|d| DifferenceOut {
                category: d.category.name(),
                bytes: d.bytes.to_f64(),
                reason: d.reason.clone(),
            })
            .collect(),
        comm: comm
            .lines
            .iter()
            .map(|l| CommOut {
                collective: l.collective.name(),
                purpose: purpose_name(l.purpose),
                group: l.group.name(),
                seconds: comm.line_seconds(l, &links),
                dtype: l.dtype.to_string(),
                calls: l.calls,
                elems: l.elems,
                sent_bytes: l.sent_bytes,
            })
            .collect(),
        comm_sent_bytes: comm.sent_bytes(),
        ranks_per_node: l,
        node_egress_bytes: comm.node_egress_bytes(),
        paper_comm_elems: paper_volume_psi(stage, knobs.grad_accum, inputs.reduce_every_micro_step)
            as f64
            * model.numel as f64
            * (n - 1) as f64
            / n as f64,
        est_comm_seconds: comm.estimate_seconds_on(&links),
        est_comm_latency_seconds: latency,
        est_compute_seconds,
        plan_text: plan.render(),
        explanation_text: expl.render(),
    })
}
