//! CPU twin of the int4 kernels of `src/quant/quant.cu` (`quantize_int4_*`,
//! `dequantize_int4_*`): the GPU's thread layout and order of operations in plain Rust.
//!
//! One thread block of [`THREADS`] threads per quantization block; thread t owns code bytes
//! t, t + THREADS, .. of its block (values 2j and 2j + 1 of byte j). Each thread takes the
//! integer maximum of its values' |x| bit patterns, the block combines them with
//! `atomicMax` (any order: an integer maximum is exact), then each thread writes its bytes.
//! Reading back, one thread per value: code from the nibble, times the block's scale. All
//! float steps are the reference's single IEEE operations, so this gives
//! [`crate::quant::reference::quantize_int4`]'s bits (tested); it is spelled out so the
//! kernel's order is written once in Rust.

use crate::float::Float;
use crate::quant::reference::{
    code_for, dequantize_one, pack_int4, scale_for, unpack_int4, Q4_MAX,
};

/// Threads per thread block of `quantize_int4_*` (the launch's block_dim).
pub const THREADS: usize = 256;

/// `quantize_int4_{f32,bf16}`: `codes` ceil(n / 2) bytes, `scales` ceil(n / block).
///
/// # Panics
/// If `block` is odd or zero, or a slice is shorter than that (the device checks first).
pub fn quantize_int4<T: Float>(x: &[T], block: usize, codes: &mut [u8], scales: &mut [f32]) {
    assert!(
        block > 0 && block.is_multiple_of(2),
        "int4 block {block} must be even"
    );
    let abs_bits = |v: T| v.to_f32().to_bits() & 0x7FFF_FFFF;
    for (b, s) in scales.iter_mut().enumerate().take(x.len().div_ceil(block)) {
        let start = b * block;
        let len = block.min(x.len() - start);
        let bytes = len.div_ceil(2);
        let xb = &x[start..start + len];
        let cb = &mut codes[start / 2..start / 2 + bytes];
        // Each thread's maximum over its strided bytes, then atomicMax into shared memory.
        let mut amax_bits = 0u32;
        for t in 0..THREADS.min(bytes) {
            let mut m = 0u32;
            for j in (t..bytes).step_by(THREADS) {
                m = m.max(abs_bits(xb[2 * j]));
                if 2 * j + 1 < len {
                    m = m.max(abs_bits(xb[2 * j + 1]));
                }
            }
            amax_bits = amax_bits.max(m);
        }
        let scaled = scale_for(amax_bits, Q4_MAX);
        for (j, c) in cb.iter_mut().enumerate() {
            *c = match scaled {
                Ok((_, inv)) => {
                    let lo = code_for(xb[2 * j].to_f32(), inv, Q4_MAX);
                    let hi = match xb.get(2 * j + 1) {
                        Some(v) => code_for(v.to_f32(), inv, Q4_MAX),
                        None => 0,
                    };
                    pack_int4(lo, hi)
                }
                Err(_) => 0,
            };
        }
        // Thread 0 writes the scale: amax / 7, or 0 / NaN for the special blocks.
        *s = match scaled {
            Ok((scale, _)) => scale,
            Err(scale) => scale,
        };
    }
}

/// `dequantize_int4_{f32,bf16}`: one thread per value i reads nibble i % 2 of byte i / 2.
///
/// # Panics
/// If `block` is zero or a slice is shorter than `out` needs (the device checks first).
pub fn dequantize_int4<T: Float>(codes: &[u8], scales: &[f32], block: usize, out: &mut [T]) {
    for (i, o) in out.iter_mut().enumerate() {
        let s = scales[i / block];
        let (lo, hi) = unpack_int4(codes[i / 2]);
        let q = if i % 2 == 0 { lo } else { hi };
        *o = T::from_f32(dequantize_one(q, s));
    }
}
