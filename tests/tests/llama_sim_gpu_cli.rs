//! `zero-bench train --device sim-gpu` on a Llama: `configs/llama-tiny.toml` under real
//! mpirun on 2 ranks, every model op on the simulated GPU running the CPU twin of its CUDA
//! kernel (Llama's RMSNorm, rotary/GQA and SwiGLU included, `zero-kernels/src/twin/`),
//! with CUDA's stream rules checked. Every stage gives stage 0's per-step losses bit for
//! bit (two ranks' addends sum the same in any order), and the curve follows the host's
//! to the drift of two summation orders: RMSNorm's, attention's and the loss's sums are
//! grouped by warp lanes on the GPU, in column order on the host, ~1e-7 relative per
//! step (`zero-models/tests/llama_gpu_twin.rs` measures it), grown by 8 steps of AdamW at
//! lr 1e-2: 1e-5 relative, the bound GPT-2's simulated-GPU test uses
//! (`tests/tests/train_cli.rs`).
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench`.

use std::path::PathBuf;

use serde_json::Value;
use zero_tests::cli::{ok, read_json, repo, s, train};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("llama-sim-gpu-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

fn losses(v: &Value, i: usize) -> Vec<f64> {
    v["stages"][i]["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|x| x.as_f64().expect("a loss"))
        .collect()
}

#[test]
fn llama_on_the_simulated_gpu_trains_every_stage_like_the_host() {
    let dir = scratch("stages");
    let run = |device: &str, stages: &str, name: &str| {
        let json = dir.join(format!("{name}.json"));
        let args: Vec<String> = [
            "--config",
            &repo("configs/llama-tiny.toml"),
            "--device",
            device,
            "--stages",
            stages,
            "--no-progress",
            "--json",
            &s(&json),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        let out = train(2, &args);
        ok(&out);
        read_json(&json)
    };
    let sim = run("sim-gpu", "0,1,2,3", "sim");
    assert!(sim["device"]
        .as_str()
        .is_some_and(|d| d.contains("simulated GPU")));
    let host = run("host", "0", "host");
    let stage0 = losses(&sim, 0);
    assert_eq!(stage0.len(), 8);
    for i in 1..4 {
        assert_eq!(
            losses(&sim, i),
            stage0,
            "stage {i} vs stage 0 on the simulated GPU"
        );
    }
    let host0 = losses(&host, 0);
    assert!(
        host0.last() < host0.first(),
        "the loss falls on the host: {host0:?}"
    );
    let mut worst = 0.0f64;
    for (step, (g, h)) in stage0.iter().zip(&host0).enumerate() {
        let rel = ((g - h) / h).abs();
        assert!(
            rel <= 1e-5,
            "step {}: simulated GPU {g} vs host {h}",
            step + 1
        );
        worst = worst.max(rel);
    }
    eprintln!(
        "llama-tiny on the simulated GPU vs the host: worst loss drift {worst:e} over 8 steps"
    );
}
