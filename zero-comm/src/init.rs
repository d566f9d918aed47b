//! Bringing MPI up and taking the job down.
//!
//! [`init`] is the one entry point: MPI_Init_thread asking for MPI_THREAD_MULTIPLE (the
//! watchdog thread calls MPI_Abort while the main thread sits in a collective), a panic
//! hook that prints `rank R: <message>` and aborts the whole job (so the other ranks do not
//! hang in their next collective), our own duplicate of MPI_COMM_WORLD with
//! MPI_ERRORS_RETURN, the half-precision ops, and the watchdog when configured.
//!
//! With a timeout configured, no call of the set-up or the end waits without a limit:
//! MPI_Init_thread and MPI_Finalize (which wait for every rank of the job) are bounded by
//! an [`exit::Deadline`], and the exchanges in between run under the watchdog, started
//! right after MPI_Init_thread. A start-up that fails after MPI_Init_thread finalises MPI
//! under the same bound before it returns its error.

use crate::config::{CommConfig, HalfSum};
use crate::error::{rank_list, CommError, Result};
use crate::exit::{self, abort_world, line_to_stderr, Deadline, PANIC_EXIT_CODE, WORLD_RANK};
use crate::mpi::{mpi_error_string, ops::HalfOps, MpiComm, Shared};
use crate::watchdog::{set_up_comm, WatchToken, Watchdog, Watched, WATCHDOG_EXIT_CODE};
use mpi::environment::Universe;
use mpi::ffi;
use mpi::Threading;

use crate::mpi::progress::ProgressThread;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How long a rank whose MPI_Finalize outlived its limit waits for its MPI_Abort to end
/// it before it exits by itself (the abort may block in a library that is finalising).
const ABORT_FALLBACK: Duration = Duration::from_secs(10);

/// Keeps MPI initialised; dropping it stops the watchdog and calls MPI_Finalize. Drop the
/// communicators first (a communicator dropped later is not freed, which is harmless).
pub struct MpiContext {
    // Declared first so that it is dropped (watchdog stopped) before the universe.
    watchdog: Option<Arc<Watchdog>>,
    progress: Option<Arc<ProgressThread>>,
    universe: Universe,
    threading: Threading,
    world_rank: usize,
    world_size: usize,
    /// The watchdog's timeout, which bounds MPI_Finalize too.
    timeout: Option<Duration>,
    /// Armed in `drop`, once the watchdog stops; declared after `universe` so that it is
    /// dropped (disarmed) only after MPI_Finalize has returned.
    finalize_deadline: Option<Deadline>,
}

impl std::fmt::Debug for MpiContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiContext")
            .field("world_rank", &self.world_rank)
            .field("world_size", &self.world_size)
            .field("threading", &self.threading)
            .finish()
    }
}

impl MpiContext {
    /// rsmpi's universe, for calls zero-comm does not wrap (the benchmark's raw baseline).
    pub fn universe(&self) -> &Universe {
        &self.universe
    }
    /// The threading level MPI granted.
    pub fn threading(&self) -> Threading {
        self.threading
    }
    /// Rank in MPI_COMM_WORLD.
    pub fn world_rank(&self) -> usize {
        self.world_rank
    }
    /// Size of MPI_COMM_WORLD.
    pub fn world_size(&self) -> usize {
        self.world_size
    }
}

impl Drop for MpiContext {
    fn drop(&mut self) {
        if let Some(w) = &self.watchdog {
            w.stop();
        }
        // Nothing watches from here on, and MPI_Finalize waits for every rank: one that
        // hangs or was stopped before its own would hold this one forever.
        self.finalize_deadline = self
            .timeout
            .and_then(|limit| finalize_deadline(self.world_rank, limit));
        // Before MPI_Finalize: the thread calls MPI.
        if let Some(p) = &self.progress {
            p.stop();
        }
    }
}

/// Arm `limit` for the end of MPI (the progress thread's stop and MPI_Finalize, which
/// runs when `universe` drops): past it, say so and abort the job.
fn finalize_deadline(world_rank: usize, limit: Duration) -> Option<Deadline> {
    let expired = move || {
        line_to_stderr(&format!(
            "rank {world_rank}: MPI_Finalize has not returned after {:.1} s (ZERO_COMM_TIMEOUT): it waits for every rank of the job to finish; check the other ranks' output for one that is still working, hung or was stopped; aborting the job",
            limit.as_secs_f64()
        ));
        // MPI_Abort inside a finalising library may block: exit after a while regardless.
        let _ = std::thread::Builder::new()
            .name("mpi-finalize-fallback".into())
            .spawn(|| {
                std::thread::sleep(ABORT_FALLBACK);
                // SAFETY: ends the process without running destructors (they would
                // call MPI).
                unsafe { libc::_exit(WATCHDOG_EXIT_CODE) }
            });
        abort_world(WATCHDOG_EXIT_CODE)
    };
    start_deadline(
        format!("mpi-finalize-deadline-{world_rank}"),
        limit,
        expired,
    )
}

