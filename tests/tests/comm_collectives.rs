//! Every collective and dtype against serial answers, accounting, half sums, overlap,
//! node-local communicator and splits: real mpirun at 1, 2, 3 and 4 ranks.

use std::time::Duration;
use zero_tests::MpiJob;

fn job(ranks: usize) -> MpiJob {
    MpiJob::new(ranks, env!("CARGO_BIN_EXE_comm_collectives")).timeout(Duration::from_secs(120))
}

fn run(ranks: usize) {
    job(ranks).run().assert_all_ok();
}

#[test]
fn collectives_1_rank() {
    run(1);
}

#[test]
fn collectives_2_ranks() {
    run(2);
}

#[test]
fn collectives_3_ranks() {
    run(3);
}

#[test]
fn collectives_4_ranks() {
    run(4);
}

/// The consistency check and the watchdog on a correct program: no false alarms, same
/// answers (the check's own exchange is not in the accounting figures).
#[test]
fn collectives_3_ranks_with_check_and_watchdog() {
    job(3)
        .env("ZERO_COMM_CHECK", "1")
        .env("ZERO_COMM_TIMEOUT", "60")
        .run()
        .assert_all_ok();
}
