//! The ZeRO engine: one rank's share of data-parallel training, at stage 0-3, on any
//! [`Device`] and any [`Communicator`].
//!
//! [`Engine::new`] lays the model out ([`PartitionLayout`]), plans this rank's buffers
//! ([`BufferPlan`], the same code as the dry run), allocates exactly those on the device
//! and fills them from the model's initialiser (the same values on every rank and for
//! every N). [`Engine::step`] (`step.rs`) runs one optimizer step over A micro-batches and
//! returns what happened ([`StepReport`]).
//!
//! Two streams carry the work: `compute` (the model, packing, the optimizer) and `comm`
//! (every collective and what lands their results). Every hand-over between them is an
//! event ([`WaitPoint`] names each one), so the same code is right on an eager CPU, on
//! the checking simulator and on a GPU.
//!
//! Files, one idea each: `step.rs` the step top to bottom; `passes.rs` the forward and
//! backward over layers (with stage-3 gathers); `reducer.rs` buckets and gradient
//! reduction; `agree.rs` what every rank must agree on; `optimizer.rs` AdamW and sharing
//! the new parameters; `buffers.rs` the allocations; `state.rs` checkpoint import and
//! export; `scaler.rs` fp16 loss scaling.
//!
//! Invariant: for the same seed, data and world size, every stage computes the same
//! step; the stage only decides which buffers are full and which are this rank's shard
//! ([`crate::plan::UnitPlacement`]).

mod agree;
mod buffers;
pub mod guard;
mod optimizer;
mod passes;
mod qgz;
mod qwz;
mod reducer;
pub mod scaler;
mod setup;
pub mod state;
mod step;

use std::collections::BTreeMap;
use std::ops::Range;

use zero_comm::{on_stream, CommError, CommStats, Communicator, NodeGroups};
use zero_kernels::device::{Buffer, DViewMut, Device, OverlapStats};
use zero_kernels::{DType, Element, Float, KernelError};

use crate::config::{ConfigError, EngineConfig, Precision};
use crate::layout::{LayoutError, PartitionLayout};
use crate::ledger::MemCategory;
use crate::model::{Compute, Model, ModelError};
use crate::plan::{BufferPlan, BufferRole, PlanError};
use crate::spec::ModelSpec;
use buffers::Buffers;
pub use scaler::LossScaler;

