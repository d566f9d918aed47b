//! Ledger tests: plan == formula + explanations exactly (every stage, precision, policy),
//! the paper's worked example, the stage-3 gather schedule simulated step by step, and
//! the communication volumes of docs/ARCHITECTURE.md.

use super::*;
use crate::config::{Precision, Stage};
use crate::layout::PartitionLayout;
use crate::plan::{BufferPlan, BufferRole, Extent, PassStep, PlanError, PlanInputs};
use crate::spec::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};
use crate::testutil::{chain, tied_spec, tied_split_spec};
use zero_kernels::DType;

fn inputs(stage: Stage, precision: Precision, reduce_f32: bool, every: bool) -> PlanInputs {
    PlanInputs {
        stage,
        precision,
        reduce_dtype: if reduce_f32 {
            DType::F32
        } else {
            precision.param_dtype()
        },
        grad_dtype: precision.param_dtype(),
        reduce_every_micro_step: every,
        bucket_elems: 1000,
        prefetch: 1,
        persistence_threshold: 200,
        reuse_distance: usize::MAX,
        grad_accum: 2,
        activation_bytes: 12345,
        quant_block: None,
        grad_quant_block: None,
        grad_quant_bits: 8,
        hierarchical_weights: false,
        ranks_per_node: 1,
    }
}

/// Every valid (stage, precision, accumulator dtype, reduce dtype, policy) combination.
fn all_inputs() -> Vec<PlanInputs> {
    let mut v = Vec::new();
    for stage in Stage::ALL {
        for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
            for reduce_f32 in [false, true] {
                for every in [false, true] {
                    if every && stage < Stage::Zero2 {
                        continue;
                    }
                    let inp = inputs(stage, precision, reduce_f32, every);
                    if precision != Precision::Fp32 {
                        v.push(PlanInputs {
                            grad_dtype: DType::F32,
                            ..inp.clone()
                        });
                    }
                    v.push(inp);
                }
            }
        }
    }
    v
}

#[test]
fn plan_equals_formula_plus_explained_differences_exactly() {
    let spec = tied_spec(65, 16, 3, 8);
    for world in [1, 2, 3, 4, 7] {
        let layout = PartitionLayout::new(&spec, world, 4).unwrap();
        for inp in all_inputs() {
            for rank in [0, world - 1] {
                let plan = BufferPlan::new(&spec, &layout, &inp, rank).unwrap();
                let e = Explanation::new(&plan);
                let diff = Frac::int(plan.total_bytes() as i128) - e.formula.total();
                assert_eq!(e.explained(), diff, "N={world} {inp:?}\n{}", e.render());
                // The categories partition the total.
                let cats: u64 = plan.by_category().iter().map(|c| c.1).sum();
                assert_eq!(cats, plan.total_bytes());
            }
        }
    }
}

#[test]
fn without_padding_16bit_state_matches_the_formula_exactly() {
    // Units of 12 elements on N = 4 with align 1: no padding anywhere.
    let spec = chain(&[12, 24, 12]);
    let psi = 48u64;
    let n = 4u64;
    let layout = PartitionLayout::new(&spec, 4, 1).unwrap();
    assert_eq!(layout.padded_numel(), 48);
    for stage in Stage::ALL {
        let every = stage >= Stage::Zero2;
        let inp = inputs(stage, Precision::Bf16, false, every);
        let plan = BufferPlan::new(&spec, &layout, &inp, 1).unwrap();
        let c = |cat| plan.category_bytes(cat);
        let state: u64 = [
            MemCategory::Params,
            MemCategory::Grads,
            MemCategory::Master,
            MemCategory::AdamM,
            MemCategory::AdamV,
        ]
        .iter()
        .map(|&k| c(k))
        .sum();
        let want = match stage {
            Stage::Zero0 => 16 * psi,
            Stage::Zero1 => 4 * psi + 12 * psi / n,
            Stage::Zero2 => 2 * psi + 14 * psi / n,
            Stage::Zero3 => 16 * psi / n,
        };
        assert_eq!(state, want, "{stage}");
        assert_eq!(c(MemCategory::Padding), 0);
        let f = PaperFormula::new(stage, 48, 4);
        assert_eq!(f.total(), Frac::int(want as i128));
    }
}

/// `precision.grad_accum_dtype = "f32"` in bf16: the gradients weigh 4 bytes a parameter
/// instead of the paper's 2 (2Ψ more at stages 0/1, 2Ψ/N more sharded), the explanation
/// says so, and full gradients need no f32 window (the model writes into them).
#[test]
fn an_f32_gradient_accumulator_costs_2_bytes_a_parameter_more() {
    let spec = chain(&[12, 24, 12]);
    let (psi, n) = (48i128, 4i128);
    let layout = PartitionLayout::new(&spec, 4, 1).unwrap();
    for stage in Stage::ALL {
        for every in [false, true] {
            if every && stage < Stage::Zero2 {
                continue;
            }
            let half = inputs(stage, Precision::Bf16, false, every);
            let f32_grads = PlanInputs {
                grad_dtype: DType::F32,
                ..half.clone()
            };
            let a = BufferPlan::new(&spec, &layout, &half, 1).unwrap();
            let b = BufferPlan::new(&spec, &layout, &f32_grads, 1).unwrap();
            let grads = |p: &BufferPlan| p.category_bytes(MemCategory::Grads) as i128;
            let more = if b.grads_sharded {
                2 * psi / n
            } else {
                2 * psi
            };
            assert_eq!(grads(&b) - grads(&a), more, "{stage} every={every}");
            let e = Explanation::new(&b);
            assert!(
                e.items
                    .iter()
                    .any(|d| d.category == MemCategory::Grads
                        && d.reason.contains("gradients are f32")),
                "{}",
                e.render()
            );
            assert_eq!(
                b.get(BufferRole::GradWindow).is_some(),
                b.grads_sharded,
                "{stage} every={every}"
            );
        }
    }
    // Only f32 or the parameter dtype.
    let mut bad = inputs(Stage::Zero1, Precision::Bf16, false, false);
    bad.grad_dtype = DType::F16;
    assert!(matches!(
        BufferPlan::new(&spec, &layout, &bad, 0),
        Err(PlanError::GradDtype { .. })
    ));
}

