//! The sweep's table: one row per (point, stage), read from the per-point result files
//! `train --stages ... --json` wrote, written as CSV and JSON.
//!
//! Every number is what the runs measured or their ledgers said; the only value computed
//! here is the scaling efficiency, which compares rows of the same sweep:
//! eff(N) = (tokens/s(N) / N) / (tokens/s(N0) / N0), N0 the smallest N of the whole table
//! (`base_n`), tokens/s(N0) that of the same (stage, model, precision, A). Each rank runs
//! its own micro-batches (data parallelism, the global batch grows with N), so perfect
//! scaling is eff = 1. A series whose N0 row failed has no efficiency (NaN): measured
//! against another N it would not compare with the other series.
//!
//! A stage that did not finish is a row too, `status` "failed" with why (`failure`), its
//! measured numbers empty fields in the CSV (in the JSON: `null` for the real numbers,
//! 0 for the counts, `[]` per rank): a point whose job stopped at a later stage keeps the rows of the
//! stages that finished (train rewrites its report after each), the rest are marked.

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
    /// Absent from older reports.
    #[serde(default)]
    skipped_steps: u64,
}

/// A number, or NaN for the `null` a non-finite one was written as.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// `train --json`'s report with `--stages`. `stages_requested` and `stopped` are absent
/// from reports of older versions, which were written only once every stage finished.
#[derive(Debug, Deserialize)]
struct ReportJson {
    world: usize,
    stages: Vec<StageJson>,
    #[serde(default)]
    stages_requested: Option<Vec<usize>>,
    #[serde(default)]
    stopped: Option<String>,
}

/// A row's `status`: the stage finished.
pub const OK: &str = "ok";
/// A row's `status`: the stage did not finish (`failure` says why).
pub const FAILED: &str = "failed";

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
    /// Mean step time in milliseconds (warm-up step excluded when there are others,
    /// slowest rank).
    pub step_ms: f64,
    /// Weak-scaling efficiency against `base_n` (module doc); NaN where the series has
    /// no finished row at `base_n`.
    pub scaling_efficiency: f64,
    /// The N the efficiency is measured against: the smallest N of the table.
    pub base_n: usize,
    /// Steps skipped on every rank (inf/NaN gradients, as fp16's loss scaling finds
    /// while it settles): no optimizer update, so they are cheaper than the others.
    pub skipped_steps: u64,
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
    /// [`OK`], or [`FAILED`]: the stage did not finish, its numbers are not measurements
    /// (NaN or 0 here; empty fields in the CSV).
    pub status: &'static str,
    /// Why the stage did not finish (`None` when it did).
    pub failure: Option<String>,
}

impl Row {
    /// The series a row belongs to in the plots and the efficiency: all but N.
    pub fn series(&self) -> (usize, &str, &str, &str) {
        (self.stage, &self.model, &self.precision, &self.grad_accum)
    }

    /// The stage finished: its numbers are measured.
    pub fn finished(&self) -> bool {
        self.status == OK
    }

    /// The row of `point`'s `stage` that did not finish, and why.
    fn failed(point: &Point, stage: usize, why: &str) -> Row {
        Row {
            n: point.n,
            stage,
            model: point.model.clone(),
            precision: point.precision.clone(),
            grad_accum: point.grad_accum_label(),
            steps: 0,
            final_loss: f64::NAN,
            tokens_per_step: 0,
            tokens_per_s: f64::NAN,
            step_ms: f64::NAN,
            scaling_efficiency: f64::NAN,
            base_n: 0,
            skipped_steps: 0,
            peak_rss_bytes_per_rank: Vec::new(),
            ledger_bytes_per_rank: Vec::new(),
            state_bytes_per_rank: Vec::new(),
            formula_bytes_per_rank: f64::NAN,
            comm_sent_bytes_per_step: 0,
            comm_plan_bytes_per_step: 0,
            status: FAILED,
            failure: Some(one_line(why)),
        }
    }
}

/// `text` on one line (a reason quoted from a log may span several).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn max(v: &[u64]) -> u64 {
    v.iter().copied().max().unwrap_or(0)
}

/// The point a result file's name gives.
fn point_of(path: &Path) -> anyhow::Result<Point> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Point::from_file_name(&name)
}

