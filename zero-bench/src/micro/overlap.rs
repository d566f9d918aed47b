//! `zero-bench micro overlap`: how much of the host-staged communication (issue 14's
//! `mpi-staged`) hides behind the backward, measured on this CPU under mpirun.
//!
//! A backward of `--layers` layers is simulated: each layer is `--compute-ms` of CPU work
//! (a calibrated loop in registers), then its gradient bucket (`--bucket` bytes of f32)
//! goes the staged way: copied into one of two host staging slots (double-buffered, as
//! zero-comm's `Staging`), summed across ranks by MPI_Allreduce on the slot, copied
//! back. Five timings, each the slowest rank's, the median of `--reps` (the mean of the
//! two middle ones for an even count), after one untimed round. It needs at least two
//! ranks: one has nothing to communicate.
//!
//! - `compute`: the layers alone; `comm`: the staged collectives alone;
//! - `serial`: each collective right after its layer (nothing overlaps);
//! - `nonblocking`: MPI_Iallreduce started after each layer and waited for only when its
//!   slot is needed again, with no MPI call during compute; Open MPI's host collectives
//!   advance only inside MPI calls (zero-comm/src/nonblocking.rs), so this shows what a
//!   start-and-wait design hides without help;
//! - `thread`: a progress thread owns the collectives (on its own duplicate of the world
//!   communicator; MPI is initialised with MPI_THREAD_MULTIPLE by zero-comm/src/init.rs):
//!   the main thread hands it each staged slot and computes on; the thread blocks in
//!   MPI_Allreduce, where Open MPI spins;
//! - `thread-poll`: the same thread starts MPI_Iallreduce and drives it with MPI_Test
//!   every `--poll-us` microseconds, sleeping in between, so it leaves the core to
//!   compute between polls.
//!
//! `exposed`: the time of a mode that its main thread did not spend computing (the
//! slowest rank's; measured in the same run, so a shared machine that slows compute from
//! one run to the next does not move it). `hidden = 1 - exposed / comm`, clamped to
//! [0, 1]: the fraction of the communication time that did not add to the step. On a
//! machine with fewer cores than ranks x 2 threads a spinning progress thread competes
//! with compute for a core, and the figure says so.

use std::os::raw::c_void;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use zero_comm::rsmpi::ffi;
use zero_comm::{Communicator, MpiComm, ReduceOp};

use crate::logging::outln;

/// `micro overlap` options.
#[derive(clap::Args, Debug)]
pub struct OverlapArgs {
    /// Layers of the simulated backward (one gradient bucket each).
    #[arg(long, default_value_t = 12)]
    pub layers: usize,
    /// Bytes of each layer's gradient bucket (f32: a multiple of 4).
    #[arg(long, default_value = "4MiB", value_parser = super::comm_args::parse_size)]
    pub bucket: usize,
    /// CPU work per layer, in milliseconds.
    #[arg(long, default_value_t = 20.0)]
    pub compute_ms: f64,
    /// `thread-poll`: microseconds the progress thread sleeps between MPI_Test calls.
    #[arg(long, default_value_t = 50)]
    pub poll_us: u64,
    /// Repetitions of each timing (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Also write the figures as JSON here (rank 0).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// A pointer or handle handed to the progress thread. The channels order every access:
/// the main thread touches a slot only before sending it and after its `done` message.
struct Handed<T>(T);
// SAFETY: see the type's documentation; MPI handles may be used from any thread under
// MPI_THREAD_MULTIPLE.
unsafe impl<T> Send for Handed<T> {}

fn check(rc: i32, call: &str) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(anyhow!("{call} failed with MPI error {rc}"))
    }
}

