//! Started host work released to a device in start order: how a device whose streams run
//! without the host (a GPU) lets a host-staged collective overlap with compute
//! (issue 14's mpi-staged path; the CUDA device's `host_task_started` in
//! `cuda/device.rs`).
//!
//! The device queues, on the collective's stream, a wait for a release word to reach the
//! collective's sequence number, and returns; the stream's later work (the upload of the
//! result) waits on the GPU, and the other streams' compute runs on. The host polls the
//! work between the ops it queues ([`Released::poll`]) and, before anything that blocks it
//! on the device ([`Released::settle`]: a synchronisation, a download, an event wait),
//! waits for all of it: a stream that waits for a word only the host can write must never
//! be waited for by a host that is not writing it.
//!
//! One word serves every stream: numbers are released in start order, so a release of
//! `n` releases everything before it. The device compares cyclically
//! (`(int32_t)(word - n) >= 0`, CUDA's `CU_STREAM_WAIT_VALUE_GEQ`), so the numbers may
//! wrap around. Work that fails is released too (the stream must not wait forever; the
//! step fails with the error at the next [`Released::settle`]), and what it retains is
//! leaked, as on the host device: the transport may still hold the addresses. What
//! finished work retains is dropped once no stream waits for the word (at the next
//! settle, or a poll that waited for everything): freeing page-locked memory
//! synchronises the whole device.

// Only the CUDA device releases work this way; the tests run everywhere.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::collections::VecDeque;
use std::time::Instant;

use super::{HostWork, OverlapStats, Result, Retained};
use crate::error::KernelError;

/// Most pieces of work in flight; starting one more first waits for the oldest. (The
/// CUDA device settles before it starts work, so one is in flight there; this bounds any
/// other user.)
const MAX_IN_FLIGHT: usize = 8;
/// Most ops the host queues behind work in flight (on a stream that waits for the word,
/// directly or through events) before it waits for that work: those ops cannot run, an
/// op may be several launches, and a full launch queue would block the host inside a
/// launch, where it could never write the word. Ops on other streams run, and are not
/// counted.
const MAX_OPS_BEHIND: usize = 128;

/// Whether a CUDA device leaves host-staged collectives running behind compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StagedOverlap {
    /// The host waits for each collective where it starts (the path that has run on a
    /// GPU; the default until the other one has).
    #[default]
    Wait,
    /// The collective's stream waits for it on the device, the host goes on queueing.
    Overlap,
}

impl StagedOverlap {
    /// The environment variable that picks the mode when a CUDA device opens.
    pub const ENV: &'static str = "ZERO_CUDA_STAGED";

    /// Parse `wait` or `overlap`.
    pub fn parse(s: &str) -> Option<StagedOverlap> {
        match s.trim().to_ascii_lowercase().as_str() {
            "wait" => Some(StagedOverlap::Wait),
            "overlap" => Some(StagedOverlap::Overlap),
            _ => None,
        }
    }

    /// The choice of [`StagedOverlap::ENV`]: the default when it is unset or empty, an
    /// error naming the variable when it holds anything but `wait` or `overlap`.
    pub fn from_env() -> Result<StagedOverlap> {
        crate::env::choice(
            Self::ENV,
            Self::parse,
            "wait (the host waits for each host-staged collective), overlap (the GPU stream waits for it)",
        )
    }
}

/// One piece of work in flight.
struct InFlight {
    number: u32,
    name: &'static str,
    work: Box<dyn HostWork>,
    retain: Vec<Retained>,
    since: Instant,
}

/// The work in flight, its numbers, the first failure not yet reported, and the time
/// accounting ([`crate::device::Device::overlap_stats`]).
#[derive(Default)]
pub(crate) struct Released {
    /// The last number handed out (0: none yet; the word starts at 0).
    last: u32,
    in_flight: VecDeque<InFlight>,
    /// Polls (ops queued) since the last start, while work was in flight.
    ops_behind: usize,
    /// What released work retained, until no stream waits for the word.
    finished: Vec<Vec<Retained>>,
    failed: Option<KernelError>,
    stats: OverlapStats,
}

