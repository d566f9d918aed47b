//! The rule for errors every rank sees alike (where `train` runs: `crate::world`): they
//! are printed once (by rank 0, with each failing rank's own message) and every rank exits with the
//! same code without a backtrace, instead of N copies of the message or a hung
//! collective.

use anyhow::anyhow;
use zero_comm::Communicator;

/// Exit status of a run stopped by SIGTERM or SIGUSR1 (Slurm's time limit warning,
/// `scancel`, preemption) after it saved a checkpoint to resume from: a job script
/// requeues or resubmits itself on it (slurm/train.sbatch).
pub const PREEMPTED_EXIT_CODE: i32 = 85;

/// Why a command failed, who says so, and the exit status.
pub struct Failure {
    /// The error (with context).
    pub error: anyhow::Error,
    /// Whether this rank prints it: exactly one rank does.
    pub print: bool,
    /// The process's exit status (1, or [`PREEMPTED_EXIT_CODE`]).
    pub code: i32,
}

impl Failure {
    /// An error every rank computed identically (a pure function of the command line and
    /// the config file, or agreed on): rank 0 prints it, exit status 1.
    pub fn same_everywhere(error: anyhow::Error, rank: usize) -> Failure {
        Failure {
            error,
            print: rank == 0,
            code: 1,
        }
    }
}

/// Agree across ranks on a set-up step that may fail on some ranks only (a file missing
/// on one node): every rank learns each failing rank's own message, rank 0 prints them
/// (one line per rank, or once when every failing rank says the same), and every rank
/// returns a failure. Collective: every rank must call it at the same point.
pub fn agree<T, C: Communicator>(comm: &C, result: anyhow::Result<T>) -> Result<T, Failure> {
    let rank = comm.rank();
    let mine = result.as_ref().err().map(crate::logging::chain);
    let failures = match zero_comm::gather_failures(comm, mine.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            // Cannot agree (ranks at different points, a broken transport): report here
            // and end the whole job. Returning would finalize MPI, which waits for the
            // ranks that are elsewhere, forever.
            let error = match result {
                Err(mine) => format!(
                    "{}; and agreeing on it failed: {e}",
                    crate::logging::chain(&mine)
                ),
                Ok(_) => format!("agreeing on set-up failed: {e}"),
            };
            zero_comm::abort(&format!("error: {error}"), 1)
        }
    };
    match result {
        Ok(v) if failures.is_empty() => Ok(v),
        Err(e) if comm.size() == 1 => Err(Failure {
            error: e,
            print: true,
            code: 1,
        }),
        _ => Err(Failure {
            error: anyhow!(describe_failures(&failures, comm.size())),
            print: rank == 0,
            code: 1,
        }),
    }
}

/// "rank 2: why" per failing rank, or the one message when every failing rank gave it.
fn describe_failures(failures: &[(usize, String)], world: usize) -> String {
    let all_same = failures.iter().all(|(_, m)| *m == failures[0].1);
    match failures {
        [(_, m), ..] if all_same && failures.len() == world => m.clone(),
        [(only, m)] => format!("rank {only} of {world}: {m}"),
        [(_, m), ..] if all_same => {
            format!("{m} (on {} of {world} ranks)", failures.len())
        }
        _ => {
            // At most 16 lines: on 512 ranks the first few say what the rest would.
            const SHOWN: usize = 16;
            let mut lines: Vec<String> = failures
                .iter()
                .take(SHOWN)
                .map(|(r, m)| format!("  rank {r}: {m}"))
                .collect();
            if failures.len() > SHOWN {
                lines.push(format!("  ... and {} more", failures.len() - SHOWN));
            }
            format!(
                "{} of {world} ranks failed:\n{}",
                failures.len(),
                lines.join("\n")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::describe_failures;

    #[test]
    fn failures_are_described_once_when_alike_and_per_rank_otherwise() {
        let same = |ranks: &[usize]| -> Vec<(usize, String)> {
            ranks
                .iter()
                .map(|&r| (r, "disk full".to_string()))
                .collect()
        };
        assert_eq!(describe_failures(&same(&[0, 1]), 2), "disk full");
        assert_eq!(describe_failures(&same(&[3]), 4), "rank 3 of 4: disk full");
        assert_eq!(
            describe_failures(&same(&[1, 2]), 4),
            "disk full (on 2 of 4 ranks)"
        );
        let mixed = vec![(0, "a".to_string()), (2, "b".to_string())];
        assert_eq!(
            describe_failures(&mixed, 4),
            "2 of 4 ranks failed:\n  rank 0: a\n  rank 2: b"
        );
        let many: Vec<(usize, String)> = (0..20).map(|r| (r, format!("m{r}"))).collect();
        let text = describe_failures(&many, 20);
        assert!(text.ends_with("  ... and 4 more"), "{text}");
        assert_eq!(text.lines().count(), 18);
    }
}
