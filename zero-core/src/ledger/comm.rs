//! The communication ledger: elements and bytes each rank sends (and receives) per
//! optimizer step, per collective, for a stage, N, A and reduce policy, from padded
//! sizes, so a test can hold the engine's measured bytes against it exactly.
//!
//! Ring algorithms (docs/ARCHITECTURE.md): for a collective over a buffer of E elements (the full,
//! gathered size), every rank sends and receives (N-1)/N x E for reduce-scatter and
//! all-gather, 2(N-1)/N x E for all-reduce. Padded unit lengths are multiples of N, so
//! every count is a whole number. Per step, with A micro-steps, padded Ψ = Ψp,
//! non-persistent padded Ψ = Ψg, persistent padded Ψ = Ψs, and Ψc the non-persistent
//! units the last layer reads in both passes, carried from its forward into its backward (stage 3,
//! `plan/gather.rs`):
//!
//! ```text
//! stage  reduce every micro-step                   accumulate locally, reduce once
//! 0      -                                         all-reduce Ψp (W)
//! 1      -                                         reduce-scatter Ψp (W) + all-gather Ψp (P)
//! 2      reduce-scatter AΨp (W) + all-gather Ψp     as stage 1
//! 3      all-gather AΨg fwd + A(Ψg-Ψc) bwd (P)      all-gather A(2Ψg-Ψc) (P)
//!        + reduce-scatter AΨp (W) + all-gather Ψs   + reduce-scatter Ψp (W) + all-gather Ψs (P)
//! ```
//!
//! With quantized gathers (qwZ, `zero.quantize_weights`), each stage-3 gather of a unit
//! (and each after-step gather at stages 1/2) of padded length E moves E int8 codes and
//! N x ceil(E / N / B) f32 scales instead of E values of P, in two all-gathers.
//!
//! On M nodes of L ranks (node-major ranks), the hierarchical switches move traffic off
//! the world communicator (a ring over all N ranks, one link of which leaves each node):
//! - hpZ (`zero.hierarchical_weights`, stage 3): the backward gathers run on the node
//!   communicator (L ranks) from the secondary partition: (L-1)/L x E of P per gather,
//!   none of it across nodes;
//! - qgZ (`zero.quantize_grads`): each reduce-scatter chunk of c elements per rank becomes
//!   an all-to-all inside the node of N c int8 codes and L ceil(M c / B) f32 scales,
//!   then an all-to-all across nodes (the M ranks of the same local rank) of M c codes
//!   and M ceil(c / B) scales (int4 codes, `grad_quant_bits = 4`: L ceil(M c / 2) and
//!   M ceil(c / 2) bytes); an all-to-all of E elements sends (g-1)/g x E on g ranks.
//!   With L = 1 (M = 1) the exchange inside (across) nodes has no peer and is skipped.
//!
//! Bytes leaving a node per step ([`CommPlan::node_egress_bytes`]): a world ring has one
//! link out of each node, carrying what each rank sends; the L cross-node all-to-alls of
//! a node all leave it, L times what each rank sends; node collectives stay inside.
//!
//! The table holds when every unit has one use and every layer's backward reads its
//! units. A unit released between uses (zero-core/src/plan/uses.rs) adds, per extra use,
//! one gather of it per pass that reads it there at stage 3 and one reduce-scatter per micro-step with
//! sharded gradients; a use whose layers' backward reads no parameter (a lookup) is not
//! gathered in the backward, one gather of it fewer per micro-step. The plan counts
//! both.
//!
//! Calls follow the engine: gradient reductions in bucket-sized chunks per unit (stage 0
//! in place, one call per unit, when no conversion is needed), stage-1/2 parameter
//! gathers and stage-3 gathers one call per unit and use. Every stage also all-reduces 3 f64
//! (squared norm, overflow flag, loss sum) once per step to agree on clipping, skipping
//! and the reported loss: [`CommPlan::control`], outside the volume formulas.

use zero_kernels::DType;

use crate::config::Stage;
use crate::layout::PartitionLayout;
use crate::plan::{grad_code_bytes, BufferPlan};

/// A collective kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collective {
    /// All-reduce (sum).
    AllReduce,
    /// Reduce-scatter (sum), equal blocks.
    ReduceScatter,
    /// All-gather, equal blocks.
    AllGather,
    /// All-to-all, equal blocks.
    AllToAll,
}

