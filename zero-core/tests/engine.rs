//! The engine in-process: N = 1..4 thread ranks (LocalComm), stages 0-3, on the host
//! device and on the simulated one, training the character model of `examples/` (a tied
//! head, several units per layer, chunked reductions).
//!
//! What holds, and why:
//! - fp32, A = 1: every stage gives the stage-0 losses and weights **bit for bit** at every
//!   N. LocalComm sums in rank order, so an all-reduce and a reduce-scatter add the same
//!   terms in the same order, a gather copies, and a shard accumulator starts at 0 (0 + x
//!   is exact).
//! - fp32, A = 2: stages 2/3 reduce every micro-step, (g1a + g1b) + (g2a + g2b), where
//!   stages 0/1 reduce the sum, (g1a + g2a) + (g1b + g2b): a few f32 roundings apart,
//!   1e-6 relative on the loss over a few steps.
//! - The simulated device gives the host device's bits (same kernels; it only reorders
//!   what no event orders) and finds no hazard: every hand-over is an event.

mod common;

use common::{bits, config, released, run_lm, run_lm_on_nodes, On};
use zero_core::ledger::Group;
use zero_core::{Precision, Stage};

const STEPS: u64 = 4;

#[test]
fn every_stage_matches_stage_0_at_every_n_on_host_and_sim() {
    for n in 1..=4 {
        let base = run_lm(
            n,
            &config(Stage::Zero0, Precision::Fp32, 1),
            On::Host,
            STEPS,
        )
        .unwrap();
        let want = bits(&base[0].losses);
        for r in &base {
            assert_eq!(bits(&r.losses), want, "N={n}: ranks agree on the loss");
        }
        for stage in Stage::ALL {
            for on in [On::Host, On::Sim(100 * n as u64 + stage.number() as u64)] {
                let runs = run_lm(n, &config(stage, Precision::Fp32, 1), on, STEPS)
                    .unwrap_or_else(|e| panic!("N={n} {stage} {on:?}: {e}"));
                for r in &runs {
                    assert_eq!(bits(&r.losses), want, "N={n} {stage} {on:?}: losses");
                    let mb: Vec<u32> = r.master.iter().map(|x| x.to_bits()).collect();
                    let wb: Vec<u32> = base[0].master.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(mb, wb, "N={n} {stage} {on:?}: weights");
                }
            }
        }
    }
}

/// bf16 training with a bf16 gradient accumulator: the tied table's gradient over its
/// use (head + lookup) is summed in an f32 accumulator and rounded to bf16 once at every
/// stage, so the stages still give stage 0's bits. (Stages 0/1 added each layer's part
/// into the bf16 accumulator, rounding twice, and differed from stages 2/3 in the last
/// bits of the loss by step 4.)
#[test]
fn in_bf16_every_stage_matches_stage_0_with_a_tied_table() {
    for n in 1..=3 {
        let base = run_lm(
            n,
            &config(Stage::Zero0, Precision::Bf16, 1),
            On::Host,
            STEPS,
        )
        .unwrap();
        let want = bits(&base[0].losses);
        let want_master: Vec<u32> = base[0].master.iter().map(|x| x.to_bits()).collect();
        for stage in Stage::ALL {
            for on in [On::Host, On::Sim(40 + n as u64)] {
                let runs = run_lm(n, &config(stage, Precision::Bf16, 1), on, STEPS)
                    .unwrap_or_else(|e| panic!("N={n} {stage} {on:?}: {e}"));
                let r = &runs[0];
                assert_eq!(bits(&r.losses), want, "N={n} {stage} {on:?}: losses");
                let mb: Vec<u32> = r.master.iter().map(|x| x.to_bits()).collect();
                assert!(mb == want_master, "N={n} {stage} {on:?}: weights");
            }
        }
    }
}

#[test]
fn with_accumulation_the_stages_agree_to_rounding() {
    for n in [2, 3] {
        let base = run_lm(
            n,
            &config(Stage::Zero0, Precision::Fp32, 2),
            On::Host,
            STEPS,
        )
        .unwrap();
        for stage in [Stage::Zero1, Stage::Zero2, Stage::Zero3] {
            for on in [On::Host, On::Sim(7)] {
                let runs = run_lm(n, &config(stage, Precision::Fp32, 2), on, STEPS).unwrap();
                for (a, b) in runs[0].losses.iter().zip(&base[0].losses) {
                    assert!(
                        (a - b).abs() <= 1e-6 * b.abs(),
                        "N={n} {stage} {on:?}: {a} vs {b}"
                    );
                }
            }
        }
        // Stage 1 accumulates locally like stage 0 and reduces the same sums: exact.
        let s1 = run_lm(
            n,
            &config(Stage::Zero1, Precision::Fp32, 2),
            On::Host,
            STEPS,
        )
        .unwrap();
        assert_eq!(bits(&s1[0].losses), bits(&base[0].losses));
    }
}