/// Sum `len` f32 at `send` across `comm` into `recv` (a slot's two halves).
///
/// # Safety
/// `send` must be valid for `len` f32 reads and `recv` for `len` writes, disjoint.
unsafe fn allreduce(
    comm: ffi::MPI_Comm,
    send: *const f32,
    recv: *mut f32,
    len: usize,
) -> Result<()> {
    // SAFETY: as the caller promises.
    let rc = unsafe {
        ffi::MPI_Allreduce(
            send as *const c_void,
            recv as *mut c_void,
            len as i32,
            ffi::RSMPI_FLOAT,
            ffi::RSMPI_SUM,
            comm,
        )
    };
    check(rc, "MPI_Allreduce")
}

/// CPU work: `iters` rounds of a dependent multiply-add chain (no memory traffic, so
/// it does not compete with the copies for bandwidth).
fn work(iters: u64) -> f32 {
    let mut x = 1.000_1f32;
    for i in 0..iters {
        x = std::hint::black_box(x * 0.999_9 + (i & 1) as f32 * 1e-4);
    }
    x
}

/// Rounds of [`work`] that take `ms` milliseconds here.
fn calibrate(ms: f64) -> u64 {
    let mut iters = 1u64 << 16;
    loop {
        let t = Instant::now();
        std::hint::black_box(work(iters));
        let s = t.elapsed().as_secs_f64();
        if s > 0.05 {
            return ((ms / 1e3) / s * iters as f64).max(1.0) as u64;
        }
        iters *= 2;
    }
}

struct Setup {
    /// Seconds spent in compute during the current mode (this rank's main thread).
    computed: f64,
    layers: usize,
    len: usize,
    iters: u64,
    grads: Vec<Vec<f32>>,
    /// Two staging slots, each a send and a receive half.
    slots: [(Vec<f32>, Vec<f32>); 2],
}

