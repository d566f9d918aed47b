//! Training data for `train`: the token source (`data.path`: "builtin" for the built-in
//! Markov corpus, else a nanoGPT `.bin` file (uint16) or an llm.c one, uint16 ("gpt-2")
//! or uint32 ("llama-3"), told apart by llm.c's header magic; read as u32 ids either way)
//! and the batch order (`data.order`).
//!
//! Both orders read, for global step s, micro-step m (of A), rank r (of N) and row b (of
//! B), the window of T+1 tokens of global row index g = ((s*A + m)*N + r)*B + b: inputs
//! the first T, targets the last T. `sequential` starts it at g*T (zero_models'
//! `Sequential`, wrapping at the end); `shuffled` at a hash of (seed, g) modulo
//! len - T (so no window wraps). Either way the global batch of a step depends only on
//! N*A*B, never on the stage or on how it is split into ranks and micro-steps.

use std::path::Path;
use std::time::{Duration, Instant};

use super::launch::{agree, Failure};
use crate::config::{Config, DataOrder};
use anyhow::{anyhow, bail, Context};
use zero_comm::{Communicator, ReduceOp};
use zero_models::data::{MarkovSource, Origin, Sequential, TokenFormat, Tokens};
use zero_models::init::SplitMix64;
use zero_models::TokenBatch as Batch;

/// Tokens of the built-in corpus: 2^20 (2 MiB of u16); windows wrap around.
const BUILTIN_TOKENS: usize = 1 << 20;
/// Symbols of the built-in corpus (its tokens are 0..64).
pub const BUILTIN_VOCAB: usize = 64;

/// Open the configured token source for a model of `vocab` tokens.
pub fn open(config: &Config, vocab: usize) -> anyhow::Result<Tokens> {
    let path = config.data.path.as_str();
    let tokens = if path == "builtin" {
        if vocab < BUILTIN_VOCAB {
            bail!(
                "the built-in corpus has {BUILTIN_VOCAB} symbols but model.vocab_size is {vocab}; \
                 set model.vocab_size >= {BUILTIN_VOCAB} or give a token file in data.path"
            );
        }
        MarkovSource::default_corpus(BUILTIN_TOKENS, vocab)
            .context("building the built-in corpus")?
    } else {
        Tokens::open(Path::new(path), TokenFormat::Auto, vocab)
            .with_context(|| format!("opening data.path = {path}"))?
    };
    let need = config.train.seq_len + 1;
    if tokens.len() < need {
        bail!(
            "{} holds {} tokens, fewer than train.seq_len + 1 = {need}; use more data or a shorter seq_len",
            tokens.name(),
            tokens.len()
        );
    }
    Ok(tokens)
}

