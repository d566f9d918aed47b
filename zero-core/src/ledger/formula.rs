//! The ZeRO paper's model-state formula (Rajbhandari et al., SC'20, section 5 / figure 1:
//! mixed-precision Adam, 2 bytes of parameters + 2 of gradients + K = 12 of fp32 master,
//! m and v per parameter), the same accounting for fp32 training (4-byte parameters and
//! gradients, no separate master: K = 8), and the explanation of every byte by which a
//! [`BufferPlan`] differs from the formula of its precision.
//!
//! ```text
//!            mixed precision (bf16, fp16)     fp32
//! stage 0:   2Ψ + 2Ψ + 12Ψ                    4Ψ + 4Ψ + 8Ψ
//! stage 1:   2Ψ + 2Ψ + 12Ψ/N                  4Ψ + 4Ψ + 8Ψ/N
//! stage 2:   2Ψ + (2 + 12)Ψ/N                 4Ψ + (4 + 8)Ψ/N
//! stage 3:   (2 + 2 + 12)Ψ/N                  (4 + 4 + 8)Ψ/N
//! ```
//!
//! Invariant: `plan.total_bytes() - formula.total() == sum of the explanation items`,
//! exactly (fractions, since Ψ/N need not be whole). Per model-state category the
//! difference splits into: element type (a buffer of another type than the formula
//! counts), extent (full gradients held by stages 2/3 accumulating locally), and
//! partition padding; every other buffer (persistent units, gather slots, compute
//! windows, buckets) and the activation arena is an item of its own.

use std::fmt::Write as _;

use super::frac::{human_bytes, Frac};
use super::MemCategory;
use crate::config::{Precision, Stage};
use crate::plan::{BufferPlan, BufferRole, Extent};

/// The formula's bytes per category for one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PaperFormula {
    /// Stage.
    pub stage: Stage,
    /// The precision whose bytes per element it counts.
    pub precision: Precision,
    /// Ψ.
    pub numel: usize,
    /// N.
    pub world: usize,
    /// 2Ψ, or 2Ψ/N at stage 3.
    pub params: Frac,
    /// 2Ψ, or 2Ψ/N at stages 2/3.
    pub grads: Frac,
    /// 4Ψ, or 4Ψ/N at stages 1-3.
    pub master: Frac,
    /// 4Ψ, or 4Ψ/N at stages 1-3.
    pub adam_m: Frac,
    /// 4Ψ, or 4Ψ/N at stages 1-3.
    pub adam_v: Frac,
}

/// Whether the formula counts this state category partitioned at `stage`.
fn formula_sharded(stage: Stage, c: MemCategory) -> bool {
    match c {
        MemCategory::Params => stage >= Stage::Zero3,
        MemCategory::Grads => stage >= Stage::Zero2,
        _ => stage >= Stage::Zero1,
    }
}

/// Bytes per parameter the formula counts in `category` for training in `precision`.
pub fn bytes_per_param(precision: Precision, category: MemCategory) -> i128 {
    match (precision, category) {
        (Precision::Fp32, MemCategory::Params | MemCategory::Grads) => 4,
        (Precision::Fp32, MemCategory::Master) => 0,
        (_, MemCategory::Params | MemCategory::Grads) => 2,
        (_, MemCategory::Master | MemCategory::AdamM | MemCategory::AdamV) => 4,
        _ => 0,
    }
}

impl PaperFormula {
    /// The paper's mixed-precision formula (K = 12) for Ψ = `numel` parameters on
    /// `world` ranks.
    pub fn new(stage: Stage, numel: usize, world: usize) -> PaperFormula {
        PaperFormula::for_precision(stage, Precision::Bf16, numel, world)
    }

    /// The formula for training in `precision`: the paper's for bf16 and fp16; for fp32,
    /// 4-byte parameters and gradients and no master copy (K = 8).
    pub fn for_precision(
        stage: Stage,
        precision: Precision,
        numel: usize,
        world: usize,
    ) -> PaperFormula {
        let psi = numel as i128;
        let n = world.max(1) as i128;
        let bytes = |c| {
            let k = bytes_per_param(precision, c);
            if formula_sharded(stage, c) {
                Frac::new(k * psi, n)
            } else {
                Frac::int(k * psi)
            }
        };
        PaperFormula {
            stage,
            precision,
            numel,
            world,
            params: bytes(MemCategory::Params),
            grads: bytes(MemCategory::Grads),
            master: bytes(MemCategory::Master),
            adam_m: bytes(MemCategory::AdamM),
            adam_v: bytes(MemCategory::AdamV),
        }
    }

