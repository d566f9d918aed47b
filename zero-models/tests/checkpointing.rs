//! Activation checkpointing (`GptConfig::checkpoint_every`, `LlamaConfig::checkpoint_every`):
//! a checkpointed block keeps only its output and recomputes its internals in the
//! backward, with the same ops on the same input, so the loss and every gradient are the
//! bits of the model that keeps everything: f64 and f32, bf16 products, the table in row
//! blocks, a batch smaller than the arena, on the host (1 and 2 threads), the simulated
//! device and the simulated GPU; GPT-2 and Llama alike. The arena shrinks by exactly the
//! internals of every checkpointed block but one.

use zero_core::model::Compute;
use zero_kernels::device::{Device, HostDevice, Scalar, SimDevice};
use zero_models::init::SplitMix64;
use zero_models::LayeredLm;
use zero_models::{
    activation_bytes_for, download_units, upload_units, Gpt, GptConfig, Llama, LlamaConfig,
    TokenBatch,
};

/// What the tests need of a model family: its shape with a checkpointing setting, and one
/// forward + backward.
trait Family: Copy {
    fn every(self, k: usize) -> Self;
    fn vocab_and_seq(self) -> (usize, usize);
    /// Fresh parameters, zero gradients, and the loss of one forward + backward.
    fn forward_backward<D: Device, F: Scalar>(
        self,
        cx: Compute<'_, D>,
        batch: &TokenBatch<'_>,
        max_rows: usize,
        perturb: &mut dyn FnMut(&mut [Vec<F>]),
    ) -> (f64, Vec<D::Buf<F>>);
}

/// Parameters perturbed by the caller, uploaded; gradients zero; one forward + backward.
macro_rules! family_forward_backward {
    ($model:ty) => {
        fn forward_backward<D: Device, F: Scalar>(
            self,
            cx: Compute<'_, D>,
            batch: &TokenBatch<'_>,
            max_rows: usize,
            perturb: &mut dyn FnMut(&mut [Vec<F>]),
        ) -> (f64, Vec<D::Buf<F>>) {
            let mut model = <$model>::new(cx.dev, self, max_rows).expect("valid");
            let mut params = model.init_params(5);
            perturb(&mut params);
            let p = upload_units(cx, &params, "p").expect("upload");
            let mut grads = upload_units(cx, &model.zero_grads(), "g").expect("upload");
            let scale = F::from_f64(1.0 / (batch.rows * batch.seq_len) as f64);
            let loss = model
                .forward_backward(cx, batch, &p, &mut grads, scale)
                .expect("valid call");
            (loss, grads)
        }
    };
}

impl Family for GptConfig {
    fn every(self, k: usize) -> Self {
        GptConfig {
            checkpoint_every: k,
            ..self
        }
    }
    fn vocab_and_seq(self) -> (usize, usize) {
        (self.vocab_size, self.max_seq_len)
    }
    family_forward_backward!(Gpt<D, F>);
}

impl Family for LlamaConfig {
    fn every(self, k: usize) -> Self {
        LlamaConfig {
            checkpoint_every: k,
            ..self
        }
    }
    fn vocab_and_seq(self) -> (usize, usize) {
        (self.vocab_size, self.max_seq_len)
    }
    family_forward_backward!(Llama<D, F>);
}

/// Three blocks (so k = 2 mixes checkpointed and full blocks), two attention heads.
fn three_blocks() -> GptConfig {
    let mut cfg = GptConfig::preset("tiny").expect("tiny is a preset");
    cfg.n_layer = 3;
    cfg.n_embd = 32;
    cfg.max_seq_len = 12;
    cfg
}

fn with_every<M: Family>(cfg: M, k: usize) -> M {
    cfg.every(k)
}

/// `llama-tiny` with three blocks at T = 12, grouped-query attention (4 heads, 2 kv).
fn llama_three_blocks() -> LlamaConfig {
    LlamaConfig {
        n_layer: 3,
        max_seq_len: 12,
        ..LlamaConfig::preset("llama-tiny").expect("llama-tiny is a preset")
    }
}

/// The loss and every gradient (bits) of one forward + backward of a fixed batch of
/// `rows` rows on a model whose arena takes `max_rows`.
fn run<M: Family, D: Device, F: Scalar>(
    dev: &D,
    cfg: M,
    rows: usize,
    max_rows: usize,
) -> (u64, Vec<Vec<F>>) {
    let stream = dev.stream("compute").expect("stream");
    let cx = Compute {
        dev,
        stream: &stream,
    };
    let mut g = SplitMix64::new(17);
    let (v, t) = cfg.vocab_and_seq();
    let n = rows * t;
    let x: Vec<u32> = (0..n).map(|_| (g.next_u64() % v as u64) as u32).collect();
    let y: Vec<u32> = (0..n).map(|_| (g.next_u64() % v as u64) as u32).collect();
    let batch = TokenBatch {
        rows,
        seq_len: t,
        inputs: &x,
        targets: &y,
    };
    // Off the init (zero biases, unit norm weights) so every path carries gradient.
    let mut perturb = |params: &mut [Vec<F>]| {
        for p in params.iter_mut().flatten() {
            *p += F::from_f64(0.1 * g.next_normal());
        }
    };
    let (loss, grads) = cfg.forward_backward::<D, F>(cx, &batch, max_rows, &mut perturb);
    let grads = download_units(cx, &grads).expect("download");
    (loss.to_bits(), grads)
}

fn bits<F: Scalar>(g: &[Vec<F>]) -> Vec<u64> {
    g.iter().flatten().map(|x| x.to_f64().to_bits()).collect()
}

