//! Every collective and dtype against serial answers, accounting, half sums, overlap,
//! node-local communicator and splits: real mpirun at 1, 2, 3, 4 and 5 ranks.

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

/// Five ranks: the first size where a ring reduce-scatter (`zero-comm/src/mpi/ring.rs`)
/// receives into a partial block it sent the step before (the self-test's block of 16Ki
/// elements and more goes round the ring past 2 ranks).
#[test]
fn collectives_5_ranks() {
    run(5);
}

/// Non-blocking reduce-scatters through MPI's own `MPI_Ireduce_scatter_block` rather than
/// the ring: the same answers.
#[test]
fn collectives_3_ranks_without_the_ring() {
    job(3).env("ZERO_COMM_RING", "0").run().assert_all_ok();
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