#[test]
fn fp32_has_no_separate_master_and_reports_why() {
    let spec = chain(&[64, 64]);
    let layout = PartitionLayout::new(&spec, 2, 1).unwrap();
    let plan = BufferPlan::new(
        &spec,
        &layout,
        &inputs(Stage::Zero1, Precision::Fp32, true, false),
        0,
    )
    .unwrap();
    assert!(plan.get(BufferRole::Master).is_none());
    assert!(plan.get(BufferRole::ParamWindow).is_none());
    assert!(
        plan.get(BufferRole::GradWindow).is_none(),
        "fp32 full grads: model writes directly"
    );
    assert_eq!(plan.get(BufferRole::Params).unwrap().dtype, DType::F32);
    let e = Explanation::new(&plan);
    // The fp32 formula counts what fp32 training holds (4-byte parameters and gradients,
    // no master): the model states differ from it by nothing; the paper's
    // mixed-precision formula is shown beside it.
    assert!(
        e.items.iter().all(|d| !matches!(
            d.category,
            MemCategory::Master | MemCategory::Params | MemCategory::Grads
        )),
        "{}",
        e.render()
    );
    let text = e.render();
    assert!(
        text.contains("ZeRO-1 formula for fp32 4Ψ + 4Ψ + 8Ψ/N"),
        "{text}"
    );
    assert!(
        text.contains("the paper's mixed-precision formula 2Ψ + 2Ψ + 12Ψ/N"),
        "{text}"
    );
}

/// The formula of each precision, term by term: fp32 stage 1 is 4Ψ + 4Ψ + 8Ψ/N (no
/// master), not the paper's 4Ψ + 12Ψ/N; bf16 is the paper's.
#[test]
fn the_formula_follows_the_precision() {
    let (psi, n) = (1000usize, 4usize);
    let f32f = |s| PaperFormula::for_precision(s, Precision::Fp32, psi, n);
    let bf = |s| PaperFormula::for_precision(s, Precision::Bf16, psi, n);
    let p = psi as i128;
    assert_eq!(f32f(Stage::Zero0).total(), Frac::int(16 * p));
    assert_eq!(
        f32f(Stage::Zero1).total(),
        Frac::int(8 * p) + Frac::new(8 * p, 4)
    );
    assert_eq!(f32f(Stage::Zero1).master, Frac::ZERO);
    assert_eq!(
        f32f(Stage::Zero2).total(),
        Frac::int(4 * p) + Frac::new(12 * p, 4)
    );
    assert_eq!(f32f(Stage::Zero3).total(), Frac::new(16 * p, 4));
    assert_eq!(
        bf(Stage::Zero1).total(),
        Frac::int(4 * p) + Frac::new(12 * p, 4)
    );
    assert_eq!(bf(Stage::Zero1), PaperFormula::new(Stage::Zero1, psi, n));
    assert_eq!(f32f(Stage::Zero1).expression(), "4Ψ + 4Ψ + 8Ψ/N");
    assert_eq!(f32f(Stage::Zero1).term(MemCategory::Params), "4Ψ");
    assert_eq!(f32f(Stage::Zero1).term(MemCategory::Master), "0");
    assert_eq!(bf(Stage::Zero2).term(MemCategory::Grads), "2Ψ/N");
    assert_eq!(bf(Stage::Zero2).term(MemCategory::Activations), "");
}

#[test]
fn stage_buffers_follow_the_table() {
    let spec = tied_spec(65, 16, 2, 8);
    let layout = PartitionLayout::new(&spec, 4, 4).unwrap();
    let ext = |plan: &BufferPlan, r| plan.get(r).map(|b| b.extent);
    for inp in all_inputs() {
        let plan = BufferPlan::new(&spec, &layout, &inp, 3).unwrap();
        let s = inp.stage;
        let want_params = if s == Stage::Zero3 {
            Extent::Shard
        } else {
            Extent::Full
        };
        assert_eq!(ext(&plan, BufferRole::Params), Some(want_params));
        let sharded_grads = s >= Stage::Zero2 && inp.reduce_every_micro_step;
        let want_grads = if sharded_grads {
            Extent::Shard
        } else {
            Extent::Full
        };
        assert_eq!(ext(&plan, BufferRole::Grads), Some(want_grads));
        assert_eq!(
            plan.get(BufferRole::Grads).map(|b| b.dtype),
            Some(inp.grad_dtype)
        );
        // The model writes f32 gradients straight into an f32 full accumulator.
        let window = sharded_grads || inp.grad_dtype != DType::F32;
        assert_eq!(
            plan.get(BufferRole::GradWindow).is_some(),
            window,
            "{inp:?}"
        );
        let want_opt = if s == Stage::Zero0 {
            Extent::Full
        } else {
            Extent::Shard
        };
        assert_eq!(ext(&plan, BufferRole::AdamV), Some(want_opt));
        // Tied accumulator (embed, unit 0) exactly when gradients go through the window
        // (sharded, or a 16-bit full accumulator: rounded once per use at every stage).
        assert_eq!(
            plan.get(BufferRole::TiedGrad { unit: 0 }).is_some(),
            window,
            "{inp:?}"
        );
        assert_eq!(plan.gather.is_some(), s == Stage::Zero3);
        assert_eq!(
            plan.get(BufferRole::BucketPiece { index: 1 }).is_some(),
            s != Stage::Zero0
        );
        assert_eq!(plan.bucket_len % (4 * 4), 0);
        assert!(plan.bucket_len <= layout.max_padded_len());
    }
}

