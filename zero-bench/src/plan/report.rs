//! Printing a plan: the header (model, precision, memory budget, link model), the summary
//! table (N | stage | formula | plan | fits | comm/step | est. comm), which stages fit
//! at each N, and with `--verbose` each point's ledger, explanation and traffic.
//!
//! Byte counts are printed in decimal units (GB = 1e9, as in the ZeRO paper) through
//! the ledger's own `human_bytes`; the memory budget also in the unit it was given.

use std::fmt::Write as _;

use serde::Serialize;
use zero_core::ledger::human_bytes;

use super::compute::{Knobs, PointReport};
use super::model::PlanModel;

/// The whole plan, as `--json` writes it.
#[derive(Debug, Serialize)]
pub struct PlanReport {
    /// Model name (`gpt2-1.5b`, `synthetic`).
    pub model: String,
    /// Ψ.
    pub params: usize,
    /// Units of the model spec.
    pub units: usize,
    /// Activation arena per micro-step, bytes.
    pub activation_bytes: u64,
    /// Where the activation bytes come from.
    pub activation_note: String,
    /// `bf16`, `fp16`, `fp32`.
    pub precision: String,
    /// The dtype gradients accumulate in (`bf16`, `fp16`, `f32`).
    pub grad_accum_dtype: String,
    /// The dtype gradients are reduced in.
    pub grad_reduce_dtype: String,
    /// A.
    pub grad_accum: usize,
    /// B.
    pub micro_batch: usize,
    /// T.
    pub seq_len: usize,
    /// Per-GPU memory, bytes.
    pub gpu_mem_bytes: u64,
    /// Fraction of it kept free.
    pub headroom: f64,
    /// `gpu_mem x (1 - headroom)`.
    pub usable_bytes: u64,
    /// Alpha, seconds per ring step.
    pub link_latency_s: f64,
    /// Beta, bytes per second per rank.
    pub link_bytes_per_s: f64,
    /// With ranks per node: a rank's bandwidth inside its node, bytes/s.
    pub intra_bytes_per_s: f64,
    /// With ranks per node: a node's bandwidth to the others, bytes/s.
    pub inter_bytes_per_s: f64,
    /// L, when given.
    pub ranks_per_node: Option<usize>,
    /// One entry per (N, stage), N outer.
    pub points: Vec<PointReport>,
}

impl PlanReport {
    /// Assemble the report.
    pub fn new(
        model: &PlanModel,
        knobs: &Knobs,
        precision: &str,
        points: Vec<PointReport>,
    ) -> Self {
        PlanReport {
            model: model.name.clone(),
            params: model.numel,
            units: model.spec.units.len(),
            activation_bytes: model.activation_bytes,
            activation_note: model.activation_note.clone(),
            precision: precision.to_string(),
            grad_accum_dtype: knobs.precision_config().grad_dtype().to_string(),
            grad_reduce_dtype: knobs.precision_config().reduce_dtype().to_string(),
            grad_accum: knobs.grad_accum,
            micro_batch: knobs.micro_batch,
            seq_len: knobs.seq_len,
            gpu_mem_bytes: knobs.gpu_mem,
            headroom: knobs.headroom,
            usable_bytes: knobs.usable_bytes(),
            link_latency_s: knobs.alpha_s,
            link_bytes_per_s: knobs.beta_bytes_per_s,
            intra_bytes_per_s: knobs.intra_bytes_per_s,
            inter_bytes_per_s: knobs.inter_bytes_per_s,
            ranks_per_node: knobs.ranks_per_node,
            points,
        }
    }

