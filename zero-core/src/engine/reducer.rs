//! Gradient reduction through two buckets, on the comm stream.
//!
//! Layout facts used here (`layout/mod.rs`): a unit's padded buffer is N blocks of
//! `shard_len` elements, block r belonging to rank r. A reduce-scatter chunk `c` (a range
//! of the shard, at most `piece_len` long) travels as N blocks packed in a bucket: block q
//! holds elements `q * shard_len + c` of the unit, converted to the reduce dtype W, so one
//! equal-block reduce-scatter leaves this rank the sum of its own chunk in a piece
//! (`plan/mod.rs`, "Buckets").
//!
//! One chunk goes through [`Reducer::send`] and then [`Reducer::land`] (the pair
//! `start_grad_sync` / `finish_grad_sync` of Megatron's buckets):
//!
//! ```text
//! compute:  wait(bucket free) -> pack N blocks into the bucket (S -> W) -> record
//! comm:     wait(packed) -> reduce-scatter bucket -> piece -> record(bucket free)
//! comm:     land: piece -> this rank's elements of the gradient (+= or =) -> record
//! compute:  finish: wait(last landing) before reading the gradients
//! ```
//!
//! The two buckets alternate, so packing the next chunk on compute overlaps the previous
//! chunk's reduction on comm. When a chunk is a unit's whole shard and the gradient is
//! already in W, the reduce-scatter reads the gradient buffer as it is (no pack); compute
//! then waits before rewriting that buffer ([`Reducer::before_rewriting_sources`]).

use std::ops::Range;

use zero_comm::{on_stream, Communicator, ReduceOp};
use zero_kernels::device::{
    same_type, same_type_mut, Buffer, DView, DViewMut, Device, FloatBuffer,
};
use zero_kernels::Float;

use super::qgz::{packed_position, GradQuantStaging};
use super::{Core, EngineError, WaitPoint};

/// One reduction bucket: W staging for a chunk's N blocks, the piece a reduce-scatter
/// leaves this rank, and when the bucket may be packed again.
pub(crate) struct Bucket<D: Device> {
    buf: FloatBuffer<D>,
    piece: Option<FloatBuffer<D>>,
    /// Recorded on comm after the last op that read the bucket.
    free: Option<D::Event>,
}

/// A chunk's sum, waiting in a bucket's piece on the comm stream.
#[must_use = "land the reduced chunk"]
pub(crate) struct InPiece {
    bucket: usize,
    len: usize,
}

/// How a reduced chunk lands in the gradient buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Landing {
    /// `+=`: sharded gradients accumulate over micro-steps.
    Add,
    /// `=`: a full gradient's own block becomes the sum.
    Overwrite,
}

/// The two buckets and what is in flight on the comm stream.
pub(crate) struct Reducer<D: Device> {
    buckets: Vec<Bucket<D>>,
    next: usize,
    /// comm: after the latest landing.
    landed: Option<D::Event>,
    /// comm: after the latest reduction that read a gradient buffer directly.
    source_read: Option<D::Event>,
    /// qgZ: the staging of quantized reductions (`qgz.rs`).
    grad_quant: Option<GradQuantStaging<D>>,
}

impl<D: Device> Reducer<D> {
    /// Buckets (and pieces, stages 1-3) as the plan allocated them.
    pub fn new(
        buffers: Vec<(FloatBuffer<D>, Option<FloatBuffer<D>>)>,
        grad_quant: Option<GradQuantStaging<D>>,
    ) -> Self {
        Reducer {
            buckets: buffers
                .into_iter()
                .map(|(buf, piece)| Bucket {
                    buf,
                    piece,
                    free: None,
                })
                .collect(),
            next: 0,
            landed: None,
            source_read: None,
            grad_quant,
        }
    }

    /// qgZ's staging, for the memory ledger.
    pub fn grad_quant(&self) -> Option<&GradQuantStaging<D>> {
        self.grad_quant.as_ref()
    }

    /// (bucket, piece) of every bucket, for the memory ledger.
    pub fn buffers(&self) -> impl Iterator<Item = (&FloatBuffer<D>, &Option<FloatBuffer<D>>)> {
        self.buckets.iter().map(|b| (&b.buf, &b.piece))
    }

    fn take_bucket(&mut self) -> usize {
        let b = self.next;
        self.next = (b + 1) % self.buckets.len().max(1);
        b
    }

