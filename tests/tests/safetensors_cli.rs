//! `zero-bench train --init-from` of safetensors, as users run it: the built binary under
//! real mpirun, on files that `ckpt export --safetensors` wrote from a real run (and
//! variants of them written here by hand: the format is an 8-byte length, a JSON header,
//! the data).
//!
//! - Round trip: both name sets (ours; Hugging Face GPT-2's, Conv1D weights transposed),
//!   one file or sharded with an index, `wte` whole or in row blocks, a whole-model state
//!   dict (`transformer.` prefix, tied `lm_head.weight`, attention-mask buffers): the
//!   weights loaded are bit for bit those of `ckpt consolidate`.
//! - f16 and bf16 files load as their values widened to f32, exactly.
//! - Missing, misshaped (with the transposed hint) and unsupported-type tensors are
//!   refused, all of them in one message naming each; an extra tensor is a warning.
//! - Fine-tuning: run B starts from run A's step-k export and its first loss is A's loss
//!   at step k + 1, bit for bit.
//!
//! How a test sees the loaded weights: `--precision fp16 --set precision.initial_scale=1e30`
//! makes every gradient of step 1 overflow f16, so the step is skipped on every rank
//! (the engine's overflow rule) and the fp32 master that `--save-model` writes after it
//! is exactly what `--init-from` loaded.
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench` in the same profile (scripts/test.sh does).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{json, Value};
use zero_tests::cli::{ok, read_lines, repo, s, train};
use zero_tests::safetensors_files::{
    assert_ran, checkpointed_run, read_st, strings, write_st, zb, Raw,
};

/// Ranks of every run here (stage 3 at load: each rank keeps half of every unit).
const RANKS: usize = 2;
/// Run A's steps, and the step whose checkpoint run B starts from.
const STEPS_A: usize = 6;
const K: usize = 3;
/// Tokens of one step: ranks x grad_accum (1) x micro_batch (2) x seq_len (16), as
/// configs/tiny.toml sets them.
const TOKENS_PER_STEP: usize = RANKS * 2 * 16;

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("st-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

// ---------------------------------------------------------------------------------------
// safetensors by hand.

/// Every tensor converted from F32 to a 16-bit type by `to_bits` (its name for safetensors).
fn narrowed(
    tensors: &BTreeMap<String, Raw>,
    dtype: &str,
    to_bits: fn(f32) -> u16,
) -> BTreeMap<String, Raw> {
    tensors
        .iter()
        .map(|(n, t)| {
            let bytes = t
                .f32s()
                .iter()
                .flat_map(|&x| to_bits(x).to_le_bytes())
                .collect();
            let raw = Raw {
                dtype: dtype.into(),
                shape: t.shape.clone(),
                bytes,
            };
            (n.clone(), raw)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Run A, shared by every test (once per test process).

struct RunA {
    dir: PathBuf,
    /// The token file A trained on (nanoGPT format: raw u16).
    corpus: PathBuf,
    /// A's per-step metrics.
    metrics: Vec<Value>,
    /// `ckpt consolidate` of step K: the reference weights.
    consolidated: PathBuf,
    /// `ckpt export --safetensors` of step K, our names and Hugging Face's.
    nanogpt: PathBuf,
    hf: PathBuf,
}

fn run_a() -> &'static RunA {
    static A: OnceLock<RunA> = OnceLock::new();
    A.get_or_init(|| {
        let dir = scratch("run-a");
        let run = checkpointed_run(&dir, "configs/tiny.toml", RANKS, STEPS_A, K);
        let (corpus, ckpt) = (run.corpus, run.ckpt);
        let step = ckpt.join(format!("step-{K}"));
        let a = RunA {
            consolidated: dir.join("consolidated.h5"),
            nanogpt: dir.join("nanogpt.safetensors"),
            hf: dir.join("hf.safetensors"),
            metrics: run.metrics,
            corpus,
            dir,
        };
        assert_ran(&zb(&[
            "ckpt",
            "consolidate",
            &s(&step),
            &s(&a.consolidated),
        ]));
        assert_ran(&zb(&[
            "ckpt",
            "export",
            "--safetensors",
            &s(&step),
            &s(&a.nanogpt),
        ]));
        assert_ran(&zb(&[
            "ckpt",
            "export",
            "--safetensors",
            "--names",
            "hf-gpt2",
            &s(&step),
            &s(&a.hf),
        ]));
        a
    })
}

/// Every dataset of an HDF5 model file as f32 bits.
fn h5_bits(path: &Path) -> BTreeMap<String, Vec<u32>> {
    let f = hdf5::File::open(path).expect("open the model file");
    f.member_names()
        .expect("list")
        .into_iter()
        .map(|n| {
            let v: Vec<f32> = f.dataset(&n).and_then(|d| d.read_raw()).expect("read");
            (n, v.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

/// Train one skipped step from `input` on 2 ranks at stage 3 and return the weights it
/// loaded (written by `--save-model`; see the file head) and the job's text.
fn loaded(input: &Path, dir: &Path, extra: &[&str]) -> (BTreeMap<String, Vec<u32>>, String) {
    let saved = dir.join("saved.h5");
    let _ = std::fs::remove_file(&saved);
    let mut args = strings(&[
        "--config",
        &repo("configs/tiny.toml"),
        "--stage",
        "3",
        "--steps",
        "1",
        "--precision",
        "fp16",
        "--set",
        "precision.initial_scale=1e30",
        "--init-from",
        &s(input),
        "--save-model",
        &s(&saved),
        "--no-progress",
    ]);
    args.extend(strings(extra));
    let out = train(RANKS, &args);
    ok(&out);
    let text = out.all_text();
    assert!(text.contains("step skipped on every rank"), "{text}");
    assert!(text.contains("weights loaded from"), "{text}");
    (h5_bits(&saved), text)
}

/// A refused `--init-from`: exit 1 by itself, one error naming every needle.
fn refused(input: &Path, needles: &[&str]) {
    let out = train(
        RANKS,
        &strings(&[
            "--config",
            &repo("configs/tiny.toml"),
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
fn both_name_sets_load_the_exported_weights_bit_for_bit() {
    let a = run_a();
    let dir = scratch("round-trip");
    let want = h5_bits(&a.consolidated);
    assert_eq!(want.len(), 28);
    let (got, text) = loaded(&a.nanogpt, &dir, &[]);
    assert!(text.contains("safetensors, nanogpt names"), "{text}");
    assert!(got == want, "nanogpt names: the loaded weights differ");
    let (got, text) = loaded(&a.hf, &dir, &[]);
    assert!(text.contains("safetensors, hf-gpt2 names"), "{text}");
    assert!(got == want, "hf-gpt2 names: the loaded weights differ");
    // wte in row blocks of 20 rows (four units): each block read from its rows.
    let (got, text) = loaded(&a.hf, &dir, &["--set", "model.vocab_block_rows=20"]);
    assert!(text.contains("model.vocab_block_rows = 20"), "{text}");
    assert!(got == want, "wte in row blocks: the loaded weights differ");

    // As GPT2LMHeadModel's state dict holds it: a `transformer.` prefix, the tied head,
    // attention-mask buffers (in older `transformers`). Loaded the same, one info line.
    let mut whole: BTreeMap<String, Raw> = read_st(&a.hf)
        .into_iter()
        .map(|(n, t)| (format!("transformer.{n}"), t))
        .collect();
    whole.insert(
        "lm_head.weight".into(),
        whole["transformer.wte.weight"].clone(),
    );
    for i in 0..2 {
        let mask = Raw {
            dtype: "F32".into(),
            shape: vec![1, 1, 16, 16],
            bytes: vec![0; 4 * 256],
        };
        whole.insert(format!("transformer.h.{i}.attn.bias"), mask.clone());
        whole.insert(format!("transformer.h.{i}.attn.masked_bias"), mask);
    }
    let file = dir.join("lm-head-model.safetensors");
    write_st(&file, &whole);
    let (got, text) = loaded(&file, &dir, &[]);
    assert!(
        got == want,
        "a whole-model state dict: the loaded weights differ"
    );
    assert!(
        text.contains("not loading 5 tensor(s) that hold nothing to load"),
        "{text}"
    );
    assert!(text.contains("lm_head.weight"), "{text}");
    assert!(!text.contains("the model does not have"), "{text}");
}

#[test]
fn a_sharded_folder_with_an_index_loads_like_one_file() {
    let a = run_a();
    let dir = scratch("sharded");
    let folder = dir.join("model");
    std::fs::create_dir_all(&folder).unwrap();
    let tensors = read_st(&a.hf);
    let mut shards = [BTreeMap::new(), BTreeMap::new()];
    let mut weight_map = serde_json::Map::new();
    for (i, (name, t)) in tensors.into_iter().enumerate() {
        let k = i % 2;
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
    let (got, text) = loaded(&folder, &dir, &[]);
    assert!(
        text.contains("sharded safetensors, hf-gpt2 names"),
        "{text}"
    );
    assert!(
        got == h5_bits(&a.consolidated),
        "sharded: the loaded weights differ"
    );
}

/// A 16-bit type: its safetensors name, f32 -> its bits (rounded to nearest even), back.
type HalfType = (&'static str, fn(f32) -> u16, fn(u16) -> f32);

#[test]
fn f16_and_bf16_files_load_as_their_values_widened() {
    let a = run_a();
    let dir = scratch("half");
    let tensors = read_st(&a.nanogpt);
    let cases: [HalfType; 2] = [
        (
            "BF16",
            |x| half::bf16::from_f32(x).to_bits(),
            |b| half::bf16::from_bits(b).to_f32(),
        ),
        (
            "F16",
            |x| half::f16::from_f32(x).to_bits(),
            |b| half::f16::from_bits(b).to_f32(),
        ),
    ];
    for (dtype, narrow, widen) in cases {
        let file = dir.join(format!("{dtype}.safetensors"));
        write_st(&file, &narrowed(&tensors, dtype, narrow));
        let (got, _) = loaded(&file, &dir, &[]);
        let mut changed = 0;
        for (name, t) in &tensors {
            let want: Vec<u32> = t
                .f32s()
                .iter()
                .map(|&x| widen(narrow(x)).to_bits())
                .collect();
            assert!(
                got[name] == want,
                "{dtype}: '{name}' is not the rounded f32"
            );
            changed += t.f32s().iter().filter(|&&x| widen(narrow(x)) != x).count();
        }
        // The rounding did something (so the check above could fail).
        assert!(changed > 1000, "{dtype}: only {changed} values changed");
    }
}

#[test]
fn missing_misshaped_and_unsupported_tensors_are_refused_by_name() {
    let a = run_a();
    let dir = scratch("bad");
    let ours = read_st(&a.nanogpt);

    // Three problems in one file, all named in the one error.
    let mut bad = ours.clone();
    bad.remove("ln_f.bias");
    bad.remove("h.0.ln_2.weight");
    bad.get_mut("h.1.mlp.c_fc.weight").unwrap().shape = vec![32, 128];
    let wpe = bad.get_mut("wpe").unwrap();
    let doubles: Vec<u8> = wpe
        .f32s()
        .iter()
        .flat_map(|&x| (x as f64).to_le_bytes())
        .collect();
    *wpe = Raw {
        dtype: "F64".into(),
        shape: wpe.shape.clone(),
        bytes: doubles,
    };
    let file = dir.join("three-problems.safetensors");
    write_st(&file, &bad);
    refused(
        &file,
        &[
            "does not fit the model",
            "lacks 2 of the model's 28 tensors: h.0.ln_2.weight [32], ln_f.bias [32]",
            "tensor 'h.1.mlp.c_fc.weight' has shape [32, 128], the model expects [128, 32]: looks transposed",
            "tensor 'wpe' is F64",
        ],
    );

    // Hugging Face names, one block weight left [out, in].
    let mut hf = read_st(&a.hf);
    hf.get_mut("h.0.mlp.c_proj.weight").unwrap().shape = vec![32, 128];
    let file = dir.join("hf-not-transposed.safetensors");
    write_st(&file, &hf);
    refused(
        &file,
        &[
            "hf-gpt2 names",
            "tensor 'h.0.mlp.c_proj.weight' has shape [32, 128], the model expects [128, 32]: looks transposed",
            "Conv1D's [in, out]",
        ],
    );

    // A type we do not read, alone.
    let mut ints = ours.clone();
    ints.get_mut("ln_f.weight").unwrap().dtype = "I32".into();
    let file = dir.join("int.safetensors");
    write_st(&file, &ints);
    refused(&file, &["tensor 'ln_f.weight' is I32"]);

    // An extra tensor: a warning naming it, and the run goes on.
    let mut extra = ours;
    extra.insert(
        "h.0.attn.rotary.inv_freq".into(),
        Raw {
            dtype: "F32".into(),
            shape: vec![2],
            bytes: vec![0; 8],
        },
    );
    let file = dir.join("extra.safetensors");
    write_st(&file, &extra);
    let (got, text) = loaded(&file, &dir, &[]);
    assert!(
        text.contains("ignoring 1 tensor(s) the model does not have: h.0.attn.rotary.inv_freq"),
        "{text}"
    );
    assert!(got == h5_bits(&a.consolidated));
}

/// Fine-tuning from an export continues with the same loss. Run A trained STEPS_A steps
/// and saved a checkpoint after step K; run B starts from its hf-gpt2 export with a fresh
/// optimizer. B's step 1 runs forward on the same weights as A's step K + 1 (the loss is
/// computed before the update), so on the same batch the two losses are equal bit for bit
/// (same ranks, same stage, no reordering). The batch: `data.order = "sequential"` reads
/// step s at token s x TOKENS_PER_STEP and there is no start-step option, so B reads a
/// copy of A's token file without its first K x TOKENS_PER_STEP tokens.
#[test]
fn fine_tuning_from_an_export_continues_with_the_same_loss() {
    let a = run_a();
    let dir = scratch("fine-tune");
    let shifted = dir.join("corpus-from-step-k.bin");
    let tokens = std::fs::read(&a.corpus).unwrap();
    std::fs::write(&shifted, &tokens[2 * K * TOKENS_PER_STEP..]).unwrap();
    let metrics = dir.join("b.jsonl");
    let out = train(
        RANKS,
        &strings(&[
            "--config",
            &repo("configs/tiny.toml"),
            "--set",
            &format!("data.path={:?}", s(&shifted)),
            "--stage",
            "2",
            "--steps",
            "3",
            "--init-from",
            &s(&a.hf),
            "--metrics",
            &s(&metrics),
            "--no-progress",
        ]),
    );
    ok(&out);
    let b = read_lines(&metrics);
    let loss = |m: &Value| m["loss"].as_f64().expect("loss");
    let a_next = loss(&a.metrics[K]);
    let b_first = loss(&b[0]);
    eprintln!(
        "fine-tune: A's losses {:?}; B (from A's step {K}) {:?}; A step {} = {a_next:?}, B step 1 = {b_first:?}",
        a.metrics.iter().map(loss).collect::<Vec<_>>(),
        b.iter().map(loss).collect::<Vec<_>>(),
        K + 1
    );
    assert_eq!(a.metrics[K]["step"], json!(K + 1));
    assert_eq!(
        a_next.to_bits(),
        b_first.to_bits(),
        "B's first loss {b_first} is not A's step {} loss {a_next} ({})",
        K + 1,
        a.dir.display()
    );
}