impl Released {
    /// Whether any work is in flight.
    pub(crate) fn busy(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Whether [`Released::settle`] has nothing to do: no work in flight, nothing
    /// retained, no failure to report.
    pub(crate) fn idle(&self) -> bool {
        self.in_flight.is_empty() && self.finished.is_empty() && self.failed.is_none()
    }

    /// The number the next piece of work's stream waits for.
    pub(crate) fn next_number(&self) -> u32 {
        self.last.wrapping_add(1)
    }

    /// Take number [`Released::next_number`] for `work`, started `issued` seconds ago
    /// (the start call, exposed), whose stream now waits for the word to reach it.
    /// Past [`MAX_IN_FLIGHT`] the oldest is waited for first.
    pub(crate) fn push(
        &mut self,
        name: &'static str,
        work: Box<dyn HostWork>,
        retain: Vec<Retained>,
        issued: f64,
        release: &dyn Fn(u32),
    ) {
        self.last = self.last.wrapping_add(1);
        self.ops_behind = 0;
        self.stats.tasks += 1;
        self.stats.exposed_seconds += issued;
        self.stats.total_seconds += issued;
        self.in_flight.push_back(InFlight {
            number: self.last,
            name,
            work,
            retain,
            since: Instant::now(),
        });
        while self.in_flight.len() > MAX_IN_FLIGHT {
            self.finish_oldest(true, release);
        }
    }

    /// Release every number whose work has finished, oldest first (one test each until
    /// one is still running); called as each op is queued, `behind` when it is queued
    /// behind the work in flight. Past [`MAX_OPS_BEHIND`] such ops with work still in
    /// flight, wait for all of it. Failures are kept for [`Released::settle`].
    pub(crate) fn poll(&mut self, behind: bool, release: &dyn Fn(u32)) {
        while self.busy() && self.finish_oldest(false, release) {}
        if !self.busy() || !behind {
            return;
        }
        self.ops_behind += 1;
        if self.ops_behind > MAX_OPS_BEHIND {
            while self.busy() {
                self.finish_oldest(true, release);
            }
            self.finished.clear();
        }
    }

    /// Wait for all work in flight and release it; the first failure since the last
    /// settle, if any (each failure is reported once).
    pub(crate) fn settle(&mut self, release: &dyn Fn(u32)) -> Result<()> {
        while self.busy() {
            self.finish_oldest(true, release);
        }
        self.finished.clear();
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The time accounting so far.
    pub(crate) fn stats(&self) -> OverlapStats {
        self.stats
    }

    /// Wait for (`block`) or test the oldest work; release it when it has finished or
    /// failed. Whether it was released.
    fn finish_oldest(&mut self, block: bool, release: &dyn Fn(u32)) -> bool {
        let Some(mut oldest) = self.in_flight.pop_front() else {
            return false;
        };
        let t0 = Instant::now();
        let outcome = if block {
            oldest.work.wait().map(|()| true)
        } else {
            oldest.work.test()
        };
        let blocked = if block {
            t0.elapsed().as_secs_f64()
        } else {
            0.0
        };
        match outcome {
            Ok(false) => {
                self.in_flight.push_front(oldest);
                false
            }
            Ok(true) => {
                self.stats.exposed_seconds += blocked;
                self.stats.total_seconds += oldest.since.elapsed().as_secs_f64();
                release(oldest.number);
                self.finished.push(oldest.retain);
                true
            }
            Err(e) => {
                self.stats.exposed_seconds += blocked;
                self.stats.total_seconds += oldest.since.elapsed().as_secs_f64();
                release(oldest.number);
                let name = oldest.name;
                // The transport may still hold the addresses: never free them.
                std::mem::forget((oldest.work, oldest.retain));
                self.failed.get_or_insert(match e {
                    e @ KernelError::HostWork { .. } => e,
                    e => KernelError::HostWork {
                        task: name,
                        message: e.to_string(),
                    },
                });
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// Work that finishes at its `polls`-th test (or at a wait), or fails there.
    struct Scripted {
        polls: usize,
        fail: bool,
        log: Rc<Cell<usize>>,
    }

    impl HostWork for Scripted {
        fn test(&mut self) -> Result<bool> {
            if self.polls > 1 {
                self.polls -= 1;
                return Ok(false);
            }
            self.wait().map(|()| true)
        }
        fn wait(&mut self) -> Result<()> {
            self.log.set(self.log.get() + 1);
            if self.fail {
                return Err(KernelError::HostWork {
                    task: "reduce_scatter",
                    message: "peer 1 is gone".into(),
                });
            }
            Ok(())
        }
    }

    fn work(polls: usize, fail: bool, log: &Rc<Cell<usize>>) -> Box<dyn HostWork> {
        Box::new(Scripted {
            polls,
            fail,
            log: Rc::clone(log),
        })
    }

    /// The word as the device sees it, and its cyclic comparison.
    struct Word(Cell<u32>);
    impl Word {
        fn passes(&self, n: u32) -> bool {
            (self.0.get().wrapping_sub(n) as i32) >= 0
        }
    }

    #[test]
    fn numbers_are_released_in_start_order_only() {
        let word = Word(Cell::new(0));
        let release = |n: u32| word.0.set(n);
        let log = Rc::new(Cell::new(0));
        let mut r = Released::default();
        assert_eq!(r.next_number(), 1);
        // The first needs 3 polls, the second is done at its first.
        r.push("a", work(3, false, &log), Vec::new(), 0.0, &release);
        r.push("b", work(1, false, &log), Vec::new(), 0.0, &release);
        r.poll(true, &release);
        assert!(
            !word.passes(1) && !word.passes(2),
            "nothing finished in order yet"
        );
        r.poll(true, &release);
        r.poll(true, &release);
        assert!(
            word.passes(1) && word.passes(2),
            "a finished, then b at once"
        );
        assert!(!r.busy());
        assert_eq!(r.next_number(), 3);
        r.settle(&release).expect("no failure");
    }

    #[test]
    fn settle_waits_for_everything_and_reports_a_failure_once() {
        let word = Word(Cell::new(0));
        let release = |n: u32| word.0.set(n);
        let log = Rc::new(Cell::new(0));
        let mut r = Released::default();
        r.push("a", work(100, false, &log), Vec::new(), 0.0, &release);
        r.push(
            "reduce_scatter",
            work(100, true, &log),
            Vec::new(),
            0.0,
            &release,
        );
        r.push("c", work(100, false, &log), Vec::new(), 0.0, &release);
        let e = r.settle(&release).expect_err("the failure surfaces");
        assert!(e.to_string().contains("peer 1 is gone"), "{e}");
        // Every stream was let go, the failed work's included.
        assert!(word.passes(3));
        assert_eq!(log.get(), 3);
        r.settle(&release).expect("reported once");
        let s = r.stats();
        assert_eq!(s.tasks, 3);
        assert!(s.exposed_seconds <= s.total_seconds);
    }

    #[test]
    fn what_work_retains_is_dropped_at_settle_only() {
        let word = Word(Cell::new(0));
        let release = |n: u32| word.0.set(n);
        let log = Rc::new(Cell::new(0));
        let held = Rc::new(());
        let mut r = Released::default();
        let retain: Vec<Retained> = vec![Box::new(Rc::clone(&held))];
        r.push("a", work(1, false, &log), retain, 0.0, &release);
        r.push("b", work(1000, false, &log), Vec::new(), 0.0, &release);
        r.poll(true, &release);
        assert!(word.passes(1) && !word.passes(2));
        assert_eq!(Rc::strong_count(&held), 2, "kept while b's stream waits");
        r.settle(&release).expect("no failure");
        assert_eq!(Rc::strong_count(&held), 1, "dropped once nothing waits");
    }

    #[test]
    fn the_host_waits_for_the_work_after_many_ops_behind_it() {
        let word = Word(Cell::new(0));
        let release = |n: u32| word.0.set(n);
        let log = Rc::new(Cell::new(0));
        let mut r = Released::default();
        r.push(
            "a",
            work(usize::MAX, false, &log),
            Vec::new(),
            0.0,
            &release,
        );
        for _ in 0..MAX_OPS_BEHIND {
            r.poll(true, &release);
            // Ops on streams that do not wait for the word are not counted.
            r.poll(false, &release);
        }
        assert!(r.busy() && !word.passes(1), "still running");
        r.poll(true, &release);
        assert!(!r.busy() && word.passes(1), "waited for");
        assert_eq!(log.get(), 1);
    }

    #[test]
    fn the_oldest_is_waited_for_past_the_limit() {
        let word = Word(Cell::new(0));
        let release = |n: u32| word.0.set(n);
        let log = Rc::new(Cell::new(0));
        let mut r = Released::default();
        for _ in 0..MAX_IN_FLIGHT + 2 {
            r.push("a", work(1000, false, &log), Vec::new(), 0.0, &release);
        }
        assert_eq!(log.get(), 2, "two waited for");
        assert!(word.passes(2) && !word.passes(3));
    }

    #[test]
    fn numbers_wrap_around_under_the_cyclic_comparison() {
        let word = Word(Cell::new(u32::MAX - 1));
        let release = |n: u32| word.0.set(n);
        let log = Rc::new(Cell::new(0));
        let mut r = Released {
            last: u32::MAX - 1,
            ..Released::default()
        };
        assert_eq!(r.next_number(), u32::MAX);
        r.push("a", work(5, false, &log), Vec::new(), 0.0, &release);
        assert_eq!(r.next_number(), 0);
        r.push("b", work(5, false, &log), Vec::new(), 0.0, &release);
        assert!(!word.passes(u32::MAX) && !word.passes(0));
        r.settle(&release).expect("no failure");
        assert!(word.passes(u32::MAX) && word.passes(0));
        assert!(!word.passes(1));
    }

    #[test]
    fn the_mode_comes_from_its_variable() {
        assert_eq!(
            StagedOverlap::parse(" Overlap "),
            Some(StagedOverlap::Overlap)
        );
        assert_eq!(StagedOverlap::parse("wait"), Some(StagedOverlap::Wait));
        assert_eq!(StagedOverlap::parse("yes"), None);
        assert_eq!(StagedOverlap::default(), StagedOverlap::Wait);
    }
}
