//! Launchers of the row-wise kernels (`src/nn/cuda/rows.cu`, CPU twin
//! [`crate::twin::rows`]): biases, embedding gathers and scatters (whole tables and row
//! blocks), position tables, the causal shift, and the deterministic column sum
//! (`bias_partials_f32` + `column_fold_f32`, also the second pass of the LayerNorm
//! backward's dw, db).
//!
//! Ids are **not** validated here: a kernel skips an id outside its table (it cannot
//! return an error), so the caller, which has the ids on the host, rejects bad ones
//! before queueing (the `Device` contract makes them an error).

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::cuda::CudaDevice;
use crate::error::KernelError;
use crate::twin::rows::CHUNK_ROWS;

/// Block size of the column-sum and scatter kernels (rows.cu's THREADS).
const THREADS: u32 = 256;
/// Warps of `column_fold_f32` ([`crate::twin::reduce::FOLD_WARPS`]).
const FOLD_THREADS: u32 = crate::twin::reduce::FOLD_WARPS as u32 * 32;
/// Largest grid.x (CUDA: 2^31 - 1).
const MAX_GRID_X: u64 = i32::MAX as u64;
/// Largest grid.y.
const MAX_GRID_Y: u64 = 65_535;

pub(super) fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::BadShape { op, detail }
}

/// `width` as the kernels' u32, or an error.
pub(super) fn width_u32(op: &'static str, width: usize) -> Result<u32, KernelError> {
    u32::try_from(width).map_err(|_| shape_err(op, format!("width {width} does not fit a u32")))
}

/// A grid dimension that must hold `n` blocks, or an error naming the limit.
pub(super) fn grid_dim(op: &'static str, n: u64, max: u64) -> Result<u32, KernelError> {
    if n > max {
        return Err(shape_err(
            op,
            format!("{n} blocks exceed the grid limit {max}"),
        ));
    }
    Ok(n as u32)
}

/// Blocks striding over `rows` rows (at most 2^31 - 1 blocks; the kernels loop), threads
/// over a row's columns: `width` rounded up to a warp, at most 256.
fn row_launch(rows: u64, width: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.min(MAX_GRID_X) as u32, 1, 1),
        block_dim: (width.next_multiple_of(32).clamp(32, 256), 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Floats of scratch [`bias_backward`] needs: one partial sum per chunk of
/// [`CHUNK_ROWS`] rows and column.
pub(crate) fn bias_backward_scratch_len(rows: usize, width: usize) -> usize {
    rows.div_ceil(CHUNK_ROWS) * width
}

/// Queue a row kernel `name(float* out, const float* src, u64 rows, u32 width, u64 extra)`
/// (or without `extra`).
#[allow(clippy::too_many_arguments)]
fn row_kernel(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    op: &'static str,
    name: &str,
    out: u64,
    src: u64,
    rows: usize,
    width: usize,
    extra: Option<u64>,
) -> Result<(), KernelError> {
    let w = width_u32(op, width)?;
    if rows == 0 || width == 0 {
        return Ok(());
    }
    let rows64 = rows as u64;
    let f = dev.kernel(name)?;
    let mut l = stream.launch_builder(f);
    l.arg(&out).arg(&src).arg(&rows64).arg(&w);
    if let Some(e) = &extra {
        l.arg(e);
    }
    // SAFETY: (float* out, const float* src, u64 rows, u32 width[, u64 extra]) is the
    // kernel's signature (each caller below names its kernel and its extra argument);
    // every thread touches elements of rows < `rows` of width `width` of `out` and the
    // rows of `src` its doc names, within the lengths the caller guarantees.
    unsafe { l.launch(row_launch(rows64, w)) }?;
    Ok(())
}

/// Queue `out[r] := row` for every row r (the semantics of [`crate::nn::fill_rows`]).
/// Launch: blocks over rows, threads over columns.
///
/// The caller guarantees that `out` holds rows*width f32 and `row` width f32.
pub(crate) fn fill_rows(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    out: u64,
    row: u64,
    rows: usize,
    width: usize,
) -> Result<(), KernelError> {
    row_kernel(
        dev,
        stream,
        "fill_rows",
        "fill_rows_f32",
        out,
        row,
        rows,
        width,
        None,
    )
}

/// Queue `out[r] += row` for every row r ([`crate::nn::add_rows`]). Launch as
/// [`fill_rows`]; same contract.
pub(crate) fn add_rows(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    out: u64,
    row: u64,
    rows: usize,
    width: usize,
) -> Result<(), KernelError> {
    row_kernel(
        dev,
        stream,
        "add_rows",
        "add_rows_f32",
        out,
        row,
        rows,
        width,
        None,
    )
}

/// Queue `out[r] += table[r % period]` ([`crate::nn::add_periodic_rows`]). Launch as
/// [`fill_rows`]. An error for period 0.
///
/// The caller guarantees that `out` holds rows*width f32 and `table` period*width f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_periodic_rows(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    out: u64,
    table: u64,
    rows: usize,
    width: usize,
    period: usize,
) -> Result<(), KernelError> {
    let op = "add_periodic_rows";
    if period == 0 {
        return Err(shape_err(op, "period must be positive".into()));
    }
    let name = "add_periodic_rows_f32";
    row_kernel(
        dev,
        stream,
        op,
        name,
        out,
        table,
        rows,
        width,
        Some(period as u64),
    )
}