impl Collective {
    /// Sequential ring steps (all-to-all: pairwise exchanges) of one call on g ranks.
    pub fn ring_steps(self, ranks: usize) -> usize {
        let s = ranks.saturating_sub(1);
        match self {
            Collective::AllReduce => 2 * s,
            _ => s,
        }
    }

    /// snake_case name, as in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::AllToAll => "all_to_all",
        }
    }
}

/// The communicator a collective runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// All N ranks.
    World,
    /// The L ranks of this rank's node.
    Node,
    /// The M ranks with this rank's local index, one per node.
    Cross,
}

impl Group {
    /// Lower-case name, as in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Group::World => "world",
            Group::Node => "node",
            Group::Cross => "cross",
        }
    }
}

/// Why the bytes move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommPurpose {
    /// Gradient reduction.
    Grads,
    /// Updated parameters gathered after the step (stages 1/2: all; stage 3: persistent
    /// units).
    ParamsAfterStep,
    /// Stage 3 gathers before each forward layer.
    GatherForward,
    /// Stage 3 gathers before each backward layer.
    GatherBackward,
}

/// One collective's traffic per optimizer step, on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommLine {
    /// Kind.
    pub collective: Collective,
    /// Purpose.
    pub purpose: CommPurpose,
    /// The communicator it runs on.
    pub group: Group,
    /// Element type on the wire.
    pub dtype: DType,
    /// Calls per step.
    pub calls: u64,
    /// Sum over calls of the full (gathered; all-to-all: sent) buffer size in elements.
    pub elems: u64,
    /// Bytes each rank sends per step (ring, on the g ranks of its group): elems x size x
    /// (g-1)/g, twice for all-reduce. Each rank receives as many.
    pub sent_bytes: u64,
}

/// Small all-reduce outside the volume formulas (clip norm and overflow agreement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlLine {
    /// Calls per step.
    pub calls: u64,
    /// Elements per call.
    pub elems: u64,
    /// Element type.
    pub dtype: DType,
}

/// Traffic of one optimizer step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommPlan {
    /// N.
    pub world: usize,
    /// L: ranks per node (N: one node).
    pub ranks_per_node: usize,
    /// A: micro-steps per optimizer step.
    pub grad_accum: usize,
    /// Data collectives.
    pub lines: Vec<CommLine>,
    /// Norm/overflow agreement (stages 1-3).
    pub control: Option<ControlLine>,
}