/// Check the token source before training (collective): every token must be inside the
/// vocabulary (each rank scans 1/N of the file, in 32 MiB reads, and the ranks agree on the
/// first bad position, so the error names it on every rank), and a source shorter than one
/// global batch gets a warning (the order wraps around inside a step). Rank 0 reports
/// progress when the scan takes more than a few seconds. Returns this rank's [`Stamp`] of
/// the source, what [`DataWatch`] compares with during the run.
pub fn check<C: Communicator>(comm: &C, tokens: &Tokens, config: &Config) -> anyhow::Result<Stamp> {
    let (rank, world) = (comm.rank(), comm.size());
    let stamp = read_on_every_rank(comm, Stamp::take(tokens), "fingerprinting")?;
    same_tokens_on_every_rank(comm, tokens, stamp.fingerprint)?;
    let len = tokens.len();
    let share = len.div_ceil(world);
    let mine = (rank * share).min(len)..((rank + 1) * share).min(len);
    let started = Instant::now();
    let mut next_report = Duration::from_secs(3);
    let total = mine.len();
    let scanned = tokens.first_out_of_vocab(mine.clone(), |done| {
        if rank == 0 && started.elapsed() >= next_report {
            log::info!(
                "checking {}: {:.0}% of this rank's {} tokens",
                tokens.name(),
                100.0 * done as f64 / total.max(1) as f64,
                total
            );
            next_report += Duration::from_secs(3);
        }
    });
    let found = read_on_every_rank(comm, scanned, "checking")?;
    // The lowest bad position over the ranks, as the max of its negation (positions
    // below 2^53 are exact in f64).
    let mut first = [found.map_or(f64::NEG_INFINITY, |(pos, _)| -(pos as f64))];
    comm.all_reduce(&mut first[..], ReduceOp::Max)
        .context("agreeing on the token check")?;
    if first[0].is_finite() {
        let pos = (-first[0]) as usize;
        return match tokens.get(pos) {
            Err(e @ zero_models::data::DataError::TokenOutOfVocab { .. }) => {
                Err(e).context(format!(
                "data.path holds a token outside the model's vocabulary (model.vocab_size = {}); \
                 tokenize with the model's vocabulary or raise model.vocab_size",
                tokens.vocab()
            ))
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", tokens.name())),
            Ok(t) => bail!(
                "{}: token {t} at position {pos} is outside the vocabulary",
                tokens.name()
            ),
        };
    }
    if rank == 0 && started.elapsed() > Duration::from_secs(1) {
        log::info!(
            "checked {} tokens of {} in {:.1} s",
            len,
            tokens.name(),
            started.elapsed().as_secs_f64()
        );
    }
    let t = &config.train;
    let batch = world * t.grad_accum * t.micro_batch * t.seq_len + 1;
    if rank == 0 && len < batch {
        log::warn!(
            "{} holds {len} tokens, fewer than one global batch ({world} rank(s) x grad_accum {} x micro_batch {} x seq_len {} + 1 = {batch}): every step reads some tokens more than once (the order wraps around, or shuffled windows overlap)",
            tokens.name(),
            t.grad_accum,
            t.micro_batch,
            t.seq_len
        );
    }
    Ok(stamp)
}

/// A read of the token file on every rank (collective): its value where every rank read,
/// else the same error on every rank, naming each rank that could not read and why
/// (train/launch.rs's agreement; the check's errors are printed by rank 0 only).
fn read_on_every_rank<T, C: Communicator>(
    comm: &C,
    read: Result<T, zero_models::data::DataError>,
    what: &str,
) -> anyhow::Result<T> {
    agree(comm, read.map_err(anyhow::Error::from))
        .map_err(|f| f.error.context(format!("{what} the token data")))
}

/// Every rank reads the same tokens (data.path may name a node-local copy on each):
/// the ranks compare their token counts and sampled fingerprints ([`Tokens::fingerprint`]),
/// and all of them fail alike, naming the ranks that differ from rank 0, when one does:
/// the scan below splits the file between them, and a stale copy would train on other
/// data. Collective.
fn same_tokens_on_every_rank<C: Communicator>(
    comm: &C,
    tokens: &Tokens,
    fingerprint: u32,
) -> anyhow::Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let mine = [tokens.len() as i64, fingerprint as i64];
    let unlike = match zero_comm::unlike_rank_0(comm, &mine) {
        Ok(u) => u,
        // The ranks may now be at different points: end the job rather than finalize
        // MPI, which would wait for them.
        Err(e) => zero_comm::abort(&format!("error: comparing the ranks' token data: {e}"), 1),
    };
    if unlike.none() {
        return Ok(());
    }
    let differ: Vec<String> = unlike
        .others
        .iter()
        .map(|(r, v)| {
            if v[0] != unlike.root[0] {
                format!("rank {r} has {} tokens", v[0])
            } else {
                format!("rank {r} has other tokens")
            }
        })
        .collect();
    bail!(
        "the ranks read different token data: rank 0 has {} tokens, {}{}: every rank must read the same tokens; refresh the node-local copies, or give every rank one file on a shared file system",
        unlike.root[0],
        differ.join(", "),
        // Rank 0 prints this (the message is the same on every rank but for this).
        if comm.rank() == 0 {
            format!(" (rank 0 reads {})", tokens.name())
        } else {
            String::new()
        }
    )
}

/// What a token source held at one moment, as far as a cheap look tells: its size in bytes
/// and its sampled fingerprint ([`Tokens::fingerprint`], 256 reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    bytes: u64,
    fingerprint: u32,
}

