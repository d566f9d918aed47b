//! `zero-bench micro ...`: micro-benchmarks, each measured against a reference in the same
//! run (raw MPI, a memory copy, SGEMM), never against a hard-coded number.

pub mod adam;
pub mod comm;
pub mod model;

use clap::Subcommand;

/// The micro-benchmarks.
#[derive(Subcommand, Debug)]
pub enum MicroCommand {
    /// Collectives (ours vs the raw MPI call on the same buffers); run under mpirun/srun.
    Comm(comm::CommArgs),
    /// Fused AdamW step vs an Adam-shaped copy and an unfused step.
    Adam(adam::AdamArgs),
    /// GPT forward+backward FLOP/s vs SGEMM on the same threads.
    Model(model::ModelArgs),
}

/// Run one micro-benchmark.
pub fn run(cmd: MicroCommand) -> anyhow::Result<()> {
    match cmd {
        MicroCommand::Comm(a) => comm::run(&a),
        MicroCommand::Adam(a) => adam::run(&a),
        MicroCommand::Model(a) => model::run(&a),
    }
}