    /// Sum over categories (mixed precision: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N).
    pub fn total(&self) -> Frac {
        self.params + self.grads + self.master + self.adam_m + self.adam_v
    }

    /// The category's bytes.
    pub fn get(&self, category: MemCategory) -> Option<Frac> {
        match category {
            MemCategory::Params => Some(self.params),
            MemCategory::Grads => Some(self.grads),
            MemCategory::Master => Some(self.master),
            MemCategory::AdamM => Some(self.adam_m),
            MemCategory::AdamV => Some(self.adam_v),
            _ => None,
        }
    }

    /// The category's term ("2Ψ", "4Ψ/N"; "0" for fp32's master; "" beyond the formula).
    pub fn term(&self, category: MemCategory) -> String {
        match bytes_per_param(self.precision, category) {
            0 if category == MemCategory::Master => "0".into(),
            0 => String::new(),
            k if formula_sharded(self.stage, category) => format!("{k}Ψ/N"),
            k => format!("{k}Ψ"),
        }
    }

    /// The whole formula ("2Ψ + 2Ψ + 12Ψ/N", "4Ψ + 4Ψ + 8Ψ/N").
    pub fn expression(&self) -> &'static str {
        match (self.precision, self.stage) {
            (Precision::Fp32, Stage::Zero0) => "4Ψ + 4Ψ + 8Ψ",
            (Precision::Fp32, Stage::Zero1) => "4Ψ + 4Ψ + 8Ψ/N",
            (Precision::Fp32, Stage::Zero2) => "4Ψ + 12Ψ/N",
            (Precision::Fp32, Stage::Zero3) => "16Ψ/N",
            (_, Stage::Zero0) => "2Ψ + 2Ψ + 12Ψ",
            (_, Stage::Zero1) => "2Ψ + 2Ψ + 12Ψ/N",
            (_, Stage::Zero2) => "2Ψ + 14Ψ/N",
            (_, Stage::Zero3) => "16Ψ/N",
        }
    }
}

/// One reason the plan differs from the formula.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The category the bytes belong to.
    pub category: MemCategory,
    /// Plan minus formula, for this reason (negative when the plan holds less).
    pub bytes: Frac,
    /// Why, in words, with the element counts.
    pub reason: String,
}

/// The plan next to the formula, with every difference explained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// The formula.
    pub formula: PaperFormula,
    /// The plan's total bytes (buffers + activations).
    pub plan_bytes: u64,
    /// The differences; they sum to `plan_bytes - formula.total()`.
    pub items: Vec<Difference>,
}

