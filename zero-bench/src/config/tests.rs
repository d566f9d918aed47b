//! One test per configuration error of this tool's sections (the engine's own are tested
//! in zero-core), the engine errors reported through the same list, provenance, overrides.

use super::load::load_str;
use super::*;
use zero_core::config::{Precision, Schedule, Stage};
use zero_core::DType;

fn problems(text: &str, sets: &[&str]) -> Vec<String> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    match load_str(text, "test.toml", &sets) {
        Err(LoadError::Invalid { problems }) => problems,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

fn has(problems: &[String], needle: &str) {
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "no problem mentions '{needle}': {problems:#?}"
    );
}

#[test]
fn empty_file_is_a_valid_default_config() {
    let c = load_str("", "test.toml", &[]).unwrap();
    assert_eq!(c.config, Config::default());
    assert_eq!(c.config.zero.stage, Stage::Zero2);
    assert!(c.config.zero.reduce_every_micro_step());
    assert_eq!(c.source("zero.stage"), Source::Default);
}

#[test]
fn file_and_overrides_with_provenance() {
    let text = "[zero]\nstage = 1\n[optim]\nlr = 3e-4\nbetas = [0.8, 0.99]\n";
    let c = load_str(
        text,
        "run.toml",
        &["zero.stage=3".into(), "data.path=/data/tok.bin".into()],
    )
    .unwrap();
    assert_eq!(c.config.zero.stage, Stage::Zero3);
    assert_eq!(c.config.optim.lr, 3e-4);
    assert_eq!(c.config.optim.betas, [0.8, 0.99]);
    assert_eq!(c.config.data.path, "/data/tok.bin");
    assert_eq!(c.source("zero.stage"), Source::CommandLine);
    assert_eq!(c.source("optim.lr"), Source::File("run.toml".into()));
    assert_eq!(c.source("train.steps"), Source::Default);
    let r = c.render();
    assert!(
        r.contains("zero.stage = 3") && r.contains("# command line"),
        "{r}"
    );
    assert!(
        r.contains("optim.lr = 0.0003") && r.contains("# file run.toml"),
        "{r}"
    );
    assert!(
        r.contains("model.layers = 4") && r.contains("preset \"small\""),
        "{r}"
    );
    assert!(r.contains("zero.reduce_every_micro_step = true"), "{r}");
}

/// A stage written as text is refused naming both forms (number, or "auto"); "auto" in
/// any case is taken.
#[test]
fn a_stage_written_as_text_names_both_forms() {
    for (text, sets, origin) in [
        ("[zero]\nstage = \"3\"\n", vec![], "test.toml"),
        ("", vec!["zero.stage=three".to_string()], "command line"),
    ] {
        let msg = load_str(text, "test.toml", &sets).unwrap_err().to_string();
        assert!(
            msg.contains("is text: write the stage as a number")
                && msg.contains("\"auto\"")
                && msg.contains(origin),
            "{msg}"
        );
    }
    let auto = load_str("[zero]\nstage = \"Auto\"\n", "test.toml", &[]).unwrap();
    assert!(auto.auto_stage);
}

#[test]
fn unknown_keys_name_the_key_and_the_valid_ones() {
    let e = load_str("[zero]\nstges = 2\n", "test.toml", &[]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("stges") && msg.contains("bucket_elems"),
        "{msg}"
    );
    assert!(msg.contains("test.toml"), "{msg}");
    let e = load_str("", "test.toml", &["zero.stages=2".into()]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("stages") && msg.contains("command line"),
        "{msg}"
    );
    let e = load_str("[zeroo]\n", "test.toml", &[]).unwrap_err();
    assert!(e.to_string().contains("zeroo"), "{e}");
}

#[test]
fn bad_values_and_overrides() {
    let e = load_str("[zero]\nstage = 5\n", "t.toml", &[]).unwrap_err();
    assert!(e.to_string().contains("use 0, 1, 2 or 3"), "{e}");
    let e = load_str("[precision]\ndtype = \"fp8\"\n", "t.toml", &[]).unwrap_err();
    assert!(e.to_string().contains("fp8"), "{e}");
    let e = load_str("", "t.toml", &["zero.stage".into()]).unwrap_err();
    assert!(matches!(e, LoadError::BadOverride { .. }), "{e}");
    let e = load_str("", "t.toml", &["stage=2".into()]).unwrap_err();
    assert!(e.to_string().contains("section.key"), "{e}");
    let e = load_str(
        "",
        "t.toml",
        &["zero.stage=1".into(), "zero.stage.x=2".into()],
    );
    assert!(e.unwrap_err().to_string().contains("'stage' is a value"));
    let e = super::load::load(Some(std::path::Path::new("/nonexistent/x.toml")), &[]);
    assert!(matches!(e, Err(LoadError::Io { .. })));
}

