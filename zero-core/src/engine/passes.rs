//! The forward and backward passes of one micro-step, layer by layer, with the
//! communication each stage overlaps with them:
//!
//! - stage 3: every layer step issues the all-gathers the [`GatherSchedule`] names for it
//!   (the layer's own units if not prefetched, and the next layers' as prefetch), waits
//!   only for the units this layer needs, computes, and lets the prefetches complete
//!   under the compute;
//! - stages 2/3 reducing every micro-step: a unit's gradient is complete after the
//!   backward of the first layer that uses it; it is packed into a bucket right away and
//!   its reduce-scatter runs during the next layer's backward (two buckets in flight;
//!   a unit with more chunks than buckets reduces the excess at once).
//!
//! Every layer step is one [`Communicator::scope`]: what it starts, it finishes, so no
//! buffer is touched while MPI may still use it.
//!
//! [`GatherSchedule`]: crate::ledger::GatherSchedule

use std::collections::VecDeque;
use std::ops::Range;

use zero_comm::{Communicator, ReduceOp};
use zero_kernels::{DType, Exec};

use super::buffers::Buffers;
use super::real::{accumulate, convert, Real};
use super::reduce::{pack, reduce_chunk_now, Chunk};
use super::{disjoint_mut, EngineError};
use crate::layout::PartitionLayout;
use crate::ledger::BufferPlan;
use crate::model::Model;
use crate::spec::ModelSpec;

/// What a pass step reads (everything but the buffers).
pub(super) struct Ctx<'a, C: Communicator> {
    pub comm: &'a C,
    pub exec: &'a Exec,
    pub spec: &'a ModelSpec,
    pub layout: &'a PartitionLayout,
    pub plan: &'a BufferPlan,
}

impl<C: Communicator> Ctx<'_, C> {
    /// Unit `u` in a full (all-units) buffer.
    pub fn full_range(&self, u: usize) -> Range<usize> {
        let unit = &self.layout.units[u];
        unit.unit_offset..unit.unit_offset + unit.padded_len
    }

    /// Unit `u` in this rank's shard buffer.
    pub fn shard_range(&self, u: usize) -> Range<usize> {
        let unit = &self.layout.units[u];
        unit.shard_offset..unit.shard_offset + unit.shard_len
    }

    fn slot_of(&self, u: usize) -> Result<usize, EngineError> {
        self.plan
            .gather
            .as_ref()
            .and_then(|g| g.unit_slot[u])
            .ok_or_else(|| EngineError::Internal(format!("unit {u} has no gather slot")))
    }
}

#[derive(Clone, Copy)]
enum Pass {
    Forward,
    Backward { grad_scale: f32 },
}

/// Forward of every layer.
pub(super) fn forward<C: Communicator, P: Real, W: Real>(
    cx: &Ctx<'_, C>,
    bufs: &mut Buffers,
    model: &mut dyn Model,
) -> Result<(), EngineError> {
    for l in 0..cx.spec.layers.len() {
        let gather = cx
            .plan
            .gather
            .as_ref()
            .map(|g| g.forward[l].gather.clone())
            .unwrap_or_default();
        layer_step::<C, P, W>(cx, bufs, model, l, Pass::Forward, &gather, &[])?;
    }
    Ok(())
}

