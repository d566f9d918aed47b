//! The Device layer: where the bytes of a model live and the math on them, behind one
//! trait, so that the engine and the models are written once for every device.
//!
//! A [`Device`] owns typed buffers ([`Device::Buf`]), streams and events, copies, and every
//! kernel the engine and the models call: the optimizer's (AdamW, casts, gradient
//! statistics) and the model's (matrix products, layer norm, GELU, attention, the
//! classifier's softmax and cross-entropy, row gathers). Work is queued on a stream and
//! runs in queue order there; work on different streams is unordered unless a stream
//! waits for an event recorded on another ([`Device::record`], [`Device::wait_event`]).
//! The host sees results only after it waits ([`Device::sync_event`],
//! [`Device::synchronize`], [`Device::download`]). These are CUDA's rules, so code that
//! is correct on one device is correct on all of them.
//!
//! Implementations:
//! - [`HostDevice`]: the CPU, eager: every op runs when it is queued (the vectorised
//!   kernels of this crate). Streams and events cost nothing and order nothing, except
//!   behind started host work ([`Device::host_task_started`]: a non-blocking MPI
//!   collective), which it leaves running, polls between ops, and queues that stream's
//!   later ops behind: so communication overlaps compute on the CPU too.
//! - [`SimDevice`]: a *simulated* device, a test tool. It queues every op per stream and
//!   runs the queues in a seeded random interleaving, only as far as the host asks; it
//!   tracks which op last wrote and read each range of each buffer, and an access that is
//!   not ordered after a conflicting one (same stream, or an event waited in between)
//!   fails with both ops, both streams and the buffer named. A missing event wait that
//!   the host device's eager order hides is an error here, deterministically.
//! - `CudaDevice` (feature `cuda`): the same trait over cudarc (pooled
//!   buffers, CUDA streams and events, our PTX kernels, cuBLASLt).
//!
//! The CPU kernels are the same on both CPU devices, so a run on [`SimDevice`] gives the
//! same bits as on [`HostDevice`].
//!
//! ```
//! use zero_kernels::device::{Buffer, Device, HostDevice, SimDevice};
//!
//! fn scaled_sum<D: Device>(dev: &D) -> zero_kernels::Result<Vec<f32>> {
//!     let (compute, comm) = (dev.stream("compute")?, dev.stream("comm")?);
//!     let mut a = dev.alloc::<f32>(4, "a")?;
//!     let mut b = dev.alloc::<f32>(4, "b")?;
//!     dev.upload(&compute, &[1.0, 2.0, 3.0, 4.0], a.view_mut())?;
//!     let ready = dev.record(&compute)?;
//!     dev.wait_event(&comm, &ready)?; // without this, SimDevice reports a hazard
//!     dev.copy(&comm, a.view(), b.view_mut())?;
//!     dev.accumulate(&comm, b.view_mut(), a.view())?;
//!     let mut out = vec![0.0; 4];
//!     dev.download(&comm, b.view(), &mut out)?;
//!     Ok(out)
//! }
//! assert_eq!(scaled_sum(&HostDevice::new()).unwrap(), [2.0, 4.0, 6.0, 8.0]);
//! assert_eq!(scaled_sum(&SimDevice::new(7)).unwrap(), [2.0, 4.0, 6.0, 8.0]);
//! ```

mod buffer;
pub(crate) mod check;
mod cpu;
mod float_buf;
mod host;
mod populate;
pub(crate) mod release;
mod sim;
mod staging;
#[cfg(test)]
mod tests;

use std::fmt::Debug;

pub use crate::nn::{AttnShape, MatLayout, RopeShape};
pub use buffer::{Access, Buffer, Location, View, ViewMut};
pub use cpu::{CpuBuffer, CpuEvent, CpuStream};
pub use float_buf::{same_type, same_type_mut, FloatBuffer, FloatView, FloatViewMut};
pub use host::HostDevice;
pub use release::StagedOverlap;
pub use sim::SimDevice;
pub use staging::StagingMemory;

/// Keeps a buffer's allocation alive while work that holds its address is in flight
/// ([`Buffer::retain`]).
pub type Retained = Box<dyn std::any::Any>;

