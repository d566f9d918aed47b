//! Ledgers: every byte the engine holds (the [`crate::plan::BufferPlan`], per rank, by
//! [`MemCategory`]) and every byte it communicates (per collective, per step), computed
//! without allocating, next to the ZeRO paper's formulas with each difference explained.

pub mod comm;
pub mod formula;
pub mod frac;
#[cfg(test)]
mod tests;

pub use comm::{
    node_egress, paper_volume_psi, Collective, CommLine, CommPlan, CommPurpose, ControlLine, Group,
    Links,
};
pub use formula::{Difference, Explanation, PaperFormula};
pub use frac::{human_bytes, Frac};

/// Memory categories of the ledger, per rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemCategory {
    /// Working parameters (16-bit copy; in fp32 training, the fp32 master itself).
    Params,
    /// Gradient accumulator (P dtype).
    Grads,
    /// fp32 master weights (16-bit training only).
    Master,
    /// Adam first moment.
    AdamM,
    /// Adam second moment.
    AdamV,
    /// Partition padding inside the buffers above (this rank's share).
    Padding,
    /// Stage 3: full copies of units under the persistence threshold.
    Persistent,
    /// Stage 3 with hpZ: this rank's part of the node's copy of the gathered weights.
    Secondary,
    /// Stage 3: gather slots (resident window, prefetch, tied units).
    Gather,
    /// f32 compute windows and tied-unit gradient accumulators.
    Compute,
    /// Gradient-reduction buckets and pieces.
    Buckets,
    /// The model's activation arena.
    Activations,
}

impl MemCategory {
    /// Every category, in report order.
    pub const ALL: [MemCategory; 12] = [
        MemCategory::Params,
        MemCategory::Grads,
        MemCategory::Master,
        MemCategory::AdamM,
        MemCategory::AdamV,
        MemCategory::Padding,
        MemCategory::Persistent,
        MemCategory::Secondary,
        MemCategory::Gather,
        MemCategory::Compute,
        MemCategory::Buckets,
        MemCategory::Activations,
    ];

    /// Short name for reports and metrics (`params`, `grads`, `master`, `adam_m`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            MemCategory::Params => "params",
            MemCategory::Grads => "grads",
            MemCategory::Master => "master",
            MemCategory::AdamM => "adam_m",
            MemCategory::AdamV => "adam_v",
            MemCategory::Padding => "padding",
            MemCategory::Persistent => "persistent",
            MemCategory::Secondary => "secondary",
            MemCategory::Gather => "gather",
            MemCategory::Compute => "compute",
            MemCategory::Buckets => "buckets",
            MemCategory::Activations => "activations",
        }
    }
}
