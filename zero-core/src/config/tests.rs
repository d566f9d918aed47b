//! One test per engine-configuration error, the defaults, and the schedule.

use super::*;

fn problems(text: &str) -> Vec<String> {
    let c: EngineConfig = toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    match c.validate() {
        Err(ConfigError { problems }) => problems,
        Ok(()) => panic!("expected problems for {text}"),
    }
}

fn has(problems: &[String], needle: &str) {
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "no problem mentions '{needle}': {problems:#?}"
    );
}

#[test]
fn defaults_are_valid_and_follow_the_stage() {
    let c = EngineConfig::default();
    c.validate().unwrap();
    assert_eq!(c.zero.stage, Stage::Zero2);
    assert!(c.zero.reduce_every_micro_step());
    assert_eq!(c.precision.reduce_dtype(), DType::BF16);
    let c: EngineConfig = toml::from_str("[zero]\nstage = 1\n").unwrap();
    assert!(!c.zero.reduce_every_micro_step());
    // Unknown keys are refused, naming the key.
    let e = toml::from_str::<EngineConfig>("[zero]\nstges = 2\n").unwrap_err();
    assert!(e.to_string().contains("stges"), "{e}");
}

#[test]
fn the_default_bucket_is_a_budget_that_grows_with_n() {
    let z = ZeroConfig::default();
    assert_eq!(z.bucket_elems_for(1), 1 << 22);
    assert_eq!(z.bucket_elems_for(64), 1 << 22);
    assert_eq!(z.bucket_elems_for(512), 512 << 16);
    let fixed = ZeroConfig {
        bucket_elems: Some(1000),
        ..ZeroConfig::default()
    };
    assert_eq!(fixed.bucket_elems_for(512), 1000);
}

#[test]
fn quantized_gathers_need_a_gather_a_master_and_a_block() {
    has(
        &problems("[zero]\nstage = 0\nquantize_weights = true\n"),
        "stage 0 gathers none",
    );
    for stage in [1, 2] {
        let p = problems(&format!(
            "[zero]\nstage = {stage}\nquantize_weights = true\n[precision]\ndtype = \"fp32\"\n"
        ));
        has(&p, "are the master weights");
        let ok: EngineConfig = toml::from_str(&format!(
            "[zero]\nstage = {stage}\nquantize_weights = true\n[precision]\ndtype = \"bf16\"\n"
        ))
        .unwrap();
        ok.validate().unwrap();
    }
    has(
        &problems("[zero]\nstage = 3\nquantize_weights = true\nquant_block = 0\n"),
        "zero.quant_block is 0",
    );
    let ok: EngineConfig = toml::from_str("[zero]\nstage = 3\nquantize_weights = true\n").unwrap();
    ok.validate().unwrap();
    assert_eq!(ok.zero.quant_block, 256);
}

#[test]
fn hierarchical_switches_need_their_stages() {
    for stage in [0, 1, 2] {
        has(
            &problems(&format!(
                "[zero]\nstage = {stage}\nhierarchical_weights = true\n"
            )),
            "set zero.stage = 3",
        );
    }
    has(
        &problems("[zero]\nstage = 0\nquantize_grads = true\n"),
        "stage 0 all-reduces",
    );
    for stage in [1, 2, 3] {
        let ok: EngineConfig = toml::from_str(&format!(
            "[zero]\nstage = {stage}\nquantize_grads = true\nranks_per_node = 2\n"
        ))
        .unwrap();
        ok.validate().unwrap();
        assert!(ok.zero.hierarchical());
    }
    has(
        &problems("[zero]\nstage = 2\nquantize_grads = true\n[precision]\ndtype = \"fp16\"\n"),
        "grad_reduce_dtype = \"f32\"",
    );
    let ok: EngineConfig = toml::from_str(
        "[zero]\nstage = 2\nquantize_grads = true\n[precision]\ndtype = \"fp16\"\ngrad_reduce_dtype = \"f32\"\n",
    )
    .unwrap();
    ok.validate().unwrap();
    has(
        &problems("[zero]\nstage = 2\nquantize_grads = true\ngrad_quant_bits = 2\n"),
        "8 (int8) or 4 (int4)",
    );
    has(
        &problems(
            "[zero]\nstage = 2\nquantize_grads = true\ngrad_quant_bits = 4\nquant_block = 33\n",
        ),
        "give an even block",
    );
    let ok: EngineConfig =
        toml::from_str("[zero]\nstage = 2\nquantize_grads = true\ngrad_quant_bits = 4\n").unwrap();
    ok.validate().unwrap();
    let ok: EngineConfig =
        toml::from_str("[zero]\nstage = 3\nhierarchical_weights = true\n").unwrap();
    ok.validate().unwrap();
    assert_eq!(ok.zero.ranks_per_node, 0);
    assert!(!EngineConfig::default().zero.hierarchical());
}