/// Everything that can stop the engine, with what and where.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A collective failed (the error names the rank and the collective).
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A device op failed or refused its inputs.
    #[error("device: {0}")]
    Device(#[from] KernelError),
    /// The model failed.
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// The model's spec cannot be laid out.
    #[error("layout: {0}")]
    Layout(#[from] LayoutError),
    /// The buffer plan cannot be made.
    #[error("memory plan: {0}")]
    Plan(#[from] PlanError),
    /// `step` was given another model than the engine was built for.
    #[error("the model passed to step ({got}) is not the one this engine was built for ({expected}); build the engine with Engine::new for this model")]
    WrongModel {
        /// The engine's model.
        expected: String,
        /// The model given.
        got: String,
    },
    /// The model or batches do not fit the configuration.
    #[error("{0}")]
    Mismatch(String),
    /// Another rank could not set its engine up (its own error says why), so this one
    /// stopped before the first gather of [`Engine::new`].
    #[error("another rank could not set its engine up (its own error, on its stderr, says why: memory, most often); this rank stopped before the first gather")]
    PeerSetup,
    /// An inf/NaN gradient where no loss scaler can recover (fp32, bf16): the step was
    /// not applied on any rank.
    #[error("step {step}: the gradient is inf/NaN on some rank (loss {loss}) in {precision} training, where loss scaling does not apply; the step was not applied. Lower optim.lr, check the data, or resume from the last checkpoint")]
    NonFinite {
        /// The step.
        step: u64,
        /// The agreed loss of the step.
        loss: f64,
        /// The precision (`fp32`, `bf16`).
        precision: String,
    },
    /// fp16 overflowed `skips` steps in a row at the minimum loss scale: skipping more
    /// makes no progress (`precision.max_skips_at_min_scale`).
    #[error("step {step}: {skips} steps in a row overflowed in fp16 at the minimum loss scale {scale}, so training makes no progress; train in bf16 (precision.dtype = \"bf16\": fp32's exponent range, no loss scaling) or lower optim.lr, and resume from the last checkpoint")]
    NoProgress {
        /// The step (counted from 1).
        step: u64,
        /// Overflowing steps in a row at the floor.
        skips: usize,
        /// The floor.
        scale: f64,
    },
    /// The loss diverged and `divergence.policy = "stop"`: the step was not applied.
    #[error("step {step}: the loss {loss} is {why}; stopping (divergence.policy = \"stop\"; \"warn\" or \"skip_step\" go on). Lower optim.lr or raise optim.warmup_steps, and resume from the last checkpoint")]
    Diverged {
        /// The step (counted from 1).
        step: u64,
        /// Its loss.
        loss: f64,
        /// Why it counts as divergent.
        why: guard::Divergence,
    },
    /// `divergence.policy = "skip_step"` skipped more than `max_consecutive_skips` steps
    /// in a row: the loss stays far above its recent median, and skipping makes no
    /// progress.
    #[error("step {step}: {skipped} steps in a row were skipped for a divergent loss (divergence.max_consecutive_skips) and this one diverges too: the loss has moved for good (new data? a resume?), and skipping makes no progress. Use divergence.policy = \"warn\", raise divergence.spike_factor, or lower optim.lr, and resume from the last checkpoint")]
    SkippedTooLong {
        /// The step (counted from 1).
        step: u64,
        /// Steps skipped in a row before it.
        skipped: usize,
    },
    /// An earlier step failed part-way (a model, device or communication error), so
    /// this engine's buffers and streams may hold half a step and the ranks may be at
    /// different collectives: it runs no more steps and moves no state in or out.
    #[error("step {step} failed part-way (the error it returned says why), so this engine's buffers may hold half a step and the ranks may be out of step in their collectives; it runs no more steps and exports or imports no state. Build a new engine (Engine::new) and resume from the last checkpoint")]
    Interrupted {
        /// The step that failed (counted from 1).
        step: u64,
    },
    /// State was imported ([`Engine::import_unit`]) and no [`Engine::finish_import`]
    /// succeeded after it (a checkpoint load that failed part-way, or a missing call):
    /// parameters, master and optimizer state are part old, part new, so the engine runs
    /// no steps and exports no state until every unit is imported again and finished.
    #[error("state was imported into this engine (Engine::import_unit, e.g. by a checkpoint load that failed part-way) without a successful Engine::finish_import after it, so its parameters, master weights and optimizer state are part old, part new; it runs no steps and exports no state. Build a new engine (Engine::new), or import every unit again and call finish_import (load the checkpoint again)")]
    ImportPending,
    /// [`Engine::finish_import`] while an import is pending and some units were not
    /// imported since it began: finishing would leave those units' state old. The import
    /// stays pending.
    #[error("finish_import: {} of the model's {units} units were not imported since the import began ({}), so finishing would leave their parameters and optimizer state old beside the new ones; import every unit (Engine::import_unit for each unit, after Engine::begin_import) and call finish_import again", missing.len(), unit_list(missing))]
    ImportIncomplete {
        /// (index, name) of each unit not imported.
        missing: Vec<(usize, String)>,
        /// Units of the model.
        units: usize,
    },
    /// [`Engine::finish_import`] failed on other ranks (each one's message): no rank
    /// finished, so every rank's import stays pending.
    #[error("finish_import failed on {} other rank(s), so no rank finished its import and every engine still refuses steps:{}", failures.len(), failure_lines(failures))]
    PeerImport {
        /// (rank, its error), in rank order.
        failures: Vec<(usize, String)>,
    },
    /// A broken engine invariant (a bug: please report it with the config).
    #[error("internal engine error: {0}")]
    Internal(String),
}

/// "unit 3 'h.2', unit 5 'h.4'", at most eight, then how many more.
fn unit_list(units: &[(usize, String)]) -> String {
    const SHOWN: usize = 8;
    let mut text: Vec<String> = units
        .iter()
        .take(SHOWN)
        .map(|(u, name)| format!("unit {u} '{name}'"))
        .collect();
    if units.len() > SHOWN {
        text.push(format!("and {} more", units.len() - SHOWN));
    }
    text.join(", ")
}

/// One indented line per failing rank.
fn failure_lines(failures: &[(usize, String)]) -> String {
    failures
        .iter()
        .map(|(r, m)| format!("\n  rank {r}: {m}"))
        .collect()
}

impl EngineError {
    /// Every rank returns this error for the same step, after the ranks agreed on it and
    /// with the step's update not applied: the engine stays whole (its state can be
    /// saved; `NoProgress` comes after its skipped step was counted, the others before).
    pub fn is_agreed_stop(&self) -> bool {
        matches!(
            self,
            EngineError::NonFinite { .. }
                | EngineError::NoProgress { .. }
                | EngineError::Diverged { .. }
                | EngineError::SkippedTooLong { .. }
        )
    }
}

/// What one optimizer step did, on this rank (values agreed across ranks where noted).
#[derive(Clone, Debug)]
pub struct StepReport {
    /// The step's number, counted from 1 (skipped steps count too): after it,
    /// [`Engine::steps_done`] is this number.
    pub step: u64,
    /// Mean loss over the global batch (same on every rank): the mean of the N x A
    /// micro-batch losses.
    pub loss: f64,
    /// Global L2 norm of the gradient before clipping (same on every rank; inf/NaN on
    /// overflow).
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Loss scale used for this step (1 without scaling).
    pub loss_scale: f64,
    /// The step was skipped on every rank (inf/NaN gradient somewhere, or a divergent
    /// loss under `divergence.policy = "skip_step"`).
    pub skipped: bool,
    /// The loss diverged ([`guard::Divergence`]); what followed is the policy's.
    pub diverged: Option<guard::Divergence>,
    /// Wall-clock seconds of the step on this rank.
    pub seconds: f64,
    /// Bytes and calls per collective kind this rank did during the step (on the world).
    pub comm: CommStats,
    /// The same on the node and cross-node groups (an engine built [`Engine::on_nodes`]).
    pub node_comm: Option<NodeStats>,
    /// How much of the step's communication ran behind compute (the progress mechanism
    /// of `zero_kernels::device::HostDevice` and `SimDevice`, `set_overlap`, and of a CUDA
    /// device with `ZERO_CUDA_STAGED=overlap`); zeros where nothing is left running.
    pub overlap: OverlapStats,
    /// Bytes held per memory category (measured from the allocations).
    pub memory: BTreeMap<MemCategory, u64>,
}

/// Calls and bytes on the node and cross-node groups ([`StepReport::node_comm`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// On the node group (hpZ's backward gathers, qgZ's first exchange).
    pub node: CommStats,
    /// On the cross-node group (qgZ's second exchange).
    pub cross: CommStats,
}

impl NodeStats {
    /// The groups' accounting so far.
    pub fn of<C: Communicator>(g: &NodeGroups<C>) -> NodeStats {
        NodeStats {
            node: g.node.stats(),
            cross: g.cross.stats(),
        }
    }
}

impl std::ops::Sub for NodeStats {
    type Output = NodeStats;
    fn sub(self, earlier: NodeStats) -> NodeStats {
        NodeStats {
            node: self.node - earlier.node,
            cross: self.cross - earlier.cross,
        }
    }
}

/// The hand-overs between the compute and the comm stream, each an event one stream
/// waits for. Named so that a test can leave one out ([`Engine::skip_wait_for_tests`])
/// and see the simulated device report the hazard it guards against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitPoint {
    /// Both streams wait for the last write of the parameters (init, update, share)
    /// before a step reads them.
    ParamsReady,
    /// comm waits for compute before reducing what compute packed (or wrote).
    GradsComputed,
    /// compute waits for comm before packing into a bucket whose previous reduction
    /// may still be reading it.
    BucketFree,
    /// compute waits for comm before rewriting a gradient buffer a reduction read
    /// directly (no bucket).
    SourceFree,
    /// compute waits for every reduction to land before reading the gradients.
    GradsReduced,
    /// comm waits for compute to release a stage-3 gather slot before gathering into it.
    SlotFree,
    /// compute waits for a stage-3 gather before the layer that uses it.
    Gathered,
    /// comm waits for the optimizer before sharing the updated parameters.
    Updated,
}