/// Host work that was started and finishes later: a non-blocking collective, as a device
/// sees it ([`Device::host_task_started`]).
pub trait HostWork {
    /// True once finished. A poll: it drives the transport's progress (`MPI_Test`).
    fn test(&mut self) -> Result<bool>;
    /// Block until finished.
    fn wait(&mut self) -> Result<()>;
}

/// Time accounting of started host work ([`Device::overlap_stats`]); subtract two
/// snapshots for one step's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OverlapStats {
    /// Pieces of work started.
    pub tasks: u64,
    /// Seconds the host was held by them: inside the start calls, and blocked waiting
    /// for them to finish. The communication that compute did not hide.
    pub exposed_seconds: f64,
    /// Seconds they were running: the start calls, plus from each start until the host
    /// saw it finished. The host looks between the ops it runs, so this can exceed the
    /// transport's own time by up to one op.
    pub total_seconds: f64,
}

impl OverlapStats {
    /// The share of the communication time that ran behind compute,
    /// 1 - exposed / total; `None` when nothing was started.
    pub fn hidden_fraction(&self) -> Option<f64> {
        (self.total_seconds > 0.0).then(|| 1.0 - self.exposed_seconds / self.total_seconds)
    }
}

impl std::ops::Sub for OverlapStats {
    type Output = OverlapStats;
    fn sub(self, earlier: OverlapStats) -> OverlapStats {
        OverlapStats {
            tasks: self.tasks.saturating_sub(earlier.tasks),
            exposed_seconds: (self.exposed_seconds - earlier.exposed_seconds).max(0.0),
            total_seconds: (self.total_seconds - earlier.total_seconds).max(0.0),
        }
    }
}

use crate::adamw::{AdamWHyper, AdamWSegment};
use crate::dtype::Element;
use crate::error::KernelError;
use crate::float::Float;
pub use crate::nn::Scalar;

/// Result of a device call.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// A read view of a buffer of device `D`.
pub type DView<'a, D, T> = View<'a, <D as Device>::Buf<T>>;
/// A write view of a buffer of device `D`.
pub type DViewMut<'a, D, T> = ViewMut<'a, <D as Device>::Buf<T>>;

/// `C = alpha * A B + beta * C` on strided views (see [`MatLayout`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatMul<F> {
    /// Scale of the product.
    pub alpha: F,
    /// Scale of C's previous contents (0: C is only written).
    pub beta: F,
    /// Layout of A in its view.
    pub a: MatLayout,
    /// Layout of B in its view.
    pub b: MatLayout,
    /// Layout of C in its view.
    pub c: MatLayout,
}

/// One AdamW step's constants for [`Device::adamw`] (see [`crate::adamw`]).
#[derive(Clone, Debug)]
pub struct AdamWStep<'a> {
    /// Parameter groups (lr, betas, eps, weight decay).
    pub groups: &'a [AdamWHyper],
    /// Disjoint ranges of the views with their group and decay flag.
    pub segments: &'a [AdamWSegment],
    /// Adam's step counter, from 1.
    pub t: u64,
    /// Multiplier on the gradient (1/loss scale x clip coefficient).
    pub grad_scale: f32,
}

/// The f32 optimizer state AdamW updates in place.
#[derive(Debug)]
pub struct AdamWViews<'a, D: Device + ?Sized> {
    /// fp32 master weights (in fp32 training: the parameters themselves).
    pub master: DViewMut<'a, D, f32>,
    /// First moment.
    pub m: DViewMut<'a, D, f32>,
    /// Second moment.
    pub v: DViewMut<'a, D, f32>,
}

/// The outputs of a layer norm's forward.
#[derive(Debug)]
pub struct LayerNormOut<'a, D: Device + ?Sized, F: Scalar> {
    /// Normalised, scaled and shifted rows.
    pub out: DViewMut<'a, D, F>,
    /// Mean of each row.
    pub mean: DViewMut<'a, D, F>,
    /// 1 / sqrt(var + eps) of each row.
    pub rstd: DViewMut<'a, D, F>,
}

