//! `zero-bench sweep` and slurm/sweep.sbatch when points fail: what the table keeps, what
//! it marks, and that nothing is left running.
//!
//! - A point whose job dies during a later stage keeps the rows of the stages that
//!   finished (train rewrites its `--json` report after each stage); the rest are failed
//!   rows with the job's reason. The same when the sweep is interrupted (SIGTERM) then.
//! - SIGHUP to `sweep run` stops the job like SIGTERM (exit 129), and a sweep that is
//!   SIGKILLed leaves no launcher or rank behind (the kernel's parent-death signal).
//! - A failing smallest N leaves the other N without an efficiency rather than measured
//!   against another base; skipped (fp16 overflow) steps are a column and a warning; an
//!   earlier sweep's table and plots never outlive a re-run that fails.
//! - slurm/sweep.sbatch, run by bash with `fake-srun-for-sbatch-logic/srun` on PATH (a
//!   test tool: it runs scripts/mpirun.sh, or exits 0 without running, or hangs, as told;
//!   the real cluster's tests are in slurm_sweep.rs): a point whose srun exits 0 without a
//!   result fails; `POINT_TIME` stops a hung point; SIGUSR1 (the time limit near) and
//!   SIGTERM (scancel) table the finished points and exit non-zero; an earlier job's
//!   results in `OUT_DIR` stay out of the table; a requeued job keeps finished points.
//!
//! Real zero-bench under scripts/mpirun.sh on configs/tiny.toml. The binary is
//! `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench` of the same profile.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use zero_tests::cli::{read_json, repo, s};
use zero_tests::plots::{assert_png, assert_svg};
use zero_tests::zero_bench_bin;

/// What configs/tiny.toml's points are named.
const TINY: &str = "v64-t16-l2-h2-c32_fp32_a1";

