//! Run-time options of the communicator: watchdog timeout, consistency check, how half
//! sums are computed, the progress thread, the ring reduce-scatter. Set in code or from
//! the environment (`ZERO_COMM_TIMEOUT` seconds, `ZERO_COMM_CHECK=1`,
//! `ZERO_COMM_HALF_SUM=op|upcast`, `ZERO_COMM_PROGRESS_US`, `ZERO_COMM_RING=0|1`), the
//! code's value winning. Every rank must be given the same values.

use crate::error::{CommError, Result};
use std::time::Duration;

/// How bf16/f16 sums are computed (MPI has no 16-bit float type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HalfSum {
    /// A user-defined MPI op on the 16-bit data: each pairwise step converts both operands
    /// to f32, adds, rounds back. Half the wire bytes; N-1 roundings along a ring.
    #[default]
    Op,
    /// Convert the buffer to f32, sum in f32 with MPI's built-in op, round back once.
    /// Twice the wire bytes and a staging copy; one rounding.
    Upcast,
}

impl std::str::FromStr for HalfSum {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "op" => Ok(HalfSum::Op),
            "upcast" => Ok(HalfSum::Upcast),
            _ => Err(format!(
                "unknown half-sum mode '{s}'; expected op or upcast"
            )),
        }
    }
}

/// Options of every communicator made by one [`crate::init_with`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommConfig {
    /// Abort the job when a collective has not finished after this long (None: no
    /// watchdog). Each rank prints the collective, its sequence number, count and dtype.
    pub timeout: Option<Duration>,
    /// Before every collective, compare (sequence number, collective, count, dtype, root)
    /// across ranks and fail with both ranks named when they differ. Costs one small
    /// all-gather per collective: a debugging aid.
    pub check: bool,
    /// How half-precision sums are computed (changeable per communicator later).
    pub half_sum: HalfSum,
    /// While non-blocking collectives are in flight, a thread calls into MPI this often
    /// so that Open MPI moves them forward while the rank computes
    /// (`mpi/progress.rs`); `None`: no such thread (they move only when tested).
    pub progress_poll: Option<Duration>,
    /// Run non-blocking reduce-scatters through MPI's own `MPI_Ireduce_scatter_block`
    /// rather than the ring of `mpi/ring.rs` (Open MPI's sums every element on rank 0;
    /// `ZERO_COMM_RING=0`).
    pub mpi_reduce_scatter: bool,
}

/// The progress thread's default interval (`ZERO_COMM_PROGRESS_US`).
pub const DEFAULT_PROGRESS_POLL: Duration = Duration::from_micros(50);

/// The watchdog's timeout when `ZERO_COMM_TIMEOUT` is not set: a hung rank must not
/// hold a job forever, and no collective of a healthy job waits this long (a rank's
/// longest solo work, writing a model file while the others wait, takes minutes).
/// PyTorch's NCCL default is the same 30 minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// The longest `ZERO_COMM_PROGRESS_US` taken.
pub const MAX_PROGRESS_POLL_US: u64 = 1_000_000;

/// A `ZERO_COMM_*` value that is not allowed. It is read before MPI is up, on every rank
/// alike, and one node with a bad environment among hundreds must be findable: the error
/// names this process by its launcher's rank and its host.
fn bad_setting(detail: String) -> CommError {
    CommError::Config {
        process: crate::exit::this_process(),
        detail,
    }
}

/// `ZERO_COMM_TIMEOUT`: seconds (> 0, at most a year), or `0`/`off` for no watchdog.
fn parse_timeout(v: &str) -> Result<Option<Duration>> {
    let t = v.trim();
    if t == "off" || t == "0" {
        return Ok(None);
    }
    let bad = || {
        bad_setting(format!(
            "ZERO_COMM_TIMEOUT='{v}' must be a number of seconds from 1 up to a year (31536000), or 0/off for no watchdog (a shorter one would fire on ordinary collectives)"
        ))
    };
    let secs: f64 = t.parse().map_err(|_| bad())?;
    if secs == 0.0 {
        return Ok(None);
    }
    if !(1.0..=31_536_000.0).contains(&secs) {
        return Err(bad());
    }
    Duration::try_from_secs_f64(secs)
        .map(Some)
        .map_err(|_| bad())
}

