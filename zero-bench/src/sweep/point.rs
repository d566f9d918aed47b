//! One point of a sweep: (N, model, precision, grad accumulation); the stages are not
//! part of a point, since one job runs every listed stage (`train --stages`).
//!
//! A point's results live in one file named after it, `n<N>_<model>_<precision>_a<A>.json`
//! (what `train --json` writes: `{"world": N, "stages": [StageResult...]}`), so that
//! slurm/sweep.sbatch can name the files in bash and `sweep collect` can read the point
//! back from the name alone. A dimension the sweep leaves to the configuration file is
//! named by the configuration's resolved value ([`Resolved`]: the preset, or the model's
//! dimensions `v256-t64-l2-h4-c128`; the precision; the accumulation), never by the word
//! `config` (which older result files may still carry, and which still parses).

use std::fmt;

use anyhow::{bail, Context as _};

use zero_models::{LlamaConfig, ModelPreset};

use crate::config::Config;

/// The label older result files carry for a dimension taken from the configuration.
pub const FROM_CONFIG: &str = "config";

/// The configuration's own model, precision and accumulation, as point labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The preset when the configuration names one and changes none of its dimensions,
    /// else the dimensions (`v50257-t1024-l12-h12-c768`).
    pub model: String,
    /// fp32, bf16 or fp16.
    pub precision: String,
    /// A.
    pub grad_accum: usize,
}

impl Resolved {
    /// Labels for a configuration not loaded: [`FROM_CONFIG`] (the accumulation's is
    /// the caller's to clear).
    pub fn unresolved() -> Resolved {
        Resolved {
            model: FROM_CONFIG.into(),
            precision: FROM_CONFIG.into(),
            grad_accum: 0,
        }
    }

    /// The labels of `config`.
    pub fn of(config: &Config) -> anyhow::Result<Resolved> {
        let m = &config.model;
        let plain_preset = m.vocab_size.is_none()
            && m.context_len.is_none()
            && m.layers.is_none()
            && m.heads.is_none()
            && m.width.is_none()
            && m.n_kv_head.is_none()
            && m.ffn_hidden.is_none()
            && m.rope_theta.is_none();
        let model = match &m.preset {
            Some(p) if plain_preset => p.clone(),
            // Either family: a Llama preset with a dimension changed is named so too.
            _ => match config.model_preset().map_err(anyhow::Error::msg)? {
                ModelPreset::Gpt(g) => {
                    dimensions_label(g.vocab_size, g.max_seq_len, g.n_layer, g.n_head, g.n_embd)
                }
                ModelPreset::Llama(l) => {
                    let base = m.preset.as_deref().and_then(LlamaConfig::preset);
                    llama_label(&l, base.as_ref())
                }
            },
        };
        let precision = crate::train::precision_name(config.precision.dtype).to_string();
        Ok(Resolved {
            model,
            precision,
            grad_accum: config.train.grad_accum,
        })
    }
}

/// `v<V>-t<T>-l<L>-h<H>-c<C>`.
fn dimensions_label(v: usize, t: usize, l: usize, h: usize, c: usize) -> String {
    format!("v{v}-t{t}-l{l}-h{h}-c{c}")
}

/// A Llama's label: its dimensions, then what differs from its preset's (`base`) among
/// its key/value heads, MLP width and RoPE base (`-kv1-f48-r500000`), so that two
/// points that differ only there are not one label (and one result file).
fn llama_label(l: &LlamaConfig, base: Option<&LlamaConfig>) -> String {
    let mut label = dimensions_label(l.vocab_size, l.max_seq_len, l.n_layer, l.n_head, l.n_embd);
    let differs = |b: fn(&LlamaConfig) -> f64| base.is_none_or(|base| b(base) != b(l));
    if differs(|c| c.n_kv_head as f64) {
        label.push_str(&format!("-kv{}", l.n_kv_head));
    }
    if differs(|c| c.ffn_hidden as f64) {
        label.push_str(&format!("-f{}", l.ffn_hidden));
    }
    if differs(|c| c.rope_theta) {
        label.push_str(&format!("-r{}", l.rope_theta));
    }
    label
}

/// The precisions a sweep may list (`precision.dtype`'s values).
pub const PRECISIONS: [&str; 3] = ["fp32", "bf16", "fp16"];

/// Which dimensions of a point come from the configuration (so the job passes no flag
/// for them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct FromConfig {
    /// The model.
    pub model: bool,
    /// The precision.
    pub precision: bool,
    /// The accumulation.
    pub grad_accum: bool,
}

