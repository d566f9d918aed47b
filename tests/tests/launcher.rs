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

/// Processes whose command line is exactly `words`.
fn running(words: &[&str]) -> Vec<String> {
    let want: Vec<u8> = words
        .iter()
        .flat_map(|w| [w.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn timeout_kills_a_hung_job_and_every_rank() {
    // An odd duration, to tell this job's ranks from any other sleep.
    let job = ["sleep", "613"];
    let out = MpiJob::new(2, job[0])
        .args([job[1]])
        .timeout(Duration::from_secs(3))
        .run();
    assert!(out.timed_out, "{}", out.transcript());
    // Open MPI puts each rank in a process group of its own: killing mpirun's group
    // alone would leave them running. SIGKILL is delivered before kill(2) returns, but
    // a killed process leaves /proc only once reaped; allow that a moment.
    let mut left = running(&job);
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        left = running(&job);
    }
    assert!(left.is_empty(), "ranks left running: pids {left:?}");
}
