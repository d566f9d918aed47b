//! Per-step metrics as JSON lines (rank 0): one object per optimizer step, flushed as it
//! is written so a crashed or killed run keeps every step it finished.
//!
//! Fields: `stage`, `step` (counted from 1: the state after it is checkpoint `step-S`),
//! `loss`, `grad_norm`, `lr`, `loss_scale`, `skipped`, `diverged` (the loss guard called
//! the loss divergent), `tokens`, `tokens_per_s`, `step_seconds`, `comm_sent_bytes` {collective kind: bytes
//! this rank sent during the step}, `memory_bytes` {ledger category: bytes this rank
//! holds}, for an engine built on node groups (a run of a stage list where some run uses
//! hpZ or qgZ) `node_comm_sent_bytes` and `cross_comm_sent_bytes` (the same per kind on
//! the node and cross-node groups), and with host-staged communication (`--comm mpi-staged`) `host_staging_bytes`
//! (the staging buffers, host memory beside the device ledger), and where collectives ran as
//! host work left running (`--device host`, the simulated GPU, a CUDA device with
//! `ZERO_CUDA_STAGED=overlap`) `comm_seconds` and `comm_exposed_seconds` (how long they ran,
//! and how much of that held the rank up: `zero_kernels::device::OverlapStats`). Non-finite numbers (an overflowed gradient norm) are written as null.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{json, Map, Value};
use zero_comm::CollectiveKind;
use zero_core::ledger::MemCategory;
use zero_core::StepReport;

/// A metrics file. Nothing at its path changes before the first step is written: a run
/// that fails while setting up (a bad resume, a model that does not fit) leaves an
/// earlier run's file as it was. Until then the lines go to a hidden file beside it,
/// renamed over the path with the first step.
pub struct Metrics {
    path: PathBuf,
    state: State,
    /// Why writing stopped (a full disk...): training goes on, the run ends with exit 1.
    failure: Option<String>,
}

enum State {
    /// The lines kept from a resumed run's file are in `tmp`; `path` is untouched.
    Staged { tmp: PathBuf, out: BufWriter<File> },
    /// Renamed into place; appending.
    Open(BufWriter<File>),
    /// A write failed; nothing more is written.
    Failed,
}

