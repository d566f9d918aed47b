//! The memory a rank may plan for, and what fits in it: the guard every run passes before
//! anything is allocated, and `zero.stage = "auto"`.
//!
//! The budget is `--mem-limit` (per rank), or this node's available memory (the smaller
//! of MemAvailable and what this process's memory cgroup, or one above it, leaves: its
//! limit minus its usage less the inactive page cache) divided by the ranks on the
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
    Planner::new(config, world)?.rank(rank)
}

/// What every rank's plan of one configuration on `world` ranks shares (the model's
/// spec, the partition layout, the engine's inputs), built once: a dry run of many
/// ranks plans each from it without building the model again.
pub struct Planner {
    spec: zero_core::ModelSpec,
    layout: PartitionLayout,
    inputs: PlanInputs,
    grad_accum: usize,
}

impl Planner {
    /// The shared part of `config`'s plans on `world` ranks.
    pub fn new(config: &Config, world: usize) -> anyhow::Result<Planner> {
        let model = model_preset(config)?;
        let spec = model.spec();
        let layout =
            PartitionLayout::new(&spec, world, config.zero.align).context("partition layout")?;
        // The engine's model allocates its arena for micro_batch x context_len in f32.
        let act = model.activation_bytes(config.train.micro_batch, model.max_seq_len(), 4) as u64;
        let inputs = PlanInputs::from_config(&config.engine(), world, act);
        Ok(Planner {
            spec,
            layout,
            inputs,
            grad_accum: config.train.grad_accum,
        })
    }

    /// The layout every rank partitions.
    pub fn layout(&self) -> &PartitionLayout {
        &self.layout
    }

    /// Rank `rank`'s buffers.
    pub fn buffers(&self, rank: usize) -> anyhow::Result<BufferPlan> {
        BufferPlan::new(&self.spec, &self.layout, &self.inputs, rank).context("memory plan")
    }

    /// Rank `rank`'s plan, with the bytes it sends per step.
    pub fn rank(&self, rank: usize) -> anyhow::Result<RankPlan> {
        let plan = self.buffers(rank)?;
        let comm_bytes = CommPlan::new(&self.layout, &plan, self.grad_accum).sent_bytes();
        Ok(RankPlan {
            plan,
            layout: self.layout.clone(),
            comm_bytes,
        })
    }
}

/// `config` at another stage.
fn at_stage(config: &Config, stage: Stage) -> Config {
    let mut c = config.clone();
    c.zero.stage = stage;
    c
}

/// This process's available memory: MemAvailable, capped by what its cgroup's memory
/// limit leaves ([`cgroup_memory`]: this process's own cgroup from /proc/self/cgroup and
/// every cgroup above it).
pub fn host_available() -> Option<(u64, String)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let avail = meminfo.lines().find_map(|l| {
        let kb = l.strip_prefix("MemAvailable:")?.trim().strip_suffix("kB")?;
        kb.trim().parse::<u64>().ok().map(|k| k * 1024)
    })?;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup_memory(&text, |p| std::fs::read_to_string(p).ok()));
    Some(match cgroup {
        Some(c) if c.remaining < avail => (c.remaining, c.describe()),
        _ => (avail, "MemAvailable".into()),
    })
}

/// Where cgroup v2 is mounted (the unified hierarchy), and v1's memory controller.
const CGROUP_V2_ROOT: &str = "/sys/fs/cgroup";
const CGROUP_V1_MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";

/// A limit at or above this is "no limit": v1 reports none as the largest page-aligned
/// i64 (9223372036854771712), and no machine has 2^60 bytes.
const NO_CGROUP_LIMIT: u64 = 1 << 60;

/// The memory limit that binds this process's cgroup: of the cgroup itself and each one
/// above it (a limit on a parent caps its children together), the one whose limit minus
/// usage (less the inactive page cache) leaves the least.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMemory {
    /// Bytes that limit leaves: `limit - (usage - inactive page cache)` (the limit where
    /// the usage is unreadable).
    pub remaining: u64,
    /// The limit itself.
    pub limit: u64,
    /// The cgroup whose limit it is, as /proc/self/cgroup names it ("/" for the root,
    /// e.g. a container's own under a cgroup namespace).
    pub cgroup: String,
    /// 1 or 2.
    pub version: u8,
}

