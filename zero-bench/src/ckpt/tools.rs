//! The `ckpt` tools (feature `hdf5`): `inspect` and `consolidate` here, `export` and
//! `bench` in their modules.

use crate::logging::outln;
use std::path::Path;

use anyhow::{bail, Context};
use zero_core::checkpoint::{self, ShardReader, KINDS};

use super::{bench, export, CkptCommand};

/// Run a `ckpt` subcommand.
pub fn run(cmd: CkptCommand) -> anyhow::Result<()> {
    match cmd {
        CkptCommand::Inspect { dir } => inspect(&dir),
        CkptCommand::Consolidate { dir, out } => {
            let context = || format!("consolidating {} into {}", dir.display(), out.display());
            // The output first: a directory missing or a file there is said before any
            // reading (and before HDF5 could say it in its own words).
            zero_core::files::check_output(&out, false).with_context(context)?;
            let n = checkpoint::consolidate(&dir, &out).with_context(context)?;
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
    // What happened beyond the steps (resumes, precision and batch changes), oldest first,
    // and the application's state (train: where its data order had got to).
    for (i, line) in m.history.iter().enumerate() {
        outln!(
            "{}{line}",
            if i == 0 {
                "history      "
            } else {
                "             "
            }
        );
    }
    if let Some(state) = &m.app_state {
        outln!("app state    {state}");
    }
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
    // A rank file that cannot be opened as its rank's shard (missing, truncated, of
    // another checkpoint) is one problem of the report, and none of its datasets was
    // read: only the others count as checked.
    let meta_path = report.dir.join(checkpoint::META_FILE);
    let mut unreadable = 0;
    for r in 0..m.world {
        let name = checkpoint::rank_file(r);
        let path = report.dir.join(&name);
        let size = match std::fs::metadata(&path) {
            Ok(md) => mib(md.len()),
            Err(e) => {
                unreadable += 1;
                outln!("  {name}  unreadable: {e}");
                continue;
            }
        };
        match ShardReader::open(&path)
            .and_then(|f| f.check_identity(r, m.world, m.step, &meta_path))
        {
            Ok(()) => outln!("  {name}  {size}"),
            // The reason is among the problems listed below.
            Err(_) => {
                unreadable += 1;
                outln!("  {name}  {size}, unreadable as this checkpoint's shard (below)");
            }
        }
    }
    let per_rank = m.layout.units.len() * KINDS.len();
    let datasets = m.world * per_rank;
    let read = datasets - unreadable * per_rank;
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
        // Each problem is an unreadable rank file or one bad dataset of a readable one.
        let bad = report.problems.len().saturating_sub(unreadable).min(read);
        let not_read = if unreadable == 0 {
            String::new()
        } else {
            format!(
                "; {} more in {unreadable} unreadable rank file{} not checked",
                unreadable * per_rank,
                if unreadable == 1 { "" } else { "s" }
            )
        };
        bail!(
            "{} problem(s) in {}: {} of {datasets} datasets checked, {bad} of them bad{not_read}",
            report.problems.len(),
            report.dir.display(),
            read
        )
    }
}
