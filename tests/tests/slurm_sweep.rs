//! slurm/train.sbatch and slurm/sweep.sbatch on a real Slurm cluster: the two-node local
//! cluster of scripts/slurm-cluster (2 nodes x 2 tasks, the scripts' own #SBATCH sizes).
//!
//! Needs the cluster up (`scripts/slurm-cluster/start.sh`, which writes
//! `$ZERO_SLURM_DIR/env`, default /tmp/zero-slurm/env); when it is not, the tests fail
//! and say how to start it, as tests/tests/slurm_cluster.rs does; they never skip. Jobs
//! are submitted with sbatch, polled with squeue, cancelled on timeout, and judged by
//! their output file and what they wrote: the training run's metrics and summary, the
//! sweep's table and plots. Small settings: configs/tiny.toml, 3 steps, N up to 4.
//!
//! The zero-bench the scripts run is this profile's (`ZERO_BENCH`); build it first with
//! `cargo build -p zero-bench --release` (scripts/test.sh does).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use zero_tests::cli::assert_node_traffic;
use zero_tests::plots::{assert_png, assert_svg};
use zero_tests::slurm::{slurm_conf, submit, text, wait};
use zero_tests::zero_bench_bin;

/// A tiny run takes seconds; the bound is for a loaded, shared machine.
const JOB_TIMEOUT: Duration = Duration::from_secs(240);

/// A fresh directory for one test's job files.
fn job_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("slurm_sweep")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

fn script(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../slurm")
        .join(name)
        .display()
        .to_string()
}

fn config(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs")
        .join(name)
        .display()
        .to_string()
}

