//! Engine set-up across ranks and state import, on thread ranks (LocalComm):
//!
//! - `Engine::new` agrees on every rank's set-up and on a fingerprint of its model spec
//!   and configuration before the first gather: ranks built differently all get
//!   `Mismatch`, a rank whose set-up fails gets its own error and the others `PeerSetup`
//!   (or `Mismatch`, when its configuration differs too), and every rank leaves at the
//!   same collective: a follow-up all-reduce finds them in step (LocalComm compares every
//!   collective's sequence number and shape across ranks, and a watchdog timeout turns a
//!   hang into a failure).
//! - An import without a successful `finish_import` leaves the engine part old, part
//!   new: steps and exports refuse it until every unit is imported again and finished,
//!   after which it trains the bits of a fresh engine; `finish_import` refuses an import
//!   that left units out (naming them), on every rank alike.
//! - The bf16 matrix-product mode is the device's; each step sets its engine's.

mod common;

use std::time::Duration;

use common::models::char_lm::{CharLm, TokenBatch};
use common::{config, lm_config};
use zero_comm::{CommConfig, Communicator, LocalComm, NodeGroups, ReduceOp};
use zero_core::{Engine, EngineConfig, EngineError, LossScaler, Precision, Stage};
use zero_kernels::device::HostDevice;

/// A hang fails the test instead of holding it.
fn watched() -> CommConfig {
    CommConfig {
        timeout: Some(Duration::from_secs(120)),
        ..CommConfig::default()
    }
}

/// What `Engine::new` returned on a rank, as (kind, message), with the outcome of an
/// all-reduce every rank makes after it: the ranks' sum when they left set-up in step.
type Outcome = ((&'static str, String), Result<f64, String>);

fn kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::Mismatch(_) => "mismatch",
        EngineError::PeerSetup => "peer",
        EngineError::Config(_) => "config",
        EngineError::ImportPending => "pending",
        _ => "other",
    }
}

/// Build an engine on this rank and report how set-up ended, then check the ranks are
/// at the same collective.
fn set_up(
    comm: &LocalComm,
    nodes: Option<&NodeGroups<LocalComm>>,
    c: &EngineConfig,
    lm: &CharLm<HostDevice>,
    dev: &HostDevice,
) -> Outcome {
    let built = match nodes {
        Some(g) => Engine::on_nodes(c, comm, g, dev, lm).map(|_| ()),
        None => Engine::new(c, comm, dev, lm).map(|_| ()),
    };
    let outcome = match built {
        Ok(()) => ("ok", String::new()),
        Err(e) => (kind(&e), e.to_string()),
    };
    let mut marker = [1.0f64; 3];
    let after = comm
        .all_reduce(&mut marker[..], ReduceOp::Sum)
        .map(|()| marker[0])
        .map_err(|e| e.to_string());
    (outcome, after)
}

fn outcomes(results: Vec<Result<Outcome, zero_comm::RankPanic>>) -> Vec<Outcome> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|p| panic!("{p}")))
        .collect()
}

/// How rank 1's configuration differs.
type Change = fn(&mut EngineConfig);

const SAME: &str = "every rank must build the engine (Engine::new, Engine::on_nodes) with the same ModelSpec and the same EngineConfig";