/// Backward of every layer, in reverse; with sharded gradients, each unit's gradient is
/// reduce-scattered into this rank's gradient shard as soon as it is complete.
pub(super) fn backward<C: Communicator, P: Real, W: Real>(
    cx: &Ctx<'_, C>,
    bufs: &mut Buffers,
    model: &mut dyn Model,
    grad_scale: f32,
) -> Result<(), EngineError> {
    let layers = cx.spec.layers.len();
    let first_use = cx.spec.first_use();
    let sharded = cx.plan.grads_sharded;
    for t in bufs.tied_grads.iter_mut().flatten() {
        t.fill(0.0);
    }
    let mut in_bucket: Vec<Chunk> = Vec::new();
    for l in (0..layers).rev() {
        let gather = cx
            .plan
            .gather
            .as_ref()
            .map(|g| g.backward[layers - 1 - l].gather.clone())
            .unwrap_or_default();
        let pass = Pass::Backward { grad_scale };
        layer_step::<C, P, W>(cx, bufs, model, l, pass, &gather, &in_bucket)?;
        in_bucket.clear();
        if !sharded {
            continue;
        }
        // Units whose gradient is now complete: queue their chunks, reduce what the two
        // buckets cannot hold at once, pack the rest for the next layer step.
        let mut queue: VecDeque<Chunk> = VecDeque::new();
        for (u, f) in first_use.iter().enumerate() {
            if *f == Some(l) {
                let s = cx.layout.units[u].shard_len;
                for range in cx.plan.shard_chunks(s) {
                    queue.push_back(Chunk { unit: u, range });
                }
            }
        }
        let window = cx
            .plan
            .window_ranges(cx.layout, &cx.spec.layers[l].units, true);
        while queue.len() > bufs.buckets.len() {
            let Some(c) = queue.pop_front() else { break };
            reduce_now::<C, P, W>(cx, bufs, &window, &c)?;
        }
        for (i, c) in queue.into_iter().enumerate() {
            let src = grad_source(&bufs.grad_window, &bufs.tied_grads, &window, c.unit)?;
            let bucket = W::of_mut(&mut bufs.buckets[i])?;
            pack(
                cx.exec,
                src,
                &cx.layout.units[c.unit],
                &c.range,
                cx.comm.size(),
                bucket,
            )?;
            in_bucket.push(c);
        }
    }
    // Nothing left to overlap with: finish the last chunks.
    for (i, c) in in_bucket.iter().enumerate() {
        let n = cx.comm.size();
        let len = c.range.len();
        let bucket = W::of(&bufs.buckets[i])?;
        let piece = W::of_mut(&mut bufs.pieces[i])?;
        cx.comm
            .reduce_scatter(&bucket[..n * len], &mut piece[..len], ReduceOp::Sum)?;
        let grads = P::of_mut(&mut bufs.grads)?;
        let shard = &mut grads[cx.shard_range(c.unit)];
        accumulate(cx.exec, &mut shard[c.range.clone()], &piece[..len])?;
    }
    Ok(())
}

/// The gradient of unit `u` as the backward left it (sharded mode): its TiedGrad buffer,
/// or its range of the GradWindow.
fn grad_source<'b>(
    grad_window: &'b [f32],
    tied_grads: &'b [Option<Vec<f32>>],
    window: &[(usize, Range<usize>)],
    u: usize,
) -> Result<&'b [f32], EngineError> {
    if let Some(t) = &tied_grads[u] {
        return Ok(t);
    }
    let (_, r) = window
        .iter()
        .find(|(v, _)| *v == u)
        .ok_or_else(|| EngineError::Internal(format!("unit {u} not in the gradient window")))?;
    Ok(&grad_window[r.clone()])
}

fn reduce_now<C: Communicator, P: Real, W: Real>(
    cx: &Ctx<'_, C>,
    bufs: &mut Buffers,
    window: &[(usize, Range<usize>)],
    c: &Chunk,
) -> Result<(), EngineError> {
    let Buffers {
        grads,
        grad_window,
        tied_grads,
        buckets,
        pieces,
        ..
    } = bufs;
    let src = grad_source(grad_window, tied_grads, window, c.unit)?;
    let grads = P::of_mut(grads)?;
    reduce_chunk_now(
        cx.comm,
        cx.exec,
        src,
        &cx.layout.units[c.unit],
        &c.range,
        W::of_mut(&mut buckets[0])?,
        W::of_mut(&mut pieces[0])?,
        &mut grads[cx.shard_range(c.unit)],
    )
}

