//! Launchers of Llama's kernels (`src/nn/cuda/llama.cu`, CPU twin [`crate::twin::llama`]):
//! RMSNorm as LayerNorm's launchers ([`super::norm`]: the forward one warp per row; the
//! backward one block per chunk of [`CHUNK_ROWS`] rows, then `column_fold_f32` adding
//! the chunks' partial sums into dw), rotary/GQA one thread per pair of rotated elements
//! over an uploaded cos/sin table, SwiGLU one element per thread. Every sum in a fixed
//! order, no atomics.

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use super::norm::{block_per_chunk, inv, warp_per_row};
use super::rows::{column_fold, shape_err, width_u32};
use crate::cuda::CudaDevice;
use crate::error::KernelError;
use crate::nn::RopeShape;
use crate::twin::rows::CHUNK_ROWS;

/// Floats of scratch [`rmsnorm_backward`] needs: dw's partial sums, one per chunk of
/// [`CHUNK_ROWS`] rows and column.
pub(crate) fn rmsnorm_backward_scratch_len(rows: usize, c: usize) -> usize {
    rows.div_ceil(CHUNK_ROWS) * c
}

/// Queue the forward on `stream` ([`crate::nn::rmsnorm_forward`]): `out` `[rows, c]` and
/// `rstd` `[rows]` from `x` `[rows, c]`, `w` `[c]`. Launch: one warp per row, 8 per block
/// (blocks stride over rows past 2^31 - 1 blocks).
///
/// The caller guarantees that the addresses are f32 device buffers of those lengths, the
/// written ones overlapping nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm_forward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    out: u64,
    rstd: u64,
    x: u64,
    w: u64,
    rows: usize,
    c: usize,
    eps: f64,
) -> Result<(), KernelError> {
    let c32 = width_u32("rmsnorm_forward", c)?;
    if rows == 0 || c == 0 {
        return Ok(());
    }
    let (rows64, cfg) = (rows as u64, warp_per_row(rows));
    // eps rounded to f32 once, as the CPU kernel's F::from_f64(eps).
    let (inv_c, eps) = (inv(c), eps as f32);
    let f = dev.kernel("rmsnorm_forward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&out)
        .arg(&rstd)
        .arg(&x)
        .arg(&w)
        .arg(&rows64)
        .arg(&c32)
        .arg(&inv_c)
        .arg(&eps);
    // SAFETY: (float* out, rstd, const float* x, w, u64 rows, u32 C, float inv_c, float
    // eps) is the kernel's signature; the warp of row r < rows reads x row r and w and
    // writes out row r and rstd[r], within the caller's lengths.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Queue the backward on `stream` ([`crate::nn::rmsnorm_backward`], in the order of
/// [`crate::twin::llama::rmsnorm_backward`]): **adds** into `dx` `[rows, c]` and `dw`
/// `[c]` from `dout`, `x` `[rows, c]`, `w` `[c]` and the forward's `rstd` `[rows]`.
/// Launch: `rmsnorm_backward_f32`, one block of 8 warps per chunk of [`CHUNK_ROWS`] rows
/// (grid ceil(rows/32)); then `column_fold_f32`, grid (ceil(c/32), 1), for dw.
///
/// The caller guarantees that the addresses are f32 device buffers of those lengths,
/// `scratch` at least [`rmsnorm_backward_scratch_len`]`(rows, c)`, and that `dx`, `dw`
/// and `scratch` overlap nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm_backward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dx: u64,
    dw: u64,
    scratch: u64,
    dout: u64,
    x: u64,
    w: u64,
    rstd: u64,
    rows: usize,
    c: usize,
) -> Result<(), KernelError> {
    let op = "rmsnorm_backward";
    let c32 = width_u32(op, c)?;
    if rows == 0 || c == 0 {
        return Ok(());
    }
    let (chunks, cfg) = block_per_chunk(op, rows)?;
    let (rows64, inv_c) = (rows as u64, inv(c));
    let f = dev.kernel("rmsnorm_backward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&dx)
        .arg(&scratch)
        .arg(&dout)
        .arg(&x)
        .arg(&w)
        .arg(&rstd)
        .arg(&rows64)
        .arg(&c32)
        .arg(&inv_c);
    // SAFETY: (float* dx, float* partial, const float* dout, x, w, rstd, u64 rows, u32 C,
    // float inv_c) is the kernel's signature; block k reads and writes the rows of chunk k
    // (< rows) of dx, reads those of dout, x, rstd and w, and writes partial row k
    // (< chunks*C = the scratch length).
    unsafe { l.launch(cfg) }?;
    column_fold(dev, stream, op, [dw, dw], 1, scratch, chunks, c32)
}

/// Floats of the cos/sin table the rotary kernels read: cos `[T, hd/2]`, then sin.
pub(crate) fn rope_table_len(s: &RopeShape) -> usize {
    2 * s.t * (s.hd / 2)
}

/// The table of [`rope_table_len`] on the host: the CPU kernel's cos and sin (computed in
/// f64, rounded once), cos first.
pub(crate) fn rope_table(s: &RopeShape) -> Vec<f32> {
    let (mut cos, sin) = s.table::<f32>();
    cos.extend(sin);
    debug_assert_eq!(cos.len(), rope_table_len(s));
    cos
}

/// The rotary kernels' launch: (rows, T, H, g, hd/2) as the kernels' integers, and the
/// grid-stride shape over `threads` threads.
fn rope_args(
    op: &'static str,
    s: &RopeShape,
    threads: usize,
) -> Result<(u64, [u32; 4], LaunchConfig), KernelError> {
    let u = |what: &str, v: usize| {
        u32::try_from(v).map_err(|_| shape_err(op, format!("{what} {v} does not fit a u32")))
    };
    let ints = [
        u("sequence length", s.t)?,
        u("heads", s.h)?,
        u("group", s.h / s.kv_h)?,
        u("half head size", s.hd / 2)?,
    ];
    Ok(((s.b * s.t) as u64, ints, CudaDevice::elementwise(threads)))
}

/// Queue the rotary/GQA forward on `stream` ([`crate::nn::rope_gqa_forward`]): **writes**
/// `qkv` `[B,T,3C]` from `q` `[B,T,C]`, `k`, `v` `[B,T,Ckv]` and `table`
/// ([`rope_table`]). Launch: grid-stride, one thread per (row, query head, i < hd/2).
///
/// The caller guarantees that `s` passed [`RopeShape::check`], that the addresses are f32
/// device buffers of those lengths (`table` [`rope_table_len`]) and that `qkv` overlaps
/// nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_gqa_forward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    qkv: u64,
    q: u64,
    k: u64,
    v: u64,
    table: u64,
    s: RopeShape,
) -> Result<(), KernelError> {
    let threads = s.b * s.t * s.h * (s.hd / 2);
    let (rows, [t, h, group, half], cfg) = rope_args("rope_gqa_forward", &s, threads)?;
    if threads == 0 {
        return Ok(());
    }
    let f = dev.kernel("rope_gqa_forward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&qkv)
        .arg(&q)
        .arg(&k)
        .arg(&v)
        .arg(&table)
        .arg(&rows)
        .arg(&t)
        .arg(&h)
        .arg(&group)
        .arg(&half);
    // SAFETY: (float* qkv, const float* q, k, v, table, u64 rows, u32 T, H, group, half) is
    // the kernel's signature; thread (r, j, i) reads elements i, i + half of head j of q
    // row r, of head j / group of k and v row r, and table[t * half + i] and
    // table[(T + t) * half + i] (t = r mod T), and writes those elements of q, k, v head j
    // of qkv row r: all within the lengths the caller guarantees (H = Hkv group).
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Queue the rotary/GQA backward on `stream` ([`crate::nn::rope_gqa_backward`]):
/// **writes** `dq` `[B,T,C]`, `dk`, `dv` `[B,T,Ckv]` from `dqkv` `[B,T,3C]` and `table`.
/// Launch: grid-stride, one thread per (row, key/value head, i < hd/2).
///
/// The caller guarantees what [`rope_gqa_forward`]'s does, for `dq`, `dk`, `dv` written.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_gqa_backward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dq: u64,
    dk: u64,
    dv: u64,
    dqkv: u64,
    table: u64,
    s: RopeShape,
) -> Result<(), KernelError> {
    let threads = s.b * s.t * s.kv_h * (s.hd / 2);
    let (rows, [t, h, group, half], cfg) = rope_args("rope_gqa_backward", &s, threads)?;
    if threads == 0 {
        return Ok(());
    }
    let f = dev.kernel("rope_gqa_backward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&dq)
        .arg(&dk)
        .arg(&dv)
        .arg(&dqkv)
        .arg(&table)
        .arg(&rows)
        .arg(&t)
        .arg(&h)
        .arg(&group)
        .arg(&half);
    // SAFETY: (float* dq, dk, dv, const float* dqkv, table, u64 rows, u32 T, H, group,
    // half) is the kernel's signature; thread (r, m, i) reads elements i, i + half of the
    // q, k, v heads m group .. m group + group - 1 of dqkv row r and the table, writes
    // those elements of the same heads of dq row r and of head m of dk, dv row r.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Queue `out = silu(a) b` over n elements ([`crate::nn::swiglu_forward`]).
///
/// The caller guarantees that `out`, `a`, `b` hold n f32 each and `out` overlaps neither.
pub(crate) fn swiglu_forward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    out: u64,
    a: u64,
    b: u64,
    n: usize,
) -> Result<(), KernelError> {
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let f = dev.kernel("swiglu_forward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&out).arg(&a).arg(&b).arg(&n64);
    // SAFETY: (float* out, const float* a, b, u64 n) is the kernel's signature; element
    // i < n of `out` is written from element i of `a` and `b`.
    unsafe { l.launch(CudaDevice::elementwise(n)) }?;
    Ok(())
}

/// Queue `da`, `db` from `dout`, `a`, `b` over n elements ([`crate::nn::swiglu_backward`]).
///
/// The caller guarantees that all five hold n f32 each and `da`, `db` overlap nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn swiglu_backward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    da: u64,
    db: u64,
    dout: u64,
    a: u64,
    b: u64,
    n: usize,
) -> Result<(), KernelError> {
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let f = dev.kernel("swiglu_backward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&da).arg(&db).arg(&dout).arg(&a).arg(&b).arg(&n64);
    // SAFETY: (float* da, db, const float* dout, a, b, u64 n) is the kernel's signature;
    // element i < n of `da` and `db` is written from element i of the three inputs.
    unsafe { l.launch(CudaDevice::elementwise(n)) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::rows::gpu::{device, down, same_bits, up, vals};
    use super::*;
    use crate::cuda::DeviceBuffer;
    use crate::nn::RMS_EPS;
    use crate::twin::llama as twin;

    #[test]
    fn gpu_rmsnorm_equals_its_twin() {
        let Some(dev) = device() else { return };
        let s = dev.default_stream().clone();
        for (k, &(rows, c)) in [(1, 1), (3, 7), (33, 31), (70, 100), (1000, 768), (4099, 45)]
            .iter()
            .enumerate()
        {
            let seed = k as u64 * 10;
            let x = vals(rows * c, seed);
            let w = vals(c, seed + 1);
            let (xb, wb) = (up(&dev, &x), up(&dev, &w));
            let out = DeviceBuffer::<f32>::zeros(&dev, rows * c).expect("alloc");
            let rstd = DeviceBuffer::<f32>::zeros(&dev, rows).expect("alloc");
            let a = |buf: &DeviceBuffer<f32>| buf.addr(&dev, 0);
            rmsnorm_forward(
                &dev,
                &s,
                a(&out),
                a(&rstd),
                a(&xb),
                a(&wb),
                rows,
                c,
                RMS_EPS,
            )
            .expect("forward");
            let mut want = (vec![0.0; rows * c], vec![0.0; rows]);
            twin::rmsnorm_forward(&mut want.0, &mut want.1, &x, &w, c, RMS_EPS);
            same_bits("rmsnorm out", &down(&dev, &out), &want.0);
            same_bits("rmsnorm rstd", &down(&dev, &rstd), &want.1);

            let dout = vals(rows * c, seed + 3);
            let (dx0, dw0) = (vals(rows * c, seed + 4), vals(c, seed + 5));
            let (gb, dxb, dwb) = (up(&dev, &dout), up(&dev, &dx0), up(&dev, &dw0));
            let scratch = DeviceBuffer::<f32>::zeros(&dev, rmsnorm_backward_scratch_len(rows, c))
                .expect("alloc");
            rmsnorm_backward(
                &dev,
                &s,
                a(&dxb),
                a(&dwb),
                a(&scratch),
                a(&gb),
                a(&xb),
                a(&wb),
                a(&rstd),
                rows,
                c,
            )
            .expect("backward");
            let (mut dx, mut dw) = (dx0, dw0);
            twin::rmsnorm_backward(&mut dx, &mut dw, &dout, &x, &w, &want.1, c);
            same_bits("rmsnorm dx", &down(&dev, &dxb), &dx);
            same_bits("rmsnorm dw", &down(&dev, &dwb), &dw);
        }
    }

    #[test]
    fn gpu_rope_and_swiglu_equal_their_twins() {
        let Some(dev) = device() else { return };
        let st = dev.default_stream().clone();
        let a = |buf: &DeviceBuffer<f32>| buf.addr(&dev, 0);
        for (k, &(b, t, h, kv_h, hd)) in [(1, 1, 1, 1, 2), (2, 3, 4, 2, 6), (2, 64, 8, 2, 64)]
            .iter()
            .enumerate()
        {
            let s = RopeShape {
                b,
                t,
                h,
                kv_h,
                hd,
                theta: 10000.0,
            };
            let seed = 300 + k as u64 * 10;
            let (c, ckv, bt) = (s.c(), s.c_kv(), b * t);
            let (q, kk, v) = (
                vals(bt * c, seed),
                vals(bt * ckv, seed + 1),
                vals(bt * ckv, seed + 2),
            );
            let table = up(&dev, &rope_table(&s));
            let (qb, kb, vb) = (up(&dev, &q), up(&dev, &kk), up(&dev, &v));
            let qkv = DeviceBuffer::<f32>::zeros(&dev, bt * 3 * c).expect("alloc");
            rope_gqa_forward(&dev, &st, a(&qkv), a(&qb), a(&kb), a(&vb), a(&table), s)
                .expect("forward");
            let mut want = vec![0.0; bt * 3 * c];
            twin::rope_gqa_forward(&mut want, &q, &kk, &v, s);
            same_bits("rope qkv", &down(&dev, &qkv), &want);

            let g = vals(bt * 3 * c, seed + 3);
            let gb = up(&dev, &g);
            let dq = DeviceBuffer::<f32>::zeros(&dev, bt * c).expect("alloc");
            let dk = DeviceBuffer::<f32>::zeros(&dev, bt * ckv).expect("alloc");
            let dv = DeviceBuffer::<f32>::zeros(&dev, bt * ckv).expect("alloc");
            rope_gqa_backward(&dev, &st, a(&dq), a(&dk), a(&dv), a(&gb), a(&table), s)
                .expect("backward");
            let mut w = (vec![0.0; bt * c], vec![0.0; bt * ckv], vec![0.0; bt * ckv]);
            twin::rope_gqa_backward(&mut w.0, &mut w.1, &mut w.2, &g, s);
            same_bits("rope dq", &down(&dev, &dq), &w.0);
            same_bits("rope dk", &down(&dev, &dk), &w.1);
            same_bits("rope dv", &down(&dev, &dv), &w.2);
        }
        for n in [1, 31, 1000, 1 << 20] {
            let mut x = vals(n, n as u64);
            for (i, v) in [100.0, -100.0, 0.0, -0.0, f32::INFINITY, f32::NAN, 1e-40]
                .iter()
                .enumerate()
            {
                if i < n {
                    x[i] = *v;
                }
            }
            let (y, d) = (vals(n, n as u64 + 1), vals(n, n as u64 + 2));
            let (xb, yb, db) = (up(&dev, &x), up(&dev, &y), up(&dev, &d));
            let out = DeviceBuffer::<f32>::zeros(&dev, n).expect("alloc");
            swiglu_forward(&dev, &st, a(&out), a(&xb), a(&yb), n).expect("forward");
            let mut want = vec![0.0; n];
            twin::swiglu_forward(&mut want, &x, &y);
            same_bits("swiglu out", &down(&dev, &out), &want);
            let da = DeviceBuffer::<f32>::zeros(&dev, n).expect("alloc");
            let dbb = DeviceBuffer::<f32>::zeros(&dev, n).expect("alloc");
            swiglu_backward(&dev, &st, a(&da), a(&dbb), a(&db), a(&xb), a(&yb), n)
                .expect("backward");
            let (mut wa, mut wb) = (vec![0.0; n], vec![0.0; n]);
            twin::swiglu_backward(&mut wa, &mut wb, &d, &x, &y);
            same_bits("swiglu da", &down(&dev, &da), &wa);
            same_bits("swiglu db", &down(&dev, &dbb), &wb);
        }
    }
}