#[test]
fn ranks_built_with_different_configurations_or_models_all_get_mismatch() {
    let n = 3;
    let base = config(Stage::Zero2, Precision::Bf16, 1);
    let differ: [(&str, Change); 4] = [
        ("lr", |c| c.optim.lr *= 2.0),
        ("betas", |c| c.optim.betas[1] = 0.999),
        ("stage", |c| c.zero.stage = Stage::Zero3),
        ("grad_accum", |c| c.grad_accum = 2),
    ];
    // Rank 1 alone differs: ranks 0 and 2 agree with each other, not with it.
    for (what, change) in differ {
        let results = zero_comm::run_local(n, watched(), |comm| {
            let dev = HostDevice::new();
            let lm = CharLm::new(&dev, lm_config()).unwrap();
            let mut c = base.clone();
            if comm.rank() == 1 {
                change(&mut c);
            }
            set_up(&comm, None, &c, &lm, &dev)
        });
        let all = outcomes(results);
        for (rank, ((k, msg), after)) in all.iter().enumerate() {
            assert_eq!(*k, "mismatch", "{what}, rank {rank}: {msg}");
            assert!(msg.contains(SAME), "{what}, rank {rank}: {msg}");
            assert_eq!(msg, &all[0].0 .1, "{what}: the same error on every rank");
            assert_eq!(after, &Ok(n as f64), "{what}, rank {rank}: in step after");
        }
    }
    // Another model on rank 1 (one block more), the configuration the same.
    let results = zero_comm::run_local(n, watched(), |comm| {
        let dev = HostDevice::new();
        let mut shape = lm_config();
        if comm.rank() == 1 {
            shape.blocks += 1;
        }
        let lm = CharLm::new(&dev, shape).unwrap();
        set_up(&comm, None, &base, &lm, &dev)
    });
    for (rank, ((k, msg), after)) in outcomes(results).into_iter().enumerate() {
        assert_eq!(k, "mismatch", "spec, rank {rank}: {msg}");
        assert!(msg.contains(SAME), "spec, rank {rank}: {msg}");
        assert_eq!(after, Ok(n as f64), "spec, rank {rank}");
    }
    // The same on every rank: built, and in step.
    let results = zero_comm::run_local(n, watched(), |comm| {
        let dev = HostDevice::new();
        let lm = CharLm::new(&dev, lm_config()).unwrap();
        set_up(&comm, None, &base, &lm, &dev)
    });
    for ((k, msg), after) in outcomes(results) {
        assert_eq!((k, after), ("ok", Ok(n as f64)), "{msg}");
    }
}

/// Errors that used to return before the set-up collective (and so left the other ranks
/// waiting in it) now come out of the agreement: the failing rank returns its own error,
/// the others `Mismatch` when its configuration differs, else `PeerSetup`.
#[test]
fn a_rank_whose_set_up_fails_stops_every_rank_before_the_first_gather() {
    // An invalid configuration on rank 1 only (grad_accum = 0).
    let base = config(Stage::Zero1, Precision::Fp32, 1);
    let results = zero_comm::run_local(2, watched(), |comm| {
        let dev = HostDevice::new();
        let lm = CharLm::new(&dev, lm_config()).unwrap();
        let mut c = base.clone();
        if comm.rank() == 1 {
            c.grad_accum = 0;
        }
        set_up(&comm, None, &c, &lm, &dev)
    });
    let all = outcomes(results);
    let ((k0, m0), after0) = &all[0];
    let ((k1, m1), after1) = &all[1];
    assert_eq!(*k1, "config", "{m1}");
    assert!(m1.contains("grad_accum"), "{m1}");
    assert_eq!(*k0, "mismatch", "{m0}");
    assert!(m0.contains(SAME), "{m0}");
    assert_eq!((after0, after1), (&Ok(2.0), &Ok(2.0)));

    // Node groups wrong on rank 1 only (its node and cross groups swapped), the
    // configuration and model the same everywhere: rank 1's own error, `PeerSetup` on
    // every other rank.
    let mut c = config(Stage::Zero3, Precision::Bf16, 1);
    c.zero.hierarchical_weights = true;
    let results = zero_comm::run_local_on_nodes(4, 2, watched(), |comm, groups| {
        let dev = HostDevice::new();
        let lm = CharLm::new(&dev, lm_config()).unwrap();
        let groups = if comm.rank() == 1 {
            NodeGroups {
                node: groups.cross,
                cross: groups.node,
            }
        } else {
            groups
        };
        set_up(&comm, Some(&groups), &c, &lm, &dev)
    })
    .unwrap();
    for (rank, ((k, msg), after)) in outcomes(results).into_iter().enumerate() {
        if rank == 1 {
            assert_eq!(k, "mismatch", "{msg}");
            assert!(msg.contains("the node groups are"), "{msg}");
        } else {
            assert_eq!(k, "peer", "rank {rank}: {msg}");
            assert!(
                msg.contains("another rank could not set its engine up"),
                "{msg}"
            );
        }
        assert_eq!(after, Ok(4.0), "rank {rank}");
    }

    // Node groups missing on rank 0 only, where the configuration needs them.
    let results = zero_comm::run_local_on_nodes(4, 2, watched(), |comm, groups| {
        let dev = HostDevice::new();
        let lm = CharLm::new(&dev, lm_config()).unwrap();
        let groups = (comm.rank() != 0).then_some(&groups);
        set_up(&comm, groups, &c, &lm, &dev)
    })
    .unwrap();
    for (rank, ((k, msg), after)) in outcomes(results).into_iter().enumerate() {
        let want = if rank == 0 {
            "Engine::on_nodes"
        } else {
            "another rank"
        };
        assert!(msg.contains(want), "rank {rank}: {k}: {msg}");
        assert_eq!(after, Ok(4.0), "rank {rank}");
    }
}