/// Elements of all calls of collective `k` in a comm plan (the gathered size).
fn elems_of(c: &CommPlan, k: Collective) -> u64 {
    c.lines
        .iter()
        .filter(|l| l.collective == k)
        .map(|l| l.elems)
        .sum()
}

/// Walk both passes of the schedule like the engine: a slot is written only when free,
/// a layer's units are resident when it computes, each unit gathered once per pass.
fn simulate(spec: &ModelSpec, plan: &BufferPlan) {
    let g = plan.gather.as_ref().unwrap();
    let layers = spec.layers.len();
    let mut slot_owner: Vec<Option<usize>> = vec![None; g.slots.len()];
    let mut resident = vec![false; spec.units.len()];
    for pass in 0..2 {
        let steps = if pass == 0 { &g.forward } else { &g.backward };
        let mut gathered = vec![0usize; spec.units.len()];
        if pass == 1 {
            // The last layer's units come gathered from the forward.
            g.carried.iter().for_each(|&u| gathered[u] = 1);
        }
        for (t, step) in steps.iter().enumerate() {
            for &u in &step.gather {
                let s = g.unit_slot[u].unwrap();
                assert_eq!(slot_owner[s], None, "slot {s} written while in use");
                assert!(g.slots[s] >= spec.units[u].numel());
                slot_owner[s] = Some(u);
                resident[u] = true;
                gathered[u] += 1;
            }
            let layer = if pass == 0 { t } else { layers - 1 - t };
            let read = if pass == 0 {
                &spec.layers[layer].units[..]
            } else {
                spec.layers[layer].backward_units()
            };
            for &u in read {
                assert!(
                    resident[u] || plan.persistent[u],
                    "unit {u} missing at layer {layer}"
                );
            }
            for &u in &step.release {
                let s = g.unit_slot[u].unwrap();
                assert_eq!(slot_owner[s], Some(u));
                slot_owner[s] = None;
                resident[u] = false;
            }
        }
        let uses = if pass == 0 {
            &plan.uses
        } else {
            &plan.backward_reads
        };
        for (u, &times) in gathered.iter().enumerate() {
            // Once per use (in the backward, per use by layers reading it), fewer where
            // prefetch merges two uses.
            let most = if plan.persistent[u] { 0 } else { uses[u].len() };
            assert!(
                times <= most && (times > 0) == (most > 0),
                "unit {u}: {times}"
            );
        }
        // After the forward only the carried units hold their slots; after the backward
        // nothing does.
        let mut held: Vec<usize> = slot_owner.iter().flatten().copied().collect();
        held.sort_unstable();
        let mut want = if pass == 0 {
            g.carried.clone()
        } else {
            Vec::new()
        };
        want.sort_unstable();
        assert_eq!(held, want, "gathered after pass {pass}");
        // Carried: exactly the non-persistent units the last layer reads in both passes.
        let mut reads: Vec<usize> = spec.layers[layers - 1]
            .backward_units()
            .iter()
            .copied()
            .filter(|&u| !plan.persistent[u])
            .collect();
        reads.sort_unstable();
        let mut carried = g.carried.clone();
        carried.sort_unstable();
        assert_eq!(carried, reads, "carried units");
    }
}

#[test]
fn gather_schedule_is_safe_and_holds_tied_units() {
    let spec = tied_spec(65, 16, 4, 8);
    for world in [1, 3, 4] {
        let layout = PartitionLayout::new(&spec, world, 4).unwrap();
        for prefetch in [0, 1, 2, 10] {
            for threshold in [0, 200] {
                let mut inp = inputs(Stage::Zero3, Precision::Bf16, false, true);
                inp.prefetch = prefetch;
                inp.persistence_threshold = threshold;
                let plan = BufferPlan::new(&spec, &layout, &inp, 0).unwrap();
                simulate(&spec, &plan);
                let g = plan.gather.as_ref().unwrap();
                let lens: Vec<usize> = layout.units.iter().map(|u| u.padded_len).collect();
                assert!(g.slot_elems() >= g.peak_resident(&lens));
                // The tied table is gathered at the first forward step and stays
                // gathered into the backward of the last layer, which reads it.
                let last = spec.layers.len() - 1;
                assert!(g.forward[0].gather.contains(&0));
                assert!(g.carried.contains(&0) && !g.forward[last].release.contains(&0));
                assert!(!g.backward[0].gather.contains(&0));
            }
        }
    }
}

/// Released between its uses, the tied table is gathered for the lookup and again for
/// the head in each pass, and its gradient is reduced after each use (no accumulator):
/// the plan and the comm ledger say so.
#[test]
fn a_released_table_is_gathered_and_reduced_per_use() {
    let spec = tied_spec(65, 16, 4, 8);
    let last = spec.layers.len() - 1;
    let layout = PartitionLayout::new(&spec, 2, 4).unwrap();
    let mut inp = inputs(Stage::Zero3, Precision::Fp32, true, true);
    inp.persistence_threshold = 0;
    let held = BufferPlan::new(&spec, &layout, &inp, 0).unwrap();
    inp.reuse_distance = 0;
    let released = BufferPlan::new(&spec, &layout, &inp, 0).unwrap();
    simulate(&spec, &released);
    let g = released.gather.as_ref().unwrap();
    let times = |pass: &[PassStep]| pass.iter().filter(|s| s.gather.contains(&0)).count();
    // The head's use is carried from its forward into its backward.
    assert_eq!((times(&g.forward), times(&g.backward)), (2, 1));
    assert!(g.forward[0].release.contains(&0) && !g.forward[last].release.contains(&0));
    let held_g = held.gather.as_ref().unwrap();
    assert_eq!((times(&held_g.forward), times(&held_g.backward)), (1, 0));
    let lens: Vec<usize> = layout.units.iter().map(|u| u.padded_len).collect();
    assert!(g.slot_elems() >= g.peak_resident(&lens));
    assert!(held.get(BufferRole::TiedGrad { unit: 0 }).is_some());
    assert!(released.get(BufferRole::TiedGrad { unit: 0 }).is_none());
    // One more gather of the table per pass and one more reduce-scatter per micro-step.
    let table = layout.units[0].padded_len as u64;
    let (ch, cr) = (
        CommPlan::new(&layout, &held, 2),
        CommPlan::new(&layout, &released, 2),
    );
    assert_eq!(
        elems_of(&cr, Collective::AllGather) - elems_of(&ch, Collective::AllGather),
        2 * 2 * table
    );
    assert_eq!(
        elems_of(&cr, Collective::ReduceScatter) - elems_of(&ch, Collective::ReduceScatter),
        2 * table
    );
}

