//! The 4-thread-rank training run at ZeRO stages 0-3, fp32 and bf16: prepared here on the
//! host (the reference curves, carried with the binary), run again on the device under
//! test, and the loss curves compared step by step.
//!
//! A small GPT over the built-in Markov corpus keeps the reference cheap to make and the
//! GPU run short. In fp32 the device differs from the host only in summation orders, but
//! training amplifies rounding differences step by step (AdamW divides by sqrt(v): a
//! gradient that is nearly zero turns an ulp into a sizeable update), so two correct
//! implementations drift apart slowly. `prepare` measures that drift on the same run
//! between the host kernels and the CUDA kernels' CPU twins (the GPU's operation order,
//! cuBLAS's products aside); the GPU's curve must stay within [`SPREAD_FACTOR`] times it
//! (and never needs better than [`FP32_TOL`]). A bug shows as a step change, a NaN or a
//! drift many times this. In bf16 both multiply with bf16 operands (the host on AVX-512
//! BF16 or its portable twin, the GPU on tensor cores, the twins run with the host's
//! bf16 GEMM) and round parameters and gradients to bf16, so every summation-order
//! difference is rounded again at each step: the curves drift further apart, by what
//! `prepare` measures the same way, and the tolerance is [`SPREAD_FACTOR`] times that
//! drift, at least [`BF16_TOL`].

use crate::logging::outln;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use zero_comm::{run_local, CommConfig, Communicator, StagedComm};
use zero_core::{Engine, EngineConfig, Precision, Stage};
use zero_kernels::device::{Device, HostDevice, SimDevice};
use zero_models::data::{MarkovSource, Sequential, Tokens};
use zero_models::{Gpt, GptConfig, TokenBatch};

use super::report::{figure, figures, no_time, Check, Kind, Report};
use crate::device::{BenchDevice, Opener};

/// The reference file inside the prepared folder.
pub const REFERENCE_FILE: &str = "reference.json";
/// Format of [`REFERENCE_FILE`]; a binary reads only its own.
const FORMAT: u32 = 4;
/// The tightest fp32 tolerance: the relative loss difference at any step that always
/// passes.
pub const FP32_TOL: f64 = 1e-5;
/// fp32: how many times the host-vs-twin drift (see the module's text) the device may
/// drift from the host curve.
pub const SPREAD_FACTOR: f64 = 4.0;
/// The tightest bf16 tolerance (relative loss difference at any step, "tracks").
pub const BF16_TOL: f64 = 2e-2;
/// Steps compared with `--quick`.
pub const QUICK_STEPS: usize = 6;

/// Everything that decides the curves, saved with them so the run repeats exactly what
/// the reference ran.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Setup {
    /// Thread ranks.
    pub ranks: usize,
    /// B per rank.
    pub rows: usize,
    /// T.
    pub seq_len: usize,
    /// V (the corpus's symbols).
    pub vocab: usize,
    /// L.
    pub layers: usize,
    /// H.
    pub heads: usize,
    /// C.
    pub embd: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// AdamW epsilon (1e-6: steps of pure rounding noise stay small, see tests/src/scenario.rs).
    pub eps: f64,
    /// Engine seed (initial weights).
    pub seed: u64,
    /// Tokens of the built-in corpus.
    pub corpus_tokens: usize,
    /// Reduction bucket elements (small: units travel in several chunks).
    pub bucket_elems: usize,
}

impl Setup {
    /// The run `gpu-check prepare` makes.
    pub fn standard(steps: usize) -> Self {
        Setup {
            ranks: 4,
            rows: 2,
            seq_len: 32,
            vocab: 64,
            layers: 2,
            heads: 4,
            embd: 64,
            steps,
            lr: 1e-2,
            eps: 1e-6,
            seed: 1234,
            corpus_tokens: 1 << 15,
            bucket_elems: 512,
        }
    }