/// Import without finish, then the way out: `step`, `export_unit` and the gathered
/// views refuse a part-imported engine (a failed `finish_import` does not end that);
/// importing every unit again and finishing makes it whole, and it then trains the bits
/// a fresh engine trains.
#[test]
fn an_import_without_finish_is_refused_until_every_unit_is_imported_and_finished() {
    for (stage, precision) in [
        (Stage::Zero0, Precision::Fp32),
        (Stage::Zero3, Precision::Bf16),
    ] {
        let results = zero_comm::run_local(2, watched(), |comm| {
            let dev = HostDevice::new();
            let mut lm = CharLm::new(&dev, lm_config()).unwrap();
            let c = config(stage, precision, 1);
            let mut engine = Engine::new(&c, &comm, &dev, &lm).unwrap();
            // What a fresh engine holds: its master, m = v = 0, counters 0.
            let initial = engine.full_master_f32().unwrap();
            let units: Vec<(usize, usize)> = (engine.layout().units.iter())
                .map(|u| (u.numel, u.padded_len))
                .collect();
            assert!(!engine.import_pending());

            // One unit imported (nonsense values), nothing finished.
            let r0 = engine.import_range(0).unwrap();
            let junk = vec![0.5f32; r0.len()];
            engine.import_unit(0, &junk, &junk, &junk).unwrap();
            assert!(engine.import_pending());
            let (x, y) = common::lm_batch(0, 0, comm.rank(), 2, 1);
            let b = TokenBatch {
                inputs: &x,
                targets: &y,
                seq_len: common::SEQ,
            };
            let mut refused = vec![
                engine.step(&mut lm, &[b]).map(|_| ()).unwrap_err(),
                engine.export_unit(0).map(|_| ()).unwrap_err(),
                engine.full_master_f32().map(|_| ()).unwrap_err(),
                engine.full_params_f32().map(|_| ()).unwrap_err(),
                engine.master_arrays().map(|_| ()).unwrap_err(),
            ];
            // A finish that fails (counters out of order) leaves it part-imported.
            let scaler = LossScaler::new(&c.precision);
            let bad = engine.finish_import(3, 4, scaler.clone()).unwrap_err();
            assert!(bad.to_string().contains("step 3 and applied 4"), "{bad}");
            assert!(engine.import_pending());
            refused.push(engine.step(&mut lm, &[b]).map(|_| ()).unwrap_err());
            assert_eq!(engine.steps_done(), 0);

            // Every unit again (the fresh state), and a finish that succeeds.
            let mut at = 0;
            for (u, &(numel, padded)) in units.iter().enumerate() {
                let mut whole = vec![0.0f32; padded];
                whole[..numel].copy_from_slice(&initial[at..at + numel]);
                at += numel;
                let keep = engine.import_range(u).unwrap();
                let zeros = vec![0.0f32; keep.len()];
                engine.import_unit(u, &whole[keep], &zeros, &zeros).unwrap();
            }
            engine.finish_import(0, 0, scaler).unwrap();
            assert!(!engine.import_pending());
            let imported = engine.step(&mut lm, &[b]).unwrap().loss;
            let imported_master = engine.full_master_f32().unwrap();

            // A fresh engine on the same batch.
            let mut fresh = Engine::new(&c, &comm, &dev, &lm).unwrap();
            let loss = fresh.step(&mut lm, &[b]).unwrap().loss;
            let fresh_master = fresh.full_master_f32().unwrap();
            let refused: Vec<_> = refused.iter().map(|e| (kind(e), e.to_string())).collect();
            (
                refused,
                [imported.to_bits(), loss.to_bits()],
                imported_master == fresh_master,
            )
        });
        for (rank, r) in results.into_iter().enumerate() {
            let (refused, [imported, fresh], same_master) = r.unwrap();
            let case = format!("{stage} {precision:?}, rank {rank}");
            assert_eq!(refused.len(), 6, "{case}");
            for (k, msg) in &refused {
                assert_eq!(*k, "pending", "{case}: {msg}");
                assert!(
                    msg.contains("without a successful Engine::finish_import")
                        && msg.contains("part old, part new")
                        && msg.contains("import every unit again"),
                    "{case}: {msg}"
                );
            }
            assert_eq!(imported, fresh, "{case}: the loss of a fresh engine");
            assert!(same_master, "{case}: the master of a fresh engine");
        }
    }
}