impl CommPlan {
    /// The traffic of `plan`'s configuration with A = `grad_accum` micro-steps.
    pub fn new(layout: &PartitionLayout, plan: &BufferPlan, grad_accum: usize) -> CommPlan {
        let n = layout.world;
        // Counts are summed in u128 (A x padded Ψ passes u64 for Ψ = 1e15, A = 20000)
        // and saturated once, in `on`, where the public u64 figures are made.
        let a = grad_accum as u128;
        let stage = plan.inputs.stage;
        let (p, g, w) = (
            plan.param_dtype,
            plan.inputs.grad_dtype,
            plan.inputs.reduce_dtype,
        );
        // Per-unit chunk counts for bucketed collectives.
        let chunked = |us: &mut dyn Iterator<Item = usize>| -> (u128, u128) {
            us.fold((0, 0), |(c, e), u| {
                let unit = &layout.units[u];
                (
                    c + plan.shard_chunk_count(unit.shard_len) as u128,
                    e + unit.padded_len as u128,
                )
            })
        };
        let all = || 0..layout.units.len();
        let l = plan.inputs.ranks_per_node.max(1);
        let m = n / l;
        let size = |g: Group| match g {
            Group::World => n,
            Group::Node => l,
            Group::Cross => m,
        } as u64;
        let mut lines = Vec::new();
        let mut on = |group: Group, collective, purpose, dtype: DType, calls: u128, elems: u128| {
            if elems == 0 {
                return;
            }
            let (g, factor) = (size(group), collective_factor(collective));
            lines.push(CommLine {
                collective,
                purpose,
                group,
                dtype,
                calls: saturate(calls),
                elems: saturate(elems),
                sent_bytes: ring_bytes(elems, dtype.size_bytes() as u64 * factor, g),
            });
        };
        use Collective::*;
        use CommPurpose::*;
        use Group::*;
        // Sharded gradients reduce every micro-step, each unit once per use; else once a
        // step.
        let uses = |u: usize| plan.uses[u].len().max(1) as u128;
        let reduced = || -> (u128, u128) {
            if !plan.grads_sharded {
                return chunked(&mut all());
            }
            let (c, e) = (0..layout.units.len()).fold((0, 0), |(c, e), u| {
                let (cu, eu) = chunked(&mut std::iter::once(u));
                (c + cu * uses(u), e + eu * uses(u))
            });
            (c * a, e * a)
        };
        // The gradient reduction of stages 1-3: reduce-scatters of W, or with qgZ per
        // chunk of c an all-to-all inside the node and one across nodes (codes, scales).
        let reduce = |on: &mut dyn FnMut(Group, Collective, CommPurpose, DType, u128, u128)| {
            let Some(block) = plan.inputs.grad_quant_block else {
                let (calls, elems) = reduced();
                on(World, ReduceScatter, Grads, w, calls, elems);
                return;
            };
            use zero_kernels::quant::scale_count;
            let (mut calls, mut inside, mut across) = (0, [0u128; 2], [0u128; 2]);
            for (u, unit) in layout.units.iter().enumerate() {
                let times = if plan.grads_sharded { uses(u) * a } else { 1 };
                // Chunks of one length at a time (counted, never built).
                for (c, count) in plan.shard_chunk_lens(unit.shard_len) {
                    let times = times * count as u128;
                    calls += times;
                    let bits = plan.inputs.grad_quant_bits;
                    inside[0] += times * (l * grad_code_bytes(m * c, bits)) as u128;
                    inside[1] += times * (l * scale_count(m * c, block)) as u128;
                    across[0] += times * (m * grad_code_bytes(c, bits)) as u128;
                    across[1] += times * (m * scale_count(c, block)) as u128;
                }
            }
            for (group, ranks, [codes, scales]) in [(Node, l, inside), (Cross, m, across)] {
                if ranks > 1 {
                    on(group, AllToAll, Grads, DType::U8, calls, codes);
                    on(group, AllToAll, Grads, DType::F32, calls, scales);
                }
            }
        };
        match stage {
            Stage::Zero0 => {
                // In place, one call per unit, when no conversion is needed (W = G);
                // else bucket-sized chunks converted to W.
                let calls = layout
                    .units
                    .iter()
                    .map(|u| {
                        if w == g {
                            1
                        } else {
                            plan.full_chunk_count(u.padded_len) as u128
                        }
                    })
                    .sum();
                on(
                    World,
                    AllReduce,
                    Grads,
                    w,
                    calls,
                    layout.padded_numel() as u128,
                );
            }
            Stage::Zero1 | Stage::Zero2 => {
                reduce(&mut on);
                let (_, elems) = chunked(&mut all());
                // Updated parameters: one in-place all-gather per unit (qwZ: codes, then
                // scales).
                let calls = layout.units.len() as u128;
                match plan.inputs.quant_block {
                    None => on(World, AllGather, ParamsAfterStep, p, calls, elems),
                    Some(block) => {
                        on(World, AllGather, ParamsAfterStep, DType::U8, calls, elems);
                        let scales = all().fold(0, |e, u| {
                            let shard = layout.units[u].shard_len;
                            e + (n * zero_kernels::quant::scale_count(shard, block)) as u128
                        });
                        on(World, AllGather, ParamsAfterStep, DType::F32, calls, scales);
                    }
                }
            }
            Stage::Zero3 => {
                let (mut s_calls, mut s_elems) = (0u128, 0u128);
                for (u, unit) in layout.units.iter().enumerate() {
                    if plan.persistent[u] {
                        s_calls += 1;
                        s_elems += unit.padded_len as u128;
                    }
                }
                // Gathers as the schedule issues them (once per use and pass).
                let gathers = |pass: &[crate::plan::PassStep]| -> (u128, u128) {
                    pass.iter()
                        .flat_map(|s| &s.gather)
                        .fold((0, 0), |(c, e), &u| {
                            (c + 1, e + layout.units[u].padded_len as u128)
                        })
                };
                if let Some(g) = &plan.gather {
                    for (pass, purpose) in
                        [(&g.forward, GatherForward), (&g.backward, GatherBackward)]
                    {
                        let (calls, elems) = gathers(pass);
                        if purpose == GatherBackward && plan.inputs.hierarchical_weights {
                            // hpZ: from the secondary partition, inside the node, exact.
                            on(Node, AllGather, purpose, p, a * calls, a * elems);
                            continue;
                        }
                        match plan.inputs.quant_block {
                            None => on(World, AllGather, purpose, p, a * calls, a * elems),
                            // qwZ: the codes (a byte a value) and, per shard, one f32
                            // scale per block, in two all-gathers.
                            Some(block) => {
                                on(World, AllGather, purpose, DType::U8, a * calls, a * elems);
                                let scales =
                                    pass.iter().flat_map(|s| &s.gather).fold(0, |e, &u| {
                                        let shard = layout.units[u].shard_len;
                                        e + (n * zero_kernels::quant::scale_count(shard, block))
                                            as u128
                                    });
                                on(World, AllGather, purpose, DType::F32, a * calls, a * scales);
                            }
                        }
                    }
                }
                reduce(&mut on);
                on(World, AllGather, ParamsAfterStep, p, s_calls, s_elems);
            }
        }
        CommPlan {
            world: n,
            ranks_per_node: l,
            grad_accum,
            lines,
            // Every stage agrees on (squared norm, overflow flag, loss sum) in f64.
            control: Some(ControlLine {
                calls: 1,
                elems: 3,
                dtype: DType::F64,
            }),
        }
    }