/// One layer of one pass, as one communication scope: start the reductions of the
/// chunks packed in the buckets (`in_bucket[i]` in bucket i), issue the stage-3 gathers
/// of `gather`, wait for this layer's own units, compute, finish everything.
#[allow(clippy::too_many_arguments)]
fn layer_step<C: Communicator, P: Real, W: Real>(
    cx: &Ctx<'_, C>,
    bufs: &mut Buffers,
    model: &mut dyn Model,
    l: usize,
    pass: Pass,
    gather: &[usize],
    in_bucket: &[Chunk],
) -> Result<(), EngineError> {
    let units: &[usize] = &cx.spec.layers[l].units;
    let stage3 = cx.plan.gather.is_some();
    let n = cx.comm.size();
    let Buffers {
        params,
        grads,
        persistent,
        slots,
        param_window,
        grad_window,
        tied_grads,
        buckets,
        pieces,
        ..
    } = bufs;
    let params: &[P] = P::of(params)?;
    let mut slot_refs: Vec<Option<&mut [P]>> = slots
        .iter_mut()
        .map(|s| P::of_mut(s).map(Some))
        .collect::<Result<_, _>>()?;
    let bucket_refs: Vec<&[W]> = buckets.iter().map(|b| W::of(b)).collect::<Result<_, _>>()?;
    let mut piece_refs: Vec<Option<&mut [W]>> = pieces
        .iter_mut()
        .map(|p| W::of_mut(p).map(Some))
        .collect::<Result<_, _>>()?;

    cx.comm.scope(|s| -> Result<(), EngineError> {
        let missing = || EngineError::Internal("buffer already in use".into());
        // Reductions of the previous layer's completed units: they run under this compute.
        let mut reductions = Vec::with_capacity(in_bucket.len());
        for (i, c) in in_bucket.iter().enumerate() {
            let len = c.range.len();
            let (piece, _) = piece_refs[i].take().ok_or_else(missing)?.split_at_mut(len);
            reductions.push(s.reduce_scatter(&bucket_refs[i][..n * len], piece, ReduceOp::Sum)?);
        }
        // Stage 3: gathers this step issues; this layer's own units are waited for now.
        let mut now = Vec::new();
        let mut prefetch = Vec::new();
        for &u in gather {
            let len = cx.layout.units[u].padded_len;
            let slot = cx.slot_of(u)?;
            let (dst, _) = slot_refs[slot]
                .take()
                .ok_or_else(missing)?
                .split_at_mut(len);
            let h = s.all_gather(&params[cx.shard_range(u)], dst)?;
            if units.contains(&u) {
                now.push((u, h));
            } else {
                prefetch.push(h);
            }
        }
        let mut ready: Vec<(usize, &[P])> = Vec::with_capacity(now.len());
        for (u, h) in now {
            let got: &[P] = h.wait()?;
            ready.push((u, got));
        }
        let mut srcs: Vec<&[P]> = Vec::with_capacity(units.len());
        for &u in units {
            let src: &[P] = if !stage3 {
                &params[cx.full_range(u)]
            } else if let Some(p) = &persistent[u] {
                P::of(p)?
            } else if let Some((_, r)) = ready.iter().find(|(v, _)| *v == u) {
                r
            } else {
                let r = slot_refs[cx.slot_of(u)?].as_deref().ok_or_else(missing)?;
                &r[..cx.layout.units[u].padded_len]
            };
            srcs.push(src);
        }
        let views = f32_views(cx, units, &srcs, param_window)?;
        match pass {
            Pass::Forward => model.forward_layer(l, &views)?,
            Pass::Backward { grad_scale } => {
                let mut g = grad_views::<C, P>(cx, units, grads, grad_window, tied_grads)?;
                model.backward_layer(l, &views, &mut g, grad_scale)?;
            }
        }
        for h in prefetch {
            h.wait()?;
        }
        for h in reductions {
            h.wait()?;
        }
        Ok(())
    })?;

    // Land the reduced chunks in this rank's gradient shard.
    for (i, c) in in_bucket.iter().enumerate() {
        let len = c.range.len();
        let g = P::of_mut(grads)?;
        let shard = &mut g[cx.shard_range(c.unit)];
        accumulate(
            cx.exec,
            &mut shard[c.range.clone()],
            &W::of(&pieces[i])?[..len],
        )?;
    }
    // 16-bit training with full gradients: the f32 window goes into the P accumulator.
    if matches!(pass, Pass::Backward { .. }) && !cx.plan.grads_sharded && P::DTYPE != DType::F32 {
        let g = P::of_mut(grads)?;
        for (u, r) in cx.plan.window_ranges(cx.layout, units, false) {
            accumulate(cx.exec, &mut g[cx.full_range(u)], &grad_window[r])?;
        }
    }
    Ok(())
}

