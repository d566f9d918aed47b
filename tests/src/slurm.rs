//! Submitting jobs to the local Slurm cluster of scripts/slurm-cluster from tests.
//!
//! The cluster must be up (`scripts/slurm-cluster/start.sh`, which writes
//! `$ZERO_SLURM_DIR/env`, default /tmp/zero-slurm/env, with the SLURM_CONF line). When it
//! is not, [`slurm_conf`] fails the test saying how to start it; tests never skip. Every
//! Slurm command gets only SLURM_CONF from the SLURM_* environment, so running the tests
//! inside another allocation changes nothing. Jobs are polled with `squeue` (faster than
//! `sbatch --wait`) and cancelled on timeout.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The cluster's SLURM_CONF, read from the file start.sh wrote; panics with how to start
/// the cluster when it is not there or not answering.
pub fn slurm_conf() -> String {
    let dir = std::env::var("ZERO_SLURM_DIR").unwrap_or_else(|_| "/tmp/zero-slurm".into());
    let env_file = Path::new(&dir).join("env");
    let how = "start it with scripts/slurm-cluster/start.sh (install Slurm first with \
               scripts/setup.sh --slurm; set ZERO_SLURM_DIR if you started it elsewhere)";
    let env_text = std::fs::read_to_string(&env_file).unwrap_or_else(|e| {
        panic!(
            "the local Slurm cluster is not up ({} unreadable: {e}): {how}",
            env_file.display()
        )
    });
    let conf = env_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("export SLURM_CONF="))
        .unwrap_or_else(|| panic!("no 'export SLURM_CONF=' line in {}", env_file.display()))
        .to_string();
    // scontrol retries a missing config file for 60 s: fail at once instead.
    assert!(
        Path::new(&conf).is_file(),
        "the local Slurm cluster is not up ({conf} is missing): {how}"
    );
    let ping = match slurm(&conf, "scontrol").arg("ping").output() {
        Ok(o) => text(&o),
        Err(e) => format!("cannot run scontrol: {e}"),
    };
    assert!(
        ping.contains("is UP"),
        "the local Slurm cluster is not answering: {how}\nscontrol ping: {ping}"
    );
    conf
}

/// A Slurm client command talking to our cluster only.
pub fn slurm(conf: &str, program: &str) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SLURM_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("SLURM_CONF", conf);
    cmd
}

pub fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// How a submitted job ended.
pub struct Finished {
    /// Final state (COMPLETED, FAILED, CANCELLED, ...).
    pub state: String,
    /// Time from the first poll to the final state.
    pub elapsed: Duration,
}

/// `sbatch --parsable args...` with extra environment; returns the job id.
pub fn submit(conf: &str, args: &[&str], env: &[(&str, &str)]) -> u64 {
    let mut cmd = slurm(conf, "sbatch");
    cmd.arg("--parsable").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run sbatch: {e}"));
    assert!(
        out.status.success(),
        "sbatch {args:?} failed\n{}",
        text(&out)
    );
    // --parsable prints "<id>" or "<id>;<cluster>".
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .split(';')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("sbatch printed no job id\n{}", text(&out)))
}

/// The job's state as squeue reports it ("" once Slurm has forgotten the job).
pub fn job_state(conf: &str, id: u64) -> String {
    // -t all: a finished job stays listed (MinJobAge) with its final state.
    let q = slurm(conf, "squeue")
        .args(["-h", "-t", "all", "-o", "%T", "-j", &id.to_string()])
        .output()
        .unwrap_or_else(|e| panic!("cannot run squeue: {e}"));
    String::from_utf8_lossy(&q.stdout).trim().to_string()
}

/// Poll until the job reaches a final state; after `timeout`, scancel it and return
/// the error.
pub fn wait(conf: &str, id: u64, timeout: Duration) -> Result<Finished, String> {
    let start = Instant::now();
    loop {
        let state = job_state(conf, id);
        let active = [
            "",
            "PENDING",
            "CONFIGURING",
            "RUNNING",
            "COMPLETING",
            "SUSPENDED",
        ];
        if !active.contains(&state.as_str()) {
            return Ok(Finished {
                state,
                elapsed: start.elapsed(),
            });
        }
        if start.elapsed() > timeout {
            let cancel = match slurm(conf, "scancel").arg(id.to_string()).output() {
                Ok(o) if o.status.success() => "cancelled".to_string(),
                Ok(o) => format!("scancel failed: {}", text(&o)),
                Err(e) => format!("scancel did not run: {e}"),
            };
            return Err(format!(
                "job {id} not finished after {timeout:?} (last state '{state}'); {cancel}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