impl Stamp {
    /// The stamp of `tokens` now.
    pub fn take(tokens: &Tokens) -> Result<Stamp, zero_models::data::DataError> {
        Ok(Stamp {
            bytes: tokens.bytes_now()?,
            fingerprint: tokens.fingerprint()?,
        })
    }
}

/// The token file, watched for being written again in place under the run (a tokenizer's
/// script run again over data.path): the reads, positioned, would go on in the new tokens,
/// and a checkpoint would hold steps of two datasets without a word. It is looked at where
/// a checkpoint is saved and after the last step; a smaller size or another fingerprint
/// than at the start stops the run (train/run.rs; a file that only grew reads as it did). A file replaced by a rename is not a change:
/// the run goes on reading the file it opened, which is as it was. A change that misses
/// every sampled window (a few tokens rewritten) is not seen.
pub struct DataWatch {
    start: Stamp,
    since: u64,
}

impl DataWatch {
    /// A watch of a source whose stamp was `start`, for a run that starts after step `since`.
    pub fn new(start: Stamp, since: u64) -> DataWatch {
        DataWatch { start, since }
    }

    /// The last step after which every rank's file was seen as at the start (or the step
    /// the run started after).
    pub fn since(&self) -> u64 {
        self.since
    }

    /// Whether every rank's token file is as at the start, looked at after step `done`.
    /// Collective: where one rank's changed (or can no longer be read), every rank gets
    /// the same failure, naming that rank and what changed.
    pub fn check<C: Communicator>(
        &mut self,
        comm: &C,
        tokens: &Tokens,
        done: u64,
    ) -> Result<(), Failure> {
        let now = Stamp::take(tokens)
            .map_err(anyhow::Error::from)
            .and_then(|now| self.compare(now, tokens.name()));
        agree(comm, now)?;
        self.since = done;
        Ok(())
    }

    fn compare(&self, now: Stamp, name: &str) -> anyhow::Result<()> {
        // Grown alone is no change: the reads stop at the length the run opened.
        let how = if now.bytes < self.start.bytes {
            format!(
                "it held {} bytes at the start and holds {} now",
                self.start.bytes, now.bytes
            )
        } else if now.fingerprint != self.start.fingerprint {
            "its tokens at sampled positions differ from those at the start".to_string()
        } else {
            return Ok(());
        };
        Err(anyhow!(
            "data.path {name} was written again while this run read it ({how})"
        ))
    }
}

/// This rank's micro-batches of each step.
pub struct Batches {
    order: Sequential,
    shuffle_seed: Option<u64>,
    inputs: Vec<Vec<u32>>,
    targets: Vec<Vec<u32>>,
}

impl Batches {
    /// The order of `config` for rank `rank` of `world`, starting at `origin` (a resumed
    /// run: where the checkpoint's order had got to; else the default).
    pub fn new(
        config: &Config,
        world: usize,
        rank: usize,
        origin: Origin,
    ) -> anyhow::Result<Batches> {
        let t = &config.train;
        let order = Sequential::new(t.micro_batch, t.seq_len, t.grad_accum, world, rank)
            .context("batch order")?
            .starting_at(origin);
        Ok(Batches {
            order,
            shuffle_seed: match config.data.order {
                DataOrder::Sequential => None,
                DataOrder::Shuffled => Some(t.seed),
            },
            inputs: vec![Vec::new(); t.grad_accum],
            targets: vec![Vec::new(); t.grad_accum],
        })
    }

    /// Where the order will have got to after `steps` steps (what a checkpoint records).
    pub fn origin_at(&self, steps: u64) -> Origin {
        self.order.origin_at(steps)
    }

