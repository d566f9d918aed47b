//! Loading: TOML file -> `--set` overrides applied onto the TOML tree -> typed
//! deserialisation -> validation, keeping where every leaf came from.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use toml::{Table, Value};

use super::{resolve_any, resolve_model, Config, LoadError};
use zero_models::ModelPreset;

/// Where a configuration value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The built-in default.
    Default,
    /// A config file (its path).
    File(String),
    /// A `--set` argument.
    CommandLine,
    /// Computed from other values (the rule, in words).
    Derived(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "file {p}"),
            Source::CommandLine => f.write_str("command line"),
            Source::Derived(why) => write!(f, "derived: {why}"),
        }
    }
}

/// A validated configuration and the provenance of each value set by a file or the
/// command line (keys `section.key`; a key absent here is a default).
#[derive(Clone, Debug)]
pub struct LoadedConfig {
    /// The configuration, validated.
    pub config: Config,
    /// Source of each explicitly set leaf.
    pub provenance: BTreeMap<String, Source>,
    /// `zero.stage = "auto"`: the stage is chosen from the memory budget before the run
    /// (`config.zero.stage` holds the default until then).
    pub auto_stage: bool,
}

/// Read `path` (or start from defaults when `None`), apply `overrides`
/// (`section.key=value` each), deserialise and validate.
pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<LoadedConfig, LoadError> {
    match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|cause| LoadError::Io {
                path: p.display().to_string(),
                cause,
            })?;
            load_str(&text, &p.display().to_string(), overrides)
        }
        None => load_str("", "defaults", overrides),
    }
}

/// As [`load`], from TOML text; `origin` names it in messages and provenance.
pub fn load_str(text: &str, origin: &str, overrides: &[String]) -> Result<LoadedConfig, LoadError> {
    let mut file: Table = toml::from_str(text).map_err(|e| LoadError::Parse {
        origin: origin.to_string(),
        message: e.to_string(),
    })?;
    // `zero.stage = "auto"` is this tool's to resolve (zero-core's stage is a number).
    let file_auto = take_auto_stage(&mut file, origin)?;
    // Deserialise each layer alone first so an unknown key or a bad type is reported
    // against the place it came from.
    typed(&file, origin)?;
    let mut provenance = BTreeMap::new();
    leaves(&file, "", &mut |k| {
        provenance.insert(k, Source::File(origin.to_string()));
    });
    let mut cli = Table::new();
    for arg in overrides {
        let (key, value) = parse_override(arg)?;
        set_path(&mut cli, &key, value.clone(), arg)?;
    }
    let cli_auto = take_auto_stage(&mut cli, "command line (--set)")?;
    let cli_stage = cli
        .get("zero")
        .and_then(Value::as_table)
        .is_some_and(|z| z.contains_key("stage"));
    typed(&cli, "command line (--set)")?;
    let mut merged = file;
    leaves(&cli, "", &mut |k| {
        provenance.insert(k, Source::CommandLine);
    });
    if cli_auto {
        provenance.insert("zero.stage".into(), Source::CommandLine);
    } else if file_auto && !cli_stage {
        provenance.insert("zero.stage".into(), Source::File(origin.to_string()));
    }
    merge(&mut merged, cli);
    let mut config = typed(&merged, origin)?;
    let auto_stage = cli_auto || (file_auto && !cli_stage);
    if auto_stage {
        // The budget picks among the stages the rest of the configuration allows
        // (zero.hierarchical_weights: stage 3 only); until then, the lowest of them.
        let allowed = zero_core::Stage::ALL.into_iter().find(|&stage| {
            let mut c = config.clone();
            c.zero.stage = stage;
            c.validate().is_ok()
        });
        if let Some(stage) = allowed {
            config.zero.stage = stage;
        }
    }
    config.validate()?;
    Ok(LoadedConfig {
        config,
        provenance,
        auto_stage,
    })
}

/// Remove `zero.stage` from `t` when it is the string "auto" (any case); whether it was.
/// Any other text there (`zero.stage = "3"`) is refused naming both forms, where the
/// parser would say only that it expected an integer.
fn take_auto_stage(t: &mut Table, origin: &str) -> Result<bool, LoadError> {
    let Some(zero) = t.get_mut("zero").and_then(Value::as_table_mut) else {
        return Ok(false);
    };
    let Some(text) = zero.get("stage").and_then(Value::as_str) else {
        return Ok(false);
    };
    if !text.trim().eq_ignore_ascii_case("auto") {
        return Err(LoadError::Parse {
            origin: origin.to_string(),
            message: format!(
                "zero.stage = \"{text}\" is text: write the stage as a number, zero.stage = 0, 1, 2 or 3 (no quotes), or zero.stage = \"auto\""
            ),
        });
    }
    zero.remove("stage");
    Ok(true)
}

