//! The forward and backward passes of one micro-step, layer by layer, with the
//! communication each stage overlaps with them:
//!
//! - stage 3: every pass step issues, on comm, the all-gathers the [`GatherSchedule`]
//!   names for it (the layer's own units if not prefetched, and the next layers' as
//!   prefetch), each into its slot once compute has released the slot; compute waits
//!   only for the units this layer reads, and releases a slot after the last layer that
//!   reads its unit (the last layer's units after its backward: the forward hands them
//!   over);
//! - stages 2/3 reducing every micro-step: a unit's gradient is complete after the
//!   backward of the first layer of each of its uses (`plan/uses.rs`); its chunks go
//!   through the reducer right away and reduce on comm while compute runs the next
//!   layer;
//! - full gradients (stage 0; stage 1 without sharded gradients): on the last micro-step,
//!   a unit's gradient is whole after the backward of the earliest layer of all its
//!   uses, and it is all-reduced (stage 1: reduce-scattered) then, on comm, while compute
//!   runs the layers below (DDP's gradient buckets, in units).
//!
//! The model computes in f32: 16-bit parameters are widened into the ParamWindow per
//! layer, and gradients go through the GradWindow when the accumulator is 16-bit or
//! sharded (an f32 full accumulator takes them directly). A layer whose backward reads
//! no parameter (a lookup, `LayerSpec::backward_reads_params`) gets none in the
//! backward, at every stage: nothing is gathered or widened for it.
//!
//! [`GatherSchedule`]: crate::plan::GatherSchedule

use zero_comm::{on_stream, Communicator};
use zero_kernels::device::{same_type, Buffer, DView, Device, FloatBuffer};
use zero_kernels::{DType, Float};

use super::buffers::{Buffers, GatherSlot};
use super::reducer::Landing;
use super::{Core, EngineError, WaitPoint};
use crate::model::{Model, UnitGrads, UnitParams};

/// Stage 3: per unit, the event after which its gather slot holds it (None: not
/// gathered). The forward hands the backward the last layer's carried units
/// ([`crate::plan::GatherSchedule::carried`]).
pub(super) type Gathered<D> = Vec<Option<<D as Device>::Event>>;

/// Forward of every layer; returns what stays gathered into the backward.
pub(super) fn forward<P: Float, D: Device, C: Communicator, M: Model<D>>(
    core: &Core<'_, D, C>,
    bufs: &mut Buffers<D>,
    model: &mut M,
) -> Result<Gathered<D>, EngineError> {
    let mut gathered: Gathered<D> = vec![None; core.spec.units.len()];
    for l in 0..core.spec.layers.len() {
        let step = core.plan.gather.as_ref().map(|g| &g.forward[l]);
        if let Some(step) = step {
            gather_units::<P, D, C>(core, bufs, &step.gather, &mut gathered, Pass::Forward)?;
        }
        let Buffers {
            params,
            slots,
            persistent,
            param_window,
            ..
        } = bufs;
        let p =
            layer_params::<P, D, C>(core, params, slots, persistent, param_window, l, &gathered)?;
        model.forward_layer(core.compute(), l, &p)?;
        drop(p);
        if let Some(step) = step {
            release_units(core, bufs, &step.release, &mut gathered)?;
        }
    }
    Ok(gathered)
}

