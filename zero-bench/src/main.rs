//! `zero-bench`: the zero-rs command line.
//!
//! Launched directly for single-process work (`micro adam`, `micro model`) and under
//! `mpirun -n N` / `srun` for anything that communicates. Errors reach the user as one
//! `error: ...` message with context, never as a panic backtrace.

mod ckpt;
mod config;
mod data;
mod device;
#[cfg(not(all(feature = "mpi", feature = "hdf5")))]
mod features;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc_compat;
mod gpu_check;
mod logging;
mod memory;
mod micro;
mod outfile;
mod plan;
mod sweep;
mod train;
mod tune;
mod world;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// Checkpoints: inspect, consolidate, export, benchmark.
    #[command(subcommand)]
    Ckpt(ckpt::CkptCommand),
    /// Token data: tokenise text, write the built-in corpus, inspect a token file.
    #[command(subcommand)]
    Data(data::DataCommand),
    /// Size a job without allocating: memory per GPU by stage, fit, communication per step.
    Plan(plan::PlanArgs),
    /// Train a GPT-2 or Llama model with ZeRO stage 0-3 under mpirun/srun (or plan it:
    /// --dry-run).
    Train(Box<train::TrainArgs>),
    /// Scaling sweeps over N, stage, model, precision, accumulation: table (CSV, JSON) and plots.
    #[command(subcommand)]
    Sweep(sweep::SweepCommand),
    /// Choose stage, micro-batch, buckets and prefetch for a world size, a global batch
    /// and a memory budget: predicted, then the best measured under the real launcher.
    Tune(tune::TuneArgs),
    /// The GPU check: `prepare` the CPU references here, `run` them on a GPU machine
    /// (`run --device sim`: the dry run without a GPU). See scripts/gpu-check.sh.
    #[command(subcommand)]
    GpuCheck(gpu_check::GpuCheckCommand),
}

/// Commands that read files and print, with no MPI and no training.
fn only_prints(command: &Command) -> bool {
    match command {
        Command::Plan(_) | Command::Data(_) => true,
        Command::Ckpt(c) => !matches!(c, ckpt::CkptCommand::Bench(_)),
        // A dry run plans, allocates nothing and trains nothing.
        Command::Train(args) => args.dry_run,
        _ => false,
    }
}

/// Every option of every command that takes a value takes a negative number too, so
/// that `--threads -2` reaches the option's own check (`'-2' is not a thread count`)
/// and `--steps -1` the parse of the number ([`explain_whole_numbers`]), instead of
/// `unexpected argument '-1'`. (Not on/off flags: clap refuses the
/// setting on an argument that takes no value.)
fn negative_values(command: clap::Command) -> clap::Command {
    command
        .mut_args(|a| {
            if a.get_action().takes_values() {
                a.allow_negative_numbers(true)
            } else {
                a
            }
        })
        .mut_subcommands(negative_values)
}

/// clap's parse of a whole-number option (`--steps`, `--rounds`, ...) says only "invalid
/// digit found in string" for `--steps -1` or `--steps ten`; this error says what was
/// wrong with the value and what to give. Other errors pass unchanged.
fn explain_whole_numbers(err: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use std::num::{IntErrorKind, ParseIntError};
    let cause = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<ParseIntError>());
    let (Some(cause), Some(ContextValue::String(arg)), Some(ContextValue::String(value))) = (
        cause,
        err.get(ContextKind::InvalidArg),
        err.get(ContextKind::InvalidValue),
    ) else {
        return err;
    };
    let why = match cause.kind() {
        IntErrorKind::PosOverflow => "it is too large",
        IntErrorKind::Empty => "it is empty",
        _ if value.trim_start().strip_prefix('-').is_some_and(|digits| {
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        }) =>
        {
            "it is negative"
        }
        _ => "it is not a whole number",
    };
    // Raw: formatted with the top command, clap would print its usage, not the option's.
    clap::Error::raw(
        ErrorKind::ValueValidation,
        format!(
            "invalid value '{value}' for '{arg}': {why}; give a whole number in digits, such as 8\n\n\
             For more information, try '--help'.\n"
        ),
    )
}

fn main() {
    let cli = negative_values(Cli::command())
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
        .unwrap_or_else(|e| explain_whole_numbers(e).exit());
    if only_prints(&cli.command) {
        // Rust ignores SIGPIPE, so printing into a closed pipe (`zero-bench plan | head`)
        // would panic; end quietly instead, as other command-line tools do. Not for
        // what trains or communicates: a metrics pipe whose reader left must not end
        // a run (a failed metrics write is logged, see train/metrics.rs), and MPI's
        // own sockets expect SIGPIPE ignored.
        // SAFETY: signal(2) with the default disposition, before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // A real training run's product is on disk (checkpoints, metrics, --json, the model);
    // every other command's is (also) what it prints.
    let prints_its_product = !matches!(&cli.command, Command::Train(args) if !args.dry_run);
    if prints_its_product {
        logging::stdout_failure_fails_the_command();
    }
    let result = match cli.command {
        Command::Micro(cmd) => micro::run(cmd),
        Command::Ckpt(cmd) => ckpt::run(cmd),
        Command::Data(cmd) => data::run(cmd),
        Command::Plan(args) => plan::run(&args),
        Command::Train(args) => train::run(*args),
        Command::Sweep(cmd) => sweep::run(cmd),
        Command::Tune(args) => tune::run(&args),
        Command::GpuCheck(cmd) => gpu_check::run(cmd),
    };
    logging::flush_out();
    let result = result.and_then(|()| match logging::stdout_error() {
        // The reader left (`| head`), as it meant to: end as a shell reports a command
        // that SIGPIPE ended, without a word (the commands that keep SIGPIPE die of it).
        Some((std::io::ErrorKind::BrokenPipe, _)) if prints_its_product => {
            std::process::exit(128 + libc::SIGPIPE)
        }
        Some((_, why)) if prints_its_product => Err(anyhow::anyhow!(
            "writing standard output: {why}: the report is incomplete; write it where there is room"
        )),
        _ => Ok(()),
    });
    if let Err(err) = result {
        // The whole context chain on one line: what failed and why.
        eprintln!("error: {}", logging::chain(&err));
        // Stopped by a signal passed on to its job (sweep, tune): 128 + the signal's
        // number, as a shell reports a command the signal ended.
        let code = err
            .chain()
            .find_map(|c| c.downcast_ref::<sweep::launch::Interrupted>())
            .map_or(1, |i| i.exit_code());
        std::process::exit(code);
    }
}

#[cfg(test)]
mod tests {
    /// clap's own consistency checks (debug builds run them at parse time) pass on the
    /// command line as `main` builds it.
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        super::negative_values(super::Cli::command()).debug_assert();
    }
}