fn typed(t: &Table, origin: &str) -> Result<Config, LoadError> {
    Value::Table(t.clone())
        .try_into()
        .map_err(|e: toml::de::Error| LoadError::Parse {
            origin: origin.to_string(),
            message: e.to_string(),
        })
}

/// `section.key=value` -> (["section", "key"], value). The value is read as TOML
/// (`2`, `true`, `1e-3`, `[0.9, 0.95]`, `"x"`); anything else is taken as a string.
fn parse_override(arg: &str) -> Result<(Vec<String>, Value), LoadError> {
    let bad = |reason: &str| LoadError::BadOverride {
        arg: arg.to_string(),
        reason: reason.to_string(),
    };
    let (key, raw) = arg.split_once('=').ok_or_else(|| bad("no '='"))?;
    let path: Vec<String> = key.trim().split('.').map(str::to_string).collect();
    if path.len() < 2 || path.iter().any(String::is_empty) {
        return Err(bad("the key must be section.key"));
    }
    let raw = raw.trim();
    let value = toml::from_str::<Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(raw.to_string()));
    Ok((path, value))
}

fn set_path(t: &mut Table, path: &[String], value: Value, arg: &str) -> Result<(), LoadError> {
    let (last, parents) = path.split_last().ok_or_else(|| LoadError::BadOverride {
        arg: arg.to_string(),
        reason: "empty key".into(),
    })?;
    let mut at = t;
    for p in parents {
        let next = at
            .entry(p.clone())
            .or_insert_with(|| Value::Table(Table::new()));
        at = next.as_table_mut().ok_or_else(|| LoadError::BadOverride {
            arg: arg.to_string(),
            reason: format!("'{p}' is a value, not a section"),
        })?;
    }
    at.insert(last.clone(), value);
    Ok(())
}

fn merge(into: &mut Table, from: Table) {
    for (k, v) in from {
        match (into.get_mut(&k), v) {
            (Some(Value::Table(a)), Value::Table(b)) => merge(a, b),
            (_, v) => {
                into.insert(k, v);
            }
        }
    }
}

fn leaves(t: &Table, prefix: &str, f: &mut dyn FnMut(String)) {
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Table(sub) => leaves(sub, &key, f),
            _ => f(key),
        }
    }
}

impl LoadedConfig {
    /// `zero.ranks_per_node` as the launch has it (hpZ/qgZ: the nodes found), recorded as
    /// derived when it was not given.
    pub fn set_ranks_per_node(&mut self, ranks_per_node: usize) {
        if self.config.zero.ranks_per_node != ranks_per_node {
            self.config.zero.ranks_per_node = ranks_per_node;
            self.provenance.insert(
                "zero.ranks_per_node".into(),
                Source::Derived("the nodes of the launch".into()),
            );
        }
    }

    /// Where `key` (`section.key`) came from.
    pub fn source(&self, key: &str) -> Source {
        self.provenance.get(key).cloned().unwrap_or(Source::Default)
    }