#[test]
fn reduce_every_micro_step_needs_stage_2_or_3() {
    for stage in [0, 1] {
        let p = problems(
            &format!("[zero]\nstage = {stage}\nreduce_every_micro_step = true\n"),
            &[],
        );
        has(&p, &format!("stage is {stage}"));
    }
    let c = load_str("[zero]\nstage = 1\n", "t", &[]).unwrap();
    assert!(!c.config.zero.reduce_every_micro_step());
    let c = load_str(
        "[zero]\nstage = 3\nreduce_every_micro_step = false\n",
        "t",
        &[],
    )
    .unwrap();
    assert!(!c.config.zero.reduce_every_micro_step());
}

#[test]
fn fp16_needs_loss_scaling_and_only_fp16_may_use_it() {
    has(
        &problems("[precision]\ndtype = \"fp16\"\nloss_scaling = false\n", &[]),
        "needs dynamic loss scaling",
    );
    has(
        &problems("[precision]\ndtype = \"bf16\"\nloss_scaling = true\n", &[]),
        "fp16 only",
    );
    has(
        &problems(
            "[precision]\ndtype = \"fp32\"\ngrad_reduce_dtype = \"half\"\n",
            &[],
        ),
        "no 16-bit form",
    );
    has(
        &problems("[precision]\ndtype = \"fp16\"\nbackoff_factor = 1.5\n", &[]),
        "backoff_factor (1.5)",
    );
    has(
        &problems("[precision]\ndtype = \"fp16\"\nmin_scale = 1e6\n", &[]),
        "min_scale (1000000)",
    );
    let c = load_str("[precision]\ndtype = \"fp16\"\n", "t", &[]).unwrap();
    assert!(c.config.precision.loss_scaling());
    assert_eq!(c.config.precision.reduce_dtype(), DType::F16);
}

#[test]
fn optimizer_values_out_of_range() {
    has(&problems("[optim]\nlr = 0.0\n", &[]), "optim.lr (0)");
    has(&problems("[optim]\nlr = -1e-3\n", &[]), "optim.lr (-0.001)");
    has(
        &problems("[optim]\nbetas = [0.9, 1.0]\n", &[]),
        "optim.betas (0.9, 1)",
    );
    has(&problems("[optim]\neps = 0.0\n", &[]), "optim.eps");
    has(
        &problems("[optim]\nweight_decay = -0.1\n", &[]),
        "weight_decay (-0.1)",
    );
    has(
        &problems("[optim]\ngrad_clip = -1.0\n", &[]),
        "grad_clip (-1)",
    );
    has(
        &problems("[optim]\nwarmup_steps = 5\n", &[]),
        "only apply to schedule",
    );
    has(
        &problems(
            "[optim]\nschedule = \"warmup_cosine\"\nwarmup_steps = 50\n[train]\nsteps = 10\n",
            &[],
        ),
        "warmup_steps (50) exceeds the decay horizon (10 steps",
    );
    has(
        &problems("[optim]\nschedule = \"warmup_cosine\"\nmin_lr = 1.0\n", &[]),
        "min_lr (1)",
    );
}

#[test]
fn batch_and_model_shape_errors() {
    has(&problems("[train]\ngrad_accum = 0\n", &[]), "4 x 64 x 0");
    has(&problems("[train]\nmicro_batch = 0\n", &[]), "0 x 64 x 1");
    has(&problems("[train]\nsteps = 0\n", &[]), "train.steps is 0");
    has(
        &problems("[train]\nseq_len = 257\n", &[]),
        "train.seq_len (257) exceeds the model's context_len (256)",
    );
    has(
        &problems("[model]\nheads = 3\n", &[]),
        "model.heads (3) must divide model.width (256)",
    );
    has(
        &problems("[model]\npreset = \"gpt5\"\n", &[]),
        "not a preset",
    );
    has(
        &problems("[model]\nvocab_size = 10\n", &["model.preset=\"\""]),
        "not a preset",
    );
    let p = problems("", &["zero.bucket_elems=0", "zero.align=0"]);
    has(&p, "zero.bucket_elems is 0");
    has(&p, "zero.align is 0");
}

