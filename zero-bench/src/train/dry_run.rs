//! `train --dry-run`: the per-rank memory plan and the communication of one step for any
//! model size, N, stage and precision, without allocating anything big and without MPI.
//!
//! It builds the same `BufferPlan` the engine allocates from (`PlanInputs::from_config`
//! with the model's activation arena from `zero_models::activation_bytes_for`, sized as
//! `Gpt::new` sizes it: micro_batch rows x the model's context length, f32), so its
//! numbers equal what a real run reports, category by category.

use crate::config::LoadedConfig;
use anyhow::Context;
use serde_json::{json, Map, Value};
use zero_core::ledger::{CommPlan, PaperFormula};
use zero_core::plan::{BufferPlan, PlanInputs};
use zero_core::PartitionLayout;
use zero_models::activation_bytes_for;

use super::report;
use super::run::gpt_config;

/// Plan every configuration in `runs` for `world` ranks, print rank `show`'s plan in
/// full (and every rank's total when they differ) when `print`, and return the plans as
/// JSON.
pub fn plan(
    runs: &[LoadedConfig],
    world: usize,
    show: usize,
    print: bool,
) -> anyhow::Result<Value> {
    let mut stages = Vec::new();
    for loaded in runs {
        let c = &loaded.config;
        let gpt = gpt_config(c)?;
        let spec = gpt.spec();
        let layout =
            PartitionLayout::new(&spec, world, c.zero.align).context("partition layout")?;
        // The engine's model allocates its arena for micro_batch x context_len in f32.
        let act = activation_bytes_for(&gpt, c.train.micro_batch, gpt.max_seq_len, 4) as u64;
        let inputs = PlanInputs::from_config(&c.engine(), world, act);
        let plans: Vec<BufferPlan> = (0..world)
            .map(|r| BufferPlan::new(&spec, &layout, &inputs, r))
            .collect::<Result<_, _>>()
            .context("memory plan")?;
        let totals: Vec<u64> = plans.iter().map(BufferPlan::total_bytes).collect();
        let shown = &plans[show];
        let comm = CommPlan::new(&layout, shown, c.train.grad_accum);
        if print {
            println!(
                "\n=== dry run: {} on {world} rank(s), {} parameters ===",
                c.zero.stage,
                layout.numel()
            );
            print!("{}", report::ledger(shown, &totals));
            print!("{}", report::comm(&comm, shown));
        }
        let mut memory = Map::new();
        for (cat, bytes) in shown.by_category() {
            memory.insert(cat.name().into(), json!(bytes));
        }
        stages.push(json!({
            "stage": c.zero.stage.number(),
            "rank": show,
            "memory_bytes": memory,
            "total_bytes": shown.total_bytes(),
            "total_bytes_per_rank": totals,
            "formula_bytes_per_rank": PaperFormula::new(c.zero.stage, layout.numel(), world).total().to_f64(),
            "comm_sent_bytes_per_step": comm.sent_bytes(),
        }));
    }
    Ok(json!({ "world": world, "stages": stages }))
}
