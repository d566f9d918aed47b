//! GPT-2 initialisation (nanoGPT's `_init_weights`): linear weights and embeddings
//! N(0, 0.02), the residual projections `attn.c_proj.weight` and `mlp.c_proj.weight`
//! N(0, 0.02/sqrt(2L)) (GPT-2 paper, section 2.3), biases 0, LayerNorm weight 1 and bias 0.
//!
//! Each tensor draws from its own stream, seeded by `(seed, tensor name)` only, so the
//! values do not depend on how parameters are grouped into units, split into row blocks,
//! or split across ranks.

use std::ops::Range;

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
fn gpt_rule(p: &ParamSpec, n_layer: usize) -> Result<f64, f64> {
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

/// Which family's rule sets a unit's initial values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// GPT-2's (`gpt_rule`).
    Gpt,
    /// Llama's (`llama_rule`).
    Llama,
}

/// Fill `out` (length >= unit numel; any padding past it is left alone) with the unit's
/// initial parameters by `family`'s rule, each tensor from its own `(seed, name)`
/// stream, drawn on up to `threads` threads (the values do not depend on it).
pub fn init_unit<F: Scalar>(
    family: Family,
    unit: &UnitSpec,
    n_layer: usize,
    seed: u64,
    out: &mut [F],
    threads: usize,
) {
    let numel = unit.numel();
    init_unit_range(
        family,
        unit,
        n_layer,
        seed,
        0..numel,
        &mut out[..numel],
        threads,
    );
}

/// Fill `out` (length `range.len()`) with elements `range` of the unit's flat initial
/// parameters: the same values [`init_unit`] writes there, drawn without the rest (each
/// tensor's stream skips to where the range enters it), so a ZeRO-3 rank draws only its
/// shard. `range` must lie within the unit's elements.
pub fn init_unit_range<F: Scalar>(
    family: Family,
    unit: &UnitSpec,
    n_layer: usize,
    seed: u64,
    range: Range<usize>,
    out: &mut [F],
    threads: usize,
) {
    assert_eq!(
        out.len(),
        range.len(),
        "init range and output differ in length"
    );
    assert!(
        range.end <= unit.numel(),
        "init range past the unit's elements"
    );
    let rule = |p: &ParamSpec| match family {
        Family::Gpt => gpt_rule(p, n_layer),
        Family::Llama => llama_rule(p, n_layer),
    };
    let mut at = 0;
    for p in &unit.params {
        let tensor = at..at + p.numel();
        at = tensor.end;
        // The part of this tensor the range covers, in the unit and in `out`.
        let (lo, hi) = (tensor.start.max(range.start), tensor.end.min(range.end));
        if lo >= hi {
            continue;
        }
        let dst = &mut out[lo - range.start..hi - range.start];
        match rule(p) {
            Ok(std) => {
                // A row block draws the values its rows have in the whole tensor: the
                // tensor's stream, from its first element (two draws per normal).
                let first = p.row_block.as_ref().map_or(0, |b| {
                    let row_len: usize = p.shape.iter().skip(1).product();
                    b.first_row * row_len
                });
                let g = param_rng(seed, p.tensor_name());
                normals(&g, first + (lo - tensor.start), std, dst, threads);
            }
            Err(value) => dst.fill(F::from_f64(value)),
        }
    }
}

/// Elements below which a tensor is drawn on one thread.
const MIN_PER_THREAD: usize = 1 << 18;

