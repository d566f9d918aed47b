//! Speed: the fused AdamW step's bandwidth next to a device-to-device copy of the same
//! bytes, and GPT-2 training throughput (tokens/s, MFU) in bf16 on one rank.
//!
//! On a simulated device both run at a tiny size to exercise the code, and their figures
//! are labelled as what they are: not a measurement.

use std::time::Instant;
use zero_kernels::twin::attention_products::AttentionKernels;

use anyhow::Context;
use half::bf16;
use zero_comm::{run_local, CommConfig};
use zero_core::{Engine, EngineConfig, Precision, Stage};
use zero_kernels::adamw::{AdamWHyper, AdamWSegment};
use zero_kernels::device::{AdamWStep, AdamWViews, Buffer, Device};
use zero_models::{activation_bytes_for, Gpt, GptConfig, TokenBatch};

use super::report::{Check, Kind, Report};
use super::stats::{median, Rng};
use crate::device::{BenchDevice, Opener};

/// Bytes AdamW moves per parameter: reads a bf16 gradient (2) and fp32 master, m, v (12),
/// writes master, m, v (12) and the bf16 copy (2).
pub const ADAMW_BYTES_PER_PARAM: usize = 28;
/// Goal: AdamW at this fraction of a copy's bandwidth or better.
pub const ADAMW_GOAL: f64 = 0.85;
/// Dense bf16 peak of an H100/H200 SXM (TFLOP/s x 1e12), the MFU denominator.
pub const PEAK_FLOPS: f64 = 989e12;
/// Goal: model FLOPs utilisation.
pub const MFU_GOAL: f64 = 0.40;

pub(super) const NOT_MEASURED: &str = "simulated, not a measurement";

/// AdamW over `n` parameters vs a copy of 14n bytes (read 14n + write 14n = 28n), in
/// `rounds` interleaved rounds of `iters` calls each; medians of the rounds.
pub fn adamw_bandwidth<D: BenchDevice>(
    dev: &D,
    n: usize,
    rounds: usize,
    iters: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let name = format!("adamw bf16 grad + bf16 copy, {n} params, 28 B/param vs copy");
    let check = Check::new("adamw-bandwidth", name, Kind::Performance);
    let t0 = Instant::now();
    let mut check = match adamw_times(dev, n, rounds, iters) {
        Err(e) => check.fail(format!("{e:#}")),
        Ok((ta, tc)) => {
            let bytes = (ADAMW_BYTES_PER_PARAM * n) as f64;
            let (a, c) = (bytes / ta / 1e9, bytes / tc / 1e9);
            let ratio = a / c;
            let figures = format!(
                "adamw {a:.1} GB/s, copy {c:.1} GB/s: {ratio:.2} of the copy (goal >= {ADAMW_GOAL})"
            );
            let data = serde_json::json!({
                "params": n, "adamw_gb_s": a, "copy_gb_s": c, "ratio": ratio,
                "adamw_s": ta, "copy_s": tc,
            });
            if dev.simulated() {
                check.skip(format!("{NOT_MEASURED}: {figures}"))
            } else {
                check.at_least(ratio, ADAMW_GOAL, figures)
            }
            .with_data(data)
        }
    };
    check.seconds = t0.elapsed().as_secs_f64();
    report.add(check)
}

