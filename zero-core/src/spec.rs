//! What a model is made of, as the engine sees it: named parameters grouped into units
//! (the granularity of partitioning and of stage-3 gathering) and layers (the order of
//! compute, each naming the units whose parameters it reads).
//!
//! A unit's flat buffer is its parameters concatenated in declaration order, with no gap
//! between them ([`UnitSpec::offsets`]); the partition layout adds padding only at the end
//! of a unit. Every layer above (engine, model, checkpoints) uses these offsets.

/// One named parameter tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// Name as in DESIGN.md, e.g. `h.3.attn.c_attn.weight`.
    pub name: String,
    /// Shape, row-major; weights are [out, in].
    pub shape: Vec<usize>,
    /// AdamW weight decay applies to this tensor (2-D weights and embeddings; not biases
    /// or LayerNorm). Decided by the parameter's identity, never by a shard's shape.
    pub weight_decay: bool,
}

impl ParamSpec {
    /// A parameter; `weight_decay` defaults to "tensor has two or more dimensions".
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        ParamSpec {
            name: name.into(),
            shape: shape.to_vec(),
            weight_decay: shape.len() >= 2,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A unit: a group of parameters gathered, reduced and released together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitSpec {
    /// Name, e.g. `embed`, `h.0`, `ln_f`.
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
    /// weights: GPT-2's LM head reads the token embedding).
    pub units: Vec<usize>,
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
            for &u in &layer.units {
                if first[u].is_none() {
                    first[u] = Some(l);
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
                last[u] = Some(l);
            }
        }
        last
    }

    /// Check the spec is well formed: names unique, every layer's units exist, every unit
    /// is used by some layer, no empty unit.
    pub fn validate(&self) -> Result<(), String> {
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
        for layer in &self.layers {
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
