//! `llama-tiny` on the simulated GPU (`SimDevice::gpu_twin`: every model op runs the CPU
//! twin of its CUDA kernel, `zero-kernels/src/twin/`, Llama's RMSNorm, rotary/GQA and
//! SwiGLU included) against the host device: one forward + backward, then a few plain SGD
//! steps, loss and every gradient tensor compared.
//!
//! The two devices differ only in how sums are grouped (the GPU kernels' warp lanes and
//! trees for RMSNorm, attention, softmax/cross-entropy and the column sums; the same
//! products otherwise), so each result is the same f32 computation up to reordered
//! roundings: ~sqrt(n) ulps of a sum of n terms of size ~1, i.e. ~1e-6 relative at
//! llama-tiny's widths (C = 16, SwiGLU hidden 40, V = 64, T = 16; measured: at most
//! 1e-6 over every tensor). The stated tolerances hold 10-100x that: loss 1e-5
//! relative; each gradient tensor 1e-4 in norm, ||g_gpu - g_host|| <= 1e-4 ||g_host||
//! (an element near zero may differ in relative terms by more, so elementwise relative
//! error would test nothing sound). A kernel twin with a wrong term (a dropped head, a
//! sign, a missed row) moves the loss or a gradient by orders of magnitude more.

use zero_core::model::Compute;
use zero_kernels::device::{Device, HostDevice, SimDevice};
use zero_models::init::SplitMix64;
use zero_models::LayeredLm;
use zero_models::{download_units, upload_units, Llama, LlamaConfig, TokenBatch};

const B: usize = 2;

/// `llama-tiny` (H = 4 query heads sharing Hkv = 2 key/value heads) at T = 16.
fn tiny() -> LlamaConfig {
    LlamaConfig {
        max_seq_len: 16,
        ..LlamaConfig::preset("llama-tiny").expect("llama-tiny is a preset")
    }
}

fn tokens(cfg: &LlamaConfig, seed: u64) -> (Vec<u32>, Vec<u32>) {
    let mut g = SplitMix64::new(seed);
    let n = B * cfg.max_seq_len;
    let v = cfg.vocab_size as u64;
    let inputs = (0..n).map(|_| (g.next_u64() % v) as u32).collect();
    let targets = (0..n).map(|_| (g.next_u64() % v) as u32).collect();
    (inputs, targets)
}

/// The losses of `steps` forward + backward passes with a plain SGD update between
/// them (on the host, from the downloaded gradients), and the gradients of each step.
fn run<D: Device>(dev: &D, cfg: LlamaConfig, steps: usize) -> (Vec<f64>, Vec<Vec<Vec<f32>>>) {
    let stream = dev.stream("compute").expect("stream");
    let cx = Compute {
        dev,
        stream: &stream,
    };
    let mut model = Llama::<D, f32>::new(dev, cfg, B).expect("valid");
    let mut params = model.init_params(11);
    // Perturb the init so the norm weights (all ones) carry non-trivial gradients.
    let mut g = SplitMix64::new(5);
    for p in params.iter_mut().flatten() {
        *p += 0.05 * g.next_normal() as f32;
    }
    let (mut losses, mut grads_per_step) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let io = tokens(&cfg, 100 + step as u64);
        let batch = TokenBatch {
            rows: B,
            seq_len: cfg.max_seq_len,
            inputs: &io.0,
            targets: &io.1,
        };
        let p = upload_units(cx, &params, "p").expect("upload");
        let mut gr = upload_units(cx, &model.zero_grads(), "g").expect("upload");
        let scale = 1.0 / (B * cfg.max_seq_len) as f32;
        let loss = model
            .forward_backward(cx, &batch, &p, &mut gr, scale)
            .expect("valid call");
        let grads = download_units(cx, &gr).expect("download");
        for (p, g) in params.iter_mut().flatten().zip(grads.iter().flatten()) {
            *p -= 0.5 * g;
        }
        losses.push(loss);
        grads_per_step.push(grads);
    }
    (losses, grads_per_step)
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

fn compare(cfg: LlamaConfig, steps: usize) {
    let (host_loss, host_grads) = run(&HostDevice::new(), cfg, steps);
    let (gpu_loss, gpu_grads) = run(&SimDevice::gpu_twin(7), cfg, steps);
    let spec = cfg.spec();
    let mut worst = 0.0f64;
    for step in 0..steps {
        let (h, g) = (host_loss[step], gpu_loss[step]);
        assert!(h.is_finite() && g.is_finite(), "step {step}: {g} vs {h}");
        assert!(
            ((g - h) / h).abs() <= 1e-5,
            "step {step}: loss on the simulated GPU {g} vs host {h}"
        );
        for (u, unit) in spec.units.iter().enumerate() {
            let (gh, gg) = (&host_grads[step][u], &gpu_grads[step][u]);
            let mut at = 0;
            for p in &unit.params {
                let (gh, gg) = (&gh[at..at + p.numel()], &gg[at..at + p.numel()]);
                at += p.numel();
                let size = norm(gh.iter().map(|&x| x as f64));
                let diff = norm(gh.iter().zip(gg).map(|(&a, &b)| a as f64 - b as f64));
                assert!(size > 0.0, "step {step}: {} has no gradient", p.name);
                assert!(
                    diff <= 1e-4 * size,
                    "step {step}: {}: |g_gpu - g_host| = {diff:e}, |g_host| = {size:e}",
                    p.name
                );
                worst = worst.max(diff / size);
            }
        }
    }
    // The two devices really took different paths (RMSNorm's warp sums at least).
    assert!(
        worst > 0.0,
        "the simulated GPU gave the host's bits: are the twins running?"
    );
    eprintln!("llama on the simulated GPU: worst gradient relative error {worst:e}");
}

#[test]
fn llama_tiny_on_the_simulated_gpu_tracks_the_host() {
    compare(tiny(), 4);
}

/// Multi-head attention (Hkv = H), and one key/value head shared by all four, Llama 3's
/// rotary base: the GQA kernels' group sizes 1 and 4.
#[test]
fn llama_on_the_simulated_gpu_tracks_the_host_with_mha_and_one_kv_head() {
    for kv in [4, 1] {
        let cfg = LlamaConfig {
            n_kv_head: kv,
            rope_theta: 500_000.0,
            ..tiny()
        };
        compare(cfg, 2);
    }
}