    /// The text report; `verbose` adds every point's details.
    pub fn render(&self, verbose: bool, tflops: Option<f64>) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "model: {} (Ψ = {} parameters, {} units), {} (gradients accumulated in {}, reduced in {}), A = {} micro-steps of B = {} x T = {}",
            self.model,
            group(self.params as u64),
            self.units,
            self.precision,
            self.grad_accum_dtype,
            self.grad_reduce_dtype,
            self.grad_accum,
            self.micro_batch,
            self.seq_len
        );
        let _ = writeln!(
            o,
            "activations: {} per GPU ({})",
            human_bytes(self.activation_bytes as f64),
            self.activation_note
        );
        let _ = writeln!(
            o,
            "memory: {} per GPU ({}); fits when the plan <= {} ({:.0}% headroom for what the ledger does not hold: CUDA context, communication library buffers, allocator fragmentation)",
            human_bytes(self.gpu_mem_bytes as f64),
            binary(self.gpu_mem_bytes),
            human_bytes(self.usable_bytes as f64),
            self.headroom * 100.0
        );
        match self.ranks_per_node {
            None => {
                let _ = writeln!(
                    o,
                    "link: alpha = {} per ring step, beta = {}/s per rank ({:.0} Gb/s); ring collectives, no overlap with compute",
                    seconds(self.link_latency_s),
                    human_bytes(self.link_bytes_per_s),
                    self.link_bytes_per_s * 8.0 / 1e9
                );
            }
            Some(l) => {
                let gbps = |b: f64| b * 8.0 / 1e9;
                let _ = writeln!(
                    o,
                    "links: {l} rank(s) per node; alpha = {} per ring step; inside a node {}/s per rank ({:.0} Gb/s), out of a node {}/s shared by its ranks ({:.0} Gb/s); a world ring spanning nodes moves at the slower, no overlap with compute",
                    seconds(self.link_latency_s),
                    human_bytes(self.intra_bytes_per_s),
                    gbps(self.intra_bytes_per_s),
                    human_bytes(self.inter_bytes_per_s),
                    gbps(self.inter_bytes_per_s),
                );
            }
        }
        let fp32 = self.precision == "fp32";
        let _ = writeln!(
            o,
            "plan = the engine's own buffer ledger (rank N-1) + activations; formula = the ZeRO model states at {}{}",
            self.precision,
            if fp32 {
                " (no master copy); paper = the ZeRO paper's mixed-precision formula"
            } else {
                " (the ZeRO paper's mixed-precision formula)"
            }
        );
        o.push('\n');

        let mut header = format!("{:>7}  {:<7} {:<28}", "N", "stage", "formula");
        if fp32 {
            header.push_str(&format!(" {:<28}", "paper"));
        }
        header.push_str(&format!(
            " {:>11}  {:<4} {:>12} {:>11}",
            "plan", "fits", "comm/step", "est. comm"
        ));
        if tflops.is_some() {
            header.push_str(&format!(" {:>12}", "est. compute"));
        }
        let _ = writeln!(o, "{}", header.trim_end());
        for p in &self.points {
            let mut line = format!(
                "{:>7}  {:<7} {:<28}",
                p.world,
                format!("ZeRO-{}", p.stage),
                format!("{} = {}", p.formula, human_bytes(p.formula_bytes)),
            );
            if fp32 {
                line.push_str(&format!(
                    " {:<28}",
                    format!(
                        "{} = {}",
                        p.paper_formula,
                        human_bytes(p.paper_formula_bytes)
                    )
                ));
            }
            line.push_str(&format!(
                " {:>11}  {:<4} {:>12} {:>11}",
                human_bytes(p.plan_bytes as f64),
                if p.fits { "yes" } else { "no" },
                human_bytes(p.comm_sent_bytes as f64),
                seconds(p.est_comm_seconds)
            ));
            if let Some(c) = p.est_compute_seconds {
                line.push_str(&format!(" {:>12}", seconds(c)));
            }
            let _ = writeln!(o, "{line}");
        }
        o.push('\n');
        let mut worlds: Vec<usize> = self.points.iter().map(|p| p.world).collect();
        worlds.dedup();
        for n in worlds {
            let at_n: Vec<&PointReport> = self.points.iter().filter(|p| p.world == n).collect();
            let fit: Vec<String> = at_n
                .iter()
                .filter(|p| p.fits)
                .map(|p| format!("ZeRO-{}", p.stage))
                .collect();
            let _ = writeln!(
                o,
                "N = {n}: {} in {}; {}",
                if fit.is_empty() {
                    "no stage fits".to_string()
                } else {
                    format!("fits with {}", fit.join(", "))
                },
                human_bytes(self.usable_bytes as f64),
                recommend(&at_n)
            );
            if let Some(l) = self.ranks_per_node.filter(|&l| l < n) {
                let out: Vec<String> = at_n
                    .iter()
                    .map(|p| {
                        format!(
                            "ZeRO-{} {}",
                            p.stage,
                            human_bytes(p.node_egress_bytes as f64)
                        )
                    })
                    .collect();
                let _ = writeln!(
                    o,
                    "  {} nodes of {l}: per step {} leave each node",
                    n / l,
                    out.join(", ")
                );
            }
        }
        if verbose {
            for p in &self.points {
                o.push('\n');
                o.push_str(&render_point(p));
            }
        } else {
            let _ = writeln!(
                o,
                "\n(--verbose: memory by category, every difference from the formula explained, traffic per collective)"
            );
        }
        o
    }
}

