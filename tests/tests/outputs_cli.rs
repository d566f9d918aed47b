//! `zero-bench train` keeps what a user already has, and fails before step 1 where it
//! would otherwise fail at the end: each case a user can run into, with the exit status
//! and the message on mpirun's stderr.
//!
//! - an output (`--save-model`, `--json`) in a directory that does not exist, or one
//!   that is the run's own token file, is refused before step 1, and the file is intact;
//! - a fresh run into a `--ckpt-dir` that holds an earlier run's checkpoints is refused
//!   (it would replace them step by step), and `--resume` continues it;
//! - a resume that fails leaves the metrics file as it was;
//! - a config file that one rank cannot read fails every rank, naming that rank, rather
//!   than leaving the others waiting.

use std::path::PathBuf;
use std::time::Duration;

use zero_tests::cli::{ok, read_lines, repo, s, train};
use zero_tests::{zero_bench_bin, JobOutput, MpiJob};

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("outputs-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

/// configs/tiny.toml on 2 ranks with `extra` arguments.
fn tiny(extra: &[&str]) -> JobOutput {
    let mut a: Vec<String> = vec![
        "--config".into(),
        repo("configs/tiny.toml"),
        "--no-progress".into(),
    ];
    a.extend(extra.iter().map(|x| x.to_string()));
    train(2, &a)
}

/// The run failed by itself with status 1 before any step, and its output says every
/// needle.
fn refused_before_step_1(out: &JobOutput, needles: &[&str]) {
    assert!(!out.timed_out, "timed out\n{}", out.transcript());
    assert_eq!(out.code, Some(1), "exit status\n{}", out.transcript());
    let text = out.all_text();
    for n in needles {
        assert!(text.contains(n), "output lacks {n:?}\n{}", out.transcript());
    }
    assert!(
        !text.contains(" step 1/") && !text.contains("summary ZeRO"),
        "a step ran before the error\n{}",
        out.transcript()
    );
}

#[test]
fn outputs_are_checked_before_step_1_and_never_overwrite_an_input() {
    let dir = scratch("paths");
    let missing = s(&dir.join("absent").join("model.h5"));
    let out = tiny(&["--steps", "3", "--save-model", &missing]);
    refused_before_step_1(&out, &["--save-model", "absent", "before step 1"]);
    let out = tiny(&["--steps", "3", "--json", &s(&dir.join("absent/s.json"))]);
    refused_before_step_1(&out, &["--json", "absent"]);

    // The run's own token file as its metrics file (another spelling of the path).
    let tokens = dir.join("tokens.bin");
    let made = std::process::Command::new(zero_bench_bin())
        .args(["data", "corpus", "--tokens", "20000"])
        .arg(&tokens)
        .output()
        .expect("run zero-bench data corpus");
    assert!(made.status.success(), "{made:?}");
    let before = std::fs::read(&tokens).expect("token file");
    let data = format!("data.path={:?}", s(&tokens));
    let alias = s(&dir.join(".").join("tokens.bin"));
    let out = tiny(&["--steps", "3", "--set", &data, "--metrics", &alias]);
    refused_before_step_1(&out, &["--metrics", "data.path", "overwritten"]);
    assert_eq!(std::fs::read(&tokens).expect("token file"), before);
}

#[test]
fn a_fresh_run_does_not_replace_an_earlier_runs_checkpoints() {
    let dir = scratch("ckpt");
    let ck = s(&dir.join("ck"));
    ok(&tiny(&[
        "--steps",
        "2",
        "--ckpt-dir",
        &ck,
        "--save-every",
        "1",
    ]));
    let step2 = std::fs::read(dir.join("ck/step-2/meta.json")).expect("step-2");
    let out = tiny(&["--steps", "2", "--ckpt-dir", &ck]);
    refused_before_step_1(&out, &["earlier run", "latest: step-2", "--resume"]);
    assert_eq!(
        std::fs::read(dir.join("ck/step-2/meta.json")).expect("step-2 kept"),
        step2
    );
    // What the message says to do works.
    ok(&tiny(&["--steps", "3", "--ckpt-dir", &ck, "--resume", &ck]));
    assert!(dir.join("ck/step-3").is_dir());
}

#[test]
fn a_failed_resume_leaves_the_metrics_file_as_it_was() {
    let dir = scratch("metrics");
    let ck = s(&dir.join("ck"));
    let m = dir.join("m.jsonl");
    ok(&tiny(&[
        "--steps",
        "4",
        "--ckpt-dir",
        &ck,
        "--save-every",
        "2",
        "--metrics",
        &s(&m),
    ]));
    let before = std::fs::read(&m).expect("metrics");
    assert_eq!(read_lines(&m).len(), 4);
    // Another model width cannot load the checkpoint of step 2.
    let step2 = s(&dir.join("ck/step-2"));
    let out = tiny(&[
        "--steps",
        "4",
        "--resume",
        &step2,
        "--set",
        "model.width=64",
        "--metrics",
        &s(&m),
    ]);
    assert_eq!(out.code, Some(1), "{}", out.transcript());
    assert_eq!(std::fs::read(&m).expect("metrics"), before);
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_config_file_one_rank_cannot_read_fails_every_rank() {
    // Rank 1 is given a path that does not exist; rank 0 the real file.
    let script = r#"if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then c=/nonexistent/tiny.toml; else c="$1"; fi
exec "$2" train --config "$c" --no-progress --steps 2"#;
    let out = MpiJob::new(2, "sh")
        .args([
            "-c".to_string(),
            script.to_string(),
            "sh".to_string(),
            repo("configs/tiny.toml"),
            s(&zero_bench_bin()),
        ])
        .timeout(Duration::from_secs(60))
        .run();
    assert!(
        !out.timed_out,
        "a rank waited forever\n{}",
        out.transcript()
    );
    assert_eq!(out.code, Some(1), "{}", out.transcript());
    let text = out.all_text();
    assert!(
        text.contains("rank 1") && text.contains("/nonexistent/tiny.toml"),
        "{}",
        out.transcript()
    );
}
