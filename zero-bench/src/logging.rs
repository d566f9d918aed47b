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