/// Released between its uses (`zero.reuse_distance` exceeded), the tied table's gradient
/// reaches the shard as head + lookup, reduced per use, where stage 0 adds the lookup's
/// rows into the head's gradient before reducing: the same sum in another order, so the
/// stages agree to f32 rounding (at N = 1 too), not bit for bit. Stage 3 gathers the
/// table twice per pass and holds no copy between.
#[test]
fn a_released_tied_table_gives_the_stage_0_step_to_rounding() {
    for n in 1..=3 {
        let base = run_lm(
            n,
            &config(Stage::Zero0, Precision::Fp32, 1),
            On::Host,
            STEPS,
        )
        .unwrap();
        for stage in [Stage::Zero2, Stage::Zero3] {
            for on in [On::Host, On::Sim(11 + n as u64)] {
                let c = released(config(stage, Precision::Fp32, 1));
                let runs = run_lm(n, &c, on, STEPS)
                    .unwrap_or_else(|e| panic!("N={n} {stage} {on:?}: {e}"));
                for (a, b) in runs[0].losses.iter().zip(&base[0].losses) {
                    assert!(
                        (a - b).abs() <= 1e-6 * b.abs(),
                        "N={n} {stage} {on:?}: {a} vs {b}"
                    );
                }
                let worst = runs[0]
                    .master
                    .iter()
                    .zip(&base[0].master)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(worst <= 1e-5, "N={n} {stage} {on:?}: weights {worst}");
            }
        }
    }
}

#[test]
fn n_ranks_with_one_micro_step_equal_one_rank_with_n() {
    for stage in [Stage::Zero0, Stage::Zero2, Stage::Zero3] {
        let one = run_lm(1, &config(stage, Precision::Fp32, 4), On::Host, STEPS).unwrap();
        let four = run_lm(4, &config(stage, Precision::Fp32, 1), On::Host, STEPS).unwrap();
        // The same rows and weights per micro-batch; only the order of the additions of
        // the four micro-batch gradients differs (local accumulation vs the rank order).
        for (a, b) in one[0].losses.iter().zip(&four[0].losses) {
            assert!((a - b).abs() <= 1e-6 * b.abs(), "{stage}: {a} vs {b}");
        }
    }
}

#[test]
fn memory_measured_equals_the_plan_and_comm_equals_the_ledger_exactly() {
    for n in [1, 2, 3] {
        for stage in Stage::ALL {
            for precision in [Precision::Fp32, Precision::Bf16] {
                for (accum, release) in [(1, false), (2, false), (2, true)] {
                    let mut c = config(stage, precision, accum);
                    if release {
                        c = released(c);
                    }
                    let runs = run_lm(n, &c, On::Host, 2).unwrap();
                    for (r, run) in runs.iter().enumerate() {
                        let what = format!(
                            "N={n} {stage} {precision:?} A={accum} released {release} rank {r}"
                        );
                        assert_ledgers_exact(run, n, &what);
                    }
                }
            }
        }
    }
}

/// Memory measured = the plan, and bytes sent per collective kind on the world = the
/// ledger's world lines of that kind (+ the 3-f64 agreement all-reduce); on nodes, the
/// bytes and calls on the node and cross-node groups = the ledger's lines there.
fn assert_ledgers_exact(run: &common::RankRun, n: usize, what: &str) {
    assert_eq!(run.memory_measured, run.memory_plan, "{what}");
    let plan = &run.comm_plan;
    let report = &run.reports[1];
    for (kind, name) in [
        (zero_comm::CollectiveKind::AllReduce, "AllReduce"),
        (zero_comm::CollectiveKind::ReduceScatter, "ReduceScatter"),
        (zero_comm::CollectiveKind::AllGather, "AllGather"),
    ] {
        let got = report.comm.get(kind).bytes_sent;
        let want_world: u64 = plan
            .lines
            .iter()
            .filter(|l| l.group == Group::World && format!("{:?}", l.collective) == name)
            .map(|l| l.sent_bytes)
            .sum::<u64>()
            + if name == "AllReduce" && n > 1 {
                2 * (n as u64 - 1) * 24 / n as u64
            } else {
                0
            };
        assert_eq!(got, want_world, "{what}: {name}");
    }
    // On nodes: every kind on the node and cross-node groups, and the calls too.
    if let Some(groups) = &report.node_comm {
        for (group, stats) in [(Group::Node, groups.node), (Group::Cross, groups.cross)] {
            assert_eq!(
                stats.total().bytes_sent,
                plan.sent_bytes_on(group),
                "{what}: bytes on {group:?}"
            );
            let calls: u64 = plan
                .lines
                .iter()
                .filter(|l| l.group == group)
                .map(|l| l.calls)
                .sum();
            assert_eq!(stats.total().calls, calls, "{what}: calls on {group:?}");
        }
    } else {
        assert_eq!(
            plan.sent_bytes(),
            plan.sent_bytes_on(Group::World),
            "{what}"
        );
    }
}

