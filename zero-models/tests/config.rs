//! Presets and specs: parameter counts against the published GPT-2 sizes, names and
//! shapes as docs/ARCHITECTURE.md lists them, and the 1.5B spec built without allocating weights.

use zero_models::{activation_bytes_for, preset_names, GptConfig, GptConfigError, ModelPreset};

#[test]
fn presets_have_the_published_parameter_counts() {
    // GPT-2 with V=50257, T=1024, wte tied: the counts nanoGPT prints for the HF models.
    for (name, want) in [
        ("gpt2-124m", 124_439_808usize),
        ("gpt2-350m", 354_823_168),
        ("gpt2-774m", 774_030_080),
        ("gpt2-1.5b", 1_557_611_200),
    ] {
        let cfg = GptConfig::preset(name).expect("preset");
        assert_eq!(cfg.num_params(), want, "{name}");
        let spec = cfg.spec();
        assert_eq!(spec.numel(), want, "{name}");
        spec.validate().expect("spec is well formed");
    }
    for name in preset_names() {
        let cfg = ModelPreset::lookup(name).expect("listed preset");
        cfg.validate().expect("preset is valid");
        assert_eq!(cfg.spec().numel(), cfg.num_params());
    }
}

#[test]
fn names_shapes_units_and_layers_follow_design() {
    let cfg = GptConfig::preset("small").expect("preset");
    let (v, t, c) = (cfg.vocab_size, cfg.max_seq_len, cfg.n_embd);
    let spec = cfg.spec();
    let shape = |n: &str| {
        let (u, i) = spec.find(n).unwrap_or_else(|| panic!("{n} missing"));
        spec.units[u].params[i].shape.clone()
    };
    assert_eq!(shape("wte"), vec![v, c]);
    assert_eq!(shape("wpe"), vec![t, c]);
    assert_eq!(shape("h.3.attn.c_attn.weight"), vec![3 * c, c]);
    assert_eq!(shape("h.3.attn.c_proj.weight"), vec![c, c]);
    assert_eq!(shape("h.0.mlp.c_fc.weight"), vec![4 * c, c]);
    assert_eq!(shape("h.0.mlp.c_fc.bias"), vec![4 * c]);
    assert_eq!(shape("h.0.mlp.c_proj.weight"), vec![c, 4 * c]);
    assert_eq!(shape("ln_f.bias"), vec![c]);
    let names: Vec<&str> = spec.units.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["embed", "h.0", "h.1", "h.2", "h.3", "ln_f"]);
    let layers: Vec<(&str, Vec<usize>)> = spec
        .layers
        .iter()
        .map(|l| (l.name.as_str(), l.units.clone()))
        .collect();
    assert_eq!(layers[0], ("embed", vec![0]));
    assert_eq!(layers[2], ("h.1", vec![2]));
    assert_eq!(
        layers[5],
        ("head", vec![5, 0]),
        "the head uses ln_f and the tied wte"
    );
    // Weight decay by identity: 2-D weights and embeddings yes, biases and LN no.
    let wd = |n: &str| {
        let (u, i) = spec.find(n).expect("exists");
        spec.units[u].params[i].weight_decay
    };
    assert!(wd("wte") && wd("h.0.attn.c_attn.weight"));
    assert!(!wd("h.0.attn.c_attn.bias") && !wd("h.0.ln_1.weight") && !wd("ln_f.weight"));
}

