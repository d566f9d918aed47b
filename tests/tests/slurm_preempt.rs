//! Time limits and preemption on a real Slurm cluster (the two-node local cluster of
//! scripts/slurm-cluster): slurm/train.sbatch submitted with a two-minute time limit gets
//! SIGUSR1 from Slurm's time-limit warning, every rank finishes its step, they save a
//! checkpoint together and exit 85, the script requeues the job, and the requeued job
//! resumes from the checkpoint. The whole loss curve (metrics.jsonl, appended across the
//! runs) equals an uninterrupted run's under mpirun, bit for bit (fp32, 4 micro-batches
//! accumulated per step, the same 2 ranks).
//!
//! One rank per node: the two emulated nodes share this machine's cores, and 4 ranks on 2
//! cores under srun (which, unlike `mpirun --oversubscribe`, does not tell Open MPI that
//! ranks share a core) spin in MPI waits while the rank they wait for is off its core:
//! steps that take 30 ms took seconds at times, and a run of 1000 steps 9 minutes.
//!
//! When the warning comes: slurmctld checks time limits every 30 s and signals a job once
//! its time left is at most the `--signal` time plus 30 s (measured on Slurm 22.05: jobs
//! of a 120 s limit asking `USR1@60` got it with 63-75 s left). So the first run is
//! signalled between [`LIMIT_S`] - [`WARN_S`] - 30 s and [`LIMIT_S`] - [`WARN_S`] after
//! its start: never during its first seconds, where the signal would find no step yet
//! (and be lost) or a task still in its TaskProlog or exec (and kill it). The script's
//! own `USR1@120` with a one-minute limit is due at the first check, which may be any
//! time in those first seconds; the test therefore gives `--signal` on the command line
//! (it overrides the script's `#SBATCH` line; the mechanism is the same).
//!
//! Two more things the test does that a user would not: Slurm holds a requeued job for
//! about two minutes before it may start again, and the test lets it start after 10 s;
//! and it gives the requeued run a longer time limit (the warning would otherwise come
//! again at once), so the job ends after one requeue instead of many. Both are
//! `scontrol update` of the pending job.
//!
//! Needs the cluster up, as tests/tests/slurm_cluster.rs; never skips.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use zero_tests::cli::repo;
use zero_tests::slurm::{job_state, slurm, slurm_conf, submit, text};
use zero_tests::{zero_bench_bin, MpiJob};

/// The first run's time limit (`--time=2`).
const LIMIT_S: u64 = 120;
/// Its warning time (`--signal=USR1@85`): the signal comes 5-35 s after the start.
const WARN_S: u64 = 85;

/// Long enough that the first run is still training when the warning comes (at most
/// [`LIMIT_S`] - [`WARN_S`] = 35 s after the start). On the emulated two-node cluster, 2
/// ranks, a step of 4 micro-batches took 39-41 ms (AMD EPYC Zen 2), so a whole run takes
/// 80 s: twice the warning's latest time at twice that speed.
const STEPS: usize = 2000;

fn job_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("slurm_preempt")
        .join(format!("job-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

fn losses(path: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"));
            let step = v["step"].as_u64().unwrap_or_else(|| panic!("no step: {l}"));
            let loss = v["loss"].as_f64().unwrap_or_else(|| panic!("no loss: {l}"));
            (step, loss.to_bits())
        })
        .collect()
}

