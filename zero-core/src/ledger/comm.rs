//! The communication ledger: elements and bytes each rank sends (and receives) per
//! optimizer step, per collective, for a stage, N, A and reduce policy, from padded
//! sizes, so a test can hold the engine's measured bytes against it exactly.
//!
//! Ring algorithms (docs/ARCHITECTURE.md): for a collective over a buffer of E elements (the full,
//! gathered size), every rank sends and receives (N-1)/N x E for reduce-scatter and
//! all-gather, 2(N-1)/N x E for all-reduce. Padded unit lengths are multiples of N, so
//! every count is a whole number. Per step, with A micro-steps, padded Ψ = Ψp,
//! non-persistent padded Ψ = Ψg and persistent padded Ψ = Ψs (stage 3):
//!
//! ```text
//! stage  reduce every micro-step                  accumulate locally, reduce once
//! 0      -                                        all-reduce Ψp (W)
//! 1      -                                        reduce-scatter Ψp (W) + all-gather Ψp (P)
//! 2      reduce-scatter AΨp (W) + all-gather Ψp    as stage 1
//! 3      all-gather AΨg fwd + AΨg bwd (P)          all-gather 2AΨg (P) + reduce-scatter Ψp (W)
//!        + reduce-scatter AΨp (W) + all-gather Ψs  + all-gather Ψs (P)
//! ```
//!
//! With quantized gathers (qwZ, `zero.quantize_weights`), each stage-3 gather of a unit
//! of padded length E moves E int8 codes and N x ceil(E / N / B) f32 scales instead of E
//! values of P, in two all-gathers.
//!
//! The table holds when every unit has one use. A unit released between uses
//! (zero-core/src/plan/uses.rs) adds, per extra use, one gather of it per pass at stage
//! 3 and one reduce-scatter per micro-step with sharded gradients: the plan counts them.
//!
//! Calls follow the engine: gradient reductions in bucket-sized chunks per unit (stage 0
//! in place, one call per unit, when no conversion is needed), stage-1/2 parameter
//! gathers and stage-3 gathers one call per unit and use. Every stage also all-reduces 3 f64
//! (squared norm, overflow flag, loss sum) once per step to agree on clipping, skipping
//! and the reported loss: [`CommPlan::control`], outside the volume formulas.

use zero_kernels::DType;

use crate::config::Stage;
use crate::layout::PartitionLayout;
use crate::plan::BufferPlan;

/// A collective kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collective {
    /// All-reduce (sum).
    AllReduce,
    /// Reduce-scatter (sum), equal blocks.
    ReduceScatter,
    /// All-gather, equal blocks.
    AllGather,
}

impl Collective {
    /// Sequential ring steps of one call on N ranks.
    pub fn ring_steps(self, world: usize) -> usize {
        let s = world.saturating_sub(1);
        match self {
            Collective::AllReduce => 2 * s,
            _ => s,
        }
    }
}

/// Why the bytes move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommPurpose {
    /// Gradient reduction.
    Grads,
    /// Updated parameters gathered after the step (stages 1/2: all; stage 3: persistent
    /// units).
    ParamsAfterStep,
    /// Stage 3 gathers before each forward layer.
    GatherForward,
    /// Stage 3 gathers before each backward layer.
    GatherBackward,
}

/// One collective's traffic per optimizer step, on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommLine {
    /// Kind.
    pub collective: Collective,
    /// Purpose.
    pub purpose: CommPurpose,
    /// Element type on the wire.
    pub dtype: DType,
    /// Calls per step.
    pub calls: u64,
    /// Sum over calls of the full (gathered) buffer size in elements.
    pub elems: u64,
    /// Bytes each rank sends per step (ring): elems x size x (N-1)/N, twice for
    /// all-reduce. Each rank receives as many.
    pub sent_bytes: u64,
}

/// Small all-reduce outside the volume formulas (clip norm and overflow agreement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlLine {
    /// Calls per step.
    pub calls: u64,
    /// Elements per call.
    pub elems: u64,
    /// Element type.
    pub dtype: DType,
}

/// Traffic of one optimizer step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommPlan {
    /// N.
    pub world: usize,
    /// A: micro-steps per optimizer step.
    pub grad_accum: usize,
    /// Data collectives.
    pub lines: Vec<CommLine>,
    /// Norm/overflow agreement (stages 1-3).
    pub control: Option<ControlLine>,
}

