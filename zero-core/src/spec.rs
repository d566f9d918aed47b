//! What a model is made of, as the engine sees it: named parameters grouped into units
//! (the granularity of partitioning and of stage-3 gathering) and layers (the order of
//! compute, each naming the units whose parameters it reads).
//!
//! A unit's flat buffer is its parameters concatenated in declaration order, with no gap
//! between them ([`UnitSpec::offsets`]); the partition layout adds padding only at the end
//! of a unit. Every layer above (engine, model, checkpoints) uses these offsets.
//!
//! A large tensor may be split by rows over several units ([`RowBlock`],
//! [`ParamSpec::split_rows`]), so that each block is gathered, computed with and reduced
//! on its own: a lookup table of many rows whose gather and gradient would otherwise be
//! the widest thing any layer holds, and so the floor of stage 3's memory. The model sees
//! the blocks; consolidated files, model files and [`crate::Engine::master_arrays`] see the
//! whole tensor ([`crate::PartitionLayout::tensors`]).

use serde::{Deserialize, Serialize};

/// A parameter that is rows `first_row .. first_row + shape[0]` of the tensor named
/// `tensor`, which has `tensor_rows` rows (its other dimensions are the parameter's).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RowBlock {
    /// The whole tensor's name.
    pub tensor: String,
    /// The first row of the whole tensor this block holds.
    pub first_row: usize,
    /// Rows of the whole tensor.
    pub tensor_rows: usize,
}

/// A whole tensor as files hold it: one parameter, or the row blocks of a split one
/// ([`ModelSpec::tensors`], [`crate::PartitionLayout::tensors`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Its name ([`ParamSpec::tensor_name`]).
    pub name: String,
    /// Its whole shape.
    pub shape: Vec<usize>,
    /// Its parameters (indices into the model's parameters in unit order) in row order,
    /// each with the first row it holds (one parameter at row 0 when not split).
    pub parts: Vec<(usize, usize)>,
}

impl Tensor {
    /// Elements of one row (the product of the shape past the first dimension).
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Elements of the whole tensor.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Join parameters (name, shape, row block; in unit order) into whole tensors, in the
/// order their first parameter appears.
pub(crate) fn join_tensors<'a>(
    params: impl Iterator<Item = (&'a str, &'a [usize], Option<&'a RowBlock>)>,
) -> Vec<Tensor> {
    let mut out: Vec<Tensor> = Vec::new();
    for (i, (name, shape, block)) in params.enumerate() {
        let Some(b) = block else {
            out.push(Tensor {
                name: name.to_string(),
                shape: shape.to_vec(),
                parts: vec![(i, 0)],
            });
            continue;
        };
        match out.iter_mut().find(|t| t.name == b.tensor) {
            Some(t) => t.parts.push((i, b.first_row)),
            None => {
                let mut whole = shape.to_vec();
                if let Some(rows) = whole.first_mut() {
                    *rows = b.tensor_rows;
                }
                out.push(Tensor {
                    name: b.tensor.clone(),
                    shape: whole,
                    parts: vec![(i, b.first_row)],
                });
            }
        }
    }
    for t in &mut out {
        t.parts.sort_by_key(|&(_, row)| row);
    }
    out
}

/// One named parameter tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// Name, unique in the model, e.g. `block.3.proj.weight` (checkpoints use it;
    /// consolidated files too, unless the parameter is a [`RowBlock`]).
    pub name: String,
    /// Shape, row-major; weights are [out, in].
    pub shape: Vec<usize>,
    /// AdamW weight decay applies to this tensor (2-D weights and lookup tables; not biases
    /// or LayerNorm). Decided by the parameter's identity, never by a shard's shape.
    pub weight_decay: bool,
    /// Set when the parameter is a block of rows of a larger tensor.
    pub row_block: Option<RowBlock>,
}

