//! Host buffers of [`POPULATE_MIN_BYTES`] or more are backed by memory when allocated
//! (`MADV_POPULATE_WRITE`, Linux 5.14 on), not page by page as they are first touched.
//!
//! Why: a lazily zeroed page that is read before it is written (AdamW's moments are, in
//! the first step) is mapped to the kernel's shared zero page, then copied on the first
//! write, and that second fault flushes the page from the TLB of every CPU running one of
//! the process's threads, an interrupt to each (a VM exit on a virtual machine). GPT-2
//! 124M's first bf16 step on 2 threads of a Zen 4 spent 3.7 CPU-seconds in those faults
//! (4.7-5.2 s, against 2.7 s for the next step; populated: 2.6-2.7 s, as the next). Pages
//! first written fault once each either way; populated, they come in one call.
//!
//! Not where the process's CPUs span several NUMA nodes: there each page is best placed
//! by the thread that first writes it (the kernels split their work the same way every
//! step), and populating splits a buffer its own way, placing pages away from the
//! threads that will use them.
//!
//! A host short of memory usually runs its out-of-memory killer during the call, so a
//! rank that cannot hold its buffers ends while it allocates rather than partway through
//! a step; a kernel that refuses instead (`ENOMEM`) is warned about, once per process.

use crate::par::Workers;

/// Buffers of at least this many bytes are populated.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) const POPULATE_MIN_BYTES: usize = 1 << 20;

/// What [`populate`] did with a buffer.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Populated {
    /// Its whole pages are backed by memory now.
    Mapped,
    /// Left to be mapped as touched: smaller than [`POPULATE_MIN_BYTES`], not Linux, or
    /// the process's CPUs span several NUMA nodes.
    Lazy,
    /// The kernel refused for another reason than memory: it does not know
    /// `MADV_POPULATE_WRITE` (before Linux 5.14, or an emulation of Linux), or a page
    /// could not be mapped (a hardware-poisoned page, a fatal signal): mapped as touched.
    Refused,
    /// The kernel had not the memory (warned about): mapped as touched.
    NoMemory,
}

/// Pages below which a buffer is populated by one thread.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const MIN_PAGES_PER_THREAD: usize = 256;

/// Backs the whole pages of a fresh allocation, `bytes` long from `ptr`, with memory now
/// (see the module documentation), split over `workers`' threads (the kernel zeroes
/// each page as it maps it: about 0.6 s a GiB on one core); `name` names the buffer in
/// a warning.
///
/// # Safety
/// `ptr..ptr + bytes` is one live allocation that nothing else uses yet.
pub(crate) unsafe fn populate(
    workers: &Workers,
    ptr: *mut u8,
    bytes: usize,
    name: &str,
) -> Populated {
    #[cfg(target_os = "linux")]
    {
        use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
        if bytes < POPULATE_MIN_BYTES || !one_memory_node() {
            return Populated::Lazy;
        }
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = usize::try_from(page).unwrap_or(4096).max(1);
        // madvise takes whole pages: those inside the allocation.
        let start = (ptr as usize).next_multiple_of(page);
        let end = (ptr as usize + bytes) / page * page;
        if end <= start {
            return Populated::Lazy;
        }
        let pages = (end - start) / page;
        let parts = workers.threads().min(pages / MIN_PAGES_PER_THREAD).max(1);
        let per = pages.div_ceil(parts) * page;
        let jobs: Vec<(usize, usize)> = (start..end)
            .step_by(per)
            .map(|from| (from, (from + per).min(end)))
            .collect();
        // The worst outcome of the parts: 0 mapped, 1 refused, 2 no memory.
        let worst = AtomicU8::new(0);
        workers.run(jobs, |(from, to)| {
            // SAFETY: [from, to) lies inside the caller's allocation; populating backs
            // its pages with zero-filled memory, as touching them would, and changes no
            // contents.
            let rc = unsafe {
                libc::madvise(
                    from as *mut libc::c_void,
                    to - from,
                    libc::MADV_POPULATE_WRITE,
                )
            };
            if rc != 0 {
                let error = std::io::Error::last_os_error().raw_os_error();
                let how = if error == Some(libc::ENOMEM) { 2 } else { 1 };
                worst.fetch_max(how, Relaxed);
            }
        });
        match worst.into_inner() {
            0 => Populated::Mapped,
            1 => Populated::Refused,
            _ => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    log::warn!(
                        "host memory is short: buffer {name:?} ({:.1} MiB) could not be \
                         backed by memory when allocated; this process may be killed for \
                         memory once it touches its buffers (further buffers are not \
                         reported)",
                        bytes as f64 / (1u64 << 20) as f64
                    )
                });
                Populated::NoMemory
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (workers, ptr, bytes, name);
        Populated::Lazy
    }
}

