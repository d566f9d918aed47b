//! SIGTERM and SIGUSR1 stop a run cleanly: the handler only records the signal; after
//! each step every rank says what it received and all agree (one all-reduce of one
//! number), so all ranks stop after the same step, save a checkpoint together and exit
//! with [`super::launch::PREEMPTED_EXIT_CODE`]. Slurm sends SIGTERM at the time limit
//! and on `scancel` (SIGKILL follows after KillWait, 30 s by default) and SIGUSR1 where
//! the job asks (`#SBATCH --signal=USR1@120`); mpirun forwards SIGUSR1 to every rank.

use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::Context;
use zero_comm::{Communicator, ReduceOp};

/// The last stopping signal received (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// The signals that stop a run after its current step.
const STOPPING: [libc::c_int; 2] = [libc::SIGTERM, libc::SIGUSR1];

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe: one atomic store.
    RECEIVED.store(sig, Ordering::SeqCst);
}

/// Install the handlers (once, at start: a signal that arrives during set-up is kept and
/// acted on after the first step).
pub fn install() -> anyhow::Result<()> {
    for sig in STOPPING {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler
        // is an extern "C" fn that only does an atomic store.
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
        other => format!("signal {other}"),
    }
}
