//! What the engine scenarios share: the tiny GPT and configuration they train, the device
//! they run on, and how a rank reports a failed check (prints `rank r: FAILED: ...`, exits
//! 1, so the job fails).

use zero_comm::Communicator;
use zero_core::config::{EngineConfig, Precision, Stage};
use zero_core::{Engine, Model};
use zero_kernels::device::HostDevice;
use zero_models::data::{MarkovSource, Sequential, Tokens};
use zero_models::GptConfig;
use zero_models::{Gpt, Llama, LlamaConfig, TokenBatch};

/// A host device for one engine and its model, alive for the rest of the process (an
/// engine borrows its device; a scenario binary builds a few dozen engines and exits).
pub fn host() -> &'static HostDevice {
    Box::leak(Box::new(HostDevice::new()))
}

/// What a scenario trains with: the engine's configuration, B rows per micro-batch, and
/// the steps to run.
#[derive(Clone, Debug)]
pub struct Tiny {
    /// The engine's configuration.
    pub engine: EngineConfig,
    /// B.
    pub rows: usize,
    /// Steps.
    pub steps: usize,
}

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
        vocab_block_rows: None,
        checkpoint_every: 0,
    }
}

/// The scenarios' configuration: `rows` x [`SEQ_LEN`] micro-batches, A = `accum`.
pub fn tiny_config(
    stage: Stage,
    precision: Precision,
    rows: usize,
    accum: usize,
    steps: usize,
) -> Tiny {
    let mut c = EngineConfig {
        grad_accum: accum,
        seed: 1234,
        ..Default::default()
    };
    c.zero.stage = stage;
    c.zero.align = 4;
    // Small buckets so units travel in several chunks (exercises the chunk queue).
    c.zero.bucket_elems = Some(512);
    c.precision.dtype = precision;
    c.optim.lr = 1e-2;
    // Some gradients are exactly zero in exact arithmetic (the attention key bias: softmax
    // cancels it) and pure rounding noise in floating point, and Adam normalises noise to
    // a step of lr * |g| / (sqrt(v) + eps). eps = 1e-6 keeps such steps below 1e-4 * lr
    // (noise |g| < 1e-10), so runs whose reductions add in another order stay comparable
    // element by element; every real gradient is far above eps.
    c.optim.eps = 1e-6;
    Tiny {
        engine: c,
        rows,
        steps,
    }
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

/// The built-in corpus the scenarios train on (64 symbols).
pub fn corpus() -> Result<Tokens, String> {
    MarkovSource::default_corpus(1 << 15, 64).map_err(|e| e.to_string())
}

/// Train the tiny GPT (`n_embd` 32) with `cfg` on `comm` and return every step's loss:
/// the same code under mpirun (`engine_stages losses`) and on thread ranks, so the two
/// transports can be held against each other.
pub fn train_losses<C: Communicator>(
    comm: &C,
    cfg: &Tiny,
    tokens: &Tokens,
) -> Result<Vec<f64>, String> {
    train_model_losses(comm, tiny_gpt(32), cfg, tokens)
}

/// [`train_losses`] for another GPT shape of the corpus's 64 symbols and [`SEQ_LEN`].
pub fn train_model_losses<C: Communicator>(
    comm: &C,
    gpt: GptConfig,
    cfg: &Tiny,
    tokens: &Tokens,
) -> Result<Vec<f64>, String> {
    let dev = HostDevice::new();
    let e = |e: &dyn std::fmt::Display| format!("rank {}: {e}", comm.rank());
    let mut model = Gpt::<HostDevice, f32>::new(&dev, gpt, cfg.rows).map_err(|x| e(&x))?;
    steps_losses(comm, &dev, &mut model, cfg, tokens)
}

/// [`train_losses`] for a Llama shape of the corpus's 64 symbols (context >= [`SEQ_LEN`]).
pub fn train_llama_losses<C: Communicator>(
    comm: &C,
    llama: LlamaConfig,
    cfg: &Tiny,
    tokens: &Tokens,
) -> Result<Vec<f64>, String> {
    let dev = HostDevice::new();
    let e = |e: &dyn std::fmt::Display| format!("rank {}: {e}", comm.rank());
    let mut model = Llama::<HostDevice, f32>::new(&dev, llama, cfg.rows).map_err(|x| e(&x))?;
    steps_losses(comm, &dev, &mut model, cfg, tokens)
}

/// [`train_losses`] on the simulated GPU (seed `seed`): the CUDA kernels' CPU twins,
/// with CUDA's stream rules checked on every op, the collectives' copies included.
pub fn train_losses_sim_gpu<C: Communicator>(
    comm: &C,
    cfg: &Tiny,
    tokens: &Tokens,
    seed: u64,
) -> Result<Vec<f64>, String> {
    let dev = zero_kernels::device::SimDevice::gpu_twin(seed);
    let e = |e: &dyn std::fmt::Display| format!("rank {}: {e}", comm.rank());
    let mut model = Gpt::<zero_kernels::device::SimDevice, f32>::new(&dev, tiny_gpt(32), cfg.rows)
        .map_err(|x| e(&x))?;
    steps_losses(comm, &dev, &mut model, cfg, tokens)
}

/// Train any token model with `cfg` on `comm`: every step's loss.
fn steps_losses<C, D, M>(
    comm: &C,
    dev: &D,
    model: &mut M,
    cfg: &Tiny,
    tokens: &Tokens,
) -> Result<Vec<f64>, String>
where
    C: Communicator,
    D: zero_kernels::device::Device,
    M: for<'a> Model<D, Batch<'a> = TokenBatch<'a>>,
{
    let e = |e: &dyn std::fmt::Display| format!("rank {}: {e}", comm.rank());
    let mut engine = Engine::new(&cfg.engine, comm, dev, model).map_err(|x| e(&x))?;
    let a = cfg.engine.grad_accum;
    let order =
        Sequential::new(cfg.rows, SEQ_LEN, a, comm.size(), comm.rank()).map_err(|x| e(&x))?;
    let (mut x, mut y) = (vec![Vec::new(); a], vec![Vec::new(); a]);
    let mut losses = Vec::new();
    for s in 0..cfg.steps as u64 {
        for m in 0..a {
            order
                .fill(tokens, s, m, &mut x[m], &mut y[m])
                .map_err(|x| e(&x))?;
        }
        let batches: Vec<TokenBatch<'_>> = (0..a)
            .map(|m| TokenBatch {
                rows: cfg.rows,
                seq_len: SEQ_LEN,
                inputs: &x[m],
                targets: &y[m],
            })
            .collect();
        losses.push(engine.step(model, &batches).map_err(|x| e(&x))?.loss);
    }
    Ok(losses)
}

/// The configurations `engine_stages losses` runs: every stage, fp32 and bf16, A = 1.
pub fn transport_cases() -> Vec<(String, Tiny)> {
    let mut out = Vec::new();
    for precision in [Precision::Fp32, Precision::Bf16] {
        for stage in Stage::ALL {
            out.push((
                format!("{stage:?}-{precision:?}"),
                tiny_config(stage, precision, 2, 1, 4),
            ));
        }
    }
    out
}