impl Explanation {
    /// Explain `plan` against the formula for its stage, Ψ and N.
    pub fn new(plan: &BufferPlan) -> Explanation {
        let stage = plan.inputs.stage;
        let f = PaperFormula::for_precision(stage, plan.inputs.precision, plan.numel, plan.world);
        let psi = plan.numel as i128;
        let n = plan.world as i128;
        let elems = |sharded: bool| {
            if sharded {
                Frac::new(psi, n)
            } else {
                Frac::int(psi)
            }
        };
        let mut items = Vec::new();
        let state = [
            (MemCategory::Params, BufferRole::Params, "parameters"),
            (MemCategory::Grads, BufferRole::Grads, "gradients"),
            (MemCategory::Master, BufferRole::Master, "fp32 master"),
            (MemCategory::AdamM, BufferRole::AdamM, "Adam m"),
            (MemCategory::AdamV, BufferRole::AdamV, "Adam v"),
        ];
        for (cat, role, what) in state {
            let sf = bytes_per_param(f.precision, cat);
            let fsh = formula_sharded(stage, cat);
            let ef = elems(fsh);
            let Some(buf) = plan.get(role) else {
                if sf != 0 {
                    items.push(Difference {
                        category: cat,
                        bytes: -ef.times(sf),
                        reason: format!(
                            "no {what} buffer (formula: {sf} bytes x {}Ψ)",
                            if fsh { "1/N " } else { "" }
                        ),
                    });
                }
                continue;
            };
            let sp = buf.dtype.size_bytes() as i128;
            if sp != sf {
                items.push(Difference {
                    category: cat,
                    bytes: ef.times(sp - sf),
                    reason: format!(
                        "{what} are {} ({sp} bytes per element; the formula counts {sf})",
                        buf.dtype
                    ),
                });
            }
            let psh = buf.extent == Extent::Shard;
            let eu = elems(psh);
            if psh != fsh {
                items.push(Difference {
                    category: cat,
                    bytes: (eu - ef).times(sp),
                    reason: if psh {
                        format!("{what} partitioned although the formula holds them in full")
                    } else {
                        format!(
                            "{what} held in full (Ψ = {psi} elements) because gradients accumulate locally and are reduced once per step (reduce_every_micro_step = false); the formula counts Ψ/N"
                        )
                    },
                });
            }
            let pad = Frac::int(buf.len as i128) - eu;
            if pad != Frac::ZERO {
                items.push(Difference {
                    category: MemCategory::Padding,
                    bytes: pad.times(sp),
                    reason: format!(
                        "partition padding of the {what}: {} {} elements vs {} unpadded",
                        if psh { "shard of" } else { "buffer of" },
                        buf.len,
                        if psh {
                            format!("Ψ/N = {psi}/{n}")
                        } else {
                            format!("Ψ = {psi}")
                        }
                    ),
                });
            }
        }

        // Every other buffer is beyond the formula; group them by purpose.
        let sum = |pred: &dyn Fn(&BufferRole) -> bool| {
            let bs: Vec<_> = plan.buffers.iter().filter(|b| pred(&b.role)).collect();
            let bytes: u64 = bs.iter().map(|b| b.bytes()).sum();
            let lens: Vec<String> = bs.iter().map(|b| b.len.to_string()).collect();
            (
                bytes,
                bs.len(),
                lens.join(", "),
                bs.first().map(|b| b.dtype),
            )
        };
        let mut extra = |cat, bytes: u64, reason: String| {
            if bytes > 0 {
                items.push(Difference {
                    category: cat,
                    bytes: Frac::int(bytes as i128),
                    reason,
                });
            }
        };
        let (bytes, k, lens, dt) = sum(&|r| matches!(r, BufferRole::Persistent { .. }));
        if let Some(dt) = dt {
            extra(MemCategory::Persistent, bytes, format!(
                "{k} persistent unit(s) under persistence_threshold = {} kept gathered in full ({lens} elements of {dt})",
                plan.inputs.persistence_threshold
            ));
        }
        let (bytes, k, lens, dt) = sum(&|r| matches!(r, BufferRole::GatherSlot { .. }));
        if let Some(dt) = dt {
            extra(MemCategory::Gather, bytes, format!(
                "{k} stage-3 gather slot(s) of {lens} elements of {dt}: the units a layer uses, prefetch of the next {} layer(s), units held across a gap within the reuse distance ({} elements)",
                plan.inputs.prefetch,
                plan.inputs.reuse_distance
            ));
        }
        let (bytes, _, _, _) = sum(&|r| {
            matches!(
                r,
                BufferRole::QuantCodes { .. } | BufferRole::QuantScales { .. }
            )
        });
        if let Some(block) = plan.inputs.quant_block {
            extra(MemCategory::Gather, bytes, format!(
                "quantized gathers (qwZ, one f32 scale per {block} values): the int8 codes and scales of the largest gathered unit's shard, and of the whole unit as gathered"
            ));
        }
        let (bytes, _, lens, dt) = sum(&|r| *r == BufferRole::Secondary);
        if let Some(dt) = dt {
            extra(MemCategory::Secondary, bytes, format!(
                "hpZ secondary partition: this rank's 1/{} of every unit the backward gathers ({lens} elements of {dt}), so that it gathers them inside the node",
                plan.inputs.ranks_per_node
            ));
        }
        let (bytes, _, _, _) = sum(&|r| {
            matches!(
                r,
                BufferRole::GradCodes { .. }
                    | BufferRole::GradScales { .. }
                    | BufferRole::GradSums { .. }
            )
        });
        if let Some(block) = plan.inputs.grad_quant_block {
            extra(MemCategory::Buckets, bytes, format!(
                "quantized gradient reduction (qgZ, int{} codes, one f32 scale per {block} values): the codes and scales of one chunk's N pieces sent and received, and two f32 sums of M pieces",
                plan.inputs.grad_quant_bits
            ));
        }
        for (role, what, units) in [
            (
                BufferRole::ParamWindow,
                "f32 parameter window (the model computes in f32)",
                "the widest layer's units",
            ),
            (
                BufferRole::GradWindow,
                "f32 gradient window the model accumulates into",
                "the widest layer's units without an accumulator of their own (below)",
            ),
        ] {
            let (bytes, _, lens, _) = sum(&|r| *r == role);
            extra(
                MemCategory::Compute,
                bytes,
                format!("{what}: {lens} elements, {units}"),
            );
        }
        let (bytes, k, lens, _) = sum(&|r| matches!(r, BufferRole::TiedGrad { .. }));
        extra(MemCategory::Compute, bytes, format!(
            "{k} f32 gradient accumulator(s) of units with a use spanning several layers ({lens} elements), complete after the backward of the use's first layer"
        ));
        let (bytes, _, _, _) = sum(&|r| {
            matches!(
                r,
                BufferRole::GradStats | BufferRole::Losses | BufferRole::Agreement
            )
        });
        extra(MemCategory::Compute, bytes, format!(
            "control scalars: gradient statistics (2 f64 per unit), the {} micro-step loss(es), the 3-f64 agreement vector",
            plan.inputs.grad_accum
        ));
        let (bytes, k, _, dt) = sum(&|r| {
            matches!(
                r,
                BufferRole::Bucket { .. } | BufferRole::BucketPiece { .. }
            )
        });
        if let Some(dt) = dt {
            extra(MemCategory::Buckets, bytes, format!(
                "{k} reduction buffers of {dt}: 2 buckets of {} elements{} (bucket_elems = {}, capped at the largest unit)",
                plan.bucket_len,
                if k > 2 { format!(" + 2 pieces of {}", plan.piece_len) } else { String::new() },
                plan.inputs.bucket_elems
            ));
        }
        extra(
            MemCategory::Activations,
            plan.inputs.activation_bytes,
            "the model's activation arena for one micro-step".into(),
        );
        Explanation {
            formula: f,
            plan_bytes: plan.total_bytes(),
            items,
        }
    }

