//! Without the `cuda` feature: no device data movement. [`super::LocalComm::validate`]
//! refuses device buffers ([`ENABLED`] is false), so nothing here is reached.

use super::rendezvous::{Reading, Slot};
use super::LocalComm;
use crate::buffer::Location;
use crate::communicator::RawCall;
use crate::error::{CommError, Result};

/// Whether this build moves data between device buffers.
pub(super) const ENABLED: bool = false;

/// Nothing to hold (a field, so both builds construct it alike).
#[derive(Debug, Default)]
pub(super) struct DeviceState {
    _none: (),
}

impl DeviceState {
    /// Never reached (device buffers are refused first); refuses again if it were.
    pub(super) fn open(&self, rank: usize, op: &'static str, ordinal: usize) -> Result<()> {
        Err(CommError::Location {
            rank,
            op,
            location: Location::Cuda(ordinal),
            backend: super::rendezvous::NAME,
        })
    }

    /// Never reached; passes point 2 and refuses.
    ///
    /// # Safety
    /// None needed: reads nothing.
    pub(super) unsafe fn move_data(
        &self,
        comm: &LocalComm,
        call: &RawCall,
        _peers: &[Slot],
        _upcast: bool,
        reading: Reading,
    ) -> Result<()> {
        let e = CommError::Location {
            rank: comm.world_rank,
            op: call.kind.name(),
            location: call.recv.location,
            backend: super::rendezvous::NAME,
        };
        comm.group.poison(comm.rank, e.to_string());
        reading.finish();
        Err(e)
    }
}
