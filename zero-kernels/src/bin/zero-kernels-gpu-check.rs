//! GPU check of zero-kernels, built to be carried to a GPU machine (links neither MPI nor
//! HDF5): every CUDA kernel against its CPU twin element by element — bitwise, since both
//! run the same IEEE operations in the same order (NaN payloads aside, which Rust leaves
//! unspecified) — then the fused AdamW step's GB/s next to a device-to-device copy.
//!
//!   zero-kernels-gpu-check [--mparams N]   (bandwidth size, millions of parameters; 64)
//!
//! Exit status 0 only if every comparison matched; without a CUDA driver it says so and
//! exits 1.

use half::{bf16, f16};
use std::process::ExitCode;
use std::time::Instant;
use zero_kernels::adamw::{self, AdamWCoeffs, AdamWHyper, AdamWState};
use zero_kernels::cuda::{CudaDevice, DeviceAdamWState, DeviceBuffer, DeviceFloat, DeviceHalfMut};
use zero_kernels::{cast, gradstats, Exec, FloatSlice, HalfSliceMut, KernelError};

/// Deterministic inputs: xorshift values over many magnitudes, with specials sprinkled in.
fn inputs(n: usize, seed: u64, nonneg: bool) -> Vec<f32> {
    let specials = [
        0.0,
        -0.0,
        1e-45,
        1e-40,
        65504.0,
        65520.0,
        f32::INFINITY,
        f32::NAN,
        3e38,
        -1e-20,
    ];
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = if i % 997 == 0 {
                specials[(s % specials.len() as u64) as usize]
            } else {
                let mant = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                let exp = ((s >> 8) % 40) as i32 - 30;
                mant * 2f32.powi(exp)
            };
            if nonneg {
                x.abs()
            } else {
                x
            }
        })
        .collect()
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Count mismatches and print the first few.
fn compare(what: &str, gpu: &[f32], cpu: &[f32], failures: &mut usize) {
    let bad: Vec<usize> = (0..cpu.len()).filter(|&i| !same(gpu[i], cpu[i])).collect();
    if bad.is_empty() {
        println!("  ok       {what} ({} elements bitwise equal)", cpu.len());
    } else {
        println!(
            "  MISMATCH {what}: {} of {} elements differ",
            bad.len(),
            cpu.len()
        );
        for &i in bad.iter().take(5) {
            println!(
                "           [{i}] gpu {:e} ({:#010x}) cpu {:e} ({:#010x})",
                gpu[i],
                gpu[i].to_bits(),
                cpu[i],
                cpu[i].to_bits()
            );
        }
        *failures += 1;
    }
}

fn halves_as_f32<H: Copy + Into<f32>>(v: &[H]) -> Vec<f32> {
    v.iter().map(|&h| h.into()).collect()
}

fn check_adamw(dev: &CudaDevice, n: usize, failures: &mut usize) -> Result<(), KernelError> {
    let exec = Exec::default();
    let g = inputs(n, 1, false);
    let (p0, m0, v0) = (inputs(n, 2, false), inputs(n, 3, false), inputs(n, 4, true));
    let gb: Vec<bf16> = g.iter().map(|&x| bf16::from_f32(x)).collect();
    let gh: Vec<f16> = g.iter().map(|&x| f16::from_f32(x)).collect();
    let h = AdamWHyper::default();
    let c = AdamWCoeffs::new(&h, 7, 0.25, true)?;
    let (dg, dgb, dgh) = (
        DeviceBuffer::from_host(dev, &g)?,
        DeviceBuffer::from_host(dev, &gb)?,
        DeviceBuffer::from_host(dev, &gh)?,
    );
    for (gname, grad, dgrad) in [
        ("f32", FloatSlice::F32(&g), DeviceFloat::F32(&dg)),
        ("bf16", FloatSlice::BF16(&gb), DeviceFloat::BF16(&dgb)),
        ("f16", FloatSlice::F16(&gh), DeviceFloat::F16(&dgh)),
    ] {
        for layout in ["none", "bf16", "f16"] {
            let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
            let (mut ob, mut oh) = (vec![bf16::ZERO; n], vec![f16::ZERO; n]);
            let out = match layout {
                "bf16" => Some(HalfSliceMut::BF16(&mut ob)),
                "f16" => Some(HalfSliceMut::F16(&mut oh)),
                _ => None,
            };
            adamw::run(
                &exec,
                &c,
                grad,
                AdamWState {
                    master: &mut p,
                    m: &mut m,
                    v: &mut v,
                },
                out,
            )?;
            let (mut dp, mut dm, mut dv) = (
                DeviceBuffer::from_host(dev, &p0)?,
                DeviceBuffer::from_host(dev, &m0)?,
                DeviceBuffer::from_host(dev, &v0)?,
            );
            let (mut dob, mut doh) = (
                DeviceBuffer::<bf16>::zeros(dev, n)?,
                DeviceBuffer::<f16>::zeros(dev, n)?,
            );
            let dout = match layout {
                "bf16" => Some(DeviceHalfMut::BF16(&mut dob)),
                "f16" => Some(DeviceHalfMut::F16(&mut doh)),
                _ => None,
            };
            adamw::cuda::run(
                dev,
                &c,
                dgrad,
                DeviceAdamWState {
                    master: &mut dp,
                    m: &mut dm,
                    v: &mut dv,
                },
                dout,
            )?;
            let tag = format!("adamw grad {gname} copy {layout}");
            compare(&format!("{tag}: master"), &dp.to_host(dev)?, &p, failures);
            compare(&format!("{tag}: m"), &dm.to_host(dev)?, &m, failures);
            compare(&format!("{tag}: v"), &dv.to_host(dev)?, &v, failures);
            match layout {
                "bf16" => compare(
                    &format!("{tag}: bf16 copy"),
                    &halves_as_f32(&dob.to_host(dev)?),
                    &halves_as_f32(&ob),
                    failures,
                ),
                "f16" => compare(
                    &format!("{tag}: f16 copy"),
                    &halves_as_f32(&doh.to_host(dev)?),
                    &halves_as_f32(&oh),
                    failures,
                ),
                _ => {}
            }
        }
    }
    Ok(())
}

