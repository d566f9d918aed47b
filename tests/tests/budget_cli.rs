//! The memory budget under real mpirun: a run whose plan exceeds `--mem-limit` stops
//! before anything is allocated, saying what would fit; `--stage auto` takes the lowest
//! stage that fits, and the chosen run holds no more than the budget while the next
//! cheaper stage would not have fitted. Also `zero-bench tune` on this machine: it
//! measures its candidates under mpirun and writes a configuration that trains.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use zero_tests::cli::{ok, read_json, repo, s, train};
use zero_tests::zero_bench_bin;

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("budget-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

fn demo(extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "--config".into(),
        repo("configs/demo.toml"),
        "--no-progress".into(),
        "--steps".into(),
        "6".into(),
    ];
    a.extend(extra.iter().map(|x| x.to_string()));
    a
}

/// Every stage's planned bytes per rank for configs/demo.toml on 2 ranks (the dry run:
/// the engine's own plan).
fn planned() -> Vec<u64> {
    let dir = scratch("plans");
    let json = dir.join("plans.json");
    let out = Command::new(zero_bench_bin())
        .args([
            "train",
            "--dry-run",
            "--world",
            "2",
            "--stages",
            "0,1,2,3",
            "--config",
        ])
        .arg(repo("configs/demo.toml"))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("zero-bench runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    read_json(&json)["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["total_bytes"].as_u64().expect("total_bytes"))
        .collect()
}

#[test]
fn a_plan_over_the_budget_stops_before_anything_is_allocated() {
    let plans = planned();
    // A limit under stage 0's plan (after the 10% headroom).
    let limit = format!("{}B", plans[0] * 8 / 10);
    let out = train(2, &demo(&["--stage", "0", "--mem-limit", &limit]));
    assert_eq!(out.code, Some(1), "{}", out.transcript());
    let text = out.all_text();
    for needle in [
        "over the budget",
        "nothing was allocated",
        "activations",
        "What would fit: zero.stage =",
    ] {
        assert!(
            text.contains(needle),
            "lacks {needle:?}\n{}",
            out.transcript()
        );
    }
    // Nothing ran: no ledger of a created engine, no step.
    assert!(
        !text.contains("=== ZeRO-0: 3 steps"),
        "{}",
        out.transcript()
    );
    assert!(!text.contains(" step 1/"), "{}", out.transcript());
}

#[test]
fn stage_auto_takes_the_lowest_stage_that_fits_and_stays_within_the_budget() {
    let plans = planned();
    // The first stage that needs less than the one below it, and a budget halfway
    // between the two plans (on this model at N = 2 activations dominate, and stage 3's
    // gather slots can make it need more than stage 2).
    let (fit, over) = (1..4)
        .filter(|&s| plans[s] < plans[s - 1])
        .map(|s| (s, s - 1))
        .next()
        .expect("some stage needs less than the one before");
    let budget = (plans[fit] + plans[over]) / 2;
    let limit = format!("{}B", budget * 10 / 9 + 1); // 10% headroom taken off again
    let dir = scratch("auto");
    let summary = dir.join("summary.json");
    let out = train(
        2,
        &demo(&[
            "--stage",
            "auto",
            "--mem-limit",
            &limit,
            "--json",
            &s(&summary),
        ]),
    );
    ok(&out);
    let text = out.all_text();
    assert!(
        text.contains(&format!("chosen: ZeRO-{fit}, the lowest stage that fits")),
        "{}",
        out.transcript()
    );
    assert!(
        text.contains("zero.stage = \"auto\": budget"),
        "{}",
        out.transcript()
    );
    let report = read_json(&summary);
    let stage = &report["stages"][0];
    assert_eq!(stage["stage"].as_u64(), Some(fit as u64));
    // What the run held, measured from its allocations, is within the budget; the next
    // cheaper stage's plan was not.
    for bytes in stage["ledger_bytes_per_rank"].as_array().expect("ledger") {
        assert!(bytes.as_u64().expect("bytes") <= budget, "{report}");
    }
    assert!(plans[over] > budget);
}

#[test]
fn tune_measures_its_candidates_and_writes_a_configuration_that_trains() {
    let dir = scratch("tune");
    let out_dir = dir.join("out");
    let out = Command::new(zero_bench_bin())
        .current_dir(repo(""))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "tune",
            "--config",
            &repo("configs/tiny.toml"),
            "--world",
            "2",
            "--global-batch",
            "8",
            "--mem-limit",
            "1GiB",
            "--top",
            "4",
            "--steps",
            "4",
            "--rounds",
            "1",
            "--out",
            &s(&out_dir),
        ])
        .output()
        .expect("zero-bench runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("predicted order matches the measured one for"),
        "{text}"
    );
    let report: Value = read_json(&out_dir.join("tune.json"));
    let measured = report["measured"].as_array().expect("measured");
    // One per stage (the best predicted of each) plus, if not among them, the given one.
    assert!(measured.len() >= 4, "{report}");
    let stages: std::collections::BTreeSet<u64> = measured
        .iter()
        .map(|c| c["stage"].as_u64().unwrap())
        .collect();
    assert_eq!(stages.len(), 4, "every stage measured: {report}");
    assert!(measured
        .iter()
        .all(|c| c["measured_s"][0].as_f64().is_some_and(|t| t > 0.0)));
    // The chosen configuration is a valid config file that trains.
    let best = out_dir.join("best.toml");
    let run = train(
        2,
        &["--config".into(), s(&best), "--steps".into(), "2".into()],
    );
    ok(&run);
}
