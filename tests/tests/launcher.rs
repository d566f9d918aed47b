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
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    // An odd duration, to tell this job's ranks from any other sleep. The timeout is
    // generous: mpirun may take seconds to start the ranks on a loaded machine, and they
    // must be running when it fires, or the test proves nothing.
    let job = MpiJob::new(2, "sleep")
        .args(["613"])
        .timeout(Duration::from_secs(30));
    let is_rank = |cmdline: &str| cmdline == "sleep\x00613\x00";
    // The watcher looks for the ranks for as long as the job runs (no deadline of its own
    // to race the job's timeout).
    let job_over = Arc::new(AtomicBool::new(false));
    let watcher = std::thread::spawn({
        let job_over = Arc::clone(&job_over);
        move || {
            while !job_over.load(Ordering::Acquire) {
                if zero_tests::running(is_rank).len() == 2 {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        }
    });
    let out = job.run();
    job_over.store(true, Ordering::Release);
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
