//! Started host work behind GPU compute (issue 14's host-staged overlap), without MPI or
//! other ranks: the mechanism by itself.
//!
//! Host work that takes [`HOST_WORK`] (a thread that sleeps, then writes a pattern into
//! page-locked staging memory, as an MPI collective writes its result) is started on a
//! comm stream (`Device::host_task_started`), the upload of that memory is queued
//! behind it (`Device::upload_from_staging`), and matrix products that take about as
//! long are queued on a compute stream. The host waiting for the work where it starts
//! (`ZERO_CUDA_STAGED=wait`), the two take their sum; with the comm stream waiting on
//! the GPU for the host's release word (`overlap`, `zero-kernels/src/device/release.rs`)
//! they take about the longer of the two. Both must upload the pattern exactly (the
//! upload ran after the work, not before), and overlapped must hide at least
//! [`HIDDEN_GOAL`] of the shorter one. On the simulated GPU the same steps run (its own
//! overlap), with its timings not judged.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use zero_kernels::device::{Buffer, HostWork, MatLayout, MatMul};
use zero_kernels::KernelError;

use super::report::{Check, Kind, Report};
use crate::device::{BenchDevice, Opener};

/// How long the host work takes on a GPU.
const HOST_WORK: Duration = Duration::from_millis(200);
/// The share of the shorter of work and compute that must run behind the other.
pub const HIDDEN_GOAL: f64 = 0.5;
/// Elements the host work writes and the upload carries.
const ELEMENTS: usize = 1 << 16;

/// The value the host work writes at `i`.
fn pattern(i: usize) -> f32 {
    (i % 4093) as f32 * 0.5 + 0.25
}

