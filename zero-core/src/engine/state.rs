//! The engine's optimizer state as a checkpoint sees it: per unit, fp32 master weights
//! and Adam's m and v, plus the counters (step, applied) and the loss scaler; and the
//! whole model gathered, for tests and export.
//!
//! Export invariant: a checkpoint is always "one shard per rank", whatever the stage.
//! Rank r exports block `r * shard_len .. (r + 1) * shard_len` of every unit of the
//! engine's layout: its shard at stages 1-3, and at stage 0 (where every rank holds the
//! whole, identical state) its block of the full buffers. So the bytes written per rank
//! are Ψ/N x 12 at every stage, every rank writes in parallel, and a stage-0 checkpoint
//! is the same files as a stage-1 one (loadable at any stage).
//!
//! Import invariant: [`Engine::import_range`] says which elements of a unit this rank
//! keeps (the whole unit at stage 0, its shard at stages 1-3); the caller passes exactly
//! those to [`Engine::import_unit`]; [`Engine::finish_import`] then rebuilds everything
//! derived from the master (16-bit parameter copies, full parameter buffers of stages
//! 1/2 by all-gather, stage-3 persistent units) and sets the counters. In fp32 training
//! the parameters are the master. From the first `import_unit` until a `finish_import`
//! succeeds the state is part old, part new ([`Engine::import_pending`]): steps, exports
//! and checkpoints refuse it ([`EngineError::ImportPending`]); imports go on.
//!
//! Every transfer here goes through the compute stream and waits for it: these are
//! between-steps operations, not part of the step's overlap.

use std::ops::Range;

use zero_comm::Communicator;
use zero_kernels::device::{Buffer, Device, FloatBuffer};
use zero_kernels::{DType, Float};

use super::{optimizer, Engine, EngineError, LossScaler};
use crate::plan::UnitPlacement;

/// One unit of this rank's exported state: its block of the unit (see the file head).
#[derive(Clone, Debug, PartialEq)]
pub struct UnitState {
    /// The block, in elements of the unit's padded flat buffer.
    pub range: Range<usize>,
    /// fp32 master weights of the block.
    pub master: Vec<f32>,
    /// Adam first moment of the block.
    pub adam_m: Vec<f32>,
    /// Adam second moment of the block.
    pub adam_v: Vec<f32>,
}