    fn gpt(&self) -> GptConfig {
        GptConfig {
            vocab_size: self.vocab,
            max_seq_len: self.seq_len,
            n_layer: self.layers,
            n_head: self.heads,
            n_embd: self.embd,
            vocab_block_rows: None,
            checkpoint_every: 0,
        }
    }

    pub(super) fn engine(&self, stage: Stage, precision: Precision) -> EngineConfig {
        self.engine_with(stage, precision, false)
    }

    /// [`Setup::engine`], the 16-bit gradients accumulated in f32 when `f32_grads`
    /// (`precision.grad_accum_dtype = "f32"`).
    fn engine_with(&self, stage: Stage, precision: Precision, f32_grads: bool) -> EngineConfig {
        let mut c = EngineConfig {
            grad_accum: 1,
            seed: self.seed,
            ..Default::default()
        };
        c.zero.stage = stage;
        c.zero.align = 4;
        c.zero.bucket_elems = Some(self.bucket_elems);
        c.precision.dtype = precision;
        c.optim.lr = self.lr;
        c.optim.eps = self.eps;
        if f32_grads {
            c.precision.grad_accum_dtype = Some(zero_core::config::GradDtype::F32);
        }
        c
    }
}

/// One case's loss per step.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Curve {
    /// ZeRO stage 0-3.
    pub stage: usize,
    /// `fp32` or `bf16`.
    pub precision: String,
    /// bf16 with the gradients accumulated in f32 (`precision.grad_accum_dtype`).
    #[serde(default)]
    pub f32_grads: bool,
    /// Mean loss of each step, from step 1.
    pub losses: Vec<f64>,
    /// The same run on the CUDA kernels' CPU twins (`SimDevice::gpu_twin`): how far a
    /// correct device with the GPU's operation order drifts from `losses`.
    pub twin_losses: Option<Vec<f64>>,
}

/// [`max_rel`]'s result in words: "equal bitwise", or the difference and its step.
pub(super) fn rel_in_words(worst: f64, at: usize) -> String {
    if worst == 0.0 {
        "equal bitwise".to_string()
    } else {
        format!("max rel {worst:.2e} (step {at})")
    }
}

/// The largest relative difference of `got` from `want` over their first `steps`
/// steps, and the step (1-based) where it is; infinite when either is shorter, NaN
/// counts as worst.
pub(super) fn max_rel(got: &[f64], want: &[f64], steps: usize) -> (f64, usize) {
    if got.len() < steps || want.len() < steps {
        return (f64::INFINITY, 0);
    }
    let (mut worst, mut at) = (0f64, 0);
    for (i, (g, w)) in got.iter().zip(want).take(steps).enumerate() {
        let rel = if g == w { 0.0 } else { ((g - w) / w).abs() };
        if rel.is_nan() || rel > worst {
            worst = rel;
            at = i + 1;
        }
    }
    (worst, at)
}

/// The tolerance of a curve over its first `steps` steps: [`SPREAD_FACTOR`] times the
/// host-vs-twin drift, at least `floor` ([`FP32_TOL`] or [`BF16_TOL`]); and the drift.
fn tolerance(want: &Curve, steps: usize, floor: f64) -> (f64, Option<f64>) {
    match &want.twin_losses {
        Some(twin) => {
            let (spread, _) = max_rel(twin, &want.losses, steps);
            let spread = if spread.is_finite() { spread } else { 0.0 };
            (floor.max(SPREAD_FACTOR * spread), Some(spread))
        }
        None => (floor, None),
    }
}

/// What `gpu-check prepare` writes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Reference {
    /// [`FORMAT`].
    pub format: u32,
    /// The device the curves come from.
    pub device: String,
    /// The run.
    pub setup: Setup,
    /// Stages 0-3 in fp32, then in bf16, then bf16 with f32 gradients at stages 0 and 2.
    pub curves: Vec<Curve>,
}

impl Reference {
    /// Read `dir/reference.json`.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join(REFERENCE_FILE);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (make it with `zero-bench gpu-check prepare --out {}`)",
                path.display(),
                dir.display()
            )
        })?;
        let r: Reference =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        if r.format != FORMAT {
            bail!(
                "{} has format {}, this binary reads {FORMAT}: prepare it again with this binary",
                path.display(),
                r.format
            );
        }
        Ok(r)
    }
}

