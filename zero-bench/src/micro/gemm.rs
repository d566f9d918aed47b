//! `zero-bench micro gemm`: the bf16-operand GEMM's micro-kernels (AMX `tdpbf16ps`,
//! AVX-512 BF16 `vdpbf16ps`, optionally the portable one) next to f32 SGEMM (what fp32
//! training multiplies with: `Gemm::run`'s kernel, `zero_kernels::nn::sgemm`) on the same
//! shapes, threads and buffers; when that kernel is not `matrixmultiply`, also
//! `matrixmultiply` itself, the fallback it replaced. Each shape is `C = A B^T` with B stored [N, K], as the model's linear layers
//! compute; the defaults are GPT-2's layer shapes at M = B*T = 4096 rows. With the
//! AVX-512 BF16 kernel, each round also times `vdpbf16ps` itself on registers
//! (`gemm_bf16::vdpbf16ps_chains`), and the table gives the kernel's fraction of that.
//! That peak is an estimate, the best of every round's samples: on some CPUs the
//! register loop runs slower than the kernel itself (seen on an AMD EPYC with AVX-512
//! BF16, 1.2-2.2x), and a fraction above 1 is then flagged, not passed off as a ceiling.
//!
//! Rounds are interleaved (every method on every shape, then the next round), so a
//! shared machine's drifts hit all methods alike, and each round starts with the next
//! method, so none is always the one that runs on a cold cache; reported are the median
//! GFLOP/s over the rounds and the median of the per-round ratios.

use anyhow::{bail, Context, Result};
use std::time::Instant;
use zero_kernels::nn::gemm_bf16::{self, Bf16Kernel};
use zero_kernels::nn::sgemm::{sgemm, SgemmKernel};
use zero_kernels::nn::{Gemm, MatLayout};

use crate::logging::outln;

/// Rounds of 24 `vdpbf16ps` in one peak sample: 1.5 GFLOP, ~7 ms at 230 GFLOP/s.
const PEAK_STEPS: usize = 1_000_000;

/// Timed peak samples per round (after an untimed one that wakes the core up).
const PEAK_SAMPLES: usize = 2;

/// Options of `micro gemm`.
#[derive(clap::Args, Debug)]
pub struct GemmArgs {
    /// Shapes as MxKxN, comma-separated (C[M, N] = A[M, K] B[N, K]^T).
    #[arg(
        long,
        default_value = "4096x256x256,4096x256x1024,4096x768x768,4096x768x3072,4096x3072x768,4096x1024x1024"
    )]
    shapes: String,
    /// bf16 micro-kernels to time, comma-separated (amx, avx512, avx2, portable); default:
    /// every one this CPU runs but the portable one.
    #[arg(long)]
    kernels: Option<String>,
    /// Threads: `Gemm::run`'s pool, as training uses it (rows of C in bands, one per
    /// thread; AMX threads also share one packed B), 1 to 1024.
    #[arg(long, default_value_t = 1, value_parser = crate::train::thread_count)]
    threads: usize,
    /// Interleaved rounds (the median is reported).
    #[arg(long, default_value_t = 7)]
    rounds: usize,
}

