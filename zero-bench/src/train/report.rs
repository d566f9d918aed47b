//! Printed reports of `train`: the per-rank memory ledger next to the ZeRO paper's
//! formula (with zero-core's explanation of every byte of difference), the communication
//! plan of one step, and the stage-comparison table of `--stages` (also as JSON).
//!
//! The numbers all come from zero-core's ledgers (`BufferPlan`, `PaperFormula`,
//! `Explanation`, `CommPlan`) or from what the run measured; nothing is recomputed here.

use std::fmt::Write as _;

use serde::Serialize;
use zero_core::config::{Precision, Stage};
use zero_core::ledger::{
    human_bytes, paper_volume_psi, Collective, CommLine, CommPlan, CommPurpose, Explanation, Group,
    MemCategory, PaperFormula,
};
use zero_core::plan::BufferPlan;
use zero_kernels::DType;

/// The ledger of `plan`'s rank next to the paper's formula, category by category, then
/// the explanation of every difference; `totals` (every rank's total bytes, in rank
/// order) is listed when ranks differ (partition padding falls unevenly).
pub fn ledger(plan: &BufferPlan, totals: &[u64]) -> String {
    let stage = plan.inputs.stage;
    let precision = plan.inputs.precision;
    // The formula of the run's precision; for fp32 the paper's mixed-precision one beside.
    let f = PaperFormula::for_precision(stage, precision, plan.numel, plan.world);
    let mixed =
        (precision == Precision::Fp32).then(|| PaperFormula::new(stage, plan.numel, plan.world));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "memory of rank {} of {} ({stage}, {precision:?}, Ψ = {} parameters):",
        plan.rank, plan.world, plan.numel
    );
    let mut head = format!(
        "  {:<12} {:>12}   {:<19}",
        "category",
        "ledger",
        format!("formula ({})", precision_name(precision))
    );
    if mixed.is_some() {
        head.push_str(&format!("   {:<19}", "paper (mixed prec.)"));
    }
    let _ = writeln!(out, "{}", head.trim_end());
    let cell = |f: &PaperFormula, cat: MemCategory| match f.get(cat) {
        Some(b) => format!("{:<6} {:>12}", f.term(cat), b.to_string()),
        None => format!("{:<6} {:>12}", "", ""),
    };
    for (cat, bytes) in plan.by_category() {
        if bytes == 0 && f.get(cat).is_none() {
            continue;
        }
        let mut line = format!(
            "  {:<12} {:>12}   {}",
            cat.name(),
            human_bytes(bytes as f64),
            cell(&f, cat)
        );
        if let Some(m) = &mixed {
            line.push_str(&format!("   {}", cell(m, cat)));
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let mut line = format!(
        "  {:<12} {:>12}   {:<6} {:>12}",
        "total",
        human_bytes(plan.total_bytes() as f64),
        "",
        f.total().to_string()
    );
    if let Some(m) = &mixed {
        line.push_str(&format!("   {:<6} {:>12}", "", m.total().to_string()));
    }
    let _ = writeln!(out, "{line}");
    out.push_str(&Explanation::new(plan).render());
    if totals.iter().any(|&t| t != totals[0]) {
        let list: Vec<String> = totals
            .iter()
            .enumerate()
            .map(|(r, &t)| format!("rank {r} {t} B"))
            .collect();
        let _ = writeln!(
            out,
            "ranks differ (partition padding falls unevenly): {}",
            list.join(", ")
        );
    } else if totals.len() > 1 {
        let _ = writeln!(
            out,
            "every rank holds the same {} B",
            totals.first().copied().unwrap_or(0)
        );
    }
    out
}

/// "fp32", "bf16", "fp16".
pub fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "fp32",
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
    }
}