/// qwZ (`zero.quantize_weights`): stage 3's gathers, and the after-step gathers of
/// stages 1/2 in bf16 training, move int8 codes and f32 scales. The ledgers
/// stay exact (the staging buffers are planned, the codes and scales are the ledger's
/// lines), every rank computes with the same rounded weights (equal losses across
/// ranks), the gathers send about a quarter of fp32's bytes, and the losses track the
/// exact gathers': a weight moves by at most amax / 254 of its block (half a step of the
/// int8 grid), which changes this model's loss by well under 1% over 8 steps.
#[test]
fn quantized_gathers_keep_exact_ledgers_and_track_exact_gathers() {
    let cases = [
        (Stage::Zero3, Precision::Fp32),
        (Stage::Zero3, Precision::Bf16),
        (Stage::Zero1, Precision::Bf16),
        (Stage::Zero2, Precision::Bf16),
    ];
    for n in [2, 3] {
        for (stage, precision) in cases {
            let exact = config(stage, precision, 1);
            let base = run_lm(n, &exact, On::Host, 8).unwrap();
            for block in [16, 256] {
                let mut c = exact.clone();
                c.zero.quantize_weights = true;
                c.zero.quant_block = block;
                for on in [On::Host, On::Sim(7 + n as u64)] {
                    let runs = run_lm(n, &c, on, 8).unwrap();
                    let what = format!("N={n} {stage} {precision:?} block {block} {on:?}");
                    for (r, run) in runs.iter().enumerate() {
                        assert_ledgers_exact(run, n, &format!("{what} rank {r}"));
                        assert_eq!(bits(&run.losses), bits(&runs[0].losses), "{what}: ranks");
                    }
                    for (q, e) in runs[0].losses.iter().zip(&base[0].losses) {
                        assert!((q - e).abs() <= 1e-2 * e, "{what}: {q} vs exact {e}");
                    }
                    let gathered = |plan: &zero_core::ledger::CommPlan| -> u64 {
                        plan.lines
                            .iter()
                            .filter(|l| l.collective == zero_core::ledger::Collective::AllGather)
                            .map(|l| l.sent_bytes)
                            .sum()
                    };
                    let (q, e) = (gathered(&runs[0].comm_plan), gathered(&base[0].comm_plan));
                    let p = precision.param_dtype().size_bytes() as f64;
                    // Codes: 1 byte a value instead of p, plus 4 bytes a block (and the
                    // persistent units' exact after-step gathers, counted in both).
                    assert!(
                        (q as f64) < e as f64 * (1.0 + 8.0 / block as f64) / p,
                        "{what}: {q} vs {e}"
                    );
                }
            }
        }
    }
}

/// hpZ (`zero.hierarchical_weights`): stage 3's backward gathers come from the
/// node-partitioned copy over the node group. They are copies of what the forward
/// gathered, so training is the same bits as the flat gathers (with qwZ too: the copy
/// holds the dequantized values every rank computed with), for any split of the ranks
/// into nodes; the secondary partition is planned (ledger exact) and no backward gather
/// is on the world.
#[test]
fn hierarchical_weights_train_the_same_bits_as_flat_gathers() {
    for (n, l) in [(4, 2), (6, 3), (6, 2), (4, 1), (4, 4)] {
        for precision in [Precision::Fp32, Precision::Bf16] {
            for quantized in [false, true] {
                let mut flat = config(Stage::Zero3, precision, 2);
                flat.zero.quantize_weights = quantized;
                flat.zero.quant_block = 16;
                let base = run_lm(n, &flat, On::Host, 4).unwrap();
                let mut c = flat.clone();
                c.zero.hierarchical_weights = true;
                for on in [On::Host, On::Sim(5)] {
                    let what = format!("N={n} L={l} {precision:?} qwZ {quantized} {on:?}");
                    let runs = run_lm_on_nodes(n, l, &c, on, 4).unwrap();
                    for (r, run) in runs.iter().enumerate() {
                        assert_eq!(bits(&run.losses), bits(&base[r].losses), "{what} rank {r}");
                        let (a, b) = (&run.master, &base[r].master);
                        assert!(
                            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "{what}"
                        );
                        assert_ledgers_exact(run, n, &format!("{what} rank {r}"));
                        let secondary = run
                            .memory_plan
                            .iter()
                            .find(|(c, _)| *c == zero_core::ledger::MemCategory::Secondary)
                            .map_or(0, |(_, b)| *b);
                        assert!(secondary > 0, "{what}: no secondary partition");
                        assert!(run.comm_plan.lines.iter().all(|l| {
                            l.purpose != zero_core::ledger::CommPurpose::GatherBackward
                                || l.group == Group::Node
                        }));
                    }
                }
            }
        }
    }
}

/// qgZ (`zero.quantize_grads`): the gradient reduce-scatter becomes two int8
/// all-to-alls (inside the node, then across). Every rank agrees on the step (equal
/// losses), the ledgers stay exact on the world, node and cross-node groups, the
/// gradient bytes shrink to about a byte a value, and the losses track the exact
/// reduction's (each value moves by at most amax / 254 of its block per exchange).
#[test]
fn quantized_grad_reduction_keeps_exact_ledgers_and_tracks_exact() {
    for (n, l) in [(4, 2), (6, 3), (4, 1), (4, 4)] {
        for stage in [Stage::Zero1, Stage::Zero2, Stage::Zero3] {
            for precision in [Precision::Fp32, Precision::Bf16] {
                let exact = config(stage, precision, 2);
                let base = run_lm(n, &exact, On::Host, 6).unwrap();
                let mut c = exact.clone();
                c.zero.quantize_grads = true;
                c.zero.quant_block = 32;
                for on in [On::Host, On::Sim(9)] {
                    let what = format!("N={n} L={l} {stage} {precision:?} {on:?}");
                    let runs = run_lm_on_nodes(n, l, &c, on, 6).unwrap();
                    for (r, run) in runs.iter().enumerate() {
                        assert_ledgers_exact(run, n, &format!("{what} rank {r}"));
                        assert_eq!(bits(&run.losses), bits(&runs[0].losses), "{what}: ranks");
                    }
                    for (q, e) in runs[0].losses.iter().zip(&base[0].losses) {
                        assert!((q - e).abs() <= 1e-2 * e, "{what}: {q} vs exact {e}");
                    }
                    let grads = |p: &zero_core::ledger::CommPlan| -> u64 {
                        p.lines
                            .iter()
                            .filter(|l| l.purpose == zero_core::ledger::CommPurpose::Grads)
                            .map(|l| l.sent_bytes)
                            .sum()
                    };
                    let (q, e) = (grads(&runs[0].comm_plan), grads(&base[0].comm_plan));
                    assert!(q < e, "{what}: {q} vs {e}");
                }
            }
        }
    }
}

