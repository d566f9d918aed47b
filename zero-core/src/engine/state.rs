//! The engine's optimizer state as a checkpoint sees it: per unit, fp32 master weights
//! and Adam's m and v, plus the counters (step, applied) and the loss scaler.
//!
//! Export invariant: a checkpoint is always "one shard per rank", whatever the stage.
//! Rank r exports block `r * shard_len .. (r + 1) * shard_len` of every unit of the
//! engine's layout: its shard at stages 1-3, and at stage 0 (where every rank holds the
//! whole, identical state) its block of the full buffers. So the bytes written per rank
//! are Ψ/N x 12 at every stage, every rank writes in parallel, and a stage-0 checkpoint
//! is the same files as a stage-1 one (loadable at any stage).
//!
//! Import invariant: [`Engine::import_unit_mut`] hands out exactly what this rank keeps of
//! a unit (the whole unit at stage 0, its shard at stages 1-3), zeroed; the caller fills
//! the parameter elements; [`Engine::finish_import`] then rebuilds everything derived from
//! the master (16-bit parameter copies, full parameter buffers of stages 1/2 by
//! all-gather, stage-3 persistent units) and sets the counters. In fp32 training the
//! parameters are the master, so the slices handed out are the parameter buffer itself.

use std::ops::Range;

use zero_comm::Communicator;
use zero_kernels::DType;

use super::real::{convert, Real};
use super::{Engine, EngineError, LossScaler};
use crate::config::Stage;

/// One unit of this rank's exported state: its block of the unit (see the file head).
#[derive(Debug)]
pub struct UnitState<'a> {
    /// The block, in elements of the unit's padded flat buffer.
    pub range: Range<usize>,
    /// fp32 master weights of the block.
    pub master: &'a [f32],
    /// Adam first moment of the block.
    pub adam_m: &'a [f32],
    /// Adam second moment of the block.
    pub adam_v: &'a [f32],
}

/// What this rank keeps of one unit, to be filled on import (zeroed when handed out).
#[derive(Debug)]
pub struct UnitStateMut<'a> {
    /// The elements kept, in the unit's padded flat buffer (whole unit at stage 0).
    pub range: Range<usize>,
    /// fp32 master weights (the parameters themselves in fp32 training).
    pub master: &'a mut [f32],
    /// Adam first moment.
    pub adam_m: &'a mut [f32],
    /// Adam second moment.
    pub adam_v: &'a mut [f32],
}

