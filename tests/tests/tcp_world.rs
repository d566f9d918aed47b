//! `train` without MPI: processes of the carried build (no MPI linked) joined over TCP by
//! `ZERO_RENDEZVOUS` (zero-comm's `socket.rs`), as on a cluster whose srun has no PMI.
//!
//! - Two processes started by hand train every stage to the bits of `mpirun -n 2` with
//!   the MPI build, with the same communication and memory ledgers.
//! - `srun --mpi=none` on the local two-node Slurm cluster does the same.
//! - A rank killed mid-run ends the others at once with its rank named; a rank that never
//!   comes is named after ZERO_RENDEZVOUS_TIMEOUT; a process started as one of several
//!   ranks without ZERO_RENDEZVOUS says what to set; the MPI build started alone with
//!   ZERO_RENDEZVOUS for a larger world refuses to train alone.
//! - ZeRO++'s node groups form over TCP too (4 processes as 2 emulated nodes of 2): hpZ
//!   trains the flat run's bits, and the node and cross-node bytes are the ledger's.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zero_tests::carried_bin;
use zero_tests::cli::{ok, read_json, repo, s, train};
use zero_tests::slurm::{slurm, slurm_conf, text};

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("tcp_world")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

/// The demo model, a few steps, every stage, bf16 (gradients reduced in bf16: the
/// half-precision sums too).
fn run_args(steps: usize) -> Vec<String> {
    [
        "--config",
        &repo("configs/demo.toml"),
        "--steps",
        &steps.to_string(),
        "--stages",
        "0,1,2,3",
        "--precision",
        "bf16",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

/// Start `size` processes of the carried build, rank r with `ZERO_RANK=r`, joined by a
/// rendezvous file in `dir`; `args_of(r)` are rank r's arguments after `train`.
fn start_world(
    dir: &Path,
    size: usize,
    env: &[(&str, &str)],
    args_of: impl Fn(usize) -> Vec<String>,
) -> Vec<(Child, PathBuf)> {
    (0..size)
        .map(|r| {
            // Files, not pipes: a rank is never held up writing its log.
            let out = std::fs::File::create(dir.join(format!("rank{r}.out"))).expect("a log file");
            let err = std::fs::File::create(dir.join(format!("rank{r}.err"))).expect("a log file");
            let mut cmd = Command::new(carried_bin());
            cmd.arg("train")
                .args(args_of(r))
                .current_dir(dir)
                .env(
                    "ZERO_RENDEZVOUS",
                    format!("file:{}", s(&dir.join("rendezvous"))),
                )
                .env("ZERO_RANK", r.to_string())
                .env("ZERO_WORLD_SIZE", size.to_string())
                .env("RUST_BACKTRACE", "0")
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err);
            for (k, v) in env {
                cmd.env(k, v);
            }
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("starting rank {r} of the carried build: {e}"));
            (child, dir.join(format!("rank{r}")))
        })
        .collect()
}

/// How one process ended: exit code (None: killed, or by us at the deadline), its text.
struct Ended {
    code: Option<i32>,
    text: String,
}