/// What one result file holds.
struct PointRows {
    /// A row per stage of its stage list: the finished stages' measured, the others
    /// failed.
    rows: Vec<Row>,
    /// Why the run stopped before its last stage (`None`: it finished).
    stopped: Option<String>,
    /// The stages the run was asked for.
    requested: Vec<usize>,
}

/// The rows of one result file, checked against the point its name gives. Stages the
/// run was asked for but did not finish are failed rows, with `why` or else the
/// report's own reason.
fn rows_of(path: &Path, why: Option<&str>) -> anyhow::Result<PointRows> {
    let point = point_of(path)?;
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
    let finished: Vec<usize> = report.stages.iter().map(|s| s.stage).collect();
    let requested = report.stages_requested.unwrap_or_else(|| finished.clone());
    let mut rows: Vec<Row> = report
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
            base_n: 0,
            skipped_steps: s.skipped_steps,
            peak_rss_bytes_per_rank: s.peak_rss_bytes_per_rank,
            ledger_bytes_per_rank: s.ledger_bytes_per_rank,
            state_bytes_per_rank: s.state_bytes_per_rank,
            formula_bytes_per_rank: s.formula_bytes_per_rank,
            comm_sent_bytes_per_step: s.comm_sent_bytes_per_step,
            comm_plan_bytes_per_step: s.comm_plan_bytes_per_step,
            status: OK,
            failure: None,
        })
        .collect();
    let stopped = report.stopped;
    let reason = why
        .map(str::to_string)
        .or_else(|| stopped.clone())
        .unwrap_or_else(|| "the run did not finish this stage".into());
    let mut missing: Vec<usize> = Vec::new();
    for &stage in &requested {
        if !finished.contains(&stage) && !missing.contains(&stage) {
            missing.push(stage);
            rows.push(Row::failed(&point, stage, &reason));
        }
    }
    // A report that lists every stage yet says it stopped (a stop after its last
    // stage): the stages are measured, the run is still not complete.
    let stopped = stopped.or_else(|| (!missing.is_empty()).then(|| reason.clone()));
    Ok(PointRows {
        rows,
        stopped,
        requested,
    })
}

/// Why the run whose report is `path` stopped before it was complete (`None`: it
/// finished every stage it was asked for); an error where the report cannot be read.
/// A launcher can exit 0 after its job stopped (a wrapper that loses the status, srun
/// after some launch failures): the report says so.
pub fn stopped_in(path: &Path) -> anyhow::Result<Option<String>> {
    Ok(rows_of(path, None)?.stopped)
}

/// What `sweep collect` found in a directory.
pub struct Collected {
    /// Every row of the readable result files, sorted by series then N, with the scaling
    /// efficiency filled in.
    pub rows: Vec<Row>,
    /// Result files that could not be read (partial, foreign, or a run that disagrees
    /// with its name), each with why: left out of the table, never silently.
    pub unreadable: Vec<String>,
    /// Points asked for (`--points`) that have no result file: failed rows.
    pub missing: Vec<String>,
    /// Points whose run stopped before its last stage, each with why: the table has
    /// the stages that finished and marks the others failed.
    pub incomplete: Vec<String>,
}

/// Whether `name` is named like a result file: `n<N>_...json`.
fn looks_like_a_result(name: &str) -> bool {
    name.ends_with(".json")
        && name.strip_prefix('n').is_some_and(|rest| {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            digits > 0 && rest[digits..].starts_with('_')
        })
}