/// f32 views of the layer's unit parameters: the buffers themselves in fp32 training,
/// else widened into the ParamWindow.
fn f32_views<'a, C: Communicator, P: Real>(
    cx: &Ctx<'_, C>,
    units: &[usize],
    srcs: &[&'a [P]],
    window: &'a mut [f32],
) -> Result<Vec<&'a [f32]>, EngineError> {
    if P::DTYPE == DType::F32 {
        return Ok(srcs
            .iter()
            .map(|s| bytemuck::cast_slice::<P, f32>(s))
            .collect());
    }
    let ranges = cx.plan.window_ranges(cx.layout, units, false);
    let find = |u: usize| {
        ranges
            .iter()
            .find(|(v, _)| *v == u)
            .map(|(_, r)| r.clone())
            .ok_or_else(|| EngineError::Internal(format!("unit {u} not in the parameter window")))
    };
    for (i, &u) in units.iter().enumerate() {
        convert(cx.exec, srcs[i], &mut window[find(u)?])?;
    }
    let window: &'a [f32] = window;
    units.iter().map(|&u| Ok(&window[find(u)?])).collect()
}

/// Mutable f32 gradient views for the layer's units, zeroed where they are scratch:
/// straight into the fp32 full gradient, or the (zeroed) GradWindow, or a tied unit's
/// accumulator.
fn grad_views<'a, C: Communicator, P: Real>(
    cx: &Ctx<'_, C>,
    units: &[usize],
    grads: &'a mut super::real::Store,
    grad_window: &'a mut [f32],
    tied_grads: &'a mut [Option<Vec<f32>>],
) -> Result<Vec<&'a mut [f32]>, EngineError> {
    let mut seen = units.to_vec();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != units.len() {
        return Err(EngineError::Mismatch(format!(
            "layer uses a unit twice ({units:?}); list each unit once"
        )));
    }
    if !cx.plan.grads_sharded && P::DTYPE == DType::F32 {
        let g: &mut [f32] = bytemuck::cast_slice_mut(P::of_mut(grads)?);
        let ranges: Vec<Range<usize>> = units.iter().map(|&u| cx.full_range(u)).collect();
        return disjoint_mut(g, &ranges);
    }
    let sharded = cx.plan.grads_sharded;
    let window = cx.plan.window_ranges(cx.layout, units, sharded);
    let ranges: Vec<Range<usize>> = window.iter().map(|(_, r)| r.clone()).collect();
    let mut win = disjoint_mut(grad_window, &ranges)?;
    for w in win.iter_mut() {
        w.fill(0.0);
    }
    let mut win: Vec<Option<&'a mut [f32]>> = win.into_iter().map(Some).collect();
    let mut tied: Vec<Option<&'a mut [f32]>> = tied_grads
        .iter_mut()
        .map(|t| t.as_mut().map(|v| &mut v[..]))
        .collect();
    units
        .iter()
        .map(|&u| {
            if sharded && cx.plan.tied[u] {
                tied[u].take()
            } else {
                window
                    .iter()
                    .position(|(v, _)| *v == u)
                    .and_then(|i| win[i].take())
            }
            .ok_or_else(|| EngineError::Internal(format!("no gradient buffer for unit {u}")))
        })
        .collect()
}