/// The units that live between uses (`released`: the tied table gathered again for the
/// head and reduced after each use) and stages 2/3 reducing once per step: hpZ still
/// trains the flat gathers' bits, qgZ still keeps its ledgers and tracks the exact run.
#[test]
fn hierarchical_switches_with_released_units_and_one_reduction_a_step() {
    let (n, l) = (4, 2);
    let mut once = config(Stage::Zero3, Precision::Bf16, 2);
    once.zero.reduce_every_micro_step = Some(false);
    for flat in [released(config(Stage::Zero3, Precision::Bf16, 2)), once] {
        let base = run_lm(n, &flat, On::Host, 4).unwrap();
        let mut hpz = flat.clone();
        hpz.zero.hierarchical_weights = true;
        let mut qgz = flat.clone();
        qgz.zero.quantize_grads = true;
        qgz.zero.quant_block = 32;
        let what = format!(
            "reuse {} once {:?}",
            flat.zero.reuse_distance, flat.zero.reduce_every_micro_step
        );
        let runs = run_lm_on_nodes(n, l, &hpz, On::Sim(2), 4).unwrap();
        for (r, run) in runs.iter().enumerate() {
            assert_eq!(bits(&run.losses), bits(&base[r].losses), "hpZ {what}");
            assert_ledgers_exact(run, n, &format!("hpZ {what} rank {r}"));
        }
        let runs = run_lm_on_nodes(n, l, &qgz, On::Sim(2), 4).unwrap();
        for (r, run) in runs.iter().enumerate() {
            assert_ledgers_exact(run, n, &format!("qgZ {what} rank {r}"));
            for (q, e) in run.losses.iter().zip(&base[r].losses) {
                assert!((q - e).abs() <= 1e-2 * e, "qgZ {what}: {q} vs exact {e}");
            }
        }
    }
}

/// qgZ with int4 codes (`grad_quant_bits = 4`): the code bytes halve against int8, the
/// ledgers stay exact, and the loss still tracks the exact reduction's (each value moves
/// by at most amax / 14 of its block per exchange: 2% over these steps).
#[test]
fn int4_gradient_codes_halve_the_code_bytes_and_track_exact() {
    for (n, l) in [(4, 2), (6, 3)] {
        for stage in [Stage::Zero2, Stage::Zero3] {
            let exact = config(stage, Precision::Bf16, 2);
            let base = run_lm(n, &exact, On::Host, 6).unwrap();
            let mut int8 = exact.clone();
            int8.zero.quantize_grads = true;
            int8.zero.quant_block = 32;
            let mut int4 = int8.clone();
            int4.zero.grad_quant_bits = 4;
            let what = format!("N={n} L={l} {stage}");
            let eight = run_lm_on_nodes(n, l, &int8, On::Host, 6).unwrap();
            for on in [On::Host, On::Sim(4)] {
                let runs = run_lm_on_nodes(n, l, &int4, on, 6).unwrap();
                for (r, run) in runs.iter().enumerate() {
                    assert_ledgers_exact(run, n, &format!("{what} {on:?} rank {r}"));
                    assert_eq!(bits(&run.losses), bits(&runs[0].losses), "{what}: ranks");
                }
                for (q, e) in runs[0].losses.iter().zip(&base[0].losses) {
                    assert!((q - e).abs() <= 2e-2 * e, "{what}: {q} vs exact {e}");
                }
                let codes = |p: &zero_core::ledger::CommPlan| -> u64 {
                    p.lines
                        .iter()
                        .filter(|l| l.collective == zero_core::ledger::Collective::AllToAll)
                        .filter(|l| l.dtype == zero_kernels::DType::U8)
                        .map(|l| l.elems)
                        .sum()
                };
                let (four, eight) = (codes(&runs[0].comm_plan), codes(&eight[0].comm_plan));
                assert_eq!(2 * four, eight, "{what}: int4 code bytes");
            }
        }
    }
}

#[test]
fn the_hierarchical_switches_need_node_groups() {
    let mut c = config(Stage::Zero3, Precision::Bf16, 1);
    c.zero.hierarchical_weights = true;
    let e = run_lm(2, &c, On::Host, 1).unwrap_err();
    assert!(e.contains("Engine::on_nodes"), "{e}");
}

