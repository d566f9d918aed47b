//! Scenario: every ZeRO stage computes the same step (launched by tests/tests/engine.rs
//! under `mpirun -n N`).
//!
//! `engine_stages fp32`: stages 0-3 on a tiny GPT, A = 1 and A = 2, same seed and data:
//! per-step losses and final master weights equal to stage 0's (bitwise where the
//! reduction order is the same, see `tolerance`), the memory ledger equal to the plan
//! byte for byte, the communicated bytes equal to the comm ledger exactly; and on rank 0
//! alone, 1 rank x A = N equals N ranks x A = 1.
//!
//! `engine_stages losses`: every stage's per-step losses (fp32, bf16) as bit patterns,
//! which tests/tests/engine.rs holds against the same training on thread ranks.
//!
//! `engine_stages mixed`: bf16 and fp16 runs of stages 1-3, with 16-bit or f32
//! gradient accumulators and reductions, at A = 1 and 2, equal the same precision's
//! stage 0 bit for bit where the sums are rounded in the same order, and within a
//! tolerance argued at `reordered` elsewhere; every A = 2 run tracks the fp32 run
//! loosely; with f32 accumulators one rank's sum over A = N micro-steps equals N ranks'
//! sum of one each to f32 rounding, where 16-bit ones differ measurably; a forced fp16
//! overflow skips the step on every rank.

use zero_comm::{ring_bytes, CollectiveKind, Communicator};
use zero_core::config::{GradDtype, Precision, Stage};
use zero_core::ledger::{CommPlan, CommPurpose};
use zero_core::{Engine, StepReport};
use zero_kernels::device::HostDevice;
use zero_kernels::DType;
use zero_models::data::{MarkovSource, Sequential, Tokens};
use zero_models::{Gpt, GptConfig, TokenBatch as Batch};
use zero_tests::scenario::{fail, host, tiny_config, tiny_gpt, Tiny as Config, SEQ_LEN as T};

const B: usize = 2;
const STEPS: usize = 4;

fn gpt() -> GptConfig {
    tiny_gpt(32)
}

fn config(stage: Stage, precision: Precision, accum: usize) -> Config {
    tiny_config(stage, precision, B, accum, STEPS)
}

struct Run {
    /// AdamW steps applied (skipped steps excluded).
    applied: u64,
    losses: Vec<f64>,
    master: Vec<f32>,
    /// The reduced gradient of the first step (every rank starts from the same weights).
    first_grads: Vec<f32>,
    reports: Vec<StepReport>,
}

