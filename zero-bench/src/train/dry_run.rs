//! `train --dry-run`: the per-rank memory plan and the communication of one step for any
//! model size, N, stage and precision, without allocating anything big and without MPI.
//!
//! It builds the same `BufferPlan` the engine allocates from (`budget::plan`: the
//! engine's inputs with the model's activation arena, sized as `Gpt::new` sizes it), so
//! its numbers equal what a real run reports, category by category.
//!
//! Every rank's total is accounted for, but no rank's plan is kept: ranks differ only
//! in where their shard of each unit meets the unit's padding (`BufferPlan::new` reads
//! the rank for that, `padding_in_shard`, and for the placements, which size nothing),
//! so one plan per distinct padding gives every rank's total. Memory stays in the
//! number of distinct totals and runs of equal ranks, not in N (262144 ranks of
//! gpt2-1.5b plan in a tenth of a second and under 20 MB).

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::config::LoadedConfig;
use serde_json::{json, Map, Value};
use zero_core::ledger::{CommPlan, PaperFormula};

use super::budget::Planner;
use super::report;
use crate::logging::{out, outln};

/// Up to this many ranks, every rank's total is listed when they differ (as a real
/// run's start lists them); above, runs of equal ranks.
const LIST_EVERY_RANK: usize = 64;

/// Runs of equal ranks named at most, with the largest and smallest total after them.
const LIST_RUNS: usize = 16;

/// Every rank's total bytes, as runs of consecutive ranks with the same total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankTotals {
    /// (first rank, ranks in the run, bytes each).
    runs: Vec<(usize, usize, u64)>,
}

impl RankTotals {
    /// The next rank's total.
    fn push(&mut self, total: u64) {
        match self.runs.last_mut() {
            Some((_, count, t)) if *t == total => *count += 1,
            _ => {
                let next = self.ranks();
                self.runs.push((next, 1, total));
            }
        }
    }

    /// Ranks counted.
    fn ranks(&self) -> usize {
        self.runs
            .last()
            .map_or(0, |(first, count, _)| first + count)
    }

    /// The largest total with its first rank, and the smallest with its.
    fn extremes(&self) -> Option<((u64, usize), (u64, usize))> {
        let most = self
            .runs
            .iter()
            .max_by_key(|(first, _, t)| (*t, std::cmp::Reverse(*first)))?;
        let least = self.runs.iter().min_by_key(|(first, _, t)| (*t, *first))?;
        Some(((most.2, most.0), (least.2, least.0)))
    }

    /// Every rank's total, in rank order (for the JSON report).
    fn expanded(&self) -> Vec<u64> {
        self.runs
            .iter()
            .flat_map(|&(_, count, t)| std::iter::repeat_n(t, count))
            .collect()
    }