/// Whether this process's CPUs (the calling thread's affinity) lie on at most one NUMA
/// node (`/sys/devices/system/node`; true where that cannot be read), decided once.
#[cfg(target_os = "linux")]
fn one_memory_node() -> bool {
    static ONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONE.get_or_init(|| {
        let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") else {
            return true;
        };
        let nodes: Vec<Vec<usize>> = dir
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.strip_prefix("node")
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .filter_map(|e| std::fs::read_to_string(e.path().join("cpulist")).ok())
            .map(|list| cpu_list(&list))
            .collect();
        if nodes.len() <= 1 {
            return true;
        }
        // SAFETY: cpu_set_t is plain data, all zeros a valid (empty) set; the call
        // writes at most its size.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `set` is a live cpu_set_t of `size` bytes.
        if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
            return false;
        }
        let allowed = |cpu: usize| {
            // SAFETY: CPU_ISSET reads the set in bounds (checked against its capacity).
            cpu < 8 * size && unsafe { libc::CPU_ISSET(cpu, &set) }
        };
        let used = nodes.iter().filter(|cpus| cpus.iter().any(|&c| allowed(c)));
        used.count() <= 1
    })
}

/// The CPUs of a Linux CPU list (`0-3,8,10-11`); what does not parse is left out.
#[cfg(target_os = "linux")]
fn cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(lo), Ok(hi)) = (lo.parse::<usize>(), hi.parse::<usize>()) {
            cpus.extend(lo..=hi);
        }
    }
    cpus
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Whole pages of `bytes` from `ptr` that are backed now (`mincore`), and all of them.
    fn resident_pages(ptr: *const u8, bytes: usize) -> (usize, usize) {
        // SAFETY: no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let start = (ptr as usize).next_multiple_of(page);
        let end = (ptr as usize + bytes) / page * page;
        let pages = (end - start) / page;
        let mut flags = vec![0u8; pages];
        // SAFETY: [start, end) is inside the caller's live allocation; `flags` has a byte
        // per page.
        let rc =
            unsafe { libc::mincore(start as *mut libc::c_void, end - start, flags.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore failed");
        (flags.iter().filter(|&&f| f & 1 == 1).count(), pages)
    }

    #[test]
    fn a_large_buffer_is_backed_when_allocated_and_reads_as_zeros() {
        use crate::device::{Buffer, Device, HostDevice};
        // Above glibc's largest mmap threshold (32 MiB on 64-bit), so the allocation is a
        // fresh mapping whatever this process freed before: lazy unless populated.
        let len = (40 << 20) / 4;
        // Three threads: the pages are populated in three parts.
        let dev = HostDevice::with_threads(3);
        let buf = dev.alloc::<f32>(len, "large").expect("alloc");
        let (resident, pages) = resident_pages(buf.raw_ptr() as *const u8, len * 4);
        // What populating a second buffer of the same size does on this machine: where
        // the kernel cannot (before Linux 5.14) or should not (CPUs on several NUMA
        // nodes), pages stay lazy and there is nothing to check.
        let probe = vec![0u8; len * 4 + 4096];
        let one = Workers::new(1);
        // SAFETY: `probe` is this test's own allocation.
        let how = unsafe { populate(&one, probe.as_ptr() as *mut u8, probe.len(), "probe") };
        if how != Populated::Mapped {
            eprintln!("skipped: this host leaves pages lazy ({how:?})");
            return;
        }
        assert_eq!(resident, pages, "pages of a fresh 40 MiB buffer backed");
        let stream = dev.stream("check").expect("stream");
        let mut values = vec![1.0f32; len];
        dev.download(&stream, buf.view(), &mut values)
            .expect("download");
        assert!(values.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn cpu_lists_parse_as_linux_writes_them() {
        assert_eq!(cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(cpu_list("5"), vec![5]);
        assert!(cpu_list("\n").is_empty());
    }
}
