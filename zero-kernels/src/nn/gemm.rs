//! The one matrix multiply every model layer goes through: `C = alpha * A B + beta * C`
//! over strided views of slices. f32 runs this crate's AVX-512F kernel where the CPU has
//! it and `matrixmultiply` (pure Rust, AVX2/FMA and AVX-512 kernels chosen at run time)
//! elsewhere ([`super::sgemm`], which says why); f64 runs `matrixmultiply`. Both chosen by
//! measurement on this machine: `matrixmultiply` ran 1024x256x1024 f32 at ~125 GFLOP/s
//! single-threaded, against ~90 for the `gemm` crate and ~108 measured earlier for
//! OpenBLAS (measured on this project's build machines; docs/ARCHITECTURE.md), with no
//! system library to install; the AVX-512F kernel then ran up to 1.18x `matrixmultiply`.
//!
//! Views are bounds-checked here, once per call, so the unsafe call below is sound.
//! With `threads > 1` the rows of C are split into disjoint bands, one per pool thread;
//! every element of C is still one dot product in the same K order as on one
//! thread. (Bands of columns where C is wider than tall, each thread packing only its
//! share of B, ran the classifier's 1024 x 384 x 50257 at 271-342 against 224-247 GFLOP/s
//! on 2 threads of a Zen 4, bf16 operands; but the model splits that product into vocab
//! blocks of 4621 columns, and the V = 50257 and V = 4096 bf16 training steps were no
//! faster, 4 interleaved rounds: rows it is.)

use super::gemm_bf16::Bf16Kernel;
use super::scalar::Scalar;
use crate::par::Workers;

/// A strided matrix view into a slice: element (i, j) lives at `i*rs + j*cs`.
/// `MatLayout::rm(rows, cols, ld)` is row-major with leading dimension `ld`; `.t()` is its
/// transpose over the same memory (column-major), which is how `A^T` is passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatLayout {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Row stride, in elements.
    pub rs: usize,
    /// Column stride, in elements.
    pub cs: usize,
}

impl MatLayout {
    /// A row-major matrix whose rows are `ld` elements apart.
    pub fn rm(rows: usize, cols: usize, ld: usize) -> Self {
        MatLayout {
            rows,
            cols,
            rs: ld,
            cs: 1,
        }
    }

    /// The transpose, as a view of the same memory.
    pub fn t(self) -> Self {
        MatLayout {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// Elements from the first to one past the last element addressed (0 for an empty
    /// view): the shortest slice the view fits in; `None` when that overflows `usize`
    /// (no slice holds the view).
    pub fn checked_span(&self) -> Option<usize> {
        if self.rows == 0 || self.cols == 0 {
            return Some(0);
        }
        (self.rows - 1)
            .checked_mul(self.rs)?
            .checked_add((self.cols - 1).checked_mul(self.cs)?)?
            .checked_add(1)
    }

    /// [`Self::checked_span`], saturating at `usize::MAX` when it overflows: a bound
    /// check against it then fails, where a wrapped span could pass.
    pub fn span(&self) -> usize {
        self.checked_span().unwrap_or(usize::MAX)
    }

    /// Whether both strides are valid pointer offsets for elements of `F`: the kernels
    /// step by them as `isize` element counts, whose byte offset must fit `isize`
    /// (a stride of a dimension of one element is never stepped, but still passed).
    pub fn strides_fit<F>(&self) -> bool {
        let max = isize::MAX as usize / std::mem::size_of::<F>().max(1);
        self.rs <= max && self.cs <= max
    }

    /// Why this view cannot address a slice of `len` elements of `F` (`Ok`: it can): its
    /// span must be computable and at most `len`, its strides fit `isize`. The one bound
    /// check of every GEMM entry point, so their unsafe kernels stay in bounds.
    pub fn check_fits<F>(&self, len: usize) -> Result<(), String> {
        if !self.strides_fit::<F>() {
            return Err(format!(
                "layout {self:?} has a stride past isize::MAX bytes of {}-byte elements",
                std::mem::size_of::<F>()
            ));
        }
        match self.checked_span() {
            Some(span) if span <= len => Ok(()),
            Some(span) => Err(format!(
                "layout {self:?} addresses {span} elements of a {len}-element view"
            )),
            None => Err(format!(
                "layout {self:?} addresses more elements than usize counts"
            )),
        }
    }
}

/// A raw pointer handed to the kernel threads; the bands it addresses are disjoint.
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: only used inside `Gemm::run`, where each thread writes a disjoint band of C and
// reads A and B, which no thread writes; `Workers::run` returns when every band is done.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the whole Send wrapper, not the field).
    fn get(self) -> *mut T {
        self.0
    }
}

/// Below this many multiply-adds a call is not split across threads (the hand-off costs
/// more than it saves).
const MIN_PARALLEL_WORK: usize = 1 << 20;

/// The matrix multiply, with its threads (cloning shares them) and its operand precision.
#[derive(Clone, Debug)]
pub struct Gemm {
    workers: Workers,
    /// f32 products rounded their operands to bf16 with this micro-kernel
    /// ([`super::gemm_bf16`]); `None`: exact f32 operands.
    bf16: Option<Bf16Kernel>,
}

impl Gemm {
    /// A GEMM on `threads` threads (0 is taken as 1), a pool of them kept for its life.
    pub fn new(threads: usize) -> Self {
        Gemm {
            workers: Workers::new(threads),
            bf16: None,
        }
    }

