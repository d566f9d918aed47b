//! ZeRO++'s hierarchical switches under real mpirun, as users run them: 4 ranks as 2
//! emulated nodes of 2 (`zero.ranks_per_node = 2`), `configs/tiny.toml` at stage 3.
//!
//! - hpZ alone trains the same bits as the flat gathers (its backward gathers are copies
//!   of what the forward gathered), with its backward gathers on the node group;
//! - all three switches on the host and on the simulated GPU through host-staged MPI
//!   (`--comm mpi-staged`: the node groups' own staging): the bytes on the node and
//!   cross-node groups, and leaving each node, equal the ledger's, per step in the
//!   metrics and in the summary;
//! - ranks per node that do not divide the world stop every rank with the reason.
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench --release` (scripts/test.sh does).

use std::path::PathBuf;

use serde_json::Value;
use zero_tests::cli::{assert_node_traffic, ok, read_json, read_lines, repo, s, train};

const STEPS: usize = 4;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("zeropp-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// A 4-rank stage-3 run with `extra` arguments: (metrics lines, the summary's stage).
fn run(name: &str, extra: &[&str]) -> (Vec<Value>, Value) {
    run_for(name, STEPS, STEPS, extra)
}

/// [`run`] to step `steps`, which runs `ran` steps (fewer after a resume).
fn run_for(name: &str, steps: usize, ran: usize, extra: &[&str]) -> (Vec<Value>, Value) {
    let dir = scratch(name);
    let (metrics, json) = (dir.join("metrics.jsonl"), dir.join("summary.json"));
    let mut args: Vec<String> = [
        "--config",
        &repo("configs/tiny.toml"),
        "--stage",
        "3",
        "--precision",
        "bf16",
        "--steps",
        &steps.to_string(),
        "--no-progress",
        "--set",
        "zero.ranks_per_node=2",
        "--metrics",
        &s(&metrics),
        "--json",
        &s(&json),
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    args.extend(extra.iter().map(|x| x.to_string()));
    let out = train(4, &args);
    ok(&out);
    let lines = read_lines(&metrics);
    assert_eq!(lines.len(), ran, "{name}");
    let summary = read_json(&json);
    (lines, summary["stages"][0].clone())
}

fn losses(lines: &[Value]) -> Vec<u64> {
    lines
        .iter()
        .map(|l| l["loss"].as_f64().expect("loss").to_bits())
        .collect()
}

/// Bytes of one kind sent in the last step on a group's metrics object.
fn sent(line: &Value, group: &str, kind: &str) -> u64 {
    line[group][kind]
        .as_u64()
        .unwrap_or_else(|| panic!("no {group}.{kind} in {line}"))
}

#[test]
fn hierarchical_weights_train_the_same_bits_with_backward_gathers_inside_the_node() {
    let (flat, _) = run("flat", &[]);
    let (hpz, stage) = run("hpz", &["--set", "zero.hierarchical_weights=true"]);
    assert_eq!(losses(&hpz), losses(&flat));
    assert_node_traffic(&stage, 2, 2, "hpZ");
    let last = &hpz[STEPS - 1];
    assert!(
        sent(last, "node_comm_sent_bytes", "all_gather") > 0,
        "{last}"
    );
    assert_eq!(
        sent(last, "cross_comm_sent_bytes", "all_to_all"),
        0,
        "{last}"
    );
    // The backward's gathers left the world: each of E elements sent 3E/4 there (4
    // ranks), E/2 on the node (2 ranks).
    let world = |l: &Value| sent(l, "comm_sent_bytes", "all_gather");
    let node = sent(last, "node_comm_sent_bytes", "all_gather");
    assert_eq!(
        2 * (world(&flat[STEPS - 1]) - world(last)),
        3 * node,
        "{last}"
    );
}

#[test]
fn all_three_switches_keep_the_ledgers_on_the_host_and_through_host_staging() {
    let all = [
        "--set",
        "zero.quantize_weights=true",
        "--set",
        "zero.hierarchical_weights=true",
        "--set",
        "zero.quantize_grads=true",
    ];
    let (host, host_stage) = run("all-host", &all);
    let cut = assert_node_traffic(&host_stage, 2, 2, "host");
    let mut staged_args = all.to_vec();
    staged_args.extend(["--device", "sim-gpu", "--comm", "mpi-staged"]);
    let (staged, staged_stage) = run("all-staged", &staged_args);
    assert_node_traffic(&staged_stage, 2, 2, "sim-gpu, mpi-staged");
    for (line, what) in [(&host[STEPS - 1], "host"), (&staged[STEPS - 1], "staged")] {
        assert!(
            sent(line, "node_comm_sent_bytes", "all_to_all") > 0,
            "{what}: {line}"
        );
        assert!(
            sent(line, "cross_comm_sent_bytes", "all_to_all") > 0,
            "{what}: {line}"
        );
        assert_eq!(
            sent(line, "comm_sent_bytes", "reduce_scatter"),
            0,
            "{what}: {line}"
        );
    }
    assert!(cut > 2.0, "{cut:.2}x fewer bytes leaving each node");
}

#[test]
fn ranks_per_node_that_do_not_divide_the_world_stop_every_rank() {
    let args: Vec<String> = [
        "--config",
        &repo("configs/tiny.toml"),
        "--stage",
        "3",
        "--steps",
        "2",
        "--set",
        "zero.ranks_per_node=3",
        "--set",
        "zero.hierarchical_weights=true",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let out = train(4, &args);
    assert!(!out.timed_out, "{}", out.transcript());
    assert_ne!(out.code, Some(0), "{}", out.transcript());
    let text = out.all_text();
    assert!(text.contains("ranks per node"), "{}", out.transcript());
    assert!(
        !text.contains("panicked") && !text.contains("stack backtrace"),
        "{}",
        out.transcript()
    );
}

/// `--stage auto` chooses among the stages the switches allow: hpZ leaves only stage 3.
#[test]
fn the_automatic_stage_honours_hierarchical_weights() {
    let args: Vec<String> = [
        "--config",
        &repo("configs/tiny.toml"),
        "--stage",
        "auto",
        "--steps",
        "2",
        "--no-progress",
        "--set",
        "zero.ranks_per_node=2",
        "--set",
        "zero.hierarchical_weights=true",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let out = train(4, &args);
    ok(&out);
    assert!(
        out.all_text().contains("summary ZeRO-3"),
        "{}",
        out.transcript()
    );
}

/// A run with the three switches saves and resumes like any other: the steps after the
/// resume are the uninterrupted run's, bit for bit (the secondary partition and the
/// staging are rebuilt by every step; the checkpoint holds only the model state).
#[test]
fn a_run_with_the_switches_resumes_the_same_run() {
    let ckpt = scratch("resume-ckpt");
    let ck = s(&ckpt);
    let switches = [
        "--set",
        "zero.quantize_weights=true",
        "--set",
        "zero.hierarchical_weights=true",
        "--set",
        "zero.quantize_grads=true",
    ];
    let run = |name: &str, steps: usize, ran: usize, extra: &[&str]| {
        let mut a = switches.to_vec();
        a.extend(extra);
        run_for(name, steps, ran, &a).0
    };
    let straight = run("resume-straight", 6, 6, &[]);
    let first = run(
        "resume-first",
        3,
        3,
        &["--ckpt-dir", &ck, "--save-every", "3"],
    );
    assert_eq!(losses(&first), losses(&straight[..3]));
    let resumed = run("resume-second", 6, 3, &["--resume", &ck]);
    assert_eq!(losses(&resumed), losses(&straight[3..]));
}