fn run<C: Communicator>(comm: &C, cfg: &Config, tokens: &Tokens, who: &str) -> Run {
    let rank = comm.rank();
    let die = |e: String| -> ! { fail(rank, format!("{who}: {e}")) };
    let dev = host();
    let mut model =
        Gpt::<HostDevice, f32>::new(dev, gpt(), B).unwrap_or_else(|e| die(e.to_string()));
    let mut engine =
        Engine::new(&cfg.engine, comm, dev, &model).unwrap_or_else(|e| die(e.to_string()));

    // Memory ledger: what is allocated equals the plan (the dry run), category by category.
    let plan = engine.plan().clone();
    let measured = engine.memory();
    for (cat, bytes) in plan.by_category() {
        if measured.get(&cat).copied().unwrap_or(0) != bytes {
            die(format!(
                "memory {}: measured {:?} bytes, plan {bytes}",
                cat.name(),
                measured.get(&cat)
            ));
        }
    }
    let comm_plan = CommPlan::new(engine.layout(), &plan, cfg.engine.grad_accum);
    let control = ring_bytes(CollectiveKind::AllReduce, comm.size(), rank, 24, 0).0;

    let order = Sequential::new(B, T, cfg.engine.grad_accum, comm.size(), rank)
        .unwrap_or_else(|e| die(e.to_string()));
    let a = cfg.engine.grad_accum;
    let (mut inputs, mut targets) = (vec![Vec::new(); a], vec![Vec::new(); a]);
    let mut out = Run {
        applied: 0,
        losses: Vec::new(),
        master: Vec::new(),
        first_grads: Vec::new(),
        reports: Vec::new(),
    };
    for s in 0..STEPS as u64 {
        for m in 0..a {
            order
                .fill(tokens, s, m, &mut inputs[m], &mut targets[m])
                .unwrap_or_else(|e| die(e.to_string()));
        }
        let batches: Vec<Batch> = (0..a)
            .map(|m| Batch {
                rows: B,
                seq_len: T,
                inputs: &inputs[m],
                targets: &targets[m],
            })
            .collect();
        let rep = engine
            .step(&mut model, &batches)
            .unwrap_or_else(|e| die(e.to_string()));
        // Communication ledger: bytes sent this step, exactly. A skipped step (overflow)
        // updates nothing, so it gathers no updated parameters.
        let sent = rep.comm.total().bytes_sent;
        let gathered_after: u64 = comm_plan
            .lines
            .iter()
            .filter(|l| l.purpose == CommPurpose::ParamsAfterStep)
            .map(|l| l.sent_bytes)
            .sum();
        let expected =
            comm_plan.sent_bytes() + control - if rep.skipped { gathered_after } else { 0 };
        if sent != expected {
            die(format!(
                "step {s}: sent {sent} bytes, ledger {} + control {control}; by kind {:?}",
                comm_plan.sent_bytes(),
                rep.comm
            ));
        }
        out.losses.push(rep.loss);
        out.reports.push(rep);
        if s == 0 {
            out.first_grads = engine
                .full_grads_f32()
                .unwrap_or_else(|e| die(e.to_string()));
        }
    }
    out.master = engine
        .full_master_f32()
        .unwrap_or_else(|e| die(e.to_string()));
    out.applied = engine.steps_applied();
    out
}

/// How far a run may be from its reference; 0 everywhere asks for equal values (bit
/// for bit).
#[derive(Clone, Copy, Debug)]
struct Tolerance {
    /// Per-step loss, relative.
    loss: f64,
    /// The first step's gradient norm, relative: every run starts from the same weights,
    /// so this is the rounding of the gradient's sums alone.
    first_grad_norm: f64,
    /// The later steps' gradient norms, relative.
    grad_norm: f64,
    /// Final master weights, absolute.
    param: f32,
}

impl Tolerance {
    const EXACT: Tolerance = Tolerance {
        loss: 0.0,
        first_grad_norm: 0.0,
        grad_norm: 0.0,
        param: 0.0,
    };

    /// Losses within `loss` relative, every gradient norm within 10x that.
    fn loose(loss: f64, param: f32) -> Tolerance {
        Tolerance {
            loss,
            first_grad_norm: 10.0 * loss,
            grad_norm: 10.0 * loss,
            param,
        }
    }
}

/// Compare a run against a reference: per-step losses within `loss_tol` relative,
/// gradient norms within 10x that, final master weights within `param_tol` absolute
/// ([`compare_within`]).
fn compare(rank: usize, what: &str, got: &Run, want: &Run, loss_tol: f64, param_tol: f32) {
    compare_within(rank, what, got, want, Tolerance::loose(loss_tol, param_tol));
}

/// `diff <= tol`, which a NaN difference fails.
fn within<T: PartialOrd>(diff: T, tol: T) -> bool {
    diff <= tol
}