/// `x` as a JSON number, or null when it is not finite.
fn num(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// One step as a JSON object.
pub fn step_json(stage: usize, r: &StepReport, tokens: u64, staging: Option<u64>) -> Value {
    let by_kind = |stats: &zero_comm::CommStats| {
        let mut comm = Map::new();
        for kind in CollectiveKind::ALL {
            if kind != CollectiveKind::Barrier {
                comm.insert(kind.name().into(), json!(stats.get(kind).bytes_sent));
            }
        }
        comm
    };
    let comm = by_kind(&r.comm);
    let mut memory = Map::new();
    for cat in MemCategory::ALL {
        memory.insert(
            cat.name().into(),
            json!(r.memory.get(&cat).copied().unwrap_or(0)),
        );
    }
    let mut line = json!({
        "stage": stage,
        "step": r.step,
        "loss": num(r.loss),
        "grad_norm": num(r.grad_norm),
        "lr": num(r.lr),
        "loss_scale": num(r.loss_scale),
        "skipped": r.skipped,
        "diverged": r.diverged.is_some(),
        "tokens": tokens,
        "tokens_per_s": num(tokens as f64 / r.seconds.max(f64::MIN_POSITIVE)),
        "step_seconds": num(r.seconds),
        "comm_sent_bytes": comm,
        "memory_bytes": memory,
    });
    if let Some(obj) = line.as_object_mut() {
        if let Some(bytes) = staging {
            obj.insert("host_staging_bytes".into(), json!(bytes));
        }
        if r.overlap.tasks > 0 {
            obj.insert("comm_seconds".into(), num(r.overlap.total_seconds));
            obj.insert(
                "comm_exposed_seconds".into(),
                num(r.overlap.exposed_seconds),
            );
        }
        if let Some(g) = &r.node_comm {
            obj.insert(
                "node_comm_sent_bytes".into(),
                Value::Object(by_kind(&g.node)),
            );
            obj.insert(
                "cross_comm_sent_bytes".into(),
                Value::Object(by_kind(&g.cross)),
            );
        }
    }
    line
}

impl Metrics {
    /// A new file at `path` (replacing one there once the first step is written).
    pub fn create(path: &Path) -> anyhow::Result<Metrics> {
        Metrics::staged(path, &[])
    }

    /// Continue `path` for a run resumed after step `step`: the lines of steps up to
    /// `step` stay (a run killed after its last checkpoint may have written later ones,
    /// which the resumed run writes again), then new lines are appended. A missing file
    /// starts empty.
    pub fn resume(path: &Path, step: u64) -> anyhow::Result<Metrics> {
        // A pipe or a device: nothing to keep, and reading it could wait forever.
        if super::outputs::is_special(path) {
            return Metrics::staged(path, &[]);
        }
        let kept: Vec<String> = match std::fs::read_to_string(path) {
            Ok(text) => text
                .lines()
                .filter(|l| {
                    serde_json::from_str::<Value>(l)
                        .ok()
                        .and_then(|v| v["step"].as_u64())
                        .is_some_and(|s| s <= step)
                })
                .map(str::to_string)
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("reading the metrics file {}", path.display()))
            }
        };
        Metrics::staged(path, &kept)
    }

    /// `lines` written to a hidden file beside `path` (with the process id, as
    /// checkpoints do): this also checks now, before step 1, that the directory takes
    /// files.
    fn staged(path: &Path, lines: &[String]) -> anyhow::Result<Metrics> {
        // Not a plain file (a pipe, a terminal, /dev/stdout): nothing to rename over,
        // write to it directly.
        if super::outputs::is_special(path) {
            let f = std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .with_context(|| format!("opening the metrics file {}", path.display()))?;
            return Ok(Metrics {
                path: path.to_path_buf(),
                state: State::Open(BufWriter::new(f)),
                failure: None,
            });
        }
        // A link to a file: replace the file it names, not the link.
        let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let path = target.as_path();
        let name = path
            .file_name()
            .map_or("metrics".into(), |n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(".{name}.partial-{}", std::process::id()));
        let mut out = File::create(&tmp).map(BufWriter::new).with_context(|| {
            format!(
                "creating the metrics file {} (beside it: {})",
                path.display(),
                tmp.display()
            )
        })?;
        let written = lines
            .iter()
            .try_for_each(|l| writeln!(out, "{l}"))
            .and_then(|_| out.flush());
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("writing {}", tmp.display()));
        }
        Ok(Metrics {
            path: path.to_path_buf(),
            state: State::Staged { tmp, out },
            failure: None,
        })
    }

    /// Append one step. A failure to write is logged, not returned: losing the metrics
    /// must not lose the training (its checkpoints); [`Self::failure`] says it at the end.
    pub fn write(&mut self, stage: usize, r: &StepReport, tokens: u64, staging: Option<u64>) {
        let line = step_json(stage, r, tokens, staging).to_string();
        if let Err(e) = self.append(&line) {
            let why = format!(
                "writing {} failed at step {} ({}); the steps after it are not in it",
                self.path.display(),
                r.step,
                crate::logging::chain(&e)
            );
            log::error!("{why}; training goes on, and the run will exit 1");
            self.failure = Some(why);
            if let State::Staged { tmp, .. } = &self.state {
                let _ = std::fs::remove_file(tmp);
            }
            self.state = State::Failed;
        }
    }

    fn append(&mut self, line: &str) -> anyhow::Result<()> {
        match &mut self.state {
            State::Failed => Ok(()),
            State::Open(out) => writeln!(out, "{line}")
                .and_then(|_| out.flush())
                .map_err(Into::into),
            State::Staged { tmp, out } => {
                writeln!(out, "{line}").and_then(|_| out.flush())?;
                std::fs::rename(&*tmp, &self.path)
                    .with_context(|| format!("renaming {} into place", tmp.display()))?;
                // The handle follows the file through the rename.
                let State::Staged { out, .. } = std::mem::replace(&mut self.state, State::Failed)
                else {
                    unreachable!("matched Staged above")
                };
                self.state = State::Open(out);
                Ok(())
            }
        }
    }

    /// Why the file stopped being written, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }
}

