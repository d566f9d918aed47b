//! The check report: one line per check as it finishes (so a run cut short by the
//! script's timeout still shows how far it got), a summary, and the same as JSON,
//! rewritten after every check (and before each long one, naming it) for the same
//! reason.

use crate::logging::outln;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// How a check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Numbers against a reference.
    Correctness,
    /// A speed goal.
    Performance,
}

/// A figure for the JSON: a number, or "inf", "-inf" or "NaN" (which serde_json would
/// write as `null`, the same as "no figure": the failures that matter most would read
/// as nothing).
pub fn figure(x: f64) -> Value {
    if x.is_finite() {
        Value::from(x)
    } else if x.is_nan() {
        Value::from("NaN")
    } else if x > 0.0 {
        Value::from("inf")
    } else {
        Value::from("-inf")
    }
}

/// [`figure`] of each.
pub fn figures(xs: &[f64]) -> Value {
    Value::Array(xs.iter().map(|&x| figure(x)).collect())
}

fn serialize_figure<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        None => s.serialize_none(),
        Some(x) => figure(*x).serialize(s),
    }
}

fn deserialize_figure<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::Number(n) => Ok(n.as_f64()),
        Value::String(s) => match s.as_str() {
            "inf" => Ok(Some(f64::INFINITY)),
            "-inf" => Ok(Some(f64::NEG_INFINITY)),
            "NaN" => Ok(Some(f64::NAN)),
            _ => Err(serde::de::Error::custom(format!("'{s}' is not a figure"))),
        },
        other => Err(serde::de::Error::custom(format!("{other} is not a figure"))),
    }
}

/// One check's result.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Check {
    /// kernel, adamw-bandwidth, gpt-fwd-bwd, llama-fwd-bwd, train-4-ranks, throughput, ...
    pub group: String,
    /// What was checked, e.g. "matmul f32 x W^T [128x64 x 64x256]".
    pub name: String,
    /// How it ended.
    pub status: Status,
    /// Correctness or performance.
    pub kind: Kind,
    /// The figure judged (an error, a ratio, MFU), if any ([`figure`]).
    #[serde(
        serialize_with = "serialize_figure",
        deserialize_with = "deserialize_figure",
        default
    )]
    pub value: Option<f64>,
    /// Its limit: the largest error allowed, or the smallest ratio wanted.
    #[serde(
        serialize_with = "serialize_figure",
        deserialize_with = "deserialize_figure",
        default
    )]
    pub limit: Option<f64>,
    /// The rest of the line: the metric, the tolerance's reason, other figures.
    pub detail: String,
    /// Not run (or not finished) because the time budget ran out: the run is incomplete.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub out_of_time: bool,
    /// Extra figures for the JSON only (per-tensor errors, per-step losses).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub data: Value,
    /// Seconds the check took.
    pub seconds: f64,
}

/// The detail of a check skipped because the budget is spent.
pub fn no_time(budget_s: f64) -> String {
    format!("not run: out of time (budget {budget_s:.0} s)")
}

impl Check {
    /// A check of `group`/`name`; `value` judged against `limit` by the caller.
    pub fn new(group: impl Into<String>, name: impl Into<String>, kind: Kind) -> Self {
        Check {
            group: group.into(),
            name: name.into(),
            status: Status::Skip,
            kind,
            value: None,
            limit: None,
            detail: String::new(),
            out_of_time: false,
            data: Value::Null,
            seconds: 0.0,
        }
    }