/// The gradient accumulator's dtype: the parameters' unless "f32" is asked for (fp32
/// training always f32); the reductions keep their own setting.
#[test]
fn the_gradient_accumulator_is_16_bit_unless_f32_is_asked_for() {
    use zero_kernels::DType;
    let resolved = |text: &str| {
        let c: EngineConfig = toml::from_str(text).unwrap();
        c.validate().unwrap();
        (c.precision.grad_dtype(), c.precision.reduce_dtype())
    };
    assert_eq!(resolved(""), (DType::BF16, DType::BF16));
    assert_eq!(
        resolved("[precision]\ngrad_accum_dtype = \"f32\"\n"),
        (DType::F32, DType::BF16)
    );
    assert_eq!(
        resolved("[precision]\ndtype = \"fp16\"\ngrad_accum_dtype = \"f32\"\ngrad_reduce_dtype = \"f32\"\n"),
        (DType::F32, DType::F32)
    );
    assert_eq!(
        resolved("[precision]\ndtype = \"fp16\"\ngrad_accum_dtype = \"half\"\n"),
        (DType::F16, DType::F16)
    );
    assert_eq!(
        resolved("[precision]\ndtype = \"fp32\"\ngrad_accum_dtype = \"f32\"\n"),
        (DType::F32, DType::F32)
    );
    assert!(toml::from_str::<EngineConfig>("[precision]\ngrad_accum_dtype = \"f64\"\n").is_err());
}

#[test]
fn reduce_every_micro_step_needs_stage_2_or_3() {
    for stage in [0, 1] {
        let p = problems(&format!(
            "[zero]\nstage = {stage}\nreduce_every_micro_step = true\n"
        ));
        has(&p, "needs stage 2 or 3");
    }
    let ok: EngineConfig =
        toml::from_str("[zero]\nstage = 3\nreduce_every_micro_step = false\n").unwrap();
    ok.validate().unwrap();
    assert!(toml::from_str::<EngineConfig>("[zero]\nstage = 4\n")
        .unwrap_err()
        .to_string()
        .contains("use 0, 1, 2 or 3"));
}

#[test]
fn fp16_needs_loss_scaling_and_only_fp16_may_use_it() {
    has(
        &problems("[precision]\ndtype = \"fp16\"\nloss_scaling = false\n"),
        "needs dynamic loss scaling",
    );
    has(
        &problems("[precision]\ndtype = \"bf16\"\nloss_scaling = true\n"),
        "loss scaling is for fp16 only",
    );
    has(
        &problems("[precision]\ndtype = \"fp32\"\ngrad_reduce_dtype = \"half\"\n"),
        "fp32 gradients have no 16-bit form",
    );
    has(
        &problems("[precision]\ndtype = \"fp32\"\ngrad_accum_dtype = \"half\"\n"),
        "precision.grad_accum_dtype = \"half\" with dtype = \"fp32\"",
    );
    has(
        &problems("[precision]\ndtype = \"fp16\"\nbackoff_factor = 1.5\n"),
        "backoff_factor (1.5)",
    );
    has(
        &problems("[precision]\ndtype = \"fp16\"\nmin_scale = 1e6\n"),
        "min_scale",
    );
    has(
        &problems("[precision]\ndtype = \"fp16\"\ninitial_scale = 1e39\n"),
        "<= 2^127",
    );
    // Below 2^-126, 1/scale is infinite in f32 and every step would be an "overflow".
    let tiny = "[precision]\ndtype = \"fp16\"\ninitial_scale = 1e-39\nmin_scale = 1e-39\n";
    has(&problems(tiny), "2^-126 <= min_scale (0.000");
    has(&problems(tiny), "1/scale");
    let below = "[precision]\ndtype = \"fp16\"\nmin_scale = 1e-39\n";
    has(&problems(below), "2^-126 <= min_scale");
    // Both bounds themselves are accepted.
    let edges: EngineConfig = toml::from_str(
        "[precision]\ndtype = \"fp16\"\nmin_scale = 1.1754943508222875e-38\ninitial_scale = 1.7014118346046923e38\n",
    )
    .unwrap();
    assert_eq!(
        edges.precision.min_scale,
        crate::engine::scaler::MIN_LOSS_SCALE
    );
    assert_eq!(
        crate::engine::scaler::MIN_LOSS_SCALE,
        2f64.powi(-126),
        "the floor is 2^-126"
    );
    assert!((1.0 / edges.precision.min_scale as f32).is_finite());
    edges.validate().unwrap();
}

