//! CPU twin of `src/nn/cuda/elementwise.cu`: GELU (tanh approximation) forward and
//! backward, `dst += src`, `dst *= a`, with the signatures of [`crate::nn`]'s kernels.
//! Each element is the same fixed sequence of IEEE operations as the CPU kernel's (tanh
//! is [`crate::nn::tanh_f32`] over the Cephes exp on both sides), so these equal
//! [`crate::nn::gelu_forward`] & co. bit for bit; they are written out here so the order
//! the kernel follows is spelled out once in Rust.

use crate::nn::Scalar;

/// sqrt(2/pi), as `nn::activation` rounds it (the kernel has its f32 bits).
const GELU_S: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient 0.044715.
const GELU_K: f64 = 0.044_715;

/// `out = gelu(x)` (**writes**): `(0.5 x) (1 + tanh(s (x + ((k x) x) x)))`.
pub fn gelu_forward<F: Scalar>(out: &mut [F], x: &[F]) {
    let (s, k, half) = (F::from_f64(GELU_S), F::from_f64(GELU_K), F::from_f64(0.5));
    for (o, &v) in out.iter_mut().zip(x) {
        let cube = k * v * v * v;
        let t = (s * (v + cube)).tanh();
        *o = half * v * (F::ONE + t);
    }
}

/// `d *= gelu'(x)` in place (**writes**): `d (0.5 (1 + t) + ((0.5 x) (1 - t t)) dt)` with
/// `dt = s (1 + ((3 k) x) x)`.
pub fn gelu_backward_inplace<F: Scalar>(d: &mut [F], x: &[F]) {
    let (s, k, half) = (F::from_f64(GELU_S), F::from_f64(GELU_K), F::from_f64(0.5));
    let three_k = F::from_f64(3.0) * k;
    for (g, &v) in d.iter_mut().zip(x) {
        let t = (s * (v + k * v * v * v)).tanh();
        let dt = s * (F::ONE + three_k * v * v);
        *g *= half * (F::ONE + t) + half * v * (F::ONE - t * t) * dt;
    }
}

/// `dst += src` elementwise.
///
/// # Panics
/// If the lengths differ.
pub fn add_into<F: Scalar>(dst: &mut [F], src: &[F]) {
    assert!(
        dst.len() == src.len(),
        "add_into: buffers of {} and {} elements",
        dst.len(),
        src.len()
    );
    dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s);
}

/// `dst *= a` elementwise.
pub fn scale_into<F: Scalar>(dst: &mut [F], a: F) {
    dst.iter_mut().for_each(|d| *d *= a);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn;

    fn inputs() -> Vec<f32> {
        // A sweep through the interesting range, tails where tanh saturates, and specials.
        let mut x: Vec<f32> = (-4000..4000).map(|i| i as f32 * 2.7e-3).collect();
        x.extend([
            -30.0, -12.5, -9.0, 9.0, 12.5, 30.0, 0.0, -0.0, 1e-30, -1e-30, 1e30,
        ]);
        x.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -1e-40]);
        x
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn kernel_constants_are_the_cpu_ones() {
        let cu = crate::ptx::SOURCES
            .iter()
            .find(|s| s.name == "elementwise")
            .map(|s| s.cu)
            .expect("elementwise.cu is registered");
        let s = format!("0x{:08X}u", (GELU_S as f32).to_bits());
        let k = format!("0x{:08X}u", (GELU_K as f32).to_bits());
        assert!(cu.contains(&s), "GELU_S is {s} in f32");
        assert!(cu.contains(&k), "GELU_K is {k} in f32");
    }

    #[test]
    fn gelu_equals_the_cpu_kernel_bitwise() {
        let x = inputs();
        for n in [0, 1, 5, 31, 33, x.len()] {
            let x = &x[x.len() - n..];
            let (mut a, mut b) = (vec![0.0f32; n], vec![0.0f32; n]);
            gelu_forward(&mut a, x);
            nn::gelu_forward(&mut b, x);
            assert_eq!(bits(&a), bits(&b));
            let d0: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.3).collect();
            let (mut a, mut b) = (d0.clone(), d0.clone());
            gelu_backward_inplace(&mut a, x);
            nn::gelu_backward_inplace(&mut b, x);
            assert_eq!(bits(&a), bits(&b));
        }
    }

    #[test]
    fn gelu_tracks_f64() {
        let x: Vec<f32> = inputs().into_iter().filter(|v| v.abs() < 1e3).collect();
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let (mut y, mut y64) = (vec![0.0f32; x.len()], vec![0.0f64; x.len()]);
        gelu_forward(&mut y, &x);
        gelu_forward(&mut y64, &x64);
        let (mut d, mut d64) = (vec![1.0f32; x.len()], vec![1.0f64; x.len()]);
        gelu_backward_inplace(&mut d, &x);
        gelu_backward_inplace(&mut d64, &x64);
        for i in 0..x.len() {
            assert!(
                (y[i] as f64 - y64[i]).abs() <= 1e-6 * (1.0 + y64[i].abs()),
                "gelu({})",
                x[i]
            );
            assert!((d[i] as f64 - d64[i]).abs() <= 2e-6, "gelu'({})", x[i]);
        }
    }

    #[test]
    fn add_and_scale_equal_the_cpu_kernels() {
        let a: Vec<f32> = inputs();
        let b: Vec<f32> = a.iter().rev().map(|v| v * 0.37).collect();
        let (mut x, mut y) = (a.clone(), a.clone());
        add_into(&mut x, &b);
        nn::add_into(&mut y, &b);
        assert_eq!(bits(&x), bits(&y));
        scale_into(&mut x, -1.7);
        nn::scale_into(&mut y, -1.7);
        assert_eq!(bits(&x), bits(&y));
    }
}
