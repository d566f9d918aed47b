//! Outputs written whole: under a temporary name beside the target, then renamed over it.
//! [`replace_target`] says what that target is, so that a rename never replaces what the
//! user named with something else.

use std::path::{Path, PathBuf};

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
