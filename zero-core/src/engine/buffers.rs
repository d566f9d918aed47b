//! The engine's buffers, allocated one for one from the rank's [`BufferPlan`] (so the dry
//! run and a real run hold the same bytes), and measured back from the allocations
//! themselves for the ledger a run reports.
//!
//! Which buffer holds the whole tensor and which only this rank's shard is the plan's
//! business (`memory.rs` has the table); here each role gets its field.

use std::collections::BTreeMap;

use zero_kernels::DType;

use super::real::Store;
use super::EngineError;
use crate::ledger::{BufferPlan, BufferRole, MemCategory};

/// Every buffer of one rank.
#[derive(Debug)]
pub struct Buffers {
    /// Working parameters P (full, or shard at stage 3). In fp32 training: the master.
    pub params: Store,
    /// Gradient accumulator P (full, or shard when reduced every micro-step).
    pub grads: Store,
    /// fp32 master (16-bit training only; full at stage 0, else shard).
    pub master: Option<Vec<f32>>,
    /// Adam first moment.
    pub adam_m: Vec<f32>,
    /// Adam second moment.
    pub adam_v: Vec<f32>,
    /// Stage 3: gathered copies of persistent units, per unit.
    pub persistent: Vec<Option<Store>>,
    /// Stage 3: gather slots.
    pub slots: Vec<Store>,
    /// f32 parameters of the computing layer (16-bit training).
    pub param_window: Vec<f32>,
    /// f32 gradients of the computing layer.
    pub grad_window: Vec<f32>,
    /// f32 gradient accumulators of tied units (sharded gradients), per unit.
    pub tied_grads: Vec<Option<Vec<f32>>>,
    /// Reduction buckets (W).
    pub buckets: Vec<Store>,
    /// Bucket pieces (W).
    pub pieces: Vec<Store>,
}

impl Buffers {
    /// Allocate (zeroed) every buffer the plan lists, and nothing else.
    pub fn allocate(plan: &BufferPlan, units: usize) -> Result<Buffers, EngineError> {
        let mut b = Buffers {
            params: Store::zeros(plan.param_dtype, 0)?,
            grads: Store::zeros(plan.param_dtype, 0)?,
            master: None,
            adam_m: Vec::new(),
            adam_v: Vec::new(),
            persistent: (0..units).map(|_| None).collect(),
            slots: Vec::new(),
            param_window: Vec::new(),
            grad_window: Vec::new(),
            tied_grads: (0..units).map(|_| None).collect(),
            buckets: Vec::new(),
            pieces: Vec::new(),
        };
        let f32s = |len: usize| vec![0.0f32; len];
        for spec in &plan.buffers {
            let (d, n) = (spec.dtype, spec.len);
            match spec.role {
                BufferRole::Params => b.params = Store::zeros(d, n)?,
                BufferRole::Grads => b.grads = Store::zeros(d, n)?,
                BufferRole::Master => b.master = Some(f32s(n)),
                BufferRole::AdamM => b.adam_m = f32s(n),
                BufferRole::AdamV => b.adam_v = f32s(n),
                BufferRole::Persistent { unit } => b.persistent[unit] = Some(Store::zeros(d, n)?),
                BufferRole::GatherSlot { slot } => {
                    if slot != b.slots.len() {
                        return Err(EngineError::Internal(format!(
                            "gather slot {slot} out of order"
                        )));
                    }
                    b.slots.push(Store::zeros(d, n)?)
                }
                BufferRole::ParamWindow => b.param_window = f32s(n),
                BufferRole::GradWindow => b.grad_window = f32s(n),
                BufferRole::TiedGrad { unit } => b.tied_grads[unit] = Some(f32s(n)),
                BufferRole::Bucket { .. } => b.buckets.push(Store::zeros(d, n)?),
                BufferRole::BucketPiece { .. } => b.pieces.push(Store::zeros(d, n)?),
            }
        }
        Ok(b)
    }

    /// Every allocation as (role, dtype, elements, bytes held), measured from the
    /// buffers themselves.
    pub fn measured(&self) -> Vec<(BufferRole, DType, usize, u64)> {
        let mut out = Vec::new();
        let mut store = |role, s: &Store| {
            if s.allocated_bytes() > 0 {
                out.push((role, s.dtype(), s.len(), s.allocated_bytes()));
            }
        };
        store(BufferRole::Params, &self.params);
        store(BufferRole::Grads, &self.grads);
        for (unit, p) in self.persistent.iter().enumerate() {
            if let Some(p) = p {
                store(BufferRole::Persistent { unit }, p);
            }
        }
        for (slot, s) in self.slots.iter().enumerate() {
            store(BufferRole::GatherSlot { slot }, s);
        }
        for (index, s) in self.buckets.iter().enumerate() {
            store(BufferRole::Bucket { index }, s);
        }
        for (index, s) in self.pieces.iter().enumerate() {
            store(BufferRole::BucketPiece { index }, s);
        }
        let mut f32s = |role, v: &Vec<f32>| {
            if v.capacity() > 0 {
                out.push((role, DType::F32, v.len(), (v.capacity() * 4) as u64));
            }
        };
        if let Some(m) = &self.master {
            f32s(BufferRole::Master, m);
        }
        f32s(BufferRole::AdamM, &self.adam_m);
        f32s(BufferRole::AdamV, &self.adam_v);
        f32s(BufferRole::ParamWindow, &self.param_window);
        f32s(BufferRole::GradWindow, &self.grad_window);
        for (unit, t) in self.tied_grads.iter().enumerate() {
            if let Some(t) = t {
                f32s(BufferRole::TiedGrad { unit }, t);
            }
        }
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
