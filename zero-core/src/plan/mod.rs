//! The buffer plan of one rank: every buffer the engine allocates, with its category,
//! element type and length, and where each unit sits in them on this rank
//! ([`UnitPlacement`]), computed from the layout and the configuration without
//! allocating anything. The engine allocates exactly these buffers and drives its step
//! from these placements; `zero-bench plan` prints the same plan as a dry run, so the
//! dry run equals what a real run reports (the [`crate::ledger`] accounts for it).
//!
//! Notation: P = working dtype of parameters (bf16/fp16, or f32 in fp32 training), G =
//! dtype of the gradient accumulator (P, or f32: `precision.grad_accum_dtype`), W =
//! dtype gradients are reduced in (P, or f32), full = the padded
//! concatenation of all units (padded Ψ elements), shard = this rank's slice of every
//! unit (padded Ψ / N elements), Lw = largest sum of padded unit lengths a layer uses.
//!
//! ```text
//! buffer            dtype  stage 0   stage 1   stage 2          stage 3          note
//! Params            P      full      full      full             shard            fp32: this IS the master
//! Grads             G      full      full      shard | full*    shard | full*    * reduce_every_micro_step = false
//! Master            f32    full      shard     shard            shard            16-bit training only
//! AdamM, AdamV      f32    full      shard     shard            shard
//! Persistent{u}     P      -         -         -                unit u           units under persistence_threshold
//! GatherSlot{s}     P      -         -         -                see gather.rs    resident window incl. prefetch and uses
//! ParamWindow       f32    Lw        Lw        Lw               Lw               16-bit only: the model reads f32
//! GradWindow        f32    Lw' (16-bit G)      Lw' (sharded|G*) Lw' (sharded|G*) model writes f32 gradients here
//! TiedGrad{u}       f32    16-bit G  16-bit G  sharded | G*     sharded | G*     a use spans several layers; G*: full 16-bit G
//! Bucket{0,1}       W      bucket    bucket    bucket           bucket           reduction staging, double-buffered
//! BucketPiece{0,1}  W      -         bucket/N  bucket/N         bucket/N         reduce-scatter output
//! QuantCodes{0,1}   u8     -         shard | unit (stages 1-3)  qwZ only: int8 codes sent | gathered
//! QuantScales{0,1}  f32    -         ns | N ns (stages 1-3)     qwZ only: ns = ceil(shard / block)
//! Secondary         P      -         -         -                Σ unit / L       hpZ only: units gathered in backward
//! GradCodes{0,1}    u8     -         N c (stages 1-3)                            qgZ only: int8 codes sent | received
//! GradScales{0,1}   f32    -         see `grad_quant_scales` (stages 1-3)        qgZ only
//! GradSums{0,1}     f32    -         M c (stages 1-3)                            qgZ only: f32 sum, one peer's values
//! GradStats         f64    2 per unit (sum of squares, overflow flag)                     read by the host
//! Losses            f32    A (one per micro-step)                                          read by the host
//! Agreement         f64    3 (squared norm, overflow, loss sum)                            all-reduced once a step
//! ```
//!
//! How the engine uses them (the plan is only exact if it does):
//! - Compute: 16-bit params of a layer's units are widened into ParamWindow (units at
//!   consecutive offsets of their padded lengths); fp32 training reads Params (stages
//!   0-2) or the gather slots / Persistent buffers (stage 3) directly.
//! - Gradients, full (stages 0/1, or 2/3 accumulating locally): an f32 accumulator (fp32
//!   training, or G = f32) lets the model `+=` straight into Grads; a 16-bit one gives
//!   it the zeroed GradWindow (the layer's units without an accumulator) and adds the
//!   window into Grads after each layer, and a unit with a use spanning several layers
//!   its TiedGrad{u}, added into Grads once after the use (as the sharded path reduces
//!   it once), so that its gradient is rounded to 16 bits once per use at every stage.
//! - Gradients, sharded (stages 2/3 reducing every micro-step): the model writes into the
//!   zeroed GradWindow (the layer's units without an accumulator: Lw' excludes them)
//!   and into TiedGrad{u} for units with a use spanning several layers ([`uses`]:
//!   zeroed at the backward of the use's last layer, complete after the backward of its
//!   first). After each use a unit is packed into a bucket, reduce-scattered into a
//!   piece and added into the Grads shard (a unit with U uses: U times a micro-step).
//! - Buckets: a unit of shard length S is reduced in ceil(S / (bucket/N)) chunks; chunk
//!   k holds, for every rank r in order, elements [r*S + k*c, r*S + k*c + len) (c =
//!   bucket/N), converted to W, so one reduce-scatter leaves rank r the chunk of its own
//!   shard in a piece. Two buckets alternate so one reduces while the next fills. When
//!   one chunk is the whole shard and the gradient is already in W, the reduce-scatter
//!   reads the unit's gradient buffer as it is (its blocks are in rank order) and no
//!   bucket is filled. Stage 0 all-reduces the unit in place when G = W, else
//!   contiguous chunks of up to `bucket` elements through a bucket (no pieces).
//! - Stages 1/2 all-gather each unit's updated P parameters in place (each rank's block
//!   sits where the gathered block goes). Stage 3 gathers all-gather a unit's P shard
//!   straight into its slot (or, once per step after the update, into its Persistent
//!   buffer). Neither is chunked: the layer needs the whole unit resident, so a staging
//!   bucket would only add a copy.
//!
//! - Quantized gathers (qwZ; stage 3, or stages 1/2 in 16-bit training): the shard is
//!   quantized into QuantCodes{0} / QuantScales{0}, both all-gathered into QuantCodes{1}
//!   / QuantScales{1}, and read back into the slot (stage 3) or the unit in Params (every
//!   rank's block, its own included: stages 1/2), all on the comm stream; sized by the
//!   largest unit so gathered. The persistent units' after-step gathers stay exact.
//! - Secondary partition (hpZ, stage 3): after each forward gather of a unit, this
//!   rank's 1/L of it (L = ranks per node; node-local rank j keeps elements
//!   [j len/L, (j+1) len/L)) is copied into Secondary on comm; the backward gathers the
//!   unit from there over the node communicator. Only units the backward gathers have
//!   a part: not persistent ones, nor those read only by lookups or carried from the
//!   forward (`GatherSchedule::carried`).
//! - Quantized gradient reduction (qgZ, stages 1-3): a chunk of c = piece_len elements
//!   is packed with its N blocks ordered by (local rank, node) instead of rank, so that
//!   each node peer's M blocks are one run; the runs are quantized into GradCodes{0}
//!   / GradScales{0}, exchanged by an all-to-all inside the node into GradCodes{1} /
//!   GradScales{1}, and read back and summed in f32 in GradSums{0} (GradSums{1} holds
//!   one peer's values); the M sums are quantized again, exchanged by an all-to-all
//!   across nodes, and summed into the piece. A step with one rank per node (or one
//!   node) skips the exchange that has no peer, and its rounding.
//!
//! Padding: buffers laid out as full or shard contain partition padding; the ledger
//! reports it as its own category (the rest of the buffer under its role's category).
//! The activation arena belongs to the model (`Model::activation_bytes`); it is listed,
//! not allocated by the engine.

