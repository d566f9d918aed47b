//! The `sequential` batch order. Global step s, micro-step m (of A), rank r (of N), row b
//! (of B) reads the T+1 tokens starting at token `(((s*A + m)*N + r)*B + b)*T`, modulo
//! the token count (reading wraps at the end). Inputs are the first T, targets the last
//! T. Consecutive rows overlap by one token, as in llm.c's loader. The global batch of a
//! step is then the same for every ZeRO stage and for every N x A with the same N*A*B.

use super::{DataError, Tokens};

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
        })
    }

    /// First token of row `row` of micro-step `micro` of step `step`, before wrapping
    /// (u128: no overflow for any step count).
    pub fn start(&self, step: u64, micro: usize, row: usize) -> u128 {
        let (a, n, b, t) = (
            self.accum as u128,
            self.world as u128,
            self.rows as u128,
            self.seq_len as u128,
        );
        (((step as u128 * a + micro as u128) * n + self.rank as u128) * b + row as u128) * t
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
        if micro >= self.accum {
            return Err(DataError::Invalid(format!(
                "micro-step {micro} of A={}",
                self.accum
            )));
        }
        inputs.clear();
        targets.clear();
        let mut window = vec![0u16; t + 1];
        for row in 0..self.rows {
            let start = (self.start(step, micro, row) % n as u128) as usize;
            tokens.read_wrapping(start, &mut window)?;
            inputs.extend(window[..t].iter().map(|&x| x as u32));
            targets.extend(window[1..].iter().map(|&x| x as u32));
        }
        Ok(())
    }
}
