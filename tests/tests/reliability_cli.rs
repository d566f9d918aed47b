//! `zero-bench train` and `ckpt` fail loudly and lose nothing: each case a user can run
//! into, with the exit status and the message they see (the stderr of mpirun, where
//! rank 0 prints). Every test here failed before the fix it covers (see the closing table
//! in the README's "Failures and exit codes").
//!
//! - checkpoint set-up checked before step 1 (uncreatable or read-only directory,
//!   --keep-last 0); --ckpt-dir alone saves after the last step; a failed final save
//!   exits 1;
//! - fp16 stuck at its minimum loss scale stops, naming the step;
//! - resuming in another precision takes the loss scaler from the new configuration;
//! - a rank that cannot load a checkpoint has its own reason printed by rank 0;
//! - data checked up front (a token outside the vocabulary anywhere in the file, an
//!   llm.c-looking header with a wrong magic, a file shorter than a global batch);
//! - the loss guard's three policies on a real loss spike;
//! - `ckpt inspect`/`consolidate` refuse inconsistent metadata and leave no partial file;
//! - an output (`--save-model`, `--json`) in a directory that does not exist, or one that
//!   is the run's own token file, is refused before step 1, and the file is intact;
//! - a fresh run into a `--ckpt-dir` holding an earlier run's checkpoints is refused (it
//!   would replace them step by step), and `--resume` continues it; so is a run resumed
//!   from another root, while one of the root's own steps, or a fresh root, resumes;
//! - a resume that fails leaves the metrics file as it was;
//! - a config file that one rank cannot read fails every rank, naming that rank, rather
//!   than leaving the others waiting;
//! - a token file written again in place under the run stops it at the next checkpoint;
//! - `--resume` alone saves where it resumed; `--rounds`/`--stages` with `--ckpt-dir`, a
//!   file as `--ckpt-dir`, and complete steps without `latest` are refused before step 1;
//! - a report that cannot be written fails the command (exit 1, not a panic);
//! - the memory guard's advice offers activation checkpointing;
//! - a real full disk (a small tmpfs) fails the saves and keeps the last good checkpoint.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use zero_tests::cli::{ok, read_lines, repo, s, train};
use zero_tests::{zero_bench_bin, JobOutput, MpiJob};

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("reliability-{name}"));
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

/// The run failed by itself with status `code`, and its output says every needle.
fn failed_with(out: &JobOutput, code: i32, needles: &[&str]) {
    assert!(!out.timed_out, "timed out\n{}", out.transcript());
    assert_eq!(out.code, Some(code), "exit status\n{}", out.transcript());
    let text = out.all_text();
    for n in needles {
        assert!(text.contains(n), "output lacks {n:?}\n{}", out.transcript());
    }
}

/// No training step ran (the progress log never reached step 1). The ranks log at
/// `info` whatever RUST_LOG says (`MpiJob::run`), so the line cannot be missing for
/// another reason.
fn no_step_ran(out: &JobOutput) {
    assert!(
        !out.all_text().contains(" step 1/"),
        "a step ran before the error\n{}",
        out.transcript()
    );
}

/// A read-only directory: a read-only tmpfs when this machine lets us mount one (root
/// outside a restricted container), else /proc/self, where no file can be created.
fn read_only_dir(dir: &Path) -> (PathBuf, bool) {
    let ro = dir.join("ro");
    std::fs::create_dir_all(&ro).expect("mkdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=64k", "tmpfs"])
        .arg(&ro)
        .output()
        .is_ok_and(|o| o.status.success());
    if mounted {
        (ro, true)
    } else {
        (PathBuf::from("/proc/self"), false)
    }
}

#[test]
fn an_unusable_checkpoint_setup_stops_before_step_1() {
    let dir = scratch("setup");
    // A directory that cannot be created (under a regular file; root ignores modes).
    let blocker = dir.join("a-file");
    std::fs::write(&blocker, "not a directory").expect("write");
    let bad = s(&blocker.join("ckpt"));
    let out = tiny(&["--steps", "3", "--ckpt-dir", &bad, "--save-every", "1"]);
    failed_with(&out, 1, &["--ckpt-dir", "cannot create it"]);
    no_step_ran(&out);
    // A read-only filesystem.
    let (ro, mounted) = read_only_dir(&dir);
    let out = tiny(&["--steps", "3", "--ckpt-dir", &s(&ro), "--save-every", "1"]);
    if mounted {
        let _ = Command::new("umount").arg(&ro).status();
    }
    failed_with(&out, 1, &["cannot write a file there"]);
    if mounted {
        assert!(
            out.all_text().contains("Read-only file system"),
            "{}",
            out.transcript()
        );
    }
    no_step_ran(&out);
    // --keep-last 0 would delete the checkpoint it just wrote.
    let ck = s(&dir.join("ck"));
    let out = tiny(&["--steps", "3", "--ckpt-dir", &ck, "--keep-last", "0"]);
    failed_with(&out, 1, &["--keep-last 0"]);
    no_step_ran(&out);
}

/// --ckpt-dir without --save-every saves once, after the last step; steps count from 1
/// alike in the metrics and the checkpoint's name.
#[test]
fn ckpt_dir_alone_saves_after_the_last_step() {
    let dir = scratch("alone");
    let (ck, m) = (dir.join("ck"), dir.join("m.jsonl"));
    let out = tiny(&["--steps", "3", "--ckpt-dir", &s(&ck), "--metrics", &s(&m)]);
    ok(&out);
    let latest = std::fs::read_to_string(ck.join("latest")).expect("a checkpoint was saved");
    assert_eq!(latest.trim(), "step-3");
    let steps: Vec<u64> = read_lines(&m)
        .iter()
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3]);
}

/// Every save fails (its `latest` pointer cannot be replaced): training goes on, but the
/// run exits 1 because its trained weights are not on disk.
#[test]
fn a_run_whose_final_checkpoint_fails_exits_1() {
    let dir = scratch("final");
    let ck = dir.join("ck");
    std::fs::create_dir_all(ck.join("latest").join("x")).expect("mkdir");
    let out = tiny(&["--steps", "4", "--ckpt-dir", &s(&ck), "--save-every", "2"]);
    failed_with(
        &out,
        1,
        &[
            "checkpoint after step 2 failed",
            "training reached step 4, but its checkpoint could not be saved",
        ],
    );
}

