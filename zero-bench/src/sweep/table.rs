//! The sweep's table: one row per (point, stage), read from the per-point result files
//! `train --stages ... --json` wrote, written as CSV and JSON.
//!
//! Every number is what the runs measured or their ledgers said; the only value computed
//! here is the scaling efficiency, which compares rows of the same sweep:
//! eff(N) = (tokens/s(N) / N) / (tokens/s(N0) / N0), N0 the smallest N of the same
//! (stage, model, precision, A). Each rank runs its own micro-batches (data parallelism,
//! the global batch grows with N), so perfect scaling is eff = 1.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

use super::point::Point;

/// One stage's part of `train --json`'s report (the fields the sweep uses). JSON has no
/// NaN or infinity, so serde_json writes a non-finite number (the loss of a run whose
/// last fp16 step overflowed) as `null`: read back as NaN, so one such point does not
/// cost the sweep its table.
#[derive(Debug, Deserialize)]
struct StageJson {
    stage: usize,
    steps: usize,
    #[serde(deserialize_with = "nan_if_null")]
    final_loss: f64,
    tokens_per_step: u64,
    #[serde(deserialize_with = "nan_if_null")]
    mean_step_seconds: f64,
    #[serde(deserialize_with = "nan_if_null")]
    tokens_per_s: f64,
    ledger_bytes_per_rank: Vec<u64>,
    state_bytes_per_rank: Vec<u64>,
    #[serde(deserialize_with = "nan_if_null")]
    formula_bytes_per_rank: f64,
    peak_rss_bytes_per_rank: Vec<u64>,
    comm_sent_bytes_per_step: u64,
    comm_plan_bytes_per_step: u64,
}

/// A number, or NaN for the `null` a non-finite one was written as.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// `train --json`'s report with `--stages`.
#[derive(Debug, Deserialize)]
struct ReportJson {
    world: usize,
    stages: Vec<StageJson>,
}

/// One row of the sweep table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// World size.
    pub n: usize,
    /// ZeRO stage 0-3.
    pub stage: usize,
    /// Model preset, or `config`.
    pub model: String,
    /// Precision, or `config`.
    pub precision: String,
    /// Gradient accumulation, or `config`.
    pub grad_accum: String,
    /// Optimizer steps run.
    pub steps: usize,
    /// Loss of the last step.
    pub final_loss: f64,
    /// Tokens of one step's global batch.
    pub tokens_per_step: u64,
    /// Tokens per second (global batch / mean step time).
    pub tokens_per_s: f64,
    /// Mean step time in milliseconds (warm-up step excluded, slowest rank).
    pub step_ms: f64,
    /// Weak-scaling efficiency against the smallest N of the same series (module doc).
    pub scaling_efficiency: f64,
    /// Peak resident set size of each rank (measured; 0 if unknown).
    pub peak_rss_bytes_per_rank: Vec<u64>,
    /// Every byte the engine's ledger holds, per rank.
    pub ledger_bytes_per_rank: Vec<u64>,
    /// Model-state bytes per rank (what the paper's formula counts), from the ledger.
    pub state_bytes_per_rank: Vec<u64>,
    /// The ZeRO paper's model-state bytes per rank.
    pub formula_bytes_per_rank: f64,
    /// Bytes rank 0 sent per step, measured.
    pub comm_sent_bytes_per_step: u64,
    /// Bytes each rank sends per step according to the communication ledger.
    pub comm_plan_bytes_per_step: u64,
}

impl Row {
    /// The series a row belongs to in the plots and the efficiency: all but N.
    pub fn series(&self) -> (usize, &str, &str, &str) {
        (self.stage, &self.model, &self.precision, &self.grad_accum)
    }
}

fn max(v: &[u64]) -> u64 {
    v.iter().copied().max().unwrap_or(0)
}