    /// An error as at most `limit`: ok when `value <= limit` (NaN fails). The detail
    /// states the comparison as ` <= `; a failed check's first ` <= ` reads ` > `, so
    /// that the line does not contradict its status.
    pub fn at_most(mut self, value: f64, limit: f64, detail: impl Into<String>) -> Self {
        let ok = value <= limit;
        self.status = if ok { Status::Ok } else { Status::Fail };
        self.value = Some(value);
        self.limit = Some(limit);
        let detail = detail.into();
        self.detail = if ok {
            detail
        } else {
            detail.replacen(" <= ", " > ", 1)
        };
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

    /// Not run, or cut short, for lack of time ([`no_time`] says it the usual way): a
    /// skip that makes the run incomplete.
    pub fn out_of_time(mut self, why: impl Into<String>) -> Self {
        self.status = Status::Skip;
        self.out_of_time = true;
        self.detail = why.into();
        self
    }

    /// Could not run: the error is the detail.
    pub fn fail(mut self, err: impl std::fmt::Display) -> Self {
        self.status = Status::Fail;
        self.detail = format!("error: {err}");
        self
    }

    /// The detail with `what` said first (after "error: "): which of several runs the
    /// line is about.
    pub fn prefixed(mut self, what: &str) -> Self {
        self.detail = match self.detail.strip_prefix("error: ") {
            Some(rest) => format!("error: {what}{rest}"),
            None => format!("{what}{}", self.detail),
        };
        self
    }

    /// Extra figures for the JSON.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = data;
        self
    }

    /// The line printed for it.
    pub fn line(&self) -> String {
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
    /// Of `skip`, the checks not run (or cut short) for lack of time.
    pub out_of_time: usize,
}

/// What the header says besides the device: the run's settings and the environment.
#[derive(Clone, Debug)]
pub struct Head {
    /// The device under test, in words.
    pub device: String,
    /// Whether it is the simulated GPU.
    pub simulated: bool,
    /// `--quick`.
    pub quick: bool,
    /// The prepared reference's folder.
    pub reference: PathBuf,
    /// `--budget-s`.
    pub budget_s: f64,
    /// Versions and settings found here (driver, CUDA, cuBLASLt, NCCL, glibc, timeout).
    pub environment: Value,
}

#[derive(Serialize)]
struct Document<'a> {
    tool: &'static str,
    version: &'static str,
    device: &'a str,
    simulated: bool,
    quick: bool,
    reference: String,
    budget_s: f64,
    environment: &'a Value,
    seconds: f64,
    /// The run got to its summary.
    finished: bool,
    /// Finished, and no check was left out for lack of time.
    complete: bool,
    /// What was running when this was written (a run killed from outside names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    running: Option<&'a str>,
    summary: Summary,
    checks: Vec<&'a Check>,
}

/// What of a saved report another process reads back (`mod.rs`'s group processes).
#[derive(Debug, Deserialize)]
pub struct Saved {
    /// Its checks.
    pub checks: Vec<Check>,
    /// What was running when it was written.
    #[serde(default)]
    pub running: Option<String>,
    /// Whether its run got to the end.
    #[serde(default)]
    pub finished: bool,
}

impl Saved {
    /// Read a report [`Report::save`] wrote.
    pub fn load(path: &Path) -> anyhow::Result<Saved> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }
}

/// The checks so far, printed and saved as they come.
pub struct Report {
    head: Head,
    json: PathBuf,
    started: Instant,
    checks: Vec<Check>,
    /// Checks of a group still running in another process (saved after `checks`).
    pending: Vec<Check>,
    running: Option<String>,
}

impl Report {
    /// A report saved as `json`, its clock (the budget's) started at `started`: the
    /// process's start, so that the budget also covers what ran before the report (the
    /// device's first open, with its PTX compiled).
    pub fn new_at(head: Head, json: PathBuf, started: Instant) -> Self {
        Report {
            head,
            json,
            started,
            checks: Vec::new(),
            pending: Vec::new(),
            running: None,
        }
    }

    /// The header.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// Where the JSON goes.
    pub fn json_path(&self) -> &Path {
        &self.json
    }

    /// Seconds since the report began.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Say (in the JSON) that `what` runs now, so that a run killed from outside names
    /// it.
    pub fn start(&mut self, what: impl Into<String>) -> anyhow::Result<()> {
        self.running = Some(what.into());
        self.save(false)
    }

    /// Record, print and save one check.
    pub fn add(&mut self, check: Check) -> anyhow::Result<()> {
        outln!("{}", check.line());
        self.checks.push(check);
        self.running = None;
        self.save(false)
    }

    /// The checks of a group that runs in another process (which printed them), so
    /// far; saved with the report until [`Report::adopt`] takes them in.
    pub fn set_pending(
        &mut self,
        checks: Vec<Check>,
        running: Option<String>,
    ) -> anyhow::Result<()> {
        self.pending = checks;
        self.running = running;
        self.save(false)
    }

