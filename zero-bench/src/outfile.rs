//! Reports and tables written whole or not at all: through a temporary file renamed over
//! the target when complete (`zero_core::files::write_whole`), so a full disk or a
//! killed job never leaves a partial file that a later `sweep collect` or script reads as
//! a result, nor costs the earlier file at the same path. A pipe, a terminal or
//! `/dev/stdout` is written as it is: there is nothing there to lose.

use std::path::Path;

use anyhow::Context as _;

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
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A directory that does not exist: an error naming the path, nothing written.
        let missing = dir.path().join("no-such-dir").join("report.json");
        let err = format!("{:#}", super::write_text(&missing, "x").unwrap_err());
        assert!(err.contains("no-such-dir"), "{err}");
        // A character device (what /dev/stdout is on a terminal) is written as it is.
        super::write_text(std::path::Path::new("/dev/null"), "x").unwrap();
    }
}