/// The result files in `dir`: files named as [`Point::file_name`] (a name that starts
/// like one, `n<N>_`, but is not one is reported too; other files are ignored), or,
/// when `points` lists some (`n<N>_<model>_<precision>_a<A>`, with or without `.json`),
/// those points' files only: the points of one sweep in a directory that holds other
/// sweeps' too. A listed point without a file is a failed row per stage of `stages`
/// (what its job was asked for), or where that is empty, per stage the other files'
/// runs were asked for; where neither says, the error names the points and asks for
/// `--stages`. One file that cannot be read is left out and named in
/// [`Collected::unreadable`], so one partial file does not cost the whole table.
pub fn collect(dir: &Path, points: &[String], stages: &[u8]) -> anyhow::Result<Collected> {
    let mut files = Vec::new();
    if points.is_empty() {
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("reading the sweep directory {}", dir.display()))?;
        for entry in entries {
            let path = entry
                .with_context(|| format!("listing {}", dir.display()))?
                .path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if looks_like_a_result(&name) {
                files.push(path);
            }
        }
        if files.is_empty() {
            bail!(
                "no result files (n<N>_<model>_<precision>_a<A>.json) in {}",
                dir.display()
            );
        }
    } else {
        for p in points {
            let name = if p.ends_with(".json") {
                p.clone()
            } else {
                format!("{p}.json")
            };
            // Checked before anything is read: a typo is not a failed point.
            Point::from_file_name(&name).with_context(|| format!("--points: '{p}'"))?;
            if !files.contains(&dir.join(&name)) {
                files.push(dir.join(&name));
            }
        }
    }
    files.sort();
    let mut rows = Vec::new();
    let mut unreadable = Vec::new();
    let mut incomplete = Vec::new();
    let mut absent = Vec::new();
    let mut missing = Vec::new();
    let given: Vec<usize> = stages.iter().map(|&s| s as usize).collect();
    let mut stages: Vec<usize> = Vec::new();
    for f in &files {
        if !points.is_empty() && !f.exists() {
            absent.push(f);
            continue;
        }
        match rows_of(f, None) {
            Ok(r) => {
                if let Some(why) = &r.stopped {
                    incomplete.push(format!("{}: {why}", f.display()));
                }
                for s in r.requested {
                    if !stages.contains(&s) {
                        stages.push(s);
                    }
                }
                rows.extend(r.rows);
            }
            Err(e) => unreadable.push(crate::logging::chain(&e)),
        }
    }
    stages.sort_unstable();
    if !given.is_empty() {
        stages = given;
    }
    if !absent.is_empty() && stages.is_empty() {
        let names: Vec<String> = absent.iter().map(|f| f.display().to_string()).collect();
        bail!(
            "no listed point has a readable result file, so the stages their jobs ran are \
             unknown: every point failed (give --stages for their failed rows; their logs are \
             beside the files):\n  {}{}",
            names.join("\n  "),
            if unreadable.is_empty() {
                String::new()
            } else {
                format!("\nunreadable:\n  {}", unreadable.join("\n  "))
            }
        );
    }
    for f in absent {
        let log = f.with_extension("log");
        let why = format!(
            "no result file: the job wrote none (its log: {})",
            log.display()
        );
        let point = point_of(f)?;
        rows.extend(stages.iter().map(|&s| Row::failed(&point, s, &why)));
        missing.push(format!("{}: {why}", f.display()));
    }
    Ok(Collected {
        rows: ordered(rows),
        unreadable,
        missing,
        incomplete,
    })
}

/// How one point of `sweep run` ended.
pub struct Outcome {
    /// Where its job writes its result.
    pub file: PathBuf,
    /// Why the job failed (`None`: it finished).
    pub failure: Option<String>,
}

/// The table of a `sweep run`: every row of its points' result files, sorted by series
/// then N, with the scaling efficiency filled in. A point whose job failed keeps the
/// stages its report says finished; the rest of its `stages` (all of them where it left
/// no readable report) are failed rows with the job's failure.
pub fn rows_from(points: &[Outcome], stages: &[u8]) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for p in points {
        match &p.failure {
            None => rows.extend(rows_of(&p.file, None)?.rows),
            Some(why) => match rows_of(&p.file, Some(why)) {
                Ok(r) => rows.extend(r.rows),
                Err(_) => {
                    let point = point_of(&p.file)?;
                    rows.extend(stages.iter().map(|&s| Row::failed(&point, s as usize, why)));
                }
            },
        }
    }
    Ok(ordered(rows))
}

/// `rows` sorted by series then N, with the scaling efficiency filled in.
fn ordered(mut rows: Vec<Row>) -> Vec<Row> {
    rows.sort_by(|a, b| a.series().cmp(&b.series()).then(a.n.cmp(&b.n)));
    set_efficiency(&mut rows);
    rows
}

