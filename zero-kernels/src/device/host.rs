//! The CPU as a device, eager: every op runs on the calling thread when it is queued, so
//! streams and events order nothing (everything is already in program order) and cost
//! nothing. The kernels are this crate's vectorised CPU kernels ([`Exec`]: instruction
//! set picked at run time, threads opt-in).

use std::cell::Cell;

use super::cpu::{CpuEvent, CpuOp, CpuQueue, CpuStream, Ids};
use super::{Access, Result};
use crate::isa::Exec;
use crate::nn::Gemm;

/// The CPU, running every op when it is queued.
#[derive(Debug)]
pub struct HostDevice {
    exec: Exec,
    gemm: Gemm,
    ids: Ids,
    streams: Cell<usize>,
    /// f32 products with bf16 operands ([`super::Device::set_bf16_products`]).
    bf16_products: Cell<bool>,
}

impl Default for HostDevice {
    fn default() -> Self {
        HostDevice::new()
    }
}

impl HostDevice {
    /// The best instruction set of this CPU, one thread (under MPI every rank owns a core).
    pub fn new() -> Self {
        HostDevice::with_exec(Exec::default(), 1)
    }

    /// The best instruction set of this CPU, every op on `threads` threads (0 is taken as
    /// 1): matrix products split C's rows, attention its sequences, the row-wise ops
    /// their rows, the vectorised kernels their chunks. No result depends on the count.
    pub fn with_threads(threads: usize) -> Self {
        let threads = threads.max(1);
        let exec = Exec::default();
        let exec = exec.with_threads(threads).unwrap_or(exec);
        HostDevice::with_exec(exec, threads)
    }

    /// Kernels as `exec` says, matrix products on `gemm_threads` threads.
    pub fn with_exec(exec: Exec, gemm_threads: usize) -> Self {
        HostDevice {
            exec,
            gemm: Gemm::new(gemm_threads),
            ids: Ids::default(),
            streams: Cell::new(0),
            bf16_products: Cell::new(false),
        }
    }

    /// The kernels' execution settings.
    pub fn exec(&self) -> &Exec {
        &self.exec
    }
}

impl CpuQueue for HostDevice {
    fn exec(&self) -> &Exec {
        &self.exec
    }
    fn gemm(&self) -> &Gemm {
        &self.gemm
    }
    fn next_id(&self) -> u64 {
        self.ids.next()
    }
    fn describe_queue(&self) -> String {
        let products = if self.bf16_products.get() {
            match crate::nn::gemm_bf16::Bf16Kernel::detect() {
                crate::nn::gemm_bf16::Bf16Kernel::Avx512Bf16 => ", bf16 products (avx512bf16)",
                crate::nn::gemm_bf16::Bf16Kernel::Portable => ", bf16 products (portable)",
                crate::nn::gemm_bf16::Bf16Kernel::Amx => ", bf16 products (amx)",
            }
        } else {
            ""
        };
        format!(
            "host ({}, {} thread(s){products})",
            self.exec.isa(),
            self.exec.threads().max(self.gemm.threads())
        )
    }
    fn bf16_products(&self) -> bool {
        self.bf16_products.get()
    }
    fn set_bf16_products(&self, on: bool) -> bool {
        self.bf16_products.set(on);
        true
    }
    fn new_stream(&self, name: &str) -> Result<CpuStream> {
        let index = self.streams.get();
        self.streams.set(index + 1);
        Ok(CpuStream {
            index,
            name: name.into(),
        })
    }
    fn submit(&self, _stream: &CpuStream, op: CpuOp) -> Result<()> {
        (op.run)()
    }
    fn record_event(&self, _stream: &CpuStream) -> Result<CpuEvent> {
        Ok(CpuEvent::default())
    }
    fn wait_for(&self, _stream: &CpuStream, _event: &CpuEvent) -> Result<()> {
        Ok(())
    }
    fn sync(&self, _event: &CpuEvent) -> Result<()> {
        Ok(())
    }
    fn sync_all(&self) -> Result<()> {
        Ok(())
    }
    fn run_host_task(
        &self,
        _stream: &CpuStream,
        _name: &'static str,
        _reads: &[Access<'_>],
        _writes: &[Access<'_>],
        task: &mut dyn FnMut(),
    ) -> Result<()> {
        task();
        Ok(())
    }
    fn host_read(
        &self,
        _stream: &CpuStream,
        _name: &'static str,
        _read: &Access<'_>,
    ) -> Result<()> {
        Ok(())
    }
}
