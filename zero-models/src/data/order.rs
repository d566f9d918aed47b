//! The `sequential` batch order. Global step s, micro-step m (of A), rank r (of N), row b
//! (of B) reads the T+1 tokens starting at token `(((s*A + m)*N + r)*B + b)*T`, modulo
//! the token count (reading wraps at the end). Inputs are the first T, targets the last
//! T. Consecutive rows overlap by one token, as in llm.c's loader. The global batch of a
//! step is then the same for every ZeRO stage and for every N x A with the same N*A*B.
//!
//! A run that changes its global batch on resume (another N*A*B or T) goes on from where
//! the data stopped rather than from where the new batch would have been after as many
//! steps: its order starts at an [`Origin`] (the step index, global row and token the
//! checkpoint's order had reached), and counts rows and tokens from there.

use super::{DataError, Tokens};

/// Where an order starts: step index `index` (0-based: the step run after `index` steps)
/// begins at global row `row` and token `token`. The default (all zero) is the formula
/// above; a resumed run whose global batch changed starts at the old order's
/// [`Sequential::origin_at`] of the checkpoint's step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// The first step index the order reads.
    pub index: u64,
    /// Global row index of that step's first row (what `shuffled` orders hash).
    pub row: u128,
    /// First token of that step's first row (where `sequential` reads it).
    pub token: u128,
}

/// Where each rank's rows come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sequential {
    /// B: rows per micro-batch.
    pub rows: usize,
    /// T: tokens per row.
    pub seq_len: usize,
    /// A: micro-steps per optimizer step.
    pub accum: usize,
    /// N: data-parallel ranks.
    pub world: usize,
    /// r: this rank.
    pub rank: usize,
    /// Where step indices, rows and tokens are counted from ([`Origin::default`] unless
    /// [`Sequential::starting_at`]).
    pub origin: Origin,
}

impl Sequential {
    /// An order; every count must be positive and `rank < world`.
    pub fn new(
        rows: usize,
        seq_len: usize,
        accum: usize,
        world: usize,
        rank: usize,
    ) -> Result<Self, DataError> {
        if rows == 0 || seq_len == 0 || accum == 0 || world == 0 || rank >= world {
            return Err(DataError::Invalid(format!(
                "sequential order needs rows, seq_len, accum, world > 0 and rank < world; \
                 got B={rows} T={seq_len} A={accum} N={world} rank={rank}"
            )));
        }
        Ok(Sequential {
            rows,
            seq_len,
            accum,
            world,
            rank,
            origin: Origin::default(),
        })
    }

    /// This order, starting at `origin` (a resumed run whose global batch changed).
    pub fn starting_at(self, origin: Origin) -> Self {
        Sequential { origin, ..self }
    }

    /// Rows of one global batch: N*A*B.
    pub fn global_rows(&self) -> u128 {
        self.world as u128 * self.accum as u128 * self.rows as u128
    }

    /// Where step index `index` starts (its first global row and token): what a run that
    /// resumes after `index` steps with another global batch starts from. `index` below
    /// the origin's counts as the origin.
    pub fn origin_at(&self, index: u64) -> Origin {
        // Saturating: an origin near u128::MAX (a damaged record) must not panic.
        let rows =
            (index.saturating_sub(self.origin.index) as u128).saturating_mul(self.global_rows());
        Origin {
            index,
            row: self.origin.row.saturating_add(rows),
            token: self
                .origin
                .token
                .saturating_add(rows.saturating_mul(self.seq_len as u128)),
        }
    }

    /// Global row index of row `row` of micro-step `micro` of step index `step` (u128: no
    /// overflow for any step count). A step before the origin counts as the origin's.
    pub fn global_row(&self, step: u64, micro: usize, row: usize) -> u128 {
        let (a, n, b) = (self.accum as u128, self.world as u128, self.rows as u128);
        let step = step.saturating_sub(self.origin.index) as u128;
        // A u64 step times a real order's N*A*B (far below 2^64) stays below 2^128; the
        // origin's part saturates (a damaged record).
        let rows = ((step * a + micro as u128) * n + self.rank as u128) * b + row as u128;
        self.origin.row.saturating_add(rows)
    }

    /// First token of row `row` of micro-step `micro` of step index `step`, before
    /// wrapping.
    pub fn start(&self, step: u64, micro: usize, row: usize) -> u128 {
        let rows = self
            .global_row(step, micro, row)
            .saturating_sub(self.origin.row);
        self.origin
            .token
            .saturating_add(rows.saturating_mul(self.seq_len as u128))
    }