use std::ops::Range;

use zero_kernels::DType;

pub mod gather;
mod placement;
pub mod uses;

pub use gather::{GatherSchedule, PassStep};
pub use placement::UnitPlacement;
pub use uses::{backward_read_uses, unit_uses, UnitUse};

use crate::config::{EngineConfig, Precision, Stage};
use crate::layout::{LayoutError, PartitionLayout};
use crate::ledger::MemCategory;
use crate::spec::ModelSpec;

/// What the plan is computed from, besides the model and the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanInputs {
    /// ZeRO stage.
    pub stage: Stage,
    /// Training precision (P = its parameter dtype).
    pub precision: Precision,
    /// W: the dtype gradients are reduced in (f32, or P).
    pub reduce_dtype: DType,
    /// G: the dtype of the gradient accumulator (f32, or P).
    pub grad_dtype: DType,
    /// Stages 2/3: reduce every micro-step (sharded gradients) or once per step.
    pub reduce_every_micro_step: bool,
    /// Bucket capacity in elements ([`crate::config::ZeroConfig::bucket_elems_for`]).
    pub bucket_elems: usize,
    /// Stage 3: layers gathered ahead.
    pub prefetch: usize,
    /// Stage 3: units with fewer elements stay gathered.
    pub persistence_threshold: usize,
    /// A unit used again after layers that use at most this many elements of other
    /// units stays resident in between ([`uses`]).
    pub reuse_distance: usize,
    /// A: micro-steps per optimizer step (one loss slot each).
    pub grad_accum: usize,
    /// The model's activation arena for one micro-step.
    pub activation_bytes: u64,
    /// Quantized parameter gathers (qwZ: stage 3, or stages 1/2 in 16-bit training):
    /// the values per scale; None: exact gathers.
    pub quant_block: Option<usize>,
    /// Quantized gradient reduction (qgZ): the values per scale; None: exact.
    pub grad_quant_block: Option<usize>,
    /// Bits per qgZ code (8 or 4).
    pub grad_quant_bits: usize,
    /// Stage 3 backward gathers from a node-partitioned copy (hpZ).
    pub hierarchical_weights: bool,
    /// L: ranks per node (node-major ranks); N when the world is one node.
    pub ranks_per_node: usize,
}

