//! Scenario: sharded checkpoints under `mpirun -n N` (launched by tests/tests/ckpt.rs).
//!
//! `resume DIR`: for stages 0-3 (fp32, and bf16 at stages 1 and 3): training 2k steps
//!   equals training k, saving, dropping the engine, loading into a new one and training
//!   k more: the same losses and final master weights, bit for bit.
//! `save DIR STAGE B`: train k steps at N ranks, save, train k more and write those k
//!   losses and the final weights (the un-resharded continuation) to DIR/reference.txt.
//! `continue DIR STAGE B`: load DIR on this job's M ranks at STAGE (B rows per rank so
//!   that M x B is the saving job's N x B: the same global batches), train k steps, and
//!   compare with the reference (tolerance argued at `continue_run`).
//! `crash DIR`: save at step k, train one more step, save again while rank 1 SIGKILLs
//!   itself after writing its first unit (the job dies).
//! `after-crash DIR`: the previous checkpoint is intact and named by `latest`, loads, and
//!   the next save removes the dead temporary directory.
//! `faults DIR`: other model refused naming the parameter; a corrupted dataset names file
//!   and dataset; truncated and missing files name the file; an uncreatable directory and
//!   a disk-full write (RLIMIT_FSIZE on rank 1) fail cleanly and lose nothing; keep_last.

use std::path::{Path, PathBuf};

use zero_comm::Communicator;
use zero_core::checkpoint::{self, CheckpointError, SaveOptions};
use zero_core::config::{Precision, Stage};
use zero_core::Engine;
use zero_kernels::device::HostDevice;
use zero_models::data::{MarkovSource, Sequential, Tokens};
use zero_models::{Gpt, GptConfig, TokenBatch as Batch};
use zero_tests::scenario::{
    fail, host, tiny_config, tiny_gpt, OrFail, Tiny as Config, SEQ_LEN as T,
};

/// k: steps before the save, and after it.
const K: u64 = 3;

fn gpt(n_embd: usize) -> GptConfig {
    tiny_gpt(n_embd)
}

/// The engine_stages configuration (small buckets, eps = 1e-6), B rows, 2K steps.
fn config(stage: Stage, precision: Precision, rows: usize) -> Config {
    tiny_config(stage, precision, rows, 1, (2 * K) as usize)
}

/// Train steps `from..to` (the engine must have done `from`), returning the losses.
fn train<C: Communicator>(
    engine: &mut Engine<'_, HostDevice, C>,
    model: &mut Gpt<HostDevice, f32>,
    tokens: &Tokens,
    rows: usize,
    steps: std::ops::Range<u64>,
) -> Vec<f64> {
    let comm = engine.communicator();
    let rank = comm.rank();
    let order = Sequential::new(rows, T, 1, comm.size(), rank).or_fail(rank, "order");
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    let mut losses = Vec::new();
    for s in steps {
        if engine.steps_done() != s {
            fail(
                rank,
                format!("engine at step {}, expected {s}", engine.steps_done()),
            );
        }
        order
            .fill(tokens, s, 0, &mut inputs, &mut targets)
            .or_fail(rank, "data");
        let batch = Batch {
            rows,
            seq_len: T,
            inputs: &inputs,
            targets: &targets,
        };
        let rep = engine.step(model, &[batch]).or_fail(rank, "step");
        losses.push(rep.loss);
    }
    losses
}

fn new_engine<'c, C: Communicator>(
    comm: &'c C,
    cfg: &Config,
    n_embd: usize,
) -> (Engine<'c, HostDevice, C>, Gpt<HostDevice, f32>) {
    let rank = comm.rank();
    let dev = host();
    let model = Gpt::<HostDevice, f32>::new(dev, gpt(n_embd), cfg.rows).or_fail(rank, "model");
    let engine = Engine::new(&cfg.engine, comm, dev, &model).or_fail(rank, "engine");
    (engine, model)
}

