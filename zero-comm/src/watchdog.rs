//! The watchdog: a thread that aborts the job when a collective has not finished within
//! the configured timeout, after printing which one (communicator, sequence number,
//! collective, element count, dtype) and which ranks are behind: it asks every other rank
//! over the heartbeat side channel (`heartbeat.rs`) what it last completed and where it
//! is now, and one rank waiting in the collective (normally the lowest; `heartbeat.rs`
//! says which) prints the ranks that are not in it, with their hosts, and those that do
//! not answer (a stopped or hung process). Every rank stuck in the same collective fires
//! at about the same moment; the others wait while the reporting rank still waits in the
//! collective, and each waits a grace period after its own line before MPI_Abort, so that
//! the report gets printed first.

use crate::stats::CollectiveKind;
use crate::DType;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::heartbeat::{self, Call, Calls, Completed, Peer};
use std::time::{Duration, Instant};

/// Exit code of a job the watchdog aborted.
pub const WATCHDOG_EXIT_CODE: i32 = 3;

/// Time a rank waits after its last line before aborting, so that what it and the
/// others printed reaches the launcher first.
const GRACE: Duration = Duration::from_millis(1000);

/// How long a rank that left the report to another waits, once that one is gone, for
/// the abort to end this process too before it reports itself.
const ABORT_LANDS: Duration = Duration::from_secs(5);

/// A poll that came this much later than asked means the process was stopped, not
/// slow: that time is not counted as waiting.
const SUSPEND_SLACK: Duration = Duration::from_secs(2);

/// How often a rank that left the report to a lower rank asks whether it still waits.
const REPORTER_POLL: Duration = Duration::from_millis(500);

/// What a watched call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Watched {
    /// A collective of `count` x `dtype`.
    Collective {
        kind: CollectiveKind,
        count: usize,
        dtype: DType,
    },
    /// A blocking MPI call of the set-up (bringing MPI up, creating a communicator, the
    /// node-group exchange), collective over its communicator: `call` is MPI's name for
    /// it, `purpose` what it is for. Numbered apart from the collectives, on
    /// [`set_up_comm`]'s name.
    SetUp {
        call: &'static str,
        purpose: &'static str,
    },
}

impl Watched {
    /// One word for the heartbeat's answers and the report: the collective's name, or the
    /// MPI call's.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Watched::Collective { kind, .. } => kind.name(),
            Watched::SetUp { call, .. } => call,
        }
    }
}

/// The name set-up calls on `comm` are watched and reported under (their numbers are not
/// the collectives' numbers, so they are kept apart in the heartbeat's answers).
pub(crate) fn set_up_comm(comm: &str) -> String {
    format!("{comm} (set-up)")
}

#[derive(Clone, Debug)]
struct Entry {
    comm: String,
    seq: u64,
    what: Watched,
    started: Instant,
}

/// The line a rank prints when `e` has waited `waited_s` past `timeout_s`: which call, on
/// which rank, and what to check.
fn timed_out_line(world_rank: usize, e: &Entry, waited_s: f64, timeout_s: f64) -> String {
    match e.what {
        Watched::Collective { kind, count, dtype } => format!(
            "rank {world_rank}: watchdog: {kind} #{} on '{}' ({count} x {dtype}) has not finished after {waited_s:.1} s \
             (timeout {timeout_s:.1} s); aborting the job",
            e.seq, e.comm
        ),
        Watched::SetUp { call, purpose } => format!(
            "rank {world_rank}: watchdog: {call} ({purpose}; #{} on '{}') has not returned after {waited_s:.1} s \
             (timeout {timeout_s:.1} s, ZERO_COMM_TIMEOUT); aborting the job. Every rank of the communicator must make this call: \
             check the other ranks' output for one that failed, hung or was stopped before it (the report below names the ranks that are not in it), \
             or raise ZERO_COMM_TIMEOUT if set-up is only slow",
            e.seq, e.comm
        ),
    }
}

/// Collectives in flight on this rank, watched by one thread.
#[derive(Debug)]
pub(crate) struct Watchdog {
    world_rank: usize,
    timeout: Duration,
    next_id: AtomicU64,
    in_flight: Mutex<HashMap<u64, Entry>>,
    /// The last collective completed on each communicator (for the heartbeat's answers).
    completed: Mutex<Completed>,
    /// Every rank's heartbeat address (set once after MPI is up).
    peers: OnceLock<Vec<Peer>>,
    stop: AtomicBool,
    /// A collective timed out: this thread reports and aborts the job.
    fired: AtomicBool,
}

