//! `zero-bench`: the zero-rs command line.
//!
//! Launched directly for single-process work (`micro adam`, `micro model`) and under
//! `mpirun -n N` / `srun` for anything that communicates. Errors reach the user as one
//! `error: ...` message with context, never as a panic backtrace.

mod logging;
mod micro;

use clap::{Parser, Subcommand};

/// ZeRO (Zero Redundancy Optimizer) in Rust: training, benchmarks and tools for MPI/Slurm clusters.
#[derive(Parser, Debug)]
#[command(name = "zero-bench", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Micro-benchmarks of one layer: communication, optimizer kernels, model compute.
    #[command(subcommand)]
    Micro(micro::MicroCommand),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Micro(cmd) => micro::run(cmd),
    };
    if let Err(err) = result {
        // `{:#}` prints the whole context chain on one line: what failed and why.
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