/// The two streams of a step.
#[derive(Debug)]
pub(crate) struct Streams<D: Device> {
    pub compute: D::Stream,
    pub comm: D::Stream,
}

/// What every phase of a step reads: everything but the buffers.
pub(crate) struct Core<'c, D: Device, C: Communicator> {
    pub dev: &'c D,
    pub comm: &'c C,
    /// The node and cross-node groups (hpZ, qgZ), when the engine was built on them.
    pub nodes: Option<&'c NodeGroups<C>>,
    pub config: EngineConfig,
    pub spec: ModelSpec,
    pub layout: PartitionLayout,
    pub plan: BufferPlan,
    pub streams: Streams<D>,
    skip: Option<WaitPoint>,
}

impl<D: Device, C: Communicator> Core<'_, D, C> {
    /// Where the model's ops go.
    pub fn compute(&self) -> Compute<'_, D> {
        Compute {
            dev: self.dev,
            stream: &self.streams.compute,
        }
    }

    /// `stream` waits for `event`, unless a test removed this wait point.
    pub fn wait(
        &self,
        point: WaitPoint,
        stream: &D::Stream,
        event: &D::Event,
    ) -> Result<(), EngineError> {
        if self.skip == Some(point) {
            return Ok(());
        }
        Ok(self.dev.wait_event(stream, event)?)
    }

    /// `to` waits for everything queued on `from` so far.
    pub fn hand_over(
        &self,
        point: WaitPoint,
        from: &D::Stream,
        to: &D::Stream,
    ) -> Result<(), EngineError> {
        let e = self.dev.record(from)?;
        self.wait(point, to, &e)
    }
}

