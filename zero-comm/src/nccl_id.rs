//! The NCCL unique id: 128 opaque bytes that rank 0 makes (`ncclGetUniqueId`) and every
//! rank passes to `ncclCommInitRank`, so every rank must get the same bytes before NCCL
//! can start (issue 14). Three ways to hand it over, none needing NCCL itself, so all of
//! them are tested here with a stand-in id:
//!
//! - over MPI ([`exchange`]): rank 0 makes it and broadcasts it; a failure on rank 0 is
//!   broadcast too, so no rank waits for an id that will not come. [`agree_and_exchange`]
//!   first agrees that every rank prepared its GPU (`NcclComm::over`, feature `nccl`), so a
//!   rank that failed there stops every rank before the blocking `ncclCommInitRank`;
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
    /// A rank could not prepare for NCCL (its GPU, a stream, memory) or rank 0 could not
    /// make the id ([`agree_and_exchange`]): no rank went on to `ncclCommInitRank`.
    #[error("rank {rank}: {}", set_up_failed(.comm, .failures))]
    SetUp {
        /// Rank reporting (in the world).
        rank: usize,
        /// The bootstrap communicator's name.
        comm: String,
        /// (rank in `comm`, its reason) of every rank that failed.
        failures: Vec<(usize, String)>,
    },
    /// The broadcast failed.
    #[error(transparent)]
    Comm(#[from] crate::CommError),
}

/// What [`IdError::SetUp`] says, without the reporting rank.
pub fn set_up_failed(comm: &str, failures: &[(usize, String)]) -> String {
    let each: Vec<String> = failures
        .iter()
        .map(|(r, why)| format!("rank {r}: {why}"))
        .collect();
    format!(
        "NCCL set-up on '{comm}' failed before any rank entered ncclCommInitRank, so none waits there: {}; fix that rank's GPU or NCCL and start again",
        each.join("; ")
    )
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

/// Agree that every rank is ready for NCCL, then hand rank 0's id to all: each rank
/// passes `ready` (`Err(why)`: its own preparation failed, e.g. its GPU or a stream), rank
/// 0 makes the id with `make` when it is ready itself, and every rank learns every
/// failure (rank 0's `make` included) before any of them returns. So either every rank
/// gets the id and goes on to the blocking `ncclCommInitRank`, or every rank returns
/// [`IdError::SetUp`] naming the failed ranks and why: no rank waits in NCCL for one
/// that already gave up. Collective over `comm`: one all-reduce (an all-gather more on a
/// failure), then one broadcast.
pub fn agree_and_exchange<C: Communicator>(
    comm: &C,
    ready: Result<(), String>,
    make: impl FnOnce() -> Result<UniqueId, String>,
) -> Result<UniqueId, IdError> {
    let mine = match ready {
        Err(why) => Err(why),
        Ok(()) if comm.rank() == 0 => make().map(Some),
        Ok(()) => Ok(None),
    };
    let failures = crate::agree::gather_failures(comm, mine.as_ref().err().map(String::as_str))?;
    if !failures.is_empty() {
        return Err(IdError::SetUp {
            rank: comm.world_rank(),
            comm: comm.name().to_string(),
            failures,
        });
    }
    let id = mine.ok().flatten();
    // Rank 0 has an id: it passed no failure.
    exchange(comm, || id.ok_or_else(|| "no id was made".to_string()))
}

/// The id from environment variable `var` (256 hex digits).
pub fn from_env(var: &str) -> Result<UniqueId, IdError> {
    from_variable(var, |name| std::env::var(name).ok())
}

/// [`from_env`] reading the variable through `lookup` (the tests pass their own: setting
/// a variable in the multi-threaded test process would race C code reading the
/// environment).
fn from_variable(
    var: &str,
    lookup: impl FnOnce(&str) -> Option<String>,
) -> Result<UniqueId, IdError> {
    let v = lookup(var).ok_or_else(|| IdError::NoVariable(var.to_string()))?;
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
    fn a_rank_that_cannot_prepare_stops_every_rank_before_nccl() {
        // Rank 2's GPU fails: every rank learns it (and why) from the agreement, so none
        // goes on to ncclCommInitRank to wait for rank 2 there.
        let out = run_local(4, Default::default(), |comm| {
            let ready = match comm.rank() {
                2 => Err("GPU 2: CUDA_ERROR_OUT_OF_MEMORY".to_string()),
                _ => Ok(()),
            };
            agree_and_exchange(&comm, ready, || Ok(stand_in(5))).map_err(|e| e.to_string())
        });
        for (r, got) in out.into_iter().enumerate() {
            let e = got.unwrap().unwrap_err();
            assert!(e.starts_with(&format!("rank {r}: ")), "{e}");
            assert!(
                e.contains("rank 2: GPU 2: CUDA_ERROR_OUT_OF_MEMORY"),
                "names the rank and why: {e}"
            );
            assert!(
                e.contains("before any rank entered ncclCommInitRank"),
                "{e}"
            );
        }
        // Rank 0 cannot make the id: the same, everywhere.
        let out = run_local(2, Default::default(), |comm| {
            agree_and_exchange(&comm, Ok(()), || Err("libnccl.so not found".into()))
                .map_err(|e| e.to_string())
        });
        for got in out {
            let e = got.unwrap().unwrap_err();
            assert!(e.contains("rank 0: libnccl.so not found"), "{e}");
        }
        // Everyone ready: everyone gets rank 0's id, made once, by rank 0.
        let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let out = run_local(3, Default::default(), move |comm| {
            let (made, rank) = (std::sync::Arc::clone(&made), comm.rank());
            agree_and_exchange(&comm, Ok(()), move || {
                assert_eq!(made.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                assert_eq!(rank, 0, "only rank 0 makes the id");
                Ok(stand_in(8))
            })
            .map_err(|e| e.to_string())
        });
        for got in out {
            assert_eq!(got.unwrap().unwrap(), stand_in(8));
        }
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
        let var = "NCCL_ID";
        let set = |name: &str| (name == var).then(|| id.to_hex());
        assert_eq!(from_variable(var, set).unwrap(), id);
        let e = from_variable(var, |_| None).unwrap_err().to_string();
        assert!(e.contains("NCCL_ID is not set"), "{e}");
        let e = from_variable(var, |_| Some("12zz".into())).unwrap_err();
        assert!(e.to_string().contains("NCCL_ID"), "{e}");
    }
}
