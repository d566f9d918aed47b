//! The partition layout: how every unit's parameters are laid out in one flat buffer and
//! which slice of it each of the N ranks owns.
//!
//! Invariants (every layer above relies on them):
//! - A unit's flat buffer is its parameters concatenated at [`UnitSpec::offsets`], then
//!   zero padding at the end only, so that `padded_len` is a multiple of `world * align`.
//!   Parameter offsets therefore do not depend on N: a checkpoint saved at N can be
//!   resharded onto M ranks by intersecting element ranges.
//! - Rank r owns `[r * shard_len, (r + 1) * shard_len)` of every unit, `shard_len =
//!   padded_len / world`, a multiple of `align` (so with `align = 32` every shard of a
//!   16-bit or fp32 buffer starts 64 bytes after an aligned base).
//! - Two concatenations are used by the engine: the *full* buffer (all units' padded
//!   buffers in unit order; `unit_offset`) and a rank's *shard* buffer (all its shards in
//!   unit order; `shard_offset`). Both keep every unit on an `align` boundary.
//!
//! Units are indexed as in the [`ModelSpec`]; parameters by a global index in unit order
//! (`ParamLayout` list), which is also their order in the spec.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::spec::{join_tensors, LayerSpec, ModelSpec, ParamSpec, RowBlock, Tensor, UnitSpec};

#[cfg(test)]
mod tests;

/// Default alignment in elements: 32 elements = 64 bytes at 2 bytes per element, so every
/// shard of a bf16/fp16 buffer (and, at 128 bytes, of an fp32 one) starts on a 64-byte
/// boundary.
pub const DEFAULT_ALIGN: usize = 32;

/// Errors building or querying a layout.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// World size 0.
    #[error("world size must be at least 1, got 0")]
    ZeroWorld,
    /// Alignment 0.
    #[error("alignment must be at least 1 element, got 0 (the default is {DEFAULT_ALIGN})")]
    ZeroAlign,
    /// A world size or alignment past what a layout may hold ([`MAX_WORLD`],
    /// [`MAX_ALIGN`]): a checkpoint saved so could not be read back.
    #[error(
        "world size {world} and alignment {align} must be at most 2^24 ranks and 2^20 \
         elements (the default alignment is {DEFAULT_ALIGN})"
    )]
    TooLarge {
        /// The world size asked for.
        world: usize,
        /// The alignment asked for.
        align: usize,
    },
    /// The model spec is malformed.
    #[error("invalid model spec: {0}")]
    BadSpec(String),
    /// A rank outside `0..world`.
    #[error("rank {rank} is out of range for world size {world}")]
    BadRank {
        /// The rank asked for.
        rank: usize,
        /// The layout's world size.
        world: usize,
    },
    /// A unit index outside the model.
    #[error("unit {unit} is out of range: the layout has {units} units")]
    BadUnit {
        /// The unit asked for.
        unit: usize,
        /// Units in the layout.
        units: usize,
    },
    /// A range that does not lie inside the unit's padded buffer.
    #[error("range {start}..{end} is not inside unit '{unit}' (padded length {padded_len})")]
    BadRange {
        /// Unit name.
        unit: String,
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// The unit's padded length.
        padded_len: usize,
    },
    /// Two layouts that do not describe the same parameters (resharding refused).
    #[error("layouts describe different models: {0}")]
    Incompatible(String),
    /// A layout read from a file that no model lays out so (corrupt or edited).
    #[error("inconsistent layout: {0}")]
    Inconsistent(String),
}

/// The most ranks a layout may span (2^24; a checkpoint's layout past it is corrupt).
pub const MAX_WORLD: usize = 1 << 24;

/// The largest shard alignment, in elements (2^20, 2-4 MB; a checkpoint's layout past
/// it is corrupt).
pub const MAX_ALIGN: usize = 1 << 20;

/// The most elements a layout read from a file may describe (2^48, a quarter of a
/// petabyte of fp32 state): beyond it the numbers are corrupt, not a model.
pub const MAX_LAYOUT_ELEMS: u128 = 1 << 48;