impl<'c, C: Communicator> Engine<'c, C> {
    /// The communicator the engine runs on (a checkpoint synchronises on it).
    pub fn communicator(&self) -> &'c C {
        self.comm
    }

    /// Where unit `u`'s state sits in the optimizer-state buffers (m, v, and the master
    /// of 16-bit training), and the unit-relative elements that slice covers.
    fn state_slot(
        &self,
        u: usize,
        whole: bool,
    ) -> Result<(Range<usize>, Range<usize>), EngineError> {
        let unit = self.layout.units.get(u).ok_or_else(|| {
            EngineError::Mismatch(format!(
                "unit {u} is out of range: the model has {} units",
                self.layout.units.len()
            ))
        })?;
        let rank = self.comm.rank();
        let own = rank * unit.shard_len..(rank + 1) * unit.shard_len;
        Ok(match self.config.zero.stage {
            Stage::Zero0 if whole => (
                unit.unit_offset..unit.unit_offset + unit.padded_len,
                0..unit.padded_len,
            ),
            Stage::Zero0 => (
                unit.unit_offset + own.start..unit.unit_offset + own.end,
                own,
            ),
            _ => (unit.shard_offset..unit.shard_offset + unit.shard_len, own),
        })
    }

    /// Where the fp32 parameters of the same elements sit in the parameter buffer (fp32
    /// training only: full buffer at stages 0-2, shard buffer at stage 3).
    fn fp32_param_slot(&self, u: usize, rel: &Range<usize>) -> Range<usize> {
        let unit = &self.layout.units[u];
        match self.config.zero.stage {
            Stage::Zero3 => unit.shard_offset..unit.shard_offset + unit.shard_len,
            _ => unit.unit_offset + rel.start..unit.unit_offset + rel.end,
        }
    }

    /// This rank's block of unit `u` (master, m, v), borrowed from the live buffers.
    pub fn export_unit(&self, u: usize) -> Result<UnitState<'_>, EngineError> {
        let (state_at, rel) = self.state_slot(u, false)?;
        let master: &[f32] = match &self.bufs.master {
            Some(m) => &m[state_at.clone()],
            None => &f32::of(&self.bufs.params)?[self.fp32_param_slot(u, &rel)],
        };
        Ok(UnitState {
            range: rel,
            master,
            adam_m: &self.bufs.adam_m[state_at.clone()],
            adam_v: &self.bufs.adam_v[state_at],
        })
    }

    /// What this rank keeps of unit `u` (whole unit at stage 0, its shard otherwise),
    /// zeroed, for the caller to fill; call [`Self::finish_import`] after every unit.
    pub fn import_unit_mut(&mut self, u: usize) -> Result<UnitStateMut<'_>, EngineError> {
        let (state_at, rel) = self.state_slot(u, true)?;
        let param_at = self.fp32_param_slot(u, &rel);
        let bufs = &mut self.bufs;
        let master: &mut [f32] = match &mut bufs.master {
            Some(m) => &mut m[state_at.clone()],
            None => &mut f32::of_mut(&mut bufs.params)?[param_at],
        };
        let adam_m = &mut bufs.adam_m[state_at.clone()];
        let adam_v = &mut bufs.adam_v[state_at];
        master.fill(0.0);
        adam_m.fill(0.0);
        adam_v.fill(0.0);
        Ok(UnitStateMut {
            range: rel,
            master,
            adam_m,
            adam_v,
        })
    }

    /// After every unit was imported: rebuild what derives from the master (16-bit
    /// parameters, stage 1/2 full parameters, stage 3 persistent units) and restore the
    /// counters and the loss scaler. Collective: every rank calls it.
    pub fn finish_import(
        &mut self,
        step: u64,
        applied: u64,
        scaler: LossScaler,
    ) -> Result<(), EngineError> {
        match self.plan.param_dtype {
            DType::F32 => self.refresh_params::<f32>()?,
            DType::BF16 => self.refresh_params::<half::bf16>()?,
            DType::F16 => self.refresh_params::<half::f16>()?,
            other => return Err(EngineError::Internal(format!("parameter dtype {other}"))),
        }
        self.step = step;
        self.applied = applied;
        self.scaler = scaler;
        Ok(())
    }

    /// Parameters from the master: convert what this rank owns (16-bit training), then
    /// gather what it must hold in full.
    fn refresh_params<P: Real>(&mut self) -> Result<(), EngineError> {
        let stage = self.config.zero.stage;
        let rank = self.comm.rank();
        for (u, unit) in self.layout.units.iter().enumerate() {
            let own = rank * unit.shard_len..(rank + 1) * unit.shard_len;
            let shard_at = unit.shard_offset..unit.shard_offset + unit.shard_len;
            let full_at = unit.unit_offset..unit.unit_offset + unit.padded_len;
            let own_in_full = unit.unit_offset + own.start..unit.unit_offset + own.end;
            let params = P::of_mut(&mut self.bufs.params)?;
            if let Some(master) = &self.bufs.master {
                match stage {
                    Stage::Zero0 => convert(
                        &self.exec,
                        &master[full_at.clone()],
                        &mut params[full_at.clone()],
                    )?,
                    Stage::Zero1 | Stage::Zero2 => convert(
                        &self.exec,
                        &master[shard_at.clone()],
                        &mut params[own_in_full],
                    )?,
                    Stage::Zero3 => convert(
                        &self.exec,
                        &master[shard_at.clone()],
                        &mut params[shard_at.clone()],
                    )?,
                }
            }
            match stage {
                Stage::Zero0 => {}
                Stage::Zero1 | Stage::Zero2 => {
                    self.comm.all_gather_in_place(&mut params[full_at])?
                }
                Stage::Zero3 => {
                    if let Some(p) = &mut self.bufs.persistent[u] {
                        self.comm.all_gather(&params[shard_at], P::of_mut(p)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}
