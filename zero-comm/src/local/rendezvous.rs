//! The meeting point of the ranks of one [`super::LocalComm`] group: a Mutex-protected
//! table and a Condvar.
//!
//! Every collective passes one or two numbered *points* (a barrier, and any collective
//! that ends in a mismatch, only the first). Rank r's k-th point is the same point as
//! every other rank's k-th point, because all ranks run the same sequence of collectives
//! (the consistency check makes sure of that) and every rendezvous ends the same way on
//! every rank (success, or the same mismatch; any other failure leaves the group
//! permanently faulted or a rank departed, so nothing pairs up afterwards).
//!
//! - [`Group::arrive`] (point 1 of a collective): publish this rank's [`Slot`] (call
//!   fingerprint, input address and length), wait until every rank has published, return
//!   a copy of every slot. This wait can fail: a peer that left ([`CommError::PeerGone`]),
//!   the watchdog ([`CommError::Timeout`]), or an earlier failure ([`CommError::Poisoned`]).
//! - [`Reading::finish`] (point 2): "I have finished reading the peers' inputs"; waits until
//!   every rank has said so. This wait never fails and has no timeout: a rank that passed
//!   point 1 runs only our own copy/reduce code before point 2 (no user code, no waits but
//!   for its own GPU stream when the buffers are device memory), and
//!   if that code ever unwound, [`Reading`]'s `Drop` still passes point 2. Returning early
//!   from it would let the caller free or overwrite a buffer a peer is still reading.
//!
//! Invariants behind the memory safety of the whole backend:
//! - no rank passes point k before every rank has arrived at it (arrival counters only
//!   grow, and are read under the lock);
//! - a rank leaves point 1 with an error only while some rank has not arrived, and only
//!   when that rank never will: it left (departed), or a fault is set, and a faulted group
//!   refuses every later arrival. So that point 1 is passed by no one, and the addresses
//!   published there (which the caller may free as soon as the error is returned) are
//!   never read;
//! - a rank passes point 2 only when every rank has finished reading (or left);
//! - slots are double-buffered by point parity, so a rank that runs ahead into its next
//!   point never overwrites a table a slower peer has yet to copy.

use crate::buffer::Location;
use crate::error::{CommError, Result};
use crate::fingerprint::FIELDS;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The communicator name in messages.
pub(super) const NAME: &str = "local";

/// Longest single sleep on the condvar: every state change notifies, so this only bounds
/// how long a lost wake-up (there should be none) could delay noticing a change.
const POLL: Duration = Duration::from_millis(100);

/// What a rank publishes at point 1.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    /// The consistency check's fingerprint of the call.
    pub(super) fp: [i64; FIELDS],
    /// The rank's input (see `LocalComm::input_of`): a host address, or a device address
    /// when `location` is a GPU.
    pub(super) ptr: *const u8,
    /// Elements at `ptr`.
    pub(super) len: usize,
    /// Where the call's buffers live (every rank's must agree: a rank reads its peers'
    /// inputs the way it reaches its own).
    pub(super) location: Location,
}

// SAFETY: a Slot is an address and numbers; sending it to another thread is harmless by
// itself. It is dereferenced only between points 1 and 2 of the collective it was
// published for, while its owner is blocked in that collective keeping the buffer alive
// and unmodified (see the module documentation and `LocalComm::execute`).
unsafe impl Send for Slot {}

impl Slot {
    const EMPTY: Slot = Slot {
        fp: [0; FIELDS],
        ptr: std::ptr::null(),
        len: 0,
        location: Location::Host,
    };
}

/// Where a rank is, for error messages.
#[derive(Clone, Copy, Debug)]
pub(super) struct Here {
    /// Communicator rank (indexes the tables).
    pub(super) rank: usize,
    /// World rank and communicator name, for messages.
    pub(super) world_rank: usize,
    pub(super) comm: &'static str,
    pub(super) seq: u64,
    pub(super) op: &'static str,
}

