//! Validation of the whole configuration in one place: every out-of-range value and
//! every impossible combination, each reported with its numbers and what to do.

use super::{resolve_model, Config, ConfigError, Precision, Schedule, Stage};

/// Record `msg` unless `ok`.
fn need(p: &mut Vec<String>, ok: bool, msg: String) {
    if !ok {
        p.push(msg);
    }
}

impl Config {
    /// Check every value and combination; all problems are reported at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p: Vec<String> = Vec::new();

        // [model]
        match resolve_model(&self.model) {
            Ok(d) => {
                need(
                &mut p,
                    d.vocab_size > 0 && d.context_len > 0 && d.layers > 0 && d.width > 0,
                    format!(
                        "model dimensions must be positive: vocab_size {}, context_len {}, layers {}, width {}",
                        d.vocab_size, d.context_len, d.layers, d.width
                    ),
                );
                need(
                &mut p,
                    d.heads > 0 && d.width % d.heads.max(1) == 0,
                    format!(
                        "model.heads ({}) must divide model.width ({}); pick heads among the divisors of the width",
                        d.heads, d.width
                    ),
                );
                need(
                &mut p,
                    self.train.seq_len <= d.context_len,
                    format!(
                        "train.seq_len ({}) exceeds the model's context_len ({}); lower train.seq_len or raise model.context_len",
                        self.train.seq_len, d.context_len
                    ),
                );
            }
            Err(e) => p.push(e),
        }

        // [data]
        need(
            &mut p,
            !self.data.path.is_empty(),
            "data.path is empty; give a token file or \"builtin\"".into(),
        );

        // [train]
        let t = &self.train;
        need(
            &mut p,
            t.steps > 0,
            "train.steps is 0; set it to at least 1".into(),
        );
        let tokens = t
            .micro_batch
            .checked_mul(t.seq_len)
            .and_then(|x| x.checked_mul(t.grad_accum));
        need(
                &mut p,
            tokens.is_some_and(|x| x > 0),
            format!(
                "micro_batch x seq_len x grad_accum = {} x {} x {} must be positive: every step needs tokens",
                t.micro_batch, t.seq_len, t.grad_accum
            ),
        );
        need(
            &mut p,
            t.log_every > 0,
            "train.log_every is 0; set it to at least 1".into(),
        );

        // [zero]
        let z = &self.zero;
        if let Some(true) = z.reduce_every_micro_step {
            need(
                &mut p,
                z.stage >= Stage::Zero2,
                format!(
                    "zero.reduce_every_micro_step = true needs stage 2 or 3 (stage is {}): stages 0/1 keep full gradients and reduce once per step; remove the key or set zero.stage = 2",
                    z.stage.number()
                ),
            );
        }
        need(
            &mut p,
            z.bucket_elems > 0,
            "zero.bucket_elems is 0; give the bucket capacity in elements (default 16777216)"
                .into(),
        );
        need(
                &mut p,
            z.align > 0,
            "zero.align is 0; give the shard alignment in elements (default 32 = 64 bytes of 16-bit elements)".into(),
        );

        // [precision]
        let pr = &self.precision;
        if pr.dtype == Precision::Fp32 {
            need(
                &mut p,
                pr.grad_reduce_dtype != Some(super::GradReduceDtype::Half),
                "precision.grad_reduce_dtype = \"half\" with dtype = \"fp32\": fp32 gradients have no 16-bit form; remove the key or set it to \"f32\"".into(),
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
                &mut p,
                pr.initial_scale.is_finite()
                    && pr.initial_scale >= pr.min_scale
                    && pr.min_scale > 0.0,
                format!(
                    "loss scale bounds: need 0 < min_scale ({}) <= initial_scale ({}), both finite",
                    pr.min_scale, pr.initial_scale
                ),
            );
            need(
                &mut p,
                pr.growth_factor > 1.0 && pr.growth_factor.is_finite(),
                format!(
                    "precision.growth_factor ({}) must be > 1 (default 2)",
                    pr.growth_factor
                ),
            );
            need(
                &mut p,
                pr.backoff_factor > 0.0 && pr.backoff_factor < 1.0,
                format!(
                    "precision.backoff_factor ({}) must be in (0, 1) (default 0.5)",
                    pr.backoff_factor
                ),
            );
            need(
                &mut p,
                pr.growth_interval > 0,
                "precision.growth_interval is 0; set the clean steps before growth (default 1000)"
                    .into(),
            );
            need(
                &mut p,
                pr.hysteresis > 0,
                "precision.hysteresis is 0; set the overflows tolerated before backing off (default 2)".into(),
            );
        }

        // [optim]
        let o = &self.optim;
        need(
            &mut p,
            o.lr > 0.0 && o.lr.is_finite(),
            format!("optim.lr ({}) must be positive and finite, e.g. 6e-4", o.lr),
        );
        need(
            &mut p,
            o.betas.iter().all(|b| (0.0..1.0).contains(b)),
            format!(
                "optim.betas ({}, {}) must each be in [0, 1), e.g. [0.9, 0.95]",
                o.betas[0], o.betas[1]
            ),
        );
        need(
            &mut p,
            o.eps > 0.0 && o.eps.is_finite(),
            format!("optim.eps ({}) must be positive, e.g. 1e-8", o.eps),
        );
        need(
            &mut p,
            o.weight_decay >= 0.0 && o.weight_decay.is_finite(),
            format!("optim.weight_decay ({}) must be >= 0", o.weight_decay),
        );
        need(
            &mut p,
            o.grad_clip >= 0.0 && o.grad_clip.is_finite(),
            format!(
                "optim.grad_clip ({}) must be >= 0 (0 disables clipping)",
                o.grad_clip
            ),
        );
        match o.schedule {
            Schedule::Constant => need(
                &mut p,
                o.warmup_steps == 0 && o.min_lr == 0.0,
                format!(
                    "optim.warmup_steps ({}) / optim.min_lr ({}) only apply to schedule = \"warmup_cosine\"; set the schedule or remove them",
                    o.warmup_steps, o.min_lr
                ),
            ),
            Schedule::WarmupCosine => {
                need(
                &mut p,
                    o.min_lr >= 0.0 && o.min_lr <= o.lr,
                    format!("optim.min_lr ({}) must be in [0, lr = {}]", o.min_lr, o.lr),
                );
                need(
                &mut p,
                    o.warmup_steps <= t.steps,
                    format!(
                        "optim.warmup_steps ({}) exceeds train.steps ({}); shorten the warmup",
                        o.warmup_steps, t.steps
                    ),
                );
            }
        }

        if p.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid { problems: p })
        }
    }
}
