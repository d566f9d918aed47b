//! The NCCL unique id: 128 opaque bytes that rank 0 makes (`ncclGetUniqueId`) and every
//! rank passes to `ncclCommInitRank`, so every rank must get the same bytes before NCCL
//! can start (issue 14). Three ways to hand it over, none needing NCCL itself, so all of
//! them are tested here with a stand-in id:
//!
//! - over MPI ([`exchange`]): rank 0 makes it and broadcasts it; a failure on rank 0 is
//!   broadcast too, so no rank waits for an id that will not come;
//! - from an environment variable ([`from_env`], 256 hex digits) that a launcher set;
//! - from a file ([`from_file`], 128 bytes or 256 hex digits) on a shared file system:
//!   rank 0 writes it atomically ([`write_file`]), the others wait for it with a
//!   deadline ([`wait_for_file`]). llm.c hands its id over the same way where Slurm runs
//!   without PMIx, so MPI cannot start.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::communicator::Communicator;

/// Bytes of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES` in nccl.h).
pub const UNIQUE_ID_BYTES: usize = 128;

/// An NCCL unique id.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The first bytes are enough to tell ids apart in a message.
        write!(f, "UniqueId({}...)", &self.to_hex()[..16])
    }
}

/// Why an id could not be had.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    /// The text is not 256 hex digits.
    #[error("{from}: an NCCL unique id is {UNIQUE_ID_BYTES} bytes written as {} hex digits; got {got}", 2 * UNIQUE_ID_BYTES)]
    Malformed {
        /// Where the text came from.
        from: String,
        /// What was wrong with it.
        got: String,
    },
    /// The environment variable is not set.
    #[error("environment variable {0} is not set; the launcher must export the NCCL unique id in it (256 hex digits), or use the MPI or file exchange")]
    NoVariable(String),
    /// The file could not be read or written.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        message: String,
    },
    /// The file did not appear in time.
    #[error("{path}: no NCCL unique id after {waited_s:.0} s; rank 0 writes it there (is the directory shared between the nodes, and did rank 0 start?)")]
    Timeout {
        /// The file.
        path: PathBuf,
        /// Seconds waited.
        waited_s: f64,
    },
    /// Rank 0 could not make the id (its reason on rank 0, a pointer to it elsewhere).
    #[error("rank {rank}: the NCCL unique id: {message}")]
    Make {
        /// Rank reporting.
        rank: usize,
        /// What went wrong.
        message: String,
    },
    /// The broadcast failed.
    #[error(transparent)]
    Comm(#[from] crate::CommError),
}

impl UniqueId {
    /// Lower-case hex, 256 digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// From 256 hex digits (surrounding whitespace ignored); `from` names the source.
    pub fn from_hex(text: &str, from: &str) -> Result<Self, IdError> {
        let t = text.trim();
        let bad = |got: String| IdError::Malformed {
            from: from.to_string(),
            got,
        };
        if t.len() != 2 * UNIQUE_ID_BYTES {
            return Err(bad(format!("{} characters", t.len())));
        }
        let mut id = [0u8; UNIQUE_ID_BYTES];
        for (i, byte) in id.iter_mut().enumerate() {
            let pair = t
                .get(2 * i..2 * i + 2)
                .ok_or_else(|| bad("non-ASCII text".into()))?;
            // Hex digits only (`from_str_radix` alone would take a sign, "+f").
            if !pair.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(format!("'{pair}' at digit {}", 2 * i)));
            }
            *byte = u8::from_str_radix(pair, 16)
                .map_err(|_| bad(format!("'{pair}' at digit {}", 2 * i)))?;
        }
        Ok(UniqueId(id))
    }
}

/// Rank 0 makes the id with `make` and broadcasts it over `comm`; every rank returns it.
/// When `make` fails, every rank returns an error (rank 0's says why).
pub fn exchange<C: Communicator>(
    comm: &C,
    make: impl FnOnce() -> Result<UniqueId, String>,
) -> Result<UniqueId, IdError> {
    // Byte 0: 1 when rank 0 has an id; then the id.
    let mut buf = [0u8; 1 + UNIQUE_ID_BYTES];
    let mut failure = None;
    if comm.rank() == 0 {
        match make() {
            Ok(id) => {
                buf[0] = 1;
                buf[1..].copy_from_slice(&id.0);
            }
            Err(e) => failure = Some(e),
        }
    }
    comm.broadcast(&mut buf[..], 0)?;
    if buf[0] != 1 {
        return Err(IdError::Make {
            rank: comm.world_rank(),
            message: failure
                .unwrap_or_else(|| "rank 0 could not make it (its log says why)".into()),
        });
    }
    let mut id = [0u8; UNIQUE_ID_BYTES];
    id.copy_from_slice(&buf[1..]);
    Ok(UniqueId(id))
}

/// The id from environment variable `var` (256 hex digits).
pub fn from_env(var: &str) -> Result<UniqueId, IdError> {
    let v = std::env::var(var).map_err(|_| IdError::NoVariable(var.to_string()))?;
    UniqueId::from_hex(&v, var)
}

