//! Stage 3: when each unit is gathered and released, and which gather slot holds it.
//!
//! One micro-step is a timeline of 2L steps: forward step t runs layer t, backward step
//! t runs layer L-1-t. With prefetch p (layers), each use `f..=e` of a unit
//! ([`super::uses`]) is one span per pass:
//!
//! ```text
//! forward:  gathered at step max(0, f - p), released after step e
//! backward: gathered at step max(0, (L-1-e) - p), released after step L-1-f
//! ```
//!
//! Spans of one unit that touch or overlap once prefetch moves them earlier merge into
//! one (a gather never lands in a slot its unit still holds). So a unit with U uses is
//! gathered at most U times per pass, the table in docs/ARCHITECTURE.md's AΨ per pass
//! when every unit has one use. The backward's spans come from the uses by layers whose
//! backward reads the unit ([`super::uses::backward_read_uses`]): none for a table only
//! looked up.
//!
//! The last layer runs its backward right after its forward, so the units it reads in
//! both passes ([`GatherSchedule::carried`]) stay gathered from one into the other: one
//! gather of them per micro-step, not two (as FSDP keeps the root's parameters gathered
//! into the backward). Nothing else stays gathered across passes, and nothing across
//! micro-steps.
//!
//! The engine follows [`GatherSchedule`] literally, at each step t of a pass: (1) issue
//! the gathers of `gather[t]` (non-blocking, into the unit's slot), (2) wait for the
//! layer's own units, compute, (3) release `release[t]`. A slot is reused only by a
//! unit whose spans do not overlap those of the slot's other units (closed integer
//! intervals), so step (1) never writes a slot that is still in use.

use std::collections::BTreeMap;

use super::uses::UnitUse;

/// What the engine does at one step of a pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassStep {
    /// Units whose all-gather is issued at the start of this step.
    pub gather: Vec<usize>,
    /// Units whose gathered copy is released after this step's compute.
    pub release: Vec<usize>,
}

/// The stage-3 gather plan of one rank (the same on every rank).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatherSchedule {
    /// Length in elements of each gather slot (a buffer of the parameter dtype).
    pub slots: Vec<usize>,
    /// Slot of each unit; `None` for persistent units (always gathered, own buffer).
    pub unit_slot: Vec<Option<usize>>,
    /// Per forward step (= layer).
    pub forward: Vec<PassStep>,
    /// Per backward step t (runs layer L-1-t).
    pub backward: Vec<PassStep>,
    /// Units the last layer reads in both passes: its backward runs right after its
    /// forward, so they stay gathered from one into the other (not released after
    /// forward step L-1 nor gathered again at backward step 0).
    pub carried: Vec<usize>,
}

/// Closed interval of steps on the 2L timeline.
type Span = (usize, usize);

/// The spans of the units in one slot, by first step. They are pairwise disjoint (a
/// unit's own spans are merged, its forward ones end before its backward ones start, and
/// a unit joins a slot only if its spans overlap none there), so their ends increase
/// with their starts, and a span overlaps one of them exactly when it overlaps the last
/// one starting at or before its own end: one lookup, not a scan of the slot's history
/// (which made planning quadratic in the layer count).
#[derive(Default)]
struct Occupied(BTreeMap<usize, usize>);

impl Occupied {
    fn overlaps(&self, (g, r): Span) -> bool {
        self.0
            .range(..=r)
            .next_back()
            .is_some_and(|(_, &end)| end >= g)
    }

    fn add(&mut self, spans: &[Span]) {
        for &(g, r) in spans {
            let earlier = self.0.insert(g, r);
            debug_assert!(earlier.is_none(), "two spans of one slot start at step {g}");
        }
    }
}

/// Spans in step order, those that overlap or touch (the next gathered at or before
/// the step after the previous release) merged.
fn merged(spans: impl Iterator<Item = Span>) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::new();
    for (g, r) in spans {
        match out.last_mut() {
            Some(last) if g <= last.1 + 1 => last.1 = last.1.max(r),
            _ => out.push((g, r)),
        }
    }
    out
}

