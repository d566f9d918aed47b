//! Everything a checkpoint save or load can run into, each with the path (and dataset)
//! it concerns, so the user knows which file to look at.

use std::path::PathBuf;

use crate::engine::EngineError;

/// A checkpoint error, naming the file and, where there is one, the dataset.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A filesystem operation failed (missing file, read-only directory, full disk...).
    #[error("{what} '{path}': {cause}")]
    Io {
        /// What was being done ("create directory", "write", "rename"...).
        what: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error (in the message, so not also a `source()`: printed once).
        cause: std::io::Error,
    },
    /// The HDF5 library refused a file or a dataset (truncated, not HDF5, missing dataset).
    /// The message is HDF5's, shortened ([`brief_hdf5`]).
    #[error("HDF5 file '{path}', {dataset}: {}", brief_hdf5(&cause.to_string()))]
    Hdf5 {
        /// The file.
        path: PathBuf,
        /// The dataset, or "(file)" for the file itself.
        dataset: String,
        /// HDF5's message.
        cause: hdf5::Error,
    },
    /// A block of a dataset does not hold what was saved (bit rot, overwrite, truncation).
    #[error("checksum mismatch in '{path}', dataset '{dataset}', elements {start}..{end}: CRC32 {found:#010x}, saved {saved:#010x}")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// The dataset.
        dataset: String,
        /// First element of the bad block.
        start: usize,
        /// End of the bad block.
        end: usize,
        /// CRC32 of what was read.
        found: u32,
        /// CRC32 recorded at save time.
        saved: u32,
    },
    /// A dataset has another length than the metadata says.
    #[error(
        "dataset '{dataset}' in '{path}' has shape {found:?}, the metadata says [{expected}] (1-D)"
    )]
    Shape {
        /// The file.
        path: PathBuf,
        /// The dataset.
        dataset: String,
        /// The dataset's shape.
        found: Vec<usize>,
        /// Elements expected.
        expected: usize,
    },
    /// The metadata is unreadable or of another format/version.
    #[error("checkpoint metadata '{path}': {reason}")]
    Meta {
        /// The metadata file (or `latest` pointer).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint is of another model (or shape) than the engine: what differs.
    #[error("checkpoint '{path}' does not fit this model: {reason}")]
    Incompatible {
        /// The step directory.
        path: PathBuf,
        /// What differs, with both values.
        reason: String,
    },
    /// Some ranks failed: each failing rank's own message, known on every rank (so rank 0
    /// prints what went wrong where).
    #[error("{what} of the checkpoint in '{}' failed on {} rank(s):{}", path.display(), failures.len(), list(failures))]
    Ranks {
        /// "save" or "load".
        what: &'static str,
        /// The directory concerned.
        path: PathBuf,
        /// (rank, its error), in rank order.
        failures: Vec<(usize, String)>,
    },
    /// The ranks of a load read different checkpoints under one path (a stale
    /// node-local copy, a `latest` that names another step on some node): loading them
    /// would mix two states. Found before any state moved: every engine is as it was.
    #[error("load of the checkpoint in '{}': this rank read '{}'; the ranks did not read the same checkpoint (rank 0: step {root_step}; {}), so the model would be a mix of two states, and nothing was loaded. Every rank must read the same files: put the checkpoint on a file system all nodes share, or refresh the node-local copies", path.display(), dir.display(), unlike(*root_step, others))]
    Differs {
        /// The path given to the load.
        path: PathBuf,
        /// The step directory this rank read.
        dir: PathBuf,
        /// The step of rank 0's checkpoint.
        root_step: u64,
        /// (rank, step) of each rank whose `meta.json` differs from rank 0's, in rank
        /// order.
        others: Vec<(usize, u64)>,
    },
    /// A bad argument (keep_last = 0...).
    #[error("{0}")]
    Invalid(String),
    /// An output written whole could not be ([`crate::files::write_whole`]).
    #[error(transparent)]
    Output(#[from] crate::files::OutputError),
    /// The engine refused the state or a collective failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl CheckpointError {
    /// An I/O error on `path`.
    pub(crate) fn io(
        what: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |cause| CheckpointError::Io { what, path, cause }
    }

    /// An HDF5 error on `dataset` of `path`.
    pub(crate) fn h5(
        path: impl Into<PathBuf>,
        dataset: impl Into<String>,
    ) -> impl FnOnce(hdf5::Error) -> Self {
        let (path, dataset) = (path.into(), dataset.into());
        move |cause| CheckpointError::Hdf5 {
            path,
            dataset,
            cause,
        }
    }
}

impl From<zero_comm::CommError> for CheckpointError {
    fn from(e: zero_comm::CommError) -> Self {
        CheckpointError::Engine(EngineError::Comm(e))
    }
}

/// HDF5's message on one line, without its internals: a failed system call's record
/// ("time = ..., filename = ..., file descriptor = ..., errno = 28, error message = 'No
/// space left on device', buf = 0x..., ...") becomes "No space left on device (errno 28)"
/// after the call that failed; other messages pass through with newlines as spaces.
pub fn brief_hdf5(message: &str) -> String {
    let quoted = |key: &str| {
        let at = message.find(key)? + key.len();
        let end = message[at..].find('\'')?;
        Some(&message[at..at + end])
    };
    let key = "errno = ";
    let errno = message.find(key).map(|at| {
        message[at + key.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
    });
    let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    match (quoted("error message = '"), message.find("time = ")) {
        (Some(os), Some(time)) => {
            let call = message[..time].trim_end().trim_end_matches(':');
            let errno = errno.map_or_else(String::new, |e| format!(" (errno {e})"));
            format!("{}: {os}{errno}", flat(call))
        }
        _ => flat(message),
    }
}

/// One indented line per failing rank.
fn list(failures: &[(usize, String)]) -> String {
    failures
        .iter()
        .map(|(r, m)| format!("\n  rank {r}: {m}"))
        .collect()
}

/// "rank 2: step 4, rank 3: step 8 (another meta.json)", at most eight ranks, then how
/// many more.
fn unlike(root_step: u64, others: &[(usize, u64)]) -> String {
    const SHOWN: usize = 8;
    let mut text: Vec<String> = others
        .iter()
        .take(SHOWN)
        .map(|&(r, step)| {
            let same = if step == root_step {
                " (another meta.json)"
            } else {
                ""
            };
            format!("rank {r}: step {step}{same}")
        })
        .collect();
    if others.len() > SHOWN {
        text.push(format!("and {} more rank(s)", others.len() - SHOWN));
    }
    text.join(", ")
}
