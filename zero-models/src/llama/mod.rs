//! Llama (Touvron et al. 2023; Meta's `llama/model.py`) as a [`zero_core::Model`] on any
//! [`Device`], beside GPT-2 and built the same way: layers [embed, layers.0 ..
//! layers.{L-1}, head], each run on the parameter views of the units it uses, handed in
//! per call (nothing is kept between calls but activations).
//!
//! What differs from GPT-2 (`crate::gpt`): RMSNorm instead of LayerNorm, rotary position
//! embeddings instead of a position table, grouped-query attention (Hkv key/value heads
//! shared by H/Hkv query heads each), a SwiGLU MLP of width F, no biases, and an untied
//! output head (its own unit with the final norm). Each of those is a device op
//! (`rmsnorm_*`, `rope_gqa_*`, `swiglu_*`; CPU kernels in `zero_kernels::nn`, CUDA
//! kernels in `zero-kernels/src/nn/cuda/llama.cu` with their CPU twins), so the same code
//! runs on the host, the simulated devices and a GPU.
//!
//! Large tables are held in row blocks ([`LlamaConfig::vocab_blocks`], as GPT-2's `wte`):
//! the lookup of each further block of `tok_embeddings` is a layer before `embed` (each
//! writes the rows of x0 whose token is in its block), and the logits of each further
//! block of `output` a layer after `head` (`crate::head`, the same column blocks as
//! GPT-2's), so no layer's working set is a whole table.

mod block;
pub mod config;
mod layout;

pub use config::{LlamaConfig, LlamaLayer, LLAMA_PRESETS};
pub use zero_kernels::nn::RMS_EPS;

use std::ops::Range;

use zero_core::model::Compute;
use zero_core::{ModelError, ModelSpec};
use zero_kernels::device::{Buffer, DView, DViewMut, Device, Scalar};

use crate::gpt::GptError;
use crate::head::{logits_backward, logits_forward};
use crate::init;
use crate::layout::Dims;
use crate::lm::{
    arena_bytes_for, bad_call, check_backward_params, check_units, host_units, impl_model,
    LayeredLm, TokenArena, TokenBatch,
};
use block::{block_backward, block_forward, block_internals};
use layout::LlamaDims;

/// Llama with its activation arena on device `D`.
pub struct Llama<D: Device, F: Scalar = f32> {
    cfg: LlamaConfig,
    spec: ModelSpec,
    layers: Vec<LlamaLayer>,
    /// The row ranges of the tables' blocks.
    vocab_blocks: Vec<Range<usize>>,
    io: TokenArena<D, F>,
    dims: LlamaDims,
    /// Threads that draw initial values ([`Self::with_init_threads`]).
    init_threads: usize,
}

/// [`crate::lm::arena_fits`] for Llama's widths (the widest activation is q, k and v
/// together, or the MLP's F).
fn llama_arena_fits(cfg: &LlamaConfig, rows: usize, seq_len: usize) -> bool {
    let qkv = cfg.n_embd.saturating_add(cfg.kv_dim().saturating_mul(2));
    let widths = (
        qkv.max(cfg.ffn_hidden),
        cfg.n_head,
        cfg.vocab_size,
        cfg.n_layer,
    );
    crate::lm::arena_fits((rows, seq_len), widths)
}

fn dims_for(cfg: &LlamaConfig, b: usize, t: usize) -> LlamaDims {
    LlamaDims {
        b,
        t,
        c: cfg.n_embd,
        h: cfg.n_head,
        kv_h: cfg.n_kv_head,
        kv: cfg.kv_dim(),
        f: cfg.ffn_hidden,
        v: cfg.vocab_size,
        l: cfg.n_layer,
        theta: cfg.rope_theta,
        eps: cfg.norm_eps,
        every: cfg.checkpoint_every,
    }
}