impl ParamSpec {
    /// A parameter; `weight_decay` defaults to "tensor has two or more dimensions".
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        ParamSpec {
            name: name.into(),
            shape: shape.to_vec(),
            weight_decay: shape.len() >= 2,
            row_block: None,
        }
    }

    /// Rows `first_row .. first_row + shape[0]` of the tensor `tensor` of `tensor_rows`
    /// rows, as a parameter named `name` (unique in the model).
    pub fn rows_of(
        name: impl Into<String>,
        shape: &[usize],
        tensor: impl Into<String>,
        first_row: usize,
        tensor_rows: usize,
    ) -> Self {
        ParamSpec {
            row_block: Some(RowBlock {
                tensor: tensor.into(),
                first_row,
                tensor_rows,
            }),
            ..ParamSpec::new(name, shape)
        }
    }

    /// The tensor `name` of `shape` ([rows, ...]) cut into row blocks of at most
    /// `block_rows` rows, in row order: each block a parameter named `name[first..end]`
    /// (its rows), all with the decay flag of the whole tensor. A tensor of at most
    /// `block_rows` rows (or a scalar) stays one plain parameter named `name`.
    pub fn split_rows(name: &str, shape: &[usize], block_rows: usize) -> Vec<ParamSpec> {
        let rows = shape.first().copied().unwrap_or(0);
        let block_rows = block_rows.max(1);
        if rows <= block_rows {
            return vec![ParamSpec::new(name, shape)];
        }
        let decay = shape.len() >= 2;
        (0..rows)
            .step_by(block_rows)
            .map(|first| {
                let end = (first + block_rows).min(rows);
                let mut block = shape.to_vec();
                block[0] = end - first;
                ParamSpec {
                    weight_decay: decay,
                    ..ParamSpec::rows_of(
                        format!("{name}[{first}..{end}]"),
                        &block,
                        name,
                        first,
                        rows,
                    )
                }
            })
            .collect()
    }

    /// The name of the tensor this parameter is (or is a block of).
    pub fn tensor_name(&self) -> &str {
        self.row_block.as_ref().map_or(&self.name, |b| &b.tensor)
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A unit: a group of parameters gathered, reduced and released together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitSpec {
    /// Name, e.g. `block.0`.
    pub name: String,
    /// The unit's parameters, in flat-buffer order.
    pub params: Vec<ParamSpec>,
}

impl UnitSpec {
    /// Total elements of the unit's parameters (without padding).
    pub fn numel(&self) -> usize {
        self.params.iter().map(ParamSpec::numel).sum()
    }

    /// Offset in elements of each parameter inside the unit's flat buffer.
    pub fn offsets(&self) -> Vec<usize> {
        let mut at = 0;
        self.params
            .iter()
            .map(|p| {
                let o = at;
                at += p.numel();
                o
            })
            .collect()
    }
}

/// A step of compute in the forward pass (the backward runs them in reverse).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    /// Name, for logs.
    pub name: String,
    /// Indices of the units whose parameters this layer reads (and, in backward, whose
    /// gradients it accumulates into). A unit may be used by several layers (tied
    /// weights: an output layer that reads the input table).
    pub units: Vec<usize>,
    /// The layer's backward reads its units' parameters. False for a table lookup,
    /// whose backward only adds rows of the output's gradient into the table's gradient
    /// (`dW[token] += dy`): the engine then passes no parameters to its
    /// `backward_layer`, and stage 3 does not gather them for it.
    pub backward_reads_params: bool,
}

impl LayerSpec {
    /// A layer reading `units` in both passes.
    pub fn new(name: impl Into<String>, units: Vec<usize>) -> Self {
        LayerSpec {
            name: name.into(),
            units,
            backward_reads_params: true,
        }
    }

    /// A lookup of rows of `units`: its backward writes their gradient and reads none of
    /// their parameters ([`LayerSpec::backward_reads_params`]).
    pub fn lookup(name: impl Into<String>, units: Vec<usize>) -> Self {
        LayerSpec {
            backward_reads_params: false,
            ..LayerSpec::new(name, units)
        }
    }

    /// The units whose parameters the layer's backward reads: all of them, or none.
    pub fn backward_units(&self) -> &[usize] {
        if self.backward_reads_params {
            &self.units
        } else {
            &[]
        }
    }
}

/// The whole model: units own parameters, layers order the compute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// Units, in the order their parameters are laid out.
    pub units: Vec<UnitSpec>,
    /// Layers, in forward order.
    pub layers: Vec<LayerSpec>,
}

