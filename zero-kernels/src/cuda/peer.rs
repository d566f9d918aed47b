//! Data movement between thread ranks that share one GPU (zero-comm's `LocalComm` over
//! device buffers): device-to-device copies and the rank-order fold kernels of `peer.cu`,
//! on a stream of the calling rank's own.
//!
//! All thread ranks of a process use the GPU's primary context, so a device address one
//! rank publishes is valid in every other rank's thread. A [`PeerMover`] is opened per
//! rank thread; it loads only the `peer` kernels (not the whole [`super::CudaDevice`]) and
//! queues on its own non-blocking stream, so a collective never waits for, nor delays,
//! the rank's compute streams; the caller orders them (the stream-ordered collectives
//! run as host tasks that wait for their stream first).
//!
//! [`twin`] is the fold in Rust, element by element in the kernel's order: zero-comm tests
//! it against its host fold, and the GPU check compares the kernels with it.

use super::CudaDevice;
use crate::cast::reference::{
    bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits,
};
use crate::dtype::DType;
use crate::error::KernelError;
use crate::ptx::{peer_fold_entry, SOURCES};
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

/// The reduction a fold computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fold {
    /// Sum in rank order; a half type rounds after every step (`HalfSum::Op`).
    Sum,
    /// Half types only: sum in f32 in rank order, round once (`HalfSum::Upcast`).
    SumUpcast,
    /// Maximum: NaN first, then the first maximum in rank order.
    Max,
}

impl Fold {
    /// The name in kernel entries (`fold_{name}_{dtype}`).
    pub fn name(self) -> &'static str {
        match self {
            Fold::Sum => "sum",
            Fold::SumUpcast => "sum_upcast",
            Fold::Max => "max",
        }
    }

    /// The kernel entry for `dtype`, or why there is none.
    pub fn entry(self, dtype: DType) -> Result<String, KernelError> {
        if self == Fold::SumUpcast && !dtype.is_half() {
            return Err(KernelError::BadShape {
                op: "peer fold",
                detail: format!("an upcast sum is for bf16/f16, not {dtype}"),
            });
        }
        Ok(peer_fold_entry(dtype, self.name()))
    }
}

/// Device scratch, grown on demand and kept (in u64 words: aligned for every dtype).
#[derive(Default)]
struct Scratch(Option<CudaSlice<u64>>);

impl Scratch {
    /// The address of at least `words` words on `stream` (valid until the next call).
    fn get(&mut self, stream: &Arc<CudaStream>, words: usize) -> Result<u64, KernelError> {
        let words = words.max(1);
        if self.0.as_ref().is_none_or(|s| s.len() < words) {
            // Grow geometrically: collectives of growing sizes reallocate O(log n) times.
            let have = self.0.as_ref().map_or(0, |s| s.len());
            self.0 = None; // freed (stream-ordered) before the new one is allocated
            self.0 = Some(stream.alloc_zeros::<u64>(words.max(have * 2))?);
        }
        let s = self
            .0
            .as_ref()
            .ok_or_else(|| KernelError::Cuda("scratch".into()))?;
        let (ptr, _record) = s.device_ptr(stream);
        Ok(ptr)
    }
}

/// One rank thread's mover: the primary context of its GPU, a stream of its own, the fold
/// kernels and a little scratch. Used from the thread that opened it (`Send`, not `Sync`).
pub struct PeerMover {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: HashMap<&'static str, CudaFunction>,
    /// The source address array a fold kernel reads.
    ptrs: RefCell<Scratch>,
    /// Temporary outputs (in-place reductions).
    tmp: RefCell<Scratch>,
}

impl std::fmt::Debug for PeerMover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerMover")
            .field("ordinal", &self.ctx.ordinal())
            .finish()
    }
}

impl PeerMover {
    /// Open GPU `ordinal` for this thread: [`KernelError::NoCudaDriver`] without a driver
    /// (checked before any cudarc call, which would panic).
    pub fn new(ordinal: usize) -> Result<PeerMover, KernelError> {
        let count = CudaDevice::count()?;
        if ordinal >= count {
            return Err(KernelError::NoSuchDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.new_stream()?;
        let src = SOURCES
            .iter()
            .find(|s| s.name == "peer")
            .ok_or_else(|| KernelError::MissingKernel("peer module".to_string()))?;
        let module = ctx.load_module(Ptx::from_src(src.ptx))?;
        let mut kernels = HashMap::new();
        for name in src.entries() {
            kernels.insert(name, module.load_function(name)?);
        }
        Ok(PeerMover {
            ctx,
            stream,
            kernels,
            ptrs: RefCell::default(),
            tmp: RefCell::default(),
        })
    }

    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// A device temporary of at least `bytes` bytes, 8-byte aligned, valid until the next
    /// call of `scratch` (the previous one may be freed, in this stream's order).
    pub fn scratch(&self, bytes: usize) -> Result<u64, KernelError> {
        self.tmp.borrow_mut().get(&self.stream, bytes.div_ceil(8))
    }

    /// Queue a copy of `bytes` bytes from `src` to `dst` (device addresses).
    ///
    /// # Safety
    /// Both ranges are device memory of this GPU, valid (and `dst` writable) until the
    /// copy has run ([`PeerMover::sync`]), and they do not overlap.
    pub unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), KernelError> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller's contract; the stream belongs to this context.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }?;
        Ok(())
    }