/// Bytes of the activation arena for micro-batches of `rows` x `seq_len` and elements of
/// `elem_bytes`, without allocating it: what the planner adds per rank.
pub fn activation_bytes_for(
    cfg: &LlamaConfig,
    rows: usize,
    seq_len: usize,
    elem_bytes: usize,
) -> usize {
    if !llama_arena_fits(cfg, rows, seq_len) {
        return crate::lm::TOO_LARGE_ARENA;
    }
    arena_bytes_for(
        dims_for(cfg, rows, seq_len).total(),
        rows,
        seq_len,
        elem_bytes,
    )
}

/// GPT-2's head functions take its dims; the logits need only B, T, C and V.
fn head_dims(d: &LlamaDims) -> Dims {
    Dims {
        b: d.b,
        t: d.t,
        c: d.c,
        h: d.h,
        v: d.v,
        l: d.l,
        // The head keeps no block activations: checkpointing does not concern it.
        every: 0,
    }
}

impl<D: Device, F: Scalar> Llama<D, F> {
    /// A model for micro-batches of up to `max_rows` x `cfg.max_seq_len` tokens, its
    /// activation arena allocated on `dev` now; parameters live with the caller.
    pub fn new(dev: &D, cfg: LlamaConfig, max_rows: usize) -> Result<Self, GptError> {
        cfg.validate()?;
        if max_rows == 0 {
            return Err(crate::GptConfigError::Zero { name: "max_rows" }.into());
        }
        if !llama_arena_fits(&cfg, max_rows, cfg.max_seq_len) {
            let (rows, seq_len) = (max_rows, cfg.max_seq_len);
            return Err(crate::GptConfigError::ActivationsTooLarge { rows, seq_len }.into());
        }
        let dims = dims_for(&cfg, max_rows, cfg.max_seq_len);
        let limits = (max_rows, cfg.max_seq_len, cfg.vocab_size);
        Ok(Llama {
            cfg,
            spec: cfg.spec(),
            layers: cfg.layers(),
            vocab_blocks: cfg.vocab_blocks(),
            io: TokenArena::new(dev, dims.total(), limits, "llama")?,
            dims,
            init_threads: 1,
        })
    }

    /// Initial values drawn on up to `threads` threads (default 1; the values do not
    /// depend on it): the threads the rank's kernels use, which a job leaves it.
    pub fn with_init_threads(mut self, threads: usize) -> Self {
        self.init_threads = threads.max(1);
        self
    }

    /// The shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// Fresh parameters, one flat host buffer per unit.
    pub fn init_params(&self, seed: u64) -> Vec<Vec<F>> {
        host_units(&self.spec, |u, v| {
            let family = init::Family::Llama;
            init::init_unit(family, u, self.cfg.n_layer, seed, v, self.init_threads)
        })
    }

    /// Zeroed gradient buffers, one per unit (host).
    pub fn zero_grads(&self) -> Vec<Vec<F>> {
        host_units(&self.spec, |_, _| {})
    }

    /// Bytes of the activations (fixed at construction).
    pub fn arena_bytes(&self) -> usize {
        self.io.bytes()
    }
}

impl<D: Device, F: Scalar> LayeredLm<D, F> for Llama<D, F> {
    fn layer_spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn begin(&mut self, cx: Compute<'_, D>, batch: &TokenBatch<'_>) -> Result<(), ModelError> {
        self.io.begin(cx, batch)?;
        self.dims = dims_for(&self.cfg, batch.rows, batch.seq_len);
        Ok(())
    }

    fn loss_f64(&self, cx: Compute<'_, D>) -> Result<f64, ModelError> {
        let d = self.dims;
        let at = d.region_start(d.l + 1) + d.head_sizes()[..3].iter().sum::<usize>();
        self.io.mean_loss(cx, at, d.bt())
    }

