//! The sweep's plots, each as PNG and SVG (plotters; text drawn with the DejaVu Sans
//! font compiled into the binary, so no system font library is needed):
//! - `memory`: per-rank model states against N for each stage, the ledger (solid) next
//!   to the ZeRO formula of the run's precision (dashed; mixed precision 16Ψ, 4Ψ+12Ψ/N,
//!   2Ψ+14Ψ/N, 16Ψ/N; fp32 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N); and the
//!   measured peak RSS (solid) with the ledger's total (dashed);
//! - `throughput`: tokens/s and weak-scaling efficiency against N;
//! - `comm`: bytes sent per step against N, measured (solid) and planned (dashed).
//!
//! A figure is a list of panels of lines, built from the table first and then rendered
//! by the same code on both backends. Per-rank values are the largest rank's. N is on a
//! log2 axis (sweeps double N), labelled 1, 2, 4, ...

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::table::Row;

/// One line of a panel: `(N, value)` points in the panel's unit.
struct Line {
    label: Option<String>,
    color: usize,
    dashed: bool,
    points: Vec<(u32, f64)>,
}

/// One chart of a figure.
struct Panel {
    title: String,
    y_desc: String,
    lines: Vec<Line>,
    /// Where the legend goes: above the curves (the y range leaves room), on the side
    /// they usually leave empty (memory falls with N, throughput and traffic rise).
    legend: SeriesLabelPosition,
}

/// Figure size in pixels (both formats).
const SIZE: (u32, u32) = (1400, 560);

/// Series colours (Tableau 10: distinct, readable on white and in grey print).
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Axis numbers without trailing zeros: 250, 2.5, 0.25.
fn tick(v: &f64) -> String {
    let t = format!("{v:.2}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_err()
        {
            log::warn!("the embedded DejaVu Sans font did not load; plot text may be missing");
        }
    });
}

/// A byte unit that keeps `max` readable: (divisor, name).
fn byte_unit(max: f64) -> (f64, &'static str) {
    match max {
        m if m >= 1e9 => (1e9, "GB"),
        m if m >= 1e6 => (1e6, "MB"),
        m if m >= 1e3 => (1e3, "kB"),
        _ => (1.0, "B"),
    }
}

/// The distinct series of the rows, in order, with their legend names: "stage s", plus
/// model/precision/A when the sweep varied them.
fn series(rows: &[Row]) -> Vec<((usize, String, String, String), String)> {
    let mut keys: Vec<(usize, String, String, String)> = Vec::new();
    for r in rows {
        let (s, m, p, a) = r.series();
        let k = (s, m.to_string(), p.to_string(), a.to_string());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let varies = |f: fn(&(usize, String, String, String)) -> &String| {
        keys.iter().any(|k| f(k) != f(&keys[0]))
    };
    let (vm, vp, va) = (varies(|k| &k.1), varies(|k| &k.2), varies(|k| &k.3));
    keys.iter()
        .map(|k| {
            let mut name = format!("stage {}", k.0);
            if vm {
                name += &format!(" {}", k.1);
            }
            if vp {
                name += &format!(" {}", k.2);
            }
            if va {
                name += &format!(" A={}", k.3);
            }
            (k.clone(), name)
        })
        .collect()
}

/// A panel with, per series, a solid line of `solid(row)` and optionally a dashed line
/// of `dashed(row)`, in bytes scaled to one unit.
fn byte_panel(
    rows: &[Row],
    legend: SeriesLabelPosition,
    title: &str,
    what: &str,
    solid: impl Fn(&Row) -> f64,
    dashed: Option<&dyn Fn(&Row) -> f64>,
) -> Panel {
    let max = rows
        .iter()
        .map(|r| solid(r).max(dashed.map_or(0.0, |d| d(r))))
        .fold(0.0, f64::max);
    let (div, unit) = byte_unit(max);
    let mut lines = Vec::new();
    for (i, (key, name)) in series(rows).into_iter().enumerate() {
        let mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.series() == (key.0, &key.1, &key.2, &key.3))
            .collect();
        let pts = |f: &dyn Fn(&Row) -> f64| mine.iter().map(|r| (r.n as u32, f(r) / div)).collect();
        lines.push(Line {
            label: Some(name),
            color: i,
            dashed: false,
            points: pts(&solid),
        });
        if let Some(d) = dashed {
            lines.push(Line {
                label: None,
                color: i,
                dashed: true,
                points: pts(d),
            });
        }
    }
    Panel {
        title: title.to_string(),
        y_desc: format!("{what} ({unit})"),
        lines,
        legend,
    }
}