    /// Queue `dst[i] = fold over r of srcs[r][offset + i]` for `i < n`, in rank order
    /// (`peer.cu`; [`twin`] is the same in Rust). Elements are `dtype`'s.
    ///
    /// # Safety
    /// Every address in `srcs` holds `offset + n` elements of `dtype` and `dst` holds `n`,
    /// all device memory of this GPU, aligned for `dtype`, valid until the fold has run
    /// ([`PeerMover::sync`]), no source written meanwhile, and `dst` overlaps no source.
    pub unsafe fn fold(
        &self,
        dtype: DType,
        fold: Fold,
        dst: u64,
        srcs: &[u64],
        offset: usize,
        n: usize,
    ) -> Result<(), KernelError> {
        let entry = fold.entry(dtype)?;
        let f = self
            .kernels
            .get(entry.as_str())
            .ok_or_else(|| KernelError::MissingKernel(entry.clone()))?;
        if n == 0 || srcs.is_empty() {
            return Ok(());
        }
        let k = u32::try_from(srcs.len()).map_err(|_| KernelError::BadShape {
            op: "peer fold",
            detail: format!("{} sources", srcs.len()),
        })?;
        self.ctx.bind_to_thread()?;
        let table = self.ptrs.borrow_mut().get(&self.stream, srcs.len())?;
        // SAFETY: `table` holds at least `srcs.len()` words; from pageable memory the driver
        // stages `srcs` before returning, so the slice may go at once. The previous fold
        // that read the table has run (every collective syncs before returning, and this
        // stream runs in order anyway).
        unsafe { result::memcpy_htod_async(table, srcs, self.stream.cu_stream()) }?;
        let (off, n64) = (offset as u64, n as u64);
        let mut l = self.stream.launch_builder(f);
        l.arg(&dst).arg(&table).arg(&k).arg(&off).arg(&n64);
        // SAFETY: the kernel's signature is (T* dst, const u64* src, u32 k, u64 off, u64 n)
        // with T the entry's dtype; the caller guarantees the addresses and lengths.
        unsafe { l.launch(CudaDevice::elementwise(n)) }?;
        Ok(())
    }

    /// Wait until everything queued here has run (then no queued copy or fold reads or
    /// writes any buffer any more, also when this returns an error).
    pub fn sync(&self) -> Result<(), KernelError> {
        Ok(self.stream.synchronize()?)
    }
}

