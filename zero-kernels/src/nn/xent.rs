//! The classifier's loss: softmax cross-entropy per row of logits `[rows, V]` against one
//! target class per row, forward (probabilities and per-row losses) and backward
//! (dlogits), in place; and the mean of the per-row losses (llm.c's
//! `crossentropy_forward` / `crossentropy_softmax_backward`, with the loss taken as
//! log-sum-exp so it never takes log(0)).

use super::scalar::{interleaved_sums, Scalar, SUM_ROWS};
use super::softmax::row_max;

/// Checks the shapes shared by forward and backward; returns the number of rows.
fn rows_of(len: usize, targets: &[u32], v: usize) -> usize {
    assert!(v > 0, "softmax cross-entropy: V must be positive");
    assert!(
        len == targets.len() * v,
        "softmax cross-entropy: {len} logits for {} targets of V = {v}",
        targets.len()
    );
    if let Some(i) = targets.iter().position(|&t| t as usize >= v) {
        panic!(
            "softmax cross-entropy: targets[{i}] = {} is not a class of V = {v}",
            targets[i]
        );
    }
    targets.len()
}

/// Softmax cross-entropy forward, per row of width `v`: the logits z are replaced in
/// place by the probabilities p = softmax(z), and `losses[row] = -log p[target]`,
/// computed as log-sum-exp: with m = max_j z_j,
/// `loss = ln(sum_j e^(z_j - m)) - (z_target - m)`. Order of operations (what the GPT-2
/// head has always done): max; z_target - m; e^(z_j - m) and their sum in column order;
/// the loss; then every e^(z_j - m) times 1/sum.
///
/// # Panics
/// If `v == 0`, `logits_to_probs.len() != targets.len() * v`,
/// `losses.len() != targets.len()`, or a target is `>= v`: callers validate targets
/// first (a model checks its batch when it is handed in).
#[inline(always)]
pub fn softmax_xent_forward<F: Scalar>(
    logits_to_probs: &mut [F],
    losses: &mut [F],
    targets: &[u32],
    v: usize,
) {
    let rows = rows_of(logits_to_probs.len(), targets, v);
    assert!(
        losses.len() == rows,
        "softmax cross-entropy: {} losses for {rows} rows",
        losses.len()
    );
    // SUM_ROWS rows at a time, so that their sums run interleaved (each still in column
    // order), then the rows left over one by one.
    let full = rows / SUM_ROWS * SUM_ROWS;
    let (head, tail) = logits_to_probs.split_at_mut(full * v);
    for ((block, loss), tgt) in head
        .chunks_exact_mut(SUM_ROWS * v)
        .zip(losses.chunks_exact_mut(SUM_ROWS))
        .zip(targets.chunks_exact(SUM_ROWS))
    {
        xent_rows::<F, SUM_ROWS>(block, loss, tgt, v);
    }
    for ((row, loss), tgt) in tail
        .chunks_exact_mut(v)
        .zip(losses[full..].chunks_exact_mut(1))
        .zip(targets[full..].chunks_exact(1))
    {
        xent_rows::<F, 1>(row, loss, tgt, v);
    }
}

/// [`softmax_xent_forward`] of `G` rows (`block` is `G * v` logits).
#[inline(always)]
fn xent_rows<F: Scalar, const G: usize>(
    block: &mut [F],
    losses: &mut [F],
    targets: &[u32],
    v: usize,
) {
    let block = &mut block[..G * v];
    let mut zt = [F::ZERO; G];
    for ((row, zt), &tgt) in block.chunks_exact_mut(v).zip(&mut zt).zip(targets) {
        let max = row_max(row);
        *zt = row[tgt as usize] - max;
        // The exponentials in a loop of their own (it vectorises); summed below.
        row.iter_mut().for_each(|z| *z = (*z - max).exp());
    }
    let sums: [F; G] = interleaved_sums(v, |g, j| block[g * v + j]);
    for (((row, loss), zt), sum) in block.chunks_exact_mut(v).zip(losses).zip(zt).zip(sums) {
        // loss = log(sum_j e^(z_j - max)) - (z_t - max)
        *loss = sum.ln() - zt;
        let inv = F::ONE / sum;
        row.iter_mut().for_each(|z| *z *= inv);
    }
}

/// Softmax cross-entropy backward, in place (**writes**): the probabilities the forward
/// left become `dlogits = (p - onehot(target)) * scale` per row of width `v`
/// (d/dz_j of `scale * loss` is `scale * (p_j - [j == target])`). Order: subtract 1 at
/// the target, then scale every element.
///
/// # Panics
/// As [`softmax_xent_forward`] (V, lengths, targets).
#[inline(always)]
pub fn softmax_xent_backward<F: Scalar>(
    probs_to_dlogits: &mut [F],
    targets: &[u32],
    v: usize,
    scale: F,
) {
    rows_of(probs_to_dlogits.len(), targets, v);
    for (row, &tgt) in probs_to_dlogits.chunks_exact_mut(v).zip(targets) {
        row[tgt as usize] -= F::ONE;
        row.iter_mut().for_each(|z| *z *= scale);
    }
}

/// The mean of `src`, summed in f64 in index order and divided by its length in f64:
/// `(sum_i src[i] as f64) / len`. NaN for an empty `src` (0/0). This is the f64 value a
/// model reports as its loss; [`mean_into`] rounds it to `F`.
pub fn mean_f64<F: Scalar>(src: &[F]) -> f64 {
    let mut total = 0.0f64;
    src.iter().for_each(|x| total += x.to_f64());
    total / src.len() as f64
}