/// The parameter gradients of a layer norm (added into).
#[derive(Debug)]
pub struct LayerNormGrads<'a, D: Device + ?Sized, F: Scalar> {
    /// Gradient of the input (added into).
    pub dx: DViewMut<'a, D, F>,
    /// Gradient of the scale (added into).
    pub dw: DViewMut<'a, D, F>,
    /// Gradient of the shift (added into).
    pub db: DViewMut<'a, D, F>,
}

/// What a layer norm's backward reads.
#[derive(Debug)]
pub struct LayerNormSaved<'a, D: Device + ?Sized, F: Scalar> {
    /// The forward's input.
    pub x: DView<'a, D, F>,
    /// The scale.
    pub w: DView<'a, D, F>,
    /// Saved row means.
    pub mean: DView<'a, D, F>,
    /// Saved row 1/std.
    pub rstd: DView<'a, D, F>,
}

/// A device: buffers, streams, events, copies and kernels. See the module documentation
/// for the ordering rules every implementation follows.
///
/// Every op checks its views' lengths against each other and returns
/// [`KernelError::LengthMismatch`] (or another typed error) instead of panicking.
pub trait Device {
    /// A typed buffer of this device.
    type Buf<T: Element>: Buffer<Elem = T> + 'static;
    /// A queue of work.
    type Stream: Clone + Debug;
    /// A point in a stream's queue that other streams and the host can wait for.
    type Event: Clone + Debug + 'static;

    /// What this device is, for logs ("host (avx512, 1 thread)", "simulated, seed 7").
    fn describe(&self) -> String;
    /// Where its buffers live.
    fn location(&self) -> Location;