/// One rank's ZeRO engine.
pub struct Engine<'c, D: Device, C: Communicator> {
    core: Core<'c, D, C>,
    bufs: Buffers<D>,
    fingerprint: u64,
    scaler: LossScaler,
    /// Steps run so far (skipped included): the data position and the lr schedule.
    step: u64,
    /// AdamW steps applied (skipped excluded): Adam's bias-correction t.
    applied: u64,
    /// Recent losses and divergent steps.
    guard: guard::LossGuard,
    /// What happened to this training beyond its steps (resumes, precision or batch
    /// changes), oldest first; carried through checkpoints.
    history: Vec<String>,
    activation_bytes: u64,
    /// The step (from 1) that returned an error part-way ([`EngineError::Interrupted`]).
    interrupted: Option<u64>,
    /// Units were imported and no `finish_import` succeeded since
    /// ([`EngineError::ImportPending`]).
    import_pending: bool,
    /// While an import is pending: which units it has imported (`finish_import` needs
    /// every one; `begin_import`, or the first `import_unit` after a finish, clears it).
    imported: Vec<bool>,
}

/// [`Engine::init_params`] for the plan's parameter dtype, chosen before set-up is agreed.
type InitParams<'c, D, C, M> = fn(&mut Engine<'c, D, C>, &M) -> Result<(), EngineError>;

