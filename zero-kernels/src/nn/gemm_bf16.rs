//! Matrix products with bf16 operands and f32 accumulation, for `precision = "bf16"` on
//! the CPU: `C = alpha * A B + beta * C` with A, B and C f32 in memory (any strides, as
//! `matrixmultiply` takes them), A and B rounded to bf16 (round to nearest even) as they
//! are packed. This is what a GPU's bf16 tensor cores compute (the CUDA device's
//! `MatmulPrecision::Bf16`), and what PyTorch's CPU autocast does to a linear layer's
//! inputs.
//!
//! Layout (the BLIS scheme, one level): K is cut into blocks of [`KC`]; per block B is
//! packed once into panels of [`NR`] columns and A into bands of [`MR`] rows, both as
//! *pairs*: one u32 holds the bf16 of k = 2p (low half) and k = 2p + 1 (high half), the
//! operand layout of AVX-512 BF16's `vdpbf16ps`, which adds both products of a pair to an
//! f32 lane. The micro-kernel keeps an MR x NR tile of f32 sums in registers; the tile
//! is then added into C: `beta C + alpha T` for the first K block, `C + alpha T` after.
//!
//! Two micro-kernels, chosen at run time: `vdpbf16ps` (AVX-512 BF16) and a portable one
//! that adds the same products in the same order (per pair, the odd k first, as the
//! instruction's definition in Intel's SDM says). A product of two bf16 is exact in f32,
//! so each step is one f32 addition with one rounding either way, and the two agree bit
//! for bit except on subnormals (the instruction flushes them to zero; see the tests).
//! AMX (`tdpbf16ps`) would slot in as a third micro-kernel.

/// Rows of A per micro-tile.
pub const MR: usize = 8;
/// Columns of B per micro-tile (two 16-lane registers).
pub const NR: usize = 32;
/// K per packed block (even, so pairs never straddle blocks).
pub const KC: usize = 256;

/// The micro-kernel of this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// AVX-512 BF16 `vdpbf16ps`.
    Avx512Bf16,
    /// Plain f32 arithmetic in the instruction's order (any CPU).
    Portable,
}

impl Bf16Kernel {
    /// The fastest this CPU runs.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
        {
            return Bf16Kernel::Avx512Bf16;
        }
        Bf16Kernel::Portable
    }
}

/// `x` rounded to bf16 (nearest even; NaN stays a quiet NaN), as its bits. Branch-free,
/// so the packing loops vectorise (equal to `half::bf16::from_f32`: tested).
#[inline(always)]
fn to_bf16(x: f32) -> u32 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x40;
    if x.is_nan() {
        quiet_nan
    } else {
        rounded
    }
}

/// A pair's u32 from the bf16 of k (low half) and k + 1 (high half).
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    to_bf16(lo) | (to_bf16(hi) << 16)
}

/// Pack rows `kb..kb + kc` of B (`n` columns) into panels of NR columns, pair-major:
/// `out[(panel * pairs + p) * NR + j]` holds columns `panel * NR + j` of k = kb + 2p and
/// kb + 2p + 1. Missing columns and the odd k past `kc` are zero.
///
/// # Safety
/// `b` with strides `rsb`, `csb` addresses a valid K x n matrix with K >= kb + kc.
unsafe fn pack_b(
    out: &mut Vec<u32>,
    b: *const f32,
    rsb: isize,
    csb: isize,
    kb: usize,
    kc: usize,
    n: usize,
) {
    let pairs = kc.div_ceil(2);
    let panels = n.div_ceil(NR);
    out.clear();
    out.resize(panels * pairs * NR, 0);
    let at = |k: usize, j: usize| *b.offset(k as isize * rsb + j as isize * csb);
    let full = kc / 2; // pairs with both halves
    if csb == 1 {
        // Rows of B contiguous: walk each pair of rows once, start to end, panel by panel.
        for p in 0..full {
            let k = kb + 2 * p;
            let lo = std::slice::from_raw_parts(b.offset(k as isize * rsb), n);
            let hi = std::slice::from_raw_parts(b.offset((k + 1) as isize * rsb), n);
            for (panel, (l, h)) in lo.chunks(NR).zip(hi.chunks(NR)).enumerate() {
                let dst = &mut out[(panel * pairs + p) * NR..][..l.len()];
                for ((slot, &l), &h) in dst.iter_mut().zip(l).zip(h) {
                    *slot = pair(l, h);
                }
            }
        }
    }
    for panel in 0..panels {
        let j0 = panel * NR;
        let width = NR.min(n - j0);
        let dst = &mut out[panel * pairs * NR..][..pairs * NR];
        if csb == 1 {
            // Packed above.
        } else if rsb == 1 {
            // Columns of B contiguous (B = W^T): each column's run of k converts in pairs.
            for j in 0..width {
                let col = std::slice::from_raw_parts(b.offset((j0 + j) as isize * csb).add(kb), kc);
                for (p, two) in col.chunks_exact(2).enumerate() {
                    dst[p * NR + j] = pair(two[0], two[1]);
                }
            }
        } else {
            for p in 0..full {
                for j in 0..width {
                    dst[p * NR + j] = pair(at(kb + 2 * p, j0 + j), at(kb + 2 * p + 1, j0 + j));
                }
            }
        }
        if full < pairs {
            // K odd: the last pair's high half is zero.
            for j in 0..width {
                dst[full * NR + j] = to_bf16(at(kb + 2 * full, j0 + j));
            }
        }
    }
}

