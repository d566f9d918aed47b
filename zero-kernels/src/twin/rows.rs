//! CPU twin of `src/nn/cuda/rows.cu`: the row-wise ops of [`crate::nn::rows`] (same
//! signatures) in the GPU kernels' order.
//!
//! Every op but [`bias_backward`] is the CPU kernel's order exactly (one operation per
//! element, or sums in the same row order), so those agree with [`crate::nn`] bit for
//! bit; [`bias_backward`] sums columns in chunks of [`CHUNK_ROWS`] rows, then over chunks
//! ([`super::reduce::fold_columns`]).
//!
//! The GPU cannot fail a launch on a bad id cheaply, so its kernels skip ids past the
//! table (the host validates ids first); these twins skip them too, where the CPU
//! kernels panic. Shape mismatches panic as in [`crate::nn::rows`].

use super::reduce::fold_columns;
use crate::nn::Scalar;

/// Rows per partial column sum (rows.cu's and norm.cu's CHUNK).
pub const CHUNK_ROWS: usize = 32;

/// Rows of `len` elements of width `width`, or a panic naming `what`.
fn rows_of(what: &str, len: usize, width: usize) -> usize {
    assert!(width > 0, "{what}: width must be positive");
    assert!(
        len.is_multiple_of(width),
        "{what}: {len} elements are not whole rows of width {width}"
    );
    len / width
}

fn same_len(what: &str, a: usize, b: usize) {
    assert!(a == b, "{what}: buffers of {a} and {b} elements");
}

/// The first pass of a column sum over `rows` rows (`bias_partials_f32`): `[chunks,
/// width]` with chunk k's entry for column j = `term(r, j)` summed over the rows r of
/// chunk k ([`CHUNK_ROWS`] rows; the last may be shorter), ascending, from 0.
pub fn chunk_partials<F: Scalar>(
    rows: usize,
    width: usize,
    term: impl Fn(usize, usize) -> F,
) -> Vec<F> {
    let chunks = rows.div_ceil(CHUNK_ROWS);
    let mut partial = vec![F::ZERO; chunks * width];
    for (k, p) in partial.chunks_exact_mut(width.max(1)).enumerate() {
        let r1 = ((k + 1) * CHUNK_ROWS).min(rows);
        for (j, acc) in p.iter_mut().enumerate() {
            for r in k * CHUNK_ROWS..r1 {
                *acc += term(r, j);
            }
        }
    }
    partial
}

/// Every row of `out` := `row` (**writes**).
pub fn fill_rows<F: Scalar>(out: &mut [F], row: &[F]) {
    rows_of("fill_rows", out.len(), row.len());
    out.chunks_exact_mut(row.len())
        .for_each(|r| r.copy_from_slice(row));
}

/// Every row of `out` += `row`.
pub fn add_rows<F: Scalar>(out: &mut [F], row: &[F]) {
    rows_of("add_rows", out.len(), row.len());
    for r in out.chunks_exact_mut(row.len()) {
        r.iter_mut().zip(row).for_each(|(o, &b)| *o += b);
    }
}

/// `db += column sums of dout` (**adds**), in the GPU order: per chunk of [`CHUNK_ROWS`]
/// rows, then over chunks ([`fold_columns`]).
pub fn bias_backward<F: Scalar>(db: &mut [F], dout: &[F]) {
    let width = db.len();
    let rows = rows_of("bias_backward", dout.len(), width);
    let partial = chunk_partials(rows, width, |r, j| dout[r * width + j]);
    fold_columns(db, &partial, rows.div_ceil(CHUNK_ROWS), width);
}

/// `out[i] = table[ids[i]]` (**writes**); rows whose id is past the table are skipped.
pub fn gather_rows<F: Scalar>(out: &mut [F], ids: &[u32], table: &[F], width: usize) {
    gather_rows_block(out, ids, table, 0, width);
}

/// `dtable[ids[i]] += dout[i]` (**adds**), i in order; ids past the table are skipped.
pub fn scatter_add_rows<F: Scalar>(dtable: &mut [F], ids: &[u32], dout: &[F], width: usize) {
    scatter_add_rows_block(dtable, ids, dout, 0, width);
}

/// The row of a block that `id` names, if it is in `first .. first + n`.
fn block_row(id: u32, first: usize, n: usize) -> Option<usize> {
    (id as usize).checked_sub(first).filter(|&r| r < n)
}

