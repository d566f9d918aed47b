//! Jobs on a real Slurm cluster: the two-node local cluster of scripts/slurm-cluster.
//!
//! Needs the cluster up (`scripts/slurm-cluster/start.sh`, which writes
//! `$ZERO_SLURM_DIR/env`, default /tmp/zero-slurm/env, with the SLURM_CONF line). When it
//! is not up the tests fail and say how to start it; they never skip. Jobs are submitted
//! with sbatch, polled with `squeue` (faster than `sbatch --wait`), cancelled on timeout,
//! and judged by their output file. Every Slurm command gets only SLURM_CONF from the
//! SLURM_* environment, so running the tests inside another allocation changes nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use zero_tests::slurm::{slurm_conf, submit, text, wait, Finished};
use zero_tests::JobOutput;

/// A 4-rank job (2 nodes x 2) starts in well under a second when healthy; the bound is
/// for a loaded, shared machine.
const JOB_TIMEOUT: Duration = Duration::from_secs(120);

/// A fresh directory for one test's job files.
fn job_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("slurm_cluster")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

/// Submit and wait up to JOB_TIMEOUT; panics (after cancelling) on timeout.
fn run_batch(conf: &str, args: &[&str], env: &[(&str, &str)]) -> (u64, Finished) {
    let id = submit(conf, args, env);
    match wait(conf, id, JOB_TIMEOUT) {
        Ok(finished) => (id, finished),
        Err(e) => panic!("{e}"),
    }
}

/// The job's output file as a JobOutput of `ranks` ranks, so that `assert_all_ok` checks
/// one `OK rank=r` line per rank and success.
fn job_output(ranks: usize, finished: &Finished, file: &Path) -> JobOutput {
    let stdout = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("job output {} unreadable: {e}", file.display()));
    JobOutput {
        ranks,
        code: Some(if finished.state == "COMPLETED" { 0 } else { 1 }),
        timed_out: false,
        elapsed: finished.elapsed,
        stdout,
        stderr: format!(
            "(job state {}; stderr is in the file above)",
            finished.state
        ),
    }
}

/// From the `rank=.. node=.. local_rank=.. local_size=..` lines of slurm_mpi_hello:
/// node name -> (local ranks seen, sorted; local sizes reported).
fn layout(stdout: &str) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<usize>)> {
    let mut nodes = std::collections::BTreeMap::<String, (Vec<usize>, Vec<usize>)>::new();
    for line in stdout.lines().filter(|l| l.starts_with("rank=")) {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in '{line}'"))
                .to_string()
        };
        let number = |key: &str| {
            field(key)
                .parse::<usize>()
                .unwrap_or_else(|e| panic!("{key} in '{line}': {e}"))
        };
        let entry = nodes.entry(field("node=")).or_default();
        entry.0.push(number("local_rank="));
        entry.1.push(number("local_size="));
    }
    for (ranks, _) in nodes.values_mut() {
        ranks.sort_unstable();
    }
    nodes
}

/// Two nodes, two ranks each, local ranks 0 and 1 on each: what -N 2
/// --ntasks-per-node=2 must give.
fn assert_two_by_two(out: &JobOutput) {
    let nodes = layout(&out.stdout);
    let expected: std::collections::BTreeMap<String, (Vec<usize>, Vec<usize>)> = [
        ("n1".to_string(), (vec![0, 1], vec![2, 2])),
        ("n2".to_string(), (vec![0, 1], vec![2, 2])),
    ]
    .into_iter()
    .collect();
    assert_eq!(nodes, expected, "node-local layout\n{}", out.transcript());
}

#[test]
fn mpi_job_spans_two_nodes_with_two_local_ranks_each() {
    let conf = slurm_conf();
    let dir = job_dir("hello");
    let script = dir.join("hello.sbatch");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\nset -euo pipefail\nsrun --mpi=pmix {}\n",
            env!("CARGO_BIN_EXE_slurm_mpi_hello")
        ),
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", script.display()));
    let output = dir.join("hello.out");
    let (id, finished) = run_batch(
        &conf,
        &[
            "-N",
            "2",
            "--ntasks-per-node=2",
            "--time=00:02:00",
            "--job-name=zero-test-hello",
            &format!("--chdir={}", dir.display()),
            &format!("--output={}", output.display()),
            &script.display().to_string(),
        ],
        &[],
    );
    let out = job_output(4, &finished, &output);
    eprintln!("job {id}: {} in {:?}", finished.state, finished.elapsed);
    out.assert_all_ok();
    assert_two_by_two(&out);
}

/// comm.sbatch's own plumbing (allocation check, finding the binary, srun --mpi=pmix
/// across both nodes) with slurm_mpi_hello standing in for zero-bench, which ignores the
/// `micro comm ...` arguments the script passes.
#[test]
fn comm_sbatch_launches_its_program_on_every_rank_of_both_nodes() {
    let conf = slurm_conf();
    let dir = job_dir("comm");
    let output = dir.join("comm.out");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm/comm.sbatch");
    let (id, finished) = run_batch(
        &conf,
        &[
            &format!("--chdir={}", dir.display()),
            &format!("--output={}", output.display()),
            &script.display().to_string(),
        ],
        &[("ZERO_BENCH", env!("CARGO_BIN_EXE_slurm_mpi_hello"))],
    );
    let out = job_output(4, &finished, &output);
    eprintln!("job {id}: {} in {:?}", finished.state, finished.elapsed);
    out.assert_all_ok();
    assert_two_by_two(&out);
    assert!(
        out.stdout
            .contains("micro comm --self-test --max-size 16MiB"),
        "comm.sbatch did not run the self-test command\n{}",
        out.transcript()
    );
}

#[test]
fn comm_sbatch_refuses_to_run_outside_an_allocation() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm/comm.sbatch");
    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SLURM_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash {}: {e}", script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr.contains("not inside a Slurm allocation") && stderr.contains("sbatch"),
        "{}",
        text(&out)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("running:"),
        "it went on to launch\n{}",
        text(&out)
    );
}

/// A job that outruns its wait is cancelled, so nothing a test submits outlives it.
#[test]
fn a_job_past_its_wait_is_cancelled() {
    let conf = slurm_conf();
    let dir = job_dir("hang");
    let id = submit(
        &conf,
        &[
            "-n",
            "1",
            "--time=00:05:00",
            "--job-name=zero-test-hang",
            &format!("--chdir={}", dir.display()),
            &format!("--output={}", dir.join("hang.out").display()),
            "--wrap=sleep 300",
        ],
        &[],
    );
    let err = match wait(&conf, id, Duration::from_secs(2)) {
        Ok(f) => panic!("job {id} finished ({}) instead of hanging", f.state),
        Err(e) => e,
    };
    assert!(
        err.contains("not finished after") && err.ends_with("; cancelled"),
        "{err}"
    );
    // scancel is asynchronous: the job reaches CANCELLED shortly after.
    let finished = wait(&conf, id, JOB_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(finished.state, "CANCELLED", "job {id} after scancel");
}