impl PlanInputs {
    /// The inputs a validated configuration gives on `world` ranks, with the model's
    /// activation bytes.
    pub fn from_config(c: &EngineConfig, world: usize, activation_bytes: u64) -> PlanInputs {
        PlanInputs {
            stage: c.zero.stage,
            precision: c.precision.dtype,
            reduce_dtype: c.precision.reduce_dtype(),
            grad_dtype: c.precision.grad_dtype(),
            reduce_every_micro_step: c.zero.reduce_every_micro_step(),
            bucket_elems: c.zero.bucket_elems_for(world),
            prefetch: c.zero.prefetch,
            persistence_threshold: c.zero.persistence_threshold,
            reuse_distance: c.zero.reuse_distance,
            grad_accum: c.grad_accum,
            activation_bytes,
            quant_block: c.zero.quantize_weights.then_some(c.zero.quant_block),
            grad_quant_block: c.zero.quantize_grads.then_some(c.zero.quant_block),
            grad_quant_bits: c.zero.grad_quant_bits,
            hierarchical_weights: c.zero.hierarchical_weights,
            // Nodes matter only to the hierarchical switches; without them, one node.
            ranks_per_node: match c.zero.ranks_per_node {
                l if l > 0 && c.zero.hierarchical() => l,
                _ => world,
            },
        }
    }

    /// These inputs on nodes of `ranks_per_node` ranks (what the launch found).
    pub fn on_nodes(mut self, ranks_per_node: usize) -> PlanInputs {
        self.ranks_per_node = ranks_per_node;
        self
    }

    /// M: nodes of `ranks_per_node` ranks among `world`.
    pub fn nodes(&self, world: usize) -> usize {
        world / self.ranks_per_node.max(1)
    }
}

/// Errors of building a plan from inconsistent inputs.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A layout query failed (rank out of range, ...).
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The layout was not made from this spec.
    #[error("the layout has {layout_units} units of {layout_numel} elements but the spec has {spec_units} of {spec_numel}; build the layout from this spec")]
    SpecMismatch {
        /// Units in the layout.
        layout_units: usize,
        /// Ψ of the layout.
        layout_numel: usize,
        /// Units in the spec.
        spec_units: usize,
        /// Ψ of the spec.
        spec_numel: usize,
    },
    /// Reducing every micro-step at a stage that keeps full gradients.
    #[error("reduce_every_micro_step needs stage 2 or 3, not {0}")]
    ReduceEveryNeedsStage2(Stage),
    /// A reduce dtype that is neither f32 nor the parameter dtype.
    #[error("gradients of {precision:?} training cannot be reduced in {dtype}; use f32 or the parameter dtype")]
    ReduceDtype {
        /// The precision.
        precision: Precision,
        /// The dtype asked for.
        dtype: DType,
    },
    /// A gradient accumulator dtype that is neither f32 nor the parameter dtype.
    #[error("gradients of {precision:?} training cannot accumulate in {dtype}; use f32 or the parameter dtype")]
    GradDtype {
        /// The precision.
        precision: Precision,
        /// The dtype asked for.
        dtype: DType,
    },
    /// Zero bucket capacity.
    #[error("bucket_elems is 0; give the bucket capacity in elements")]
    ZeroBucket,
    /// Ranks per node that do not divide the world.
    #[error("{ranks_per_node} ranks per node do not divide the {world} ranks into whole nodes; run a multiple of the ranks per node (zero.ranks_per_node)")]
    RanksPerNode {
        /// L.
        ranks_per_node: usize,
        /// N.
        world: usize,
    },
}

/// Which buffer of the engine a plan entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferRole {
    /// Working parameters (full or shard).
    Params,
    /// Gradient accumulator (full or shard).
    Grads,
    /// fp32 master (full or shard).
    Master,
    /// Adam m (full or shard).
    AdamM,
    /// Adam v (full or shard).
    AdamV,
    /// Stage 3: the always-gathered copy of persistent unit `unit`.
    Persistent {
        /// Unit index.
        unit: usize,
    },
    /// Stage 3: gather slot `slot` of [`GatherSchedule::slots`].
    GatherSlot {
        /// Slot index.
        slot: usize,
    },
    /// f32 parameters of the computing layer's units (16-bit training).
    ParamWindow,
    /// f32 gradients of the computing layer's units.
    GradWindow,
    /// f32 gradient accumulator of a unit with a use spanning several layers (sharded
    /// gradients only).
    TiedGrad {
        /// Unit index.
        unit: usize,
    },
    /// Reduction bucket 0 or 1 (`bucket_len` elements of W).
    Bucket {
        /// 0 or 1.
        index: usize,
    },
    /// Bucket piece 0 or 1 (`bucket_len / N` elements of W).
    BucketPiece {
        /// 0 or 1.
        index: usize,
    },
    /// Per-unit gradient statistics of the step (sum of squares, overflow flag: 2 f64 a
    /// unit), read by the host to agree across ranks.
    GradStats,
    /// The A micro-steps' losses (f32 each).
    Losses,
    /// The agreement vector all-reduced once per step (3 f64: squared norm, overflow,
    /// loss sum).
    Agreement,
    /// Quantized gathers (stages 1-3): int8 codes (as bytes) of this rank's shard of the
    /// unit being gathered (`gathered`: false), or of the whole unit as gathered (true).
    QuantCodes {
        /// The gathered side.
        gathered: bool,
    },
    /// Quantized gathers (stages 1-3): the f32 scales of the codes, one per block of
    /// `quant_block` values of a shard (`gathered`: N shards' worth).
    QuantScales {
        /// The gathered side.
        gathered: bool,
    },
    /// hpZ (stage 3): this rank's 1/L of every unit the backward gathers, as gathered.
    Secondary,
    /// qgZ: int8 codes of a chunk's blocks sent (`received`: false) or received (true).
    GradCodes {
        /// The received side.
        received: bool,
    },
    /// qgZ: the f32 scales of the codes.
    GradScales {
        /// The received side.
        received: bool,
    },
    /// qgZ: f32 sums (index 0) and one peer's dequantized values (index 1).
    GradSums {
        /// 0 or 1.
        index: usize,
    },
}