/// `out[i] = block[ids[i] - first]` (**writes**) for ids in `first .. first + rows`;
/// other rows of `out` are left as they are.
pub fn gather_rows_block<F: Scalar>(
    out: &mut [F],
    ids: &[u32],
    block: &[F],
    first: usize,
    width: usize,
) {
    let rows = rows_of("gather_rows_block", out.len(), width);
    same_len("gather_rows_block (out rows, ids)", rows, ids.len());
    let n = rows_of("gather_rows_block table", block.len(), width);
    for (o, &id) in out.chunks_exact_mut(width).zip(ids) {
        if let Some(r) = block_row(id, first, n) {
            o.copy_from_slice(&block[r * width..][..width]);
        }
    }
}

/// `dblock[ids[i] - first] += dout[i]` (**adds**) for ids in the block, in i order, the
/// way `scatter_add_rows_f32` does it: the first position naming a row takes the row's
/// value and adds the dout rows of every position naming it, ascending; later positions
/// naming it do nothing.
pub fn scatter_add_rows_block<F: Scalar>(
    dblock: &mut [F],
    ids: &[u32],
    dout: &[F],
    first: usize,
    width: usize,
) {
    let rows = rows_of("scatter_add_rows_block", dout.len(), width);
    same_len("scatter_add_rows_block (dout rows, ids)", rows, ids.len());
    let n = rows_of("scatter_add_rows_block table", dblock.len(), width);
    // Positions naming each row, ascending (what the first position's block finds by
    // scanning the ids after it).
    let mut positions: std::collections::HashMap<u32, Vec<usize>> = Default::default();
    for (i, &id) in ids.iter().enumerate() {
        if block_row(id, first, n).is_some() {
            positions.entry(id).or_default().push(i);
        }
    }
    for (i, &id) in ids.iter().enumerate() {
        let Some(r) = block_row(id, first, n) else {
            continue;
        };
        let at = &positions[&id];
        if at[0] != i {
            continue; // an earlier position's block adds this one
        }
        let row = &mut dblock[r * width..][..width];
        for (col, e) in row.iter_mut().enumerate() {
            let mut acc = *e;
            for &j in at {
                acc += dout[j * width + col];
            }
            *e = acc;
        }
    }
}

/// `out[i] += table[i % period]` for every row i of `out`.
pub fn add_periodic_rows<F: Scalar>(out: &mut [F], table: &[F], period: usize, width: usize) {
    rows_of("add_periodic_rows", out.len(), width);
    assert!(period > 0, "add_periodic_rows: period must be positive");
    same_len(
        "add_periodic_rows (table, period*width)",
        table.len(),
        period * width,
    );
    for (i, o) in out.chunks_exact_mut(width).enumerate() {
        let p = &table[(i % period) * width..][..width];
        o.iter_mut().zip(p).for_each(|(o, &p)| *o += p);
    }
}

/// `dtable[i % period] += dout[i]` (**adds**), rows i in order: one accumulator per
/// element of the table, as `periodic_rows_backward_f32`'s threads.
pub fn periodic_rows_backward<F: Scalar>(
    dtable: &mut [F],
    dout: &[F],
    period: usize,
    width: usize,
) {
    let rows = rows_of("periodic_rows_backward", dout.len(), width);
    assert!(
        period > 0,
        "periodic_rows_backward: period must be positive"
    );
    same_len(
        "periodic_rows_backward (dtable, period*width)",
        dtable.len(),
        period * width,
    );
    for (e, d) in dtable.iter_mut().enumerate() {
        let (p, j) = (e / width, e % width);
        let mut acc = *d;
        for i in (p..rows).step_by(period) {
            acc += dout[i * width + j];
        }
        *d = acc;
    }
}

/// Causal token shift (**writes**): per sequence of `seq_len` rows, `out[t] = x[t - 1]`,
/// `out[0] = 0`.
pub fn shift_rows_forward<F: Scalar>(out: &mut [F], x: &[F], seq_len: usize, width: usize) {
    same_len("shift_rows_forward (out, x)", out.len(), x.len());
    rows_of("shift_rows_forward", x.len(), width);
    rows_of("shift_rows_forward (sequences)", x.len(), seq_len * width);
    for (r, o) in out.chunks_exact_mut(width).enumerate() {
        if r % seq_len == 0 {
            o.fill(F::ZERO);
        } else {
            o.copy_from_slice(&x[(r - 1) * width..][..width]);
        }
    }
}