impl Setup {
    /// One layer's compute, timed.
    fn compute(&mut self) {
        let t = Instant::now();
        std::hint::black_box(work(self.iters));
        self.computed += t.elapsed().as_secs_f64();
    }
    fn stage_down(&mut self, l: usize) {
        let (g, s) = (&self.grads[l], &mut self.slots[l % 2].0);
        s.copy_from_slice(g);
    }
    fn stage_up(&mut self, l: usize) {
        let (s, g) = (&self.slots[l % 2].1, &mut self.grads[l]);
        g.copy_from_slice(s);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Compute,
    Comm,
    Serial,
    Nonblocking,
    Thread,
    ThreadPoll,
}

fn run_mode(mode: Mode, s: &mut Setup, comm: &MpiComm, threads: &[Progress; 2]) -> Result<()> {
    let raw = comm.as_raw();
    let len = s.len;
    match mode {
        Mode::Compute => {
            for _ in 0..s.layers {
                s.compute();
            }
        }
        Mode::Comm | Mode::Serial => {
            for l in 0..s.layers {
                if mode == Mode::Serial {
                    s.compute();
                }
                s.stage_down(l);
                let (send, recv) = &mut s.slots[l % 2];
                // SAFETY: both halves hold `len` f32 and are not touched during the call.
                unsafe { allreduce(raw, send.as_ptr(), recv.as_mut_ptr(), len)? };
                s.stage_up(l);
            }
        }
        Mode::Nonblocking => {
            // SAFETY: a request handle is plain data; NULL means none.
            let mut reqs = [unsafe { ffi::RSMPI_REQUEST_NULL }; 2];
            let mut owner = [usize::MAX; 2];
            for l in 0..s.layers {
                s.compute();
                let slot = l % 2;
                if owner[slot] != usize::MAX {
                    // SAFETY: a request we started; MPI sets it to NULL when done.
                    let rc = unsafe { ffi::MPI_Wait(&mut reqs[slot], ffi::RSMPI_STATUS_IGNORE) };
                    check(rc, "MPI_Wait")?;
                    s.stage_up(owner[slot]);
                }
                s.stage_down(l);
                let (send, recv) = &mut s.slots[slot];
                // SAFETY: the slot stays untouched until the request is waited for.
                let rc = unsafe {
                    ffi::MPI_Iallreduce(
                        send.as_ptr() as *const c_void,
                        recv.as_mut_ptr() as *mut c_void,
                        len as i32,
                        ffi::RSMPI_FLOAT,
                        ffi::RSMPI_SUM,
                        raw,
                        &mut reqs[slot],
                    )
                };
                check(rc, "MPI_Iallreduce")?;
                owner[slot] = l;
            }
            for slot in 0..2 {
                if owner[slot] != usize::MAX {
                    // SAFETY: as above.
                    let rc = unsafe { ffi::MPI_Wait(&mut reqs[slot], ffi::RSMPI_STATUS_IGNORE) };
                    check(rc, "MPI_Wait")?;
                    s.stage_up(owner[slot]);
                }
            }
        }
        Mode::Thread | Mode::ThreadPoll => {
            let progress = &threads[usize::from(mode == Mode::ThreadPoll)];
            let mut owner = [usize::MAX; 2];
            let mut pending = 0usize;
            for l in 0..s.layers {
                s.compute();
                let slot = l % 2;
                if owner[slot] != usize::MAX {
                    progress.done(owner[slot])?;
                    pending -= 1;
                    s.stage_up(owner[slot]);
                }
                s.stage_down(l);
                let (send, recv) = &mut s.slots[slot];
                progress.send(l, send.as_mut_ptr(), recv.as_mut_ptr(), len)?;
                owner[slot] = l;
                pending += 1;
            }
            for l in s.layers - pending..s.layers {
                progress.done(l)?;
                s.stage_up(l);
            }
        }
    }
    Ok(())
}

/// MPI_Iallreduce driven by MPI_Test every `poll`, sleeping in between.
///
/// # Safety
/// As [`allreduce`].
unsafe fn allreduce_polled(
    comm: ffi::MPI_Comm,
    send: *const f32,
    recv: *mut f32,
    len: usize,
    poll: Duration,
) -> Result<()> {
    // SAFETY: a request handle is plain data.
    let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: as the caller promises; the buffers stay untouched until the test says done.
    let rc = unsafe {
        ffi::MPI_Iallreduce(
            send as *const c_void,
            recv as *mut c_void,
            len as i32,
            ffi::RSMPI_FLOAT,
            ffi::RSMPI_SUM,
            comm,
            &mut req,
        )
    };
    check(rc, "MPI_Iallreduce")?;
    loop {
        let mut flag: i32 = 0;
        // SAFETY: our request; MPI sets it to NULL when complete.
        let rc = unsafe { ffi::MPI_Test(&mut req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        check(rc, "MPI_Test")?;
        if flag != 0 {
            return Ok(());
        }
        std::thread::sleep(poll);
    }
}

/// A layer's collective for the progress thread: (layer, send, receive, length).
type Job = (usize, Handed<*mut f32>, Handed<*mut f32>, usize);

/// The progress thread: runs each handed collective on its own communicator, in order.
struct Progress {
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<(usize, Result<(), String>)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// `poll`: drive a non-blocking collective with MPI_Test at this interval; `None`:
    /// block in the collective.
    fn start(world: &MpiComm, poll: Option<Duration>) -> Result<Self> {
        let mut dup = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        // SAFETY: collective over the world; MPI writes one handle.
        let rc = unsafe { ffi::MPI_Comm_dup(world.as_raw(), dup.as_mut_ptr()) };
        check(rc, "MPI_Comm_dup")?;
        // SAFETY: written on success.
        let comm = Handed(unsafe { dup.assume_init() });
        let (jobs, rx) = mpsc::channel::<Job>();
        let (tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("mpi-progress".into())
            .spawn(move || {
                let mut comm = comm;
                for (l, send, recv, len) in rx {
                    // SAFETY: the main thread handed the slot over and touches it again
                    // only after our `done` message.
                    let r = match poll {
                        None => unsafe { allreduce(comm.0, send.0, recv.0, len) },
                        Some(p) => unsafe { allreduce_polled(comm.0, send.0, recv.0, len, p) },
                    }
                    .map_err(|e| e.to_string());
                    if tx.send((l, r)).is_err() {
                        break;
                    }
                }
                // SAFETY: our duplicate, freed by the thread that used it.
                unsafe { ffi::MPI_Comm_free(&mut comm.0) };
            })
            .context("starting the progress thread")?;
        Ok(Progress {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    fn send(&self, l: usize, send: *mut f32, recv: *mut f32, len: usize) -> Result<()> {
        self.jobs
            .as_ref()
            .ok_or_else(|| anyhow!("progress thread stopped"))?
            .send((l, Handed(send), Handed(recv), len))
            .map_err(|_| anyhow!("the progress thread ended"))
    }

    /// Wait for layer `l`'s collective (they complete in order).
    fn done(&self, l: usize) -> Result<()> {
        let (got, r) = self
            .done
            .recv()
            .map_err(|_| anyhow!("the progress thread ended"))?;
        if got != l {
            return Err(anyhow!(
                "progress thread finished layer {got}, expected {l}"
            ));
        }
        r.map_err(|e| anyhow!("progress thread: {e}"))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Run `micro overlap` (under mpirun).
pub fn run(args: &OverlapArgs) -> Result<()> {
    // Every check before MPI starts: one rank refusing alone after it (its node's
    // memory) would leave the others waiting in the first collective.
    if args.layers == 0 || args.reps == 0 || args.bucket < 4 {
        return Err(anyhow!(
            "--layers, --reps and --bucket (at least 4 bytes) must be positive"
        ));
    }
    // Whole f32 elements: a cut bucket would move fewer bytes than the header says.
    if !args.bucket.is_multiple_of(4) {
        return Err(anyhow!(
            "--bucket {}: give a multiple of 4 bytes (the bucket holds whole f32 values), such as {}",
            args.bucket,
            args.bucket / 4 * 4
        ));
    }
    // One collective's count is an MPI int of f32 elements: at most 2^31 - 1 of them.
    let max_bucket = 4 * i32::MAX as usize;
    if args.bucket > max_bucket {
        return Err(anyhow!(
            "--bucket {}: at most {} (2^31 - 1 f32 elements, what one MPI call counts)",
            args.bucket,
            zero_core::ledger::human_bytes(max_bucket as f64)
        ));
    }
    if !(0.0..=60_000.0).contains(&args.compute_ms) {
        return Err(anyhow!(
            "--compute-ms {}: give 0 to 60000 ms of compute per layer",
            args.compute_ms
        ));
    }
    // The layers' buckets, and two gather slots of a send and a receive bucket each.
    let layers = args.layers as u64;
    let bytes = crate::memory::product(&[layers.saturating_add(4), args.bucket as u64]);
    crate::memory::need("micro overlap's buckets", bytes)?;
    let (ctx, comm) = zero_comm::init().context("initialising MPI")?;
    crate::logging::init(Some((comm.rank(), comm.size())));
    // Rank 0's --json, checked before the measurement rather than after it.
    if let Err(f) = super::outputs::check_on_rank_0(&comm, &[("--json", args.json.as_deref())]) {
        super::outputs::exit(f, (comm, ctx))
    }
    // After the option and output checks; one rank has nothing to hide behind compute.
    if comm.size() == 1 {
        return Err(anyhow!(
            "micro overlap on 1 rank: there is no communication to hide (its 'hidden' figures would time local copies); run it under mpirun/srun with at least 2 ranks"
        ));
    }
    let len = args.bucket / 4;
    let iters = calibrate(args.compute_ms);
    let mut s = Setup {
        computed: 0.0,
        layers: args.layers,
        len,
        iters,
        grads: vec![vec![1.0f32; len]; args.layers],
        slots: [
            (vec![0.0; len], vec![0.0; len]),
            (vec![0.0; len], vec![0.0; len]),
        ],
    };
    let threads = [
        Progress::start(&comm, None)?,
        Progress::start(&comm, Some(Duration::from_micros(args.poll_us)))?,
    ];
    let modes = [
        Mode::Compute,
        Mode::Comm,
        Mode::Serial,
        Mode::Nonblocking,
        Mode::Thread,
        Mode::ThreadPoll,
    ];
    let mut times = vec![Vec::new(); modes.len()];
    let mut exposed = vec![Vec::new(); modes.len()];
    // Interleaved repetitions, one warm-up round first: drift hits every mode alike.
    for rep in 0..=args.reps {
        for (i, &mode) in modes.iter().enumerate() {
            for g in &mut s.grads {
                g.fill(1.0);
            }
            s.computed = 0.0;
            comm.barrier()?;
            let t = Instant::now();
            run_mode(mode, &mut s, &comm, &threads)?;
            let elapsed = t.elapsed().as_secs_f64();
            // [time, time not spent computing]: the second is the communication this
            // rank's step exposed, whatever the compute cost this time (a shared machine
            // slows compute from one run to the next).
            let mut slowest = [elapsed, elapsed - s.computed];
            comm.all_reduce(&mut slowest[..], ReduceOp::Max)?;
            if rep > 0 {
                times[i].push(slowest[0]);
                exposed[i].push(slowest[1]);
            }
            // The sums are checked, so a broken staging path cannot pass for a fast one.
            let want = if mode == Mode::Compute {
                1.0
            } else {
                comm.size() as f32
            };
            if s.grads.iter().any(|g| g.iter().any(|&x| x != want)) {
                return Err(anyhow!("{mode:?}: a staged sum is wrong (expected {want})"));
            }
        }
    }
    drop(threads);
    let t: Vec<f64> = times.iter().map(|v| super::median(v)).collect();
    let e: Vec<f64> = exposed.iter().map(|v| super::median(v)).collect();
    // The communication alone is all exposed (nothing computes in `comm`).
    let comm_t = e[1];
    let hidden = |exposed: f64| (1.0 - exposed / comm_t).clamp(0.0, 1.0);
    if comm.rank() == 0 {
        outln!(
            "# micro overlap: {} ranks, {} layers x ({:.1} ms compute + {} bucket), median of {}",
            comm.size(),
            args.layers,
            args.compute_ms,
            zero_core::ledger::human_bytes(args.bucket as f64),
            args.reps
        );
        outln!(
            "{:<12} {:>10} {:>10} {:>8}",
            "mode",
            "seconds",
            "exposed",
            "hidden"
        );
        for (i, name) in [
            "compute",
            "comm",
            "serial",
            "nonblocking",
            "thread",
            "thread-poll",
        ]
        .iter()
        .enumerate()
        {
            let h = if i >= 2 {
                format!("{:.0}%", 100.0 * hidden(e[i]))
            } else {
                "-".into()
            };
            outln!("{name:<12} {:>10.4} {:>10.4} {h:>8}", t[i], e[i]);
        }
        if let Some(path) = &args.json {
            let v = serde_json::json!({
                "ranks": comm.size(),
                "layers": args.layers,
                "bucket_bytes": args.bucket,
                "compute_ms": args.compute_ms,
                "seconds": {
                    "compute": t[0], "comm": t[1], "serial": t[2],
                    "nonblocking": t[3], "thread": t[4], "thread_poll": t[5],
                },
                "exposed_seconds": {
                    "comm": e[1], "serial": e[2], "nonblocking": e[3],
                    "thread": e[4], "thread_poll": e[5],
                },
                "hidden": {
                    "serial": hidden(e[2]),
                    "nonblocking": hidden(e[3]),
                    "thread": hidden(e[4]),
                    "thread_poll": hidden(e[5]),
                },
            });
            let text = serde_json::to_string_pretty(&v)? + "\n";
            crate::outfile::write_text(path, &text).context("--json")?;
        }
    }
    Ok(())
}
