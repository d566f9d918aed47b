//! What [`super::Engine::new`] does before its first collective, and the agreement that
//! ends it. Everything that can fail, and may fail on some ranks only (a config or spec
//! that does not validate, the layout, node groups built wrongly, the plan, streams,
//! memory), is one [`prepare`] whose result every rank then agrees on in one all-reduce,
//! together with a fingerprint of the model and the configuration. So every rank leaves
//! set-up with an error, or every rank goes on to the initial values' gathers: a rank that
//! returned early would leave the others waiting in a collective, and ranks built with
//! different learning rates, stages or models would train apart silently or wait at
//! different collectives.
//!
//! Invariant: the agreement needs nothing that can fail on some ranks only except its own
//! stream, a 5-element device buffer and (for a host-staged communicator) 40 bytes of
//! staging, all taken before anything large is allocated.

use zero_comm::{on_stream, Communicator, NodeGroups, ReduceOp};
use zero_kernels::device::{Buffer, Device};

use super::buffers::Buffers;
use super::{EngineError, Streams};
use crate::config::EngineConfig;
use crate::layout::{LayoutError, PartitionLayout};
use crate::plan::{BufferPlan, PlanInputs};
use crate::spec::ModelSpec;

/// What the agreement reduces: [failed, hi, lo, -hi, -lo] of the fingerprint, under Max.
/// The negated halves give each half's minimum, so max == min says every rank has the
/// same half. A 32-bit half is exact in f64; five values (40 bytes) fit the smallest
/// host staging region a plan reserves (64 bytes), so the agreement adds nothing to it.
const AGREED: usize = 5;

/// What every rank must build alike, in 64 bits: the model's spec (its own fingerprint)
/// and the engine's configuration, FNV-1a over its `Debug` text (every field, floats in
/// their shortest exact form; the same binary writes it alike on every rank).
pub(super) fn fingerprint(spec: &ModelSpec, config: &EngineConfig) -> u64 {
    let mut h = crate::spec::Fnv::default();
    h.u64(spec.fingerprint());
    h.bytes(format!("{config:?}").as_bytes());
    h.0
}

/// The message every rank returns when the fingerprints differ.
const MISMATCH: &str = "the ranks built their engines from different models or configurations (the fingerprints of their ModelSpec and EngineConfig differ): every rank must build the engine (Engine::new, Engine::on_nodes) with the same ModelSpec and the same EngineConfig (lr, betas, stage, grad_accum, precision, policies, seed), or the ranks train apart or wait at different collectives";

/// What the engine is built from, made on this rank before any collective.
pub(super) struct Prepared<D: Device> {
    pub layout: PartitionLayout,
    pub plan: BufferPlan,
    pub streams: Streams<D>,
    pub bufs: Buffers<D>,
}

/// Every fallible step of set-up, in order: validation, layout, the node groups, the
/// plan, the streams, the buffers and the host staging (the last two may fail on some
/// ranks only: memory).
pub(super) fn prepare<D: Device, C: Communicator>(
    config: &EngineConfig,
    comm: &C,
    nodes: Option<&NodeGroups<C>>,
    dev: &D,
    spec: &ModelSpec,
    activation_bytes: u64,
) -> Result<Prepared<D>, EngineError> {
    config.validate()?;
    // This rank's own spec is malformed: a layout error, not Mismatch (which says the
    // ranks disagree).
    spec.validate().map_err(LayoutError::BadSpec)?;
    let (rank, world) = (comm.rank(), comm.size());
    let layout = PartitionLayout::new(spec, world, config.zero.align)?;
    let mut inputs = PlanInputs::from_config(config, world, activation_bytes);
    match nodes {
        Some(g) => {
            let (l, m) = (g.node.size(), g.cross.size());
            let wanted = config.zero.ranks_per_node;
            // Node-major: the packing of qgZ and the parts of hpZ rely on it.
            let node_major = g.node.rank() == rank % l && g.cross.rank() == rank / l;
            if l * m != world || !node_major || (wanted > 0 && wanted != l) {
                return Err(EngineError::Mismatch(format!(
                    "the node groups are {m} node(s) of {l} rank(s) (this rank {rank}: local rank {} on node {}) but the world has {world} ranks{}, numbered node by node; build them from this world (zero_comm::MpiComm::node_groups)",
                    g.node.rank(),
                    g.cross.rank(),
                    if wanted > 0 { format!(" and zero.ranks_per_node = {wanted}") } else { String::new() }
                )));
            }
            inputs = inputs.on_nodes(l);
        }
        None if config.zero.hierarchical() => {
            return Err(EngineError::Mismatch(
                "zero.hierarchical_weights and zero.quantize_grads need the node groups: build the engine with Engine::on_nodes (zero_comm::MpiComm::node_groups makes them)".into(),
            ));
        }
        None => {}
    }
    let plan = BufferPlan::new(spec, &layout, &inputs, rank)?;
    let streams = Streams {
        compute: dev.stream("compute")?,
        comm: dev.stream("comm")?,
    };
    let bufs = Buffers::allocate(dev, &plan, spec.units.len())?;
    // Host-staged collectives (zero-comm's StagedComm): the staging buffers are sized
    // here, once, for the largest collective of this plan, not in the middle of a step.
    // The node groups' own staging too (hpZ's and qgZ's collectives are no larger).
    let groups = nodes.into_iter().flat_map(|g| [&g.node, &g.cross]);
    for staging in std::iter::once(comm)
        .chain(groups)
        .filter_map(|c| c.staging())
    {
        staging.reserve(dev, crate::plan::host_staging_region_bytes(&layout, &plan))?;
    }
    Ok(Prepared {
        layout,
        plan,
        streams,
        bufs,
    })
}