    /// Bytes each rank sends per step over all data collectives (and receives as many).
    pub fn sent_bytes(&self) -> u64 {
        self.lines
            .iter()
            .map(|l| l.sent_bytes)
            .fold(0, u64::saturating_add)
    }

    /// Bytes sent per step by one kind of collective.
    pub fn sent_bytes_of(&self, c: Collective) -> u64 {
        self.lines
            .iter()
            .filter(|l| l.collective == c)
            .map(|l| l.sent_bytes)
            .fold(0, u64::saturating_add)
    }

    /// Bytes each rank sends per step in the control all-reduce (on the world, outside
    /// the lines).
    pub fn control_sent_bytes(&self) -> u64 {
        let n = self.world as u64;
        self.control.map_or(0, |c| {
            ring_bytes(
                c.calls as u128 * c.elems as u128,
                c.dtype.size_bytes() as u64 * 2,
                n,
            )
        })
    }

    /// M: nodes.
    pub fn nodes(&self) -> usize {
        self.world / self.ranks_per_node.max(1)
    }

    /// Ranks of a group.
    pub fn group_size(&self, g: Group) -> usize {
        match g {
            Group::World => self.world,
            Group::Node => self.ranks_per_node,
            Group::Cross => self.nodes(),
        }
    }

    /// Bytes each rank sends per step on one group.
    pub fn sent_bytes_on(&self, g: Group) -> u64 {
        self.lines
            .iter()
            .filter(|l| l.group == g)
            .map(|l| l.sent_bytes)
            .fold(0, u64::saturating_add)
    }

    /// Bytes leaving each node per step (one node: none): the world ring's one link out
    /// of the node carries what a rank sends on the world; the node's L ranks each send
    /// their cross-node bytes out of it.
    pub fn node_egress_bytes(&self) -> u64 {
        node_egress(
            self.nodes(),
            self.ranks_per_node,
            self.sent_bytes_on(Group::World),
            self.sent_bytes_on(Group::Cross),
        )
    }

    /// Alpha-beta estimate of the communication time of one step, in seconds, if no
    /// collective overlaps compute, on one kind of link: every ring step of every call
    /// costs `alpha_s`, every byte sent costs `1 / beta_bytes_per_s`.
    pub fn estimate_seconds(&self, alpha_s: f64, beta_bytes_per_s: f64) -> f64 {
        self.estimate_seconds_on(&Links::uniform(alpha_s, beta_bytes_per_s))
    }

    /// Alpha-beta estimate on two kinds of link ([`Links`]), no overlap: a world ring
    /// spanning nodes moves at the slower of the two; a node collective at the intra-node
    /// rate; the L cross-node all-to-alls of a node share its link.
    pub fn estimate_seconds_on(&self, links: &Links) -> f64 {
        self.lines.iter().map(|l| self.line_seconds(l, links)).sum()
    }

