//! Reports and tables written whole or not at all: through a temporary file renamed over
//! the target when complete (`zero_core::files::write_whole`), so a full disk or a
//! killed job never leaves a partial file that a later `sweep collect` or script reads as
//! a result, nor costs the earlier file at the same path. A pipe, a terminal or
//! `/dev/stdout` is written as it is: there is nothing there to lose.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::Context as _;

/// Both paths exist and are the same file (links followed).
pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The two paths name one file, existing or not: the same file, or the same name in the
/// same directory.
pub(crate) fn same_target(a: &Path, b: &Path) -> bool {
    let place = |p: &Path| {
        let dir = parent(p).canonicalize().ok()?;
        Some(dir.join(p.file_name()?))
    };
    same_file(a, b) || matches!((place(a), place(b)), (Some(x), Some(y)) if x == y)
}

/// The directory a relative or absolute file path is in ("." for a bare name).
pub(crate) fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Write `text` to `path` whole, replacing an earlier file whole.
pub fn write_text(path: &Path, text: &str) -> anyhow::Result<()> {
    let special = std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir());
    if special {
        return std::fs::write(path, text).with_context(|| format!("writing {}", path.display()));
    }
    zero_core::files::write_whole(path, true, |tmp| -> anyhow::Result<()> {
        Ok(std::fs::write(tmp, text)?)
    })
    .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_report_replaces_the_earlier_one_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        super::write_text(&path, "first\n").unwrap();
        super::write_text(&path, "second\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second\n");
        let names = zero_core::files::entry_names(dir.path()).unwrap();
        assert_eq!(names.len(), 1, "{names:?}");
        // A directory that does not exist: an error naming the path, nothing written.
        let missing = dir.path().join("no-such-dir").join("report.json");
        let err = format!("{:#}", super::write_text(&missing, "x").unwrap_err());
        assert!(err.contains("no-such-dir"), "{err}");
        // A character device (what /dev/stdout is on a terminal) is written as it is.
        super::write_text(std::path::Path::new("/dev/null"), "x").unwrap();
    }
}