    /// Take in the pending checks (printed already), then `more` (printed here).
    pub fn adopt(&mut self, more: Vec<Check>) -> anyhow::Result<()> {
        self.checks.append(&mut self.pending);
        self.running = None;
        for c in more {
            outln!("{}", c.line());
            self.checks.push(c);
        }
        self.save(false)
    }

    /// The counts.
    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for c in self.checks.iter().chain(&self.pending) {
            match c.status {
                Status::Ok => s.ok += 1,
                Status::Skip => {
                    s.skip += 1;
                    if c.out_of_time {
                        s.out_of_time += 1;
                    }
                }
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
        let summary = self.summary();
        let doc = Document {
            tool: "zero-bench gpu-check",
            version: env!("CARGO_PKG_VERSION"),
            device: &self.head.device,
            simulated: self.head.simulated,
            quick: self.head.quick,
            reference: self.head.reference.display().to_string(),
            budget_s: self.head.budget_s,
            environment: &self.head.environment,
            seconds: self.elapsed(),
            finished,
            complete: finished && summary.out_of_time == 0,
            running: if finished {
                None
            } else {
                self.running.as_deref()
            },
            summary,
            checks: self.checks.iter().chain(&self.pending).collect(),
        };
        let text = serde_json::to_string_pretty(&doc).context("serialising the results")?;
        // Write then rename, so a reader (or a kill mid-write) never sees half a file.
        let tmp = self.json.with_extension("json.tmp");
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.json)
            .with_context(|| format!("renaming {} to {}", tmp.display(), self.json.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Non-finite figures are written as words, not `null`, and read back.
    #[test]
    fn non_finite_figures_survive_the_json() {
        let c = Check::new("kernel", "x", Kind::Correctness)
            .at_most(f64::INFINITY, 1e-5, "rel inf <= 1e-5")
            .with_data(figures(&[1.0, f64::NAN, f64::NEG_INFINITY]));
        assert_eq!(c.status, Status::Fail);
        assert_eq!(c.detail, "rel inf > 1e-5");
        let text = serde_json::to_string(&c).unwrap();
        assert!(text.contains(r#""value":"inf""#), "{text}");
        assert!(text.contains(r#"[1.0,"NaN","-inf"]"#), "{text}");
        let back: Check = serde_json::from_str(&text).unwrap();
        assert_eq!(back.value, Some(f64::INFINITY));
        assert_eq!(back.limit, Some(1e-5));
        let nan = Check::new("kernel", "y", Kind::Correctness).at_most(f64::NAN, 0.0, "");
        let back: Check = serde_json::from_str(&serde_json::to_string(&nan).unwrap()).unwrap();
        assert!(back.value.is_some_and(f64::is_nan));
    }

    /// A check left out for time is counted apart, and the run reads as incomplete.
    #[test]
    fn out_of_time_is_counted_apart() {
        let dir = tempfile::tempdir().unwrap();
        let head = Head {
            device: "test".into(),
            simulated: true,
            quick: true,
            reference: dir.path().to_path_buf(),
            budget_s: 1.0,
            environment: Value::Null,
        };
        let mut r = Report::new_at(head, dir.path().join("r.json"), Instant::now());
        r.add(Check::new("kernel", "a", Kind::Correctness).at_most(0.0, 0.0, "ok"))
            .unwrap();
        r.add(Check::new("kernel", "b", Kind::Correctness).skip("no bf16"))
            .unwrap();
        r.add(Check::new("throughput", "c", Kind::Performance).out_of_time(no_time(1.0)))
            .unwrap();
        let s = r.summary();
        assert_eq!((s.ok, s.skip, s.out_of_time, s.fail), (1, 2, 1, 0));
        r.save(true).unwrap();
        let text = std::fs::read_to_string(dir.path().join("r.json")).unwrap();
        assert!(text.contains(r#""complete": false"#), "{text}");
        let saved = Saved::load(&dir.path().join("r.json")).unwrap();
        assert_eq!(saved.checks.len(), 3);
        assert!(saved.checks[2].out_of_time && saved.finished);
    }
}
