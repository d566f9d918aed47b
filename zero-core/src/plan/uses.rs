//! When each unit is in use: its layers, grouped into *uses*. A use is a stretch of
//! forward layers `first..=last` over which the unit stays resident: gathered once in
//! the forward at stage 3 (and once in the backward if a layer of it reads the unit
//! there, unless the last layer carries it across: `plan/gather.rs`), and, with sharded gradients (stages 2/3 reducing every micro-step),
//! its gradient accumulated over the use's layers and reduced once, after the backward
//! of `first`.
//!
//! A unit used by one run of consecutive layers has one use. A unit used again later
//! (a tied table read by the first and the last layer) has one use per run, unless the
//! layers in between use at most `reuse_distance` elements of other units: then the
//! runs merge into one use and the unit stays resident across the gap (the rule of
//! DeepSpeed's `stage3_max_reuse_distance`). Keeping it costs its size for the gap
//! (in each pass that reads it there), twice over with sharded gradients (the gathered
//! copy and an f32 accumulator); releasing it costs one more all-gather of the unit per
//! pass that reads it (the forward only, when the first use is a lookup) and one more
//! reduce-scatter per micro-step, and the gradient is then summed across ranks per use rather than once (the
//! same sum, rounded in another order).
//!
//! Stage 3's backward gathers a unit only for the layers whose backward reads it
//! ([`backward_read_uses`]): a lookup's backward adds the output's gradient into rows of
//! the table's gradient and reads no parameter, so a table read in the backward only by
//! lookups is not gathered there at all (its gradient still follows [`unit_uses`]).

use crate::spec::{LayerSpec, ModelSpec};

/// One use of a unit: forward layers `first..=last`, both using the unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitUse {
    /// First forward layer of the use (its gradient is complete after this layer's
    /// backward).
    pub first: usize,
    /// Last forward layer of the use (its backward starts the use's gradient).
    pub last: usize,
}

impl UnitUse {
    /// The use spans more than one layer: its gradient is accumulated across layers.
    pub fn accumulates(&self) -> bool {
        self.last > self.first
    }
}

/// Per unit, its uses in forward order (empty: unused).
pub fn unit_uses(spec: &ModelSpec, reuse_distance: usize) -> Vec<Vec<UnitUse>> {
    uses_over(spec, reuse_distance, |layer| &layer.units)
}

/// Per unit, its uses by the layers whose backward reads it
/// ([`crate::LayerSpec::backward_units`]): what stage 3 gathers in the backward. A unit
/// only looked up has none; the gradient still follows [`unit_uses`].
pub fn backward_read_uses(spec: &ModelSpec, reuse_distance: usize) -> Vec<Vec<UnitUse>> {
    uses_over(spec, reuse_distance, LayerSpec::backward_units)
}

fn uses_over(
    spec: &ModelSpec,
    reuse_distance: usize,
    units_of: impl Fn(&LayerSpec) -> &[usize],
) -> Vec<Vec<UnitUse>> {
    let mut layers_of: Vec<Vec<usize>> = vec![Vec::new(); spec.units.len()];
    for (l, layer) in spec.layers.iter().enumerate() {
        for &u in units_of(layer) {
            if layers_of[u].last() != Some(&l) {
                layers_of[u].push(l);
            }
        }
    }
    layers_of
        .iter()
        .enumerate()
        .map(|(u, layers)| {
            let mut uses: Vec<UnitUse> = Vec::new();
            for &l in layers {
                match uses.last_mut() {
                    Some(run) if run.last + 1 == l => run.last = l,
                    Some(run) if gap_elems(spec, u, run.last + 1..l) <= reuse_distance => {
                        run.last = l
                    }
                    _ => uses.push(UnitUse { first: l, last: l }),
                }
            }
            uses
        })
        .collect()
}

/// Elements of the units other than `unit` that layers `between` use (each unit once).
fn gap_elems(spec: &ModelSpec, unit: usize, between: std::ops::Range<usize>) -> usize {
    let mut seen = vec![false; spec.units.len()];
    seen[unit] = true;
    let mut elems = 0;
    for l in between {
        for &v in &spec.layers[l].units {
            if !std::mem::replace(&mut seen[v], true) {
                elems += spec.units[v].numel();
            }
        }
    }
    elems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::tied_spec;

    #[test]
    fn a_tied_table_is_one_use_within_the_distance_and_two_beyond() {
        // Layers: table lookup (units 0), blocks 1..=3, head (units 4 and 0).
        let spec = tied_spec(65, 16, 3, 8);
        let blocks: usize = (1..=3).map(|u| spec.units[u].numel()).sum();
        let near = unit_uses(&spec, blocks);
        assert_eq!(near[0], vec![UnitUse { first: 0, last: 4 }]);
        let far = unit_uses(&spec, blocks - 1);
        assert_eq!(
            far[0],
            vec![UnitUse { first: 0, last: 0 }, UnitUse { first: 4, last: 4 }]
        );
        for uses in [&near, &far] {
            assert_eq!(uses[2], vec![UnitUse { first: 2, last: 2 }]);
        }
        assert!(near[0][0].accumulates() && !far[0][0].accumulates());
    }
}