/// Submit `script args...` (in `dir`, output to `dir/job.out`) with extra environment,
/// wait for its end (scancel after JOB_TIMEOUT, then fail); returns (job id, final state,
/// output file text).
/// Submit and wait for a job; (id, state, its output). A job whose step launch timed out
/// inside the local cluster's own daemons ("Socket timed out on send/recv operation":
/// slurmd's RPCs on a loaded 2-core machine, before our binary ran) is submitted once
/// more, saying so.
fn run_job(conf: &str, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (u64, String, String) {
    let (id, state, log) = run_job_once(conf, dir, args, env);
    if state != "COMPLETED" && log.contains("Socket timed out on send/recv operation") {
        eprintln!("job {id}: {state} on a Slurm RPC timeout of the local cluster; submitting it again\n{log}");
        return run_job_once(conf, dir, args, env);
    }
    (id, state, log)
}

fn run_job_once(
    conf: &str,
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (u64, String, String) {
    let output = dir.join("job.out");
    let (chdir, out) = (
        format!("--chdir={}", dir.display()),
        format!("--output={}", output.display()),
    );
    let mut all = vec![chdir.as_str(), out.as_str()];
    all.extend_from_slice(args);
    let id = submit(conf, &all, env);
    let finished = wait(conf, id, JOB_TIMEOUT).unwrap_or_else(|e| {
        panic!(
            "{e}\n{}",
            std::fs::read_to_string(&output).unwrap_or_default()
        )
    });
    let log = std::fs::read_to_string(&output)
        .unwrap_or_else(|e| panic!("job {id} output {} unreadable: {e}", output.display()));
    eprintln!("job {id}: {} in {:?}", finished.state, finished.elapsed);
    (id, finished.state, log)
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

#[test]
fn train_sbatch_trains_across_both_nodes_and_leaves_metrics_in_the_job_directory() {
    let conf = slurm_conf();
    let dir = job_dir("train");
    let bench = zero_bench_bin().display().to_string();
    let tiny = config("tiny.toml");
    let (id, state, log) = run_job(
        &conf,
        &dir,
        &[
            &script("train.sbatch"),
            "--stage",
            "3",
            "--steps",
            "3",
            "--save-every",
            "1",
        ],
        &[("ZERO_BENCH", &bench), ("CONFIG", &tiny)],
    );
    assert_eq!(state, "COMPLETED", "job {id}\n{log}");
    assert!(
        log.contains("running: srun --mpi=pmix") && log.contains("2 nodes"),
        "{log}"
    );
    let run_dir = dir.join(format!("zero-train-{id}"));
    let summary = read_json(&run_dir.join("summary.json"));
    assert_eq!(summary["world"], 4, "2 nodes x 2 tasks\n{summary}");
    let stages = summary["stages"]
        .as_array()
        .unwrap_or_else(|| panic!("{summary}"));
    assert_eq!(stages.len(), 1, "{summary}");
    assert_eq!(stages[0]["stage"], 3);
    assert_eq!(stages[0]["steps"], 3);
    assert!(
        stages[0]["final_loss"].as_f64().is_some_and(f64::is_finite),
        "{summary}"
    );
    assert_eq!(
        stages[0]["ledger_bytes_per_rank"].as_array().map(Vec::len),
        Some(4)
    );
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap_or_else(|e| panic!("metrics.jsonl: {e}\n{log}"));
    let lines: Vec<Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect();
    assert_eq!(lines.len(), 3, "one line per step\n{metrics}");

    // RESUME_STEP goes back to an earlier step of the run: it branches there, the later
    // steps moved aside whole.
    let ckpt = run_dir.join("ckpt").display().to_string();
    let again = job_dir("train-branch");
    let (id2, state, log) = run_job(
        &conf,
        &again,
        &[&script("train.sbatch"), "--stage", "2", "--steps", "3"],
        &[
            ("ZERO_BENCH", &bench),
            ("CONFIG", &tiny),
            ("CKPT_DIR", &ckpt),
            ("RESUME_STEP", "1"),
        ],
    );
    assert_eq!(state, "COMPLETED", "job {id2}\n{log}");
    assert!(log.contains("RESUME_STEP=1: resuming from"), "{log}");
    assert!(
        log.contains("branches from step 1: the later steps step-2, step-3"),
        "{log}"
    );
    let aside: Vec<PathBuf> = std::fs::read_dir(run_dir.join("ckpt"))
        .unwrap_or_else(|e| panic!("{ckpt}: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().contains("abandoned-after-step-1-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}\n{log}");
    for step in ["step-2", "step-3"] {
        assert!(aside[0].join(step).join("meta.json").is_file(), "{step}");
    }
    // A step that is not there is refused before srun, naming the steps that are.
    let (id3, state, log) = run_job(
        &conf,
        &job_dir("train-branch-missing"),
        &[&script("train.sbatch"), "--steps", "3"],
        &[
            ("ZERO_BENCH", &bench),
            ("CONFIG", &tiny),
            ("CKPT_DIR", &ckpt),
            ("RESUME_STEP", "7"),
        ],
    );
    assert_eq!(state, "FAILED", "job {id3}\n{log}");
    assert!(
        log.contains("RESUME_STEP=7, but")
            && log.contains("step-1")
            && !log.contains("running: srun"),
        "{log}"
    );
}

/// ZeRO++'s three switches across the two Slurm nodes: the nodes are found from Slurm
/// (each rank's SLURM_NODEID; both slurmds share one host, so MPI's shared-memory split
/// would see one node), the bytes on the node and cross-node groups and leaving each node
/// equal the ledger's, and with qwZ, hpZ and qgZ on, stage 3 sends >= 3.5x fewer bytes
/// out of each node than without them (7.08x on this fp32 model: 35,640 vs 252,288 B).
#[test]
fn zeropp_switches_find_the_slurm_nodes_and_cut_the_bytes_leaving_them() {
    let conf = slurm_conf();
    let dir = job_dir("zeropp");
    let bench = zero_bench_bin().display().to_string();
    let tiny = config("tiny.toml");
    let (id, state, log) = run_job(
        &conf,
        &dir,
        &[
            &script("train.sbatch"),
            "--stage",
            "3",
            "--steps",
            "3",
            "--set",
            "zero.quantize_weights=true",
            "--set",
            "zero.hierarchical_weights=true",
            "--set",
            "zero.quantize_grads=true",
        ],
        &[("ZERO_BENCH", &bench), ("CONFIG", &tiny)],
    );
    assert_eq!(state, "COMPLETED", "job {id}\n{log}");
    assert!(
        log.contains("2 node(s) of 2 rank(s) (found from the launch)"),
        "{log}"
    );
    let summary = read_json(&dir.join(format!("zero-train-{id}")).join("summary.json"));
    let stage = &summary["stages"][0];
    let cut = assert_node_traffic(stage, 2, 2, "2 Slurm nodes");
    for group in ["node_sent_bytes_per_step", "cross_sent_bytes_per_step"] {
        assert!(
            stage["nodes"][group].as_u64() > Some(0),
            "{group}\n{summary}"
        );
    }
    assert!(
        cut >= 3.5,
        "{cut:.2}x fewer bytes leaving each node\n{summary}"
    );
}

/// `train --dry-run` under srun with hpZ plans for the Slurm nodes the step has (2 of 2
/// ranks: a secondary partition of half of every unit the backward gathers), as the run does.
#[test]
fn a_dry_run_under_srun_plans_the_slurm_nodes() {
    let conf = slurm_conf();
    let dir = job_dir("zeropp-dry");
    let script = dir.join("dry.sbatch");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\nset -euo pipefail\nsrun --mpi=pmix {} train --config {} --stage 3 --dry-run --set zero.hierarchical_weights=true\n",
            zero_bench_bin().display(),
            config("tiny.toml")
        ),
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", script.display()));
    let script = script.display().to_string();
    let (id, state, log) = run_job(
        &conf,
        &dir,
        &["-N", "2", "--ntasks-per-node=2", "--time=00:02:00", &script],
        &[],
    );
    assert_eq!(state, "COMPLETED", "job {id}\n{log}");
    assert!(
        log.contains("zero.ranks_per_node = 2") && log.contains("derived: the nodes of the launch"),
        "{log}"
    );
    assert!(
        log.contains("this rank's 1/2 of every unit the backward gathers"),
        "{log}"
    );
}

#[test]
fn sweep_sbatch_runs_one_step_per_point_and_collects_the_table_and_plots() {
    let conf = slurm_conf();
    let dir = job_dir("sweep");
    let bench = zero_bench_bin().display().to_string();
    let tiny = config("tiny.toml");
    let (id, state, log) = run_job(
        &conf,
        &dir,
        &[&script("sweep.sbatch")],
        &[
            ("ZERO_BENCH", &bench),
            ("CONFIG", &tiny),
            ("RANKS", "1 2 4 8"),
            ("STAGES", "0,3"),
            ("STEPS", "3"),
        ],
    );
    assert_eq!(state, "COMPLETED", "job {id}\n{log}");
    for n in [1, 2, 4] {
        assert!(
            log.contains(&format!("srun --mpi=pmix --kill-on-bad-exit=1 -n {n} ")),
            "no srun step for N={n}\n{log}"
        );
    }
    assert!(
        log.contains("skipping N=8: the allocation has 4 tasks"),
        "{log}"
    );
    let out = dir.join(format!("zero-sweep-{id}"));
    let csv =
        std::fs::read_to_string(out.join("sweep.csv")).unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert_eq!(
        csv.lines().count(),
        1 + 3 * 2,
        "header + 3 N x 2 stages\n{csv}"
    );
    let rows = read_json(&out.join("sweep.json"));
    let rows = rows.as_array().unwrap_or_else(|| panic!("{rows}"));
    let mut points: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["n"].as_u64().unwrap_or(0),
                r["stage"].as_u64().unwrap_or(9),
            )
        })
        .collect();
    points.sort_unstable();
    assert_eq!(points, [(1, 0), (1, 3), (2, 0), (2, 3), (4, 0), (4, 3)]);
    for r in rows {
        let n = r["n"].as_u64().unwrap_or(0) as usize;
        assert_eq!(
            r["peak_rss_bytes_per_rank"].as_array().map(Vec::len),
            Some(n),
            "{r}"
        );
        assert!(r["tokens_per_s"].as_f64().is_some_and(|t| t > 0.0), "{r}");
        // Ranks on both nodes exchange gradients: traffic whenever N > 1.
        let sent = r["comm_sent_bytes_per_step"].as_u64().unwrap_or(0);
        assert_eq!(sent > 0, n > 1, "{r}");
    }
    for name in ["memory", "throughput", "comm"] {
        assert_png(&out.join(format!("{name}.png")));
        assert_svg(&out.join(format!("{name}.svg")));
    }
}