/// Arm `limit` for MPI_Init_thread, which waits for every rank of the job: past it, say
/// so, naming this process by its launcher's rank and host (MPI gives no rank yet), and
/// exit plainly (MPI_Abort needs MPI up).
fn init_deadline(limit: Duration) -> Option<Deadline> {
    let expired = move || {
        line_to_stderr(&format!(
            "{}: MPI_Init_thread has not returned after {:.1} s (ZERO_COMM_TIMEOUT): it waits for every rank of the job; check that every rank was started (the launcher's output), that none failed, hung or was stopped before MPI_Init, and that the nodes can reach each other (network, firewall); exiting with code {WATCHDOG_EXIT_CODE}",
            exit::this_process(),
            limit.as_secs_f64()
        ));
        // SAFETY: ends the process without running destructors; MPI is not up to abort.
        unsafe { libc::_exit(WATCHDOG_EXIT_CODE) }
    };
    start_deadline("mpi-init-deadline".into(), limit, expired)
}

/// A deadline, or none (with a warning) when its thread cannot start: not a reason to
/// fail this rank alone, while its peers wait for it in MPI.
fn start_deadline(
    name: String,
    limit: Duration,
    expired: impl FnOnce() + Send + 'static,
) -> Option<Deadline> {
    match Deadline::start(name.clone(), limit, expired) {
        Ok(d) => Some(d),
        Err(e) => {
            log::warn!(
                "{}: no thread for {name} ({e}): that call goes unbounded",
                exit::this_process()
            );
            None
        }
    }
}

/// Watch the start-up call `call` (#`seq` on MPI_COMM_WORLD) until the token drops.
fn watch_start_up(
    watchdog: &Option<Arc<Watchdog>>,
    seq: u64,
    call: &'static str,
    purpose: &'static str,
) -> Option<WatchToken> {
    let what = Watched::SetUp { call, purpose };
    let dog = watchdog.as_ref()?;
    Some(dog.enter(&set_up_comm("MPI_COMM_WORLD"), seq, what))
}

