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

impl CommConfig {
    /// Options from the environment: `ZERO_COMM_TIMEOUT` (seconds, > 0),
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
                CommError::Init(format!(
                    "ZERO_COMM_PROGRESS_US='{v}' is not a whole number of microseconds (0: no progress thread)"
                ))
            })?;
            c.progress_poll = (us > 0).then(|| Duration::from_micros(us));
        }
        if let Ok(v) = std::env::var("ZERO_COMM_TIMEOUT") {
            let secs: f64 = v.trim().parse().map_err(|_| {
                CommError::Init(format!(
                    "ZERO_COMM_TIMEOUT='{v}' is not a number of seconds"
                ))
            })?;
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(CommError::Init(format!(
                    "ZERO_COMM_TIMEOUT='{v}' must be a positive number of seconds"
                )));
            }
            c.timeout = Some(Duration::from_secs_f64(secs));
        }
        if let Ok(v) = std::env::var("ZERO_COMM_CHECK") {
            c.check = match v.trim() {
                "1" | "true" | "yes" => true,
                "0" | "false" | "no" | "" => false,
                _ => {
                    return Err(CommError::Init(format!(
                        "ZERO_COMM_CHECK='{v}' must be 1 or 0"
                    )))
                }
            };
        }
        if let Ok(v) = std::env::var("ZERO_COMM_RING") {
            c.mpi_reduce_scatter = match v.trim() {
                "1" | "true" | "yes" | "" => false,
                "0" | "false" | "no" => true,
                _ => {
                    return Err(CommError::Init(format!(
                        "ZERO_COMM_RING='{v}' must be 1 (reduce-scatters as a ring, the default) or 0 (MPI's own)"
                    )))
                }
            };
        }
        if let Ok(v) = std::env::var("ZERO_COMM_HALF_SUM") {
            c.half_sum = v
                .trim()
                .parse()
                .map_err(|e| CommError::Init(format!("ZERO_COMM_HALF_SUM: {e}")))?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
