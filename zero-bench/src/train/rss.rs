//! Peak resident memory of this process (Linux): `VmHWM` of /proc/self/status, reset to
//! the current RSS by writing "5" to /proc/self/clear_refs (proc(5)), so each stage of a
//! `--stages` run reports its own peak. Elsewhere both are unavailable (None / no-op).

/// Peak resident set size in bytes since the start or the last [`reset_peak`].
pub fn peak_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    // "VmHWM:     123456 kB"
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Reset the peak to the current RSS; false when the kernel does not allow it.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_grows_with_a_touched_allocation() {
        let Some(before) = peak_bytes() else {
            return; // not Linux: nothing to measure
        };
        let big = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = peak_bytes().unwrap_or(0);
        assert!(after >= before, "{after} < {before}");
        assert!(
            after >= (64 << 20),
            "peak {after} below a touched 64 MiB buffer"
        );
        drop(big);
    }
}