/// The agreement's own stream and buffer (none on one rank: nothing to agree with).
pub(super) struct Agreement<D: Device> {
    on: Option<(D::Stream, D::Buf<f64>)>,
}

impl<D: Device> Agreement<D> {
    /// Take what the agreement needs, before [`prepare`] allocates anything large (so
    /// that a rank short of memory still has these). A failure here returns before the
    /// collective: a device that cannot give a stream and 40 bytes cannot take part in
    /// any collective.
    pub fn new<C: Communicator>(comm: &C, dev: &D) -> Result<Self, EngineError> {
        if comm.size() == 1 {
            return Ok(Agreement { on: None });
        }
        let stream = dev.stream("set-up agreement")?;
        let buf = dev.alloc::<f64>(AGREED, "set-up agreement")?;
        // A host-staged all-reduce needs its staging: reserved here so that a rank whose
        // plan-sized reservation fails still reaches the collective. Never shrinks, and
        // the plan's (at least 64 bytes) replaces it.
        if let Some(staging) = comm.staging() {
            staging.reserve(dev, AGREED * std::mem::size_of::<f64>())?;
        }
        Ok(Agreement {
            on: Some((stream, buf)),
        })
    }

    /// Every rank's set-up outcome and fingerprint, agreed (collective: one all-reduce
    /// on the device buffer, which every communicator takes, NCCL only device memory).
    /// A rank returns its own error if it has one, else [`EngineError::Mismatch`] when
    /// the fingerprints differ, else [`EngineError::PeerSetup`] when another rank
    /// failed, else its own result.
    pub fn agree<T, C: Communicator>(
        self,
        comm: &C,
        dev: &D,
        fingerprint: u64,
        mine: Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let Some((stream, mut buf)) = self.on else {
            return mine;
        };
        let (hi, lo) = (
            (fingerprint >> 32) as f64,
            (fingerprint & 0xffff_ffff) as f64,
        );
        let failed = f64::from(u8::from(mine.is_err()));
        let sent = [failed, hi, lo, -hi, -lo];
        let mut agreed = [0.0f64; AGREED];
        let reduced = (|| -> Result<(), EngineError> {
            dev.upload(&stream, &sent, buf.view_mut())?;
            on_stream::all_reduce(comm, dev, &stream, buf.view_mut(), ReduceOp::Max)?;
            dev.download(&stream, buf.view(), &mut agreed)?;
            Ok(())
        })();
        // This rank's own error says more than a failed agreement.
        let mine = mine?;
        reduced?;
        let same = agreed[1] == -agreed[3] && agreed[2] == -agreed[4];
        if !same {
            return Err(EngineError::Mismatch(MISMATCH.into()));
        }
        if agreed[0] > 0.0 {
            return Err(EngineError::PeerSetup);
        }
        Ok(mine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_sees_every_field_of_the_configuration() {
        let spec = ModelSpec {
            units: Vec::new(),
            layers: Vec::new(),
        };
        let base = EngineConfig::default();
        let f = fingerprint(&spec, &base);
        assert_eq!(f, fingerprint(&spec, &base.clone()), "stable");
        let mut lr = base.clone();
        lr.optim.lr *= 1.0 + f64::EPSILON;
        let mut beta = base.clone();
        beta.optim.betas[1] = 0.999;
        let mut accum = base.clone();
        accum.grad_accum = 2;
        let mut policy = base.clone();
        policy.divergence.spike_factor += 1.0;
        for (what, c) in [
            ("lr", lr),
            ("betas", beta),
            ("grad_accum", accum),
            ("policy", policy),
        ] {
            assert_ne!(fingerprint(&spec, &c), f, "{what}");
        }
    }

    #[test]
    fn a_malformed_spec_is_a_layout_error_on_every_rank_not_a_mismatch() {
        use crate::spec::{LayerSpec, ParamSpec, UnitSpec};
        use zero_kernels::device::HostDevice;
        // The same bad spec on both ranks (a duplicate name): each rank's own error, which
        // is no disagreement between the ranks.
        let spec = ModelSpec {
            units: vec![UnitSpec {
                name: "u".into(),
                params: vec![ParamSpec::new("w", &[2]), ParamSpec::new("w", &[3])],
            }],
            layers: vec![LayerSpec::new("l", vec![0])],
        };
        let config = EngineConfig::default();
        let outcomes = zero_comm::run_local(2, Default::default(), |comm| {
            let dev = HostDevice::new();
            let agreement = Agreement::new(&comm, &dev).map_err(|e| e.to_string())?;
            let mine = prepare(&config, &comm, None, &dev, &spec, 0).map(drop);
            match agreement.agree(&comm, &dev, fingerprint(&spec, &config), mine) {
                Err(EngineError::Layout(LayoutError::BadSpec(m))) => Ok(m),
                other => Err(format!("{:?}", other.map(drop))),
            }
        });
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            let message = outcome
                .expect("no panic")
                .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            assert!(
                message.contains("'w' appears twice"),
                "rank {rank}: {message}"
            );
        }
    }

    #[test]
    fn the_halves_of_a_fingerprint_are_exact_in_f64() {
        for f in [
            0u64,
            1,
            u64::MAX,
            0x8000_0000_ffff_ffff,
            0xdead_beef_0bad_f00d,
        ] {
            let (hi, lo) = ((f >> 32) as f64, (f & 0xffff_ffff) as f64);
            assert_eq!(((hi as u64) << 32) | lo as u64, f);
        }
    }
}
