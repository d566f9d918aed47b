//! `zero-bench gpu-check` as scripts/gpu-check.sh runs it, without a GPU: `prepare` writes
//! the reference curves, `run --device sim --quick` (the dry run) passes every check with
//! one line each and a summary and writes the same as JSON, and `run --device cuda` on a
//! machine without a GPU says "no GPU" and exits 3 instead of panicking.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn zero_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zero-bench"))
        .arg("gpu-check")
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("zero-bench starts")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn prepare(dir: &Path) {
    let out = zero_bench(&["prepare", "--out", dir.to_str().unwrap(), "--steps", "6"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "prepare failed\n{stdout}\n{stderr}");
    assert!(dir.join("reference.json").is_file());
}

#[test]
fn dry_run_passes_and_reports_every_check() {
    let tmp = tempfile::tempdir().unwrap();
    let (refdir, outdir) = (tmp.path().join("ref"), tmp.path().join("out"));
    prepare(&refdir);
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(refdir.join("reference.json")).unwrap())
            .unwrap();
    let curves = r["curves"].as_array().unwrap();
    assert_eq!(
        curves.len(),
        10,
        "stages 0-3 x fp32, bf16, and bf16 with f32 gradients at stages 0 and 2"
    );
    assert_eq!(curves.iter().filter(|c| c["f32_grads"] == true).count(), 2);
    for c in curves {
        assert_eq!(c["losses"].as_array().unwrap().len(), 6);
    }

    let out = zero_bench(&[
        "run",
        "--ref",
        refdir.to_str().unwrap(),
        "--out",
        outdir.to_str().unwrap(),
        "--device",
        "sim",
        "--quick",
        // Every check runs, however slow this machine: none is skipped out of time.
        "--budget-s",
        "1e9",
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "dry run failed\n{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    let checks: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("ok ") || l.starts_with("FAIL") || l.starts_with("skip"))
        .collect();
    for (group, at_least) in [
        ("kernel", 36),
        ("llama-fwd-bwd", 2),
        ("adamw-bandwidth", 1),
        ("gpt-fwd-bwd", 4),
        ("train-4-ranks", 10),
        ("throughput", 2),
        ("attention-products", 7),
    ] {
        let n = checks.iter().filter(|l| l.contains(group)).count();
        assert!(n >= at_least, "{n} {group} lines\n{stdout}");
    }
    // The simulated GPU runs the plan of batched products too (the host GEMM in cuBLAS's
    // place): every correctness line of the group passes; its throughput is no measurement.
    for l in checks.iter().filter(|l| l.contains("attention-products")) {
        let timing = l.contains("tokens/s");
        assert!(
            (l.starts_with("ok") && !timing) || (timing && l.contains("not a measurement")),
            "{l}"
        );
    }
    assert!(!checks.iter().any(|l| l.starts_with("FAIL")), "{stdout}");
    // Timings of a simulated device are never judged.
    for l in checks
        .iter()
        .filter(|l| l.contains("throughput") || l.contains("adamw-bandwidth"))
    {
        assert!(
            l.starts_with("skip") && l.contains("not a measurement"),
            "{l}"
        );
    }
    let summary = lines
        .iter()
        .find(|l| l.starts_with("summary:"))
        .expect("a summary line");
    assert!(summary.contains(" 0 FAIL"), "{summary}");

    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(outdir.join("gpu-check.json")).unwrap())
            .unwrap();
    assert_eq!(json["finished"], true);
    assert_eq!(json["simulated"], true);
    let items = json["checks"].as_array().unwrap();
    assert_eq!(items.len(), checks.len(), "one JSON entry per line");
    assert_eq!(json["summary"]["fail"], 0);
    assert_eq!(
        json["summary"]["ok"].as_u64().unwrap() + json["summary"]["skip"].as_u64().unwrap(),
        items.len() as u64
    );
    for c in items {
        assert!(
            ["ok", "skip"].contains(&c["status"].as_str().unwrap()),
            "{c}"
        );
    }
    let train: Vec<&Value> = items
        .iter()
        .filter(|c| c["group"] == "train-4-ranks")
        .collect();
    assert!(train
        .iter()
        .all(|c| c["status"] == "ok" && c["data"]["device"].as_array().unwrap().len() == 6));
}

/// A device whose curve leaves the reference is caught: one fp32 loss moved by 1e-4
/// (relative) fails that case's line, the summary counts it, and the exit status is 2.
#[test]
fn a_curve_off_the_reference_fails_with_status_2() {
    let tmp = tempfile::tempdir().unwrap();
    let (refdir, outdir) = (tmp.path().join("ref"), tmp.path().join("out"));
    prepare(&refdir);
    let path = refdir.join("reference.json");
    let mut r: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let curve = r["curves"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["stage"] == 1 && c["precision"] == "fp32")
        .unwrap();
    // The host curve and its twin drift alike: a device 1e-4 off at step 4.
    for key in ["losses", "twin_losses"] {
        let l = curve[key][3].as_f64().unwrap();
        curve[key][3] = Value::from(l * (1.0 + 1e-4));
    }
    std::fs::write(&path, serde_json::to_string(&r).unwrap()).unwrap();

    let out = zero_bench(&[
        "run",
        "--ref",
        refdir.to_str().unwrap(),
        "--out",
        outdir.to_str().unwrap(),
        "--device",
        "sim",
        "--quick",
        // Every check runs, however slow this machine: none is skipped out of time.
        "--budget-s",
        "1e9",
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failed.len(), 1, "{stdout}");
    assert!(
        failed[0].contains("ZeRO-1 fp32") && failed[0].contains("(step 4)"),
        "{}",
        failed[0]
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(outdir.join("gpu-check.json")).unwrap())
            .unwrap();
    assert_eq!(json["summary"]["fail"], 1);
    assert_eq!(json["summary"]["fail_performance"], 0);
}

#[test]
fn without_a_gpu_the_cuda_run_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let (refdir, outdir) = (tmp.path().join("ref"), tmp.path().join("out"));
    prepare(&refdir);
    let out = zero_bench(&[
        "run",
        "--ref",
        refdir.to_str().unwrap(),
        "--out",
        outdir.to_str().unwrap(),
        "--quick",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(!stderr.contains("panicked"), "{stderr}");
    match out.status.code() {
        Some(3) => assert!(stdout.starts_with("no GPU: "), "{stdout}"),
        // A machine with a GPU (and a cuda build) runs the checks instead.
        Some(0) | Some(2) => assert!(stdout.contains("summary:"), "{stdout}"),
        other => panic!("exit {other:?}\n{stdout}\n{stderr}"),
    }
}

#[test]
fn a_missing_reference_is_an_error_naming_prepare() {
    let tmp = tempfile::tempdir().unwrap();
    let out = zero_bench(&[
        "run",
        "--ref",
        tmp.path().join("nothing").to_str().unwrap(),
        "--out",
        tmp.path().join("out").to_str().unwrap(),
        "--device",
        "sim",
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("gpu-check prepare"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