/// Wait for every process, killing those still running at `deadline` from now.
fn finish(children: Vec<(Child, PathBuf)>, deadline: Duration) -> Vec<Ended> {
    let t0 = Instant::now();
    children
        .into_iter()
        .map(|(mut c, logs)| {
            let code = loop {
                match c.try_wait().expect("waiting for a rank") {
                    Some(status) => break status.code(),
                    None if t0.elapsed() > deadline => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break None;
                    }
                    None => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            let read =
                |ext: &str| std::fs::read_to_string(logs.with_extension(ext)).unwrap_or_default();
            Ended {
                code,
                text: format!(
                    "--- stdout ---\n{}--- stderr ---\n{}",
                    read("out"),
                    read("err")
                ),
            }
        })
        .collect()
}

/// Per stage: (losses, bytes sent per step, ledger bytes per rank), from a `--json` report.
fn curves(report: &Value) -> Vec<(Value, Value, Value)> {
    report["stages"]
        .as_array()
        .expect("stages in the report")
        .iter()
        .map(|st| {
            (
                st["losses"].clone(),
                st["comm_sent_bytes_per_step"].clone(),
                st["ledger_bytes_per_rank"].clone(),
            )
        })
        .collect()
}

/// The same run under `mpirun -n 2` with the MPI build: the reference.
fn mpirun_reference(dir: &Path, steps: usize) -> Value {
    let json = dir.join("mpirun.json");
    let mut args = run_args(steps);
    args.extend(["--json".to_string(), s(&json)]);
    ok(&train(2, &args));
    read_json(&json)
}

#[test]
fn two_processes_without_mpi_train_the_bits_of_mpirun() {
    let dir = scratch("by_hand");
    let steps = 6;
    let json = dir.join("tcp.json");
    let ended = finish(
        start_world(&dir, 2, &[], |r| {
            let mut a = run_args(steps);
            if r == 0 {
                a.extend(["--json".to_string(), s(&json)]);
            }
            a
        }),
        Duration::from_secs(180),
    );
    for (r, e) in ended.iter().enumerate() {
        assert_eq!(e.code, Some(0), "rank {r} failed\n{}", e.text);
    }
    assert!(
        ended[0]
            .text
            .contains("the host collectives go over the TCP world of 2 ranks"),
        "rank 0 says what carries the collectives\n{}",
        ended[0].text
    );
    let tcp = curves(&read_json(&json));
    let mpi = curves(&mpirun_reference(&dir, steps));
    assert_eq!((tcp.len(), mpi.len()), (4, 4), "one report per stage");
    for (stage, (t, m)) in tcp.iter().zip(&mpi).enumerate() {
        // Two ranks: every sum is a + b in both transports, so the bits agree.
        assert_eq!(t.0, m.0, "stage {stage}: losses (TCP, then mpirun)");
        assert_eq!(t.1, m.1, "stage {stage}: bytes sent per step");
        assert_eq!(t.2, m.2, "stage {stage}: ledger per rank");
    }
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("the scratch directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("rendezvous"))
        .collect();
    assert!(
        left.is_empty(),
        "rank 0 removes the rendezvous file once everyone joined: {left:?}"
    );
}

#[test]
fn srun_without_pmi_joins_the_ranks_over_tcp() {
    let conf = slurm_conf();
    let dir = scratch("srun");
    let steps = 6;
    let json = dir.join("srun.json");
    let mut args = run_args(steps);
    args.extend(["--json".to_string(), s(&json)]);
    // One task per emulated node; --mpi=none: no PMI, as on a cluster without PMIx.
    let out = slurm(&conf, "srun")
        .args(["--mpi=none", "-N", "2", "-n", "2", "--time=5"])
        .arg(carried_bin())
        .arg("train")
        .args(&args)
        .current_dir(&dir)
        .env("ZERO_RENDEZVOUS", format!("file:{}", s(&dir.join("rv"))))
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("srun runs");
    assert!(out.status.success(), "srun failed\n{}", text(&out));
    let tcp = curves(&read_json(&json));
    let mpi = curves(&mpirun_reference(&dir, steps));
    assert_eq!((tcp.len(), mpi.len()), (4, 4), "one report per stage");
    for (stage, (t, m)) in tcp.iter().zip(&mpi).enumerate() {
        assert_eq!(
            t.0, m.0,
            "stage {stage}: losses (srun over TCP, then mpirun)"
        );
        assert_eq!(t.1, m.1, "stage {stage}: bytes sent per step");
        assert_eq!(t.2, m.2, "stage {stage}: ledger per rank");
    }
}

#[test]
fn a_killed_rank_ends_the_others_at_once_naming_it() {
    let dir = scratch("killed");
    let metrics = dir.join("metrics.jsonl");
    let mut children = start_world(&dir, 3, &[], |r| {
        let mut a = vec![
            "--config".to_string(),
            repo("configs/demo.toml"),
            "--steps".to_string(),
            "100000".to_string(),
        ];
        if r == 0 {
            a.extend(["--metrics".to_string(), s(&metrics)]);
        }
        a
    });
    // Training is under way once rank 0 has logged a step.
    let t0 = Instant::now();
    while std::fs::read_to_string(&metrics).map_or(true, |m| m.lines().count() < 2) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no step within 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (mut victim, _) = children.pop().expect("rank 2");
    victim.kill().expect("killing rank 2");
    let _ = victim.wait();
    // The watchdog's default is 30 minutes: only the closed connection can end them now
    // (a rank still running at the 60 s deadline is killed, and has no exit code).
    let ended = finish(children, Duration::from_secs(60));
    for (r, e) in ended.iter().enumerate() {
        assert!(
            e.code.is_some_and(|c| c != 0),
            "rank {r} should fail by itself (code {:?})\n{}",
            e.code,
            e.text
        );
    }
    assert!(
        ended[0].text.contains("the connection to rank 2 failed"),
        "rank 0 names the rank that went\n{}",
        ended[0].text
    );
    assert!(
        ended[1].text.contains("since rank 0 failed") && ended[1].text.contains("rank 2"),
        "rank 1 passes on rank 0's verdict\n{}",
        ended[1].text
    );
}

#[test]
fn a_rank_that_never_comes_is_named_and_no_rank_waits_forever() {
    let dir = scratch("never");
    let ended = finish(
        start_world(
            &dir,
            1,
            &[("ZERO_WORLD_SIZE", "3"), ("ZERO_RENDEZVOUS_TIMEOUT", "2")],
            |_| {
                vec![
                    "--config".to_string(),
                    repo("configs/demo.toml"),
                    "--steps".into(),
                    "2".into(),
                ]
            },
        ),
        Duration::from_secs(60),
    );
    assert_eq!(ended[0].code, Some(1), "{}", ended[0].text);
    assert!(
        ended[0]
            .text
            .contains("rank(s) 1, 2 did not join within 2 s"),
        "{}",
        ended[0].text
    );
}

#[test]
fn one_of_several_ranks_without_a_rendezvous_says_what_to_set() {
    let dir = scratch("unjoined");
    let out = Command::new(carried_bin())
        .args([
            "train",
            "--config",
            &repo("configs/demo.toml"),
            "--steps",
            "2",
        ])
        .current_dir(&dir)
        .env_remove("ZERO_RENDEZVOUS")
        .env("SLURM_PROCID", "1")
        .env("SLURM_STEP_NUM_TASKS", "2")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("the carried build runs");
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("SLURM_PROCID=1") || said.contains("SLURM_STEP_NUM_TASKS=2"),
        "names what said so\n{said}"
    );
    assert!(
        said.contains("ZERO_RENDEZVOUS=file:"),
        "says what to set\n{said}"
    );
    assert!(!said.contains("panicked"), "{said}");
}

#[test]
fn the_mpi_build_told_of_a_tcp_world_refuses_to_train_alone() {
    let dir = scratch("mpi_build");
    let out = Command::new(zero_tests::zero_bench_bin())
        .args([
            "train",
            "--config",
            &repo("configs/demo.toml"),
            "--steps",
            "2",
        ])
        .current_dir(&dir)
        .env("ZERO_RENDEZVOUS", format!("file:{}", s(&dir.join("rv"))))
        .env("ZERO_RANK", "0")
        .env("ZERO_WORLD_SIZE", "2")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("the MPI build runs");
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("joins ranks through MPI and MPI started it alone"),
        "{said}"
    );
    assert!(!said.contains("step 1"), "no step ran\n{said}");
}