    /// Every setting as a `key = value` line, in key order.
    pub fn settings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Ok(Value::Table(t)) = Value::try_from(&self.config) {
            leaves_with_values(&t, "", &mut |k, v| out.push(format!("{k} = {v}")));
        }
        out.sort();
        out
    }

    /// The resolved configuration, one `section.key = value  # source` line per leaf,
    /// including the values derived from others (model dimensions from the preset, the
    /// reduce policy, the reduce dtype, loss scaling), for printing at start.
    pub fn render(&self) -> String {
        let c = &self.config;
        let mut rows: Vec<(String, String, Source)> = Vec::new();
        if let Ok(Value::Table(t)) = Value::try_from(c) {
            leaves_with_values(&t, "", &mut |k, v| {
                let src = self.source(&k);
                let v = if self.auto_stage && k == "zero.stage" {
                    "\"auto\" (chosen from the memory budget before the run)".into()
                } else {
                    v
                };
                rows.push((k, v, src));
            });
        }
        let derived =
            |rows: &mut Vec<(String, String, Source)>, key: &str, v: String, why: &str| {
                if !rows.iter().any(|(k, _, _)| k == key) {
                    rows.push((key.to_string(), v, Source::Derived(why.to_string())));
                }
            };
        let preset = c.model.preset.clone().unwrap_or_default();
        if let Ok(ModelPreset::Llama(l)) = resolve_any(&c.model) {
            // A Llama's values from its preset, and those its rules derive (Hkv following
            // a multi-head preset's changed heads).
            let why = format!("preset \"{preset}\"");
            for (key, v) in [
                ("model.vocab_size", l.vocab_size.to_string()),
                ("model.context_len", l.max_seq_len.to_string()),
                ("model.layers", l.n_layer.to_string()),
                ("model.heads", l.n_head.to_string()),
                ("model.width", l.n_embd.to_string()),
                ("model.n_kv_head", l.n_kv_head.to_string()),
                ("model.ffn_hidden", l.ffn_hidden.to_string()),
                ("model.rope_theta", format!("{:?}", l.rope_theta)),
            ] {
                derived(&mut rows, key, v, &why);
            }
            derived(
                &mut rows,
                "model.vocab_block_rows",
                l.block_rows().to_string(),
                &format!(
                    "one block's worth: each table in {} unit(s)",
                    l.vocab_block_count()
                ),
            );
        }
        if let Ok(d) = resolve_model(&c.model) {
            let why = format!("preset \"{preset}\"");
            derived(
                &mut rows,
                "model.vocab_size",
                d.vocab_size.to_string(),
                &why,
            );
            derived(
                &mut rows,
                "model.context_len",
                d.max_seq_len.to_string(),
                &why,
            );
            derived(&mut rows, "model.layers", d.n_layer.to_string(), &why);
            derived(&mut rows, "model.heads", d.n_head.to_string(), &why);
            derived(&mut rows, "model.width", d.n_embd.to_string(), &why);
            derived(
                &mut rows,
                "model.vocab_block_rows",
                d.block_rows().to_string(),
                &format!(
                    "12 x width + 13, or more past 4096 blocks: wte in {} unit(s)",
                    d.vocab_block_count()
                ),
            );
            derived(
                &mut rows,
                "model.checkpoint_every",
                d.checkpoint_every.to_string(),
                "0: activation checkpointing off",
            );
        }
        derived(
            &mut rows,
            "zero.reduce_every_micro_step",
            c.zero.reduce_every_micro_step().to_string(),
            "true for stages 2/3, false for 0/1",
        );
        if c.zero.bucket_elems.is_none() {
            derived(
                &mut rows,
                "zero.bucket_elems",
                format!(
                    "\"auto\" (max(4Mi, 64Ki x N) = {} at N = 1)",
                    c.zero.bucket_elems_for(1)
                ),
                "a memory budget that grows with N",
            );
        }
        if c.optim.schedule == zero_core::config::Schedule::WarmupCosine
            && c.optim.decay_steps.is_none()
        {
            derived(
                &mut rows,
                "optim.decay_steps",
                c.train.steps.to_string(),
                "train.steps",
            );
        }
        // The keys take "half" or "f32"; the comment names the dtype "half" is.
        let key_value = |dtype: zero_kernels::DType| {
            if dtype == zero_kernels::DType::F32 {
                "\"f32\"".to_string()
            } else {
                "\"half\"".to_string()
            }
        };
        let why = format!("the parameter dtype ({})", c.precision.dtype.param_dtype());
        derived(
            &mut rows,
            "precision.grad_reduce_dtype",
            key_value(c.precision.reduce_dtype()),
            &why,
        );
        derived(
            &mut rows,
            "precision.grad_accum_dtype",
            key_value(c.precision.grad_dtype()),
            &why,
        );
        derived(
            &mut rows,
            "precision.loss_scaling",
            c.precision.loss_scaling().to_string(),
            "on for fp16 only",
        );
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let width = rows
            .iter()
            .map(|(k, v, _)| k.len() + v.len())
            .max()
            .unwrap_or(0)
            + 3;
        let mut out = String::new();
        for (k, v, src) in rows {
            let kv = format!("{k} = {v}");
            let _ = writeln!(out, "{kv:<width$}  # {src}");
        }
        out
    }
}

fn leaves_with_values(t: &Table, prefix: &str, f: &mut dyn FnMut(String, String)) {
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Table(sub) => leaves_with_values(sub, &key, f),
            _ => f(key, v.to_string()),
        }
    }
}
