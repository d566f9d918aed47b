//! Thread ranks (LocalComm) account their collectives exactly as the MPI backend does:
//! the same check as the `comm_collectives` MPI scenario, at 1-4 ranks. And the GPT with
//! its token table in row blocks trains at every stage on thread ranks.

use zero_core::config::{Precision, Stage};
use zero_tests::scenario::{corpus, tiny_config, tiny_gpt, train_model_losses};

#[test]
fn local_comm_accounting_matches_the_ring_formulas() {
    for n in 1..=4 {
        let results = zero_comm::run_local(n, Default::default(), |comm| {
            zero_tests::accounting::check_accounting(&comm)
        });
        for (r, res) in results.into_iter().enumerate() {
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("N={n} rank {r}: {e}"),
                Err(p) => panic!("N={n} rank {r} panicked: {p:?}"),
            }
        }
    }
}

/// The tiny GPT with its 64-row table in blocks of 20, 20, 20 and 4 rows (four units; the
/// lookups and the head split per block) trains on 2 and 3 thread ranks at every stage,
/// A = 1 and 2: every stage gives stage 0's losses bit for bit (thread ranks add in rank
/// order, and at this size every unit stays within the reuse distance), and the losses
/// are the unsplit model's to f32 rounding (the head's input gradient is summed block by
/// block, so the weights differ in their last bits after the first step).
#[test]
fn a_table_in_row_blocks_trains_at_every_stage_as_the_whole_table() {
    let tokens = corpus().unwrap();
    let whole = tiny_gpt(32);
    let split = zero_models::GptConfig {
        vocab_block_rows: Some(20),
        ..whole
    };
    assert_eq!(split.vocab_blocks().len(), 4);
    for (ranks, accum) in [(2, 1), (3, 1), (2, 2)] {
        let run = |gpt, stage| {
            let cfg = tiny_config(stage, Precision::Fp32, 2, accum, 4);
            let out = zero_comm::run_local(ranks, Default::default(), |comm| {
                train_model_losses(&comm, gpt, &cfg, &tokens)
            });
            out.into_iter().next().unwrap().unwrap().unwrap()
        };
        let reference = run(whole, Stage::Zero0);
        let base = run(split, Stage::Zero0);
        for (a, b) in reference.iter().zip(&base) {
            // f32 rounding of one weight's update (~1e-7 relative) over 4 steps: 1e-5.
            assert!(
                (a - b).abs() <= 1e-5 * a.abs(),
                "N={ranks} A={accum}: whole {a} vs split {b}"
            );
        }
        for stage in [Stage::Zero1, Stage::Zero2, Stage::Zero3] {
            let got = run(split, stage);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            if accum == 1 {
                assert_eq!(
                    bits(&got),
                    bits(&base),
                    "N={ranks} {stage:?}: {got:?} vs {base:?}"
                );
            } else {
                // Accumulated micro-steps reduce per micro-step at stages 2/3 (a sum in
                // another order than stage 0's): 1e-6 relative, as the mpirun tests hold.
                for (a, b) in got.iter().zip(&base) {
                    assert!(
                        (a - b).abs() <= 1e-6 * b.abs(),
                        "N={ranks} A=2 {stage:?}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// `llama-tiny` (GQA: 4 query heads on 2 key/value heads) on the built-in corpus trains
/// on 2 thread ranks at every stage with stage 0's losses bit for bit, as the GPT's
/// mpirun test holds them (two addends sum the same in any order), fp32 and bf16; and so
/// does it with its tables in row blocks of 20 rows (four units each).
#[test]
fn llama_trains_at_every_stage_with_equal_losses_on_2_ranks() {
    let tokens = corpus().unwrap();
    let whole = zero_models::LlamaConfig::preset("llama-tiny").unwrap();
    let split = zero_models::LlamaConfig {
        vocab_block_rows: Some(20),
        ..whole
    };
    let cases = [
        (whole, Precision::Fp32),
        (whole, Precision::Bf16),
        (split, Precision::Fp32),
    ];
    for (llama, precision) in cases {
        let run = |stage| {
            let cfg = tiny_config(stage, precision, 2, 1, 4);
            let out = zero_comm::run_local(2, Default::default(), |comm| {
                zero_tests::scenario::train_llama_losses(&comm, llama, &cfg, &tokens)
            });
            out.into_iter().next().unwrap().unwrap().unwrap()
        };
        let base = run(Stage::Zero0);
        assert!(
            base.iter().all(|l| l.is_finite()) && base[3] < base[0],
            "{precision:?}: losses {base:?} do not fall"
        );
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for stage in [Stage::Zero1, Stage::Zero2, Stage::Zero3] {
            let got = run(stage);
            assert_eq!(
                bits(&got),
                bits(&base),
                "{precision:?} {stage:?}: {got:?} vs {base:?}"
            );
        }
    }
}

/// An f32 gradient accumulator in bf16 training (`precision.grad_accum_dtype = "f32"`,
/// A = 2) on 2 thread ranks, on the simulated GPU, which checks CUDA's stream rules on
/// every op: the new path's hand-overs (the model writing straight into the f32
/// accumulator, 16-bit parameters widened beside it) are ordered at every stage, on
/// every rank. Stage 1 gives stage 0's losses bit for bit (the same sums). Stages 2/3
/// reduce every micro-step, in bf16 here (the default `grad_reduce_dtype`), so each
/// micro-step's gradient is rounded in the bucket and the sums add in another order:
/// their losses stay within 1e-4 of stage 0's over 4 steps (a lost or doubled
/// contribution moves them by ~1e-2).
#[test]
fn an_f32_gradient_accumulator_trains_every_stage_on_the_simulated_gpu() {
    let tokens = corpus().unwrap();
    let run = |stage| {
        let mut cfg = tiny_config(stage, Precision::Bf16, 2, 2, 4);
        cfg.engine.precision.grad_accum_dtype = Some(zero_core::config::GradDtype::F32);
        let out = zero_comm::run_local(2, Default::default(), |comm| {
            zero_tests::scenario::train_losses_sim_gpu(&comm, &cfg, &tokens, 7)
        });
        let mut ranks: Vec<Vec<f64>> = out
            .into_iter()
            .enumerate()
            .map(|(r, o)| match o {
                Ok(Ok(losses)) => losses,
                Ok(Err(e)) => panic!("{stage:?} rank {r}: {e}"),
                Err(p) => panic!("{stage:?} rank {r} panicked: {p:?}"),
            })
            .collect();
        assert_eq!(ranks.len(), 2, "{stage:?}");
        assert!(ranks.iter().all(|l| l.len() == 4), "{stage:?}: {ranks:?}");
        ranks.swap_remove(0)
    };
    let base = run(Stage::Zero0);
    assert!(
        base.iter().all(|l| l.is_finite()) && base[3] < base[0],
        "losses {base:?} do not fall"
    );
    for stage in [Stage::Zero1, Stage::Zero2, Stage::Zero3] {
        let got = run(stage);
        for (s, (g, want)) in got.iter().zip(&base).enumerate() {
            let rel = (g - want).abs() / want.abs();
            let tol = if stage == Stage::Zero1 { 0.0 } else { 1e-4 };
            assert!(rel <= tol, "{stage:?} step {s}: {g} vs stage 0's {want}");
        }
    }
}