impl CgroupMemory {
    /// For the budget's source: "the memory limit of cgroup ... minus its usage".
    /// (The usage counted leaves out the inactive page cache, as MemAvailable does.)
    pub fn describe(&self) -> String {
        format!(
            "the memory limit of cgroup {} (v{}, {}) minus its usage",
            self.cgroup,
            self.version,
            human_bytes(self.limit as f64)
        )
    }
}

/// The memory limit of this process's cgroup ([`CgroupMemory`]), from the text of
/// /proc/self/cgroup and `read` (a file's contents by path, `None` where it cannot be
/// read). v2: the `0::PATH` line, `memory.max` and `memory.current` less
/// `memory.stat`'s `inactive_file` in /sys/fs/cgroup/PATH; v1: the line whose
/// controllers include `memory`, `memory.limit_in_bytes` and `memory.usage_in_bytes`
/// less `total_inactive_file` in /sys/fs/cgroup/memory/PATH.
/// Each is read again in every directory above PATH up to the mount's root (under
/// Slurm the job's limit is set on the job's cgroup, the steps' and tasks' below it;
/// in a container whose mount shows only its own cgroup the limit is at the root).
/// Files that are missing or unreadable are skipped, and so are "max" and limits of
/// 2^60 bytes or more (no limit). `None` where no cgroup has a limit.
pub fn cgroup_memory(
    proc_self_cgroup: &str,
    read: impl Fn(&str) -> Option<String>,
) -> Option<CgroupMemory> {
    let number = |path: String| -> Option<u64> { read(&path)?.trim().parse().ok() };
    let mut best: Option<CgroupMemory> = None;
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        // The page cache's inactive part (`memory.stat`) counts in usage but is what
        // the kernel reclaims first, as MemAvailable counts it available: a job that
        // wrote its token file or checkpoints just before would otherwise look full.
        let (root, version, max, usage, reclaimable) = if id == "0" && controllers.is_empty() {
            (
                CGROUP_V2_ROOT,
                2,
                "memory.max",
                "memory.current",
                "inactive_file",
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                CGROUP_V1_MEMORY_ROOT,
                1,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            )
        } else {
            continue;
        };
        let Some(parts) = cgroup_components(path) else {
            continue;
        };
        // The cgroup itself, then each parent up to the root.
        for depth in (0..=parts.len()).rev() {
            let cgroup = format!("/{}", parts[..depth].join("/"));
            let dir = if depth == 0 {
                root.to_string()
            } else {
                format!("{root}{cgroup}")
            };
            // "max" (v2's no limit) does not parse and is skipped like a missing file.
            let Some(limit) = number(format!("{dir}/{max}")).filter(|&l| l < NO_CGROUP_LIMIT)
            else {
                continue;
            };
            let cache = read(&format!("{dir}/memory.stat"))
                .and_then(|stat| stat_value(&stat, reclaimable))
                .unwrap_or(0);
            let remaining = match number(format!("{dir}/{usage}")) {
                Some(used) => limit.saturating_sub(used.saturating_sub(cache)),
                None => limit,
            };
            if best.as_ref().is_none_or(|b| remaining < b.remaining) {
                best = Some(CgroupMemory {
                    remaining,
                    limit,
                    cgroup,
                    version,
                });
            }
        }
    }
    best
}