#[test]
fn fp16_stuck_at_its_minimum_loss_scale_stops_naming_the_step() {
    // A loss scale of 1e30 overflows fp16 at every step, and it is the floor too.
    let out = tiny(&[
        "--steps",
        "20",
        "--precision",
        "fp16",
        "--set",
        "precision.initial_scale=1e30",
        "--set",
        "precision.min_scale=1e30",
        "--set",
        "precision.max_skips_at_min_scale=5",
    ]);
    failed_with(
        &out,
        1,
        &[
            "step 5: 5 steps in a row overflowed in fp16 at the minimum loss scale",
            "train in bf16",
        ],
    );
    assert!(!out.all_text().contains("step 6:"), "{}", out.transcript());
}

/// fp32 -> fp16: dynamic scaling from the configured initial scale (not the fp32 run's
/// disabled scale of 1), and the change recorded in the next checkpoint; fp16 -> fp32:
/// no scaling.
#[test]
fn resuming_in_another_precision_takes_the_loss_scaler_from_the_new_configuration() {
    let dir = scratch("precision");
    let ck = s(&dir.join("ck"));
    ok(&tiny(&[
        "--steps",
        "3",
        "--ckpt-dir",
        &ck,
        "--precision",
        "fp32",
    ]));
    let m16 = dir.join("m16.jsonl");
    let out = tiny(&[
        "--steps",
        "5",
        "--ckpt-dir",
        &ck,
        "--resume",
        &ck,
        "--precision",
        "fp16",
        "--metrics",
        &s(&m16),
    ]);
    ok(&out);
    let scales: Vec<f64> = read_lines(&m16)
        .iter()
        .map(|v| v["loss_scale"].as_f64().unwrap())
        .collect();
    assert_eq!(scales, [65536.0, 65536.0], "{}", out.transcript());
    let meta: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("ck/step-5/meta.json")).expect("step-5 saved"),
    )
    .expect("JSON");
    let history = meta["history"].to_string();
    assert!(
        history.contains("precision Fp32 (loss scaling off) -> Fp16 (loss scaling on)"),
        "{history}"
    );
    let m32 = dir.join("m32.jsonl");
    ok(&tiny(&[
        "--steps",
        "6",
        "--ckpt-dir",
        &ck,
        "--resume",
        &ck,
        "--precision",
        "fp32",
        "--metrics",
        &s(&m32),
    ]));
    assert_eq!(read_lines(&m32)[0]["loss_scale"].as_f64(), Some(1.0));
}

#[test]
fn a_rank_that_cannot_load_has_its_own_reason_printed() {
    let dir = scratch("load");
    let ck = dir.join("ck");
    ok(&tiny(&["--steps", "2", "--ckpt-dir", &s(&ck)]));
    let f = ck.join("step-2").join("rank-00001.h5");
    let mut bytes = std::fs::read(&f).expect("read shard");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&f, bytes).expect("write shard");
    let out = tiny(&["--steps", "4", "--resume", &s(&ck)]);
    failed_with(
        &out,
        1,
        &[
            "failed on 1 rank(s)",
            "rank 1: checksum mismatch",
            "rank-00001.h5",
        ],
    );
    assert!(
        !out.all_text().contains("in its log"),
        "{}",
        out.transcript()
    );
}

/// Little-endian u16 tokens as a nanoGPT file, optionally behind an llm.c-style header.
fn token_file(path: &Path, header: Option<[i32; 3]>, tokens: &[u16]) {
    let mut bytes = Vec::new();
    if let Some(h) = header {
        let mut full = [0i32; 256];
        full[..3].copy_from_slice(&h);
        full.iter()
            .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes()));
    }
    tokens
        .iter()
        .for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
    std::fs::write(path, bytes).expect("write tokens");
}

#[test]
fn data_is_checked_before_training() {
    let dir = scratch("data");
    let path = |n: &str| format!("data.path={:?}", s(&dir.join(n)));
    // A token outside V = 64 far past anything 3 steps read: an error before step 1.
    let mut tokens: Vec<u16> = (0..100_000).map(|i| (i * 7 % 64) as u16).collect();
    tokens[90_000] = 500;
    token_file(&dir.join("bad.bin"), None, &tokens);
    let out = tiny(&["--steps", "3", "--set", &path("bad.bin")]);
    failed_with(
        &out,
        1,
        &["token 500 at position 90000", "model.vocab_size = 64"],
    );
    no_step_ran(&out);
    // An llm.c header (version 1, the right count) with another magic.
    let good: Vec<u16> = (0..5000).map(|i| (i % 64) as u16).collect();
    token_file(&dir.join("magic.bin"), Some([20240801, 1, 5000]), &good);
    let out = tiny(&["--steps", "3", "--set", &path("magic.bin")]);
    failed_with(&out, 1, &["header magic is 20240801", "20240520"]);
    // Shorter than one global batch (2 x 2 x 16 + 1 = 65 tokens): a warning, and it runs.
    token_file(&dir.join("short.bin"), None, &good[..50]);
    let out = tiny(&["--steps", "2", "--set", &path("short.bin")]);
    ok(&out);
    assert!(
        out.all_text()
            .contains("holds 50 tokens, fewer than one global batch"),
        "{}",
        out.transcript()
    );
}

/// A token stream the model learns (period 8) for 40 steps, then one it has not seen:
/// the loss jumps from ~0.2 to ~10, over 3x its recent median. `warn` logs and counts,
/// `stop` exits 1 naming the step, `skip_step` skips those steps on every rank.
#[test]
fn a_diverging_loss_follows_the_configured_policy() {
    let dir = scratch("diverge");
    let mut tokens: Vec<u16> = (0..64 * 40).map(|i| (i % 8) as u16).collect();
    tokens.extend((0..64 * 40).map(|i| (32 + (i * 13 + i / 7) % 32) as u16));
    let data = dir.join("shift.bin");
    token_file(&data, None, &tokens);
    let data_set = format!("data.path={:?}", s(&data));
    // 45 steps of the shifting data under `policy`, plus `extra` arguments.
    let run_with = |policy: &str, extra: &[&str]| {
        let policy = format!("divergence.policy={policy:?}");
        let mut a = vec![
            "--steps",
            "45",
            "--set",
            "optim.lr=1e-2",
            "--set",
            &data_set,
            "--set",
            &policy,
        ];
        a.extend_from_slice(extra);
        tiny(&a)
    };
    let run = |policy: &str, metrics: &Path| run_with(policy, &["--metrics", &s(metrics)]);
    let warned = dir.join("warn.jsonl");
    let out = run("warn", &warned);
    ok(&out);
    let lines = read_lines(&warned);
    let diverged: Vec<u64> = lines
        .iter()
        .filter(|v| v["diverged"] == Value::Bool(true))
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert!(
        !diverged.is_empty(),
        "no divergence seen\n{}",
        out.transcript()
    );
    assert!(lines.iter().all(|v| v["skipped"] == Value::Bool(false)));
    let first = diverged[0];
    assert!(
        out.all_text().contains(&format!(
            "{} step(s) with a divergent loss (divergence.policy = Warn)",
            diverged.len()
        )),
        "{}",
        out.transcript()
    );

    let out = run("stop", &dir.join("stop.jsonl"));
    failed_with(
        &out,
        1,
        &[
            &format!("step {first}: the loss"),
            "divergence.policy = \"stop\"",
        ],
    );

    let skipped = dir.join("skip.jsonl");
    ok(&run("skip_step", &skipped));
    let lines = read_lines(&skipped);
    let first_skip = lines
        .iter()
        .find(|v| v["skipped"] == Value::Bool(true))
        .expect("a skipped step");
    assert_eq!(first_skip["step"].as_u64(), Some(first));
    assert_eq!(first_skip["diverged"], Value::Bool(true));

    // A loss that stays high would be skipped forever: past max_consecutive_skips the
    // run stops, naming the step.
    let out = run_with(
        "skip_step",
        &["--set", "divergence.max_consecutive_skips=2"],
    );
    failed_with(
        &out,
        1,
        &[
            &format!("step {}: 2 steps in a row were skipped", first + 2),
            "max_consecutive_skips",
        ],
    );
}

