//! `zero-bench ckpt`: tools on a sharded checkpoint directory. `inspect`, `consolidate`
//! and `export` are plain processes (no MPI): they read the rank files directly, one
//! tensor or dataset at a time. `bench` runs under mpirun and times save and load
//! against a plain sequential write and read of the same bytes.

mod args;
#[cfg(feature = "hdf5")]
mod bench;
#[cfg(feature = "hdf5")]
mod export;
#[cfg(feature = "hdf5")]
mod tools;

use std::path::PathBuf;

use clap::Subcommand;

pub use args::{BenchArgs, ExportArgs};

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
    ///
    /// The file appears only when complete, and never replaces an existing one (nor one
    /// that another process writes meanwhile). On Ctrl-C, SIGTERM or SIGHUP the unfinished
    /// file is removed and the command ends by that signal (exit status 130 for Ctrl-C,
    /// 143 for SIGTERM); the one a killed process (SIGKILL) leaves, .OUT.partial-PID, is
    /// removed by the next run writing OUT once it is a minute old.
    Consolidate {
        /// A checkpoint root (follows `latest`) or a step directory.
        dir: PathBuf,
        /// The HDF5 file to create (must not exist; its directory must).
        out: PathBuf,
    },
    /// Export the master weights for other tools.
    ///
    /// The file appears only when complete, and never replaces an existing one (nor one
    /// that another process writes meanwhile). On Ctrl-C, SIGTERM or SIGHUP the unfinished
    /// file is removed and the command ends by that signal (exit status 130 for Ctrl-C,
    /// 143 for SIGTERM); the one a killed process (SIGKILL) leaves, .OUT.partial-PID, is
    /// removed by the next run writing OUT once it is a minute old.
    Export(ExportArgs),
    /// Save/load throughput vs a plain sequential write/read of the same bytes (mpirun).
    Bench(BenchArgs),
}

/// Run a `ckpt` subcommand, its `log` lines shown (`RUST_LOG`). `bench` starts MPI first
/// and installs the logger itself, tagged with its rank (bench.rs); the other tools are
/// one plain process.
#[cfg(feature = "hdf5")]
pub fn run(cmd: CkptCommand) -> anyhow::Result<()> {
    if !matches!(cmd, CkptCommand::Bench(_)) {
        crate::logging::init(None);
    }
    if matches!(
        cmd,
        CkptCommand::Consolidate { .. } | CkptCommand::Export(_)
    ) {
        // An output written whole: a signal removes the unfinished file (data.rs).
        crate::data::remove_unfinished_output_on_signals()?;
    }
    tools::run(cmd)
}

/// Run a `ckpt` subcommand: in a build without HDF5, say what to build instead.
#[cfg(not(feature = "hdf5"))]
pub fn run(_cmd: CkptCommand) -> anyhow::Result<()> {
    Err(crate::features::missing(
        "hdf5",
        "`zero-bench ckpt` (checkpoints are HDF5 files)",
    ))
}