    fn forward(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        params: &[DView<'_, D, F>],
    ) -> Result<(), ModelError> {
        self.io.expect_forward(layer, self.layers.len())?;
        let lens: Vec<usize> = params.iter().map(|p| p.len()).collect();
        check_units(&self.spec, layer, &lens, "parameter")?;
        let (dev, s) = (cx.dev, cx.stream);
        let d = self.dims;
        let (bt, c, v) = (d.bt(), d.c, d.v);
        let kind = self.layers[layer];
        let (rows, last) = kind.table_rows(&self.vocab_blocks);
        let n = rows.len() * c;
        let start = d.region_start(kind.region(self.cfg.n_layer));
        let end = start + d.region_len(kind.region(self.cfg.n_layer));
        let recompute = d.recompute_start()..d.recompute_start() + d.recompute_len();
        let mut parts = self
            .io
            .acts
            .split_mut(&[0..start, start..end, recompute])?
            .into_iter();
        let (Some(before), Some(region), Some(spare)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad_call("arena split".into()));
        };
        let x = before.as_view().slice(start.saturating_sub(bt * c)..start);
        let ids = self.io.inputs.slice(0..bt);
        let hd = head_dims(&d);
        let head = match kind {
            LlamaLayer::Lookup(_) | LlamaLayer::Embed => {
                // x0's rows whose token falls in this block (each row written by one block).
                let table = params[0].slice(0..n);
                dev.gather_rows_block(s, region, ids, table, rows.start, c)?;
                None
            }
            LlamaLayer::Block(i) => {
                // A checkpointed block's region is its output alone; its internals go to
                // the recompute region, overwritten by the next checkpointed block.
                let (acts, out) = if d.checkpointed(i) {
                    (spare, region)
                } else {
                    region.split_at(d.internal_len())
                };
                block_forward(cx, d, params[0].clone(), x, acts, out)?;
                None
            }
            LlamaLayer::Head => {
                // norm = RMSNorm(x), then block 0's logits norm output^T.
                let [mut norm, rstd, mut probs, losses] = region.carve(d.head_sizes());
                let (w, out) = (params[0].slice(0..c), params[0].slice(c..c + n));
                dev.rmsnorm_forward(s, norm.reborrow(), rstd, x, w, c, d.eps)?;
                logits_forward(cx, hd, norm.as_view(), out, probs.reborrow(), &rows)?;
                last.then_some((probs, losses))
            }
            LlamaLayer::Logits(_) => {
                let [norm, _, mut probs, losses] = region.carve(d.head_sizes());
                let out = params[0].slice(0..n);
                logits_forward(cx, hd, norm.as_view(), out, probs.reborrow(), &rows)?;
                last.then_some((probs, losses))
            }
        };
        let head_done = head.is_some();
        if let Some((probs, mut losses)) = head {
            // Every column is in: the cross-entropy per position, the probabilities left
            // in the arena for the backward.
            let targets = self.io.targets.slice(0..bt);
            dev.softmax_xent_forward(s, probs, losses.reborrow(), targets, v)?;
            dev.mean(s, self.io.loss.view_mut(), losses.as_view())?;
        }
        self.io.forward_done(layer, head_done);
        Ok(())
    }