/// The communication of one optimizer step, per collective, with the volume of docs/ARCHITECTURE.md's table.
pub fn comm(cp: &CommPlan, plan: &BufferPlan) -> String {
    let n = cp.world as u64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "communication per step (A = {}, N = {}; each rank sends this much and receives as much):",
        cp.grad_accum, cp.world
    );
    let _ = writeln!(
        out,
        "  {:<15} {:<16} {:<6} {:<5} {:>6} {:>14} {:>12}",
        "collective", "purpose", "group", "dtype", "calls", "elements", "sent"
    );
    for l in &cp.lines {
        let _ = writeln!(
            out,
            "  {:<15} {:<16} {:<6} {:<5} {:>6} {:>14} {:>12}",
            format!("{:?}", l.collective),
            format!("{:?}", l.purpose),
            l.group.name(),
            l.dtype.to_string(),
            l.calls,
            l.elems,
            human_bytes(l.sent_bytes as f64)
        );
    }
    // qwZ's scales are not model elements: the volume counts the codes only.
    // The quantized gathers: stage 3's before each layer, else the after-step gathers.
    // (hpZ's backward gathers, on the node group, stay exact.)
    let is_gather = |l: &CommLine| {
        l.group == Group::World
            && match plan.inputs.stage {
                Stage::Zero3 => matches!(
                    l.purpose,
                    CommPurpose::GatherForward | CommPurpose::GatherBackward
                ),
                _ => l.purpose == CommPurpose::ParamsAfterStep,
            }
    };
    let hierarchical = plan.inputs.hierarchical_weights || plan.inputs.grad_quant_block.is_some();
    if hierarchical {
        // The paper's table counts world rings; hpZ and qgZ move traffic to the groups.
        let _ = writeln!(
            out,
            "  total sent {} ({} B): world {}, node group {}, cross-node group {} ({} node(s) of {} rank(s)); leaving each node {}",
            human_bytes(cp.sent_bytes() as f64),
            cp.sent_bytes(),
            human_bytes(cp.sent_bytes_on(Group::World) as f64),
            human_bytes(cp.sent_bytes_on(Group::Node) as f64),
            human_bytes(cp.sent_bytes_on(Group::Cross) as f64),
            cp.nodes(),
            cp.ranks_per_node,
            human_bytes(cp.node_egress_bytes() as f64),
        );
    } else {
        let k = paper_volume_psi(
            plan.inputs.stage,
            cp.grad_accum,
            plan.inputs.reduce_every_micro_step,
        ) as u64;
        let quant_scales = |l: &CommLine| {
            plan.inputs.quant_block.is_some() && is_gather(l) && l.dtype == DType::F32
        };
        // An all-reduce moves its buffer twice (reduce-scatter + all-gather).
        let elems: u64 = cp
            .lines
            .iter()
            .filter(|l| !quant_scales(l))
            .map(|l| match l.collective {
                Collective::AllReduce => 2 * l.elems,
                _ => l.elems,
            })
            .sum();
        let _ = writeln!(
            out,
            "  total sent {} ({} B); volume {} elements (padded) vs the paper's {k}Ψ = {} elements, each x (N-1)/N = {}/{n} (stage 3 gathers the last layer's units and the lookups' tables once less)",
            human_bytes(cp.sent_bytes() as f64),
            cp.sent_bytes(),
            elems,
            k * plan.numel as u64,
            n.saturating_sub(1),
        );
    }
    if let Some(block) = plan.inputs.quant_block {
        // What the same gathers would send as P values.
        let sent: u64 = cp
            .lines
            .iter()
            .filter(|l| is_gather(l))
            .map(|l| l.sent_bytes)
            .sum();
        let p = plan.param_dtype.size_bytes() as u64;
        let exact: u64 = cp
            .lines
            .iter()
            .filter(|l| is_gather(l) && l.dtype == DType::U8)
            .map(|l| l.elems * p * (n - 1) / n)
            .sum();
        let _ = writeln!(
            out,
            "  parameter gathers quantized (qwZ: int8 codes + one f32 scale per {block} values): {} vs {} as {} ({:.2}x less)",
            human_bytes(sent as f64),
            human_bytes(exact as f64),
            plan.param_dtype,
            exact as f64 / sent.max(1) as f64
        );
    }
    if let Some(c) = &cp.control {
        let _ = writeln!(
            out,
            "  + {} all-reduce of {} {} per step (gradient norm, overflow flag, loss)",
            c.calls, c.elems, c.dtype
        );
    }
    out
}

