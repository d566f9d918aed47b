//! The benchmark commands (`micro ...`, `ckpt bench`) refuse bad settings and unwritable
//! outputs before they measure anything, with one clear message and no MPI_ABORT:
//!
//! - `--csv` / `--json` that cannot be written (a directory) are checked up front, as one
//!   process and under mpirun (rank 0 writes them; every rank stops, the error once);
//! - `micro comm --ops` names are read with the command line (no header first);
//! - `--iters 0`, `--min-pairs 0` and `--min-pairs` above `--iters` are refused, and the
//!   default `--min-pairs` follows a lower `--iters` (`--iters 3` times 3 pairs);
//! - `--threads` is 1 to 1024 in every micro-benchmark that takes it;
//! - `micro comm` and `micro overlap` on one rank (no communication to measure) are
//!   refused, after the other checks; `micro overlap --bucket` must be whole f32 values;
//! - every `micro comm --csv` row says what "ours" and "raw" ran;
//! - `ckpt bench --repeat 0` is refused rather than run as "best of 1".
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench --release` (scripts/test.sh does).

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use zero_tests::{zero_bench_bin, MpiJob};

fn run(args: &[&str]) -> Output {
    Command::new(zero_bench_bin())
        .args(args)
        .env("RUST_BACKTRACE", "1")
        // One process, no mpirun: Open MPI starts a singleton (as root too).
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .expect("zero-bench starts")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A fresh scratch directory of this test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("micro-cli")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// `args` fails with exit status `code`, stderr naming every needle, nothing on stdout
/// (no table or header printed before the refusal), no panic and no MPI_ABORT.
fn refused(args: &[&str], code: i32, needles: &[&str]) {
    let out = run(args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: no '{needle}' in\n{stderr}"
        );
    }
    assert!(
        stdout.is_empty(),
        "{args:?}: printed before failing:\n{stdout}"
    );
    for noise in ["MPI_ABORT", "panicked", "backtrace"] {
        assert!(!stderr.contains(noise), "{args:?}: {noise}\n{stderr}");
    }
}

#[test]
fn unwritable_outputs_are_refused_before_the_benchmark() {
    let dir = scratch("outputs");
    let d = dir.to_string_lossy().into_owned();
    let one_size = ["micro", "comm", "--min-size", "1KiB", "--max-size", "1KiB"];
    let with = |extra: &[&str]| -> Vec<String> {
        one_size
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    let csv = with(&["--csv", &d]);
    let csv: Vec<&str> = csv.iter().map(String::as_str).collect();
    refused(&csv, 1, &["--csv", "is a directory"]);
    let json = with(&["--json", &format!("{d}/absent/t.json")]);
    let json: Vec<&str> = json.iter().map(String::as_str).collect();
    refused(&json, 1, &["--json", "absent", "cannot write a file in"]);
    refused(
        &["micro", "adam", "--max-mparams", "1", "--json", &d],
        1,
        &["--json", "is a directory"],
    );

    // Under mpirun: rank 0's check, agreed; every rank exits by itself, the error once.
    let out = MpiJob::new(2, zero_bench_bin())
        .args(with(&["--csv", &d]))
        .timeout(Duration::from_secs(120))
        .run();
    out.assert_failed_by_itself();
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{}", out.transcript());
    assert!(
        errors[0].contains("--csv") && errors[0].contains("is a directory"),
        "{}",
        out.transcript()
    );
    assert!(
        !out.all_text().contains("MPI_ABORT"),
        "{}",
        out.transcript()
    );
    assert!(!out.stdout.contains("collective"), "{}", out.transcript());
}

#[test]
fn comm_ops_and_pair_counts_are_checked_with_the_command_line() {
    refused(
        &["micro", "comm", "--ops", "foo"],
        2,
        &[
            "unknown collective 'foo'",
            "reduce_scatter, all_gather, all_reduce",
        ],
    );
    refused(
        &["micro", "comm", "--iters", "0"],
        2,
        &["--iters", "at least 1"],
    );
    refused(
        &["micro", "comm", "--min-pairs", "0"],
        2,
        &["--min-pairs", "at least 1"],
    );
    refused(
        &["micro", "comm", "--min-pairs", "100", "--iters", "5"],
        1,
        &["--min-pairs 100 is above --iters 5"],
    );
    // `--iters` is the most pairs, and the default fewest (5) follows it down.
    let dir = scratch("pairs");
    let csv = dir.join("t.csv");
    let c = csv.to_string_lossy().into_owned();
    let out = MpiJob::new(2, zero_bench_bin())
        .args([
            "micro",
            "comm",
            "--min-size",
            "1KiB",
            "--max-size",
            "2KiB",
            "--iters",
            "3",
            "--ops",
            "all_reduce",
            "--csv",
            &c,
        ])
        .timeout(Duration::from_secs(120))
        .run();
    assert_eq!(out.code, Some(0), "{}", out.transcript());
    let table = std::fs::read_to_string(&csv).expect("--csv written");
    let pairs: Vec<&str> = table
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(5).unwrap())
        .collect();
    assert_eq!(pairs, ["3", "3"], "{table}");
    assert!(table.lines().skip(1).all(|l| l.starts_with("all_reduce,")));
    // What was measured, on every row: our MPI communicator against raw MPI, host memory.
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.ends_with(",ratio,ours,comm,device,baseline,measured"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .skip(1)
            .all(|l| l.ends_with(",zero-comm,mpi,host,mpi-host,true")),
        "{table}"
    );
}

#[test]
fn one_rank_and_cut_buckets_are_refused() {
    // One process: every other check passes first, then the lone rank is refused.
    refused(
        &["micro", "comm", "--min-size", "1KiB", "--max-size", "2KiB"],
        1,
        &["micro comm on 1 rank", "at least 2 ranks"],
    );
    refused(
        &["micro", "overlap", "--layers", "2", "--bucket", "4KiB"],
        1,
        &["micro overlap on 1 rank", "at least 2 ranks"],
    );
    // A bucket of 1001 bytes would move 1000 and be reported as 1001.
    refused(
        &["micro", "overlap", "--bucket", "1001"],
        1,
        &["--bucket 1001", "multiple of 4", "1000"],
    );
}

#[test]
fn threads_are_one_to_1024_everywhere() {
    for bench in ["adam", "gemm", "model", "quant"] {
        refused(
            &["micro", bench, "--threads", "0"],
            2,
            &["--threads", "0 threads: give at least 1"],
        );
        refused(
            &["micro", bench, "--threads", "5000"],
            2,
            &["--threads", "at most 1024"],
        );
    }
}

#[test]
fn ckpt_bench_refuses_zero_rounds() {
    let dir = scratch("ckpt-bench");
    let d = dir.join("bench").to_string_lossy().into_owned();
    let args = [
        "ckpt",
        "bench",
        "--dir",
        &d,
        "--n-layer",
        "1",
        "--n-embd",
        "64",
        "--vocab",
        "256",
        "--repeat",
        "0",
    ];
    refused(&args, 1, &["--repeat 0", "at least 1"]);
    assert!(
        !dir.join("bench").exists(),
        "nothing made for a refused run"
    );
}