impl ModelSpec {
    /// Ψ: total parameter count.
    pub fn numel(&self) -> usize {
        self.units.iter().map(UnitSpec::numel).sum()
    }

    /// The whole tensors ([`Tensor`]): the parameters, with the row blocks of a split
    /// tensor joined; `parts` index the parameters in unit order.
    pub fn tensors(&self) -> Vec<Tensor> {
        join_tensors(
            self.units
                .iter()
                .flat_map(|u| &u.params)
                .map(|p| (p.name.as_str(), p.shape.as_slice(), p.row_block.as_ref())),
        )
    }

    /// Find a parameter by name: (unit index, parameter index in the unit).
    pub fn find(&self, name: &str) -> Option<(usize, usize)> {
        self.units.iter().enumerate().find_map(|(u, unit)| {
            unit.params
                .iter()
                .position(|p| p.name == name)
                .map(|i| (u, i))
        })
    }

    /// Per unit, the first forward layer using it (`None` if unused). The backward runs
    /// layers in reverse, so a unit's gradient is complete after the backward of this
    /// layer; in the forward, a gathered unit is needed until [`Self::last_use`].
    pub fn first_use(&self) -> Vec<Option<usize>> {
        let mut first = vec![None; self.units.len()];
        for (l, layer) in self.layers.iter().enumerate() {
            // A layer naming a unit the spec lacks (a spec not validated) is skipped there.
            for &u in &layer.units {
                if let Some(slot @ None) = first.get_mut(u) {
                    *slot = Some(l);
                }
            }
        }
        first
    }

    /// Per unit, the last forward layer using it (`None` if unused).
    pub fn last_use(&self) -> Vec<Option<usize>> {
        let mut last = vec![None; self.units.len()];
        for (l, layer) in self.layers.iter().enumerate() {
            for &u in &layer.units {
                if let Some(slot) = last.get_mut(u) {
                    *slot = Some(l);
                }
            }
        }
        last
    }