/// Pack rows `i0..i0 + mr` (mr <= MR) of A, columns `kb..kb + kc`, pair-major:
/// `out[p * MR + r]`. Missing rows and the odd k past `kc` are zero.
///
/// # Safety
/// `a` with strides `rsa`, `csa` addresses a valid matrix holding those rows and columns.
#[allow(clippy::too_many_arguments)]
unsafe fn pack_a(
    out: &mut [u32],
    a: *const f32,
    rsa: isize,
    csa: isize,
    i0: usize,
    mr: usize,
    kb: usize,
    kc: usize,
) {
    let pairs = kc.div_ceil(2);
    let at = |i: usize, k: usize| *a.offset(i as isize * rsa + k as isize * csa);
    let full = kc / 2;
    if mr < MR {
        out[..pairs * MR].fill(0);
    }
    if csa == 1 {
        // Rows of A contiguous: each row's run of k converts in pairs.
        for r in 0..mr {
            let row = std::slice::from_raw_parts(a.offset((i0 + r) as isize * rsa).add(kb), kc);
            for (p, two) in row.chunks_exact(2).enumerate() {
                out[p * MR + r] = pair(two[0], two[1]);
            }
        }
    } else {
        for p in 0..full {
            for r in 0..mr {
                out[p * MR + r] = pair(at(i0 + r, kb + 2 * p), at(i0 + r, kb + 2 * p + 1));
            }
        }
    }
    if full < pairs {
        for r in 0..mr {
            out[full * MR + r] = to_bf16(at(i0 + r, kb + 2 * full));
        }
    }
}

/// One bf16 value of a pair, widened to f32 (exact).
#[inline(always)]
fn half_of(pair: u32, high: bool) -> f32 {
    let bits = if high { pair >> 16 } else { pair & 0xFFFF };
    f32::from_bits(bits << 16)
}

/// The portable micro-kernel: `tile[r * NR + j] = sum over pairs of A[r] . B[j]`, per
/// pair the odd k first, each product added with one rounding (as `vdpbf16ps`).
fn kernel_portable(pairs: usize, a: &[u32], b: &[u32], tile: &mut [f32; MR * NR]) {
    tile.fill(0.0);
    for p in 0..pairs {
        let (ap, bp) = (&a[p * MR..][..MR], &b[p * NR..][..NR]);
        for (r, &ar) in ap.iter().enumerate() {
            let (a_lo, a_hi) = (half_of(ar, false), half_of(ar, true));
            let row = &mut tile[r * NR..][..NR];
            for (acc, &bj) in row.iter_mut().zip(bp) {
                *acc += a_hi * half_of(bj, true);
                *acc += a_lo * half_of(bj, false);
            }
        }
    }
}

/// The `vdpbf16ps` micro-kernel: the tile's 8 x 2 registers of 16 f32 sums.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 BF16; `a` holds `pairs * MR` and `b` `pairs * NR`
/// values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel_avx512bf16(pairs: usize, a: &[u32], b: &[u32], tile: &mut [f32; MR * NR]) {
    use std::arch::x86_64::*;
    debug_assert!(a.len() >= pairs * MR && b.len() >= pairs * NR);
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    for p in 0..pairs {
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(pb.add(p * NR) as *const _));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(pb.add(p * NR + 16) as *const _));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let ar: __m512bh = std::mem::transmute(_mm512_set1_epi32(*pa.add(p * MR + r) as i32));
            acc_r[0] = _mm512_dpbf16_ps(acc_r[0], ar, b0);
            acc_r[1] = _mm512_dpbf16_ps(acc_r[1], ar, b1);
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR), acc_r[0]);
        _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR + 16), acc_r[1]);
    }
}

