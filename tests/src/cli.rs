//! Running the real `zero-bench train` from CLI tests: the binary of this profile under
//! mpirun, files of the repository, and the JSON its runs write.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::{zero_bench_bin, JobOutput, MpiJob};

/// `zero-bench COMMAND ARGS...` as one process (no launcher), run to its end, logging
/// at `info` whatever the caller's RUST_LOG says (see [`MpiJob::run`]).
pub fn command(command: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(zero_bench_bin())
        .arg(command)
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .expect("zero-bench starts")
}

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

/// A `--json` summary stage's `nodes` (hpZ/qgZ runs): M nodes of L ranks, and the bytes
/// each rank sent on the node and cross-node groups and those leaving each node equal
/// the ledger's. Returns how many times fewer bytes left each node than the ledger gives
/// with the switches off.
pub fn assert_node_traffic(stage: &Value, nodes: u64, ranks_per_node: u64, what: &str) -> f64 {
    let traffic = &stage["nodes"];
    let get = |key: &str| {
        traffic[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: no nodes.{key} in {stage}"))
    };
    assert_eq!(
        (get("nodes"), get("ranks_per_node")),
        (nodes, ranks_per_node),
        "{what}"
    );
    for (measured, ledger) in [
        ("node_sent_bytes_per_step", "node_plan_bytes_per_step"),
        ("cross_sent_bytes_per_step", "cross_plan_bytes_per_step"),
        ("egress_bytes_per_step", "egress_plan_bytes_per_step"),
    ] {
        assert_eq!(get(measured), get(ledger), "{what}: {measured}\n{stage}");
    }
    get("egress_exact_plan_bytes_per_step") as f64 / get("egress_bytes_per_step").max(1) as f64
}

/// How a command stopped by [`terminate_when`] ended.
#[derive(Debug)]
pub struct Terminated {
    /// `ready` held before the signal was sent (else it was sent at the deadline).
    pub was_ready: bool,
    /// The exit status: `None` when it did not end within 120 s of the signal and was
    /// killed, its whole process group with it.
    pub code: Option<i32>,
    /// What it printed (stdout and stderr, in one file).
    pub text: String,
}

/// `zero-bench ARGS...` in `dir`, its output in `dir/<log>`, sent SIGTERM (it alone, as
/// `kill` or a scheduler sends it) once `ready()` holds, or after 120 s if it never does;
/// then waited for. A command that outlives the signal by 120 s is killed with its
/// process group (the jobs it launched), so that nothing outlives the test.
pub fn terminate_when(
    dir: &Path,
    args: &[&str],
    log: &str,
    ready: impl Fn() -> bool,
) -> Terminated {
    use std::os::unix::process::CommandExt;
    let log = dir.join(log);
    let file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let err = file
        .try_clone()
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let mut child = std::process::Command::new(zero_bench_bin())
        .current_dir(dir)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(err)
        .process_group(0)
        .spawn()
        .expect("zero-bench starts");
    let pid = child.id() as libc::pid_t;
    let poll = |deadline: Duration, done: &mut dyn FnMut() -> bool| {
        let start = std::time::Instant::now();
        while !done() {
            if start.elapsed() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    };
    // Until ready, or until it ended by itself (then there is no one to signal).
    let mut status = None;
    let was_ready = poll(Duration::from_secs(120), &mut || {
        status = child.try_wait().ok().flatten();
        status.is_some() || ready()
    }) && status.is_none();
    if status.is_none() {
        // SAFETY: kill(2) on our own child, not yet reaped; no memory involved.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        poll(Duration::from_secs(120), &mut || {
            status = child.try_wait().ok().flatten();
            status.is_some()
        });
    }
    if status.is_none() {
        crate::kill_job(pid);
        let _ = child.wait();
    }
    Terminated {
        was_ready,
        code: status.and_then(|s| s.code()),
        text: std::fs::read_to_string(&log).unwrap_or_default(),
    }
}