/// `dst[i] = std * N(first + i)`, N(j) the j-th normal of the stream `g` starts (two
/// draws each), split over up to `threads` threads: the generator's state is a counter
/// ([`SplitMix64::skip`]), so each part starts where it falls and the values are those
/// of one thread, whatever the count. (Box-Muller's `ln` and `cos` cost
/// about 22 ns a value: 2.8 s for GPT-2 124M on one thread of a Zen 4.)
fn normals<F: Scalar>(g: &SplitMix64, first: usize, std: f64, dst: &mut [F], threads: usize) {
    let fill = |at: usize, part: &mut [F]| {
        let mut g = g.clone();
        g.skip(2 * (first + at) as u64);
        part.iter_mut()
            .for_each(|x| *x = F::from_f64(std * g.next_normal()));
    };
    let parts = threads.min(dst.len() / MIN_PER_THREAD).max(1);
    if parts == 1 {
        return fill(0, dst);
    }
    let per = dst.len().div_ceil(parts);
    let jobs: Vec<(usize, &mut [F])> = (dst.chunks_mut(per).enumerate())
        .map(|(i, part)| (i * per, part))
        .collect();
    // Scoped threads (a thread the OS refuses leaves its part to this one).
    zero_kernels::run_parts(jobs, |(at, part)| fill(at, part));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_of_a_unit_is_drawn_as_the_whole_unit_draws_it() {
        // Tensors of every rule (normal, scaled normal, constants), one split in row
        // blocks, so ranges start and end inside tensors, blocks and constant runs.
        let mut params = vec![
            ParamSpec::new("h.0.ln_1.weight", &[6]),
            ParamSpec::new("h.0.attn.c_attn.weight", &[18, 6]),
            ParamSpec::new("h.0.attn.c_attn.bias", &[18]),
            ParamSpec::new("h.0.attn.c_proj.weight", &[6, 6]),
        ];
        params.extend(ParamSpec::split_rows("wte.weight", &[11, 6], 4));
        let unit = UnitSpec {
            name: "mixed".into(),
            params,
        };
        let n = unit.numel();
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        for family in [Family::Gpt, Family::Llama] {
            let mut whole = vec![0f32; n];
            init_unit(family, &unit, 2, 5, &mut whole, 1);
            let mut starts: Vec<usize> = (0..n).step_by(7).collect();
            starts.extend(unit.offsets());
            for &lo in &starts {
                for hi in [lo, lo + 1, lo + 13, lo + 40, n] {
                    let hi = hi.min(n);
                    let mut part = vec![f32::NAN; hi - lo];
                    init_unit_range(family, &unit, 2, 5, lo..hi, &mut part, 2);
                    assert!(same(&part, &whole[lo..hi]), "{family:?} {lo}..{hi}");
                }
            }
        }
        // A tensor long enough to be split over threads, ranges starting inside it.
        let big = UnitSpec {
            name: "big".into(),
            params: vec![
                ParamSpec::new("h.0.ln_2.bias", &[5]),
                ParamSpec::new("h.0.mlp.c_fc.weight", &[3 * MIN_PER_THREAD / 100, 100]),
            ],
        };
        let n = big.numel();
        let mut whole = vec![0f32; n];
        init_unit(Family::Gpt, &big, 2, 5, &mut whole, 1);
        for range in [
            0..n,
            3..n - 1,
            MIN_PER_THREAD + 1..n,
            7..2 * MIN_PER_THREAD + 9,
        ] {
            let mut part = vec![f32::NAN; range.len()];
            init_unit_range(Family::Gpt, &big, 2, 5, range.clone(), &mut part, 3);
            assert!(same(&part, &whole[range.clone()]), "{range:?}");
        }
    }

    #[test]
    fn drawn_on_several_threads_the_values_are_those_of_one() {
        let g = param_rng(11, "h.0.mlp.c_fc.weight");
        let len = 7 * MIN_PER_THREAD + 5;
        let mut one = vec![0f32; len];
        normals(&g, 17, 0.02, &mut one, 1);
        for threads in [2, 3, 5] {
            let mut many = vec![0f32; len];
            normals(&g, 17, 0.02, &mut many, threads);
            assert!(
                one.iter()
                    .zip(&many)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{threads} threads"
            );
        }
        // And they are the stream's, from element 17 on.
        let mut h = g.clone();
        h.skip(2 * 17);
        let want: Vec<f32> = (0..8).map(|_| (0.02 * h.next_normal()) as f32).collect();
        assert_eq!(&one[..8], &want[..]);
    }
}
