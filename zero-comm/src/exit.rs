//! Ending the process: `rank R: <message>` on stderr in one write, then the whole job down
//! (MPI_Abort when MPI is up, else a plain exit). Apart from `init.rs` so that a build
//! without MPI (the carried GPU build) keeps the same exits. [`Deadline`] bounds a call
//! that cannot time out itself (`ncclCommInitRank`) by ending the job after a limit.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Exit code of a job aborted by a panicking rank.
pub const PANIC_EXIT_CODE: i32 = 101;

/// This process's rank in MPI_COMM_WORLD once MPI is up (`usize::MAX` before).
pub(crate) static WORLD_RANK: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Print `rank R: <message>` on stderr and abort every rank of the job.
pub fn abort(message: &str, code: i32) -> ! {
    let r = WORLD_RANK.load(Ordering::Relaxed);
    if r == usize::MAX {
        line_to_stderr(message);
    } else {
        line_to_stderr(&format!("rank {r}: {message}"));
    }
    abort_world(code)
}

/// Write `line` and a newline to stderr in one `write`, so that mpirun, which merges the
/// ranks' streams, never interleaves two ranks' messages inside a line (`eprintln!` may
/// issue one write per formatted piece).
pub fn line_to_stderr(line: &str) {
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    let _ = std::io::stderr().lock().write_all(buf.as_bytes());
}

/// MPI_Abort on MPI_COMM_WORLD (or a plain exit when MPI is not running, or not built in).
pub(crate) fn abort_world(code: i32) -> ! {
    let _ = std::io::stderr().flush();
    let _ = std::io::stdout().flush();
    #[cfg(feature = "mpi")]
    crate::mpi::abort_if_running(code);
    // SAFETY: _exit ends the process without running destructors (which could block in
    // MPI); nothing of ours needs to run.
    unsafe { libc::_exit(code) }
}

/// This machine's host name (`gethostname`), or "unknown".
pub(crate) fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates within it
    // or truncates, and we stop at the first NUL.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The rank the launcher gave this process, and the variable it came from (the first of
/// [`crate::socket::RANK_VARS`] that holds a number): all there is before MPI_Init.
pub(crate) fn launcher_rank() -> Option<(&'static str, usize)> {
    crate::socket::RANK_VARS
        .iter()
        .find_map(|&name| Some((name, std::env::var(name).ok()?.trim().parse().ok()?)))
}

/// `rank 3 (OMPI_COMM_WORLD_RANK) on host n2`, or `pid 42 on host n2` without a launcher
/// rank: who says a line before MPI (and `WORLD_RANK`) is up, so that one bad node among
/// hundreds can be found.
pub(crate) fn describe_process(rank: Option<(&str, usize)>, host: &str, pid: u32) -> String {
    match rank {
        Some((var, r)) => format!("rank {r} ({var}) on host {host}"),
        None => format!("pid {pid} on host {host} (no launcher rank variable set)"),
    }
}

/// [`describe_process`] of this process.
pub(crate) fn this_process() -> String {
    describe_process(launcher_rank(), &host_name(), std::process::id())
}

/// A call that must return within a time limit: a thread runs `on_expiry` unless the guard
/// is dropped first. For calls that block in a library with no timeout of their own
/// (`ncclCommInitRank`, which waits forever for a rank that never comes).
#[cfg_attr(not(any(feature = "nccl", feature = "mpi")), allow(dead_code))]
pub(crate) struct Deadline {
    /// Dropping it wakes the thread, which then returns.
    disarm: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg_attr(not(any(feature = "nccl", feature = "mpi")), allow(dead_code))]
impl Deadline {
    /// Start the clock: `on_expiry` runs on a thread named `name` after `limit`, unless the
    /// guard is dropped before.
    pub(crate) fn start(
        name: String,
        limit: std::time::Duration,
        on_expiry: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Deadline> {
        let (disarm, expired) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            // No message is ever sent: the guard's drop disconnects, which ends the wait.
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = expired.recv_timeout(limit) {
                on_expiry();
            }
        })?;
        Ok(Deadline {
            disarm: Some(disarm),
            thread: Some(thread),
        })
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        // Disconnecting wakes the thread at once.
        drop(self.disarm.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether dropping `guard` returns within `bound`: a disarmed [`Deadline`] wakes its
/// thread at once, where one that is not would keep the drop waiting until its limit. A
/// drop that does not return is left to run on its thread.
#[cfg(test)]
pub(crate) fn dropped_within<T: Send + 'static>(guard: T, bound: std::time::Duration) -> bool {
    let (done, dropped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(guard);
        let _ = done.send(());
    });
    dropped.recv_timeout(bound).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn a_process_is_named_by_its_launcher_rank_and_host() {
        assert_eq!(
            describe_process(Some(("OMPI_COMM_WORLD_RANK", 3)), "n2", 42),
            "rank 3 (OMPI_COMM_WORLD_RANK) on host n2"
        );
        let anonymous = describe_process(None, "n2", 42);
        assert!(anonymous.contains("pid 42 on host n2"), "{anonymous}");
    }

    #[test]
    fn a_deadline_fires_only_when_the_call_outlives_it() {
        let fired = Arc::new(AtomicBool::new(false));
        let f = Arc::clone(&fired);
        // A limit no test run reaches: only disarming can end the thread.
        let guard = Deadline::start("t".into(), Duration::from_secs(3600), move || {
            f.store(true, Ordering::SeqCst)
        })
        .unwrap();
        assert!(
            dropped_within(guard, Duration::from_secs(60)),
            "disarming wakes it"
        );
        assert!(!fired.load(Ordering::SeqCst));
        let f = Arc::clone(&fired);
        let guard = Deadline::start("t".into(), Duration::from_millis(20), move || {
            f.store(true, Ordering::SeqCst)
        })
        .unwrap();
        // Polled, not slept on: a loaded machine may run the thread late.
        let give_up = Instant::now() + Duration::from_secs(60);
        while !fired.load(Ordering::SeqCst) && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            fired.load(Ordering::SeqCst),
            "a call that outlives its limit"
        );
        drop(guard);
    }
}

/// Running a test's body in a child process, for what ends the process (a deadline or
/// the watchdog firing): the test re-runs itself, only itself, with [`child::MARK`] set.
/// (Used by the MPI build's tests.)
#[cfg(all(test, feature = "mpi"))]
pub(crate) mod child {
    use std::process::{Command, Output};

    /// Set in the child's environment.
    pub(crate) const MARK: &str = "ZERO_COMM_TEST_CHILD";

    /// Whether this process is the child of [`run`].
    pub(crate) fn is_child() -> bool {
        std::env::var_os(MARK).is_some()
    }

    /// Run the test `name` (its full path, e.g. `exit::tests::x`) alone in a child
    /// process with `env` added and the launcher's rank variables removed.
    pub(crate) fn run(name: &str, env: &[(&str, &str)]) -> Output {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut cmd = Command::new(exe);
        cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(MARK, "1");
        for var in crate::socket::RANK_VARS {
            cmd.env_remove(var);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("the child test runs")
    }
}