    /// Reduce-scatter chunk `c` of the unit gradient `src` (its padded buffer, N blocks of
    /// `shard_len`) into a piece. Land it with [`Reducer::land`].
    pub fn send<S: Float, W: Float, C: Communicator>(
        &mut self,
        core: &Core<'_, D, C>,
        src: DView<'_, D, S>,
        shard_len: usize,
        c: Range<usize>,
    ) -> Result<InPiece, EngineError> {
        let (n, len) = (core.comm.size(), c.len());
        let (compute, comm) = (&core.streams.compute, &core.streams.comm);
        let b = self.take_bucket();
        let bucket = &mut self.buckets[b];
        let piece = bucket
            .piece
            .as_mut()
            .ok_or_else(|| EngineError::Internal("a reduce-scatter at stage 0".into()))?
            .get_mut::<W>()?;
        // qgZ: on the node groups, packed ordered by (local rank, node).
        let quantized = match (&mut self.grad_quant, core.nodes) {
            (Some(q), Some(nodes)) => Some((q, nodes)),
            _ => None,
        };
        let (l, m) = quantized
            .as_ref()
            .map_or((1, n), |(_, g)| (g.node.size(), g.cross.size()));
        if c == (0..shard_len) && quantized.is_none() {
            if let Some(whole) = same_type::<D, S, W>(src.clone()) {
                // The unit's blocks are in rank order already: reduce it as it is.
                core.hand_over(WaitPoint::GradsComputed, compute, comm)?;
                on_stream::reduce_scatter(
                    core.comm,
                    core.dev,
                    comm,
                    whole.head(n * shard_len),
                    piece.slice_mut(0..len),
                    ReduceOp::Sum,
                )?;
                self.source_read = Some(core.dev.record(comm)?);
                return Ok(InPiece { bucket: b, len });
            }
        }
        if let Some(e) = &bucket.free {
            core.wait(WaitPoint::BucketFree, compute, e)?;
        }
        let staging = bucket.buf.get_mut::<W>()?;
        for q in 0..n {
            let from = q * shard_len + c.start;
            let at = packed_position(q, l, m);
            core.dev.cast(
                compute,
                src.slice(from..from + len),
                staging.slice_mut(at * len..(at + 1) * len),
            )?;
        }
        core.hand_over(WaitPoint::GradsComputed, compute, comm)?;
        match quantized {
            Some((q, nodes)) => q.reduce(
                core.dev,
                comm,
                nodes,
                staging.slice(0..n * len),
                piece.slice_mut(0..len),
            )?,
            None => on_stream::reduce_scatter(
                core.comm,
                core.dev,
                comm,
                staging.slice(0..n * len),
                piece.slice_mut(0..len),
                ReduceOp::Sum,
            )?,
        }
        bucket.free = Some(core.dev.record(comm)?);
        Ok(InPiece { bucket: b, len })
    }

    /// Land a reduced chunk in `dst` (this rank's elements of it, in the gradient
    /// accumulator's G), on comm.
    pub fn land<W: Float, G: Float, C: Communicator>(
        &mut self,
        core: &Core<'_, D, C>,
        at: InPiece,
        dst: DViewMut<'_, D, G>,
        how: Landing,
    ) -> Result<(), EngineError> {
        let comm = &core.streams.comm;
        let piece = self.buckets[at.bucket]
            .piece
            .as_ref()
            .ok_or_else(|| EngineError::Internal("landing without a piece".into()))?
            .get::<W>()?
            .slice(0..at.len);
        match how {
            Landing::Add => core.dev.accumulate(comm, dst, piece)?,
            Landing::Overwrite => core.dev.cast(comm, piece, dst)?,
        }
        self.landed = Some(core.dev.record(comm)?);
        Ok(())
    }

    /// Stage 0: all-reduce `range` of the gradient buffer, in place when G = W, else
    /// chunk by chunk (at most `chunk` elements) through a bucket.
    pub fn all_reduce<G: Float, W: Float, C: Communicator>(
        &mut self,
        core: &Core<'_, D, C>,
        grads: &mut D::Buf<G>,
        range: Range<usize>,
        chunk: usize,
    ) -> Result<(), EngineError> {
        let (compute, comm) = (&core.streams.compute, &core.streams.comm);
        if let Some(g) = same_type_mut::<D, G, W>(grads.slice_mut(range.clone())) {
            core.hand_over(WaitPoint::GradsComputed, compute, comm)?;
            on_stream::all_reduce(core.comm, core.dev, comm, g, ReduceOp::Sum)?;
            self.landed = Some(core.dev.record(comm)?);
            return Ok(());
        }
        let mut at = range.start;
        while at < range.end {
            let len = chunk.min(range.end - at);
            let b = self.take_bucket();
            let bucket = &mut self.buckets[b];
            if let Some(e) = &bucket.free {
                core.wait(WaitPoint::BucketFree, compute, e)?;
            }
            let staging = bucket.buf.get_mut::<W>()?;
            core.dev.cast(
                compute,
                grads.slice(at..at + len),
                staging.slice_mut(0..len),
            )?;
            core.hand_over(WaitPoint::GradsComputed, compute, comm)?;
            on_stream::all_reduce(
                core.comm,
                core.dev,
                comm,
                staging.slice_mut(0..len),
                ReduceOp::Sum,
            )?;
            core.dev
                .cast(comm, staging.slice(0..len), grads.slice_mut(at..at + len))?;
            let done = core.dev.record(comm)?;
            bucket.free = Some(done.clone());
            self.landed = Some(done);
            at += len;
        }
        Ok(())
    }

    /// compute waits until every reduction so far has landed (before reading gradients).
    pub fn finish<C: Communicator>(&mut self, core: &Core<'_, D, C>) -> Result<(), EngineError> {
        if let Some(e) = self.landed.take() {
            core.wait(WaitPoint::GradsReduced, &core.streams.compute, &e)?;
        }
        Ok(())
    }

    /// The reductions so far read sources nothing rewrites before [`Reducer::finish`] (a
    /// unit's whole gradient on the last micro-step): compute need not wait for them
    /// before the next layer.
    pub fn sources_kept(&mut self) {
        self.source_read = None;
    }

    /// compute waits for reductions that read a gradient buffer directly, before it
    /// rewrites one.
    pub fn before_rewriting_sources<C: Communicator>(
        &mut self,
        core: &Core<'_, D, C>,
    ) -> Result<(), EngineError> {
        if let Some(e) = self.source_read.take() {
            core.wait(WaitPoint::SourceFree, &core.streams.compute, &e)?;
        }
        Ok(())
    }
}
