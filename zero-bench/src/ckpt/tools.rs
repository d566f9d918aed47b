//! The `ckpt` tools (feature `hdf5`): `inspect` and `consolidate` here, `export` and
//! `bench` in their modules.

use crate::logging::outln;
use std::path::Path;

use anyhow::{bail, Context};
use zero_core::checkpoint::{self, KINDS};

use super::{bench, export, CkptCommand};

/// Run a `ckpt` subcommand.
pub fn run(cmd: CkptCommand) -> anyhow::Result<()> {
    match cmd {
        CkptCommand::Inspect { dir } => inspect(&dir),
        CkptCommand::Consolidate { dir, out } => {
            let n = checkpoint::consolidate(&dir, &out).with_context(|| {
                format!("consolidating {} into {}", dir.display(), out.display())
            })?;
            outln!("wrote {n} tensors to {}", out.display());
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
    outln!("checkpoint   {}", report.dir.display());
    outln!(
        "format       {} v{} (zero-rs {})",
        m.format,
        m.format_version,
        m.zero_rs_version
    );
    outln!(
        "step         {} ({} AdamW steps applied), seed {}",
        m.step,
        m.applied,
        m.seed
    );
    outln!(
        "saved by     {} ranks, stage {:?}, precision {:?}",
        m.world,
        m.stage,
        m.precision
    );
    outln!(
        "loss scale   {} (dynamic scaling {})",
        m.scaler.scale,
        if m.scaler.enabled { "on" } else { "off" }
    );
    outln!(
        "model        {} tensors in {} units, {} parameters ({} padded, {} per rank shard)",
        m.layout.params.len(),
        m.layout.units.len(),
        m.layout.numel(),
        m.layout.padded_numel(),
        m.layout.shard_numel()
    );
    outln!(
        "state        fp32 {} per rank: {} in all",
        KINDS.join(", "),
        mib(m.data_bytes())
    );
    for r in 0..m.world {
        let path = report.dir.join(checkpoint::rank_file(r));
        match std::fs::metadata(&path) {
            Ok(md) => outln!("  {}  {}", checkpoint::rank_file(r), mib(md.len())),
            Err(e) => outln!("  {}  unreadable: {e}", checkpoint::rank_file(r)),
        }
    }
    let datasets = m.world * m.layout.units.len() * KINDS.len();
    if report.problems.is_empty() {
        outln!(
            "checksums    all hold ({datasets} datasets, {} checked)",
            mib(report.bytes_checked)
        );
        Ok(())
    } else {
        for p in &report.problems {
            outln!("  BAD: {p}");
        }
        bail!(
            "{} problem(s) in {} ({datasets} datasets checked)",
            report.problems.len(),
            report.dir.display()
        )
    }
}
