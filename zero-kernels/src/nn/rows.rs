//! Row-wise helpers over row-major buffers `[rows, width]`: biases, embedding lookups and
//! their gradients, position tables, a causal token shift, and elementwise sums.
//!
//! Every function panics when a buffer is not a whole number of rows of its width, a width
//! is 0, buffers that must have the same rows do not, or an id names a row past its
//! table: shape bugs in the calling layer, never user input (a model validates token ids
//! when a batch is handed in).

use super::scalar::Scalar;

/// Rows of `len` elements of width `width`, or a panic naming `what`.
fn rows_of(what: &str, len: usize, width: usize) -> usize {
    assert!(width > 0, "{what}: width must be positive");
    assert!(
        len.is_multiple_of(width),
        "{what}: {len} elements are not whole rows of width {width}"
    );
    len / width
}

/// Panics unless the two buffers have the same number of elements.
fn same_len(what: &str, a: usize, b: usize) {
    assert!(a == b, "{what}: buffers of {a} and {b} elements");
}

/// Set every row of `out` (width `row.len()`) to `row` (**writes**): the bias before a
/// GEMM adds X W^T with beta = 1.
pub fn fill_rows<F: Scalar>(out: &mut [F], row: &[F]) {
    rows_of("fill_rows", out.len(), row.len());
    out.chunks_exact_mut(row.len())
        .for_each(|r| r.copy_from_slice(row));
}

/// `out[i] += row` for every row i of `out` (width `row.len()`): a bias added onto rows
/// that already hold a residual.
#[inline(always)]
pub fn add_rows<F: Scalar>(out: &mut [F], row: &[F]) {
    rows_of("add_rows", out.len(), row.len());
    for r in out.chunks_exact_mut(row.len()) {
        r.iter_mut().zip(row).for_each(|(o, &b)| *o += b);
    }
}

/// `db += sum over rows of dout` (**adds**; rows in order): the bias gradient of a
/// linear layer, width `db.len()`.
#[inline(always)]
pub fn bias_backward<F: Scalar>(db: &mut [F], dout: &[F]) {
    rows_of("bias_backward", dout.len(), db.len());
    for r in dout.chunks_exact(db.len()) {
        db.iter_mut().zip(r).for_each(|(d, &g)| *d += g);
    }
}

/// [`bias_backward`] for the channels `first .. first + db.len()` of rows of width `width`
/// (**adds**; rows in order). Each channel receives the same sum in the same order as in
/// [`bias_backward`], so a split of the channels over threads gives its bits: no sum
/// crosses a split.
#[inline(always)]
pub fn bias_backward_channels<F: Scalar>(db: &mut [F], dout: &[F], width: usize, first: usize) {
    rows_of("bias_backward_channels", dout.len(), width);
    assert!(
        first + db.len() <= width,
        "bias_backward_channels: channels {first}..{} of {width}",
        first + db.len()
    );
    for r in dout.chunks_exact(width) {
        db.iter_mut().zip(&r[first..]).for_each(|(d, &g)| *d += g);
    }
}

/// `out[i] = table[ids[i]]` (**writes**) for rows of width `width`: an embedding lookup.
/// `out` has `ids.len()` rows; `table` any number of rows.
pub fn gather_rows<F: Scalar>(out: &mut [F], ids: &[u32], table: &[F], width: usize) {
    let rows = rows_of("gather_rows", out.len(), width);
    same_len("gather_rows (out rows, ids)", rows, ids.len());
    let n = rows_of("gather_rows table", table.len(), width);
    for (o, &id) in out.chunks_exact_mut(width).zip(ids) {
        assert!(
            (id as usize) < n,
            "gather_rows: id {id} past a table of {n} rows"
        );
        o.copy_from_slice(&table[id as usize * width..][..width]);
    }
}

/// `dtable[ids[i]] += dout[i]` (**adds**), for i in order, so a row named twice receives
/// its gradients in position order: the embedding lookup's backward.
pub fn scatter_add_rows<F: Scalar>(dtable: &mut [F], ids: &[u32], dout: &[F], width: usize) {
    let rows = rows_of("scatter_add_rows", dout.len(), width);
    same_len("scatter_add_rows (dout rows, ids)", rows, ids.len());
    let n = rows_of("scatter_add_rows table", dtable.len(), width);
    for (g, &id) in dout.chunks_exact(width).zip(ids) {
        assert!(
            (id as usize) < n,
            "scatter_add_rows: id {id} past a table of {n} rows"
        );
        let e = &mut dtable[id as usize * width..][..width];
        e.iter_mut().zip(g).for_each(|(e, &g)| *e += g);
    }
}