/// Backward of every layer, in reverse, starting with what the forward left `gathered`;
/// with sharded gradients, each unit's gradient is reduce-scattered into this rank's
/// gradient shard as soon as it is complete.
pub(super) fn backward<P: Float, G: Float, W: Float, D: Device, C: Communicator, M: Model<D>>(
    core: &Core<'_, D, C>,
    bufs: &mut Buffers<D>,
    model: &mut M,
    mut gathered: Gathered<D>,
    weight: f32,
    last_micro_step: bool,
) -> Result<(), EngineError> {
    let layers = core.spec.layers.len();
    let sharded = core.plan.grads_sharded;
    let compute = &core.streams.compute;
    for t in 0..layers {
        let l = layers - 1 - t;
        let step = core.plan.gather.as_ref().map(|g| &g.backward[t]);
        if let Some(step) = step {
            gather_units::<P, D, C>(core, bufs, &step.gather, &mut gathered, Pass::Backward)?;
        }
        bufs.reducer.before_rewriting_sources(core)?;
        for &u in &core.spec.layers[l].units {
            if core.plan.grads_via_window && core.plan.starts_accumulating(u, l) {
                if let Some(t) = bufs.tied_grads[u].as_mut() {
                    core.dev.fill(compute, t.view_mut(), 0.0)?;
                }
            }
        }
        {
            let Buffers {
                params,
                grads,
                slots,
                persistent,
                param_window,
                grad_window,
                tied_grads,
                ..
            } = &mut *bufs;
            // A lookup's backward reads no parameter: none gathered, none passed.
            let p = if core.spec.layers[l].backward_reads_params {
                layer_params::<P, D, C>(
                    core,
                    params,
                    slots,
                    persistent,
                    param_window,
                    l,
                    &gathered,
                )?
            } else {
                Vec::new()
            };
            let mut g = layer_grads::<D, C>(core, grads, grad_window, tied_grads, l)?;
            model.backward_layer(core.compute(), l, &p, &mut g, weight)?;
        }
        let units = &core.spec.layers[l].units;
        if !sharded && core.plan.grads_via_window {
            // A 16-bit full accumulator: the f32 window is added into it (and rounded),
            // and a tied unit's f32 accumulator once its use is complete (rounded once per
            // use, as the sharded path reduces it once).
            let grads = bufs.grads.get_mut::<G>()?;
            for (u, r) in core.plan.window_ranges(&core.layout, units, true) {
                let at = core.plan.placements[u].grads.clone();
                core.dev
                    .accumulate(compute, grads.slice_mut(at), bufs.grad_window.slice(r))?;
            }
            for u in core.plan.completed_after(l) {
                if let Some(tied) = &bufs.tied_grads[u] {
                    let at = core.plan.placements[u].grads.clone();
                    core.dev
                        .accumulate(compute, grads.slice_mut(at), tied.view())?;
                }
            }
        }
        if sharded {
            let window = core.plan.window_ranges(&core.layout, units, true);
            let Buffers {
                grads,
                grad_window,
                tied_grads,
                reducer,
                ..
            } = &mut *bufs;
            for u in core.plan.completed_after(l) {
                let unit = &core.layout.units[u];
                let src: DView<'_, D, f32> = match &tied_grads[u] {
                    Some(tied) => tied.view(),
                    None => {
                        let (_, r) = window.iter().find(|(v, _)| *v == u).ok_or_else(|| {
                            EngineError::Internal(format!("unit {u} not in the gradient window"))
                        })?;
                        grad_window.slice(r.clone())
                    }
                };
                let shard_at = core.plan.placements[u].grads.start;
                for c in core.plan.shard_chunks(unit.shard_len) {
                    let sent =
                        reducer.send::<f32, W, C>(core, src.clone(), unit.shard_len, c.clone())?;
                    let dst = grads
                        .get_mut::<G>()?
                        .slice_mut(shard_at + c.start..shard_at + c.end);
                    reducer.land::<W, G, C>(core, sent, dst, Landing::Add)?;
                }
            }
        }
        if !sharded && last_micro_step {
            for u in core.plan.fully_computed_after(l) {
                super::step::reduce_full_unit::<G, W, D, C>(core, bufs, u)?;
            }
        }
        if let Some(step) = step {
            release_units(core, bufs, &step.release, &mut gathered)?;
        }
    }
    Ok(())
}

/// Which pass a gather is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Forward,
    Backward,
}

