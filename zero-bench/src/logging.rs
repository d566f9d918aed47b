//! Rank-tagged logging: every line says which rank wrote it.
//!
//! `RUST_LOG` picks the level (default `info`). Call [`init`] once the rank is known
//! (after MPI is initialised); single-process commands pass `None`.

use std::io::Write;

/// Install the global logger, tagging lines with `[rank r/n]` when running under MPI.
pub fn init(rank: Option<(usize, usize)>) {
    let tag = match rank {
        Some((r, n)) => format!("[rank {r}/{n}]"),
        None => String::new(),
    };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format(move |buf, record| {
            writeln!(
                buf,
                "{} {:<5} {} {}",
                buf.timestamp_seconds(),
                record.level(),
                tag,
                record.args()
            )
        })
        .try_init();
}

/// The first failed write to standard output (`> /dev/full`, a full disk, a closed pipe
/// where SIGPIPE is ignored).
static STDOUT_ERROR: std::sync::OnceLock<(std::io::ErrorKind, String)> = std::sync::OnceLock::new();

/// Write to standard output without panicking where `print!` would (a full disk, or a
/// closed pipe where SIGPIPE is ignored, as `train` does, see main.rs): the first failure
/// is logged and kept ([`stdout_error`]), and the command goes on; main.rs then fails
/// every command whose report is its product, and a training run ends as its training
/// does (its reports are in the log, the metrics and --json). Use through [`out!`] and
/// [`outln!`].
pub fn write_out(args: std::fmt::Arguments<'_>) {
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        note_stdout_error(&e);
    }
}

/// Flush standard output (at the end of a command), keeping a failure as [`write_out`].
pub fn flush_out() {
    if let Err(e) = std::io::stdout().lock().flush() {
        note_stdout_error(&e);
    }
}

/// Whether a failed write to standard output fails the command at its end (main.rs), so
/// that saying "going on" when it happens would mislead.
static STDOUT_FAILURE_FAILS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Make a failed write to standard output the command's failure (main.rs reports it at
/// the end), rather than a warning.
pub fn stdout_failure_fails_the_command() {
    STDOUT_FAILURE_FAILS.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn note_stdout_error(e: &std::io::Error) {
    let quiet = STDOUT_FAILURE_FAILS.load(std::sync::atomic::Ordering::Relaxed);
    if STDOUT_ERROR.set((e.kind(), e.to_string())).is_ok() && !quiet {
        log::warn!("standard output cannot be written ({e}); training goes on, its reports in the log (and --json where given) only");
    }
}

/// Why standard output could not be written, if a write failed: the error's kind and
/// its text.
pub fn stdout_error() -> Option<(std::io::ErrorKind, &'static str)> {
    STDOUT_ERROR
        .get()
        .map(|(kind, text)| (*kind, text.as_str()))
}

/// `print!` that survives a closed standard output ([`write_out`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::logging::write_out(format_args!($($arg)*))
    };
}

/// `println!` that survives a closed standard output ([`write_out`]).
macro_rules! outln {
    () => {
        $crate::logging::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::logging::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {out, outln};

/// An error with its causes on one line, `what: why: why...`, like `{:#}`, but a cause
/// whose text the line already holds is left out: library errors often put their
/// source's message in their own (`"device: {0}"`), which `{:#}` would print twice.
pub fn chain(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("allocating the activations: {0}")]
        struct Outer(#[source] std::io::Error);
        let inner = std::io::Error::other("cannot allocate 9 TB");
        let e = anyhow::Error::new(Outer(inner)).context("building the model");
        assert_eq!(
            chain(&e),
            "building the model: allocating the activations: cannot allocate 9 TB"
        );
        let plain = anyhow::anyhow!("disk full").context("writing m.jsonl");
        assert_eq!(chain(&plain), "writing m.jsonl: disk full");
    }
}
