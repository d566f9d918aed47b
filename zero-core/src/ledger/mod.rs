//! Ledgers: every byte the engine holds (memory plan, per rank, by category) and every
//! byte it communicates (per collective, per step), computed without allocating, next
//! to the ZeRO paper's formulas with each difference explained.

pub mod comm;
pub mod formula;
pub mod frac;
pub mod memory;
pub mod schedule;
#[cfg(test)]
mod tests;

pub use comm::{paper_volume_psi, Collective, CommLine, CommPlan, CommPurpose, ControlLine};
pub use formula::{Difference, Explanation, PaperFormula};
pub use frac::{human_bytes, Frac};
pub use memory::{BufferPlan, BufferRole, BufferSpec, Extent, MemCategory, PlanError, PlanInputs};
pub use schedule::{GatherSchedule, PassStep};