/// Queue the causal shift ([`crate::nn::shift_rows_forward`]): per sequence of `seq_len`
/// rows, `out[t] = x[t - 1]`, `out[0] = 0`. Launch as [`fill_rows`]. An error for
/// seq_len 0.
///
/// The caller guarantees that `out` and `x` hold rows*width f32 each (rows a multiple of
/// seq_len) and do not overlap.
#[allow(clippy::too_many_arguments)]
pub(crate) fn shift_rows_forward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    out: u64,
    x: u64,
    rows: usize,
    width: usize,
    seq_len: usize,
) -> Result<(), KernelError> {
    let op = "shift_rows_forward";
    if seq_len == 0 {
        return Err(shape_err(op, "seq_len must be positive".into()));
    }
    let name = "shift_rows_forward_f32";
    row_kernel(
        dev,
        stream,
        op,
        name,
        out,
        x,
        rows,
        width,
        Some(seq_len as u64),
    )
}

/// Queue the shift's backward ([`crate::nn::shift_rows_backward`]): `dx[t - 1] +=
/// dout[t]` per sequence. Launch as [`fill_rows`]; contract as [`shift_rows_forward`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn shift_rows_backward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dx: u64,
    dout: u64,
    rows: usize,
    width: usize,
    seq_len: usize,
) -> Result<(), KernelError> {
    let op = "shift_rows_backward";
    if seq_len == 0 {
        return Err(shape_err(op, "seq_len must be positive".into()));
    }
    let name = "shift_rows_backward_f32";
    row_kernel(
        dev,
        stream,
        op,
        name,
        dx,
        dout,
        rows,
        width,
        Some(seq_len as u64),
    )
}