impl GatherSchedule {
    /// Plan gathers for units of `padded_len` with forward `uses`
    /// ([`super::uses::unit_uses`]; empty: unused) and the backward's `backward_reads`
    /// ([`super::uses::backward_read_uses`]), `persistent` units excluded, with
    /// `prefetch` layers ahead.
    pub fn new(
        padded_len: &[usize],
        uses: &[Vec<UnitUse>],
        backward_reads: &[Vec<UnitUse>],
        layers: usize,
        persistent: &[bool],
        prefetch: usize,
    ) -> GatherSchedule {
        let units = padded_len.len();
        let mut forward = vec![PassStep::default(); layers];
        let mut backward = vec![PassStep::default(); layers];
        let mut spans: Vec<Vec<Span>> = vec![Vec::new(); units];
        let mut carried = Vec::new();
        for u in 0..units {
            if persistent[u] {
                continue;
            }
            let fwd = merged(
                uses[u]
                    .iter()
                    .map(|x| (x.first.saturating_sub(prefetch), x.last)),
            );
            let bwd = merged(backward_reads[u].iter().rev().map(|x| {
                (
                    (layers - 1 - x.last).saturating_sub(prefetch),
                    layers - 1 - x.first,
                )
            }));
            // The last layer's own units (read by it in both passes) are carried.
            let last = layers.saturating_sub(1);
            let carry = uses[u].last().is_some_and(|x| x.last == last)
                && backward_reads[u].last().is_some_and(|x| x.last == last);
            for (i, &(g, r)) in fwd.iter().enumerate() {
                forward[g].gather.push(u);
                if !(carry && i + 1 == fwd.len()) {
                    forward[r].release.push(u);
                }
            }
            for (i, &(g, r)) in bwd.iter().enumerate() {
                if !(carry && i == 0) {
                    backward[g].gather.push(u);
                }
                backward[r].release.push(u);
            }
            if carry {
                carried.push(u);
            }
            // Backward steps sit after the forward ones on one timeline.
            spans[u] = fwd
                .into_iter()
                .chain(bwd.into_iter().map(|(g, r)| (g + layers, r + layers)))
                .collect();
        }

        // Greedy slot assignment in order of first gather (largest first on ties):
        // prefer the smallest free slot that fits, else grow the largest free one, else
        // open a new slot.
        let mut order: Vec<usize> = (0..units).filter(|&u| !spans[u].is_empty()).collect();
        order.sort_by_key(|&u| (spans[u][0].0, std::cmp::Reverse(padded_len[u])));
        let mut slots: Vec<usize> = Vec::new();
        let mut members: Vec<Occupied> = Vec::new();
        let mut unit_slot = vec![None; units];
        for u in order {
            let su = &spans[u];
            let need = padded_len[u];
            let free = |s: usize| su.iter().all(|&b| !members[s].overlaps(b));
            let fits = (0..slots.len())
                .filter(|&s| free(s) && slots[s] >= need)
                .min_by_key(|&s| slots[s]);
            let grow = (0..slots.len())
                .filter(|&s| free(s))
                .max_by_key(|&s| slots[s]);
            let s = match (fits, grow) {
                (Some(s), _) | (None, Some(s)) => s,
                (None, None) => {
                    slots.push(0);
                    members.push(Occupied::default());
                    slots.len() - 1
                }
            };
            slots[s] = slots[s].max(need);
            members[s].add(su);
            unit_slot[u] = Some(s);
        }
        GatherSchedule {
            slots,
            unit_slot,
            forward,
            backward,
            carried,
        }
    }

    /// Total elements of all gather slots.
    pub fn slot_elems(&self) -> usize {
        self.slots.iter().sum()
    }

    /// Largest sum of padded lengths gathered at once in either pass (a lower bound on
    /// [`Self::slot_elems`]; equal when the slot assignment is tight). The carried units
    /// are still gathered when the backward starts.
    pub fn peak_resident(&self, padded_len: &[usize]) -> usize {
        let mut peak = 0;
        let mut now = 0;
        for pass in [&self.forward, &self.backward] {
            for step in pass {
                now += step.gather.iter().map(|&u| padded_len[u]).sum::<usize>();
                peak = peak.max(now);
                now -= step.release.iter().map(|&u| padded_len[u]).sum::<usize>();
            }
        }
        peak
    }
}