/// One unit in the layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitLayout {
    /// Unit name, as in the spec.
    pub name: String,
    /// Elements of the unit's parameters (no padding).
    pub numel: usize,
    /// Length of the flat buffer: `numel` rounded up to a multiple of `world * align`.
    pub padded_len: usize,
    /// Elements each rank owns: `padded_len / world`.
    pub shard_len: usize,
    /// Offset of this unit in the full concatenated buffer (sum of earlier `padded_len`).
    pub unit_offset: usize,
    /// Offset of this unit's shard in a rank's concatenated shard buffer (sum of earlier
    /// `shard_len`).
    pub shard_offset: usize,
    /// Global indices of this unit's parameters in [`PartitionLayout::params`].
    pub params: Range<usize>,
}

/// One named parameter in the layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamLayout {
    /// Name, as the model's spec gives it.
    pub name: String,
    /// Index of the unit holding it.
    pub unit: usize,
    /// Offset in elements inside the unit's flat buffer.
    pub offset: usize,
    /// Shape, row-major.
    pub shape: Vec<usize>,
    /// Elements (product of the shape).
    pub numel: usize,
    /// AdamW weight decay applies (by identity, never by a shard's shape).
    pub weight_decay: bool,
    /// Set when the parameter is a block of rows of a larger tensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_block: Option<RowBlock>,
}

/// The part of one parameter that falls inside a range of a unit's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Global parameter index in [`PartitionLayout::params`].
    pub param: usize,
    /// Elements of the parameter (flattened, row-major) covered.
    pub in_param: Range<usize>,
    /// The same elements, relative to the start of the queried range.
    pub in_range: Range<usize>,
}

/// A run of a flat buffer with one weight-decay flag (padding never decays).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Elements of the buffer.
    pub range: Range<usize>,
    /// AdamW weight decay applies to this run.
    pub weight_decay: bool,
}

/// One copy of a resharding plan: elements a new rank takes from an old rank's shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReshardCopy {
    /// Unit index.
    pub unit: usize,
    /// Rank of the old layout whose shard holds the elements.
    pub from_rank: usize,
    /// Range inside that old rank's shard of the unit.
    pub from: Range<usize>,
    /// Range inside the new rank's shard of the unit.
    pub to: Range<usize>,
}

/// How a model's parameters are partitioned over `world` ranks. Saved in checkpoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionLayout {
    /// N: ranks the buffers are partitioned over.
    pub world: usize,
    /// Alignment of every shard, in elements.
    pub align: usize,
    /// Units, in spec order.
    pub units: Vec<UnitLayout>,
    /// Parameters, in spec order (unit by unit).
    pub params: Vec<ParamLayout>,
}

/// Smallest multiple of `m` that is >= `x` (m >= 1).
fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

/// Intersection of two ranges (empty ranges start at `max(starts)`).
fn intersect(a: &Range<usize>, b: &Range<usize>) -> Range<usize> {
    let start = a.start.max(b.start);
    start..a.end.min(b.end).max(start)
}

impl PartitionLayout {
    /// Lay out `spec` over `world` ranks with shards aligned to `align` elements.
    pub fn new(spec: &ModelSpec, world: usize, align: usize) -> Result<Self, LayoutError> {
        if world == 0 {
            return Err(LayoutError::ZeroWorld);
        }
        if align == 0 {
            return Err(LayoutError::ZeroAlign);
        }
        if world > MAX_WORLD || align > MAX_ALIGN {
            return Err(LayoutError::TooLarge { world, align });
        }
        spec.validate().map_err(LayoutError::BadSpec)?;
        let quantum = world * align;
        let (mut units, mut params) = (Vec::new(), Vec::new());
        let (mut unit_offset, mut shard_offset) = (0, 0);
        for (u, unit) in spec.units.iter().enumerate() {
            let numel = unit.numel();
            // Pad to a multiple of N*align, and to at least one quantum so that an empty
            // remainder never makes a zero-length unit (validate() refuses empty units, but
            // a unit of zero-sized tensors has numel 0).
            let padded_len = round_up(numel, quantum).max(quantum);
            let first = params.len();
            params.extend(unit_params(u, unit));
            units.push(UnitLayout {
                name: unit.name.clone(),
                numel,
                padded_len,
                shard_len: padded_len / world,
                unit_offset,
                shard_offset,
                params: first..params.len(),
            });
            unit_offset += padded_len;
            shard_offset += padded_len / world;
        }
        Ok(PartitionLayout {
            world,
            align,
            units,
            params,
        })
    }