fn resume<C: Communicator>(comm: &C, tokens: &Tokens, root: &Path) {
    let rank = comm.rank();
    let rows = 2;
    let cases = [
        (Stage::Zero0, Precision::Fp32),
        (Stage::Zero1, Precision::Fp32),
        (Stage::Zero2, Precision::Fp32),
        (Stage::Zero3, Precision::Fp32),
        (Stage::Zero1, Precision::Bf16),
        (Stage::Zero3, Precision::Bf16),
    ];
    for (stage, precision) in cases {
        let what = format!("{stage:?} {precision:?}");
        let cfg = config(stage, precision, rows);
        let (mut e, mut m) = new_engine(comm, &cfg, 32);
        let want = train(&mut e, &mut m, tokens, rows, 0..2 * K);
        let want_master = e.full_master_f32().or_fail(rank, "master");
        drop(e);

        let dir = root.join(format!("{stage:?}-{precision:?}"));
        let (mut e, mut m) = new_engine(comm, &cfg, 32);
        let mut got = train(&mut e, &mut m, tokens, rows, 0..K);
        checkpoint::save(&e, &dir, &SaveOptions::default()).or_fail(rank, "save");
        drop(e);
        let (mut e, mut m) = new_engine(comm, &cfg, 32);
        let info = checkpoint::load(&mut e, &dir).or_fail(rank, "load");
        if info.meta.step != K || e.steps_done() != K {
            fail(
                rank,
                format!(
                    "{what}: loaded step {}, engine at {}",
                    info.meta.step,
                    e.steps_done()
                ),
            );
        }
        got.extend(train(&mut e, &mut m, tokens, rows, K..2 * K));
        let got_master = e.full_master_f32().or_fail(rank, "master");
        if got != want || got_master != want_master {
            fail(
                rank,
                format!(
                    "{what}: resumed losses {got:?} vs uninterrupted {want:?} (master equal: {})",
                    got_master == want_master
                ),
            );
        }
        if rank == 0 {
            println!("{what}: resumed at step {K}, losses {got:?} bitwise equal to the uninterrupted run");
        }
    }
}

fn stage_arg(rank: usize, s: &str) -> Stage {
    match s {
        "0" => Stage::Zero0,
        "1" => Stage::Zero1,
        "2" => Stage::Zero2,
        "3" => Stage::Zero3,
        _ => fail(rank, format!("stage '{s}' is not 0-3")),
    }
}

/// `master` (`Engine::full_master_f32`: each unit's parameters without its padding, unit
/// after unit) as one line per whole tensor, `name v v ...`, its row blocks joined in
/// row order.
fn master_by_name(rank: usize, layout: &zero_core::PartitionLayout, master: &[f32]) -> String {
    let mut unit_start = Vec::with_capacity(layout.units.len());
    let mut at = 0;
    for u in &layout.units {
        unit_start.push(at);
        at += u.numel;
    }
    if at != master.len() {
        fail(
            rank,
            format!("{} master values, the layout has {at}", master.len()),
        );
    }
    let mut out = String::new();
    for t in layout.tensors() {
        out.push_str(&t.name);
        for &(param, _first_row) in &t.parts {
            let p = &layout.params[param];
            let from = unit_start[p.unit] + p.offset;
            for x in &master[from..from + p.numel] {
                out.push_str(&format!(" {x:e}"));
            }
        }
        out.push('\n');
    }
    out
}

