//! Initialisation for the example models: every tensor draws from its own stream seeded
//! by `(seed, tensor name)` only, so the values do not depend on the world size, the rank
//! or how tensors are grouped into units (what `Model::init_unit` must guarantee).

/// SplitMix64: small, well mixed, fully specified here.
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream from a seed and a name.
    pub fn for_tensor(seed: u64, name: &str) -> Self {
        // FNV-1a of the name, mixed with the seed.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        SplitMix64(seed ^ h)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Fill `out` with N(0, std^2) draws of the tensor `name`.
pub fn normal(seed: u64, name: &str, std: f64, out: &mut [f32]) {
    let mut r = SplitMix64::for_tensor(seed, name);
    out.iter_mut().for_each(|x| *x = (r.normal() * std) as f32);
}