    /// The line after the ledger: every rank the same, or how they differ. Up to
    /// [`LIST_EVERY_RANK`] ranks as `report::ledger` writes it for a real run.
    fn render(&self) -> String {
        let mut out = String::new();
        let ranks = self.ranks();
        match self.runs.as_slice() {
            [] => {}
            [(_, _, t)] => {
                if ranks > 1 {
                    let _ = writeln!(out, "every rank holds the same {t} B");
                }
            }
            runs if ranks <= LIST_EVERY_RANK => {
                let list: Vec<String> = runs
                    .iter()
                    .flat_map(|&(first, count, t)| {
                        (first..first + count).map(move |r| format!("rank {r} {t} B"))
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "ranks differ (partition padding falls unevenly): {}",
                    list.join(", ")
                );
            }
            runs => {
                let mut list: Vec<String> = runs
                    .iter()
                    .take(LIST_RUNS)
                    .map(|&(first, count, t)| match count {
                        1 => format!("rank {first} {t} B"),
                        _ => format!("ranks {first}-{} {t} B", first + count - 1),
                    })
                    .collect();
                if runs.len() > LIST_RUNS {
                    list.push(format!("... {} more run(s)", runs.len() - LIST_RUNS));
                }
                let _ = write!(
                    out,
                    "ranks differ (partition padding falls unevenly): {}",
                    list.join(", ")
                );
                if let Some(((most, at), (least, low))) = self.extremes() {
                    let _ = write!(
                        out,
                        "; most {most} B (rank {at}), least {least} B (rank {low})"
                    );
                }
                out.push('\n');
            }
        }
        out
    }
}

/// Every rank's total of the configuration `planner` plans, from one plan per distinct
/// partition padding (`shown`: rank `show`'s total, already known).
fn rank_totals(
    planner: &Planner,
    world: usize,
    show: usize,
    shown: u64,
) -> anyhow::Result<RankTotals> {
    let layout = planner.layout();
    let mut by_padding: HashMap<usize, u64> = HashMap::new();
    by_padding.insert(layout.padding_in_shard(show)?, shown);
    let mut totals = RankTotals::default();
    for r in 0..world {
        let padding = layout.padding_in_shard(r)?;
        let total = match by_padding.get(&padding) {
            Some(&t) => t,
            None => {
                let t = planner.buffers(r)?.total_bytes();
                by_padding.insert(padding, t);
                t
            }
        };
        totals.push(total);
    }
    Ok(totals)
}

/// Plan every configuration in `runs` for `world` ranks, print rank `show`'s plan in
/// full (and how the ranks' totals compare) when `print`, and return the plans as JSON
/// when `json` (every rank's total included).
pub fn plan(
    runs: &[LoadedConfig],
    world: usize,
    show: usize,
    print: bool,
    staged: bool,
    json: bool,
) -> anyhow::Result<Option<Value>> {
    let mut stages = Vec::new();
    for loaded in runs {
        let c = &loaded.config;
        let planner = Planner::new(c, world)?;
        let shown_plan = planner.rank(show)?;
        let (shown, layout) = (&shown_plan.plan, &shown_plan.layout);
        let totals = rank_totals(&planner, world, show, shown.total_bytes())?;
        let comm = CommPlan::new(layout, shown, c.train.grad_accum);
        if print {
            outln!(
                "\n=== dry run: {} on {world} rank(s), {} parameters ===",
                c.zero.stage,
                layout.numel()
            );
            out!("{}", report::ledger(shown, &[shown.total_bytes()]));
            out!("{}", totals.render());
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
        if !json {
            continue;
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
            "total_bytes_per_rank": totals.expanded(),
            "formula_bytes_per_rank": PaperFormula::for_precision(c.zero.stage, c.precision.dtype, layout.numel(), world).total().to_f64(),
            "comm_sent_bytes_per_step": comm.sent_bytes(),
            "host_staging_bytes": host_staging,
        }));
    }
    Ok(json.then(|| json!({ "world": world, "stages": stages })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(list: &[u64]) -> RankTotals {
        let mut t = RankTotals::default();
        for &x in list {
            t.push(x);
        }
        t
    }

    #[test]
    fn equal_ranks_are_one_run_and_print_as_before() {
        let t = totals(&[5, 5, 5, 5]);
        assert_eq!(t.runs, [(0, 4, 5)]);
        assert_eq!(t.render(), "every rank holds the same 5 B\n");
        assert_eq!(t.expanded(), [5, 5, 5, 5]);
        assert_eq!(totals(&[5]).render(), "");
    }

    #[test]
    fn few_ranks_that_differ_are_each_listed_as_a_run_lists_them() {
        let t = totals(&[7, 7, 6]);
        assert_eq!(t.runs, [(0, 2, 7), (2, 1, 6)]);
        assert_eq!(
            t.render(),
            "ranks differ (partition padding falls unevenly): rank 0 7 B, rank 1 7 B, rank 2 6 B\n"
        );
        assert_eq!(t.expanded(), [7, 7, 6]);
    }

    #[test]
    fn many_ranks_that_differ_print_runs_and_the_extremes() {
        let mut list = vec![9u64; 4095];
        list.push(8);
        let t = totals(&list);
        assert_eq!(t.runs.len(), 2);
        assert_eq!(
            t.render(),
            "ranks differ (partition padding falls unevenly): ranks 0-4094 9 B, rank 4095 8 B; most 9 B (rank 0), least 8 B (rank 4095)\n"
        );
        // Alternating totals: the runs listed are capped, the extremes still named.
        let list: Vec<u64> = (0..100).map(|r| 10 + (r % 2)).collect();
        let text = totals(&list).render();
        assert!(text.contains("... 84 more run(s)"), "{text}");
        assert!(
            text.ends_with("; most 11 B (rank 1), least 10 B (rank 0)\n"),
            "{text}"
        );
    }

    #[test]
    fn totals_from_distinct_paddings_equal_every_ranks_own_plan() {
        // Worlds that pad unevenly (7 ranks of tiny's units), every stage, hpZ and qgZ.
        let cases: &[(usize, &[&str])] = &[
            (7, &["zero.stage=0"]),
            (7, &["zero.stage=1"]),
            (7, &["zero.stage=2", "zero.align=3"]),
            (7, &["zero.stage=3"]),
            (13, &["zero.stage=3", "zero.align=5"]),
            (
                8,
                &[
                    "zero.stage=3",
                    "zero.hierarchical_weights=true",
                    "zero.ranks_per_node=4",
                ],
            ),
        ];
        for (world, extra) in cases {
            let mut o: Vec<String> = vec![
                "model.preset=\"tiny\"".into(),
                "model.vocab_size=64".into(),
                "train.seq_len=8".into(),
            ];
            o.extend(extra.iter().map(|s| s.to_string()));
            let c = crate::config::load(None, &o).expect("config").config;
            let planner = Planner::new(&c, *world).unwrap();
            let each: Vec<u64> = (0..*world)
                .map(|r| {
                    super::super::budget::plan(&c, *world, r)
                        .unwrap()
                        .plan
                        .total_bytes()
                })
                .collect();
            for show in [0, world - 1] {
                let shown = each[show];
                let t = rank_totals(&planner, *world, show, shown).unwrap();
                assert_eq!(t.expanded(), each, "{extra:?} on {world}");
            }
        }
    }
}
