//! Train a model of your own with zero-core: an MLP classifier (features -> GELU MLP ->
//! softmax over 4 classes, `models/mlp.rs`; the loop is `models/train.rs`) on Gaussian
//! blobs, at any ZeRO stage, on N ranks.
//!
//! ```text
//! cargo run --release -p zero-core --example mlp_classifier -- --ranks 2 --stage 3
//! scripts/mpirun.sh 2 target/release/examples/mlp_classifier --stage 3    # one process a rank
//! ```
//!
//! Options (`--help` lists them): `--ranks N` (thread ranks when not under mpirun, N >= 1;
//! default 2), `--stage S` (default 3), `--steps K` (K >= 1, default 200; the learning rate
//! warms up over min(10, K/10) steps, then decays by a cosine to a tenth at step K),
//! `--sim` (the simulated device: a test tool that checks every stream hand-over, slower).

#[path = "models/mod.rs"]
mod models;

fn main() -> std::process::ExitCode {
    models::launch::main("mlp_classifier", &models::train::MlpExample, 200)
}