/// The rows of one result file, checked against the point its name gives.
fn rows_of(path: &Path) -> anyhow::Result<Vec<Row>> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let point = Point::from_file_name(&name)?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let report: ReportJson = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a `train --stages ... --json` report",
            path.display()
        )
    })?;
    if report.world != point.n {
        bail!(
            "{}: the run had {} rank(s) but the file name says N={}",
            path.display(),
            report.world,
            point.n
        );
    }
    Ok(report
        .stages
        .into_iter()
        .map(|s| Row {
            n: point.n,
            stage: s.stage,
            model: point.model.clone(),
            precision: point.precision.clone(),
            grad_accum: point.grad_accum_label(),
            steps: s.steps,
            final_loss: s.final_loss,
            tokens_per_step: s.tokens_per_step,
            tokens_per_s: s.tokens_per_s,
            step_ms: s.mean_step_seconds * 1e3,
            scaling_efficiency: f64::NAN,
            peak_rss_bytes_per_rank: s.peak_rss_bytes_per_rank,
            ledger_bytes_per_rank: s.ledger_bytes_per_rank,
            state_bytes_per_rank: s.state_bytes_per_rank,
            formula_bytes_per_rank: s.formula_bytes_per_rank,
            comm_sent_bytes_per_step: s.comm_sent_bytes_per_step,
            comm_plan_bytes_per_step: s.comm_plan_bytes_per_step,
        })
        .collect())
}

/// What `sweep collect` found in a directory.
pub struct Collected {
    /// Every row of the readable result files, sorted by series then N, with the scaling
    /// efficiency filled in.
    pub rows: Vec<Row>,
    /// Result files that could not be read (partial, foreign, or a run that disagrees
    /// with its name), each with why: left out of the table, never silently.
    pub unreadable: Vec<String>,
}

/// The result files in `dir`: files named as [`Point::file_name`] (a name that starts
/// like one, `n<N>_`, but is not one is reported too; other files are ignored). One that
/// cannot be read is left out and named in [`Collected::unreadable`], so one partial
/// file does not cost the whole table.
pub fn collect(dir: &Path) -> anyhow::Result<Collected> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("reading the sweep directory {}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("listing {}", dir.display()))?
            .path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let looks_like_a_result = name.ends_with(".json")
            && name.strip_prefix('n').is_some_and(|rest| {
                let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                digits > 0 && rest[digits..].starts_with('_')
            });
        if looks_like_a_result {
            files.push(path);
        }
    }
    if files.is_empty() {
        bail!(
            "no result files (n<N>_<model>_<precision>_a<A>.json) in {}",
            dir.display()
        );
    }
    files.sort();
    let mut rows = Vec::new();
    let mut unreadable = Vec::new();
    for f in &files {
        match rows_of(f) {
            Ok(r) => rows.extend(r),
            Err(e) => unreadable.push(crate::logging::chain(&e)),
        }
    }
    Ok(Collected {
        rows: ordered(rows),
        unreadable,
    })
}

/// Every row of the given result files, sorted by series then N, with the scaling
/// efficiency filled in.
pub fn rows_from(files: &[PathBuf]) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for f in files {
        rows.extend(rows_of(f)?);
    }
    Ok(ordered(rows))
}

/// `rows` sorted by series then N, with the scaling efficiency filled in.
fn ordered(mut rows: Vec<Row>) -> Vec<Row> {
    rows.sort_by(|a, b| a.series().cmp(&b.series()).then(a.n.cmp(&b.n)));
    set_efficiency(&mut rows);
    rows
}

/// eff(N) = (tps(N)/N) / (tps(N0)/N0) within each series (module doc); rows sorted.
pub fn set_efficiency(rows: &mut [Row]) {
    let mut i = 0;
    while i < rows.len() {
        let j = i + rows[i..]
            .iter()
            .take_while(|r| r.series() == rows[i].series())
            .count();
        let base = rows[i].tokens_per_s / rows[i].n as f64;
        for r in &mut rows[i..j] {
            r.scaling_efficiency = (r.tokens_per_s / r.n as f64) / base;
        }
        i = j;
    }
}

/// The CSV header; per-rank columns give the largest rank's value.
const HEADER: &str = "n,stage,model,precision,grad_accum,steps,final_loss,tokens_per_step,\
tokens_per_s,step_ms,scaling_efficiency,peak_rss_bytes_max,ledger_bytes_max,state_bytes_max,\
formula_bytes,comm_sent_bytes_per_step,comm_plan_bytes_per_step";

