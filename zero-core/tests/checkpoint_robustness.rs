//! Checkpoints against what a long run meets on a shared filesystem, with the char LM on
//! thread ranks (`zero_comm::LocalComm`):
//! - leftovers of earlier runs that this user cannot remove (another user's `tmp-step-*`)
//!   never stop a save: they are logged and left;
//! - an `old-step-S-*` copy goes back as `step-S` only when `latest` names `step-S` (an
//!   interrupted replace), and a stale one is removed, never resurrected;
//! - a checkpoint of many more ranks than the open-file limit allows to keep open loads
//!   (stage 0 reads every shard) and consolidates in a child process whose
//!   `ulimit -n` is lowered below the number of shards.
//!
//! The parts that need another user or a lowered limit run this test binary again as a
//! child process (the test named, an environment variable saying which part).

#![cfg(feature = "hdf5")]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::models::char_lm::{CharLm, TokenBatch};
use common::{config, lm_batch, lm_config, SEQ};
use zero_comm::{run_local, CommConfig, Communicator, LocalComm};
use zero_core::checkpoint::{self, SaveOptions, LATEST, MAX_OPEN_SHARDS};
use zero_core::files::entry_names;
use zero_core::{Engine, EngineConfig, Precision, Stage};
use zero_kernels::device::HostDevice;

/// Set in a child: the directory it works in.
const CHILD_SAVE: &str = "ZERO_TEST_CHILD_SAVE";
const CHILD_LOAD: &str = "ZERO_TEST_CHILD_LOAD";

/// Shards of the many-rank checkpoint, and the open-file limit its reader runs under:
/// far fewer than the shards, enough for `MAX_OPEN_SHARDS` and the process's own files.
const MANY: usize = 96;
const FD_LIMIT: usize = 64;

/// Called after each step (a save, or nothing).
type AfterStep<'a> = &'a dyn Fn(&Engine<'_, HostDevice, LocalComm>) -> Result<(), String>;

/// What one rank kept of each unit (master, m, v) and the gathered tensors.
struct Saved {
    units: Vec<zero_core::UnitState>,
    arrays: Vec<(String, ndarray::ArrayD<f32>)>,
}

/// Train the char LM on `comm` up to step `steps` (resuming from `resume` first, if
/// given), calling `save` with the engine after each step.
fn train(
    comm: &LocalComm,
    cfg: &EngineConfig,
    resume: Option<&Path>,
    steps: u64,
    save: AfterStep<'_>,
) -> Result<Saved, String> {
    let dev = HostDevice::new();
    let mut model = CharLm::new(&dev, lm_config()).map_err(|e| e.to_string())?;
    let mut engine = Engine::new(cfg, comm, &dev, &model).map_err(|e| e.to_string())?;
    if let Some(dir) = resume {
        checkpoint::load(&mut engine, dir).map_err(|e| format!("load: {e}"))?;
    }
    let (n, r) = (comm.size(), comm.rank());
    for step in engine.steps_done()..steps {
        let (x, y) = lm_batch(step, 0, r, n, 1);
        let batch = TokenBatch {
            inputs: &x,
            targets: &y,
            seq_len: SEQ,
        };
        engine
            .step(&mut model, std::slice::from_ref(&batch))
            .map_err(|e| e.to_string())?;
        save(&engine)?;
    }
    let units = (0..engine.layout().units.len())
        .map(|u| engine.export_unit(u))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let arrays = engine.master_arrays().map_err(|e| e.to_string())?;
    Ok(Saved { units, arrays })
}

/// Run `f` on `n` thread ranks; every rank's result, or the first failure.
fn on_ranks<T: Send>(
    n: usize,
    f: impl Fn(LocalComm) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    run_local(n, CommConfig::default(), f)
        .into_iter()
        .enumerate()
        .map(|(r, o)| match o {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(format!("rank {r}: {e}")),
            Err(p) => Err(format!("rank {r} panicked: {p:?}")),
        })
        .collect()
}

/// A save into `root` keeping `keep_last`, as a run's loop calls it.
fn save_into<'a>(
    root: &'a Path,
    keep_last: usize,
) -> impl Fn(&Engine<'_, HostDevice, LocalComm>) -> Result<(), String> + 'a {
    move |e| {
        let opts = SaveOptions {
            keep_last,
            ..Default::default()
        };
        checkpoint::save(e, root, &opts)
            .map(drop)
            .map_err(|err| format!("checkpoint after step {} failed: {err}", e.steps_done()))
    }
}

/// This test binary, running test `name` alone with `var` = `arg` in its environment.
fn this_test(cmd: &mut Command, name: &str, var: &str, arg: &Path) {
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(var, arg);
}

fn exe() -> PathBuf {
    std::env::current_exe().expect("the test binary's path")
}

fn latest(root: &Path) -> String {
    std::fs::read_to_string(root.join(LATEST))
        .unwrap()
        .trim()
        .to_string()
}

/// Whether this process may write into a directory it has made read-only (root may).
fn privileged(scratch: &Path) -> bool {
    let probe = scratch.join("probe");
    std::fs::create_dir(&probe).unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o555)).unwrap();
    let can = std::fs::create_dir(probe.join("x")).is_ok();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_dir_all(&probe).unwrap();
    can
}