pub(super) fn precision_of(name: &str) -> anyhow::Result<Precision> {
    match name {
        "fp32" => Ok(Precision::Fp32),
        "bf16" => Ok(Precision::Bf16),
        other => bail!("unknown precision '{other}' in the reference"),
    }
}

pub(super) fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "fp32",
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
    }
}

/// One rank's training: `steps` losses.
pub(super) fn train_rank<D: BenchDevice, C: Communicator>(
    comm: &C,
    dev: &D,
    setup: &Setup,
    cfg: &EngineConfig,
    tokens: &Tokens,
    steps: usize,
) -> Result<Vec<f64>, String> {
    let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", comm.rank());
    let mut model = Gpt::<D, f32>::new(dev, setup.gpt(), setup.rows).map_err(|x| e(&x))?;
    let mut engine = Engine::new(cfg, comm, dev, &model).map_err(|x| e(&x))?;
    let order = Sequential::new(setup.rows, setup.seq_len, 1, comm.size(), comm.rank())
        .map_err(|x| e(&x))?;
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let mut losses = Vec::with_capacity(steps);
    for s in 0..steps as u64 {
        order
            .fill(tokens, s, 0, &mut x, &mut y)
            .map_err(|v| e(&v))?;
        let batch = TokenBatch {
            rows: setup.rows,
            seq_len: setup.seq_len,
            inputs: &x,
            targets: &y,
        };
        let report = engine.step(&mut model, &[batch]).map_err(|v| e(&v))?;
        losses.push(report.loss);
    }
    Ok(losses)
}

/// Train `setup` at `stage`/`precision` on thread ranks, each on a device from `open`
/// (bf16 products where it has them, for bf16), its bf16 gradients accumulated in f32
/// when the case says so, and return the loss curve (the same on every rank: it is the
/// agreed global loss; checked).
pub(super) fn curve<D: BenchDevice>(
    open: &Opener<D>,
    setup: &Setup,
    (stage, precision, f32_grads): Case,
    steps: usize,
) -> anyhow::Result<Vec<f64>> {
    let cfg = setup.engine_with(stage, precision, f32_grads);
    curve_with(open, setup, &cfg, steps, Transport::Direct)
}

/// How the thread ranks' collectives reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Thread ranks on device buffers (GPU path I).
    Direct,
    /// The same communicator behind host staging (`StagedComm`: the device's staging
    /// memory, page-locked on a GPU; issue 14's mpi-staged path without MPI), the host
    /// waiting for each collective where it starts.
    Staged,
    /// Host staging with the collectives left running behind compute
    /// ([`BenchDevice::set_overlap`]: on a CUDA device its streams wait for them on the
    /// GPU, `zero-kernels/src/device/release.rs`).
    StagedOverlap,
}

/// [`curve`] through `transport`.
pub fn curve_through<D: BenchDevice>(
    open: &Opener<D>,
    setup: &Setup,
    stage: Stage,
    precision: Precision,
    steps: usize,
    transport: Transport,
) -> anyhow::Result<Vec<f64>> {
    let cfg = setup.engine(stage, precision);
    curve_with(open, setup, &cfg, steps, transport)
}