/// One shape's buffers.
struct Shape {
    m: usize,
    k: usize,
    n: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

/// A method under test: f32 SGEMM (through `Gemm::run`), one bf16 micro-kernel, or one
/// f32 kernel forced.
#[derive(Clone, Copy)]
enum Method {
    Sgemm,
    Bf16(Bf16Kernel),
    F32(SgemmKernel),
}

impl Method {
    fn name(self) -> String {
        match self {
            Method::Sgemm => "f32 sgemm".to_string(),
            Method::Bf16(k) => format!("bf16 {k}"),
            Method::F32(k) => format!("f32 {k}"),
        }
    }
}

/// `MxKxN`, and the bytes of its A, B and C in f32 (`None` on overflow; the packed copies
/// are smaller than their sources).
fn parse_shape(s: &str) -> Result<((usize, usize, usize), Option<u64>)> {
    let dims: Vec<usize> = s
        .trim()
        .split('x')
        .map(|d| d.parse::<usize>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("shape {s:?} is not MxKxN"))?;
    match dims[..] {
        [m, k, n] if m > 0 && k > 0 && n > 0 => {
            let (m64, k64, n64) = (m as u64, k as u64, n as u64);
            let elems = crate::memory::product(&[m64, k64])
                .zip(crate::memory::product(&[k64, n64]))
                .zip(crate::memory::product(&[m64, n64]))
                .and_then(|((a, b), c)| a.checked_add(b)?.checked_add(c));
            Ok(((m, k, n), elems.and_then(|e| e.checked_mul(4))))
        }
        _ => bail!("shape {s:?} must be MxKxN with three positive sizes"),
    }
}

/// One timed product, in seconds.
fn time(method: Method, s: &mut Shape, gemm: &Gemm, threads: usize) -> f64 {
    let (m, k, n) = (s.m, s.k, s.n);
    let t0 = Instant::now();
    match method {
        // The pool's threads, as training runs them (AMX threads share one packed B).
        Method::Sgemm | Method::Bf16(_) => {
            let bf16 = match method {
                Method::Bf16(kernel) => Some(kernel),
                _ => None,
            };
            gemm.with_bf16_kernel(bf16).run(
                1.0,
                &s.a,
                MatLayout::rm(m, k, k),
                &s.b,
                MatLayout::rm(n, k, k).t(),
                0.0,
                &mut s.c,
                MatLayout::rm(m, n, n),
            )
        }
        // A forced f32 kernel: bands of rows on scoped threads.
        Method::F32(kernel) => {
            let rows = m.div_ceil(threads.clamp(1, m));
            let (a, b) = (&s.a, &s.b);
            std::thread::scope(|sc| {
                for (band, c) in s.c.chunks_mut(rows * n).enumerate() {
                    let r0 = band * rows;
                    let mr = c.len() / n;
                    let mut run = move || {
                        // SAFETY: A's rows r0..r0 + mr (row-major, K apart), B [N, K] read
                        // as K x N (strides 1, K) and C's band (row-major, N apart) lie
                        // inside their vectors; the kernel was checked available.
                        unsafe {
                            let a = a[r0 * k..].as_ptr();
                            let (ki, ni) = (k as isize, n as isize);
                            sgemm(
                                kernel,
                                mr,
                                k,
                                n,
                                1.0,
                                a,
                                ki,
                                1,
                                b.as_ptr(),
                                1,
                                ki,
                                0.0,
                                c.as_mut_ptr(),
                                ni,
                                1,
                            )
                        }
                    };
                    if r0 == 0 {
                        run();
                    } else {
                        sc.spawn(run);
                    }
                }
            });
        }
    }
    t0.elapsed().as_secs_f64()
}

/// Run the benchmark.
pub fn run(args: &GemmArgs) -> Result<()> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be > 0");
    // Every kernel is timed by name here, but a bad ZERO_BF16_KERNEL is still an error
    // (as in `micro model`), not a surprise in the next run.
    Bf16Kernel::from_env()?;
    SgemmKernel::from_env()?;
    let kernels: Vec<Bf16Kernel> = match &args.kernels {
        Some(list) => list
            .split(',')
            .map(|name| Ok(name.parse::<Bf16Kernel>()?.force()?))
            .collect::<Result<_>>()
            .context("--kernels")?,
        None => Bf16Kernel::available()
            .into_iter()
            .rev()
            .filter(|&k| k != Bf16Kernel::Portable)
            .collect(),
    };
    let mut methods = vec![Method::Sgemm];
    methods.extend(kernels.iter().map(|&k| Method::Bf16(k)));
    // The f32 fallback next to the kernel `Gemm::run` uses, when they differ.
    let f32_kernel = SgemmKernel::detect();
    let with_fallback = f32_kernel != SgemmKernel::MatrixMultiply;
    if with_fallback {
        methods.push(Method::F32(SgemmKernel::MatrixMultiply));
    }
    let dims: Vec<((usize, usize, usize), Option<u64>)> = args
        .shapes
        .split(',')
        .map(parse_shape)
        .collect::<Result<_>>()?;
    // Every shape's buffers live at once: their sum is what must fit, not each alone.
    let total = dims
        .iter()
        .try_fold(0u64, |sum, (_, bytes)| sum.checked_add((*bytes)?));
    let what = match dims.len() {
        1 => format!("--shapes {}", args.shapes.trim()),
        n => format!("--shapes (all {n} shapes at once)"),
    };
    crate::memory::need(&what, total)?;
    crate::logging::init(None);
    let mut shapes: Vec<Shape> = dims
        .into_iter()
        .map(|((m, k, n), _)| {
            let val =
                |i: usize| ((i.wrapping_mul(2_654_435_761) >> 7) % 2001) as f32 / 1000.0 - 1.0;
            Ok(Shape {
                m,
                k,
                n,
                a: (0..m * k).map(val).collect(),
                b: (0..n * k).map(|i| val(i + 7)).collect(),
                c: vec![0.0; m * n],
            })
        })
        .collect::<Result<_>>()?;
    let gemm = Gemm::new(args.threads);
    // times[shape][method][round]
    let mut times = vec![vec![Vec::new(); methods.len()]; shapes.len()];
    // `vdpbf16ps` on registers, one core, each round (GFLOP/s): an estimate of the
    // AVX-512 BF16 kernel's ceiling, measured beside it.
    let with_peak = kernels.contains(&Bf16Kernel::Avx512Bf16);
    let mut peaks = Vec::new();
    let mut progress = super::Progress::new("micro gemm");
    for round in 0..=args.rounds {
        if with_peak {
            // The pool's workers spin a while after each product, then sleep: let them,
            // so that none shares the core with the measurement. Then an untimed sample,
            // so that the timed ones do not start on a core the sleep let clock down.
            std::thread::sleep(std::time::Duration::from_millis(20));
            std::hint::black_box(gemm_bf16::vdpbf16ps_chains(PEAK_STEPS / 2));
            for _ in 0..PEAK_SAMPLES {
                let t0 = Instant::now();
                if let Some((flops, sum)) = gemm_bf16::vdpbf16ps_chains(PEAK_STEPS) {
                    let gflops = flops / t0.elapsed().as_secs_f64() / 1e9;
                    if round > 0 && sum.is_finite() {
                        peaks.push(gflops);
                    }
                }
            }
        }
        for (s, shape) in shapes.iter_mut().enumerate() {
            // Each round starts one method later: the first method of a shape finds the
            // previous shape's data in cache, the others this shape's (A and B warm), which
            // favoured the later columns by ~5% on the smaller shapes.
            for step in 0..methods.len() {
                let i = (round + step) % methods.len();
                let t = time(methods[i], shape, &gemm, args.threads);
                if round > 0 {
                    // Round 0 warms caches, pages and the AMX permission up.
                    times[s][i].push(t);
                }
            }
        }
        progress.done(round, args.rounds, "rounds (after a warm-up round)");
    }
    outln!(
        "bf16-operand GEMM micro-kernels vs f32 SGEMM ({f32_kernel}), {} thread(s), median of {} interleaved rounds (GFLOP/s; ratios: median of per-round ratios)",
        args.threads, args.rounds
    );
    let mut header = format!("{:<18}", "MxKxN");
    for m in &methods {
        header += &format!(" {:>14}", m.name());
    }
    if with_fallback {
        header += &format!(" {:>12}", "sgemm/mm");
    }
    for k in &kernels {
        header += &format!(" {:>12}", format!("{k}/sgemm"));
    }
    if kernels.contains(&Bf16Kernel::Amx) && kernels.contains(&Bf16Kernel::Avx512Bf16) {
        header += &format!(" {:>12}", "amx/avx512");
    }
    // The best sample: an estimate of a ceiling is the fastest the loop was seen to run.
    let peak = peaks.iter().copied().reduce(f64::max);
    if peak.is_some() {
        header += &format!(" {:>12}", "avx512/peak");
    }
    outln!("{header}");
    // (Shapes where the kernel beat the peak estimate, the largest fraction.)
    let (mut above, mut most) = (0usize, 0.0f64);
    for (s, shape) in shapes.iter().enumerate() {
        let flop = 2.0 * (shape.m * shape.k * shape.n) as f64;
        let mut line = format!("{:<18}", format!("{}x{}x{}", shape.m, shape.k, shape.n));
        for t in &times[s] {
            let g: Vec<f64> = t.iter().map(|t| flop / t / 1e9).collect();
            line += &format!(" {:>14.1}", super::median(&g));
        }
        // Ratio of speeds = inverse ratio of times, per round.
        let ratio = |num: usize, den: usize| {
            let r: Vec<f64> = times[s][den]
                .iter()
                .zip(&times[s][num])
                .map(|(d, n)| d / n)
                .collect();
            super::median(&r)
        };
        if with_fallback {
            line += &format!(" {:>12.2}", ratio(0, methods.len() - 1));
        }
        for i in 1..=kernels.len() {
            line += &format!(" {:>12.2}", ratio(i, 0));
        }
        let at = |k: Bf16Kernel| kernels.iter().position(|&x| x == k).map(|p| p + 1);
        if let (Some(x), Some(v)) = (at(Bf16Kernel::Amx), at(Bf16Kernel::Avx512Bf16)) {
            line += &format!(" {:>12.2}", ratio(x, v));
        }
        if let (Some(peak), Some(v)) = (peak, at(Bf16Kernel::Avx512Bf16)) {
            let g: Vec<f64> = times[s][v].iter().map(|t| flop / t / 1e9).collect();
            let fraction = super::median(&g) / (peak * args.threads as f64);
            // Shown as measured, marked where it is no ceiling.
            let mark = if fraction > 1.0 { "!" } else { "" };
            line += &format!(" {:>12}", format!("{fraction:.2}{mark}"));
            if fraction > 1.0 {
                above += 1;
                most = most.max(fraction);
            }
        }
        outln!("{line}");
    }
    if let Some(peak) = peak {
        outln!(
            "peak estimate: vdpbf16ps on registers (24 independent chains, no loads), one core: {peak:.1} GFLOP/s (the best of {} samples); avx512/peak divides by it times --threads",
            peaks.len()
        );
        if above > 0 {
            outln!(
                "warning: the avx512 kernel ran faster than this estimate on {above} of {} shape(s) (marked !, up to {most:.2}x): on this CPU the register loop does not reach the instruction's limit, so the estimate is no ceiling here and avx512/peak overstates how near the kernel is to one",
                shapes.len()
            );
        }
    }
    Ok(())
}