/// `finish_import` while an import is pending needs every unit imported since it began:
/// `begin_import` then `finish_import` with no unit, or with some, is refused naming the
/// missing units, and the engine stays pending (it used to finish and step with a part-old
/// state). A rank that imported everything while another did not is refused too
/// (`PeerImport`), with no rank left in a gather; every unit imported on every rank
/// finishes.
#[test]
fn finish_import_needs_every_unit_imported_since_the_import_began() {
    let results = zero_comm::run_local(2, watched(), |comm| {
        let dev = HostDevice::new();
        let mut lm = CharLm::new(&dev, lm_config()).unwrap();
        let c = config(Stage::Zero2, Precision::Fp32, 1);
        let mut engine = Engine::new(&c, &comm, &dev, &lm).unwrap();
        let scaler = LossScaler::new(&c.precision);
        let units = engine.layout().units.len();
        let own: Vec<_> = (0..units)
            .map(|u| {
                let r = engine.import_range(u).unwrap();
                engine
                    .export_unit(u)
                    .map(|s| (r, s.master, s.adam_m, s.adam_v))
                    .unwrap()
            })
            .collect();
        // Stages 1-3 export and import the same block: re-import what it holds.
        let import = |engine: &mut Engine<'_, HostDevice, LocalComm>, u: usize| {
            let (r, m, a, v) = &own[u];
            assert_eq!(r.len(), m.len());
            engine.import_unit(u, m, a, v).unwrap();
        };
        let mut seen = Vec::new();
        // Nothing imported.
        engine.begin_import();
        let e = engine.finish_import(0, 0, scaler.clone()).unwrap_err();
        seen.push((kind_of(&e), e.to_string(), engine.import_pending()));
        // Rank 0 all units, rank 1 all but the last.
        engine.begin_import();
        let upto = if comm.rank() == 0 { units } else { units - 1 };
        for u in 0..upto {
            import(&mut engine, u);
        }
        let e = engine.finish_import(0, 0, scaler.clone()).unwrap_err();
        seen.push((kind_of(&e), e.to_string(), engine.import_pending()));
        let (x, y) = common::lm_batch(0, 0, comm.rank(), 2, 1);
        let b = TokenBatch {
            inputs: &x,
            targets: &y,
            seq_len: common::SEQ,
        };
        let refused = engine.step(&mut lm, &[b]).map(drop).unwrap_err();
        seen.push((kind(&refused), refused.to_string(), engine.import_pending()));
        // A new import begun: what the last one imported counts no more.
        engine.begin_import();
        import(&mut engine, units - 1);
        let e = engine.finish_import(0, 0, scaler.clone()).unwrap_err();
        seen.push((kind_of(&e), e.to_string(), engine.import_pending()));
        // Every unit: it finishes and steps.
        for u in 0..units {
            import(&mut engine, u);
        }
        engine.finish_import(0, 0, scaler).unwrap();
        assert!(!engine.import_pending());
        engine.step(&mut lm, &[b]).unwrap();
        (seen, units)
    });
    for (rank, r) in results.into_iter().enumerate() {
        let (seen, units) = r.unwrap();
        let case = |i: usize| format!("rank {rank}, case {i}: {:?}", seen[i]);
        let all = format!("{units} of the model's {units} units were not imported");
        assert_eq!(seen[0].0, "incomplete", "{}", case(0));
        assert!(
            seen[0].1.contains(&all) && seen[0].1.contains("unit 0 '"),
            "{}",
            case(0)
        );
        let last = format!("unit {} '", units - 1);
        if rank == 0 {
            assert_eq!(seen[1].0, "peer", "{}", case(1));
            assert!(
                seen[1].1.contains("rank 1: finish_import: 1 of"),
                "{}",
                case(1)
            );
        } else {
            assert_eq!(seen[1].0, "incomplete", "{}", case(1));
            assert!(
                seen[1].1.contains(&last) && !seen[1].1.contains("unit 0 '"),
                "{}",
                case(1)
            );
        }
        assert_eq!(seen[2].0, "pending", "{}", case(2));
        assert_eq!(seen[3].0, "incomplete", "{}", case(3));
        assert!(
            seen[3].1.contains(&format!("{} of the model's", units - 1))
                && !seen[3].1.contains(&last),
            "{}",
            case(3)
        );
        assert!(
            seen.iter().all(|s| s.2),
            "rank {rank}: stays pending: {seen:?}"
        );
    }
}