/// The fold kernels in Rust, element by element in the same order and with the same
/// element operations (`peer.cu`): `srcs[r]` holds at least `offset + n` elements of
/// `dtype` as little-endian bytes, `dst` `n`. For tests: zero-comm checks it against its
/// host fold, the GPU check checks the kernels against it.
pub fn twin(
    dtype: DType,
    fold: Fold,
    dst: &mut [u8],
    srcs: &[&[u8]],
    offset: usize,
    n: usize,
) -> Result<(), KernelError> {
    fold.entry(dtype)?;
    let es = dtype.size_bytes();
    let short = srcs.iter().any(|s| s.len() < (offset + n) * es);
    if dst.len() < n * es || short {
        return Err(KernelError::BadShape {
            op: "peer fold twin",
            detail: format!("buffers shorter than offset {offset} + {n} elements"),
        });
    }
    if srcs.is_empty() {
        return Ok(());
    }
    macro_rules! run {
        ($t:ty, $first:expr, $step:expr, $finish:expr) => {{
            const W: usize = std::mem::size_of::<$t>();
            let ld = |s: &[u8], i: usize| -> $t {
                let mut b = [0u8; W];
                b.copy_from_slice(&s[i * W..(i + 1) * W]);
                <$t>::from_le_bytes(b)
            };
            for i in 0..n {
                let mut acc = $first(ld(srcs[0], offset + i));
                for s in &srcs[1..] {
                    acc = $step(acc, ld(s, offset + i));
                }
                let out: $t = $finish(acc);
                dst[i * W..(i + 1) * W].copy_from_slice(&out.to_le_bytes());
            }
        }};
    }
    match (fold, dtype) {
        (Fold::Sum, DType::F32) => run!(u32, id, add_f32, id),
        (Fold::Sum, DType::F64) => run!(u64, id, add_f64, id),
        (Fold::Sum, DType::BF16) => run!(
            u16,
            id,
            |a, x| half_step(a, x, bf16_bits_to_f32, f32_to_bf16_bits),
            id
        ),
        (Fold::Sum, DType::F16) => run!(
            u16,
            id,
            |a, x| half_step(a, x, f16_bits_to_f32, f32_to_f16_bits),
            id
        ),
        (Fold::SumUpcast, DType::BF16) => run!(
            u16,
            |x| bf16_bits_to_f32(x).to_bits(),
            |a, x| add_f32(a, bf16_bits_to_f32(x).to_bits()),
            |a| f32_to_bf16_bits(f32::from_bits(a))
        ),
        (Fold::SumUpcast, DType::F16) => run!(
            u16,
            |x| f16_bits_to_f32(x).to_bits(),
            |a, x| add_f32(a, f16_bits_to_f32(x).to_bits()),
            |a| f32_to_f16_bits(f32::from_bits(a))
        ),
        (Fold::Sum, DType::U8) => run!(u8, id, u8::wrapping_add, id),
        (Fold::Sum, DType::U32 | DType::I32) => run!(u32, id, u32::wrapping_add, id),
        (Fold::Sum, DType::I64) => run!(u64, id, u64::wrapping_add, id),
        (Fold::Max, DType::F32) => run!(u32, id, max_f32, id),
        (Fold::Max, DType::F64) => run!(u64, id, max_f64, id),
        (Fold::Max, DType::BF16) => {
            run!(u16, id, |a, x| half_max(a, x, 0x7F80, bf16_bits_to_f32), id)
        }
        (Fold::Max, DType::F16) => {
            run!(u16, id, |a, x| half_max(a, x, 0x7C00, f16_bits_to_f32), id)
        }
        (Fold::Max, DType::U8) => run!(u8, id, |a: u8, x: u8| if x > a { x } else { a }, id),
        (Fold::Max, DType::U32) => run!(u32, id, |a: u32, x: u32| if x > a { x } else { a }, id),
        (Fold::Max, DType::I32) => run!(i32, id, |a: i32, x: i32| if x > a { x } else { a }, id),
        (Fold::Max, DType::I64) => run!(i64, id, |a: i64, x: i64| if x > a { x } else { a }, id),
        (Fold::SumUpcast, _) => unreachable!("refused by Fold::entry above"),
    }
    Ok(())
}

/// The identity (a step or end that keeps the accumulator).
fn id<T>(x: T) -> T {
    x
}

/// Addition of f32 bit patterns (`add_f32` of `peer.cu`, zero-comm's host fold): a NaN
/// operand comes back quieted (the accumulator's first); inf - inf is the canonical NaN.
fn add_f32(a: u32, b: u32) -> u32 {
    let (fa, fb) = (f32::from_bits(a), f32::from_bits(b));
    if fa.is_nan() {
        return a | 0x0040_0000;
    }
    if fb.is_nan() {
        return b | 0x0040_0000;
    }
    let s = fa + fb;
    if s.is_nan() {
        return 0x7FC0_0000;
    }
    s.to_bits()
}

/// As [`add_f32`], for f64.
fn add_f64(a: u64, b: u64) -> u64 {
    let (fa, fb) = (f64::from_bits(a), f64::from_bits(b));
    if fa.is_nan() {
        return a | 0x0008_0000_0000_0000;
    }
    if fb.is_nan() {
        return b | 0x0008_0000_0000_0000;
    }
    let s = fa + fb;
    if s.is_nan() {
        return 0x7FF8_0000_0000_0000;
    }
    s.to_bits()
}

/// One `HalfSum::Op` step: widen both, add in f32, round back.
fn half_step(a: u16, x: u16, widen: fn(u16) -> f32, narrow: fn(f32) -> u16) -> u16 {
    narrow(f32::from_bits(add_f32(
        widen(a).to_bits(),
        widen(x).to_bits(),
    )))
}

fn max_f32(a: u32, b: u32) -> u32 {
    let (fa, fb) = (f32::from_bits(a), f32::from_bits(b));
    if fa.is_nan() {
        return a;
    }
    if fb.is_nan() || fb > fa {
        b
    } else {
        a
    }
}

fn max_f64(a: u64, b: u64) -> u64 {
    let (fa, fb) = (f64::from_bits(a), f64::from_bits(b));
    if fa.is_nan() {
        return a;
    }
    if fb.is_nan() || fb > fa {
        b
    } else {
        a
    }
}

