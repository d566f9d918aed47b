//! Train a model of your own with zero-core: a small character-level language model whose
//! block mixes each position with the previous one (no attention; `models/char_lm.rs`),
//! its head tied to the embedding, on a built-in text (the loop is `models/train.rs`), at
//! any ZeRO stage, on N ranks.
//!
//! ```text
//! cargo run --release -p zero-core --example char_lm -- --ranks 2 --stage 3
//! scripts/mpirun.sh 2 target/release/examples/char_lm --stage 3    # one process a rank
//! ```
//!
//! Options (`--help` lists them): `--ranks N` (thread ranks when not under mpirun, N >= 1;
//! default 2), `--stage S` (default 3), `--steps K` (K >= 1, default 300; the learning rate
//! warms up over min(10, K/10) steps, then decays by a cosine to a tenth at step K),
//! `--sim` (the simulated device).

#[path = "models/mod.rs"]
mod models;

fn main() -> std::process::ExitCode {
    models::launch::main("char_lm", &models::train::CharLmExample, 300)
}
