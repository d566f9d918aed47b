//! The memory a rank may plan for, and what fits in it: the guard every run passes before
//! anything is allocated, and `zero.stage = "auto"`.
//!
//! The budget is `--mem-limit` (per rank), or this node's available memory (the smaller
//! of MemAvailable and the cgroup's limit minus its usage) divided by the ranks on the
//! node, less `--mem-headroom` (default 10%) for what the ledger does not hold (the
//! program itself, MPI's buffers, allocator slack). A plan is the engine's own
//! `BufferPlan` for this configuration, world size and rank plus the model's activation
//! arena: what `train --dry-run` prints and the engine then allocates, byte for byte.
//!
//! `auto` picks the lowest stage whose plan fits: each stage up holds less but moves
//! more (stages 1-2 replace the all-reduce by a reduce-scatter and an all-gather, stage
//! 3 moves 1.5x). Ranks decide alike, or take the highest stage any of them needs (nodes
//! can differ in free memory).

use std::fmt::Write as _;

use crate::world::{self, WorldComm};
use anyhow::{anyhow, bail, Context};
use zero_comm::{Communicator, ReduceOp};
use zero_core::config::Stage;
use zero_core::ledger::{human_bytes, CommPlan};
use zero_core::plan::{BufferPlan, PlanInputs};
use zero_core::PartitionLayout;

use super::args::MemLimit;
use super::report;
use super::run::model_preset;
use crate::config::Config;

/// What each rank may plan for.
#[derive(Clone, Debug)]
pub struct Budget {
    /// Bytes per rank, headroom taken off.
    pub bytes: u64,
    /// Where it came from, for messages.
    pub source: String,
}

/// The plan of one configuration for one rank: every buffer plus the activations, and
/// the bytes it sends per step.
pub struct RankPlan {
    /// The engine's plan.
    pub plan: BufferPlan,
    /// The layout it partitions.
    pub layout: PartitionLayout,
    /// Bytes sent per optimizer step.
    pub comm_bytes: u64,
}

/// Plan `config` as the engine would for rank `rank` of `world`.
pub fn plan(config: &Config, world: usize, rank: usize) -> anyhow::Result<RankPlan> {
    let model = model_preset(config)?;
    let spec = model.spec();
    let layout =
        PartitionLayout::new(&spec, world, config.zero.align).context("partition layout")?;
    // The engine's model allocates its arena for micro_batch x context_len in f32.
    let act = model.activation_bytes(config.train.micro_batch, model.max_seq_len(), 4) as u64;
    let inputs = PlanInputs::from_config(&config.engine(), world, act);
    let plan = BufferPlan::new(&spec, &layout, &inputs, rank).context("memory plan")?;
    let comm_bytes = CommPlan::new(&layout, &plan, config.train.grad_accum).sent_bytes();
    Ok(RankPlan {
        plan,
        layout,
        comm_bytes,
    })
}

/// `config` at another stage.
fn at_stage(config: &Config, stage: Stage) -> Config {
    let mut c = config.clone();
    c.zero.stage = stage;
    c
}