    /// Fill the A micro-batches of global step `step` and return them.
    pub fn fill(&mut self, tokens: &Tokens, step: u64) -> anyhow::Result<Vec<Batch<'_>>> {
        let o = self.order;
        for m in 0..o.accum {
            let (inputs, targets) = (&mut self.inputs[m], &mut self.targets[m]);
            match self.shuffle_seed {
                None => o
                    .fill(tokens, step, m, inputs, targets)
                    .with_context(|| format!("reading step {step}, micro-step {m}"))?,
                Some(seed) => fill_shuffled(&o, seed, tokens, step, m, inputs, targets)
                    .with_context(|| format!("reading step {step}, micro-step {m}"))?,
            }
        }
        Ok((0..o.accum)
            .map(|m| Batch {
                rows: o.rows,
                seq_len: o.seq_len,
                inputs: &self.inputs[m],
                targets: &self.targets[m],
            })
            .collect())
    }
}

/// Start of the shuffled window of global row `g`: uniform over `0..=len - T - 1`.
fn shuffled_start(seed: u64, g: u128, len: usize, seq_len: usize) -> usize {
    // Mix the seed and both halves of g through SplitMix64 (bijective steps, so distinct
    // rows get independent-looking draws); the modulo bias is < span / 2^64.
    let mut s = SplitMix64::new(seed ^ (g as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let x = s.next_u64() ^ ((g >> 64) as u64);
    let span = (len - seq_len) as u64;
    (SplitMix64::new(x).next_u64() % span) as usize
}

fn fill_shuffled(
    o: &Sequential,
    seed: u64,
    tokens: &Tokens,
    step: u64,
    micro: usize,
    inputs: &mut Vec<u32>,
    targets: &mut Vec<u32>,
) -> anyhow::Result<()> {
    let t = o.seq_len;
    inputs.clear();
    targets.clear();
    let mut window = vec![0u32; t + 1];
    for row in 0..o.rows {
        let g = o.global_row(step, micro, row);
        let start = shuffled_start(seed, g, tokens.len(), t);
        tokens.read_wrapping(start, &mut window)?;
        inputs.extend_from_slice(&window[..t]);
        targets.extend_from_slice(&window[1..]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Tokens {
        Tokens::from_vec("t", (0..1000u16).map(|i| i % 50).collect(), 64).unwrap()
    }

    /// The global batch is the same for every N x A split with the same N*A (each row's
    /// window depends only on its global row index), in both orders.
    #[test]
    fn global_batch_independent_of_split() {
        for order in [DataOrder::Sequential, DataOrder::Shuffled] {
            let mut c = Config::default();
            c.data.order = order;
            c.train.micro_batch = 2;
            c.train.seq_len = 8;
            let gather = |world: usize, accum: usize| {
                let mut c = c.clone();
                c.train.grad_accum = accum;
                // Row order of the global batch: micro-step, then rank, then row.
                let mut rows: Vec<(usize, usize, Vec<u32>)> = Vec::new();
                for r in 0..world {
                    let mut b = Batches::new(&c, world, r, Origin::default()).unwrap();
                    for (m, batch) in b.fill(&corpus(), 3).unwrap().iter().enumerate() {
                        rows.push((m, r, batch.inputs.to_vec()));
                    }
                }
                rows.sort_by_key(|(m, r, _)| (*m, *r));
                rows.into_iter()
                    .flat_map(|(_, _, v)| v)
                    .collect::<Vec<u32>>()
            };
            assert_eq!(gather(4, 1), gather(1, 4), "{order:?}");
            assert_eq!(gather(2, 2), gather(1, 4), "{order:?}");
        }
    }

    #[test]
    fn shuffled_windows_stay_inside_and_targets_shift_by_one() {
        let tokens = corpus();
        let mut c = Config::default();
        c.train.micro_batch = 3;
        c.train.seq_len = 16;
        c.data.order = DataOrder::Shuffled;
        let mut b = Batches::new(&c, 1, 0, Origin::default()).unwrap();
        let batch = &b.fill(&tokens, 5).unwrap()[0];
        assert_eq!(batch.inputs.len(), 48);
        for row in 0..3 {
            let (i, t) = (&batch.inputs[row * 16..], &batch.targets[row * 16..]);
            assert_eq!(i[1..16], t[..15]);
        }
        for g in 0..10_000u128 {
            assert!(shuffled_start(7, g, 1000, 16) <= 1000 - 17);
        }
    }
}