/// One job of a sweep.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Point {
    /// World size (MPI ranks).
    pub n: usize,
    /// Model preset, or `config`.
    pub model: String,
    /// Precision (fp32, bf16, fp16), or `config`.
    pub precision: String,
    /// Micro-batches accumulated per step (`None`: an older file's `config`).
    pub grad_accum: Option<usize>,
    /// The dimensions taken from the configuration (named by their resolved values).
    pub from_config: FromConfig,
    /// The preset `--model` names when `model` labels the point by other dimensions
    /// (`--set model.KEY` over the preset's: [`Point::label_model_as_trained`]).
    pub preset: Option<String>,
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
            from_config: FromConfig::default(),
            preset: None,
        })
    }

    /// The `train` flags that select this point (none for dimensions from the
    /// configuration).
    pub fn train_flags(&self) -> Vec<String> {
        let mut f = Vec::new();
        if !self.from_config.model && self.model != FROM_CONFIG {
            let preset = self.preset.as_ref().unwrap_or(&self.model);
            f.extend(["--model".to_string(), preset.clone()]);
        }
        if !self.from_config.precision && self.precision != FROM_CONFIG {
            f.extend(["--precision".to_string(), self.precision.clone()]);
        }
        match self.grad_accum {
            Some(a) if !self.from_config.grad_accum => {
                f.extend(["--grad-accum".to_string(), a.to_string()])
            }
            _ => {}
        }
        f
    }
}