/// One stage's run, as the table and the JSON report show it.
#[derive(Clone, Debug, Serialize)]
pub struct StageResult {
    /// ZeRO stage 0-3.
    pub stage: usize,
    /// Steps run.
    pub steps: usize,
    /// Loss of every step (the global-batch mean).
    pub losses: Vec<f64>,
    /// Loss of the last step.
    pub final_loss: f64,
    /// Tokens in one step's global batch.
    pub tokens_per_step: u64,
    /// Mean step time, the first (warm-up) step excluded when there are others; the
    /// slowest rank's mean.
    pub mean_step_seconds: f64,
    /// The mean step time of each round (`--rounds`); `mean_step_seconds` is their mean.
    pub round_step_seconds: Vec<f64>,
    /// `tokens_per_step / mean_step_seconds`.
    pub tokens_per_s: f64,
    /// `mean_step_seconds / stage 0's`, when stage 0 ran in the same process.
    pub step_time_ratio_to_stage0: Option<f64>,
    /// The CPU target for that ratio (1.05 for stages 1-2, 1.2 for stage 3).
    pub ratio_target: Option<f64>,
    /// Ledger bytes held by each rank (measured from the allocations), rank order.
    pub ledger_bytes_per_rank: Vec<u64>,
    /// Model-state bytes of each rank (parameters, gradients, master, m, v and their
    /// partition padding: what the paper's formula counts), measured, rank order.
    pub state_bytes_per_rank: Vec<u64>,
    /// The formula's model-state bytes per rank for the run's precision (mixed: 16Ψ,
    /// 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N; fp32: 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N).
    pub formula_bytes_per_rank: f64,
    /// Steps skipped on every rank (inf/NaN gradients; divergent losses under
    /// `divergence.policy = "skip_step"`).
    #[serde(default)]
    pub skipped_steps: u64,
    /// Steps whose loss the loss guard called divergent (`[divergence]`).
    #[serde(default)]
    pub divergent_steps: u64,
    /// Peak resident set size of each rank during this stage's first run (VmHWM, reset
    /// before the stage; 0 if unknown).
    pub peak_rss_bytes_per_rank: Vec<u64>,
    /// Bytes rank 0 sent per step (mean over steps, measured).
    pub comm_sent_bytes_per_step: u64,
    /// Bytes each rank sends per step according to the communication ledger (data
    /// collectives, without the 24-byte control all-reduce).
    pub comm_plan_bytes_per_step: u64,
    /// Traffic on the node groups (an engine built on nodes: hpZ, qgZ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeTraffic>,
    /// How much of the communication ran behind compute (collectives left running: the
    /// host device, the simulated GPU, a CUDA device with `ZERO_CUDA_STAGED=overlap`);
    /// absent where none ran that way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<CommOverlap>,
}

/// Communication time per step, and the share of it compute hid: means over the steps
/// after the first and over the ranks (`zero_kernels::device::OverlapStats`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CommOverlap {
    /// Collectives started per step.
    pub collectives_per_step: f64,
    /// Seconds they ran per step (from each start until the rank saw it finish).
    pub comm_seconds_per_step: f64,
    /// Seconds of that the rank was held up (starting them, and blocked waiting).
    pub exposed_seconds_per_step: f64,
    /// 1 - exposed / comm: the share that ran behind compute.
    pub hidden_fraction: f64,
}

impl CommOverlap {
    /// One line for the end of a run.
    pub fn render(&self, stage: usize) -> String {
        format!(
            "overlap ZeRO-{stage}: {:.0}% of the communication ran behind compute ({:.1} of {:.1} ms per step held the rank up; {:.0} collectives per step)",
            self.hidden_fraction * 100.0,
            self.exposed_seconds_per_step * 1e3,
            self.comm_seconds_per_step * 1e3,
            self.collectives_per_step
        )
    }
}

/// Per-step traffic of a run on M nodes of L ranks, measured and from the ledger.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeTraffic {
    /// L.
    pub ranks_per_node: usize,
    /// M.
    pub nodes: usize,
    /// Bytes rank 0 sent per step on the node group (measured mean).
    pub node_sent_bytes_per_step: u64,
    /// Bytes rank 0 sent per step on the cross-node group (measured mean).
    pub cross_sent_bytes_per_step: u64,
    /// The same two from the ledger.
    pub node_plan_bytes_per_step: u64,
    /// See `node_plan_bytes_per_step`.
    pub cross_plan_bytes_per_step: u64,
    /// Bytes leaving each node per step, from the measured bytes
    /// (`zero_core::ledger::node_egress`).
    pub egress_bytes_per_step: u64,
    /// The same from the ledger.
    pub egress_plan_bytes_per_step: u64,
    /// The ledger's bytes leaving each node per step with hpZ, qgZ and qwZ off.
    pub egress_exact_plan_bytes_per_step: u64,
}