impl<'c, D: Device, C: Communicator> Engine<'c, D, C> {
    /// Lay out `model`, plan and allocate this rank's buffers on `dev`, and initialise
    /// parameters and master weights from `model.init_unit(config.seed, ..)` (or, for
    /// part of a unit, `model.init_unit_range`). Collective: every rank of `comm` calls
    /// it (the initial values are all-gathered). Every rank must pass the same `config`
    /// and a model with the same spec. Set-up is agreed before the first gather, so no
    /// rank waits for one that left: a rank whose set-up fails (configuration, layout,
    /// node groups, plan, memory) returns its own error; otherwise, where the ranks' specs
    /// or configurations differ, every rank returns [`EngineError::Mismatch`]; otherwise,
    /// where another rank failed, [`EngineError::PeerSetup`].
    ///
    /// The matrix-product mode is the device's, not the engine's: this sets `dev`'s bf16
    /// products ([`Device::set_bf16_products`]) on in bf16 training and off otherwise,
    /// for everything that runs on `dev` afterwards (a model's forward outside a step
    /// included). Each [`Engine::step`] sets it again, so engines of different precisions
    /// on one device each step with their own; between steps the device keeps the mode of
    /// the engine that last set it.
    pub fn new<M: Model<D>>(
        config: &EngineConfig,
        comm: &'c C,
        dev: &'c D,
        model: &M,
    ) -> Result<Self, EngineError> {
        Self::build(config, comm, None, dev, model)
    }

    /// [`Engine::new`] on a world of nodes: `nodes` are the node and cross-node groups of
    /// `comm` (`zero_comm::MpiComm::node_groups`), which the hierarchical switches use
    /// (`zero.hierarchical_weights`, `zero.quantize_grads`); without them the groups are
    /// unused.
    pub fn on_nodes<M: Model<D>>(
        config: &EngineConfig,
        comm: &'c C,
        nodes: &'c NodeGroups<C>,
        dev: &'c D,
        model: &M,
    ) -> Result<Self, EngineError> {
        Self::build(config, comm, Some(nodes), dev, model)
    }

