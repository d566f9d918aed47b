//! Failure behaviour under real mpirun: a panicking rank aborts the job naming itself; the
//! consistency check names both ranks of a mismatch; the watchdog aborts a hung collective
//! naming it; MPI errors come back as typed errors. Each job is killed after 50 s at most
//! (the launcher's timeout, below the 60 s the hung ranks sleep), so a regression shows up
//! as a failed test, not a hung one.

use std::time::Duration;
use zero_comm::{PANIC_EXIT_CODE, WATCHDOG_EXIT_CODE};
use zero_tests::MpiJob;

fn job(ranks: usize, mode: &str) -> MpiJob {
    MpiJob::new(ranks, env!("CARGO_BIN_EXE_comm_failures"))
        .args([mode])
        .timeout(Duration::from_secs(50))
}

/// ZERO_COMM_TIMEOUT of the watchdog tests: well above the moments a rank of an
/// oversubscribed machine (two tests' ranks on 2 cores) can lose, so that every waiting
/// rank is inside the collective when the first one times out and asks, and well below
/// the 60 s the hung ranks sleep.
const WATCHDOG_TIMEOUT: &str = "8";

/// A job under the watchdog of [`WATCHDOG_TIMEOUT`].
fn watched_job(ranks: usize, mode: &str) -> MpiJob {
    job(ranks, mode).env("ZERO_COMM_TIMEOUT", WATCHDOG_TIMEOUT)
}