/// The global batch is N x A x B rows: a 2-rank, A = 1 checkpoint resumes on 1 rank with
/// A = 2 (the same rows, the same data) without --allow-batch-change, and --init-from
/// beside --resume is ignored with a warning (what a requeued job script passes).
#[test]
fn a_resume_with_the_same_rows_split_otherwise_is_accepted() {
    let dir = scratch("same-batch");
    let ck = s(&dir.join("ck"));
    ok(&tiny(&["--steps", "3", "--ckpt-dir", &ck]));
    let mut a: Vec<String> = [
        "--config",
        &repo("configs/tiny.toml"),
        "--no-progress",
        "--steps",
        "5",
        "--resume",
        &ck,
        "--grad-accum",
        "2",
        "--init-from",
        "/nonexistent/model.h5",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let out = train(1, &a);
    ok(&out);
    assert!(
        out.all_text()
            .contains("--init-from /nonexistent/model.h5 is ignored"),
        "{}",
        out.transcript()
    );
    // Another number of rows is still refused (from step 3 again: the resume above
    // saved step 5 into the same root).
    a[6] = s(&dir.join("ck").join("step-3"));
    a[8] = "1".into();
    let out = train(1, &a);
    failed_with(&out, 1, &["global batch", "--allow-batch-change"]);
}

/// Metadata that no model lays out so is refused before anything is read or allocated,
/// and an output is never left half-written.
#[test]
fn ckpt_tools_refuse_inconsistent_metadata_and_leave_no_partial_output() {
    let dir = scratch("meta");
    let ck = dir.join("ck");
    ok(&tiny(&["--steps", "2", "--ckpt-dir", &s(&ck)]));
    let step = ck.join("step-2");
    let meta_path = step.join("meta.json");
    let text = std::fs::read_to_string(&meta_path).expect("meta.json");
    let mut meta: Value = serde_json::from_str(&text).expect("JSON");
    meta["layout"]["params"][3]["shape"] = serde_json::json!([64, 64]);
    std::fs::write(&meta_path, meta.to_string()).expect("write meta");
    let bench = zero_bench_bin();
    let inspect = Command::new(&bench)
        .args(["ckpt", "inspect"])
        .arg(&step)
        .output()
        .expect("zero-bench runs");
    let err = String::from_utf8_lossy(&inspect.stderr);
    assert_eq!(inspect.status.code(), Some(1), "{err}");
    assert!(
        err.contains("inconsistent layout") && err.contains("numel 32"),
        "{err}"
    );
    let out = dir.join("model.h5");
    let consolidate = Command::new(&bench)
        .args(["ckpt", "consolidate"])
        .arg(&step)
        .arg(&out)
        .output()
        .expect("zero-bench runs");
    assert_eq!(consolidate.status.code(), Some(1));
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("model.h5"))
        .collect();
    assert!(left.is_empty(), "partial output left: {left:?}");
}