impl heartbeat::State for Watchdog {
    fn snapshot(&self) -> (Vec<(&'static str, u64, String, f64)>, Calls) {
        let waiting = self
            .in_flight
            .lock()
            .map(|m| {
                m.values()
                    .map(|e| {
                        let waited = e.started.elapsed().as_secs_f64();
                        (e.what.name(), e.seq, e.comm.clone(), waited)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let done = self
            .completed
            .lock()
            .map(|m| {
                m.iter()
                    .map(|(c, &(seq, kind))| (kind, seq, c.clone()))
                    .collect()
            })
            .unwrap_or_default();
        (waiting, done)
    }
}

/// What to watch for one collective; [`WatchSpec::enter`] starts the clock. Blocking
/// calls are watched for their whole duration; non-blocking ones only while the caller
/// waits on them, so a long compute phase overlapping a request is not mistaken for a hang.
pub(crate) struct WatchSpec {
    pub(crate) dog: Arc<Watchdog>,
    pub(crate) comm: String,
    pub(crate) seq: u64,
    pub(crate) kind: CollectiveKind,
    pub(crate) count: usize,
    pub(crate) dtype: DType,
}

impl WatchSpec {
    fn what(&self) -> Watched {
        Watched::Collective {
            kind: self.kind,
            count: self.count,
            dtype: self.dtype,
        }
    }

    /// Watch from now until the token is dropped.
    pub(crate) fn enter(&self) -> WatchToken {
        self.dog.enter(&self.comm, self.seq, self.what())
    }

    /// Watch from now until the token is dropped, without recording the collective as
    /// completed then: for a wait whose success records it by [`WatchSpec::completed`],
    /// an exchange made before the collective runs, or a call that may fail
    /// ([`WatchToken::completed`] records it once it has succeeded).
    pub(crate) fn enter_unrecorded(&self) -> WatchToken {
        let mut token = self.enter();
        token.record = false;
        token
    }

    /// The collective completed, also outside any wait (a test found it done): the
    /// heartbeat's answers then name it as completed, or a report would call this rank
    /// behind a collective it finished.
    pub(crate) fn completed(&self) {
        self.dog.record_completed(&self.comm, self.seq, self.what());
    }
}

/// Removes its collective from the watch list when dropped, recording it as completed
/// unless it came from [`WatchSpec::enter_unrecorded`] (a call that failed must not be
/// answered as done).
pub(crate) struct WatchToken {
    dog: Arc<Watchdog>,
    id: u64,
    record: bool,
}

impl WatchToken {
    /// The watched call succeeded: record it as completed when the token goes.
    pub(crate) fn completed(mut self) {
        self.record = true;
    }
}

impl Drop for WatchToken {
    fn drop(&mut self) {
        let done = self
            .dog
            .in_flight
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&self.id));
        if let (true, Some(e)) = (self.record, done) {
            self.dog.record_completed(&e.comm, e.seq, e.what);
        }
    }
}

impl Watchdog {
    /// Start the watching thread.
    pub(crate) fn start(world_rank: usize, timeout: Duration) -> std::io::Result<Arc<Self>> {
        let dog = Arc::new(Watchdog {
            world_rank,
            timeout,
            next_id: AtomicU64::new(0),
            in_flight: Mutex::new(HashMap::new()),
            completed: Mutex::new(HashMap::new()),
            peers: OnceLock::new(),
            stop: AtomicBool::new(false),
            fired: AtomicBool::new(false),
        });

        let d = Arc::clone(&dog);
        // Poll often enough that the abort comes within ~10% of the timeout.
        let poll = (timeout / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
        std::thread::Builder::new()
            .name("zero-comm-watchdog".into())
            .spawn(move || d.run(poll))?;
        Ok(dog)
    }

    /// Start this rank's heartbeat server; returns its port (the caller exchanges the
    /// addresses and hands them to [`Watchdog::set_peers`]).
    pub(crate) fn serve_heartbeat(self: &Arc<Self>) -> std::io::Result<u16> {
        heartbeat::serve(
            self.world_rank,
            Arc::clone(self) as Arc<dyn heartbeat::State>,
        )
    }

    /// Every rank's heartbeat address, in rank order (once, after the exchange).
    pub(crate) fn set_peers(&self, peers: Vec<Peer>) {
        let _ = self.peers.set(peers);
    }

    /// Stop watching (MPI is about to be finalised). When the watchdog has fired, the
    /// job is being aborted: wait for that rather than let this process end with exit 0
    /// in the middle of the report, and abort here if it does not come.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if self.fired.load(Ordering::SeqCst) {
            std::thread::sleep(self.report_bound());
            crate::exit::abort_world(WATCHDOG_EXIT_CODE);
        }
    }

    /// The longest a report can take before its abort (see [`Self::report`]).
    fn report_bound(&self) -> Duration {
        self.patience() + ABORT_LANDS + 2 * heartbeat::ANSWER_TIMEOUT + GRACE
    }

    /// How long a rank that left the report to a lower one waits for it: at least the
    /// time that rank's own report takes when a peer does not answer.
    fn patience(&self) -> Duration {
        self.timeout
            .max(heartbeat::report_slack(self.timeout) + 2 * heartbeat::ANSWER_TIMEOUT + GRACE)
    }

    /// Record #`seq` on `comm` as the last call completed there, unless a later one
    /// already is (requests may complete out of order).
    fn record_completed(&self, comm: &str, seq: u64, what: Watched) {
        let Ok(mut completed) = self.completed.lock() else {
            return;
        };
        match completed.get_mut(comm) {
            Some(last) if seq < last.0 => {}
            Some(last) => *last = (seq, what.name()),
            None => {
                completed.insert(comm.to_string(), (seq, what.name()));
            }
        }
    }

    /// Watch one call (`what`, #`seq` on `comm`) until the token is dropped.
    pub(crate) fn enter(self: &Arc<Self>, comm: &str, seq: u64, what: Watched) -> WatchToken {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let e = Entry {
            comm: comm.to_string(),
            seq,
            what,
            started: Instant::now(),
        };
        if let Ok(mut m) = self.in_flight.lock() {
            m.insert(id, e);
        }
        WatchToken {
            dog: Arc::clone(self),
            id,
            record: true,
        }
    }

    /// Print the report on `stuck`, or leave it to a lower rank (`heartbeat.rs`): then
    /// wait while that rank still waits in `stuck`, since it reports (or has left the
    /// report to a rank lower still) and aborts the job, which ends this process too.
    /// If it stops waiting without that, or the wait passes the timeout, report here.
    fn report(&self, stuck: &Call, peers: &[Peer]) {
        let me = self.world_rank;
        let answers = match heartbeat::gather(me, stuck, self.timeout, peers) {
            heartbeat::Reporter::Me(answers) => answers,
            heartbeat::Reporter::LowerRank { rank, in_s } => {
                log::debug!(
                    "rank {me}: watchdog: rank {rank} times out in {in_s:.1} s and reports"
                );
                let started = Instant::now();
                let reporter = peers.iter().find(|p| p.rank == rank);
                let patience = self.patience();
                while started.elapsed() < patience
                    && reporter.is_some_and(|p| heartbeat::still_waits(p, stuck))
                {
                    std::thread::sleep(REPORTER_POLL);
                }
                // Its MPI_Abort ends it before the launcher ends this process (Open MPI:
                // SIGTERM, then SIGKILL a second later): let that land before reporting
                // here too.
                std::thread::sleep(ABORT_LANDS);
                let others: Vec<&Peer> = peers.iter().filter(|p| p.rank != me).collect();
                heartbeat::ask_all(&others)
            }
        };
        crate::exit::line_to_stderr(&heartbeat::report(me, stuck, &answers, peers));
    }

    fn run(&self, poll: Duration) {
        let mut woke = Instant::now();
        while !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep(poll);
            // A stop of the whole process (SIGSTOP, Slurm's `scontrol suspend`) is no
            // time waited: the clock of every collective in flight skips it, or a job
            // suspended past the timeout would be aborted when it resumes.
            let gap = woke.elapsed();
            woke = Instant::now();
            if let Some(lost) = gap.checked_sub(poll + SUSPEND_SLACK) {
                if let Ok(mut m) = self.in_flight.lock() {
                    for e in m.values_mut() {
                        e.started += lost;
                    }
                }
            }
            let late: Option<Entry> = match self.in_flight.lock() {
                Ok(m) => m
                    .values()
                    .filter(|e| e.started.elapsed() > self.timeout)
                    .min_by_key(|e| e.seq)
                    .cloned(),
                Err(_) => None,
            };
            if let Some(e) = late {
                // From here on the job is aborted: `stop()` (MPI about to be finalised)
                // sees this and waits for the abort, so the process cannot exit 0 after
                // the line below.
                self.fired.store(true, Ordering::SeqCst);
                crate::exit::line_to_stderr(&timed_out_line(
                    self.world_rank,
                    &e,
                    e.started.elapsed().as_secs_f64(),
                    self.timeout.as_secs_f64(),
                ));
                let _ = std::io::stderr().flush();
                // Ask the others where they are; one rank reports (heartbeat.rs).
                let stuck = Call {
                    kind: e.what.name().to_string(),
                    seq: e.seq,
                    comm: e.comm.clone(),
                };
                if let Some(peers) = self.peers.get() {
                    self.report(&stuck, peers);
                }
                let _ = std::io::stderr().flush();
                std::thread::sleep(GRACE);
                crate::exit::abort_world(WATCHDOG_EXIT_CODE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::child;

    #[test]
    fn a_collective_times_out_with_its_kind_number_count_and_dtype() {
        let e = Entry {
            comm: "world".into(),
            seq: 2282,
            what: Watched::Collective {
                kind: CollectiveKind::ReduceScatter,
                count: 789_792,
                dtype: DType::BF16,
            },
            started: Instant::now(),
        };
        let line = timed_out_line(1, &e, 3.2, 3.0);
        assert!(
            line.starts_with("rank 1: watchdog: reduce_scatter #2282 on 'world' (789792 x bf16) has not finished after 3.2 s"),
            "{line}"
        );
    }

    /// The heartbeat's "last completed" counts a non-blocking collective that a test found
    /// done, never waited on, as it counts one completed in a wait; one that completes
    /// late does not take the place of a later one.
    #[test]
    fn a_collective_a_test_completed_is_answered_as_done_like_a_waited_one() {
        let dog = Watchdog::start(0, Duration::from_secs(3600)).expect("the thread");
        let spec = |seq| WatchSpec {
            dog: Arc::clone(&dog),
            comm: "world".into(),
            seq,
            kind: CollectiveKind::AllGather,
            count: 8,
            dtype: DType::F32,
        };
        let done = || heartbeat::State::snapshot(&*dog).1;
        drop(spec(0).enter()); // #0 completed in a wait
        assert_eq!(done(), vec![("all_gather", 0, "world".to_string())]);
        spec(2).completed(); // #2 found done by a test
        assert_eq!(done(), vec![("all_gather", 2, "world".to_string())]);
        spec(1).completed(); // #1, tested after #2
        drop(spec(1).enter());
        let (waiting, last) = heartbeat::State::snapshot(&*dog);
        assert!(waiting.is_empty(), "{waiting:?}");
        assert_eq!(last, vec![("all_gather", 2, "world".to_string())]);
        // A call that failed (or an exchange before the collective) is not done; one
        // recorded only on success is, once it succeeded.
        drop(spec(3).enter_unrecorded());
        assert_eq!(done(), vec![("all_gather", 2, "world".to_string())]);
        spec(4).enter_unrecorded().completed();
        assert_eq!(done(), vec![("all_gather", 4, "world".to_string())]);
        assert!(heartbeat::State::snapshot(&*dog).0.is_empty());
        dog.stop();
    }

    /// A set-up call that never returns ends the job with the watchdog's exit code and a
    /// line naming the call, the rank and what to check (in a child: it exits).
    #[test]
    fn a_set_up_call_that_hangs_ends_the_job() {
        if child::is_child() {
            let dog = Watchdog::start(4, Duration::from_millis(200)).expect("the thread");
            let what = Watched::SetUp {
                call: "MPI_Comm_split_type",
                purpose: "finding the ranks on this node",
            };
            let _watch = dog.enter(&set_up_comm("world"), 1, what);
            std::thread::sleep(Duration::from_secs(30));
            return;
        }
        let out = child::run(
            "watchdog::tests::a_set_up_call_that_hangs_ends_the_job",
            &[],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The child's call returns after 30 s and exits 0: this code says the limit ended it.
        assert_eq!(out.status.code(), Some(WATCHDOG_EXIT_CODE), "{stderr}");
        for said in [
            "rank 4: watchdog: MPI_Comm_split_type (finding the ranks on this node; #1 on 'world (set-up)') has not returned after",
            "check the other ranks' output",
            "ZERO_COMM_TIMEOUT",
        ] {
            assert!(stderr.contains(said), "{said}: {stderr}");
        }
    }
}
