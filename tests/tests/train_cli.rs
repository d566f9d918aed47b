//! `zero-bench train` as users run it: the built binary under real mpirun (and as a plain
//! process for `--dry-run`).
//!
//! - 4 ranks, the built-in corpus, `--stages 0,1,2,3 --rounds 2` (bf16, A = 2): the loss falls at
//!   every stage, the metrics file has one complete JSON line per step, rank 0 prints every
//!   stage's ledger next to the paper's formula, and the stage table and its JSON appear.
//! - `--dry-run --world 4` (no MPI) reports, per stage and memory category, exactly the
//!   bytes the real 4-rank run measured (rank 0's metrics, every rank's total).
//! - Bad configurations exit non-zero with the message, printed once, without a backtrace.
//! - `--init-from` a consolidated HDF5 file written here with the hdf5 crate (h5py's
//!   layout: one f32 dataset per tensor at the root): the weights are used (a zero `wte`
//!   gives a loss of exactly ln V), and with lr = 1e-30 `--save-model` writes them back
//!   unchanged; wrong shapes, missing tensors and f64 data are refused by name.
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench --release` (scripts/test.sh does).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;
use zero_models::GptConfig;
use zero_tests::cli::{ok, read_json, read_lines, repo, s, train};
use zero_tests::JobOutput;

use zero_tests::zero_bench_bin as zero_bench;

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("train-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

// ---------------------------------------------------------------------------------------
// The 4-rank run every stage, shared by two tests (run once per test process).

const RANKS: usize = 4;
const STEPS: usize = 10;
/// The shared run's settings on top of configs/tiny.toml (bf16 so the ledger has fp32
/// master weights, A = 2 so accumulation is on).
fn shared_settings() -> Vec<String> {
    [
        "--config",
        &repo("configs/tiny.toml"),
        "--stages",
        "0,1,2,3",
        "--precision",
        "bf16",
        "--grad-accum",
        "2",
        "--steps",
        &STEPS.to_string(),
    ]
    .iter()
    .map(|x| x.to_string())
    .collect()
}

struct RealRun {
    out: JobOutput,
    metrics: Vec<Value>,
    table: Value,
}

fn real_run() -> &'static RealRun {
    static RUN: OnceLock<RealRun> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = scratch("real");
        let (metrics, json) = (dir.join("metrics.jsonl"), dir.join("stages.json"));
        let mut args = shared_settings();
        args.extend(["--metrics".into(), s(&metrics), "--json".into(), s(&json)]);
        // Two interleaved rounds: the second adds step times only (no metrics, no ledger).
        args.extend(["--rounds".into(), "2".into()]);
        let out = train(RANKS, &args);
        ok(&out);
        RealRun {
            metrics: read_lines(&metrics),
            table: read_json(&json),
            out,
        }
    })
}

#[test]
fn four_ranks_every_stage_loss_falls_metrics_complete_ledgers_printed() {
    let run = real_run();
    let stdout = &run.out.stdout;
    // Rank 0 alone prints the configuration, once, with provenance.
    assert_eq!(
        stdout.matches("resolved configuration").count(),
        1,
        "{stdout}"
    );
    assert!(
        stdout.contains("precision.dtype = \"bf16\"") && stdout.contains("# command line"),
        "{stdout}"
    );

    // One complete line per step per stage, in order.
    assert_eq!(run.metrics.len(), 4 * STEPS, "{:#?}", run.metrics);
    for (i, m) in run.metrics.iter().enumerate() {
        let (stage, step) = (i / STEPS, i % STEPS + 1);
        assert_eq!(m["stage"], stage as u64, "{m}");
        assert_eq!(m["step"], step as u64, "{m}: steps count from 1");
        for key in [
            "loss",
            "grad_norm",
            "lr",
            "loss_scale",
            "tokens_per_s",
            "step_seconds",
        ] {
            let x = m[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key} missing in {m}"));
            assert!(x.is_finite() && x >= 0.0, "{key} = {x} in {m}");
        }
        assert_eq!(m["skipped"], false, "{m}");
        // N x A x B x T = 4 x 2 x 2 x 16 tokens per step (configs/tiny.toml: B = 2, T = 16).
        assert_eq!(m["tokens"], 256, "{m}");
        let comm = m["comm_sent_bytes"].as_object().expect("comm object");
        for kind in ["all_reduce", "reduce_scatter", "all_gather"] {
            assert!(comm[kind].is_u64(), "{kind} in {m}");
        }
        assert!(comm.values().map(|v| v.as_u64().unwrap_or(0)).sum::<u64>() > 0);
        let mem = m["memory_bytes"].as_object().expect("memory object");
        for cat in [
            "params",
            "grads",
            "master",
            "adam_m",
            "adam_v",
            "padding",
            "activations",
        ] {
            assert!(mem[cat].is_u64(), "{cat} in {m}");
        }
        assert!(
            mem["master"].as_u64() > Some(0),
            "bf16 keeps an fp32 master: {m}"
        );
    }

    // The loss falls at every stage: from ~ln 64 = 4.16 by far more than noise (0.2 nats)
    // over 10 steps of lr 1e-2 on the order-2 Markov corpus.
    for stage in 0..4 {
        let l = |k: usize| {
            run.metrics[stage * STEPS + k]["loss"]
                .as_f64()
                .unwrap_or(f64::NAN)
        };
        assert!(
            l(STEPS - 1) < l(0) - 0.2,
            "stage {stage}: loss {} -> {}",
            l(0),
            l(STEPS - 1)
        );
        // Every stage's ledger next to the formula, with the explanation.
        for needle in [
            format!("=== ZeRO-{stage}: {STEPS} steps on 4 rank(s) ==="),
            format!("memory of rank 0 of 4 (ZeRO-{stage}"),
            format!("ZeRO-{stage} formula"),
            format!("summary ZeRO-{stage}: "),
        ] {
            assert!(stdout.contains(&needle), "missing {needle:?} in\n{stdout}");
        }
    }
    assert!(stdout.contains("total difference"), "{stdout}");

    // The stage table and its JSON.
    assert!(
        stdout.contains("=== stages compared (4 rank(s)) ==="),
        "{stdout}"
    );
    let stages = run.table["stages"].as_array().expect("stages array");
    assert_eq!(stages.len(), 4);
    for (i, st) in stages.iter().enumerate() {
        assert_eq!(st["stage"], i as u64);
        assert_eq!(
            st["ledger_bytes_per_rank"].as_array().map(Vec::len),
            Some(RANKS)
        );
        assert_eq!(
            st["peak_rss_bytes_per_rank"].as_array().map(Vec::len),
            Some(RANKS)
        );
        assert!(st["step_time_ratio_to_stage0"]
            .as_f64()
            .is_some_and(|r| r > 0.0));
        assert_eq!(st["round_step_seconds"].as_array().map(Vec::len), Some(2));
        let losses: Vec<f64> = st["losses"]
            .as_array()
            .expect("losses")
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        let from_metrics: Vec<f64> = (0..STEPS)
            .filter_map(|k| run.metrics[i * STEPS + k]["loss"].as_f64())
            .collect();
        assert_eq!(losses, from_metrics, "stage {i}");
    }
    assert_eq!(stages[0]["step_time_ratio_to_stage0"], 1.0);
    // Model states per rank fall from stage to stage (16Ψ -> 4Ψ+12Ψ/N -> 2Ψ+14Ψ/N -> 16Ψ/N).
    let states: Vec<u64> = stages
        .iter()
        .map(|st| st["state_bytes_per_rank"][0].as_u64().unwrap_or(0))
        .collect();
    assert!(states.windows(2).all(|w| w[1] < w[0]), "{states:?}");
}

#[test]
fn dry_run_without_mpi_equals_the_real_run_per_category() {
    let run = real_run();
    let dir = scratch("dry");
    let json = dir.join("dry.json");
    let mut args: Vec<String> = vec![
        "train".into(),
        "--dry-run".into(),
        "--world".into(),
        RANKS.to_string(),
    ];
    args.extend(shared_settings());
    args.extend(["--json".into(), s(&json)]);
    // A plain process: no mpirun, no MPI initialised.
    let out = Command::new(zero_bench())
        .args(&args)
        .output()
        .expect("zero-bench starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{args:?}\n{text}");
    assert!(text.contains("=== dry run: ZeRO-3 on 4 rank(s)"), "{text}");
    let dry = read_json(&json);
    let plans = dry["stages"].as_array().expect("stages");
    let real = run.table["stages"].as_array().expect("stages");
    assert_eq!(plans.len(), 4);
    for (i, plan) in plans.iter().enumerate() {
        // Rank 0's first step of this stage (memory does not change between steps).
        let measured = &run.metrics[i * STEPS]["memory_bytes"];
        assert_eq!(
            &plan["memory_bytes"], measured,
            "stage {i}: dry run vs rank 0 of the real run, by category"
        );
        assert_eq!(
            plan["total_bytes_per_rank"], real[i]["ledger_bytes_per_rank"],
            "stage {i}: every rank's total"
        );
        // Measured bytes per step = the communication ledger + the control all-reduce of 3
        // f64 (24 bytes, ring all-reduce: 2 (N-1)/N x 24 = 36 bytes sent per rank).
        let control = 2 * (RANKS as u64 - 1) * 24 / RANKS as u64;
        assert_eq!(
            plan["comm_sent_bytes_per_step"]
                .as_u64()
                .map(|b| b + control),
            real[i]["comm_sent_bytes_per_step"].as_u64(),
            "stage {i}: bytes sent per step"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Bad configurations.

/// Run on 2 ranks, expect failure with `needle` in the message, printed once, no panic.
fn refused(args: &[&str], needle: &str) {
    let mut all = vec!["--config".to_string(), repo("configs/tiny.toml")];
    all.extend(args.iter().map(|a| a.to_string()));
    let out = train(2, &all);
    out.assert_failed_by_itself();
    let text = out.all_text();
    assert!(text.contains(needle), "{args:?}: no {needle:?} in\n{text}");
    assert_eq!(
        text.matches("error:").count(),
        1,
        "{args:?}: the error must be printed once (rank 0)\n{text}"
    );
    for bad in ["panicked", "stack backtrace", "RUST_BACKTRACE"] {
        assert!(!text.contains(bad), "{args:?}: {bad:?} in\n{text}");
    }
}

#[test]
fn bad_configs_exit_nonzero_with_the_message_once_and_no_backtrace() {
    refused(&["--set", "train.stepz=3"], "stepz");
    refused(
        &["--stage", "1", "--set", "zero.reduce_every_micro_step=true"],
        "reduce_every_micro_step = true needs stage 2 or 3",
    );
    refused(
        &[
            "--precision",
            "fp16",
            "--set",
            "precision.loss_scaling=false",
        ],
        "needs dynamic loss scaling",
    );
    refused(&["--model", "gpt2-9000"], "\"gpt2-9000\" is not a preset");
    refused(
        &["--set", "train.seq_len=17"],
        "exceeds the model's context_len (16)",
    );
    refused(
        &["--set", "data.path=\"/nonexistent/tokens.bin\""],
        "/nonexistent/tokens.bin",
    );
    // The dry run, without MPI, refuses a rank outside the world.
    let out = Command::new(zero_bench())
        .args(["train", "--dry-run", "--world", "4", "--rank", "4"])
        .output()
        .expect("zero-bench starts");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--rank 4 is out of range"),
        "{err}"
    );
}

/// `--dry-run --world N` at the largest N accepted: every rank accounted for, but in a
/// fraction of a second and a few MB, not a plan kept per rank (minutes and tens of GB
/// at 262144 ranks). Run under a 1 GB address-space limit, which a plan per rank
/// exceeds, so that a regression fails here rather than filling the machine.
#[test]
fn dry_run_at_the_largest_world_is_quick_and_small() {
    let started = std::time::Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 1000000 && exec '{}' train --dry-run --world 262144 --model gpt2-1.5b --stage 3",
            zero_bench().display()
        ))
        .output()
        .expect("sh starts");
    let elapsed = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        text.contains("=== dry run: ZeRO-3 on 262144 rank(s)")
            && text.contains("every rank holds the same"),
        "{text}"
    );
    // What it took, for the log (not a bound: the address-space limit is the check).
    eprintln!("dry run at 262144 ranks: {elapsed:?}");
}

// ---------------------------------------------------------------------------------------
// --init-from / --save-model.

/// configs/tiny.toml's model.
fn tiny() -> GptConfig {
    GptConfig {
        vocab_size: 64,
        max_seq_len: 16,
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        vocab_block_rows: None,
        checkpoint_every: 0,
    }
}

/// (name, shape) of every tensor, in spec order.
fn tensors() -> Vec<(String, Vec<usize>)> {
    tiny()
        .spec()
        .units
        .iter()
        .flat_map(|u| u.params.iter().map(|p| (p.name.clone(), p.shape.clone())))
        .collect()
}

/// Deterministic values in [-0.05, 0.05) for tensor `i` (an LCG; `wte` all zero unless
/// `zero_wte` is false).
fn values(i: usize, name: &str, n: usize, zero_wte: bool) -> Vec<f32> {
    if name == "wte" && zero_wte {
        return vec![0.0; n];
    }
    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect()
}

/// Write a model file as h5py would: one f32 dataset per tensor at the root. `edit` may
/// change a tensor's shape (None: leave it out) or ask for f64 storage.
/// How a tensor is written: its shape and whether as f64 (None: left out).
type Stored = Option<(Vec<usize>, bool)>;

fn write_model(path: &Path, edit: &dyn Fn(&str, &[usize]) -> Stored) {
    write_model_values(path, true, edit)
}

fn write_model_values(path: &Path, zero_wte: bool, edit: &dyn Fn(&str, &[usize]) -> Stored) {
    let f = hdf5::File::create(path).expect("create the model file");
    for (i, (name, shape)) in tensors().iter().enumerate() {
        let Some((shape, as_f64)) = edit(name, shape) else {
            continue;
        };
        let n: usize = shape.iter().product();
        let v = values(i, name, n, zero_wte);
        if as_f64 {
            let v: Vec<f64> = v.iter().map(|&x| x as f64).collect();
            f.new_dataset::<f64>()
                .shape(shape.clone())
                .create(name.as_str())
                .and_then(|d| d.write_raw(&v))
                .expect("write a tensor");
        } else {
            f.new_dataset::<f32>()
                .shape(shape.clone())
                .create(name.as_str())
                .and_then(|d| d.write_raw(&v))
                .expect("write a tensor");
        }
    }
}

#[test]
fn init_from_is_used_and_round_trips_through_save_model() {
    round_trip(false);
}

/// The same with `wte` held in row blocks of 20 rows (four units): the blocks are read
/// from their rows of the file's one `wte` dataset and written back joined, and `wte`
/// holds non-zero values here, so a block read from the wrong rows would show.
#[test]
fn init_from_and_save_model_read_and_write_a_table_held_in_row_blocks_whole() {
    round_trip(true);
}

fn round_trip(split: bool) {
    let dir = scratch(if split { "init-split" } else { "init" });
    let (input, output, metrics) = (dir.join("in.h5"), dir.join("out.h5"), dir.join("m.jsonl"));
    let zero_wte = !split;
    write_model_values(&input, zero_wte, &|_, shape| Some((shape.to_vec(), false)));
    // lr = 1e-30 (the config demands lr > 0): each AdamW step moves a parameter by about
    // lr (the bias-corrected m / sqrt(v) is of order 1) and decays it by a factor 1 - 1e-31,
    // which rounds to no change at all for values of order 1e-2 (f32 ulp ~1e-9) and to at
    // most ~1e-29 for the zeros of wte. So the saved weights equal the loaded ones within
    // 1e-24 absolute, while any misplaced or mis-shaped tensor is off by ~1e-2.
    let args: Vec<String> = [
        "--config",
        &repo("configs/tiny.toml"),
        "--stages",
        "0,3",
        "--steps",
        "2",
        "--set",
        "optim.lr=1e-30",
        "--init-from",
        &s(&input),
        "--save-model",
        &s(&output),
        "--metrics",
        &s(&metrics),
        "--set",
        if split {
            "model.vocab_block_rows=20"
        } else {
            "train.log_every=1"
        },
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let out = train(2, &args);
    ok(&out);
    let m = read_lines(&metrics);
    assert_eq!(m.len(), 4);
    if split {
        assert!(
            out.stdout.contains("model.vocab_block_rows = 20"),
            "{}",
            out.stdout
        );
    }

    // wte = 0 makes every logit 0 (the LM head is tied to wte): the loss is exactly ln V
    // up to f32 rounding of the log-sum-exp (1e-5 relative), whatever the data. Default
    // initialisation gives ~4.19 here, so this shows the file's weights were loaded.
    let ln_v = (tiny().vocab_size as f64).ln();
    for line in m.iter().filter(|_| zero_wte) {
        let loss = line["loss"].as_f64().expect("loss");
        assert!(
            (loss - ln_v).abs() < 1e-5 * ln_v,
            "loss {loss} vs ln V {ln_v}: {line}"
        );
    }

    // The saved file: h5py's layout, the same names, shapes and values.
    let f = hdf5::File::open(&output).expect("open the saved model");
    let mut names = f.member_names().expect("list");
    names.sort();
    let mut want: Vec<String> = tensors().into_iter().map(|(n, _)| n).collect();
    want.sort();
    assert_eq!(names, want);
    for (i, (name, shape)) in tensors().iter().enumerate() {
        let ds = f.dataset(name).expect("dataset at the root");
        assert_eq!(&ds.shape(), shape, "{name}");
        assert!(ds.dtype().expect("dtype").is::<f32>(), "{name} is f32");
        let got: Vec<f32> = ds.read_raw().expect("read");
        let n: usize = shape.iter().product();
        let want = values(i, name, n, zero_wte);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-24,
            "{name} changed in the round trip by {worst:e}"
        );
    }
}

#[test]
fn init_from_refuses_wrong_shapes_missing_tensors_and_f64() {
    let dir = scratch("init-bad");
    let run = |file: &Path, needles: &[&str]| {
        let args: Vec<String> = [
            "--config",
            &repo("configs/tiny.toml"),
            "--steps",
            "1",
            "--init-from",
            &s(file),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        let out = train(2, &args);
        out.assert_failed_by_itself();
        let text = out.all_text();
        for n in needles {
            assert!(text.contains(n), "no {n:?} in\n{text}");
        }
        assert_eq!(text.matches("error:").count(), 1, "{text}");
        assert!(!text.contains("panicked"), "{text}");
    };
    let transposed = dir.join("transposed.h5");
    write_model(&transposed, &|name, shape| {
        let mut s = shape.to_vec();
        if name == "h.1.mlp.c_fc.weight" {
            s.reverse(); // Conv1D's [in, out] instead of [out, in]
        }
        Some((s, false))
    });
    run(
        &transposed,
        &[
            "'h.1.mlp.c_fc.weight' has shape [32, 128]",
            "expects [128, 32]",
            "stored [out, in]",
        ],
    );
    let missing = dir.join("missing.h5");
    write_model(&missing, &|name, shape| {
        (name != "ln_f.bias").then(|| (shape.to_vec(), false))
    });
    run(&missing, &["lacks 1 of the model's", "ln_f.bias [32]"]);
    let doubles = dir.join("f64.h5");
    write_model(&doubles, &|name, shape| {
        Some((shape.to_vec(), name == "wpe"))
    });
    run(&doubles, &["'wpe'", "expected 32-bit float"]);
}

#[test]
fn help_explains_the_options_with_an_example() {
    let out = Command::new(zero_bench())
        .args(["train", "--help"])
        .output()
        .expect("zero-bench starts");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for needle in [
        "--config",
        "--set",
        "--stages",
        "--dry-run",
        "--init-from",
        "--metrics",
        "Examples:",
        "mpirun",
    ] {
        assert!(text.contains(needle), "--help lacks {needle:?}:\n{text}");
    }
}

#[test]
fn every_example_config_is_valid_and_dry_runs() {
    let dir = PathBuf::from(repo("configs"));
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("configs/ exists") {
        let path = entry.expect("directory entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let out = Command::new(zero_bench())
            .args(["train", "--dry-run", "--world", "8", "--config"])
            .arg(&path)
            .output()
            .expect("zero-bench starts");
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        n += 1;
    }
    assert!(n >= 2, "expected the example configs in {}", dir.display());
}

/// Training 2k steps equals training k, saving, exiting, and resuming for k more: the
/// same per-step metrics (loss, grad norm, lr, loss scale), bitwise in fp32 — and a
/// resume on another world size and stage continues within rounding.
#[test]
fn resume_from_a_checkpoint_continues_the_same_run() {
    let dir = scratch("resume");
    let ckpt = dir.join("ckpt");
    let run = |ranks: usize, steps: usize, stage: &str, extra: &[&str], metrics: &Path| {
        let mut a: Vec<String> = [
            "--config",
            &repo("configs/tiny.toml"),
            "--stage",
            stage,
            "--steps",
            &steps.to_string(),
            "--metrics",
            &s(metrics),
            "--no-progress",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        a.extend(extra.iter().map(|x| x.to_string()));
        let out = train(ranks, &a);
        ok(&out);
        read_lines(metrics)
    };
    // The same numbers of a step, as JSON values: bitwise when the f64s print the same.
    let key = |v: &Value| {
        ["step", "loss", "grad_norm", "lr", "loss_scale", "skipped"]
            .iter()
            .map(|k| v[k].to_string())
            .collect::<Vec<_>>()
    };
    let straight = run(2, 8, "2", &[], &dir.join("straight.jsonl"));
    let ck = s(&ckpt);
    let first = run(
        2,
        4,
        "2",
        &["--ckpt-dir", &ck, "--save-every", "2"],
        &dir.join("a.jsonl"),
    );
    assert_eq!(first.len(), 4);
    assert!(ckpt.join("latest").is_file() && ckpt.join("step-4").is_dir());
    let resumed = run(2, 8, "2", &["--resume", &ck], &dir.join("b.jsonl"));
    assert_eq!(resumed.len(), 4, "the resumed run does steps 4..8 only");
    for (r, x) in resumed.iter().zip(&straight[4..]) {
        assert_eq!(
            key(r),
            key(x),
            "resumed step differs from the uninterrupted run"
        );
    }
    // Resharded: the 2-rank stage-2 checkpoint of step 4 continues on 3 ranks at stage 3
    // (the resume above went on saving into the root: step 8 is its `latest` now). The
    // global batch is different (N changes): refused without --allow-batch-change, and
    // with it the run trains on from step 5, its data from where step 4 left it.
    assert!(
        ckpt.join("step-8").is_dir(),
        "--resume of a root saves into it"
    );
    let ck = s(&ckpt.join("step-4"));
    let mut a: Vec<String> = [
        "--config",
        &repo("configs/tiny.toml"),
        "--stage",
        "3",
        "--steps",
        "6",
        "--resume",
        &ck,
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let refused = train(3, &a);
    assert_eq!(refused.code, Some(1), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("global batch") && refused.stderr.contains("--allow-batch-change"),
        "{}",
        refused.stderr
    );
    a[5] = "4".into(); // --steps 4: the checkpoint is at step 4 already
    let nothing_left = train(3, &a);
    assert!(
        nothing_left.code == Some(1) && nothing_left.stderr.contains("is at step 4"),
        "{}",
        nothing_left.stderr
    );
    let other_ckpt = dir.join("other");
    let other = run(
        3,
        6,
        "3",
        &[
            "--resume",
            &ck,
            "--allow-batch-change",
            "--ckpt-dir",
            &s(&other_ckpt),
        ],
        &dir.join("c.jsonl"),
    );
    assert_eq!(other.len(), 2);
    assert_eq!(other[0]["step"], Value::from(5));
    assert!(other
        .iter()
        .all(|v| v["loss"].as_f64().is_some_and(f64::is_finite)));
    // Each checkpoint records where the data order has got to (configs/tiny.toml: B = 2
    // rows of T = 16 tokens, A = 1): after 4 steps of 2 ranks, global row 4*2*2 = 16 and
    // token 16*16 = 256; after 2 more steps of 3 ranks, row 16 + 2*3*2 = 28 and token
    // 256 + 12*16 = 448, not where 6 steps of 3 ranks would be (row 36).
    let meta = |step_dir: &Path| -> Value {
        let text = std::fs::read_to_string(step_dir.join("meta.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let position = |step_dir: &Path| -> Value {
        let state = meta(step_dir)["app_state"].as_str().unwrap().to_string();
        serde_json::from_str::<Value>(&state).unwrap()["data_position"].clone()
    };
    let expect = |index: u64, row: &str, token: &str| serde_json::json!({"step_index": index, "row": row, "token": token});
    assert_eq!(position(&ckpt.join("step-4")), expect(4, "16", "256"));
    assert_eq!(position(&other_ckpt.join("step-6")), expect(6, "28", "448"));
    let history = meta(&other_ckpt.join("step-6"))["history"].to_string();
    assert!(
        history.contains("global batch changed") && history.contains("global row 16, token 256"),
        "{history}"
    );
    // A checkpoint from before positions were recorded: its position is worked out from
    // its global batch, to the same place.
    let legacy = dir.join("legacy").join("step-4");
    std::fs::create_dir_all(&legacy).unwrap();
    for entry in std::fs::read_dir(ckpt.join("step-4")).unwrap() {
        let from = entry.unwrap().path();
        std::fs::copy(&from, legacy.join(from.file_name().unwrap())).unwrap();
    }
    let mut old = meta(&legacy);
    old.as_object_mut().unwrap().remove("app_state");
    std::fs::write(legacy.join("meta.json"), old.to_string()).unwrap();
    let legacy_ckpt = dir.join("legacy-on");
    let again = run(
        3,
        6,
        "3",
        &[
            "--resume",
            &s(&legacy),
            "--allow-batch-change",
            "--ckpt-dir",
            &s(&legacy_ckpt),
        ],
        &dir.join("d.jsonl"),
    );
    assert_eq!(again.len(), 2);
    assert_eq!(
        position(&legacy_ckpt.join("step-6")),
        expect(6, "28", "448")
    );
}

/// `--device sim-gpu` (the simulated GPU: the CUDA kernels' CPU twins, with CUDA's
/// stream rules checked) trains through the same command as the host: on 2 ranks every
/// stage gives its stage 0's losses bitwise (sums of two addends are order-free), the
/// curve follows the host's to the drift of two summation orders over 8 steps, and a
/// checkpoint saved and resumed on the simulated GPU continues the same run bitwise.
/// `--device cuda` in a build without the `cuda` feature says how to get it.
#[test]
fn the_simulated_gpu_trains_every_stage_like_the_host_and_resumes_bitwise() {
    let dir = scratch("sim-gpu");
    let run = |device: &str, extra: &[&str], name: &str| {
        let json = dir.join(format!("{name}.json"));
        let mut a: Vec<String> = [
            "--config",
            &repo("configs/tiny.toml"),
            "--device",
            device,
            "--no-progress",
            "--json",
            &s(&json),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        a.extend(extra.iter().map(|x| x.to_string()));
        let out = train(2, &a);
        ok(&out);
        (out, read_json(&json))
    };
    let losses = |v: &Value, i: usize| -> Vec<f64> {
        v["stages"][i]["losses"]
            .as_array()
            .expect("losses")
            .iter()
            .map(|x| x.as_f64().expect("a loss"))
            .collect()
    };
    let (out, sim) = run("sim-gpu", &["--stages", "0,1,2,3"], "sim");
    assert!(
        out.stdout.contains("on simulated GPU"),
        "the resolved configuration names the device\n{}",
        out.transcript()
    );
    assert!(sim["device"]
        .as_str()
        .is_some_and(|d| d.contains("simulated GPU")));
    let (_, host) = run("host", &["--stage", "0"], "host");
    let stage0 = losses(&sim, 0);
    assert_eq!(stage0.len(), 8);
    for i in 1..4 {
        assert_eq!(
            losses(&sim, i),
            stage0,
            "stage {i} vs stage 0 on the simulated GPU"
        );
    }
    for (step, (g, h)) in stage0.iter().zip(&losses(&host, 0)).enumerate() {
        assert!(
            ((g - h) / h).abs() <= 1e-5,
            "step {}: simulated GPU {g} vs host {h}",
            step + 1
        );
    }
    // Save after 4 steps on the simulated GPU at stage 3, resume for 4 more.
    let ck = s(&dir.join("ckpt"));
    run(
        "sim-gpu",
        &["--stage", "3", "--steps", "4", "--ckpt-dir", &ck],
        "first",
    );
    let (_, resumed) = run("sim-gpu", &["--stage", "3", "--resume", &ck], "resumed");
    assert_eq!(losses(&resumed, 0), stage0[4..], "resumed vs uninterrupted");

    let out = train(
        1,
        &[
            "--config".to_string(),
            repo("configs/tiny.toml"),
            "--device".into(),
            "cuda".into(),
        ],
    );
    assert_eq!(out.code, Some(1), "{}", out.transcript());
    assert!(
        out.stderr.contains("built without the `cuda` feature"),
        "{}",
        out.transcript()
    );
}

/// Issue 14's host-staged MPI under real mpirun, on the simulated GPU (whose every copy
/// is hazard-checked like a kernel): every stage gives the losses of MPI on the buffers
/// as they are (the simulated GPU's memory is host memory, so `--comm mpi` can take
/// it), bit for bit, with the same network bytes per step, quantized stage-3 gathers
/// included; `auto` picks staging here (no NCCL in this build, and the probe says the
/// MPI is not CUDA-aware) and says why.
#[test]
fn host_staged_mpi_on_the_simulated_gpu_trains_every_stage_like_direct_mpi() {
    let dir = scratch("staged");
    let run = |comm: &str| {
        let json = dir.join(format!("{comm}.json"));
        let metrics = dir.join(format!("{comm}.jsonl"));
        let a: Vec<String> = [
            "--config",
            &repo("configs/tiny.toml"),
            "--device",
            "sim-gpu",
            "--stages",
            "0,1,2,3",
            "--steps",
            "4",
            "--no-progress",
            "--comm",
            comm,
            "--json",
            &s(&json),
            "--metrics",
            &s(&metrics),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        let out = train(2, &a);
        ok(&out);
        (out, read_json(&json))
    };
    let (_, staged) = run("mpi-staged");
    let (_, direct) = run("mpi");
    let (auto_out, auto) = run("auto");
    assert!(
        auto_out
            .all_text()
            .contains("comm backend: mpi-staged (device buffers across processes"),
        "{}",
        auto_out.transcript()
    );
    assert_eq!(
        auto_out.all_text().matches("comm backend:").count(),
        1,
        "rank 0 logs the choice once\n{}",
        auto_out.transcript()
    );
    assert_eq!(staged["comm"], "mpi-staged");
    assert_eq!(direct["comm"], "mpi");
    assert_eq!(auto["comm"], "mpi-staged");
    assert!(direct["staging"].is_null());
    let held = staged["staging"]["held_bytes"]
        .as_u64()
        .expect("staging bytes");
    assert!(held > 0 && held % 4 == 0, "{}", staged["staging"]);
    assert!(staged["staging"]["to_host_bytes"].as_u64() > Some(0));
    // The dry run plans the same host staging (the run keeps the largest of its stages').
    let dry_json = dir.join("dry-staged.json");
    let dry = Command::new(zero_bench())
        .args([
            "train",
            "--dry-run",
            "--world",
            "2",
            "--config",
            &repo("configs/tiny.toml"),
            "--device",
            "sim-gpu",
            "--stages",
            "0,1,2,3",
            "--comm",
            "mpi-staged",
            "--json",
            &s(&dry_json),
        ])
        .output()
        .expect("zero-bench starts");
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(String::from_utf8_lossy(&dry.stdout).contains("host staging (--comm mpi-staged)"));
    let planned = read_json(&dry_json)["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .filter_map(|p| p["host_staging_bytes"].as_u64())
        .max();
    assert_eq!(planned, Some(held), "dry run vs the run's host staging");
    // The metrics lines carry the staging beside the device ledger.
    let lines = read_lines(&dir.join("mpi-staged.jsonl"));
    assert_eq!(lines.len(), 16);
    assert!(lines
        .iter()
        .all(|l| l["host_staging_bytes"].as_u64() == Some(held)));
    assert!(read_lines(&dir.join("mpi.jsonl"))
        .iter()
        .all(|l| l.get("host_staging_bytes").is_none()));
    for i in 0..4 {
        let stage = |v: &Value, key: &str| v["stages"][i][key].clone();
        assert_eq!(
            stage(&staged, "losses"),
            stage(&direct, "losses"),
            "stage {i}"
        );
        assert_eq!(
            stage(&auto, "losses"),
            stage(&direct, "losses"),
            "stage {i}"
        );
        for key in ["comm_sent_bytes_per_step", "comm_plan_bytes_per_step"] {
            assert_eq!(stage(&staged, key), stage(&direct, key), "stage {i}: {key}");
        }
    }
    // Stage 3 with quantized gathers (qwZ): int8 codes and f32 scales go through the
    // staging as well, with the direct path's losses and bytes.
    let quantized = |comm: &str| {
        let json = dir.join(format!("qwz-{comm}.json"));
        let a: Vec<String> = [
            "--config",
            &repo("configs/tiny.toml"),
            "--device",
            "sim-gpu",
            "--stage",
            "3",
            "--steps",
            "4",
            "--no-progress",
            "--set",
            "zero.quantize_weights=true",
            "--comm",
            comm,
            "--json",
            &s(&json),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        ok(&train(2, &a));
        read_json(&json)
    };
    let (q_staged, q_direct) = (quantized("mpi-staged"), quantized("mpi"));
    for key in ["losses", "comm_sent_bytes_per_step"] {
        assert_eq!(
            q_staged["stages"][0][key], q_direct["stages"][0][key],
            "qwZ: {key}"
        );
    }
}

/// A transport asked for that cannot run here stops every rank with one message that
/// names what is missing and what to do.
#[test]
fn asking_for_a_comm_backend_that_cannot_run_is_a_clear_error() {
    let fails = |device: &str, comm: &str, ranks: usize, says: &[&str]| {
        let a: Vec<String> = [
            "--config",
            &repo("configs/tiny.toml"),
            "--device",
            device,
            "--comm",
            comm,
            "--steps",
            "1",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        let out = train(ranks, &a);
        assert_eq!(out.code, Some(1), "{}", out.transcript());
        assert_eq!(
            out.stderr.matches("error:").count(),
            1,
            "{}",
            out.transcript()
        );
        for s in says {
            assert!(out.stderr.contains(s), "{s}\n{}", out.transcript());
        }
    };
    fails(
        "sim-gpu",
        "nccl",
        2,
        &["--comm nccl", "built without NCCL", "--comm mpi-staged"],
    );
    fails(
        "sim-gpu",
        "mpi-cuda",
        2,
        &[
            "--comm mpi-cuda",
            "not CUDA-aware",
            "MPIX_Query_cuda_support",
            "mpi-staged",
        ],
    );
    fails("host", "mpi-cuda", 2, &["on the host", "use --comm mpi"]);
    fails("host", "local", 2, &["2 processes", "--comm auto"]);
}

/// On the CPU the engine's collectives are left running behind compute (non-blocking
/// MPI, polled by the host device between ops) and `--no-overlap` waits for each where it
/// is issued: the same collectives (as many per step), so the same losses bit for bit,
/// at every stage (bf16 with A = 2: stage 0 reduces through buckets during the last
/// micro-batch's backward). Both runs report their overlap (a share in [0, 1], 0 when
/// waiting) and the metrics time the communication. How much actually ran hidden is a
/// timing, so it is not asserted: the report has no untimed sign of overlap.
#[test]
fn overlapped_collectives_give_the_losses_of_waiting_for_each_and_report_the_overlap() {
    let dir = scratch("overlap");
    let run = |name: &str, extra: &[&str]| {
        let (metrics, json) = (
            dir.join(format!("{name}.jsonl")),
            dir.join(format!("{name}.json")),
        );
        let mut args: Vec<String> = [
            "--config",
            &repo("configs/tiny.toml"),
            "--stages",
            "0,1,2,3",
            "--precision",
            "bf16",
            "--grad-accum",
            "2",
            "--steps",
            "4",
            "--metrics",
            &s(&metrics),
            "--json",
            &s(&json),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        args.extend(extra.iter().map(|x| x.to_string()));
        let out = train(2, &args);
        ok(&out);
        (out.stdout, read_lines(&metrics), read_json(&json))
    };
    let (stdout, metrics, table) = run("on", &[]);
    let (stdout_off, _, table_off) = run("off", &["--no-overlap"]);
    let stages = table["stages"].as_array().expect("stages");
    let stages_off = table_off["stages"].as_array().expect("stages");
    assert_eq!((stages.len(), stages_off.len()), (4, 4));
    for (stage, (on, off)) in stages.iter().zip(stages_off).enumerate() {
        assert_eq!(on["losses"], off["losses"], "stage {stage}");
        for (text, st) in [(&stdout, on), (&stdout_off, off)] {
            assert!(
                text.contains(&format!("overlap ZeRO-{stage}: ")),
                "stage {stage}:\n{text}"
            );
            let o = &st["overlap"];
            let hidden = o["hidden_fraction"].as_f64().expect("hidden_fraction");
            assert!((0.0..=1.0).contains(&hidden), "{o}");
            assert!(o["collectives_per_step"].as_f64() > Some(0.0), "{o}");
        }
        assert_eq!(off["overlap"]["hidden_fraction"], 0.0, "waited for each");
        assert_eq!(
            on["overlap"]["collectives_per_step"], off["overlap"]["collectives_per_step"],
            "stage {stage}: the same collectives either way"
        );
    }
    for m in &metrics {
        let total = m["comm_seconds"].as_f64().expect("comm_seconds");
        let exposed = m["comm_exposed_seconds"].as_f64().expect("exposed");
        assert!(0.0 <= exposed && exposed <= total, "{m}");
    }
}
