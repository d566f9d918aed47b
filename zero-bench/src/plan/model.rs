//! The model a plan is made for: a GPT-2 preset (its real [`ModelSpec`], and its
//! activation arena from `zero_models::activation_bytes_for`, the size `Gpt::new`
//! allocates: B x the context length, whatever T a step uses) or a synthetic model of Ψ
//! parameters given only by count.
//!
//! Synthetic model: L equal units (the first Ψ mod L one element longer) chained one per
//! layer, no tied units. Units only matter for partition padding (each unit is padded to
//! a multiple of N x align) and for the stage-3 gather slots and f32 compute windows,
//! which are sized by the largest unit. The default L is the depth of a transformer of
//! that size with GPT-3's aspect ratio (C = 128 L, Ψ ≈ 12 L C², so L = (Ψ / 196608)^(1/3):
//! 96 for 175e9, 71 for 70e9, 34 for 7.5e9); `--units` overrides it.

use anyhow::{bail, Context as _};
use zero_core::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};
use zero_models::ModelPreset;

/// Bytes per element of the reference model's activations (`Gpt<f32>`).
const ACTIVATION_ELEM_BYTES: usize = 4;

/// What the plan is computed for.
#[derive(Clone, Debug)]
pub struct PlanModel {
    /// `gpt2-1.5b`, or `synthetic`.
    pub name: String,
    /// Units and layers, as the engine sees them.
    pub spec: ModelSpec,
    /// Ψ.
    pub numel: usize,
    /// The activation arena per micro-step, bytes.
    pub activation_bytes: u64,
    /// How the activation bytes were obtained, for the report.
    pub activation_note: String,
    /// Training FLOPs per token (forward + backward), for the optional compute estimate.
    pub flops_per_token: f64,
    /// The preset's shape (GPT-2 or Llama), when the model is a preset.
    pub preset: Option<ModelPreset>,
}

/// The default number of units of a synthetic model of `params` parameters.
pub fn default_units(params: u64) -> usize {
    // L = (Ψ / (12 x 128²))^(1/3), at least 1.
    let l = (params as f64 / (12.0 * 128.0 * 128.0)).cbrt().round();
    (l as usize).max(1)
}

/// A GPT-2 or Llama preset with micro-batches of B sequences and activation
/// checkpointing every `checkpoint_every` blocks (0: off); `seq_len` (T, default the
/// context length) only sets the FLOPs per token.
pub fn preset(
    name: &str,
    micro_batch: usize,
    seq_len: Option<usize>,
    checkpoint_every: usize,
) -> anyhow::Result<PlanModel> {
    let cfg = ModelPreset::lookup(name)
        .with_context(|| format!("--model {name}: not a model preset"))?
        .with_checkpoint_every(checkpoint_every);
    let ctx = cfg.max_seq_len();
    let t = seq_len.unwrap_or(ctx);
    if t == 0 || t > ctx {
        bail!("--seq-len {t} is outside 1..={ctx} (the context length of {name})");
    }
    let spec = cfg.spec();
    // `Gpt::new` and `Llama::new` size their arena for micro-batches of up to B x the
    // context length, whatever T a step uses: the plan reports what the model allocates.
    let act = cfg.activation_bytes(micro_batch, ctx, ACTIVATION_ELEM_BYTES);
    let family = match cfg {
        ModelPreset::Gpt(_) => "GPT",
        ModelPreset::Llama(_) => "Llama",
    };
    Ok(PlanModel {
        name: name.to_string(),
        numel: spec.numel(),
        spec,
        activation_bytes: act as u64,
        activation_note: if checkpoint_every == 0 {
            format!(
                "the {family}'s f32 activation arena, sized by its `new` for B = {micro_batch} x the context length {ctx} (zero_models::ModelPreset::activation_bytes); no activation checkpointing"
            )
        } else {
            let full = cfg.with_checkpoint_every(0).activation_bytes(
                micro_batch,
                ctx,
                ACTIVATION_ELEM_BYTES,
            );
            format!(
                "the {family}'s f32 activation arena, sized by its `new` for B = {micro_batch} x the context length {ctx} (zero_models::ModelPreset::activation_bytes), checkpointing every {checkpoint_every} block(s); without checkpointing: {}",
                zero_core::ledger::human_bytes(full as f64)
            )
        },
        flops_per_token: cfg.flops_per_token(t),
        preset: Some(cfg),
    })
}

/// A synthetic model of `params` parameters in `units` equal units, with a given
/// activation budget (the synthetic model has no activation model of its own).
pub fn synthetic(params: u64, units: usize, activation_bytes: u64) -> anyhow::Result<PlanModel> {
    let numel = usize::try_from(params)
        .with_context(|| format!("--params {params} does not fit this machine's usize"))?;
    if numel == 0 {
        bail!("--params must be at least 1, got 0");
    }
    if units == 0 || units > numel {
        bail!("--units {units} must be in 1..={numel} (one element per unit at least)");
    }
    let (base, extra) = (numel / units, numel % units);
    let unit_specs: Vec<UnitSpec> = (0..units)
        .map(|u| UnitSpec {
            name: format!("u.{u}"),
            params: vec![ParamSpec::new(
                format!("u.{u}.weight"),
                &[base + usize::from(u < extra)],
            )],
        })
        .collect();
    let layers = (0..units)
        .map(|u| LayerSpec::new(format!("u.{u}"), vec![u]))
        .collect();
    let spec = ModelSpec {
        units: unit_specs,
        layers,
    };
    Ok(PlanModel {
        name: "synthetic".into(),
        numel,
        spec,
        activation_bytes,
        activation_note: if activation_bytes == 0 {
            "not counted: a model given by --params has no activation model; pass --activation-mem"
                .into()
        } else {
            "as given by --activation-mem".into()
        },
        // 6 FLOPs per parameter per token (2 forward, 4 backward), attention left out.
        flops_per_token: 6.0 * numel as f64,
        preset: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_units_add_up_to_psi() {
        let m = synthetic(1_000_003, 7, 0).unwrap();
        assert_eq!(m.spec.numel(), 1_000_003);
        assert_eq!(m.spec.units.len(), 7);
        let lens: Vec<usize> = m.spec.units.iter().map(UnitSpec::numel).collect();
        assert_eq!(lens.iter().max().unwrap() - lens.iter().min().unwrap(), 1);
        assert!(m.spec.validate().is_ok());
    }

    #[test]
    fn default_depth_follows_gpt3_aspect_ratio() {
        assert_eq!(default_units(175_000_000_000), 96);
        assert_eq!(default_units(70_000_000_000), 71);
        assert_eq!(default_units(7_500_000_000), 34);
        assert_eq!(default_units(10), 1);
    }

    #[test]
    fn bad_models_are_errors() {
        assert!(synthetic(0, 1, 0).is_err());
        assert!(synthetic(10, 11, 0).is_err());
        assert!(preset("gpt5", 1, None, 0).is_err());
        assert!(preset("gpt2-124m", 1, Some(4096), 0).is_err());
        let m = preset("gpt2-124m", 1, None, 0).unwrap();
        assert_eq!(
            m.numel,
            zero_models::GptConfig::preset("gpt2-124m")
                .unwrap()
                .num_params()
        );
        assert!(m.activation_bytes > 0);
    }
}
