//! Validation of the engine's configuration in one place: every out-of-range value and
//! every impossible combination, each reported with its numbers and what to do.

use super::{ConfigError, EngineConfig, Precision, Schedule, Stage};

/// Record `msg` unless `ok`.
fn need(p: &mut Vec<String>, ok: bool, msg: String) {
    if !ok {
        p.push(msg);
    }
}

impl EngineConfig {
    /// Check every value and combination; all problems are reported at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Vec::new();
        self.collect_problems(&mut p);
        if p.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems: p })
        }
    }

    /// Append every problem to `p` (for an application that validates its own sections
    /// too and reports everything in one list).
    pub fn collect_problems(&self, p: &mut Vec<String>) {
        need(
            p,
            self.grad_accum > 0,
            "grad_accum (train.grad_accum) is 0; accumulate at least 1 micro-batch per step".into(),
        );

        // [zero]
        let z = &self.zero;
        if let Some(true) = z.reduce_every_micro_step {
            need(
                p,
                z.stage >= Stage::Zero2,
                format!(
                    "zero.reduce_every_micro_step = true needs stage 2 or 3 (stage is {}): stages 0/1 keep full gradients and reduce once per step; remove the key or set zero.stage = 2",
                    z.stage.number()
                ),
            );
        }
        need(
            p,
            z.bucket_elems != Some(0),
            "zero.bucket_elems is 0; give the bucket capacity in elements, or remove the key for the default (max(4Mi, 64Ki x N))"
                .into(),
        );
        if z.quantize_weights {
            need(
                p,
                z.stage != Stage::Zero0,
                "zero.quantize_weights = true quantizes parameter gathers, and stage 0 gathers none: set zero.stage to 1, 2 or 3, or remove the key".into(),
            );
            need(
                p,
                z.stage == Stage::Zero3 || self.precision.dtype != Precision::Fp32,
                format!(
                    "zero.quantize_weights = true at stage {} rounds the parameters gathered after the step, which in fp32 training are the master weights: use precision.dtype = \"bf16\" (the master stays fp32 and exact) or stage 3, or remove the key",
                    z.stage.number()
                ),
            );
        }
        need(
            p,
            !z.hierarchical_weights || z.stage == Stage::Zero3,
            format!(
                "zero.hierarchical_weights = true keeps a node-partitioned copy of the weights for stage 3's backward gathers, and stage {} gathers none before layers: set zero.stage = 3, or remove the key",
                z.stage.number()
            ),
        );
        need(
            p,
            !z.quantize_grads || z.stage != Stage::Zero0,
            "zero.quantize_grads = true quantizes the gradient reduce-scatter of stages 1-3, and stage 0 all-reduces: set zero.stage to 1, 2 or 3, or remove the key".into(),
        );
        need(
            p,
            !z.quantize_grads || self.precision.reduce_dtype() != zero_kernels::DType::F16,
            "zero.quantize_grads = true in fp16 training would quantize fp16 gradients, which the CUDA quantization kernels do not take (f32 and bf16 only): set precision.grad_reduce_dtype = \"f32\", or remove the key".into(),
        );
        need(
            p,
            matches!(z.grad_quant_bits, 4 | 8),
            format!(
                "zero.grad_quant_bits is {}; qgZ codes are 8 (int8) or 4 (int4) bits",
                z.grad_quant_bits
            ),
        );
        need(
            p,
            z.grad_quant_bits != 4 || !z.quantize_grads || z.quant_block.is_multiple_of(2),
            format!(
                "zero.grad_quant_bits = 4 packs two codes a byte, and zero.quant_block = {} is odd: give an even block (default 256)",
                z.quant_block
            ),
        );
        need(
            p,
            z.quant_block > 0,
            "zero.quant_block is 0; give the values per scale of quantized communication (default 256)".into(),
        );
        need(
            p,
            z.align > 0,
            "zero.align is 0; give the shard alignment in elements (default 32 = 64 bytes of 16-bit elements)".into(),
        );
        need(
            p,
            z.align <= crate::layout::MAX_ALIGN,
            format!(
                "zero.align = {} is past the largest alignment, 2^20 = {} elements (a checkpoint saved so could not be read back); give at most that (default 32)",
                z.align,
                crate::layout::MAX_ALIGN
            ),
        );

        // [precision]
        let pr = &self.precision;
        if pr.dtype == Precision::Fp32 {
            need(
                p,
                pr.grad_reduce_dtype != Some(super::GradDtype::Half),
                "precision.grad_reduce_dtype = \"half\" with dtype = \"fp32\": fp32 gradients have no 16-bit form; remove the key or set it to \"f32\"".into(),
            );
            need(
                p,
                pr.grad_accum_dtype != Some(super::GradDtype::Half),
                "precision.grad_accum_dtype = \"half\" with dtype = \"fp32\": fp32 gradients have no 16-bit form; remove the key or set it to \"f32\"".into(),
            );
        }
        match (pr.dtype, pr.loss_scaling) {
            (Precision::Fp16, Some(false)) => p.push(
                "precision.dtype = \"fp16\" needs dynamic loss scaling (its gradients underflow without it); set precision.loss_scaling = true or use bf16".into(),
            ),
            (Precision::Fp32 | Precision::Bf16, Some(true)) => p.push(format!(
                "precision.loss_scaling = true with dtype = \"{}\": loss scaling is for fp16 only (bf16 and fp32 have fp32's exponent range); remove the key",
                match pr.dtype { Precision::Fp32 => "fp32", _ => "bf16" }
            )),
            _ => {}
        }
        if pr.loss_scaling() {
            need(
                p,
                pr.initial_scale <= crate::engine::scaler::MAX_LOSS_SCALE
                    && pr.initial_scale >= pr.min_scale
                    && pr.min_scale >= crate::engine::scaler::MIN_LOSS_SCALE,
                format!(
                    "loss scale bounds: need 2^-126 <= min_scale ({}) <= initial_scale ({}) <= 2^127 (gradients are multiplied by 1/scale in f32: 2^-126 is f32's smallest normal number, and not far below it 1/scale is infinite, so every step would count as an overflow; 2^127 is the largest power of two f32 holds)",
                    pr.min_scale, pr.initial_scale
                ),
            );
            need(
                p,
                pr.growth_factor > 1.0 && pr.growth_factor.is_finite(),
                format!(
                    "precision.growth_factor ({}) must be > 1 (default 2)",
                    pr.growth_factor
                ),
            );
            need(
                p,
                pr.backoff_factor > 0.0 && pr.backoff_factor < 1.0,
                format!(
                    "precision.backoff_factor ({}) must be in (0, 1) (default 0.5)",
                    pr.backoff_factor
                ),
            );
            need(
                p,
                pr.growth_interval > 0,
                "precision.growth_interval is 0; set the clean steps before growth (default 1000)"
                    .into(),
            );
            need(
                p,
                pr.hysteresis > 0,
                "precision.hysteresis is 0; set the overflows tolerated before backing off (default 2)".into(),
            );
            need(
                p,
                pr.max_skips_at_min_scale > 0,
                "precision.max_skips_at_min_scale is 0; set how many overflowing steps in a row at the minimum loss scale stop training (default 100)".into(),
            );
        }

        // [divergence]
        let d = &self.divergence;
        need(
            p,
            (d.spike_factor > 1.0 || d.spike_factor == 0.0) && d.spike_factor.is_finite(),
            format!(
                "divergence.spike_factor ({}) must be > 1: a loss above this multiple of its recent median is a spike (default 3; 0 turns the spike test off)",
                d.spike_factor
            ),
        );
        need(
            p,
            d.window > 0,
            "divergence.window is 0; set the number of recent losses the median is taken over (default 50)".into(),
        );
        need(
            p,
            d.max_consecutive_skips > 0,
            "divergence.max_consecutive_skips is 0; set how many steps in a row skip_step may skip before training stops (default 20)".into(),
        );

        // [optim]
        let o = &self.optim;
        need(
            p,
            o.lr > 0.0 && o.lr.is_finite(),
            format!("optim.lr ({}) must be positive and finite, e.g. 6e-4", o.lr),
        );
        need(
            p,
            o.betas.iter().all(|b| (0.0..1.0).contains(b)),
            format!(
                "optim.betas ({}, {}) must each be in [0, 1), e.g. [0.9, 0.95]",
                o.betas[0], o.betas[1]
            ),
        );
        need(
            p,
            o.eps > 0.0 && o.eps.is_finite(),
            format!("optim.eps ({}) must be positive, e.g. 1e-8", o.eps),
        );
        need(
            p,
            o.weight_decay >= 0.0 && o.weight_decay.is_finite(),
            format!("optim.weight_decay ({}) must be >= 0", o.weight_decay),
        );
        need(
            p,
            o.grad_clip >= 0.0 && o.grad_clip.is_finite(),
            format!(
                "optim.grad_clip ({}) must be >= 0 (0 disables clipping)",
                o.grad_clip
            ),
        );
        match o.schedule {
            Schedule::Constant => need(
                p,
                o.warmup_steps == 0 && o.min_lr == 0.0 && o.decay_steps.is_none(),
                format!(
                    "optim.warmup_steps ({}) / optim.min_lr ({}) / optim.decay_steps only apply to schedule = \"warmup_cosine\"; set the schedule or remove them",
                    o.warmup_steps, o.min_lr
                ),
            ),
            Schedule::WarmupCosine => {
                need(
                    p,
                    o.min_lr >= 0.0 && o.min_lr <= o.lr,
                    format!("optim.min_lr ({}) must be in [0, lr = {}]", o.min_lr, o.lr),
                );
                match o.decay_steps {
                    None => p.push("optim.decay_steps is not set: schedule = \"warmup_cosine\" decays to min_lr at that step; set it (usually to the run's number of steps)".into()),
                    Some(d) => need(
                        p,
                        o.warmup_steps <= d,
                        format!(
                            "optim.warmup_steps ({}) exceeds the decay horizon ({d} steps, train.steps unless optim.decay_steps is set); shorten the warmup",
                            o.warmup_steps
                        ),
                    ),
                }
            }
        }
    }
}