/// Queue `dtable[p] += dout[i]` for rows i = p, p + period, .. in order
/// ([`crate::nn::periodic_rows_backward`], same bits). Launch: one thread per table
/// element (grid-stride over period*width), each adding its column of the rows of its
/// residue in order. An error for period 0.
///
/// The caller guarantees that `dtable` holds period*width f32 and `dout` rows*width f32,
/// not overlapping.
#[allow(clippy::too_many_arguments)]
pub(crate) fn periodic_rows_backward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dtable: u64,
    dout: u64,
    rows: usize,
    width: usize,
    period: usize,
) -> Result<(), KernelError> {
    let op = "periodic_rows_backward";
    if period == 0 {
        return Err(shape_err(op, "period must be positive".into()));
    }
    let w = width_u32(op, width)?;
    let n = period
        .checked_mul(width)
        .ok_or_else(|| shape_err(op, format!("period {period} x width {width} overflows")))?;
    if rows == 0 || n == 0 {
        return Ok(());
    }
    let (rows64, period64) = (rows as u64, period as u64);
    let f = dev.kernel("periodic_rows_backward_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&dtable)
        .arg(&dout)
        .arg(&rows64)
        .arg(&w)
        .arg(&period64);
    // SAFETY: (float* dtable, const float* dout, u64 rows, u32 width, u64 period) is the
    // kernel's signature; thread e < period*width reads and writes dtable[e] and reads
    // dout rows < rows, within the caller's lengths.
    unsafe { l.launch(CudaDevice::elementwise(n)) }?;
    Ok(())
}

/// Queue `db += column sums of dout` ([`crate::nn::bias_backward`], in the order of
/// [`crate::twin::rows::bias_backward`]): `bias_partials_f32` sums each chunk of
/// [`CHUNK_ROWS`] rows per column into `scratch` (grid (chunks, ceil(width/256)), a
/// thread per column), then `column_fold_f32` adds the chunks' sums into `db` (grid
/// ceil(width/32), 8 warps). Deterministic: no atomics.
///
/// The caller guarantees that `db` holds width f32, `dout` rows*width f32 and `scratch`
/// [`bias_backward_scratch_len`]`(rows, width)` f32, `scratch` overlapping neither.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bias_backward(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    db: u64,
    scratch: u64,
    dout: u64,
    rows: usize,
    width: usize,
) -> Result<(), KernelError> {
    let op = "bias_backward";
    let w = width_u32(op, width)?;
    if rows == 0 || width == 0 {
        return Ok(());
    }
    let chunks = rows.div_ceil(CHUNK_ROWS) as u64;
    let cfg = LaunchConfig {
        grid_dim: (
            grid_dim(op, chunks, MAX_GRID_X)?,
            grid_dim(op, (width as u64).div_ceil(THREADS as u64), MAX_GRID_Y)?,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let rows64 = rows as u64;
    let f = dev.kernel("bias_partials_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&scratch).arg(&dout).arg(&rows64).arg(&w);
    // SAFETY: (float* partial, const float* dout, u64 rows, u32 width) is the kernel's
    // signature; block (k, t) reads dout rows of chunk k, columns of tile t (< width),
    // and writes partial[k * width + col] < chunks*width = the scratch length.
    unsafe { l.launch(cfg) }?;
    column_fold(dev, stream, op, [db, db], 1, scratch, chunks, w)
}

/// Queue `column_fold_f32`: `dst[s][col] += ` the fold over chunks of
/// `partial[s * chunks * width + k * width + col]` for the `sets` (1 or 2) destinations.
/// Grid (ceil(width/32), sets), 8 warps per block.
///
/// The caller guarantees that `partial` holds sets*chunks*width f32 and each used `dst`
/// width f32, overlapping nothing else.
#[allow(clippy::too_many_arguments)]
pub(super) fn column_fold(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    op: &'static str,
    dst: [u64; 2],
    sets: u32,
    partial: u64,
    chunks: u64,
    width: u32,
) -> Result<(), KernelError> {
    let cfg = LaunchConfig {
        grid_dim: (
            grid_dim(op, (width as u64).div_ceil(32), MAX_GRID_X)?,
            sets,
            1,
        ),
        block_dim: (FOLD_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = dev.kernel("column_fold_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&dst[0])
        .arg(&dst[1])
        .arg(&partial)
        .arg(&chunks)
        .arg(&width);
    // SAFETY: (float* dst0, float* dst1, const float* partial, u64 chunks, u32 width) is
    // the kernel's signature; block (t, s) reads partial set s (chunks*width floats) at
    // columns of tile t below width and writes dst_s there; dst1 is read only when
    // sets = 2.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// The id range of a lookup: ids in `first .. first + nrows`; `None` when no u32 id can
/// fall in it (nothing to do).
fn id_range(first: usize, nrows: usize) -> Option<(u64, u64)> {
    (nrows > 0 && first <= u32::MAX as usize).then_some((first as u64, nrows as u64))
}

/// Queue `out[i] = block[ids[i] - first]` for the ids in `first .. first + block_rows`
/// ([`crate::nn::gather_rows_block`]; [`gather_rows`] is `first` = 0); rows of `out`
/// whose id falls outside are left alone. Launch: blocks over the `rows` positions,
/// threads over columns.
///
/// Ids are not validated (see the module doc). The caller guarantees that `out` holds
/// rows*width f32, `ids` rows u32 and `block` block_rows*width f32, `out` overlapping
/// neither.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_rows_block(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    out: u64,
    ids: u64,
    block: u64,
    rows: usize,
    width: usize,
    first: usize,
    block_rows: usize,
) -> Result<(), KernelError> {
    let w = width_u32("gather_rows", width)?;
    let Some((first64, n64)) = id_range(first, block_rows) else {
        return Ok(());
    };
    if rows == 0 || width == 0 {
        return Ok(());
    }
    let rows64 = rows as u64;
    let f = dev.kernel("gather_rows_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&out)
        .arg(&ids)
        .arg(&block)
        .arg(&rows64)
        .arg(&w)
        .arg(&first64)
        .arg(&n64);
    // SAFETY: (float* out, const u32* ids, const float* block, u64 rows, u32 width,
    // u64 first, u64 nrows) is the kernel's signature; block r reads ids[r] and, only
    // when first <= id < first + nrows, block row id - first and writes out row r.
    unsafe { l.launch(row_launch(rows64, w)) }?;
    Ok(())
}

/// Queue `out[i] = table[ids[i]]` ([`crate::nn::gather_rows`]): [`gather_rows_block`]
/// over the whole table of `table_rows` rows (ids past it are skipped, see the module
/// doc).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_rows(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    out: u64,
    ids: u64,
    table: u64,
    rows: usize,
    width: usize,
    table_rows: usize,
) -> Result<(), KernelError> {
    gather_rows_block(dev, stream, out, ids, table, rows, width, 0, table_rows)
}

/// Queue `dblock[ids[i] - first] += dout[i]`, i ascending, for the ids in `first ..
/// first + block_rows` ([`crate::nn::scatter_add_rows_block`], same bits;
/// [`scatter_add_rows`] is `first` = 0). Launch: one block of 256 threads per position
/// i (blocks stride over positions); the block of the first position naming a row finds
/// the later ones (each thread compares 4 ids per pass) and adds their dout rows in
/// order (threads over columns, 4 columns per thread in registers), the other blocks
/// return. No atomics; each block compares O(rows) ids (1024 per pass), which keeps it
/// to tens of microseconds at rows = 16384 but grows as rows^2.
///
/// Ids are not validated (see the module doc). The caller guarantees that `dblock`
/// holds block_rows*width f32, `ids` rows u32 and `dout` rows*width f32, `dblock`
/// overlapping neither.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter_add_rows_block(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dblock: u64,
    ids: u64,
    dout: u64,
    rows: usize,
    width: usize,
    first: usize,
    block_rows: usize,
) -> Result<(), KernelError> {
    let w = width_u32("scatter_add_rows", width)?;
    let Some((first64, n64)) = id_range(first, block_rows) else {
        return Ok(());
    };
    if rows == 0 || width == 0 {
        return Ok(());
    }
    let rows64 = rows as u64;
    let cfg = LaunchConfig {
        grid_dim: (rows64.min(MAX_GRID_X) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = dev.kernel("scatter_add_rows_f32")?;
    let mut l = stream.launch_builder(f);
    l.arg(&dblock)
        .arg(&ids)
        .arg(&dout)
        .arg(&rows64)
        .arg(&w)
        .arg(&first64)
        .arg(&n64);
    // SAFETY: (float* dblock, const u32* ids, const float* dout, u64 n, u32 width,
    // u64 first, u64 nrows) is the kernel's signature; it reads ids[< n], dout rows < n,
    // and reads and writes dblock row id - first only for first <= id < first + nrows,
    // each row from one block only.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Queue `dtable[ids[i]] += dout[i]` in i order ([`crate::nn::scatter_add_rows`]):
/// [`scatter_add_rows_block`] over the whole table of `table_rows` rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter_add_rows(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dtable: u64,
    ids: u64,
    dout: u64,
    rows: usize,
    width: usize,
    table_rows: usize,
) -> Result<(), KernelError> {
    scatter_add_rows_block(dev, stream, dtable, ids, dout, rows, width, 0, table_rows)
}

/// Helpers of the GPU tests of the model launchers: on a machine with a GPU each
/// launcher is run on pseudo-random data and compared with its CPU twin bit for bit;
/// without a driver (or without a GPU) the tests return at once.
#[cfg(test)]
pub(super) mod gpu {
    use crate::cuda::{CudaDevice, DeviceBuffer, DeviceElement};
    use crate::error::KernelError;

    /// GPU 0, or `None` where there is none.
    pub(crate) fn device() -> Option<CudaDevice> {
        if !CudaDevice::driver_present() {
            return None;
        }
        match CudaDevice::new(0) {
            Ok(d) => Some(d),
            Err(KernelError::NoSuchDevice { .. }) => None,
            Err(e) => panic!("opening GPU 0: {e}"),
        }
    }

    /// Values of both signs and several magnitudes (xorshift from `seed`).
    pub(crate) fn vals(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                u * [1.0, 3.7, 0.01, 25.0][(s & 3) as usize]
            })
            .collect()
    }

    pub(crate) fn up<T: DeviceElement>(dev: &CudaDevice, v: &[T]) -> DeviceBuffer<T> {
        DeviceBuffer::from_host(dev, v).expect("upload")
    }

    pub(crate) fn down(dev: &CudaDevice, b: &DeviceBuffer<f32>) -> Vec<f32> {
        b.to_host(dev).expect("download")
    }

    /// Equal bits (any NaN equals any NaN: the GPU's NaN is canonical).
    pub(crate) fn same_bits(what: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        let bad = got
            .iter()
            .zip(want)
            .position(|(g, w)| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()));
        if let Some(i) = bad {
            panic!("{what}: element {i}: GPU {} vs twin {}", got[i], want[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gpu::{device, down, same_bits, up, vals};
    use super::*;
    use crate::cuda::DeviceBuffer;
    use crate::twin::rows as twin;

    /// (rows, width): odd sizes, widths below and above a block, several chunks.
    const SHAPES: [(usize, usize); 6] =
        [(1, 1), (3, 5), (33, 7), (100, 300), (1000, 33), (4096, 768)];

    #[test]
    fn gpu_row_ops_equal_their_twins() {
        let Some(dev) = device() else { return };
        let s = dev.default_stream().clone();
        for (k, &(rows, w)) in SHAPES.iter().enumerate() {
            let seed = k as u64 * 100;
            let base = vals(rows * w, seed);
            let row = vals(w, seed + 1);
            let (rb, rowb) = (up(&dev, &base), up(&dev, &row));

            let out = up(&dev, &base);
            fill_rows(&dev, &s, out.addr(&dev, 0), rowb.addr(&dev, 0), rows, w).expect("fill_rows");
            let mut want = base.clone();
            twin::fill_rows(&mut want, &row);
            same_bits("fill_rows", &down(&dev, &out), &want);

            let out = up(&dev, &base);
            add_rows(&dev, &s, out.addr(&dev, 0), rowb.addr(&dev, 0), rows, w).expect("add_rows");
            let mut want = base.clone();
            twin::add_rows(&mut want, &row);
            same_bits("add_rows", &down(&dev, &out), &want);

            let db0 = vals(w, seed + 2);
            let db = up(&dev, &db0);
            let scratch = DeviceBuffer::<f32>::zeros(&dev, bias_backward_scratch_len(rows, w))
                .expect("alloc");
            let (d, sc, src) = (db.addr(&dev, 0), scratch.addr(&dev, 0), rb.addr(&dev, 0));
            bias_backward(&dev, &s, d, sc, src, rows, w).expect("bias_backward");
            let mut want = db0.clone();
            twin::bias_backward(&mut want, &base);
            same_bits("bias_backward", &down(&dev, &db), &want);

            for period in [1, 7, rows] {
                let table = vals(period * w, seed + 3);
                let tb = up(&dev, &table);
                let out = up(&dev, &base);
                let (o, t) = (out.addr(&dev, 0), tb.addr(&dev, 0));
                add_periodic_rows(&dev, &s, o, t, rows, w, period).expect("add_periodic_rows");
                let mut want = base.clone();
                twin::add_periodic_rows(&mut want, &table, period, w);
                same_bits("add_periodic_rows", &down(&dev, &out), &want);
                periodic_rows_backward(&dev, &s, t, src, rows, w, period)
                    .expect("periodic backward");
                let mut want = table.clone();
                twin::periodic_rows_backward(&mut want, &base, period, w);
                same_bits("periodic_rows_backward", &down(&dev, &tb), &want);
            }

            for seq in [1, rows] {
                let x = vals(rows * w, seed + 4);
                let xb = up(&dev, &x);
                let out = up(&dev, &base);
                let (o, xa) = (out.addr(&dev, 0), xb.addr(&dev, 0));
                shift_rows_forward(&dev, &s, o, xa, rows, w, seq).expect("shift forward");
                let mut want = base.clone();
                twin::shift_rows_forward(&mut want, &x, seq, w);
                same_bits("shift_rows_forward", &down(&dev, &out), &want);
                let out = up(&dev, &base);
                let o = out.addr(&dev, 0);
                shift_rows_backward(&dev, &s, o, xa, rows, w, seq).expect("shift backward");
                let mut want = base.clone();
                twin::shift_rows_backward(&mut want, &x, seq, w);
                same_bits("shift_rows_backward", &down(&dev, &out), &want);
            }
        }
    }

    #[test]
    fn gpu_gathers_and_scatters_equal_their_twins() {
        let Some(dev) = device() else { return };
        let s = dev.default_stream().clone();
        for (k, &(rows, w)) in SHAPES.iter().enumerate() {
            for n in [1, 5, 50_257.min(rows * 3 + 1)] {
                let seed = k as u64 * 100 + n as u64;
                // Repeats (n small), skewed ids, and one id past the table.
                let mut ids: Vec<u32> = (0..rows)
                    .map(|i| ((i * i * 7 + i * 3 + k) % n) as u32)
                    .collect();
                ids[rows / 2] = n as u32 + 3;
                let table = vals(n * w, seed);
                let dout = vals(rows * w, seed + 1);
                let base = vals(rows * w, seed + 2);
                let (ib, tb, gb) = (up(&dev, &ids), up(&dev, &table), up(&dev, &dout));
                let (ia, ta, ga) = (ib.addr(&dev, 0), tb.addr(&dev, 0), gb.addr(&dev, 0));
                for (lo, hi) in [(0, n), (0, n / 2), (n / 2, n)] {
                    let blk = &table[lo * w..hi * w];
                    let blk_addr = tb.addr(&dev, lo * w);
                    let out = up(&dev, &base);
                    let o = out.addr(&dev, 0);
                    gather_rows_block(&dev, &s, o, ia, blk_addr, rows, w, lo, hi - lo)
                        .expect("gather");
                    let mut want = base.clone();
                    twin::gather_rows_block(&mut want, &ids, blk, lo, w);
                    same_bits("gather_rows_block", &down(&dev, &out), &want);

                    let db = up(&dev, blk);
                    let d = db.addr(&dev, 0);
                    scatter_add_rows_block(&dev, &s, d, ia, ga, rows, w, lo, hi - lo)
                        .expect("scatter");
                    let mut want = blk.to_vec();
                    twin::scatter_add_rows_block(&mut want, &ids, &dout, lo, w);
                    same_bits("scatter_add_rows_block", &down(&dev, &db), &want);
                }
                let out = up(&dev, &base);
                gather_rows(&dev, &s, out.addr(&dev, 0), ia, ta, rows, w, n).expect("gather");
                let mut want = base.clone();
                twin::gather_rows(&mut want, &ids, &table, w);
                same_bits("gather_rows", &down(&dev, &out), &want);
                let db = up(&dev, &table);
                scatter_add_rows(&dev, &s, db.addr(&dev, 0), ia, ga, rows, w, n).expect("scatter");
                let mut want = table.clone();
                twin::scatter_add_rows(&mut want, &ids, &dout, w);
                same_bits("scatter_add_rows", &down(&dev, &db), &want);
            }
        }
    }
}