/// Compare a run against a reference within `tol`, and the same steps skipped. A NaN or
/// infinite difference is a failure (the bounds must hold: `rel > tol` would pass a NaN).
fn compare_within(rank: usize, what: &str, got: &Run, want: &Run, tol: Tolerance) {
    if got.reports.len() != want.reports.len() || got.reports.is_empty() {
        fail(
            rank,
            format!(
                "{what}: {} steps vs {} in the reference",
                got.reports.len(),
                want.reports.len()
            ),
        );
    }
    let mut worst_loss = 0.0f64;
    for (s, (g, w)) in got.reports.iter().zip(&want.reports).enumerate() {
        if g.skipped != w.skipped {
            fail(
                rank,
                format!(
                    "{what}: step {s} skipped {} vs {} in the reference",
                    g.skipped, w.skipped
                ),
            );
        }
        let rel = (g.loss - w.loss).abs() / w.loss.abs();
        if !within(rel, tol.loss) {
            fail(
                rank,
                format!(
                    "{what}: step {s} loss {} vs {} (rel {rel:.2e} > {:.0e})",
                    g.loss, w.loss, tol.loss
                ),
            );
        }
        worst_loss = worst_loss.max(rel);
        // A skipped step's norm is inf/NaN on both sides (the skip itself is compared).
        let norm_tol = if s == 0 {
            tol.first_grad_norm
        } else {
            tol.grad_norm
        };
        let rel = (g.grad_norm - w.grad_norm).abs() / w.grad_norm;
        let both_skipped = g.skipped && w.skipped;
        if !(within(rel, norm_tol) || both_skipped) {
            fail(
                rank,
                format!(
                    "{what}: step {s} grad norm {} vs {} (rel {rel:.2e} > {norm_tol:.0e})",
                    g.grad_norm, w.grad_norm
                ),
            );
        }
    }
    if got.master.len() != want.master.len() || got.master.is_empty() {
        fail(
            rank,
            format!(
                "{what}: {} master weights vs {}",
                got.master.len(),
                want.master.len()
            ),
        );
    }
    let param_tol = tol.param;
    let (mut worst, mut at) = (0.0f32, 0);
    for (i, (x, y)) in got.master.iter().zip(&want.master).enumerate() {
        let d = (x - y).abs();
        if d > worst || d.is_nan() {
            (worst, at) = (d, i);
            if d.is_nan() {
                break;
            }
        }
    }
    if !within(worst, param_tol) {
        fail(
            rank,
            format!(
                "{what}: final parameter {at} is {} vs {} (|diff| {worst:.2e} > {param_tol:.0e})",
                got.master[at], want.master[at]
            ),
        );
    }
    if rank == 0 {
        let bitwise = got.losses == want.losses && got.master == want.master;
        println!(
            "{what}: losses {:?}, max rel loss diff {worst_loss:.2e}, max |param diff| {worst:.2e}{}",
            got.losses
                .iter()
                .map(|l| format!("{l:.6}"))
                .collect::<Vec<_>>(),
            if bitwise { " (bitwise equal)" } else { "" }
        );
    }
}

/// Stages 1-3 of one 16-bit precision and (accumulator, reduction) pair against the same
/// pair's stage 0, at A = 1 and A = 2, and every A = 2 run against fp32 as a loose sanity
/// check.
///
/// Bit for bit where the additions and roundings come in the same order: at N = 2 a
/// reduction adds two addends, the same sum whatever the collective (all-reduce,
/// reduce-scatter), so A = 1 runs, and stage 1 at A = 2 (it accumulates the micro-steps
/// locally and reduces their sum once, as stage 0 does), give stage 0's bits. Two
/// exceptions are by design, not by accident of order:
/// - a 16-bit accumulator with f32 reductions at stages 2/3 (reducing every micro-step):
///   stages 0/1 round each rank's gradient into the 16-bit accumulator before the f32
///   reduction, where stages 2/3 reduce the backward's f32 gradient as it is and round
///   only the sum into their 16-bit shard, one rounding fewer;
/// - N > 2 (MPI may add in another order) and stages 2/3 at A = 2 ((g1a + g1b) +
///   (g2a + g2b) where stage 0 reduces (g1a + g2a) + (g1b + g2b)).
///
/// There [`reordered`] gives the tolerance.
fn mixed_stages_agree(
    world: &zero_comm::MpiComm,
    tokens: &Tokens,
    precision: Precision,
    accum: GradDtype,
    reduce: GradDtype,
    fp32: &Run,
) {
    let (rank, n) = (world.rank(), world.size());
    let cfg = |stage, a| {
        let mut c = config(stage, precision, a);
        c.engine.precision.grad_accum_dtype = Some(accum);
        c.engine.precision.grad_reduce_dtype = Some(reduce);
        c
    };
    let case = format!("{precision:?} accumulate {accum:?} reduce {reduce:?}");
    for a in [1, 2] {
        let base = run(world, &cfg(Stage::Zero0, a), tokens, "mixed stage 0");
        if a == 2 {
            sanity_against_fp32(rank, &format!("{case} A=2 Zero0"), &base, fp32, precision);
        }
        for stage in [Stage::Zero1, Stage::Zero2, Stage::Zero3] {
            let r = run(world, &cfg(stage, a), tokens, "mixed");
            let one_rounding_fewer =
                stage >= Stage::Zero2 && accum == GradDtype::Half && reduce == GradDtype::F32;
            let same_order = n == 2 && (a == 1 || stage == Stage::Zero1) && !one_rounding_fewer;
            let tol = if same_order {
                Tolerance::EXACT
            } else {
                reordered(precision, accum, reduce)
            };
            compare_within(
                rank,
                &format!("{case} A={a} {stage:?} vs its stage 0"),
                &r,
                &base,
                tol,
            );
            if a == 2 {
                sanity_against_fp32(rank, &format!("{case} A=2 {stage:?}"), &r, fp32, precision);
            }
        }
    }
}