/// Two saves, as the user who runs them (the child's part when privileged).
fn two_saves(root: &Path) -> Result<(), String> {
    let cfg = config(Stage::Zero1, Precision::Fp32, 1);
    on_ranks(2, |comm| train(&comm, &cfg, None, 2, &save_into(root, 3))).map(drop)
}

/// The audit's case: `tmp-step-5-abc/x` and a stale `old-step-2-ab/x` that this user
/// cannot remove (another user's, in a directory this user may write) used to fail every
/// save ("remove '.../tmp-step-5-abc': Permission denied"). Now both saves succeed, the
/// leftovers stay, and the checkpoints are whole. Privileged, the saves run in a child
/// process as `nobody` (the leftovers then are root's); unprivileged, the leftovers are
/// made read-only instead.
#[test]
fn saves_go_on_past_leftovers_they_cannot_remove() {
    if let Some(root) = std::env::var_os(CHILD_SAVE) {
        two_saves(Path::new(&root)).unwrap();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    std::fs::create_dir(&root).unwrap();
    let leftovers = ["tmp-step-5-abc", "old-step-2-ab"];
    for d in leftovers {
        std::fs::create_dir(root.join(d)).unwrap();
        std::fs::write(root.join(d).join("x"), "left by another user").unwrap();
    }
    if privileged(tmp.path()) {
        // `nobody` must reach the directory (and run this binary: else `output` fails).
        let reachable = tmp
            .path()
            .ancestors()
            .skip(1)
            .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
        if !reachable {
            eprintln!(
                "{} is not reachable by other users: skipped",
                tmp.path().display()
            );
            return;
        }
        // Another user's run: root's leftovers, a directory `nobody` may write into.
        for d in [tmp.path(), root.as_path()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let mut cmd = Command::new(exe());
        this_test(
            &mut cmd,
            "saves_go_on_past_leftovers_they_cannot_remove",
            CHILD_SAVE,
            &root,
        );
        cmd.uid(65534).gid(65534);
        match cmd.output() {
            Ok(out) => assert!(
                out.status.success(),
                "the saves as nobody failed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => {
                eprintln!("cannot run a child as nobody ({e}): skipped");
                return;
            }
        }
    } else {
        for d in leftovers {
            std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(0o555)).unwrap();
        }
        let done = two_saves(&root);
        for d in leftovers {
            std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        done.unwrap();
    }
    // Both saves published; what could not be removed is still there, untouched.
    assert_eq!(latest(&root), "step-2");
    for d in leftovers {
        assert!(root.join(d).join("x").is_file(), "{d}");
    }
    let have = entry_names(&root).unwrap();
    assert!(
        have.contains(&"step-1".to_string()) && have.contains(&"step-2".to_string()),
        "{have:?}"
    );
    let report = checkpoint::verify(&root).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.meta.step, 2);
}

/// Copy a step directory (its files).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A save that crashed between moving `step-2` aside and renaming the new one in leaves
/// `latest` naming a missing `step-2`: a resume reads the moved copy and the next save puts
/// it back. A copy of `step-1` moved aside whose `step-1` retention has removed since is
/// stale: that save removes it, and `step-1` does not come back.
#[test]
fn only_the_step_latest_names_is_restored() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    let aside = tmp.path().join("aside");
    let cfg = config(Stage::Zero2, Precision::Fp32, 1);
    let run = |steps, keep_last| {
        let resume = root.join(LATEST).exists().then_some(root.as_path());
        on_ranks(2, |comm| {
            train(&comm, &cfg, resume, steps, &save_into(&root, keep_last))
        })
        .unwrap();
    };
    run(1, 1);
    copy_dir(&root.join("step-1"), &aside);
    run(2, 1);
    assert_eq!(entry_names(&root).unwrap(), ["latest", "step-2"]);
    // A stale copy of the pruned step 1, and a crash that moved `step-2` aside.
    std::fs::rename(&aside, root.join("old-step-1-5a")).unwrap();
    std::fs::rename(root.join("step-2"), root.join("old-step-2-c0ffee")).unwrap();
    assert_eq!(
        checkpoint::resolve(&root).unwrap(),
        root.join("old-step-2-c0ffee")
    );
    run(3, 3);
    assert_eq!(entry_names(&root).unwrap(), ["latest", "step-2", "step-3"]);
    assert_eq!(latest(&root), "step-3");
    let report = checkpoint::verify(&root.join("step-2")).unwrap();
    assert!(report.problems.is_empty() && report.meta.step == 2);
}