/// Median seconds of one AdamW call and of one copy.
fn adamw_times<D: Device>(
    dev: &D,
    n: usize,
    rounds: usize,
    iters: usize,
) -> anyhow::Result<(f64, f64)> {
    let s = dev.stream("bandwidth")?;
    let mut grad = dev.alloc::<bf16>(n, "grad")?;
    let mut master = dev.alloc::<f32>(n, "master")?;
    let mut m = dev.alloc::<f32>(n, "m")?;
    let mut v = dev.alloc::<f32>(n, "v")?;
    let mut param = dev.alloc::<bf16>(n, "param")?;
    // 14n bytes as f32: half of AdamW's traffic read, the other half written.
    let words = ADAMW_BYTES_PER_PARAM * n / 2 / 4;
    let mut src = dev.alloc::<f32>(words, "copy src")?;
    let mut dst = dev.alloc::<f32>(words, "copy dst")?;
    dev.fill(&s, grad.view_mut(), bf16::from_f32(1e-3))?;
    dev.fill(&s, master.view_mut(), 0.5)?;
    dev.fill(&s, src.view_mut(), 1.0)?;
    let groups = [AdamWHyper::default()];
    let segments = [AdamWSegment {
        range: 0..n,
        group: 0,
        decay: true,
    }];
    let mut adamw = |t: u64| -> zero_kernels::Result<()> {
        let step = AdamWStep {
            groups: &groups,
            segments: &segments,
            t,
            grad_scale: 1.0,
        };
        let state = AdamWViews {
            master: master.view_mut(),
            m: m.view_mut(),
            v: v.view_mut(),
        };
        dev.adamw::<bf16, bf16>(&s, &step, grad.view(), state, Some(param.view_mut()))
    };
    // Warm-up: first launches load code and touch every page.
    adamw(1)?;
    dev.copy(&s, src.view(), dst.view_mut())?;
    dev.synchronize()?;
    let (mut ta, mut tc) = (Vec::new(), Vec::new());
    let mut t = 1;
    for _ in 0..rounds {
        let t0 = Instant::now();
        for _ in 0..iters {
            t += 1;
            adamw(t)?;
        }
        dev.synchronize()?;
        ta.push(t0.elapsed().as_secs_f64() / iters as f64);
        let t0 = Instant::now();
        for _ in 0..iters {
            dev.copy(&s, src.view(), dst.view_mut())?;
        }
        dev.synchronize()?;
        tc.push(t0.elapsed().as_secs_f64() / iters as f64);
    }
    Ok((median(&ta), median(&tc)))
}

/// A throughput run: the model and the batch.
#[derive(Clone, Copy, Debug)]
pub struct Throughput {
    /// The preset whose figures the line is about.
    pub preset: &'static str,
    /// The preset actually run (a small one on a simulated device).
    pub run_preset: &'static str,
    /// B.
    pub rows: usize,
    /// T.
    pub seq_len: usize,
    /// Steps before timing.
    pub warmup: usize,
    /// Steps timed.
    pub timed: usize,
    /// The attention kernels to run (`None`: the device's default).
    pub attention: Option<AttentionKernels>,
}

/// FLOPs per token of training as the issue defines them: 6N + 6LCT (llm.c's estimate:
/// attention's causal half).
pub fn flops_per_token(cfg: &GptConfig, seq_len: usize) -> f64 {
    6.0 * cfg.num_params() as f64 + 6.0 * (cfg.n_layer * cfg.n_embd * seq_len) as f64
}

/// Train `tp` in bf16 on one rank (stage 0; bf16 products) and report tokens/s and MFU.
pub fn throughput<D: BenchDevice>(
    open: &Opener<D>,
    tp: &Throughput,
    report: &mut Report,
) -> anyhow::Result<()> {
    let mut name = format!("{} bf16 B{} T{}", tp.preset, tp.rows, tp.seq_len);
    if let Some(k) = tp.attention {
        name.push_str(&format!(", attention {}", k.name()));
    }
    let group = match tp.attention {
        Some(_) => super::PRODUCTS_GROUP,
        None => "throughput",
    };
    let check = Check::new(group, name, Kind::Performance);
    let t0 = Instant::now();
    let cfg = GptConfig::preset(tp.run_preset)?;
    let results = run_local(1, CommConfig::default(), |comm| -> Result<_, String> {
        let dev = open(0).map_err(|e| format!("opening the device: {e}"))?;
        if let Some(k) = tp.attention {
            if dev.set_attention_kernels(k).is_none() {
                return Ok(None);
            }
        }
        timed_steps(&comm, &dev, cfg, tp)
            .map(Some)
            .map_err(|e| format!("{e:#}"))
    });
    let outcome = match results.into_iter().next() {
        Some(Ok(Ok(r))) => Ok(r),
        Some(Ok(Err(e))) => Err(e),
        Some(Err(p)) => Err(p.to_string()),
        None => Err("the rank did not start".to_string()),
    };
    let mut check = match outcome {
        Err(e) => check.fail(e),
        Ok(None) => check.skip("this device has one kind of attention kernels"),
        Ok(Some((secs, simulated, sizes, profile))) => {
            let tokens = (tp.rows * tp.seq_len * tp.timed) as f64;
            let tok_s = tokens / secs;
            let fpt = flops_per_token(&cfg, tp.seq_len);
            let mfu = tok_s * fpt / PEAK_FLOPS;
            let figures = format!(
                "{tok_s:.0} tokens/s, {:.1} TFLOP/s, MFU {:.1}% of 989 TFLOP/s (goal >= {:.0}%; 6N+6LCT = {:.3e} FLOP/token, N = {}){sizes}",
                tok_s * fpt / 1e12,
                mfu * 100.0,
                MFU_GOAL * 100.0,
                fpt,
                cfg.num_params()
            );
            let data = serde_json::json!({
                "preset": tp.run_preset, "rows": tp.rows, "seq_len": tp.seq_len,
                "timed_steps": tp.timed, "seconds": secs, "tokens_per_s": tok_s,
                "flops_per_token": fpt, "mfu": mfu, "params": cfg.num_params(),
                "profile": profile,
            });
            if simulated {
                check.skip(format!(
                    "{NOT_MEASURED} (ran {} B{} T{}): {figures}",
                    tp.run_preset, tp.rows, tp.seq_len
                ))
            } else {
                check.at_least(mfu, MFU_GOAL, figures)
            }
            .with_data(data)
        }
    };
    check.seconds = t0.elapsed().as_secs_f64();
    report.add(check)
}