/// The host work: a thread that sleeps, writes [`pattern`] into the region, and says so.
struct Sleeper {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HostWork for Sleeper {
    fn test(&mut self) -> zero_kernels::Result<bool> {
        Ok(self.done.load(Ordering::Acquire))
    }
    fn wait(&mut self) -> zero_kernels::Result<()> {
        if let Some(t) = self.thread.take() {
            t.join()
                .map_err(|_| KernelError::Device("the host work's thread panicked".into()))?;
        }
        Ok(())
    }
}

/// The staging region's address, for the thread that fills it.
struct Region(*mut f32);
// SAFETY: only the work's thread writes the region until it says it is done; the region
// is kept allocated (retained by the device) until then.
unsafe impl Send for Region {}

/// One run's figures, in seconds.
struct Timing {
    /// The matrix products alone.
    compute: f64,
    /// From starting the work until everything was queued.
    queued: f64,
    /// From starting the work until everything had run.
    total: f64,
    /// Uploaded elements that are not the work's pattern.
    wrong: usize,
}

impl Timing {
    /// The share of the shorter of work and compute that ran behind the other.
    fn hidden(&self, work: f64) -> f64 {
        ((work + self.compute - self.total) / work.min(self.compute)).clamp(0.0, 1.0)
    }
}

/// Run the work beside `products` products of `size` x `size` on `dev`, overlapped or
/// not.
fn run_once<D: BenchDevice>(
    dev: &D,
    overlap: bool,
    work: Duration,
    size: usize,
    products: usize,
) -> anyhow::Result<Timing> {
    dev.set_overlap(overlap);
    let comm = dev.stream("gpu-check comm")?;
    let compute = dev.stream("gpu-check compute")?;
    let staging = Rc::new(dev.alloc_staging(ELEMENTS * 4)?);
    let mut out = dev.alloc::<f32>(ELEMENTS, "uploaded")?;
    let a = dev.alloc::<f32>(size * size, "a")?;
    let b = dev.alloc::<f32>(size * size, "b")?;
    let mut c = dev.alloc::<f32>(size * size, "c")?;
    let mm = MatMul {
        alpha: 1.0f32,
        beta: 0.0,
        a: MatLayout::rm(size, size, size),
        b: MatLayout::rm(size, size, size),
        c: MatLayout::rm(size, size, size),
    };
    // One product first: it loads cuBLASLt and fills the pool's cache (both may
    // synchronise the device, so with work in flight they would wait for it), and it
    // stays out of the timing. Then the products alone.
    dev.matmul(&compute, mm, a.view(), b.view(), c.view_mut())?;
    dev.synchronize()?;
    let t = Instant::now();
    for _ in 0..products {
        dev.matmul(&compute, mm, a.view(), b.view(), c.view_mut())?;
    }
    dev.synchronize()?;
    let compute_s = t.elapsed().as_secs_f64();

    let t0 = Instant::now();
    let region = Region(staging.as_ptr() as *mut f32);
    dev.host_task_started(
        &comm,
        "gpu-check host work",
        &[],
        &[],
        vec![Box::new(Rc::clone(&staging))],
        || {
            let done = Arc::new(AtomicBool::new(false));
            let said = Arc::clone(&done);
            let thread = std::thread::Builder::new()
                .name("gpu-check-host-work".into())
                .spawn(move || {
                    let region = region;
                    std::thread::sleep(work);
                    for i in 0..ELEMENTS {
                        // SAFETY: the region holds ELEMENTS f32 (allocated above) and
                        // nothing else touches it until `done` (Region's Send note).
                        unsafe { region.0.add(i).write(pattern(i)) };
                    }
                    said.store(true, Ordering::Release);
                })
                .map_err(|e| KernelError::Device(format!("starting the host work: {e}")))?;
            Ok(Box::new(Sleeper {
                done,
                thread: Some(thread),
            }) as Box<dyn HostWork>)
        },
    )?;
    // SAFETY: the region holds ELEMENTS f32; only the work started above on this stream
    // writes it, and the copy is queued behind that work.
    unsafe {
        dev.upload_from_staging(
            &comm,
            staging.as_ptr() as *const f32,
            out.view_mut(),
            Box::new(Rc::clone(&staging)),
        )
    }?;
    for _ in 0..products {
        dev.matmul(&compute, mm, a.view(), b.view(), c.view_mut())?;
    }
    let queued = t0.elapsed().as_secs_f64();
    dev.synchronize()?;
    let total = t0.elapsed().as_secs_f64();
    let mut host = vec![0f32; ELEMENTS];
    dev.download(&comm, out.view(), &mut host)?;
    let wrong = (host.iter().enumerate())
        .filter(|(i, v)| v.to_bits() != pattern(*i).to_bits())
        .count();
    Ok(Timing {
        compute: compute_s,
        queued,
        total,
        wrong,
    })
}

/// The checks: the pattern uploaded exactly, the host waiting and overlapped; then the
/// share overlap hid (a goal on a real device).
pub fn check<D: BenchDevice>(open: &Opener<D>, report: &mut Report) -> anyhow::Result<()> {
    let dev = open(0).context("opening the device")?;
    let sim = dev.simulated();
    let t0 = Instant::now();
    // Products for about as long as the work, sized from a probe: 2048 x 2048 on a GPU;
    // on the simulated GPU, which runs the twins on the CPU, 64 x 64 beside 50 ms of
    // work (the same steps, its timings not judged).
    let (work, size) = if sim {
        (Duration::from_millis(50), 64)
    } else {
        (HOST_WORK, 2048)
    };
    let probe = run_once(&dev, false, Duration::ZERO, size, 10)?;
    let per_product = probe.compute / 10.0;
    let products = (work.as_secs_f64() / per_product.max(1e-6))
        .round()
        .clamp(10.0, 20_000.0) as usize;
    let waited = run_once(&dev, false, work, size, products);
    let overlapped = run_once(&dev, true, work, size, products);
    dev.set_overlap(false);
    let seconds = t0.elapsed().as_secs_f64();
    let work_s = work.as_secs_f64();
    for (how, run) in [("host waiting", &waited), ("overlapped", &overlapped)] {
        let name = format!("host work's values through the staging upload, {how}");
        let check = Check::new("staged", name, Kind::Correctness);
        let mut check = match run {
            Err(e) => check.fail(format!("{e:#}")),
            Ok(t) => check.at_most(
                t.wrong as f64,
                0.0,
                format!(
                    "{} of {ELEMENTS} elements not the host work's (bitwise: bound 0)",
                    t.wrong
                ),
            ),
        };
        check.seconds = seconds / 2.0;
        report.add(check)?;
    }
    let name = format!(
        "host work of {:.0} ms behind {products} products {size}x{size}",
        work_s * 1e3
    );
    let check = Check::new("staged", name, Kind::Performance);
    let check = match (&waited, &overlapped) {
        (Ok(w), Ok(o)) => {
            let figures = format!(
                "overlapped: {:.0}% hidden (all queued after {:.1} ms, done after {:.1} ms); host waiting: {:.0}% (queued {:.1} ms, done {:.1} ms); products alone {:.1} ms (goal >= {:.0}%)",
                100.0 * o.hidden(work_s),
                1e3 * o.queued,
                1e3 * o.total,
                100.0 * w.hidden(work_s),
                1e3 * w.queued,
                1e3 * w.total,
                1e3 * o.compute,
                100.0 * HIDDEN_GOAL
            );
            let data = serde_json::json!({
                "work_s": work_s, "products": products, "size": size,
                "overlapped": { "compute_s": o.compute, "queued_s": o.queued, "total_s": o.total, "hidden": o.hidden(work_s) },
                "waiting": { "compute_s": w.compute, "queued_s": w.queued, "total_s": w.total, "hidden": w.hidden(work_s) },
            });
            if sim {
                check.skip(format!("{}: {figures}", super::perf::NOT_MEASURED))
            } else {
                check.at_least(o.hidden(work_s), HIDDEN_GOAL, figures)
            }
            .with_data(data)
        }
        _ => check.skip("a run failed (above)"),
    };
    report.add(check)
}
