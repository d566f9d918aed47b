//! `zero-bench micro adam`: the fused AdamW step against, in the same process and on the
//! same buffers, (1) an "Adam-shaped copy" that moves the same bytes with trivial math —
//! the memory-bandwidth roofline — and (2) the unfused step (one pass per operation).
//!
//! Reported per size: Gparam/s and GB/s (counting the step's own traffic: gradient +
//! master/m/v read and written + 16-bit copy, 28 bytes per parameter for bf16), the ratio
//! fused/copy (target at least 0.90 on one thread) and the speed-up fused/unfused
//! (target at least 1.8x). Times are the best of `--reps` runs, kernels interleaved so
//! that drifts of a shared machine hit all three alike.

use anyhow::{bail, Context, Result};
use half::{bf16, f16};
use serde::Serialize;
use std::time::Instant;
use zero_kernels::adamw::{self, AdamWCoeffs, AdamWHyper, AdamWState};
use zero_kernels::{DType, Exec, FloatSlice, HalfSliceMut, Isa};

use crate::logging::outln;

/// Options of `micro adam`.
#[derive(clap::Args, Debug)]
pub struct AdamArgs {
    /// Smallest size, in millions (10^6) of parameters.
    #[arg(long, default_value_t = 1)]
    min_mparams: usize,
    /// Largest size, in millions (10^6) of parameters (sizes go up by 4x: 1, 4, 16, 64, 256).
    #[arg(long, default_value_t = 16)]
    max_mparams: usize,
    /// Gradient type: f32, bf16 or f16.
    #[arg(long, default_value = "bf16")]
    grad: DType,
    /// Type of the 16-bit parameter copy written by the step: bf16, f16, or none (fp32).
    #[arg(long, default_value = "bf16")]
    param: String,
    /// Threads per kernel call (1: what a rank under MPI uses), 1 to 1024.
    #[arg(long, default_value_t = 1, value_parser = crate::train::thread_count)]
    threads: usize,
    /// Force an instruction-set level (scalar, avx2, avx512); default: the best available.
    #[arg(long)]
    isa: Option<String>,
    /// Timed runs per kernel and size (the best is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// One size's measurements.
#[derive(Serialize, Debug)]
struct Row {
    params: usize,
    bytes_per_param: usize,
    copy_s: f64,
    fused_s: f64,
    unfused_s: f64,
    copy_gbs: f64,
    fused_gbs: f64,
    unfused_gbs: f64,
    fused_gparams: f64,
    fused_over_copy: f64,
    fused_over_unfused: f64,
}

#[derive(Serialize, Debug)]
struct Report {
    isa: String,
    threads: usize,
    grad: String,
    param: String,
    rows: Vec<Row>,
}

enum Grad {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
}

enum Param {
    None,
    BF16(Vec<bf16>),
    F16(Vec<f16>),
}

impl Grad {
    fn slice(&self) -> FloatSlice<'_> {
        match self {
            Grad::F32(g) => FloatSlice::F32(g),
            Grad::BF16(g) => FloatSlice::BF16(g),
            Grad::F16(g) => FloatSlice::F16(g),
        }
    }
}

impl Param {
    fn slice(&mut self) -> Option<HalfSliceMut<'_>> {
        match self {
            Param::None => None,
            Param::BF16(p) => Some(HalfSliceMut::BF16(p)),
            Param::F16(p) => Some(HalfSliceMut::F16(p)),
        }
    }
}

/// Buffers of one size, filled with small smooth values (the speed does not depend on
/// them, but denormals or NaNs could).
struct Buffers {
    grad: Grad,
    master: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
    param: Param,
    scratch: Vec<f32>,
}

impl Buffers {
    fn new(n: usize, grad: DType, param: &str) -> Result<Buffers> {
        let val = |i: usize| ((i % 1021) as f32 - 510.0) * 1e-3;
        let grad = match grad {
            DType::F32 => Grad::F32((0..n).map(val).collect()),
            DType::BF16 => Grad::BF16((0..n).map(|i| bf16::from_f32(val(i))).collect()),
            DType::F16 => Grad::F16((0..n).map(|i| f16::from_f32(val(i))).collect()),
            other => bail!("--grad must be f32, bf16 or f16, not {other}"),
        };
        let param = match param {
            "none" => Param::None,
            "bf16" => Param::BF16(vec![bf16::ZERO; n]),
            "f16" => Param::F16(vec![f16::ZERO; n]),
            other => bail!("--param must be bf16, f16 or none, not '{other}'"),
        };
        Ok(Buffers {
            grad,
            master: (0..n).map(val).collect(),
            m: vec![0.0; n],
            v: vec![0.0; n],
            param,
            scratch: vec![0.0; n],
        })
    }
}