/// Train `setup` with the engine configuration `cfg` (see [`curve_through`]).
fn curve_with<D: BenchDevice>(
    open: &Opener<D>,
    setup: &Setup,
    cfg: &EngineConfig,
    steps: usize,
    transport: Transport,
) -> anyhow::Result<Vec<f64>> {
    let tokens = MarkovSource::default_corpus(setup.corpus_tokens, setup.vocab)
        .context("building the built-in corpus")?;
    // A rank that fails leaves the others in a collective: the watchdog ends them.
    let comm_cfg = CommConfig {
        timeout: Some(std::time::Duration::from_secs(120)),
        ..CommConfig::default()
    };
    let results = run_local(setup.ranks, comm_cfg, |comm| {
        let dev = open(comm.rank())
            .map_err(|e| format!("rank {}: opening the device: {e}", comm.rank()))?;
        // The engine turns bf16 products on for bf16 (on the host too: AVX-512 BF16).
        let losses = match transport {
            Transport::Direct => train_rank(&comm, &dev, setup, cfg, &tokens, steps)?,
            Transport::Staged | Transport::StagedOverlap => {
                dev.set_overlap(transport == Transport::StagedOverlap);
                let staged = StagedComm::new(&comm);
                let losses = train_rank(&staged, &dev, setup, cfg, &tokens, steps)?;
                if staged.buffers().stats().calls == 0 {
                    return Err(format!(
                        "rank {}: nothing went through staging",
                        comm.rank()
                    ));
                }
                losses
            }
        };
        Ok(losses)
    });
    if results.len() != setup.ranks {
        bail!("{} of {} ranks ran", results.len(), setup.ranks);
    }
    let mut curves = Vec::new();
    for r in results {
        match r {
            Ok(Ok(c)) => curves.push(c),
            Ok(Err(e)) => bail!("{e}"),
            Err(p) => bail!("{p}"),
        }
    }
    if let Some(r) = curves.iter().position(|c| c != &curves[0]) {
        bail!("rank {r}'s losses differ from rank 0's: the global loss must agree");
    }
    Ok(curves.swap_remove(0))
}

/// A reference case: stage, precision, and whether bf16 gradients accumulate in f32.
pub(super) type Case = (Stage, Precision, bool);

/// The cases, in the reference's order: stages 0-3 in fp32 and in bf16, then bf16 with
/// f32 gradient accumulators at stage 0 (the model writes into them) and stage 2 (the
/// reduced bf16 pieces land in them).
fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for p in [Precision::Fp32, Precision::Bf16] {
        for s in Stage::ALL {
            v.push((s, p, false));
        }
    }
    v.push((Stage::Zero0, Precision::Bf16, true));
    v.push((Stage::Zero2, Precision::Bf16, true));
    v
}

/// "bf16", or "bf16 with f32 gradients".
fn case_name(precision: &str, f32_grads: bool) -> String {
    if f32_grads {
        format!("{precision} with f32 gradients")
    } else {
        precision.to_string()
    }
}

/// `gpu-check prepare`: the host's curves into `dir/reference.json`, with the twins'
/// curves beside them (the drift the tolerances are made of).
pub fn prepare(dir: &Path, steps: usize) -> anyhow::Result<Reference> {
    let setup = Setup::standard(steps);
    let open = |_rank: usize| Ok(HostDevice::new());
    let open_twin = |rank: usize| Ok(SimDevice::gpu_twin(0x7417 + rank as u64));
    let mut curves = Vec::new();
    for case in cases() {
        let (stage, precision, f32_grads) = case;
        let t0 = Instant::now();
        let name = case_name(precision_name(precision), f32_grads);
        let losses = curve(&open, &setup, case, steps)
            .with_context(|| format!("reference run {stage} {name}"))?;
        let twin_losses = Some(
            curve(&open_twin, &setup, case, steps)
                .with_context(|| format!("twin run {stage} {name}"))?,
        );
        let spread = twin_losses
            .as_ref()
            .map(|t| format!(", twins drift {:.2e}", max_rel(t, &losses, steps).0))
            .unwrap_or_default();
        outln!(
            "reference {stage} {name}: {} ranks x {steps} steps, loss {:.4} -> {:.4}{spread} ({:.1} s)",
            setup.ranks,
            losses.first().copied().unwrap_or(f64::NAN),
            losses.last().copied().unwrap_or(f64::NAN),
            t0.elapsed().as_secs_f64()
        );
        curves.push(Curve {
            stage: stage.number(),
            precision: precision_name(precision).to_string(),
            f32_grads,
            losses,
            twin_losses,
        });
    }
    let reference = Reference {
        format: FORMAT,
        device: HostDevice::new().describe(),
        setup,
        curves,
    };
    let path = dir.join(REFERENCE_FILE);
    let text = serde_json::to_string_pretty(&reference)?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(reference)
}