#[test]
fn explicit_model_without_preset_needs_all_dims() {
    let text = "[model]\nvocab_size = 100\ncontext_len = 32\nlayers = 1\nheads = 1\nwidth = 8\n";
    // An explicit `preset` key must be removable: overriding needs a file without it.
    let ok: Result<LoadedConfig, _> = load_str(text, "t", &[]);
    // The default preset is "small"; explicit dims override it, seq_len 64 > context 32.
    has(
        &match ok {
            Err(LoadError::Invalid { problems }) => problems,
            other => panic!("{other:?}"),
        },
        "exceeds the model's context_len (32)",
    );
    let m = ModelConfig {
        preset: None,
        vocab_size: Some(100),
        ..ModelConfig::default()
    };
    let e = resolve_model(&m).unwrap_err();
    assert!(e.contains("model.context_len is not set"), "{e}");
}

#[test]
fn the_engine_config_takes_accumulation_seed_and_the_decay_horizon_from_train() {
    let c = load_str(
        "[train]\nsteps = 110\ngrad_accum = 3\nseed = 9\n[optim]\nschedule = \"warmup_cosine\"\nwarmup_steps = 10\n",
        "t",
        &[],
    )
    .unwrap()
    .config;
    let e = c.engine();
    assert_eq!(
        (e.grad_accum, e.seed, e.optim.decay_steps),
        (3, 9, Some(110))
    );
    assert_eq!(e.optim.schedule, Schedule::WarmupCosine);
    e.validate().unwrap();
    let c = load_str(
        "",
        "t",
        &[
            "optim.decay_steps=50".into(),
            "optim.schedule=warmup_cosine".into(),
        ],
    )
    .unwrap()
    .config;
    assert_eq!(c.engine().optim.decay_steps, Some(50));
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = "[model]\nlayers = 0\n[data]\npath = \"\"\n[train]\nlog_every = 0\n\
                [precision]\ndtype = \"fp16\"\ngrowth_factor = 1.0\ngrowth_interval = 0\nhysteresis = 0\n";
    let p = problems(text, &[]);
    has(&p, "layers 0");
    has(&p, "data.path is empty");
    has(&p, "train.log_every is 0");
    has(&p, "growth_factor (1) must be > 1");
    has(&p, "growth_interval is 0");
    has(&p, "hysteresis is 0");
    assert_eq!(p.len(), 6, "{p:#?}");
    let msg = load_str(text, "t", &[]).unwrap_err().to_string();
    assert!(msg.starts_with("invalid configuration:\n  - "), "{msg}");
}

#[test]
fn override_values_are_read_as_toml() {
    let c = load_str(
        "",
        "t",
        &[
            "optim.lr=1".into(),
            "optim.betas=[0.8, 0.9]".into(),
            "precision.dtype=fp16".into(),
            "precision.grad_reduce_dtype=\"f32\"".into(),
            "precision.grad_accum_dtype=\"f32\"".into(),
            "zero.reduce_every_micro_step=false".into(),
            "train.metrics_file=out/metrics.jsonl".into(),
        ],
    )
    .unwrap();
    let c = c.config;
    assert_eq!(c.optim.lr, 1.0);
    assert_eq!(c.optim.betas, [0.8, 0.9]);
    assert_eq!(c.precision.dtype, Precision::Fp16);
    assert_eq!(c.precision.reduce_dtype(), DType::F32);
    assert_eq!(c.precision.grad_dtype(), DType::F32);
    assert!(!c.zero.reduce_every_micro_step());
    assert_eq!(c.train.metrics_file.as_deref(), Some("out/metrics.jsonl"));
    let e = load_str("", "t", &["zero.stage=two".into()]).unwrap_err();
    assert!(e.to_string().contains("command line"), "{e}");
}

/// `--model NAME` and `sets`, as `train` passes them: the preset and its five dimensions,
/// except those `sets` gives.
fn with_model(name: &str, sets: &[&str]) -> Vec<String> {
    let mut out = vec![format!("model.preset=\"{name}\"")];
    for (key, value) in preset_dimensions(name).expect("a preset") {
        let key = format!("model.{key}");
        if !sets.iter().any(|s| s.starts_with(&format!("{key}="))) {
            out.push(format!("{key}={value}"));
        }
    }
    out.extend(sets.iter().map(|s| s.to_string()));
    out
}

