//! Test inputs and the central difference the kernels' gradient tests share.

/// `n` fixed values in [-1.2, 1.47], a different pattern per `seed`.
pub(crate) fn vals(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 37 + seed * 11) % 89) as f64 * 0.03 - 1.2)
        .collect()
}

/// d f / d x[i] by (f(x + h e_i) - f(x - h e_i)) / 2h, h = 1e-5 (f64: error ~1e-10).
pub(crate) fn central_difference(x: &[f64], i: usize, f: impl Fn(&[f64]) -> f64) -> f64 {
    let h = 1e-5;
    let mut xe = x.to_vec();
    xe[i] += h;
    let up = f(&xe);
    xe[i] -= 2.0 * h;
    (up - f(&xe)) / (2.0 * h)
}