fn check_casts_and_stats(
    dev: &CudaDevice,
    n: usize,
    failures: &mut usize,
) -> Result<(), KernelError> {
    let exec = Exec::default();
    let x = inputs(n, 5, false);
    let dx = DeviceBuffer::from_host(dev, &x)?;
    // Narrow.
    let (mut b, mut h) = (vec![bf16::ZERO; n], vec![f16::ZERO; n]);
    cast::narrow(&exec, &x, HalfSliceMut::BF16(&mut b))?;
    cast::narrow(&exec, &x, HalfSliceMut::F16(&mut h))?;
    let (mut db, mut dh) = (
        DeviceBuffer::<bf16>::zeros(dev, n)?,
        DeviceBuffer::<f16>::zeros(dev, n)?,
    );
    cast::cuda::narrow(dev, &dx, DeviceHalfMut::BF16(&mut db))?;
    cast::cuda::narrow(dev, &dx, DeviceHalfMut::F16(&mut dh))?;
    let bits = |v: Vec<u16>| {
        v.into_iter()
            .map(|u| f32::from_bits(u as u32))
            .collect::<Vec<f32>>()
    };
    compare(
        "narrow bf16 (bits)",
        &bits(db.to_host(dev)?.iter().map(|v| v.to_bits()).collect()),
        &bits(b.iter().map(|v| v.to_bits()).collect()),
        failures,
    );
    compare(
        "narrow f16 (bits)",
        &bits(dh.to_host(dev)?.iter().map(|v| v.to_bits()).collect()),
        &bits(h.iter().map(|v| v.to_bits()).collect()),
        failures,
    );
    // Widen and accumulate, from every type.
    for (name, src, dsrc) in [
        ("f32", FloatSlice::F32(&x), DeviceFloat::F32(&dx)),
        ("bf16", FloatSlice::BF16(&b), DeviceFloat::BF16(&db)),
        ("f16", FloatSlice::F16(&h), DeviceFloat::F16(&dh)),
    ] {
        let mut w = vec![0.0f32; n];
        cast::widen(&exec, src, &mut w)?;
        let mut dw = DeviceBuffer::<f32>::zeros(dev, n)?;
        cast::cuda::widen(dev, dsrc, &mut dw)?;
        compare(&format!("widen {name}"), &dw.to_host(dev)?, &w, failures);
        let mut acc = inputs(n, 6, false);
        let mut dacc = DeviceBuffer::from_host(dev, &acc)?;
        cast::accumulate(&exec, &mut acc, src)?;
        cast::cuda::accumulate(dev, &mut dacc, dsrc)?;
        compare(
            &format!("accumulate {name}"),
            &dacc.to_host(dev)?,
            &acc,
            failures,
        );
        // Statistics (the inputs hold inf/NaN, so also a finite variant).
        for (tag, scale) in [("with inf/NaN", 0.5f32), ("", 0.5f32)] {
            let finite: Vec<f32>;
            let (s, ds) = if tag.is_empty() {
                finite = w
                    .iter()
                    .map(|v| {
                        if v.is_finite() {
                            v.clamp(-1e30, 1e30)
                        } else {
                            1.0
                        }
                    })
                    .collect();
                let df = DeviceBuffer::from_host(dev, &finite)?;
                (
                    gradstats::stats(&exec, FloatSlice::F32(&finite), scale),
                    gradstats::cuda::stats(dev, DeviceFloat::F32(&df), scale)?,
                )
            } else {
                (
                    gradstats::stats(&exec, src, scale),
                    gradstats::cuda::stats(dev, dsrc, scale)?,
                )
            };
            let ok = (s.sum_squares.to_bits() == ds.sum_squares.to_bits()
                || (s.sum_squares.is_nan() && ds.sum_squares.is_nan()))
                && s.nonfinite == ds.nonfinite;
            println!(
                "  {}       sum of squares {name} {tag}: gpu {:e} cpu {:e} nonfinite {}/{}",
                if ok { "ok" } else { "MISMATCH" },
                ds.sum_squares,
                s.sum_squares,
                ds.nonfinite,
                s.nonfinite
            );
            if !ok {
                *failures += 1;
            }
        }
    }
    let mut u = x.clone();
    let mut du = DeviceBuffer::from_host(dev, &x)?;
    let s = gradstats::unscale_in_place(&exec, &mut u, 0.125);
    let ds = gradstats::cuda::unscale_in_place(dev, &mut du, 0.125)?;
    compare("unscale in place", &du.to_host(dev)?, &u, failures);
    if !(s.nonfinite == ds.nonfinite
        && (s.sum_squares.to_bits() == ds.sum_squares.to_bits()
            || (s.sum_squares.is_nan() && ds.sum_squares.is_nan())))
    {
        println!("  MISMATCH unscale statistics: gpu {ds:?} cpu {s:?}");
        *failures += 1;
    }
    Ok(())
}

