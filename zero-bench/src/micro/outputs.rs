//! The files a benchmark writes at its end (`--csv`, `--json`), checked before it runs:
//! a path that cannot be written would otherwise fail only after the measurement,
//! losing it (and, under mpirun, as an abort of the whole job). They are written with
//! [`crate::outfile::write_text`], whole, through a temporary file beside the target
//! renamed over it; the check makes and removes that very temporary file.

use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::outfile::{parent, same_target};

/// Check each `(flag, path)` an output is to be written to, in order: not a directory,
/// its directory takes the temporary file it is written through, and no two outputs
/// share a file. A pipe, a terminal or `/dev/stdout` passes (written as it is).
pub(crate) fn check(outputs: &[(&str, &Path)]) -> anyhow::Result<()> {
    let mut targets: Vec<(&str, PathBuf)> = Vec::new();
    for &(flag, path) in outputs {
        let Some(target) = writable(flag, path)? else {
            continue;
        };
        if let Some((other, _)) = targets.iter().find(|(_, t)| same_target(t, &target)) {
            bail!(
                "{flag} and {other} are both {}: give each output its own file",
                path.display()
            );
        }
        targets.push((flag, target));
    }
    Ok(())
}

/// Under mpirun: rank 0, which writes the outputs, checks them ([`check`]), and every
/// rank learns the verdict (train's rule, `crate::train::launch::agree`), so that every
/// rank stops at the same point. Collective. On a failure, call [`exit`].
#[cfg(feature = "mpi")]
pub(crate) fn check_on_rank_0<C: zero_comm::Communicator>(
    comm: &C,
    outputs: &[(&str, Option<&Path>)],
) -> Result<(), crate::train::launch::Failure> {
    let given: Vec<(&str, &Path)> = outputs
        .iter()
        .filter_map(|&(flag, p)| Some((flag, p?)))
        .collect();
    let mine = match comm.rank() {
        0 => check(&given),
        _ => Ok(()),
    };
    crate::train::launch::agree(comm, mine)
}

/// End the process after an agreed failure: the rank that says it prints the error,
/// then `mpi` (the communicator, then the MPI context, in that order) is dropped, which
/// finalizes MPI (every rank is at this point: MPI_Finalize returns), and the process
/// exits with the failure's status.
#[cfg(feature = "mpi")]
pub(crate) fn exit<M>(f: crate::train::launch::Failure, mpi: M) -> ! {
    if f.print {
        zero_comm::line_to_stderr(&format!("error: {}", crate::logging::chain(&f.error)));
    }
    drop(mpi);
    std::process::exit(f.code)
}

/// The file `write_text` replaces at `path` (`None` for a pipe, a terminal, a device,
/// written through as they are), once its directory has taken the temporary file.
fn writable(flag: &str, path: &Path) -> anyhow::Result<Option<PathBuf>> {
    if path.as_os_str().is_empty() {
        bail!("{flag} is empty: give a file path");
    }
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        return Ok(None);
    }
    let target =
        zero_core::files::replace_target(path).map_err(|e| anyhow::anyhow!("{flag} {e}"))?;
    let probe = zero_core::files::partial_path(&target);
    let made = std::fs::File::create(&probe).and_then(|f| {
        drop(f);
        std::fs::remove_file(&probe)
    });
    if let Err(e) = made {
        bail!(
            "{flag} {}: cannot write a file in {} ({e}); give a path in an existing directory you can write (checked before the benchmark runs, so that its result is not lost at its end)",
            path.display(),
            parent(&target).display()
        );
    }
    Ok(Some(target))
}

#[cfg(test)]
mod tests {
    use super::check;
    use std::path::Path;

    #[test]
    fn outputs_are_checked_before_the_benchmark_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // A directory as the file.
        let err = check(&[("--csv", d)]).unwrap_err().to_string();
        assert!(
            err.starts_with("--csv") && err.contains("is a directory"),
            "{err}"
        );
        // A directory that does not exist.
        let missing = d.join("absent").join("t.json");
        let err = check(&[("--json", &missing)]).unwrap_err().to_string();
        assert!(
            err.starts_with("--json") && err.contains("absent") && err.contains("cannot write"),
            "{err}"
        );
        // Two outputs on one file, spelled two ways.
        let a = d.join("t.csv");
        let b = d.join(".").join("t.csv");
        let err = check(&[("--csv", &a), ("--json", &b)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--json and --csv"), "{err}");
        // Good paths, an existing file and a device pass; nothing is left behind.
        std::fs::write(&a, "old").unwrap();
        check(&[("--csv", &a), ("--json", &d.join("t.json"))]).unwrap();
        check(&[("--json", Path::new("/dev/null"))]).unwrap();
        let names = zero_core::files::entry_names(d).unwrap();
        assert_eq!(names, ["t.csv"]);
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "old");
        let err = check(&[("--csv", Path::new(""))]).unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");
    }
}