    /// One line's alpha-beta seconds ([`CommPlan::estimate_seconds_on`]).
    pub fn line_seconds(&self, l: &CommLine, links: &Links) -> f64 {
        let g = self.group_size(l.group);
        // In f64: calls x steps may pass u64 for a saturated line.
        let latency = l.calls as f64 * l.collective.ring_steps(g) as f64 * links.alpha_s;
        let bytes = l.sent_bytes as f64;
        let spans_nodes = self.nodes() > 1;
        let bandwidth = match l.group {
            Group::World if spans_nodes => {
                bytes / links.intra_bytes_per_s.min(links.inter_bytes_per_s)
            }
            Group::World | Group::Node => bytes / links.intra_bytes_per_s,
            Group::Cross => self.ranks_per_node as f64 * bytes / links.inter_bytes_per_s,
        };
        latency + bandwidth
    }
}

/// Bytes leaving each of `nodes` nodes of `ranks_per_node` ranks, from what one rank
/// sends on the world and on the cross-node group ([`CommPlan::node_egress_bytes`]).
pub fn node_egress(nodes: usize, ranks_per_node: usize, world_sent: u64, cross_sent: u64) -> u64 {
    if nodes <= 1 {
        return 0;
    }
    world_sent.saturating_add((ranks_per_node as u64).saturating_mul(cross_sent))
}

/// Bytes one rank sends in a ring collective over `g` ranks moving `elems` elements of
/// `bytes_per_elem` (the collective's factor included): `elems x bytes x (g-1) / g`. In
/// u128, then saturated: a huge plan (stage 3, A = 1024, 65536 ranks, 70B parameters)
/// passes u64 in the product though not in the result; exact below that. `elems` is
/// the exact u128 count of [`CommPlan::new`], so a result below 2^64 is exact even
/// when `elems` is not (Ψ = 1e15, A = 20000: 2e19 elements).
pub(crate) fn ring_bytes(elems: u128, bytes_per_elem: u64, g: u64) -> u64 {
    if g == 0 {
        return 0;
    }
    // Saturating in u128 too, though no plan comes near it: u128::MAX / g is still past
    // u64::MAX, so such a result saturates below rather than wrapping.
    let total = elems
        .saturating_mul(bytes_per_elem as u128)
        .saturating_mul((g - 1) as u128)
        / g as u128;
    saturate(total)
}

/// A u128 count as a public u64 figure: exact below 2^64, saturated (never wrapped) above.
fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// The links of an alpha-beta estimate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Links {
    /// Latency per ring step (all-to-all: per exchange), seconds.
    pub alpha_s: f64,
    /// A rank's bandwidth to the ranks of its node, bytes/s.
    pub intra_bytes_per_s: f64,
    /// A node's bandwidth to the other nodes, shared by its ranks, bytes/s.
    pub inter_bytes_per_s: f64,
}

impl Links {
    /// One kind of link for everything.
    pub fn uniform(alpha_s: f64, bytes_per_s: f64) -> Links {
        Links {
            alpha_s,
            intra_bytes_per_s: bytes_per_s,
            inter_bytes_per_s: bytes_per_s,
        }
    }
}

fn collective_factor(c: Collective) -> u64 {
    match c {
        Collective::AllReduce => 2,
        _ => 1,
    }
}

/// the volume of docs/ARCHITECTURE.md's table per step in units of Ψ, before the (N-1)/N x element size factor:
/// 2 (stages 0-2 reducing once), A + 1 (stage 2 reducing every micro-step), 3A (stage 3
/// reducing every micro-step), 2A + 1 (stage 3 accumulating locally).
pub fn paper_volume_psi(stage: Stage, grad_accum: usize, reduce_every_micro_step: bool) -> usize {
    let a = grad_accum;
    match (stage, reduce_every_micro_step) {
        (Stage::Zero0 | Stage::Zero1, _) | (Stage::Zero2, false) => 2,
        (Stage::Zero2, true) => a + 1,
        (Stage::Zero3, true) => 3 * a,
        (Stage::Zero3, false) => 2 * a + 1,
    }
}