/// How a buffer's elements are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extent {
    /// The full concatenation ([`crate::layout::UnitLayout::unit_offset`]).
    Full,
    /// This rank's shard concatenation ([`crate::layout::UnitLayout::shard_offset`]).
    Shard,
    /// One unit's padded buffer.
    Unit(usize),
    /// Scratch, laid out by its user.
    Scratch,
}

/// One buffer the engine allocates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    /// Which buffer.
    pub role: BufferRole,
    /// Ledger category.
    pub category: MemCategory,
    /// Element type.
    pub dtype: DType,
    /// Length in elements.
    pub len: usize,
    /// Elements of `len` that are partition padding on this rank (reported under
    /// [`MemCategory::Padding`]; nonzero only for full/shard model-state buffers).
    pub padding: usize,
    /// Layout of the elements.
    pub extent: Extent,
}

impl BufferSpec {
    /// Bytes of the buffer.
    pub fn bytes(&self) -> u64 {
        (self.len * self.dtype.size_bytes()) as u64
    }
}

/// Every buffer of one rank for one configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferPlan {
    /// N.
    pub world: usize,
    /// This rank.
    pub rank: usize,
    /// Ψ (unpadded).
    pub numel: usize,
    /// What the plan was built from.
    pub inputs: PlanInputs,
    /// P: parameter dtype (the gradient accumulator's is `inputs.grad_dtype`).
    pub param_dtype: DType,
    /// Gradients are a shard (stages 2/3 reducing every micro-step), else full.
    pub grads_sharded: bool,
    /// The model writes gradients into the f32 GradWindow, and those of the
    /// [`accumulated`](Self::accumulated) units into their TiedGrad buffers, rather than
    /// straight into Grads: with sharded gradients, or a 16-bit accumulator G.
    pub grads_via_window: bool,
    /// Elements of each bucket (a multiple of N x align).
    pub bucket_len: usize,
    /// Elements of each bucket piece (`bucket_len / N`).
    pub piece_len: usize,
    /// Each unit's uses ([`uses`]).
    pub uses: Vec<Vec<UnitUse>>,
    /// Each unit's uses by layers whose backward reads it ([`backward_read_uses`]): what
    /// stage 3 gathers in the backward.
    pub backward_reads: Vec<Vec<UnitUse>>,
    /// Units with a use spanning several layers (a tied table kept across the gap, or
    /// a unit two consecutive layers read): where gradients go through the window
    /// ([`grads_via_window`](Self::grads_via_window)) their gradient is accumulated in a
    /// TiedGrad buffer over the use.
    pub accumulated: Vec<bool>,
    /// Stage 3: units kept gathered.
    pub persistent: Vec<bool>,
    /// Stage 3: the gather schedule.
    pub gather: Option<GatherSchedule>,
    /// Where each unit sits in the buffers on this rank.
    pub placements: Vec<UnitPlacement>,
    /// hpZ: where the 1/L of each unit the backward gathers sits in the Secondary buffer.
    pub secondary: Vec<Option<Range<usize>>>,
    /// Buffers, in allocation order.
    pub buffers: Vec<BufferSpec>,
}

