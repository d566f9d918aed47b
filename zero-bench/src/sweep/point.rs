//! One point of a sweep: (N, model, precision, grad accumulation); the stages are not
//! part of a point, since one job runs every listed stage (`train --stages`).
//!
//! A point's results live in one file named after it, `n<N>_<model>_<precision>_a<A>.json`
//! (what `train --json` writes: `{"world": N, "stages": [StageResult...]}`), so that
//! slurm/sweep.sbatch can name the files in bash and `sweep collect` can read the point
//! back from the name alone. A dimension the sweep leaves to the configuration file is
//! written as `config` (`n4_config_config_aconfig.json`).

use std::fmt;

use anyhow::{bail, Context as _};

/// The label of a dimension taken from the configuration file, not the command line.
pub const FROM_CONFIG: &str = "config";

/// One job of a sweep.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Point {
    /// World size (MPI ranks).
    pub n: usize,
    /// Model preset, or `config`.
    pub model: String,
    /// Precision (fp32, bf16, fp16), or `config`.
    pub precision: String,
    /// Micro-batches accumulated per step, or `None` for the configuration's value.
    pub grad_accum: Option<usize>,
}

impl Point {
    /// The accumulation as written in file names and tables (`1`, or `config`).
    pub fn grad_accum_label(&self) -> String {
        self.grad_accum
            .map_or_else(|| FROM_CONFIG.to_string(), |a| a.to_string())
    }

    /// The result file's name, `n<N>_<model>_<precision>_a<A>.json`.
    pub fn file_name(&self) -> String {
        format!(
            "n{}_{}_{}_a{}.json",
            self.n,
            self.model,
            self.precision,
            self.grad_accum_label()
        )
    }

    /// The point a result file is named after (the inverse of [`Point::file_name`]).
    pub fn from_file_name(name: &str) -> anyhow::Result<Point> {
        let how = "expected n<N>_<model>_<precision>_a<A>.json (as sweep run and \
                   slurm/sweep.sbatch write them)";
        let stem = name
            .strip_suffix(".json")
            .with_context(|| format!("'{name}' is not a .json file; {how}"))?;
        let parts: Vec<&str> = stem.split('_').collect();
        let [n, model, precision, a] = parts[..] else {
            bail!(
                "'{name}' has {} '_'-separated fields, not 4; {how}",
                parts.len()
            );
        };
        let n: usize = n
            .strip_prefix('n')
            .and_then(|s| s.parse().ok())
            .filter(|&n| n > 0)
            .with_context(|| format!("'{name}': no world size n<N> (N >= 1); {how}"))?;
        let a = a
            .strip_prefix('a')
            .with_context(|| format!("'{name}': no accumulation a<A>; {how}"))?;
        let grad_accum = match a {
            FROM_CONFIG => None,
            _ => Some(
                a.parse()
                    .ok()
                    .filter(|&a: &usize| a > 0)
                    .with_context(|| format!("'{name}': accumulation '{a}' is not >= 1"))?,
            ),
        };
        if model.is_empty() || precision.is_empty() {
            bail!("'{name}': empty model or precision field; {how}");
        }
        Ok(Point {
            n,
            model: model.to_string(),
            precision: precision.to_string(),
            grad_accum,
        })
    }

    /// The `train` flags that select this point (none for `config` dimensions).
    pub fn train_flags(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.model != FROM_CONFIG {
            f.extend(["--model".to_string(), self.model.clone()]);
        }
        if self.precision != FROM_CONFIG {
            f.extend(["--precision".to_string(), self.precision.clone()]);
        }
        if let Some(a) = self.grad_accum {
            f.extend(["--grad-accum".to_string(), a.to_string()]);
        }
        f
    }
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "N={} model={} precision={} A={}",
            self.n,
            self.model,
            self.precision,
            self.grad_accum_label()
        )
    }
}

/// Every point of the matrix ranks x models x precisions x accumulations, in that nesting
/// order (N outermost); an empty list stands for the configuration's value.
pub fn matrix(
    ranks: &[usize],
    models: &[String],
    precisions: &[String],
    grad_accums: &[usize],
) -> anyhow::Result<Vec<Point>> {
    if ranks.is_empty() {
        bail!("--ranks is empty: give the world sizes to sweep, e.g. --ranks 1,2,4");
    }
    if let Some(n) = ranks.iter().find(|&&n| n == 0) {
        bail!("--ranks contains {n}: world sizes start at 1");
    }
    if let Some(a) = grad_accums.iter().find(|&&a| a == 0) {
        bail!("--grad-accum contains {a}: accumulation starts at 1");
    }
    let labels = |v: &[String], what: &str| -> anyhow::Result<Vec<String>> {
        for s in v {
            if s.is_empty() || s.contains(['_', '/', ' ']) || s == FROM_CONFIG {
                bail!("{what} '{s}' cannot name a result file (no '_', '/', spaces, or '{FROM_CONFIG}')");
            }
        }
        Ok(if v.is_empty() {
            vec![FROM_CONFIG.to_string()]
        } else {
            v.to_vec()
        })
    };
    let models = labels(models, "model")?;
    let precisions = labels(precisions, "precision")?;
    let accums: Vec<Option<usize>> = if grad_accums.is_empty() {
        vec![None]
    } else {
        grad_accums.iter().copied().map(Some).collect()
    };
    let mut points = Vec::new();
    for &n in ranks {
        for model in &models {
            for precision in &precisions {
                for &grad_accum in &accums {
                    points.push(Point {
                        n,
                        model: model.clone(),
                        precision: precision.clone(),
                        grad_accum,
                    });
                }
            }
        }
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip() {
        let points = matrix(&[1, 4], &["gpt2-124m".into()], &[], &[2]).unwrap();
        assert_eq!(points.len(), 2);
        assert_eq!(points[1].file_name(), "n4_gpt2-124m_config_a2.json");
        for p in &points {
            assert_eq!(&Point::from_file_name(&p.file_name()).unwrap(), p);
        }
        let p = Point::from_file_name("n2_config_bf16_aconfig.json").unwrap();
        assert_eq!(p.grad_accum, None);
        assert_eq!(p.train_flags(), vec!["--precision", "bf16"]);
    }

    #[test]
    fn bad_names_and_lists_are_errors() {
        for bad in [
            "n0_a_b_a1.json",
            "n2_a_b_a0.json",
            "n2_a_b.json",
            "x.txt",
            "2_a_b_a1.json",
        ] {
            assert!(Point::from_file_name(bad).is_err(), "{bad}");
        }
        assert!(matrix(&[], &[], &[], &[]).is_err());
        assert!(matrix(&[0], &[], &[], &[]).is_err());
        assert!(matrix(&[1], &["a_b".into()], &[], &[]).is_err());
        assert!(matrix(&[1], &[], &[], &[0]).is_err());
    }
}