/// Run `job` as this process's rank of an MPI job (started by mpirun or srun) and end it
/// as a job should end; `main` returns what this returns:
///
/// ```no_run
/// # fn train(_: &zero_comm::MpiComm) -> Result<(), zero_comm::CommError> { Ok(()) }
/// fn main() -> std::process::ExitCode {
///     // zero-core's EngineError::is_agreed_stop tells the errors every rank returns.
///     zero_comm::mpi_main(|comm| train(comm), |_error| false)
/// }
/// ```
///
/// - MPI does not start ([`init`]): the reason on stderr, exit code 1.
/// - `job` returns `Ok`: MPI_Finalize, exit code 0.
/// - `job` returns `Err(e)`: `rank R: e` on stderr at once (`{:#}`, so an `anyhow` error
///   shows its causes), then, when `agreed(&e)` says every rank returns this error at
///   the same point, MPI_Finalize on every rank and exit code 1; otherwise the whole job
///   is aborted (MPI_Abort, exit code 1), because the other ranks may be waiting for this
///   one in a collective. Returning such an error from `main` with `?` instead would
///   drop [`MpiContext`] first: its MPI_Finalize waits for ranks that wait in their
///   collective, until the watchdog ([`CommConfig::timeout`], 30 minutes unless set)
///   ends the job without the error ever printed. `|_| false` is always safe.
///
/// A panic aborts the job as with [`init`] (its hook).
pub fn mpi_main<E: std::fmt::Display>(
    job: impl FnOnce(&MpiComm) -> std::result::Result<(), E>,
    agreed: impl FnOnce(&E) -> bool,
) -> std::process::ExitCode {
    let (context, world) = match init() {
        Ok(x) => x,
        Err(e) => {
            line_to_stderr(&format!("cannot start MPI: {e}"));
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = job(&world);
    let code = match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if agreed(&e) => {
            line_to_stderr(&format!("rank {}: {e:#}", context.world_rank));
            std::process::ExitCode::FAILURE
        }
        Err(e) => crate::exit::abort(&format!("{e:#}"), 1),
    };
    drop(world);
    drop(context);
    code
}

/// Initialise MPI with options from the environment ([`CommConfig::from_env`]).
pub fn init() -> Result<(MpiContext, MpiComm)> {
    init_with(CommConfig::from_env()?)
}

/// Initialise MPI with these options. Returns the context guard and the world
/// communicator (our own duplicate of MPI_COMM_WORLD).
///
/// When the `ZERO_COMM_*` settings that shape the collectives differ between the ranks,
/// this does not return: rank 0 prints one line naming the settings and the ranks that
/// differ from it, and every rank finalises MPI and exits with code 1. Every rank knows
/// of the mismatch alike, so returning an error would have each print it (N copies on
/// N ranks), and only the ranks whose own values differ know what to fix.
pub fn init_with(config: CommConfig) -> Result<(MpiContext, MpiComm)> {
    let init_bound = config.timeout.and_then(init_deadline);
    let initialised = mpi::initialize_with_threading(Threading::Multiple);
    drop(init_bound);
    let (universe, threading) = initialised
        .ok_or_else(|| CommError::Init("MPI was already initialised in this process".into()))?;
    let (mut rank, mut size) = (0, 0);
    // SAFETY: MPI is initialised; out-pointers are locals.
    unsafe {
        ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank);
        ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size);
    }
    let (world_rank, world_size) = (rank as usize, size as usize);
    install_panic_hook(world_rank);
    let timeout = config.timeout;
    // Started before the first exchange: every one below waits for every rank.
    let watchdog = match timeout.map(|t| Watchdog::start(world_rank, t)) {
        Some(Ok(dog)) => Some(dog),
        Some(Err(e)) => {
            let e = CommError::Init(format!(
                "rank {world_rank}: cannot start the watchdog thread: {e}"
            ));
            finalize_after_failed_start(universe, world_rank, timeout, None);
            return Err(e);
        }
        None => None,
    };
    let (world, progress) = match start_up(world_rank, world_size, threading, config, &watchdog) {
        Ok(up) => up,
        Err(StartUpFailure::Error(e)) => {
            finalize_after_failed_start(universe, world_rank, timeout, watchdog);
            return Err(e);
        }
        Err(StartUpFailure::SettingsDiffer(report)) => {
            // Printed before MPI_Finalize: once a rank has exited with 1, mpirun may kill
            // the others.
            if world_rank == 0 {
                line_to_stderr(&format!("rank 0 of {world_size}: {report}"));
            }
            finalize_after_failed_start(universe, world_rank, timeout, watchdog);
            let _ = std::io::Write::flush(&mut std::io::stdout());
            std::process::exit(1)
        }
    };
    Ok((
        MpiContext {
            watchdog,
            progress,
            universe,
            threading,
            world_rank,
            world_size,
            timeout,
            finalize_deadline: None,
        },
        world,
    ))
}

/// Why [`start_up`] stopped.
enum StartUpFailure {
    /// An MPI call or a thread failed (this rank's error).
    Error(CommError),
    /// The ranks' `ZERO_COMM_*` settings differ: the description, the same on every rank.
    SettingsDiffer(String),
}

impl From<CommError> for StartUpFailure {
    fn from(e: CommError) -> Self {
        StartUpFailure::Error(e)
    }
}

