//! Outputs written whole: under a temporary name beside the target, then renamed over it.
//! [`replace_target`] says what that target is, so that a rename never replaces what the
//! user named with something else.

use std::path::{Path, PathBuf};

/// The names of what `dir` holds, sorted: what a caller checks for leftovers (no
/// temporary file after a whole write, no partial step after a failed save).
pub fn entry_names(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<Vec<String>>>()?;
    names.sort();
    Ok(names)
}

/// Why an output cannot be written whole at a path.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The path is a directory.
    #[error("'{0}' is a directory; give a file path")]
    Directory(PathBuf),
    /// The path is a device, a FIFO or a socket.
    #[error("'{0}' is not a regular file (a device, a FIFO or a socket), and this output is written to a temporary file renamed over it, which would replace it; give a regular file path")]
    Special(PathBuf),
    /// A chain of symbolic links too long (or a loop).
    #[error("'{0}': too many levels of symbolic links")]
    TooManyLinks(PathBuf),
    /// The path, or a link on the way, cannot be examined.
    #[error("'{path}': {source}")]
    Io {
        /// The path examined.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The output exists, and this one does not replace an existing file.
    #[error("'{0}' exists; not overwriting it")]
    Exists(PathBuf),
    /// The output appeared while it was being written (another process).
    #[error("'{0}' appeared while it was being written; not overwriting it")]
    Appeared(PathBuf),
    /// Making the written output durable and putting it in place failed.
    #[error("{what} '{path}': {source}")]
    Place {
        /// What was being done ("fsync", "rename into place", "fsync directory").
        what: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The temporary name an output is written under before it is renamed to `out`: in
/// the same directory (so the rename is atomic), hidden, with the process id.
pub fn partial_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map_or("output".into(), |n| n.to_string_lossy().into_owned());
    out.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// Write `out` through [`partial_path`]: `write` fills the temporary file; it is fsynced
/// and renamed to `out` only when complete (then the directory fsynced), and removed on
/// failure, so `out` is either as before or whole, a crash included. An existing `out` is
/// an error unless `overwrite` (then it is replaced whole). A symbolic link is written
/// through (its target replaced; [`replace_target`]), and a device, FIFO or socket is
/// refused. Any error type that an [`OutputError`] converts into.
pub fn write_whole<T, E: From<OutputError>>(
    out: &Path,
    overwrite: bool,
    write: impl FnOnce(&Path) -> Result<T, E>,
) -> Result<T, E> {
    let out = &replace_target(out)?;
    if out.exists() && !overwrite {
        return Err(OutputError::Exists(out.clone()).into());
    }
    let tmp = partial_path(out);
    let place = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| OutputError::Place { what, path, source }
    };
    let result = write(&tmp).and_then(|v| {
        if out.exists() && !overwrite {
            return Err(OutputError::Appeared(out.clone()).into());
        }
        // The bytes reach the disk before the name does: else a crash soon after the
        // rename can leave `out` empty or partial (and, with `overwrite`, the old file gone).
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(place("fsync", &tmp))?;
        std::fs::rename(&tmp, out).map_err(place("rename into place", out))?;
        Ok(v)
    });
    if result.is_err() && tmp.exists() {
        if let Err(e) = std::fs::remove_file(&tmp) {
            log::warn!("could not remove the partial '{}': {e}", tmp.display());
        }
    }
    let v = result?;
    // The rename recorded in the directory. The output is whole under its name already,
    // so a failure here is a warning (the file may not survive a crash), not lost work.
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        log::warn!(
            "wrote '{}', but could not fsync its directory ({e}): a crash soon may lose it",
            out.display()
        );
    }
    Ok(v)
}

/// The file a written-whole output at `path` replaces: `path` itself, or, when `path` is
/// a symbolic link, the file it points to (existing or not; the link stays a link). An
/// error when that is something a rename must not replace: a directory, or a device, a
/// FIFO or a socket (`/dev/null` would become a plain file; an HDF5 or token file needs a
/// regular one), or when it cannot be examined (no permission).
pub fn replace_target(path: &Path) -> Result<PathBuf, OutputError> {
    let mut target = path.to_path_buf();
    // A chain of links, followed as the kernel would (bounded like its 40).
    for _ in 0..40 {
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&target).map_err(|source| OutputError::Io {
                    path: target.clone(),
                    source,
                })?;
                target = match target.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            Ok(m) if m.is_dir() => return Err(OutputError::Directory(path.to_path_buf())),
            Ok(m) if !m.is_file() => return Err(OutputError::Special(path.to_path_buf())),
            Ok(_) => return Ok(target),
            // Not there yet: it is created.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(target),
            Err(source) => {
                return Err(OutputError::Io {
                    path: target,
                    source,
                })
            }
        }
    }
    Err(OutputError::TooManyLinks(path.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_followed_and_special_files_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(replace_target(&d.join("new.h5")).unwrap(), d.join("new.h5"));
        std::fs::write(d.join("real.bin"), b"x").unwrap();
        std::os::unix::fs::symlink("real.bin", d.join("link.bin")).unwrap();
        std::os::unix::fs::symlink("link.bin", d.join("link2.bin")).unwrap();
        assert_eq!(
            replace_target(&d.join("link2.bin")).unwrap(),
            d.join("real.bin")
        );
        // A dangling link: its target is created.
        std::os::unix::fs::symlink("later.bin", d.join("dangling")).unwrap();
        assert_eq!(
            replace_target(&d.join("dangling")).unwrap(),
            d.join("later.bin")
        );
        assert!(matches!(replace_target(d), Err(OutputError::Directory(_))));
        let e = replace_target(Path::new("/dev/null"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::os::unix::fs::symlink("/dev/null", d.join("null")).unwrap();
        assert!(replace_target(&d.join("null")).is_err());
        std::os::unix::fs::symlink("loop", d.join("loop")).unwrap();
        assert!(matches!(
            replace_target(&d.join("loop")),
            Err(OutputError::TooManyLinks(_))
        ));
    }
}