#[test]
fn optimizer_values_out_of_range() {
    has(&problems("[optim]\nlr = 0.0\n"), "optim.lr (0)");
    has(&problems("[optim]\nlr = -1e-3\n"), "optim.lr (-0.001)");
    has(
        &problems("[optim]\nbetas = [0.9, 1.0]\n"),
        "optim.betas (0.9, 1)",
    );
    has(&problems("[optim]\neps = 0.0\n"), "optim.eps");
    has(
        &problems("[optim]\nweight_decay = -0.1\n"),
        "weight_decay (-0.1)",
    );
    has(&problems("[optim]\ngrad_clip = -1.0\n"), "grad_clip (-1)");
    has(
        &problems("[optim]\nwarmup_steps = 5\n"),
        "only apply to schedule",
    );
    has(
        &problems("[optim]\nschedule = \"warmup_cosine\"\nwarmup_steps = 50\ndecay_steps = 10\n"),
        "warmup_steps (50) exceeds the decay horizon (10 steps",
    );
    has(
        &problems("[optim]\nschedule = \"warmup_cosine\"\n"),
        "optim.decay_steps is not set",
    );
    has(
        &problems("[optim]\nschedule = \"warmup_cosine\"\nmin_lr = 1.0\ndecay_steps = 10\n"),
        "min_lr (1)",
    );
}

#[test]
fn zero_sizes_and_every_problem_at_once() {
    let p = problems(
        "grad_accum = 0\n[zero]\nbucket_elems = 0\nalign = 0\n[precision]\ndtype = \"fp16\"\n\
         growth_factor = 1.0\ngrowth_interval = 0\nhysteresis = 0\n",
    );
    has(&p, "grad_accum (train.grad_accum) is 0");
    has(&p, "zero.bucket_elems is 0");
    has(&p, "zero.align is 0");
    has(&p, "growth_factor (1) must be > 1");
    has(&p, "growth_interval is 0");
    has(&p, "hysteresis is 0");
    assert_eq!(p.len(), 6, "{p:#?}");
    let c: EngineConfig = toml::from_str("grad_accum = 0\n").unwrap();
    let msg = c.validate().unwrap_err().to_string();
    assert!(msg.starts_with("invalid configuration:\n  - "), "{msg}");
}

#[test]
fn an_alignment_no_checkpoint_could_be_read_back_with_is_refused() {
    let p = problems("[zero]\nalign = 2097152\n");
    has(&p, "zero.align = 2097152 is past the largest alignment");
    assert_eq!(p.len(), 1, "{p:#?}");
    let largest: EngineConfig = toml::from_str("[zero]\nalign = 1048576\n").unwrap();
    largest.validate().unwrap();
}

#[test]
fn learning_rate_schedule() {
    let o = OptimConfig {
        lr: 1.0,
        min_lr: 0.1,
        schedule: Schedule::WarmupCosine,
        warmup_steps: 10,
        decay_steps: Some(110),
        ..OptimConfig::default()
    };
    assert_eq!(o.lr_at(0), 0.1);
    assert_eq!(o.lr_at(9), 1.0);
    assert_eq!(o.lr_at(10), 1.0);
    assert!((o.lr_at(60) - 0.55).abs() < 1e-12);
    assert!((o.lr_at(110) - 0.1).abs() < 1e-12);
    assert!(
        (o.lr_at(500) - 0.1).abs() < 1e-12,
        "held at min_lr after the horizon"
    );
    assert_eq!(OptimConfig::default().lr_at(7), 1e-3);
}
