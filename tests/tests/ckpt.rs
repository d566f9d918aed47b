//! Sharded checkpoints under real mpirun: exact resume at every stage, resharding to
//! other world sizes and stages, a rank killed mid-save, corrupted and foreign input.
//! The checks live in the scenario binary `ckpt_scenario`; each test gets its own
//! directory under the target dir's tmp.

use std::path::PathBuf;
use std::time::Duration;
use zero_tests::MpiJob;

const BIN: &str = env!("CARGO_BIN_EXE_ckpt_scenario");

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ckpt-{name}"));
    // A leftover from an earlier run would change what the test sees.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

fn job(ranks: usize, args: &[&str]) -> zero_tests::JobOutput {
    MpiJob::new(ranks, BIN)
        .args(args.iter().copied())
        .timeout(Duration::from_secs(120))
        .run()
}

fn ok(ranks: usize, args: &[&str]) {
    let out = job(ranks, args);
    out.assert_all_ok();
    println!("{}", out.stdout);
}

#[test]
fn resume_is_bitwise_exact_at_every_stage_on_2_ranks() {
    let d = scratch("resume2");
    ok(2, &["resume", d.to_str().unwrap()]);
}

#[test]
fn resume_is_bitwise_exact_at_every_stage_on_3_ranks() {
    let d = scratch("resume3");
    ok(3, &["resume", d.to_str().unwrap()]);
}

#[test]
fn saved_on_4_ranks_stage_1_loads_on_3_ranks_stage_3_and_2_ranks_stage_0() {
    let d = scratch("reshard");
    let p = d.to_str().unwrap();
    // Global batch 12 rows in every job: 4 x 3, 3 x 4, 2 x 6.
    ok(4, &["save", p, "1", "3"]);
    // A new process on the same N and stage: bitwise (checked in the scenario).
    ok(4, &["continue", p, "1", "3"]);
    ok(3, &["continue", p, "3", "4"]);
    ok(2, &["continue", p, "0", "6"]);
    ok(1, &["continue", p, "2", "12"]);
}

#[test]
fn saved_on_2_ranks_stage_3_loads_on_3_ranks_stage_1_and_4_ranks_stage_2() {
    let d = scratch("reshard-up");
    let p = d.to_str().unwrap();
    // Global batch 12 rows in every job: 2 x 6, 3 x 4, 4 x 3.
    ok(2, &["save", p, "3", "6"]);
    ok(3, &["continue", p, "1", "4"]);
    ok(4, &["continue", p, "2", "3"]);
}

#[test]
fn a_rank_killed_mid_save_leaves_the_previous_checkpoint_intact() {
    let d = scratch("crash");
    let p = d.to_str().unwrap();
    let out = job(2, &["crash", p]);
    out.assert_failed_by_itself();
    assert!(
        out.all_text().contains("SIGKILL in the middle of the save"),
        "the kill hook did not run:\n{}",
        out.transcript()
    );
    ok(2, &["after-crash", p]);
}

#[test]
fn bad_input_is_refused_with_the_file_and_dataset_named() {
    let d = scratch("faults");
    ok(2, &["faults", d.to_str().unwrap()]);
}
