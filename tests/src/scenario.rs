//! What the engine scenarios share: the tiny GPT and configuration they train, and how a
//! rank reports a failed check (prints `rank r: FAILED: ...`, exits 1, so the job fails).

use zero_core::config::{Config, Precision, Stage};
use zero_models::GptConfig;

/// T: tokens per sequence (and the model's context).
pub const SEQ_LEN: usize = 16;

/// A 2-layer GPT over the built-in corpus's 64 symbols, `n_embd` wide.
pub fn tiny_gpt(n_embd: usize) -> GptConfig {
    GptConfig {
        vocab_size: 64,
        max_seq_len: SEQ_LEN,
        n_layer: 2,
        n_head: 2,
        n_embd,
    }
}

/// The scenarios' configuration: `rows` x [`SEQ_LEN`] micro-batches, A = `accum`.
pub fn tiny_config(
    stage: Stage,
    precision: Precision,
    rows: usize,
    accum: usize,
    steps: usize,
) -> Config {
    let mut c = Config::default();
    c.model.preset = Some("tiny".into());
    c.train.micro_batch = rows;
    c.train.seq_len = SEQ_LEN;
    c.train.grad_accum = accum;
    c.train.steps = steps;
    c.train.seed = 1234;
    c.zero.stage = stage;
    c.zero.align = 4;
    // Small buckets so units travel in several chunks (exercises the chunk queue).
    c.zero.bucket_elems = 512;
    c.precision.dtype = precision;
    c.optim.lr = 1e-2;
    // Some gradients are exactly zero in exact arithmetic (the attention key bias: softmax
    // cancels it) and pure rounding noise in floating point, and Adam normalises noise to
    // a step of lr * |g| / (sqrt(v) + eps). eps = 1e-6 keeps such steps below 1e-4 * lr
    // (noise |g| < 1e-10), so runs whose reductions add in another order stay comparable
    // element by element; every real gradient is far above eps.
    c.optim.eps = 1e-6;
    c
}

/// Report a failed check on this rank and exit 1 (the job then fails).
pub fn fail(rank: usize, what: String) -> ! {
    eprintln!("rank {rank}: FAILED: {what}");
    std::process::exit(1);
}

/// `result.or_fail(rank, "what")`: the value, or [`fail`] with the error.
pub trait OrFail<T> {
    /// The value, or exit through [`fail`].
    fn or_fail(self, rank: usize, what: &str) -> T;
}

impl<T, E: std::fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, rank: usize, what: &str) -> T {
        self.unwrap_or_else(|e| fail(rank, format!("{what}: {e}")))
    }
}
