//! GPU time per op, measured with CUDA events: while profiling is on
//! ([`CudaDevice::profile_ops`]), every `Device` op records an event on its stream before
//! and after its work; [`CudaDevice::take_op_profile`] waits for them and sums the time
//! between each pair by op name. Off (the default), an op pays one `Cell` read.
//!
//! Ops on different streams may overlap, so the per-op times can add up to more than the
//! wall time; on one stream they add up to the stream's busy time.

use std::collections::HashMap;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

use super::CudaDevice;
use crate::error::KernelError;

/// One op's events.
pub(crate) struct OpMark {
    name: &'static str,
    start: CudaEvent,
    end: CudaEvent,
}

/// The GPU time of one op name over a profiled stretch.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    /// The `Device` method, e.g. "matmul", "attention_forward".
    pub name: &'static str,
    /// Calls.
    pub calls: usize,
    /// Milliseconds between the events around its calls, summed.
    pub ms: f64,
}

/// Records the end event of an op when dropped (see [`CudaDevice::begin_op`]).
pub(crate) struct OpTimer<'a> {
    dev: &'a CudaDevice,
    name: &'static str,
    stream: &'a CudaStream,
    start: Option<CudaEvent>,
}

impl Drop for OpTimer<'_> {
    fn drop(&mut self) {
        let Some(start) = self.start.take() else {
            return;
        };
        // A failed record loses one sample of a diagnostic, not the op's work.
        if let Ok(end) = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        {
            self.dev.op_marks.borrow_mut().push(OpMark {
                name: self.name,
                start,
                end,
            });
        }
    }
}

impl CudaDevice {
    /// Start (`true`) or stop timing every op (see the module documentation). Starting
    /// drops the marks of an earlier stretch not taken.
    pub fn profile_ops(&self, on: bool) {
        if on {
            self.op_marks.borrow_mut().clear();
        }
        self.profiling.set(on);
    }

    /// Wait for the ops timed since [`CudaDevice::profile_ops`] and return their GPU time
    /// per op name, the largest first; the marks are consumed.
    pub fn take_op_profile(&self) -> Result<Vec<OpTime>, KernelError> {
        // The marks' events may sit behind streams that wait for started host work.
        self.settle()?;
        let marks = std::mem::take(&mut *self.op_marks.borrow_mut());
        let mut by_name: HashMap<&'static str, (usize, f64)> = HashMap::new();
        for m in &marks {
            let ms = m.start.elapsed_ms(&m.end)? as f64;
            let e = by_name.entry(m.name).or_default();
            e.0 += 1;
            e.1 += ms;
        }
        let mut out: Vec<OpTime> = by_name
            .into_iter()
            .map(|(name, (calls, ms))| OpTime { name, calls, ms })
            .collect();
        out.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        Ok(out)
    }

    /// Every op starts here: the host looks at the host-staged work left running
    /// (`staged.rs`), and, when profiling is on, op `name` on `stream` is timed from now
    /// until the returned guard drops.
    pub(crate) fn begin_op<'a>(
        &'a self,
        name: &'static str,
        stream: &'a CudaStream,
    ) -> OpTimer<'a> {
        self.staged.poll(stream);
        let start = if self.profiling.get() {
            stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .ok()
        } else {
            None
        };
        OpTimer {
            dev: self,
            name,
            stream,
            start,
        }
    }
}
