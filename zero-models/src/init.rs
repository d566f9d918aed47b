//! GPT-2 initialisation (nanoGPT's `_init_weights`): linear weights and embeddings
//! N(0, 0.02), the residual projections `attn.c_proj.weight` and `mlp.c_proj.weight`
//! N(0, 0.02/sqrt(2L)) (GPT-2 paper, section 2.3), biases 0, LayerNorm weight 1 and bias 0.
//!
//! Each tensor draws from its own stream, seeded by `(seed, tensor name)` only, so the
//! values do not depend on how parameters are grouped into units, split into row blocks,
//! or split across ranks.

use zero_core::{ParamSpec, UnitSpec};
use zero_kernels::nn::Scalar;

/// SplitMix64 (Steele et al. 2014): a fast, well-mixed 64-bit generator; enough for
/// initialisation and synthetic data, and fully specified here, so streams never change
/// with a dependency's version.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Skip the next `n` draws of [`Self::next_u64`] in O(1) (the state is a counter).
    pub fn skip(&mut self, n: u64) {
        self.0 = self
            .0
            .wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(n));
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal, by Box-Muller (one of the pair; simple and exactly reproducible).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]: ln is finite
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// FNV-1a over the name: the per-tensor stream id.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The generator for one parameter tensor.
pub fn param_rng(seed: u64, name: &str) -> SplitMix64 {
    // One warm-up draw mixes seed and name before the first value.
    let mut g = SplitMix64::new(seed ^ name_hash(name).rotate_left(17));
    g.next_u64();
    g
}

/// The initial value rule of one parameter: Some(std) for a normal draw, or a constant.
fn rule(p: &ParamSpec, n_layer: usize) -> Result<f64, f64> {
    let n = p.tensor_name();
    if n.ends_with("c_proj.weight") {
        Ok(0.02 / ((2 * n_layer) as f64).sqrt())
    } else if n.ends_with(".bias") {
        Err(0.0)
    } else if n.contains("ln_") {
        Err(1.0) // LayerNorm weights (ln_1, ln_2, ln_f)
    } else {
        Ok(0.02)
    }
}

/// Llama's rule (as GPT-2's, for want of a published one): RMSNorm weights 1, the
/// residual projections `attention.wo` and `feed_forward.w2` N(0, 0.02/sqrt(2L)), every
/// other weight (q, k, v, w1, w3, the embedding and the untied output) N(0, 0.02).
fn llama_rule(p: &ParamSpec, n_layer: usize) -> Result<f64, f64> {
    let n = p.tensor_name();
    if n.contains("norm") {
        Err(1.0)
    } else if n.ends_with("wo.weight") || n.ends_with("w2.weight") {
        Ok(0.02 / ((2 * n_layer) as f64).sqrt())
    } else {
        Ok(0.02)
    }
}

/// Fill `out` (length >= unit numel; any padding past it is left alone) with the unit's
/// initial parameters.
pub fn init_unit<F: Scalar>(unit: &UnitSpec, n_layer: usize, seed: u64, out: &mut [F]) {
    init_with(unit, seed, out, |p| rule(p, n_layer))
}

/// [`init_unit`] for a Llama unit (`llama_rule`): each tensor from its own
/// `(seed, name)` stream, as GPT-2's.
pub fn init_llama_unit<F: Scalar>(unit: &UnitSpec, n_layer: usize, seed: u64, out: &mut [F]) {
    init_with(unit, seed, out, |p| llama_rule(p, n_layer))
}

fn init_with<F: Scalar>(
    unit: &UnitSpec,
    seed: u64,
    out: &mut [F],
    rule: impl Fn(&ParamSpec) -> Result<f64, f64>,
) {
    let mut at = 0;
    for p in &unit.params {
        let dst = &mut out[at..at + p.numel()];
        match rule(p) {
            Ok(std) => {
                // A row block draws the values its rows have in the whole tensor: the
                // tensor's stream, from its first element (two draws per normal).
                let mut g = param_rng(seed, p.tensor_name());
                if let Some(b) = &p.row_block {
                    let row_len: usize = p.shape.iter().skip(1).product();
                    g.skip(2 * (b.first_row * row_len) as u64);
                }
                dst.iter_mut()
                    .for_each(|x| *x = F::from_f64(std * g.next_normal()));
            }
            Err(value) => dst.fill(F::from_f64(value)),
        }
        at += p.numel();
    }
}