/// The run failed by itself with status 1 before any step, saying every needle.
fn refused_before_step_1(out: &JobOutput, needles: &[&str]) {
    failed_with(out, 1, needles);
    no_step_ran(out);
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

    // Resumed from another run's checkpoint into this root: refused too, the root kept.
    let other = s(&dir.join("other"));
    ok(&tiny(&["--steps", "1", "--ckpt-dir", &other]));
    let step3 = std::fs::read(dir.join("ck/step-3/meta.json")).expect("step-3");
    let out = tiny(&["--steps", "3", "--ckpt-dir", &ck, "--resume", &other]);
    refused_before_step_1(
        &out,
        &["holds the checkpoints of another run", "latest: step-3"],
    );
    assert_eq!(
        std::fs::read(dir.join("ck/step-3/meta.json")).expect("step-3 kept"),
        step3
    );
    // A step of the root itself (going back to step 2) and a fresh root both resume.
    // Going back branches the run: the later step-3 it would replace is moved aside
    // whole (it was "kept" and then silently replaced), and `latest` names the new one.
    let step2_dir = s(&dir.join("ck/step-2"));
    let branched = tiny(&[
        "--steps",
        "3",
        "--ckpt-dir",
        &ck,
        "--resume",
        &step2_dir,
        "--set",
        "data.order=\"shuffled\"",
    ]);
    ok(&branched);
    let said = branched.all_text();
    assert!(
        said.contains("branches from step 2: the later steps step-3"),
        "{}",
        branched.transcript()
    );
    assert!(
        said.contains("data.order = \"sequential\", and this run has \"shuffled\""),
        "{}",
        branched.transcript()
    );
    let aside: Vec<PathBuf> = std::fs::read_dir(dir.join("ck"))
        .expect("the root")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().contains("abandoned-after-step-2-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(aside[0].join("step-3/meta.json")).expect("the earlier step-3, moved"),
        step3
    );
    assert_ne!(
        std::fs::read(dir.join("ck/step-3/meta.json")).expect("the new step-3"),
        step3
    );
    let latest = std::fs::read_to_string(dir.join("ck/latest")).expect("latest");
    assert_eq!(latest.trim(), "step-3");
    let fresh = s(&dir.join("fresh"));
    ok(&tiny(&[
        "--steps",
        "2",
        "--ckpt-dir",
        &fresh,
        "--resume",
        &other,
    ]));
    assert!(dir.join("fresh/step-2").is_dir());
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

/// Each rank of 2 in its own directory (`base/L<rank>`, as node-local storage mounted
/// under one path would give), running `train` with `args`.
fn per_rank_dirs(base: &Path, args: &[&str]) -> JobOutput {
    for r in 0..2 {
        std::fs::create_dir_all(base.join(format!("L{r}"))).expect("mkdir");
    }
    let script = r#"cd "$1/L$OMPI_COMM_WORLD_RANK" && b="$2" && shift 2 && exec "$b" train "$@""#;
    let mut a = vec![
        "-c".to_string(),
        script.to_string(),
        "sh".to_string(),
        s(base),
        s(&zero_bench_bin()),
        "--config".to_string(),
        repo("configs/tiny.toml"),
        "--no-progress".to_string(),
    ];
    a.extend(args.iter().map(|x| x.to_string()));
    MpiJob::new(2, "sh")
        .args(a)
        .timeout(Duration::from_secs(90))
        .run()
}

/// A --ckpt-dir that is a different directory on each rank (both exist and are
/// writable) is refused before step 1, naming the rank that cannot see rank 0's file;
/// a --resume path that holds different checkpoints on different ranks (a stale
/// node-local copy) is refused before anything loads, naming the rank.
#[test]
fn ranks_that_see_different_checkpoint_directories_are_refused() {
    let dir = scratch("node-local");
    for r in 0..2 {
        std::fs::create_dir_all(dir.join(format!("L{r}/ck"))).expect("mkdir");
    }
    let out = per_rank_dirs(
        &dir,
        &["--steps", "3", "--ckpt-dir", "ck", "--save-every", "1"],
    );
    failed_with(
        &out,
        1,
        &["rank 1 of 2", "does not see it", "not one directory shared"],
    );
    no_step_ran(&out);
    // Two runs' step 2 (another learning rate), one copied to each rank's directory.
    for (name, lr) in [("a", "0.01"), ("b", "0.05")] {
        let ck = s(&dir.join(name));
        let lr = format!("optim.lr={lr}");
        ok(&tiny(&["--steps", "2", "--ckpt-dir", &ck, "--set", &lr]));
    }
    for (r, name) in [(0, "a"), (1, "b")] {
        let to = dir.join(format!("L{r}/from"));
        let status = Command::new("cp")
            .arg("-r")
            .arg(dir.join(name).join("step-2"))
            .arg(&to)
            .status()
            .expect("cp runs");
        assert!(status.success());
    }
    let out_dir = s(&dir.join("out"));
    let out = per_rank_dirs(
        &dir,
        &["--steps", "4", "--resume", "from", "--ckpt-dir", &out_dir],
    );
    failed_with(
        &out,
        1,
        &["rank 1 of 2", "--resume from", "another meta.json"],
    );
    no_step_ran(&out);
}

/// Two jobs given one --ckpt-dir: the second is refused while the first runs, naming
/// the first (its process); the first, then stopped by SIGTERM, saves and exits 85 as it
/// would alone. (The first never ends by itself: its steps outnumber any test's time.)
#[test]
fn a_second_job_in_a_checkpoint_directory_in_use_is_refused() {
    let dir = scratch("locked");
    let ck = s(&dir.join("ck"));
    let metrics = dir.join("first.metrics.jsonl");
    let (first, locked, stepping) = std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            tiny(&[
                "--steps",
                "100000000",
                "--ckpt-dir",
                &ck,
                "--metrics",
                &s(&metrics),
            ])
        });
        // Once the first holds the lock (it writes its holder there). The deadlines only
        // turn a first job that never gets there into a failure; together they stay
        // below the first job's own 180 s.
        let lock = dir.join("ck/.zero-lock");
        let locked = wait_for(Duration::from_secs(60), || {
            std::fs::read_to_string(&lock).is_ok_and(|t| !t.is_empty())
        });
        let second = locked.then(|| tiny(&["--steps", "3", "--ckpt-dir", &ck]));
        // Into the first's training loop (a step's metrics line is written): a SIGTERM
        // during its set-up would stop it before step 1, saving nothing.
        let stepping = locked
            && wait_for(Duration::from_secs(90), || {
                std::fs::metadata(&metrics).is_ok_and(|m| m.len() > 0)
            });
        // Stop the first (its ranks: the processes running train with this directory),
        // whatever happened above, so that a failure here does not wait for its timeout.
        let ranks = zero_tests::running(|c| {
            c.contains("train") && c.contains(&ck) && !c.starts_with("mpirun")
        });
        for pid in &ranks {
            // SAFETY: kill(2) on pids just read from /proc; no memory involved.
            unsafe {
                libc::kill(*pid, libc::SIGTERM);
            }
        }
        if let Some(second) = &second {
            failed_with(second, 1, &["is in use by another job (process"]);
            no_step_ran(second);
        }
        (
            first.join().expect("the first job's thread"),
            locked,
            stepping,
        )
    });
    assert!(
        locked,
        "the first job never wrote its lock\n{}",
        first.transcript()
    );
    assert!(
        stepping,
        "the first job wrote no metrics line\n{}",
        first.transcript()
    );
    failed_with(&first, 85, &["stopped by SIGTERM", "checkpoint saved"]);
}