/// Steps per stage where a test acts in the second stage: enough for the test to see the
/// first stage's report and freeze the ranks before the second ends
/// ([`freeze_in_second_stage`] checks that it did).
const LONG_STEPS: &str = if cfg!(debug_assertions) {
    "400"
} else {
    "8000"
};

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("sweep-failures-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

fn mpirun_launcher() -> String {
    format!("{} {{n}}", repo("scripts/mpirun.sh"))
}

/// A process started with its output in a log, in a process group of its own.
struct Started {
    child: Child,
    log: PathBuf,
    what: String,
}

impl Started {
    fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait for the end (killed with everything below it after `timeout`, which fails
    /// the test); exit code and output.
    fn finish(mut self, timeout: Duration) -> (Option<i32>, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self
                .child
                .try_wait()
                .unwrap_or_else(|e| panic!("wait: {e}"))
            {
                break s;
            }
            if start.elapsed() > timeout {
                zero_tests::kill_job(self.pid());
                let _ = self.child.wait();
                panic!(
                    "{} still running after {timeout:?}; killed\n{}",
                    self.what,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (status.code(), self.output())
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) of our own child; no memory involved.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }
}

/// Start `command` with its output into `log`.
fn start(mut command: Command, log: &Path, what: &str) -> Started {
    let file = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let err = file.try_clone().unwrap_or_else(|e| panic!("{e}"));
    // The command hears the signals these tests send as from a terminal, also when the
    // test run itself was started with them ignored: `nohup` ignores SIGHUP, an ignored
    // signal stays ignored across exec, and the sweep rightly keeps it so.
    // SAFETY: between fork and exec the closure calls only signal(2), which is
    // async-signal-safe, and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    let child = command
        .current_dir(repo(""))
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    Started {
        child,
        log: log.to_path_buf(),
        what: what.to_string(),
    }
}

/// Start `zero-bench sweep run ARGS --out OUT` (output into OUT/../<name>.log).
fn sweep_run(out: &Path, args: &[&str]) -> Started {
    let mut c = Command::new(zero_bench_bin());
    c.args(["sweep", "run"]).args(args).args(["--out", &s(out)]);
    let log = out.with_extension("log");
    start(c, &log, &format!("sweep run {args:?}"))
}

/// `sweep run` of one 2-rank point through stages 0 and 3, long enough
/// ([`LONG_STEPS`]) that stage 3 is still running when a test steps in.
fn two_stage_sweep(out: &Path) -> Started {
    let launcher = mpirun_launcher();
    sweep_run(
        out,
        &[
            "--ranks",
            "2",
            "--stages",
            "0,3",
            "--config",
            "configs/tiny.toml",
            "--steps",
            LONG_STEPS,
            "--launcher",
            &launcher,
            "--timeout",
            "600",
        ],
    )
}

/// Wait until `ready` (polled every 20 ms), failing the test (after killing `job`)
/// after a generous deadline.
fn wait_for(job: &Started, what: &str, ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() {
        if start.elapsed() > Duration::from_secs(240) {
            zero_tests::kill_job(job.pid());
            panic!("never saw {what}\n{}", job.output());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The rows of a sweep's `sweep.json`.
fn table_rows(out: &Path) -> Vec<Value> {
    match read_json(&out.join("sweep.json")) {
        Value::Array(rows) => rows,
        other => panic!("sweep.json is not an array of rows: {other}"),
    }
}

fn row(rows: &[Value], n: u64, stage: u64) -> &Value {
    rows.iter()
        .find(|r| r["n"] == n && r["stage"] == stage)
        .unwrap_or_else(|| panic!("no row N={n} stage={stage} in {rows:?}"))
}

/// The ranks of this test's job: zero-bench processes running `train` whose command
/// line names `out` (the launcher's names it too, but starts with mpirun).
fn ranks_of(out: &Path) -> Vec<libc::pid_t> {
    let bench = s(&zero_bench_bin());
    let out = s(out);
    zero_tests::running(|c| c.starts_with(&bench) && c.contains("\0train\0") && c.contains(&out))
}

/// Wait for the report a 2-rank job at `out` writes after its first stage, then freeze
/// its ranks (SIGSTOP) and check that they were frozen in the second stage: the report
/// still says only the first finished. What the test then does to the job happens in
/// the second stage by construction, however loaded the machine (a rank cannot finish
/// the stage while frozen, nor without its killed peer). The ranks, rank 0 first.
fn freeze_in_second_stage(job: &Started, out: &Path, report: &Path) -> Vec<libc::pid_t> {
    wait_for(job, "the job's two ranks", || ranks_of(out).len() == 2);
    let ranks = ranks_of(out);
    wait_for(job, "the report written after stage 0", || report.is_file());
    for &p in &ranks {
        // SAFETY: kill(2) of a rank of this test's job.
        unsafe {
            libc::kill(p, libc::SIGSTOP);
        }
    }
    let partial = read_json(report);
    assert_eq!(
        partial["stages_completed"],
        serde_json::json!([0]),
        "the ranks were frozen after stage 3 finished: {partial}"
    );
    assert_eq!(partial["complete"], false, "{partial}");
    ranks
}

fn resume(ranks: &[libc::pid_t]) {
    for &p in ranks {
        // SAFETY: kill(2) of a rank of this test's job (gone already: harmless).
        unsafe {
            libc::kill(p, libc::SIGCONT);
        }
    }
}

/// Wait (up to 60 s) until no process names `out` on its command line; kill and name
/// what is left.
fn assert_nothing_left(out: &Path) {
    let out = s(out);
    let start = Instant::now();
    let mut left = zero_tests::running(|c| c.contains(&out));
    while !left.is_empty() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
        left = zero_tests::running(|c| c.contains(&out));
    }
    for &p in &left {
        // SAFETY: kill(2) of a process of this test's job; no memory involved.
        unsafe {
            libc::kill(p, libc::SIGKILL);
        }
    }
    assert!(
        left.is_empty(),
        "processes of the job left running: {left:?}"
    );
}

/// A rank killed during the second stage (as the OOM killer would): the point fails,
/// but its first stage, which finished, stays in the table and the report says why the
/// rest is missing.
#[test]
fn a_stage_that_dies_keeps_the_stages_that_finished_before_it() {
    let dir = scratch("crash");
    let out = dir.join("out");
    let sweep = two_stage_sweep(&out);
    let report = out.join(format!("n2_{TINY}.json"));
    // Written after stage 0; the ranks are frozen in stage 3.
    let ranks = freeze_in_second_stage(&sweep, &out, &report);
    let partial = read_json(&report);
    assert_eq!(
        partial["stages_requested"],
        serde_json::json!([0, 3]),
        "{partial}"
    );
    // SAFETY: kill(2) of one rank of this test's job.
    unsafe {
        libc::kill(ranks[1], libc::SIGKILL);
    }
    resume(&ranks);
    let (code, output) = sweep.finish(Duration::from_secs(300));
    assert_eq!(code, Some(1), "{output}");
    assert!(
        output.contains("1 of 1 point(s) failed (the table has the 1 stage(s) that finished"),
        "{output}"
    );
    let rows = table_rows(&out);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let done = row(&rows, 2, 0);
    assert_eq!(done["status"], "ok", "{done}");
    assert!(done["tokens_per_s"].as_f64().unwrap_or(0.0) > 0.0, "{done}");
    let lost = row(&rows, 2, 3);
    assert_eq!(lost["status"], "failed", "{lost}");
    let why = lost["failure"].as_str().unwrap_or("");
    assert!(why.contains("the job failed"), "{lost}");
    // The report still says what finished, and that stage 3 did not.
    let left = read_json(&report);
    assert_eq!(left["complete"], false, "{left}");
    assert!(
        left["stopped"]
            .as_str()
            .is_some_and(|s| s.contains("the ZeRO-3 run did not finish")),
        "{left}"
    );
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        csv.lines()
            .next()
            .is_some_and(|h| h.ends_with(",status,failure")),
        "{csv}"
    );
    assert!(csv.contains(",ok,"), "{csv}");
    assert_png(&out.join("memory.png"));
    assert_nothing_left(&out);
}

/// SIGTERM to the sweep while a point's second stage runs: the sweep stops the job,
/// exits 143, and writes the table of what finished, the interrupted stage marked.
#[test]
fn an_interrupted_sweep_tables_the_stages_that_finished() {
    let dir = scratch("term");
    let out = dir.join("out");
    let sweep = two_stage_sweep(&out);
    let report = out.join(format!("n2_{TINY}.json"));
    let ranks = freeze_in_second_stage(&sweep, &out, &report);
    sweep.signal(libc::SIGTERM);
    // The sweep has passed SIGTERM on to the launcher: the ranks go on, to be stopped.
    wait_for(&sweep, "the sweep stopping its job", || {
        sweep.output().contains("[SIGTERM] stopping")
    });
    resume(&ranks);
    let (code, output) = sweep.finish(Duration::from_secs(300));
    assert_eq!(code, Some(143), "{output}");
    assert!(
        output.contains("sweep interrupted at point 1 of 1")
            && output.contains("the table has the stages that finished"),
        "{output}"
    );
    let rows = table_rows(&out);
    assert_eq!(row(&rows, 2, 0)["status"], "ok", "{rows:?}");
    let lost = row(&rows, 2, 3);
    assert_eq!(
        (lost["status"].as_str(), lost["failure"].as_str()),
        (Some("failed"), Some("interrupted by SIGTERM")),
        "{lost}"
    );
    assert_eq!(read_json(&report)["complete"], false);
    assert_nothing_left(&out);
}

/// A hang-up (an ssh session that drops) stops the job as SIGTERM does, exit 129; a
/// sweep killed outright leaves no launcher or rank running either.
#[test]
fn a_hang_up_or_a_killed_sweep_leaves_no_job_running() {
    let dir = scratch("hup");
    let launcher = mpirun_launcher();
    for (sig, want) in [(libc::SIGHUP, Some(129)), (libc::SIGKILL, None)] {
        let out = dir.join(format!("out{sig}"));
        let sweep = sweep_run(
            &out,
            &[
                "--ranks",
                "2",
                "--stages",
                "0",
                "--config",
                "configs/tiny.toml",
                "--steps",
                "100000000",
                "--launcher",
                &launcher,
                "--timeout",
                "600",
            ],
        );
        wait_for(&sweep, "the job's two ranks", || ranks_of(&out).len() == 2);
        sweep.signal(sig);
        let (code, output) = sweep.finish(Duration::from_secs(120));
        assert_eq!(code, want, "signal {sig}\n{output}");
        if sig == libc::SIGHUP {
            assert!(output.contains("interrupted by SIGHUP"), "{output}");
        }
        assert_nothing_left(&out);
    }
}

/// A launcher script that fails at N=1 and runs scripts/mpirun.sh otherwise.
fn failing_at_one(dir: &Path) -> String {
    let path = dir.join("fails-at-n1.sh");
    let script = format!(
        "#!/bin/sh\nn=$1; shift\nif [ \"$n\" = 1 ]; then echo 'error: simulated failure at N=1' >&2; exit 1; fi\nexec {} \"$n\" \"$@\"\n",
        repo("scripts/mpirun.sh")
    );
    std::fs::write(&path, script).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    format!("{} {{n}}", path.display())
}

/// The smallest N failing: its rows are failed, and the other N have no efficiency
/// (`null`) against base_n 1, rather than 1.0 against N=2. An earlier sweep's table and
/// plots in the directory are replaced by this run's, and a run where every point fails
/// leaves its failed rows and no plots.
#[test]
fn a_failed_base_n_leaves_no_efficiency_and_no_earlier_table_survives() {
    let dir = scratch("base");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(out.join("sweep.csv"), "stale table\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(out.join("comm.svg"), "stale plot").unwrap_or_else(|e| panic!("{e}"));
    let launcher = failing_at_one(&dir);
    let (code, output) = sweep_run(
        &out,
        &[
            "--ranks",
            "1,2",
            "--stages",
            "0",
            "--config",
            "configs/tiny.toml",
            "--steps",
            "2",
            "--launcher",
            &launcher,
            "--timeout",
            "300",
        ],
    )
    .finish(Duration::from_secs(300));
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("1 of 2 point(s) failed"), "{output}");
    let rows = table_rows(&out);
    let failed = row(&rows, 1, 0);
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(
        failed["failure"]
            .as_str()
            .is_some_and(|f| f.contains("simulated failure at N=1")),
        "{failed}"
    );
    let n2 = row(&rows, 2, 0);
    assert_eq!(n2["status"], "ok", "{n2}");
    assert_eq!(n2["base_n"], 1, "{n2}");
    assert!(n2["scaling_efficiency"].is_null(), "{n2}");
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap_or_else(|e| panic!("{e}"));
    assert!(!csv.contains("stale"), "{csv}");
    assert_svg(&out.join("comm.svg"));
    let svg = std::fs::read_to_string(out.join("throughput.svg")).unwrap_or_default();
    assert!(
        svg.contains("vs N=1"),
        "the efficiency panel names its base"
    );

    // Every point failing: the table says so, and no plot is left from before.
    let (code, output) = sweep_run(
        &out,
        &[
            "--ranks",
            "1",
            "--stages",
            "0,3",
            "--config",
            "configs/tiny.toml",
            "--launcher",
            "false {n}",
        ],
    )
    .finish(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("every point failed"), "{output}");
    let rows = table_rows(&out);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r["status"] == "failed"), "{rows:?}");
    for name in ["memory", "throughput", "comm"] {
        assert!(!out.join(format!("{name}.png")).exists(), "{name}.png left");
        assert!(!out.join(format!("{name}.svg")).exists(), "{name}.svg left");
    }
}

/// fp16 whose loss scale overflows every step: the rows say how many steps were skipped
/// and the sweep warns that their throughput is not a training step's.
#[test]
fn skipped_fp16_steps_are_a_column_and_a_warning() {
    let dir = scratch("fp16");
    let out = dir.join("out");
    let (code, output) = sweep_run(
        &out,
        &[
            "--ranks",
            "1",
            "--stages",
            "0",
            "--precisions",
            "fp16",
            "--config",
            "configs/tiny.toml",
            "--steps",
            "3",
            "--set",
            "precision.initial_scale=1e30",
            "--launcher",
            "env X={n}",
        ],
    )
    .finish(Duration::from_secs(120));
    assert_eq!(code, Some(0), "{output}");
    let rows = table_rows(&out);
    assert_eq!(rows[0]["skipped_steps"], 3, "{rows:?}");
    assert!(output.contains("every step was skipped"), "{output}");
}

/// The fake srun: `srun [--opt=...|-n N|...] PROGRAM ARGS...` runs
/// `scripts/mpirun.sh N PROGRAM ARGS...`; FAKE_SRUN_EXIT0_AT=N exits 0 at that N without
/// running (a launch failure srun reports with status 0), FAKE_SRUN_HANG_AT=N sleeps
/// there instead (a step that never starts).
fn fake_srun(dir: &Path) -> PathBuf {
    let bin = dir.join("fake-srun-for-sbatch-logic");
    std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("{e}"));
    let script = format!(
        r#"#!/bin/bash
# Test tool for slurm/sweep.sbatch's own logic, not Slurm: see sweep_failures_cli.rs.
n=1
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n=$2; shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ "${{FAKE_SRUN_EXIT0_AT:-}}" = "$n" ]; then
  echo "srun: error: task launch failed (fake srun), status 0" >&2
  exit 0
fi
if [ "${{FAKE_SRUN_HANG_AT:-}}" = "$n" ]; then
  echo "fake srun: hanging at N=$n"
  exec sleep 600
fi
exec {} "$n" "$@"
"#,
        repo("scripts/mpirun.sh")
    );
    let srun = bin.join("srun");
    std::fs::write(&srun, script).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&srun, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    bin
}