fn save_reference<C: Communicator>(
    comm: &C,
    tokens: &Tokens,
    root: &Path,
    stage: Stage,
    rows: usize,
) {
    let rank = comm.rank();
    let cfg = config(stage, Precision::Fp32, rows);
    let (mut e, mut m) = new_engine(comm, &cfg, 32);
    train(&mut e, &mut m, tokens, rows, 0..K);
    checkpoint::save(&e, root, &SaveOptions::default()).or_fail(rank, "save");
    // The saved master weights, for the CLI tests (consolidate/export must hold them):
    // all values in the engine's order, and each whole tensor by name.
    let saved = e.full_master_f32().or_fail(rank, "master");
    if rank == 0 {
        let text: String = saved.iter().map(|x| format!("{x:e}\n")).collect();
        std::fs::write(root.join("saved-master.txt"), text).or_fail(rank, "write saved master");
        std::fs::write(
            root.join("saved-master-by-name.txt"),
            master_by_name(rank, e.layout(), &saved),
        )
        .or_fail(rank, "write saved master by name");
    }
    let losses = train(&mut e, &mut m, tokens, rows, K..2 * K);
    let master = e.full_master_f32().or_fail(rank, "master");
    if rank == 0 {
        let mut text = String::new();
        for l in &losses {
            text.push_str(&format!("loss {l:e}\n"));
        }
        for x in &master {
            text.push_str(&format!("w {x:e}\n"));
        }
        std::fs::write(root.join("reference.txt"), text).or_fail(rank, "write reference");
        println!(
            "saved at N={} {stage:?}: continuation losses {losses:?}",
            comm.size()
        );
    }
}

