//! `zero-bench ckpt`: tools on a sharded checkpoint directory. `inspect`, `consolidate`
//! and `export` are plain processes (no MPI): they read the rank files directly, one
//! tensor or dataset at a time. `bench` runs under mpirun and times save and load
//! against a plain sequential write and read of the same bytes.

mod bench;
mod export;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Subcommand;
use zero_core::checkpoint::{self, KINDS};

/// Checkpoint tools.
#[derive(Subcommand, Debug)]
pub enum CkptCommand {
    /// Step, N, stage, sizes, and whether every checksum holds (exit 1 if one does not).
    Inspect {
        /// A checkpoint root (follows `latest`) or a step directory.
        dir: PathBuf,
    },
    /// Write the master weights as one HDF5 file of named fp32 tensors (what
    /// `train --init-from` and h5py read).
    Consolidate {
        /// A checkpoint root (follows `latest`) or a step directory.
        dir: PathBuf,
        /// The HDF5 file to create (must not exist).
        out: PathBuf,
    },
    /// Export the master weights for other tools.
    Export(export::ExportArgs),
    /// Save/load throughput vs a plain sequential write/read of the same bytes (mpirun).
    Bench(bench::BenchArgs),
}

/// Run a `ckpt` subcommand.
pub fn run(cmd: CkptCommand) -> anyhow::Result<()> {
    match cmd {
        CkptCommand::Inspect { dir } => inspect(&dir),
        CkptCommand::Consolidate { dir, out } => {
            let n = checkpoint::consolidate(&dir, &out).with_context(|| {
                format!("consolidating {} into {}", dir.display(), out.display())
            })?;
            println!("wrote {n} tensors to {}", out.display());
            Ok(())
        }
        CkptCommand::Export(args) => export::run(&args),
        CkptCommand::Bench(args) => bench::run(&args),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn inspect(dir: &Path) -> anyhow::Result<()> {
    let report =
        checkpoint::verify(dir).with_context(|| format!("inspecting {}", dir.display()))?;
    let m = &report.meta;
    println!("checkpoint   {}", report.dir.display());
    println!(
        "format       {} v{} (zero-rs {})",
        m.format, m.format_version, m.zero_rs_version
    );
    println!(
        "step         {} ({} AdamW steps applied), seed {}",
        m.step, m.applied, m.seed
    );
    println!(
        "saved by     {} ranks, stage {:?}, precision {:?}",
        m.world, m.stage, m.precision
    );
    println!(
        "loss scale   {} (dynamic scaling {})",
        m.scaler.scale,
        if m.scaler.enabled { "on" } else { "off" }
    );
    println!(
        "model        {} tensors in {} units, {} parameters ({} padded, {} per rank shard)",
        m.layout.params.len(),
        m.layout.units.len(),
        m.layout.numel(),
        m.layout.padded_numel(),
        m.layout.shard_numel()
    );
    println!(
        "state        fp32 {} per rank: {} in all",
        KINDS.join(", "),
        mib(m.data_bytes())
    );
    for r in 0..m.world {
        let path = report.dir.join(checkpoint::rank_file(r));
        match std::fs::metadata(&path) {
            Ok(md) => println!("  {}  {}", checkpoint::rank_file(r), mib(md.len())),
            Err(e) => println!("  {}  unreadable: {e}", checkpoint::rank_file(r)),
        }
    }
    let datasets = m.world * m.layout.units.len() * KINDS.len();
    if report.problems.is_empty() {
        println!(
            "checksums    all hold ({datasets} datasets, {} checked)",
            mib(report.bytes_checked)
        );
        Ok(())
    } else {
        for p in &report.problems {
            println!("  BAD: {p}");
        }
        bail!(
            "{} problem(s) in {} ({datasets} datasets checked)",
            report.problems.len(),
            report.dir.display()
        )
    }
}
