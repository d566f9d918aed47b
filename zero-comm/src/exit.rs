//! Ending the process: `rank R: <message>` on stderr in one write, then the whole job down
//! (MPI_Abort when MPI is up, else a plain exit). Apart from `init.rs` so that a build
//! without MPI (the carried GPU build) keeps the same exits.

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
