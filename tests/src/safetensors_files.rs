//! What the safetensors tests share (`tests/tests/safetensors_cli.rs` for GPT-2,
//! `tests/tests/llama_safetensors_cli.rs` for Llama): safetensors files read and written
//! by hand (8-byte little-endian header length, a JSON header, raw data), so the tests do
//! not trust our own reader; `zero-bench` as a plain process; and run A, the training run
//! whose checkpoints the tests export and start from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::cli::{ok, read_lines, repo, s, train};
use crate::zero_bench_bin;

/// One tensor: dtype as safetensors spells it, shape, little-endian bytes.
#[derive(Clone, Debug)]
pub struct Raw {
    /// "F32", "BF16", ...
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// The data.
    pub bytes: Vec<u8>,
}

impl Raw {
    /// The values of an F32 tensor.
    pub fn f32s(&self) -> Vec<f32> {
        assert_eq!(self.dtype, "F32");
        self.bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

/// Every tensor of the file at `path` (panics on a malformed file: a test failure).
pub fn read_st(path: &Path) -> BTreeMap<String, Raw> {
    let bytes = std::fs::read(path).expect("read the safetensors file");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8-byte header length")) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).expect("JSON header");
    let data = &bytes[8 + n..];
    let mut out = BTreeMap::new();
    for (name, t) in header.as_object().expect("header object") {
        if name == "__metadata__" {
            continue;
        }
        let offsets: Vec<usize> =
            serde_json::from_value(t["data_offsets"].clone()).expect("data_offsets");
        out.insert(
            name.clone(),
            Raw {
                dtype: t["dtype"].as_str().expect("dtype").to_string(),
                shape: serde_json::from_value(t["shape"].clone()).expect("shape"),
                bytes: data[offsets[0]..offsets[1]].to_vec(),
            },
        );
    }
    out
}

/// Write `tensors` as a safetensors file at `path`, in name order.
pub fn write_st(path: &Path, tensors: &BTreeMap<String, Raw>) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, t) in tensors {
        let end = data.len() + t.bytes.len();
        header.insert(
            name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [data.len(), end]}),
        );
        data.extend_from_slice(&t.bytes);
    }
    let h = Value::Object(header).to_string();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(&data);
    std::fs::write(path, out).expect("write a safetensors file");
}

/// `zero-bench args...` as a plain process.
pub fn zb(args: &[&str]) -> Output {
    Command::new(zero_bench_bin())
        .args(args)
        .output()
        .expect("zero-bench starts")
}

/// stdout and stderr of `out`.
pub fn text_of(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Assert `out` exited 0, showing what it printed otherwise.
pub fn assert_ran(out: &Output) {
    assert!(out.status.success(), "{}", text_of(out));
}

/// Owned arguments.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// Run A's files: its corpus, checkpoint directory and per-step metrics.
pub struct CheckpointedRun {
    /// The token file it trained on (nanoGPT format: raw u16; 20000 tokens).
    pub corpus: PathBuf,
    /// Its checkpoints, `step-{every}`, `step-{2 every}`, ... (5 kept).
    pub ckpt: PathBuf,
    /// Its per-step metrics.
    pub metrics: Vec<Value>,
}

/// In `dir`: make a 20000-token corpus, then train `config` (a file under configs/) on it
/// for `steps` steps at stage 2 on `ranks` mpirun ranks, saving every `every` steps.
pub fn checkpointed_run(
    dir: &Path,
    config: &str,
    ranks: usize,
    steps: usize,
    every: usize,
) -> CheckpointedRun {
    let corpus = dir.join("corpus.bin");
    assert_ran(&zb(&[
        "data",
        "corpus",
        "--format",
        "nanogpt",
        "--tokens",
        "20000",
        &s(&corpus),
    ]));
    let (ckpt, metrics) = (dir.join("ckpt"), dir.join("a.jsonl"));
    let out = train(
        ranks,
        &strings(&[
            "--config",
            &repo(config),
            "--set",
            &format!("data.path={:?}", s(&corpus)),
            "--stage",
            "2",
            "--steps",
            &steps.to_string(),
            "--ckpt-dir",
            &s(&ckpt),
            "--save-every",
            &every.to_string(),
            "--keep-last",
            "5",
            "--metrics",
            &s(&metrics),
            "--no-progress",
        ]),
    );
    ok(&out);
    CheckpointedRun {
        corpus,
        ckpt,
        metrics: read_lines(&metrics),
    }
}
