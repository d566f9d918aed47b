//! SIGTERM and SIGUSR1 stop a run cleanly: the handler only records the signal; after
//! each step every rank says what it received and all agree (one all-reduce of one
//! number), so all ranks stop after the same step, save a checkpoint together and exit
//! with [`super::launch::PREEMPTED_EXIT_CODE`]. They agree once more before the first
//! step: SIGTERM or SIGINT during the set-up (loading, planning, allocating) ends the
//! run there, with nothing trained and nothing to save; SIGUSR1, a warning ahead of
//! the time limit, still lets it run its first step and save it (with a short limit,
//! each requeued job then makes progress). Slurm sends SIGTERM at the time limit
//! and on `scancel` (SIGKILL follows after KillWait, 30 s by default) and SIGUSR1 where
//! the job asks (`#SBATCH --signal=USR1@120`); mpirun forwards SIGUSR1 to every rank.
//! SIGINT (Ctrl-C on a run started without a launcher; mpirun turns its own into SIGTERM
//! for the ranks) does the same, saying so at once, but exits 130 and leaves no stop
//! marker, so a job script does not requeue it; a second SIGINT ends the process there
//! and then. A SIGINT ignored when the process started (a background job of a
//! script) stays ignored.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

use anyhow::Context;
use zero_comm::{Communicator, ReduceOp};

/// The stopping signal received (0: none); of several, the highest number, so that
/// SIGTERM (15) and SIGUSR1 (10), a scheduler's, win over SIGINT (2), a user's.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// SIGINTs received (the second one ends the process at once).
static INTERRUPTS: AtomicU32 = AtomicU32::new(0);

/// Whether a run has reached its steps (the first SIGINT's message says where it stops);
/// false again while the next run of `--stages` sets up.
static STEPPING: AtomicBool = AtomicBool::new(false);

/// The signals that stop a run after its current step (or before its first).
const STOPPING: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGUSR1, libc::SIGINT];

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe only: atomics, errno, write(2), signal(2), raise(3).
    RECEIVED.fetch_max(sig, Ordering::SeqCst);
    if sig != libc::SIGINT {
        return;
    }
    let again = INTERRUPTS.fetch_add(1, Ordering::SeqCst) > 0;
    let text: &[u8] = if again {
        b"\nSIGINT again: stopping now, without a checkpoint\n"
    } else if STEPPING.load(Ordering::SeqCst) {
        b"\nSIGINT: stopping after this step (with --ckpt-dir, after saving a checkpoint); Ctrl-C again stops at once\n"
    } else {
        b"\nSIGINT: stopping before the first step, once the set-up is done; Ctrl-C again stops at once\n"
    };
    // SAFETY: errno is this thread's (saved and restored, so the interrupted code's
    // reading of it is unchanged); write(2) of a static buffer to stderr; signal(2) and
    // raise(3) are async-signal-safe, and restore the default action before re-raising.
    unsafe {
        let errno = *libc::__errno_location();
        libc::write(2, text.as_ptr() as *const libc::c_void, text.len());
        if again {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::raise(libc::SIGINT);
        }
        *libc::__errno_location() = errno;
    }
}

/// The exit status of a run stopped by `sig` (after saving, or before its first step):
/// 85 for the scheduler's signals (a job script requeues on it), 130 (128 + 2) for
/// SIGINT, the user's (no requeue: the user asked to stop).
pub fn exit_code(sig: i32) -> i32 {
    if sig == libc::SIGINT {
        128 + libc::SIGINT
    } else {
        super::launch::PREEMPTED_EXIT_CODE
    }
}

/// Install the handlers (once, at start: a signal that arrives during set-up is kept and
/// acted on before the first step, or SIGUSR1 after it: [`stops_set_up`], `run.rs`).
pub fn install() -> anyhow::Result<()> {
    for sig in STOPPING {
        if sig == libc::SIGINT && ignored(sig) {
            continue;
        }
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler
        // is an extern "C" fn that only does async-signal-safe calls.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("installing the handler of {}", name(sig)));
        }
    }
    Ok(())
}

/// Whether `sig` is ignored (SIG_IGN) now.
fn ignored(sig: libc::c_int) -> bool {
    // SAFETY: sigaction(2) with no new action only reads the current one into a local.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// From here on a stop waits for the step under way (the first SIGINT says so).
pub fn stepping() {
    STEPPING.store(true, Ordering::SeqCst);
}

/// A run (of several, with `--stages`) starts its set-up: a stop comes before its first
/// step.
pub fn setting_up() {
    STEPPING.store(false, Ordering::SeqCst);
}

/// Whether a stop signal received during the set-up ends the run before its first
/// step: SIGTERM (the time limit, scancel) and SIGINT (the user) do; SIGUSR1 is the
/// scheduler's warning ahead of the limit (`#SBATCH --signal=USR1@120`), with time
/// left for a step and its checkpoint.
pub fn stops_set_up(sig: i32) -> bool {
    sig != libc::SIGUSR1
}

/// Whether any rank received a stopping signal, agreed on every rank (the signal's
/// number). Collective: one all-reduce of one f64.
pub fn agreed<C: Communicator>(comm: &C) -> anyhow::Result<Option<i32>> {
    let mut got = [RECEIVED.load(Ordering::SeqCst) as f64];
    comm.all_reduce(&mut got[..], ReduceOp::Max)
        .context("agreeing on a stop signal")?;
    Ok((got[0] > 0.0).then_some(got[0] as i32))
}

/// "SIGTERM", "SIGUSR1", or the number.
pub fn name(sig: i32) -> String {
    match sig {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        libc::SIGINT => "SIGINT".into(),
        other => format!("signal {other}"),
    }
}