impl BufferPlan {
    /// Plan rank `rank`'s buffers.
    pub fn new(
        spec: &ModelSpec,
        layout: &PartitionLayout,
        inputs: &PlanInputs,
        rank: usize,
    ) -> Result<BufferPlan, PlanError> {
        // The spec's layers are read by index below: a malformed one is an error here.
        spec.validate().map_err(LayoutError::BadSpec)?;
        if spec.units.len() != layout.units.len()
            || spec
                .units
                .iter()
                .zip(&layout.units)
                .any(|(s, l)| s.numel() != l.numel)
        {
            return Err(PlanError::SpecMismatch {
                layout_units: layout.units.len(),
                layout_numel: layout.numel(),
                spec_units: spec.units.len(),
                spec_numel: spec.numel(),
            });
        }
        let (stage, p) = (inputs.stage, inputs.precision.param_dtype());
        let (g, w) = (inputs.grad_dtype, inputs.reduce_dtype);
        if w != DType::F32 && w != p {
            return Err(PlanError::ReduceDtype {
                precision: inputs.precision,
                dtype: w,
            });
        }
        if g != DType::F32 && g != p {
            return Err(PlanError::GradDtype {
                precision: inputs.precision,
                dtype: g,
            });
        }
        if inputs.reduce_every_micro_step && stage < Stage::Zero2 {
            return Err(PlanError::ReduceEveryNeedsStage2(stage));
        }
        if inputs.bucket_elems == 0 {
            return Err(PlanError::ZeroBucket);
        }
        let n = layout.world;
        let l = inputs.ranks_per_node;
        if l == 0 || !n.is_multiple_of(l) {
            return Err(PlanError::RanksPerNode {
                ranks_per_node: l,
                world: n,
            });
        }
        let full_pad = layout.padding_in_full();
        let shard_pad = layout.padding_in_shard(rank)?;
        let sixteen = p != DType::F32;
        let grads_sharded = stage >= Stage::Zero2 && inputs.reduce_every_micro_step;
        let grads_via_window = grads_sharded || g != DType::F32;

        let mut b = Vec::new();
        let full = |role, category, dtype| BufferSpec {
            role,
            category,
            dtype,
            len: layout.padded_numel(),
            padding: full_pad,
            extent: Extent::Full,
        };
        let shard = |role, category, dtype| BufferSpec {
            role,
            category,
            dtype,
            len: layout.shard_numel(),
            padding: shard_pad,
            extent: Extent::Shard,
        };
        let state = |role, category, dtype, is_shard: bool| {
            if is_shard {
                shard(role, category, dtype)
            } else {
                full(role, category, dtype)
            }
        };
        use BufferRole as R;
        use MemCategory as C;
        b.push(state(R::Params, C::Params, p, stage == Stage::Zero3));
        b.push(state(R::Grads, C::Grads, g, grads_sharded));
        let opt_sharded = stage >= Stage::Zero1;
        if sixteen {
            b.push(state(R::Master, C::Master, DType::F32, opt_sharded));
        }
        b.push(state(R::AdamM, C::AdamM, DType::F32, opt_sharded));
        b.push(state(R::AdamV, C::AdamV, DType::F32, opt_sharded));

        // Stage 3: persistent units and the gather slots.
        let uses = unit_uses(spec, inputs.reuse_distance);
        let backward_reads = backward_read_uses(spec, inputs.reuse_distance);
        let accumulated: Vec<bool> = uses
            .iter()
            .map(|us| us.iter().any(UnitUse::accumulates))
            .collect();
        let persistent: Vec<bool> = layout
            .units
            .iter()
            .map(|u| stage == Stage::Zero3 && u.numel < inputs.persistence_threshold)
            .collect();
        let mut gather = None;
        if stage == Stage::Zero3 {
            for (u, unit) in layout.units.iter().enumerate() {
                if persistent[u] {
                    b.push(BufferSpec {
                        role: R::Persistent { unit: u },
                        category: C::Persistent,
                        dtype: p,
                        len: unit.padded_len,
                        padding: 0,
                        extent: Extent::Unit(u),
                    });
                }
            }
            let lens: Vec<usize> = layout.units.iter().map(|u| u.padded_len).collect();
            let g = GatherSchedule::new(
                &lens,
                &uses,
                &backward_reads,
                spec.layers.len(),
                &persistent,
                inputs.prefetch,
            );
            for (slot, &len) in g.slots.iter().enumerate() {
                b.push(scratch(R::GatherSlot { slot }, C::Gather, p, len));
            }
            gather = Some(g);
        }
        // hpZ: node-local rank j = rank mod L keeps elements [j len/L, (j+1) len/L) of each unit
        // the backward gathers (padded lengths are multiples of N, so of L). Units it never
        // gathers (read only by lookups, or carried from the forward) keep no part.
        let mut secondary = vec![None; layout.units.len()];
        if let (Some(g), true) = (&gather, inputs.hierarchical_weights) {
            // Like the gather slots, it holds the units' padding too (counted as its own).
            // Marked in one pass over the schedule (not a scan of it per unit: a plan of
            // 1e5 units stays linear).
            let mut in_backward = vec![false; layout.units.len()];
            for &u in g.backward.iter().flat_map(|s| &s.gather) {
                in_backward[u] = true;
            }
            let mut at = 0;
            for (u, unit) in layout.units.iter().enumerate() {
                if in_backward[u] {
                    let part = unit.padded_len / l;
                    secondary[u] = Some(at..at + part);
                    at += part;
                }
            }
            if at > 0 {
                b.push(scratch(R::Secondary, C::Secondary, p, at));
            }
        }
        // Quantized gathers (stage 3's before each layer, stages 1/2's after the step)
        // stage one unit at a time on the comm stream, so one set of buffers sized by the
        // largest unit so gathered serves them all; persistent units gather exactly.
        if let Some(block) = inputs.quant_block.filter(|_| stage >= Stage::Zero1) {
            let gathered = layout.units.iter().zip(&persistent).filter(|(_, &p)| !p);
            let shard = gathered
                .clone()
                .map(|(u, _)| u.shard_len)
                .max()
                .unwrap_or(0);
            let full = gathered.map(|(u, _)| u.padded_len).max().unwrap_or(0);
            let scales = zero_kernels::quant::scale_count(shard, block);
            let codes = |gathered| R::QuantCodes { gathered };
            let scale = |gathered| R::QuantScales { gathered };
            b.push(scratch(codes(false), C::Gather, DType::U8, shard));
            b.push(scratch(scale(false), C::Gather, DType::F32, scales));
            b.push(scratch(codes(true), C::Gather, DType::U8, full));
            b.push(scratch(scale(true), C::Gather, DType::F32, n * scales));
        }

        // Compute windows: the widest layer, counted over all units or only those
        // without an accumulator.
        let window = |skip_accumulated: bool| {
            spec.layers
                .iter()
                .map(|l| {
                    let skip = skip_accumulated.then_some(accumulated.as_slice());
                    window_ranges(layout, &l.units, skip)
                        .last()
                        .map_or(0, |(_, r)| r.end)
                })
                .max()
                .unwrap_or(0)
        };
        if sixteen {
            b.push(scratch(
                R::ParamWindow,
                C::Compute,
                DType::F32,
                window(false),
            ));
        }
        if grads_via_window {
            b.push(scratch(R::GradWindow, C::Compute, DType::F32, window(true)));
            for (u, unit) in layout.units.iter().enumerate() {
                if accumulated[u] {
                    let mut t = scratch(R::TiedGrad { unit: u }, C::Compute, DType::F32, 0);
                    t.len = unit.padded_len;
                    t.extent = Extent::Unit(u);
                    b.push(t);
                }
            }
        }

        // Buckets: capacity rounded to whole N x align quanta, never above the largest
        // unit (no chunk is ever larger).
        let q = n * layout.align;
        let bucket_len = inputs
            .bucket_elems
            .div_ceil(q)
            .saturating_mul(q)
            .min(layout.max_padded_len());
        let piece_len = bucket_len / n;
        for index in 0..2 {
            b.push(scratch(R::Bucket { index }, C::Buckets, w, bucket_len));
        }
        if stage >= Stage::Zero1 {
            for index in 0..2 {
                b.push(scratch(R::BucketPiece { index }, C::Buckets, w, piece_len));
            }
        }
        b.push(scratch(
            R::GradStats,
            C::Compute,
            DType::F64,
            2 * layout.units.len(),
        ));
        b.push(scratch(
            R::Losses,
            C::Compute,
            DType::F32,
            inputs.grad_accum,
        ));
        b.push(scratch(R::Agreement, C::Compute, DType::F64, 3));
        // qgZ: staging for one chunk at a time, on the comm stream.
        if let Some(block) = inputs.grad_quant_block.filter(|_| stage >= Stage::Zero1) {
            let m = n / l;
            let c = piece_len;
            let codes = grad_quant_code_bytes(l, m, c, inputs.grad_quant_bits);
            for received in [false, true] {
                b.push(scratch(
                    R::GradCodes { received },
                    C::Buckets,
                    DType::U8,
                    codes,
                ));
            }
            let scales = grad_quant_scales(l, m, c, block);
            b.push(scratch(
                R::GradScales { received: false },
                C::Buckets,
                DType::F32,
                scales,
            ));
            b.push(scratch(
                R::GradScales { received: true },
                C::Buckets,
                DType::F32,
                scales,
            ));
            for index in 0..2 {
                b.push(scratch(
                    R::GradSums { index },
                    C::Buckets,
                    DType::F32,
                    m * c,
                ));
            }
        }
        b.retain(|x| x.len > 0);
        let placements = layout
            .units
            .iter()
            .map(|u| UnitPlacement::new(stage, grads_sharded, u, rank))
            .collect();

        Ok(BufferPlan {
            world: n,
            rank,
            numel: layout.numel(),
            inputs: inputs.clone(),
            param_dtype: p,
            grads_sharded,
            grads_via_window,
            bucket_len,
            piece_len,
            uses,
            backward_reads,
            accumulated,
            persistent,
            gather,
            placements,
            secondary,
            buffers: b,
        })
    }