/// `dst = mean(src)`: [`mean_f64`] rounded to `F` (for f32 the same bits as
/// `mean_f64(src) as f32`).
pub fn mean_into<F: Scalar>(dst: &mut F, src: &[F]) {
    *dst = F::from_f64(mean_f64(src));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_summed_together_give_the_bits_of_one_row_at_a_time() {
        // 21 rows: two groups of SUM_ROWS and 5 left over; one row per call is the plain
        // per-row loop (G = 1).
        let (rows, v) = (21, 131);
        let z: Vec<f32> = crate::testutil::vals(rows * v, 5, 30.0, 0.0);
        let targets: Vec<u32> = (0..rows as u32).map(|r| r * 7 % v as u32).collect();
        let (mut p, mut loss) = (z.clone(), vec![0.0f32; rows]);
        softmax_xent_forward(&mut p, &mut loss, &targets, v);
        for r in 0..rows {
            let (mut p1, mut l1) = (z[r * v..(r + 1) * v].to_vec(), [0.0f32]);
            softmax_xent_forward(&mut p1, &mut l1, &targets[r..r + 1], v);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&p[r * v..(r + 1) * v]), bits(&p1), "row {r}");
            assert_eq!(loss[r].to_bits(), l1[0].to_bits(), "row {r}");
        }
    }

    /// Deterministic logits in about [-6, 6], with a few large ones.
    fn logits(n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 37 % 101) as f64 - 50.0) * 0.12 + if i % 29 == 0 { 30.0 } else { 0.0 })
            .collect()
    }

    /// -log softmax(z)[t], by the definition in f64 (no max shift needed at this range).
    fn direct_loss(z: &[f64], t: usize) -> f64 {
        let s: f64 = z.iter().map(|z| z.exp()).sum();
        -(z[t].exp() / s).ln()
    }

    #[test]
    fn forward_matches_definition_f64() {
        let (rows, v) = (5, 13);
        let z = logits(rows * v);
        let targets = [0u32, 12, 3, 7, 7];
        let mut p = z.clone();
        let mut losses = vec![0.0; rows];
        softmax_xent_forward(&mut p, &mut losses, &targets, v);
        for r in 0..rows {
            let zr = &z[r * v..][..v];
            let want = direct_loss(zr, targets[r] as usize);
            assert!(
                (losses[r] - want).abs() < 1e-13,
                "row {r}: {} vs {want}",
                losses[r]
            );
            let s: f64 = zr.iter().map(|z| z.exp()).sum();
            for j in 0..v {
                assert!((p[r * v + j] - zr[j].exp() / s).abs() < 1e-15);
            }
        }
    }

    #[test]
    fn forward_f32_is_finite_for_huge_logits() {
        // e^(z - max) never overflows, and the loss never takes ln(0).
        let mut z = vec![1.0e30f32, -1.0e30, 0.0, 88.0];
        let mut loss = [0.0f32];
        softmax_xent_forward(&mut z, &mut loss, &[1], 4);
        assert!(loss[0].is_finite() && loss[0] > 1.0e29, "{}", loss[0]);
        assert_eq!(z[0], 1.0);
    }

    #[test]
    fn backward_matches_central_differences_f64() {
        // L(z) = scale * sum_rows loss(row); dL/dz by the backward vs (L(z+h) - L(z-h))/2h.
        let (rows, v, scale) = (3, 7, 0.37);
        let z = logits(rows * v);
        let targets = [6u32, 0, 2];
        let total = |z: &[f64]| {
            let mut p = z.to_vec();
            let mut l = vec![0.0; rows];
            softmax_xent_forward(&mut p, &mut l, &targets, v);
            scale * l.iter().sum::<f64>()
        };
        let mut d = z.clone();
        let mut l = vec![0.0; rows];
        softmax_xent_forward(&mut d, &mut l, &targets, v);
        softmax_xent_backward(&mut d, &targets, v, scale);
        let h = 1e-5;
        for i in 0..z.len() {
            let (mut zp, mut zm) = (z.clone(), z.clone());
            zp[i] += h;
            zm[i] -= h;
            let fd = (total(&zp) - total(&zm)) / (2.0 * h);
            assert!((d[i] - fd).abs() < 1e-9, "logit {i}: {} vs {fd}", d[i]);
        }
    }

    #[test]
    fn mean_sums_in_f64_in_order() {
        let src = [1.0f32, 1.0e-8, 1.0e-8, 3.0];
        let want = ((1.0f64 + 1.0e-8f32 as f64) + 1.0e-8f32 as f64 + 3.0) / 4.0;
        assert_eq!(mean_f64(&src), want);
        let mut m = 0.0f32;
        mean_into(&mut m, &src);
        assert_eq!(m, want as f32);
        let mut m = 0.0f64;
        mean_into(&mut m, &[2.0f64, 4.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!(mean_f64::<f32>(&[]).is_nan());
    }

    #[test]
    #[should_panic(expected = "targets[1] = 4 is not a class of V = 4")]
    fn forward_rejects_target_outside_vocabulary() {
        let mut z = vec![0.0f32; 8];
        let mut l = [0.0f32; 2];
        softmax_xent_forward(&mut z, &mut l, &[0, 4], 4);
    }

    #[test]
    #[should_panic(expected = "6 logits for 2 targets of V = 4")]
    fn backward_rejects_wrong_length() {
        let mut z = vec![0.0f32; 6];
        softmax_xent_backward(&mut z, &[0, 1], 4, 1.0);
    }
}