/// `scontrol show job` field `key` of job `id` ("" when absent).
fn job_field(conf: &str, id: u64, key: &str) -> String {
    let out = slurm(conf, "scontrol")
        .args(["show", "job", &id.to_string()])
        .output()
        .unwrap_or_else(|e| panic!("scontrol: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or("")
        .to_string()
}

/// The controller's log lines on job `id` (why it was requeued, by whom), for failures.
fn controller_log(conf: &str, id: u64) -> String {
    let conf_text = std::fs::read_to_string(conf).unwrap_or_default();
    let Some(path) = conf_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("SlurmctldLogFile="))
    else {
        return format!("(no SlurmctldLogFile in {conf})");
    };
    let tag = format!("JobId={id}");
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| format!("({path}: {e})"))
        .lines()
        .filter(|l| {
            l.match_indices(&tag)
                .any(|(at, _)| !l[at + tag.len()..].starts_with(|c: char| c.is_ascii_digit()))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_job_signalled_before_its_time_limit_checkpoints_requeues_and_resumes_bitwise() {
    let conf = slurm_conf();
    let dir = job_dir();
    let bench = zero_bench_bin().display().to_string();
    let demo = repo("configs/demo.toml");
    let train_args = [
        "--precision".to_string(),
        "fp32".into(),
        "--stage".into(),
        "2".into(),
        "--steps".into(),
        STEPS.to_string(),
        "--set".into(),
        "train.grad_accum=4".into(),
    ];
    let output = dir.join("job.out");
    let (chdir, out, time, warn) = (
        format!("--chdir={}", dir.display()),
        format!("--output={}", output.display()),
        format!("--time={}", LIMIT_S / 60),
        format!("--signal=USR1@{WARN_S}"),
    );
    let script = repo("slurm/train.sbatch");
    // What the command line overrides: the script asks for the warning itself.
    let script_text = std::fs::read_to_string(&script).unwrap_or_else(|e| panic!("{script}: {e}"));
    assert!(
        script_text.contains("\n#SBATCH --signal=USR1@120\n"),
        "{script} no longer asks for SIGUSR1 before the time limit"
    );
    let mut args: Vec<&str> = vec![&chdir, &out, &time, &warn, "--ntasks-per-node=1", &script];
    args.extend(train_args.iter().map(String::as_str));
    let id = submit(&conf, &args, &[("ZERO_BENCH", &bench), ("CONFIG", &demo)]);

    // Follow the job: once requeued (pending on its begin time), let it start now with a
    // longer limit; then wait for the end.
    let start = Instant::now();
    let mut nudged = false;
    let state = loop {
        let state = job_state(&conf, id);
        if state == "PENDING" && !nudged && job_field(&conf, id, "Reason") == "BeginTime" {
            let upd = slurm(&conf, "scontrol")
                // (now+10: the first run's step daemons finish their cleanup first; a
                // requeued job keeps its id, and its new step would reuse their sockets.)
                .args([
                    "update",
                    &format!("JobId={id}"),
                    "StartTime=now+10",
                    "TimeLimit=20",
                ])
                .output()
                .unwrap_or_else(|e| panic!("scontrol update: {e}"));
            assert!(upd.status.success(), "{}", text(&upd));
            nudged = true;
        }
        if [
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
        ]
        .contains(&state.as_str())
        {
            break state;
        }
        if start.elapsed() > Duration::from_secs(600) {
            let _ = slurm(&conf, "scancel").arg(id.to_string()).output();
            panic!(
                "job {id} not finished after 10 min (state '{state}')\n{}\nslurmctld:\n{}",
                std::fs::read_to_string(&output).unwrap_or_default(),
                controller_log(&conf, id)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let log = std::fs::read_to_string(&output).unwrap_or_default();
    assert_eq!(
        state,
        "COMPLETED",
        "job {id}\n{log}\nslurmctld:\n{}",
        controller_log(&conf, id)
    );
    assert!(nudged, "the job was never requeued\n{log}");
    for needle in [
        "stopped by SIGUSR1 after step",
        "(exit status 85)",
        "requeueing job",
        "(restart 1): resuming from",
        "done: metrics",
    ] {
        assert!(log.contains(needle), "job output lacks {needle:?}\n{log}");
    }
    assert_eq!(
        job_field(&conf, id, "Restarts"),
        "1",
        "{log}\nslurmctld on job {id}:\n{}",
        controller_log(&conf, id)
    );

    // The uninterrupted run, under mpirun on the same 2 ranks.
    let reference = dir.join("reference.jsonl");
    let mut ref_args = vec![
        "train".to_string(),
        "--config".into(),
        demo.clone(),
        "--no-progress".into(),
        "--metrics".into(),
        reference.display().to_string(),
    ];
    ref_args.extend(train_args.iter().cloned());
    let r = MpiJob::new(2, &bench)
        .args(ref_args)
        .timeout(Duration::from_secs(600))
        .run();
    assert_eq!(r.code, Some(0), "reference run\n{}", r.transcript());

    // The whole curve, every step once, equals the uninterrupted run's bit for bit.
    let run_dir = dir.join(format!("zero-train-{id}"));
    let got = losses(&run_dir.join("metrics.jsonl"));
    let want = losses(&reference);
    assert_eq!(want.len(), STEPS);
    assert_eq!(
        got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        (1..=STEPS as u64).collect::<Vec<_>>(),
        "steps of the job's metrics"
    );
    for ((s, a), (_, b)) in got.iter().zip(&want) {
        assert_eq!(
            a,
            b,
            "step {s}: loss {} after the requeue vs {} uninterrupted",
            f64::from_bits(*a),
            f64::from_bits(*b)
        );
    }
    let ckpt = run_dir.join("ckpt");
    let latest = std::fs::read_to_string(ckpt.join("latest")).unwrap_or_default();
    assert_eq!(latest.trim(), format!("step-{STEPS}"), "{log}");
}
