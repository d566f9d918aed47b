//! Inputs (a seeded generator) and how results are compared.

/// xorshift64: the same inputs on every device and machine for a seed.
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        let mut s = self.0;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        self.0 = s;
        s
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
    /// `n` values uniform in [offset - scale, offset + scale).
    pub fn vec_offset(&mut self, n: usize, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|_| offset + self.uniform() * scale).collect()
    }
    /// `n` indices below `limit`.
    pub fn ids(&mut self, n: usize, limit: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.next_u64() % limit.max(1) as u64) as u32)
            .collect()
    }
    /// `n` values over many magnitudes, with zeros, subnormals, halves' limits and huge
    /// values sprinkled in (casts and statistics: every rounding case), no inf or NaN.
    pub fn wide(&mut self, n: usize) -> Vec<f32> {
        const SPECIALS: [f32; 8] = [0.0, -0.0, 1e-45, 1e-40, 65504.0, 65520.0, 3e38, -1e-20];
        (0..n)
            .map(|i| {
                let s = self.next_u64();
                if i % 997 == 0 {
                    SPECIALS[(s % SPECIALS.len() as u64) as usize]
                } else {
                    let mant = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                    mant * 2f32.powi(((s >> 8) % 40) as i32 - 30)
                }
            })
            .collect()
    }
}

/// How two results differ.
#[derive(Clone, Copy, Debug, Default)]
pub struct Diff {
    /// Elements compared.
    pub len: usize,
    /// Elements whose bits differ (NaN matches NaN).
    pub differ: usize,
    /// max |a - b| / max |b| (0 when equal, inf when one is non-finite and the other not
    /// the same, or the lengths differ).
    pub rel: f64,
}

/// `got` against `want`.
pub fn diff(got: &[f64], want: &[f64]) -> Diff {
    if got.len() != want.len() {
        return Diff {
            len: want.len(),
            differ: want.len().max(got.len()),
            rel: f64::INFINITY,
        };
    }
    let (mut differ, mut max_d, mut max_ref) = (0, 0f64, 0f64);
    for (&a, &b) in got.iter().zip(want) {
        if b.is_finite() {
            max_ref = max_ref.max(b.abs());
        }
        if a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) {
            continue;
        }
        differ += 1;
        let d = if a.is_finite() && b.is_finite() {
            (a - b).abs()
        } else if a == b {
            0.0 // +0 and -0, or equal infinities
        } else {
            f64::INFINITY
        };
        max_d = max_d.max(d);
    }
    let rel = if max_d == 0.0 {
        0.0
    } else if max_ref > 0.0 {
        max_d / max_ref
    } else {
        f64::INFINITY
    };
    Diff {
        len: want.len(),
        differ,
        rel,
    }
}

/// ||got - want||_2 / ||want||_2 (0 when equal; inf when `want` is zero and `got` not,
/// or anything is non-finite): a whole tensor's error, robust to the elements of
/// rounding noise a gradient has where it is exactly zero in exact arithmetic.
pub fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let (mut dd, mut ww) = (0f64, 0f64);
    for (&a, &b) in got.iter().zip(want) {
        dd += (a - b) * (a - b);
        ww += b * b;
    }
    if !dd.is_finite() || !ww.is_finite() {
        f64::INFINITY
    } else if dd == 0.0 {
        0.0
    } else if ww > 0.0 {
        (dd / ww).sqrt()
    } else {
        f64::INFINITY
    }
}

/// The median of `v` (NaN for none).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_counts_bits_and_relative_error() {
        let d = diff(&[1.0, 2.0, f64::NAN], &[1.0, 2.5, f64::NAN]);
        assert_eq!(d.differ, 1);
        assert!((d.rel - 0.2).abs() < 1e-12);
        let d = diff(&[-0.0], &[0.0]);
        assert_eq!((d.differ, d.rel), (1, 0.0));
        assert_eq!(diff(&[f64::INFINITY], &[1.0]).rel, f64::INFINITY);
        assert_eq!(diff(&[1.0], &[1.0, 2.0]).rel, f64::INFINITY);
    }

    #[test]
    fn rel_l2_and_median() {
        assert_eq!(rel_l2(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((rel_l2(&[3.0, 4.0], &[0.0, 5.0]) - (10f64).sqrt() / 5.0).abs() < 1e-12);
        assert_eq!(rel_l2(&[1.0], &[0.0]), f64::INFINITY);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
