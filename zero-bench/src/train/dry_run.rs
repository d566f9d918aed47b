//! `train --dry-run`: the per-rank memory plan and the communication of one step for any
//! model size, N, stage and precision, without allocating anything big and without MPI.
//!
//! It builds the same `BufferPlan` the engine allocates from (`budget::plan`: the
//! engine's inputs with the model's activation arena, sized as `Gpt::new` sizes it), so
//! its numbers equal what a real run reports, category by category.

use crate::config::LoadedConfig;
use serde_json::{json, Map, Value};
use zero_core::ledger::{CommPlan, PaperFormula};

use super::budget::{self, RankPlan};
use super::report;
use crate::logging::{out, outln};

/// Plan every configuration in `runs` for `world` ranks, print rank `show`'s plan in
/// full (and every rank's total when they differ) when `print`, and return the plans as
/// JSON.
pub fn plan(
    runs: &[LoadedConfig],
    world: usize,
    show: usize,
    print: bool,
    staged: bool,
) -> anyhow::Result<Value> {
    let mut stages = Vec::new();
    for loaded in runs {
        let c = &loaded.config;
        let plans: Vec<RankPlan> = (0..world)
            .map(|r| budget::plan(c, world, r))
            .collect::<anyhow::Result<_>>()?;
        let totals: Vec<u64> = plans.iter().map(|p| p.plan.total_bytes()).collect();
        let (shown, layout) = (&plans[show].plan, &plans[show].layout);
        let comm = CommPlan::new(layout, shown, c.train.grad_accum);
        if print {
            outln!(
                "\n=== dry run: {} on {world} rank(s), {} parameters ===",
                c.zero.stage,
                layout.numel()
            );
            out!("{}", report::ledger(shown, &totals));
            out!("{}", report::comm(&comm, shown));
        }
        // --comm mpi-staged: host memory beside the device ledger, one staging per
        // communicator the engine uses (the world's, and the node groups' with hpZ/qgZ).
        let host_staging = staged.then(|| {
            let communicators = if c.zero.hierarchical() { 3 } else { 1 };
            let region = zero_core::plan::host_staging_region_bytes(layout, shown);
            let held = communicators * zero_comm::Staging::held_bytes_for(region);
            if print {
                outln!(
                    "host staging (--comm mpi-staged): {} per rank in host memory, beside the device ledger ({communicators} communicator(s) x 2 slots x send + receive of {})",
                    zero_core::ledger::human_bytes(held as f64),
                    zero_core::ledger::human_bytes(region as f64)
                );
            }
            held
        });
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
            "formula_bytes_per_rank": PaperFormula::for_precision(c.zero.stage, c.precision.dtype, layout.numel(), world).total().to_f64(),
            "comm_sent_bytes_per_step": comm.sent_bytes(),
            "host_staging_bytes": host_staging,
        }));
    }
    Ok(json!({ "world": world, "stages": stages }))
}
