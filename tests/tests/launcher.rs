//! The launcher itself: a real mpirun job that runs `true` on every rank, and one that
//! hangs, which the timeout must kill.

use std::time::Duration;
use zero_tests::MpiJob;

#[test]
fn mpirun_starts_and_exits_cleanly() {
    let out = MpiJob::new(2, "true")
        .timeout(Duration::from_secs(30))
        .run();
    assert!(!out.timed_out, "{}", out.transcript());
    assert_eq!(out.code, Some(0), "{}", out.transcript());
}

#[test]
fn timeout_kills_a_hung_job() {
    let out = MpiJob::new(2, "sleep")
        .args(["600"])
        .timeout(Duration::from_secs(3))
        .run();
    assert!(out.timed_out, "{}", out.transcript());
    assert!(
        out.elapsed < Duration::from_secs(20),
        "{}",
        out.transcript()
    );
}