/// A checkpoint of `MANY` ranks (more than `FD_LIMIT` files) loaded on one rank at stage
/// 0, which reads every shard, and consolidated, in a child whose open-file limit is
/// `FD_LIMIT`: both succeed and give what the ranks saved, bit for bit.
#[test]
fn many_shards_load_and_consolidate_under_a_low_open_file_limit() {
    if let Some(dir) = std::env::var_os(CHILD_LOAD) {
        // Both tried, whichever fails: each reads every shard.
        let dir = PathBuf::from(dir);
        let root = dir.join("ckpt");
        let cfg = config(Stage::Zero0, Precision::Fp32, 1);
        let loaded = on_ranks(1, |comm| train(&comm, &cfg, Some(&root), 1, &|_| Ok(())));
        let consolidated = checkpoint::consolidate(&root, &dir.join("model.h5"));
        let saved = match (loaded, consolidated) {
            (Ok(saved), Ok(_)) => saved,
            (l, c) => panic!("load: {:?}\nconsolidate: {:?}", l.err(), c.err()),
        };
        let layout = checkpoint::Meta::read(&root.join("step-1")).unwrap().layout;
        let mut bytes = Vec::new();
        for (s, unit) in saved[0].units.iter().zip(&layout.units) {
            for v in [&s.master, &s.adam_m, &s.adam_v] {
                bytes.extend(v[..unit.numel].iter().flat_map(|x| x.to_le_bytes()));
            }
        }
        std::fs::write(dir.join("loaded.bin"), bytes).unwrap();
        return;
    }
    const { assert!(MAX_OPEN_SHARDS + 16 < FD_LIMIT && FD_LIMIT < MANY) };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    let cfg = config(Stage::Zero1, Precision::Fp32, 1);
    let saved = on_ranks(MANY, |comm| {
        train(&comm, &cfg, None, 1, &save_into(&root, 1))
    })
    .unwrap();
    assert_eq!(
        std::fs::read_dir(root.join("step-1")).unwrap().count(),
        MANY + 1,
        "one shard per rank and the metadata"
    );

    let mut cmd = Command::new("sh");
    cmd.args(["-c", &format!("ulimit -n {FD_LIMIT} && exec \"$0\" \"$@\"")])
        .arg(exe());
    this_test(
        &mut cmd,
        "many_shards_load_and_consolidate_under_a_low_open_file_limit",
        CHILD_LOAD,
        tmp.path(),
    );
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "load and consolidate under ulimit -n {FD_LIMIT} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // What was loaded: every unit whole (stage 0), the saved ranks' blocks joined.
    let loaded: Vec<f32> = std::fs::read(tmp.path().join("loaded.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let layout = {
        let meta = checkpoint::Meta::read(&root.join("step-1")).unwrap();
        meta.layout
    };
    let mut at = 0;
    for (u, unit) in layout.units.iter().enumerate() {
        for kind in 0..3 {
            let mut want = vec![0.0f32; unit.padded_len];
            for s in &saved {
                let part = [&s.units[u].master, &s.units[u].adam_m, &s.units[u].adam_v][kind];
                want[s.units[u].range.clone()].copy_from_slice(part);
            }
            let got = &loaded[at..at + unit.numel];
            at += unit.numel;
            assert_eq!(bits(got), bits(&want[..unit.numel]), "unit {u} kind {kind}");
        }
    }
    assert_eq!(at, loaded.len());

    // What was consolidated: every tensor as the ranks held it.
    let arrays = checkpoint::read_consolidated(&tmp.path().join("model.h5")).unwrap();
    assert_eq!(arrays.len(), saved[0].arrays.len());
    for (name, want) in &saved[0].arrays {
        let got = &arrays[name];
        assert_eq!(got.shape(), want.shape(), "{name}");
        assert_eq!(
            bits(got.as_slice().unwrap()),
            bits(want.as_slice().unwrap()),
            "{name}"
        );
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A load that fails before any state moved (nothing at the path) leaves every engine as
/// it was, so the ranks may train from scratch; one that fails while importing (rank 1's
/// shard is gone) leaves every rank's engine refusing steps and saves alike
/// (`EngineError::ImportPending`: the state is part old, part new), until a load succeeds.
#[test]
fn a_failed_load_leaves_every_engine_usable_or_every_one_refusing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    let cfg = config(Stage::Zero2, Precision::Fp32, 1);
    on_ranks(2, |comm| {
        train(&comm, &cfg, None, 2, &save_into(&root, 3)).map(drop)
    })
    .unwrap();
    let shard = root.join("step-2").join(checkpoint::rank_file(1));
    let kept = tmp.path().join("kept.h5");
    std::fs::rename(&shard, &kept).unwrap();
    let nothing = tmp.path().join("nothing-here");
    let step = |engine: &mut Engine<'_, HostDevice, LocalComm>, model: &mut CharLm<HostDevice>| {
        let (n, r) = (engine.communicator().size(), engine.communicator().rank());
        let (x, y) = lm_batch(engine.steps_done(), 0, r, n, 1);
        let batch = TokenBatch {
            inputs: &x,
            targets: &y,
            seq_len: SEQ,
        };
        engine.step(model, std::slice::from_ref(&batch))
    };
    let shard_back = std::sync::Barrier::new(2);
    on_ranks(2, |comm| {
        let dev = HostDevice::new();
        let mut model = CharLm::new(&dev, lm_config()).map_err(|e| e.to_string())?;
        let mut engine = Engine::new(&cfg, &comm, &dev, &model).map_err(|e| e.to_string())?;
        if checkpoint::load(&mut engine, &nothing).is_ok() || engine.import_pending() {
            return Err("a load of nothing moved the engine's state".into());
        }
        if checkpoint::load(&mut engine, &root).is_ok() || !engine.import_pending() {
            return Err("a load without rank 1's shard left the engine usable".into());
        }
        match step(&mut engine, &mut model) {
            Err(zero_core::EngineError::ImportPending) => {}
            other => return Err(format!("a step after the failed load: {:?}", other.err())),
        }
        let other = tmp.path().join(format!("other-{}", comm.rank()));
        if checkpoint::save(&engine, &other, &SaveOptions::default()).is_ok() {
            return Err("a part-loaded engine was saved".into());
        }
        // The shard back: the load succeeds and the engine steps again.
        if comm.rank() == 0 {
            std::fs::rename(&kept, &shard).map_err(|e| e.to_string())?;
        }
        shard_back.wait();
        checkpoint::load(&mut engine, &root).map_err(|e| format!("the load again: {e}"))?;
        step(&mut engine, &mut model).map_err(|e| format!("a step after it: {e}"))?;
        Ok(())
    })
    .unwrap();
}

/// Copy the files of directory `from` into a new directory `to` (one level deep: a
/// checkpoint root's `latest` and step directories).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// Each rank imports from its own `meta.json`: ranks that read different checkpoints
/// under one path (rank 1's node-local copy is stale: its `latest` names step 1; or it
/// holds step 2 with another `meta.json`) would load a mix of two states. Every rank is
/// refused, naming the ranks and steps, before any state moved: the engines stay usable
/// and hold what they held, and a load of the same files on every rank then succeeds.
#[test]
fn ranks_that_read_different_checkpoints_are_all_refused_before_any_import() {
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("shared");
    let cfg = config(Stage::Zero2, Precision::Fp32, 1);
    on_ranks(2, |comm| {
        train(&comm, &cfg, None, 2, &save_into(&shared, 3)).map(drop)
    })
    .unwrap();
    // Rank 1's stale copy: `latest` names step 1.
    let stale = tmp.path().join("stale");
    copy_tree(&shared, &stale);
    std::fs::write(stale.join(LATEST), "step-1\n").unwrap();
    // Another copy: step 2, its metadata rewritten (the same step, other bytes).
    let edited = tmp.path().join("edited");
    copy_tree(&shared, &edited);
    let meta = edited.join("step-2").join(checkpoint::META_FILE);
    let text = std::fs::read_to_string(&meta).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    std::fs::write(&meta, serde_json::to_string(&value).unwrap()).unwrap();
    for (other, want) in [
        (&stale, "rank 1: step 1"),
        (&edited, "rank 1: step 2 (another meta.json)"),
    ] {
        let outcomes = on_ranks(2, |comm| {
            let dev = HostDevice::new();
            let model = CharLm::new(&dev, lm_config()).map_err(|e| e.to_string())?;
            let mut engine = Engine::new(&cfg, &comm, &dev, &model).map_err(|e| e.to_string())?;
            let before = engine.full_master_f32().map_err(|e| e.to_string())?;
            let path = if comm.rank() == 0 { &shared } else { other };
            let err = match checkpoint::load(&mut engine, path) {
                Ok(_) => return Err("a load of two checkpoints succeeded".into()),
                Err(e) => e,
            };
            if !matches!(err, checkpoint::CheckpointError::Differs { .. }) {
                return Err(format!("not CheckpointError::Differs: {err}"));
            }
            if engine.import_pending() || engine.steps_done() != 0 {
                return Err("the refused load moved the engine's state".into());
            }
            let after = engine.full_master_f32().map_err(|e| e.to_string())?;
            if bits(&after) != bits(&before) {
                return Err("the refused load changed the master weights".into());
            }
            // In step: a load of the same files on every rank follows.
            checkpoint::load(&mut engine, &shared).map_err(|e| format!("the load then: {e}"))?;
            Ok((err.to_string(), engine.steps_done()))
        })
        .unwrap();
        for (rank, (msg, done)) in outcomes.into_iter().enumerate() {
            assert!(
                msg.contains("rank 0: step 2")
                    && msg.contains(want)
                    && msg.contains("mix of two states")
                    && msg.contains("nothing was loaded"),
                "rank {rank}: {msg}"
            );
            assert_eq!(done, 2, "rank {rank}");
        }
    }
}