fn time(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

/// Run the benchmark.
pub fn run(args: &AdamArgs) -> Result<()> {
    if args.min_mparams == 0 || args.max_mparams < args.min_mparams {
        bail!(
            "need 1 <= --min-mparams <= --max-mparams, got {} and {}",
            args.min_mparams,
            args.max_mparams
        );
    }
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    if let Some(path) = &args.json {
        super::outputs::check(&[("--json", path)])?;
    }
    if !matches!(args.grad, DType::F32 | DType::BF16 | DType::F16) {
        bail!("--grad must be f32, bf16 or f16, not {}", args.grad);
    }
    let param_bytes = match args.param.as_str() {
        "none" => 0,
        "bf16" | "f16" => 2,
        other => bail!("--param must be bf16, f16 or none, not '{other}'"),
    };
    // What `Buffers::new` allocates for the largest point: the gradient, master, m and v
    // in f32, the 16-bit copy and the unfused step's f32 scratch. Checked here because a
    // failed allocation aborts the process rather than returning an error.
    let alloc_per_param = args.grad.size_bytes() as u64 + 12 + param_bytes as u64 + 4;
    crate::memory::need(
        &format!("--max-mparams {}", args.max_mparams),
        crate::memory::product(&[args.max_mparams as u64, 1_000_000, alloc_per_param]),
    )?;
    crate::logging::init(None);
    let mut exec = Exec::default().with_threads(args.threads)?;
    if let Some(name) = &args.isa {
        let isa = Isa::ALL
            .into_iter()
            .find(|i| i.name() == name)
            .with_context(|| format!("unknown --isa '{name}' (scalar, avx2, avx512)"))?;
        exec = exec.with_isa(isa)?;
    }
    let bytes = args.grad.size_bytes() + 24 + param_bytes;
    // Step 10 of a default nanoGPT group, decay on, a typical fp16 loss-scale factor.
    let c = AdamWCoeffs::new(&AdamWHyper::default(), 10, 1.0 / 1024.0, true)?;
    // The header first and each size's row as it is measured: a large size takes a while.
    outln!(
        "micro adam: isa {}, threads {}, grad {}, param {}, {} B/param (GB/s count these bytes), best of {} after an untimed run",
        exec.isa(),
        exec.threads(),
        args.grad,
        args.param,
        bytes,
        args.reps
    );
    outln!(
        "{:>9} {:>10} {:>10} {:>11} {:>12} {:>10} {:>13}",
        "params",
        "copy GB/s",
        "fused GB/s",
        "unfused GB/s",
        "fused Gpar/s",
        "fused/copy",
        "fused/unfused"
    );

    let mut rows = Vec::new();
    let mut mp = args.min_mparams;
    while mp <= args.max_mparams {
        // Millions as the options say (10^6), not 2^20.
        let n = mp * 1_000_000;
        // Fails only on a --grad or --param refused above.
        let mut b = Buffers::new(n, args.grad, &args.param)?;
        let (mut copy_s, mut fused_s, mut unfused_s) = (f64::MAX, f64::MAX, f64::MAX);
        // One untimed round first: page faults and caches.
        for rep in 0..=args.reps {
            let c1 = time(|| {
                let grad = b.grad.slice();
                let state = AdamWState {
                    master: &mut b.master,
                    m: &mut b.m,
                    v: &mut b.v,
                };
                Ok(adamw::roofline::shaped_copy(
                    &exec,
                    grad,
                    state,
                    b.param.slice(),
                )?)
            })?;
            // The copy grew the state; reset it so the step sees ordinary values.
            b.m.iter_mut().for_each(|x| *x = 0.0);
            b.v.iter_mut().for_each(|x| *x = 0.0);
            let f1 = time(|| {
                let grad = b.grad.slice();
                let state = AdamWState {
                    master: &mut b.master,
                    m: &mut b.m,
                    v: &mut b.v,
                };
                Ok(adamw::run(&exec, &c, grad, state, b.param.slice())?)
            })?;
            let u1 = time(|| {
                let grad = b.grad.slice();
                let state = AdamWState {
                    master: &mut b.master,
                    m: &mut b.m,
                    v: &mut b.v,
                };
                Ok(adamw::unfused::run(
                    &exec,
                    &c,
                    grad,
                    state,
                    b.param.slice(),
                    &mut b.scratch,
                )?)
            })?;
            if rep > 0 {
                copy_s = copy_s.min(c1);
                fused_s = fused_s.min(f1);
                unfused_s = unfused_s.min(u1);
            }
        }
        let gbs = |s: f64| (n * bytes) as f64 / s / 1e9;
        let row = Row {
            params: n,
            bytes_per_param: bytes,
            copy_s,
            fused_s,
            unfused_s,
            copy_gbs: gbs(copy_s),
            fused_gbs: gbs(fused_s),
            unfused_gbs: gbs(unfused_s),
            fused_gparams: n as f64 / fused_s / 1e9,
            fused_over_copy: copy_s / fused_s,
            fused_over_unfused: unfused_s / fused_s,
        };
        outln!(
            "{:>8}M {:>10.1} {:>10.1} {:>12.1} {:>12.3} {:>10.2} {:>12.2}x",
            mp,
            row.copy_gbs,
            row.fused_gbs,
            row.unfused_gbs,
            row.fused_gparams,
            row.fused_over_copy,
            row.fused_over_unfused
        );
        rows.push(row);
        match mp.checked_mul(4) {
            Some(next) => mp = next,
            None => break,
        }
    }
    if let Some(path) = &args.json {
        let report = Report {
            isa: exec.isa().to_string(),
            threads: exec.threads(),
            grad: args.grad.to_string(),
            param: args.param.clone(),
            rows,
        };
        let text = serde_json::to_string_pretty(&report)? + "\n";
        crate::outfile::write_text(path, &text).context("--json")?;
    }
    Ok(())
}
