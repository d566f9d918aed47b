//! One optimizer step, top to bottom, as llm.c's training loop reads: micro-steps
//! (forward, loss, backward with per-unit reduction at stages 2/3) -> full gradients
//! reduced once (stages 0/1, or 2/3 accumulating locally) -> agree on overflow, norm and
//! loss across ranks -> AdamW on this rank's share -> share the new parameters. In the
//! step the stage differences sit at three points: which buffers hold what (the plan's
//! placements), the boundary reduction below, and the sharing (`optimizer.rs`); the
//! fourth is before step 1 (which part of a fresh unit a rank keeps, `init_params`).
//!
//! Steps are numbered from 1 wherever a user sees them (reports, logs, errors, the
//! checkpoint `step-S` holding the state after step S); the engine's step counter is
//! the number of steps done, which is also the 0-based index of the next step (its data
//! position and learning rate).

use std::time::Instant;

use zero_comm::Communicator;
use zero_kernels::device::{Buffer, Device};
use zero_kernels::{DType, Float};

use super::buffers::Buffers;
use super::reducer::Landing;
use super::{
    agree, optimizer, passes, Core, Engine, EngineError, NodeStats, StepReport, WaitPoint,
};
use crate::config::{DivergencePolicy, Stage};
use crate::model::Model;