/// What [`init_with`] does once MPI is up and the watchdog started: the settings
/// compared, the half ops, the heartbeat exchange, the world's duplicate, the progress
/// thread. Apart so that each failure finalises MPI the one bounded way
/// ([`finalize_after_failed_start`]).
fn start_up(
    world_rank: usize,
    world_size: usize,
    threading: Threading,
    config: CommConfig,
    watchdog: &Option<Arc<Watchdog>>,
) -> std::result::Result<(MpiComm, Option<Arc<ProgressThread>>), StartUpFailure> {
    {
        let _watch = watch_start_up(
            watchdog,
            0,
            "MPI_Allgather",
            "comparing the ZERO_COMM_* settings",
        );
        if let Some(report) = settings_unlike_rank_0(world_rank, world_size, &config)? {
            return Err(StartUpFailure::SettingsDiffer(report));
        }
    }
    if threading != Threading::Multiple {
        log::warn!(
            "rank {world_rank}: MPI granted {threading:?}, not Multiple; the watchdog's \
             MPI_Abort from its own thread relies on the library tolerating it, and \
             non-blocking collectives advance only when tested (no progress thread)"
        );
    }
    let ops = HalfOps::create().map_err(|rc| init_failed(world_rank, "MPI_Op_create", rc))?;
    // Every rank takes part in the exchange, watchdog or not (ZERO_COMM_TIMEOUT may not
    // reach every node, a port may fail to bind): a rank with nothing to offer sends
    // port 0, and the others know it cannot be asked.
    let port = match watchdog {
        Some(dog) => match dog.serve_heartbeat() {
            Ok(port) => port,
            Err(e) => {
                log::warn!(
                    "rank {world_rank}: no heartbeat server ({e}); a hang will not be diagnosed from this rank's side"
                );
                0
            }
        },
        None => 0,
    };
    let peers = {
        let _watch = watch_start_up(
            watchdog,
            1,
            "MPI_Allgather",
            "exchanging the watchdog's heartbeat addresses",
        );
        exchange_addresses(world_rank, world_size, port)?
    };
    if let Some(dog) = watchdog {
        dog.set_peers(peers);
    }
    let mut dup = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
    let watch = watch_start_up(
        watchdog,
        2,
        "MPI_Comm_dup",
        "our own copy of MPI_COMM_WORLD",
    );
    // SAFETY: collective over the world; MPI writes one handle.
    let rc = unsafe { ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, dup.as_mut_ptr()) };
    drop(watch);
    if rc != 0 {
        return Err(init_failed(world_rank, "MPI_Comm_dup(MPI_COMM_WORLD)", rc).into());
    }
    // SAFETY: written on success.
    let dup = unsafe { dup.assume_init() };
    // The thread calls MPI while the main thread does: only under MPI_THREAD_MULTIPLE.
    let progress = match config.progress_poll.filter(|_| threading == Threading::Multiple) {
        Some(poll) => Some(Arc::new(ProgressThread::start(world_rank, poll).map_err(
            |e| {
                CommError::Init(format!(
                    "rank {world_rank}: cannot start the MPI progress thread: {e} (ZERO_COMM_PROGRESS_US=0 runs without it)"
                ))
            },
        )?)),
        None => None,
    };
    let shared = Rc::new(Shared {
        world_rank,
        config,
        ops,
        // SAFETY: returns a constant.
        in_place: unsafe { crate::mpi::in_place() },
        watchdog: watchdog.clone(),
        progress: progress.clone(),
    });
    // On an error the progress thread stops as its last handle (in `shared`) drops.
    let world = MpiComm::adopt(dup, "world".to_string(), shared)?;
    Ok((world, progress))
}

/// End MPI after the start-up failed, as [`MpiContext`]'s drop does: the watchdog
/// stopped, then MPI_Finalize, which waits for every rank, bounded by the timeout (the
/// other ranks may be anywhere: still in an exchange, hung, or stopped).
fn finalize_after_failed_start(
    universe: Universe,
    world_rank: usize,
    timeout: Option<Duration>,
    watchdog: Option<Arc<Watchdog>>,
) {
    if let Some(dog) = &watchdog {
        dog.stop();
    }
    drop(watchdog);
    let bound = timeout.and_then(|limit| finalize_deadline(world_rank, limit));
    drop(universe);
    drop(bound);
}

/// The settings that change which MPI calls a collective makes (`ZERO_COMM_CHECK`'s
/// extra all-gather, `ZERO_COMM_HALF_SUM`, `ZERO_COMM_RING`): each rank's, in the order
/// of [`describe_unlike_settings`]. (`ZERO_COMM_TIMEOUT` and `ZERO_COMM_PROGRESS_US`
/// change no call and may differ.)
fn protocol_settings(config: &CommConfig) -> [i64; 3] {
    [
        config.check as i64,
        match config.half_sum {
            HalfSum::Op => 0,
            HalfSum::Upcast => 1,
        },
        config.mpi_reduce_scatter as i64,
    ]
}