/// `out[i] = block[ids[i] - first]` (**writes**) for the ids in `first .. first + rows`
/// of `block` (rows of width `width`); the rows of `out` whose id falls outside are left
/// as they are. A lookup in one row block of a table split by rows: the blocks' lookups
/// together write every row once, with the values of [`gather_rows`] on the whole table.
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
        if let Some(r) = (id as usize).checked_sub(first).filter(|&r| r < n) {
            o.copy_from_slice(&block[r * width..][..width]);
        }
    }
}

/// `dblock[ids[i] - first] += dout[i]` (**adds**) for the ids in `first .. first + rows`,
/// in i order: the backward of [`gather_rows_block`]. Each row of the whole table gets
/// the sums [`scatter_add_rows`] would give it, in the same order.
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
    for (g, &id) in dout.chunks_exact(width).zip(ids) {
        if let Some(r) = (id as usize).checked_sub(first).filter(|&r| r < n) {
            let e = &mut dblock[r * width..][..width];
            e.iter_mut().zip(g).for_each(|(e, &g)| *e += g);
        }
    }
}

/// `out[i] += table[i % period]` for every row i of `out`: a table of `period` rows
/// repeated down the buffer (GPT-2's position embedding wpe, period T, over [B*T, C]).
/// `table` has exactly `period` rows.
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

/// `dtable[i % period] += dout[i]` (**adds**), for rows i in order: the backward of
/// [`add_periodic_rows`]. `dtable` has exactly `period` rows.
pub fn periodic_rows_backward<F: Scalar>(
    dtable: &mut [F],
    dout: &[F],
    period: usize,
    width: usize,
) {
    rows_of("periodic_rows_backward", dout.len(), width);
    assert!(
        period > 0,
        "periodic_rows_backward: period must be positive"
    );
    same_len(
        "periodic_rows_backward (dtable, period*width)",
        dtable.len(),
        period * width,
    );
    for (i, g) in dout.chunks_exact(width).enumerate() {
        let p = &mut dtable[(i % period) * width..][..width];
        p.iter_mut().zip(g).for_each(|(p, &g)| *p += g);
    }
}

/// A causal token shift (**writes**): per sequence of `seq_len` consecutive rows,
/// `out[t] = x[t - 1]` for t >= 1 and `out[0] = 0`, so position t sees the previous
/// token and never the next. `out` and `x` have the same whole number of sequences.
pub fn shift_rows_forward<F: Scalar>(out: &mut [F], x: &[F], seq_len: usize, width: usize) {
    same_len("shift_rows_forward (out, x)", out.len(), x.len());
    rows_of("shift_rows_forward", x.len(), width);
    let seq = seq_len * width;
    rows_of("shift_rows_forward (sequences)", x.len(), seq);
    for (o, s) in out.chunks_exact_mut(seq).zip(x.chunks_exact(seq)) {
        o[..width].fill(F::ZERO);
        o[width..].copy_from_slice(&s[..seq - width]);
    }
}

/// The backward of [`shift_rows_forward`] (**adds**): per sequence,
/// `dx[t - 1] += dout[t]` for t >= 1; the last row of each sequence receives nothing.
pub fn shift_rows_backward<F: Scalar>(dx: &mut [F], dout: &[F], seq_len: usize, width: usize) {
    same_len("shift_rows_backward (dx, dout)", dx.len(), dout.len());
    rows_of("shift_rows_backward", dout.len(), width);
    let seq = seq_len * width;
    rows_of("shift_rows_backward (sequences)", dout.len(), seq);
    for (d, g) in dx.chunks_exact_mut(seq).zip(dout.chunks_exact(seq)) {
        d[..seq - width]
            .iter_mut()
            .zip(&g[width..])
            .for_each(|(d, &g)| *d += g);
    }
}

/// `dst += src`, elementwise.
#[inline(always)]
pub fn add_into<F: Scalar>(dst: &mut [F], src: &[F]) {
    same_len("add_into", dst.len(), src.len());
    dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s);
}