/// A 16-bit run against its stage 0 where the gradient's sums are rounded in another
/// order ([`mixed_stages_agree`]). Each reordered or extra rounding moves a gradient
/// element by at most half a unit in the last place of the format it is rounded to:
/// 2^-9 relative in bf16, 2^-12 in fp16, 2^-24 in f32.
/// - The first step's gradient norm: every run starts from the same weights, so the
///   gradients differ by those roundings alone, two at most here, and so does their norm
///   (|‖g'‖ - ‖g‖| <= ‖g' - g‖): 2^-8 = 3.9e-3 (bf16), 2^-11 = 4.9e-4 (fp16), 1e-6 with
///   f32 sums (2^-23 and margin). Measured: 5.8e-4, 3.2e-5, 2e-8.
/// - Losses and later norms: from the first update on, an element whose gradient is
///   near zero (its terms cancel) may change sign, which Adam turns into a step of up
///   to 2 lr; the loss moves by the sum of such flips, which no bound on one rounding
///   gives. Measured on 2 and 4 ranks, over 4 steps: up to 3.1e-4 relative (bf16),
///   4.2e-5 (fp16), 1.2e-5 with f32 sums; the tolerances are about 3x that (1e-3,
///   2e-4, 1e-4), 20x (bf16) and 50x (fp16) tighter than the distance to fp32, and match
///   the transports' bf16 tolerance (tests/tests/engine.rs). Later gradient norms
///   follow the flipped weights: measured 2.2e-2 (16-bit sums) and 5.1e-4 (f32 sums),
///   held to 5e-2 and 5e-3.
/// - Weights: the same flips bound them only by 4 steps x 2 lr = 8e-2 with 16-bit sums
///   (measured 3.9e-2), which catches NaN and blow-ups only; with f32 sums a flip is
///   rarer and the difference stays below lr / 2 (measured 1.7e-3), as in
///   [`accumulation_in_f32`]. The bitwise cases hold the weights exactly.
fn reordered(precision: Precision, accum: GradDtype, reduce: GradDtype) -> Tolerance {
    // 1e-2, as `tiny_config` sets it.
    let lr = config(Stage::Zero0, precision, 1).engine.optim.lr as f32;
    if accum == GradDtype::F32 && reduce == GradDtype::F32 {
        return Tolerance {
            loss: 1e-4,
            first_grad_norm: 1e-6,
            grad_norm: 5e-3,
            param: lr / 2.0,
        };
    }
    let (loss, first_grad_norm) = if precision == Precision::Bf16 {
        (1e-3, 2f64.powi(-8))
    } else {
        (2e-4, 2f64.powi(-11))
    };
    Tolerance {
        loss,
        first_grad_norm,
        grad_norm: 5e-2,
        param: 4.0 * 2.0 * lr,
    }
}

