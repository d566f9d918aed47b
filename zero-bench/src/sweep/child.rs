//! What a `zero-bench train` command line that `sweep run` or `tune` launches will run:
//! its configurations (one per run of its stage list), loaded and validated here from the
//! very arguments the job gets, as train's own loading does (`--config`, every `--set`,
//! the convenience flags over them, what `--model` fits), so that a job that can only
//! fail is refused before anything starts, and a sweep or tune checks what its jobs run,
//! not the bare configuration.

use crate::train::TrainArgs;
use anyhow::{anyhow, Context as _};
use clap::Parser;

/// `train`'s arguments alone (the words after `zero-bench train`), as clap parses them
/// in the job.
#[derive(Parser)]
#[command(name = "zero-bench train", no_binary_name = true)]
struct TrainLine {
    #[command(flatten)]
    t: TrainArgs,
}

/// The configurations of one `train` command line.
pub(crate) struct ChildRun {
    /// One per run of its stage list (`None`: the configured stage), in order.
    pub configs: crate::train::StageRuns,
    /// What `--model` fitted besides the preset's dimensions (key, value, why).
    pub fit: crate::train::PresetFit,
}

/// Parse `train_words` (what follows `zero-bench train` on the job's command line) and
/// load every configuration it runs, as train does (`train::load_runs`): per run of
/// `--stages`, the file with the command line's overrides and what `--model` fits,
/// validated, and the model checked. An error names the stage whose configuration is
/// invalid when there is a list.
pub(crate) fn train_configs(train_words: &[String]) -> anyhow::Result<ChildRun> {
    let args = TrainLine::try_parse_from(train_words)
        .map_err(|e| anyhow!("{}", e.render().to_string().trim_end()))
        .with_context(|| format!("the job's arguments: train {}", train_words.join(" ")))?
        .t;
    let (configs, fit) = crate::train::load_runs(&args)?;
    Ok(ChildRun { configs, fit })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zero_core::config::Stage;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_command_line_is_loaded_as_train_loads_it_stage_by_stage() {
        // The stage list is what the job runs: hpZ at stage 3 is valid, though the
        // default stage is not 3.
        let ok = train_configs(&words(&[
            "--model",
            "tiny",
            "--stages",
            "3",
            "--set",
            "zero.hierarchical_weights=true",
            "--steps",
            "2",
        ]))
        .unwrap();
        assert_eq!(ok.configs.len(), 1);
        let c = &ok.configs[0].1.config;
        assert_eq!(c.zero.stage, Stage::Zero3);
        assert_eq!(c.train.steps, 2);
        // --model tiny fitted the sequence length to its context (8), as train does.
        assert_eq!(c.train.seq_len, 8);
        // A stage of the list that the configuration rules out is named.
        let e = train_configs(&words(&[
            "--model",
            "tiny",
            "--stages",
            "3,2",
            "--set",
            "zero.hierarchical_weights=true",
        ]))
        .err()
        .map(|e| crate::logging::chain(&e))
        .unwrap_or_default();
        assert!(
            e.starts_with("at stage 2: invalid configuration") && e.contains("set zero.stage = 3"),
            "{e}"
        );
        // The flags win over --set, as in the job: --steps 3 under a warmup of 5.
        let e = train_configs(&words(&[
            "--model",
            "tiny",
            "--set",
            "optim.schedule=\"warmup_cosine\"",
            "--set",
            "optim.warmup_steps=5",
            "--set",
            "train.steps=20",
            "--steps",
            "3",
        ]))
        .err()
        .map(|e| crate::logging::chain(&e))
        .unwrap_or_default();
        assert!(
            e.contains("optim.warmup_steps (5) exceeds the decay horizon (3 steps"),
            "{e}"
        );
        // A command line train would refuse is refused naming it.
        let e = train_configs(&words(&["--stepz", "3"]))
            .err()
            .map(|e| crate::logging::chain(&e))
            .unwrap_or_default();
        assert!(e.starts_with("the job's arguments: train --stepz 3"), "{e}");
    }
}