    /// Check a layout that came from a file before trusting its numbers: every shape's
    /// element count is its numel, the sizes are bounded ([`MAX_LAYOUT_ELEMS`]), and the
    /// layout is exactly what [`PartitionLayout::new`] makes of the model it describes at
    /// its world size and alignment (offsets, padding, shards, unit ranges, row blocks).
    /// Nothing is allocated in proportion to the sizes it claims.
    pub fn check_consistent(&self) -> Result<(), LayoutError> {
        let bad = |m: String| Err(LayoutError::Inconsistent(m));
        if !(1..=MAX_WORLD).contains(&self.world) || !(1..=MAX_ALIGN).contains(&self.align) {
            return bad(format!(
                "world {} and align {} must be in 1..=2^24 and 1..=2^20",
                self.world, self.align
            ));
        }
        let mut total: u128 = 0;
        for p in &self.params {
            let n = p.shape.iter().try_fold(1u128, |a, &d| {
                a.checked_mul(d as u128).filter(|&x| x <= MAX_LAYOUT_ELEMS)
            });
            if n != Some(p.numel as u128) {
                return bad(format!(
                    "parameter '{}' has shape {:?} but numel {}",
                    p.name, p.shape, p.numel
                ));
            }
            total += p.numel as u128;
        }
        let padded: u128 = self.units.iter().map(|u| u.padded_len as u128).sum();
        if total > MAX_LAYOUT_ELEMS || padded > MAX_LAYOUT_ELEMS {
            return bad(format!(
                "{total} parameter elements ({padded} padded): beyond any model ({MAX_LAYOUT_ELEMS} at most)"
            ));
        }
        // The model it describes, laid out again.
        let mut units = Vec::with_capacity(self.units.len());
        let mut next = 0;
        for u in &self.units {
            if u.params.start != next
                || u.params.end < u.params.start
                || u.params.end > self.params.len()
            {
                return bad(format!(
                    "unit '{}' lists parameters {:?}, expected to start at {next} (of {})",
                    u.name,
                    u.params,
                    self.params.len()
                ));
            }
            next = u.params.end;
            let params = self.params[u.params.clone()]
                .iter()
                .map(|p| ParamSpec {
                    name: p.name.clone(),
                    shape: p.shape.clone(),
                    weight_decay: p.weight_decay,
                    row_block: p.row_block.clone(),
                })
                .collect();
            units.push(UnitSpec {
                name: u.name.clone(),
                params,
            });
        }
        if next != self.params.len() {
            return bad(format!(
                "the units list {next} of the {} parameters",
                self.params.len()
            ));
        }
        // One layer per unit: the layout does not record layers, only what they use.
        let layers = (0..units.len())
            .map(|u| LayerSpec::new(format!("{u}"), vec![u]))
            .collect();
        let spec = ModelSpec { units, layers };
        let again = PartitionLayout::new(&spec, self.world, self.align)
            .map_err(|e| LayoutError::Inconsistent(e.to_string()))?;
        if let Some((u, (a, b))) = self
            .units
            .iter()
            .zip(&again.units)
            .enumerate()
            .find(|(_, (a, b))| a != b)
        {
            return bad(format!(
                "unit {u} '{}': numel {}, padded {}, shard {}, offsets {}/{}; {} ranks with alignment {} give numel {}, padded {}, shard {}, offsets {}/{}",
                a.name,
                a.numel,
                a.padded_len,
                a.shard_len,
                a.unit_offset,
                a.shard_offset,
                self.world,
                self.align,
                b.numel,
                b.padded_len,
                b.shard_len,
                b.unit_offset,
                b.shard_offset
            ));
        }
        if let Some((a, b)) = self.params.iter().zip(&again.params).find(|(a, b)| a != b) {
            return bad(format!(
                "parameter '{}' at unit {} offset {}, expected unit {} offset {}",
                a.name, a.unit, a.offset, b.unit, b.offset
            ));
        }
        Ok(())
    }

    /// Ψ: parameter elements, without padding.
    pub fn numel(&self) -> usize {
        self.units.iter().map(|u| u.numel).sum()
    }

    /// The whole tensors, in the order their first parameter appears: each parameter
    /// on its own, the row blocks of a split tensor joined; `parts` index
    /// [`PartitionLayout::params`].
    pub fn tensors(&self) -> Vec<Tensor> {
        join_tensors(
            self.params
                .iter()
                .map(|p| (p.name.as_str(), p.shape.as_slice(), p.row_block.as_ref())),
        )
    }