/// Polls `done` every 50 ms until it holds (true) or `deadline` has passed (false).
fn wait_for(deadline: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGINT (Ctrl-C) to a run without a launcher: it stops after the step, saves a
/// checkpoint, says so and exits 130 (not 85, so no job script requeues it), and leaves
/// no stop marker; a second SIGINT ends it at once.
#[test]
fn ctrl_c_stops_a_run_with_a_checkpoint_and_a_second_one_at_once() {
    let dir = scratch("sigint");
    let start_run = |ck: &str| {
        std::process::Command::new(zero_bench_bin())
            .args([
                "train",
                "--config",
                &repo("configs/tiny.toml"),
                "--no-progress",
            ])
            .args(["--steps", "100000000", "--ckpt-dir", ck])
            .args(["--metrics", &format!("{ck}.metrics.jsonl")])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("zero-bench starts")
    };
    // Into the training loop: a step's metrics line is written (a signal during the
    // set-up stops the run before step 1 instead, which a loaded machine made likely when
    // this waited a fixed time after the checkpoint lock).
    // Returns whether it got there; the run is signalled either way (so that it ends),
    // and the test fails after it.
    let wait_for_steps = |ck: &Path| {
        let metrics = format!("{}.metrics.jsonl", ck.display());
        wait_for(Duration::from_secs(120), || {
            std::fs::metadata(&metrics).is_ok_and(|m| m.len() > 0)
        })
    };
    let ck = dir.join("once");
    let child = start_run(&s(&ck));
    let stepping = wait_for_steps(&ck);
    // SAFETY: kill(2) on our own child; no memory involved.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let out = child.wait_with_output().expect("the run ends");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stepping, "no step's metrics line within 120 s\n{text}");
    assert_eq!(out.status.code(), Some(130), "{text}");
    assert!(
        text.contains("SIGINT: stopping after this step")
            && text.contains("stopped by SIGINT")
            && text.contains("checkpoint saved"),
        "{text}"
    );
    assert!(
        !ck.join("STOPPED").exists(),
        "a stop marker: a job script would requeue"
    );
    assert!(
        std::fs::read_to_string(ck.join("latest")).is_ok_and(|l| l.starts_with("step-")),
        "{text}"
    );
    // Twice: ended by the signal itself. The second comes once the first was seen, while
    // the run finishes its step and saves (a wider model: a step and a save of
    // milliseconds, not microseconds).
    let ck = dir.join("twice");
    let mut child = std::process::Command::new(zero_bench_bin())
        .args([
            "train",
            "--config",
            &repo("configs/tiny.toml"),
            "--no-progress",
        ])
        .args(["--set", "model.width=256", "--set", "model.layers=6"])
        .args(["--steps", "100000000", "--ckpt-dir", &s(&ck)])
        .args(["--metrics", &format!("{}.metrics.jsonl", ck.display())])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("zero-bench starts");
    let stderr = child.stderr.take().expect("piped");
    let (seen_tx, seen) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut text = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("SIGINT: stopping after this step") {
                let _ = seen_tx.send(());
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let stepping = wait_for_steps(&ck);
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child; no memory involved.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    seen.recv_timeout(Duration::from_secs(60))
        .expect("the first SIGINT was announced");
    // SAFETY: as above.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    let status = child.wait().expect("the run ends");
    let text = reader.join().expect("the reader");
    assert!(stepping, "no step's metrics line within 120 s\n{text}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}\n{text}");
    assert!(text.contains("SIGINT again"), "{text}");
}

/// SIGTERM during the set-up (here the seconds a GPT-2 124M spends allocating and
/// initialising its weights, after the configuration is printed) ends the run before
/// step 1 with the preemption status 85 and the stop marker, saying nothing was trained,
/// instead of running a step and saving a checkpoint inside the scheduler's grace
/// period; SIGINT does the same with 130, says so when it arrives, and leaves no marker.
#[test]
fn a_stop_signal_during_set_up_stops_before_step_1() {
    for (sig, name, code) in [
        (libc::SIGTERM, "SIGTERM", 85),
        (libc::SIGINT, "SIGINT", 130),
    ] {
        let dir = scratch(&format!("setup-{name}"));
        let mut child = Command::new(zero_bench_bin())
            // The "step 1/2" info line must be there to be missed (see `no_step_ran`).
            .env("RUST_LOG", "info")
            .args(["train", "--model", "gpt2-124m", "--no-progress"])
            .args([
                "--set",
                "data.path=\"builtin\"",
                "--set",
                "train.micro_batch=1",
            ])
            .args(["--set", "train.seq_len=32", "--set", "train.grad_accum=1"])
            .args(["--precision", "fp32", "--stage", "0", "--steps", "2"])
            .args(["--ckpt-dir", &s(&dir.join("ck"))])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("zero-bench starts");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
        let mut text = String::new();
        // The handlers are installed before the configuration is printed.
        for line in lines.by_ref().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
            if line.starts_with("resolved configuration") {
                // SAFETY: kill(2) on our own child; no memory involved.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, sig);
                }
                break;
            }
        }
        text.extend(lines.map_while(Result::ok).map(|l| l + "\n"));
        let out = child.wait_with_output().expect("the run ends");
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(code), "{text}");
        assert!(
            text.contains(&format!(
                "stopped by {name} during the set-up of ZeRO-0, before its step 1: this run trained nothing"
            )),
            "{text}"
        );
        assert!(!text.contains("step 1/2"), "a step ran: {text}");
        assert!(!dir.join("ck").join("latest").exists(), "{text}");
        // The marker a job script requeues on, as after a step: not for the user's stop.
        assert_eq!(
            dir.join("ck").join("STOPPED").exists(),
            sig == libc::SIGTERM,
            "{text}"
        );
        if sig == libc::SIGINT {
            assert!(
                text.contains("SIGINT: stopping before the first step"),
                "{text}"
            );
        }
    }
}

/// A resume whose model has another head count (the parameters' shapes alike, so the
/// load alone would accept it) is refused before step 1, saying the checkpoint's.
#[test]
fn a_resume_with_another_head_count_is_refused() {
    let dir = scratch("heads");
    let ck = s(&dir.join("ck"));
    ok(&tiny(&["--steps", "2", "--ckpt-dir", &ck]));
    // The heads; then a dimension that sizes parameters, named by its key (the load would
    // name the first tensor whose shape differs), with no "earlier checkpoints" to go
    // back to: they all have the same shapes.
    for (set, said) in [
        (
            "model.heads=4",
            "heads 2, and this run has 4 (--set model.heads=2)",
        ),
        (
            "model.width=48",
            "width 32, and this run has 48 (--set model.width=32)",
        ),
    ] {
        let out = tiny(&[
            "--steps",
            "4",
            "--resume",
            &ck,
            "--ckpt-dir",
            &ck,
            "--set",
            set,
        ]);
        failed_with(&out, 1, &[said]);
        assert!(
            !out.all_text().contains("earlier checkpoints"),
            "{}",
            out.transcript()
        );
        no_step_ran(&out);
    }
}

/// 2 ranks of `train` on configs/tiny.toml where rank 1 alone gets `rank1` (a shell
/// fragment run before the command: an export, or extra arguments through `$@`).
fn rank1_differs(rank1_env: &str, rank1_args: &str) -> JobOutput {
    let script = format!(
        r#"b="$1"; c="$2"; shift 2
if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then {rank1_env}; exec "$b" train --config "$c" --no-progress --steps 3 {rank1_args}; fi
exec "$b" train --config "$c" --no-progress --steps 3"#
    );
    MpiJob::new(2, "sh")
        .args([
            "-c".to_string(),
            script,
            "sh".to_string(),
            s(&zero_bench_bin()),
            repo("configs/tiny.toml"),
        ])
        .timeout(Duration::from_secs(90))
        .run()
}

