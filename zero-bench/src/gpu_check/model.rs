//! A model's forward and backward on the device under test against the host, on the same
//! weights and tokens: the loss, and every parameter's gradient tensor by tensor. GPT-2
//! (`gpt-fwd-bwd`) and Llama (`llama-fwd-bwd`: RMSNorm, rotary/GQA and SwiGLU kernels
//! besides the ops it shares with GPT-2), under the same tolerances.
//!
//! fp32 matrix products differ from the host's only in summation order, so the loss and
//! each gradient agree to 1e-5 (relative, L2 over the tensor). With bf16 tensor-core
//! products every operand is rounded to 8 bits of mantissa (2^-9 relative) and the
//! errors compound through the layers forward and back: the loss within 2e-2, each
//! gradient within 5e-2.

use std::time::Instant;

use anyhow::Context;
use zero_core::model::Compute;
use zero_kernels::device::{Buffer, Device, HostDevice};
use zero_kernels::twin::attention_products::AttentionKernels;
use zero_models::LayeredLm;
use zero_models::{Gpt, Llama, ModelPreset, TokenBatch};

use super::report::{figure, Check, Kind, Report};
use super::stats::{rel_l2, Rng};
use crate::device::BenchDevice;

/// Loss tolerance with fp32 products.
pub const FP32_TOL: f64 = 1e-5;
/// Loss tolerance with bf16 products.
pub const BF16_LOSS_TOL: f64 = 2e-2;
/// Per-tensor gradient tolerance with bf16 products.
pub const BF16_GRAD_TOL: f64 = 5e-2;

/// Which model and micro-batch.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// A preset of zero-models, either family (`gpt2-124m`, `llama-small`).
    pub preset: &'static str,
    /// B.
    pub rows: usize,
    /// T.
    pub seq_len: usize,
}

/// What a forward and backward gave: the loss and each unit's gradient.
struct Run {
    loss: f64,
    grads: Vec<Vec<f32>>,
}

/// Seed of the weights both devices start from.
const INIT_SEED: u64 = 0x6770_7432;

fn forward_backward<D: Device>(
    dev: &D,
    preset: &ModelPreset,
    case: &Case,
    inputs: &[u32],
    targets: &[u32],
) -> anyhow::Result<Run> {
    match preset {
        ModelPreset::Gpt(cfg) => {
            let model = Gpt::<D, f32>::new(dev, *cfg, case.rows).context("building the model")?;
            let params = model.init_params(INIT_SEED);
            run_model(dev, model, &params, case, inputs, targets)
        }
        ModelPreset::Llama(cfg) => {
            let model = Llama::<D, f32>::new(dev, *cfg, case.rows).context("building the model")?;
            let params = model.init_params(INIT_SEED);
            run_model(dev, model, &params, case, inputs, targets)
        }
    }
}

fn run_model<D: Device, M: LayeredLm<D, f32>>(
    dev: &D,
    mut model: M,
    host_params: &[Vec<f32>],
    case: &Case,
    inputs: &[u32],
    targets: &[u32],
) -> anyhow::Result<Run> {
    let stream = dev.stream("compute")?;
    let spec = model.layer_spec().clone();
    let mut params = Vec::with_capacity(host_params.len());
    let mut grads = Vec::with_capacity(host_params.len());
    for (p, u) in host_params.iter().zip(&spec.units) {
        let mut buf = dev.alloc::<f32>(p.len(), &u.name)?;
        dev.upload(&stream, p, buf.view_mut())?;
        params.push(buf);
        grads.push(dev.alloc::<f32>(p.len(), &u.name)?);
    }
    let batch = TokenBatch {
        rows: case.rows,
        seq_len: case.seq_len,
        inputs,
        targets,
    };
    let cx = Compute {
        dev,
        stream: &stream,
    };
    let loss = model
        .forward_backward(cx, &batch, &params, &mut grads, 1.0)
        .context("forward and backward")?;
    let mut out = Vec::with_capacity(grads.len());
    for g in &grads {
        let mut v = vec![0f32; g.len()];
        dev.download(&stream, g.view(), &mut v)?;
        out.push(v);
    }
    Ok(Run { loss, grads: out })
}

/// Per-tensor relative L2 errors of `got` against `want`: (name, error), worst first.
fn tensor_errors(spec: &zero_core::ModelSpec, got: &Run, want: &Run) -> Vec<(String, f64)> {
    let mut errs = Vec::new();
    for (u, unit) in spec.units.iter().enumerate() {
        for (p, at) in unit.params.iter().zip(unit.offsets()) {
            let r = at..at + p.numel();
            let g: Vec<f64> = got.grads[u][r.clone()].iter().map(|&x| x.into()).collect();
            let w: Vec<f64> = want.grads[u][r].iter().map(|&x| x.into()).collect();
            errs.push((p.name.clone(), rel_l2(&g, &w)));
        }
    }
    errs.sort_by(|a, b| b.1.total_cmp(&a.1));
    errs
}