/// Start `bash slurm/sweep.sbatch` as a 2-task allocation would, the fake srun first on
/// PATH, with `env` on top; its output into `log`.
fn sbatch(dir: &Path, out: &Path, log: &str, env: &[(&str, &str)]) -> Started {
    let path = format!(
        "{}:{}",
        fake_srun(dir).display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new("bash");
    c.arg(repo("slurm/sweep.sbatch"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SLURM_") || k.starts_with("FAKE_SRUN_") {
            c.env_remove(k);
        }
    }
    c.env("PATH", path)
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_NTASKS", "2")
        .env("SLURM_CPUS_PER_TASK", "1")
        .env("ZERO_BENCH", zero_bench_bin())
        .env("CONFIG", repo("configs/tiny.toml"))
        .env("STAGES", "0")
        .env("STEPS", "2")
        .env("OUT_DIR", out);
    for (k, v) in env {
        c.env(k, v);
    }
    start(c, &dir.join(log), &format!("sweep.sbatch {env:?}"))
}

/// srun exiting 0 without running the ranks is a failed point (the job exits 1); N
/// above the allocation is skipped; an earlier job's result in OUT_DIR stays out of the
/// table; a requeued job keeps the points it finished.
#[test]
fn sweep_sbatch_fails_a_point_without_a_result_and_tables_only_its_own_points() {
    let dir = scratch("sbatch-results");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("{e}"));
    // An earlier job's N=4 result (3 steps), which this job skips.
    let earlier = out.join(format!("n4_{TINY}.json"));
    std::fs::write(
        &earlier,
        r#"{"world": 4, "stages": [{"stage": 0, "steps": 3, "final_loss": 3.0,
        "tokens_per_step": 64, "mean_step_seconds": 0.01, "tokens_per_s": 6400.0,
        "ledger_bytes_per_rank": [1, 1, 1, 1], "state_bytes_per_rank": [1, 1, 1, 1],
        "formula_bytes_per_rank": 1.0, "peak_rss_bytes_per_rank": [1, 1, 1, 1],
        "comm_sent_bytes_per_step": 1, "comm_plan_bytes_per_step": 1}]}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (code, log) = sbatch(
        &dir,
        &out,
        "job.out",
        &[("RANKS", "1 2 4"), ("FAKE_SRUN_EXIT0_AT", "2")],
    )
    .finish(Duration::from_secs(300));
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains(&format!(
            "point n2_{TINY} FAILED: srun exited 0 but the job wrote no"
        )) && log.contains("skipping N=4")
            && log.contains("already holds 1 result file(s) of an earlier job"),
        "{log}"
    );
    let rows = table_rows(&out);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(row(&rows, 1, 0)["status"], "ok", "{rows:?}");
    let n2 = row(&rows, 2, 0);
    assert_eq!(n2["status"], "failed", "{n2}");
    assert!(
        n2["failure"]
            .as_str()
            .is_some_and(|f| f.contains("no result file")),
        "{n2}"
    );
    assert!(
        earlier.is_file(),
        "the earlier job's file is left as it was"
    );

    // Requeued: the finished N=1 point is kept, not run again.
    let (code, log) = sbatch(
        &dir,
        &out,
        "requeued.out",
        &[("RANKS", "1"), ("SLURM_RESTART_COUNT", "1")],
    )
    .finish(Duration::from_secs(120));
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains(&format!(
            "point n1_{TINY}: finished before the requeue, kept"
        )),
        "{log}"
    );
    assert_eq!(table_rows(&out).len(), 1);
}