/// The table as CSV (per-rank values: the largest rank's; the JSON has every rank's).
pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from(HEADER);
    out.push('\n');
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{:.6},{},{:.3},{:.4},{:.4},{},{},{},{:.0},{},{}",
            r.n,
            r.stage,
            r.model,
            r.precision,
            r.grad_accum,
            r.steps,
            r.final_loss,
            r.tokens_per_step,
            r.tokens_per_s,
            r.step_ms,
            r.scaling_efficiency,
            max(&r.peak_rss_bytes_per_rank),
            max(&r.ledger_bytes_per_rank),
            max(&r.state_bytes_per_rank),
            r.formula_bytes_per_rank,
            r.comm_sent_bytes_per_step,
            r.comm_plan_bytes_per_step
        );
    }
    out
}

/// A short text version of the table for the terminal.
pub fn text(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4} {:>5} {:<10} {:<6} {:>6} {:>10} {:>9} {:>6} {:>11} {:>11} {:>11} {:>11}",
        "N",
        "stage",
        "model",
        "prec",
        "A",
        "tokens/s",
        "step ms",
        "eff",
        "states B",
        "formula B",
        "peak RSS B",
        "sent B/step"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>4} {:>5} {:<10} {:<6} {:>6} {:>10.0} {:>9.2} {:>6.3} {:>11} {:>11.0} {:>11} {:>11}",
            r.n,
            r.stage,
            r.model,
            r.precision,
            r.grad_accum,
            r.tokens_per_s,
            r.step_ms,
            r.scaling_efficiency,
            max(&r.state_bytes_per_rank),
            r.formula_bytes_per_rank,
            max(&r.peak_rss_bytes_per_rank),
            r.comm_sent_bytes_per_step
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize, stage: usize, tps: f64) -> Row {
        Row {
            n,
            stage,
            model: "tiny".into(),
            precision: "fp32".into(),
            grad_accum: "1".into(),
            steps: 2,
            final_loss: 3.0,
            tokens_per_step: 64 * n as u64,
            tokens_per_s: tps,
            step_ms: 1.0,
            scaling_efficiency: f64::NAN,
            peak_rss_bytes_per_rank: vec![10; n],
            ledger_bytes_per_rank: vec![5; n],
            state_bytes_per_rank: (0..n as u64).collect(),
            formula_bytes_per_rank: 4.0,
            comm_sent_bytes_per_step: 0,
            comm_plan_bytes_per_step: 0,
        }
    }

    #[test]
    fn a_non_finite_loss_written_as_null_reads_back_as_nan() {
        let stage = r#"{"stage": 0, "steps": 2, "final_loss": null, "tokens_per_step": 64,
            "mean_step_seconds": 0.5, "tokens_per_s": 128.0, "ledger_bytes_per_rank": [1],
            "state_bytes_per_rank": [1], "formula_bytes_per_rank": 1.0,
            "peak_rss_bytes_per_rank": [1], "comm_sent_bytes_per_step": 0,
            "comm_plan_bytes_per_step": 0}"#;
        let s: StageJson = serde_json::from_str(stage).expect("null reads as NaN");
        assert!(s.final_loss.is_nan());
        assert_eq!(s.tokens_per_s, 128.0);
    }

    #[test]
    fn efficiency_is_per_rank_throughput_against_the_smallest_n_of_the_series() {
        let mut rows = vec![row(2, 0, 100.0), row(4, 0, 150.0), row(4, 3, 80.0)];
        set_efficiency(&mut rows);
        assert_eq!(rows[0].scaling_efficiency, 1.0);
        assert_eq!(rows[1].scaling_efficiency, 0.75);
        assert_eq!(rows[2].scaling_efficiency, 1.0);
        let csv = csv(&rows);
        assert_eq!(csv.lines().count(), 4);
        assert!(csv
            .lines()
            .nth(2)
            .unwrap()
            .starts_with("4,0,tiny,fp32,1,2,"));
        // state_bytes_max of N=4 is rank 3's.
        assert!(csv.lines().nth(2).unwrap().contains(",10,5,3,4,"));
    }
}