impl CommConfig {
    /// Options from the environment: `ZERO_COMM_TIMEOUT` (seconds, > 0; `0`/`off`: no
    /// watchdog; unset: [`DEFAULT_TIMEOUT`]),
    /// `ZERO_COMM_CHECK` (`1`/`0`), `ZERO_COMM_HALF_SUM` (`op`/`upcast`),
    /// `ZERO_COMM_PROGRESS_US` (the progress thread's interval in microseconds, default
    /// 50; `0` runs without the thread), `ZERO_COMM_RING` (`1`/`0`: non-blocking
    /// reduce-scatters as a ring of messages, the default, or MPI's own).
    pub fn from_env() -> Result<Self> {
        let mut c = CommConfig {
            progress_poll: Some(DEFAULT_PROGRESS_POLL),
            ..CommConfig::default()
        };
        if let Ok(v) = std::env::var("ZERO_COMM_PROGRESS_US") {
            let us: u64 = v.trim().parse().map_err(|_| {
                bad_setting(format!(
                    "ZERO_COMM_PROGRESS_US='{v}' is not a whole number of microseconds (0: no progress thread)"
                ))
            })?;
            if us > MAX_PROGRESS_POLL_US {
                return Err(bad_setting(format!(
                    "ZERO_COMM_PROGRESS_US={us}: at most {MAX_PROGRESS_POLL_US} (1 s; the thread only nudges MPI, and it is waited for at the end), default {}",
                    DEFAULT_PROGRESS_POLL.as_micros()
                )));
            }
            c.progress_poll = (us > 0).then(|| Duration::from_micros(us));
        }
        c.timeout = match std::env::var("ZERO_COMM_TIMEOUT") {
            Ok(v) => parse_timeout(&v)?,
            Err(_) => Some(DEFAULT_TIMEOUT),
        };
        if let Ok(v) = std::env::var("ZERO_COMM_CHECK") {
            c.check = match v.trim() {
                "1" | "true" | "yes" => true,
                "0" | "false" | "no" | "" => false,
                _ => return Err(bad_setting(format!("ZERO_COMM_CHECK='{v}' must be 1 or 0"))),
            };
        }
        if let Ok(v) = std::env::var("ZERO_COMM_RING") {
            c.mpi_reduce_scatter = match v.trim() {
                "1" | "true" | "yes" | "" => false,
                "0" | "false" | "no" => true,
                _ => {
                    return Err(bad_setting(format!(
                        "ZERO_COMM_RING='{v}' must be 1 (reduce-scatters as a ring, the default) or 0 (MPI's own)"
                    )))
                }
            };
        }
        if let Ok(v) = std::env::var("ZERO_COMM_HALF_SUM") {
            c.half_sum = v
                .trim()
                .parse()
                .map_err(|e| bad_setting(format!("ZERO_COMM_HALF_SUM: {e}")))?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_or_say_what_is_allowed() {
        assert_eq!(
            parse_timeout(" 2.5 ").unwrap(),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(parse_timeout("off").unwrap(), None);
        assert_eq!(parse_timeout("0").unwrap(), None);
        assert_eq!(parse_timeout("0.0").unwrap(), None);
        for bad in ["-1", "1e20", "inf", "NaN", "soon", "", "0.000001", "0.5"] {
            let e = parse_timeout(bad).unwrap_err().to_string();
            assert!(
                e.contains("ZERO_COMM_TIMEOUT") && e.contains("0/off"),
                "{bad}: {e}"
            );
            // Which node has the bad value, and no "MPI initialisation failed": this is
            // no failure of MPI.
            assert!(e.contains(" on host "), "{e}");
            assert!(!e.contains("initialisation"), "{e}");
        }
    }

    #[test]
    fn half_sum_names() {
        assert_eq!("op".parse::<HalfSum>(), Ok(HalfSum::Op));
        assert_eq!("upcast".parse::<HalfSum>(), Ok(HalfSum::Upcast));
        assert!("fast"
            .parse::<HalfSum>()
            .unwrap_err()
            .contains("expected op or upcast"));
    }
}
