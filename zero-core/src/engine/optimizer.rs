//! The update and what follows it: fused AdamW over what this rank updates of every unit
//! (all of it at stage 0, its shard otherwise: `plan/placement.rs`), on compute; then
//! the new parameters shared on comm, the one other stage difference of the step:
//!
//! ```text
//! stage 0     nothing: every rank updated everything
//! stage 1, 2  all-gather every unit's parameters in place (each rank updated its block)
//! stage 3     all-gather the persistent units (the rest is gathered on demand)
//! ```
//!
//! [`refresh_from_master`] rebuilds the 16-bit parameters from the fp32 master and shares
//! them the same way (after a checkpoint import).

use zero_comm::{on_stream, Communicator};
use zero_kernels::adamw::{AdamWHyper, AdamWSegment};
use zero_kernels::device::{AdamWStep, AdamWViews, Buffer, Device};
use zero_kernels::{DType, Float};

use super::buffers::Buffers;
use super::{Core, EngineError, WaitPoint};
use crate::config::Stage;

/// AdamW step `t` (from 1) with learning rate `lr`, the gradient (in G) multiplied by
/// `grad_mult` (1/loss scale x clip coefficient) on the way in.
pub(super) fn update<P: Float, G: Float, D: Device, C: Communicator>(
    core: &Core<'_, D, C>,
    bufs: &mut Buffers<D>,
    t: u64,
    lr: f64,
    grad_mult: f32,
) -> Result<(), EngineError> {
    let o = &core.config.optim;
    let groups = [AdamWHyper {
        lr,
        beta1: o.betas[0],
        beta2: o.betas[1],
        eps: o.eps,
        weight_decay: o.weight_decay,
    }];
    let compute = &core.streams.compute;
    let Buffers {
        params,
        grads,
        master,
        adam_m,
        adam_v,
        ..
    } = bufs;
    let grads = grads.get::<G>()?;
    for (u, at) in core.plan.placements.iter().enumerate() {
        let segments: Vec<AdamWSegment> = core
            .layout
            .segments(u, at.updates.clone())?
            .into_iter()
            .map(|s| AdamWSegment {
                range: s.range,
                group: 0,
                decay: s.weight_decay,
            })
            .collect();
        let step = AdamWStep {
            groups: &groups,
            segments: &segments,
            t,
            grad_scale: grad_mult,
        };
        let grad = grads.slice(at.reduced_grads.clone());
        let (m, v) = (
            adam_m.slice_mut(at.state.clone()),
            adam_v.slice_mut(at.state.clone()),
        );
        match master {
            Some(master) => {
                let state = AdamWViews {
                    master: master.slice_mut(at.state.clone()),
                    m,
                    v,
                };
                let p = params.get_mut::<P>()?.slice_mut(at.updated_params.clone());
                core.dev
                    .adamw::<G, P>(compute, &step, grad, state, Some(p))?;
            }
            None => {
                // fp32 training: the parameters are the master weights.
                let state = AdamWViews {
                    master: params
                        .get_mut::<f32>()?
                        .slice_mut(at.updated_params.clone()),
                    m,
                    v,
                };
                core.dev
                    .adamw::<G, f32>(compute, &step, grad, state, None)?;
            }
        }
    }
    Ok(())
}

/// Share the updated parameters (see the module doc); records when they are ready.
pub(super) fn publish<P: Float, D: Device, C: Communicator>(
    core: &Core<'_, D, C>,
    bufs: &mut Buffers<D>,
) -> Result<(), EngineError> {
    let comm = &core.streams.comm;
    core.hand_over(WaitPoint::Updated, &core.streams.compute, comm)?;
    match core.config.zero.stage {
        Stage::Zero0 => {}
        Stage::Zero1 | Stage::Zero2 => {
            for at in &core.plan.placements {
                let unit = at.params.clone();
                match &mut bufs.quant {
                    None => {
                        let unit = bufs.params.get_mut::<P>()?.slice_mut(unit);
                        on_stream::all_gather_in_place(core.comm, core.dev, comm, unit)?;
                    }
                    // qwZ: this rank's block as codes; every block read back, its own too.
                    Some(q) => {
                        let s = unit.len() / core.layout.world;
                        let own = unit.start + core.comm.rank() * s;
                        q.send(core, bufs.params.get::<P>()?.slice(own..own + s))?;
                        q.receive(core, s, bufs.params.get_mut::<P>()?.slice_mut(unit))?;
                    }
                }
            }
        }
        Stage::Zero3 => {
            let params = bufs.params.get::<P>()?;
            for (at, p) in core.plan.placements.iter().zip(&mut bufs.persistent) {
                if let Some(p) = p {
                    let shard = params.slice(at.params.clone());
                    on_stream::all_gather(
                        core.comm,
                        core.dev,
                        comm,
                        shard,
                        p.get_mut::<P>()?.view_mut(),
                    )?;
                }
            }
        }
    }
    bufs.params_ready = Some(core.dev.record(comm)?);
    Ok(())
}

/// The working parameters from the master (16-bit training: round what this rank
/// updates; fp32: the parameters are the master), then shared as after a step.
pub(super) fn refresh_from_master<P: Float, D: Device, C: Communicator>(
    core: &Core<'_, D, C>,
    bufs: &mut Buffers<D>,
) -> Result<(), EngineError> {
    if let (Some(master), true) = (&bufs.master, P::DTYPE != DType::F32) {
        let params = bufs.params.get_mut::<P>()?;
        for at in &core.plan.placements {
            core.dev.cast(
                &core.streams.compute,
                master.slice(at.state.clone()),
                params.slice_mut(at.updated_params.clone()),
            )?;
        }
    }
    publish::<P, D, C>(core, bufs)
}