impl<D: Device, C: Communicator> Engine<'_, D, C> {
    /// Run one optimizer step over this rank's `batches` (one per micro-step: exactly
    /// `grad_accum` of them).
    pub fn step<M: Model<D>>(
        &mut self,
        model: &mut M,
        batches: &[M::Batch<'_>],
    ) -> Result<StepReport, EngineError> {
        self.check_model(model)?;
        let a = self.core.config.grad_accum;
        if batches.len() != a {
            return Err(EngineError::Mismatch(format!(
                "got {} micro-batches for grad_accum = {a}; pass one batch per micro-step",
                batches.len()
            )));
        }
        self.check_intact()?;
        // The mode is the device's: another engine (or the caller) on this device may
        // have changed it since `Engine::new` set it.
        let bf16 = self.core.config.precision.dtype == crate::config::Precision::Bf16;
        self.core.dev.set_bf16_products(bf16);
        // The loss is copied out after each forward: one f32, by the Model contract.
        let loss_len = model.loss().len();
        if loss_len != 1 {
            return Err(EngineError::Mismatch(format!(
                "the model's loss() view has {loss_len} elements: it must be the micro-batch's mean loss, one f32 (Model::loss)"
            )));
        }
        // Until the step returns Ok or an error every rank agreed on, it is part-way: an
        // error in between leaves buffers, events and collectives mid-step.
        self.interrupted = Some(self.step + 1);
        let report = match self.core.plan.param_dtype {
            DType::F32 => self.step_with_param::<f32, M>(model, batches),
            DType::BF16 => self.step_with_param::<half::bf16, M>(model, batches),
            DType::F16 => self.step_with_param::<half::f16, M>(model, batches),
            p => Err(EngineError::Internal(format!("parameters in {p}"))),
        };
        if report
            .as_ref()
            .map_or_else(EngineError::is_agreed_stop, |_| true)
        {
            self.interrupted = None;
        }
        report
    }

    /// The step (counted from 1) that failed part-way, if one did: this engine then runs
    /// no more steps and moves no state ([`EngineError::Interrupted`]).
    pub fn interrupted(&self) -> Option<u64> {
        self.interrupted
    }

    /// Refuse to go on after a step that failed part-way ([`EngineError::Interrupted`]),
    /// or with state imported and not finished ([`EngineError::ImportPending`]): what
    /// steps and exports check.
    pub(super) fn check_intact(&self) -> Result<(), EngineError> {
        self.check_not_interrupted()?;
        if self.import_pending {
            return Err(EngineError::ImportPending);
        }
        Ok(())
    }

    /// Refuse to go on after a step that failed part-way ([`EngineError::Interrupted`]):
    /// what imports check (an import pending is theirs to finish).
    pub(super) fn check_not_interrupted(&self) -> Result<(), EngineError> {
        match self.interrupted {
            Some(step) => Err(EngineError::Interrupted { step }),
            None => Ok(()),
        }
    }

    /// The step with parameters in P: the gradient accumulator (G) and the reduction (W)
    /// are each P or f32 (for fp32 training both are f32).
    fn step_with_param<P: Float, M: Model<D>>(
        &mut self,
        model: &mut M,
        batches: &[M::Batch<'_>],
    ) -> Result<StepReport, EngineError> {
        let plan = &self.core.plan;
        let (g, w) = (plan.inputs.grad_dtype, plan.inputs.reduce_dtype);
        let p_or_f32 = |t: DType| t == P::DTYPE || t == DType::F32;
        if !p_or_f32(g) || !p_or_f32(w) {
            return Err(EngineError::Internal(format!(
                "parameters {} with gradients accumulated in {g} and reduced in {w}",
                P::DTYPE
            )));
        }
        match (g == DType::F32, w == DType::F32) {
            (false, false) => self.step_as::<P, P, P, M>(model, batches),
            (false, true) => self.step_as::<P, P, f32, M>(model, batches),
            (true, false) => self.step_as::<P, f32, P, M>(model, batches),
            (true, true) => self.step_as::<P, f32, f32, M>(model, batches),
        }
    }

    /// The step with parameters in P, gradients accumulated in G and reduced in W.
    fn step_as<P: Float, G: Float, W: Float, M: Model<D>>(
        &mut self,
        model: &mut M,
        batches: &[M::Batch<'_>],
    ) -> Result<StepReport, EngineError> {
        let start = Instant::now();
        let Engine {
            core,
            bufs,
            scaler,
            step,
            applied,
            guard,
            ..
        } = self;
        let comm_before = core.comm.stats();
        let overlap_before = core.dev.overlap_stats();
        let groups_before = core.nodes.map(NodeStats::of);
        let (n, a) = (core.comm.size(), batches.len());
        let loss_scale = scaler.scale;
        // Each micro-batch's mean loss weighs 1/(N A) in the global-batch mean; the loss
        // scale rides along so that small fp16 gradients stay representable (scaler.rs).
        let weight = (loss_scale / (n * a) as f64) as f32;

        // 0. The parameters are current on both streams; the gradients start at zero.
        start_step::<G, D, C>(core, bufs)?;

        // 1. Micro-steps.
        for (m, batch) in batches.iter().enumerate() {
            model.begin_micro_step(core.compute(), batch)?;
            let gathered = passes::forward::<P, D, C, M>(core, bufs, model)?;
            core.dev.copy(
                &core.streams.compute,
                model.loss(),
                bufs.losses.slice_mut(m..m + 1),
            )?;
            let last = m + 1 == batches.len();
            passes::backward::<P, G, W, D, C, M>(core, bufs, model, gathered, weight, last)?;
        }

        // 2. Full gradients are reduced once per step, each unit as soon as the last
        //    micro-step's backward has completed it (passes.rs), as DDP's buckets are;
        //    here only the units no layer uses.
        if !core.plan.grads_sharded {
            for u in (0..core.plan.uses.len()).filter(|&u| core.plan.uses[u].is_empty()) {
                reduce_full_unit::<G, W, D, C>(core, bufs, u)?;
            }
        }

        // 3. Agree across ranks on overflow, gradient norm and loss; judge the loss.
        let agreed = agree::agree::<G, D, C>(core, bufs, a, loss_scale)?;
        let index = *step; // 0-based: the data position and the schedule's step
        let number = index + 1; // what users see: steps count from 1
        let lr = core.config.optim.lr_at(index as usize);
        let guard_cfg = &core.config.divergence;
        // An overflowing step is the loss scaler's business (skipped, or NonFinite below).
        let diverged = match agreed.overflow {
            true => None,
            false => guard.judge(agreed.loss, guard_cfg),
        };
        let rank0 = core.comm.rank() == 0;
        if let Some(why) = diverged {
            guard.events = guard.events.saturating_add(1);
            match guard_cfg.policy {
                DivergencePolicy::Stop => {
                    return Err(EngineError::Diverged {
                        step: number,
                        loss: agreed.loss,
                        why,
                    })
                }
                DivergencePolicy::Warn if rank0 => log::warn!(
                    "step {number}: the loss {} is {why} ({} divergent step(s) so far; divergence.policy = \"warn\")",
                    agreed.loss,
                    guard.events
                ),
                DivergencePolicy::SkipStep if rank0 => log::warn!(
                    "step {number}: the loss {} is {why}; the step is skipped on every rank ({} divergent step(s) so far)",
                    agreed.loss,
                    guard.events
                ),
                _ => {}
            }
        }
        let skip_for_loss = diverged.is_some() && guard_cfg.policy == DivergencePolicy::SkipStep;
        if skip_for_loss {
            guard.skipped_in_a_row = guard.skipped_in_a_row.saturating_add(1);
            if guard.skipped_in_a_row > guard_cfg.max_consecutive_skips {
                return Err(EngineError::SkippedTooLong {
                    step: number,
                    skipped: guard.skipped_in_a_row - 1,
                });
            }
        }

        // 4-5. AdamW on this rank's share, then share the new parameters.
        if !agreed.overflow && !skip_for_loss {
            let clip = core.config.optim.grad_clip;
            // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), capped at 1.
            let coef = if clip > 0.0 && agreed.grad_norm > clip {
                clip / (agreed.grad_norm + 1e-6)
            } else {
                1.0
            };
            let grad_mult = (coef / loss_scale) as f32;
            optimizer::update::<P, G, D, C>(core, bufs, *applied + 1, lr, grad_mult)?;
            optimizer::publish::<P, D, C>(core, bufs)?;
            *applied += 1;
            guard.record(agreed.loss, guard_cfg);
            guard.skipped_in_a_row = 0;
        } else if agreed.overflow && !scaler.enabled {
            // Nothing will make the next step finite: stop with what happened (every rank
            // agreed on the overflow, so every rank returns this error).
            return Err(EngineError::NonFinite {
                step: number,
                loss: agreed.loss,
                precision: format!("{:?}", core.config.precision.dtype).to_lowercase(),
            });
        } else if agreed.overflow && rank0 {
            log::warn!(
                "step {number}: inf/NaN gradient (loss scale {loss_scale}); step skipped on every rank"
            );
        }
        // A step skipped for its loss had finite gradients: it tells the loss scaler
        // nothing (neither an overflow nor a clean step).
        if !skip_for_loss {
            scaler.update(agreed.overflow);
        }
        *step += 1;
        let max_skips = core.config.precision.max_skips_at_min_scale;
        if scaler.enabled && scaler.skips_at_min >= max_skips {
            return Err(EngineError::NoProgress {
                step: number,
                skips: scaler.skips_at_min,
                scale: scaler.min_scale,
            });
        }
        core.dev.synchronize()?;
        let memory = self.memory();
        Ok(StepReport {
            step: number,
            loss: agreed.loss,
            grad_norm: agreed.grad_norm,
            lr,
            loss_scale,
            skipped: agreed.overflow || skip_for_loss,
            diverged,
            seconds: start.elapsed().as_secs_f64(),
            comm: self.core.comm.stats() - comm_before,
            overlap: self.core.dev.overlap_stats() - overlap_before,
            node_comm: self
                .core
                .nodes
                .map(NodeStats::of)
                .zip(groups_before)
                .map(|(after, before)| after - before),
            memory,
        })
    }
}

/// Both streams wait for the last write of the parameters; compute zeroes the gradient
/// accumulator (its readers, last step's statistics and update, ran on compute too).
fn start_step<G: Float, D: Device, C: Communicator>(
    core: &Core<'_, D, C>,
    bufs: &mut Buffers<D>,
) -> Result<(), EngineError> {
    if let Some(e) = &bufs.params_ready {
        core.wait(WaitPoint::ParamsReady, &core.streams.compute, e)?;
        core.wait(WaitPoint::ParamsReady, &core.streams.comm, e)?;
    }
    bufs.reducer.before_rewriting_sources(core)?;
    let grads = bufs.grads.get_mut::<G>()?;
    core.dev
        .fill(&core.streams.compute, grads.view_mut(), G::from_f32(0.0))?;
    Ok(())
}

/// Full gradients (stage 0, and stage 1 without sharded gradients): reduce unit `u`'s
/// whole gradient (in G). Stage 0 all-reduces it (in place when G = W, else in bucket-sized
/// chunks through a bucket); stage 1 reduce-scatters it so that this rank's block holds
/// the sum (the other blocks keep stale local values, never read).
pub(super) fn reduce_full_unit<G: Float, W: Float, D: Device, C: Communicator>(
    core: &Core<'_, D, C>,
    bufs: &mut Buffers<D>,
    u: usize,
) -> Result<(), EngineError> {
    let Buffers { grads, reducer, .. } = bufs;
    let at = &core.plan.placements[u];
    if core.config.zero.stage == Stage::Zero0 {
        let grads = grads.get_mut::<G>()?;
        return reducer.all_reduce::<G, W, C>(core, grads, at.grads.clone(), core.plan.bucket_len);
    }
    let shard_len = core.layout.units[u].shard_len;
    for c in core.plan.shard_chunks(shard_len) {
        let src = grads.get::<G>()?.slice(at.grads.clone());
        let sent = reducer.send::<G, W, C>(core, src, shard_len, c.clone())?;
        let own = at.reduced_grads.start;
        let dst = grads.get_mut::<G>()?.slice_mut(own + c.start..own + c.end);
        reducer.land::<W, G, C>(core, sent, dst, Landing::Overwrite)?;
    }
    // The unit's gradient is whole: the backward of the layers below does not rewrite
    // it, and compute reads it only after `finish` (the agreement) waited for comm.
    reducer.sources_kept();
    Ok(())
}