    /// Gradient-reduction (and stage-1/2 parameter-gather) chunks of a unit with shard
    /// length `shard_len`: ranges of the shard, `piece_len` long except the last. Chunk
    /// `k` travels as N blocks (rank r's `r * shard_len + range`) packed in a bucket.
    pub fn shard_chunks(&self, shard_len: usize) -> Vec<Range<usize>> {
        split(shard_len, self.piece_len)
    }

    /// Stage 0 all-reduce chunks of a unit's padded buffer: contiguous ranges of at most
    /// `bucket_len` elements.
    pub fn full_chunks(&self, padded_len: usize) -> Vec<Range<usize>> {
        split(padded_len, self.bucket_len)
    }

    /// `shard_chunks(shard_len).len()`, counted without building the ranges (a plan of
    /// 1e15 parameters has billions of them; `zero-bench plan` allocates nothing).
    pub fn shard_chunk_count(&self, shard_len: usize) -> usize {
        split_count(shard_len, self.piece_len)
    }

    /// `full_chunks(padded_len).len()`, counted without building the ranges.
    pub fn full_chunk_count(&self, padded_len: usize) -> usize {
        split_count(padded_len, self.bucket_len)
    }

    /// The lengths of `shard_chunks(shard_len)` with how many chunks have each, without
    /// building the ranges: `(piece_len, shard_len / piece_len)` for the whole chunks,
    /// then `(shard_len % piece_len, 1)` for a shorter last one (pairs with a count of 0
    /// left out).
    pub fn shard_chunk_lens(&self, shard_len: usize) -> impl Iterator<Item = (usize, usize)> {
        split_lens(shard_len, self.piece_len)
    }

