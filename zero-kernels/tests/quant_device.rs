//! Block-wise int8 quantization as a device op: on the host device (1 and 2 threads) and
//! the simulated devices (queued with hazard checks; the GPU twin, whose order is the
//! CUDA kernel's, the block maximum being exact in any order), the codes, scales and
//! values read back are the bits of `zero_kernels::quant::reference`, for f32 and bf16
//! values, a last block shorter than the rest, and views into the middle of buffers.

use half::bf16;
use zero_kernels::device::{Buffer, Device, HostDevice, SimDevice};
use zero_kernels::float::Float;
use zero_kernels::quant::{reference, scale_count};

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

fn check<D: Device, T: Float>(dev: &D, n: usize, block: usize) {
    let s = dev.stream("compute").expect("stream");
    let x: Vec<T> = values(n);
    let ns = scale_count(n, block);
    // One element of padding on each side: the ops work on views, not whole buffers.
    let mut src = dev.alloc::<T>(n + 2, "x").expect("alloc");
    let mut codes = dev.alloc::<u8>(n + 2, "codes").expect("alloc");
    let mut scales = dev.alloc::<f32>(ns + 2, "scales").expect("alloc");
    let mut back = dev.alloc::<T>(n + 2, "back").expect("alloc");
    dev.upload(&s, &x, src.slice_mut(1..n + 1)).expect("upload");
    dev.quantize_int8(
        &s,
        src.slice(1..n + 1),
        block,
        codes.slice_mut(1..n + 1),
        scales.slice_mut(1..ns + 1),
    )
    .expect("quantize");
    dev.dequantize_int8(
        &s,
        codes.slice(1..n + 1),
        scales.slice(1..ns + 1),
        block,
        back.slice_mut(1..n + 1),
    )
    .expect("dequantize");
    let (mut got_q, mut got_s, mut got_x) =
        (vec![0u8; n], vec![0f32; ns], vec![T::from_f32(0.0); n]);
    dev.download(&s, codes.slice(1..n + 1), &mut got_q)
        .expect("download");
    dev.download(&s, scales.slice(1..ns + 1), &mut got_s)
        .expect("download");
    dev.download(&s, back.slice(1..n + 1), &mut got_x)
        .expect("download");
    let (mut want_q, mut want_s, mut want_x) =
        (vec![0i8; n], vec![0f32; ns], vec![T::from_f32(0.0); n]);
    reference::quantize(&x, block, &mut want_q, &mut want_s);
    reference::dequantize(&want_q, &want_s, block, &mut want_x);
    let want_q: Vec<u8> = want_q.iter().map(|&q| q as u8).collect();
    assert_eq!(got_q, want_q, "codes, n {n} block {block}");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got_s), bits(&want_s), "scales");
    let fbits = |v: &[T]| v.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<_>>();
    assert_eq!(fbits(&got_x), fbits(&want_x), "values");
}

fn every_shape<D: Device>(dev: &D) {
    for (n, block) in [(1000, 256), (96 * 4, 32), (257, 256), (5, 1), (0, 16)] {
        check::<D, f32>(dev, n, block);
        check::<D, bf16>(dev, n, block);
    }
}

#[test]
fn quantization_on_every_cpu_device_gives_the_reference_bits() {
    every_shape(&HostDevice::new());
    every_shape(&HostDevice::with_threads(2));
    every_shape(&SimDevice::new(3));
    every_shape(&SimDevice::gpu_twin(5));
}

#[test]
fn bad_lengths_and_a_zero_block_are_errors() {
    let dev = HostDevice::new();
    let s = dev.stream("compute").expect("stream");
    let x = dev.alloc::<f32>(10, "x").expect("alloc");
    let mut q = dev.alloc::<u8>(10, "q").expect("alloc");
    let mut sc = dev.alloc::<f32>(3, "s").expect("alloc");
    let bad = [
        dev.quantize_int8(&s, x.view(), 4, q.slice_mut(0..9), sc.view_mut()),
        dev.quantize_int8(&s, x.view(), 4, q.view_mut(), sc.slice_mut(0..2)),
        dev.quantize_int8(&s, x.view(), 0, q.view_mut(), sc.view_mut()),
    ];
    for r in bad {
        assert!(r.is_err());
    }
}