/// `C = alpha * bf16(A) bf16(B) + beta * C`, f32 accumulation, with `kernel`.
/// matrixmultiply's `sgemm` contract: `a` is m x k, `b` k x n, `c` m x n, each with its
/// row and column strides; `beta == 0` overwrites C (NaN in C does not survive).
///
/// # Safety
/// The pointers with these dimensions and strides address valid memory; `c` does not
/// alias `a` or `b`; `kernel` is one this CPU runs ([`Bf16Kernel::detect`]).
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm_bf16(
    kernel: Bf16Kernel,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    rsa: isize,
    csa: isize,
    b: *const f32,
    rsb: isize,
    csb: isize,
    beta: f32,
    c: *mut f32,
    rsc: isize,
    csc: isize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let c_at = |i: usize, j: usize| c.offset(i as isize * rsc + j as isize * csc);
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                let x = c_at(i, j);
                *x = if beta == 0.0 { 0.0 } else { beta * *x };
            }
        }
        return;
    }
    let mut b_packed = Vec::new();
    let mut a_packed = vec![0u32; KC.div_ceil(2) * MR];
    let mut tile = [0f32; MR * NR];
    for kb in (0..k).step_by(KC) {
        let kc = KC.min(k - kb);
        let pairs = kc.div_ceil(2);
        pack_b(&mut b_packed, b, rsb, csb, kb, kc, n);
        for i0 in (0..m).step_by(MR) {
            let mr = MR.min(m - i0);
            pack_a(&mut a_packed, a, rsa, csa, i0, mr, kb, kc);
            for (panel, bp) in b_packed.chunks_exact(pairs * NR).enumerate() {
                match kernel {
                    #[cfg(target_arch = "x86_64")]
                    Bf16Kernel::Avx512Bf16 => kernel_avx512bf16(pairs, &a_packed, bp, &mut tile),
                    _ => kernel_portable(pairs, &a_packed, bp, &mut tile),
                }
                let j0 = panel * NR;
                let width = NR.min(n - j0);
                for (r, t) in tile.chunks_exact(NR).take(mr).enumerate() {
                    let t = &t[..width];
                    if csc == 1 {
                        // A contiguous row of C: a loop that vectorises.
                        let row = std::slice::from_raw_parts_mut(c_at(i0 + r, j0), width);
                        if kb > 0 {
                            row.iter_mut().zip(t).for_each(|(x, &t)| *x += alpha * t);
                        } else if beta == 0.0 {
                            row.iter_mut().zip(t).for_each(|(x, &t)| *x = alpha * t);
                        } else {
                            row.iter_mut()
                                .zip(t)
                                .for_each(|(x, &t)| *x = beta * *x + alpha * t);
                        }
                        continue;
                    }
                    for (j, &t) in t.iter().enumerate() {
                        let x = c_at(i0 + r, j0 + j);
                        *x = if kb > 0 {
                            *x + alpha * t
                        } else if beta == 0.0 {
                            alpha * t
                        } else {
                            beta * *x + alpha * t
                        };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// The definition in f64 over the bf16-rounded operands.
    fn reference(m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
        let r = |x: f32| bf16::from_f32(x).to_f32() as f64;
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| r(a[i * k + p]) * r(b[p * n + j])).sum();
            }
        }
        c
    }

    fn vals(len: usize, seed: u32) -> Vec<f32> {
        (0..len as u32)
            .map(|i| {
                let h = (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) >> 8;
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn run(kernel: Bf16Kernel, m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![f32::NAN; m * n];
        // SAFETY: row-major m x k, k x n, m x n over slices of those sizes.
        unsafe {
            sgemm_bf16(
                kernel,
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                n as isize,
                1,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        };
        c
    }

    /// Odd shapes: one element, K odd (a half pair), K past one block, edges in M and N.
    const SHAPES: [(usize, usize, usize); 6] = [
        (1, 1, 1),
        (3, 5, 7),
        (9, 33, 31),
        (17, 257, 65),
        (8, 600, 32),
        (40, 64, 100),
    ];

    #[test]
    fn matches_the_f64_product_of_the_rounded_operands() {
        for &(m, k, n) in &SHAPES {
            let (a, b) = (vals(m * k, 1), vals(k * n, 2));
            let want = reference(m, k, n, &a, &b);
            for kernel in [Bf16Kernel::Portable, Bf16Kernel::detect()] {
                let got = run(kernel, m, k, n, &a, &b);
                for (g, w) in got.iter().zip(&want) {
                    // f32 sums of k exact products: k roundings of at most 2^-24 each.
                    let tol = 2.0 * k as f64 * f32::EPSILON as f64 * (1.0 + w.abs());
                    assert!(
                        (*g as f64 - w).abs() <= tol,
                        "{kernel:?} {m}x{k}x{n}: {g} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_vector_kernel_equals_the_portable_one_bit_for_bit() {
        if Bf16Kernel::detect() == Bf16Kernel::Portable {
            eprintln!("no AVX-512 BF16 here: only the portable kernel to test");
            return;
        }
        for &(m, k, n) in &SHAPES {
            let (a, b) = (vals(m * k, 3), vals(k * n, 4));
            let p = run(Bf16Kernel::Portable, m, k, n, &a, &b);
            let v = run(Bf16Kernel::Avx512Bf16, m, k, n, &a, &b);
            for (x, y) in p.iter().zip(&v) {
                assert_eq!(x.to_bits(), y.to_bits(), "{m}x{k}x{n}: {x} vs {y}");
            }
        }
    }

    #[test]
    fn rounding_equals_the_half_crate() {
        let mut bits = 0x1234_5678u32;
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            f32::INFINITY,
        ];
        let randoms = (0..200_000).map(|_| {
            bits = bits.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            f32::from_bits(bits)
        });
        for x in specials.into_iter().chain(randoms) {
            let want = bf16::from_f32(x);
            let got = bf16::from_bits(to_bf16(x) as u16);
            if want.is_nan() {
                assert!(got.is_nan(), "{x:e}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{x:e}");
            }
        }
    }

    #[test]
    fn every_operand_layout_packs_alike() {
        // The same product from A and B stored row-major, transposed, and with both
        // strides above 1 (every packing path): equal bit for bit.
        let (m, k, n) = (13, 37, 45);
        let (a, b) = (vals(m * k, 8), vals(k * n, 9));
        let want = run(Bf16Kernel::Portable, m, k, n, &a, &b);
        let a_t: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let b_t: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        // Strides 2 x: every other element of a doubled buffer.
        let a2: Vec<f32> = a.iter().flat_map(|&x| [x, f32::NAN]).collect();
        let b2: Vec<f32> = b.iter().flat_map(|&x| [x, f32::NAN]).collect();
        type Case<'a> = (&'a [f32], isize, isize, &'a [f32], isize, isize);
        let cases: [Case<'_>; 3] = [
            (&a_t, 1, m as isize, &b_t, 1, k as isize),
            (&a2, 2 * k as isize, 2, &b2, 2 * n as isize, 2),
            (&a, k as isize, 1, &b_t, 1, k as isize),
        ];
        for (ca, rsa, csa, cb, rsb, csb) in cases {
            let mut c = vec![0f32; m * n];
            // SAFETY: each case's strides address its buffer's m x k and k x n elements.
            unsafe {
                sgemm_bf16(
                    Bf16Kernel::Portable,
                    m,
                    k,
                    n,
                    1.0,
                    ca.as_ptr(),
                    rsa,
                    csa,
                    cb.as_ptr(),
                    rsb,
                    csb,
                    0.0,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                )
            };
            assert!(
                c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                "strides {rsa} {csa} {rsb} {csb}"
            );
        }
    }

    #[test]
    fn alpha_beta_and_strided_views() {
        // C^T (column-major) = 0.5 A B + 2 C, A given transposed.
        let (m, k, n) = (11, 300, 13);
        let a_t = vals(k * m, 5); // A stored k x m
        let b = vals(k * n, 6);
        let c0 = vals(m * n, 7);
        let mut c = c0.clone();
        // SAFETY: the strides address k x m, k x n and n x m buffers of those sizes.
        unsafe {
            sgemm_bf16(
                Bf16Kernel::detect(),
                m,
                k,
                n,
                0.5,
                a_t.as_ptr(),
                1,
                m as isize,
                b.as_ptr(),
                n as isize,
                1,
                2.0,
                c.as_mut_ptr(),
                1,
                m as isize,
            )
        };
        let a: Vec<f32> = (0..m * k).map(|i| a_t[(i % k) * m + i / k]).collect();
        let ab = reference(m, k, n, &a, &b);
        for i in 0..m {
            for j in 0..n {
                let want = 0.5 * ab[i * n + j] + 2.0 * c0[j * m + i] as f64;
                let got = c[j * m + i] as f64;
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{got} vs {want}"
                );
            }
        }
        // k = 0 with beta = 0 overwrites NaN.
        let mut z = [f32::NAN; 4];
        // SAFETY: k = 0 reads nothing; C is 2 x 2.
        unsafe {
            sgemm_bf16(
                Bf16Kernel::Portable,
                2,
                0,
                2,
                1.0,
                [].as_ptr(),
                0,
                0,
                [].as_ptr(),
                0,
                0,
                0.0,
                z.as_mut_ptr(),
                2,
                1,
            )
        };
        assert_eq!(z, [0.0; 4]);
    }
}