    /// Where each unit of `layer` sits in the ParamWindow (`skip_accumulated = false`)
    /// or the GradWindow (`skip_accumulated = true`: units with an accumulator live in
    /// their TiedGrad buffer instead).
    pub fn window_ranges(
        &self,
        layout: &PartitionLayout,
        layer_units: &[usize],
        skip_accumulated: bool,
    ) -> Vec<(usize, Range<usize>)> {
        window_ranges(
            layout,
            layer_units,
            skip_accumulated.then_some(self.accumulated.as_slice()),
        )
    }

    /// The units whose gradient of a use is complete after layer `l`'s backward (a use
    /// of theirs starts at `l`): with sharded gradients to reduce then, and an
    /// accumulated unit's TiedGrad to add into a 16-bit full Grads then.
    pub fn completed_after(&self, l: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.uses.len()).filter(move |&u| self.uses[u].iter().any(|x| x.first == l))
    }

    /// Full gradients: the units whose whole gradient (every use) is complete after layer
    /// `l`'s backward, the earliest layer of any use (the backward runs from the last
    /// layer down), to reduce then on the last micro-step.
    pub fn fully_computed_after(&self, l: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.uses.len()).filter(move |&u| self.uses[u].iter().map(|x| x.first).min() == Some(l))
    }

    /// Whether unit `u`'s TiedGrad accumulator starts a new use at layer `l`'s backward
    /// (zero it first).
    pub fn starts_accumulating(&self, u: usize, l: usize) -> bool {
        self.accumulated[u] && self.uses[u].iter().any(|x| x.last == l)
    }

    /// The buffer with this role, if the plan has one.
    pub fn get(&self, role: BufferRole) -> Option<&BufferSpec> {
        self.buffers.iter().find(|b| b.role == role)
    }

    /// Bytes of one category on this rank (padding split out of the state buffers).
    pub fn category_bytes(&self, cat: MemCategory) -> u64 {
        if cat == MemCategory::Activations {
            return self.inputs.activation_bytes;
        }
        self.buffers
            .iter()
            .map(|b| {
                let size = b.dtype.size_bytes() as u64;
                if cat == MemCategory::Padding {
                    b.padding as u64 * size
                } else if b.category == cat {
                    (b.len - b.padding) as u64 * size
                } else {
                    0
                }
            })
            .sum()
    }

    /// Every category with its bytes, in [`MemCategory::ALL`] order.
    pub fn by_category(&self) -> Vec<(MemCategory, u64)> {
        MemCategory::ALL
            .iter()
            .map(|&c| (c, self.category_bytes(c)))
            .collect()
    }

    /// One line per category (`name  bytes`), then the total: the per-rank ledger as
    /// `plan` and the start of a run print it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (c, b) in self.by_category() {
            if b > 0 {
                out.push_str(&format!(
                    "{:<12}{:>14}\n",
                    c.name(),
                    crate::ledger::human_bytes(b as f64)
                ));
            }
        }
        out.push_str(&format!(
            "{:<12}{:>14}\n",
            "total",
            crate::ledger::human_bytes(self.total_bytes() as f64)
        ));
        out
    }

    /// Bytes the engine allocates (every buffer).
    pub fn buffer_bytes(&self) -> u64 {
        self.buffers.iter().map(BufferSpec::bytes).sum()
    }

    /// Everything on this rank: buffers plus the activation arena.
    pub fn total_bytes(&self) -> u64 {
        self.buffer_bytes() + self.inputs.activation_bytes
    }
}

