//! `zero-bench train` on a Llama as users run it: `configs/llama-tiny.toml` (the built-in
//! corpus) under real mpirun on 2 ranks, `--stages 0,1,2,3`, fp32 and bf16: the loss
//! falls and every stage gives stage 0's per-step losses bit for bit (two ranks' addends
//! sum the same in any order, as the GPT's 2-rank engine test holds them); activation
//! checkpointing gives the same losses bit for bit with an arena smaller by exactly the
//! dropped blocks' internals; and the published shapes dry-run at every stage.
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench`.

use std::path::PathBuf;
use std::process::Command;

use zero_tests::cli::{ok, read_lines, repo, s, train};
use zero_tests::zero_bench_bin as zero_bench;

const STEPS: usize = 6;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("llama-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

/// The per-step metrics of `configs/llama-tiny.toml` on 2 ranks at every stage, with
/// `extra` arguments.
fn metrics_of_every_stage(name: &str, precision: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let dir = scratch(name);
    let metrics = dir.join("metrics.jsonl");
    let args: Vec<String> = [
        "--config",
        &repo("configs/llama-tiny.toml"),
        "--stages",
        "0,1,2,3",
        "--precision",
        precision,
        "--steps",
        &STEPS.to_string(),
        "--metrics",
        &s(&metrics),
    ]
    .iter()
    .chain(extra)
    .map(|x| x.to_string())
    .collect();
    let out = train(2, &args);
    ok(&out);
    read_lines(&metrics)
}

fn losses(lines: &[serde_json::Value]) -> Vec<u64> {
    lines
        .iter()
        .map(|m| m["loss"].as_f64().expect("loss").to_bits())
        .collect()
}

fn every_stage_same_losses(precision: &str) {
    let lines = metrics_of_every_stage(precision, precision, &[]);
    assert_eq!(lines.len(), 4 * STEPS, "{lines:#?}");
    let loss = |stage: usize| losses(&lines[stage * STEPS..(stage + 1) * STEPS]);
    let base = loss(0);
    let (first, last) = (f64::from_bits(base[0]), f64::from_bits(base[STEPS - 1]));
    assert!(
        last < first,
        "{precision}: loss {first} -> {last} does not fall"
    );
    for stage in 1..4 {
        assert_eq!(loss(stage), base, "{precision}: stage {stage} vs stage 0");
    }
}

#[test]
fn llama_tiny_trains_on_2_ranks_every_stage_with_equal_losses_fp32() {
    every_stage_same_losses("fp32");
}

#[test]
fn llama_tiny_trains_on_2_ranks_every_stage_with_equal_losses_bf16() {
    every_stage_same_losses("bf16");
}

/// `--checkpoint-every 1` on llama-tiny (L = 2): both blocks keep only their output and
/// one block's internals stay for the recompute, so the arena is smaller by one block's
/// internals, B T (8 C + 2 Ckv + 3 F + 2) + B H T^2 elements of f32 at the arena's
/// B = 2 x the context length 64 (an, q, qkv, atty, res2, fn; k, v; h1, h3, g; two RMSNorm
/// statistics; the attention probabilities), and every loss is the same bits.
#[test]
fn llama_checkpointing_gives_the_same_losses_with_a_smaller_arena() {
    let full = metrics_of_every_stage("ckpt-off", "fp32", &[]);
    let ckpt = metrics_of_every_stage("ckpt-on", "fp32", &["--checkpoint-every", "1"]);
    assert_eq!(losses(&ckpt), losses(&full));
    let cfg = zero_models::LlamaConfig::preset("llama-tiny").expect("preset");
    let (b, t, c, kv, f) = (2, cfg.max_seq_len, cfg.n_embd, cfg.kv_dim(), cfg.ffn_hidden);
    let internals = b * t * (8 * c + 2 * kv + 3 * f + 2) + b * cfg.n_head * t * t;
    for (off, on) in full.iter().zip(&ckpt) {
        let arena = |m: &serde_json::Value| m["memory_bytes"]["activations"].as_u64();
        let (off, on) = (arena(off).expect("bytes"), arena(on).expect("bytes"));
        assert_eq!(off - on, 4 * internals as u64, "{off} -> {on}");
    }
}

#[test]
fn published_llama_shapes_dry_run_at_every_stage() {
    for model in ["llama2-7b", "llama-13b", "llama2-70b", "llama3-8b"] {
        let out = Command::new(zero_bench())
            .args(["train", "--dry-run", "--world", "64", "--stages", "0,1,2,3"])
            .args(["--model", model, "--set", "train.micro_batch=1"])
            .output()
            .expect("zero-bench starts");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout.matches("=== dry run: ZeRO-").count(), 4, "{stdout}");
    }
}