    /// Padded Ψ: length of the full concatenated buffer.
    pub fn padded_numel(&self) -> usize {
        self.units.iter().map(|u| u.padded_len).sum()
    }

    /// Length of a rank's concatenated shard buffer (the same on every rank).
    pub fn shard_numel(&self) -> usize {
        self.units.iter().map(|u| u.shard_len).sum()
    }

    /// Largest padded unit length (sizes staging buffers).
    pub fn max_padded_len(&self) -> usize {
        self.units.iter().map(|u| u.padded_len).max().unwrap_or(0)
    }

    fn check_rank(&self, rank: usize) -> Result<(), LayoutError> {
        if rank >= self.world {
            return Err(LayoutError::BadRank {
                rank,
                world: self.world,
            });
        }
        Ok(())
    }

    fn unit(&self, unit: usize) -> Result<&UnitLayout, LayoutError> {
        self.units.get(unit).ok_or(LayoutError::BadUnit {
            unit,
            units: self.units.len(),
        })
    }

    /// The range of unit `unit`'s flat buffer that `rank` owns.
    pub fn shard_range(&self, unit: usize, rank: usize) -> Result<Range<usize>, LayoutError> {
        self.check_rank(rank)?;
        let u = self.unit(unit)?;
        Ok(rank * u.shard_len..(rank + 1) * u.shard_len)
    }

    /// Padding elements inside `rank`'s shards, summed over units (the last ranks hold
    /// the padding; multiply by the element size for bytes).
    pub fn padding_in_shard(&self, rank: usize) -> Result<usize, LayoutError> {
        self.check_rank(rank)?;
        Ok(self
            .units
            .iter()
            .map(|u| {
                let shard = rank * u.shard_len..(rank + 1) * u.shard_len;
                intersect(&shard, &(u.numel..u.padded_len)).len()
            })
            .sum())
    }

    /// Padding elements of the full buffer (`padded_numel - numel`).
    pub fn padding_in_full(&self) -> usize {
        self.padded_numel() - self.numel()
    }

    /// The pieces of parameters inside `range` of unit `unit`'s flat buffer, in order.
    /// Elements of `range` not covered by a piece are padding.
    pub fn pieces(&self, unit: usize, range: Range<usize>) -> Result<Vec<Piece>, LayoutError> {
        let u = self.unit(unit)?;
        if range.start > range.end || range.end > u.padded_len {
            return Err(LayoutError::BadRange {
                unit: u.name.clone(),
                start: range.start,
                end: range.end,
                padded_len: u.padded_len,
            });
        }
        let mut out = Vec::new();
        for i in u.params.clone() {
            let p = &self.params[i];
            let hit = intersect(&(p.offset..p.offset + p.numel), &range);
            if !hit.is_empty() {
                out.push(Piece {
                    param: i,
                    in_param: hit.start - p.offset..hit.end - p.offset,
                    in_range: hit.start - range.start..hit.end - range.start,
                });
            }
        }
        Ok(out)
    }

    /// The pieces of parameters in `rank`'s shard of unit `unit` (`in_range` is relative
    /// to the shard's start).
    pub fn shard_pieces(&self, unit: usize, rank: usize) -> Result<Vec<Piece>, LayoutError> {
        let range = self.shard_range(unit, rank)?;
        self.pieces(unit, range)
    }

    /// Weight-decay runs covering `range` of unit `unit` exactly (relative to
    /// `range.start`); padding is a no-decay run. Adjacent runs with the same flag merge.
    pub fn segments(&self, unit: usize, range: Range<usize>) -> Result<Vec<Segment>, LayoutError> {
        let len = range.len();
        let mut out: Vec<Segment> = Vec::new();
        let mut at = 0;
        for piece in self.pieces(unit, range)? {
            push_segment(&mut out, at..piece.in_range.start, false);
            push_segment(
                &mut out,
                piece.in_range.clone(),
                self.params[piece.param].weight_decay,
            );
            at = piece.in_range.end;
        }
        push_segment(&mut out, at..len, false);
        Ok(out)
    }

    /// Weight-decay runs of `rank`'s concatenated shard buffer (length
    /// [`Self::shard_numel`]), for AdamW on the shard (stages 1-3).
    pub fn shard_segments(&self, rank: usize) -> Result<Vec<Segment>, LayoutError> {
        let mut out = Vec::new();
        for (i, u) in self.units.iter().enumerate() {
            for s in self.segments(i, self.shard_range(i, rank)?)? {
                let r = s.range.start + u.shard_offset..s.range.end + u.shard_offset;
                push_segment(&mut out, r, s.weight_decay);
            }
        }
        Ok(out)
    }