/// `dst *= a`, elementwise.
#[inline(always)]
pub fn scale_into<F: Scalar>(dst: &mut [F], a: F) {
    dst.iter_mut().for_each(|d| *d *= a);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct, non-integer values so a wrong index or a missing term shows.
    fn vals(n: usize, seed: usize) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 31 + seed * 17) % 97) as f64 * 0.013 - 0.6)
            .collect()
    }

    #[test]
    fn fill_add_and_bias_rows() {
        let row = [1.5f32, -2.0, 0.25];
        let mut out = vec![9.0f32; 6];
        fill_rows(&mut out, &row);
        assert_eq!(out, [1.5, -2.0, 0.25, 1.5, -2.0, 0.25]);
        add_rows(&mut out, &row);
        assert_eq!(out, [3.0, -4.0, 0.5, 3.0, -4.0, 0.5]);
        let mut db = [1.0f32, 0.0, 0.0];
        bias_backward(&mut db, &out);
        assert_eq!(db, [7.0, -8.0, 1.0]);
    }

    #[test]
    fn bias_backward_by_channels_gives_the_whole_rows_bits() {
        // 13 rows of 37, channel parts of 16, 5 and 1: each part's sums are the bits of
        // the whole-row pass (values that round differently in another order).
        let (rows, w) = (13, 37);
        let dout: Vec<f32> = vals(rows * w, 3).iter().map(|&v| v as f32 * 1.37).collect();
        let start: Vec<f32> = vals(w, 4).iter().map(|&v| v as f32 / 3.0).collect();
        let mut want = start.clone();
        bias_backward(&mut want, &dout);
        for part in [16, 5, 1] {
            let mut got = start.clone();
            for (k, db) in got.chunks_mut(part).enumerate() {
                bias_backward_channels(db, &dout, w, k * part);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "channel parts of {part}");
        }
    }

    #[test]
    fn gather_and_scatter_match_definition() {
        let (w, n) = (3, 5);
        let table = vals(n * w, 1);
        let ids = [4u32, 0, 4, 2];
        let mut out = vec![7.0; ids.len() * w];
        gather_rows(&mut out, &ids, &table, w);
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(&out[i * w..][..w], &table[id as usize * w..][..w]);
        }
        let dout = vals(ids.len() * w, 2);
        let mut dt = vals(n * w, 3);
        let mut want = dt.clone();
        for (i, &id) in ids.iter().enumerate() {
            for j in 0..w {
                want[id as usize * w + j] += dout[i * w + j];
            }
        }
        scatter_add_rows(&mut dt, &ids, &dout, w);
        assert_eq!(dt, want);
    }

    #[test]
    fn row_blocks_together_equal_the_whole_table() {
        // A 7-row table split into blocks of 3, 3, 1 rows: the blocks' lookups write each
        // row once and their scatters give each row the whole table's sums, bitwise.
        let (w, n) = (2, 7);
        let table = vals(n * w, 6);
        let ids = [6u32, 0, 4, 2, 4, 3, 6];
        let mut whole = vec![0.0; ids.len() * w];
        gather_rows(&mut whole, &ids, &table, w);
        let mut blocked = vec![9.0; ids.len() * w];
        let blocks = [(0, 3), (3, 6), (6, 7)];
        for &(lo, hi) in &blocks {
            gather_rows_block(&mut blocked, &ids, &table[lo * w..hi * w], lo, w);
        }
        assert_eq!(blocked, whole);
        let dout = vals(ids.len() * w, 7);
        let mut dwhole = vals(n * w, 8);
        let mut dblocked = dwhole.clone();
        scatter_add_rows(&mut dwhole, &ids, &dout, w);
        for &(lo, hi) in &blocks {
            scatter_add_rows_block(&mut dblocked[lo * w..hi * w], &ids, &dout, lo, w);
        }
        assert_eq!(dblocked, dwhole);
        // Ids outside a block leave its rows alone.
        let mut out = vec![5.0; 2 * w];
        gather_rows_block(&mut out, &[0, 1], &table[3 * w..6 * w], 3, w);
        assert_eq!(out, vec![5.0; 2 * w]);
    }

    #[test]
    fn periodic_rows_match_definition() {
        let (w, period, rows) = (2, 3, 7);
        let table = vals(period * w, 4);
        let base = vals(rows * w, 5);
        let mut out = base.clone();
        add_periodic_rows(&mut out, &table, period, w);
        for i in 0..rows {
            for j in 0..w {
                assert_eq!(
                    out[i * w + j],
                    base[i * w + j] + table[(i % period) * w + j]
                );
            }
        }
        let mut dt = vals(period * w, 6);
        let mut want = dt.clone();
        for i in 0..rows {
            for j in 0..w {
                want[(i % period) * w + j] += base[i * w + j];
            }
        }
        periodic_rows_backward(&mut dt, &base, period, w);
        assert_eq!(dt, want);
    }

    #[test]
    fn embedding_as_gather_then_add_equals_one_sum() {
        // x = wte[tok] + wpe[t] in one go, and gather then +=, round the same e + p once.
        let (w, v, t, b) = (5, 11, 4, 3);
        let wte: Vec<f32> = vals(v * w, 7).iter().map(|&x| x as f32 * 1.7).collect();
        let wpe: Vec<f32> = vals(t * w, 8).iter().map(|&x| x as f32 / 3.0).collect();
        let ids: Vec<u32> = (0..b * t).map(|i| (i * 5 % v) as u32).collect();
        let mut x = vec![0.0f32; b * t * w];
        gather_rows(&mut x, &ids, &wte, w);
        add_periodic_rows(&mut x, &wpe, t, w);
        for (i, &id) in ids.iter().enumerate() {
            for j in 0..w {
                let want = wte[id as usize * w + j] + wpe[(i % t) * w + j];
                assert_eq!(x[i * w + j].to_bits(), want.to_bits());
            }
        }
    }

    #[test]
    fn shift_rows_match_definition() {
        let (w, seq, nseq) = (3, 4, 2);
        let x = vals(nseq * seq * w, 9);
        let mut out = vec![5.0; x.len()];
        shift_rows_forward(&mut out, &x, seq, w);
        for s in 0..nseq {
            for t in 0..seq {
                for j in 0..w {
                    let want = if t == 0 {
                        0.0
                    } else {
                        x[((s * seq) + t - 1) * w + j]
                    };
                    assert_eq!(out[(s * seq + t) * w + j], want);
                }
            }
        }
        let dout = vals(x.len(), 10);
        let mut dx = vals(x.len(), 11);
        let mut want = dx.clone();
        for s in 0..nseq {
            for t in 1..seq {
                for j in 0..w {
                    want[(s * seq + t - 1) * w + j] += dout[(s * seq + t) * w + j];
                }
            }
        }
        shift_rows_backward(&mut dx, &dout, seq, w);
        assert_eq!(dx, want);
    }

    #[test]
    fn shift_rows_backward_matches_central_differences_f64() {
        // L(x) = sum_i c_i * shift(x)_i^2 (non-linear, so the check is not vacuous):
        // dL/dx = shift^T(2 c * shift(x)) by the backward vs (L(x+h) - L(x-h)) / 2h.
        let (w, seq, nseq) = (2, 3, 2);
        let x = vals(nseq * seq * w, 12);
        let c = vals(x.len(), 13);
        let loss = |x: &[f64]| {
            let mut y = vec![0.0; x.len()];
            shift_rows_forward(&mut y, x, seq, w);
            y.iter().zip(&c).map(|(y, c)| c * y * y).sum::<f64>()
        };
        let mut y = vec![0.0; x.len()];
        shift_rows_forward(&mut y, &x, seq, w);
        let dy: Vec<f64> = y.iter().zip(&c).map(|(y, c)| 2.0 * c * y).collect();
        let mut dx = vec![0.0; x.len()];
        shift_rows_backward(&mut dx, &dy, seq, w);
        let h = 1e-5;
        for i in 0..x.len() {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[i] += h;
            xm[i] -= h;
            let fd = (loss(&xp) - loss(&xm)) / (2.0 * h);
            assert!((dx[i] - fd).abs() < 1e-9, "x[{i}]: {} vs {fd}", dx[i]);
        }
        // The last row of each sequence feeds nothing.
        for s in 0..nseq {
            let last = (s * seq + seq - 1) * w;
            assert_eq!(&dx[last..last + w], &[0.0, 0.0]);
        }
    }

    #[test]
    fn add_and_scale_into() {
        let mut d = [1.0f32, 2.0, -3.0];
        add_into(&mut d, &[0.5, 0.5, 0.5]);
        assert_eq!(d, [1.5, 2.5, -2.5]);
        scale_into(&mut d, 2.0);
        assert_eq!(d, [3.0, 5.0, -5.0]);
    }

    #[test]
    #[should_panic(expected = "gather_rows: id 3 past a table of 3 rows")]
    fn gather_rejects_id_past_table() {
        let mut out = [0.0f32; 2];
        gather_rows(&mut out, &[3], &[0.0; 6], 2);
    }

    #[test]
    #[should_panic(expected = "not whole rows of width 4")]
    fn rows_reject_ragged_buffer() {
        let mut out = [0.0f32; 6];
        add_rows(&mut out, &[1.0; 4]);
    }
}