/// A point that hangs is stopped after POINT_TIME; SIGUSR1 (the time limit near) and
/// SIGTERM (scancel) stop the running point: each time the finished point is tabled, the
/// hung one is a failed row, and the job exits non-zero.
#[test]
fn sweep_sbatch_bounds_a_hung_point_and_tables_what_finished_when_stopped() {
    let dir = scratch("sbatch-stops");
    let hang = [("RANKS", "1 2"), ("FAKE_SRUN_HANG_AT", "2")];
    let out = dir.join("timeout");
    let mut env = hang.to_vec();
    // Generous: it bounds the N=1 point too, which must finish (mpirun's start-up on a
    // loaded machine); the hung N=2 point (the fake srun's sleep) waits it out.
    env.push(("POINT_TIME", "60"));
    let (code, log) = sbatch(&dir, &out, "timeout.out", &env).finish(Duration::from_secs(300));
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains(&format!(
            "point n2_{TINY} FAILED: still running after POINT_TIME=60 s, stopped"
        )),
        "{log}"
    );
    let rows_after_timeout = table_rows(&out);
    assert_eq!(row(&rows_after_timeout, 1, 0)["status"], "ok");
    assert_eq!(row(&rows_after_timeout, 2, 0)["status"], "failed");

    for (sig, name, code) in [(libc::SIGUSR1, "USR1", 138), (libc::SIGTERM, "TERM", 143)] {
        let out = dir.join(name);
        let job = sbatch(&dir, &out, &format!("{name}.out"), &hang);
        let hung_log = out.join(format!("n2_{TINY}.log"));
        wait_for(&job, "the hung N=2 point", || {
            std::fs::read_to_string(&hung_log).is_ok_and(|l| l.contains("fake srun: hanging"))
        });
        job.signal(sig);
        let (got, log) = job.finish(Duration::from_secs(180));
        assert_eq!(got, Some(code), "SIG{name}\n{log}");
        assert!(
            log.contains(&format!("point n2_{TINY} STOPPED by SIG{name}")),
            "{log}"
        );
        let rows = table_rows(&out);
        assert_eq!(row(&rows, 1, 0)["status"], "ok", "{rows:?}");
        assert_eq!(row(&rows, 2, 0)["status"], "failed", "{rows:?}");
        // The hung step (the fake srun's sleep) was stopped with it.
        let hung = zero_tests::running(|c| c.starts_with("sleep\x00600"));
        assert!(hung.is_empty(), "the hung step still runs: {hung:?}");
    }
}