    /// Weight-decay runs of the full concatenated buffer (length [`Self::padded_numel`]),
    /// for AdamW on everything (stage 0).
    pub fn full_segments(&self) -> Vec<Segment> {
        let mut out = Vec::new();
        for (i, u) in self.units.iter().enumerate() {
            // The whole unit is always a valid range of itself.
            let segs = self.segments(i, 0..u.padded_len).unwrap_or_default();
            for s in segs {
                let r = s.range.start + u.unit_offset..s.range.end + u.unit_offset;
                push_segment(&mut out, r, s.weight_decay);
            }
        }
        out
    }

    /// Refuse two layouts that do not hold the same parameters at the same offsets (the
    /// world size and alignment may differ).
    pub fn check_same_params(&self, other: &PartitionLayout) -> Result<(), LayoutError> {
        if self.params.len() != other.params.len() || self.units.len() != other.units.len() {
            return Err(LayoutError::Incompatible(format!(
                "{} units / {} parameters vs {} units / {} parameters",
                self.units.len(),
                self.params.len(),
                other.units.len(),
                other.params.len()
            )));
        }
        for (a, b) in self.params.iter().zip(&other.params) {
            if (&a.name, a.unit, a.offset, &a.shape) != (&b.name, b.unit, b.offset, &b.shape) {
                return Err(LayoutError::Incompatible(format!(
                    "parameter '{}' (unit {}, offset {}, shape {:?}) vs '{}' (unit {}, offset {}, shape {:?})",
                    a.name, a.unit, a.offset, a.shape, b.name, b.unit, b.offset, b.shape
                )));
            }
        }
        Ok(())
    }

    /// Resharding: the copies that fill `to_rank`'s shards of layout `self` from the
    /// shards of a checkpoint saved with layout `from`. Only parameter elements are
    /// copied; padding of the new shard is left to the caller to zero.
    pub fn reshard_from(
        &self,
        from: &PartitionLayout,
        to_rank: usize,
    ) -> Result<Vec<ReshardCopy>, LayoutError> {
        self.check_same_params(from)?;
        let mut out = Vec::new();
        for (i, (new, old)) in self.units.iter().zip(&from.units).enumerate() {
            // Only real elements move: clip the new shard to the parameters.
            let want = intersect(&self.shard_range(i, to_rank)?, &(0..new.numel));
            if want.is_empty() {
                continue;
            }
            if old.shard_len == 0 {
                // Only a layout not made by `new` (nor checked) has empty shards.
                return Err(LayoutError::Inconsistent(format!(
                    "unit '{}' of the old layout has shards of 0 elements",
                    old.name
                )));
            }
            let first = want.start / old.shard_len;
            let last = (want.end - 1) / old.shard_len;
            for from_rank in first..=last {
                let have = from_rank * old.shard_len..(from_rank + 1) * old.shard_len;
                let hit = intersect(&want, &have);
                let to_base = to_rank * new.shard_len;
                out.push(ReshardCopy {
                    unit: i,
                    from_rank,
                    from: hit.start - have.start..hit.end - have.start,
                    to: hit.start - to_base..hit.end - to_base,
                });
            }
        }
        Ok(out)
    }
}

/// Append a run, merging with the previous one when the flag is the same.
fn push_segment(out: &mut Vec<Segment>, range: Range<usize>, weight_decay: bool) {
    if range.is_empty() {
        return;
    }
    if let Some(last) = out.last_mut() {
        if last.weight_decay == weight_decay && last.range.end == range.start {
            last.range.end = range.end;
            return;
        }
    }
    out.push(Segment {
        range,
        weight_decay,
    });
}

fn unit_params(u: usize, unit: &UnitSpec) -> impl Iterator<Item = ParamLayout> + '_ {
    unit.params
        .iter()
        .zip(unit.offsets())
        .map(move |(p, offset)| ParamLayout {
            name: p.name.clone(),
            unit: u,
            offset,
            shape: p.shape.clone(),
            numel: p.numel(),
            weight_decay: p.weight_decay,
            row_block: p.row_block.clone(),
        })
}