/// Stage 3: start the all-gathers of `units` on comm, each into its slot once the slot's
/// previous unit is released. With hpZ (a Secondary buffer), the forward's gathers of a
/// unit the backward gathers again also keep this rank's 1/L of it (node-local rank j:
/// elements [j len/L, (j+1) len/L)), and the backward's gather the unit from those parts
/// over the node group alone.
fn gather_units<P: Float, D: Device, C: Communicator>(
    core: &Core<'_, D, C>,
    bufs: &mut Buffers<D>,
    units: &[usize],
    gathered: &mut [Option<D::Event>],
    pass: Pass,
) -> Result<(), EngineError> {
    let comm = &core.streams.comm;
    for &u in units {
        let slot = slot_of(core, u)?;
        let GatherSlot { buf, free } = &mut bufs.slots[slot];
        if let Some(e) = free.take() {
            core.wait(WaitPoint::SlotFree, comm, &e)?;
        }
        let len = core.layout.units[u].padded_len;
        let hierarchical = match (&mut bufs.secondary, core.nodes, &core.plan.secondary[u]) {
            (Some(s), Some(g), Some(at)) => Some((s.get_mut::<P>()?, &g.node, at.clone())),
            _ => None,
        };
        let hpz = core.plan.inputs.hierarchical_weights && core.nodes.is_some();
        if hpz && hierarchical.is_none() && matches!(pass, Pass::Backward) {
            // The plan gives a part to every unit the backward gathers (plan/mod.rs).
            return Err(EngineError::Internal(format!(
                "hpZ: the backward gathers unit {u}, which keeps no node part"
            )));
        }
        if let (Some((secondary, node, at)), Pass::Backward) = (&hierarchical, pass) {
            let part = secondary.slice(at.clone());
            let dst = buf.get_mut::<P>()?.slice_mut(0..len);
            on_stream::all_gather(*node, core.dev, comm, part, dst)?;
            gathered[u] = Some(core.dev.record(comm)?);
            continue;
        }
        let shard = bufs
            .params
            .get::<P>()?
            .slice(core.plan.placements[u].params.clone());
        match &mut bufs.quant {
            None => {
                let dst = buf.get_mut::<P>()?.slice_mut(0..len);
                on_stream::all_gather(core.comm, core.dev, comm, shard, dst)?;
            }
            Some(q) => {
                q.send(core, shard)?;
                q.receive(
                    core,
                    len / core.layout.world,
                    buf.get_mut::<P>()?.slice_mut(0..len),
                )?;
            }
        }
        if let Some((secondary, node, at)) = hierarchical {
            let j = node.rank();
            let part = at.len();
            let mine = buf.get::<P>()?.slice(j * part..(j + 1) * part);
            core.dev.copy(comm, mine, secondary.slice_mut(at))?;
        }
        gathered[u] = Some(core.dev.record(comm)?);
    }
    Ok(())
}

/// Stage 3: the slots of `units` may be gathered into again after what compute queued.
fn release_units<D: Device, C: Communicator>(
    core: &Core<'_, D, C>,
    bufs: &mut Buffers<D>,
    units: &[usize],
    gathered: &mut [Option<D::Event>],
) -> Result<(), EngineError> {
    for &u in units {
        let slot = slot_of(core, u)?;
        bufs.slots[slot].free = Some(core.dev.record(&core.streams.compute)?);
        gathered[u] = None;
    }
    Ok(())
}

fn slot_of<D: Device, C: Communicator>(
    core: &Core<'_, D, C>,
    u: usize,
) -> Result<usize, EngineError> {
    core.plan
        .gather
        .as_ref()
        .and_then(|g| g.unit_slot[u])
        .ok_or_else(|| EngineError::Internal(format!("unit {u} has no gather slot")))
}