/// GPT-2 124M's table (50257 x 768) in blocks of 12C + 13 = 9229 rows: six units, each
/// no wider than a transformer block, looked up before `embed` and read by the head
/// after `head`; their row blocks tile `wte` and the layout joins them back.
#[test]
fn a_large_table_is_split_into_row_blocks_no_wider_than_a_block() {
    let cfg = GptConfig::preset("gpt2-124m").expect("preset");
    let (v, c, l) = (cfg.vocab_size, cfg.n_embd, cfg.n_layer);
    assert_eq!(cfg.block_rows(), 12 * c + 13);
    let blocks = cfg.vocab_blocks();
    assert_eq!(blocks.len(), 6);
    assert_eq!(blocks[5], 5 * 9229..v);
    let spec = cfg.spec();
    spec.validate().expect("valid spec");
    assert_eq!(spec.numel(), cfg.num_params());
    let names: Vec<&str> = spec.units.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(
        &names[..3],
        ["embed", "wte[9229..18458]", "wte[18458..27687]"]
    );
    assert_eq!(spec.units[0].params[0].name, "wte[0..9229]");
    let block_numel = spec.units[6].numel();
    assert!(spec.units[..6]
        .iter()
        .all(|u| u.numel() <= block_numel + cfg.max_seq_len * c));
    let layers: Vec<(&str, Vec<usize>)> = spec
        .layers
        .iter()
        .map(|l| (l.name.as_str(), l.units.clone()))
        .collect();
    assert_eq!(layers[0], ("embed.1", vec![1]));
    assert_eq!(layers[5], ("embed", vec![0]));
    assert_eq!(layers[6], ("h.0", vec![6]));
    assert_eq!(layers[6 + l], ("head", vec![6 + l, 0]));
    assert_eq!(layers[6 + l + 5], ("head.5", vec![5]));
    assert!(
        spec.units[3].params[0].weight_decay,
        "a block of wte decays"
    );
    let layout = zero_core::PartitionLayout::new(&spec, 4, 32).expect("layout");
    let tensors = layout.tensors();
    let wte = tensors
        .iter()
        .find(|t| t.name == "wte")
        .expect("wte joined");
    assert_eq!(wte.shape, vec![v, c]);
    assert_eq!(wte.parts.len(), 6);
    assert!(tensors.iter().all(|t| !t.name.contains('[')));
    assert_eq!(tensors.len(), 2 + 12 * l + 2);
}

#[test]
fn big_specs_and_activation_sizes_need_no_allocation() {
    let cfg = GptConfig::preset("gpt2-1.5b").expect("preset");
    // 16 TB of f32 activations would fail to allocate; computing the number must not.
    let bytes = activation_bytes_for(&cfg, 1024, 1024, 4);
    assert!(bytes > 1 << 40);
    assert!(cfg.flops_per_token(1024) > 6.0 * 1.5e9);
    // Sizes whose exact count would wrap come back as 2^62 bytes (which any memory
    // budget refuses), and a model of them is an error, not a wrapped allocation.
    assert_eq!(activation_bytes_for(&cfg, usize::MAX / 3, 1024, 4), 1 << 62);
    let dev = zero_kernels::device::HostDevice::new();
    let too_many = zero_models::Gpt::<_, f32>::new(&dev, cfg, usize::MAX / 3);
    assert!(
        matches!(
            too_many.as_ref().err(),
            Some(zero_models::GptError::Config(
                GptConfigError::ActivationsTooLarge { .. }
            ))
        ),
        "{:?}",
        too_many.err()
    );
}

#[test]
fn bad_configs_are_errors_with_the_numbers() {
    let err = GptConfig::preset("gpt5").expect_err("unknown");
    assert!(err.to_string().contains("gpt5") && err.to_string().contains("gpt2-124m"));
    let mut cfg = GptConfig::preset("tiny").expect("preset");
    cfg.n_head = 3;
    let err = cfg.validate().expect_err("16 % 3 != 0");
    assert!(
        matches!(err, GptConfigError::HeadsDontDivide { c: 16, h: 3 }),
        "{err}"
    );
    cfg.n_head = 0;
    assert!(cfg.validate().is_err());
    // Dimensions past their bounds are refused before a spec of a billion layers is built
    // or a size overflows, naming the dimension.
    let mut cfg = GptConfig::preset("tiny").expect("preset");
    cfg.n_layer = 1_000_000_000;
    let err = cfg.validate().expect_err("a billion layers");
    assert!(
        matches!(
            err,
            GptConfigError::TooLarge {
                name: "n_layer",
                ..
            }
        ),
        "{err}"
    );
    let mut cfg = GptConfig::preset("tiny").expect("preset");
    cfg.n_embd = usize::MAX / 2;
    cfg.n_head = 1;
    assert!(matches!(
        cfg.validate(),
        Err(GptConfigError::TooLarge { name: "n_embd", .. })
    ));
    GptConfig::preset("gpt2-1.5b")
        .expect("preset")
        .validate()
        .expect("the largest preset is inside the bounds");
}