    /// A hash of everything the engine derives from the spec (unit and parameter names,
    /// shapes, decay flags, which units each layer uses and whether its backward reads
    /// them), FNV-1a over a canonical encoding: the engine refuses to step a model whose
    /// spec differs from the one it was built for.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv::default();
        for u in &self.units {
            h.str(&u.name);
            for p in &u.params {
                h.str(&p.name);
                h.u64(p.shape.len() as u64);
                p.shape.iter().for_each(|&d| h.u64(d as u64));
                if let Some(b) = &p.row_block {
                    h.str(&b.tensor);
                    h.u64(b.first_row as u64);
                    h.u64(b.tensor_rows as u64);
                }
                h.u64(p.weight_decay as u64);
            }
            h.u64(u64::MAX);
        }
        for l in &self.layers {
            h.str(&l.name);
            l.units.iter().for_each(|&u| h.u64(u as u64));
            h.u64(l.backward_reads_params as u64);
            h.u64(u64::MAX);
        }
        h.0
    }

    /// "N units in L layers, Ψ parameters" (for messages).
    pub fn summary(&self) -> String {
        // Counted without overflow: the spec described may not be validated (a model
        // handed to an engine built for another).
        let elements = (self.units.iter().flat_map(|u| &u.params))
            .map(|p| (p.shape.iter()).fold(1u128, |n, &d| n.saturating_mul(d as u128)))
            .fold(0u128, u128::saturating_add);
        format!(
            "{} units in {} layers, {elements} parameters",
            self.units.len(),
            self.layers.len(),
        )
    }

    /// Check the spec is well formed: sizes that memory can address, names unique, every
    /// layer's units exist and are distinct, every unit is used by some layer, no empty
    /// unit, the row blocks of each split tensor tile its rows exactly.
    pub fn validate(&self) -> Result<(), String> {
        // Before anything multiplies shapes (numel, offsets, layouts): an 8-byte element
        // count that overflows would wrap silently in a release build.
        let limit = isize::MAX as usize / 8;
        let mut total = 0usize;
        for p in self.units.iter().flat_map(|u| &u.params) {
            total = p
                .shape
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .and_then(|n| total.checked_add(n))
                .filter(|&t| t <= limit)
                .ok_or_else(|| {
                    format!(
                        "parameter '{}' of shape {:?} takes the model past {limit} elements, more than memory can address; check its shape",
                        p.name, p.shape
                    )
                })?;
        }
        let mut names = std::collections::HashSet::new();
        for unit in &self.units {
            if unit.params.is_empty() {
                return Err(format!("unit '{}' has no parameters", unit.name));
            }
            for p in &unit.params {
                if !names.insert(p.name.as_str()) {
                    return Err(format!("parameter name '{}' appears twice", p.name));
                }
            }
        }
        let mut split: std::collections::BTreeMap<&str, Vec<&ParamSpec>> = Default::default();
        for p in self.units.iter().flat_map(|u| &u.params) {
            if let Some(b) = &p.row_block {
                split.entry(b.tensor.as_str()).or_default().push(p);
            }
        }
        for (tensor, mut blocks) in split {
            if names.contains(tensor) {
                return Err(format!(
                    "'{tensor}' names both a parameter and a tensor split into row blocks"
                ));
            }
            blocks.sort_by_key(|p| p.row_block.as_ref().map_or(0, |b| b.first_row));
            let whole = blocks[0].row_block.as_ref().map_or(0, |b| b.tensor_rows);
            let mut next = 0;
            for p in &blocks {
                let b = p.row_block.as_ref().ok_or("row block lost")?;
                let Some(&rows) = p.shape.first() else {
                    return Err(format!("row block '{}' has no rows (a scalar)", p.name));
                };
                if b.first_row != next
                    || b.tensor_rows != whole
                    || p.shape.get(1..) != blocks[0].shape.get(1..)
                    || p.weight_decay != blocks[0].weight_decay
                {
                    return Err(format!(
                        "the row blocks of '{tensor}' must tile its {whole} rows in order with \
                         one row shape and decay flag: '{}' holds rows {}..{} of {}, expected \
                         to start at row {next}",
                        p.name,
                        b.first_row,
                        b.first_row.saturating_add(rows),
                        b.tensor_rows
                    ));
                }
                next = next.checked_add(rows).ok_or_else(|| {
                    format!("the row blocks of '{tensor}' hold more rows than a count can")
                })?;
            }
            if next != whole {
                return Err(format!(
                    "the row blocks of '{tensor}' cover {next} of its {whole} rows"
                ));
            }
        }
        for layer in &self.layers {
            let mut seen = layer.units.clone();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() != layer.units.len() {
                return Err(format!(
                    "layer '{}' lists a unit twice ({:?}); list each unit once",
                    layer.name, layer.units
                ));
            }
            if let Some(&u) = layer.units.iter().find(|&&u| u >= self.units.len()) {
                return Err(format!(
                    "layer '{}' uses unit {u}, but the model has {} units",
                    layer.name,
                    self.units.len()
                ));
            }
        }
        if let Some(u) = self.first_use().iter().position(Option::is_none) {
            return Err(format!(
                "unit '{}' is not used by any layer",
                self.units[u].name
            ));
        }
        Ok(())
    }
}

