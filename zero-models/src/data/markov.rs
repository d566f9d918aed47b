//! The built-in corpus: a seeded order-k Markov source over V symbols whose entropy rate
//! is computed exactly, so a training run with no download has a known floor to approach.
//!
//! The last symbol picks `fanout` distinct possible successors; the whole context (the
//! last k symbols, one of V^k states) picks their probabilities, Dirichlet(1). So a
//! bigram model already gets far below ln V, and only a model that looks k symbols back
//! reaches the floor: training shows a steady descent rather than a plateau. The entropy rate (nats/token) is
//!   H = sum_s pi(s) * H(next | s),
//! pi the stationary distribution reached from the start context (all zeros), found by
//! power iteration on the lazy chain (I + P)/2 (same stationary law, aperiodic). No model
//! can beat H in expected cross-entropy; a model that learns the source reaches it.

use super::{DataError, Tokens};
use crate::init::SplitMix64;

/// The seed the built-in corpus is sampled with ([`MarkovSource::default_corpus`]; the
/// same tokens through [`MarkovSource::sample`]).
pub const DEFAULT_CORPUS_SEED: u64 = 0xC0_4B05;

/// A seeded order-k Markov source.
#[derive(Clone, Debug)]
pub struct MarkovSource {
    vocab: usize,
    order: usize,
    fanout: usize,
    /// V^k.
    states: usize,
    /// Per state: `fanout` successor symbols.
    next: Vec<u16>,
    /// Per state: their probabilities.
    prob: Vec<f64>,
}

impl MarkovSource {
    /// The default corpus source: V=64 symbols, order 2 (4096 contexts), 4 successors.
    pub fn default_source() -> Self {
        // Valid by construction: 64^2 states, fanout 4 <= 64.
        Self::build(64, 2, 4, 0x5EED_C0DE)
    }

    /// A source over `vocab` symbols with contexts of `order` symbols, each followed by
    /// one of `fanout` successors.
    pub fn new(vocab: usize, order: usize, fanout: usize, seed: u64) -> Result<Self, DataError> {
        let states = (vocab as u128)
            .checked_pow(order as u32)
            .unwrap_or(u128::MAX);
        if vocab == 0
            || vocab > 65536
            || order == 0
            || fanout == 0
            || fanout > vocab
            || states > 1 << 22
        {
            return Err(DataError::Invalid(format!(
                "Markov source needs 0 < fanout <= vocab <= 65536, order > 0, vocab^order <= 2^22; \
                 got vocab={vocab} order={order} fanout={fanout}"
            )));
        }
        Ok(Self::build(vocab, order, fanout, seed))
    }

    fn build(vocab: usize, order: usize, fanout: usize, seed: u64) -> Self {
        let states = vocab.pow(order as u32);
        let mut g = SplitMix64::new(seed);
        let mut pool: Vec<u16> = (0..vocab).map(|x| x as u16).collect();
        let mut succ = Vec::with_capacity(vocab * fanout);
        for _ in 0..vocab {
            // First `fanout` of a partial Fisher-Yates shuffle: distinct successors.
            for i in 0..fanout {
                let j = i + (g.next_u64() % (vocab - i) as u64) as usize;
                pool.swap(i, j);
            }
            succ.extend_from_slice(&pool[..fanout]);
        }
        let mut next = Vec::with_capacity(states * fanout);
        let mut prob = Vec::with_capacity(states * fanout);
        for s in 0..states {
            let last = s % vocab; // the state's newest symbol (lowest base-V digit)
            next.extend_from_slice(&succ[last * fanout..(last + 1) * fanout]);
            // Dirichlet(1): normalised exponentials.
            let w: Vec<f64> = (0..fanout).map(|_| -(1.0 - g.next_f64()).ln()).collect();
            let sum: f64 = w.iter().sum();
            prob.extend(w.iter().map(|x| x / sum));
        }
        MarkovSource {
            vocab,
            order,
            fanout,
            states,
            next,
            prob,
        }
    }