/// Lookups read no parameter in their backward: stage 3's backward gathers each table
/// block only for the layer that reads it (the head's logits), one gather of the table
/// less per micro-step than when the lookups read it, and the gradients reduce as before.
#[test]
fn lookups_are_not_gathered_in_the_backward() {
    let reading = tied_split_spec(65, 16, 3, 8, 20);
    let mut looking_up = reading.clone();
    // Layers first.1.., first look up units 1.., 0: the table's blocks.
    let first = reading
        .layers
        .iter()
        .position(|l| l.name == "first")
        .unwrap();
    for layer in &mut looking_up.layers[..=first] {
        layer.backward_reads_params = false;
    }
    let table: Vec<usize> = (0..=first).collect();
    assert!(first >= 3);
    assert!(looking_up.layers[..=first]
        .iter()
        .all(|l| l.units.len() == 1 && table.contains(&l.units[0])));
    for (world, a, prefetch) in [(2, 1, 1), (3, 2, 0), (4, 1, 3)] {
        let layout = PartitionLayout::new(&reading, world, 4).unwrap();
        let mut inp = inputs(Stage::Zero3, Precision::Bf16, false, true);
        inp.persistence_threshold = 0;
        inp.prefetch = prefetch;
        inp.reuse_distance = 0;
        let before = BufferPlan::new(&reading, &layout, &inp, 0).unwrap();
        let after = BufferPlan::new(&looking_up, &layout, &inp, 0).unwrap();
        simulate(&looking_up, &after);
        let g = after.gather.as_ref().unwrap();
        let in_backward = |p: &BufferPlan, u: usize| {
            let steps = &p.gather.as_ref().unwrap().backward;
            steps.iter().filter(|s| s.gather.contains(&u)).count() as u64
        };
        // Without prefetch merging the lookup's span into the head's, the table was
        // gathered twice in the backward; now once, for the head (none for the block the
        // last layer reads: it stays gathered from the forward).
        let mut fewer = 0;
        for &u in &table {
            let carried = g.carried.contains(&u) as u64;
            let now = in_backward(&after, u);
            assert_eq!(now, 1 - carried, "table unit {u}: the head's read only");
            let was = in_backward(&before, u);
            assert!(
                was == 2 - carried || (was == 1 && prefetch > 1),
                "unit {u}: {was}"
            );
            fewer += (was - now) * layout.units[u].padded_len as u64;
            assert_eq!(after.uses[u], before.uses[u], "gradient uses unchanged");
        }
        if prefetch <= 1 {
            let table_elems: u64 = table
                .iter()
                .map(|&u| layout.units[u].padded_len as u64)
                .sum();
            assert_eq!(fewer, table_elems);
        }
        let (cb, ca) = (
            CommPlan::new(&layout, &before, a),
            CommPlan::new(&layout, &after, a),
        );
        assert_eq!(
            elems_of(&cb, Collective::AllGather) - elems_of(&ca, Collective::AllGather),
            a as u64 * fewer,
            "N={world} A={a}"
        );
        assert_eq!(
            elems_of(&cb, Collective::ReduceScatter),
            elems_of(&ca, Collective::ReduceScatter)
        );
        let lens: Vec<usize> = layout.units.iter().map(|u| u.padded_len).collect();
        assert!(g.slot_elems() >= g.peak_resident(&lens));
    }
}

/// hpZ keeps a node part only of the units the backward gathers: the table blocks read
/// only by lookups and carried into the head's backward, and persistent units, keep none,
/// and the Secondary buffer is exactly Σ E/L over the rest.
#[test]
fn hpz_keeps_parts_only_of_units_gathered_in_the_backward() {
    let mut spec = tied_split_spec(65, 16, 3, 8, 20);
    let first = spec.layers.iter().position(|l| l.name == "first").unwrap();
    for layer in &mut spec.layers[..=first] {
        layer.backward_reads_params = false;
    }
    for (world, l, threshold) in [(4, 2, 0), (6, 3, 0), (4, 4, 200)] {
        let layout = PartitionLayout::new(&spec, world, 4).unwrap();
        let mut inp = inputs(Stage::Zero3, Precision::Bf16, false, true);
        inp.persistence_threshold = threshold;
        inp.hierarchical_weights = true;
        inp.ranks_per_node = l;
        let plan = BufferPlan::new(&spec, &layout, &inp, 0).unwrap();
        let g = plan.gather.as_ref().unwrap();
        let mut elems = 0;
        for (u, unit) in layout.units.iter().enumerate() {
            let gathered = g.backward.iter().any(|s| s.gather.contains(&u));
            assert_eq!(plan.secondary[u].is_some(), gathered, "unit {u}");
            if let Some(at) = &plan.secondary[u] {
                assert_eq!(at.len(), unit.padded_len / l);
                elems += at.len();
            }
            if plan.persistent[u] || g.carried.contains(&u) {
                assert!(plan.secondary[u].is_none(), "unit {u}");
            }
        }
        assert!(
            threshold > 0 || !g.carried.is_empty(),
            "N={world}: none carried"
        );
        assert!(elems > 0);
        assert_eq!(plan.get(BufferRole::Secondary).unwrap().len, elems);
    }
}