    /// Sum of the items (equals `plan_bytes - formula.total()`).
    pub fn explained(&self) -> Frac {
        self.items.iter().map(|d| d.bytes).sum()
    }

    /// A printable report: formula, plan, and each difference.
    pub fn render(&self) -> String {
        let f = &self.formula;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} formula for {} {} (Ψ = {}, N = {}): {}",
            f.stage,
            precision_name(f.precision),
            f.expression(),
            f.numel,
            f.world,
            f.total()
        );
        if f.precision == Precision::Fp32 {
            let mixed = PaperFormula::new(f.stage, f.numel, f.world);
            let _ = writeln!(
                out,
                "  (the paper's mixed-precision formula {}: {}; fp32 keeps no master copy)",
                mixed.expression(),
                mixed.total()
            );
        }
        let _ = writeln!(out, "plan: {}", human_bytes(self.plan_bytes as f64));
        for d in &self.items {
            let _ = writeln!(
                out,
                "  {:>12}  {:<11} {}",
                signed(d.bytes),
                d.category.name(),
                d.reason
            );
        }
        let _ = writeln!(out, "  {:>12}  total difference", signed(self.explained()));
        out
    }
}

/// "fp32", "bf16", "fp16".
fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "fp32",
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
    }
}

/// Bytes with an explicit sign.
fn signed(b: Frac) -> String {
    if b.numer() >= 0 {
        format!("+{b}")
    } else {
        b.to_string()
    }
}