/// The protocol settings must be alike on every rank, or the ranks' first collectives
/// would not match: a hang, or garbage. Each rank's environment is its own (`mpirun -x`
/// passes a variable on), so they are compared here, with one all-gather on
/// MPI_COMM_WORLD before any collective of ours, so that the report can name the ranks
/// that differ. `Some(description)`, the same on every rank, when they differ.
fn settings_unlike_rank_0(
    world_rank: usize,
    world_size: usize,
    config: &CommConfig,
) -> Result<Option<String>> {
    let mine = protocol_settings(config);
    let mut all = vec![0i64; mine.len() * world_size];
    // SAFETY: `mine` holds mine.len() i64s and `all` that many per rank; collective over
    // the world, called by every rank at the same point of init.
    let rc = unsafe {
        ffi::MPI_Allgather(
            mine.as_ptr() as *const std::os::raw::c_void,
            mine.len() as i32,
            ffi::RSMPI_INT64_T,
            all.as_mut_ptr() as *mut std::os::raw::c_void,
            mine.len() as i32,
            ffi::RSMPI_INT64_T,
            ffi::RSMPI_COMM_WORLD,
        )
    };
    if rc != 0 {
        return Err(init_failed(
            world_rank,
            "comparing the ZERO_COMM_* settings",
            rc,
        ));
    }
    Ok(describe_unlike_settings(&all))
}

/// How a protocol setting's value reads in the environment.
type Shown = fn(i64) -> &'static str;

/// The names of the protocol settings and how each value reads in the environment.
const PROTOCOL_SETTINGS: [(&str, Shown); 3] = [
    ("ZERO_COMM_CHECK", |v| if v != 0 { "1" } else { "0" }),
    (
        "ZERO_COMM_HALF_SUM",
        |v| if v != 0 { "upcast" } else { "op" },
    ),
    // `mpi_reduce_scatter` is ZERO_COMM_RING=0.
    ("ZERO_COMM_RING", |v| if v != 0 { "0" } else { "1" }),
];

/// From every rank's [`protocol_settings`] (`all`, in rank order): which settings differ
/// and, for each, rank 0's value and the ranks that hold another; `None` when alike.
fn describe_unlike_settings(all: &[i64]) -> Option<String> {
    let k = PROTOCOL_SETTINGS.len();
    let ranks: Vec<&[i64]> = all.chunks(k).collect();
    let root = ranks.first()?;
    let mut names = Vec::new();
    let mut details = Vec::new();
    for (i, (name, shown)) in PROTOCOL_SETTINGS.iter().enumerate() {
        // Every distinct value other than rank 0's, with its ranks, in order of rank.
        let mut others: Vec<(i64, Vec<usize>)> = Vec::new();
        for (r, values) in ranks.iter().enumerate().skip(1) {
            let v = values[i];
            if v == root[i] {
                continue;
            }
            match others.iter_mut().find(|(w, _)| *w == v) {
                Some((_, rs)) => rs.push(r),
                None => others.push((v, vec![r])),
            }
        }
        if others.is_empty() {
            continue;
        }
        names.push(*name);
        let mut said = vec![format!("{name}={} on rank 0", shown(root[i]))];
        said.extend(
            others
                .iter()
                .map(|(v, rs)| format!("{} on {}", shown(*v), rank_list(rs))),
        );
        details.push(said.join(", "));
    }
    if names.is_empty() {
        return None;
    }
    Some(format!(
        "{} differ(s) between the ranks ({}): their collectives would not match; give every rank the same environment (mpirun -x VAR, or export it before srun)",
        names.join(", "),
        details.join("; ")
    ))
}

/// Every rank's heartbeat address: one MPI_Allgather of fixed-size blocks on
/// MPI_COMM_WORLD itself (not on our duplicate: its calls are counted and numbered).
fn exchange_addresses(
    world_rank: usize,
    world_size: usize,
    port: u16,
) -> Result<Vec<crate::heartbeat::Peer>> {
    use crate::heartbeat::{decode_addresses, encode_address, ADDRESS_BYTES};
    let mine = encode_address(port);
    let mut all = vec![0u8; ADDRESS_BYTES * world_size];
    // SAFETY: `mine` holds ADDRESS_BYTES bytes and `all` that many per rank; MPI writes
    // only `all`. Collective over the world, called by every rank at the same point.
    let rc = unsafe {
        ffi::MPI_Allgather(
            mine.as_ptr() as *const std::os::raw::c_void,
            ADDRESS_BYTES as i32,
            ffi::RSMPI_UINT8_T,
            all.as_mut_ptr() as *mut std::os::raw::c_void,
            ADDRESS_BYTES as i32,
            ffi::RSMPI_UINT8_T,
            ffi::RSMPI_COMM_WORLD,
        )
    };
    if rc != 0 {
        return Err(init_failed(
            world_rank,
            "exchanging the watchdog's heartbeat addresses",
            rc,
        ));
    }
    Ok(decode_addresses(&all))
}