/// The first failure that made the group unusable.
#[derive(Debug)]
struct Fault {
    by: usize,
    /// The point at which it happened.
    point: u64,
    /// A watchdog timeout (peers waiting at the same point report a timeout too).
    timed_out: bool,
    message: String,
}

#[derive(Debug)]
struct State {
    /// Points each rank has reached (its next point's number).
    arrived: Vec<u64>,
    /// Ranks whose communicator was dropped: the order in which they left.
    departed: Vec<Option<u64>>,
    /// Departures so far.
    departures: u64,
    /// What each rank published at its last two points, by point parity: a rank may
    /// publish at point k+1 (e.g. after a barrier, which has no point 2) while a slower
    /// peer has yet to copy point k's table, but it cannot reach point k+2 before every
    /// rank has passed point k.
    slots: [Vec<Slot>; 2],
    fault: Option<Fault>,
}

impl State {
    /// Of `ranks`, the one that left first (the likely cause: later ones may have left
    /// because of it).
    fn first_departed(&self, ranks: impl Iterator<Item = usize>) -> Option<usize> {
        ranks
            .filter_map(|p| self.departed[p].map(|order| (order, p)))
            .min()
            .map(|(_, p)| p)
    }
}

/// Shared by the communicators of one group.
#[derive(Debug)]
pub(super) struct Group {
    size: usize,
    timeout: Option<Duration>,
    state: Mutex<State>,
    cv: Condvar,
}

impl Group {
    pub(super) fn new(size: usize, timeout: Option<Duration>) -> Self {
        Group {
            size,
            timeout,
            state: Mutex::new(State {
                arrived: vec![0; size],
                departed: vec![None; size],
                departures: 0,
                slots: [vec![Slot::EMPTY; size], vec![Slot::EMPTY; size]],
                fault: None,
            }),
            cv: Condvar::new(),
        }
    }

