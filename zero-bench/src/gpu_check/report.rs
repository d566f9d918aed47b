//! The check report: one line per check as it finishes (so a run cut short by the
//! script's timeout still shows how far it got), a summary, and the same as JSON,
//! rewritten after every check for the same reason.

use crate::logging::outln;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

/// How a check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Within its tolerance or goal.
    Ok,
    /// Outside it, or the check could not run (an error).
    Fail,
    /// Not judged here (a simulated device's timings, a mode the device lacks, no time left).
    Skip,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        }
    }
}

/// What a check holds a device to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Numbers against a reference.
    Correctness,
    /// A speed goal.
    Performance,
}

/// One check's result.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// kernel, adamw-bandwidth, gpt-fwd-bwd, llama-fwd-bwd, train-4-ranks, throughput.
    pub group: &'static str,
    /// What was checked, e.g. "matmul f32 x W^T [128x64 x 64x256]".
    pub name: String,
    /// How it ended.
    pub status: Status,
    /// Correctness or performance.
    pub kind: Kind,
    /// The figure judged (an error, a ratio, MFU), if any.
    pub value: Option<f64>,
    /// Its limit: the largest error allowed, or the smallest ratio wanted.
    pub limit: Option<f64>,
    /// The rest of the line: the metric, the tolerance's reason, other figures.
    pub detail: String,
    /// Extra figures for the JSON only (per-tensor errors, per-step losses).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub data: serde_json::Value,
    /// Seconds the check took.
    pub seconds: f64,
}

impl Check {
    /// A check of `group`/`name`; `value` judged against `limit` by the caller.
    pub fn new(group: &'static str, name: impl Into<String>, kind: Kind) -> Self {
        Check {
            group,
            name: name.into(),
            status: Status::Skip,
            kind,
            value: None,
            limit: None,
            detail: String::new(),
            data: serde_json::Value::Null,
            seconds: 0.0,
        }
    }

    /// An error as at most `limit`: ok when `value <= limit` (NaN fails).
    pub fn at_most(mut self, value: f64, limit: f64, detail: impl Into<String>) -> Self {
        self.status = if value <= limit {
            Status::Ok
        } else {
            Status::Fail
        };
        self.value = Some(value);
        self.limit = Some(limit);
        self.detail = detail.into();
        self
    }

    /// A goal of at least `limit`: ok when `value >= limit`.
    pub fn at_least(mut self, value: f64, limit: f64, detail: impl Into<String>) -> Self {
        self.status = if value >= limit {
            Status::Ok
        } else {
            Status::Fail
        };
        self.value = Some(value);
        self.limit = Some(limit);
        self.detail = detail.into();
        self
    }

    /// Not judged, with why.
    pub fn skip(mut self, why: impl Into<String>) -> Self {
        self.status = Status::Skip;
        self.detail = why.into();
        self
    }

    /// Could not run: the error is the detail.
    pub fn fail(mut self, err: impl std::fmt::Display) -> Self {
        self.status = Status::Fail;
        self.detail = format!("error: {err}");
        self
    }

    /// Extra figures for the JSON.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = data;
        self
    }

    fn line(&self) -> String {
        format!(
            "{:<4}  {:<15} {}: {}",
            self.status.label(),
            self.group,
            self.name,
            self.detail
        )
    }
}

/// Counts of a report.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Summary {
    /// Checks within tolerance or goal.
    pub ok: usize,
    /// Checks outside (correctness and performance together).
    pub fail: usize,
    /// Of `fail`, the performance goals missed.
    pub fail_performance: usize,
    /// Checks not judged.
    pub skip: usize,
}

#[derive(Serialize)]
struct Document<'a> {
    tool: &'static str,
    version: &'static str,
    device: &'a str,
    simulated: bool,
    quick: bool,
    reference: &'a str,
    seconds: f64,
    finished: bool,
    summary: Summary,
    checks: &'a [Check],
}

/// The checks so far, printed and saved as they come.
pub struct Report {
    device: String,
    simulated: bool,
    quick: bool,
    reference: String,
    json: PathBuf,
    started: Instant,
    checks: Vec<Check>,
}

impl Report {
    /// A report saved as `out/gpu-check.json`.
    pub fn new(device: String, simulated: bool, quick: bool, reference: &Path, out: &Path) -> Self {
        Report {
            device,
            simulated,
            quick,
            reference: reference.display().to_string(),
            json: out.join("gpu-check.json"),
            started: Instant::now(),
            checks: Vec::new(),
        }
    }

    /// Where the JSON goes.
    pub fn json_path(&self) -> &Path {
        &self.json
    }

    /// Seconds since the report began.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Record, print and save one check.
    pub fn add(&mut self, check: Check) -> anyhow::Result<()> {
        outln!("{}", check.line());
        self.checks.push(check);
        self.save(false)
    }

    /// The counts.
    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for c in &self.checks {
            match c.status {
                Status::Ok => s.ok += 1,
                Status::Skip => s.skip += 1,
                Status::Fail => {
                    s.fail += 1;
                    if c.kind == Kind::Performance {
                        s.fail_performance += 1;
                    }
                }
            }
        }
        s
    }

    /// The checks recorded.
    pub fn checks(&self) -> &[Check] {
        &self.checks
    }

    /// Write the JSON (`finished`: the run got to its summary).
    pub fn save(&self, finished: bool) -> anyhow::Result<()> {
        let doc = Document {
            tool: "zero-bench gpu-check",
            version: env!("CARGO_PKG_VERSION"),
            device: &self.device,
            simulated: self.simulated,
            quick: self.quick,
            reference: &self.reference,
            seconds: self.elapsed(),
            finished,
            summary: self.summary(),
            checks: &self.checks,
        };
        let text = serde_json::to_string_pretty(&doc).context("serialising the results")?;
        // Write then rename, so a reader (or a kill mid-write) never sees half a file.
        let tmp = self.json.with_extension("json.tmp");
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.json)
            .with_context(|| format!("renaming {} to {}", tmp.display(), self.json.display()))
    }
}