/// A 4-process TCP-world run of `configs/tiny.toml` at stage 3 on 2 emulated nodes of 2,
/// with `extra` arguments: the report's stage.
fn four_on_two_nodes(name: &str, extra: &[&str]) -> Value {
    let dir = scratch(name);
    let json = dir.join("report.json");
    let ended = finish(
        start_world(&dir, 4, &[], |r| {
            let mut a: Vec<String> = [
                "--config",
                &repo("configs/tiny.toml"),
                "--stage",
                "3",
                "--precision",
                "bf16",
                "--steps",
                "4",
                "--no-progress",
                "--set",
                "zero.ranks_per_node=2",
            ]
            .iter()
            .chain(extra)
            .map(|x| x.to_string())
            .collect();
            if r == 0 {
                a.extend(["--json".to_string(), s(&json)]);
            }
            a
        }),
        Duration::from_secs(180),
    );
    for (r, e) in ended.iter().enumerate() {
        assert_eq!(e.code, Some(0), "{name}: rank {r} failed\n{}", e.text);
    }
    read_json(&json)["stages"][0].clone()
}

#[test]
fn zero_plus_plus_node_groups_form_over_tcp() {
    // hpZ's backward gathers on the node group: the flat run's bits.
    let flat = four_on_two_nodes("flat", &[]);
    let hpz = four_on_two_nodes("hpz", &["--set", "zero.hierarchical_weights=true"]);
    assert_eq!(hpz["losses"], flat["losses"], "hpZ over TCP node groups");
    zero_tests::cli::assert_node_traffic(&hpz, 2, 2, "hpZ over TCP");
    // All three switches: the bytes on the node and cross-node groups are the ledger's.
    let all = four_on_two_nodes(
        "all",
        &[
            "--set",
            "zero.hierarchical_weights=true",
            "--set",
            "zero.quantize_weights=true",
            "--set",
            "zero.quantize_grads=true",
        ],
    );
    let cut = zero_tests::cli::assert_node_traffic(&all, 2, 2, "ZeRO++ over TCP");
    assert!(cut > 2.0, "{cut:.2}x fewer bytes leaving each node");
}
