//! Quantized parameter gathers (ZeRO++'s qwZ, Wang et al. 2023, section 4.1;
//! `zero.quantize_weights`): a rank's shard of a unit is quantized block-wise to int8
//! codes and one f32 scale per block (`zero_kernels::quant`), the codes and the scales
//! are all-gathered, and every rank's block is read back into the gathered unit. Stage 3
//! does this for the gathers before each layer, stages 1/2 (16-bit training) for the
//! after-step gather of the updated parameters. Every rank, the shard's owner included,
//! reads the same codes back, so all compute with the same rounded weights; the master
//! weights and the optimizer state are never rounded.
//!
//! Everything runs on the comm stream, one unit at a time, so one set of staging buffers,
//! sized by the plan for the largest unit, serves every gather.

use zero_comm::{on_stream, Communicator};
use zero_kernels::device::{Buffer, DView, DViewMut, Device};
use zero_kernels::quant::scale_count;
use zero_kernels::Float;

use super::{Core, EngineError};

/// The staging buffers of quantized gathers.
pub(crate) struct QuantStaging<D: Device> {
    /// Values per scale.
    pub block: usize,
    /// This rank's shard as codes (bytes of i8).
    pub send_codes: D::Buf<u8>,
    /// The shard's scales.
    pub send_scales: D::Buf<f32>,
    /// Every rank's codes, in rank order.
    pub recv_codes: D::Buf<u8>,
    /// Every rank's scales, in rank order.
    pub recv_scales: D::Buf<f32>,
}

impl<D: Device> QuantStaging<D> {
    /// Quantize this rank's `shard` and all-gather its codes and scales (comm stream).
    pub fn send<P: Float, C: Communicator>(
        &mut self,
        core: &Core<'_, D, C>,
        shard: DView<'_, D, P>,
    ) -> Result<(), EngineError> {
        let (dev, comm, n) = (core.dev, &core.streams.comm, core.layout.world);
        let (s, b) = (shard.len(), self.block);
        let ns = scale_count(s, b);
        let (codes, scales) = (
            self.send_codes.slice_mut(0..s),
            self.send_scales.slice_mut(0..ns),
        );
        dev.quantize_int8(comm, shard, b, codes, scales)?;
        let codes = self.send_codes.slice(0..s);
        on_stream::all_gather(
            core.comm,
            dev,
            comm,
            codes,
            self.recv_codes.slice_mut(0..n * s),
        )?;
        let scales = self.send_scales.slice(0..ns);
        let all = self.recv_scales.slice_mut(0..n * ns);
        on_stream::all_gather(core.comm, dev, comm, scales, all)?;
        Ok(())
    }

    /// Read every rank's codes of shard length `s` back into the unit `dst` (N s values).
    pub fn receive<P: Float, C: Communicator>(
        &self,
        core: &Core<'_, D, C>,
        s: usize,
        mut dst: DViewMut<'_, D, P>,
    ) -> Result<(), EngineError> {
        let (dev, comm, n, b) = (core.dev, &core.streams.comm, core.layout.world, self.block);
        let ns = scale_count(s, b);
        if s.is_multiple_of(b) {
            // Shards of whole blocks: the gathered codes are one run of blocks.
            let (codes, scales) = (
                self.recv_codes.slice(0..n * s),
                self.recv_scales.slice(0..n * ns),
            );
            dev.dequantize_int8(comm, codes, scales, b, dst)?;
            return Ok(());
        }
        for r in 0..n {
            let codes = self.recv_codes.slice(r * s..(r + 1) * s);
            let scales = self.recv_scales.slice(r * ns..(r + 1) * ns);
            let out = dst.reborrow().slice_mut(r * s..(r + 1) * s);
            dev.dequantize_int8(comm, codes, scales, b, out)?;
        }
        Ok(())
    }
}