/// A communication setting in one rank's environment only (ZERO_COMM_RING=0 changes the
/// reduce-scatter's protocol, ZERO_COMM_CHECK=1 adds an all-gather to every collective)
/// or a flag on one rank only (--mem-limit, --save-model) would leave the ranks in
/// different collectives: refused before step 1, naming it.
#[test]
fn one_ranks_own_comm_environment_or_flag_is_refused() {
    for var in ["ZERO_COMM_RING=0", "ZERO_COMM_CHECK=1"] {
        let out = rank1_differs(&format!("export {var}"), "");
        let name = var.split('=').next().unwrap_or(var);
        failed_with(
            &out,
            1,
            &[&format!("{name} differ(s) between the ranks"), "mpirun -x"],
        );
        no_step_ran(&out);
    }
    let out = rank1_differs(":", "--mem-limit 10MiB");
    failed_with(&out, 1, &["rank 1 of 2", "--mem-limit = Some"]);
    no_step_ran(&out);
    let dir = scratch("one-rank-flag");
    let model = s(&dir.join("m.h5"));
    let out = rank1_differs(":", &format!("--save-model {model}"));
    failed_with(&out, 1, &["rank 1 of 2", "--save-model given = true"]);
    no_step_ran(&out);
}

/// Outputs written whole (a temporary file renamed over the target) never replace a
/// FIFO or a device with a plain file: refused before any work. A symbolic link is
/// written through: its target gets the data, the link stays.
#[test]
fn whole_outputs_refuse_special_files_and_write_through_links() {
    let dir = scratch("special");
    let fifo = dir.join("pipe");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let out = tiny(&["--steps", "2", "--save-model", &s(&fifo)]);
    failed_with(&out, 1, &["--save-model", "is not a regular file"]);
    no_step_ran(&out);
    let data = |args: &[&str]| zero_tests::cli::command("data", args);
    let o = data(&["corpus", &s(&fifo), "--tokens", "10"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not a regular file"),
        "{o:?}"
    );
    let meta = std::fs::symlink_metadata(&fifo).expect("the FIFO is still there");
    assert!(!meta.is_file(), "the FIFO was replaced by a file");
    let real = dir.join("real.bin");
    std::fs::write(&real, b"old").expect("write");
    let link = dir.join("link.bin");
    std::os::unix::fs::symlink("real.bin", &link).expect("symlink");
    // An existing file (through a link too) is replaced only when asked.
    let o = data(&["corpus", &s(&link), "--tokens", "1000"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--force"),
        "{o:?}"
    );
    assert_eq!(std::fs::read(&real).expect("target"), b"old");
    let o = data(&["corpus", &s(&link), "--tokens", "1000", "--force"]);
    assert!(o.status.success(), "{o:?}");
    assert!(std::fs::symlink_metadata(&link)
        .expect("link")
        .file_type()
        .is_symlink());
    assert!(
        std::fs::metadata(&real).expect("target").len() > 1000,
        "the target got the tokens"
    );
}

/// Sizes past this machine's memory or a 64-bit count, and thread counts past any node,
/// are refused with the size named: no panic, no allocator abort.
#[test]
fn absurd_sizes_are_refused_without_a_panic() {
    // The token files the refused `data corpus` would write: this test's own directory.
    let dir = scratch("absurd");
    let never = s(&dir.join("never-written.bin"));
    let run = |args: &[&str]| {
        Command::new(zero_bench_bin())
            .args(args)
            .output()
            .expect("zero-bench starts")
    };
    for (args, said) in [
        (
            &[
                "micro",
                "gemm",
                "--shapes",
                "10000000000x10000000000x10000000000",
            ][..],
            "overflow a 64-bit byte count",
        ),
        (
            &[
                "micro",
                "adam",
                "--min-mparams",
                "100000000",
                "--max-mparams",
                "100000000",
            ][..],
            "of memory, and this process has",
        ),
        (
            &["micro", "quant", "--mvalues", "100000000000"][..],
            "of memory, and this process has",
        ),
        (
            &["data", "corpus", &never, "--tokens", "100000000000000"][..],
            "an llm.c token file holds at most 2147483647 tokens",
        ),
        // The corpus streams (its memory is bounded), so the disk is what it could fill.
        (
            &[
                "data",
                "corpus",
                &never,
                "--format",
                "nanogpt",
                "--tokens",
                "100000000000000",
            ][..],
            "free; give fewer tokens or another directory",
        ),
        (
            &[
                "train",
                "--config",
                "configs/tiny.toml",
                "--threads",
                "100000",
            ][..],
            "at most 1024",
        ),
        // A negative number reaches the option's own check, not "unexpected argument".
        (
            &["train", "--config", "configs/tiny.toml", "--threads", "-2"][..],
            "'-2' is not a thread count",
        ),
        // Whole-number options say what was wrong, not "invalid digit found in string".
        (
            &["train", "--config", "configs/tiny.toml", "--steps", "-1"][..],
            "invalid value '-1' for '--steps <N>': it is negative; give a whole number",
        ),
        (
            &["train", "--config", "configs/tiny.toml", "--steps", "ten"][..],
            "'ten' for '--steps <N>': it is not a whole number",
        ),
        (
            &["micro", "gemm", "--rounds", "99999999999999999999999"][..],
            "for '--rounds <ROUNDS>': it is too large",
        ),
        (
            &["micro", "gemm", "--rounds", "-1.5"][..],
            "'-1.5' for '--rounds <ROUNDS>': it is not a whole number",
        ),
        (
            &["micro", "gemm", "--rounds="][..],
            "'' for '--rounds <ROUNDS>': it is empty",
        ),
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            matches!(o.status.code(), Some(1) | Some(2))
                && err.contains(said)
                && !err.contains("panicked"),
            "{args:?}: {o:?}"
        );
    }
    assert!(
        !Path::new(&never).exists(),
        "a refused `data corpus` left {never}"
    );
}

/// A synthetic token file of `tokens` tokens at `path` (`zero-bench data corpus`).
fn write_corpus(path: &Path, tokens: u64) {
    let o = Command::new(zero_bench_bin())
        .args(["data", "corpus", &s(path), "--tokens", &tokens.to_string()])
        .output()
        .expect("zero-bench starts");
    assert!(o.status.success(), "{o:?}");
}

/// data.path may name a node-local copy on each rank, but the copies must hold the same
/// tokens: a rank reading another file is refused before step 1, naming it.
#[test]
fn ranks_reading_different_token_data_are_refused() {
    let dir = scratch("tokens");
    let other = dir.join("other.bin");
    write_corpus(&other, 1234);
    let out = rank1_differs(":", &format!("--set data.path={}", s(&other)));
    failed_with(
        &out,
        1,
        &[
            "the ranks read different token data",
            "rank 1 has 1234 tokens",
        ],
    );
    no_step_ran(&out);
}

/// A token file written again in place while the run reads it (nanoGPT's prepare.py run
/// again over data.path) stops the run at its next checkpoint with exit status 1, naming
/// the file, the steps that may have read the new tokens and the checkpoints on either
/// side of the change; no older checkpoint is removed (`--keep-last 1` here). Before, the
/// run trained on the new tokens without a word.
#[test]
fn a_token_file_written_again_under_the_run_stops_it_at_the_next_checkpoint() {
    let dir = scratch("rewritten");
    let (data, ck) = (dir.join("tokens.bin"), dir.join("ck"));
    write_corpus(&data, 50000);
    let rewrite = {
        let (data, ck) = (data.clone(), ck.clone());
        std::thread::spawn(move || {
            // Once the first checkpoint is in place, the same tokens in reverse order, over
            // the old ones (the same file, never shorter: a truncation is a read error of
            // its own, tested in zero-models/tests/data.rs).
            let start = std::time::Instant::now();
            while !ck.join("latest").exists() && start.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let bytes = std::fs::read(&data).expect("read tokens");
            let reversed: Vec<u8> = bytes.chunks_exact(2).rev().flatten().copied().collect();
            use std::os::unix::fs::FileExt;
            std::fs::File::options()
                .write(true)
                .open(&data)
                .and_then(|f| f.write_all_at(&reversed, 0))
                .expect("write in place");
        })
    };
    let out = tiny(&[
        "--set",
        &format!("data.path={}", s(&data)),
        "--steps",
        "100000000",
        "--save-every",
        "20",
        "--keep-last",
        "1",
        "--ckpt-dir",
        &s(&ck),
    ]);
    rewrite.join().expect("the rewriting thread");
    failed_with(
        &out,
        1,
        &[
            "was written again while this run read it",
            "may have read the new tokens, so the run stops after step",
            "no older checkpoint was removed",
            "to go on with the new file, --resume",
            "put it back and --resume",
        ],
    );
    let text = out.all_text();
    assert_eq!(text.matches("was written again").count(), 1, "{text}");
    let steps: Vec<String> = std::fs::read_dir(&ck)
        .expect("the checkpoint directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    assert!(steps.len() >= 2, "{steps:?}\n{text}");
}

/// `--resume` of a root without `--ckpt-dir` goes on saving into that root, as README's
/// example does (before, it trained and saved nothing, exit status 0); one of a step
/// directory (perhaps another run's) saves nothing and says so, and `--save-every` there
/// needs a `--ckpt-dir`. `--keep-last`/`--save-every` need somewhere to save.
#[test]
fn a_resume_without_ckpt_dir_goes_on_saving_where_it_resumed() {
    let dir = scratch("resume-saves");
    let ck = s(&dir.join("ck"));
    ok(&tiny(&["--steps", "3", "--ckpt-dir", &ck]));
    let out = tiny(&["--steps", "5", "--resume", &ck]);
    ok(&out);
    assert!(
        out.all_text()
            .contains("without --ckpt-dir: the run goes on saving into"),
        "{}",
        out.transcript()
    );
    let latest = |d: &str| std::fs::read_to_string(Path::new(d).join("latest")).unwrap_or_default();
    assert_eq!(latest(&ck).trim(), "step-5", "{}", out.transcript());
    // From a step directory: nothing saved, and said.
    let step5 = s(&dir.join("ck").join("step-5"));
    let out = tiny(&["--steps", "6", "--resume", &step5]);
    ok(&out);
    assert!(
        out.all_text().contains("this run saves no checkpoint"),
        "{}",
        out.transcript()
    );
    assert_eq!(latest(&ck).trim(), "step-5");
    assert!(!dir.join("ck").join("step-6").exists());
    let out = tiny(&["--steps", "6", "--resume", &step5, "--save-every", "1"]);
    failed_with(
        &out,
        1,
        &["--save-every 1 with --resume", "give --ckpt-dir"],
    );
    let out = Command::new(zero_bench_bin())
        .args([
            "train",
            "--config",
            &repo("configs/tiny.toml"),
            "--keep-last",
            "2",
        ])
        .output()
        .expect("zero-bench starts");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--ckpt-dir <DIR>|--resume <DIR>"),
        "{out:?}"
    );
}

/// Checkpoint directories a run would save over are refused before step 1: every round
/// of `--rounds` or stage of `--stages` would start again into the same directory; a
/// directory with complete steps but no `latest` (a run that died in its first save)
/// would be overwritten; a file is not a directory.
#[test]
fn a_checkpoint_directory_the_run_would_save_over_is_refused() {
    let dir = scratch("save-over");
    let ck = s(&dir.join("ck"));
    let out = tiny(&["--steps", "2", "--rounds", "2", "--ckpt-dir", &ck]);
    failed_with(
        &out,
        1,
        &["--rounds 2 with --ckpt-dir", "save over the round before"],
    );
    no_step_ran(&out);
    let out = tiny(&["--steps", "2", "--stages", "0,1", "--ckpt-dir", &ck]);
    failed_with(
        &out,
        1,
        &["--stages with --ckpt-dir", "--stage N --ckpt-dir DIR"],
    );
    no_step_ran(&out);
    let file = dir.join("a-file");
    std::fs::write(&file, "x").expect("write");
    let out = tiny(&["--steps", "2", "--ckpt-dir", &s(&file)]);
    failed_with(&out, 1, &["is a file, not a directory"]);
    no_step_ran(&out);
    // A complete step without `latest`.
    ok(&tiny(&["--steps", "2", "--ckpt-dir", &ck]));
    std::fs::remove_file(dir.join("ck").join("latest")).expect("remove latest");
    let meta = std::fs::read(dir.join("ck").join("step-2").join("meta.json")).expect("meta");
    let out = tiny(&["--steps", "2", "--ckpt-dir", &ck]);
    failed_with(
        &out,
        1,
        &[
            "holds complete checkpoints (step-2) but no `latest`",
            "--resume",
        ],
    );
    no_step_ran(&out);
    assert_eq!(
        std::fs::read(dir.join("ck").join("step-2").join("meta.json")).expect("meta"),
        meta,
        "the step is as it was"
    );
}

/// A report that cannot be written (`> /dev/full`) fails the command with exit status 1
/// and says so, instead of a panic (101) with a backtrace; a dry run of `train` too.
#[test]
fn a_report_that_cannot_be_written_fails_the_command() {
    let dir = scratch("dev-full");
    let tokens = dir.join("t.bin");
    write_corpus(&tokens, 1000);
    let commands: [Vec<String>; 3] = [
        ["plan", "--params", "7.5e9", "--gpus", "8"]
            .map(String::from)
            .to_vec(),
        vec!["data".into(), "info".into(), s(&tokens)],
        vec![
            "train".into(),
            "--config".into(),
            repo("configs/tiny.toml"),
            "--dry-run".into(),
        ],
    ];
    for args in commands {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let out = Command::new(zero_bench_bin())
            .args(&args)
            .stdout(full)
            .output()
            .expect("zero-bench starts");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("error: writing standard output: No space left on device")
                && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

/// A standard output whose reader is gone (`zero-bench plan ... --verbose | head -1`)
/// ends the command without a message, as a shell reports a command that SIGPIPE ended
/// (141): `plan`, `data` and `train --dry-run` die of SIGPIPE at their first write;
/// `micro`, which keeps SIGPIPE ignored, finishes its work and exits 141. The pipe's
/// read end is closed before the command starts, so its first write fails: no race
/// with a reader that might have read everything.
#[test]
fn a_closed_standard_output_ends_the_command_as_sigpipe_would() {
    use std::os::unix::process::ExitStatusExt;
    let dir = scratch("sigpipe");
    let tokens = dir.join("t.bin");
    write_corpus(&tokens, 1000);
    // (arguments, whether it dies of the signal rather than exiting 141 itself)
    let commands: [(Vec<String>, bool); 4] = [
        (
            ["plan", "--params", "7.5e9", "--gpus", "8", "--verbose"]
                .map(String::from)
                .to_vec(),
            true,
        ),
        (vec!["data".into(), "info".into(), s(&tokens)], true),
        (
            vec![
                "train".into(),
                "--config".into(),
                repo("configs/tiny.toml"),
                "--dry-run".into(),
            ],
            true,
        ),
        (
            ["micro", "adam", "--max-mparams", "1"]
                .map(String::from)
                .to_vec(),
            false,
        ),
    ];
    for (args, dies_of_it) in commands {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2(2) writes two descriptors into the array it is given.
        let made = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(made, 0, "pipe2: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors were just created by pipe2 and are owned by nothing else.
        let (read_end, write_end) = unsafe {
            use std::os::fd::FromRawFd;
            (
                std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        };
        drop(read_end);
        let out = Command::new(zero_bench_bin())
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(write_end)
            .output()
            .expect("zero-bench starts");
        let err = String::from_utf8_lossy(&out.stderr);
        let shell_status = out
            .status
            .code()
            .or(out.status.signal().map(|sig| 128 + sig));
        assert_eq!(shell_status, Some(141), "{args:?}: {:?}\n{err}", out.status);
        if dies_of_it {
            assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{args:?}\n{err}");
        } else {
            assert_eq!(out.status.code(), Some(141), "{args:?}\n{err}");
        }
        assert!(
            !err.contains("error:") && !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: a message\n{err}"
        );
    }
}

/// Over the memory budget, the advice offers activation checkpointing where it fits
/// (before, it said activation checkpointing was not in this version).
#[test]
fn the_memory_advice_offers_activation_checkpointing() {
    let out = Command::new(zero_bench_bin())
        .args(["train", "--config", &repo("configs/tiny.toml"), "--dry-run"])
        .args(["--mem-limit", "4MB", "--set", "model.layers=8"])
        .args(["--set", "train.micro_batch=16", "--set", "zero.stage=3"])
        .output()
        .expect("zero-bench starts");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("model.checkpoint_every = 1 (activation checkpointing")
            && !err.contains("not in this version"),
        "{err}"
    );
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct SmallMount(PathBuf);

impl SmallMount {
    /// A tmpfs of `size` at `dir`, where this machine lets us mount one (root outside a
    /// restricted container).
    fn new(dir: &Path, size: &str) -> Option<SmallMount> {
        std::fs::create_dir_all(dir).expect("mkdir");
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .is_ok_and(|o| o.status.success())
            .then(|| SmallMount(dir.to_path_buf()))
    }
}

impl Drop for SmallMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
    }
}

/// A real full disk: a 900 KiB tmpfs holds two checkpoints of the tiny model on 2 ranks
/// (about 370 kB each) and not a third. The third save fails with ENOSPC, training goes
/// on, the final save fails too, and the run exits 1 naming the last good checkpoint,
/// which is whole (`ckpt inspect` checks every checksum) with no partial step left.
#[test]
fn a_full_disk_fails_the_saves_and_keeps_the_last_good_checkpoint() {
    let dir = scratch("enospc");
    let Some(mount) = SmallMount::new(&dir.join("small"), "900k") else {
        zero_tests::skip_or_fail(
            "tmpfs",
            "this machine does not let the test mount a tmpfs (`mount -t tmpfs` needs root \
             outside a restricted container)",
        );
        return;
    };
    let ck = mount.0.join("ck");
    let out = tiny(&[
        "--steps",
        "5",
        "--save-every",
        "1",
        "--keep-last",
        "5",
        "--ckpt-dir",
        &s(&ck),
    ]);
    failed_with(
        &out,
        1,
        &[
            "checkpoint after step 3 failed",
            "No space left on device",
            "training reached step 5, but its checkpoint could not be saved",
            "the last good checkpoint is",
            "(step 2)",
        ],
    );
    let names: Vec<String> = std::fs::read_dir(&ck)
        .expect("the checkpoint directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("step-"))
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["step-1", "step-2"], "no partial step is left");
    let inspect = Command::new(zero_bench_bin())
        .args(["ckpt", "inspect", &s(&ck)])
        .output()
        .expect("zero-bench starts");
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        inspect.status.success() && text.contains("step-2"),
        "{inspect:?}"
    );
    drop(mount);
}

/// `micro comm` with other sizes on one rank is refused on every rank at once (before,
/// the ranks waited in different collectives).
#[test]
fn micro_comm_with_other_options_on_one_rank_is_refused() {
    let script = r#"b="$1"; shift
if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$b" micro comm --min-size 1KiB --max-size 8KiB --iters 2; fi
exec "$b" micro comm --min-size 1KiB --max-size 4KiB --iters 2"#;
    let out = MpiJob::new(2, "sh")
        .args([
            "-c".to_string(),
            script.to_string(),
            "sh".to_string(),
            s(&zero_bench_bin()),
        ])
        .timeout(Duration::from_secs(90))
        .run();
    failed_with(&out, 1, &["given different micro comm options"]);
}