/// f32 views of layer `l`'s unit parameters: the P buffers themselves in fp32 training
/// (Params, or at stage 3 the gather slots and persistent copies), else widened into the
/// ParamWindow on compute.
#[allow(clippy::too_many_arguments)]
fn layer_params<'a, P: Float, D: Device, C: Communicator>(
    core: &'a Core<'_, D, C>,
    params: &'a FloatBuffer<D>,
    slots: &'a [GatherSlot<D>],
    persistent: &'a [Option<FloatBuffer<D>>],
    window: &'a mut D::Buf<f32>,
    l: usize,
    gathered: &[Option<D::Event>],
) -> Result<Vec<UnitParams<'a, D>>, EngineError> {
    let units = &core.spec.layers[l].units;
    let compute = &core.streams.compute;
    let stage3 = core.plan.gather.is_some();
    let mut srcs: Vec<DView<'a, D, P>> = Vec::with_capacity(units.len());
    for &u in units {
        let src = if !stage3 {
            params
                .get::<P>()?
                .slice(core.plan.placements[u].params.clone())
        } else if let Some(p) = &persistent[u] {
            p.get::<P>()?.view()
        } else {
            let e = gathered[u].as_ref().ok_or_else(|| {
                EngineError::Internal(format!("unit {u} is not gathered at layer {l}"))
            })?;
            core.wait(WaitPoint::Gathered, compute, e)?;
            let len = core.layout.units[u].padded_len;
            slots[slot_of(core, u)?].buf.get::<P>()?.slice(0..len)
        };
        srcs.push(src);
    }
    let spec = |u: usize| &core.spec.units[u];
    if P::DTYPE == DType::F32 {
        return units
            .iter()
            .zip(srcs)
            .map(|(&u, s)| {
                same_type::<D, P, f32>(s)
                    .map(|v| UnitParams::new(spec(u), v))
                    .ok_or_else(|| EngineError::Internal("f32 parameters that are not f32".into()))
            })
            .collect();
    }
    let ranges = core.plan.window_ranges(&core.layout, units, false);
    let find = |u: usize| {
        ranges
            .iter()
            .find(|(v, _)| *v == u)
            .map(|(_, r)| r.clone())
            .ok_or_else(|| EngineError::Internal(format!("unit {u} not in the parameter window")))
    };
    for (&u, src) in units.iter().zip(srcs) {
        core.dev.cast(compute, src, window.slice_mut(find(u)?))?;
    }
    let window: &'a D::Buf<f32> = window;
    units
        .iter()
        .map(|&u| Ok(UnitParams::new(spec(u), window.slice(find(u)?))))
        .collect()
}

/// f32 gradient views for layer `l`'s units (the model adds into them): straight into
/// an f32 full accumulator, or the zeroed GradWindow, or a tied unit's accumulator.
fn layer_grads<'a, D: Device, C: Communicator>(
    core: &'a Core<'_, D, C>,
    grads: &'a mut FloatBuffer<D>,
    window: &'a mut D::Buf<f32>,
    tied: &'a mut [Option<D::Buf<f32>>],
    l: usize,
) -> Result<Vec<UnitGrads<'a, D>>, EngineError> {
    let units = &core.spec.layers[l].units;
    let spec = |u: usize| &core.spec.units[u];
    if !core.plan.grads_via_window {
        let ranges: Vec<_> = units
            .iter()
            .map(|&u| core.plan.placements[u].grads.clone())
            .collect();
        let views = grads.get_mut::<f32>()?.split_mut(&ranges)?;
        return Ok(units
            .iter()
            .zip(views)
            .map(|(&u, v)| UnitGrads::new(spec(u), v))
            .collect());
    }
    let ranges: Vec<_> = core
        .plan
        .window_ranges(&core.layout, units, true)
        .into_iter()
        .collect();
    for (_, r) in &ranges {
        core.dev
            .fill(&core.streams.compute, window.slice_mut(r.clone()), 0.0)?;
    }
    let plain: Vec<_> = ranges.iter().map(|(_, r)| r.clone()).collect();
    let mut win: Vec<Option<_>> = window.split_mut(&plain)?.into_iter().map(Some).collect();
    let mut tied: Vec<Option<_>> = tied
        .iter_mut()
        .map(|t| t.as_mut().map(|b| b.view_mut()))
        .collect();
    units
        .iter()
        .map(|&u| {
            let view = if core.plan.accumulated[u] {
                tied[u].take()
            } else {
                ranges
                    .iter()
                    .position(|(v, _)| *v == u)
                    .and_then(|i| win[i].take())
            };
            view.map(|v| UnitGrads::new(spec(u), v))
                .ok_or_else(|| EngineError::Internal(format!("no gradient buffer for unit {u}")))
        })
        .collect()
}