/// A panel of one value per series, no unit scaling.
fn value_panel(
    rows: &[Row],
    legend: SeriesLabelPosition,
    title: &str,
    y_desc: &str,
    f: impl Fn(&Row) -> f64,
) -> Panel {
    let lines = series(rows)
        .into_iter()
        .enumerate()
        .map(|(i, (key, name))| Line {
            label: Some(name),
            color: i,
            dashed: false,
            points: rows
                .iter()
                .filter(|r| r.series() == (key.0, &key.1, &key.2, &key.3))
                .map(|r| (r.n as u32, f(r)))
                .collect(),
        })
        .collect();
    Panel {
        title: title.to_string(),
        y_desc: y_desc.to_string(),
        lines,
        legend,
    }
}

fn max_u64(v: &[u64]) -> f64 {
    v.iter().copied().max().unwrap_or(0) as f64
}

/// The three figures: (file stem, panels).
fn figures(rows: &[Row]) -> Vec<(&'static str, Vec<Panel>)> {
    vec![
        (
            "memory",
            vec![
                byte_panel(
                    rows,
                    SeriesLabelPosition::UpperRight,
                    "Model states per rank: ledger (solid), ZeRO formula (dashed)",
                    "bytes per rank",
                    |r| max_u64(&r.state_bytes_per_rank),
                    Some(&|r: &Row| r.formula_bytes_per_rank),
                ),
                byte_panel(
                    rows,
                    SeriesLabelPosition::UpperRight,
                    "Peak RSS per rank (solid), ledger total (dashed)",
                    "bytes per rank",
                    |r| max_u64(&r.peak_rss_bytes_per_rank),
                    Some(&|r: &Row| max_u64(&r.ledger_bytes_per_rank)),
                ),
            ],
        ),
        (
            "throughput",
            vec![
                value_panel(
                    rows,
                    SeriesLabelPosition::UpperLeft,
                    "Throughput",
                    "tokens/s",
                    |r| r.tokens_per_s,
                ),
                value_panel(
                    rows,
                    SeriesLabelPosition::UpperRight,
                    &format!(
                        "Scaling efficiency vs N={} (per-rank tokens/s)",
                        rows.first().map_or(0, |r| r.base_n)
                    ),
                    "efficiency",
                    |r| r.scaling_efficiency,
                ),
            ],
        ),
        (
            "comm",
            vec![byte_panel(
                rows,
                SeriesLabelPosition::UpperLeft,
                "Communication per step: measured (solid), ledger plan (dashed)",
                "bytes sent per rank per step",
                |r| r.comm_sent_bytes_per_step as f64,
                Some(&|r: &Row| r.comm_plan_bytes_per_step as f64),
            )],
        ),
    ]
}

/// Draw `panels` side by side on `root`.
fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, panels: &[Panel]) -> anyhow::Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e}");
    root.fill(&WHITE).map_err(err)?;
    for (area, panel) in root.split_evenly((1, panels.len())).iter().zip(panels) {
        let all = panel.lines.iter().flat_map(|l| l.points.iter());
        // N on a log2 axis: powers of two equally spaced, ticks labelled 1, 2, 4, ...
        let log2 = |n: u32| (n.max(1) as f64).log2();
        let x_lo = all.clone().map(|p| log2(p.0)).fold(f64::INFINITY, f64::min);
        let x_hi = all.clone().map(|p| log2(p.0)).fold(0.0, f64::max);
        let x_lo = if x_lo.is_finite() { x_lo.floor() } else { 0.0 };
        let x_hi = x_hi.ceil().max(x_lo + 1.0);
        let y_max = all
            .map(|p| p.1)
            .filter(|y| y.is_finite())
            .fold(0.0, f64::max);
        // Headroom above the data for the legend (about 6% of the height per entry),
        // and a non-empty range when everything is 0.
        let entries = panel.lines.iter().filter(|l| l.label.is_some()).count();
        let y_top = if y_max > 0.0 {
            y_max * (1.15 + 0.07 * entries as f64)
        } else {
            1.0
        };
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .build_cartesian_2d((x_lo - 0.25)..(x_hi + 0.25), 0f64..y_top)
            .map_err(err)?;
        let power_of_two = |x: &f64| {
            if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
                format!("{}", 1u64 << (x.round() as u32).min(62))
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc("N (ranks, log2 scale)")
            .y_desc(&panel.y_desc)
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            // Ticks at every quarter: the formatter labels the powers of two only.
            .x_labels((4.0 * (x_hi - x_lo + 0.5)) as usize + 1)
            .x_label_formatter(&power_of_two)
            .y_label_formatter(&tick)
            .draw()
            .map_err(err)?;
        let series = panel.lines.iter().map(|l| l.color + 1).max().unwrap_or(1);
        for line in &panel.lines {
            let color = COLORS[line.color % COLORS.len()];
            // Earlier series drawn wider, so that a later one on top of it (stages
            // 0-2 often send the same bytes) still shows both.
            let width = 2 + 2 * (series - 1 - line.color).min(3) as u32;
            let pts: Vec<(f64, f64)> = line
                .points
                .iter()
                .filter(|p| p.1.is_finite())
                .map(|&(n, y)| (log2(n), y))
                .collect();
            if line.dashed {
                chart
                    .draw_series(DashedLineSeries::new(pts, 10, 6, color.stroke_width(width)))
                    .map_err(err)?;
                continue;
            }
            let drawn = chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(width)))
                .map_err(err)?;
            if let Some(label) = &line.label {
                drawn.label(label.clone()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
                });
            }
            chart
                .draw_series(
                    pts.iter()
                        .map(|&p| Circle::new(p, 2 + width, color.filled())),
                )
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(panel.legend.clone())
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The figures' file stems.
pub const NAMES: [&str; 3] = ["memory", "throughput", "comm"];