#[test]
fn equal_units_need_one_slot_without_prefetch_and_two_with() {
    let spec = chain(&[100, 100, 100, 100]);
    let layout = PartitionLayout::new(&spec, 2, 2).unwrap();
    for (prefetch, slots) in [(0, 1), (1, 2), (3, 4)] {
        let mut inp = inputs(Stage::Zero3, Precision::Fp32, true, true);
        inp.prefetch = prefetch;
        inp.persistence_threshold = 0;
        let plan = BufferPlan::new(&spec, &layout, &inp, 0).unwrap();
        simulate(&spec, &plan);
        assert_eq!(plan.gather.as_ref().unwrap().slots, vec![100; slots]);
    }
}

#[test]
fn paper_worked_example_7_5b_on_64_gpus() {
    // 50 units of 150M parameters: Ψ = 7.5e9, no activations (nothing is allocated).
    let units: Vec<UnitSpec> = (0..50)
        .map(|i| UnitSpec {
            name: format!("h.{i}"),
            params: vec![ParamSpec::new(format!("h.{i}.w"), &[10_000, 15_000])],
        })
        .collect();
    let layers = (0..50)
        .map(|i| LayerSpec::new(format!("h.{i}"), vec![i]))
        .collect();
    let spec = ModelSpec { units, layers };
    assert_eq!(spec.numel(), 7_500_000_000);
    let layout = PartitionLayout::new(&spec, 64, 32).unwrap();
    let paper = [120.0, 31.4, 16.6, 1.9];
    for (stage, want) in Stage::ALL.into_iter().zip(paper) {
        let f = PaperFormula::new(stage, spec.numel(), 64);
        let gb = f.total().to_f64() / 1e9;
        assert_eq!((gb * 10.0).round() / 10.0, want, "{stage}: {gb} GB");
        let mut inp = inputs(stage, Precision::Bf16, false, stage >= Stage::Zero2);
        inp.activation_bytes = 0;
        inp.persistence_threshold = 0;
        inp.bucket_elems = 1 << 24;
        let plan = BufferPlan::new(&spec, &layout, &inp, 63).unwrap();
        let e = Explanation::new(&plan);
        assert_eq!(
            e.explained(),
            Frac::int(plan.total_bytes() as i128) - f.total()
        );
        println!("{}", e.render());
    }
}

/// docs/ARCHITECTURE.md's comm column per step, in units of Ψ (before the (N-1)/N x
/// element size factor), written out here for A = 1 and A = 3 rather than taken from
/// `paper_volume_psi`: stages 0-1 2Ψ; stage 2 (A+1)Ψ reducing every micro-step, else 2Ψ;
/// stage 3 3AΨ reducing every micro-step, else (2A+1)Ψ.
const DESIGN_VOLUME_PSI: [(Stage, bool, usize, usize); 16] = [
    // (stage, reduce_every_micro_step, A, volume / Ψ)
    (Stage::Zero0, true, 1, 2),
    (Stage::Zero0, false, 1, 2),
    (Stage::Zero1, true, 1, 2),
    (Stage::Zero1, false, 1, 2),
    (Stage::Zero2, true, 1, 2),
    (Stage::Zero2, false, 1, 2),
    (Stage::Zero3, true, 1, 3),
    (Stage::Zero3, false, 1, 3),
    (Stage::Zero0, true, 3, 2),
    (Stage::Zero0, false, 3, 2),
    (Stage::Zero1, true, 3, 2),
    (Stage::Zero1, false, 3, 2),
    (Stage::Zero2, true, 3, 4),
    (Stage::Zero2, false, 3, 2),
    (Stage::Zero3, true, 3, 9),
    (Stage::Zero3, false, 3, 7),
];

#[test]
fn paper_volume_is_the_design_table() {
    for (stage, every, a, psi) in DESIGN_VOLUME_PSI {
        assert_eq!(
            paper_volume_psi(stage, a, every),
            psi,
            "{stage:?} A={a} reduce every micro-step {every}"
        );
    }
}

#[test]
fn comm_volume_matches_design_table() {
    let spec = tied_spec(65, 16, 3, 8);
    let mut checked = std::collections::BTreeSet::new();
    for world in [2, 3, 4] {
        let layout = PartitionLayout::new(&spec, world, 4).unwrap();
        let psi_p = layout.padded_numel() as u64;
        for a in [1, 3] {
            for inp in all_inputs() {
                // One dtype on the wire, so the table's single element size applies.
                if inp.reduce_dtype != inp.precision.param_dtype() {
                    continue;
                }
                let mut inp = inp;
                inp.persistence_threshold = 0;
                let plan = BufferPlan::new(&spec, &layout, &inp, 0).unwrap();
                let comm = CommPlan::new(&layout, &plan, a);
                let size = inp.reduce_dtype.size_bytes() as u64;
                let every = inp.reduce_every_micro_step;
                let k = DESIGN_VOLUME_PSI
                    .iter()
                    .find(|&&(st, e, aa, _)| st == inp.stage && e == every && aa == a)
                    .map(|&(_, _, _, psi)| psi as u64)
                    .unwrap_or_else(|| panic!("no design volume for {inp:?} A={a}"));
                checked.insert((inp.stage.number(), every, a));
                // Stage 3 gathers the last layer's units once per micro-step, not twice.
                // The last layer ("last") reads `final` and the table in both passes.
                let carried: u64 = plan.gather.as_ref().map_or(0, |g| {
                    assert_eq!(g.carried.len(), 2, "{inp:?}");
                    g.carried
                        .iter()
                        .map(|&u| layout.units[u].padded_len as u64)
                        .sum()
                });
                let elems = k * psi_p - a as u64 * carried;
                let want = elems * size * (world as u64 - 1) / world as u64;
                assert_eq!(comm.sent_bytes(), want, "N={world} A={a} {inp:?}");
                assert_eq!(
                    comm.control.map(|c| (c.elems, c.dtype)),
                    Some((3, DType::F64))
                );
            }
        }
    }
    // Every row the plans can take (stages 0/1 have no per-micro-step reduction: their
    // `true` rows are `paper_volume_is_the_design_table`'s only) was held to a plan.
    let rows = DESIGN_VOLUME_PSI
        .iter()
        .filter(|&&(st, every, _, _)| st >= Stage::Zero2 || !every)
        .map(|&(st, every, a, _)| (st.number(), every, a))
        .collect::<std::collections::BTreeSet<_>>();
    assert_eq!(checked, rows);
}

