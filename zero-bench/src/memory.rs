//! Sizes from the command line checked against this process's memory before anything is
//! allocated, so a benchmark asked for too much says so instead of aborting in the
//! allocator (or panicking on an overflowing size).

use anyhow::{bail, Result};
use zero_core::ledger::human_bytes;

/// `what` needs `bytes` of host memory (`None`: the size overflowed): an error naming
/// both when it is more than this process has available (`/proc/meminfo` and the
/// cgroup's limit; no check where neither can be read).
pub fn need(what: &str, bytes: Option<u64>) -> Result<()> {
    let Some(bytes) = bytes else {
        bail!("{what}: the sizes given overflow a 64-bit byte count; give smaller sizes");
    };
    if let Some((avail, source)) = crate::train::budget::host_available() {
        if bytes > avail {
            bail!(
                "{what} needs {} of memory, and this process has {} ({source}); give smaller sizes",
                human_bytes(bytes as f64),
                human_bytes(avail as f64)
            );
        }
    }
    Ok(())
}

/// The product of `factors`, `None` on overflow.
pub fn product(factors: &[u64]) -> Option<u64> {
    factors.iter().try_fold(1u64, |p, &f| p.checked_mul(f))
}