/// eff(N) = (tps(N)/N) / (tps(N0)/N0) within each series, N0 the smallest N of all
/// `rows` (module doc); rows sorted. A series without a finished N0 row gets NaN.
pub fn set_efficiency(rows: &mut [Row]) {
    let base_n = rows.iter().map(|r| r.n).min().unwrap_or(0);
    let mut i = 0;
    while i < rows.len() {
        let j = i + rows[i..]
            .iter()
            .take_while(|r| r.series() == rows[i].series())
            .count();
        let base = rows[i..j]
            .iter()
            .find(|r| r.n == base_n && r.finished())
            .map_or(f64::NAN, |r| r.tokens_per_s / r.n as f64);
        for r in &mut rows[i..j] {
            r.base_n = base_n;
            r.scaling_efficiency = if r.finished() {
                (r.tokens_per_s / r.n as f64) / base
            } else {
                f64::NAN
            };
        }
        i = j;
    }
}

/// The CSV header; per-rank columns give the largest rank's value.
const HEADER: &str = "n,stage,model,precision,grad_accum,steps,final_loss,tokens_per_step,\
tokens_per_s,step_ms,scaling_efficiency,peak_rss_bytes_max,ledger_bytes_max,state_bytes_max,\
formula_bytes,comm_sent_bytes_per_step,comm_plan_bytes_per_step,base_n,skipped_steps,status,\
failure";

/// `text` as one CSV field: quoted (quotes doubled) where it holds a comma or a quote.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// The table as CSV (per-rank values: the largest rank's; the JSON has every rank's).
/// A failed row's measured numbers are empty fields (it measured nothing: a 0 there
/// would read as a measurement to a consumer that does not filter on `status`); its
/// `base_n`, the table's, is given.
pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from(HEADER);
    out.push('\n');
    for r in rows {
        let _ = write!(
            out,
            "{},{},{},{},{},",
            r.n, r.stage, r.model, r.precision, r.grad_accum
        );
        if r.finished() {
            let _ = write!(
                out,
                "{},{:.6},{},{:.3},{:.4},{:.4},{},{},{},{:.0},{},{},{},{}",
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
                r.comm_plan_bytes_per_step,
                r.base_n,
                r.skipped_steps,
            );
        } else {
            // steps .. comm_plan_bytes_per_step (12 fields), base_n, skipped_steps.
            let _ = write!(out, "{}{},", ",".repeat(12), r.base_n);
        }
        let _ = writeln!(
            out,
            ",{},{}",
            r.status,
            csv_field(r.failure.as_deref().unwrap_or(""))
        );
    }
    out
}

/// A short text version of the table for the terminal: a failed stage's row says why;
/// the efficiency's base N is said below.
pub fn text(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4} {:>5} {:<10} {:<6} {:>6} {:>10} {:>9} {:>6} {:>11} {:>11} {:>11} {:>11} {:>7}",
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
        "sent B/step",
        "skipped"
    );
    for r in rows {
        let _ = write!(
            out,
            "{:>4} {:>5} {:<10} {:<6} {:>6} ",
            r.n, r.stage, r.model, r.precision, r.grad_accum
        );
        if !r.finished() {
            let _ = writeln!(out, "FAILED: {}", r.failure.as_deref().unwrap_or("?"));
            continue;
        }
        let eff = if r.scaling_efficiency.is_finite() {
            format!("{:.3}", r.scaling_efficiency)
        } else {
            "n/a".into()
        };
        let _ = writeln!(
            out,
            "{:>10.0} {:>9.2} {:>6} {:>11} {:>11.0} {:>11} {:>11} {:>7}",
            r.tokens_per_s,
            r.step_ms,
            eff,
            max(&r.state_bytes_per_rank),
            r.formula_bytes_per_rank,
            max(&r.peak_rss_bytes_per_rank),
            r.comm_sent_bytes_per_step,
            r.skipped_steps
        );
    }
    if let Some(r) = rows.first() {
        let _ = writeln!(
            out,
            "eff: per-rank tokens/s against N={} of the same series (n/a: that row failed)",
            r.base_n
        );
    }
    out
}