/// Host staging (`zero_comm::StagedComm`, `--comm mpi-staged`): the bytes of each
/// staging region, sized by `Engine::new` for the largest collective buffer of a step
/// on this plan: a unit's whole padded buffer (stage 0's in-place all-reduce, stage 1-2's
/// parameter all-gather, stage 3's gathers, hpZ's node gathers) or a bucket
/// (reduce-scatter input; qgZ's codes, N c bytes, and scales, at most N c f32). The
/// elements the engine moves are at most 4 bytes (P, G and W are f32, bf16 or f16); the
/// agreement's three f64s are below any unit.
pub fn host_staging_region_bytes(layout: &PartitionLayout, plan: &BufferPlan) -> usize {
    let unit = layout.units.iter().map(|u| u.padded_len).max().unwrap_or(0);
    (unit.max(plan.bucket_len) * 4).max(64)
}

/// Bytes of `n` qgZ codes of `bits` bits (int4: two a byte, the last byte of an odd run
/// half used).
pub fn grad_code_bytes(n: usize, bits: usize) -> usize {
    if bits == 4 {
        n.div_ceil(2)
    } else {
        n
    }
}

/// qgZ code bytes of a chunk of `c` elements per rank on M nodes of L ranks: inside the
/// node L runs of M c values, across nodes M runs of c (N c bytes in int8).
pub fn grad_quant_code_bytes(l: usize, m: usize, c: usize, bits: usize) -> usize {
    (l * grad_code_bytes(m * c, bits)).max(m * grad_code_bytes(c, bits))
}

/// qgZ scales of a chunk of `c` elements per rank on M nodes of L ranks, quantized in
/// blocks of `block`: inside the node, L runs of M c values; across nodes, M runs of c.
pub fn grad_quant_scales(l: usize, m: usize, c: usize, block: usize) -> usize {
    use zero_kernels::quant::scale_count;
    (l * scale_count(m * c, block)).max(m * scale_count(c, block))
}

/// `0..len` cut into consecutive ranges of at most `step` (none when `len == 0`).
fn split(len: usize, step: usize) -> Vec<Range<usize>> {
    let step = step.max(1);
    (0..split_count(len, step))
        .map(|k| k * step..((k + 1) * step).min(len))
        .collect()
}

/// `split(len, step).len()`, without the ranges.
fn split_count(len: usize, step: usize) -> usize {
    len.div_ceil(step.max(1))
}

/// The range lengths of `split(len, step)`, each with how many ranges have it (those
/// with none left out), without the ranges.
fn split_lens(len: usize, step: usize) -> impl Iterator<Item = (usize, usize)> {
    let step = step.max(1);
    [
        (step, len / step),
        (len % step, usize::from(!len.is_multiple_of(step))),
    ]
    .into_iter()
    .filter(|&(_, count)| count > 0)
}

/// A layer's distinct units (first occurrence order) at consecutive offsets of their
/// padded lengths, skipping units marked in `skip`.
pub fn window_ranges(
    layout: &PartitionLayout,
    layer_units: &[usize],
    skip: Option<&[bool]>,
) -> Vec<(usize, Range<usize>)> {
    let mut out: Vec<(usize, Range<usize>)> = Vec::new();
    let mut at = 0;
    for &u in layer_units {
        if out.iter().any(|(v, _)| *v == u) || skip.is_some_and(|s| s[u]) {
            continue;
        }
        let len = layout.units[u].padded_len;
        out.push((u, at..at + len));
        at += len;
    }
    out
}

fn scratch(role: BufferRole, category: MemCategory, dtype: DType, len: usize) -> BufferSpec {
    BufferSpec {
        role,
        category,
        dtype,
        len,
        padding: 0,
        extent: Extent::Scratch,
    }
}

#[cfg(test)]
mod tests {
    use super::{split, split_count, split_lens};

    #[test]
    fn chunks_are_counted_as_they_would_be_built() {
        for len in (0..200).chain([1 << 20, (1 << 20) + 1, 3 * 4096 - 1, 1_000_003]) {
            for step in [0, 1, 2, 3, 7, 64, 100, 199, 200, 201, 4096, 1 << 22] {
                let built = split(len, step);
                assert_eq!(split_count(len, step), built.len(), "len {len} step {step}");
                // The lengths with their counts: the built ranges, grouped.
                let mut grouped: Vec<(usize, usize)> = Vec::new();
                for r in &built {
                    match grouped.last_mut() {
                        Some((l, c)) if *l == r.len() => *c += 1,
                        _ => grouped.push((r.len(), 1)),
                    }
                }
                assert_eq!(
                    split_lens(len, step).collect::<Vec<_>>(),
                    grouped,
                    "len {len} step {step}"
                );
            }
        }
        // What the built Vec could not hold: 1e15 elements in chunks of 4Mi.
        let len = 1_000_000_000_000_000;
        assert_eq!(split_count(len, 1 << 22), 238_418_580);
        let lens: Vec<_> = split_lens(len, 1 << 22).collect();
        assert_eq!(lens, [(1 << 22, 238_418_579), (len % (1 << 22), 1)]);
        assert_eq!(split_count(usize::MAX, 1), usize::MAX);
    }
}