/// Max of half bit patterns; `inf` is the type's infinity bits (NaN test on the bits).
fn half_max(a: u16, x: u16, inf: u16, widen: fn(u16) -> f32) -> u16 {
    let nan = |h: u16| (h & 0x7FFF) > inf;
    if nan(a) {
        return a;
    }
    if nan(x) || widen(x) > widen(a) {
        x
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_has_its_entries_and_upcast_is_for_halves_only() {
        for d in DType::ALL {
            assert_eq!(
                Fold::Sum.entry(d).ok(),
                Some(format!("fold_sum_{}", d.name()))
            );
            assert_eq!(
                Fold::Max.entry(d).ok(),
                Some(format!("fold_max_{}", d.name()))
            );
            assert_eq!(Fold::SumUpcast.entry(d).is_ok(), d.is_half(), "{d}");
        }
    }

    #[test]
    fn twin_folds_in_rank_order() {
        // bf16: 256 + 1 + 1 rounds to 256 step by step, 258 summed in f32.
        let b = |v: f32| f32_to_bf16_bits(v).to_le_bytes();
        let (x0, x1) = (b(256.0), b(1.0));
        let srcs: [&[u8]; 3] = [&x0, &x1, &x1];
        let mut out = [0u8; 2];
        twin(DType::BF16, Fold::Sum, &mut out, &srcs, 0, 1).expect("twin");
        assert_eq!(bf16_bits_to_f32(u16::from_le_bytes(out)), 256.0);
        twin(DType::BF16, Fold::SumUpcast, &mut out, &srcs, 0, 1).expect("twin");
        assert_eq!(bf16_bits_to_f32(u16::from_le_bytes(out)), 258.0);
        // Offsets select each source's block.
        let a: Vec<u8> = [1i32, 2, 3, 4]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let c: Vec<u8> = [10i32, 20, 30, 40]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut o = [0u8; 8];
        twin(DType::I32, Fold::Sum, &mut o, &[&a, &c], 2, 2).expect("twin");
        assert_eq!(o[..4], 33i32.to_le_bytes());
        assert_eq!(o[4..], 44i32.to_le_bytes());
        assert!(twin(DType::I32, Fold::Sum, &mut o, &[&a, &c], 3, 2).is_err());
    }

    /// On a GPU machine: every fold kernel gives its twin's bits (random bits, so NaNs,
    /// infinities and subnormals occur), and a copy copies. Without a driver: nothing.
    #[test]
    fn gpu_folds_equal_the_twin() {
        if !CudaDevice::driver_present() {
            return;
        }
        let m = PeerMover::new(0).expect("open GPU 0");
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut bytes = |len: usize| -> Vec<u8> {
            (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 24) as u8
                })
                .collect()
        };
        let addr = |s: &CudaSlice<u8>| s.device_ptr(&m.stream).0;
        for d in DType::ALL {
            for fold in [Fold::Sum, Fold::Max, Fold::SumUpcast] {
                if fold.entry(d).is_err() {
                    continue;
                }
                let (k, off, n) = (3, 5, 1000);
                let es = d.size_bytes();
                let host: Vec<Vec<u8>> = (0..k).map(|_| bytes((off + n) * es)).collect();
                let dev: Vec<CudaSlice<u8>> = host
                    .iter()
                    .map(|h| m.stream.clone_htod(h).expect("upload"))
                    .collect();
                let out = m.stream.alloc_zeros::<u8>(n * es).expect("alloc");
                let srcs: Vec<u64> = dev.iter().map(addr).collect();
                // SAFETY: every source holds off + n elements, out n; all on GPU 0.
                unsafe { m.fold(d, fold, addr(&out), &srcs, off, n) }.expect("fold");
                m.sync().expect("sync");
                let got = m.stream.clone_dtoh(&out).expect("download");
                let refs: Vec<&[u8]> = host.iter().map(|h| &h[..]).collect();
                let mut want = vec![0u8; n * es];
                twin(d, fold, &mut want, &refs, off, n).expect("twin");
                let bad = (0..n).find(|&i| got[i * es..][..es] != want[i * es..][..es]);
                assert!(bad.is_none(), "{d} {fold:?}: element {bad:?} differs");
            }
        }
        let src = m.stream.clone_htod(&bytes(4096)).expect("upload");
        let dst = m.stream.alloc_zeros::<u8>(4096).expect("alloc");
        // SAFETY: both hold 4096 bytes on GPU 0 and do not overlap.
        unsafe { m.copy(addr(&dst), addr(&src), 4096) }.expect("copy");
        m.sync().expect("sync");
        assert_eq!(
            m.stream.clone_dtoh(&dst).expect("download"),
            m.stream.clone_dtoh(&src).expect("download")
        );
    }
}