fn llama_of(name: &str, sets: &[&str]) -> Result<LlamaConfig, LoadError> {
    let c = load_str("", "t", &with_model(name, sets))?;
    match c.config.model_preset() {
        Ok(ModelPreset::Llama(l)) => Ok(l),
        other => panic!("not a Llama: {other:?}"),
    }
}

fn llama_problems(name: &str, sets: &[&str]) -> Vec<String> {
    match llama_of(name, sets) {
        Err(LoadError::Invalid { problems }) => problems,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// `--model llama-tiny --set model.heads=1` was refused naming `n_kv_head`, a key that
/// did not exist; it is a key now, a multi-head preset's Hkv follows the heads, and a
/// grouped preset's Hkv that no longer divides them is named with the key to set.
#[test]
fn a_llama_preset_with_other_heads_takes_or_names_its_key_value_heads() {
    let p = llama_problems("llama-tiny", &["model.heads=1"]);
    has(&p, "preset \"llama-tiny\"'s n_kv_head = 2");
    has(&p, "set model.n_kv_head to a divisor of 1");
    let l = llama_of("llama-tiny", &["model.heads=1", "model.n_kv_head=1"]).unwrap();
    assert_eq!((l.n_head, l.n_kv_head), (1, 1));
    // A grouped preset keeps its Hkv where it divides (Llama 3 has 8 for 32 or 64 heads).
    let l = llama_of("llama-tiny", &["model.heads=8"]).unwrap();
    assert_eq!((l.n_head, l.n_kv_head), (8, 2));
    // A multi-head preset stays multi-head.
    let l = llama_of("llama2-7b", &["model.heads=16"]).unwrap();
    assert_eq!((l.n_head, l.n_kv_head), (16, 16));
    let l = llama_of("llama2-7b", &[]).unwrap();
    assert_eq!((l.n_head, l.n_kv_head), (32, 32));
    // A given Hkv that does not divide H is the model's own error, naming both.
    let p = llama_problems("llama2-70b", &["model.heads=12"]);
    has(&p, "preset \"llama2-70b\"'s n_kv_head = 8 (64 query heads");
    has(&p, "--set model.n_kv_head=4");
    let p = llama_problems("llama-tiny", &["model.n_kv_head=3"]);
    has(&p, "n_kv_head Hkv=3 does not divide n_head H=4");
}

/// `--set model.width=1024` on llama-tiny kept the preset's 40-wide MLP without a word:
/// the presets' MLP widths are the published ones (no formula), so a changed width asks
/// for `model.ffn_hidden`, naming the preset's.
#[test]
fn a_llama_preset_with_another_width_asks_for_its_mlp_width() {
    let p = llama_problems("llama-tiny", &["model.width=1024"]);
    has(&p, "preset \"llama-tiny\"'s width 16");
    has(&p, "ffn_hidden = 40");
    has(&p, "--set model.ffn_hidden=2560");
    let l = llama_of("llama-tiny", &["model.width=1024", "model.ffn_hidden=2816"]).unwrap();
    assert_eq!((l.n_embd, l.ffn_hidden), (1024, 2816));
    // The width of the preset keeps its F.
    let l = llama_of("llama-small", &[]).unwrap();
    assert_eq!((l.n_embd, l.ffn_hidden), (256, 688));
}

/// `--model llama-tiny --set model.width=96 --set model.heads=5` was refused one problem
/// per run (first the key/value heads, then the MLP width, then the heads): all are
/// named at once now, in `[model]` keys, with head counts that would do.
#[test]
fn a_llama_shape_names_all_its_problems_at_once() {
    let p = llama_problems("llama-tiny", &["model.width=96", "model.heads=5"]);
    assert_eq!(p.len(), 3, "{p:?}");
    has(&p, "model.heads = 5 does not divide model.width = 96");
    has(&p, "nearest that do (4 or 6)");
    has(&p, "set model.n_kv_head to a divisor of 5");
    has(&p, "--set model.ffn_hidden=240");
    // An odd head size, with heads whose head size is even.
    let p = llama_problems("llama-tiny", &["model.width=100", "model.ffn_hidden=250"]);
    assert_eq!(p.len(), 1, "{p:?}");
    has(&p, "model.width / model.heads = 100/4 = 25 is odd");
    has(&p, "(2 or 10)");
    has(&p, "a multiple of 8");
    let p = llama_problems("llama-tiny", &["model.width=99", "model.ffn_hidden=248"]);
    has(&p, "model.heads = 4 does not divide model.width = 99");
    has(&p, "give a width that is a multiple of 8");
    // The suggestions are head counts the key/value heads allow: width 6 splits into
    // even heads as 3 or 1, neither of which llama-tiny's 2 key/value heads divide.
    let p = llama_problems("llama-tiny", &["model.width=6", "model.ffn_hidden=16"]);
    has(
        &p,
        "model.heads = 4 does not divide model.width = 6; give a width that is a multiple of 8",
    );
    let p = llama_problems(
        "llama-tiny",
        &["model.width=12", "model.ffn_hidden=30", "model.heads=4"],
    );
    has(&p, "12/4 = 3 is odd");
    has(
        &p,
        "nearest that do (2 or 6), or give a width that is a multiple of 8",
    );
    // Following the advice gives a model.
    let l = llama_of(
        "llama-tiny",
        &["model.width=96", "model.heads=6", "model.ffn_hidden=240"],
    )
    .unwrap();
    assert_eq!(
        (l.n_embd, l.n_head, l.n_kv_head, l.ffn_hidden),
        (96, 6, 2, 240)
    );
    // A width past its bound is the model's own error (no search over its divisors).
    let p = llama_problems(
        "llama-tiny",
        &[
            "model.width=1000000000",
            "model.heads=3",
            "model.n_kv_head=1",
            "model.ffn_hidden=8",
        ],
    );
    has(&p, "n_embd = 1000000000 is past its bound");
}

/// The three Llama keys from a file and the command line, with their provenance, and
/// the rotary base checked.
#[test]
fn llama_keys_are_read_from_the_file_and_the_command_line() {
    let text = "[model]\npreset = \"llama-tiny\"\nn_kv_head = 1\nffn_hidden = 48\n";
    let c = load_str(text, "run.toml", &["model.rope_theta=500000".into()]).unwrap();
    let Ok(ModelPreset::Llama(l)) = c.config.model_preset() else {
        panic!("not a Llama");
    };
    assert_eq!(
        (l.n_kv_head, l.ffn_hidden, l.rope_theta),
        (1, 48, 500_000.0)
    );
    assert_eq!(c.source("model.n_kv_head"), Source::File("run.toml".into()));
    assert_eq!(c.source("model.rope_theta"), Source::CommandLine);
    let r = c.render();
    assert!(r.contains("model.ffn_hidden = 48"), "{r}");
    let p = llama_problems("llama-tiny", &["model.rope_theta=1.0"]);
    has(&p, "rope_theta = 1 must be finite and > 1");
}

/// A Llama's printed configuration shows what its preset and rules gave it: the key/value
/// heads following a multi-head preset's changed heads, the MLP width and RoPE base.
#[test]
fn a_llamas_printed_configuration_shows_its_derived_values() {
    let c = load_str(
        "[model]\npreset = \"llama2-7b\"\n",
        "run.toml",
        &["model.heads=64".into()],
    )
    .unwrap();
    let r = c.render();
    for row in [
        "model.heads = 64",
        "model.n_kv_head = 64",
        "model.ffn_hidden = 11008",
        "model.rope_theta = 10000.0",
        "model.width = 4096",
        "model.vocab_block_rows",
    ] {
        assert!(r.contains(row), "{row} not in {r}");
    }
    assert!(r.contains("preset \"llama2-7b\""), "{r}");
}

/// The Llama keys on a GPT-2 are refused, not ignored.
#[test]
fn llama_keys_on_a_gpt_are_refused() {
    let p = problems("[model]\nn_kv_head = 2\nffn_hidden = 8\n", &[]);
    has(&p, "model.n_kv_head, model.ffn_hidden (Llama only) set");
    has(&p, "model.preset = \"small\" is a GPT-2");
    let sets = with_model("tiny", &["model.rope_theta=1e4"]);
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    has(&problems("", &sets), "unset model.rope_theta");
}

/// A Llama's vocabulary past its bound (2^20) is refused naming the key, the value and
/// the bound: 10^12 aborted allocating 564 GB.
#[test]
fn a_llama_vocabulary_past_its_bound_is_refused() {
    let p = llama_problems("llama-tiny", &["model.vocab_size=1000000000000"]);
    has(
        &p,
        "model: vocab_size = 1000000000000 is past its bound 1048576",
    );
    let l = llama_of("llama3-8b", &["model.vocab_size=1048576"]).unwrap();
    assert_eq!(l.vocab_size, 1 << 20);
}