    /// The same GEMM (same threads) with f32 operands rounded to bf16 (f32 sums) when
    /// `on`, on this CPU's fastest bf16 micro-kernel; f64 products stay exact.
    pub fn with_bf16_operands(&self, on: bool) -> Self {
        self.with_bf16_kernel(on.then(Bf16Kernel::detect))
    }

    /// The same GEMM (same threads) with f32 operands rounded to bf16 on `kernel`'s
    /// micro-kernel (`None`: exact f32 operands); for benchmarks that time each kernel.
    ///
    /// # Panics
    /// When this CPU does not run `kernel` ([`Bf16Kernel::is_available`]).
    pub fn with_bf16_kernel(&self, kernel: Option<Bf16Kernel>) -> Self {
        if let Some(k) = kernel {
            assert!(
                k.is_available(),
                "bf16 kernel {k} is not available on this CPU"
            );
        }
        Gemm {
            workers: self.workers.clone(),
            bf16: kernel,
        }
    }

    /// The same operands (bf16 or exact) on the calling thread alone: for work the caller
    /// has already split over threads, which must compute what one thread would.
    pub fn on_one_thread(&self) -> Self {
        Gemm {
            workers: Workers::new(1),
            bf16: self.bf16,
        }
    }

    /// Whether f32 operands are rounded to bf16.
    pub fn bf16_operands(&self) -> bool {
        self.bf16.is_some()
    }

    /// Threads used.
    pub fn threads(&self) -> usize {
        self.workers.threads()
    }

    /// The threads, for the other kernels that split their work.
    pub fn workers(&self) -> &Workers {
        &self.workers
    }

