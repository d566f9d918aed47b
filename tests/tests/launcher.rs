//! The launcher itself: a real mpirun job that runs `true` on every rank, and one that
//! hangs, which the timeout must kill, ranks included.

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
fn timeout_kills_a_hung_job_and_every_rank() {
    // An odd duration, to tell this job's ranks from any other sleep.
    let job = MpiJob::new(2, "sleep")
        .args(["613"])
        .timeout(Duration::from_secs(10));
    let is_rank = |cmdline: &str| cmdline == "sleep\x00613\x00";
    // The ranks must be running when the timeout fires, or the test proves nothing.
    let watcher = std::thread::spawn(move || {
        for _ in 0..1000 {
            if zero_tests::running(is_rank).len() == 2 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    });
    let out = job.run();
    assert!(out.timed_out, "{}", out.transcript());
    assert!(
        watcher.join().unwrap_or(false),
        "the 2 ranks never ran\n{}",
        out.transcript()
    );
    // Open MPI puts each rank in a process group of its own: killing mpirun's group
    // alone would leave them running.
    let left = zero_tests::wait_until_none_running(is_rank);
    assert!(left.is_empty(), "ranks left running: pids {left:?}");
}