/// The id in `path`: 128 raw bytes, or 256 hex digits.
pub fn from_file(path: &Path) -> Result<UniqueId, IdError> {
    let bytes = std::fs::read(path).map_err(|e| IdError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if bytes.len() == UNIQUE_ID_BYTES {
        let mut id = [0u8; UNIQUE_ID_BYTES];
        id.copy_from_slice(&bytes);
        return Ok(UniqueId(id));
    }
    let text = String::from_utf8_lossy(&bytes);
    UniqueId::from_hex(&text, &path.display().to_string())
}

/// Write `id` to `path` as hex, atomically (a temporary name, then a rename), so a rank
/// waiting for the file never reads half of it.
pub fn write_file(path: &Path, id: &UniqueId) -> Result<(), IdError> {
    let err = |e: std::io::Error| IdError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, id.to_hex() + "\n").map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// Wait up to `timeout` for `path` to hold an id ([`write_file`]'s), polling. The path
/// must be new to this job (name it after the job, e.g. with `SLURM_JOB_ID`): a file left
/// by an earlier job would be read as this one's id.
pub fn wait_for_file(path: &Path, timeout: Duration) -> Result<UniqueId, IdError> {
    let start = Instant::now();
    loop {
        if path.exists() {
            return from_file(path);
        }
        if start.elapsed() >= timeout {
            return Err(IdError::Timeout {
                path: path.to_path_buf(),
                waited_s: start.elapsed().as_secs_f64(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_local;

    fn stand_in(seed: u8) -> UniqueId {
        let mut id = [0u8; UNIQUE_ID_BYTES];
        for (i, b) in id.iter_mut().enumerate() {
            *b = seed.wrapping_mul(31).wrapping_add(i as u8);
        }
        UniqueId(id)
    }

    #[test]
    fn hex_round_trips_and_bad_text_is_named() {
        let id = stand_in(7);
        assert_eq!(UniqueId::from_hex(&id.to_hex(), "t").unwrap(), id);
        assert_eq!(
            UniqueId::from_hex(&format!("  {}\n", id.to_hex()), "t").unwrap(),
            id
        );
        let e = UniqueId::from_hex("abc", "NCCL_ID")
            .unwrap_err()
            .to_string();
        assert!(e.contains("NCCL_ID") && e.contains("3 characters"), "{e}");
        let mut bad = id.to_hex();
        bad.replace_range(10..12, "zz");
        let e = UniqueId::from_hex(&bad, "f").unwrap_err().to_string();
        assert!(e.contains("'zz' at digit 10"), "{e}");
        let mut signed = id.to_hex();
        signed.replace_range(4..6, "+f");
        let e = UniqueId::from_hex(&signed, "f").unwrap_err().to_string();
        assert!(e.contains("'+f' at digit 4"), "{e}");
    }

    #[test]
    fn rank_0_makes_the_id_and_every_thread_rank_gets_it() {
        let out = run_local(3, Default::default(), |comm| {
            exchange(&comm, || {
                assert_eq!(comm.rank(), 0, "only rank 0 makes the id");
                Ok(stand_in(42))
            })
            .map_err(|e| e.to_string())
        });
        for r in out {
            assert_eq!(r.unwrap().unwrap(), stand_in(42));
        }
    }

    #[test]
    fn a_failure_to_make_the_id_reaches_every_rank() {
        let out = run_local(2, Default::default(), |comm| {
            exchange(&comm, || Err("libnccl.so.2 not found".into())).map_err(|e| e.to_string())
        });
        let errs: Vec<String> = out.into_iter().map(|r| r.unwrap().unwrap_err()).collect();
        assert!(errs[0].contains("rank 0") && errs[0].contains("libnccl.so.2 not found"));
        assert!(errs[1].contains("rank 1") && errs[1].contains("rank 0 could not make it"));
    }

    #[test]
    fn the_file_exchange_waits_for_rank_0_and_reads_hex_or_raw() {
        let dir = std::env::temp_dir().join(format!("zero-nccl-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("id");
        let _ = std::fs::remove_file(&path);
        let id = stand_in(3);
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                write_file(&path, &id).unwrap();
            })
        };
        assert_eq!(wait_for_file(&path, Duration::from_secs(10)).unwrap(), id);
        writer.join().unwrap();
        std::fs::write(&path, id.0).unwrap();
        assert_eq!(from_file(&path).unwrap(), id);
        let e = wait_for_file(&dir.join("never"), Duration::from_millis(50)).unwrap_err();
        assert!(e.to_string().contains("is the directory shared"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_environment_exchange_reads_the_launchers_variable() {
        let id = stand_in(9);
        let var = "ZERO_TEST_NCCL_ID_ENV";
        std::env::set_var(var, id.to_hex());
        assert_eq!(from_env(var).unwrap(), id);
        std::env::remove_var(var);
        let e = from_env(var).unwrap_err().to_string();
        assert!(e.contains("is not set"), "{e}");
    }
}
