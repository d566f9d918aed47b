//! Llama weights in Hugging Face's layout, as users move them: `ckpt export --safetensors
//! --names hf-llama` of a real `configs/llama-tiny.toml` run, and `train --init-from` of
//! that file (or of variants written here by hand: an 8-byte length, a JSON header, the
//! data), the built binary under real mpirun on 2 ranks.
//!
//! - The export holds exactly `LlamaForCausalLM`'s names and [out, in] shapes.
//! - Fine-tuning: run B starts from run A's step-k export (one file, or sharded with an
//!   index) and its first loss is A's loss at step k + 1, bit for bit.
//! - Against an independent reference: tests/python/hf_llama_ref.py, a numpy float64
//!   forward of HF's Llama written from `transformers`' conventions (rotate_half,
//!   repeat_kv, SwiGLU, RMSNorm), reads the same file and computes the mean cross-entropy
//!   of the same tokens; ours agrees to 1e-5 relative, and the two conventions a layout
//!   mistake would amount to (Meta's interleaved rotary pairs, round-robin key/value
//!   heads) disagree by over ten times that, so the check can fail. The same for a file without
//!   `lm_head.weight` (tied embeddings).
//! - Missing, extra and misshaped tensors are refused by name, each alone and all in one
//!   message; rotary `inv_freq` buffers are not extra; so is a `config.json` that says
//!   the head is untied or gives other head counts (no Python needed).
//! - Without numpy the reference check fails unless `ZERO_TESTS_SKIP=numpy` is set.
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench` in the same profile (scripts/test.sh does).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};
use zero_tests::cli::{ok, read_lines, repo, s, train};
use zero_tests::safetensors_files::{
    assert_ran, checkpointed_run, read_st, strings, text_of, write_st, zb, Raw,
};

/// Ranks of every run here.
const RANKS: usize = 2;
/// Run A's steps, and the step whose checkpoint run B starts from.
const STEPS_A: usize = 6;
const K: usize = 3;
/// Rows per micro-batch (B) and tokens per row (T), as configs/llama-tiny.toml sets them.
const ROWS: usize = 2;
const SEQ: usize = 16;
/// Tokens of one step: ranks x grad_accum (1) x B x T.
const TOKENS_PER_STEP: usize = RANKS * ROWS * SEQ;

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("llama-st-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

// ---------------------------------------------------------------------------------------
// safetensors by hand.

/// `t` with every value times `k`.
fn scaled(t: &Raw, k: f32) -> Raw {
    Raw {
        bytes: t
            .f32s()
            .iter()
            .flat_map(|&x| (x * k).to_le_bytes())
            .collect(),
        ..t.clone()
    }
}

// ---------------------------------------------------------------------------------------
// Run A, shared by every test (once per test process).

struct RunA {
    dir: PathBuf,
    /// The token file A trained on (nanoGPT format: raw u16).
    corpus: PathBuf,
    /// A's per-step metrics.
    metrics: Vec<Value>,
    /// `ckpt export --safetensors --names hf-llama` of step K.
    hf: PathBuf,
}

fn run_a() -> &'static RunA {
    static A: OnceLock<RunA> = OnceLock::new();
    A.get_or_init(|| {
        let dir = scratch("run-a");
        let run = checkpointed_run(&dir, "configs/llama-tiny.toml", RANKS, STEPS_A, K);
        let (corpus, ckpt) = (run.corpus, run.ckpt);
        let step = ckpt.join(format!("step-{K}"));
        let a = RunA {
            hf: dir.join("hf.safetensors"),
            metrics: run.metrics,
            corpus,
            dir,
        };
        let out = zb(&[
            "ckpt",
            "export",
            "--safetensors",
            "--names",
            "hf-llama",
            &s(&step),
            &s(&a.hf),
        ]);
        assert_ran(&out);
        assert!(
            text_of(&out).contains("hf-llama names"),
            "{}",
            text_of(&out)
        );
        a
    })
}

/// Train `steps` steps of llama-tiny from `input` on `corpus` and return the per-step
/// metrics and the job's text.
fn run_b(
    input: &Path,
    corpus: &Path,
    dir: &Path,
    steps: usize,
    stage: &str,
) -> (Vec<Value>, String) {
    let metrics = dir.join("b.jsonl");
    let _ = std::fs::remove_file(&metrics);
    let out = train(
        RANKS,
        &strings(&[
            "--config",
            &repo("configs/llama-tiny.toml"),
            "--set",
            &format!("data.path={:?}", s(corpus)),
            "--stage",
            stage,
            "--steps",
            &steps.to_string(),
            "--init-from",
            &s(input),
            "--metrics",
            &s(&metrics),
            "--no-progress",
        ]),
    );
    ok(&out);
    let text = out.all_text();
    assert!(text.contains("weights loaded from"), "{text}");
    (read_lines(&metrics), text)
}

fn loss(m: &Value) -> f64 {
    m["loss"].as_f64().expect("loss")
}

/// A copy of A's token file without the tokens of its first K steps: run B's step 1
/// then reads A's step K + 1 batch (`data.order = "sequential"` reads step s at token
/// s x TOKENS_PER_STEP; zero-models/src/data/order.rs).
fn shifted_corpus(a: &RunA, dir: &Path) -> PathBuf {
    let shifted = dir.join("corpus-from-step-k.bin");
    let tokens = std::fs::read(&a.corpus).unwrap();
    std::fs::write(&shifted, &tokens[2 * K * TOKENS_PER_STEP..]).unwrap();
    shifted
}

/// A refused `--init-from`: exit 1 by itself, one error naming every needle.
fn refused(input: &Path, needles: &[&str]) {
    let out = train(
        RANKS,
        &strings(&[
            "--config",
            &repo("configs/llama-tiny.toml"),
            "--steps",
            "1",
            "--init-from",
            &s(input),
        ]),
    );
    out.assert_failed_by_itself();
    assert_eq!(out.code, Some(1), "{}", out.transcript());
    let text = out.all_text();
    for n in needles {
        assert!(text.contains(n), "no {n:?} in\n{text}");
    }
    assert_eq!(text.matches("error:").count(), 1, "{text}");
    assert!(!text.contains("panicked"), "{text}");
}

// ---------------------------------------------------------------------------------------

#[test]
fn the_export_holds_llama_for_causal_lm_names_and_shapes() {
    let a = run_a();
    let got: BTreeMap<String, Vec<usize>> = read_st(&a.hf)
        .into_iter()
        .map(|(n, t)| {
            assert_eq!(t.dtype, "F32", "{n}");
            (n, t.shape)
        })
        .collect();
    // llama-tiny: V=64 L=2 H=4 Hkv=2 C=16 F=40, head size 4, Ckv = 8.
    let mut want = BTreeMap::new();
    want.insert("model.embed_tokens.weight".to_string(), vec![64, 16]);
    want.insert("model.norm.weight".to_string(), vec![16]);
    want.insert("lm_head.weight".to_string(), vec![64, 16]);
    for i in 0..2 {
        for (m, shape) in [
            ("input_layernorm.weight", vec![16]),
            ("self_attn.q_proj.weight", vec![16, 16]),
            ("self_attn.k_proj.weight", vec![8, 16]),
            ("self_attn.v_proj.weight", vec![8, 16]),
            ("self_attn.o_proj.weight", vec![16, 16]),
            ("post_attention_layernorm.weight", vec![16]),
            ("mlp.gate_proj.weight", vec![40, 16]),
            ("mlp.up_proj.weight", vec![40, 16]),
            ("mlp.down_proj.weight", vec![16, 40]),
        ] {
            want.insert(format!("model.layers.{i}.{m}"), shape);
        }
    }
    assert_eq!(got, want);

    // `--names hf` is the same file for a Llama; GPT-2's names are refused.
    let step = a.dir.join("ckpt").join(format!("step-{K}"));
    let hf = a.dir.join("hf-auto.safetensors");
    assert_ran(&zb(&[
        "ckpt",
        "export",
        "--safetensors",
        "--names",
        "hf",
        &s(&step),
        &s(&hf),
    ]));
    let tensors = |p: &Path| -> BTreeMap<String, (Vec<usize>, Vec<u8>)> {
        read_st(p)
            .into_iter()
            .map(|(n, t)| (n, (t.shape, t.bytes)))
            .collect()
    };
    assert!(
        tensors(&hf) == tensors(&a.hf),
        "--names hf wrote another file"
    );
    let out = zb(&[
        "ckpt",
        "export",
        "--safetensors",
        "--names",
        "hf-gpt2",
        &s(&step),
        &s(&a.dir.join("gpt2.safetensors")),
    ]);
    assert!(!out.status.success());
    let text = text_of(&out);
    assert!(
        text.contains("--names hf-gpt2 names GPT-2 tensors, and this checkpoint is a Llama"),
        "{text}"
    );
}

/// Fine-tuning from an export continues with the same loss. B's step 1 runs forward on
/// the same weights as A's step K + 1 (the loss is computed before the update), on the
/// same batch, with the same ranks and stage: the two losses are equal bit for bit.
#[test]
fn fine_tuning_from_a_hf_llama_export_continues_with_the_same_loss() {
    let a = run_a();
    let dir = scratch("fine-tune");
    let shifted = shifted_corpus(a, &dir);
    let (b, text) = run_b(&a.hf, &shifted, &dir, 3, "2");
    assert!(text.contains("safetensors, hf-llama names"), "{text}");
    let a_next = loss(&a.metrics[K]);
    eprintln!(
        "fine-tune: A's losses {:?}; B (from A's step {K}) {:?}",
        a.metrics.iter().map(loss).collect::<Vec<_>>(),
        b.iter().map(loss).collect::<Vec<_>>(),
    );
    assert_eq!(a.metrics[K]["step"], json!(K + 1));
    assert_eq!(
        a_next.to_bits(),
        loss(&b[0]).to_bits(),
        "B's first loss {} is not A's step {} loss {a_next}",
        loss(&b[0]),
        K + 1
    );
}

#[test]
fn a_sharded_llama_folder_with_an_index_continues_the_same() {
    let a = run_a();
    let dir = scratch("sharded");
    let folder = dir.join("model");
    std::fs::create_dir_all(&folder).unwrap();
    let mut shards = [BTreeMap::new(), BTreeMap::new()];
    let mut weight_map = serde_json::Map::new();
    // As HF shards: the first layers in one file, the rest (and the head) in the other;
    // plus the rotary buffers older `transformers` saved, which hold nothing to load.
    let mut tensors = read_st(&a.hf);
    for i in 0..2 {
        tensors.insert(
            format!("model.layers.{i}.self_attn.rotary_emb.inv_freq"),
            Raw {
                dtype: "F32".into(),
                shape: vec![2],
                bytes: vec![0; 8],
            },
        );
    }
    for (name, t) in tensors {
        let k = usize::from(
            !name.starts_with("model.layers.0.") && name != "model.embed_tokens.weight",
        );
        let file = format!("model-0000{}-of-00002.safetensors", k + 1);
        weight_map.insert(name.clone(), Value::String(file));
        shards[k].insert(name, t);
    }
    for (k, shard) in shards.iter().enumerate() {
        write_st(
            &folder.join(format!("model-0000{}-of-00002.safetensors", k + 1)),
            shard,
        );
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(
        folder.join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let shifted = shifted_corpus(a, &dir);
    // Stage 3: each rank reads only its half of every unit from the shards.
    let (b, text) = run_b(&folder, &shifted, &dir, 1, "3");
    assert!(
        text.contains("sharded safetensors, hf-llama names"),
        "{text}"
    );
    assert!(
        text.contains("not loading 2 tensor(s) that hold nothing to load: rotary inv_freq"),
        "{text}"
    );
    assert_eq!(
        loss(&a.metrics[K]).to_bits(),
        loss(&b[0]).to_bits(),
        "sharded: B's first loss differs from A's step {}",
        K + 1
    );
}

/// The first N x B rows of `corpus` (raw u16) as run B's step 1 reads them (row j from
/// token j T: zero-models/src/data/order.rs), with llama-tiny's shape, for the reference.
fn batch_json(corpus: &Path, path: &Path) {
    let bytes = std::fs::read(corpus).unwrap();
    let tok = |i: usize| u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u64;
    let rows = RANKS * ROWS;
    let inputs: Vec<Vec<u64>> = (0..rows)
        .map(|j| (0..SEQ).map(|i| tok(j * SEQ + i)).collect())
        .collect();
    let targets: Vec<Vec<u64>> = (0..rows)
        .map(|j| (0..SEQ).map(|i| tok(j * SEQ + i + 1)).collect())
        .collect();
    let batch = json!({
        "inputs": inputs, "targets": targets,
        "n_head": 4, "n_kv_head": 2, "rope_theta": 10000.0, "norm_eps": 1e-5,
    });
    std::fs::write(path, batch.to_string()).unwrap();
}

/// The reference's losses of `model` on `batch`.
fn reference(model: &Path, batch: &Path) -> Value {
    let out = Command::new("python3")
        .args([&repo("tests/python/hf_llama_ref.py"), &s(model), &s(batch)])
        .output()
        .expect("python3 starts");
    assert!(
        out.status.success(),
        "the reference failed:\n{}",
        text_of(&out)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}

/// True when python3 cannot import numpy, and `ZERO_TESTS_SKIP=numpy` allows the
/// reference check to be skipped; without it a missing numpy fails the test
/// (scripts/setup.sh --python installs it, and scripts/test.sh runs that).
fn numpy_missing() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        zero_tests::skip_or_fail(
            "numpy",
            "python3 with numpy is not available (scripts/setup.sh --python installs it), \
             so the HF Llama reference check cannot run",
        );
    }
    !ok
}

/// Tolerance of ours (fp32) against the float64 reference: fp32 rounds each op to
/// 6e-8 relative; a forward of two blocks is a few dozen ops deep, each a sum of at
/// most C=16 or F=40 products (or V=64 exponentials), so its errors add to some 1e-6
/// of the loss at worst, and the mean over 64 tokens averages them down. 1e-5 leaves
/// that a factor of ten (measured: 2e-9), while the wrong conventions miss by more than
/// ten times the tolerance (asserted; measured: 7e-4 for the interleaved rotary layout,
/// 4e-3 for round-robin key/value heads).
const REL_TOL: f64 = 1e-5;

/// Ours against the reference on `model`: our first loss of a run from it, on `corpus`.
fn check_against_reference(model: &Path, corpus: &Path, dir: &Path, tied: bool) {
    let batch = dir.join("batch.json");
    batch_json(corpus, &batch);
    let r = reference(model, &batch);
    let (b, text) = run_b(model, corpus, dir, 1, "3");
    assert_eq!(
        text.contains("a model with tied embeddings"),
        tied,
        "{text}"
    );
    let ours = loss(&b[0]);
    let rel = |x: f64| ((ours - x) / x).abs();
    let (hf, inter, tiled) = (
        r["hf"].as_f64().unwrap(),
        r["interleaved_rope"].as_f64().unwrap(),
        r["tiled_kv"].as_f64().unwrap(),
    );
    eprintln!(
        "{}: ours {ours:.9}; reference: hf {hf:.9} (rel {:.2e}), interleaved rope {inter:.9} \
         (rel {:.2e}), tiled kv {tiled:.9} (rel {:.2e})",
        model.display(),
        rel(hf),
        rel(inter),
        rel(tiled)
    );
    assert!(
        rel(hf) <= REL_TOL,
        "ours {ours} vs HF reference {hf}: relative {:.3e} > {REL_TOL:e}",
        rel(hf)
    );
    // The layouts are told apart on the untied file (asserted there once; the tied one's
    // logits differ, and so do its margins).
    let wrong: &[(&str, f64)] = if tied {
        &[]
    } else {
        &[("interleaved rope", inter), ("tiled kv heads", tiled)]
    };
    for &(what, x) in wrong {
        assert!(
            rel(x) >= 10.0 * REL_TOL,
            "the reference under {what} ({x}) is as close to ours ({ours}) as HF's: the check \
             cannot tell the layouts apart"
        );
    }
}

/// Our Llama computes what HF's Llama computes with the exported weights. The trained
/// q/k weights are small (attention near uniform, where the rotary layout barely shows),
/// so q_proj and k_proj are scaled by 10 each (scores x100) in the file that both read.
#[test]
fn our_loss_is_hf_llamas_loss_on_the_exported_weights() {
    if numpy_missing() {
        return;
    }
    let a = run_a();
    let dir = scratch("reference");
    let mut tensors = read_st(&a.hf);
    for (name, t) in tensors.iter_mut() {
        if name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight") {
            *t = scaled(t, 10.0);
        }
    }
    let sharp = dir.join("sharp.safetensors");
    write_st(&sharp, &tensors);
    check_against_reference(&sharp, &a.corpus, &dir, false);

    // Tied embeddings: no lm_head.weight; HF's head is the embedding, ours a copy of it.
    let tied_dir = dir.join("tied");
    std::fs::create_dir_all(&tied_dir).unwrap();
    tensors.remove("lm_head.weight");
    let tied = tied_dir.join("model.safetensors");
    write_st(&tied, &tensors);
    check_against_reference(&tied, &a.corpus, &dir, true);
}

/// A `config.json` beside the file is read: one that says the embeddings are not tied
/// makes a file without `lm_head.weight` lack the head, and one that gives other head
/// counts (the same shapes, another function) is refused, each by name. (No Python: the
/// file is run A's export without its head.)
#[test]
fn a_config_json_that_does_not_describe_the_model_is_refused() {
    let a = run_a();
    let dir = scratch("config-json");
    let mut tensors = read_st(&a.hf);
    assert!(
        tensors.remove("lm_head.weight").is_some(),
        "the export has a head"
    );
    write_st(&dir.join("model.safetensors"), &tensors);

    // The config says the embeddings are not tied: then the head is missing.
    let mut config = json!({
        "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 16,
        "intermediate_size": 40, "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "vocab_size": 64, "tie_word_embeddings": false
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    refused(
        &dir,
        &[
            "lacks 1 of the model's 21 tensors: lm_head.weight [64, 16] (config.json: \
             tie_word_embeddings = false)",
        ],
    );

    // Twice the heads of half the size: the same shapes, another function. The config
    // beside the file says so (and so would a rotary base or epsilon of its own).
    config["num_attention_heads"] = json!(8);
    config["num_key_value_heads"] = json!(4);
    config["tie_word_embeddings"] = json!(true);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    refused(
        &dir,
        &[
            "config.json does not describe the model",
            "num_attention_heads = 8, the model has n_head = 4",
            "num_key_value_heads = 4, the model has n_kv_head = 2",
        ],
    );
}

#[test]
fn missing_extra_and_misshaped_llama_tensors_are_refused_by_name() {
    let a = run_a();
    let dir = scratch("bad");
    let hf = read_st(&a.hf);
    let up = "model.layers.1.mlp.up_proj.weight";
    let k_proj = "model.layers.0.self_attn.k_proj.weight";
    let bias = "model.layers.0.self_attn.q_proj.bias";
    let missing = format!("lacks 1 of the model's 21 tensors: {up} [40, 16]");
    let extra = format!("has 1 tensor(s) the model does not have: {bias}");
    let misshaped =
        format!("tensor '{k_proj}' has shape [16, 8], the model expects [8, 16]: looks transposed");
    let bias_raw = Raw {
        dtype: "F32".into(),
        shape: vec![16],
        bytes: vec![0; 64],
    };

    let mut m = hf.clone();
    m.remove(up);
    let file = dir.join("missing.safetensors");
    write_st(&file, &m);
    refused(
        &file,
        &["hf-llama names", "does not fit the model (Llama)", &missing],
    );

    let mut e = hf.clone();
    e.insert(bias.into(), bias_raw.clone());
    let file = dir.join("extra.safetensors");
    write_st(&file, &e);
    refused(&file, &[&extra, "another architecture"]);

    let mut w = hf.clone();
    w.get_mut(k_proj).unwrap().shape = vec![16, 8];
    let file = dir.join("misshaped.safetensors");
    write_st(&file, &w);
    refused(
        &file,
        &[&misshaped, "Llama's linear weights are stored [out, in]"],
    );

    // All three at once: one error listing each.
    let mut all = w;
    all.remove(up);
    all.insert(bias.into(), bias_raw);
    let file = dir.join("three.safetensors");
    write_st(&file, &all);
    refused(&file, &[&missing, &extra, &misshaped]);
}