/// Compare `dut`'s curves with the reference's, one line per case. `steps`: how many of
/// the reference's steps (all, or [`QUICK_STEPS`]); `deadline`: seconds of the report
/// after which the remaining cases are skipped.
pub fn check<D: BenchDevice>(
    open: &Opener<D>,
    reference: &Reference,
    steps: usize,
    deadline: f64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let setup = &reference.setup;
    let steps = steps.min(setup.steps);
    // This device's ZeRO-0 curve per precision: the other stages must do the same step
    // (reported beside the host comparison; on the host they are bitwise equal).
    let mut stage0: Vec<(String, Vec<f64>)> = Vec::new();
    for want in &reference.curves {
        let precision = precision_of(&want.precision)?;
        let stage = Stage::try_from(want.stage as i64).map_err(anyhow::Error::msg)?;
        let label = case_name(&want.precision, want.f32_grads);
        let name = format!("{stage} {label}, {} ranks x {steps} steps", setup.ranks);
        let check = Check::new("train-4-ranks", name, Kind::Correctness);
        if report.elapsed() > deadline {
            report.add(check.out_of_time(no_time(deadline)))?;
            continue;
        }
        report.start(format!("train-4-ranks/{}", check.name))?;
        let t0 = Instant::now();
        let case = (stage, precision, want.f32_grads);
        let mut check = match curve(open, setup, case, steps) {
            Err(e) => check.fail(format!("{e:#}")),
            Ok(got) => {
                let floor = match precision {
                    Precision::Bf16 => BF16_TOL,
                    _ => FP32_TOL,
                };
                let (tol, spread) = tolerance(want, steps, floor);
                let why = match spread {
                    Some(s) => format!(
                        " ({SPREAD_FACTOR}x the host-vs-twin drift {s:.2e}, at least {floor:.0e})"
                    ),
                    None => String::new(),
                };
                let (worst, at) = max_rel(&got, &want.losses, steps);
                let (first, last) = (
                    got.first().copied().unwrap_or(f64::NAN),
                    got.last().copied().unwrap_or(f64::NAN),
                );
                let verb = if precision == Precision::Bf16 {
                    "tracks"
                } else {
                    "matches"
                };
                let vs_stage0_rel = match stage0.iter().find(|(p, _)| p == &label) {
                    Some((_, s0)) if stage != Stage::Zero0 => Some(max_rel(&got, s0, steps).0),
                    _ => None,
                };
                let vs_stage0 = match vs_stage0_rel {
                    Some(0.0) => "; equals this device's ZeRO-0 bitwise".to_string(),
                    Some(d) => format!("; vs this device's ZeRO-0: max rel {d:.2e}"),
                    None => String::new(),
                };
                if stage == Stage::Zero0 {
                    stage0.push((label.clone(), got.clone()));
                }
                check
                    .at_most(
                        worst,
                        tol,
                        format!(
                            "{verb} the host curve: max rel {worst:.2e}{} <= {tol:.2e}{why}; loss {first:.4} -> {last:.4}{vs_stage0}",
                            if worst > 0.0 { format!(" (step {at})") } else { String::new() }
                        ),
                    )
                    .with_data(serde_json::json!({
                        "device": figures(&got),
                        "reference": figures(&want.losses[..steps.min(want.losses.len())]),
                        "tolerance": tol,
                        "worst_step": at,
                        "host_vs_twin_drift": spread.map(figure),
                        "vs_own_zero0": vs_stage0_rel.map(figure),
                    }))
            }
        };
        check.seconds = t0.elapsed().as_secs_f64();
        report.add(check)?;
    }
    Ok(())
}

