//! Quantized parameter gathers (ZeRO++'s qwZ, `zero.quantize_weights`) under real mpirun
//! on 3 ranks, as users run them: `configs/tiny.toml` at stage 3 (fp32 and bf16) and at
//! stage 2 (bf16: the after-step gathers), 8 steps.
//! The all-gathers move the int8 codes and the f32 scales the ledger plans (the run's
//! per-step bytes of its data collectives, in its metrics, equal the printed plan's
//! total), about a
//! quarter of fp32's gather bytes (half of bf16's), and the loss tracks the exact run's
//! within 1% at every step.
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench`.

use std::path::PathBuf;

use zero_tests::cli::{ok, read_lines, repo, s, train};

const STEPS: usize = 8;

/// The run's losses, its all-gather bytes per step, and its transcript; checks that the
/// bytes its data collectives sent per step are the printed plan's total.
fn run(name: &str, stage: &str, precision: &str, quantized: bool) -> (Vec<f64>, u64, String) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("qwz-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    let metrics = dir.join("metrics.jsonl");
    let args: Vec<String> = [
        "--config",
        &repo("configs/tiny.toml"),
        "--stage",
        stage,
        "--precision",
        precision,
        "--steps",
        &STEPS.to_string(),
        "--set",
        &format!("zero.quantize_weights={quantized}"),
        "--metrics",
        &s(&metrics),
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let out = train(3, &args);
    ok(&out);
    let lines = read_lines(&metrics);
    assert_eq!(lines.len(), STEPS);
    let losses = lines
        .iter()
        .map(|m| m["loss"].as_f64().expect("loss"))
        .collect();
    let sent = &lines[STEPS - 1]["comm_sent_bytes"];
    let bytes = |k: &str| sent[k].as_u64().expect("bytes per collective");
    let transcript = out.transcript();
    // "total sent 84.54 kB (84544 B); ..." from the printed communication plan.
    let planned: u64 = transcript
        .split("total sent ")
        .nth(1)
        .and_then(|t| t.split('(').nth(1))
        .and_then(|t| t.split(" B)").next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no planned total in\n{transcript}"));
    assert_eq!(
        bytes("all_gather") + bytes("reduce_scatter"),
        planned,
        "{name}"
    );
    (losses, bytes("all_gather"), transcript)
}

fn quantized_tracks_exact(stage: &str, precision: &str, elem_bytes: f64) {
    let name = |q| format!("{q}-{stage}-{precision}");
    let (exact, exact_bytes, _) = run(&name("exact"), stage, precision, false);
    let (quant, quant_bytes, transcript) = run(&name("quant"), stage, precision, true);
    for (q, e) in quant.iter().zip(&exact) {
        assert!(
            (q - e).abs() <= 1e-2 * e,
            "{precision}: loss {q} vs exact {e}"
        );
    }
    // The plan says qwZ is on.
    assert!(
        transcript.contains("gathers quantized (qwZ"),
        "{transcript}"
    );
    // Codes are 1 byte a value instead of elem_bytes, plus a 4-byte scale per 256: at
    // least that (a block cut short by a unit's end still has a whole scale, and units
    // under the persistence threshold are gathered exact), and at most 5% more. A qwZ
    // that dropped its scales, or sent fewer codes than values, falls below.
    // The lower bound in integers (quant / exact >= 260 / (256 elem_bytes)): equality is
    // possible, and a float quotient could round below it.
    let ratio = quant_bytes as f64 / exact_bytes as f64;
    let want = (1.0 + 4.0 / 256.0) / elem_bytes;
    assert!(
        quant_bytes * 256 * elem_bytes as u64 >= exact_bytes * 260 && ratio <= want * 1.05,
        "{precision}: gathers sent {quant_bytes} B vs {exact_bytes} B exact ({ratio:.4}, want {want:.4} to 5% over)"
    );
}

#[test]
fn quantized_gathers_send_a_quarter_of_fp32_and_track_the_exact_loss() {
    quantized_tracks_exact("3", "fp32", 4.0);
}

#[test]
fn quantized_gathers_send_half_of_bf16_and_track_the_exact_loss() {
    quantized_tracks_exact("3", "bf16", 2.0);
}

/// Stage 2 in bf16: the updated parameters are gathered after the step as codes (the
/// fp32 master stays exact).
#[test]
fn stage_2_after_step_gathers_send_half_of_bf16_and_track_the_exact_loss() {
    quantized_tracks_exact("2", "bf16", 2.0);
}