impl Point {
    /// Label a `--models` point by the model its job trains (`run`, its configurations):
    /// when a `--set model.KEY` changes one of the preset's dimensions (train lets it win
    /// over `--model`), the point is named by the dimensions (`v..-t..-l..-h..-c..`, as
    /// a configuration's own changed preset is), not by the preset's name, and keeps
    /// passing `--model` with the preset. What `--model` fits by itself (the built-in
    /// corpus's vocabulary, a shorter `train.seq_len`) is the preset as it runs.
    pub(crate) fn label_model_as_trained(
        &mut self,
        run: &super::child::ChildRun,
    ) -> anyhow::Result<()> {
        if self.from_config.model || self.model == FROM_CONFIG || self.preset.is_some() {
            return Ok(());
        }
        let (Some(dims), Some((_, loaded))) = (
            crate::config::preset_dimensions(&self.model),
            run.configs.first(),
        ) else {
            return Ok(());
        };
        let expected: Vec<usize> = dims
            .iter()
            .map(|(key, value)| {
                let key = format!("model.{key}");
                run.fit
                    .iter()
                    .find(|(k, _, _)| *k == key)
                    .map_or(*value, |(_, v, _)| *v)
            })
            .collect();
        // A Llama's key/value heads, MLP width and RoPE base count too.
        let (dims, extras_changed, label) =
            match loaded.config.model_preset().map_err(anyhow::Error::msg)? {
                ModelPreset::Gpt(g) => {
                    let (v, t, l, h, c) =
                        (g.vocab_size, g.max_seq_len, g.n_layer, g.n_head, g.n_embd);
                    ([v, t, l, h, c], false, dimensions_label(v, t, l, h, c))
                }
                ModelPreset::Llama(m) => {
                    let base = LlamaConfig::preset(&self.model);
                    let extras = |c: &LlamaConfig| (c.n_kv_head, c.ffn_hidden, c.rope_theta);
                    let changed = base.as_ref().is_some_and(|b| extras(b) != extras(&m));
                    let dims = [m.vocab_size, m.max_seq_len, m.n_layer, m.n_head, m.n_embd];
                    (dims, changed, llama_label(&m, base.as_ref()))
                }
            };
        if expected != dims || extras_changed {
            self.preset = Some(std::mem::replace(&mut self.model, label));
        }
        Ok(())
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

/// Refuse a list (`flag`'s) that names a value twice, naming it and the list: checked
/// before anything starts, since a repeated point's job would run again over the same
/// result file and log (and a repeated stage would run twice in every job).
pub fn no_repeats<T: PartialEq + fmt::Display>(
    list: &[T],
    flag: &str,
    what: &str,
) -> anyhow::Result<()> {
    for (i, v) in list.iter().enumerate() {
        if list[..i].contains(v) {
            let given: Vec<String> = list.iter().map(ToString::to_string).collect();
            bail!(
                "{flag} {} lists the {what} {v} twice: each value runs once, and a repeat would \
                 run the same job again over the same files; give each {what} once",
                given.join(",")
            );
        }
    }
    Ok(())
}

/// Every point of the matrix ranks x models x precisions x accumulations, in that nesting
/// order (N outermost); an empty list stands for the configuration's value, `resolved`.
pub fn matrix(
    ranks: &[usize],
    models: &[String],
    precisions: &[String],
    grad_accums: &[usize],
    resolved: &Resolved,
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
    // A value listed twice is the same point twice: its job would run again, over the
    // first one's result file and log.
    no_repeats(ranks, "--ranks", "world size")?;
    no_repeats(models, "--models", "model")?;
    no_repeats(precisions, "--precisions", "precision")?;
    no_repeats(grad_accums, "--grad-accum", "accumulation")?;
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
    // Checked here, before any job starts: a misspelt name would otherwise fail every
    // job of its row, one launch at a time.
    if let Some(m) = models.iter().find(|m| ModelPreset::lookup(m).is_err()) {
        bail!(
            "--models: '{m}' is not a model preset; use one of {}",
            zero_models::preset_names().join(", ")
        );
    }
    if let Some(p) = precisions
        .iter()
        .find(|p| !PRECISIONS.contains(&p.as_str()))
    {
        bail!(
            "--precisions: '{p}' is not a precision; use one of {}",
            PRECISIONS.join(", ")
        );
    }
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
                    let from_config = FromConfig {
                        model: model == FROM_CONFIG,
                        precision: precision == FROM_CONFIG,
                        grad_accum: grad_accum.is_none(),
                    };
                    let pick = |label: &String, own: &String| {
                        if label == FROM_CONFIG {
                            own.clone()
                        } else {
                            label.clone()
                        }
                    };
                    points.push(Point {
                        n,
                        model: pick(model, &resolved.model),
                        precision: pick(precision, &resolved.precision),
                        grad_accum: Some(grad_accum.unwrap_or(resolved.grad_accum)),
                        from_config,
                        preset: None,
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

    fn resolved() -> Resolved {
        Resolved {
            model: "v64-t64-l2-h4-c128".into(),
            precision: "bf16".into(),
            grad_accum: 1,
        }
    }

    #[test]
    fn file_names_show_resolved_values_and_round_trip() {
        let points = matrix(&[1, 4], &["gpt2-124m".into()], &[], &[2], &resolved()).unwrap();
        assert_eq!(points.len(), 2);
        assert_eq!(points[1].file_name(), "n4_gpt2-124m_bf16_a2.json");
        // The precision is the configuration's: no flag, but named by its value.
        assert_eq!(
            points[1].train_flags(),
            vec!["--model", "gpt2-124m", "--grad-accum", "2"]
        );
        for p in &points {
            let back = Point::from_file_name(&p.file_name()).unwrap();
            assert_eq!(
                (back.n, &back.model, &back.precision, back.grad_accum),
                (p.n, &p.model, &p.precision, p.grad_accum)
            );
        }
        let all = matrix(&[2], &[], &[], &[], &resolved()).unwrap();
        assert_eq!(all[0].file_name(), "n2_v64-t64-l2-h4-c128_bf16_a1.json");
        assert!(all[0].train_flags().is_empty());
        // Older files named `config` still parse.
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
        let r = resolved();
        assert!(matrix(&[], &[], &[], &[], &r).is_err());
        assert!(matrix(&[0], &[], &[], &[], &r).is_err());
        assert!(matrix(&[1], &["a_b".into()], &[], &[], &r).is_err());
        assert!(matrix(&[1], &[], &[], &[0], &r).is_err());
    }

    #[test]
    fn a_value_listed_twice_is_refused_naming_it() {
        let r = resolved();
        let e = |res: anyhow::Result<Vec<Point>>| res.unwrap_err().to_string();
        assert_eq!(
            e(matrix(&[1, 1], &[], &[], &[], &r)),
            "--ranks 1,1 lists the world size 1 twice: each value runs once, and a repeat \
             would run the same job again over the same files; give each world size once"
        );
        assert!(e(matrix(&[1, 2, 4, 2], &[], &[], &[], &r))
            .starts_with("--ranks 1,2,4,2 lists the world size 2 twice"));
        let m = e(matrix(&[1], &["tiny".into(), "tiny".into()], &[], &[], &r));
        assert!(
            m.starts_with("--models tiny,tiny lists the model tiny twice"),
            "{m}"
        );
        let p = e(matrix(&[1], &[], &["bf16".into(), "bf16".into()], &[], &r));
        assert!(
            p.starts_with("--precisions bf16,bf16 lists the precision bf16 twice"),
            "{p}"
        );
        let a = e(matrix(&[1], &[], &[], &[2, 1, 2], &r));
        assert!(
            a.starts_with("--grad-accum 2,1,2 lists the accumulation 2 twice"),
            "{a}"
        );
        assert!(no_repeats(&[0u8, 3, 0], "--stages", "stage").is_err());
        assert!(no_repeats(&[0u8, 1, 2, 3], "--stages", "stage").is_ok());
        // Distinct values still make every point.
        assert_eq!(matrix(&[1, 2], &[], &[], &[1, 2], &r).unwrap().len(), 4);
    }

    #[test]
    fn unknown_models_and_precisions_are_named_with_the_valid_ones() {
        let r = resolved();
        let e = matrix(&[1], &["small".into(), "gtp2".into()], &[], &[], &r)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'gtp2' is not a model preset"), "{e}");
        assert!(e.contains("gpt2-124m") && e.contains("llama-tiny"), "{e}");
        let e = matrix(&[1], &[], &["bf16".into(), "fp8".into()], &[], &r)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'fp8' is not a precision; use one of fp32, bf16, fp16"),
            "{e}"
        );
        // Both families' presets and every precision pass.
        let ok = matrix(
            &[1],
            &["llama-tiny".into(), "tiny".into()],
            &PRECISIONS.map(String::from),
            &[],
            &r,
        )
        .unwrap();
        assert_eq!(ok.len(), 6);
    }

    #[test]
    fn a_models_point_whose_set_changes_the_preset_is_named_by_what_it_trains() {
        let run = |set: &[&str], p: &Point| {
            let mut words: Vec<String> = set
                .iter()
                .flat_map(|s| ["--set".to_string(), s.to_string()])
                .collect();
            words.extend(p.train_flags());
            crate::sweep::child::train_configs(&words).unwrap()
        };
        let points = matrix(
            &[1],
            &["small".into(), "tiny".into()],
            &[],
            &[],
            &resolved(),
        )
        .unwrap();
        // --set model.width=32 wins over --model small's: the job trains another model.
        let mut small = points[0].clone();
        let width = ["model.width=32", "train.seq_len=8"];
        small.label_model_as_trained(&run(&width, &small)).unwrap();
        let dims = crate::config::preset_dimensions("small").unwrap();
        assert!(
            small.model.starts_with('v')
                && small.model.ends_with(&format!(
                    "-t{}-l{}-h{}-c32",
                    dims[1].1, dims[2].1, dims[3].1
                )),
            "{small}"
        );
        assert_eq!(small.preset.as_deref(), Some("small"));
        assert_eq!(
            small.file_name(),
            format!("n1_{}_bf16_a1.json", small.model)
        );
        // It still trains from the preset, with the --set over it.
        assert_eq!(small.train_flags(), ["--model", "small"]);
        let again = run(&width, &small);
        assert_eq!(again.configs[0].1.config.model.width, Some(32));
        // What --model fits by itself (tiny's sequence length and the built-in corpus's
        // vocabulary) is the preset as it runs: still named tiny; so is a plain preset.
        for (i, set) in [(1, &[][..]), (0, &["train.seq_len=8"][..])] {
            let mut p = points[i].clone();
            let before = p.model.clone();
            p.label_model_as_trained(&run(set, &p)).unwrap();
            assert_eq!((p.model, p.preset), (before, None));
        }
    }

    #[test]
    fn a_llama_with_a_changed_dimension_is_named_by_its_dimensions() {
        let mut c = Config {
            model: crate::config::ModelConfig {
                preset: Some("llama-tiny".into()),
                layers: Some(3),
                ..Default::default()
            },
            ..Default::default()
        };
        let r = Resolved::of(&c).unwrap();
        assert_eq!(r.model, "v64-t64-l3-h4-c16");
        c.model.layers = None;
        assert_eq!(Resolved::of(&c).unwrap().model, "llama-tiny");
        // Only a Llama key changed: named by it too, not as the preset (nor as another
        // point whose dimensions alone agree).
        c.model.n_kv_head = Some(1);
        c.model.ffn_hidden = Some(48);
        assert_eq!(Resolved::of(&c).unwrap().model, "v64-t64-l2-h4-c16-kv1-f48");
        c.model.ffn_hidden = None;
        c.model.rope_theta = Some(500000.0);
        assert_eq!(
            Resolved::of(&c).unwrap().model,
            "v64-t64-l2-h4-c16-kv1-r500000"
        );
    }
}
