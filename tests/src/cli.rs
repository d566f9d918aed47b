//! Running the real `zero-bench train` from CLI tests: the binary of this profile under
//! mpirun, files of the repository, and the JSON its runs write.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::{zero_bench_bin, JobOutput, MpiJob};

/// A file of the repository (configs/..., slurm/...), as a string for arguments.
pub fn repo(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
        .to_string_lossy()
        .into_owned()
}

/// A path as an argument.
pub fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `mpirun -n ranks zero-bench train args...` (killed after 3 minutes).
pub fn train(ranks: usize, args: &[String]) -> JobOutput {
    MpiJob::new(ranks, zero_bench_bin())
        .args(
            ["train".to_string()]
                .into_iter()
                .chain(args.iter().cloned()),
        )
        .timeout(Duration::from_secs(180))
        .run()
}

/// Assert the run exited 0 by itself.
pub fn ok(out: &JobOutput) {
    assert!(!out.timed_out, "timed out\n{}", out.transcript());
    assert_eq!(out.code, Some(0), "failed\n{}", out.transcript());
}

/// A JSON file.
pub fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// A JSON-lines file (metrics), one value per line.
pub fn read_lines(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}