impl Drop for Metrics {
    /// A run that wrote no step leaves no hidden file behind.
    fn drop(&mut self) {
        if let State::Staged { tmp, .. } = &self.state {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use zero_kernels::device::OverlapStats;

    #[test]
    fn a_step_has_every_field_and_nan_is_null() {
        let r = StepReport {
            node_comm: None,
            step: 3,
            loss: 2.5,
            grad_norm: f64::INFINITY,
            lr: 1e-3,
            loss_scale: 65536.0,
            skipped: true,
            diverged: None,
            seconds: 0.5,
            comm: Default::default(),
            overlap: OverlapStats {
                tasks: 2,
                exposed_seconds: 0.25,
                total_seconds: 1.0,
            },
            memory: BTreeMap::from([(MemCategory::Params, 10)]),
        };
        let v = step_json(2, &r, 1024, None);
        assert_eq!(v["stage"], 2);
        assert_eq!(v["step"], 3);
        assert_eq!(v["grad_norm"], Value::Null);
        assert_eq!(v["diverged"], false);
        assert_eq!(v["tokens_per_s"], 2048.0);
        assert_eq!(v["memory_bytes"]["params"], 10);
        assert_eq!(v["memory_bytes"]["adam_v"], 0);
        assert_eq!(v["comm_sent_bytes"]["all_gather"], 0);
        assert!(v["comm_sent_bytes"].get("barrier").is_none());
        assert!(v.get("host_staging_bytes").is_none());
        assert_eq!(v["comm_seconds"], 1.0);
        assert_eq!(v["comm_exposed_seconds"], 0.25);
        let staged = step_json(2, &r, 1024, Some(4096));
        assert_eq!(staged["host_staging_bytes"], 4096);
    }

    #[test]
    fn a_resumed_run_keeps_the_steps_up_to_its_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let lines: Vec<String> = (1..=6).map(|s| format!("{{\"step\":{s}}}")).collect();
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let mut m = Metrics::resume(&path, 4).unwrap();
        let r = StepReport {
            node_comm: None,
            step: 5,
            loss: 1.0,
            grad_norm: 1.0,
            lr: 1e-3,
            loss_scale: 1.0,
            skipped: false,
            diverged: None,
            seconds: 0.1,
            comm: Default::default(),
            overlap: OverlapStats::default(),
            memory: BTreeMap::new(),
        };
        // Nothing changes before the first step is written.
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 6);
        m.write(0, &r, 1, None);
        assert!(m.failure().is_none());
        drop(m);
        let steps: Vec<u64> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["step"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(steps, [1, 2, 3, 4, 5]);
        // A run that fails before its first step leaves no file and no hidden one.
        let fresh = dir.path().join("new.jsonl");
        drop(Metrics::resume(&fresh, 3).unwrap());
        drop(Metrics::create(&fresh).unwrap());
        assert!(!fresh.exists());
        let left = zero_core::files::entry_names(dir.path()).unwrap();
        assert_eq!(left.len(), 1, "{left:?}");
        // A device or a link is written through, never replaced.
        let mut null = Metrics::create(Path::new("/dev/null")).unwrap();
        null.write(0, &r, 1, None);
        assert!(null.failure().is_none());
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let mut through = Metrics::resume(&link, 5).unwrap();
        through.write(0, &r, 1, None);
        drop(through);
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 6);
        std::fs::remove_file(&link).unwrap();
        // A directory that does not exist is an error before step 1.
        assert!(Metrics::create(&dir.path().join("absent").join("m.jsonl")).is_err());
    }
}