/// The backward of [`shift_rows_forward`] (**adds**): `dx[t - 1] += dout[t]` per sequence.
pub fn shift_rows_backward<F: Scalar>(dx: &mut [F], dout: &[F], seq_len: usize, width: usize) {
    same_len("shift_rows_backward (dx, dout)", dx.len(), dout.len());
    let rows = rows_of("shift_rows_backward", dout.len(), width);
    rows_of(
        "shift_rows_backward (sequences)",
        dout.len(),
        seq_len * width,
    );
    for (r, d) in dx.chunks_exact_mut(width).enumerate() {
        if r % seq_len == seq_len - 1 || r + 1 >= rows {
            continue;
        }
        let g = &dout[(r + 1) * width..][..width];
        d.iter_mut().zip(g).for_each(|(d, &g)| *d += g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn;

    /// Distinct, non-integer values of both signs and a spread of magnitudes, so a wrong
    /// index, a missing term or another summation order shows.
    fn vals(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                u * [1.0, 3.7, 0.01, 250.0][(s & 3) as usize]
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// (rows, width) shapes: rows not a multiple of 32 or of a chunk, widths below 32,
    /// not a multiple of 4, one row.
    const SHAPES: [(usize, usize); 8] = [
        (1, 1),
        (1, 37),
        (3, 5),
        (31, 7),
        (32, 32),
        (33, 3),
        (97, 130),
        (300, 19),
    ];

    #[test]
    fn exact_ops_equal_the_cpu_kernels_bitwise() {
        for (seed, &(rows, w)) in SHAPES.iter().enumerate() {
            let seed = seed as u64;
            let row = vals(w, seed);
            let base = vals(rows * w, seed + 100);
            let (mut a, mut b) = (base.clone(), base.clone());
            fill_rows(&mut a, &row);
            nn::fill_rows(&mut b, &row);
            assert_eq!(bits(&a), bits(&b));
            let (mut a, mut b) = (base.clone(), base.clone());
            add_rows(&mut a, &row);
            nn::add_rows(&mut b, &row);
            assert_eq!(bits(&a), bits(&b), "add_rows {rows}x{w}");

            for period in [1, 2, 7, rows, rows + 3] {
                let table = vals(period * w, seed + 200);
                let (mut a, mut b) = (base.clone(), base.clone());
                add_periodic_rows(&mut a, &table, period, w);
                nn::add_periodic_rows(&mut b, &table, period, w);
                assert_eq!(bits(&a), bits(&b));
                let (mut a, mut b) = (table.clone(), table.clone());
                periodic_rows_backward(&mut a, &base, period, w);
                nn::periodic_rows_backward(&mut b, &base, period, w);
                assert_eq!(bits(&a), bits(&b), "periodic {rows}x{w} period {period}");
            }
            for seq in (1..=rows).filter(|s| rows % s == 0) {
                let (mut a, mut b) = (base.clone(), base.clone());
                let x = vals(rows * w, seed + 300);
                shift_rows_forward(&mut a, &x, seq, w);
                nn::shift_rows_forward(&mut b, &x, seq, w);
                assert_eq!(bits(&a), bits(&b));
                let (mut a, mut b) = (base.clone(), base.clone());
                shift_rows_backward(&mut a, &x, seq, w);
                nn::shift_rows_backward(&mut b, &x, seq, w);
                assert_eq!(bits(&a), bits(&b), "shift {rows}x{w} seq {seq}");
            }
        }
    }

    #[test]
    fn gather_and_scatter_equal_the_cpu_kernels_bitwise() {
        for (seed, &(rows, w)) in SHAPES.iter().enumerate() {
            let seed = seed as u64;
            for n in [1, 3, 17, 40] {
                // Ids with repeats (a small table) and without (a large one).
                let ids: Vec<u32> = (0..rows)
                    .map(|i| ((i * 7 + i * i * 3 + seed as usize) % n) as u32)
                    .collect();
                let table = vals(n * w, seed + 400);
                let base = vals(rows * w, seed + 500);
                let (mut a, mut b) = (base.clone(), base.clone());
                gather_rows(&mut a, &ids, &table, w);
                nn::gather_rows(&mut b, &ids, &table, w);
                assert_eq!(bits(&a), bits(&b));
                let (mut a, mut b) = (table.clone(), table.clone());
                scatter_add_rows(&mut a, &ids, &base, w);
                nn::scatter_add_rows(&mut b, &ids, &base, w);
                assert_eq!(bits(&a), bits(&b), "scatter {rows}x{w} n {n}");
                // Row blocks: each block's rows as the CPU block kernels give them.
                for (lo, hi) in [(0, n / 2), (n / 2, n), (1.min(n), n)] {
                    let blk = &table[lo * w..hi * w];
                    let (mut a, mut b) = (base.clone(), base.clone());
                    gather_rows_block(&mut a, &ids, blk, lo, w);
                    nn::gather_rows_block(&mut b, &ids, blk, lo, w);
                    assert_eq!(bits(&a), bits(&b));
                    let (mut a, mut b) = (blk.to_vec(), blk.to_vec());
                    scatter_add_rows_block(&mut a, &ids, &base, lo, w);
                    nn::scatter_add_rows_block(&mut b, &ids, &base, lo, w);
                    assert_eq!(bits(&a), bits(&b), "scatter block {lo}..{hi}");
                }
            }
        }
    }

    #[test]
    fn ids_past_the_table_are_skipped() {
        let table = vals(6, 1);
        let mut out = vec![5.0f32; 4];
        gather_rows(&mut out, &[3, 1], &table, 2);
        assert_eq!(out, [5.0, 5.0, table[2], table[3]]);
        let mut dt = table.clone();
        scatter_add_rows(&mut dt, &[7, 0], &[1.0, 2.0, 3.0, 4.0], 2);
        assert_eq!(dt[..2], [table[0] + 3.0, table[1] + 4.0]);
        assert_eq!(dt[2..], table[2..]);
    }

    #[test]
    fn bias_backward_tracks_the_cpu_kernel_and_f64() {
        for (seed, &(rows, w)) in SHAPES.iter().enumerate() {
            for rows in [rows, rows * 9 + 5] {
                let dout = vals(rows * w, seed as u64 + 600);
                let db0 = vals(w, seed as u64 + 700);
                let (mut a, mut b) = (db0.clone(), db0.clone());
                bias_backward(&mut a, &dout);
                nn::bias_backward(&mut b, &dout);
                for j in 0..w {
                    let exact: f64 =
                        db0[j] as f64 + (0..rows).map(|r| dout[r * w + j] as f64).sum::<f64>();
                    let mag: f64 = db0[j].abs() as f64
                        + (0..rows).map(|r| dout[r * w + j].abs() as f64).sum::<f64>();
                    let tol = 1e-6 * mag;
                    assert!((a[j] as f64 - exact).abs() <= tol, "{rows}x{w} col {j}");
                    assert!(
                        (a[j] - b[j]).abs() as f64 <= 2.0 * tol,
                        "{rows}x{w} col {j}"
                    );
                }
                // The generic twin in f64 follows the exact sum closely.
                let d64: Vec<f64> = dout.iter().map(|&v| v as f64).collect();
                let mut c: Vec<f64> = db0.iter().map(|&v| v as f64).collect();
                bias_backward(&mut c, &d64);
                for j in 0..w {
                    let exact: f64 =
                        db0[j] as f64 + (0..rows).map(|r| dout[r * w + j] as f64).sum::<f64>();
                    let mag: f64 = db0[j].abs() as f64
                        + (0..rows).map(|r| dout[r * w + j].abs() as f64).sum::<f64>();
                    assert!((c[j] - exact).abs() <= 1e-13 * mag);
                }
            }
        }
    }

    #[test]
    fn chunk_partials_cover_every_row_once() {
        for rows in [1, 31, 32, 33, 64, 65] {
            let p: Vec<f64> = chunk_partials(rows, 2, |r, j| (r * 2 + j) as f64);
            assert_eq!(p.len(), rows.div_ceil(CHUNK_ROWS) * 2);
            let total: f64 = p.iter().sum();
            let want: f64 = (0..rows * 2).map(|e| e as f64).sum();
            assert_eq!(total, want);
        }
    }
}