/// Every stage of fp16 and bf16 gives its own precision's stage-0 losses and weights bit
/// for bit (thread ranks sum in rank order, so the additions come in the same order at
/// every stage, as in fp32), on the simulated device too; and each tracks fp32 loosely:
/// bf16 keeps 8 significand bits (relative rounding 2^-9 = 2e-3 per value), so over 8
/// steps the loss stays within 2e-2 relative of fp32's; fp16's 11 bits, 1e-2.
#[test]
fn mixed_precision_stages_match_their_stage_0_and_track_fp32() {
    let f = run_lm(2, &config(Stage::Zero2, Precision::Fp32, 1), On::Host, 8).unwrap();
    for (precision, tol) in [(Precision::Bf16, 2e-2), (Precision::Fp16, 1e-2)] {
        let base = run_lm(2, &config(Stage::Zero0, precision, 1), On::Host, 8).unwrap();
        let want_master: Vec<u32> = base[0].master.iter().map(|x| x.to_bits()).collect();
        for stage in Stage::ALL {
            let runs = run_lm(2, &config(stage, precision, 1), On::Sim(3), 8).unwrap();
            let what = format!("{stage} {precision:?}");
            assert_eq!(
                bits(&runs[0].losses),
                bits(&base[0].losses),
                "{what}: losses vs its stage 0"
            );
            let master: Vec<u32> = runs[0].master.iter().map(|x| x.to_bits()).collect();
            assert!(master == want_master, "{what}: weights vs its stage 0");
            for (a, b) in runs[0].losses.iter().zip(&f[0].losses) {
                // `!(x > tol)` would pass a NaN: ask for the bound to hold.
                assert!((a - b).abs() <= tol * b, "{what}: {a} vs fp32 {b}");
            }
        }
    }
}

/// Each stream hand-over guards a real hazard: leave one out and the simulated device
/// names it (the eager host device, where everything runs in program order, cannot see
/// it; on a GPU it would be a race).
#[test]
fn the_simulated_device_catches_every_removed_wait() {
    use zero_core::WaitPoint as W;
    // Every wait point, each with a configuration that needs it. The match is
    // exhaustive, so a new wait point does not compile here until it has a case; it goes
    // into ALL beside it.
    const ALL: [W; 8] = [
        W::ParamsReady,
        W::GradsComputed,
        W::BucketFree,
        W::SourceFree,
        W::GradsReduced,
        W::SlotFree,
        W::Gathered,
        W::Updated,
    ];
    let needs = |point: W| match point {
        W::ParamsReady => config(Stage::Zero3, Precision::Bf16, 1),
        W::GradsComputed => config(Stage::Zero2, Precision::Bf16, 1),
        W::BucketFree => config(Stage::Zero2, Precision::Bf16, 1),
        W::SourceFree => {
            // fp32 with buckets as large as a shard: reductions read the gradient window
            // directly.
            let mut c = config(Stage::Zero2, Precision::Fp32, 1);
            c.zero.bucket_elems = None;
            c
        }
        W::GradsReduced => config(Stage::Zero1, Precision::Bf16, 1),
        W::SlotFree => config(Stage::Zero3, Precision::Bf16, 1),
        W::Gathered => config(Stage::Zero3, Precision::Fp32, 1),
        W::Updated => config(Stage::Zero1, Precision::Bf16, 1),
    };
    let cases = ALL.map(|point| (point, needs(point)));
    for (point, c) in cases {
        run_lm(2, &c, On::Sim(5), 3).unwrap_or_else(|e| panic!("{point:?} with the wait: {e}"));
        common::run_lm_with(2, &c, On::Host, 3, Some(point))
            .unwrap_or_else(|e| panic!("{point:?}: the host device cannot see it: {e}"));
        let err = common::run_lm_with(2, &c, On::Sim(5), 3, Some(point)).expect_err(&format!(
            "{point:?} removed: the simulated device must object"
        ));
        assert!(err.contains("hazard on buffer"), "{point:?}: {err}");
        eprintln!("{point:?} removed -> {err}");
    }
}

use hooked::Hooked;

mod hooked {
    use super::common;
    use common::models::char_lm::{CharLm, TokenBatch};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use zero_core::model::{Compute, Model, ModelError, UnitGrads, UnitParams};
    use zero_core::ModelSpec;
    use zero_kernels::device::{DView, HostDevice};

    /// The char LM with three test hooks: the forward of `fail_layer` fails on its first
    /// call, the initial values drawn are counted (`init_unit`, `init_unit_range`), and
    /// `spec` replaces the model's spec (a rank whose buffers cannot be allocated).
    pub struct Hooked {
        lm: CharLm<HostDevice>,
        fail_layer: Option<usize>,
        pub drawn: AtomicUsize,
        pub spec: Option<ModelSpec>,
    }

    impl Hooked {
        pub fn new(lm: CharLm<HostDevice>, fail_layer: Option<usize>) -> Self {
            let drawn = AtomicUsize::new(0);
            Hooked {
                lm,
                fail_layer,
                drawn,
                spec: None,
            }
        }
    }