/// The value of `key` in a cgroup's `memory.stat` (lines of "key value").
fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The components of a cgroup path from /proc/self/cgroup (`/slurm/uid_1/job_2` ->
/// `["slurm", "uid_1", "job_2"]`); `None` for one that is not absolute or that climbs
/// (`..`), which no kernel writes.
fn cgroup_components(path: &str) -> Option<Vec<&str>> {
    let rest = path.trim_end().strip_prefix('/')?;
    let parts: Vec<&str> = rest
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    (!parts.contains(&"..")).then_some(parts)
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
    // Every smaller divisor of the micro-batch, largest first (the same global batch in
    // more, smaller micro-steps; 3 and 1 for 9, not only halvings).
    let divisors = smaller_divisors(b);
    'smaller: for &s in Stage::ALL.iter().filter(|&&s| s >= config.zero.stage) {
        for &rows in &divisors {
            let Some(accum) = a.checked_mul(b / rows) else {
                continue;
            };
            let mut c = at_stage(config, s);
            c.train.micro_batch = rows;
            c.train.grad_accum = accum;
            if let Some((bytes, true)) = fits(&c) {
                options.push(format!(
                    "zero.stage = {}, train.micro_batch = {rows}, train.grad_accum = {} (the same global batch; {} per rank)",
                    s.number(),
                    c.train.grad_accum,
                    human_bytes(bytes as f64)
                ));
                break 'smaller;
            }
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

/// The largest trial divisor [`smaller_divisors`] tries.
const DIVISOR_SEARCH: usize = 1 << 20;

/// The divisors of `b` below `b`, largest first (none for 0 or 1); found in pairs up to
/// the square root, and trial division stops at [`DIVISOR_SEARCH`]: every divisor of a
/// micro-batch up to 2^40, the small ones and their cofactors of a larger one (which no
/// memory holds anyway), in a millisecond rather than seconds.
fn smaller_divisors(b: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut d = 1;
    while d <= b / d && d <= DIVISOR_SEARCH {
        if b.is_multiple_of(d) {
            out.push(d);
            out.push(b / d);
        }
        d += 1;
    }
    out.sort_unstable_by(|x, y| y.cmp(x));
    out.dedup();
    out.retain(|&r| r < b);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A reader over an in-memory tree of cgroup files.
    fn files(entries: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = entries
            .iter()
            .map(|(p, v)| (p.to_string(), v.to_string()))
            .collect();
        move |p: &str| map.get(p).cloned()
    }

    const V2: &str = "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n";
    const V1: &str = "12:pids:/slurm/uid_1/job_42/step_0\n\
        4:memory:/slurm/uid_1/job_42/step_0/task_0\n\
        3:cpu,cpuacct:/slurm/uid_1/job_42/step_0\n\
        1:name=systemd:/user.slice\n0::/user.slice\n";

    #[test]
    fn v2_reads_the_jobs_own_cgroup_not_the_root() {
        // The root has no memory.max in v2; the job's limit is set on the job's cgroup.
        let job = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42";
        let read = files(&[
            (&format!("{job}/memory.max"), "8589934592\n"),
            (&format!("{job}/memory.current"), "1073741824\n"),
            (&format!("{job}/step_0/memory.max"), "max\n"),
            (&format!("{job}/step_0/memory.current"), "1000\n"),
            ("/sys/fs/cgroup/memory.current", "99999999999\n"),
        ]);
        let c = cgroup_memory(V2, read).unwrap();
        assert_eq!(c.remaining, 8589934592 - 1073741824);
        assert_eq!(c.limit, 8589934592);
        assert_eq!(c.version, 2);
        assert_eq!(c.cgroup, "/system.slice/slurmstepd.scope/job_42");
        let d = c.describe();
        assert!(
            d.contains("cgroup /system.slice/slurmstepd.scope/job_42") && d.contains("v2"),
            "{d}"
        );
    }

    /// The inactive page cache (`memory.stat`) counts as free, as MemAvailable counts it:
    /// a job that just wrote a token file is not told it is full.
    #[test]
    fn inactive_page_cache_counts_as_available() {
        let job = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42";
        let read = files(&[
            (&format!("{job}/memory.max"), "8000\n"),
            (&format!("{job}/memory.current"), "7000\n"),
            (
                &format!("{job}/memory.stat"),
                "anon 1000\nfile 6000\nactive_file 500\ninactive_file 5500\n",
            ),
        ]);
        assert_eq!(cgroup_memory(V2, read).unwrap().remaining, 8000 - 1500);
        let v1 = "/sys/fs/cgroup/memory/slurm/uid_1/job_42";
        let read = files(&[
            (&format!("{v1}/memory.limit_in_bytes"), "8000\n"),
            (&format!("{v1}/memory.usage_in_bytes"), "7000\n"),
            (
                &format!("{v1}/memory.stat"),
                "inactive_file 1\ntotal_inactive_file 3000\n",
            ),
        ]);
        assert_eq!(cgroup_memory(V1, read).unwrap().remaining, 8000 - 4000);
        // A cache larger than the usage read (the files are not read at one instant)
        // leaves the whole limit, never more.
        let read = files(&[
            (&format!("{job}/memory.max"), "8000\n"),
            (&format!("{job}/memory.current"), "100\n"),
            (&format!("{job}/memory.stat"), "inactive_file 900\n"),
        ]);
        assert_eq!(cgroup_memory(V2, read).unwrap().remaining, 8000);
    }

    #[test]
    fn nested_limits_take_the_one_that_leaves_least() {
        let job = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42";
        // The task's own limit is larger, but the job's (shared by its steps) leaves less.
        let read = files(&[
            (&format!("{job}/step_0/user/task_0/memory.max"), "6000\n"),
            (
                &format!("{job}/step_0/user/task_0/memory.current"),
                "1000\n",
            ),
            (&format!("{job}/memory.max"), "10000\n"),
            (&format!("{job}/memory.current"), "7000\n"),
        ]);
        let c = cgroup_memory(V2, read).unwrap();
        assert_eq!((c.remaining, c.limit), (3000, 10000));
        assert_eq!(c.cgroup, "/system.slice/slurmstepd.scope/job_42");
        // Without the job's usage, the task's own limit binds.
        let read = files(&[
            (&format!("{job}/step_0/user/task_0/memory.max"), "6000\n"),
            (
                &format!("{job}/step_0/user/task_0/memory.current"),
                "1000\n",
            ),
            (&format!("{job}/memory.max"), "10000\n"),
            (&format!("{job}/memory.current"), "1000\n"),
        ]);
        let c = cgroup_memory(V2, read).unwrap();
        assert_eq!((c.remaining, c.limit), (5000, 6000));
        assert_eq!(
            c.cgroup,
            "/system.slice/slurmstepd.scope/job_42/step_0/user/task_0"
        );
    }

    #[test]
    fn v1_reads_the_memory_controllers_line_and_walks_up() {
        let m = "/sys/fs/cgroup/memory";
        let read = files(&[
            // The task's and the root's "no limit": the largest page-aligned i64.
            (
                &format!("{m}/slurm/uid_1/job_42/step_0/task_0/memory.limit_in_bytes"),
                "9223372036854771712\n",
            ),
            (
                &format!("{m}/memory.limit_in_bytes"),
                "9223372036854771712\n",
            ),
            (&format!("{m}/memory.usage_in_bytes"), "5\n"),
            (
                &format!("{m}/slurm/uid_1/job_42/memory.limit_in_bytes"),
                "4096\n",
            ),
            (
                &format!("{m}/slurm/uid_1/job_42/memory.usage_in_bytes"),
                "1024\n",
            ),
        ]);
        let c = cgroup_memory(V1, read).unwrap();
        assert_eq!((c.remaining, c.limit, c.version), (3072, 4096, 1));
        assert_eq!(c.cgroup, "/slurm/uid_1/job_42");
    }

    #[test]
    fn the_root_file_counts_where_the_namespace_shows_slash() {
        // A container's cgroup namespace: its own cgroup is "/", mounted at the root.
        let read = files(&[
            ("/sys/fs/cgroup/memory.max", "2048\n"),
            ("/sys/fs/cgroup/memory.current", "48\n"),
        ]);
        let c = cgroup_memory("0::/\n", read).unwrap();
        assert_eq!((c.remaining, c.cgroup.as_str()), (2000, "/"));
        // v1 likewise; a usage that cannot be read leaves the whole limit.
        let read = files(&[("/sys/fs/cgroup/memory/memory.limit_in_bytes", "4096")]);
        let c = cgroup_memory("4:memory:/\n", read).unwrap();
        assert_eq!((c.remaining, c.limit, c.version), (4096, 4096, 1));
    }

    #[test]
    fn no_limit_max_missing_or_garbled_files_give_none() {
        assert_eq!(cgroup_memory(V2, files(&[])), None);
        assert_eq!(cgroup_memory("", files(&[])), None);
        let job = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42";
        let read = files(&[
            (&format!("{job}/memory.max"), "max\n"),
            (&format!("{job}/step_0/memory.max"), "lots\n"),
            ("/sys/fs/cgroup/memory.max", "-1\n"),
        ]);
        assert_eq!(cgroup_memory(V2, read), None);
        let read = files(&[(
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712",
        )]);
        assert_eq!(cgroup_memory(V1, read), None);
        // Lines of no memory hierarchy, malformed lines and relative or climbing paths.
        let read = files(&[("/sys/fs/cgroup/memory.max", "100")]);
        assert_eq!(
            cgroup_memory("3:cpu:/\nnonsense\n0::relative\n0::/a/../b\n", read),
            None
        );
        // Usage above the limit leaves nothing, not an underflow.
        let read = files(&[
            ("/sys/fs/cgroup/memory.max", "100"),
            ("/sys/fs/cgroup/memory.current", "150"),
        ]);
        assert_eq!(cgroup_memory("0::/\n", read).map(|c| c.remaining), Some(0));
    }

    #[test]
    fn v1_and_v2_lines_both_count_and_the_tighter_binds() {
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/slurm/uid_1/job_42/memory.limit_in_bytes",
                "9000",
            ),
            ("/sys/fs/cgroup/user.slice/memory.max", "500"),
        ]);
        let c = cgroup_memory(V1, read).unwrap();
        assert_eq!(
            (c.remaining, c.version, c.cgroup.as_str()),
            (500, 2, "/user.slice")
        );
    }

    #[test]
    fn every_smaller_divisor_is_tried_largest_first() {
        assert_eq!(smaller_divisors(5), [1]);
        assert_eq!(smaller_divisors(9), [3, 1]);
        assert_eq!(smaller_divisors(12), [6, 4, 3, 2, 1]);
        assert_eq!(smaller_divisors(16), [8, 4, 2, 1]);
        assert!(smaller_divisors(1).is_empty());
        assert!(smaller_divisors(0).is_empty());
        assert_eq!(smaller_divisors(49), [7, 1]);
        // Beyond 2^40 the small divisors and their cofactors, without a search to the
        // root: a prime near 2^63 gives 1 at once.
        assert_eq!(smaller_divisors(9223372036854775783), [1]);
        let big = (1usize << 62) + (1 << 61);
        let d = smaller_divisors(big);
        assert_eq!(d[0], big / 2);
        assert!(d.iter().all(|&x| big.is_multiple_of(x) && x < big));
    }

    fn tiny(extra: &[&str]) -> Config {
        let mut o: Vec<String> = [
            "model.preset=\"tiny\"",
            "model.vocab_size=64",
            "train.seq_len=8",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        o.extend(extra.iter().map(|s| s.to_string()));
        crate::config::load(None, &o).expect("config").config
    }

    #[test]
    fn an_odd_micro_batch_is_advised_its_smaller_divisors() {
        // The audit's case: B = 5 at stage 3 is over 230 kB, B = 1 with A = 5 is not.
        let c = tiny(&["zero.stage=3", "train.micro_batch=5"]);
        let one = tiny(&["zero.stage=3", "train.micro_batch=1", "train.grad_accum=5"]);
        let need = plan(&one, 1, 0).unwrap().plan.total_bytes();
        let over = plan(&c, 1, 0).unwrap().plan.total_bytes();
        assert!(need < over, "{need} {over}");
        let budget = Budget {
            bytes: need,
            source: "test".into(),
        };
        let text = over_budget_advice(&c, 1, 0, &budget);
        assert!(
            text.contains("train.micro_batch = 1, train.grad_accum = 5"),
            "{text}"
        );
        // B = 9: 3 is tried before 1.
        let c = tiny(&["zero.stage=3", "train.micro_batch=9"]);
        let three = tiny(&["zero.stage=3", "train.micro_batch=3", "train.grad_accum=3"]);
        let budget = Budget {
            bytes: plan(&three, 1, 0).unwrap().plan.total_bytes(),
            source: "test".into(),
        };
        let text = over_budget_advice(&c, 1, 0, &budget);
        assert!(
            text.contains("train.micro_batch = 3, train.grad_accum = 3"),
            "{text}"
        );
    }
}
