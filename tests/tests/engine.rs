//! The ZeRO engine under real mpirun: every stage computes the same step, the ledgers are
//! exact, mixed precision tracks fp32, an fp16 overflow skips the step everywhere.
//! The checks themselves live in the scenario binary `engine_stages`.

use std::time::Duration;
use zero_tests::MpiJob;

fn stages(ranks: usize, mode: &str) {
    let out = MpiJob::new(ranks, env!("CARGO_BIN_EXE_engine_stages"))
        .args([mode])
        .timeout(Duration::from_secs(120))
        .run();
    out.assert_all_ok();
    // Rank 0's comparison lines, for the test log.
    println!("{}", out.stdout);
}

#[test]
fn fp32_stages_agree_on_2_ranks_bitwise() {
    stages(2, "fp32");
}

#[test]
fn fp32_stages_agree_on_4_ranks() {
    stages(4, "fp32");
}

#[test]
fn fp32_stages_agree_on_3_ranks() {
    stages(3, "fp32");
}

#[test]
fn mixed_precision_tracks_fp32_and_overflow_skips_on_2_ranks() {
    stages(2, "mixed");
}

#[test]
fn mixed_precision_tracks_fp32_and_overflow_skips_on_4_ranks() {
    stages(4, "mixed");
}
