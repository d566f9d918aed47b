//! The engine's buffers, allocated one for one from the rank's [`BufferPlan`] on the
//! device (so the dry run and a real run hold the same bytes), and measured back from the
//! allocations themselves for the ledger a run reports.
//!
//! Which buffer holds the whole tensor and which only this rank's shard is the plan's
//! business (`plan/mod.rs` has the table, `plan/placement.rs` the ranges); here each
//! role gets its field, and the events that say when a buffer may be reused live with it.

use std::collections::BTreeMap;

use zero_kernels::device::{Buffer, Device, FloatBuffer};
use zero_kernels::DType;

use super::qgz::GradQuantStaging;
use super::qwz::QuantStaging;
use super::reducer::Reducer;
use super::EngineError;
use crate::ledger::MemCategory;
use crate::plan::{BufferPlan, BufferRole};

/// A stage-3 gather slot and when it may be written again.
pub(crate) struct GatherSlot<D: Device> {
    /// P elements: the gathered unit that occupies the slot.
    pub buf: FloatBuffer<D>,
    /// Recorded on compute after the last layer that read the slot's current unit.
    pub free: Option<D::Event>,
}

/// Every buffer of one rank.
pub(crate) struct Buffers<D: Device> {
    /// Working parameters P (full, or shard at stage 3). In fp32 training: the master.
    pub params: FloatBuffer<D>,
    /// Gradient accumulator G (full, or shard when reduced every micro-step).
    pub grads: FloatBuffer<D>,
    /// fp32 master (16-bit training only; full at stage 0, else shard).
    pub master: Option<D::Buf<f32>>,
    /// Adam first moment.
    pub adam_m: D::Buf<f32>,
    /// Adam second moment.
    pub adam_v: D::Buf<f32>,
    /// Stage 3: gathered copies of persistent units, per unit.
    pub persistent: Vec<Option<FloatBuffer<D>>>,
    /// Stage 3: gather slots.
    pub slots: Vec<GatherSlot<D>>,
    /// Quantized parameter gathers (qwZ): the staging of the codes.
    pub quant: Option<QuantStaging<D>>,
    /// hpZ: this rank's 1/L of every unit the backward gathers (P).
    pub secondary: Option<FloatBuffer<D>>,
    /// f32 parameters of the computing layer (16-bit training).
    pub param_window: D::Buf<f32>,
    /// f32 gradients of the computing layer.
    pub grad_window: D::Buf<f32>,
    /// f32 gradient accumulators of tied units (sharded gradients), per unit.
    pub tied_grads: Vec<Option<D::Buf<f32>>>,
    /// The two reduction buckets and their pieces.
    pub reducer: Reducer<D>,
    /// Per-unit gradient statistics (2 f64 a unit).
    pub grad_stats: D::Buf<f64>,
    /// The micro-steps' losses.
    pub losses: D::Buf<f32>,
    /// The agreement vector.
    pub agreement: D::Buf<f64>,
    /// Recorded after the last write of the parameters (init, update and share, import).
    pub params_ready: Option<D::Event>,
}