    /// From now on, matrix products of f32 buffers round their operands to bf16 and sum
    /// in f32 (`on`), or take f32 operands exactly (`!on`): what bf16 training computes
    /// with (tensor cores on a GPU, AVX-512 BF16 on a CPU; the engine sets it from its
    /// precision). [`Device::matmul`] changes, and on the host also the products inside
    /// attention (a GPU's attention kernels stay f32); f64 products stay exact. Returns
    /// false where the device has no such mode (its products stay f32).
    fn set_bf16_products(&self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// `len` zeros of `T`, named `name` in messages.
    fn alloc<T: Element>(&self, len: usize, name: &str) -> Result<Self::Buf<T>>;
    /// A new stream named `name` (in messages).
    fn stream(&self, name: &str) -> Result<Self::Stream>;
    /// An event completing when everything queued on `stream` so far has run.
    fn record(&self, stream: &Self::Stream) -> Result<Self::Event>;
    /// Work queued on `stream` after this call waits for `event`.
    fn wait_event(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;
    /// The host waits for `event`.
    fn sync_event(&self, event: &Self::Event) -> Result<()>;
    /// The host waits for every stream.
    fn synchronize(&self) -> Result<()>;
    /// Run `task` on the host, ordered on `stream`: after the work queued there before,
    /// before the work queued after, as if it were a kernel that `reads` and `writes`
    /// these views (the declaration is what a checking device checks). Collectives of a
    /// host transport (MPI, thread ranks) run this way; the host blocks until `task`
    /// returns. Work on other streams is not ordered by it: they must wait for an event
    /// recorded on `stream` after this call.
    fn host_task<R>(
        &self,
        stream: &Self::Stream,
        name: &'static str,
        reads: &[Access<'_>],
        writes: &[Access<'_>],
        task: impl FnOnce() -> R,
    ) -> Result<R>;

    /// As [`Device::host_task`], for work that `start` begins on the host and that finishes
    /// later (a non-blocking collective). The device may return before it has finished;
    /// it is still ordered on `stream` like a kernel: work queued there afterwards, and
    /// events recorded there, come after it. `retain` ([`Buffer::retain`] of the buffers
    /// behind `reads` and `writes`) keeps them allocated until then. [`HostDevice`] and
    /// [`SimDevice`] with overlap on poll the work between the ops they run and defer
    /// `stream`'s later ops until it is done, so compute on other streams runs meanwhile
    /// (the CPU's progress mechanism); a CUDA device with [`StagedOverlap::Overlap`]
    /// queues a wait on `stream` for a word the host sets once the work has finished
    /// (`release.rs`). Overlap off, a CUDA device by default, and this default wait for
    /// it here.
    fn host_task_started(
        &self,
        stream: &Self::Stream,
        name: &'static str,
        reads: &[Access<'_>],
        writes: &[Access<'_>],
        retain: Vec<Retained>,
        start: impl FnOnce() -> Result<Box<dyn HostWork>>,
    ) -> Result<()> {
        drop(retain);
        self.host_task(stream, name, reads, writes, || start()?.wait())?
    }

    /// The native handle of `stream` where the device has one (a CUDA `CUstream`'s
    /// address), for a transport that queues its own GPU work on it (NCCL); `None` on
    /// the CPU devices. A device that returns `Some` promises that a buffer dropped
    /// while such work is queued keeps its memory until that work has run (the CUDA
    /// pool reuses a dropped buffer only after a device-wide synchronisation), since the
    /// transport's work is invisible to the device's own bookkeeping.
    fn native_stream(&self, _stream: &Self::Stream) -> Option<u64> {
        None
    }

    /// How much of the started host work ([`Device::host_task_started`]) ran behind other
    /// work, so far ([`HostDevice`], [`SimDevice`]: with overlap off, exposed = total; a
    /// CUDA device counts only the work it overlapped, [`StagedOverlap::Overlap`]).
    /// Zero on a device that does not time it (this default).
    fn overlap_stats(&self) -> OverlapStats {
        OverlapStats::default()
    }

    /// Copy host data into `dst` (same length), in `stream`'s order; `src` has been read
    /// when this returns.
    fn upload<T: Element>(
        &self,
        stream: &Self::Stream,
        src: &[T],
        dst: DViewMut<'_, Self, T>,
    ) -> Result<()>;
    /// Host memory of at least `bytes` for copies between this device and a host-only
    /// transport (zero-comm's host staging): page-locked on a GPU, so that
    /// [`Device::upload_from_staging`] is an asynchronous DMA; plain memory on the CPU
    /// devices (this default).
    fn alloc_staging(&self, bytes: usize) -> Result<StagingMemory> {
        Ok(StagingMemory::plain(bytes))
    }

    /// Copy `dst.len()` elements from staging memory at `src` into `dst` when `stream`
    /// reaches the copy: unlike [`Device::upload`], `src` is read then, not now, so the
    /// host work that fills it (a collective started on `stream` before this call,
    /// [`Device::host_task_started`]) may still be running. `keep` holds the memory
    /// allocated until the copy has run.
    ///
    /// # Safety
    /// `src` is aligned for `T` and holds `dst.len()` elements inside the memory `keep`
    /// keeps allocated, and nothing but work ordered before this copy on `stream` writes
    /// them until the copy has run (an event recorded on `stream` afterwards is complete).
    unsafe fn upload_from_staging<T: Element>(
        &self,
        stream: &Self::Stream,
        src: *const T,
        dst: DViewMut<'_, Self, T>,
        keep: Retained,
    ) -> Result<()>;

    /// Copy `src` to host memory (same length) after the work queued on `stream`; the
    /// host waits for it.
    fn download<T: Element>(
        &self,
        stream: &Self::Stream,
        src: DView<'_, Self, T>,
        dst: &mut [T],
    ) -> Result<()>;
    /// Set every element of `dst` to `value`.
    fn fill<T: Element>(
        &self,
        stream: &Self::Stream,
        dst: DViewMut<'_, Self, T>,
        value: T,
    ) -> Result<()>;
    /// `dst = src` (same length).
    fn copy<T: Element>(
        &self,
        stream: &Self::Stream,
        src: DView<'_, Self, T>,
        dst: DViewMut<'_, Self, T>,
    ) -> Result<()>;
    /// `dst = src` converted: exact widening, round-to-nearest-even narrowing, or a copy.
    fn cast<S: Float, T: Float>(
        &self,
        stream: &Self::Stream,
        src: DView<'_, Self, S>,
        dst: DViewMut<'_, Self, T>,
    ) -> Result<()>;
    /// `dst += src`, one rounding to `T` per element.
    fn accumulate<S: Float, T: Float>(
        &self,
        stream: &Self::Stream,
        dst: DViewMut<'_, Self, T>,
        src: DView<'_, Self, S>,
    ) -> Result<()>;
    /// Block-wise symmetric int8 quantization ([`crate::quant`]): `codes` gets one code
    /// per value of `src` (the two's-complement byte of an i8), `scales` one f32 per block
    /// of `block` values (the last block may be shorter).
    fn quantize_int8<T: Float>(
        &self,
        stream: &Self::Stream,
        src: DView<'_, Self, T>,
        block: usize,
        codes: DViewMut<'_, Self, u8>,
        scales: DViewMut<'_, Self, f32>,
    ) -> Result<()>;
    /// Read back what [`Device::quantize_int8`] made: `dst[i] = code[i] x scale[i /
    /// block]`, rounded to `T`.
    fn dequantize_int8<T: Float>(
        &self,
        stream: &Self::Stream,
        codes: DView<'_, Self, u8>,
        scales: DView<'_, Self, f32>,
        block: usize,
        dst: DViewMut<'_, Self, T>,
    ) -> Result<()>;
    /// Block-wise symmetric int4 quantization ([`crate::quant::quantize_int4`]): `codes`
    /// gets two codes per byte ([`crate::quant::code_bytes_int4`] bytes; value 2i in the
    /// low nibble of byte i, 2i + 1 in the high one), `scales` one f32 per block of `block`
    /// values (even: a block starts on a byte; the last block may be shorter).
    fn quantize_int4<T: Float>(
        &self,
        stream: &Self::Stream,
        src: DView<'_, Self, T>,
        block: usize,
        codes: DViewMut<'_, Self, u8>,
        scales: DViewMut<'_, Self, f32>,
    ) -> Result<()>;
    /// Read back what [`Device::quantize_int4`] made: `dst[i] = code(i) x scale[i /
    /// block]`, rounded to `T`.
    fn dequantize_int4<T: Float>(
        &self,
        stream: &Self::Stream,
        codes: DView<'_, Self, u8>,
        scales: DView<'_, Self, f32>,
        block: usize,
        dst: DViewMut<'_, Self, T>,
    ) -> Result<()>;
    /// Gradient statistics of `grad` times `scale` ([`crate::gradstats::stats`]):
    /// `out[0]` = the sum of squares (f64, fixed order), `out[1]` = 1 if some element is
    /// inf/NaN else 0. `out` has 2 elements.
    fn grad_stats<G: Float>(
        &self,
        stream: &Self::Stream,
        grad: DView<'_, Self, G>,
        scale: f32,
        out: DViewMut<'_, Self, f64>,
    ) -> Result<()>;
    /// One fused AdamW step over a range of parameters ([`crate::adamw::step`]); `param`
    /// (16-bit only) receives the rounded new weights.
    fn adamw<G: Float, P: Float>(
        &self,
        stream: &Self::Stream,
        step: &AdamWStep<'_>,
        grad: DView<'_, Self, G>,
        state: AdamWViews<'_, Self>,
        param: Option<DViewMut<'_, Self, P>>,
    ) -> Result<()>;

    // ---- model ops (crate::nn documents the math of each) ----

    /// `C = alpha * A B + beta * C`.
    fn matmul<F: Scalar>(
        &self,
        stream: &Self::Stream,
        mm: MatMul<F>,
        a: DView<'_, Self, F>,
        b: DView<'_, Self, F>,
        c: DViewMut<'_, Self, F>,
    ) -> Result<()>;
    /// Layer norm over rows of `width` ([`crate::nn::layernorm_forward`]).
    fn layernorm_forward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        out: LayerNormOut<'_, Self, F>,
        x: DView<'_, Self, F>,
        w: DView<'_, Self, F>,
        b: DView<'_, Self, F>,
        width: usize,
    ) -> Result<()>;
    /// Layer norm backward, adding into the gradients ([`crate::nn::layernorm_backward`]).
    fn layernorm_backward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        grads: LayerNormGrads<'_, Self, F>,
        dout: DView<'_, Self, F>,
        saved: LayerNormSaved<'_, Self, F>,
        width: usize,
    ) -> Result<()>;
    /// `out = gelu(x)` (tanh approximation).
    fn gelu_forward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        out: DViewMut<'_, Self, F>,
        x: DView<'_, Self, F>,
    ) -> Result<()>;
    /// `d *= gelu'(x)`, in place.
    fn gelu_backward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        d: DViewMut<'_, Self, F>,
        x: DView<'_, Self, F>,
    ) -> Result<()>;
    /// Causal multi-head attention over packed `qkv` `[B,T,3C]`: writes `y` `[B,T,C]` and
    /// the probabilities `p` `[B,H,T,T]` the backward needs.
    fn attention_forward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        y: DViewMut<'_, Self, F>,
        p: DViewMut<'_, Self, F>,
        qkv: DView<'_, Self, F>,
        shape: AttnShape,
    ) -> Result<()>;
    /// Attention backward: writes `dqkv` from `dy`; `scratch` holds at least T*T.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        dqkv: DViewMut<'_, Self, F>,
        scratch: DViewMut<'_, Self, F>,
        dy: DView<'_, Self, F>,
        p: DView<'_, Self, F>,
        qkv: DView<'_, Self, F>,
        shape: AttnShape,
    ) -> Result<()>;
    /// Rows of `v` logits become probabilities in place; `losses[row]` = the row's
    /// cross-entropy against `targets[row]` (every target must be < v: an error otherwise).
    fn softmax_xent_forward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        logits: DViewMut<'_, Self, F>,
        losses: DViewMut<'_, Self, F>,
        targets: DView<'_, Self, u32>,
        v: usize,
    ) -> Result<()>;
    /// Probabilities become `(p - onehot(target)) * scale` in place: d(scale x loss)/dlogits.
    fn softmax_xent_backward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        probs: DViewMut<'_, Self, F>,
        targets: DView<'_, Self, u32>,
        v: usize,
        scale: F,
    ) -> Result<()>;
    /// `dst[0]` = the mean of `src` (summed in f64, in order).
    fn mean<F: Scalar>(
        &self,
        stream: &Self::Stream,
        dst: DViewMut<'_, Self, F>,
        src: DView<'_, Self, F>,
    ) -> Result<()>;
    /// Every row of `out` (width `row.len()`) := `row`.
    fn fill_rows<F: Scalar>(
        &self,
        stream: &Self::Stream,
        out: DViewMut<'_, Self, F>,
        row: DView<'_, Self, F>,
    ) -> Result<()>;
    /// Every row of `out` += `row`.
    fn add_rows<F: Scalar>(
        &self,
        stream: &Self::Stream,
        out: DViewMut<'_, Self, F>,
        row: DView<'_, Self, F>,
    ) -> Result<()>;
    /// `db += column sums of dout` (width `db.len()`).
    fn bias_backward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        db: DViewMut<'_, Self, F>,
        dout: DView<'_, Self, F>,
    ) -> Result<()>;
    /// `out[i] = table[ids[i]]`, rows of `width` (every id must be a row of the table).
    fn gather_rows<F: Scalar>(
        &self,
        stream: &Self::Stream,
        out: DViewMut<'_, Self, F>,
        ids: DView<'_, Self, u32>,
        table: DView<'_, Self, F>,
        width: usize,
    ) -> Result<()>;
    /// `dtable[ids[i]] += dout[i]`, in i order.
    fn scatter_add_rows<F: Scalar>(
        &self,
        stream: &Self::Stream,
        dtable: DViewMut<'_, Self, F>,
        ids: DView<'_, Self, u32>,
        dout: DView<'_, Self, F>,
        width: usize,
    ) -> Result<()>;
    /// `out[i] = block[ids[i] - first]` for the ids in `first .. first + block rows`; the
    /// other rows of `out` are left alone (a lookup in one row block of a split table).
    fn gather_rows_block<F: Scalar>(
        &self,
        stream: &Self::Stream,
        out: DViewMut<'_, Self, F>,
        ids: DView<'_, Self, u32>,
        block: DView<'_, Self, F>,
        first: usize,
        width: usize,
    ) -> Result<()>;
    /// `dblock[ids[i] - first] += dout[i]` for the ids in the block, in i order.
    fn scatter_add_rows_block<F: Scalar>(
        &self,
        stream: &Self::Stream,
        dblock: DViewMut<'_, Self, F>,
        ids: DView<'_, Self, u32>,
        dout: DView<'_, Self, F>,
        first: usize,
        width: usize,
    ) -> Result<()>;
    /// `out[i] += table[i % period]` (positional rows).
    fn add_periodic_rows<F: Scalar>(
        &self,
        stream: &Self::Stream,
        out: DViewMut<'_, Self, F>,
        table: DView<'_, Self, F>,
        period: usize,
        width: usize,
    ) -> Result<()>;
    /// `dtable[i % period] += dout[i]`, in i order.
    fn periodic_rows_backward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        dtable: DViewMut<'_, Self, F>,
        dout: DView<'_, Self, F>,
        period: usize,
        width: usize,
    ) -> Result<()>;
    /// Per sequence of `seq_len` rows: `out[t] = x[t-1]`, `out[0] = 0` (causal shift).
    fn shift_rows_forward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        out: DViewMut<'_, Self, F>,
        x: DView<'_, Self, F>,
        seq_len: usize,
        width: usize,
    ) -> Result<()>;
    /// `dx[t-1] += dout[t]` per sequence (adds).
    fn shift_rows_backward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        dx: DViewMut<'_, Self, F>,
        dout: DView<'_, Self, F>,
        seq_len: usize,
        width: usize,
    ) -> Result<()>;
    /// RMSNorm over rows of `width` ([`crate::nn::rmsnorm_forward`]): writes `out` and the
    /// rows' `rstd`.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_forward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        out: DViewMut<'_, Self, F>,
        rstd: DViewMut<'_, Self, F>,
        x: DView<'_, Self, F>,
        w: DView<'_, Self, F>,
        width: usize,
        eps: f64,
    ) -> Result<()>;
    /// RMSNorm backward, adding into `dx` and `dw` ([`crate::nn::rmsnorm_backward`]).
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        dx: DViewMut<'_, Self, F>,
        dw: DViewMut<'_, Self, F>,
        dout: DView<'_, Self, F>,
        x: DView<'_, Self, F>,
        w: DView<'_, Self, F>,
        rstd: DView<'_, Self, F>,
        width: usize,
    ) -> Result<()>;
    /// Rotary embeddings and GQA's repeated key/value heads: writes the packed `qkv`
    /// `[B,T,3C]` of [`Device::attention_forward`] from `q`, `k`, `v`
    /// ([`crate::nn::rope_gqa_forward`]).
    fn rope_gqa_forward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        qkv: DViewMut<'_, Self, F>,
        q: DView<'_, Self, F>,
        k: DView<'_, Self, F>,
        v: DView<'_, Self, F>,
        shape: RopeShape,
    ) -> Result<()>;
    /// Its backward: writes `dq`, `dk`, `dv` from `dqkv`, the repeated heads' gradients
    /// summed ([`crate::nn::rope_gqa_backward`]).
    #[allow(clippy::too_many_arguments)]
    fn rope_gqa_backward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        dq: DViewMut<'_, Self, F>,
        dk: DViewMut<'_, Self, F>,
        dv: DViewMut<'_, Self, F>,
        dqkv: DView<'_, Self, F>,
        shape: RopeShape,
    ) -> Result<()>;
    /// `out = silu(a) * b` ([`crate::nn::swiglu_forward`]).
    fn swiglu_forward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        out: DViewMut<'_, Self, F>,
        a: DView<'_, Self, F>,
        b: DView<'_, Self, F>,
    ) -> Result<()>;
    /// Writes `da`, `db` from `dout` ([`crate::nn::swiglu_backward`]).
    #[allow(clippy::too_many_arguments)]
    fn swiglu_backward<F: Scalar>(
        &self,
        stream: &Self::Stream,
        da: DViewMut<'_, Self, F>,
        db: DViewMut<'_, Self, F>,
        dout: DView<'_, Self, F>,
        a: DView<'_, Self, F>,
        b: DView<'_, Self, F>,
    ) -> Result<()>;
    /// `dst += src` elementwise.
    fn add<F: Scalar>(
        &self,
        stream: &Self::Stream,
        dst: DViewMut<'_, Self, F>,
        src: DView<'_, Self, F>,
    ) -> Result<()>;
    /// `dst *= a` elementwise.
    fn scale<F: Scalar>(
        &self,
        stream: &Self::Stream,
        dst: DViewMut<'_, Self, F>,
        a: F,
    ) -> Result<()>;
}