/// Issue 14's host staging on this device: thread ranks train ZeRO-2 and ZeRO-3 in fp32
/// through `StagedComm` (device -> staging memory, the collective on the host, staging ->
/// device from the copy that reads the region when its stream gets there), against the
/// same ranks' direct curve (trained here): first with the host waiting for each staged
/// collective, then (both stages) with the collectives left running behind compute
/// ([`Transport::StagedOverlap`], last: the path that has not yet run on a GPU, so that a
/// hang in it costs only itself). Thread ranks fold in rank order on the host and on the
/// GPU alike (zero-kernels/src/cuda/peer.rs), so each must agree with the direct curve
/// bit for bit. (Thread ranks' collectives complete when they start, so there is nothing
/// to hide here: `overlap.rs` measures the overlap.)
pub fn staged_check<D: BenchDevice>(
    open: &Opener<D>,
    setup: &Setup,
    steps: usize,
    deadline: f64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let steps = steps.min(setup.steps);
    let stages = [Stage::Zero2, Stage::Zero3];
    let base = |stage: Stage| format!("{stage} fp32, {} ranks x {steps} steps", setup.ranks);
    let mut directs = Vec::new();
    for stage in stages {
        let name = base(stage);
        if report.elapsed() > deadline {
            let check = Check::new("staged", name, Kind::Correctness);
            report.add(check.out_of_time(no_time(deadline)))?;
            directs.push(None);
            continue;
        }
        report.start(format!("staged/{name}"))?;
        let t0 = Instant::now();
        let direct = curve_through(
            open,
            setup,
            stage,
            Precision::Fp32,
            steps,
            Transport::Direct,
        );
        let waited = curve_through(
            open,
            setup,
            stage,
            Precision::Fp32,
            steps,
            Transport::Staged,
        );
        let check = staged_judged(name, "through host staging", &direct, &waited, steps);
        report.add(Check {
            seconds: t0.elapsed().as_secs_f64(),
            ..check
        })?;
        directs.push(Some(direct));
    }
    for (stage, direct) in stages.into_iter().zip(directs) {
        let name = format!("{}, overlapped", base(stage));
        let check = Check::new("staged", name.clone(), Kind::Correctness);
        let Some(direct) = direct else {
            report.add(check.out_of_time(no_time(deadline)))?;
            continue;
        };
        if report.elapsed() > deadline {
            report.add(check.out_of_time(no_time(deadline)))?;
            continue;
        }
        report.start(format!("staged/{name}"))?;
        let t0 = Instant::now();
        let overlapped = curve_through(
            open,
            setup,
            stage,
            Precision::Fp32,
            steps,
            Transport::StagedOverlap,
        );
        let how = "through host staging, overlapped";
        let check = staged_judged(name, how, &direct, &overlapped, steps);
        report.add(Check {
            seconds: t0.elapsed().as_secs_f64(),
            ..check
        })?;
    }
    Ok(())
}

/// A staged curve against the direct one: equal bit for bit.
fn staged_judged(
    name: String,
    how: &str,
    direct: &anyhow::Result<Vec<f64>>,
    staged: &anyhow::Result<Vec<f64>>,
    steps: usize,
) -> Check {
    const BOUND: f64 = 0.0;
    let check = Check::new("staged", name, Kind::Correctness);
    match (direct, staged) {
        (Err(e), _) => check.fail(format!("direct: {e:#}")),
        (_, Err(e)) => check.fail(format!("{how}: {e:#}")),
        (Ok(direct), Ok(staged)) => {
            let (worst, at) = max_rel(staged, direct, steps);
            check
                .at_most(
                    worst,
                    BOUND,
                    format!(
                        "{how}: max rel {worst:.2e}{} vs direct thread ranks <= {BOUND} (bitwise); loss {:.4} -> {:.4}",
                        if worst > 0.0 { format!(" (step {at})") } else { String::new() },
                        staged.first().copied().unwrap_or(f64::NAN),
                        staged.last().copied().unwrap_or(f64::NAN),
                    ),
                )
                .with_data(serde_json::json!({ "staged": figures(staged), "direct": figures(direct) }))
        }
    }
}
