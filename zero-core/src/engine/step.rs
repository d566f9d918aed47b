//! One optimizer step, top to bottom (STYLE.md rule 6): micro-steps (forward, backward
//! with per-unit reduction at stages 2/3) -> reduce full gradients once (stages 0/1, or
//! 2/3 accumulating locally) -> agree on overflow, norm and loss across ranks -> AdamW on
//! this rank's shard -> all-gather the updated parameters (stages 1/2; stage 3 only its
//! persistent units). Stage differences are the `match`/`if` at those points only.

use std::time::Instant;

use zero_comm::{Communicator, ReduceOp};
use zero_kernels::adamw::{self, AdamWHyper, AdamWSegment, AdamWState};
use zero_kernels::{gradstats, DType};

use super::buffers::Buffers;
use super::passes::{self, Ctx};
use super::real::Real;
use super::reduce;
use super::{Engine, EngineError, StepReport};
use crate::config::Stage;
use crate::model::{Batch, Model};

impl<C: Communicator> Engine<'_, C> {
    /// Run one optimizer step over this rank's `batches` (one per micro-step: exactly
    /// `grad_accum` of them, each `micro_batch x seq_len` tokens).
    pub fn step(
        &mut self,
        model: &mut dyn Model,
        batches: &[Batch<'_>],
    ) -> Result<StepReport, EngineError> {
        let t = &self.config.train;
        if batches.len() != t.grad_accum {
            return Err(EngineError::Mismatch(format!(
                "got {} micro-batches for grad_accum = {}; pass one batch per micro-step",
                batches.len(),
                t.grad_accum
            )));
        }
        for (m, b) in batches.iter().enumerate() {
            let want = t.micro_batch * t.seq_len;
            if b.rows != t.micro_batch
                || b.seq_len != t.seq_len
                || b.inputs.len() != want
                || b.targets.len() != want
            {
                return Err(EngineError::Mismatch(format!(
                    "micro-batch {m} is {} x {} with {} inputs and {} targets; the config says micro_batch = {}, seq_len = {} ({want} tokens)",
                    b.rows, b.seq_len, b.inputs.len(), b.targets.len(), t.micro_batch, t.seq_len
                )));
            }
        }
        match (self.plan.param_dtype, self.plan.inputs.reduce_dtype) {
            (DType::F32, DType::F32) => self.step_as::<f32, f32>(model, batches),
            (DType::BF16, DType::BF16) => self.step_as::<half::bf16, half::bf16>(model, batches),
            (DType::BF16, DType::F32) => self.step_as::<half::bf16, f32>(model, batches),
            (DType::F16, DType::F16) => self.step_as::<half::f16, half::f16>(model, batches),
            (DType::F16, DType::F32) => self.step_as::<half::f16, f32>(model, batches),
            (p, w) => Err(EngineError::Internal(format!(
                "parameters {p} reduced in {w}"
            ))),
        }
    }

    fn step_as<P: Real, W: Real>(
        &mut self,
        model: &mut dyn Model,
        batches: &[Batch<'_>],
    ) -> Result<StepReport, EngineError> {
        let start = Instant::now();
        let comm_before = self.comm.stats();
        let (n, rank) = (self.comm.size(), self.comm.rank());
        let stage = self.config.zero.stage;
        let train = &self.config.train;
        let a = batches.len();
        let tokens = (n * a * train.micro_batch * train.seq_len) as u64;
        let loss_scale = self.scaler.scale;
        // d(global mean loss x scale)/d(each position's cross-entropy): summing the
        // gradients over ranks and micro-steps then gives the global-batch gradient.
        let grad_scale = (loss_scale / tokens as f64) as f32;

        // 1. Micro-steps.
        let Engine {
            comm,
            exec,
            spec,
            layout,
            plan,
            bufs,
            ..
        } = self;
        let cx = Ctx {
            comm: *comm,
            exec,
            spec,
            layout,
            plan,
        };
        bufs.grads.fill_zero();
        let mut loss_sum = 0.0f64;
        for batch in batches {
            model.begin_micro_step(batch)?;
            passes::forward::<C, P, W>(&cx, bufs, model)?;
            loss_sum += model.loss() as f64;
            passes::backward::<C, P, W>(&cx, bufs, model, grad_scale)?;
        }

        // 2. Full gradients are reduced once per step.
        if !plan.grads_sharded {
            let Buffers {
                grads,
                buckets,
                pieces,
                ..
            } = bufs;
            let g = P::of_mut(grads)?;
            let bucket = W::of_mut(&mut buckets[0])?;
            if stage == Stage::Zero0 {
                let chunks = |len| plan.full_chunks(len);
                reduce::all_reduce_full(cx.comm, exec, &layout.units, chunks, g, bucket)?;
            } else {
                let chunks = |len| plan.shard_chunks(len);
                let piece = W::of_mut(&mut pieces[0])?;
                reduce::reduce_scatter_full(
                    cx.comm,
                    exec,
                    &layout.units,
                    chunks,
                    g,
                    bucket,
                    piece,
                )?;
            }
        }

        // 3. Agree across ranks: squared norm of this rank's shard (each element counted
        // once over all ranks, so the sum is the full gradient's), overflow, loss.
        let inv_scale = (1.0 / loss_scale) as f32;
        let grads = P::of(&bufs.grads)?;
        let (mut sum_squares, mut nonfinite) = (0.0f64, false);
        for u in 0..layout.units.len() {
            let g = &grads[grad_shard_range(&cx, u)];
            let s = gradstats::stats(exec, P::float_slice(g), inv_scale);
            sum_squares += s.sum_squares;
            nonfinite |= s.nonfinite;
        }
        let mut agreed = [sum_squares, if nonfinite { 1.0 } else { 0.0 }, loss_sum];
        cx.comm.all_reduce(&mut agreed[..], ReduceOp::Sum)?;
        let loss = agreed[2] / (n * a) as f64;
        let overflow = agreed[1] > 0.0 || !agreed[0].is_finite();
        let grad_norm = agreed[0].sqrt();
        let step = self.step;
        let lr = self
            .config
            .optim
            .lr_at(step as usize, self.config.train.steps);

        // 4-5. AdamW on this rank's shard, then gather what other ranks need.
        if !overflow {
            let clip = self.config.optim.grad_clip;
            // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), capped at 1.
            let coef = if clip > 0.0 && grad_norm > clip {
                clip / (grad_norm + 1e-6)
            } else {
                1.0
            };
            let grad_mult = (coef / loss_scale) as f32;
            self.update::<P>(self.applied + 1, lr, grad_mult)?;
            self.gather_params::<P>()?;
            self.applied += 1;
        } else if !self.scaler.enabled {
            // Nothing will make the next step finite: stop with what happened (every rank
            // agreed on the overflow, so every rank returns this error).
            return Err(EngineError::NonFinite {
                step,
                loss,
                precision: format!("{:?}", self.config.precision.dtype).to_lowercase(),
            });
        } else if rank == 0 {
            log::warn!(
                "step {step}: inf/NaN gradient (loss scale {loss_scale}); step skipped on every rank"
            );
        }
        self.scaler.update(overflow);
        self.step += 1;
        Ok(StepReport {
            step,
            loss,
            grad_norm,
            lr,
            loss_scale,
            skipped: overflow,
            tokens,
            seconds: start.elapsed().as_secs_f64(),
            comm: self.comm.stats() - comm_before,
            memory: self.memory(),
        })
    }

    /// Fused AdamW over this rank's part of every unit (all of it at stage 0).
    fn update<P: Real>(&mut self, t: u64, lr: f64, grad_mult: f32) -> Result<(), EngineError> {
        let o = &self.config.optim;
        let hyper = [AdamWHyper {
            lr,
            beta1: o.betas[0],
            beta2: o.betas[1],
            eps: o.eps,
            weight_decay: o.weight_decay,
        }];
        let stage = self.config.zero.stage;
        let rank = self.comm.rank();
        let Buffers {
            params,
            grads,
            master,
            adam_m,
            adam_v,
            ..
        } = &mut self.bufs;
        let grads = P::of(grads)?;
        let params = P::of_mut(params)?;
        let cx = Ctx {
            comm: self.comm,
            exec: &self.exec,
            spec: &self.spec,
            layout: &self.layout,
            plan: &self.plan,
        };
        for (u, unit) in self.layout.units.iter().enumerate() {
            let own = rank * unit.shard_len..(rank + 1) * unit.shard_len;
            let own_in_full = unit.unit_offset + own.start..unit.unit_offset + own.end;
            // (optimizer state, parameters, unit-relative range) of this rank's part.
            let (state_at, param_at, grad_at, rel) = match stage {
                Stage::Zero0 => {
                    let all = cx.full_range(u);
                    (all.clone(), all.clone(), all, 0..unit.padded_len)
                }
                Stage::Zero1 | Stage::Zero2 => (
                    cx.shard_range(u),
                    own_in_full,
                    grad_shard_range(&cx, u),
                    own,
                ),
                Stage::Zero3 => (
                    cx.shard_range(u),
                    cx.shard_range(u),
                    grad_shard_range(&cx, u),
                    own,
                ),
            };
            let segments: Vec<AdamWSegment> = self
                .layout
                .segments(u, rel)?
                .into_iter()
                .map(|s| AdamWSegment {
                    range: s.range,
                    group: 0,
                    decay: s.weight_decay,
                })
                .collect();
            let g = P::float_slice(&grads[grad_at]);
            let (m, v) = (&mut adam_m[state_at.clone()], &mut adam_v[state_at.clone()]);
            match master {
                Some(master) => {
                    let state = AdamWState {
                        master: &mut master[state_at],
                        m,
                        v,
                    };
                    let p = P::half_mut(&mut params[param_at]);
                    adamw::step(&self.exec, &hyper, &segments, t, grad_mult, g, state, p)?;
                }
                None => {
                    // fp32 training: the parameters are the master weights.
                    let p: &mut [f32] = bytemuck::cast_slice_mut(&mut params[param_at]);
                    let state = AdamWState { master: p, m, v };
                    adamw::step(&self.exec, &hyper, &segments, t, grad_mult, g, state, None)?;
                }
            }
        }
        Ok(())
    }

    /// After the update: stages 1/2 all-gather every unit's parameters in place (each
    /// rank updated its block); stage 3 refreshes its persistent units.
    fn gather_params<P: Real>(&mut self) -> Result<(), EngineError> {
        let stage = self.config.zero.stage;
        let Buffers {
            params, persistent, ..
        } = &mut self.bufs;
        let params = P::of_mut(params)?;
        for (u, unit) in self.layout.units.iter().enumerate() {
            match stage {
                Stage::Zero0 => {}
                Stage::Zero1 | Stage::Zero2 => {
                    let at = unit.unit_offset..unit.unit_offset + unit.padded_len;
                    self.comm.all_gather_in_place(&mut params[at])?;
                }
                Stage::Zero3 => {
                    if let Some(p) = &mut persistent[u] {
                        let at = unit.shard_offset..unit.shard_offset + unit.shard_len;
                        self.comm.all_gather(&params[at], P::of_mut(p)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Where this rank's summed gradient of unit `u` sits in the Grads buffer: its shard
/// buffer when gradients are sharded, else its block of the full buffer.
fn grad_shard_range<C: Communicator>(cx: &Ctx<'_, C>, u: usize) -> std::ops::Range<usize> {
    if cx.plan.grads_sharded {
        cx.shard_range(u)
    } else {
        let unit = &cx.layout.units[u];
        let at = unit.unit_offset + cx.comm.rank() * unit.shard_len;
        at..at + unit.shard_len
    }
}