/// Seconds of `tp.timed` steps after `tp.warmup`, whether the device is simulated, a
/// note on memory, and where one more step's GPU time went (`null` where the device
/// cannot time its ops): wall and busy milliseconds, each op's calls and milliseconds.
fn timed_steps<D: BenchDevice, C: zero_comm::Communicator>(
    comm: &C,
    dev: &D,
    cfg: GptConfig,
    tp: &Throughput,
) -> anyhow::Result<(f64, bool, String, serde_json::Value)> {
    dev.set_bf16_products(true);
    let act = activation_bytes_for(&cfg, tp.rows, tp.seq_len, 4);
    let state = 16 * cfg.num_params();
    let sizes = match dev.free_memory() {
        Some(free) => format!(
            "; activations {:.1} GiB + states {:.1} GiB, {:.1} GiB were free",
            act as f64 / (1u64 << 30) as f64,
            state as f64 / (1u64 << 30) as f64,
            free as f64 / (1u64 << 30) as f64
        ),
        None => String::new(),
    };
    let mut ecfg = EngineConfig {
        grad_accum: 1,
        seed: 7,
        ..Default::default()
    };
    ecfg.zero.stage = Stage::Zero0;
    ecfg.precision.dtype = Precision::Bf16;
    let mut model = Gpt::<D, f32>::new(dev, cfg, tp.rows).context("building the model")?;
    let mut engine = Engine::new(&ecfg, comm, dev, &model).context("building the engine")?;
    let mut rng = Rng::new(11);
    let n = tp.rows * tp.seq_len;
    let (x, y) = (rng.ids(n, cfg.vocab_size), rng.ids(n, cfg.vocab_size));
    let batch = TokenBatch {
        rows: tp.rows,
        seq_len: tp.seq_len,
        inputs: &x,
        targets: &y,
    };
    for _ in 0..tp.warmup {
        engine.step(&mut model, &[batch]).context("warm-up step")?;
    }
    dev.synchronize()?;
    let t0 = Instant::now();
    let mut last = f64::NAN;
    for _ in 0..tp.timed {
        last = engine
            .step(&mut model, &[batch])
            .context("timed step")?
            .loss;
    }
    dev.synchronize()?;
    let secs = t0.elapsed().as_secs_f64();
    log::info!(
        "throughput {}: {} steps in {secs:.3} s, last loss {last:.4}",
        tp.run_preset,
        tp.timed
    );
    if !last.is_finite() {
        anyhow::bail!("the loss is {last}: the run diverged");
    }
    // One more step with every op timed on the GPU: where the step's time goes (not
    // counted in the figures above; the events cost a little).
    let mut profile = serde_json::Value::Null;
    if dev.profile_ops(true) {
        let t0 = Instant::now();
        let stepped = engine
            .step(&mut model, &[batch])
            .context("profiled step")
            .and_then(|_| Ok(dev.synchronize()?));
        dev.profile_ops(false);
        stepped?;
        let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
        let ops = dev.take_op_profile()?;
        let busy: f64 = ops.iter().map(|o| o.2).sum();
        let top: Vec<String> = ops
            .iter()
            .take(10)
            .map(|(name, calls, ms)| format!("{name} {ms:.1} ms/{calls}"))
            .collect();
        log::info!(
            "throughput {}: profiled step {wall_ms:.1} ms wall, ops {busy:.1} ms on the GPU: {}",
            tp.run_preset,
            top.join(", ")
        );
        profile = serde_json::json!({
            "wall_ms": wall_ms,
            "busy_ms": busy,
            "ops": ops
                .iter()
                .map(|(op, calls, ms)| serde_json::json!({"op": op, "calls": calls, "ms": ms}))
                .collect::<Vec<_>>(),
        });
    }
    Ok((secs, dev.simulated(), sizes, profile))
}