#[test]
fn comm_with_f32_reduce_and_persistent_units() {
    let spec = tied_spec(65, 16, 3, 8);
    let layout = PartitionLayout::new(&spec, 4, 4).unwrap();
    let mut inp = inputs(Stage::Zero3, Precision::Bf16, true, true);
    inp.persistence_threshold = 100; // `final` (16 elements) stays gathered
    let plan = BufferPlan::new(&spec, &layout, &inp, 0).unwrap();
    let last_unit = layout.units.len() - 1;
    assert!(plan.persistent[last_unit] && !plan.persistent[0]);
    assert!(plan
        .get(BufferRole::Persistent { unit: last_unit })
        .is_some());
    let comm = CommPlan::new(&layout, &plan, 2);
    let psi_p = layout.padded_numel() as u64;
    let psi_s = layout.units[last_unit].padded_len as u64;
    let rs = comm.sent_bytes_of(Collective::ReduceScatter);
    assert_eq!(rs, 2 * psi_p * 4 * 3 / 4, "A x Ψp in f32");
    let ag = comm.sent_bytes_of(Collective::AllGather);
    // The table is read by the last layer: carried into its backward, gathered 3 times
    // per micro-step, not 4 (the blocks twice, `final` once per step).
    let table = layout.units[0].padded_len as u64;
    assert_eq!(
        plan.gather.as_ref().unwrap().carried,
        vec![0],
        "persistent units are not carried"
    );
    assert_eq!(ag, (2 * (2 * (psi_p - psi_s) - table) + psi_s) * 2 * 3 / 4);
    let t = comm.estimate_seconds(1e-5, 1e9);
    let calls: u64 = comm.lines.iter().map(|l| l.calls * 3).sum();
    assert!((t - (calls as f64 * 1e-5 + comm.sent_bytes() as f64 / 1e9)).abs() < 1e-12);
}

#[test]
fn inconsistent_plan_inputs_are_errors() {
    let spec = chain(&[10, 20]);
    let layout = PartitionLayout::new(&spec, 2, 1).unwrap();
    let e = BufferPlan::new(
        &spec,
        &layout,
        &inputs(Stage::Zero1, Precision::Bf16, false, true),
        0,
    );
    assert!(matches!(
        e,
        Err(PlanError::ReduceEveryNeedsStage2(Stage::Zero1))
    ));
    let mut inp = inputs(Stage::Zero2, Precision::Bf16, false, true);
    inp.reduce_dtype = DType::F16;
    let e = BufferPlan::new(&spec, &layout, &inp, 0).unwrap_err();
    assert!(e.to_string().contains("f16"), "{e}");
    let e = BufferPlan::new(
        &spec,
        &layout,
        &inputs(Stage::Zero2, Precision::Bf16, false, true),
        2,
    )
    .unwrap_err();
    assert!(e.to_string().contains("rank 2"), "{e}");
    let other = chain(&[10, 21]);
    let e = BufferPlan::new(
        &other,
        &layout,
        &inputs(Stage::Zero2, Precision::Bf16, false, true),
        0,
    )
    .unwrap_err();
    assert!(matches!(e, PlanError::SpecMismatch { .. }), "{e}");
    let mut inp = inputs(Stage::Zero2, Precision::Bf16, false, true);
    inp.bucket_elems = 0;
    assert!(matches!(
        BufferPlan::new(&spec, &layout, &inp, 0),
        Err(PlanError::ZeroBucket)
    ));
}

#[test]
fn frac_arithmetic_is_exact() {
    let a = Frac::new(7, 3);
    let b = Frac::new(2, 6);
    assert_eq!(a + b, Frac::new(8, 3));
    assert_eq!(a - a, Frac::ZERO);
    assert_eq!(Frac::new(3, -6), Frac::new(-1, 2));
    assert_eq!(Frac::new(12, 4).times(2), Frac::int(6));
    assert_eq!(human_bytes(1.875e9), "1.88 GB");
}