    /// Symbols.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    fn step_state(&self, state: usize, sym: u16) -> usize {
        // Drop the oldest symbol, append the new one: base-V digits of the context.
        (state * self.vocab + sym as usize) % self.states
    }

    /// -ln P(sym | state), or infinity when `sym` cannot follow.
    pub fn neg_log_prob(&self, state: usize, sym: u16) -> f64 {
        let at = state * self.fanout;
        (0..self.fanout)
            .find(|&i| self.next[at + i] == sym)
            .map_or(f64::INFINITY, |i| -self.prob[at + i].ln())
    }

    /// The entropy rate in nats per token: the floor of the expected cross-entropy.
    pub fn entropy_rate(&self) -> f64 {
        let states = self.states;
        let mut pi = vec![0.0f64; states];
        pi[0] = 1.0;
        let mut nxt = vec![0.0f64; states];
        for _ in 0..100_000 {
            nxt.iter_mut().zip(&pi).for_each(|(n, p)| *n = 0.5 * p);
            for (s, &mass) in pi.iter().enumerate() {
                if mass == 0.0 {
                    continue;
                }
                for i in 0..self.fanout {
                    let to = self.step_state(s, self.next[s * self.fanout + i]);
                    nxt[to] += 0.5 * mass * self.prob[s * self.fanout + i];
                }
            }
            let delta: f64 = nxt.iter().zip(&pi).map(|(a, b)| (a - b).abs()).sum();
            std::mem::swap(&mut pi, &mut nxt);
            if delta < 1e-14 {
                break;
            }
        }
        (0..states)
            .map(|s| {
                let h: f64 = self.prob[s * self.fanout..(s + 1) * self.fanout]
                    .iter()
                    .map(|p| -p * p.ln())
                    .sum();
                pi[s] * h
            })
            .sum()
    }

    /// `n` symbols from the start context (all zeros), sampling with `seed`.
    pub fn generate(&self, n: usize, seed: u64) -> Vec<u16> {
        self.sample(seed).take(n).collect()
    }

    /// Symbols drawn one after another from the start context (all zeros) with `seed`:
    /// the sequence [`Self::generate`] collects, for a writer that streams it in chunks
    /// (`zero-bench data corpus` holds no more than a chunk, whatever the length).
    pub fn sample(&self, seed: u64) -> Sampler<'_> {
        Sampler {
            source: self,
            rng: SplitMix64::new(seed),
            state: 0,
        }
    }

    /// Mean -ln P of a sequence under this source, started from the zero context: the
    /// cross-entropy of the true model, which approaches [`Self::entropy_rate`].
    pub fn mean_neg_log_prob(&self, seq: &[u16]) -> f64 {
        let mut state = 0usize;
        let mut total = 0.0;
        for &s in seq {
            total += self.neg_log_prob(state, s);
            state = self.step_state(state, s);
        }
        total / seq.len().max(1) as f64
    }

    /// The built-in corpus: `n` tokens of the default source, as [`Tokens`] for a model of
    /// vocabulary `vocab` (>= 64).
    pub fn default_corpus(n: usize, vocab: usize) -> Result<Tokens, DataError> {
        let src = Self::default_source();
        let symbols = src.generate(n, DEFAULT_CORPUS_SEED);
        Tokens::from_vec("built-in Markov corpus", symbols, vocab)
    }

    /// Context length.
    pub fn order(&self) -> usize {
        self.order
    }
}

/// An endless stream of a [`MarkovSource`]'s symbols ([`MarkovSource::sample`]).
pub struct Sampler<'a> {
    source: &'a MarkovSource,
    rng: SplitMix64,
    /// The last `order` symbols, base-V digits.
    state: usize,
}

impl Iterator for Sampler<'_> {
    type Item = u16;

    fn next(&mut self) -> Option<u16> {
        let src = self.source;
        let u = self.rng.next_f64();
        let at = self.state * src.fanout;
        let mut acc = 0.0;
        // Falls back to the last successor when rounding leaves u above the sum.
        let mut sym = src.next[at + src.fanout - 1];
        for i in 0..src.fanout {
            acc += src.prob[at + i];
            if u < acc {
                sym = src.next[at + i];
                break;
            }
        }
        self.state = src.step_state(self.state, sym);
        Some(sym)
    }

    /// Endless, so that `take(n).collect()` allocates `n` at once.
    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}
