//! Block-wise int4 quantization as a device op: on the host device (1 and 2 threads) and
//! the simulated devices (queued with hazard checks; the GPU twin, which runs the CUDA
//! kernels' CPU twin `zero_kernels::twin::quant`), the code bytes, scales and values read
//! back are the bits of `zero_kernels::quant::reference`, for f32 and bf16 values, odd
//! counts, a last block shorter than the rest, and views into the middle of buffers. The
//! simulated device sees the ops' reads and writes: a missing wait is a hazard.

use half::bf16;
use zero_kernels::device::{Buffer, Device, HostDevice, SimDevice};
use zero_kernels::float::Float;
use zero_kernels::quant::{code_bytes_int4, reference, scale_count};

fn values<T: Float>(n: usize) -> Vec<T> {
    (0..n)
        .map(|i| {
            let v = ((i * 7919 + 13) % 2001) as f32 / 1000.0 - 1.0;
            // Blocks of very different magnitudes, and one all-zero stretch.
            let mag = [1.0, 1.0e-3, 250.0, 0.0][(i / 96) % 4];
            T::from_f32(v * mag)
        })
        .collect()
}

/// Device results (codes, scales, values) for `x`.
fn run<D: Device, T: Float>(dev: &D, x: &[T], block: usize) -> (Vec<u8>, Vec<f32>, Vec<T>) {
    let s = dev.stream("compute").expect("stream");
    let n = x.len();
    let (nb, ns) = (code_bytes_int4(n), scale_count(n, block));
    // One element of padding on each side: the ops work on views, not whole buffers.
    let mut src = dev.alloc::<T>(n + 2, "x").expect("alloc");
    let mut codes = dev.alloc::<u8>(nb + 2, "codes").expect("alloc");
    let mut scales = dev.alloc::<f32>(ns + 2, "scales").expect("alloc");
    let mut back = dev.alloc::<T>(n + 2, "back").expect("alloc");
    dev.upload(&s, x, src.slice_mut(1..n + 1)).expect("upload");
    dev.quantize_int4(
        &s,
        src.slice(1..n + 1),
        block,
        codes.slice_mut(1..nb + 1),
        scales.slice_mut(1..ns + 1),
    )
    .expect("quantize");
    dev.dequantize_int4(
        &s,
        codes.slice(1..nb + 1),
        scales.slice(1..ns + 1),
        block,
        back.slice_mut(1..n + 1),
    )
    .expect("dequantize");
    let (mut got_c, mut got_s, mut got_x) =
        (vec![0u8; nb], vec![0f32; ns], vec![T::from_f32(0.0); n]);
    dev.download(&s, codes.slice(1..nb + 1), &mut got_c)
        .expect("download");
    dev.download(&s, scales.slice(1..ns + 1), &mut got_s)
        .expect("download");
    dev.download(&s, back.slice(1..n + 1), &mut got_x)
        .expect("download");
    (got_c, got_s, got_x)
}

fn check<D: Device, T: Float>(dev: &D, n: usize, block: usize) {
    let x: Vec<T> = values(n);
    let (got_c, got_s, got_x) = run(dev, &x, block);
    let (mut want_c, mut want_s, mut want_x) = (
        vec![0u8; code_bytes_int4(n)],
        vec![0f32; scale_count(n, block)],
        vec![T::from_f32(0.0); n],
    );
    reference::quantize_int4(&x, block, &mut want_c, &mut want_s);
    reference::dequantize_int4(&want_c, &want_s, block, &mut want_x);
    assert_eq!(got_c, want_c, "codes, n {n} block {block}");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got_s), bits(&want_s), "scales");
    let fbits = |v: &[T]| v.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<_>>();
    assert_eq!(fbits(&got_x), fbits(&want_x), "values");
}

fn every_shape<D: Device>(dev: &D) {
    for (n, block) in [
        (1000, 256),
        (96 * 4, 32),
        (257, 256),
        (5, 2),
        (3, 16),
        (1201, 600),
        (0, 16),
    ] {
        check::<D, f32>(dev, n, block);
        check::<D, bf16>(dev, n, block);
    }
}

#[test]
fn int4_on_every_cpu_device_gives_the_reference_bits() {
    every_shape(&HostDevice::new());
    every_shape(&HostDevice::with_threads(2));
    every_shape(&SimDevice::new(3));
    every_shape(&SimDevice::gpu_twin(5));
}

#[test]
fn int4_odd_blocks_and_bad_lengths_are_errors() {
    let dev = HostDevice::new();
    let s = dev.stream("compute").expect("stream");
    let x = dev.alloc::<f32>(11, "x").expect("alloc");
    let mut c = dev.alloc::<u8>(6, "c").expect("alloc");
    let mut sc = dev.alloc::<f32>(3, "s").expect("alloc");
    let mut y = dev.alloc::<f32>(11, "y").expect("alloc");
    dev.quantize_int4(&s, x.view(), 4, c.view_mut(), sc.view_mut())
        .expect("lengths fit");
    let odd = dev
        .quantize_int4(&s, x.view(), 5, c.view_mut(), sc.view_mut())
        .expect_err("odd block")
        .to_string();
    assert!(
        odd.contains("block size 5") && odd.contains("even"),
        "{odd}"
    );
    let bad = [
        dev.quantize_int4(&s, x.view(), 4, c.slice_mut(0..5), sc.view_mut()),
        dev.quantize_int4(&s, x.view(), 4, c.view_mut(), sc.slice_mut(0..2)),
        dev.quantize_int4(&s, x.view(), 0, c.view_mut(), sc.view_mut()),
        dev.dequantize_int4(&s, c.slice(0..5), sc.view(), 4, y.view_mut()),
        dev.dequantize_int4(&s, c.view(), sc.view(), 3, y.view_mut()),
    ];
    for r in bad {
        assert!(r.is_err());
    }
}

/// Quantize on one stream, read back on another: without a wait the simulated device
/// reports the read of the codes before the quantization wrote them.
#[test]
fn int4_ops_declare_their_accesses() {
    let go = |wait: bool| -> zero_kernels::Result<()> {
        let dev = SimDevice::new(7);
        let (s1, s2) = (dev.stream("compute")?, dev.stream("comm")?);
        let x = dev.alloc::<f32>(8, "grad")?;
        let mut c = dev.alloc::<u8>(4, "codes")?;
        let mut sc = dev.alloc::<f32>(2, "scales")?;
        let mut y = dev.alloc::<f32>(8, "back")?;
        dev.quantize_int4(&s1, x.view(), 4, c.view_mut(), sc.view_mut())?;
        if wait {
            let e = dev.record(&s1)?;
            dev.wait_event(&s2, &e)?;
        }
        dev.dequantize_int4(&s2, c.view(), sc.view(), 4, y.view_mut())?;
        dev.synchronize()
    };
    go(true).expect("ordered");
    let err = go(false).expect_err("hazard").to_string();
    for part in ["read-after-write", "'quantize_int4'", "'dequantize_int4'"] {
        assert!(err.contains(part), "{part} missing from: {err}");
    }
}
