//! `zero-bench micro ...`: micro-benchmarks, each measured against a reference in the same
//! run (raw MPI, a memory copy, SGEMM), never against a hard-coded number.

pub mod adam;
#[cfg(feature = "mpi")]
pub mod comm;
mod comm_args;
#[cfg(feature = "mpi")]
mod comm_device;
pub mod gemm;
pub mod model;
pub(crate) mod outputs;
#[cfg(feature = "mpi")]
pub mod overlap;
pub mod quant;

pub use comm_args::CommArgs;

/// The median of measured times or rates: robust to the outliers of a shared machine;
/// of an even count the mean of the two middle values (the upper one alone would be the
/// slower of two rounds); NaN for none.
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let h = v.len() / 2;
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[h],
        _ => 0.5 * (v[h - 1] + v[h]),
    }
}

use clap::Subcommand;

/// The micro-benchmarks.
#[derive(Subcommand, Debug)]
pub enum MicroCommand {
    /// Collectives (ours vs the raw MPI call on the same buffers); run under mpirun/srun.
    Comm(CommArgs),
    /// Fused AdamW step vs an Adam-shaped copy and an unfused step.
    Adam(adam::AdamArgs),
    /// Model (GPT-2 or Llama) forward+backward FLOP/s vs SGEMM on the same threads.
    Model(model::ModelArgs),
    /// Host-staged communication hidden behind a simulated backward: serial, non-blocking
    /// without progress, and with a progress thread; run under mpirun/srun.
    #[cfg(feature = "mpi")]
    Overlap(overlap::OverlapArgs),
    /// Block-wise int8 and int4 quantize / dequantize (quantized communication) vs a copy.
    Quant(quant::QuantArgs),
    /// bf16 GEMM micro-kernels (AMX, AVX-512 BF16, AVX2, portable) vs f32 SGEMM on the
    /// model's shapes.
    Gemm(gemm::GemmArgs),
}

/// A line in the log (stderr) at most every [`Progress::EVERY`] of a long run, so that it
/// does not look hung; a short run prints none. Needs `crate::logging::init`.
pub(crate) struct Progress {
    what: &'static str,
    last: std::time::Instant,
}

impl Progress {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(10);

    pub(crate) fn new(what: &'static str) -> Self {
        Progress {
            what,
            last: std::time::Instant::now(),
        }
    }

    /// `done` of `of` units (rounds, steps) are done.
    pub(crate) fn done(&mut self, done: usize, of: usize, unit: &str) {
        if self.last.elapsed() >= Self::EVERY {
            log::info!("{}: {done} of {of} {unit} done", self.what);
            self.last = std::time::Instant::now();
        }
    }
}

/// Run one micro-benchmark.
pub fn run(cmd: MicroCommand) -> anyhow::Result<()> {
    match cmd {
        MicroCommand::Comm(a) => comm::run(&a),
        MicroCommand::Adam(a) => adam::run(&a),
        MicroCommand::Model(a) => model::run(&a),
        #[cfg(feature = "mpi")]
        MicroCommand::Overlap(a) => overlap::run(&a),
        MicroCommand::Quant(a) => quant::run(&a),
        MicroCommand::Gemm(a) => gemm::run(&a),
    }
}

/// `micro comm` in a build without MPI: there is no raw MPI call to compare with.
#[cfg(not(feature = "mpi"))]
mod comm {
    pub fn run(_args: &super::CommArgs) -> anyhow::Result<()> {
        Err(crate::features::missing(
            "mpi",
            "`micro comm` (ours vs the raw MPI call, under mpirun/srun)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::train::thread_count;

    /// The micro-benchmarks' `--threads` (train's count, without `auto`).
    #[test]
    fn threads_are_bounded_as_train_bounds_them() {
        assert_eq!(thread_count("1"), Ok(1));
        assert_eq!(thread_count(" 8 "), Ok(8));
        assert_eq!(thread_count("1024"), Ok(1024));
        for bad in ["0", "1025", "5000", "auto", "-1", "two", ""] {
            assert!(thread_count(bad).is_err(), "{bad}");
        }
        assert!(thread_count("0").unwrap_err().contains("at least 1"));
        assert!(thread_count("5000").unwrap_err().contains("at most 1024"));
    }

    /// Of an even count the mean of the middle two, not the upper one (of two rounds,
    /// the slower); NaN for none.
    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(super::median(&[3.0, 1.0]), 2.0);
        assert_eq!(super::median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(super::median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(super::median(&[7.0]), 7.0);
        assert!(super::median(&[]).is_nan());
    }
}