/// Draw every figure of the finished rows into `dir` as `<name>.png` and `<name>.svg`;
/// returns the files. Each is drawn into a temporary file renamed into place, so an
/// interrupted or failed drawing never leaves half a figure under the name.
pub fn write_all(rows: &[Row], dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    register_font();
    let finished: Vec<Row> = rows.iter().filter(|r| r.finished()).cloned().collect();
    let mut files = Vec::new();
    for (name, panels) in figures(&finished) {
        // The temporary name keeps the extension: the PNG encoder goes by it.
        let png = dir.join(format!("{name}.png"));
        let tmp = dir.join(format!(".{name}.tmp.png"));
        draw(BitMapBackend::new(&tmp, SIZE).into_drawing_area(), &panels)
            .and_then(|()| Ok(std::fs::rename(&tmp, &png)?))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                anyhow!("{}: {e}", png.display())
            })?;
        let svg = dir.join(format!("{name}.svg"));
        let tmp = dir.join(format!(".{name}.tmp.svg"));
        draw(SVGBackend::new(&tmp, SIZE).into_drawing_area(), &panels)
            .and_then(|()| Ok(std::fs::rename(&tmp, &svg)?))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                anyhow!("{}: {e}", svg.display())
            })?;
        files.extend([png, svg]);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize, stage: usize, precision: &str) -> Row {
        Row {
            n,
            stage,
            model: "tiny".into(),
            precision: precision.into(),
            grad_accum: "1".into(),
            steps: 2,
            final_loss: 3.0,
            tokens_per_step: 64,
            tokens_per_s: 1000.0 * n as f64,
            step_ms: 1.0,
            scaling_efficiency: 1.0,
            base_n: 1,
            skipped_steps: 0,
            peak_rss_bytes_per_rank: vec![20_000_000; n],
            ledger_bytes_per_rank: vec![2_000_000; n],
            state_bytes_per_rank: vec![1_600_000 / n as u64; n],
            formula_bytes_per_rank: 1.6e6 / n as f64,
            comm_sent_bytes_per_step: 1000 * (n as u64 - 1),
            comm_plan_bytes_per_step: 1000 * (n as u64 - 1),
            status: crate::sweep::table::OK,
            failure: None,
        }
    }

    #[test]
    fn legends_name_only_the_dimensions_that_vary_and_ticks_drop_zeros() {
        let one = [row(1, 3, "bf16"), row(2, 3, "bf16")];
        let names: Vec<String> = series(&one).into_iter().map(|(_, n)| n).collect();
        assert_eq!(names, ["stage 3"]);
        let two = [row(1, 3, "bf16"), row(1, 3, "fp32")];
        let names: Vec<String> = series(&two).into_iter().map(|(_, n)| n).collect();
        assert_eq!(names, ["stage 3 bf16", "stage 3 fp32"]);
        assert_eq!(
            (tick(&250.0), tick(&2.5), tick(&0.25), tick(&0.0)),
            ("250".into(), "2.5".into(), "0.25".into(), "0".into())
        );
        // Memory in MB: 1.6 MB states at N=1, the formula line beside them.
        let panel = &figures(&one)[0].1[0];
        assert_eq!(panel.y_desc, "bytes per rank (MB)");
        assert_eq!(panel.lines[0].points, vec![(1, 1.6), (2, 0.8)]);
        assert!(panel.lines[1].dashed);
    }

    #[test]
    fn every_figure_is_written_as_png_and_svg() {
        let dir = std::env::temp_dir().join(format!("zero-sweep-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = write_all(&[row(1, 0, "fp32"), row(2, 0, "fp32")], &dir).unwrap();
        assert_eq!(files.len(), 6);
        // No temporary file is left beside them.
        let names = zero_core::files::entry_names(&dir).unwrap();
        assert_eq!(names.len(), 6, "{names:?}");
        for f in &files {
            let bytes = std::fs::read(f).unwrap();
            match f.extension().and_then(|e| e.to_str()) {
                Some("png") => assert_eq!(&bytes[..4], b"\x89PNG"),
                _ => assert!(bytes.starts_with(b"<svg")),
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
