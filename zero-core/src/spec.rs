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
    /// Name, unique in the model, e.g. `block.3.proj.weight` (checkpoints and
    /// consolidated files use it).
    pub name: String,
    /// Shape, row-major; weights are [out, in].
    pub shape: Vec<usize>,
    /// AdamW weight decay applies to this tensor (2-D weights and lookup tables; not biases
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

    /// A hash of everything the engine derives from the spec (unit and parameter names,
    /// shapes, decay flags, and which units each layer uses), FNV-1a over a canonical
    /// encoding: the engine refuses to step a model whose spec differs from the one it
    /// was built for.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv::default();
        for u in &self.units {
            h.str(&u.name);
            for p in &u.params {
                h.str(&p.name);
                h.u64(p.shape.len() as u64);
                p.shape.iter().for_each(|&d| h.u64(d as u64));
                h.u64(p.weight_decay as u64);
            }
            h.u64(u64::MAX);
        }
        for l in &self.layers {
            h.str(&l.name);
            l.units.iter().for_each(|&u| h.u64(u as u64));
            h.u64(u64::MAX);
        }
        h.0
    }

    /// "N units in L layers, Ψ parameters" (for messages).
    pub fn summary(&self) -> String {
        format!(
            "{} units in {} layers, {} parameters",
            self.units.len(),
            self.layers.len(),
            self.numel()
        )
    }

    /// Check the spec is well formed: names unique, every layer's units exist and are
    /// distinct, every unit is used by some layer, no empty unit.
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
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.bytes(s.as_bytes());
    }
}