    /// The lock, also when a thread panicked while holding it. That cannot leave the
    /// state half-updated: nothing under the lock runs user code, and every update is a
    /// plain store of a value computed beforehand. (A thread that panics elsewhere is
    /// reported to its peers as departed, by its communicator's `Drop`.)
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, st: MutexGuard<'a, State>, d: Duration) -> MutexGuard<'a, State> {
        match self.cv.wait_timeout(st, d) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        }
    }

    fn peer_gone(here: &Here, peer: usize) -> CommError {
        CommError::PeerGone {
            rank: here.world_rank,
            comm: here.comm.to_string(),
            seq: here.seq,
            op: here.op,
            peer,
        }
    }

    fn poisoned(here: &Here, f: &Fault) -> CommError {
        CommError::Poisoned {
            rank: here.world_rank,
            comm: here.comm.to_string(),
            seq: here.seq,
            op: here.op,
            by: f.by,
            reason: f.message.clone(),
        }
    }

    fn timeout(here: &Here, waited: Duration, missing: Vec<usize>) -> CommError {
        CommError::Timeout {
            rank: here.world_rank,
            comm: here.comm.to_string(),
            seq: here.seq,
            op: here.op,
            waited_s: waited.as_secs_f64(),
            missing,
        }
    }

    /// Point 1: publish `slot`, wait for every rank, copy every rank's slot into `out`
    /// (index = rank).
    pub(super) fn arrive(&self, here: &Here, slot: Slot, out: &mut Vec<Slot>) -> Result<()> {
        let me = here.rank;
        let mut st = self.lock();
        // Refuse before arriving: a fault means some rank gave up on an earlier or this
        // point (reported first: it says why), and a departed rank never arrives.
        if let Some(f) = &st.fault {
            return Err(Self::poisoned(here, f));
        }
        if let Some(p) = st.first_departed((0..self.size).filter(|&p| p != me)) {
            return Err(Self::peer_gone(here, p));
        }
        let k = st.arrived[me];
        st.slots[(k % 2) as usize][me] = slot;
        st.arrived[me] = k + 1;
        self.cv.notify_all();
        let start = Instant::now();
        loop {
            // Checked first: once everyone has arrived, the collective goes ahead whatever
            // happens next (a rank that finished may drop its communicator at once).
            if st.arrived.iter().all(|&a| a > k) {
                out.clear();
                out.extend_from_slice(&st.slots[(k % 2) as usize]);
                return Ok(());
            }
            let missing: Vec<usize> = (0..self.size).filter(|&p| st.arrived[p] <= k).collect();
            // Leaving after arriving is safe: a faulted group accepts no more arrivals
            // and a departed rank never arrives, so nobody passes k.
            if let Some(f) = &st.fault {
                return Err(if f.timed_out && f.point == k {
                    // The group's watchdog fired at this very point: report it as ours.
                    Self::timeout(here, start.elapsed(), missing)
                } else {
                    Self::poisoned(here, f)
                });
            }
            if let Some(p) = st.first_departed(missing.iter().copied()) {
                return Err(Self::peer_gone(here, p));
            }
            let waited = start.elapsed();
            let step = match self.timeout {
                Some(t) if waited >= t => {
                    let e = Self::timeout(here, waited, missing);
                    // Set under the same lock as the "not everyone arrived" observation:
                    // no later arrival is accepted, so point k is never passed and no one
                    // reads this rank's buffers after it returns.
                    st.fault = Some(Fault {
                        by: me,
                        point: k,
                        timed_out: true,
                        message: e.to_string(),
                    });
                    self.cv.notify_all();
                    return Err(e);
                }
                Some(t) => (t - waited).min(POLL),
                None => POLL,
            };
            st = self.wait(st, step);
        }
    }

    /// Point 2: this rank finished reading; wait until every rank has (a departed rank
    /// reads nothing). Never fails, no timeout: see the module documentation.
    fn done_reading(&self, me: usize) {
        let mut st = self.lock();
        let k = st.arrived[me];
        st.arrived[me] = k + 1;
        self.cv.notify_all();
        while !(0..self.size).all(|p| st.arrived[p] > k || st.departed[p].is_some()) {
            st = self.wait(st, POLL);
        }
    }

    /// Make the group unusable after a failure on rank `by` (the first fault is kept).
    pub(super) fn poison(&self, by: usize, message: String) {
        let mut st = self.lock();
        if st.fault.is_none() {
            let point = st.arrived[by];
            st.fault = Some(Fault {
                by,
                point,
                timed_out: false,
                message,
            });
        }
        self.cv.notify_all();
    }

    /// Rank `me`'s communicator is gone: peers waiting for it, or arriving later, get
    /// `PeerGone`.
    pub(super) fn depart(&self, me: usize) {
        let mut st = self.lock();
        if st.departed[me].is_none() {
            st.departed[me] = Some(st.departures);
            st.departures += 1;
        }
        self.cv.notify_all();
    }
}

/// Between points 1 and 2: this rank may be reading its peers' inputs. [`Reading::finish`]
/// passes point 2; dropping it unfinished (only by unwinding out of our own code) faults
/// the group and still passes point 2, so peers are never left waiting and never read a
/// buffer this rank's caller has already freed.
pub(super) struct Reading<'a> {
    group: &'a Group,
    rank: usize,
    done: bool,
}

impl<'a> Reading<'a> {
    pub(super) fn new(group: &'a Group, rank: usize) -> Self {
        Reading {
            group,
            rank,
            done: false,
        }
    }

    /// Pass point 2 (blocks until every rank finished reading).
    pub(super) fn finish(mut self) {
        self.done = true;
        self.group.done_reading(self.rank);
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.group.poison(
                self.rank,
                format!(
                    "rank {}: panicked inside a collective on '{NAME}'",
                    self.rank
                ),
            );
            self.group.done_reading(self.rank);
        }
    }
}