/// Stage 3 saves memory at every shape, one dominated by a tied table included (50257
/// rows, six blocks, width 384: the table is 64% of Ψ). With buckets sized by the memory
/// budget (`ZeroConfig::bucket_elems_for`) rather than by the largest unit, and the table
/// in row blocks no wider than a block (as the GPT of zero-models splits it), the stage-3
/// plan sits under the stage-0 plan by at least half of the paper's model-state saving
/// (16Ψ - 16Ψ/N) in mixed precision and in fp32 alike. Whole, the table is the widest
/// layer's working set (gathered, and its gradient), which stage 3 needs at once: that
/// saves less in fp32, as the printed numbers show.
#[test]
fn stage_3_saves_at_least_half_the_model_state_saving_on_a_table_heavy_shape() {
    let world = 2;
    let plan = |spec: &ModelSpec, stage: Stage, precision: Precision| {
        let layout = PartitionLayout::new(spec, world, 32).unwrap();
        let mut c = crate::config::EngineConfig::default();
        c.zero.stage = stage;
        c.precision.dtype = precision;
        // The activations are the same at every stage (the model's): leave them out.
        let inputs = PlanInputs::from_config(&c, world, 0);
        BufferPlan::new(spec, &layout, &inputs, 0)
            .unwrap()
            .total_bytes()
    };
    let whole = tied_spec(50257, 256, 6, 384);
    let split = tied_split_spec(50257, 256, 6, 384, 12 * 384 + 13);
    assert_eq!(
        split.units.len(),
        whole.units.len() + 10,
        "eleven row blocks"
    );
    let psi = whole.numel() as u64;
    assert_eq!(split.numel() as u64, psi);
    let saving = 16 * psi - 16 * psi / world as u64;
    for precision in [Precision::Bf16, Precision::Fp32] {
        for (name, spec) in [("whole", &whole), ("split", &split)] {
            let (s0, s3) = (
                plan(spec, Stage::Zero0, precision),
                plan(spec, Stage::Zero3, precision),
            );
            eprintln!(
                "{precision:?}, table {name}: stage 0 {} vs stage 3 {} per rank: saves {} of \
                 the model states' {}",
                human_bytes(s0 as f64),
                human_bytes(s3 as f64),
                human_bytes(s0 as f64 - s3 as f64),
                human_bytes(saving as f64)
            );
            assert!(s3 < s0, "{precision:?}, {name}: stage 3 must hold less");
            if name == "split" {
                assert!(
                    s0 - s3 >= saving / 2,
                    "{precision:?}: saves {} of {saving}",
                    s0 - s3
                );
            }
        }
    }
}

