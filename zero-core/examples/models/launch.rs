//! What the example binaries share: options, and the launch on N thread ranks
//! (`zero_comm::run_local`), or on MPI when started by mpirun/srun (one process a rank).

use std::process::ExitCode;
use zero_comm::Communicator;
use zero_core::{EngineError, Stage};
use zero_kernels::device::{Device, HostDevice, SimDevice};

/// A training loop to launch (generic over where it runs).
pub trait Example: Sync {
    /// What it trains, for `--help`.
    fn about(&self) -> &'static str;

    /// Train for `steps` at `stage` on `comm` and `dev`; the per-step losses.
    fn train<C: Communicator, D: Device>(
        &self,
        comm: &C,
        dev: &D,
        stage: Stage,
        steps: u64,
    ) -> Result<Vec<f64>, EngineError>;
}

/// `--help`: what the example trains, and every option with its default.
fn help(name: &str, usage: &str, example: &impl Example, default_steps: u64) -> String {
    format!(
        "{name}: train {}, with zero-core at ZeRO stage S on N ranks; rank 0 prints the \
         global loss.\n\n{usage}\n\n\
         \x20 --ranks N   thread ranks in this process, N >= 1 (default 2); under mpirun or \
         srun each process is one rank and N is ignored\n\
         \x20 --stage S   ZeRO stage 0, 1, 2 or 3 (default 3)\n\
         \x20 --steps K   optimizer steps, K >= 1 (default {default_steps}); {}\n\
         \x20 --sim       the simulated device: a test tool that checks every stream \
         hand-over (slower)\n\
         \x20 -h, --help  print this help",
        example.about(),
        super::train::schedule_help(),
    )
}

/// A count option's value: a whole number of at least 1 (0 ranks or 0 steps would train
/// nothing and still exit 0).
fn at_least_one<T: std::str::FromStr<Err = std::num::ParseIntError> + PartialEq + From<u8>>(
    v: &str,
) -> Result<T, String> {
    match v.parse::<T>() {
        Ok(x) if x == T::from(0) => Err("must be at least 1, got 0".to_string()),
        Ok(x) => Ok(x),
        Err(e) => Err(format!("{v:?} is not a whole number ({e})")),
    }
}

/// Parse `--ranks N --stage S --steps K --sim`, run; the exit code is non-zero on any error.
pub fn main(name: &str, example: &impl Example, default_steps: u64) -> ExitCode {
    let usage = format!("usage: {name} [--ranks N] [--stage 0-3] [--steps K] [--sim]");
    let (mut ranks, mut stage, mut steps, mut sim) = (2usize, Stage::Zero3, default_steps, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let parsed = match a.as_str() {
            "--sim" => {
                sim = true;
                Ok(())
            }
            "-h" | "--help" => {
                println!("{}", help(name, &usage, example, default_steps));
                return ExitCode::SUCCESS;
            }
            "--ranks" | "--steps" | "--stage" => match args.next() {
                None => Err("needs a value".to_string()),
                Some(v) if a == "--ranks" => at_least_one(&v).map(|x| ranks = x),
                Some(v) if a == "--steps" => at_least_one(&v).map(|x| steps = x),
                Some(v) => v
                    .parse::<i64>()
                    .map_err(|e| e.to_string())
                    .and_then(|s| Stage::try_from(s).map(|s| stage = s)),
            },
            _ => Err(format!("unknown option ({usage})")),
        };
        if let Err(e) = parsed {
            eprintln!("{name}: {a}: {e}");
            return ExitCode::from(2);
        }
    }
    if under_mpirun() {
        // One rank's error aborts the job (the others may wait for it in a collective);
        // an error every rank returns together ends each rank normally.
        return zero_comm::mpi_main(
            |comm| launch(example, comm, stage, steps, sim).map(drop),
            EngineError::is_agreed_stop,
        );
    }
    println!(
        "{ranks} thread ranks, {stage} on the {} device",
        if sim { "simulated" } else { "host" }
    );
    let outcome = zero_comm::run_local(ranks, Default::default(), |comm| {
        launch(example, &comm, stage, steps, sim)
            .map(drop)
            .map_err(|e| format!("rank {}: {e}", comm.rank()))
    })
    .into_iter()
    .enumerate()
    .try_for_each(|(r, x)| {
        x.map_err(|p| format!("rank {r} panicked: {p:?}"))
            .and_then(|x| x)
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn launch<C: Communicator>(
    example: &impl Example,
    comm: &C,
    stage: Stage,
    steps: u64,
    sim: bool,
) -> Result<Vec<f64>, EngineError> {
    if sim {
        example.train(comm, &SimDevice::new(comm.rank() as u64), stage, steps)
    } else {
        example.train(comm, &HostDevice::new(), stage, steps)
    }
}

/// Launched by mpirun or srun (then every process is one rank of MPI's world).
fn under_mpirun() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}