impl<D: Device, C: Communicator> Engine<'_, D, C> {
    fn placement(&self, u: usize) -> Result<&UnitPlacement, EngineError> {
        self.core.plan.placements.get(u).ok_or_else(|| {
            EngineError::Mismatch(format!(
                "unit {u} is out of range: the model has {} units",
                self.core.plan.placements.len()
            ))
        })
    }

    /// This rank's block of unit `u` (master, m, v), copied to the host.
    pub fn export_unit(&self, u: usize) -> Result<UnitState, EngineError> {
        self.check_intact()?;
        let at = self.placement(u)?.clone();
        let (dev, s) = (self.core.dev, &self.core.streams.compute);
        let own_state = at.own_within(&at.state);
        let n = at.own.len();
        let mut out = UnitState {
            range: at.own.clone(),
            master: vec![0.0; n],
            adam_m: vec![0.0; n],
            adam_v: vec![0.0; n],
        };
        match &self.bufs.master {
            Some(m) => dev.download(s, m.slice(own_state.clone()), &mut out.master)?,
            None => dev.download(
                s,
                self.bufs
                    .params
                    .get::<f32>()?
                    .slice(at.own_within(&at.updated_params)),
                &mut out.master,
            )?,
        }
        dev.download(
            s,
            self.bufs.adam_m.slice(own_state.clone()),
            &mut out.adam_m,
        )?;
        dev.download(s, self.bufs.adam_v.slice(own_state), &mut out.adam_v)?;
        Ok(out)
    }

    /// The elements of unit `u` this rank keeps (unit-relative): the whole unit at stage
    /// 0, its shard otherwise. [`Engine::import_unit`] takes exactly these.
    pub fn import_range(&self, u: usize) -> Result<Range<usize>, EngineError> {
        Ok(self.placement(u)?.updates.clone())
    }

    /// Set what this rank keeps of unit `u` ([`Engine::import_range`]) from host data;
    /// call [`Engine::finish_import`] after every unit. Until one succeeds the engine
    /// refuses steps and exports ([`Engine::import_pending`]). The first call after a
    /// finish (or on a fresh engine) begins an import, as [`Engine::begin_import`] does.
    pub fn import_unit(
        &mut self,
        u: usize,
        master: &[f32],
        adam_m: &[f32],
        adam_v: &[f32],
    ) -> Result<(), EngineError> {
        self.check_not_interrupted()?;
        let at = self.placement(u)?.clone();
        let n = at.updates.len();
        for (what, len) in [
            ("master", master.len()),
            ("adam_m", adam_m.len()),
            ("adam_v", adam_v.len()),
        ] {
            if len != n {
                return Err(EngineError::Mismatch(format!(
                    "importing unit {u}: {what} has {len} elements, this rank keeps {n} ({:?})",
                    at.updates
                )));
            }
        }
        // From the first upload on, the state is part this import's.
        if !self.import_pending {
            self.begin_import();
        }
        let (dev, s) = (self.core.dev, &self.core.streams.compute);
        let bufs = &mut self.bufs;
        match &mut bufs.master {
            Some(m) => dev.upload(s, master, m.slice_mut(at.state.clone()))?,
            None => dev.upload(
                s,
                master,
                bufs.params
                    .get_mut::<f32>()?
                    .slice_mut(at.updated_params.clone()),
            )?,
        }
        dev.upload(s, adam_m, bufs.adam_m.slice_mut(at.state.clone()))?;
        dev.upload(s, adam_v, bufs.adam_v.slice_mut(at.state))?;
        // Counted only once all three uploads were made: a failed one leaves it to do.
        if let Some(done) = self.imported.get_mut(u) {
            *done = true;
        }
        Ok(())
    }

    /// After every unit was imported: rebuild what derives from the master and restore
    /// the counters and the loss scaler. Collective: every rank calls it, also one whose
    /// import failed part-way (it then returns its own error, the others
    /// [`EngineError::PeerImport`]). Only its success makes the engine whole again after
    /// [`Engine::import_unit`]; while an import is pending it needs every unit imported
    /// since the import began ([`EngineError::ImportIncomplete`] names the others), and
    /// on any error the import stays pending. Without an import pending it only rebuilds
    /// and sets the counters.
    pub fn finish_import(
        &mut self,
        step: u64,
        applied: u64,
        scaler: LossScaler,
    ) -> Result<(), EngineError> {
        // Before any collective: after a step failed part-way the ranks may be at
        // different ones.
        self.check_not_interrupted()?;
        // What may differ between ranks (an import that stopped early on one) is agreed
        // before the rebuild's gathers, so that no rank waits in one that another left.
        let mine = self.check_finish(step, applied, &scaler).err();
        let text = mine.as_ref().map(ToString::to_string);
        let failures = zero_comm::gather_failures(self.core.comm, text.as_deref())?;
        if let Some(e) = mine {
            return Err(e);
        }
        if !failures.is_empty() {
            return Err(EngineError::PeerImport { failures });
        }
        let (core, bufs) = (&self.core, &mut self.bufs);
        match core.plan.param_dtype {
            DType::F32 => optimizer::refresh_from_master::<f32, D, C>(core, bufs)?,
            DType::BF16 => optimizer::refresh_from_master::<half::bf16, D, C>(core, bufs)?,
            DType::F16 => optimizer::refresh_from_master::<half::f16, D, C>(core, bufs)?,
            other => return Err(EngineError::Internal(format!("parameter dtype {other}"))),
        }
        core.dev.synchronize()?;
        self.step = step;
        self.applied = applied;
        self.scaler = scaler;
        self.import_pending = false;
        self.imported.clear();
        Ok(())
    }

    /// What [`Engine::finish_import`] refuses on this rank: a damaged scaler or counters,
    /// or units an import pending has not imported.
    fn check_finish(
        &self,
        step: u64,
        applied: u64,
        scaler: &LossScaler,
    ) -> Result<(), EngineError> {
        // A scale outside [2^-126, 2^127] (or NaN) would turn every step into an
        // "overflow" (not far below 2^-126, 1/scale is infinite in f32) and blame the
        // learning rate or the data.
        let scale_ok =
            |s: f64| (super::scaler::MIN_LOSS_SCALE..=super::scaler::MAX_LOSS_SCALE).contains(&s);
        // (The floor matters only where scaling is on; nothing validates it elsewhere.)
        if !scale_ok(scaler.scale) || (scaler.enabled && !scale_ok(scaler.min_scale)) {
            return Err(EngineError::Mismatch(format!(
                "the imported loss scaler has scale {} and min_scale {}: both must be at least 2^-126 (f32's smallest normal number; not far below it 1/scale is infinite in f32) and at most 2^127 (a damaged or hand-edited state?)",
                scaler.scale, scaler.min_scale
            )));
        }
        // Counters a step adds to: beyond 2^53 (where JSON's numbers stop being exact) or
        // out of order they are damaged, and would overflow.
        if step > 1 << 53 || applied > step {
            return Err(EngineError::Mismatch(format!(
                "the imported step counters are step {step} and applied {applied}: need applied <= step <= 2^53 (a damaged or hand-edited state?)"
            )));
        }
        if !self.import_pending {
            return Ok(());
        }
        let units = &self.core.layout.units;
        let missing: Vec<(usize, String)> = units
            .iter()
            .enumerate()
            .filter(|&(u, _)| !self.imported.get(u).copied().unwrap_or(false))
            .map(|(u, unit)| (u, unit.name.clone()))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(EngineError::ImportIncomplete {
            missing,
            units: units.len(),
        })
    }

    /// Mark an import as begun ([`Engine::import_pending`]) before anything of it is
    /// read, with no unit imported yet: [`Engine::finish_import`] then needs every unit
    /// imported after this call. A collective import (a checkpoint load) calls it on
    /// every rank first, so that one that fails on some rank before that rank imports a
    /// unit leaves every rank refusing steps alike: a rank that stepped while its peers
    /// refused would wait in the step's first collective.
    pub fn begin_import(&mut self) {
        self.import_pending = true;
        self.imported = vec![false; self.core.layout.units.len()];
    }

    /// Units were imported ([`Engine::import_unit`], or [`Engine::begin_import`]) and no
    /// [`Engine::finish_import`] succeeded since: the state is part old, part new, and
    /// steps, exports and checkpoint saves refuse it ([`EngineError::ImportPending`])
    /// until every unit is imported again and the import finished.
    pub fn import_pending(&self) -> bool {
        self.import_pending
    }

    /// Restore what a checkpoint carries of the run beyond its tensors and counters: the
    /// loss guard and the history (a resume then records itself on top).
    pub fn restore_run(&mut self, guard: super::guard::LossGuard, history: Vec<String>) {
        self.guard = guard;
        self.history = history;
    }

    /// The fp32 value of every parameter (unpadded, in layout order) as the working
    /// copy holds it, gathered to every rank (a collective at every stage, though only
    /// stage 3's partitioned units move): for tests and export. Allocates Ψ floats
    /// on the host; not for the training loop.
    ///
    /// Collective: every rank of the engine's communicator calls it, at the same point
    /// of the run (it all-gathers unit by unit). To dump weights from one rank, call it
    /// on every rank and write on rank 0 only: called on one rank alone, it waits for the
    /// others, and an MPI job hangs until the watchdog ends it (`ZERO_COMM_TIMEOUT`).
    /// [`Engine::export_unit`] is local.
    pub fn full_params_f32(&self) -> Result<Vec<f32>, EngineError> {
        self.check_intact()?;
        let params = |at: &UnitPlacement| at.params.clone();
        self.full_f32(&self.bufs.params, self.core.plan.param_dtype, params)
    }

    /// The last step's reduced gradient of every parameter as f32 (unpadded, layout
    /// order), gathered to every rank: what AdamW read, before clipping and still
    /// multiplied by the loss scale that step used (`StepReport::loss_scale`). It is
    /// there from the end of a step until the next step starts (which zeroes it). Each
    /// rank contributes the block it owns (`UnitPlacement::norm_grads`), so the result is
    /// the same at every stage. For tests and inspection: allocates Ψ floats on the host.
    ///
    /// Collective: every rank of the engine's communicator calls it, at the same point
    /// of the run (it all-gathers unit by unit). To dump weights from one rank, call it
    /// on every rank and write on rank 0 only: called on one rank alone, it waits for the
    /// others, and an MPI job hangs until the watchdog ends it (`ZERO_COMM_TIMEOUT`).
    /// [`Engine::export_unit`] is local.
    pub fn full_grads_f32(&self) -> Result<Vec<f32>, EngineError> {
        self.check_intact()?;
        let own_block = |at: &UnitPlacement| at.norm_grads.clone();
        self.full_f32(
            &self.bufs.grads,
            self.core.plan.inputs.grad_dtype,
            own_block,
        )
    }

    /// Every unit of `buf` (elements of `dtype`) as f32, unpadded, in layout order: each
    /// rank's `held` range of the unit (the whole unit, or its own block), gathered.
    fn full_f32(
        &self,
        buf: &FloatBuffer<D>,
        dtype: DType,
        held: impl Fn(&UnitPlacement) -> Range<usize>,
    ) -> Result<Vec<f32>, EngineError> {
        match dtype {
            DType::F32 => self.full_as::<f32>(buf, held),
            DType::BF16 => self.full_as::<half::bf16>(buf, held),
            DType::F16 => self.full_as::<half::f16>(buf, held),
            other => Err(EngineError::Internal(format!("a {other} buffer"))),
        }
    }

    fn full_as<T: Float>(
        &self,
        buf: &FloatBuffer<D>,
        held: impl Fn(&UnitPlacement) -> Range<usize>,
    ) -> Result<Vec<f32>, EngineError> {
        let (dev, s) = (self.core.dev, &self.core.streams.compute);
        let values = buf.get::<T>()?;
        let mut out = Vec::with_capacity(self.core.layout.numel());
        for (unit, at) in self
            .core
            .layout
            .units
            .iter()
            .zip(&self.core.plan.placements)
        {
            let range = held(at);
            let mut mine = vec![T::from_f32(0.0); range.len()];
            dev.download(s, values.slice(range), &mut mine)?;
            let whole = self.gathered(mine, at, unit.padded_len)?;
            out.extend(whole[..unit.numel].iter().map(|x| x.to_f32()));
        }
        Ok(out)
    }

    /// The fp32 master of every parameter (unpadded, layout order), gathered to every
    /// rank; in fp32 training the parameters themselves.
    ///
    /// Collective: every rank of the engine's communicator calls it, at the same point
    /// of the run (it all-gathers unit by unit). To dump weights from one rank, call it
    /// on every rank and write on rank 0 only: called on one rank alone, it waits for the
    /// others, and an MPI job hangs until the watchdog ends it (`ZERO_COMM_TIMEOUT`).
    /// [`Engine::export_unit`] is local.
    pub fn full_master_f32(&self) -> Result<Vec<f32>, EngineError> {
        self.check_intact()?;
        let mut out = Vec::with_capacity(self.core.layout.numel());
        for (u, unit) in self.core.layout.units.iter().enumerate() {
            let s = self.export_unit(u)?;
            let mut whole = vec![0.0f32; unit.padded_len];
            whole[s.range.clone()].copy_from_slice(&s.master);
            self.core.comm.all_gather_in_place(&mut whole[..])?;
            out.extend_from_slice(&whole[..unit.numel]);
        }
        Ok(out)
    }

    /// Every tensor's fp32 master as an ndarray of its shape, by name (gathered to every
    /// rank, like [`Engine::full_master_f32`]); the row blocks of a split tensor joined
    /// ([`crate::RowBlock`]).
    ///
    /// Collective: every rank of the engine's communicator calls it, at the same point
    /// of the run (it all-gathers unit by unit). To dump weights from one rank, call it
    /// on every rank and write on rank 0 only: called on one rank alone, it waits for the
    /// others, and an MPI job hangs until the watchdog ends it (`ZERO_COMM_TIMEOUT`).
    /// [`Engine::export_unit`] is local.
    pub fn master_arrays(&self) -> Result<Vec<(String, ndarray::ArrayD<f32>)>, EngineError> {
        let flat = self.full_master_f32()?;
        let params = &self.core.layout.params;
        let mut starts = Vec::with_capacity(params.len());
        params.iter().fold(0, |at, p| {
            starts.push(at);
            at + p.numel
        });
        let mut out = Vec::new();
        for t in self.core.layout.tensors() {
            let mut values = Vec::with_capacity(t.numel());
            for &(i, _) in &t.parts {
                values.extend_from_slice(&flat[starts[i]..starts[i] + params[i].numel]);
            }
            let a = ndarray::ArrayD::from_shape_vec(t.shape.clone(), values)
                .map_err(|e| EngineError::Internal(format!("tensor '{}': {e}", t.name)))?;
            out.push((t.name, a));
        }
        Ok(out)
    }

    /// The whole padded unit from what this rank holds of it: already whole (stages
    /// 0-2), or its shard, all-gathered (stage 3).
    fn gathered<T: zero_kernels::Element>(
        &self,
        held: Vec<T>,
        at: &UnitPlacement,
        padded_len: usize,
    ) -> Result<Vec<T>, EngineError> {
        if held.len() == padded_len {
            return Ok(held);
        }
        let mut whole = vec![T::default(); padded_len];
        self.core.comm.all_gather(&held[..], &mut whole[..])?;
        debug_assert_eq!(at.own.len(), held.len());
        Ok(whole)
    }
}
