//! `zero-bench tune` as users run it, one rank on this machine (`--launcher "env X={n}"`:
//! each measured run is a plain `zero-bench train`, no mpirun, so these take seconds).
//!
//! Checked: a configuration's `train.metrics_file` is the user's file, which tune's runs
//! leave as it was (each writes its own step lines into `--out`) and which the chosen
//! `best.toml` does not name; a world size or global batch past what tune can count is
//! refused with what to lower, not wrapped into a number nobody typed.
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench --release` (scripts/test.sh does).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use zero_tests::cli::{read_lines, repo, s};
use zero_tests::zero_bench_bin;

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("tune-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

/// `zero-bench args...` in `dir`.
fn zero_bench(dir: &Path, args: &[&str]) -> Output {
    Command::new(zero_bench_bin())
        .current_dir(dir)
        .args(args)
        .output()
        .expect("zero-bench runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// configs/tiny.toml with `metrics_file = "<metrics>"` in its `[train]`.
fn config_with_metrics(dir: &Path, metrics: &Path) -> PathBuf {
    let tiny = std::fs::read_to_string(repo("configs/tiny.toml")).expect("configs/tiny.toml");
    let with = tiny.replacen(
        "[train]\n",
        &format!("[train]\nmetrics_file = \"{}\"\n", metrics.display()),
        1,
    );
    assert_ne!(with, tiny, "configs/tiny.toml has no [train] section");
    let path = dir.join("tm.toml");
    std::fs::write(&path, with).expect("write tm.toml");
    path
}

#[test]
fn tune_leaves_the_configurations_metrics_file_alone_and_best_toml_names_none() {
    let dir = scratch("metrics");
    let precious = dir.join("precious.jsonl");
    let kept = "{\"the user's\": \"earlier metrics\"}\n";
    std::fs::write(&precious, kept).expect("write precious.jsonl");
    let config = config_with_metrics(&dir, &precious);
    let out_dir = dir.join("tout");
    let out = zero_bench(
        &dir,
        &[
            "tune",
            "--config",
            &s(&config),
            "--world",
            "1",
            "--mem-limit",
            "1GiB",
            "--top",
            "1",
            "--steps",
            "2",
            "--rounds",
            "2",
            "--launcher",
            "env X={n}",
            "--out",
            &s(&out_dir),
        ],
    );
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    assert_eq!(
        std::fs::read_to_string(&precious).expect("precious.jsonl"),
        kept,
        "tune's runs wrote over the configuration's metrics file\n{text}"
    );
    assert!(
        text.contains("is left as it is: each run writes its steps to"),
        "{text}"
    );
    // Every run (each candidate, each round) has its own step lines in --out.
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&out_dir)
        .expect("the --out directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| s(p).ends_with(".metrics.jsonl"))
        .collect();
    runs.sort();
    assert!(
        runs.len() >= 2,
        "one metrics file per run: {runs:?}\n{text}"
    );
    for r in &runs {
        assert!(
            s(r).contains("round-0") || s(r).contains("round-1"),
            "{}",
            r.display()
        );
        let steps: Vec<u64> = read_lines(r)
            .iter()
            .map(|l| l["step"].as_u64().expect("a step number"))
            .collect();
        assert_eq!(steps, [1, 2], "{}", r.display());
    }
    // The chosen configuration names no metrics file: training with it overwrites none.
    let best = std::fs::read_to_string(out_dir.join("best.toml")).expect("best.toml");
    assert!(
        !best
            .lines()
            .any(|l| l.trim_start().starts_with("metrics_file")),
        "{best}"
    );
    assert!(
        best.contains("# train.metrics_file (") && best.contains("--metrics FILE"),
        "{best}"
    );
}

/// SIGTERM to `tune` while one of its runs trains (as `kill` or a scheduler sends it):
/// the run is stopped, tune says which round it stopped in and where the finished runs'
/// reports are, and exits 143 (128 + 15, as a shell reports a command that SIGTERM
/// ended).
#[test]
fn sigterm_stops_tune_and_its_run_with_status_143() {
    let dir = scratch("sigterm");
    let out = dir.join("tout");
    let out_arg = s(&out);
    // A run's log (`run-<candidate>-round-<r>.log`) has its first step.
    let stepped = || {
        std::fs::read_dir(&out)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| s(p).ends_with(".log"))
            .any(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains(" step 1/10000000")))
    };
    let ended = zero_tests::cli::terminate_when(
        &dir,
        &[
            "tune",
            "--config",
            &repo("configs/tiny.toml"),
            "--world",
            "1",
            "--mem-limit",
            "1GiB",
            "--top",
            "1",
            "--steps",
            "10000000",
            "--rounds",
            "1",
            "--launcher",
            "env X={n}",
            "--out",
            &out_arg,
        ],
        "tune.log",
        stepped,
    );
    let text = &ended.text;
    assert!(ended.was_ready, "no run logged its step 1\n{text}");
    assert_eq!(ended.code, Some(143), "{text}");
    assert!(
        text.contains("tune interrupted in round 1 of 1")
            && text.contains("interrupted by SIGTERM; the job and its ranks were stopped"),
        "{text}"
    );
    let left = zero_tests::wait_until_none_running(|cmdline| cmdline.contains(&out_arg));
    assert!(left.is_empty(), "processes of the stopped run: {left:?}");
}

#[test]
fn a_world_or_global_batch_tune_cannot_count_is_refused_saying_what_to_lower() {
    let dir = scratch("overflow");
    let never = dir.join("never");
    let cases: [(&[&str], &str); 2] = [
        (
            &["--world", "1000000"],
            "--world 1000000: tune plans for at most 262144 ranks",
        ),
        (
            &[
                "--world",
                "1000",
                "--set",
                "train.micro_batch=100000000000000000",
            ],
            "the global batch --world x train.grad_accum x train.micro_batch = 1000 x 1 x \
             100000000000000000 is more than 18446744073709551615 sequences: lower \
             train.micro_batch or train.grad_accum",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["tune", "--mem-limit", "1GiB", "--out"];
        let never_arg = s(&never);
        args.push(&never_arg);
        args.extend(extra);
        let out = zero_bench(&dir, &args);
        let text = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}\n{text}");
        assert!(
            text.contains("error: ") && text.contains(want),
            "{args:?}: want '{want}'\n{text}"
        );
        assert!(
            !text.contains("not a positive multiple") && !text.contains("panicked"),
            "{text}"
        );
        assert!(
            !never.exists(),
            "a refused tune created {}",
            never.display()
        );
    }
}

/// The `zero.X = value` lines of a run's log (train prints its resolved configuration).
fn logged(log: &Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().find_map(|l| {
        l.trim_start()
            .strip_prefix(&format!("{key} = "))
            .and_then(|v| v.split_whitespace().next())
            .map(str::to_string)
    })
}

/// Every measured run's log in `out` (`run-<i>-round-<r>.log`).
fn run_logs(out: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(out)
        .expect("the --out directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = s(p);
            name.contains("/run-") && name.ends_with(".log")
        })
        .collect();
    logs.sort();
    logs
}

/// A configuration with its own bucket size and a warmup longer than tune's runs: every
/// candidate runs (the warmup_cosine keeps the configuration's horizon), and a candidate
/// labelled "bucket=default" runs the default bucket, which best.toml then trains with,
/// not the file's.
#[test]
fn tune_runs_what_it_labels_with_the_configurations_schedule() {
    let dir = scratch("bucket-warmup");
    let config = dir.join("bw.toml");
    std::fs::write(
        &config,
        "[model]\npreset = \"tiny\"\nvocab_size = 64\n[train]\nseq_len = 8\nsteps = 1000\n\
         [zero]\nbucket_elems = 1000\n[optim]\nschedule = \"warmup_cosine\"\nwarmup_steps = 100\n",
    )
    .expect("write bw.toml");
    let out_dir = dir.join("tout");
    let out = zero_bench(
        &dir,
        &[
            "tune",
            "--config",
            &s(&config),
            "--world",
            "1",
            "--mem-limit",
            "1GiB",
            "--top",
            "2",
            "--steps",
            "2",
            "--rounds",
            "1",
            "--launcher",
            "env X={n}",
            "--out",
            &s(&out_dir),
        ],
    );
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("failed"), "{text}");
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("tune.json")).expect("tune.json"),
    )
    .expect("tune.json is JSON");
    let measured = report["measured"].as_array().expect("measured candidates");
    let default = measured
        .iter()
        .filter(|c| c["bucket_elems"].is_null())
        .count();
    assert!(default >= 1 && default < measured.len(), "{text}");
    // One log per measured run: the default ones ran 4Mi (max(4Mi, 64Ki x 1)), the
    // given one the file's 1000; all kept the file's 1000-step cosine.
    let logs = run_logs(&out_dir);
    assert_eq!(logs.len(), measured.len(), "{logs:?}\n{text}");
    let buckets: Vec<String> = logs
        .iter()
        .map(|l| logged(l, "zero.bucket_elems").unwrap_or_default())
        .collect();
    let count = |v: &str| buckets.iter().filter(|b| *b == v).count();
    assert_eq!(count("4194304"), default, "{buckets:?}\n{text}");
    let given = measured
        .iter()
        .filter(|c| c["bucket_elems"].as_u64() == Some(1000))
        .count();
    assert_eq!(count("1000"), given, "{buckets:?}");
    assert!(given >= 1, "the configuration as given is measured\n{text}");
    for l in &logs {
        assert_eq!(
            logged(l, "optim.decay_steps").as_deref(),
            Some("1000"),
            "{}",
            l.display()
        );
        assert_eq!(
            logged(l, "train.steps").as_deref(),
            Some("2"),
            "{}",
            l.display()
        );
    }
    // best.toml: the configuration's schedule (no horizon of tune's), and the bucket of
    // the chosen label.
    let best = std::fs::read_to_string(out_dir.join("best.toml")).expect("best.toml");
    assert!(!best.contains("decay_steps"), "{best}");
    assert!(
        best.contains("warmup_steps = 100") && best.contains("steps = 1000"),
        "{best}"
    );
    let chosen = report["best"].as_str().expect("the chosen label");
    assert_eq!(
        best.contains("bucket_elems = 1000"),
        chosen.contains("bucket=1000"),
        "{chosen}\n{best}"
    );
}

/// Candidates the configuration rules out (hpZ at stages 0-2) are dropped before
/// anything is measured, in one line saying how many and why; every run is a valid one.
#[test]
fn tune_drops_the_candidates_the_configuration_rules_out() {
    let dir = scratch("invalid");
    let out_dir = dir.join("tout");
    let out = zero_bench(
        &dir,
        &[
            "tune",
            "--world",
            "1",
            "--set",
            "model.preset=tiny",
            "--set",
            "model.vocab_size=64",
            "--set",
            "train.seq_len=8",
            "--set",
            "zero.stage=3",
            "--set",
            "zero.hierarchical_weights=true",
            "--mem-limit",
            "1GiB",
            "--top",
            "4",
            "--steps",
            "2",
            "--rounds",
            "1",
            "--launcher",
            "env X={n}",
            "--out",
            &s(&out_dir),
        ],
    );
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    let line: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("candidates dropped"))
        .collect();
    assert_eq!(line.len(), 1, "{text}");
    assert!(
        line[0].contains("the configuration rules them out")
            && line[0].contains("stage 0 gathers none")
            && line[0].contains("set zero.stage = 3"),
        "{text}"
    );
    assert!(!text.contains("failed"), "{text}");
    let logs = run_logs(&out_dir);
    assert!(!logs.is_empty(), "{text}");
    for l in &logs {
        assert_eq!(
            logged(l, "zero.stage").as_deref(),
            Some("3"),
            "{}",
            l.display()
        );
    }
}