impl NodeTraffic {
    /// One line for the end of a run.
    pub fn render(&self, stage: usize) -> String {
        let b = |x: u64| human_bytes(x as f64);
        format!(
            "nodes ZeRO-{stage}: {} node(s) of {} rank(s); per rank and step: node group {} (ledger {}), cross-node group {} (ledger {}); leaving each node {} (ledger {}) vs {} with qwZ/hpZ/qgZ off ({:.2}x less)",
            self.nodes,
            self.ranks_per_node,
            b(self.node_sent_bytes_per_step),
            b(self.node_plan_bytes_per_step),
            b(self.cross_sent_bytes_per_step),
            b(self.cross_plan_bytes_per_step),
            b(self.egress_bytes_per_step),
            b(self.egress_plan_bytes_per_step),
            b(self.egress_exact_plan_bytes_per_step),
            self.egress_exact_plan_bytes_per_step as f64
                / self.egress_bytes_per_step.max(1) as f64
        )
    }
}

/// Fold a later round's run of the same stage into `into`: step time averaged over the
/// rounds. Peak RSS stays the first round's: the heap a process has touched rarely shrinks
/// back, so later rounds start from a higher floor that says nothing about the stage.
pub fn add_round(into: &mut StageResult, later: &StageResult) {
    into.round_step_seconds
        .extend_from_slice(&later.round_step_seconds);
    let n = into.round_step_seconds.len().max(1) as f64;
    into.mean_step_seconds = into.round_step_seconds.iter().sum::<f64>() / n;
    into.tokens_per_s = into.tokens_per_step as f64 / into.mean_step_seconds.max(f64::MIN_POSITIVE);
    // Overlap: the mean over rounds, each round weighing the same.
    let rounds = into.round_step_seconds.len() as f64;
    if let (Some(a), Some(b)) = (into.overlap.as_mut(), later.overlap.as_ref()) {
        let mix = |x: f64, y: f64| x + (y - x) / rounds;
        a.collectives_per_step = mix(a.collectives_per_step, b.collectives_per_step);
        a.comm_seconds_per_step = mix(a.comm_seconds_per_step, b.comm_seconds_per_step);
        a.exposed_seconds_per_step = mix(a.exposed_seconds_per_step, b.exposed_seconds_per_step);
        a.hidden_fraction = hidden(a.exposed_seconds_per_step, a.comm_seconds_per_step);
    }
}

/// 1 - exposed / total (0 without communication): `OverlapStats::hidden_fraction`.
pub fn hidden(exposed: f64, total: f64) -> f64 {
    let stats = zero_kernels::device::OverlapStats {
        tasks: 0,
        exposed_seconds: exposed,
        total_seconds: total,
    };
    stats.hidden_fraction().unwrap_or(0.0)
}

/// The CPU targets for the step-time ratio to stage 0.
pub fn ratio_target(stage: usize) -> Option<f64> {
    match stage {
        1 | 2 => Some(1.05),
        3 => Some(1.2),
        _ => None,
    }
}

/// Fill in each stage's step-time ratio to stage 0 (when stage 0 is among them).
pub fn set_ratios(results: &mut [StageResult]) {
    let base = results
        .iter()
        .find(|r| r.stage == 0)
        .map(|r| r.mean_step_seconds);
    for r in results.iter_mut() {
        r.step_time_ratio_to_stage0 = base.map(|b| r.mean_step_seconds / b);
        r.ratio_target = ratio_target(r.stage);
    }
}

/// `a/b/c MB` for a few ranks, `min..max MB (N ranks)` for many.
fn per_rank(v: &[u64]) -> String {
    let mb = |b: u64| format!("{:.1}", b as f64 / 1e6);
    if v.is_empty() {
        return "-".into();
    }
    if v.iter().all(|&b| b == v[0]) {
        return format!("{} MB", mb(v[0]));
    }
    if v.len() <= 4 {
        let parts: Vec<String> = v.iter().map(|&b| mb(b)).collect();
        return format!("{} MB", parts.join("/"));
    }
    let (lo, hi) = (
        v.iter().copied().min().unwrap_or(0),
        v.iter().copied().max().unwrap_or(0),
    );
    format!("{}..{} MB ({} ranks)", mb(lo), mb(hi), v.len())
}