/// The set-up's MPI call `what` returned the error code `rc`: say which rank and call.
fn init_failed(world_rank: usize, what: &str, rc: i32) -> CommError {
    CommError::Init(format!(
        "rank {world_rank}: {what} failed: {}",
        mpi_error_string(rc)
    ))
}

fn install_panic_hook(world_rank: usize) {
    WORLD_RANK.store(world_rank, Ordering::Relaxed);
    std::panic::set_hook(Box::new(move |info| {
        let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = info.payload().downcast_ref::<String>() {
            s.clone()
        } else {
            "panic with a non-string payload".to_string()
        };
        let at = info
            .location()
            .map(|l| format!(" (at {}:{})", l.file(), l.line()))
            .unwrap_or_default();
        line_to_stderr(&format!("rank {world_rank}: {msg}{at}"));
        abort_world(PANIC_EXIT_CODE);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::child;

    /// Run `test` in a child with `env`; it must end with the watchdog's code (the call it
    /// bounds returns and exits 0: the code says the limit ended it); its stderr.
    fn ends_the_job(test: &str, env: &[(&str, &str)]) -> String {
        let out = child::run(test, env);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(WATCHDOG_EXIT_CODE), "{stderr}");
        stderr
    }

    #[test]
    fn an_mpi_init_that_outlives_the_timeout_exits_naming_the_launcher_rank() {
        if child::is_child() {
            let _bound = init_deadline(Duration::from_millis(200));
            std::thread::sleep(Duration::from_secs(30)); // MPI_Init_thread, hung
            return;
        }
        let stderr = ends_the_job(
            "init::tests::an_mpi_init_that_outlives_the_timeout_exits_naming_the_launcher_rank",
            &[("OMPI_COMM_WORLD_RANK", "7")],
        );
        let said = format!(
            "rank 7 (OMPI_COMM_WORLD_RANK) on host {}: MPI_Init_thread has not returned after 0.2 s",
            exit::host_name()
        );
        assert!(stderr.contains(&said), "{stderr}");
        assert!(
            stderr.contains("check that every rank was started"),
            "{stderr}"
        );
    }

    #[test]
    fn an_mpi_finalize_that_outlives_the_timeout_aborts() {
        if child::is_child() {
            let _bound = finalize_deadline(4, Duration::from_millis(200));
            std::thread::sleep(Duration::from_secs(30)); // MPI_Finalize, hung
            return;
        }
        let stderr = ends_the_job(
            "init::tests::an_mpi_finalize_that_outlives_the_timeout_aborts",
            &[],
        );
        assert!(
            stderr.contains("rank 4: MPI_Finalize has not returned after 0.2 s"),
            "{stderr}"
        );
        assert!(stderr.contains("check the other ranks' output"), "{stderr}");
    }

    #[test]
    fn unlike_settings_name_the_ranks_that_differ_from_rank_0() {
        let alike = [0, 0, 0].repeat(4);
        assert_eq!(describe_unlike_settings(&alike), None);
        // Ranks 1 and 2 of 3 run ZERO_COMM_RING=0, rank 2 also ZERO_COMM_CHECK=1.
        let all = [[0, 0, 0], [0, 0, 1], [1, 0, 1]].concat();
        let said = describe_unlike_settings(&all).expect("they differ");
        assert!(
            said.starts_with("ZERO_COMM_CHECK, ZERO_COMM_RING differ(s) between the ranks"),
            "{said}"
        );
        assert!(
            said.contains("ZERO_COMM_CHECK=0 on rank 0, 1 on rank 2;"),
            "{said}"
        );
        assert!(
            said.contains("ZERO_COMM_RING=1 on rank 0, 0 on ranks 1-2)"),
            "{said}"
        );
        assert!(said.contains("mpirun -x"), "{said}");
        let half = [[0, 1, 0], [0, 0, 0]].concat();
        let said = describe_unlike_settings(&half).expect("they differ");
        assert!(
            said.contains("ZERO_COMM_HALF_SUM=upcast on rank 0, op on rank 1)"),
            "{said}"
        );
    }

    #[test]
    fn a_call_that_returns_in_time_is_not_ended() {
        // Limits no test run reaches: only disarming ends their threads.
        let limit = Duration::from_secs(3600);
        let bound = Duration::from_secs(60);
        let init = init_deadline(limit).expect("a deadline thread");
        assert!(exit::dropped_within(init, bound), "disarmed at once");
        let finalize = finalize_deadline(0, limit).expect("a deadline thread");
        assert!(exit::dropped_within(finalize, bound), "disarmed at once");
    }
}