/// A 16-bit run against the fp32 one, loosely: 16-bit parameters carry 8 (bf16) or 11
/// (fp16) significant bits, so the loss of a tiny model tracks fp32 to ~1e-2 relative
/// over 4 steps. Adam moves a parameter by about lr at most per step, so the weights
/// are within ~4 lr (5e-2 with margin) whatever the gradients: the parameter check here
/// only catches NaN and blow-ups.
fn sanity_against_fp32(rank: usize, what: &str, got: &Run, fp32: &Run, precision: Precision) {
    let tol = if precision == Precision::Bf16 {
        2e-2
    } else {
        1e-2
    };
    compare(rank, &format!("{what} vs fp32"), got, fp32, tol, 5e-2);
}

/// `precision.grad_accum_dtype = "f32"` in bf16 (reductions in f32 throughout). One
/// rank with A = N micro-steps sums the same N micro-batch gradients as N ranks with
/// A = 1 (the data order gives both the same global batch), from the same bf16 weights
/// at the first step. With f32 accumulators the two sums differ only in the order of f32
/// additions (relative error ~1e-7). With bf16 accumulators the single rank rounds its
/// running sum to 8 significant bits after each micro-step, where each of the N ranks
/// rounds its one gradient and the f32 sum of those is rounded once: they differ by
/// ~2^-9 relative on the elements where the roundings fall differently. Stages 1-3 with
/// an f32 accumulator track stage 0's (tolerances below).
fn accumulation_in_f32(world: &zero_comm::MpiComm, tokens: &Tokens) {
    let (rank, n) = (world.rank(), world.size());
    let bf16 = |stage, a, accum| {
        let mut c = config(stage, Precision::Bf16, a);
        c.engine.precision.grad_accum_dtype = Some(accum);
        c.engine.precision.grad_reduce_dtype = Some(GradDtype::F32);
        c
    };
    let wide = run(
        world,
        &bf16(Stage::Zero0, 1, GradDtype::F32),
        tokens,
        "f32 sums",
    );
    if wide.reports.is_empty() || wide.first_grads.is_empty() {
        fail(rank, "f32 accumulation: no step ran".into());
    }
    let wide16 = run(
        world,
        &bf16(Stage::Zero0, 1, GradDtype::Half),
        tokens,
        "bf16 sums",
    );
    let plan_grads = |c: &Config| {
        let dev = host();
        let model = Gpt::<HostDevice, f32>::new(dev, gpt(), B)
            .unwrap_or_else(|e| fail(rank, e.to_string()));
        let engine = Engine::new(&c.engine, world, dev, &model)
            .unwrap_or_else(|e| fail(rank, e.to_string()));
        engine
            .plan()
            .get(zero_core::plan::BufferRole::Grads)
            .map(|b| b.dtype)
    };
    if plan_grads(&bf16(Stage::Zero0, 1, GradDtype::F32)) != Some(DType::F32) {
        fail(
            rank,
            "grad_accum_dtype = \"f32\" did not plan f32 gradients".into(),
        );
    }
    // Stages 2/3 reduce every micro-step, so their f32 sums add in another order than
    // stage 0's, and the masters differ in the last bits. That can flip a weight's bf16
    // rounding, after which the gradients differ by ~2^-9 relative and a near-zero one
    // may change sign, which Adam turns into a step of up to lr (1e-2) on that element:
    // losses within 1e-4, weights within lr / 2, against O(lr) for a lost contribution.
    let base = run(
        world,
        &bf16(Stage::Zero0, 2, GradDtype::F32),
        tokens,
        "f32 A=2",
    );
    for &stage in &[Stage::Zero1, Stage::Zero2, Stage::Zero3] {
        let r = run(world, &bf16(stage, 2, GradDtype::F32), tokens, "f32 A=2");
        compare(
            rank,
            &format!("bf16 accumulate F32 A=2 {stage:?} vs stage 0"),
            &r,
            &base,
            1e-4,
            5e-3,
        );
    }
    let solo = world
        .split(if rank == 0 { Some(0) } else { None }, 0)
        .unwrap_or_else(|e| fail(rank, e.to_string()));
    let Some(solo) = solo else {
        return;
    };
    // ||g - g_ref|| / ||g_ref|| over every parameter.
    let rel_err = |g: &[f32], want: &[f32]| -> f64 {
        let (mut d, mut r) = (0.0f64, 0.0f64);
        for (&x, &y) in g.iter().zip(want) {
            d += (x as f64 - y as f64).powi(2);
            r += (y as f64).powi(2);
        }
        (d / r).sqrt()
    };
    let f32_sums = run(
        &solo,
        &bf16(Stage::Zero0, n, GradDtype::F32),
        tokens,
        "1 rank",
    );
    let bf16_sums = run(
        &solo,
        &bf16(Stage::Zero0, n, GradDtype::Half),
        tokens,
        "1 rank",
    );
    let numel = wide.first_grads.len();
    for (what, g) in [
        ("f32, 1 rank", &f32_sums.first_grads),
        ("bf16, 1 rank", &bf16_sums.first_grads),
        ("bf16, N ranks", &wide16.first_grads),
    ] {
        if g.len() != numel {
            fail(
                rank,
                format!("{what}: {} gradient values, {numel} expected", g.len()),
            );
        }
    }
    let e32 = rel_err(&f32_sums.first_grads, &wide.first_grads);
    let e16 = rel_err(&bf16_sums.first_grads, &wide16.first_grads);
    println!(
        "bf16, 1 rank x A={n} vs {n} ranks x A=1, first-step gradient: relative difference {e32:.2e} with f32 accumulators, {e16:.2e} with bf16 ones"
    );
    // f32 rounding of a few additions per element, against bf16's 2^-9 on the elements
    // whose roundings differ: 10x apart is a wide margin either way (a NaN fails).
    if !(e32 <= 1e-5 && e16 >= 1e-4 && e16 >= 10.0 * e32) {
        fail(
            rank,
            format!("f32 accumulators differ by {e32:.2e}, bf16 ones by {e16:.2e}"),
        );
    }
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "fp32".into());
    let (_mpi, world) = zero_comm::init().unwrap_or_else(|e| {
        eprintln!("MPI init failed: {e}");
        std::process::exit(2)
    });
    let (rank, n) = (world.rank(), world.size());
    let tokens =
        MarkovSource::default_corpus(1 << 15, 64).unwrap_or_else(|e| fail(rank, e.to_string()));
    let stages = [Stage::Zero0, Stage::Zero1, Stage::Zero2, Stage::Zero3];
    match mode.as_str() {
        "fp32" => {
            // Tolerances: with N = 2 every sum of two addends is the same whatever the
            // order, so A = 1 runs must be bitwise equal; with N > 2 or A > 1 the order of
            // the additions differs between all-reduce and reduce-scatter (and between
            // accumulating before or after the reduction), which moves the last bit of
            // a gradient; Adam amplifies it at most to ~1e-6 of a parameter in 4 steps.
            let exact = n <= 2;
            // A reordered sum changes a gradient's last bits; Adam turns that into a
            // parameter difference far below 1e-3 * lr (1e-5) in 4 steps, while a lost or
            // doubled contribution moves parameters by O(lr) and losses by ~1e-3.
            let (lt, pt) = if exact { (0.0, 0.0) } else { (1e-6, 1e-5) };
            let base = run(
                &world,
                &config(Stage::Zero0, Precision::Fp32, 1),
                &tokens,
                "stage 0",
            );
            for &stage in &stages[1..] {
                let r = run(&world, &config(stage, Precision::Fp32, 1), &tokens, "A=1");
                compare(
                    rank,
                    &format!("fp32 A=1 {stage:?} vs stage 0"),
                    &r,
                    &base,
                    lt,
                    pt,
                );
            }
            // Stage 3 gather policies: no prefetch, two layers ahead, and small units kept
            // resident (ln_f falls under the threshold).
            for (prefetch, persist) in [(0, 0), (2, 0), (1, 1000)] {
                let mut c = config(Stage::Zero3, Precision::Fp32, 1);
                c.engine.zero.prefetch = prefetch;
                c.engine.zero.persistence_threshold = persist;
                let r = run(&world, &c, &tokens, "stage 3 policy");
                let what =
                    format!("fp32 A=1 Zero3 prefetch {prefetch} persistence {persist} vs stage 0");
                compare(rank, &what, &r, &base, lt, pt);
            }
            let base2 = run(
                &world,
                &config(Stage::Zero0, Precision::Fp32, 2),
                &tokens,
                "A=2",
            );
            for &stage in &stages[1..] {
                let r = run(&world, &config(stage, Precision::Fp32, 2), &tokens, "A=2");
                compare(
                    rank,
                    &format!("fp32 A=2 {stage:?} vs stage 0"),
                    &r,
                    &base2,
                    1e-6,
                    1e-5,
                );
            }
            // Stage 3 accumulating locally (full gradients, one reduce-scatter per step).
            let mut c = config(Stage::Zero3, Precision::Fp32, 2);
            c.engine.zero.reduce_every_micro_step = Some(false);
            let r = run(&world, &c, &tokens, "stage 3 local accumulation");
            compare(
                rank,
                "fp32 A=2 Zero3 accumulate-locally vs stage 0",
                &r,
                &base2,
                1e-6,
                1e-5,
            );
            // 1 rank x A = N sees the same global batch as N ranks x A = 1.
            let solo = world
                .split(if rank == 0 { Some(0) } else { None }, 0)
                .unwrap_or_else(|e| fail(rank, e.to_string()));
            if let Some(solo) = solo {
                let r = run(
                    &solo,
                    &config(Stage::Zero0, Precision::Fp32, n),
                    &tokens,
                    "1 rank",
                );
                compare(
                    rank,
                    &format!("fp32 1 rank x A={n} vs {n} ranks x A=1"),
                    &r,
                    &base,
                    1e-6,
                    1e-5,
                );
            }
        }
        "mixed" => {
            let fp32 = run(
                &world,
                &config(Stage::Zero0, Precision::Fp32, 2),
                &tokens,
                "fp32",
            );
            for precision in [Precision::Bf16, Precision::Fp16] {
                for (accum, reduce) in [
                    (GradDtype::Half, GradDtype::Half),
                    (GradDtype::Half, GradDtype::F32),
                    (GradDtype::F32, GradDtype::Half),
                    (GradDtype::F32, GradDtype::F32),
                ] {
                    mixed_stages_agree(&world, &tokens, precision, accum, reduce, &fp32);
                }
            }
            accumulation_in_f32(&world, &tokens);
            // fp32/bf16 have no loss scaler to recover: a diverged run (lr 1e30 makes the
            // next forward overflow) stops with an error on every rank, naming the step.
            for precision in [Precision::Fp32, Precision::Bf16] {
                let mut c = config(Stage::Zero2, precision, 1);
                c.engine.optim.lr = 1e30;
                let dev = host();
                let mut model = Gpt::<HostDevice, f32>::new(dev, gpt(), B)
                    .unwrap_or_else(|e| fail(rank, e.to_string()));
                let mut engine = Engine::new(&c.engine, &world, dev, &model)
                    .unwrap_or_else(|e| fail(rank, e.to_string()));
                let order =
                    Sequential::new(B, T, 1, n, rank).unwrap_or_else(|e| fail(rank, e.to_string()));
                let (mut x, mut y) = (Vec::new(), Vec::new());
                let mut stopped = None;
                for s in 0..STEPS as u64 {
                    order
                        .fill(&tokens, s, 0, &mut x, &mut y)
                        .unwrap_or_else(|e| fail(rank, e.to_string()));
                    let batch = Batch {
                        rows: B,
                        seq_len: T,
                        inputs: &x,
                        targets: &y,
                    };
                    match engine.step(&mut model, &[batch]) {
                        Ok(_) => {}
                        Err(e @ zero_core::EngineError::NonFinite { .. }) => {
                            stopped = Some((s, e.to_string()));
                            break;
                        }
                        Err(e) => fail(rank, format!("{precision:?} divergence: {e}")),
                    }
                }
                match stopped {
                    // The error names the step by its number, counted from 1.
                    Some((s, msg))
                        if msg.contains("inf/NaN") && msg.contains(&format!("step {}:", s + 1)) =>
                    {
                        if rank == 0 {
                            println!("{precision:?} divergence stopped at step {s}: {msg}");
                        }
                    }
                    other => fail(
                        rank,
                        format!(
                            "{precision:?} with lr 1e30 did not stop with NonFinite: {other:?}"
                        ),
                    ),
                }
            }
            // A forced overflow: a loss scale so large that fp16 gradients overflow.
            for &stage in &stages {
                let mut c = config(stage, Precision::Fp16, 1);
                c.engine.precision.initial_scale = 2f64.powi(40);
                c.engine.precision.hysteresis = 1;
                let r = run(&world, &c, &tokens, "overflow");
                let first = &r.reports[0];
                if !first.skipped || first.grad_norm.is_finite() {
                    fail(
                        rank,
                        format!("{stage:?}: step 0 with scale 2^40 was not skipped: {first:?}"),
                    );
                }
                let skipped = r.reports.iter().filter(|x| x.skipped).count() as u64;
                if r.applied + skipped != STEPS as u64 {
                    fail(
                        rank,
                        format!(
                            "{stage:?}: {} steps applied and {skipped} skipped of {STEPS}",
                            r.applied
                        ),
                    );
                }
                if r.applied == 0 {
                    // Nothing applied: the weights must be the initial ones, bit for bit.
                    let mut c0 = c.clone();
                    c0.steps = 0;
                    let dev = host();
                    let model = Gpt::<HostDevice, f32>::new(dev, gpt(), B)
                        .unwrap_or_else(|e| fail(rank, e.to_string()));
                    let init = Engine::new(&c0.engine, &world, dev, &model)
                        .and_then(|e| e.full_master_f32())
                        .unwrap_or_else(|e| fail(rank, e.to_string()));
                    if init != r.master {
                        fail(
                            rank,
                            format!("{stage:?}: skipped steps changed the weights"),
                        );
                    }
                }
                if r.reports[1].loss_scale >= first.loss_scale {
                    fail(
                        rank,
                        format!("{stage:?}: loss scale did not back off after an overflow"),
                    );
                }
                if rank == 0 {
                    let skipped: Vec<bool> = r.reports.iter().map(|x| x.skipped).collect();
                    println!(
                        "fp16 {stage:?} forced overflow: skipped {skipped:?}, scales {:?}",
                        r.reports.iter().map(|x| x.loss_scale).collect::<Vec<_>>()
                    );
                }
            }
        }
        "losses" => {
            // Every case's per-step losses as bit patterns, for the in-process comparison.
            for (name, cfg) in zero_tests::scenario::transport_cases() {
                let losses = zero_tests::scenario::train_losses(&world, &cfg, &tokens)
                    .unwrap_or_else(|e| fail(rank, e));
                if rank == 0 {
                    let bits: Vec<String> = losses
                        .iter()
                        .map(|l| format!("{:016x}", l.to_bits()))
                        .collect();
                    println!("LOSSES {name} {}", bits.join(" "));
                }
            }
        }
        other => fail(
            rank,
            format!("unknown mode '{other}' (fp32 | mixed | losses)"),
        ),
    }
    if let Err(e) = world.barrier() {
        fail(rank, e.to_string());
    }
    println!("{}", zero_tests::ok_line(rank));
}
