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
//! host work (`--device host`) `comm_seconds` and `comm_exposed_seconds` (how long they ran,
//! and how much of that held the rank up: `zero_kernels::device::OverlapStats`). Non-finite numbers (an overflowed gradient norm) are written as null.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{json, Map, Value};
use zero_comm::CollectiveKind;
use zero_core::ledger::MemCategory;
use zero_core::StepReport;

/// An open metrics file.
pub struct Metrics {
    path: PathBuf,
    out: BufWriter<File>,
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
    /// Create (truncate) `path`.
    pub fn create(path: &Path) -> anyhow::Result<Metrics> {
        let f = File::create(path)
            .with_context(|| format!("creating the metrics file {}", path.display()))?;
        Ok(Metrics {
            path: path.to_path_buf(),
            out: BufWriter::new(f),
        })
    }

    /// Continue `path` for a run resumed after step `step`: the lines of steps up to
    /// `step` stay (a run killed after its last checkpoint may have written later ones,
    /// which the resumed run writes again), then new lines are appended. The kept lines
    /// are rewritten through a temporary file renamed into place. A missing file is
    /// created.
    pub fn resume(path: &Path, step: u64) -> anyhow::Result<Metrics> {
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
        // Beside it (an atomic rename), hidden, with the process id: as checkpoints do.
        let name = path
            .file_name()
            .map_or("metrics".into(), |n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(".{name}.partial-{}", std::process::id()));
        let mut text = kept.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, path))
            .with_context(|| format!("rewriting the metrics file {}", path.display()))?;
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("opening the metrics file {}", path.display()))?;
        Ok(Metrics {
            path: path.to_path_buf(),
            out: BufWriter::new(f),
        })
    }

    /// Append one step.
    pub fn write(
        &mut self,
        stage: usize,
        r: &StepReport,
        tokens: u64,
        staging: Option<u64>,
    ) -> anyhow::Result<()> {
        let line = step_json(stage, r, tokens, staging).to_string();
        writeln!(self.out, "{line}")
            .and_then(|_| self.out.flush())
            .with_context(|| format!("writing {}", self.path.display()))
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
        m.write(0, &r, 1, None).unwrap();
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
        let fresh = dir.path().join("new.jsonl");
        Metrics::resume(&fresh, 3).unwrap();
        assert_eq!(std::fs::read_to_string(&fresh).unwrap(), "");
    }
}