/// The gradient lines of `CommPlan::new` (which counts chunks arithmetically) against
/// the same traffic summed over the chunk ranges themselves, on shapes whose shards end
/// in a short chunk and on ones that do not, with and without qgZ, on one node and two.
#[test]
fn chunk_counts_equal_the_built_chunks() {
    let mut checked = [0usize; 2];
    for (spec, align) in [
        (tied_spec(65, 16, 3, 8), 4),
        (chain(&[1000, 37, 4096, 5]), 1),
    ] {
        for (world, rpn) in [(2, 1), (4, 1), (4, 2), (3, 3)] {
            let layout = PartitionLayout::new(&spec, world, align).unwrap();
            for bucket_elems in [world, 7 * world, 1000, 1 << 20] {
                for quant in [None, Some(16)] {
                    for bits in [8, 4] {
                        for mut inp in all_inputs() {
                            inp.bucket_elems = bucket_elems;
                            inp.ranks_per_node = rpn;
                            inp.grad_quant_block = quant;
                            inp.grad_quant_bits = bits;
                            let Ok(plan) = BufferPlan::new(&spec, &layout, &inp, 0) else {
                                continue;
                            };
                            let a = 3;
                            let comm = CommPlan::new(&layout, &plan, a);
                            let grads: Vec<_> = comm
                                .lines
                                .iter()
                                .filter(|l| l.purpose == CommPurpose::Grads)
                                .map(|l| (l.collective, l.group, l.calls, l.elems))
                                .collect();
                            let want = reference_grad_lines(&layout, &plan, a as u64);
                            assert_eq!(grads, want, "N={world} L={rpn} {inp:?}");
                            checked[usize::from(quant.is_some())] += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked[0] > 100 && checked[1] > 100, "{checked:?}");
}

/// The gradient traffic of a step, chunk range by chunk range (`shard_chunks`,
/// `full_chunks`): what `CommPlan::new` computed before it counted them.
fn reference_grad_lines(
    layout: &PartitionLayout,
    plan: &BufferPlan,
    a: u64,
) -> Vec<(Collective, Group, u64, u64)> {
    use crate::plan::grad_code_bytes;
    use zero_kernels::quant::scale_count;
    let inp = &plan.inputs;
    let (w, g) = (inp.reduce_dtype, inp.grad_dtype);
    let times = |u: usize| -> u64 {
        if plan.grads_sharded {
            plan.uses[u].len().max(1) as u64 * a
        } else {
            1
        }
    };
    let mut out = Vec::new();
    if inp.stage == Stage::Zero0 {
        let calls = layout
            .units
            .iter()
            .map(|u| {
                if w == g {
                    1
                } else {
                    plan.full_chunks(u.padded_len).len() as u64
                }
            })
            .sum();
        out.push((
            Collective::AllReduce,
            Group::World,
            calls,
            layout.padded_numel() as u64,
        ));
        return out;
    }
    let (mut calls, mut elems) = (0, 0);
    let (l, m) = (
        inp.ranks_per_node.max(1),
        layout.world / inp.ranks_per_node.max(1),
    );
    let (mut inside, mut across) = ([0u64; 2], [0u64; 2]);
    for (u, unit) in layout.units.iter().enumerate() {
        let chunks = plan.shard_chunks(unit.shard_len);
        calls += times(u) * chunks.len() as u64;
        elems += times(u) * unit.padded_len as u64;
        if let Some(block) = inp.grad_quant_block {
            for c in chunks {
                let (c, t, bits) = (c.len(), times(u), inp.grad_quant_bits);
                inside[0] += t * (l * grad_code_bytes(m * c, bits)) as u64;
                inside[1] += t * (l * scale_count(m * c, block)) as u64;
                across[0] += t * (m * grad_code_bytes(c, bits)) as u64;
                across[1] += t * (m * scale_count(c, block)) as u64;
            }
        }
    }
    if inp.grad_quant_block.is_none() {
        out.push((Collective::ReduceScatter, Group::World, calls, elems));
        return out;
    }
    for (group, ranks, [codes, scales]) in [(Group::Node, l, inside), (Group::Cross, m, across)] {
        if ranks > 1 {
            out.push((Collective::AllToAll, group, calls, codes));
            out.push((Collective::AllToAll, group, calls, scales));
        }
    }
    out.retain(|x| x.3 > 0);
    out
}

/// Stage 3, A = 1024, 65536 ranks, 70B fp32 parameters: the bytes of a line pass u64 in
/// `elems x size x (N-1)` though not in the result; each line is that product over N,
/// computed here in f64, and the sums saturate instead of wrapping.
#[test]
fn huge_plans_count_their_bytes_without_overflow() {
    let units: Vec<UnitSpec> = (0..80)
        .map(|i| UnitSpec {
            name: format!("h.{i}"),
            params: vec![ParamSpec::new(format!("h.{i}.w"), &[25_000, 35_000])],
        })
        .collect();
    let layers = (0..80)
        .map(|i| LayerSpec::new(format!("h.{i}"), vec![i]))
        .collect();
    let spec = ModelSpec { units, layers };
    assert_eq!(spec.numel(), 70_000_000_000);
    let world = 65_536;
    let layout = PartitionLayout::new(&spec, world, 32).unwrap();
    let mut inp = inputs(Stage::Zero3, Precision::Fp32, true, true);
    inp.activation_bytes = 0;
    inp.persistence_threshold = 0;
    inp.bucket_elems = 1 << 24;
    inp.grad_accum = 1024;
    let plan = BufferPlan::new(&spec, &layout, &inp, 0).unwrap();
    let comm = CommPlan::new(&layout, &plan, 1024);
    let mut overflowing = 0;
    for l in &comm.lines {
        let g = comm.group_size(l.group) as f64;
        let per = (l.dtype.size_bytes()
            * if l.collective == Collective::AllReduce {
                2
            } else {
                1
            }) as f64;
        let product = l.elems as f64 * per * (g - 1.0);
        overflowing += usize::from(product > u64::MAX as f64);
        let want = product / g;
        assert!(
            (l.sent_bytes as f64 - want).abs() <= want * 1e-12,
            "{l:?}: want {want}"
        );
    }
    assert!(overflowing > 0, "the case must pass u64 in the product");
    let sum: f64 = comm.lines.iter().map(|l| l.sent_bytes as f64).sum();
    assert!((comm.sent_bytes() as f64 - sum).abs() <= sum * 1e-12);
    // Beyond u64 in the result: saturated, never wrapped.
    assert_eq!(super::comm::ring_bytes(u64::MAX as u128, 8, 2), u64::MAX);
    assert_eq!(super::comm::ring_bytes(u128::MAX, 1, u64::MAX), u64::MAX);
    assert_eq!(super::comm::ring_bytes(10, 4, 0), 0);
    assert_eq!(super::comm::ring_bytes(10, 4, 4), 30);
    assert_eq!(node_egress(2, u64::MAX as usize, 1, 2), u64::MAX);
}

/// audit36 #2: Ψ = 1e15 (`plan --params`' maximum), N = 1024, stage 2 reducing every
/// micro-step. A x padded Ψ passes u64 at A = 20000 (2e19 elements); the counts are exact
/// below 2^64 and saturated above, never wrapped, so a larger A never prints less.
#[test]
fn comm_counts_past_u64_saturate_instead_of_wrapping() {
    let units: Vec<UnitSpec> = (0..1000)
        .map(|i| UnitSpec {
            name: format!("h.{i}"),
            params: vec![ParamSpec::new(format!("h.{i}.w"), &[1_000_000, 1_000_000])],
        })
        .collect();
    let layers = (0..1000)
        .map(|i| LayerSpec::new(format!("h.{i}"), vec![i]))
        .collect();
    let spec = ModelSpec { units, layers };
    assert_eq!(spec.numel(), 1_000_000_000_000_000);
    let world = 1024;
    let layout = PartitionLayout::new(&spec, world, 32).unwrap();
    let psi_p = layout.padded_numel() as u128;
    let exact = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
    let mut last = 0;
    for a in [1, 9000, 18000, 20000, 100_000] {
        let mut inp = inputs(Stage::Zero2, Precision::Bf16, false, true);
        inp.activation_bytes = 0;
        inp.persistence_threshold = 0;
        inp.bucket_elems = 1 << 24;
        inp.grad_accum = a;
        let plan = BufferPlan::new(&spec, &layout, &inp, 0).unwrap();
        let comm = CommPlan::new(&layout, &plan, a);
        let rs = comm
            .lines
            .iter()
            .find(|l| l.collective == Collective::ReduceScatter)
            .unwrap();
        let elems = a as u128 * psi_p;
        let bytes = elems * 2 * (world as u128 - 1) / world as u128;
        assert_eq!(rs.elems, exact(elems), "A = {a}");
        assert_eq!(rs.sent_bytes, exact(bytes), "A = {a}");
        match a {
            // Exact: 1.8e19 elements fit u64, 9000 x Ψ x 2 bytes x 1023/1024 too.
            9000 => assert!(bytes < u64::MAX as u128),
            18000 => assert!(elems < u64::MAX as u128),
            20000 => assert_eq!(rs.elems, u64::MAX),
            _ => {}
        }
        // The after-step gather: Ψp of bf16, once a step whatever A.
        let ag = comm
            .lines
            .iter()
            .find(|l| l.collective == Collective::AllGather)
            .unwrap();
        assert_eq!(ag.elems as u128, psi_p);
        let total = comm.sent_bytes();
        assert_eq!(total, exact(bytes + ag.sent_bytes as u128), "A = {a}");
        assert!(total >= last, "A = {a}: {total} < {last}");
        last = total;
        assert!(comm.estimate_seconds(1e-6, 1e9).is_finite());
    }
}