/// `run` at k = 1, 2, 3 gives k = 0's loss and gradients bit for bit.
fn same_bits<M: Family, D: Device, F: Scalar>(dev: &D, cfg: M, rows: usize, max_rows: usize) {
    let (loss, grads) = run::<M, D, F>(dev, with_every(cfg, 0), rows, max_rows);
    assert!(grads.iter().flatten().any(|g| g.to_f64() != 0.0));
    for k in [1, 2, 3] {
        let (l, g) = run::<M, D, F>(dev, with_every(cfg, k), rows, max_rows);
        assert_eq!(l, loss, "loss at checkpoint_every = {k}");
        assert_eq!(
            bits(&g),
            bits(&grads),
            "gradients at checkpoint_every = {k}"
        );
    }
}

/// Every setting of the module documentation, for the model of shape `cfg` and its
/// tables in row blocks `split`.
fn same_bits_everywhere<M: Family>(cfg: M, split: M) {
    same_bits::<_, _, f64>(&HostDevice::new(), cfg, 2, 2);
    same_bits::<_, _, f32>(&HostDevice::new(), cfg, 2, 2);
    same_bits::<_, _, f32>(&HostDevice::with_threads(2), cfg, 2, 2);
    // A batch of fewer rows than the arena was laid out for.
    same_bits::<_, _, f32>(&HostDevice::new(), cfg, 2, 3);
    // The token table in row blocks (lookup and logits layers around the blocks).
    same_bits::<_, _, f32>(&HostDevice::new(), split, 2, 2);
    // bf16 products (what bf16 training sets): the recompute rounds the same operands.
    let dev = HostDevice::new();
    dev.set_bf16_products(true);
    same_bits::<_, _, f32>(&dev, cfg, 2, 2);
    // Queued and interleaved, every access hazard-checked; and the GPU kernels' twins.
    same_bits::<_, _, f32>(&SimDevice::new(3), cfg, 2, 2);
    same_bits::<_, _, f32>(&SimDevice::gpu_twin(4), cfg, 2, 2);
}

#[test]
fn checkpointed_blocks_give_the_bits_of_kept_activations() {
    let cfg = three_blocks();
    let split = GptConfig {
        vocab_block_rows: Some(10),
        ..cfg
    };
    same_bits_everywhere(cfg, split);
}

#[test]
fn checkpointed_llama_blocks_give_the_bits_of_kept_activations() {
    let cfg = llama_three_blocks();
    let split = LlamaConfig {
        vocab_block_rows: Some(20),
        ..cfg
    };
    same_bits_everywhere(cfg, split);
}

/// Elements of one GPT-2 block's internal activations: everything but its output, B T
/// (15 C + 4) + B H T^2 (ln1, qkv, atty, res2, ln2 and the MLP's 4C twice; four LayerNorm
/// statistics; the attention probabilities).
fn gpt_internals(cfg: GptConfig, b: usize, t: usize) -> usize {
    b * t * (15 * cfg.n_embd + 4) + b * cfg.n_head * t * t
}

/// Elements of one Llama block's internals: everything but its output, B T (8 C + 2 Ckv +
/// 3 F + 2) + B H T^2 (an, q, qkv (3C), atty, res2, fn; k and v; h1, h3 and g; two RMSNorm
/// statistics; the attention probabilities).
fn llama_internals(cfg: LlamaConfig, b: usize, t: usize) -> usize {
    let c = cfg.n_embd;
    let kv = cfg.kv_dim();
    b * t * (8 * c + 2 * kv + 3 * cfg.ffn_hidden + 2) + b * cfg.n_head * t * t
}

/// For each shape in `cfgs` (L blocks): at k = 1..=L+1, blocks 0, k, 2k, ... keep their
/// output only and one block's internals remain for the recompute, so the arena of
/// `bytes` (B = 3 x the context) is smaller by `internals` x (checkpointed blocks - 1).
fn arena_shrinks<M: Family>(
    cfgs: &[(M, usize)],
    bytes: impl Fn(M, usize, usize) -> usize,
    internals: impl Fn(M, usize, usize) -> usize,
) {
    for &(cfg, l) in cfgs {
        let (b, t) = (3, cfg.vocab_and_seq().1);
        let full = bytes(cfg, b, t);
        for k in 1..=l + 1 {
            let checkpointed = l.div_ceil(k);
            let want = full - (checkpointed - 1) * internals(cfg, b, t) * 4;
            assert_eq!(bytes(with_every(cfg, k), b, t), want, "L = {l}, k = {k}");
        }
    }
}

#[test]
fn the_arena_shrinks_by_the_internals_of_every_checkpointed_block_but_one() {
    let small = GptConfig::preset("small").expect("preset");
    let gpt_bytes = |cfg: GptConfig, b, t| activation_bytes_for(&cfg, b, t, 4);
    arena_shrinks(
        &[(three_blocks(), 3), (small, small.n_layer)],
        gpt_bytes,
        gpt_internals,
    );
    let small = LlamaConfig::preset("llama-small").expect("preset");
    let llama_bytes =
        |cfg: LlamaConfig, b, t| zero_models::llama::activation_bytes_for(&cfg, b, t, 4);
    let shapes = [(llama_three_blocks(), 3), (small, small.n_layer)];
    arena_shrinks(&shapes, llama_bytes, llama_internals);
    // What `new` allocates is what the planner is told.
    let dev = HostDevice::new();
    let cfg = with_every(three_blocks(), 2);
    let model = Gpt::<HostDevice, f32>::new(&dev, cfg, 3).expect("valid");
    assert_eq!(model.arena_bytes(), gpt_bytes(cfg, 3, cfg.max_seq_len));
    let cfg = with_every(llama_three_blocks(), 2);
    let model = Llama::<HostDevice, f32>::new(&dev, cfg, 3).expect("valid");
    assert_eq!(model.arena_bytes(), llama_bytes(cfg, 3, cfg.max_seq_len));
}
