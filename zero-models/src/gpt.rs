//! GPT-2 as a [`zero_core::Model`] on any [`Device`]: layers [embed, h.0 .. h.{L-1},
//! head], each run on the parameter views of the units it uses, handed in per call
//! (nothing is kept between calls but activations). The LM head is tied to `wte`: the
//! head's backward adds dlogits^T lnf into `wte`'s gradient, and the embed layer's
//! backward adds its rows later.
//!
//! A large `wte` is held in row blocks ([`GptConfig::vocab_blocks`], [`GptLayer`]): the
//! lookup of each further block is a layer before `embed` (each writes the rows of x0
//! whose token is in its block, `embed` then adds the positions), and the logits of each
//! further block a layer after `head` (`head.rs`), so no layer reads the whole table.
//!
//! Generic over the device and the scalar: `Gpt<D, f32>` is the model the engine trains,
//! `Gpt<HostDevice, f64>` the reference the gradient checks hold it against, and every op
//! is a device op (`zero_kernels::device`), so the same code runs on the simulated device
//! and, with CUDA kernels behind the same ops, on a GPU.

use std::ops::Range;
use zero_core::model::Compute;
use zero_core::{ModelError, ModelSpec};

use zero_kernels::device::{
    Buffer, DView, DViewMut, Device, LayerNormGrads, LayerNormOut, LayerNormSaved, Scalar,
};
use zero_kernels::KernelError;

use crate::block::{block_backward, block_forward, block_internals};
use crate::config::{GptConfig, GptConfigError, GptLayer};
use crate::head::{logits_backward, logits_forward};
use crate::init;
use crate::layout::Dims;
pub use crate::lm::TokenBatch;
use crate::lm::{
    arena_bytes_for, bad_call, check_backward_params, check_units, host_units, impl_model,
    LayeredLm, TokenArena,
};