/// This machine's name, as the heartbeat reports name the ranks' hosts.
fn hostname() -> String {
    let out = std::process::Command::new("hostname")
        .output()
        .expect("hostname runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn panicking_rank_aborts_the_job_and_is_named() {
    for ranks in [2, 3] {
        let out = job(ranks, "panic").run();
        out.assert_failed_by_itself();
        // mpirun passes the aborting rank's code on (README: 101 for a panicking rank).
        assert_eq!(out.code, Some(PANIC_EXIT_CODE), "{}", out.transcript());
        let text = out.all_text();
        let who = format!("rank {}: deliberate panic in comm_failures", ranks - 1);
        assert!(
            text.contains(&who),
            "expected '{who}'\n{}",
            out.transcript()
        );
    }
}

#[test]
fn consistency_check_names_both_ranks() {
    for ranks in [2, 4] {
        let out = job(ranks, "mismatch").env("ZERO_COMM_CHECK", "1").run();
        out.assert_all_ok();
        let text = out.all_text();
        for r in 0..ranks {
            let line = format!("rank {r}: collective mismatch on 'world' at call #0: rank 0 issued #0 all_reduce(sum) of 12 x f32 but rank 1 issued #0 all_reduce(sum) of 10 x f32");
            assert!(
                text.contains(&line),
                "missing '{line}'\n{}",
                out.transcript()
            );
        }
        assert!(
            text.contains("rank 1 issued #1 broadcast of 12 x f32 from root 0"),
            "{}",
            out.transcript()
        );
    }
}

#[test]
fn watchdog_aborts_a_hung_collective() {
    let ranks = 3;
    let out = watched_job(ranks, "hang").run();
    out.assert_failed_by_itself();
    assert_eq!(out.code, Some(WATCHDOG_EXIT_CODE), "{}", out.transcript());
    let text = out.all_text();
    // Rank 0 sleeps outside any collective; the others wait in all_reduce #0. Rank 1, the
    // lowest waiting, fires and reports; rank 2 may fire too, or see the job aborted first.
    let host = hostname();
    for needle in [
        "rank 1: watchdog: all_reduce #0 on 'world' (1000 x f32) has not finished".to_string(),
        "rank 1: watchdog: 2 of 3 ranks wait in all_reduce #0 on 'world'; behind".to_string(),
        format!("rank 0 on {host} (pid "),
        "last completed nothing yet on 'world', now outside any collective".to_string(),
    ] {
        assert!(
            text.contains(&needle),
            "missing '{needle}'\n{}",
            out.transcript()
        );
    }
    assert!(
        !text.contains("rank 2: watchdog: 2 of 3"),
        "only the lowest waiting rank reports\n{}",
        out.transcript()
    );
}

/// The same for a host-staged collective of device buffers (issue 14): the watchdog
/// covers the MPI call between the staging copies.
#[test]
fn watchdog_aborts_a_hung_staged_collective() {
    let ranks = 2;
    let out = watched_job(ranks, "hang-staged").run();
    out.assert_failed_by_itself();
    assert_eq!(out.code, Some(WATCHDOG_EXIT_CODE), "{}", out.transcript());
    let line = "rank 1: watchdog: reduce_scatter #0 on 'world' (1000 x f32) has not finished";
    assert!(
        out.all_text().contains(line),
        "missing '{line}'\n{}",
        out.transcript()
    );
}

/// A rank stopped with SIGSTOP and a rank computing outside any collective: the ranks
/// that time out ask everyone over the heartbeat side channel, and the lowest of them
/// names the two ranks behind, with their hosts: one with what it last completed (a
/// non-blocking all-reduce it found done by a test, never waited on), the stopped one as
/// not answering. Ranks 0 and 1 enter the collective at different moments
/// and rank 1 may time out first: it leaves the report to rank 0 all the same.
#[test]
fn watchdog_names_the_ranks_behind_a_stopped_one_included() {
    let ranks = 4;
    let out = watched_job(ranks, "stopped").run();
    out.assert_failed_by_itself();
    assert_eq!(out.code, Some(WATCHDOG_EXIT_CODE), "{}", out.transcript());
    let text = out.all_text();
    let host = hostname();
    for needle in [
        "rank 0: watchdog: 2 of 4 ranks wait in all_reduce #2 on 'world'; behind".to_string(),
        format!("rank 2 on {host} (pid "),
        "last completed all_reduce #1 on 'world', now outside any collective".to_string(),
        format!("rank 3 on {host}: no answer within 2 s"),
    ] {
        assert!(
            text.contains(&needle),
            "missing '{needle}'\n{}",
            out.transcript()
        );
    }
    assert!(
        !text.contains("rank 1: watchdog: 2 of 4"),
        "only the lowest waiting rank reports\n{}",
        out.transcript()
    );
}

#[test]
fn watchdog_watches_non_blocking_collectives_while_waited_on() {
    let ranks = 2;
    let out = watched_job(ranks, "hang-nonblocking").run();
    out.assert_failed_by_itself();
    assert_eq!(out.code, Some(WATCHDOG_EXIT_CODE), "{}", out.transcript());
    let text = out.all_text();
    let line = "rank 1: watchdog: all_gather #0 on 'world' (998 x f32) has not finished";
    let fired = text.find(line);
    let waiting = text.find("rank 1: now waiting");
    assert!(fired.is_some(), "missing '{line}'\n{}", out.transcript());
    // Fired after the compute (longer than the timeout) ended, not during it.
    assert!(
        waiting.is_some() && waiting < fired,
        "watchdog fired before the wait\n{}",
        out.transcript()
    );
}

#[test]
fn mpi_errors_are_typed_and_carry_the_rank() {
    let out = job(2, "mpi-error").run();
    out.assert_all_ok();
    let text = out.all_text();
    for r in 0..2 {
        // The collective is named (kind, number, count, dtype) before MPI's call.
        let line = format!(
            "caught: rank {r}: broadcast #0 (1000 x f32): MPI_Bcast on communicator 'world' failed with MPI error"
        );
        assert!(
            text.contains(&line),
            "missing '{line}'\n{}",
            out.transcript()
        );
    }
}

/// A library user's `main` under `zero_comm::mpi_main`: one rank's error ends the job at
/// once (the others sat in an all-reduce) and is printed naming the rank; an error every
/// rank returns at the same point ends each rank normally, with exit code 1 and no abort.
#[test]
fn mpi_main_aborts_on_one_ranks_error_and_finalizes_on_an_agreed_one() {
    let out = job(3, "rank-error").run();
    out.assert_failed_by_itself();
    assert_eq!(out.code, Some(1), "{}", out.transcript());
    assert!(
        out.all_text()
            .contains("rank 2: deliberate error on the last rank"),
        "{}",
        out.transcript()
    );
    assert!(
        !out.all_text().contains("watchdog"),
        "ended by the watchdog, not by mpi_main\n{}",
        out.transcript()
    );
    let out = job(3, "agreed-error").run();
    out.assert_failed_by_itself();
    assert_eq!(out.code, Some(1), "{}", out.transcript());
    for r in 0..3 {
        let line = format!("rank {r}: deliberate error on every rank (sum 3)");
        assert!(
            out.all_text().contains(&line),
            "{line}\n{}",
            out.transcript()
        );
    }
    assert!(
        !out.all_text().contains("MPI_ABORT"),
        "aborted instead of finalizing\n{}",
        out.transcript()
    );
}
