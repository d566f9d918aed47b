//! Reports and tables written whole or not at all: through a temporary file renamed over
//! the target when complete (`zero_core::checkpoint::write_whole`), so a full disk or a
//! killed job never leaves a partial file that a later `sweep collect` or script reads as
//! a result, nor costs the earlier file at the same path.

use std::path::Path;

use anyhow::Context as _;

/// Write `text` to `path` whole, replacing an earlier file whole.
pub fn write_text(path: &Path, text: &str) -> anyhow::Result<()> {
    zero_core::checkpoint::write_whole(path, true, |tmp| {
        std::fs::write(tmp, text).map_err(|cause| zero_core::CheckpointError::Io {
            what: "writing",
            path: tmp.to_path_buf(),
            cause,
        })
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
    }
}