    fn backward(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        params: &[DView<'_, D, F>],
        grads: &mut [DViewMut<'_, D, F>],
        grad_scale: F,
    ) -> Result<(), ModelError> {
        self.io.expect_backward(layer)?;
        let lens: Vec<usize> = params.iter().map(|p| p.len()).collect();
        check_backward_params(&self.spec, layer, &lens)?;
        let lens: Vec<usize> = grads.iter().map(|p| p.len()).collect();
        check_units(&self.spec, layer, &lens, "gradient")?;
        let (dev, s) = (cx.dev, cx.stream);
        let d = self.dims;
        let (bt, c, v) = (d.bt(), d.c, d.v);
        let kind = self.layers[layer];
        let (rows, last) = kind.table_rows(&self.vocab_blocks);
        let n = rows.len() * c;
        let start = d.region_start(kind.region(self.cfg.n_layer));
        let end = start + d.region_len(kind.region(self.cfg.n_layer));
        let scratch_at = d.scratch_start();
        let scratch = scratch_at..scratch_at + d.scratch_sizes().iter().sum::<usize>();
        let recompute = match kind {
            LlamaLayer::Block(i) if d.checkpointed(i) => Some(d.recompute_start()..scratch_at),
            _ => None,
        };
        // The head rewrites its probabilities in place: they get a write view of their own.
        let head = matches!(kind, LlamaLayer::Head | LlamaLayer::Logits(_));
        let probs_at = start + d.head_sizes()[..2].iter().sum::<usize>();
        let ranges = if head {
            vec![0..probs_at, probs_at..probs_at + bt * v, scratch]
        } else if let Some(r) = recompute.clone() {
            vec![0..end, r, scratch]
        } else {
            vec![0..end, scratch]
        };
        let mut parts = self.io.acts.split_mut(&ranges)?.into_iter();
        let acts = parts.next().ok_or_else(|| bad_call("arena split".into()))?;
        let acts = acts.as_view();
        let x = acts.slice(start.saturating_sub(bt * c)..start);
        match kind {
            LlamaLayer::Lookup(_) | LlamaLayer::Embed => {
                // tok_embeddings[token] += dx0, for the tokens in this block.
                let scratch = parts.next().ok_or_else(|| bad_call("arena split".into()))?;
                let dres = scratch.as_view().slice(0..bt * c);
                let ids = self.io.inputs.slice(0..bt);
                let dw = grads[0].reborrow().slice_mut(0..n);
                dev.scatter_add_rows_block(s, dw, ids, dres, rows.start, c)?;
            }
            LlamaLayer::Block(_) => {
                // Checkpointed: the internals again, from the saved input x.
                let mut spare = match recompute {
                    Some(_) => Some(parts.next().ok_or_else(|| bad_call("arena split".into()))?),
                    None => None,
                };
                if let Some(spare) = spare.as_mut() {
                    block_internals(cx, d, params[0].clone(), x.clone(), spare.reborrow())?;
                }
                let internals = match &spare {
                    Some(spare) => spare.as_view(),
                    None => acts.slice(start..start + d.internal_len()),
                };
                let scratch = parts.next().ok_or_else(|| bad_call("arena split".into()))?;
                let (p, g) = (params[0].clone(), grads[0].reborrow());
                block_backward(cx, d, p, g, x, internals, scratch)?;
            }
            LlamaLayer::Head | LlamaLayer::Logits(_) => {
                // The last block first: dlogits = (probs - onehot) grad_scale, in place.
                // Each block: dout_k += dlogits_k^T norm; dnorm (+)= dlogits_k out_k. The
                // head ends with the RMSNorm's backward: dres = d(x), norm's gradient added.
                let (Some(mut probs), Some(scratch)) = (parts.next(), parts.next()) else {
                    return Err(bad_call("arena split".into()));
                };
                let [norm, rstd] = acts.slice(start..probs_at).carve([bt * c, bt]);
                let [mut dres, mut dln, ..] = scratch.carve(d.scratch_sizes());
                if last {
                    let targets = self.io.targets.slice(0..bt);
                    dev.softmax_xent_backward(s, probs.reborrow(), targets, v, grad_scale)?;
                }
                let at = if kind == LlamaLayer::Head { c } else { 0 };
                let (dnw, dout) = grads[0].reborrow().split_at(at);
                let out = params[0].slice(at..at + n);
                let dout = dout.slice_mut(0..n);
                let hd = head_dims(&d);
                let dlogits = probs.as_view();
                let dnorm = dln.reborrow();
                logits_backward(cx, hd, dlogits, norm, out, dout, dnorm, &rows, last)?;
                if kind == LlamaLayer::Head {
                    let w = params[0].slice(0..c);
                    dev.fill(s, dres.reborrow(), F::ZERO)?;
                    let dnw = dnw.slice_mut(0..c);
                    dev.rmsnorm_backward(s, dres, dnw, dln.as_view(), x, w, rstd, c)?;
                }
            }
        }
        self.io.backward_done(layer);
        Ok(())
    }
}

impl_model!(Llama, init::Family::Llama);