/// `zero-bench sweep run` inside an allocation with srun as its launcher: one step per
/// point, N = 1 and 4 over the two nodes.
#[test]
fn sweep_run_with_srun_as_launcher_inside_an_allocation() {
    let conf = slurm_conf();
    let dir = job_dir("sweep-run");
    let bench = zero_bench_bin().display().to_string();
    let out = dir.join("out");
    let batch = dir.join("sweep-run.sbatch");
    std::fs::write(
        &batch,
        format!(
            "#!/bin/bash\nset -euo pipefail\n{bench} sweep run --ranks 1,4 --stages 0,3 \
             --steps 3 --config {} --out {} \
             --launcher 'srun --mpi=pmix --kill-on-bad-exit=1 -n {{n}}'\n",
            config("tiny.toml"),
            out.display()
        ),
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", batch.display()));
    let batch = batch.display().to_string();
    let (id, state, log) = run_job(
        &conf,
        &dir,
        &["-N", "2", "--ntasks-per-node=2", "--time=00:05:00", &batch],
        &[],
    );
    assert_eq!(state, "COMPLETED", "job {id}\n{log}");
    let rows = read_json(&out.join("sweep.json"));
    let rows = rows.as_array().unwrap_or_else(|| panic!("{rows}"));
    assert_eq!(rows.len(), 4, "2 N x 2 stages\n{log}");
    for r in rows {
        let n = r["n"].as_u64().unwrap_or(0) as usize;
        assert_eq!(
            r["ledger_bytes_per_rank"].as_array().map(Vec::len),
            Some(n),
            "{r}"
        );
    }
    assert_png(&out.join("comm.png"));
    assert_svg(&out.join("comm.svg"));
}

/// `zero-bench tune` inside an allocation, srun as its launcher: 4 ranks over the two
/// nodes, the tiny model; it probes the link, measures one candidate per stage (and the
/// configuration as given), and writes a configuration that the allocation then trains.
#[test]
fn tune_with_srun_as_launcher_inside_an_allocation() {
    let conf = slurm_conf();
    let dir = job_dir("tune");
    let bench = zero_bench_bin().display().to_string();
    let out = dir.join("out");
    let batch = dir.join("tune.sbatch");
    std::fs::write(
        &batch,
        format!(
            "#!/bin/bash\nset -euo pipefail\n{bench} tune --config {} --world 4 \
             --global-batch 8 --mem-limit 1GiB --top 4 --steps 4 --rounds 1 \
             --ranks-per-node 2 --out {out} \
             --launcher 'srun --mpi=pmix --kill-on-bad-exit=1 -n {{n}}'\n\
             srun --mpi=pmix --kill-on-bad-exit=1 -n 4 {bench} train --config {out}/best.toml \
             --steps 2 --no-progress\n",
            config("tiny.toml"),
            out = out.display()
        ),
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", batch.display()));
    let batch = batch.display().to_string();
    let (id, state, log) = run_job(
        &conf,
        &dir,
        &["-N", "2", "--ntasks-per-node=2", "--time=00:10:00", &batch],
        &[],
    );
    assert_eq!(state, "COMPLETED", "job {id}\n{log}");
    assert!(
        log.contains("predicted order matches the measured one for") && log.contains("chosen:"),
        "{log}"
    );
    let report = read_json(&out.join("tune.json"));
    let measured = report["measured"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"));
    assert!(measured.len() >= 4, "{report}");
    assert!(
        report["beta_bytes_per_s"].as_f64().is_some_and(|b| b > 0.0),
        "{report}"
    );
}

#[test]
fn train_and_sweep_sbatch_refuse_to_run_outside_an_allocation() {
    for name in ["train.sbatch", "sweep.sbatch"] {
        let mut cmd = Command::new("bash");
        cmd.arg(script(name));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SLURM_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run bash {name}: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}\n{}", text(&out));
        assert!(
            stderr.contains("not inside a Slurm allocation") && stderr.contains("sbatch"),
            "{name}\n{}",
            text(&out)
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("srun"),
            "{name} went on to launch\n{}",
            text(&out)
        );
    }
}

/// Ctrl-C to `sweep run` or `tune` inside an allocation, while their srun step trains:
/// the step ends within seconds (no step of the job is left in `squeue -s` 30 s later:
/// Slurm tears a cancelled step down after srun has ended), the command
/// exits 130 and says which point or run it stopped and where its partial output is. The
/// batch script runs the command in the background with job control on (`set -m`), as an
/// interactive shell would, so SIGINT is not ignored the way a non-interactive shell's
/// background jobs ignore it; the signal goes to that one process, as a terminal's
/// Ctrl-C goes to the foreground process (the launcher runs in its own process group).
#[test]
fn ctrl_c_stops_sweep_and_tune_and_their_srun_steps() {
    // What the batch script says when rank 0 logged no backend within its 120 s.
    const NOT_TRAINING: &str = "no comm backend logged within 120 s";
    let conf = slurm_conf();
    let bench = zero_bench_bin().display().to_string();
    let launcher = "srun --mpi=pmix --kill-on-bad-exit=1 -n {n}";
    let cases = [
        (
            "sweep",
            format!(
                "sweep run --ranks 4 --stages 0 --steps 20000 --config {} --out out --launcher '{launcher}'",
                config("tiny.toml")
            ),
            "sweep interrupted at point 1 of 1",
        ),
        (
            "tune",
            format!(
                "tune --config {} --world 4 --global-batch 8 --mem-limit 1GiB --top 2 \
                 --steps 20000 --rounds 1 --ranks-per-node 2 --out out --launcher '{launcher}'",
                config("tiny.toml")
            ),
            "tune interrupted in round 1 of 1",
        ),
    ];
    for (name, args, said) in cases {
        let dir = job_dir(&format!("ctrl-c-{name}"));
        let batch = dir.join("ctrl-c.sbatch");
        // Wait until the training job's ranks run (rank 0 has logged its backend; not
        // tune's link probe, whose log is probe-comm.log), interrupt a second later, then
        // give Slurm 30 s to tear the step down. (Interrupted while srun still launched
        // its tasks, the step may outlive srun by minutes on this loaded machine: slurmd
        // was measured taking 2 minutes to start a step's tasks under a load of 10.)
        std::fs::write(
            &batch,
            format!(
                "#!/bin/bash\nset -m\n{bench} {args} > cmd.log 2>&1 &\npid=$!\nseen=0\n\
                 for i in $(seq 600); do\n\
                 \x20 cat out/run-*.log out/n4_*.log 2>/dev/null | grep -q 'comm backend' && {{ seen=1; break; }}\n\
                 \x20 sleep 0.2\ndone\n[ $seen = 1 ] || echo \"{NOT_TRAINING}\"\n\
                 sleep 1\nkill -INT $pid\nwait $pid\necho \"rc=$?\"\n\
                 for i in $(seq 150); do\n\
                 \x20 left=$(squeue -h -s -j $SLURM_JOB_ID -o %i | grep -v batch | tr '\\n' ' ')\n\
                 \x20 [ -z \"$left\" ] && break\n\x20 sleep 0.2\ndone\n\
                 echo \"steps left: $left\"\n"
            ),
        )
        .unwrap_or_else(|e| panic!("write {}: {e}", batch.display()));
        let batch = batch.display().to_string();
        let (id, state, log) = run_job(
            &conf,
            &dir,
            &["-N", "2", "--ntasks-per-node=2", "--time=00:05:00", &batch],
            &[],
        );
        let cmd_log = std::fs::read_to_string(dir.join("cmd.log")).unwrap_or_default();
        assert_eq!(state, "COMPLETED", "{name}: job {id}\n{log}\n{cmd_log}");
        // Interrupted while its step trained, not at some earlier point.
        assert!(
            !log.contains(NOT_TRAINING),
            "{name}: job {id}\n{log}\n{cmd_log}"
        );
        assert!(log.contains("rc=130"), "{name}: job {id}\n{log}\n{cmd_log}");
        assert!(
            log.lines().any(|l| l
                .strip_prefix("steps left:")
                .is_some_and(|r| r.trim().is_empty())),
            "{name}: a step outlived the interrupt: job {id}\n{log}\n{cmd_log}"
        );
        assert!(
            cmd_log.contains(said)
                && cmd_log.contains("interrupted by SIGINT; the job and its ranks were stopped"),
            "{name}: job {id}\n{cmd_log}"
        );
    }
}