    /// Fill this rank's micro-batch (`rows * seq_len` inputs and targets, row-major).
    pub fn fill(
        &self,
        tokens: &Tokens,
        step: u64,
        micro: usize,
        inputs: &mut Vec<u32>,
        targets: &mut Vec<u32>,
    ) -> Result<(), DataError> {
        let (n, t) = (tokens.len(), self.seq_len);
        if n < t + 1 {
            return Err(DataError::TooShort {
                source_name: tokens.name().to_string(),
                len: n,
                need: t + 1,
            });
        }
        if step < self.origin.index {
            return Err(DataError::Invalid(format!(
                "step index {step} is before the order's origin (index {})",
                self.origin.index
            )));
        }
        if micro >= self.accum {
            return Err(DataError::Invalid(format!(
                "micro-step {micro} of A={}",
                self.accum
            )));
        }
        inputs.clear();
        targets.clear();
        let mut window = vec![0u32; t + 1];
        for row in 0..self.rows {
            let start = (self.start(step, micro, row) % n as u128) as usize;
            tokens.read_wrapping(start, &mut window)?;
            inputs.extend_from_slice(&window[..t]);
            targets.extend_from_slice(&window[1..]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Global row and token of every (step, micro, rank, row) of an order, in read order.
    fn rows_read(order: Sequential, steps: std::ops::Range<u64>) -> Vec<(u128, u128)> {
        let mut out = Vec::new();
        for s in steps {
            for m in 0..order.accum {
                for r in 0..order.world {
                    let o = Sequential { rank: r, ..order };
                    for b in 0..order.rows {
                        out.push((o.global_row(s, m, b), o.start(s, m, b)));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn default_origin_is_the_formula() {
        let o = Sequential::new(3, 5, 2, 4, 1).unwrap();
        // (((s*A + m)*N + r)*B + b)*T with s=7, m=1, r=1, b=2.
        assert_eq!(o.start(7, 1, 2), (((7 * 2 + 1) * 4 + 1) * 3 + 2) * 5);
        assert_eq!(o.global_row(7, 1, 2) * 5, o.start(7, 1, 2));
    }

    #[test]
    fn a_changed_batch_goes_on_where_the_old_one_stopped() {
        // 3 steps of N=2 x A=2 x B=2 rows of T=4, then 2 more steps of N=3 x A=1 x B=1
        // rows of T=6: the rows go on in sequence, and the tokens from where the third
        // step's last row began plus its T.
        let old = Sequential::new(2, 4, 2, 2, 0).unwrap();
        let before = rows_read(old, 0..3);
        let origin = old.origin_at(3);
        assert_eq!(
            origin,
            Origin {
                index: 3,
                row: 24,
                token: 96
            }
        );
        let new = Sequential::new(1, 6, 1, 3, 0).unwrap().starting_at(origin);
        let after = rows_read(new, 3..5);
        let rows: Vec<u128> = before.iter().chain(&after).map(|&(g, _)| g).collect();
        assert_eq!(rows, (0..30).collect::<Vec<u128>>());
        let tokens: Vec<u128> = after.iter().map(|&(_, t)| t).collect();
        assert_eq!(tokens, (0..6).map(|i| 96 + 6 * i).collect::<Vec<u128>>());
        // Chained: the new order's origin after its 5th step.
        assert_eq!(
            new.origin_at(5),
            Origin {
                index: 5,
                row: 30,
                token: 132
            }
        );
        // Reading a step before the origin is refused.
        let tokens = Tokens::from_vec("test", (0..64).collect(), 64).unwrap();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        assert!(new.fill(&tokens, 2, 0, &mut x, &mut y).is_err());
        assert!(new.fill(&tokens, 3, 0, &mut x, &mut y).is_ok());
    }

    /// Ids past 65535 (llm.c's llama-3 files) reach the batch whole, as u32.
    #[test]
    fn wide_ids_fill_the_batch_whole() {
        let ids: Vec<u32> = (0..40u32).map(|i| 65_530 + 1000 * i).collect();
        let tokens = Tokens::from_vec_u32("wide", ids.clone(), 128_256).unwrap();
        let o = Sequential::new(2, 4, 1, 1, 0).unwrap();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        // Step 4 reads rows 8 and 9: tokens 32..37 and 36..41 (wrapping to 0).
        o.fill(&tokens, 4, 0, &mut x, &mut y).unwrap();
        assert_eq!(
            x,
            [ids[32], ids[33], ids[34], ids[35], ids[36], ids[37], ids[38], ids[39]]
        );
        assert_eq!(y[4..], [ids[37], ids[38], ids[39], ids[0]]);
        assert!(x.iter().all(|&t| t >= 65_536));
    }
}