/// Warnings for rows whose steps were skipped (inf/NaN gradients: no optimizer update,
/// so a cheaper step than the others, and a throughput that does not compare).
pub fn skipped_warnings(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .filter(|r| r.finished() && r.skipped_steps > 0)
        .map(|r| {
            let what = if r.skipped_steps as usize >= r.steps {
                "every step was skipped: no optimizer update ran, and its throughput is not a training step's".to_string()
            } else {
                format!(
                    "{} of {} steps skipped (no optimizer update in those: its throughput is higher than training's)",
                    r.skipped_steps, r.steps
                )
            };
            format!(
                "N={} stage {} model={} precision={} A={}: {what}; more steps (or a loss scale that settles sooner) measure it",
                r.n, r.stage, r.model, r.precision, r.grad_accum
            )
        })
        .collect()
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
            base_n: 0,
            skipped_steps: 0,
            peak_rss_bytes_per_rank: vec![10; n],
            ledger_bytes_per_rank: vec![5; n],
            state_bytes_per_rank: (0..n as u64).collect(),
            formula_bytes_per_rank: 4.0,
            comm_sent_bytes_per_step: 0,
            comm_plan_bytes_per_step: 0,
            status: OK,
            failure: None,
        }
    }

    fn point(n: usize) -> Point {
        Point::from_file_name(&format!("n{n}_tiny_fp32_a1.json")).unwrap()
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
    fn efficiency_is_per_rank_throughput_against_the_smallest_n_of_the_table() {
        let mut rows = vec![
            row(2, 0, 100.0),
            row(4, 0, 150.0),
            row(2, 3, 50.0),
            row(4, 3, 80.0),
        ];
        set_efficiency(&mut rows);
        assert_eq!(rows[0].scaling_efficiency, 1.0);
        assert_eq!(rows[1].scaling_efficiency, 0.75);
        assert_eq!(rows[3].scaling_efficiency, 0.8);
        assert!(rows.iter().all(|r| r.base_n == 2));
        let csv = csv(&rows);
        assert_eq!(csv.lines().count(), 5);
        assert!(csv
            .lines()
            .next()
            .unwrap()
            .ends_with(",base_n,skipped_steps,status,failure"));
        let n4 = csv.lines().nth(2).unwrap();
        assert!(n4.starts_with("4,0,tiny,fp32,1,2,"), "{n4}");
        // state_bytes_max of N=4 is rank 3's.
        assert!(n4.contains(",10,5,3,4,"), "{n4}");
        assert!(n4.ends_with(",2,0,ok,"), "{n4}");
    }

    #[test]
    fn a_series_whose_base_n_failed_has_no_efficiency_rather_than_another_base() {
        // Stage 3 failed at N=1: its N=2 and N=4 are not renormalised to N=2 (the
        // stage 0 series, measured against N=1, would not compare with it).
        let mut rows = vec![
            row(1, 0, 100.0),
            row(2, 0, 150.0),
            Row::failed(&point(1), 3, "out of memory"),
            row(2, 3, 80.0),
            row(4, 3, 120.0),
        ];
        rows = ordered(rows);
        let eff = |n, s| {
            rows.iter()
                .find(|r| r.n == n && r.stage == s)
                .unwrap()
                .scaling_efficiency
        };
        assert_eq!(eff(2, 0), 0.75);
        assert!(eff(1, 3).is_nan() && eff(2, 3).is_nan() && eff(4, 3).is_nan());
        assert!(rows.iter().all(|r| r.base_n == 1));
        let text = text(&rows);
        assert!(text.contains("FAILED: out of memory"), "{text}");
        assert!(text.contains("n/a"), "{text}");
        assert!(text.contains("against N=1"), "{text}");
    }

    #[test]
    fn a_report_that_stopped_keeps_its_finished_stages_and_marks_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let stage = |s: usize| {
            format!(
                r#"{{"stage": {s}, "steps": 4, "final_loss": 3.5, "tokens_per_step": 64,
                "mean_step_seconds": 0.5, "tokens_per_s": 128.0, "ledger_bytes_per_rank": [1, 1],
                "state_bytes_per_rank": [1, 1], "formula_bytes_per_rank": 1.0,
                "peak_rss_bytes_per_rank": [1, 1], "comm_sent_bytes_per_step": 8,
                "comm_plan_bytes_per_step": 8, "skipped_steps": 1}}"#
            )
        };
        let partial = dir.path().join("n2_tiny_fp32_a1.json");
        std::fs::write(
            &partial,
            format!(
                r#"{{"world": 2, "stages_requested": [0, 1, 3], "stages_completed": [0],
                "complete": false, "stopped": "the ZeRO-1 run failed: stuck", "stages": [{}]}}"#,
                stage(0)
            ),
        )
        .unwrap();
        // An older report: no stage list, written only when every stage finished.
        let old = dir.path().join("n1_tiny_fp32_a1.json");
        std::fs::write(
            &old,
            format!(r#"{{"world": 1, "stages": [{}, {}]}}"#, stage(0), stage(3)),
        )
        .unwrap();
        let found = collect(dir.path(), &[], &[]).unwrap();
        assert!(found.unreadable.is_empty(), "{:?}", found.unreadable);
        assert_eq!(found.incomplete.len(), 1, "{:?}", found.incomplete);
        assert!(found.incomplete[0].ends_with("the ZeRO-1 run failed: stuck"));
        let status: Vec<(usize, usize, &str)> = found
            .rows
            .iter()
            .map(|r| (r.n, r.stage, r.status))
            .collect();
        assert_eq!(
            status,
            [
                (1, 0, OK),
                (2, 0, OK),
                (2, 1, FAILED),
                (1, 3, OK),
                (2, 3, FAILED)
            ]
        );
        let failed = &found.rows[2];
        assert_eq!(
            failed.failure.as_deref(),
            Some("the ZeRO-1 run failed: stuck")
        );
        assert!(failed.tokens_per_s.is_nan() && failed.scaling_efficiency.is_nan());
        assert_eq!(found.rows[1].skipped_steps, 1);
        assert_eq!(skipped_warnings(&found.rows).len(), 3);

        // `sweep run` gives the job's own reason; a point without a report fails every
        // stage; --points tables the listed points only, a missing one as failed rows.
        let outcomes = [
            Outcome {
                file: partial.clone(),
                failure: Some("the job failed (exit status: 1), with, commas".into()),
            },
            Outcome {
                file: dir.path().join("n4_tiny_fp32_a1.json"),
                failure: Some("launch failed".into()),
            },
        ];
        let rows = rows_from(&outcomes, &[0, 1, 3]).unwrap();
        assert_eq!(rows.len(), 6);
        assert_eq!(rows.iter().filter(|r| r.finished()).count(), 1);
        let csv = csv(&rows);
        assert!(
            csv.contains(",failed,\"the job failed (exit status: 1), with, commas\"\n"),
            "{csv}"
        );
        // A failed row measured nothing: empty fields, not 0 or NaN; base_n is the table's.
        assert!(
            csv.contains("\n4,0,tiny,fp32,1,,,,,,,,,,,,,2,,failed,launch failed\n"),
            "{csv}"
        );
        assert!(
            csv.lines()
                .all(|l| !l.contains("NaN") || l.contains(",ok,")),
            "{csv}"
        );
        let only = collect(
            dir.path(),
            &["n2_tiny_fp32_a1".into(), "n4_tiny_fp32_a1".into()],
            &[],
        )
        .unwrap();
        assert!(only.unreadable.is_empty(), "{:?}", only.unreadable);
        assert_eq!(only.missing.len(), 1, "{:?}", only.missing);
        assert!(only.missing[0].contains("no result file"));
        assert!(only.rows.iter().all(|r| r.n != 1));
        assert_eq!(only.rows.iter().filter(|r| r.n == 4).count(), 3);
        assert!(collect(dir.path(), &["n2_tiny".into()], &[]).is_err());
        // No listed point has a file: --stages gives their failed rows; without it the
        // stages are unknown, and the error says so.
        let none = ["n8_tiny_fp32_a1".to_string(), "n16_tiny_fp32_a1".into()];
        let lost = collect(dir.path(), &none, &[0, 2]).unwrap();
        assert_eq!(lost.missing.len(), 2, "{:?}", lost.missing);
        let status: Vec<(usize, usize, &str)> =
            lost.rows.iter().map(|r| (r.n, r.stage, r.status)).collect();
        assert_eq!(
            status,
            [
                (8, 0, FAILED),
                (16, 0, FAILED),
                (8, 2, FAILED),
                (16, 2, FAILED)
            ]
        );
        let e = match collect(dir.path(), &none, &[]) {
            Ok(_) => panic!("no stages known, yet rows"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("stages their jobs ran are unknown") && e.contains("n16_tiny_fp32_a1.json"),
            "{e}"
        );
    }
}