    impl Model<HostDevice> for Hooked {
        type Batch<'a> = TokenBatch<'a>;
        fn spec(&self) -> &ModelSpec {
            self.spec.as_ref().unwrap_or_else(|| self.lm.spec())
        }
        fn init_unit(&self, seed: u64, unit: usize, out: &mut [f32]) {
            let numel = self.spec().units[unit].numel();
            self.drawn.fetch_add(numel, Ordering::Relaxed);
            self.lm.init_unit(seed, unit, out)
        }
        fn init_unit_range(
            &self,
            seed: u64,
            unit: usize,
            range: std::ops::Range<usize>,
            out: &mut [f32],
        ) {
            self.drawn.fetch_add(range.len(), Ordering::Relaxed);
            let mut whole = vec![0.0; self.spec().units[unit].numel()];
            self.lm.init_unit(seed, unit, &mut whole);
            out.copy_from_slice(&whole[range]);
        }
        fn begin_micro_step(
            &mut self,
            cx: Compute<'_, HostDevice>,
            batch: &TokenBatch<'_>,
        ) -> Result<(), ModelError> {
            self.lm.begin_micro_step(cx, batch)
        }
        fn forward_layer(
            &mut self,
            cx: Compute<'_, HostDevice>,
            layer: usize,
            params: &[UnitParams<'_, HostDevice>],
        ) -> Result<(), ModelError> {
            if self.fail_layer == Some(layer) {
                self.fail_layer = None;
                return Err(ModelError::BadCall("injected failure".into()));
            }
            self.lm.forward_layer(cx, layer, params)
        }
        fn loss(&self) -> DView<'_, HostDevice, f32> {
            self.lm.loss()
        }
        fn backward_layer(
            &mut self,
            cx: Compute<'_, HostDevice>,
            layer: usize,
            params: &[UnitParams<'_, HostDevice>],
            grads: &mut [UnitGrads<'_, HostDevice>],
            weight: f32,
        ) -> Result<(), ModelError> {
            self.lm.backward_layer(cx, layer, params, grads, weight)
        }
        fn activation_bytes(&self) -> usize {
            self.lm.activation_bytes()
        }
    }
}

/// A step that fails part-way (here the model's forward of one layer, on every rank)
/// leaves half a step behind: the engine returns that error, then refuses further steps,
/// state export and checkpoints with one that says what to do, at every stage, instead
/// of gathering into slots or reducing gradients the failed step left mid-flight.
#[test]
fn a_step_that_failed_part_way_stops_the_engine() {
    use common::models::char_lm::{CharLm, TokenBatch};
    use zero_comm::Communicator;
    use zero_kernels::device::{Device, HostDevice};

    for stage in [Stage::Zero0, Stage::Zero3] {
        let outcomes = zero_comm::run_local(2, Default::default(), |comm| {
            let dev = HostDevice::new();
            let lm = CharLm::new(&dev, common::lm_config()).unwrap();
            let mut model = Hooked::new(lm, Some(2));
            let c = config(stage, Precision::Bf16, 1);
            let mut engine = zero_core::Engine::new(&c, &comm, &dev, &model).unwrap();
            let (x, y) = common::lm_batch(0, 0, comm.rank(), 2, 1);
            let b = TokenBatch {
                inputs: &x,
                targets: &y,
                seq_len: common::SEQ,
            };
            let failed = engine.step(&mut model, &[b]).unwrap_err().to_string();
            let again = engine.step(&mut model, &[b]).unwrap_err().to_string();
            let export = engine.export_unit(0).unwrap_err().to_string();
            let params = engine.full_params_f32().unwrap_err().to_string();
            // Refused before any collective or file: nothing is written.
            let dir = std::env::temp_dir().join(format!(
                "zero-interrupted-{}-{stage}-{}",
                std::process::id(),
                comm.rank()
            ));
            let opts = zero_core::checkpoint::SaveOptions::default();
            let saved = zero_core::checkpoint::save(&engine, &dir, &opts)
                .unwrap_err()
                .to_string();
            assert!(!dir.exists(), "{}", dir.display());
            // Nor is a checkpoint loaded into it (before any collective: the ranks may be
            // at different ones).
            let loaded = zero_core::checkpoint::load(&mut engine, &dir)
                .unwrap_err()
                .to_string();
            assert_eq!(engine.interrupted(), Some(1));
            dev.synchronize().unwrap();
            let refused = [again, export, params, saved, loaded];
            (failed, refused, engine.steps_done())
        });
        for outcome in outcomes {
            let (failed, refused, done) = outcome.unwrap();
            assert!(failed.contains("injected failure"), "{stage}: {failed}");
            for refused in &refused {
                assert!(
                    refused.contains("step 1 failed part-way")
                        && refused.contains("resume from the last checkpoint"),
                    "{stage}: {refused}"
                );
            }
            assert_eq!(done, 0);
        }
    }
}

/// At every stage each rank draws only its own block of each unit's initial values
/// (`init_unit_range`), units kept gathered at stage 3 too, and the engine's bf16
/// parameters and f32 master are the bits of each unit drawn whole, once, outside any
/// engine (the blocks are all-gathered exactly where a whole unit is kept).
#[test]
fn each_rank_draws_only_its_block_of_the_initial_values() {
    use common::models::char_lm::CharLm;
    use std::sync::atomic::Ordering;
    use zero_core::Model;
    use zero_kernels::device::HostDevice;

    let n = 2;
    // (stage, units kept whole below this many elements) -> per rank (drawn, units'
    // (numel, shard_len), params and master gathered, in bf16 training).
    let start = |stage: Stage, persist_below: usize| {
        zero_comm::run_local(n, Default::default(), |comm| {
            let dev = HostDevice::new();
            let model = Hooked::new(CharLm::new(&dev, common::lm_config()).unwrap(), None);
            let mut c = config(stage, Precision::Bf16, 1);
            c.zero.persistence_threshold = persist_below;
            let engine = zero_core::Engine::new(&c, &comm, &dev, &model).unwrap();
            let drawn = model.drawn.load(Ordering::Relaxed);
            let units: Vec<(usize, usize)> = (engine.layout().units.iter())
                .map(|u| (u.numel, u.shard_len))
                .collect();
            let params = engine.full_params_f32().unwrap();
            let master = engine.full_master_f32().unwrap();
            (drawn, units, [params, master].concat())
        })
        .into_iter()
        .map(Result::unwrap)
        .collect::<Vec<_>>()
    };
    let f32_bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    // Each unit drawn whole on one thread: the parameters rounded to bf16, the master.
    let reference = {
        let dev = HostDevice::new();
        let model = CharLm::new(&dev, common::lm_config()).unwrap();
        let seed = config(Stage::Zero0, Precision::Bf16, 1).seed;
        let master: Vec<f32> = (model.spec().units.iter().enumerate())
            .flat_map(|(u, unit)| {
                let mut values = vec![0.0f32; unit.numel()];
                model.init_unit(seed, u, &mut values);
                values
            })
            .collect();
        let params = master.iter().map(|&x| half::bf16::from_f32(x).to_f32());
        f32_bits(&params.chain(master.iter().copied()).collect::<Vec<_>>())
    };
    // This rank's block of every unit, clipped to the unit's real elements (the last
    // rank's block of a padded unit holds padding, which is zeros, not drawn).
    let block = |rank: usize, units: &[(usize, usize)]| -> usize {
        (units.iter())
            .map(|&(numel, s)| (rank * s..(rank + 1) * s).filter(|&e| e < numel).count())
            .sum()
    };
    let sizes: Vec<usize> = start(Stage::Zero0, 0)[0].1.iter().map(|u| u.0).collect();
    let whole_model: usize = sizes.iter().sum();
    // Stage 3 with the small units kept gathered (whole on every rank) as well.
    let below = 1000;
    assert!(
        sizes.iter().any(|&e| e < below) && sizes.iter().any(|&e| e >= below),
        "units on both sides of {below}: {sizes:?}"
    );
    let cases = [
        (Stage::Zero0, 0),
        (Stage::Zero1, 0),
        (Stage::Zero2, 0),
        (Stage::Zero3, 0),
        (Stage::Zero3, below),
    ];
    for (stage, persist_below) in cases {
        for (rank, (drawn, units, params)) in start(stage, persist_below).into_iter().enumerate() {
            let case = format!("{stage}, units below {persist_below} kept whole, rank {rank}");
            assert_eq!(drawn, block(rank, &units), "{case}");
            assert!(
                drawn < whole_model * 2 / 3,
                "{case}: {drawn} of {whole_model}"
            );
            assert_eq!(f32_bits(&params), reference, "{case}");
        }
    }
}

/// `Engine::new` is collective (the initial values are all-gathered): a rank that cannot
/// allocate its buffers returns its own error, before the first gather, instead of
/// leaving the others waiting there. Its buffers are too large because its spec is
/// another (a 16 TiB tensor), so the other rank is told the ranks' models differ (with
/// the same spec it would be `PeerSetup`: `tests/engine_setup.rs`).
#[test]
fn a_rank_that_cannot_allocate_stops_every_rank_before_the_first_gather() {
    use common::models::char_lm::CharLm;
    use zero_core::Model;
    use zero_kernels::device::HostDevice;
    let outcomes = zero_comm::run_local(2, Default::default(), |comm| {
        let dev = HostDevice::new();
        let lm = CharLm::new(&dev, common::lm_config()).unwrap();
        let mut spec = lm.spec().clone();
        let mut model = Hooked::new(lm, None);
        if zero_comm::Communicator::rank(&comm) == 1 {
            // 2^42 elements (16 TiB of f32) in one tensor: no host allocates that.
            spec.units[0].params[0].shape = vec![1 << 21, 1 << 21];
            model.spec = Some(spec);
        }
        let c = config(Stage::Zero1, Precision::Fp32, 1);
        zero_core::Engine::new(&c, &comm, &dev, &model)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    let errors: Vec<String> = outcomes
        .into_iter()
        .map(|o| o.unwrap().expect_err("no engine"))
        .collect();
    assert!(
        errors[0].contains("with the same ModelSpec and the same EngineConfig"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("TiB") || errors[1].contains("bytes"),
        "{errors:?}"
    );
}

/// State from a damaged or hand-edited checkpoint is refused, not run with: counters a
/// step would overflow or that disagree, and a loss scale no step could use.
#[test]
fn imported_counters_and_scales_out_of_range_are_refused() {
    use common::models::char_lm::CharLm;
    use zero_kernels::device::HostDevice;
    let outcomes = zero_comm::run_local(1, Default::default(), |comm| {
        let dev = HostDevice::new();
        let model = CharLm::new(&dev, common::lm_config()).unwrap();
        let c = config(Stage::Zero1, Precision::Fp32, 1);
        let mut engine = zero_core::Engine::new(&c, &comm, &dev, &model).unwrap();
        let scaler = zero_core::LossScaler::new(&c.precision);
        let mut huge = scaler.clone();
        huge.scale = f64::INFINITY;
        // Below 2^-126, 1/scale is infinite in f32: every step would be an "overflow".
        let mut tiny = scaler.clone();
        tiny.scale = 1e-39;
        let refusals = [
            (u64::MAX, 0, scaler.clone()),
            (3, 4, scaler.clone()),
            (3, 3, huge),
            (3, 3, tiny),
        ]
        .map(|(step, applied, s)| {
            engine
                .finish_import(step, applied, s)
                .unwrap_err()
                .to_string()
        });
        engine.finish_import(3, 2, scaler).unwrap();
        (refusals, engine.steps_done())
    });
    let (refusals, done) = outcomes.into_iter().next().unwrap().unwrap();
    assert!(
        refusals[0].contains("need applied <= step <= 2^53"),
        "{}",
        refusals[0]
    );
    assert!(
        refusals[1].contains("step 3 and applied 4"),
        "{}",
        refusals[1]
    );
    assert!(refusals[2].contains("at most 2^127"), "{}", refusals[2]);
    assert!(refusals[3].contains("at least 2^-126"), "{}", refusals[3]);
    assert!(refusals[3].contains("scale 0.000"), "{}", refusals[3]);
    assert_eq!(done, 3);
}

#[test]
fn a_step_refuses_another_model_and_a_wrong_batch_count() {
    use common::models::char_lm::{CharLm, TokenBatch};
    use zero_kernels::device::HostDevice;
    let outcomes = zero_comm::run_local(1, Default::default(), |comm| {
        let dev = HostDevice::new();
        let model = CharLm::new(&dev, common::lm_config()).unwrap();
        let mut other = common::lm_config();
        other.blocks = 3;
        let mut other = CharLm::new(&dev, other).unwrap();
        let c = config(Stage::Zero3, Precision::Fp32, 1);
        let mut engine = zero_core::Engine::new(&c, &comm, &dev, &model).unwrap();
        let (x, y) = common::lm_batch(0, 0, 0, 1, 1);
        let b = TokenBatch {
            inputs: &x,
            targets: &y,
            seq_len: common::SEQ,
        };
        let wrong_model = engine.step(&mut other, &[b]).unwrap_err().to_string();
        let mut model = model;
        let wrong_count = engine.step(&mut model, &[b, b]).unwrap_err().to_string();
        (wrong_model, wrong_count)
    });
    let (wrong_model, wrong_count) = outcomes.into_iter().next().unwrap().unwrap();
    assert!(
        wrong_model.contains("not the one this engine was built for"),
        "{wrong_model}"
    );
    assert!(
        wrong_model.contains("4 layers") && wrong_model.contains("5 layers"),
        "{wrong_model}"
    );
    assert!(
        wrong_count.contains("got 2 micro-batches for grad_accum = 1"),
        "{wrong_count}"
    );
}

/// What research code reads back: every parameter as an ndarray of its shape (gathered),
/// the 16-bit working copy equal to the master rounded, and a unit's tensors by name.
#[test]
fn parameters_come_back_as_shaped_arrays() {
    use common::models::char_lm::CharLm;
    use zero_core::model::{Compute, Model, UnitGrads, UnitParams};
    use zero_kernels::device::{Buffer, Device, HostDevice};
    use zero_kernels::Float;
    let out = zero_comm::run_local(2, Default::default(), |comm| {
        let dev = HostDevice::new();
        let model = CharLm::new(&dev, common::lm_config()).unwrap();
        let c = config(Stage::Zero3, Precision::Bf16, 1);
        let engine = zero_core::Engine::new(&c, &comm, &dev, &model).unwrap();
        let arrays = engine.master_arrays().unwrap();
        let working = engine.full_params_f32().unwrap();
        let master = engine.full_master_f32().unwrap();
        (model.spec().clone(), arrays, working, master)
    });
    let (spec, arrays, working, master) = out.into_iter().next().unwrap().unwrap();
    let names: Vec<&str> = spec
        .units
        .iter()
        .flat_map(|u| u.params.iter().map(|p| p.name.as_str()))
        .collect();
    assert_eq!(
        arrays.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        names
    );
    let (_, wte) = &arrays[0];
    assert_eq!(wte.shape(), &[common::lm_config().vocab, 16]);
    for (w, m) in working.iter().zip(&master) {
        assert_eq!(
            *w,
            <half::bf16 as Float>::from_f32(*m).to_f32(),
            "working copy = bf16(master)"
        );
    }
    // A model reads its tensors by name with their shapes.
    let dev = HostDevice::new();
    let s = dev.stream("compute").unwrap();
    let unit = &spec.units[1];
    let mut buf = dev.alloc::<f32>(unit.numel(), "unit").unwrap();
    let values: Vec<f32> = (0..unit.numel()).map(|i| i as f32).collect();
    dev.upload(&s, &values, buf.view_mut()).unwrap();
    let p = UnitParams::new(unit, buf.view());
    let now = p.by_name("block.0.mix.now.weight").unwrap();
    assert_eq!(now.len(), 64 * 16);
    let a = p
        .to_ndarray(
            Compute {
                dev: &dev,
                stream: &s,
            },
            2,
        )
        .unwrap();
    assert_eq!(a.shape(), &[64, 16]);
    assert_eq!(
        a[[0, 0]],
        (2 * 16) as f32,
        "after ln.weight and ln.bias (16 each)"
    );
    assert!(p.by_name("no such tensor").is_none());
    // And its gradients likewise.
    let mut gbuf = dev.alloc::<f32>(unit.numel(), "grad").unwrap();
    dev.upload(&s, &values, gbuf.view_mut()).unwrap();
    let mut g = UnitGrads::new(unit, gbuf.view_mut());
    let cx = Compute {
        dev: &dev,
        stream: &s,
    };
    let ga = g.to_ndarray(cx, 2).unwrap();
    assert_eq!(ga, a, "the same tensor of the same values");
}
