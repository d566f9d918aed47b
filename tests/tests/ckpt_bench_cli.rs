//! `zero-bench ckpt bench` under mpirun when one rank fails: every rank exits non-zero by
//! itself (not after the communication watchdog's 30 minutes), and the cause, with the
//! OS error and the failing rank, is printed once.
//!
//! - `--dir` below a regular file: rank 0 cannot make the benchmark's directory.
//! - Rank 1 alone given a `--dir` where its plain file is a directory (each rank's
//!   arguments chosen by a shell from `OMPI_COMM_WORLD_RANK`): rank 1 alone fails to
//!   remove it, while rank 0 goes on towards the save's collectives.
//! - Rank 1 alone given a `--dir` where the checkpoint is rank 0's (a symlink) but its
//!   plain file is a dangling symlink: save and load succeed on both ranks, then the
//!   timed plain write fails on rank 1 only (what a disk with room for the checkpoint
//!   but not for the plain file does to some ranks).
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench --release` (scripts/test.sh does).

use std::path::{Path, PathBuf};
use std::time::Duration;

use zero_tests::cli::s;
use zero_tests::{zero_bench_bin, JobOutput, MpiJob};

/// A small model, one round: the bench itself takes a second or two.
const SMALL: &str = "--n-layer 1 --n-embd 64 --vocab 256 --repeat 1";

/// A fresh scratch directory of this test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("ckpt-bench-cli")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// The error lines: `error: ...` from the rank that reports an agreed failure, or
/// `rank R: error: ...` from one that aborted the job.
fn error_lines(out: &JobOutput) -> Vec<&str> {
    out.stderr
        .lines()
        .filter(|l| l.starts_with("error:") || l.contains(": error:"))
        .collect()
}

/// Every rank exited by itself, and stderr holds exactly one error line, naming each of
/// `needles` (the failing rank, the path, the OS error).
fn assert_failed_once_naming(out: &JobOutput, needles: &[&str]) {
    out.assert_failed_by_itself();
    let errors = error_lines(out);
    assert_eq!(
        errors.len(),
        1,
        "the error once, not per rank\n{}",
        out.transcript()
    );
    for needle in needles {
        assert!(
            errors[0].contains(needle),
            "the failing rank, the path and the OS error: no '{needle}'\n{}",
            out.transcript()
        );
    }
}

/// `mpirun -n 2 sh -c SCRIPT`: rank 1 runs `ckpt bench --dir rank1_dir`, the others
/// `--dir dir`.
fn bench(dir: &Path, rank1_dir: &Path) -> JobOutput {
    let script = format!(
        "if [ \"${{OMPI_COMM_WORLD_RANK:-$PMI_RANK}}\" = 1 ]; then d=\"$3\"; else d=\"$2\"; fi; \
         exec \"$1\" ckpt bench --dir \"$d\" {SMALL}"
    );
    MpiJob::new(2, "/bin/sh")
        .args([
            "-c".to_string(),
            script,
            "sh".to_string(),
            s(&zero_bench_bin()),
            s(dir),
            s(rank1_dir),
        ])
        .timeout(Duration::from_secs(120))
        .run()
}

#[test]
fn a_dir_below_a_regular_file_fails_every_rank_with_the_os_error_once() {
    let root = scratch("below-a-file");
    let file = root.join("a-file");
    std::fs::write(&file, "not a directory").expect("write a file");
    let dir = file.join("bench");
    let out = bench(&dir, &dir);
    assert_failed_once_naming(&out, &["rank 0 of 2", &s(&dir), "Not a directory"]);
}

#[test]
fn one_rank_failing_alone_ends_every_rank_promptly_naming_it() {
    let root = scratch("one-rank");
    let good = root.join("good");
    let bad = root.join("bad");
    // Rank 1's plain file of the first round is a directory: removing it fails there only.
    let plain = bad.join("zero-ckpt-bench").join("plain-rank-00001.bin");
    std::fs::create_dir_all(plain.join("inside")).expect("a directory in the plain file's place");
    let out = bench(&good, &bad);
    assert_failed_once_naming(&out, &["rank 1 of 2", &s(&plain), "Is a directory"]);
    // Rank 0 removed its own directory on the way out; rank 1's is not the bench's to
    // remove (rank 0 made none there).
    assert!(
        !good.join("zero-ckpt-bench").exists(),
        "the bench's directory was left behind\n{}",
        out.transcript()
    );
    assert!(plain.is_dir());
}

#[test]
fn a_timed_part_failing_on_one_rank_ends_every_rank_promptly_naming_it() {
    let root = scratch("timed-part");
    let good = root.join("good");
    let bad = root.join("bad");
    let own = bad.join("zero-ckpt-bench");
    std::fs::create_dir_all(&own).expect("rank 1's directory");
    // Rank 1 saves into and loads from rank 0's checkpoint root, as on a shared disk...
    std::os::unix::fs::symlink(good.join("zero-ckpt-bench").join("ckpt"), own.join("ckpt"))
        .expect("symlink to rank 0's checkpoint root");
    // ...but cannot create its plain file.
    let plain = own.join("plain-rank-00001.bin");
    std::os::unix::fs::symlink(root.join("nowhere").join("file"), &plain)
        .expect("dangling symlink");
    let out = bench(&good, &bad);
    let creating = format!("creating {}", s(&plain));
    assert_failed_once_naming(
        &out,
        &["rank 1 of 2", &creating, "No such file or directory"],
    );
    assert!(
        !good.join("zero-ckpt-bench").exists(),
        "the bench's directory was left behind\n{}",
        out.transcript()
    );
}

/// At stage 0 every rank loads all N shard files: the bench says so, and its load MB/s
/// and plain read count those bytes (the plain read reads all N plain files).
#[test]
fn stage_0_counts_the_n_files_each_rank_loads() {
    let dir = scratch("stage-0");
    let out = MpiJob::new(2, zero_bench_bin())
        .args([
            "ckpt".to_string(),
            "bench".to_string(),
            "--dir".to_string(),
            s(&dir.join("bench")),
            "--stage".to_string(),
            "0".to_string(),
        ])
        .args(SMALL.split(' ').map(str::to_string))
        .timeout(Duration::from_secs(120))
        .run();
    assert_eq!(out.code, Some(0), "{}", out.transcript());
    assert!(
        out.stdout.contains("each rank loads all 2 shard files")
            && out.stdout.contains("plain read reads all 2 plain files"),
        "{}",
        out.transcript()
    );
    assert!(
        !dir.join("bench").join("zero-ckpt-bench").exists(),
        "the bench's directory was left behind\n{}",
        out.transcript()
    );
}
