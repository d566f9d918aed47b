//! `zero-bench sweep` as users run it on one machine: `sweep run` with scripts/mpirun.sh
//! as the launcher over N = 1, 2 on configs/tiny.toml, then `sweep collect` on what it
//! left.
//!
//! Checked: one table row per (N, stage) in the CSV and the JSON, with the ledger's
//! model states and the paper's formula per rank falling with N where ZeRO partitions
//! (stage 3: 16Ψ/N exactly), no traffic at N = 1 and some at N = 2, efficiency 1 at the
//! smallest N; the plots exist as valid PNG (signature, IHDR) and SVG (root element);
//! `collect` rebuilds the same table; bad input is refused with a message.
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench --release` (scripts/test.sh does).

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use zero_tests::plots::{assert_png, assert_svg};
use zero_tests::zero_bench_bin as zero_bench;

/// The repository root.
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("sweep-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

/// What a zero-bench process left: exit code and its combined output.
struct Ran {
    code: Option<i32>,
    output: String,
}

/// Run zero-bench with `args` in the repository root; killed (its whole process tree,
/// ranks included: `zero_tests::kill_job`) after `timeout`, which fails the test.
fn zero_bench_run(args: &[&str], log: &Path, timeout: Duration) -> Ran {
    let file = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let err = file.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(zero_bench())
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start zero-bench: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap_or_else(|e| panic!("wait: {e}")) {
            break s;
        }
        if start.elapsed() > timeout {
            zero_tests::kill_job(child.id() as libc::pid_t);
            let _ = child.wait();
            panic!(
                "zero-bench {args:?} still running after {timeout:?}; killed\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ran {
        code: status.code(),
        output: std::fs::read_to_string(log).unwrap_or_default(),
    }
}

fn read_json(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match serde_json::from_str(&text) {
        Ok(Value::Array(rows)) => rows,
        other => panic!("{}: not a JSON array of rows: {other:?}", path.display()),
    }
}

fn row(rows: &[Value], n: u64, stage: u64) -> &Value {
    rows.iter()
        .find(|r| r["n"] == n && r["stage"] == stage)
        .unwrap_or_else(|| panic!("no row N={n} stage={stage} in {rows:?}"))
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

fn max_of(v: &Value, key: &str) -> u64 {
    let list = v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not a list in {v}"));
    list.iter().filter_map(Value::as_u64).max().unwrap_or(0)
}

#[test]
fn sweep_run_over_one_and_two_ranks_writes_the_table_and_plots_and_collect_rebuilds_it() {
    let out = scratch("run");
    let launcher = format!("{} {{n}}", repo().join("scripts/mpirun.sh").display());
    let ran = zero_bench_run(
        &[
            "sweep",
            "run",
            "--ranks",
            "1,2",
            "--stages",
            "0,3",
            "--config",
            "configs/tiny.toml",
            "--steps",
            "3",
            "--launcher",
            &launcher,
            "--timeout",
            "120",
            "--out",
            &out.display().to_string(),
        ],
        &out.join("sweep.log"),
        Duration::from_secs(300),
    );
    assert_eq!(ran.code, Some(0), "sweep run failed\n{}", ran.output);
    // Named by the values configs/tiny.toml gives the dimensions the sweep leaves to it.
    for point in [
        "n1_v64-t16-l2-h2-c32_fp32_a1",
        "n2_v64-t16-l2-h2-c32_fp32_a1",
    ] {
        assert!(
            out.join(format!("{point}.json")).is_file(),
            "{point}.json missing\n{}",
            ran.output
        );
        assert!(
            out.join(format!("{point}.log")).is_file(),
            "{point}.log missing"
        );
    }

    let csv =
        std::fs::read_to_string(out.join("sweep.csv")).unwrap_or_else(|e| panic!("sweep.csv: {e}"));
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "header + 2 N x 2 stages\n{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    for col in [
        "n",
        "stage",
        "tokens_per_s",
        "step_ms",
        "scaling_efficiency",
        "peak_rss_bytes_max",
        "ledger_bytes_max",
        "formula_bytes",
        "comm_sent_bytes_per_step",
    ] {
        assert!(header.contains(&col), "no column {col} in {}", lines[0]);
    }
    for l in &lines[1..] {
        assert_eq!(l.split(',').count(), header.len(), "ragged row {l}");
    }

    let rows = read_json(&out.join("sweep.json"));
    assert_eq!(rows.len(), 4, "{rows:?}");
    for r in &rows {
        assert!(
            num(r, "tokens_per_s") > 0.0 && num(r, "step_ms") > 0.0,
            "{r}"
        );
        assert!(num(r, "final_loss").is_finite(), "{r}");
        let n = r["n"].as_u64().unwrap_or(0) as usize;
        for key in [
            "peak_rss_bytes_per_rank",
            "ledger_bytes_per_rank",
            "state_bytes_per_rank",
        ] {
            assert_eq!(
                r[key].as_array().map(Vec::len),
                Some(n),
                "{key} per rank in {r}"
            );
        }
        assert!(
            max_of(r, "peak_rss_bytes_per_rank") > 0,
            "RSS unmeasured in {r}"
        );
    }
    for stage in [0, 3] {
        assert_eq!(num(row(&rows, 1, stage), "scaling_efficiency"), 1.0);
        assert!(num(row(&rows, 2, stage), "scaling_efficiency") > 0.0);
        assert_eq!(
            num(row(&rows, 1, stage), "comm_sent_bytes_per_step"),
            0.0,
            "no peers at N=1"
        );
        assert!(num(row(&rows, 2, stage), "comm_sent_bytes_per_step") > 0.0);
        // Measured = the ledger's data collectives + the control all-reduce of a few
        // scalars (norm, overflow flag, loss) that the plan leaves out.
        let sent = num(row(&rows, 2, stage), "comm_sent_bytes_per_step");
        let plan = num(row(&rows, 2, stage), "comm_plan_bytes_per_step");
        assert!(
            sent >= plan && sent - plan < 1024.0,
            "sent {sent} vs plan {plan}"
        );
    }
    // Stage 0 replicates everything: 16Ψ per rank at any N; stage 3: 16Ψ/N.
    let f = |n, s| num(row(&rows, n, s), "formula_bytes_per_rank");
    assert_eq!(f(2, 0), f(1, 0));
    assert_eq!(f(2, 3) * 2.0, f(1, 3));
    assert!(
        max_of(row(&rows, 2, 3), "state_bytes_per_rank")
            < max_of(row(&rows, 1, 3), "state_bytes_per_rank")
    );
    assert_eq!(
        max_of(row(&rows, 2, 0), "state_bytes_per_rank"),
        max_of(row(&rows, 1, 0), "state_bytes_per_rank")
    );

    for name in ["memory", "throughput", "comm"] {
        assert_png(&out.join(format!("{name}.png")));
        assert_svg(&out.join(format!("{name}.svg")));
    }

    // collect: the same table from the files alone, into another directory.
    let again = scratch("collect");
    let ran = zero_bench_run(
        &[
            "sweep",
            "collect",
            &out.display().to_string(),
            "--out",
            &again.display().to_string(),
        ],
        &out.join("collect.log"),
        Duration::from_secs(60),
    );
    assert_eq!(ran.code, Some(0), "sweep collect failed\n{}", ran.output);
    let csv_again =
        std::fs::read_to_string(again.join("sweep.csv")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(csv_again, csv, "collect rebuilt a different table");
    assert_png(&again.join("memory.png"));
    assert_svg(&again.join("memory.svg"));

    // One partial result file (a full disk under `train --json`) costs only its own rows:
    // the table of the others is written, the file is named, and the exit code says so.
    // Files not named as results are ignored.
    let partial = scratch("collect-partial");
    for entry in std::fs::read_dir(&out).unwrap_or_else(|e| panic!("{e}")) {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with('n') && name.ends_with(".json") {
            std::fs::copy(&path, partial.join(&*name)).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let truncated = partial.join("n3_tiny_fp32_a1.json");
    std::fs::write(&truncated, "{\"world\": 3, \"sta").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(partial.join("notes_v2.json"), "{}").unwrap_or_else(|e| panic!("{e}"));
    let ran = zero_bench_run(
        &["sweep", "collect", &partial.display().to_string()],
        &out.join("collect-partial.log"),
        Duration::from_secs(60),
    );
    assert_eq!(ran.code, Some(1), "{}", ran.output);
    assert!(
        ran.output.contains("1 result file(s) could not be read")
            && ran.output.contains("n3_tiny_fp32_a1.json")
            && !ran.output.contains("notes_v2"),
        "{}",
        ran.output
    );
    let csv_partial =
        std::fs::read_to_string(partial.join("sweep.csv")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(csv_partial, csv, "the readable files' table");

    // A second, smaller run into the same directory tables its own point only, though
    // the N=2 result of the first run is still there.
    let ran = zero_bench_run(
        &[
            "sweep",
            "run",
            "--ranks",
            "1",
            "--stages",
            "2",
            "--config",
            "configs/tiny.toml",
            "--steps",
            "2",
            "--launcher",
            &launcher,
            "--timeout",
            "120",
            "--out",
            &out.display().to_string(),
        ],
        &out.join("sweep2.log"),
        Duration::from_secs(120),
    );
    assert_eq!(ran.code, Some(0), "second sweep run failed\n{}", ran.output);
    let rows = read_json(&out.join("sweep.json"));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0]["n"].as_u64(), rows[0]["stage"].as_u64()),
        (Some(1), Some(2))
    );
}

/// SIGTERM to `sweep run` while its job trains (as `kill` or a scheduler sends it): the
/// job and its ranks are stopped, the sweep says which point it stopped at and where
/// the partial output is, and exits 143 (128 + 15, as a shell reports a command that
/// SIGTERM ended).
#[test]
fn sigterm_stops_a_sweep_and_its_job_with_status_143() {
    let dir = scratch("sigterm");
    let out = dir.join("out");
    let out_arg = out.display().to_string();
    let launcher = format!("{} {{n}}", repo().join("scripts/mpirun.sh").display());
    let config = repo().join("configs/tiny.toml").display().to_string();
    let job_logs = || {
        std::fs::read_dir(&out)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<String>()
    };
    let ended = zero_tests::cli::terminate_when(
        &dir,
        &[
            "sweep",
            "run",
            "--ranks",
            "2",
            "--stages",
            "2",
            "--config",
            &config,
            "--steps",
            "10000000",
            "--launcher",
            &launcher,
            "--out",
            &out_arg,
        ],
        "sweep.log",
        || job_logs().contains("ZeRO-2 step 1/10000000"),
    );
    let text = format!("{}\n--- job logs ---\n{}", ended.text, job_logs());
    assert!(ended.was_ready, "the job never reached step 1\n{text}");
    assert_eq!(ended.code, Some(143), "{text}");
    assert!(
        ended.text.contains("sweep interrupted at point 1 of 1")
            && ended
                .text
                .contains("interrupted by SIGTERM; the job and its ranks were stopped"),
        "{text}"
    );
    let left = zero_tests::wait_until_none_running(|cmdline| cmdline.contains(&out_arg));
    assert!(left.is_empty(), "processes of the stopped job: {left:?}");
}

/// A job past `--timeout` is stopped with every rank it started (Open MPI gives each
/// rank a process group of its own: killing mpirun's alone would leave them training),
/// and the sweep fails naming it.
#[test]
fn a_job_past_its_timeout_is_stopped_with_its_ranks() {
    let out = scratch("timeout");
    let launcher = format!("{} {{n}}", repo().join("scripts/mpirun.sh").display());
    let out_arg = out.display().to_string();
    let ran = zero_bench_run(
        &[
            "sweep",
            "run",
            "--ranks",
            "2",
            "--stages",
            "2",
            "--config",
            "configs/tiny.toml",
            "--steps",
            "10000000",
            "--launcher",
            &launcher,
            "--timeout",
            "10",
            "--out",
            &out_arg,
        ],
        &out.join("sweep.log"),
        Duration::from_secs(120),
    );
    assert_eq!(ran.code, Some(1), "{}", ran.output);
    assert!(
        ran.output.contains("stopped after") && ran.output.contains("(timeout 10s)"),
        "{}",
        ran.output
    );
    // The ranks were training when the timeout came (mpirun ends them on SIGTERM, with
    // a SIGKILL soon after: they print nothing of it).
    let job_log = std::fs::read_dir(&out)
        .unwrap_or_else(|e| panic!("{}: {e}", out.display()))
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "log") && !p.ends_with("sweep.log"))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .unwrap_or_default();
    assert!(
        job_log.contains("ZeRO-2 step 1/10000000"),
        "job log:\n{job_log}\n{}",
        ran.output
    );
    // Nothing is left whose command line names this sweep's directory (the ranks' name
    // their result file there). A killed process leaves /proc once reaped: allow that.
    let left = zero_tests::wait_until_none_running(|cmdline| cmdline.contains(&out_arg));
    assert!(left.is_empty(), "processes of the stopped job: {left:?}");
}

#[test]
fn bad_sweeps_are_refused_with_a_message() {
    let dir = scratch("bad");
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap_or_else(|e| panic!("{e}"));
    // Refused before anything is created.
    let never = dir.join("never").display().to_string();
    let cases: [(&[&str], &str); 8] = [
        (
            &["sweep", "collect", &empty.display().to_string()],
            "no result files",
        ),
        (
            &["sweep", "run", "--ranks", "1,0", "--out", &never],
            "world sizes start at 1",
        ),
        (
            &[
                "sweep",
                "run",
                "--ranks",
                "1",
                "--launcher",
                "mpirun -n 2",
                "--out",
                &never,
            ],
            "has no {n}",
        ),
        (
            &[
                "sweep", "run", "--ranks", "1", "--stages", "0,4", "--out", &never,
            ],
            "ZeRO stages are 0, 1, 2 and 3",
        ),
        // A value listed twice would run its job twice over the same files.
        (
            &["sweep", "run", "--ranks", "1,1", "--out", &never],
            "--ranks 1,1 lists the world size 1 twice: each value runs once, and a repeat \
             would run the same job again over the same files; give each world size once",
        ),
        (
            &[
                "sweep",
                "run",
                "--ranks",
                "1",
                "--models",
                "tiny,small,tiny",
                "--out",
                &never,
            ],
            "--models tiny,small,tiny lists the model tiny twice",
        ),
        (
            &[
                "sweep",
                "run",
                "--ranks",
                "1",
                "--grad-accum",
                "2,2",
                "--out",
                &never,
            ],
            "--grad-accum 2,2 lists the accumulation 2 twice",
        ),
        (
            &[
                "sweep", "run", "--ranks", "1", "--stages", "0,3,0", "--out", &never,
            ],
            "--stages 0,3,0 lists the stage 0 twice",
        ),
    ];
    for (i, (args, msg)) in cases.iter().enumerate() {
        let ran = zero_bench_run(args, &dir.join(format!("{i}.log")), Duration::from_secs(30));
        assert_eq!(ran.code, Some(1), "{args:?}\n{}", ran.output);
        assert!(
            ran.output.contains(msg) && ran.output.contains("error:"),
            "{args:?}: want '{msg}'\n{}",
            ran.output
        );
        assert!(!ran.output.contains("panicked"), "{args:?}\n{}", ran.output);
    }
    assert!(
        !Path::new(&never).exists(),
        "a refused sweep created {never}"
    );
    // A launcher that fails every point: non-zero, naming the log.
    let out = dir.join("fail");
    let ran = zero_bench_run(
        &[
            "sweep",
            "run",
            "--ranks",
            "1",
            "--launcher",
            "false {n}",
            "--out",
            &out.display().to_string(),
        ],
        &dir.join("fail.log"),
        Duration::from_secs(30),
    );
    assert_eq!(ran.code, Some(1), "{}", ran.output);
    assert!(
        ran.output.contains("every point failed") && ran.output.contains("n1_small_bf16_a1.log"),
        "{}",
        ran.output
    );
}

/// A configuration's `train.metrics_file` is the user's file: the sweep's jobs leave it
/// as it was, each writing its own step lines beside its result.
#[test]
fn sweep_run_leaves_the_configurations_metrics_file_alone() {
    let dir = scratch("metrics");
    let precious = dir.join("precious.jsonl");
    let kept = "{\"the user's\": \"earlier metrics\"}\n";
    std::fs::write(&precious, kept).unwrap_or_else(|e| panic!("{e}"));
    let tiny = std::fs::read_to_string(repo().join("configs/tiny.toml"))
        .unwrap_or_else(|e| panic!("configs/tiny.toml: {e}"));
    let with = tiny.replacen(
        "[train]\n",
        &format!("[train]\nmetrics_file = \"{}\"\n", precious.display()),
        1,
    );
    assert_ne!(with, tiny, "configs/tiny.toml has no [train] section");
    let config = dir.join("tm.toml");
    std::fs::write(&config, with).unwrap_or_else(|e| panic!("{e}"));
    let out = dir.join("sw5");
    // One rank per job, started without mpirun: two points, two jobs.
    let ran = zero_bench_run(
        &[
            "sweep",
            "run",
            "--ranks",
            "1",
            "--grad-accum",
            "1,2",
            "--stages",
            "0",
            "--config",
            &config.display().to_string(),
            "--steps",
            "2",
            "--launcher",
            "env X={n}",
            "--out",
            &out.display().to_string(),
        ],
        &dir.join("sweep.log"),
        Duration::from_secs(120),
    );
    assert_eq!(ran.code, Some(0), "{}", ran.output);
    assert_eq!(
        std::fs::read_to_string(&precious).unwrap_or_else(|e| panic!("{e}")),
        kept,
        "the sweep's jobs wrote over the configuration's metrics file\n{}",
        ran.output
    );
    assert!(
        ran.output
            .contains("is left as it is: each point's job writes its steps to"),
        "{}",
        ran.output
    );
    for a in [1, 2] {
        let path = out.join(format!("n1_v64-t16-l2-h2-c32_fp32_a{a}.metrics.jsonl"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), ran.output));
        let steps: Vec<u64> = text
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
                v["step"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("no step in {l}"))
            })
            .collect();
        assert_eq!(steps, [1, 2], "{}", path.display());
    }
    // The table has both points (the metrics files are not taken for results).
    assert_eq!(read_json(&out.join("sweep.json")).len(), 2);
}

/// `sweep run` checks each point's configuration as its job will load it (the file, the
/// `--set`s, then `--stages`, `--steps` and the point's `--model`/`--precision`/
/// `--grad-accum`), not the bare configuration: what only the point's stages allow
/// runs; what no job of the point could run is refused before anything starts, naming
/// the point; and a `--models` point is named by the model its job trains.
#[test]
fn sweep_run_checks_each_points_configuration_as_its_job_runs_it() {
    let dir = scratch("points");
    let config = |name: &str| repo().join("configs").join(name).display().to_string();
    let (tiny, demo) = (config("tiny.toml"), config("demo.toml"));
    // hpZ is stage 3's only: the default stage of the file would refuse it, the jobs'
    // --stages 3 allows it.
    let out = dir.join("hpz");
    let ran = zero_bench_run(
        &[
            "sweep",
            "run",
            "--ranks",
            "1",
            "--stages",
            "3",
            "--config",
            &tiny,
            "--set",
            "zero.hierarchical_weights=true",
            "--steps",
            "2",
            "--launcher",
            "env X={n}",
            "--out",
            &out.display().to_string(),
        ],
        &dir.join("hpz.log"),
        Duration::from_secs(120),
    );
    assert_eq!(ran.code, Some(0), "{}", ran.output);
    assert_eq!(
        read_json(&out.join("sweep.json")).len(),
        1,
        "{}",
        ran.output
    );
    // Invalid as the points run them: refused up front, every bad point named with its
    // reason, nothing created (the launcher, `false`, would fail each job otherwise).
    let never = dir.join("never");
    let cases: [(&[&str], &[&str]); 2] = [
        (
            &["--ranks", "1,2", "--stages", "0", "--config", &demo, "--steps", "3"],
            &[
                "2 of 2 point(s) cannot run (nothing was started)",
                "N=1 model=v64-t64-l2-h4-c128 precision=bf16 A=1: at stage 0: invalid configuration",
                "N=2 model=v64-t64-l2-h4-c128 precision=bf16 A=1: at stage 0: invalid configuration",
                "optim.warmup_steps (5) exceeds the decay horizon (3 steps",
            ],
        ),
        (
            &["--ranks", "1", "--models", "tiny,small", "--config", &demo],
            &[
                "1 of 2 point(s) cannot run (nothing was started)",
                "N=1 model=tiny precision=bf16 A=1: at stage 0: invalid configuration",
                "train.seq_len (64) exceeds the model's context_len (8)",
            ],
        ),
    ];
    for (i, (extra, want)) in cases.iter().enumerate() {
        let never_arg = never.display().to_string();
        let mut args = vec![
            "sweep",
            "run",
            "--launcher",
            "false {n}",
            "--out",
            &never_arg,
        ];
        args.extend(extra.iter());
        let ran = zero_bench_run(
            &args,
            &dir.join(format!("bad{i}.log")),
            Duration::from_secs(30),
        );
        assert_eq!(ran.code, Some(1), "{args:?}\n{}", ran.output);
        for w in want.iter() {
            assert!(
                ran.output.contains(w),
                "{args:?}: want '{w}'\n{}",
                ran.output
            );
        }
        assert!(!ran.output.contains("every point failed"), "{}", ran.output);
        assert!(
            !never.exists(),
            "a refused sweep created {}",
            never.display()
        );
    }
    // --models tiny with --set model.width=32: the job trains tiny at width 32 (a --set
    // wins over --model), so the point is named by those dimensions, not "tiny".
    let out = dir.join("width");
    let ran = zero_bench_run(
        &[
            "sweep",
            "run",
            "--ranks",
            "1",
            "--stages",
            "0",
            "--models",
            "tiny",
            "--config",
            &tiny,
            "--set",
            "model.width=32",
            "--set",
            "train.seq_len=8",
            "--steps",
            "2",
            "--launcher",
            "env X={n}",
            "--out",
            &out.display().to_string(),
        ],
        &dir.join("width.log"),
        Duration::from_secs(120),
    );
    assert_eq!(ran.code, Some(0), "{}", ran.output);
    let rows = read_json(&out.join("sweep.json"));
    assert_eq!(rows.len(), 1, "{}", ran.output);
    assert_eq!(rows[0]["model"], "v64-t8-l2-h2-c32", "{}", ran.output);
    assert!(out.join("n1_v64-t8-l2-h2-c32_fp32_a1.json").is_file());
    assert!(!out.join("n1_tiny_fp32_a1.json").exists());
}