/// Errors of building the model.
#[derive(Debug, thiserror::Error)]
pub enum GptError {
    /// The shape is invalid.
    #[error(transparent)]
    Config(#[from] GptConfigError),
    /// The device could not allocate the activations.
    #[error("allocating the activations: {0}")]
    Device(#[from] KernelError),
}

/// GPT-2 with its activation arena on device `D`.
pub struct Gpt<D: Device, F: Scalar = f32> {
    cfg: GptConfig,
    spec: ModelSpec,
    /// What each of the spec's layers computes.
    layers: Vec<GptLayer>,
    /// The row ranges of `wte`'s blocks.
    vocab_blocks: Vec<Range<usize>>,
    io: TokenArena<D, F>,
    dims: Dims,
    /// Threads that draw initial values ([`Self::with_init_threads`]).
    init_threads: usize,
}

/// Bytes of the activation arena for micro-batches of `rows` x `seq_len` and elements of
/// `elem_bytes` (4 for f32), without allocating it: what the planner adds per rank.
pub fn activation_bytes_for(
    cfg: &GptConfig,
    rows: usize,
    seq_len: usize,
    elem_bytes: usize,
) -> usize {
    if !gpt_arena_fits(cfg, rows, seq_len) {
        return crate::lm::TOO_LARGE_ARENA;
    }
    arena_bytes_for(
        dims_for(cfg, rows, seq_len).total(),
        rows,
        seq_len,
        elem_bytes,
    )
}

/// [`crate::lm::arena_fits`] for GPT-2's widths (the widest activation is the MLP's 4C).
fn gpt_arena_fits(cfg: &GptConfig, rows: usize, seq_len: usize) -> bool {
    let widths = (
        cfg.n_embd.saturating_mul(4),
        cfg.n_head,
        cfg.vocab_size,
        cfg.n_layer,
    );
    crate::lm::arena_fits((rows, seq_len), widths)
}

fn dims_for(cfg: &GptConfig, b: usize, t: usize) -> Dims {
    Dims {
        b,
        t,
        c: cfg.n_embd,
        h: cfg.n_head,
        v: cfg.vocab_size,
        l: cfg.n_layer,
        every: cfg.checkpoint_every,
    }
}

impl<D: Device, F: Scalar> Gpt<D, F> {
    /// A model for micro-batches of up to `max_rows` x `cfg.max_seq_len` tokens, its
    /// activation arena allocated on `dev` now (see [`activation_bytes_for`]); parameters
    /// live with the caller.
    pub fn new(dev: &D, cfg: GptConfig, max_rows: usize) -> Result<Self, GptError> {
        cfg.validate()?;
        if max_rows == 0 {
            return Err(GptConfigError::Zero { name: "max_rows" }.into());
        }
        if !gpt_arena_fits(&cfg, max_rows, cfg.max_seq_len) {
            let (rows, seq_len) = (max_rows, cfg.max_seq_len);
            return Err(GptConfigError::ActivationsTooLarge { rows, seq_len }.into());
        }
        let dims = dims_for(&cfg, max_rows, cfg.max_seq_len);
        let limits = (max_rows, cfg.max_seq_len, cfg.vocab_size);
        Ok(Gpt {
            cfg,
            spec: cfg.spec(),
            layers: cfg.layers(),
            vocab_blocks: cfg.vocab_blocks(),
            io: TokenArena::new(dev, dims.total(), limits, "gpt")?,
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
    pub fn config(&self) -> &GptConfig {
        &self.cfg
    }

    /// Fresh parameters, one flat host buffer per unit (no padding).
    pub fn init_params(&self, seed: u64) -> Vec<Vec<F>> {
        host_units(&self.spec, |u, v| {
            init::init_unit(
                init::Family::Gpt,
                u,
                self.cfg.n_layer,
                seed,
                v,
                self.init_threads,
            )
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

impl<D: Device, F: Scalar> LayeredLm<D, F> for Gpt<D, F> {
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
        let at = d.layer_start(d.l + 1) + d.head_sizes()[..4].iter().sum::<usize>();
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
        let (bt, c) = (d.bt(), d.c);
        let kind = self.layers[layer];
        let (rows, last) = kind.table_rows(&self.vocab_blocks);
        let start = d.layer_start(kind.region(self.cfg.n_layer));
        let recompute = d.recompute_start()..d.recompute_start() + d.recompute_len();
        let mut parts = self
            .io
            .acts
            .split_mut(&[
                0..start,
                start..start + d.layer_len(kind.region(self.cfg.n_layer)),
                recompute,
            ])?
            .into_iter();
        let (Some(before), Some(mut region), Some(spare)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad_call("arena split".into()));
        };
        let x = before.as_view().slice(start.saturating_sub(bt * c)..start);
        let ids = self.io.inputs.slice(0..bt);
        let head = match kind {
            GptLayer::Lookup(_) => {
                // x0's rows whose token falls in block k (each row is written by one block).
                let w = params[0].slice(0..rows.len() * c);
                dev.gather_rows_block(s, region, ids, w, rows.start, c)?;
                None
            }
            GptLayer::Embed => {
                // x0[b,t] = wte[token] + wpe[t]: the lookups then one add round e + p once.
                let wte = params[0].slice(0..rows.len() * c);
                let wpe = params[0].slice(rows.len() * c..(rows.len() + d.t) * c);
                dev.gather_rows_block(s, region.reborrow(), ids, wte, 0, c)?;
                dev.add_periodic_rows(s, region, wpe, d.t, c)?;
                None
            }
            GptLayer::Block(i) => {
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
            GptLayer::Head => {
                // lnf = LN(x), then block 0's logits lnf wte^T.
                let [mut lnf, mean, rstd, mut probs, losses] = region.carve(d.head_sizes());
                let (w, b) = (params[0].slice(0..c), params[0].slice(c..2 * c));
                let out = LayerNormOut {
                    out: lnf.reborrow(),
                    mean,
                    rstd,
                };
                dev.layernorm_forward(s, out, x, w, b, c)?;
                logits_forward(
                    cx,
                    d,
                    lnf.as_view(),
                    params[1].clone(),
                    probs.reborrow(),
                    &rows,
                )?;
                last.then_some((probs, losses))
            }
            GptLayer::Logits(_) => {
                let [lnf, _, _, mut probs, losses] = region.carve(d.head_sizes());
                logits_forward(
                    cx,
                    d,
                    lnf.as_view(),
                    params[0].clone(),
                    probs.reborrow(),
                    &rows,
                )?;
                last.then_some((probs, losses))
            }
        };
        let head_done = head.is_some();
        if let Some((probs, mut losses)) = head {
            // Every column is in: per position the cross-entropy as log-sum-exp (never
            // log 0), the probabilities left in the arena for the backward.
            let targets = self.io.targets.slice(0..bt);
            dev.softmax_xent_forward(s, probs, losses.reborrow(), targets, d.v)?;
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
        let start = d.layer_start(kind.region(self.cfg.n_layer));
        let end = start + d.layer_len(kind.region(self.cfg.n_layer));
        let scratch_at = d.scratch_start();
        let scratch = scratch_at..scratch_at + d.scratch_sizes().iter().sum::<usize>();
        let recompute = match kind {
            GptLayer::Block(i) if d.checkpointed(i) => Some(d.recompute_start()..scratch_at),
            _ => None,
        };
        // The head rewrites its probabilities in place: they get a write view of their own.
        let head = matches!(kind, GptLayer::Head | GptLayer::Logits(_));
        let probs_at = start + d.head_sizes()[..3].iter().sum::<usize>();
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
        let ids = self.io.inputs.slice(0..bt);
        match kind {
            GptLayer::Lookup(_) => {
                // wte[token] += dx0 for the tokens in block k.
                let scratch = parts.next().ok_or_else(|| bad_call("arena split".into()))?;
                let dres = scratch.as_view().slice(0..bt * c);
                let dw = grads[0].reborrow().slice_mut(0..rows.len() * c);
                dev.scatter_add_rows_block(s, dw, ids, dres, rows.start, c)?;
            }
            GptLayer::Embed => {
                // wte[token] += dx0 (block 0's tokens); wpe[t] += dx0. The head added its
                // part of wte already.
                let scratch = parts.next().ok_or_else(|| bad_call("arena split".into()))?;
                let dres = scratch.as_view().slice(0..bt * c);
                let (dwte, rest) = grads[0].reborrow().split_at(rows.len() * c);
                let dwpe = rest.slice_mut(0..d.t * c);
                dev.scatter_add_rows_block(s, dwte, ids, dres.clone(), 0, c)?;
                dev.periodic_rows_backward(s, dwpe, dres, d.t, c)?;
            }
            GptLayer::Block(_) => {
                // Checkpointed: the internals again, from the saved input x.
                let mut spare = match recompute {
                    Some(_) => Some(parts.next().ok_or_else(|| bad_call("arena split".into()))?),
                    None => None,
                };
                if let Some(spare) = spare.as_mut() {
                    block_internals(cx, d, params[0].clone(), x.clone(), spare.reborrow())?;
                }
                let region = match &spare {
                    Some(spare) => spare.as_view(),
                    None => acts.slice(start..start + d.internal_len()),
                };
                let scratch = parts.next().ok_or_else(|| bad_call("arena split".into()))?;
                block_backward(
                    cx,
                    d,
                    params[0].clone(),
                    grads[0].reborrow(),
                    x,
                    region,
                    scratch,
                )?;
            }
            GptLayer::Head | GptLayer::Logits(_) => {
                // The last block first: dlogits = (probs - onehot) grad_scale, in place.
                // Each block: dwte_k += dlogits_k^T lnf; dln (+)= dlogits_k wte_k. The head
                // ends with the LayerNorm's backward: dres = d(x), ln_f's gradient added.
                let (Some(mut probs), Some(scratch)) = (parts.next(), parts.next()) else {
                    return Err(bad_call("arena split".into()));
                };
                let [lnf, mean, rstd] = acts.slice(start..probs_at).carve([bt * c, bt, bt]);
                let [mut dres, mut dln, ..] = scratch.carve(d.scratch_sizes());
                if last {
                    let targets = self.io.targets.slice(0..bt);
                    dev.softmax_xent_backward(s, probs.reborrow(), targets, v, grad_scale)?;
                }
                let (wte, dwte) = match kind {
                    GptLayer::Head => (params[1].clone(), grads[1].reborrow()),
                    _ => (params[0].clone(), grads[0].reborrow()),
                };
                let (dlogits, lnf_in) = (probs.as_view(), lnf.clone());
                logits_backward(
                    cx,
                    d,
                    dlogits,
                    lnf_in,
                    wte,
                    dwte,
                    dln.reborrow(),
                    &rows,
                    last,
                )?;
                if kind == GptLayer::Head {
                    dev.fill(s, dres.reborrow(), F::ZERO)?;
                    let (dw, db) = grads[0].reborrow().split_at(c);
                    let grads = LayerNormGrads {
                        dx: dres,
                        dw,
                        db: db.slice_mut(0..c),
                    };
                    let saved = LayerNormSaved {
                        x,
                        w: params[0].slice(0..c),
                        mean,
                        rstd,
                    };
                    dev.layernorm_backward(s, grads, dln.as_view(), saved, c)?;
                }
            }
        }
        self.io.backward_done(layer);
        Ok(())
    }
}

impl_model!(Gpt, init::Family::Gpt);