    fn build<M: Model<D>>(
        config: &EngineConfig,
        comm: &'c C,
        nodes: Option<&'c NodeGroups<C>>,
        dev: &'c D,
        model: &M,
    ) -> Result<Self, EngineError> {
        let spec = model.spec().clone();
        let activation_bytes = model.activation_bytes() as u64;
        // Everything that can fail on some ranks only is agreed before the first
        // collective (the initial values' gathers), with what every rank must build
        // alike, so that no rank waits there for one that left (`setup.rs`).
        let agreement = setup::Agreement::new(comm, dev)?;
        let mine = setup::prepare(config, comm, nodes, dev, &spec, activation_bytes).and_then(
            |prepared| {
                let init: InitParams<'c, D, C, M> = match prepared.plan.param_dtype {
                    DType::F32 => Self::init_params::<f32, M>,
                    DType::BF16 => Self::init_params::<half::bf16, M>,
                    DType::F16 => Self::init_params::<half::f16, M>,
                    other => return Err(EngineError::Internal(format!("parameter dtype {other}"))),
                };
                Ok((prepared, init))
            },
        );
        let fingerprint = setup::fingerprint(&spec, config);
        let (prepared, init) = agreement.agree(comm, dev, fingerprint, mine)?;
        let setup::Prepared {
            layout,
            plan,
            streams,
            bufs,
        } = prepared;
        let rank = comm.rank();
        // Mixed precision as the hardware does it: in bf16 the model's matrix products take
        // bf16 operands with f32 sums (tensor cores, AVX-512 BF16) where the device can.
        let wants_bf16 = config.precision.dtype == Precision::Bf16;
        let bf16 = dev.set_bf16_products(wants_bf16);
        if wants_bf16 && rank == 0 {
            if bf16 {
                log::debug!("matrix products with bf16 operands on {}", dev.describe());
            } else {
                log::warn!(
                    "{} has no bf16 matrix-product mode: bf16 training multiplies f32 operands \
                     there (weights and gradients are still bf16)",
                    dev.describe()
                );
            }
        }
        let mut engine = Engine {
            fingerprint: spec.fingerprint(),
            core: Core {
                dev,
                comm,
                nodes,
                config: config.clone(),
                spec,
                layout,
                plan,
                streams,
                skip: None,
            },
            bufs,
            scaler: LossScaler::new(&config.precision),
            step: 0,
            applied: 0,
            guard: guard::LossGuard::default(),
            history: Vec::new(),
            activation_bytes,
            interrupted: None,
            import_pending: false,
            imported: Vec::new(),
        };
        init(&mut engine, model)?;
        Ok(engine)
    }

    /// Fill parameters, master weights and persistent units from the model's initialiser,
    /// one unit at a time. Each rank draws only its own block of each unit (`own`, 1/N of
    /// it, through `init_unit_range`) and puts it where its buffers keep it; a buffer that
    /// holds the whole unit (the parameters at stages 0-2 and of a stage-3 unit kept
    /// gathered, the master at stage 0) is then all-gathered from every rank's block. So
    /// with a model whose `init_unit_range` skips ahead (the reference models) start-up
    /// falls as 1/N at every stage, and host memory holds one block at a time. The values
    /// are the bits a whole-unit draw gives: the gather is exact, never qwZ's.
    fn init_params<P: Float, M: Model<D>>(&mut self, model: &M) -> Result<(), EngineError> {
        let core = &self.core;
        let seed = core.config.seed;
        let bufs = &mut self.bufs;
        // One host block and its rounding for every unit, the largest's size: allocated
        // once (per-unit vectors made the allocator return and fault in their pages anew
        // for every unit, about 0.5 GB of page faults per rank on GPT-2 124M).
        let largest = core.plan.placements.iter().map(|at| at.own.len()).max();
        let mut block = Vec::with_capacity(largest.unwrap_or(0));
        let mut rounded: Vec<P> = Vec::with_capacity(block.capacity());
        for (u, unit) in core.layout.units.iter().enumerate() {
            let at = &core.plan.placements[u];
            // This rank's block; elements past numel are padding, zero.
            block.clear();
            block.resize(at.own.len(), 0.0f32);
            let real = at.own.start.min(unit.numel)..at.own.end.min(unit.numel);
            if real.len() == unit.numel {
                model.init_unit(seed, u, &mut block[..unit.numel]);
            } else if !real.is_empty() {
                model.init_unit_range(seed, u, real.clone(), &mut block[..real.len()]);
            }
            rounded.clear();
            rounded.extend(block.iter().map(|&v| P::from_f32(v)));
            let params = bufs.params.get_mut::<P>()?.slice_mut(at.params.clone());
            place_block(core, params, &at.own, &rounded)?;
            if let Some(master) = &mut bufs.master {
                place_block(core, master.slice_mut(at.state.clone()), &at.own, &block)?;
            }
            if let Some(p) = &mut bufs.persistent[u] {
                place_block(core, p.get_mut::<P>()?.view_mut(), &at.own, &rounded)?;
            }
        }
        bufs.params_ready = Some(core.dev.record(&core.streams.compute)?);
        Ok(())
    }

    /// Leave out one stream hand-over (tests only: the simulated device must then report
    /// the hazard; on a real device the run would race).
    #[doc(hidden)]
    pub fn skip_wait_for_tests(&mut self, point: WaitPoint) {
        self.core.skip = Some(point);
    }

    /// The partition layout (saved in checkpoints).
    pub fn layout(&self) -> &PartitionLayout {
        &self.core.layout
    }

    /// This rank's buffer plan (the dry run's numbers).
    pub fn plan(&self) -> &BufferPlan {
        &self.core.plan
    }

    /// The model's units and layers.
    pub fn spec(&self) -> &ModelSpec {
        &self.core.spec
    }

    /// The configuration the engine runs.
    pub fn config(&self) -> &EngineConfig {
        &self.core.config
    }

    /// The communicator the engine runs on (a checkpoint synchronises on it).
    pub fn communicator(&self) -> &'c C {
        self.core.comm
    }

    /// The node and cross-node groups, for an engine built [`Engine::on_nodes`].
    pub fn node_groups(&self) -> Option<&'c NodeGroups<C>> {
        self.core.nodes
    }

    /// The host staging of every communicator the engine uses (the world's, and with
    /// node groups theirs; `zero_comm::StagedComm` only): held bytes, and the copies.
    pub fn host_staging(&self) -> Option<(u64, zero_comm::StagingStats)> {
        let groups = self
            .core
            .nodes
            .into_iter()
            .flat_map(|g| [&g.node, &g.cross]);
        std::iter::once(self.core.comm)
            .chain(groups)
            .filter_map(|c| c.staging())
            .map(|s| (s.held_bytes(), s.stats()))
            .reduce(|(h, a), (g, b)| {
                let stats = zero_comm::StagingStats {
                    to_host: a.to_host + b.to_host,
                    to_device: a.to_device + b.to_device,
                    calls: a.calls + b.calls,
                };
                (h + g, stats)
            })
    }

    /// The device the engine's buffers live on.
    pub fn device(&self) -> &'c D {
        self.core.dev
    }

    /// The loss scaler's state.
    pub fn scaler(&self) -> &LossScaler {
        &self.scaler
    }

    /// Steps run so far (skipped included).
    pub fn steps_done(&self) -> u64 {
        self.step
    }

    /// AdamW steps applied so far.
    pub fn steps_applied(&self) -> u64 {
        self.applied
    }

    /// Steps whose loss diverged so far (`[divergence]`), this run and the runs it
    /// resumed.
    pub fn divergences(&self) -> u64 {
        self.guard.events
    }

    /// The loss guard's state (saved in checkpoints).
    pub fn loss_guard(&self) -> &guard::LossGuard {
        &self.guard
    }

    /// What happened to this training beyond its steps, oldest first (saved in
    /// checkpoints): resumes, precision changes, and what the application records.
    pub fn history(&self) -> &[String] {
        &self.history
    }

    /// Record an event in [`Engine::history`] (e.g. an application allowed a different
    /// batch size on resume).
    pub fn record(&mut self, event: impl Into<String>) {
        self.history.push(event.into());
    }

    /// Bytes held per memory category, measured from the allocations.
    pub fn memory(&self) -> BTreeMap<MemCategory, u64> {
        self.bufs
            .measured_by_category(&self.core.plan, self.activation_bytes)
    }

    /// Every allocated buffer: (role, dtype, elements, bytes).
    pub fn allocations(&self) -> Vec<(BufferRole, DType, usize, u64)> {
        self.bufs.measured()
    }

    /// Refuse a model whose spec is not the one the engine was built for.
    fn check_model<M: Model<D>>(&self, model: &M) -> Result<(), EngineError> {
        let spec = model.spec();
        if spec.fingerprint() != self.fingerprint {
            return Err(EngineError::WrongModel {
                expected: self.core.spec.summary(),
                got: spec.summary(),
            });
        }
        Ok(())
    }
}

/// Put this rank's block of a unit's initial values (`block`, the unit's elements `own`)
/// into `dst`, which keeps either that block or the whole padded unit; a whole unit is
/// then all-gathered from every rank's block (on the compute stream, after the upload).
fn place_block<T: Element, D: Device, C: Communicator>(
    core: &Core<'_, D, C>,
    mut dst: DViewMut<'_, D, T>,
    own: &Range<usize>,
    block: &[T],
) -> Result<(), EngineError> {
    let (dev, s) = (core.dev, &core.streams.compute);
    if dst.len() == block.len() {
        dev.upload(s, block, dst)?;
        return Ok(());
    }
    dev.upload(s, block, dst.reborrow().slice_mut(own.clone()))?;
    on_stream::all_gather_in_place(core.comm, dev, s, dst)?;
    Ok(())
}