/// FNV-1a, 64 bit: stable across platforms and Rust versions (a spec's fingerprint can be
/// compared between runs).
pub(crate) struct Fnv(pub(crate) u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.bytes(s.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_of(units: Vec<UnitSpec>) -> ModelSpec {
        let layers = (0..units.len())
            .map(|u| LayerSpec::new(format!("l{u}"), vec![u]))
            .collect();
        ModelSpec { units, layers }
    }

    fn unit(params: Vec<ParamSpec>) -> UnitSpec {
        UnitSpec {
            name: params[0].name.clone(),
            params,
        }
    }

    #[test]
    fn split_rows_tiles_the_rows_and_keeps_the_decay() {
        let blocks = ParamSpec::split_rows("t", &[10, 3], 4);
        let rows: Vec<(String, Vec<usize>, usize)> = blocks
            .iter()
            .map(|b| {
                let rb = b.row_block.as_ref().unwrap();
                assert_eq!((rb.tensor.as_str(), rb.tensor_rows), ("t", 10));
                assert!(b.weight_decay);
                assert_eq!(b.tensor_name(), "t");
                (b.name.clone(), b.shape.clone(), rb.first_row)
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("t[0..4]".to_string(), vec![4, 3], 0),
                ("t[4..8]".to_string(), vec![4, 3], 4),
                ("t[8..10]".to_string(), vec![2, 3], 8)
            ]
        );
        // A tensor of at most `block_rows` rows stays whole.
        assert_eq!(
            ParamSpec::split_rows("t", &[4, 3], 4),
            vec![ParamSpec::new("t", &[4, 3])]
        );
        let one_d = ParamSpec::split_rows("b", &[5], 2);
        assert!(
            one_d.iter().all(|b| !b.weight_decay),
            "a 1-D tensor never decays"
        );
        let spec = spec_of(blocks.into_iter().map(|b| unit(vec![b])).collect());
        spec.validate().unwrap();
        let t = spec.tensors();
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].name.as_str(), t[0].shape.clone()), ("t", vec![10, 3]));
        assert_eq!(t[0].parts, [(0, 0), (1, 4), (2, 8)]);
    }

    #[test]
    fn validate_refuses_row_blocks_that_do_not_tile() {
        let blocks = ParamSpec::split_rows("t", &[10, 3], 4);
        let refused = |units: Vec<UnitSpec>, needle: &str| {
            let e = spec_of(units).validate().unwrap_err();
            assert!(e.contains(needle), "{e}");
        };
        // A block missing: rows 4..8 are not covered.
        refused(
            vec![unit(vec![blocks[0].clone()]), unit(vec![blocks[2].clone()])],
            "expected to start at row 4",
        );
        // The last block missing: 8 of 10 rows.
        refused(
            vec![unit(vec![blocks[0].clone()]), unit(vec![blocks[1].clone()])],
            "cover 8 of its 10 rows",
        );
        // A parameter named like the split tensor.
        refused(
            vec![unit(blocks.clone()), unit(vec![ParamSpec::new("t", &[1])])],
            "names both",
        );
        // Blocks of different row shapes.
        let mut odd = blocks.clone();
        odd[1].shape = vec![4, 2];
        refused(vec![unit(odd)], "one row shape");
        // Row numbers at the end of the counting range: errors, not overflows.
        let far = ParamSpec::rows_of("t.a", &[2, 3], "t", usize::MAX, 4);
        refused(vec![unit(vec![far])], "expected to start at row 0");
        let (a, b) = (
            ParamSpec::rows_of("z.a", &[usize::MAX, 0], "z", 0, usize::MAX),
            ParamSpec::rows_of("z.b", &[usize::MAX, 0], "z", usize::MAX, usize::MAX),
        );
        refused(vec![unit(vec![a, b])], "more rows than a count can");
    }

    #[test]
    fn uses_and_summary_of_a_spec_not_validated_do_not_panic() {
        let mut spec = spec_of(vec![unit(vec![ParamSpec::new("w", &[usize::MAX, 2])])]);
        spec.layers.push(LayerSpec::new("stray", vec![0, 99]));
        assert_eq!(spec.first_use(), [Some(0)]);
        assert_eq!(spec.last_use(), [Some(1)]);
        let expected = (usize::MAX as u128 * 2).to_string();
        assert!(spec.summary().contains(&expected), "{}", spec.summary());
    }

    #[test]
    fn validate_refuses_sizes_past_what_memory_addresses() {
        let huge = ParamSpec::new("w", &[usize::MAX / 2, 3]);
        let e = spec_of(vec![unit(vec![huge])]).validate().unwrap_err();
        assert!(
            e.contains("'w' of shape") && e.contains("check its shape"),
            "{e}"
        );
        // Each fits, the sum does not.
        let half = ParamSpec::new("a", &[isize::MAX as usize / 16 + 1]);
        let other = ParamSpec::new("b", &[isize::MAX as usize / 16 + 1]);
        let e = spec_of(vec![unit(vec![half]), unit(vec![other])])
            .validate()
            .unwrap_err();
        assert!(e.contains("'b'"), "{e}");
    }
}
