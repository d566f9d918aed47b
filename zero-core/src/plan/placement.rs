//! Where one unit lives on this rank, in every buffer: the one place that knows, per
//! stage, which buffers hold the whole unit and which only this rank's shard (the table
//! in this module's parent). The engine's step, its checkpoint export and import, and
//! its parameter refresh all read these ranges; none recomputes them.
//!
//! Ranges are in elements. "Unit-relative" ranges index the unit's padded flat buffer
//! (`0..padded_len`); the others index a buffer of the plan (Params, Grads, the
//! optimizer state Master/AdamM/AdamV).

use std::ops::Range;

use crate::config::Stage;
use crate::layout::UnitLayout;

/// One unit on one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitPlacement {
    /// Unit-relative elements this rank owns: `rank * shard_len .. (rank + 1) * shard_len`.
    pub own: Range<usize>,
    /// The unit's working parameters in Params: the whole padded unit (stages 0-2) or
    /// this rank's shard (stage 3).
    pub params: Range<usize>,
    /// The unit's gradient accumulator in Grads: the whole padded unit (full gradients)
    /// or this rank's shard (stages 2/3 reducing every micro-step).
    pub grads: Range<usize>,
    /// This rank's summed gradient in Grads after the reduction: the whole unit (stage
    /// 0, all-reduced), the own block of the whole unit (stages 1-3 with full gradients),
    /// or the shard (sharded gradients).
    pub reduced_grads: Range<usize>,
    /// This rank's block of the reduced gradient in Grads: the elements whose squares it
    /// adds to the global norm, so each element is counted on exactly one rank (the own
    /// block at stage 0, where every rank holds the whole sum; `reduced_grads` otherwise).
    pub norm_grads: Range<usize>,
    /// Unit-relative elements this rank's optimizer updates: the whole padded unit at
    /// stage 0 (every rank updates everything), `own` otherwise.
    pub updates: Range<usize>,
    /// The optimizer state (Master, AdamM, AdamV) of `updates`.
    pub state: Range<usize>,
    /// The working parameters of `updates` in Params (in fp32 training, the master).
    pub updated_params: Range<usize>,
}

impl UnitPlacement {
    /// Unit `unit` on `rank` at `stage`, gradients sharded or full.
    pub fn new(stage: Stage, grads_sharded: bool, unit: &UnitLayout, rank: usize) -> Self {
        let s = unit.shard_len;
        let own = rank * s..(rank + 1) * s;
        let whole = unit.unit_offset..unit.unit_offset + unit.padded_len;
        let shard = unit.shard_offset..unit.shard_offset + s;
        let own_in_whole = unit.unit_offset + own.start..unit.unit_offset + own.end;
        let grads = if grads_sharded {
            shard.clone()
        } else {
            whole.clone()
        };
        // The stage differences of where things live, all in this one match.
        match stage {
            Stage::Zero0 => UnitPlacement {
                own: own.clone(),
                params: whole.clone(),
                grads,
                reduced_grads: whole.clone(),
                norm_grads: own_in_whole,
                updates: 0..unit.padded_len,
                state: whole.clone(),
                updated_params: whole,
            },
            Stage::Zero1 | Stage::Zero2 => UnitPlacement {
                own: own.clone(),
                params: whole,
                reduced_grads: if grads_sharded {
                    shard.clone()
                } else {
                    own_in_whole.clone()
                },
                norm_grads: if grads_sharded {
                    shard.clone()
                } else {
                    own_in_whole.clone()
                },
                grads,
                updates: own,
                state: shard,
                updated_params: own_in_whole,
            },
            Stage::Zero3 => UnitPlacement {
                own: own.clone(),
                params: shard.clone(),
                reduced_grads: if grads_sharded {
                    shard.clone()
                } else {
                    own_in_whole.clone()
                },
                norm_grads: if grads_sharded {
                    shard.clone()
                } else {
                    own_in_whole
                },
                grads,
                updates: own,
                state: shard.clone(),
                updated_params: shard,
            },
        }
    }

    /// The own block inside a range that covers `updates` (the state, or the updated
    /// parameters): what this rank exports to a checkpoint at every stage.
    pub fn own_within(&self, covering_updates: &Range<usize>) -> Range<usize> {
        let at = covering_updates.start + (self.own.start - self.updates.start);
        at..at + self.own.len()
    }
}
