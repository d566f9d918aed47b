//! What the in-process engine tests share: the example models on thread ranks
//! (`zero_comm::LocalComm`), on the host or the simulated device, and a run that returns
//! every step's loss and the final parameters.

#![allow(dead_code)]

#[path = "../../examples/models/mod.rs"]
pub mod models;

use models::char_lm::{CharLm, CharLmConfig, TokenBatch};
use models::data;
use zero_comm::{run_local, run_local_on_nodes, CommConfig, Communicator, LocalComm, NodeGroups};
use zero_core::{Engine, EngineConfig, EngineError, Precision, Stage, StepReport, WaitPoint};
use zero_kernels::device::{Device, HostDevice, SimDevice};

/// Which device the ranks run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    /// The eager CPU device.
    Host,
    /// The simulated device with this interleaving seed (plus the rank).
    Sim(u64),
}

/// Rows per rank per micro-step, characters per row.
pub const ROWS: usize = 2;
pub const SEQ: usize = 16;

/// The char LM's shape for the tests: ~7k parameters, a tied head.
pub fn lm_config() -> CharLmConfig {
    let (_, vocab) = data::text_tokens();
    CharLmConfig {
        vocab,
        width: 16,
        blocks: 2,
        max_tokens: ROWS * SEQ,
    }
}

/// An fp32 engine configuration at `stage` with A = `accum`.
pub fn config(stage: Stage, precision: Precision, accum: usize) -> EngineConfig {
    let mut c = EngineConfig::default();
    c.zero.stage = stage;
    c.precision.dtype = precision;
    c.grad_accum = accum;
    c.optim.lr = 3e-3;
    c.seed = 7;
    // Small buckets so that units reduce in several chunks.
    c.zero.bucket_elems = Some(256);
    c.zero.align = 8;
    // The tied table stays resident from the lookup to the head (one use), as stage 0
    // keeps it: see `released` for the other policy.
    c.zero.reuse_distance = usize::MAX;
    c
}

/// `c` with every unit released between its uses: the tied table is gathered again for
/// the head (stage 3) and its gradient reduced after each use (stages 2/3).
pub fn released(mut c: EngineConfig) -> EngineConfig {
    c.zero.reuse_distance = 0;
    c
}

/// What one rank saw.
#[derive(Clone, Debug)]
pub struct RankRun {
    pub losses: Vec<f64>,
    pub reports: Vec<StepReport>,
    pub master: Vec<f32>,
    pub memory_plan: Vec<(zero_core::ledger::MemCategory, u64)>,
    pub memory_measured: Vec<(zero_core::ledger::MemCategory, u64)>,
    pub comm_plan: zero_core::ledger::CommPlan,
}

/// The global batch of `step` for micro-step `m` on rank `r` of `n`: rows
/// `(m n + r) B ..` of the step's N A B rows, so any N x A split sees the same rows.
pub fn lm_batch(step: u64, m: usize, r: usize, n: usize, accum: usize) -> (Vec<u32>, Vec<u32>) {
    let (tokens, _) = data::text_tokens();
    let global = n * accum * ROWS;
    let first = step as usize * global + (m * n + r) * ROWS;
    data::text_rows(&tokens, 11, 0, first, ROWS, SEQ)
}

/// Train the char LM for `steps` on `n` thread ranks; every rank's run, in rank order.
pub fn run_lm(n: usize, config: &EngineConfig, on: On, steps: u64) -> Result<Vec<RankRun>, String> {
    run_lm_with(n, config, on, steps, None)
}

/// As [`run_lm`], leaving out one stream hand-over (the simulated device must object).
pub fn run_lm_with(
    n: usize,
    config: &EngineConfig,
    on: On,
    steps: u64,
    skip: Option<WaitPoint>,
) -> Result<Vec<RankRun>, String> {
    let outcomes = run_local(n, CommConfig::default(), |comm: LocalComm| match on {
        On::Host => rank_run(&comm, None, &HostDevice::new(), config, steps, skip),
        On::Sim(seed) => rank_run(
            &comm,
            None,
            &SimDevice::new(seed + comm.rank() as u64),
            config,
            steps,
            skip,
        ),
    });
    collect(outcomes)
}

/// As [`run_lm`], on nodes of `ranks_per_node` thread ranks (the engine built
/// `Engine::on_nodes`).
pub fn run_lm_on_nodes(
    n: usize,
    ranks_per_node: usize,
    config: &EngineConfig,
    on: On,
    steps: u64,
) -> Result<Vec<RankRun>, String> {
    let outcomes = run_local_on_nodes(
        n,
        ranks_per_node,
        CommConfig::default(),
        |comm: LocalComm, nodes: NodeGroups<LocalComm>| match on {
            On::Host => rank_run(&comm, Some(&nodes), &HostDevice::new(), config, steps, None),
            On::Sim(seed) => rank_run(
                &comm,
                Some(&nodes),
                &SimDevice::new(seed + comm.rank() as u64),
                config,
                steps,
                None,
            ),
        },
    )
    .map_err(|e| e.to_string())?;
    collect(outcomes)
}

fn collect(
    outcomes: Vec<Result<Result<RankRun, EngineError>, zero_comm::RankPanic>>,
) -> Result<Vec<RankRun>, String> {
    let mut out = Vec::new();
    for (r, o) in outcomes.into_iter().enumerate() {
        match o {
            Ok(Ok(run)) => out.push(run),
            Ok(Err(e)) => return Err(format!("rank {r}: {e}")),
            Err(p) => return Err(format!("rank {r} panicked: {p:?}")),
        }
    }
    Ok(out)
}

fn rank_run<D: Device>(
    comm: &LocalComm,
    nodes: Option<&NodeGroups<LocalComm>>,
    dev: &D,
    config: &EngineConfig,
    steps: u64,
    skip: Option<WaitPoint>,
) -> Result<RankRun, EngineError> {
    let mut model = CharLm::new(dev, lm_config())?;
    let mut engine = match nodes {
        Some(g) => Engine::on_nodes(config, comm, g, dev, &model)?,
        None => Engine::new(config, comm, dev, &model)?,
    };
    if let Some(point) = skip {
        engine.skip_wait_for_tests(point);
    }
    let (n, r, a) = (comm.size(), comm.rank(), config.grad_accum);
    let mut losses = Vec::new();
    let mut reports = Vec::new();
    for step in 0..steps {
        let io: Vec<_> = (0..a).map(|m| lm_batch(step, m, r, n, a)).collect();
        let batches: Vec<TokenBatch<'_>> = io
            .iter()
            .map(|(x, y)| TokenBatch {
                inputs: x,
                targets: y,
                seq_len: SEQ,
            })
            .collect();
        let report = engine.step(&mut model, &batches)?;
        losses.push(report.loss);
        reports.push(report);
    }
    Ok(RankRun {
        losses,
        reports,
        master: engine.full_master_f32()?,
        memory_plan: engine.plan().by_category(),
        memory_measured: engine.memory().into_iter().collect(),
        comm_plan: zero_core::ledger::CommPlan::new(engine.layout(), engine.plan(), a),
    })
}

/// Bit patterns, for exact comparisons.
pub fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}