/// Check `dut` against the host on `case`, fp32 products and (where the device has
/// them) bf16; with `attention`, those kernels (group `attention-products`; skipped
/// where the device has one kind).
pub fn check<D: BenchDevice>(
    dut: &D,
    case: &Case,
    attention: Option<AttentionKernels>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let tag = format!("{} B{} T{}", case.preset, case.rows, case.seq_len);
    let preset = ModelPreset::lookup(case.preset)?;
    let (family_group, vocab) = match &preset {
        ModelPreset::Gpt(c) => ("gpt-fwd-bwd", c.vocab_size),
        ModelPreset::Llama(c) => ("llama-fwd-bwd", c.vocab_size),
    };
    let group = match attention {
        Some(_) => super::PRODUCTS_GROUP,
        None => family_group,
    };
    // Other attention kernels where the device has them, else a skip per line.
    if let Some(k) = attention {
        match dut.set_attention_kernels(k) {
            Some(before) => {
                dut.set_attention_kernels(before);
            }
            None => {
                for prec in ["fp32", "bf16 matmul"] {
                    for what in ["loss", "gradients"] {
                        let name = format!("{tag} {prec}, attention {}: {what}", k.name());
                        let c = Check::new(group, name, Kind::Correctness);
                        report.add(c.skip("this device has one kind of attention kernels"))?;
                    }
                }
                return Ok(());
            }
        }
    }
    let mut rng = Rng::new(0x746f_6b73);
    let n = case.rows * case.seq_len;
    let inputs = rng.ids(n, vocab);
    let targets = rng.ids(n, vocab);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let host = HostDevice::with_threads(threads);
    let spec = preset.spec();
    let want = match forward_backward(&host, &preset, case, &inputs, &targets) {
        Ok(r) => r,
        Err(e) => {
            let c = Check::new(group, format!("{tag} host reference"), Kind::Correctness);
            return report.add(c.fail(format!("{e:#}")));
        }
    };
    log::info!(
        "{group}: host reference {tag} in {:.1} s, loss {:.6}",
        started.elapsed().as_secs_f64(),
        want.loss
    );
    for bf16 in [false, true] {
        let mut prec = if bf16 { "bf16 matmul" } else { "fp32" }.to_string();
        if let Some(k) = attention {
            prec.push_str(&format!(", attention {}", k.name()));
        }
        let loss_check = Check::new(group, format!("{tag} {prec}: loss"), Kind::Correctness);
        report.start(format!("{group}/{}", loss_check.name))?;
        let grad_check = Check::new(group, format!("{tag} {prec}: gradients"), Kind::Correctness);
        if bf16 && !dut.set_bf16_products(true) {
            let why = "this device has no bf16 matrix-product mode";
            report.add(loss_check.skip(why))?;
            report.add(grad_check.skip(why))?;
            continue;
        }
        let before = attention.and_then(|k| dut.set_attention_kernels(k));
        let t0 = Instant::now();
        let got = forward_backward(dut, &preset, case, &inputs, &targets);
        if bf16 {
            dut.set_bf16_products(false);
        }
        if let Some(k) = before {
            dut.set_attention_kernels(k);
        }
        let got = match got {
            Ok(r) => r,
            Err(e) => {
                report.add(loss_check.fail(format!("{e:#}")))?;
                report.add(grad_check.fail("no gradients (the run failed)"))?;
                continue;
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        let (loss_tol, grad_tol) = if bf16 {
            (BF16_LOSS_TOL, BF16_GRAD_TOL)
        } else {
            (FP32_TOL, FP32_TOL)
        };
        let loss_rel = if got.loss == want.loss {
            0.0
        } else {
            ((got.loss - want.loss) / want.loss).abs()
        };
        let mut c = loss_check
            .at_most(
                loss_rel,
                loss_tol,
                format!(
                    "{:.7} vs host {:.7}: rel {loss_rel:.2e} <= {loss_tol:.0e}",
                    got.loss, want.loss
                ),
            )
            .with_data(serde_json::json!({"device": figure(got.loss), "host": figure(want.loss)}));
        c.seconds = secs;
        report.add(c)?;
        let errs = tensor_errors(&spec, &got, &want);
        let (worst_name, worst) = errs
            .first()
            .map_or(("none".to_string(), 0.0), |(n, e)| (n.clone(), *e));
        let over = errs
            .iter()
            .filter(|(_, e)| e.is_nan() || *e > grad_tol)
            .count();
        let data = serde_json::json!(errs
            .iter()
            .map(|(n, e)| serde_json::json!({"tensor": n, "rel_l2": figure(*e)}))
            .collect::<Vec<_>>());
        let c = grad_check
            .at_most(
                worst,
                grad_tol,
                format!(
                    "worst ||d||/||ref|| {worst:.2e} <= {grad_tol:.0e} ({worst_name}); {over} of {} tensors over",
                    errs.len()
                ),
            )
            .with_data(data);
        report.add(c)?;
    }
    Ok(())
}