    /// `C = alpha * A B + beta * C`. Panics when the shapes disagree or a view runs past
    /// its slice (or its span or a stride overflows, [`MatLayout::check_fits`]): both
    /// are bugs in the calling layer, never user input; a device's matmul checks first
    /// and returns an error instead.
    #[allow(clippy::too_many_arguments)]
    pub fn run<F: Scalar>(
        &self,
        alpha: F,
        a: &[F],
        la: MatLayout,
        b: &[F],
        lb: MatLayout,
        beta: F,
        c: &mut [F],
        lc: MatLayout,
    ) {
        assert!(
            la.cols == lb.rows && la.rows == lc.rows && lb.cols == lc.cols,
            "gemm shapes: A {}x{}, B {}x{}, C {}x{}",
            la.rows,
            la.cols,
            lb.rows,
            lb.cols,
            lc.rows,
            lc.cols
        );
        // The only bound check before the raw pointers below: overflow-safe spans, and
        // strides that are valid offsets (a panic on a bad view, never a wild access).
        for (what, l, len) in [("A", la, a.len()), ("B", lb, b.len()), ("C", lc, c.len())] {
            if let Err(e) = l.check_fits::<F>(len) {
                panic!("gemm view out of bounds: {what}'s {e}");
            }
        }
        let (m, k, n) = (la.rows, la.cols, lb.cols);
        if m == 0 || n == 0 {
            return;
        }
        // Threads only over row-major C whose bands are disjoint memory.
        let threads = self.threads();
        let bands = if threads > 1
            && lc.cs == 1
            && lc.rs >= n
            && m.saturating_mul(n).saturating_mul(k) >= MIN_PARALLEL_WORK
        {
            threads.min(m)
        } else {
            1
        };
        let (pa, pb, pc) = (
            SendPtr(a.as_ptr() as *mut F),
            SendPtr(b.as_ptr() as *mut F),
            SendPtr(c.as_mut_ptr()),
        );
        let bf16 = self.bf16;
        // Rows r0..r1 of C, on whichever thread calls it.
        let band = |(r0, r1): (usize, usize)| {
            // SAFETY: the views were bounds-checked above; rows r0..r1 of A and C are
            // inside them (r0 * rs is at most the span; an empty A, k = 0, is one band
            // from r0 = 0); C does not alias A or B (a `&mut` and two `&`); bands on
            // several threads write disjoint rows of C.
            unsafe {
                gemm_band(
                    bf16,
                    r1 - r0,
                    k,
                    n,
                    alpha,
                    pa.get().add(r0 * la.rs),
                    la.rs as isize,
                    la.cs as isize,
                    pb.get(),
                    lb.rs as isize,
                    lb.cs as isize,
                    beta,
                    pc.get().add(r0 * lc.rs),
                    lc.rs as isize,
                    lc.cs as isize,
                )
            }
        };
        if bands == 1 {
            band((0, m));
            return;
        }
        if let (Some(kernel), Some(shared)) = (bf16, F::GEMM_BF16_SHARED) {
            // SAFETY: as `band`, over all rows.
            let done = unsafe {
                shared(
                    &self.workers,
                    kernel,
                    m,
                    k,
                    n,
                    alpha,
                    pa.get(),
                    la.rs as isize,
                    la.cs as isize,
                    pb.get(),
                    lb.rs as isize,
                    lb.cs as isize,
                    beta,
                    pc.get(),
                    lc.rs as isize,
                    lc.cs as isize,
                )
            };
            if done {
                return;
            }
        }
        let per = m.div_ceil(bands);
        let jobs: Vec<(usize, usize)> = (0..bands)
            .map(|i| (i * per, ((i + 1) * per).min(m)))
            .filter(|(r0, r1)| r0 < r1)
            .collect();
        self.workers.run(jobs, band);
    }
}

/// One band's product: exact operands, or rounded to bf16 with `bf16`'s micro-kernel.
///
/// # Safety
/// As [`Scalar::gemm_raw`].
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn gemm_band<F: Scalar>(
    bf16: Option<Bf16Kernel>,
    m: usize,
    k: usize,
    n: usize,
    alpha: F,
    a: *const F,
    rsa: isize,
    csa: isize,
    b: *const F,
    rsb: isize,
    csb: isize,
    beta: F,
    c: *mut F,
    rsc: isize,
    csc: isize,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match bf16 {
            Some(kernel) => F::gemm_raw_bf16(
                kernel, m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
            ),
            None => F::gemm_raw(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive triple loop: the oracle.
    fn reference(a: &[f64], la: MatLayout, b: &[f64], lb: MatLayout, c: &mut [f64], lc: MatLayout) {
        for i in 0..la.rows {
            for j in 0..lb.cols {
                let mut s = 0.0;
                for p in 0..la.cols {
                    s += a[i * la.rs + p * la.cs] * b[p * lb.rs + j * lb.cs];
                }
                c[i * lc.rs + j * lc.cs] = 0.5 * s + 2.0 * c[i * lc.rs + j * lc.cs];
            }
        }
    }

    #[test]
    fn spans_and_strides_that_overflow_never_fit() {
        // (3-1) * 2^63 + 1 wraps to 1 in unchecked arithmetic.
        let wraps = MatLayout::rm(3, 1, 1 << 63);
        assert_eq!(wraps.checked_span(), None);
        assert_eq!(wraps.span(), usize::MAX);
        assert!(wraps.check_fits::<f32>(1).is_err());
        assert!(wraps.check_fits::<f32>(usize::MAX).is_err());
        assert_eq!(MatLayout::rm(0, 5, usize::MAX).checked_span(), Some(0));
        assert_eq!(MatLayout::rm(3, 4, 5).t().checked_span(), Some(14));
        assert!(MatLayout::rm(3, 4, 5).check_fits::<f64>(15).is_ok());
        // One row: the span is 4, but the stride is no isize offset of f32 bytes.
        let wild = MatLayout::rm(1, 4, isize::MAX as usize / 4 + 1);
        assert_eq!(wild.checked_span(), Some(4));
        assert!(wild.check_fits::<f32>(4).is_err());
        assert!(wild.check_fits::<u8>(4).is_ok());
    }

    #[test]
    #[should_panic(expected = "gemm view out of bounds: B's")]
    fn run_panics_on_a_wrapping_span_instead_of_reading_past_it() {
        let (a, b, mut c) = ([1.0f32; 3], [1.0f32; 1], [0.0f32; 9]);
        // B is 1 x 3 with columns 2^63 apart: its span, 2 * 2^63 + 1, wraps to 1.
        let lb = MatLayout::rm(3, 1, 1 << 63).t();
        let (la, lc) = (MatLayout::rm(3, 1, 1), MatLayout::rm(3, 3, 3));
        Gemm::new(1).run(1.0, &a, la, &b, lb, 0.0, &mut c, lc);
    }

    #[test]
    fn strided_and_threaded_match_reference() {
        for &(m, k, n, threads) in &[
            (1, 1, 1, 1),
            (7, 0, 5, 1),
            (37, 129, 65, 3),
            (300, 64, 70, 2),
        ] {
            let a: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
            let b: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64) - 5.0).collect();
            let la = MatLayout::rm(k, m, m).t(); // A stored transposed
            let lb = MatLayout::rm(k, n, n);
            let lc = MatLayout::rm(m, n, n + 3); // padded rows
            let init: Vec<f64> = (0..m * (n + 3)).map(|i| (i % 3) as f64).collect();
            let mut want = init.clone();
            reference(&a, la, &b, lb, &mut want, lc);
            let mut got = init;
            Gemm::new(threads).run(0.5, &a, la, &b, lb, 2.0, &mut got, lc);
            assert_eq!(got, want, "m={m} k={k} n={n} threads={threads}");
        }
    }
}