/// Best time of `reps` runs of `f` (each synchronised).
fn best(
    dev: &CudaDevice,
    reps: usize,
    mut f: impl FnMut() -> Result<(), KernelError>,
) -> Result<f64, KernelError> {
    f()?;
    dev.synchronize_default()?;
    let mut t_best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        dev.synchronize_default()?;
        t_best = t_best.min(t.elapsed().as_secs_f64());
    }
    Ok(t_best)
}

fn bandwidth(dev: &CudaDevice, n: usize) -> Result<(), KernelError> {
    let g = DeviceBuffer::<bf16>::zeros(dev, n)?;
    let (mut p, mut m, mut v) = (
        DeviceBuffer::<f32>::zeros(dev, n)?,
        DeviceBuffer::<f32>::zeros(dev, n)?,
        DeviceBuffer::<f32>::zeros(dev, n)?,
    );
    let mut out = DeviceBuffer::<bf16>::zeros(dev, n)?;
    let c = AdamWCoeffs::new(&AdamWHyper::default(), 10, 1.0, true)?;
    let t_adam = best(dev, 20, || {
        adamw::cuda::run(
            dev,
            &c,
            DeviceFloat::BF16(&g),
            DeviceAdamWState {
                master: &mut p,
                m: &mut m,
                v: &mut v,
            },
            Some(DeviceHalfMut::BF16(&mut out)),
        )
    })?;
    // Device-to-device copy of as many bytes as the step reads (14 B/param), so it moves
    // (reads + writes) 28 B/param like the step.
    let src = DeviceBuffer::<bf16>::zeros(dev, 7 * n)?;
    let mut dst = DeviceBuffer::<bf16>::zeros(dev, 7 * n)?;
    let t_copy = best(dev, 20, || dst.copy_from_device(dev, &src))?;
    let bytes = 28.0 * n as f64;
    println!(
        "bandwidth, {}M parameters, grad bf16, copy bf16 (28 B/param):",
        n >> 20
    );
    println!("  device-to-device copy {:8.1} GB/s", bytes / t_copy / 1e9);
    println!(
        "  fused AdamW           {:8.1} GB/s  {:.3} Gparam/s  ratio to copy {:.2} (target >= 0.85)",
        bytes / t_adam / 1e9,
        n as f64 / t_adam / 1e9,
        t_copy / t_adam
    );
    Ok(())
}

fn main() -> ExitCode {
    let mut mparams = 64usize;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.next().map(|s| s.parse::<usize>())) {
            ("--mparams", Some(Ok(v))) if v > 0 => mparams = v,
            _ => {
                eprintln!(
                    "error: bad arguments {args:?} (usage: zero-kernels-gpu-check [--mparams N])"
                );
                return ExitCode::from(2);
            }
        }
    }
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    println!(
        "device 0: {}",
        dev.name()
            .unwrap_or_else(|e| format!("(name unavailable: {e})"))
    );
    let mut failures = 0;
    let mut run = || -> Result<(), KernelError> {
        for n in [0usize, 1, 4095, 4097, (1 << 20) + 77] {
            println!("n = {n}:");
            check_adamw(&dev, n, &mut failures)?;
            check_casts_and_stats(&dev, n, &mut failures)?;
        }
        bandwidth(&dev, mparams << 20)
    };
    if let Err(e) = run() {
        eprintln!("error: {e}");
        return ExitCode::from(1);
    }
    if failures > 0 {
        eprintln!("FAILED: {failures} comparison(s) differ");
        return ExitCode::from(1);
    }
    println!("OK: every GPU kernel matches the CPU bit for bit");
    ExitCode::SUCCESS
}