impl<D: Device> Buffers<D> {
    /// Allocate (zeroed) every buffer the plan lists, and nothing else.
    pub fn allocate(dev: &D, plan: &BufferPlan, units: usize) -> Result<Buffers<D>, EngineError> {
        let len = |role| plan.get(role).map_or(0, |b| b.len);
        let p = plan.param_dtype;
        let w = plan.inputs.reduce_dtype;
        let float = |role, name: &str, dtype| FloatBuffer::alloc(dev, dtype, len(role), name);
        let f32s = |role, name: &str| dev.alloc::<f32>(len(role), name);
        let master = match plan.get(BufferRole::Master) {
            Some(b) => Some(dev.alloc::<f32>(b.len, "master")?),
            None => None,
        };
        let mut persistent = Vec::with_capacity(units);
        let mut tied_grads = Vec::with_capacity(units);
        for unit in 0..units {
            persistent.push(match plan.get(BufferRole::Persistent { unit }) {
                Some(b) => Some(FloatBuffer::alloc(
                    dev,
                    p,
                    b.len,
                    &format!("persistent unit {unit}"),
                )?),
                None => None,
            });
            tied_grads.push(match plan.get(BufferRole::TiedGrad { unit }) {
                Some(b) => Some(dev.alloc::<f32>(b.len, &format!("tied gradient of unit {unit}"))?),
                None => None,
            });
        }
        let slots = plan
            .gather
            .iter()
            .flat_map(|g| g.slots.iter().enumerate())
            .map(|(slot, &n)| {
                Ok(GatherSlot {
                    buf: FloatBuffer::alloc(dev, p, n, &format!("gather slot {slot}"))?,
                    free: None,
                })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        let quant = match plan.inputs.quant_block {
            Some(block) => {
                let bytes = |gathered| {
                    dev.alloc::<u8>(len(BufferRole::QuantCodes { gathered }), "quantized codes")
                };
                let scales = |gathered| {
                    dev.alloc::<f32>(
                        len(BufferRole::QuantScales { gathered }),
                        "quantization scales",
                    )
                };
                Some(QuantStaging {
                    block,
                    send_codes: bytes(false)?,
                    send_scales: scales(false)?,
                    recv_codes: bytes(true)?,
                    recv_scales: scales(true)?,
                })
            }
            None => None,
        };
        let grad_quant = match plan
            .inputs
            .grad_quant_block
            .filter(|_| plan.get(BufferRole::GradSums { index: 0 }).is_some())
        {
            Some(block) => {
                let bytes = |received| {
                    dev.alloc::<u8>(len(BufferRole::GradCodes { received }), "gradient codes")
                };
                let scales = |received| {
                    dev.alloc::<f32>(len(BufferRole::GradScales { received }), "gradient scales")
                };
                Some(GradQuantStaging {
                    block,
                    bits: plan.inputs.grad_quant_bits,
                    send_codes: bytes(false)?,
                    send_scales: scales(false)?,
                    recv_codes: bytes(true)?,
                    recv_scales: scales(true)?,
                    sums: f32s(BufferRole::GradSums { index: 0 }, "gradient sums")?,
                    peer: f32s(BufferRole::GradSums { index: 1 }, "gradient peer values")?,
                })
            }
            None => None,
        };
        let secondary = match plan.get(BufferRole::Secondary) {
            Some(b) => Some(FloatBuffer::alloc(dev, p, b.len, "secondary partition")?),
            None => None,
        };
        let mut buckets = Vec::new();
        for index in 0..2 {
            let bucket = float(BufferRole::Bucket { index }, &format!("bucket {index}"), w)?;
            let piece = match plan.get(BufferRole::BucketPiece { index }) {
                Some(b) => Some(FloatBuffer::alloc(
                    dev,
                    w,
                    b.len,
                    &format!("bucket piece {index}"),
                )?),
                None => None,
            };
            buckets.push((bucket, piece));
        }
        Ok(Buffers {
            params: float(BufferRole::Params, "params", p)?,
            grads: float(BufferRole::Grads, "grads", plan.inputs.grad_dtype)?,
            master,
            adam_m: f32s(BufferRole::AdamM, "adam m")?,
            adam_v: f32s(BufferRole::AdamV, "adam v")?,
            persistent,
            slots,
            quant,
            secondary,
            param_window: f32s(BufferRole::ParamWindow, "param window")?,
            grad_window: f32s(BufferRole::GradWindow, "grad window")?,
            tied_grads,
            reducer: Reducer::new(buckets, grad_quant),
            grad_stats: dev.alloc::<f64>(len(BufferRole::GradStats), "grad stats")?,
            losses: f32s(BufferRole::Losses, "losses")?,
            agreement: dev.alloc::<f64>(len(BufferRole::Agreement), "agreement")?,
            params_ready: None,
        })
    }

    /// Every allocation as (role, dtype, elements, bytes held), measured from the
    /// buffers themselves.
    pub fn measured(&self) -> Vec<(BufferRole, DType, usize, u64)> {
        let mut out = Vec::new();
        let mut float = |role, b: &FloatBuffer<D>| {
            if b.allocated_bytes() > 0 {
                out.push((role, b.dtype(), b.len(), b.allocated_bytes()));
            }
        };
        float(BufferRole::Params, &self.params);
        float(BufferRole::Grads, &self.grads);
        for (unit, p) in self.persistent.iter().enumerate() {
            if let Some(p) = p {
                float(BufferRole::Persistent { unit }, p);
            }
        }
        for (slot, s) in self.slots.iter().enumerate() {
            float(BufferRole::GatherSlot { slot }, &s.buf);
        }
        if let Some(s) = &self.secondary {
            float(BufferRole::Secondary, s);
        }
        for (index, (bucket, piece)) in self.reducer.buffers().enumerate() {
            float(BufferRole::Bucket { index }, bucket);
            if let Some(piece) = piece {
                float(BufferRole::BucketPiece { index }, piece);
            }
        }
        fn typed<B: Buffer>(
            out: &mut Vec<(BufferRole, DType, usize, u64)>,
            role: BufferRole,
            b: &B,
        ) {
            if b.allocated_bytes() > 0 {
                out.push((
                    role,
                    <B::Elem as zero_kernels::Element>::DTYPE,
                    b.len(),
                    b.allocated_bytes(),
                ));
            }
        }
        if let Some(m) = &self.master {
            typed(&mut out, BufferRole::Master, m);
        }
        typed(&mut out, BufferRole::AdamM, &self.adam_m);
        typed(&mut out, BufferRole::AdamV, &self.adam_v);
        typed(&mut out, BufferRole::ParamWindow, &self.param_window);
        typed(&mut out, BufferRole::GradWindow, &self.grad_window);
        for (unit, t) in self.tied_grads.iter().enumerate() {
            if let Some(t) = t {
                typed(&mut out, BufferRole::TiedGrad { unit }, t);
            }
        }
        if let Some(q) = &self.quant {
            for gathered in [false, true] {
                let (codes, scales) = if gathered {
                    (&q.recv_codes, &q.recv_scales)
                } else {
                    (&q.send_codes, &q.send_scales)
                };
                typed(&mut out, BufferRole::QuantCodes { gathered }, codes);
                typed(&mut out, BufferRole::QuantScales { gathered }, scales);
            }
        }
        if let Some(q) = self.reducer.grad_quant() {
            for received in [false, true] {
                let (codes, scales) = if received {
                    (&q.recv_codes, &q.recv_scales)
                } else {
                    (&q.send_codes, &q.send_scales)
                };
                typed(&mut out, BufferRole::GradCodes { received }, codes);
                typed(&mut out, BufferRole::GradScales { received }, scales);
            }
            typed(&mut out, BufferRole::GradSums { index: 0 }, &q.sums);
            typed(&mut out, BufferRole::GradSums { index: 1 }, &q.peer);
        }
        typed(&mut out, BufferRole::GradStats, &self.grad_stats);
        typed(&mut out, BufferRole::Losses, &self.losses);
        typed(&mut out, BufferRole::Agreement, &self.agreement);
        out
    }

    /// Bytes held per ledger category, measured from the allocations; padding split out
    /// as the plan defines it (the plan knows which elements of a state buffer are
    /// partition padding), activations from the model.
    pub fn measured_by_category(
        &self,
        plan: &BufferPlan,
        activation_bytes: u64,
    ) -> BTreeMap<MemCategory, u64> {
        let mut by: BTreeMap<MemCategory, u64> = MemCategory::ALL.iter().map(|&c| (c, 0)).collect();
        for (role, dtype, _, bytes) in self.measured() {
            let Some(spec) = plan.get(role) else {
                // Not in the plan: count it where it would belong, so a test sees the excess.
                *by.entry(MemCategory::Compute).or_default() += bytes;
                continue;
            };
            let pad = (spec.padding * dtype.size_bytes()) as u64;
            *by.entry(MemCategory::Padding).or_default() += pad.min(bytes);
            *by.entry(spec.category).or_default() += bytes.saturating_sub(pad);
        }
        *by.entry(MemCategory::Activations).or_default() += activation_bytes;
        by
    }
}