impl CommPlan {
    /// The traffic of `plan`'s configuration with A = `grad_accum` micro-steps.
    pub fn new(layout: &PartitionLayout, plan: &BufferPlan, grad_accum: usize) -> CommPlan {
        let n = layout.world;
        let a = grad_accum as u64;
        let stage = plan.inputs.stage;
        let (p, w) = (plan.param_dtype, plan.inputs.reduce_dtype);
        // Per-unit chunk counts for bucketed collectives.
        let chunked = |us: &mut dyn Iterator<Item = usize>| -> (u64, u64) {
            us.fold((0, 0), |(c, e), u| {
                let unit = &layout.units[u];
                (
                    c + plan.shard_chunks(unit.shard_len).len() as u64,
                    e + unit.padded_len as u64,
                )
            })
        };
        let all = || 0..layout.units.len();
        let mut lines = Vec::new();
        let mut line = |collective, purpose, dtype, calls: u64, elems: u64| {
            if elems == 0 {
                return;
            }
            let factor = collective_factor(collective);
            lines.push(CommLine {
                collective,
                purpose,
                dtype,
                calls,
                elems,
                sent_bytes: elems * dtype.size_bytes() as u64 * factor * (n as u64 - 1) / n as u64,
            });
        };
        use Collective::*;
        use CommPurpose::*;
        // Sharded gradients reduce every micro-step, each unit once per use; else once a
        // step.
        let uses = |u: usize| plan.uses[u].len().max(1) as u64;
        let reduced = || -> (u64, u64) {
            if !plan.grads_sharded {
                return chunked(&mut all());
            }
            let (c, e) = (0..layout.units.len()).fold((0, 0), |(c, e), u| {
                let (cu, eu) = chunked(&mut std::iter::once(u));
                (c + cu * uses(u), e + eu * uses(u))
            });
            (c * a, e * a)
        };
        match stage {
            Stage::Zero0 => {
                // In place, one call per unit, when no conversion is needed (W = P);
                // else bucket-sized chunks converted to W.
                let calls = layout
                    .units
                    .iter()
                    .map(|u| {
                        if w == p {
                            1
                        } else {
                            plan.full_chunks(u.padded_len).len() as u64
                        }
                    })
                    .sum();
                line(AllReduce, Grads, w, calls, layout.padded_numel() as u64);
            }
            Stage::Zero1 | Stage::Zero2 => {
                let (calls, elems) = reduced();
                line(ReduceScatter, Grads, w, calls, elems);
                let (_, elems) = chunked(&mut all());
                // Updated parameters: one in-place all-gather per unit.
                line(
                    AllGather,
                    ParamsAfterStep,
                    p,
                    layout.units.len() as u64,
                    elems,
                );
            }
            Stage::Zero3 => {
                let (mut s_calls, mut s_elems) = (0, 0);
                for (u, unit) in layout.units.iter().enumerate() {
                    if plan.persistent[u] {
                        s_calls += 1;
                        s_elems += unit.padded_len as u64;
                    }
                }
                // Gathers as the schedule issues them (once per use and pass).
                let gathers = |pass: &[crate::plan::PassStep]| -> (u64, u64) {
                    pass.iter()
                        .flat_map(|s| &s.gather)
                        .fold((0, 0), |(c, e), &u| {
                            (c + 1, e + layout.units[u].padded_len as u64)
                        })
                };
                if let Some(g) = &plan.gather {
                    for (pass, purpose) in
                        [(&g.forward, GatherForward), (&g.backward, GatherBackward)]
                    {
                        let (calls, elems) = gathers(pass);
                        match plan.inputs.quant_block {
                            None => line(AllGather, purpose, p, a * calls, a * elems),
                            // qwZ: the codes (a byte a value) and, per shard, one f32
                            // scale per block, in two all-gathers.
                            Some(block) => {
                                line(AllGather, purpose, DType::U8, a * calls, a * elems);
                                let scales =
                                    pass.iter().flat_map(|s| &s.gather).fold(0, |e, &u| {
                                        let shard = layout.units[u].shard_len;
                                        e + (n * zero_kernels::quant::scale_count(shard, block))
                                            as u64
                                    });
                                line(AllGather, purpose, DType::F32, a * calls, a * scales);
                            }
                        }
                    }
                }
                let (calls, elems) = reduced();
                line(ReduceScatter, Grads, w, calls, elems);
                line(AllGather, ParamsAfterStep, p, s_calls, s_elems);
            }
        }
        CommPlan {
            world: n,
            grad_accum,
            lines,
            // Every stage agrees on (squared norm, overflow flag, loss sum) in f64.
            control: Some(ControlLine {
                calls: 1,
                elems: 3,
                dtype: DType::F64,
            }),
        }
    }

    /// Bytes each rank sends per step over all data collectives (and receives as many).
    pub fn sent_bytes(&self) -> u64 {
        self.lines.iter().map(|l| l.sent_bytes).sum()
    }

    /// Bytes sent per step by one kind of collective.
    pub fn sent_bytes_of(&self, c: Collective) -> u64 {
        self.lines
            .iter()
            .filter(|l| l.collective == c)
            .map(|l| l.sent_bytes)
            .sum()
    }

    /// Alpha-beta estimate of the communication time of one step, in seconds, if no
    /// collective overlaps compute: every ring step of every call costs `alpha_s`, every
    /// byte sent costs `1 / beta_bytes_per_s`.
    pub fn estimate_seconds(&self, alpha_s: f64, beta_bytes_per_s: f64) -> f64 {
        self.lines
            .iter()
            .map(|l| {
                (l.calls as f64) * (l.collective.ring_steps(self.world) as f64) * alpha_s
                    + l.sent_bytes as f64 / beta_bytes_per_s
            })
            .sum()
    }
}

fn collective_factor(c: Collective) -> u64 {
    match c {
        Collective::AllReduce => 2,
        _ => 1,
    }
}

/// the volume of docs/ARCHITECTURE.md's table per step in units of Ψ, before the (N-1)/N x element size factor:
/// 2 (stages 0-2 reducing once), A + 1 (stage 2 reducing every micro-step), 3A (stage 3
/// reducing every micro-step), 2A + 1 (stage 3 accumulating locally).
pub fn paper_volume_psi(stage: Stage, grad_accum: usize, reduce_every_micro_step: bool) -> usize {
    let a = grad_accum;
    match (stage, reduce_every_micro_step) {
        (Stage::Zero0 | Stage::Zero1, _) | (Stage::Zero2, false) => 2,
        (Stage::Zero2, true) => a + 1,
        (Stage::Zero3, true) => 3 * a,
        (Stage::Zero3, false) => 2 * a + 1,
    }
}
