//! The training loops of the examples: what research code writes around zero-core once
//! it has a model. A model, a configuration, an engine, and steps; each rank passes its
//! own rows of the step's global batch, and every rank gets the same global loss back.

use zero_comm::Communicator;
use zero_core::config::Schedule;
use zero_core::{Engine, EngineConfig, EngineError, Precision, Stage};
use zero_kernels::device::Device;

use super::char_lm::{CharLm, CharLmConfig, TokenBatch};
use super::data::{self, Blobs};
use super::launch::Example;
use super::mlp::{ClassBatch, Mlp};

/// The peak learning rate of both examples.
pub const LR: f64 = 3e-3;

/// How [`schedule`] moves the learning rate over a run of K steps, for `--help`.
pub fn schedule_help() -> String {
    format!(
        "the learning rate warms up linearly to {LR:e} over min(10, K/10) steps (none \
         below K = 10), then decays by a cosine to a tenth of that at step K"
    )
}

/// Warmup steps of a run of `steps`: a tenth of the run, at most 10, so that a short run
/// (down to 1 step) still fits the decay horizon, which the engine requires.
pub fn warmup_steps(steps: u64) -> usize {
    (steps / 10).min(10) as usize
}

/// A learning rate warmed up over [`warmup_steps`], then a cosine down to a tenth by
/// `steps`.
fn schedule(config: &mut EngineConfig, lr: f64, steps: u64) {
    config.optim.lr = lr;
    config.optim.schedule = Schedule::WarmupCosine;
    config.optim.warmup_steps = warmup_steps(steps);
    config.optim.min_lr = lr / 10.0;
    config.optim.decay_steps = Some(steps as usize);
}

/// The MLP classifier on 4 Gaussian blobs in 16 dimensions, 32 rows a rank a step.
pub fn train_mlp<C: Communicator, D: Device>(
    comm: &C,
    dev: &D,
    stage: Stage,
    steps: u64,
) -> Result<Vec<f64>, EngineError> {
    const FEATURES: usize = 16;
    const CLASSES: usize = 4;
    const ROWS: usize = 32;
    let mut model = Mlp::new(dev, FEATURES, 64, CLASSES, ROWS)?;
    let mut config = EngineConfig::default();
    config.zero.stage = stage;
    schedule(&mut config, LR, steps);
    let mut engine = Engine::new(&config, comm, dev, &model)?;
    let blobs = Blobs::new(FEATURES, CLASSES, 0.8, 1);
    let mut losses = Vec::new();
    for step in 0..steps {
        let (x, y) = blobs.rows(7, step, comm.rank() * ROWS, ROWS);
        let report = engine.step(
            &mut model,
            &[ClassBatch {
                features: &x,
                labels: &y,
            }],
        )?;
        // Steps are numbered from 1 (report.step), as everywhere in zero-rs.
        if comm.rank() == 0 && (step % 20 == 0 || step + 1 == steps) {
            println!(
                "step {:4}  loss {:.4}  grad norm {:.3}",
                report.step, report.loss, report.grad_norm
            );
        }
        losses.push(report.loss);
    }
    Ok(losses)
}

/// The character model (3 blocks of width 64, bf16) on the built-in text, 8 rows of 32
/// characters a rank a step.
pub fn train_char_lm<C: Communicator, D: Device>(
    comm: &C,
    dev: &D,
    stage: Stage,
    steps: u64,
) -> Result<Vec<f64>, EngineError> {
    const ROWS: usize = 8;
    const SEQ: usize = 32;
    let (tokens, vocab) = data::text_tokens();
    let shape = CharLmConfig {
        vocab,
        width: 64,
        blocks: 3,
        max_tokens: ROWS * SEQ,
    };
    let mut model = CharLm::new(dev, shape)?;
    let mut config = EngineConfig::default();
    config.zero.stage = stage;
    config.precision.dtype = Precision::Bf16;
    schedule(&mut config, LR, steps);
    let mut engine = Engine::new(&config, comm, dev, &model)?;
    if comm.rank() == 0 {
        println!(
            "{} parameters, {vocab} characters, ln V = {:.3}",
            engine.spec().numel(),
            (vocab as f64).ln()
        );
    }
    let mut losses = Vec::new();
    for step in 0..steps {
        let first = (step as usize * comm.size() + comm.rank()) * ROWS;
        let (x, y) = data::text_rows(&tokens, 3, 0, first, ROWS, SEQ);
        let batch = TokenBatch {
            inputs: &x,
            targets: &y,
            seq_len: SEQ,
        };
        let report = engine.step(&mut model, &[batch])?;
        if comm.rank() == 0 && (step % 25 == 0 || step + 1 == steps) {
            println!("step {:4}  loss {:.4}", report.step, report.loss);
        }
        losses.push(report.loss);
    }
    Ok(losses)
}

/// [`train_mlp`] as an [`Example`].
pub struct MlpExample;

impl Example for MlpExample {
    fn about(&self) -> &'static str {
        "an MLP classifier (16 features -> GELU MLP of width 64 -> softmax over 4 classes, \
         fp32) on Gaussian blobs, 32 rows a rank a step"
    }

    fn train<C: Communicator, D: Device>(
        &self,
        comm: &C,
        dev: &D,
        stage: Stage,
        steps: u64,
    ) -> Result<Vec<f64>, EngineError> {
        train_mlp(comm, dev, stage, steps)
    }
}

/// [`train_char_lm`] as an [`Example`].
pub struct CharLmExample;

impl Example for CharLmExample {
    fn about(&self) -> &'static str {
        "a character-level language model (3 token-shift blocks of width 64, head tied to \
         the embedding, bf16) on a built-in text, 8 rows of 32 characters a rank a step"
    }

    fn train<C: Communicator, D: Device>(
        &self,
        comm: &C,
        dev: &D,
        stage: Stage,
        steps: u64,
    ) -> Result<Vec<f64>, EngineError> {
        train_char_lm(comm, dev, stage, steps)
    }
}