/// This process's available memory: MemAvailable, capped by the cgroup's remaining
/// limit (v2 `memory.max - memory.current`, or v1 `limit_in_bytes - usage_in_bytes`).
pub fn host_available() -> Option<(u64, String)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let avail = meminfo.lines().find_map(|l| {
        let kb = l.strip_prefix("MemAvailable:")?.trim().strip_suffix("kB")?;
        kb.trim().parse::<u64>().ok().map(|k| k * 1024)
    })?;
    let read = |p: &str| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let cgroup = match (
        read("/sys/fs/cgroup/memory.max"),
        read("/sys/fs/cgroup/memory.current"),
    ) {
        (Some(max), Some(cur)) => Some(max.saturating_sub(cur)),
        _ => match (
            read("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
            read("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
        ) {
            // v1 reports "no limit" as a huge number: MemAvailable decides then.
            (Some(max), Some(cur)) if max < 1 << 60 => Some(max.saturating_sub(cur)),
            _ => None,
        },
    };
    Some(match cgroup {
        Some(c) if c < avail => (c, "the cgroup's memory limit minus its usage".into()),
        _ => (avail, "MemAvailable".into()),
    })
}

/// Each rank's budget (collective under MPI: the ranks of this node are counted).
/// `None` with `--mem-limit none`, or in a dry run without `--mem-limit`. On a device
/// with memory of its own (`device_memory`: its free bytes and its name), the budget is
/// that memory: the buffers the plan counts live there, one rank per device.
pub fn resolve(
    limit: Option<MemLimit>,
    headroom: f64,
    comm: Option<&WorldComm>,
    device_memory: Option<(u64, String)>,
) -> anyhow::Result<Option<Budget>> {
    let keep = 1.0 - headroom;
    if let (None, Some((free, name))) = (limit, &device_memory) {
        return Ok(Some(Budget {
            bytes: (*free as f64 * keep) as u64,
            source: format!(
                "free memory of {name}, {}, less {:.0}% headroom",
                human_bytes(*free as f64),
                headroom * 100.0
            ),
        }));
    }
    match (limit, comm) {
        (Some(MemLimit::None), _) => Ok(None),
        (Some(MemLimit::Bytes(b)), _) => Ok(Some(Budget {
            bytes: (b as f64 * keep) as u64,
            source: format!(
                "--mem-limit {} less {:.0}% headroom",
                human_bytes(b as f64),
                headroom * 100.0
            ),
        })),
        (None, None) => Ok(None),
        (None, Some(comm)) => {
            let local = world::ranks_on_this_node(comm)?;
            let Some((avail, what)) = host_available() else {
                log::warn!(
                    "cannot read this node's available memory (/proc/meminfo); no memory guard (give --mem-limit)"
                );
                return Ok(None);
            };
            Ok(Some(Budget {
                bytes: (avail as f64 * keep / local as f64) as u64,
                source: format!(
                    "{what} {} shared by {local} rank(s) on this node, less {:.0}% headroom",
                    human_bytes(avail as f64),
                    headroom * 100.0
                ),
            }))
        }
    }
}

/// Pick the stage of `config` (its `zero.stage = "auto"`): the lowest whose plan fits
/// `budget` on this rank, agreed across `comm`'s ranks (the highest any rank needs).
/// Returns the stage and, for rank 0 to print, the alternatives table.
pub fn choose_stage(
    config: &Config,
    world: usize,
    rank: usize,
    budget: &Budget,
    comm: Option<&WorldComm>,
) -> anyhow::Result<(Stage, String)> {
    // Only stages the rest of the configuration allows (zero.quantize_weights rules out
    // stage 0, and stages 1/2 in fp32).
    let plans: Vec<(Stage, RankPlan)> = Stage::ALL
        .iter()
        .filter(|&&s| at_stage(config, s).engine().validate().is_ok())
        .map(|&s| plan(&at_stage(config, s), world, rank).map(|p| (s, p)))
        .collect::<anyhow::Result<_>>()?;
    let mine = plans
        .iter()
        .find(|(_, p)| p.plan.total_bytes() <= budget.bytes)
        .map(|(s, _)| *s);
    // Agree: the highest stage any rank needs (4: some rank fits none).
    let mut need = [mine.map_or(4.0, |s| s.number() as f64)];
    if let Some(c) = comm {
        c.all_reduce(&mut need[..], ReduceOp::Max)
            .context("agreeing on the automatic stage")?;
    }
    let mut table = String::new();
    let _ = writeln!(
        table,
        "zero.stage = \"auto\": budget {} per rank ({})",
        human_bytes(budget.bytes as f64),
        budget.source
    );
    let _ = writeln!(
        table,
        "  {:<7} {:>12} {:<5} {:>12}",
        "stage", "plan/rank", "fits", "comm/step"
    );
    for (s, p) in &plans {
        let _ = writeln!(
            table,
            "  {:<7} {:>12} {:<5} {:>12}",
            format!("ZeRO-{}", s.number()),
            human_bytes(p.plan.total_bytes() as f64),
            if p.plan.total_bytes() <= budget.bytes {
                "yes"
            } else {
                "no"
            },
            human_bytes(p.comm_bytes as f64)
        );
    }
    let chosen = Stage::try_from(need[0] as i64).map_err(|_| {
        anyhow!(
            "{}no stage fits: {}",
            table,
            over_budget_advice(config, world, rank, budget)
        )
    })?;
    let _ = writeln!(
        table,
        "chosen: {chosen}, the lowest stage that fits{}",
        if Some(chosen) != mine {
            " on every rank (this rank alone would take a lower one)"
        } else {
            ""
        }
    );
    Ok((chosen, table))
}

/// The guard: `config`'s plan must fit `budget`, else an error with the plan by
/// category and what would fit.
pub fn guard(config: &Config, world: usize, rank: usize, budget: &Budget) -> anyhow::Result<()> {
    let p = plan(config, world, rank)?;
    let total = p.plan.total_bytes();
    if total <= budget.bytes {
        return Ok(());
    }
    let mut text = format!(
        "the memory plan of rank {rank} ({}, {} rank(s)) needs {}, over the budget of {} ({}) by {}; nothing was allocated.\n",
        config.zero.stage,
        world,
        human_bytes(total as f64),
        human_bytes(budget.bytes as f64),
        budget.source,
        human_bytes((total - budget.bytes) as f64)
    );
    text.push_str(&report::ledger(&p.plan, &[total]));
    text.push_str(&over_budget_advice(config, world, rank, budget));
    bail!(text)
}

/// What would fit instead: another stage at this micro-batch, or a smaller micro-batch
/// with more accumulation (the same global batch) at this stage or the next ones.
fn over_budget_advice(config: &Config, world: usize, rank: usize, budget: &Budget) -> String {
    let fits = |c: &Config| {
        plan(c, world, rank)
            .map(|p| (p.plan.total_bytes(), p.plan.total_bytes() <= budget.bytes))
            .ok()
    };
    let mut options = Vec::new();
    for &s in Stage::ALL.iter().filter(|&&s| s > config.zero.stage) {
        if let Some((bytes, true)) = fits(&at_stage(config, s)) {
            options.push(format!(
                "zero.stage = {} ({} per rank)",
                s.number(),
                human_bytes(bytes as f64)
            ));
            break;
        }
    }
    let (b, a) = (config.train.micro_batch, config.train.grad_accum);
    'smaller: for &s in Stage::ALL.iter().filter(|&&s| s >= config.zero.stage) {
        let mut rows = b / 2;
        while rows >= 1 && b.is_multiple_of(rows) {
            let mut c = at_stage(config, s);
            c.train.micro_batch = rows;
            c.train.grad_accum = a * (b / rows);
            if let Some((bytes, true)) = fits(&c) {
                options.push(format!(
                    "zero.stage = {}, train.micro_batch = {rows}, train.grad_accum = {} (the same global batch; {} per rank)",
                    s.number(),
                    c.train.grad_accum,
                    human_bytes(bytes as f64)
                ));
                break 'smaller;
            }
            if rows == 1 {
                break;
            }
            rows /= 2;
        }
    }
    // Activation checkpointing at every block: the same batch, recomputing each block's
    // internals in the backward.
    if config.model.checkpoint_every != Some(1) {
        for &s in Stage::ALL.iter().filter(|&&s| s >= config.zero.stage) {
            let mut c = at_stage(config, s);
            c.model.checkpoint_every = Some(1);
            if let Some((bytes, true)) = fits(&c) {
                options.push(format!(
                    "zero.stage = {}, model.checkpoint_every = 1 (activation checkpointing at every block: the same batch, each block recomputed in the backward; {} per rank)",
                    s.number(),
                    human_bytes(bytes as f64)
                ));
                break;
            }
        }
    }
    let mut text = if options.is_empty() {
        "No stage, smaller micro-batch or activation checkpointing fits this budget: use more ranks (stages 1-3 divide by N), a smaller model, or more memory per rank.".to_string()
    } else {
        format!("What would fit: {}.", options.join("; or "))
    };
    text.push_str(" (--mem-limit none turns the guard off.)");
    text
}
