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

/// Write to standard output for a command that must outlive its reader: `train`
/// ignores SIGPIPE (see main.rs), so where `print!` would panic on a closed pipe
/// (`zero-bench train | head`) or a full disk, the failed write is logged once and the
/// run goes on. Use through [`out!`] and [`outln!`].
pub fn write_out(args: std::fmt::Arguments<'_>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if !WARNED.swap(true, Ordering::Relaxed) {
            log::warn!("standard output cannot be written ({e}); training goes on, its reports in the log and --json only");
        }
    }
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