/// Continue on this job's ranks. Tolerance: the global batch and every weight are the
/// same as the saving job's, but the gradient sums add N partial sums in another order
/// (N ranks vs M ranks), which moves a gradient's last bit (~1e-7 relative); over k = 3
/// Adam steps with eps = 1e-6 that stays below ~1e-6 relative in the loss and 1e-5 of a
/// parameter (engine_stages measures the same for stage and N changes), while a wrong
/// block (misplaced or stale m/v) moves parameters by O(lr) = 1e-2 and losses by ~1e-3.
fn continue_run<C: Communicator>(
    comm: &C,
    tokens: &Tokens,
    root: &Path,
    stage: Stage,
    rows: usize,
) {
    let rank = comm.rank();
    let cfg = config(stage, Precision::Fp32, rows);
    let (mut e, mut m) = new_engine(comm, &cfg, 32);
    let info = checkpoint::load(&mut e, root).or_fail(rank, "load");
    let losses = train(&mut e, &mut m, tokens, rows, K..2 * K);
    let master = e.full_master_f32().or_fail(rank, "master");
    let text = std::fs::read_to_string(root.join("reference.txt")).or_fail(rank, "reference");
    let mut want_l = Vec::new();
    let mut want_w = Vec::new();
    for line in text.lines() {
        let (tag, v) = line.split_once(' ').unwrap_or(("", ""));
        let v: f64 = v.parse().or_fail(rank, "reference value");
        if tag == "loss" {
            want_l.push(v)
        } else {
            want_w.push(v as f32)
        }
    }
    if want_w.len() != master.len() || want_l.len() != losses.len() {
        fail(
            rank,
            format!(
                "reference has {} losses / {} weights",
                want_l.len(),
                want_w.len()
            ),
        );
    }
    let loss_diff = losses
        .iter()
        .zip(&want_l)
        .map(|(a, b)| (a - b).abs() / b.abs())
        .fold(0.0, f64::max);
    let w_diff = master
        .iter()
        .zip(&want_w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // Same N and stage in a new process: nothing is reordered, so exact.
    let same = comm.size() == info.meta.world && stage == info.meta.stage;
    if same && (loss_diff != 0.0 || w_diff != 0.0) {
        fail(rank, format!("resumed on the same N and stage: losses {losses:?} vs {want_l:?}, max |w diff| {w_diff:.2e}; expected bitwise equality"));
    }
    if !(loss_diff <= 1e-6 && w_diff <= 1e-5) {
        fail(rank, format!("resharded continuation: losses {losses:?} vs {want_l:?} (max rel {loss_diff:.2e} > 1e-6) or max |w diff| {w_diff:.2e} > 1e-5"));
    }
    if rank == 0 {
        println!(
            "saved by N={} {:?}, loaded on M={} {stage:?}: losses {losses:?}, max rel loss diff {loss_diff:.2e}, max |w diff| {w_diff:.2e}",
            info.meta.world, info.meta.stage, comm.size()
        );
    }
}

fn crash<C: Communicator>(comm: &C, tokens: &Tokens, root: &Path) {
    let rank = comm.rank();
    let cfg = config(Stage::Zero1, Precision::Fp32, 2);
    let (mut e, mut m) = new_engine(comm, &cfg, 32);
    train(&mut e, &mut m, tokens, 2, 0..K);
    checkpoint::save(&e, root, &SaveOptions::default()).or_fail(rank, "save");
    train(&mut e, &mut m, tokens, 2, K..K + 1);
    let kill = |u: usize| {
        if rank == 1 && u == 1 {
            eprintln!("rank 1: SIGKILL in the middle of the save (after unit {u})");
            // SAFETY: plain libc calls on our own process.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    };
    let opts = SaveOptions {
        after_unit: Some(&kill),
        ..SaveOptions::default()
    };
    let r = checkpoint::save(&e, root, &opts);
    fail(rank, format!("the save survived the kill: {r:?}"));
}

fn after_crash<C: Communicator>(comm: &C, tokens: &Tokens, root: &Path) {
    let rank = comm.rank();
    let latest = std::fs::read_to_string(root.join("latest")).or_fail(rank, "latest");
    if latest.trim() != format!("step-{K}") {
        fail(
            rank,
            format!("latest names '{}', expected step-{K}", latest.trim()),
        );
    }
    let tmp_dirs = |root: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(root)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.to_string_lossy().contains("tmp-step-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    if tmp_dirs(root).is_empty() {
        fail(rank, "no partial directory left by the killed save".into());
    }
    let report = checkpoint::verify(root).or_fail(rank, "verify");
    if !report.problems.is_empty() {
        fail(
            rank,
            format!("previous checkpoint damaged: {:?}", report.problems),
        );
    }
    comm.barrier().or_fail(rank, "barrier");
    let cfg = config(Stage::Zero1, Precision::Fp32, 2);
    let (mut e, mut m) = new_engine(comm, &cfg, 32);
    checkpoint::load(&mut e, root).or_fail(rank, "load");
    train(&mut e, &mut m, tokens, 2, K..K + 1);
    checkpoint::save(&e, root, &SaveOptions::default()).or_fail(rank, "save");
    if !tmp_dirs(root).is_empty() {
        fail(
            rank,
            format!("partial directories remain: {:?}", tmp_dirs(root)),
        );
    }
    if rank == 0 {
        println!("after the crash: latest was step-{K} (verified), partial save removed by the next save");
    }
}

/// The error of a load expected to fail; on ranks that only saw a peer fail, `None`.
fn load_err<C: Communicator>(comm: &C, cfg: &Config, n_embd: usize, dir: &Path) -> CheckpointError {
    let rank = comm.rank();
    let (mut e, _m) = new_engine(comm, cfg, n_embd);
    match checkpoint::load(&mut e, dir) {
        Ok(_) => fail(rank, format!("loading '{}' succeeded", dir.display())),
        Err(e) => e,
    }
}

/// Every rank holds each failing rank's own message (`CheckpointError::Ranks`), so the
/// needles must be in the error on every rank, not only on the rank that failed.
fn expect(rank: usize, err: &CheckpointError, needles: &[&str]) {
    let text = err.to_string();
    if let Some(n) = needles.iter().find(|n| !text.contains(**n)) {
        fail(rank, format!("error '{text}' does not mention '{n}'"));
    }
    println!("rank {rank}: refused as expected: {text}");
}

fn copy_dir(rank: usize, from: &Path, to: &Path) {
    std::fs::create_dir_all(to).or_fail(rank, "mkdir");
    for e in std::fs::read_dir(from).or_fail(rank, "list") {
        let e = e.or_fail(rank, "list");
        std::fs::copy(e.path(), to.join(e.file_name())).or_fail(rank, "copy");
    }
}

fn faults<C: Communicator>(comm: &C, tokens: &Tokens, root: &Path) {
    let rank = comm.rank();
    let cfg = config(Stage::Zero3, Precision::Fp32, 2);
    let (mut e, mut m) = new_engine(comm, &cfg, 32);
    train(&mut e, &mut m, tokens, 2, 0..1);
    let good = root.join("good");
    let keep2 = SaveOptions {
        keep_last: 2,
        ..SaveOptions::default()
    };
    let step1 = checkpoint::save(&e, &good, &keep2).or_fail(rank, "save");

    // Another model (n_embd 48): refused, naming the first parameter that differs.
    let err = load_err(comm, &cfg, 48, &good);
    expect(rank, &err, &["does not fit", "wte", "[64, 48]", "[64, 32]"]);

    // Corrupted, truncated, missing files (prepared by rank 0 on copies).
    let (corrupt, truncated, missing) = (
        root.join("corrupt"),
        root.join("truncated"),
        root.join("missing"),
    );
    if rank == 0 {
        for d in [&corrupt, &truncated, &missing] {
            copy_dir(rank, &step1, d);
        }
        let f = corrupt.join("rank-00001.h5");
        let offset = checkpoint::ShardReader::open(&f)
            .and_then(|h| h.dataset_offset(1, 2))
            .or_fail(rank, "dataset offset")
            .unwrap_or_else(|| fail(rank, "no offset".into()));
        let mut bytes = std::fs::read(&f).or_fail(rank, "read");
        bytes[offset as usize + 8] ^= 0x40;
        std::fs::write(&f, bytes).or_fail(rank, "write");
        let f = truncated.join("rank-00000.h5");
        let len = std::fs::metadata(&f).or_fail(rank, "stat").len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .and_then(|h| h.set_len(len / 2))
            .or_fail(rank, "truncate");
        std::fs::remove_file(missing.join("rank-00001.h5")).or_fail(rank, "remove");
    }
    comm.barrier().or_fail(rank, "barrier");
    // Stage 3 on the same N: rank 1 reads rank-00001.h5 (the corrupted one), rank 0 not.
    let err = load_err(comm, &cfg, 32, &corrupt);
    expect(
        rank,
        &err,
        &["checksum mismatch", "rank-00001.h5", "unit0001/adam_v"],
    );
    let err = load_err(comm, &cfg, 32, &truncated);
    expect(rank, &err, &["rank-00000.h5"]);
    let err = load_err(comm, &cfg, 32, &missing);
    expect(rank, &err, &["rank-00001.h5"]);
    let err = load_err(comm, &cfg, 32, &root.join("nowhere"));
    expect(rank, &err, &["nowhere"]);
    let report = checkpoint::verify(&corrupt).or_fail(rank, "verify");
    if report.problems.len() != 1 {
        fail(rank, format!("verify found {:?}", report.problems));
    }

    // A directory that cannot be created (under a regular file: root ignores chmod).
    let blocker = root.join("blocker");
    if rank == 0 {
        std::fs::write(&blocker, b"not a directory").or_fail(rank, "write");
    }
    comm.barrier().or_fail(rank, "barrier");
    let bad_root = blocker.join("ckpt");
    match checkpoint::save(&e, &bad_root, &SaveOptions::default()) {
        Ok(_) => fail(rank, "saving under a regular file succeeded".into()),
        Err(err) => expect(rank, &err, &["blocker/ckpt"]),
    }

    // Disk full on rank 1 (file size limit): the save fails everywhere, `latest` and the
    // previous checkpoint stay, the temporary directory is removed before save returns.
    train(&mut e, &mut m, tokens, 2, 1..2);
    if rank == 1 {
        // SAFETY: plain libc calls on our own process; SIGXFSZ ignored so write() fails
        // with EFBIG instead of killing us.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: 4096,
                rlim_max: libc::RLIM_INFINITY,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
        }
    }
    let r = checkpoint::save(&e, &good, &keep2);
    if rank == 1 {
        // SAFETY: as above.
        unsafe {
            let lim = libc::rlimit {
                rlim_cur: libc::RLIM_INFINITY,
                rlim_max: libc::RLIM_INFINITY,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
        }
    }
    match r {
        Ok(_) => fail(rank, "a save with a full disk succeeded".into()),
        // The OS error, not HDF5's record of the write (buffer address, byte counts).
        Err(err) => {
            expect(rank, &err, &["rank-00001.h5", "File too large (errno 27)"]);
            if err.to_string().contains("buf = 0x") {
                fail(rank, format!("HDF5's internals in the message: {err}"));
            }
        }
    }
    let latest = std::fs::read_to_string(good.join("latest")).or_fail(rank, "latest");
    if latest.trim() != "step-1" {
        fail(
            rank,
            format!("latest is '{}' after a failed save", latest.trim()),
        );
    }
    let names: Vec<String> = std::fs::read_dir(&good)
        .or_fail(rank, "list")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if names.iter().any(|n| n.starts_with("tmp-")) {
        fail(rank, format!("failed save left {names:?}"));
    }

    // Every rank has looked before the next save creates its own temporary directory.
    comm.barrier().or_fail(rank, "barrier");

    // keep_last = 2: after saves at steps 2, 3, 4 only step-3 and step-4 remain.
    for s in 2..5 {
        checkpoint::save(&e, &good, &keep2).or_fail(rank, "save");
        train(&mut e, &mut m, tokens, 2, s..s + 1);
    }
    comm.barrier().or_fail(rank, "barrier");
    let mut steps: Vec<String> = std::fs::read_dir(&good)
        .or_fail(rank, "list")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    steps.sort();
    if steps != ["step-3", "step-4"] {
        fail(rank, format!("keep_last 2 left {steps:?}"));
    }
    let report = checkpoint::verify(&good).or_fail(rank, "verify");
    if !report.problems.is_empty() || report.meta.step != 4 {
        fail(
            rank,
            format!(
                "latest checkpoint: step {}, problems {:?}",
                report.meta.step, report.problems
            ),
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (_mpi, world) = zero_comm::init().unwrap_or_else(|e| {
        eprintln!("MPI init failed: {e}");
        std::process::exit(2)
    });
    let rank = world.rank();
    if args.len() < 3 {
        fail(rank, "usage: ckpt_scenario MODE DIR [STAGE ROWS]".into());
    }
    let (mode, root) = (args[1].as_str(), PathBuf::from(&args[2]));
    let tokens = MarkovSource::default_corpus(1 << 15, 64).or_fail(rank, "corpus");
    let stage_rows = || {
        if args.len() < 5 {
            fail(rank, format!("{mode} needs STAGE ROWS"));
        }
        (
            stage_arg(rank, &args[3]),
            args[4].parse::<usize>().or_fail(rank, "rows"),
        )
    };
    match mode {
        "resume" => resume(&world, &tokens, &root),
        "save" => {
            let (s, b) = stage_rows();
            save_reference(&world, &tokens, &root, s, b)
        }
        "continue" => {
            let (s, b) = stage_rows();
            continue_run(&world, &tokens, &root, s, b)
        }
        "crash" => crash(&world, &tokens, &root),
        "after-crash" => after_crash(&world, &tokens, &root),
        "faults" => faults(&world, &tokens, &root),
        other => fail(rank, format!("unknown mode '{other}'")),
    }
    world.barrier().or_fail(rank, "barrier");
    println!("{}", zero_tests::ok_line(rank));
}
