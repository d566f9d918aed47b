//! `zero-bench micro quant`: block-wise int8 and int4 quantization and dequantization (the
//! kernels of ZeRO++-style quantized communication, `zero_kernels::quant`) against a plain
//! copy of the same values in the same run, on every instruction-set level this CPU has.
//!
//! Reported per level and width: values per second of quantize (reads 4 bytes, writes
//! 1 + 4/B per value for int8, 1/2 + 4/B for int4), dequantize (the reverse) and an f32
//! copy (reads 4, writes 4), and the ratios quantize/copy and dequantize/copy in values per
//! second. Medians of `--reps` rounds (the mean of the two middle ones for an even count),
//! after one untimed round per level (the outputs' first touch, caches), the five kernels
//! interleaved in each round so a shared machine's drift hits all alike.

use anyhow::{Context, Result};
use std::time::Instant;
use zero_kernels::quant::{
    code_bytes_int4, dequantize, dequantize_int4, quantize, quantize_int4, scale_count,
};
use zero_kernels::{Exec, Isa};

use crate::logging::outln;

/// Options of `micro quant`.
#[derive(clap::Args, Debug)]
pub struct QuantArgs {
    /// Values per call, in millions (10^6).
    #[arg(long, default_value_t = 16)]
    mvalues: usize,
    /// Values per scale (the quantization block).
    #[arg(long, default_value_t = zero_kernels::quant::DEFAULT_BLOCK)]
    block: usize,
    /// Threads per kernel call, 1 to 1024.
    #[arg(long, default_value_t = 1, value_parser = crate::train::thread_count)]
    threads: usize,
    /// Timed rounds, after an untimed one (the median is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
}

/// Run the benchmark and print one line per instruction-set level.
pub fn run(a: &QuantArgs) -> Result<()> {
    if a.mvalues == 0 || a.block == 0 || a.reps == 0 {
        anyhow::bail!("--mvalues, --block and --reps must be at least 1");
    }
    if !a.block.is_multiple_of(2) {
        anyhow::bail!(
            "--block {} is odd: int4 packs two values per byte, so blocks must be even",
            a.block
        );
    }
    // x, y and the int8 scales in f32, the codes: under 14 bytes a value.
    crate::memory::need(
        &format!("--mvalues {}", a.mvalues),
        crate::memory::product(&[a.mvalues as u64, 1_000_000, 14]),
    )?;
    let n = a.mvalues * 1_000_000;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let mut q = vec![0i8; n];
    let mut s = vec![0f32; scale_count(n, a.block)];
    let mut c4 = vec![0u8; code_bytes_int4(n)];
    let mut s4 = vec![0f32; scale_count(n, a.block)];
    let mut y = vec![0f32; n];
    outln!(
        "micro quant: {} M values (10^6), blocks of {}, {} thread(s), median of {} rounds after an untimed one",
        a.mvalues,
        a.block,
        a.threads,
        a.reps
    );
    for isa in Isa::available() {
        let exec = Exec::default()
            .with_isa(isa)
            .and_then(|e| e.with_threads(a.threads))
            .context("choosing the instruction-set level")?;
        let (mut tq, mut td, mut tc) = (Vec::new(), Vec::new(), Vec::new());
        let (mut tq4, mut td4) = (Vec::new(), Vec::new());
        // Round 0 is untimed: the first touch of the outputs' pages and the caches would
        // otherwise be timed in the first level's first round.
        for round in 0..=a.reps {
            if round == 0 {
                quantize(&exec, &x, a.block, &mut q, &mut s)?;
                dequantize(&exec, &q, &s, a.block, &mut y)?;
                quantize_int4(&exec, &x, a.block, &mut c4, &mut s4)?;
                dequantize_int4(&exec, &c4, &s4, a.block, &mut y)?;
                y.copy_from_slice(std::hint::black_box(&x));
                continue;
            }
            let t = Instant::now();
            quantize(&exec, &x, a.block, &mut q, &mut s)?;
            tq.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            dequantize(&exec, &q, &s, a.block, &mut y)?;
            td.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            quantize_int4(&exec, &x, a.block, &mut c4, &mut s4)?;
            tq4.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            dequantize_int4(&exec, &c4, &s4, a.block, &mut y)?;
            td4.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            y.copy_from_slice(std::hint::black_box(&x));
            tc.push(t.elapsed().as_secs_f64());
        }
        let (tq, td, tc) = (super::median(&tq), super::median(&td), super::median(&tc));
        let (tq4, td4) = (super::median(&tq4), super::median(&td4));
        let gv = |t: f64| n as f64 / t / 1e9;
        outln!(
            "  {isa:>6}: quantize {:.2} Gvalues/s ({:.2}x copy), dequantize {:.2} Gvalues/s ({:.2}x copy), f32 copy {:.2} Gvalues/s ({:.1} GB/s)",
            gv(tq),
            tc / tq,
            gv(td),
            tc / td,
            gv(tc),
            8.0 * n as f64 / tc / 1e9
        );
        outln!(
            "  {:>6}  int4: quantize {:.2} Gvalues/s ({:.2}x copy), dequantize {:.2} Gvalues/s ({:.2}x copy)",
            "",
            gv(tq4),
            tc / tq4,
            gv(td4),
            tc / td4
        );
    }
    Ok(())
}