/// One line: which of the planned stages at one N to use, and why. The rule is the one
/// `zero.stage = "auto"` applies: the lowest stage that fits, since each stage up holds
/// less but does more (stages 1 and 2 move what stage 0 moves but add a reduce-scatter
/// and an all-gather per step in place of one all-reduce; stage 3 moves 1.5x).
pub fn recommend(points: &[&PointReport]) -> String {
    let mut sorted: Vec<&&PointReport> = points.iter().collect();
    sorted.sort_by_key(|p| p.stage);
    let Some(best) = sorted.iter().find(|p| p.fits) else {
        let least = sorted.iter().min_by_key(|p| p.plan_bytes);
        return match least {
            Some(p) => format!(
                "recommend: none fits; the leanest planned, ZeRO-{}, needs {} ({} over): more GPUs, a smaller --micro-batch, or more memory",
                p.stage,
                human_bytes(p.plan_bytes as f64),
                human_bytes(p.plan_bytes.saturating_sub(p.usable_bytes) as f64)
            ),
            None => "recommend: nothing planned".into(),
        };
    };
    let lower: Vec<String> = sorted
        .iter()
        .filter(|p| p.stage < best.stage)
        .map(|p| {
            format!(
                "ZeRO-{} needs {}",
                p.stage,
                human_bytes(p.plan_bytes as f64)
            )
        })
        .collect();
    let why = if lower.is_empty() {
        "the lowest planned stage, and it fits".to_string()
    } else {
        format!("the lowest stage that fits ({})", lower.join(", "))
    };
    format!(
        "recommend ZeRO-{}: {why}; it moves {} per step",
        best.stage,
        human_bytes(best.comm_sent_bytes as f64)
    )
}

/// One point's details.
fn render_point(p: &PointReport) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "== N = {}, ZeRO-{} ==", p.world, p.stage);
    let _ = writeln!(o, "memory of rank {} by category:", p.rank);
    for line in p.plan_text.lines() {
        let _ = writeln!(o, "  {line}");
    }
    let _ = writeln!(
        o,
        "  {} the usable {}: {}",
        if p.fits { "fits in" } else { "does NOT fit in" },
        human_bytes(p.usable_bytes as f64),
        if p.fits {
            format!(
                "{} to spare",
                human_bytes((p.usable_bytes - p.plan_bytes) as f64)
            )
        } else {
            format!(
                "{} short",
                human_bytes((p.plan_bytes - p.usable_bytes) as f64)
            )
        }
    );
    let _ = writeln!(o, "plan vs the ZeRO formula:");
    for line in p.explanation_text.lines() {
        let _ = writeln!(o, "  {line}");
    }
    let _ = writeln!(
        o,
        "communication per optimizer step (each rank sends this much and receives as much):"
    );
    for c in &p.comm {
        let _ = writeln!(
            o,
            "  {:<15}{:<18}{:<6}{:<5}{:>8} calls {:>16} elements {:>12} {:>11}",
            c.collective,
            c.purpose,
            c.group,
            c.dtype,
            c.calls,
            group(c.elems),
            human_bytes(c.sent_bytes as f64),
            seconds(c.seconds)
        );
    }
    let _ = writeln!(
        o,
        "  + 1 all-reduce of 3 f64 (norm, overflow flag, loss) per step, outside the volume formulas"
    );
    let _ = writeln!(
        o,
        "  total {} sent; the paper's volume kΨ(N-1)/N = {:.4e} elements (unpadded Ψ; the ledger counts padded units, and at stage 3 no second gather of the last layer's units or of a table for its lookups' backward)",
        human_bytes(p.comm_sent_bytes as f64),
        p.paper_comm_elems
    );
    if p.ranks_per_node < p.world {
        let _ = writeln!(
            o,
            "  {} node(s) of {} rank(s): {} leave each node per step (a world ring's one link out of the node, plus the node's cross-node all-to-alls)",
            p.world / p.ranks_per_node,
            p.ranks_per_node,
            human_bytes(p.node_egress_bytes as f64)
        );
    }
    let _ = writeln!(
        o,
        "  alpha-beta: {} = {} latency (calls x ring steps x alpha) + {} bandwidth (bytes / the link's beta)",
        seconds(p.est_comm_seconds),
        seconds(p.est_comm_latency_seconds),
        seconds(p.est_comm_seconds - p.est_comm_latency_seconds)
    );
    if let Some(c) = p.est_compute_seconds {
        let _ = writeln!(
            o,
            "  compute: {} per step at --tflops; communication / compute = {:.2} (if nothing overlaps)",
            seconds(c),
            p.est_comm_seconds / c
        );
    }
    o
}

/// Seconds in a readable unit.
pub fn seconds(s: f64) -> String {
    let a = s.abs();
    if a >= 1.0 {
        format!("{s:.2} s")
    } else if a >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

/// An integer with thousands separators (`7,500,000,000`).
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in binary units (GiB), for the memory budget as devices are usually sized.
fn binary(b: u64) -> String {
    let gib = b as f64 / (1u64 << 30) as f64;
    if gib >= 1.0 {
        format!("{gib:.2} GiB")
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formatting() {
        assert_eq!(group(7_500_000_000), "7,500,000,000");
        assert_eq!(group(512), "512");
        assert_eq!(seconds(2.5), "2.50 s");
        assert_eq!(seconds(0.0125), "12.50 ms");
        assert_eq!(seconds(5e-6), "5.0 us");
        assert_eq!(binary(80 << 30), "80.00 GiB");
    }
}
