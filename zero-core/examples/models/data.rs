//! Data for the examples, generated or built in (nothing to download): Gaussian blobs for
//! the classifier, a short text for the character model. Each rank draws its own rows
//! from the same seeded stream, so every world size sees the same global batch.

use super::init::SplitMix64;

/// K Gaussian blobs in F dimensions: class k is centred at a random point, unit noise.
pub struct Blobs {
    centres: Vec<f32>,
    features: usize,
    classes: usize,
}

impl Blobs {
    /// `classes` blobs in `features` dimensions, their centres N(0, spread^2).
    pub fn new(features: usize, classes: usize, spread: f64, seed: u64) -> Self {
        let mut r = SplitMix64::for_tensor(seed, "blob centres");
        let centres = (0..features * classes)
            .map(|_| (r.normal() * spread) as f32)
            .collect();
        Blobs {
            centres,
            features,
            classes,
        }
    }

    /// Rows `first..first + rows` of the stream for `step` (row i's class and point
    /// depend only on (seed, step, i)): features [rows, F] and labels [rows].
    pub fn rows(&self, seed: u64, step: u64, first: usize, rows: usize) -> (Vec<f32>, Vec<u32>) {
        let mut x = Vec::with_capacity(rows * self.features);
        let mut y = Vec::with_capacity(rows);
        for i in first..first + rows {
            let mut r = SplitMix64::for_tensor(seed ^ (step << 20) ^ i as u64, "blob row");
            let k = (r.next_u64() % self.classes as u64) as usize;
            y.push(k as u32);
            for f in 0..self.features {
                x.push(self.centres[k * self.features + f] + r.normal() as f32);
            }
        }
        (x, y)
    }
}

/// What the character model reads: a few paragraphs about what it is trained with.
pub const TEXT: &str = "\
the zero redundancy optimizer splits what data parallel training copies onto every rank. \
stage one splits the optimizer state, stage two the gradients as well, and stage three \
the parameters too, so that the memory each rank holds for the model falls with the \
number of ranks while every step remains the step of plain data parallel training. \
before a layer runs, its parameters are gathered from the ranks that own them; after its \
backward, its gradients are reduced and scattered back to their owners. the optimizer \
then updates only the shard a rank owns, and the new parameters are shared again. \
nothing about the model changes: the same losses come out at every stage, to the last \
bit where the sums are taken in the same order. a small model learns this text one \
character at a time, each position mixed with the one before it, layer after layer. ";

/// Characters of [`TEXT`] as ids 0..V (sorted distinct characters) and V.
pub fn text_tokens() -> (Vec<u32>, usize) {
    let mut chars: Vec<char> = TEXT.chars().collect();
    chars.sort_unstable();
    chars.dedup();
    let ids = TEXT
        .chars()
        .map(|ch| chars.binary_search(&ch).map_or(0, |i| i as u32))
        .collect();
    (ids, chars.len())
}

/// Rows `first..first + rows` of `seq_len` characters for `step`: each row a window at a
/// position drawn from (seed, step, row), inputs and next-character targets.
pub fn text_rows(
    tokens: &[u32],
    seed: u64,
    step: u64,
    first: usize,
    rows: usize,
    seq_len: usize,
) -> (Vec<u32>, Vec<u32>) {
    let mut x = Vec::with_capacity(rows * seq_len);
    let mut y = Vec::with_capacity(rows * seq_len);
    let span = tokens.len() - seq_len - 1;
    for i in first..first + rows {
        let mut r = SplitMix64::for_tensor(seed ^ (step << 20) ^ i as u64, "text row");
        let at = (r.next_u64() % span as u64) as usize;
        x.extend_from_slice(&tokens[at..at + seq_len]);
        y.extend_from_slice(&tokens[at + 1..at + seq_len + 1]);
    }
    (x, y)
}