fn kind_of(e: &EngineError) -> &'static str {
    match e {
        EngineError::ImportIncomplete { .. } => "incomplete",
        EngineError::PeerImport { .. } => "peer",
        other => kind(other),
    }
}

/// The bf16 matrix-product mode is the device's: an fp32 engine built on the device of
/// a bf16 one turns it off, and each step sets it again, so the bf16 engine still steps
/// the bits it steps alone on its device (and the fp32 one those of its own).
#[test]
fn engines_of_two_precisions_on_one_device_each_step_with_their_own_products() {
    let results = zero_comm::run_local(1, watched(), |comm| {
        let step = |engine: &mut Engine<'_, HostDevice, LocalComm>, lm: &mut CharLm<HostDevice>| {
            let (x, y) = common::lm_batch(0, 0, 0, 1, 1);
            let b = TokenBatch {
                inputs: &x,
                targets: &y,
                seq_len: common::SEQ,
            };
            engine.step(lm, &[b]).unwrap().loss.to_bits()
        };
        let alone = |c: &EngineConfig| {
            let dev = HostDevice::new();
            let mut lm = CharLm::new(&dev, lm_config()).unwrap();
            let mut e = Engine::new(c, &comm, &dev, &lm).unwrap();
            step(&mut e, &mut lm)
        };
        let (c16, c32) = (
            config(Stage::Zero1, Precision::Bf16, 1),
            config(Stage::Zero1, Precision::Fp32, 1),
        );
        let dev = HostDevice::new();
        let mut lm = CharLm::new(&dev, lm_config()).unwrap();
        let mut e16 = Engine::new(&c16, &comm, &dev, &lm).unwrap();
        let mut e32 = Engine::new(&c32, &comm, &dev, &lm).unwrap();
        let shared16 = step(&mut e16, &mut lm);
        let shared32 = step(&mut e32, &mut lm);
        ([alone(&c16), alone(&c32)], [shared16, shared32])
    });
    let (alone, shared) = results.into_iter().next().unwrap().unwrap();
    assert_eq!(
        shared, alone,
        "bf16 and fp32 losses beside each other, and alone"
    );
}