/// The `--stages` comparison table.
pub fn stage_table(results: &[StageResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<6} {:>10} {:>10} {:>9} {:>14} {:>12} {:>10} {:>14} {:>24} {:>11}",
        "stage",
        "final loss",
        "tokens/s",
        "step ms",
        "vs stage 0",
        "states/rank",
        "formula",
        "ledger/rank",
        "peak RSS per rank",
        "sent/step"
    );
    for r in results {
        let ratio = match (r.step_time_ratio_to_stage0, r.ratio_target) {
            (Some(x), Some(t)) => format!(
                "{x:.3} {}",
                if x <= t {
                    format!("(<={t})")
                } else {
                    format!("(>{t}!)")
                }
            ),
            (Some(x), None) => format!("{x:.3}"),
            (None, _) => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<6} {:>10.4} {:>10.0} {:>9.1} {:>14} {:>12} {:>10} {:>14} {:>24} {:>11}",
            r.stage,
            r.final_loss,
            r.tokens_per_s,
            r.mean_step_seconds * 1e3,
            ratio,
            per_rank(&r.state_bytes_per_rank),
            human_bytes(r.formula_bytes_per_rank),
            per_rank(&r.ledger_bytes_per_rank),
            if r.peak_rss_bytes_per_rank.iter().all(|&b| b == 0) {
                "unknown".into()
            } else {
                per_rank(&r.peak_rss_bytes_per_rank)
            },
            human_bytes(r.comm_sent_bytes_per_step as f64),
        );
    }
    let _ = writeln!(
        out,
        "states: parameters, gradients, fp32 master, Adam m and v (+ padding), what the ZeRO \
         formula counts (for the run's precision: fp32 has no master copy); ledger: every byte \
         the engine holds (+ buffers, activations).\n\
         step ms: mean over steps after the first (warm-up), slowest rank (and over --rounds); \
         vs stage 0: ratio of \
         those means in this run (the CPU targets in parentheses: reported, not enforced)"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(stage: usize, secs: f64) -> StageResult {
        StageResult {
            stage,
            steps: 3,
            losses: vec![4.0, 3.0, 2.0],
            final_loss: 2.0,
            tokens_per_step: 100,
            mean_step_seconds: secs,
            round_step_seconds: vec![secs],
            tokens_per_s: 100.0 / secs,
            step_time_ratio_to_stage0: None,
            ratio_target: None,
            ledger_bytes_per_rank: vec![1_000_000, 1_000_064],
            state_bytes_per_rank: vec![500_000, 500_000],
            formula_bytes_per_rank: 999_000.0,
            peak_rss_bytes_per_rank: vec![0, 0],
            comm_sent_bytes_per_step: 4096,
            comm_plan_bytes_per_step: 4096,
            skipped_steps: 0,
            divergent_steps: 0,
            nodes: None,
            overlap: None,
        }
    }

    #[test]
    fn rounds_average_the_overlap() {
        let overlap = |exposed: f64| CommOverlap {
            collectives_per_step: 10.0,
            comm_seconds_per_step: 0.2,
            exposed_seconds_per_step: exposed,
            hidden_fraction: hidden(exposed, 0.2),
        };
        let mut a = StageResult {
            overlap: Some(overlap(0.1)),
            ..result(2, 0.5)
        };
        let b = StageResult {
            overlap: Some(overlap(0.05)),
            ..result(2, 0.5)
        };
        add_round(&mut a, &b);
        let o = a.overlap.expect("kept");
        assert!((o.exposed_seconds_per_step - 0.075).abs() < 1e-12);
        assert!((o.hidden_fraction - 0.625).abs() < 1e-12);
        assert!(o
            .render(2)
            .contains("of the communication ran behind compute"));
        assert_eq!(hidden(0.0, 0.0), 0.0);
    }

    #[test]
    fn ratios_are_relative_to_stage_0_of_the_same_run() {
        let mut rs = vec![result(0, 0.5), result(1, 0.5), result(3, 0.75)];
        set_ratios(&mut rs);
        assert_eq!(rs[0].step_time_ratio_to_stage0, Some(1.0));
        assert_eq!(rs[2].step_time_ratio_to_stage0, Some(1.5));
        assert_eq!(rs[2].ratio_target, Some(1.2));
        let table = stage_table(&rs);
        assert!(table.contains("1.500 (>1.2!)"), "{table}");
        assert!(table.contains("1.0/1.0 MB"), "{table}");
        assert!(table.contains(" 0.5 MB"), "{table}");
        let mut r = result(1, 0.5);
        add_round(&mut r, &result(1, 1.0));
        assert_eq!(r.mean_step_seconds, 0.75);
        assert_eq!(r.round_step_seconds, vec![0.5, 1.0]);
        let mut no_base = vec![result(2, 0.5)];
        set_ratios(&mut no_base);
        assert_eq!(no_base[0].step_time_ratio_to_stage0, None);
    }
}
