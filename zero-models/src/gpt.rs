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
use zero_core::model::{Compute, UnitGrads, UnitParams};
use zero_core::{Model, ModelError, ModelSpec};

use zero_kernels::device::{
    Buffer, DView, DViewMut, Device, LayerNormGrads, LayerNormOut, LayerNormSaved, Scalar,
};
use zero_kernels::nn::mean_f64;
use zero_kernels::KernelError;

use crate::block::{block_backward, block_forward, block_internals};
use crate::config::{GptConfig, GptConfigError, GptLayer};
use crate::head::{logits_backward, logits_forward};
use crate::init;
use crate::layout::Dims;

/// One micro-batch: `rows` sequences of `seq_len` tokens and their targets (the next
/// token), row-major.
#[derive(Clone, Copy, Debug)]
pub struct TokenBatch<'a> {
    /// B: sequences in the micro-batch.
    pub rows: usize,
    /// T: tokens per sequence.
    pub seq_len: usize,
    /// Input tokens, `rows * seq_len`.
    pub inputs: &'a [u32],
    /// Target tokens, `rows * seq_len`.
    pub targets: &'a [u32],
}

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
    max_rows: usize,
    arena: D::Buf<F>,
    inputs: D::Buf<u32>,
    targets: D::Buf<u32>,
    loss: D::Buf<F>,
    dims: Dims,
    /// Next forward layer expected (layers == all done).
    fwd_next: usize,
    /// Next backward layer expected (None when none may run).
    bwd_next: Option<usize>,
}

/// Bytes of the activation arena for micro-batches of `rows` x `seq_len` and elements of
/// `elem_bytes` (4 for f32), without allocating it: what the planner adds per rank.
pub fn activation_bytes_for(
    cfg: &GptConfig,
    rows: usize,
    seq_len: usize,
    elem_bytes: usize,
) -> usize {
    let tokens = rows * seq_len;
    dims_for(cfg, rows, seq_len).total() * elem_bytes + 2 * tokens * 4 + elem_bytes
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

fn bad_call(msg: String) -> ModelError {
    ModelError::BadCall(msg)
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
        let dims = dims_for(&cfg, max_rows, cfg.max_seq_len);
        let tokens = max_rows * cfg.max_seq_len;
        Ok(Gpt {
            cfg,
            spec: cfg.spec(),
            layers: cfg.layers(),
            vocab_blocks: cfg.vocab_blocks(),
            max_rows,
            arena: dev.alloc(dims.total(), "gpt activations")?,
            inputs: dev.alloc(tokens, "gpt inputs")?,
            targets: dev.alloc(tokens, "gpt targets")?,
            loss: dev.alloc(1, "gpt loss")?,
            dims,
            fwd_next: 0,
            bwd_next: None,
        })
    }

    /// The shape.
    pub fn config(&self) -> &GptConfig {
        &self.cfg
    }

    /// Fresh parameters, one flat host buffer per unit (no padding).
    pub fn init_params(&self, seed: u64) -> Vec<Vec<F>> {
        self.spec
            .units
            .iter()
            .map(|u| {
                let mut v = vec![F::ZERO; u.numel()];
                init::init_unit(u, self.cfg.n_layer, seed, &mut v);
                v
            })
            .collect()
    }

    /// Zeroed gradient buffers, one per unit (host).
    pub fn zero_grads(&self) -> Vec<Vec<F>> {
        self.spec
            .units
            .iter()
            .map(|u| vec![F::ZERO; u.numel()])
            .collect()
    }

    /// Bytes of the activations (fixed at construction).
    pub fn arena_bytes(&self) -> usize {
        (self.arena.allocated_bytes()
            + self.inputs.allocated_bytes()
            + self.targets.allocated_bytes()
            + self.loss.allocated_bytes()) as usize
    }

    /// Start a micro-step: check the batch on the host, upload it, lay the arena out for
    /// its B x T.
    pub fn begin(&mut self, cx: Compute<'_, D>, batch: &TokenBatch<'_>) -> Result<(), ModelError> {
        let (b, t) = (batch.rows, batch.seq_len);
        if b == 0 || b > self.max_rows || t == 0 || t > self.cfg.max_seq_len {
            return Err(ModelError::BadBatch(format!(
                "batch of {b} rows x {t} tokens; this model takes 1..={} rows x 1..={} tokens",
                self.max_rows, self.cfg.max_seq_len
            )));
        }
        for (what, v) in [("inputs", batch.inputs), ("targets", batch.targets)] {
            if v.len() != b * t {
                return Err(ModelError::BadBatch(format!(
                    "{what} has {} tokens, expected rows*seq_len = {b}*{t} = {}",
                    v.len(),
                    b * t
                )));
            }
            if let Some(i) = v.iter().position(|&x| x as usize >= self.cfg.vocab_size) {
                return Err(ModelError::BadBatch(format!(
                    "{what}[{i}] = {} is outside the vocabulary (V = {})",
                    v[i], self.cfg.vocab_size
                )));
            }
        }
        cx.dev
            .upload(cx.stream, batch.inputs, self.inputs.slice_mut(0..b * t))?;
        cx.dev
            .upload(cx.stream, batch.targets, self.targets.slice_mut(0..b * t))?;
        self.dims = dims_for(&self.cfg, b, t);
        self.fwd_next = 0;
        self.bwd_next = None;
        Ok(())
    }

    /// The micro-step's mean cross-entropy, computed in f64 from the per-position losses
    /// (after the head's forward; a host copy, waits for the compute stream).
    pub fn loss_f64(&self, cx: Compute<'_, D>) -> Result<f64, ModelError> {
        let d = self.dims;
        let at = d.layer_start(d.l + 1) + d.head_sizes()[..4].iter().sum::<usize>();
        let mut losses = vec![F::ZERO; d.bt()];
        cx.dev
            .download(cx.stream, self.arena.slice(at..at + d.bt()), &mut losses)?;
        Ok(mean_f64(&losses))
    }

    fn check_units(&self, layer: usize, lens: &[usize], what: &str) -> Result<(), ModelError> {
        let units = &self.spec.layers[layer].units;
        if lens.len() != units.len() {
            return Err(bad_call(format!(
                "layer {layer} uses {} units, got {} {what} views",
                units.len(),
                lens.len()
            )));
        }
        for (&u, &len) in units.iter().zip(lens) {
            let need = self.spec.units[u].numel();
            if len < need {
                return Err(bad_call(format!(
                    "{what} view of unit '{}' has {len} elements, needs {need}",
                    self.spec.units[u].name
                )));
            }
        }
        Ok(())
    }

    /// Where a layer's activations live: 0 = x0, 1..=L the blocks, L+1 the head.
    fn region(&self, layer: GptLayer) -> usize {
        match layer {
            GptLayer::Lookup(_) | GptLayer::Embed => 0,
            GptLayer::Block(i) => i + 1,
            GptLayer::Head | GptLayer::Logits(_) => self.cfg.n_layer + 1,
        }
    }

    /// The rows of the `wte` block a layer of the table uses (block 0 for the others),
    /// and whether it is the last block (the one the loss follows).
    fn vocab_block(&self, layer: GptLayer) -> (Range<usize>, bool) {
        let k = match layer {
            GptLayer::Lookup(k) | GptLayer::Logits(k) => k,
            _ => 0,
        };
        (
            self.vocab_blocks[k].clone(),
            k + 1 == self.vocab_blocks.len(),
        )
    }

    /// Forward of `layer` on the parameters of its units.
    pub fn forward(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        params: &[DView<'_, D, F>],
    ) -> Result<(), ModelError> {
        if layer != self.fwd_next || layer >= self.layers.len() {
            return Err(bad_call(format!(
                "forward of layer {layer}, expected layer {} (call begin_micro_step first; \
                 layers run in order)",
                self.fwd_next
            )));
        }
        let lens: Vec<usize> = params.iter().map(|p| p.len()).collect();
        self.check_units(layer, &lens, "parameter")?;
        let (dev, s) = (cx.dev, cx.stream);
        let d = self.dims;
        let (bt, c) = (d.bt(), d.c);
        let kind = self.layers[layer];
        let (rows, last) = self.vocab_block(kind);
        let start = d.layer_start(self.region(kind));
        let recompute = d.recompute_start()..d.recompute_start() + d.recompute_len();
        let mut parts = self
            .arena
            .split_mut(&[
                0..start,
                start..start + d.layer_len(self.region(kind)),
                recompute,
            ])?
            .into_iter();
        let (Some(before), Some(mut region), Some(spare)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad_call("arena split".into()));
        };
        let x = before.as_view().slice(start.saturating_sub(bt * c)..start);
        let ids = self.inputs.slice(0..bt);
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
        if let Some((probs, mut losses)) = head {
            // Every column is in: per position the cross-entropy as log-sum-exp (never
            // log 0), the probabilities left in the arena for the backward.
            let targets = self.targets.slice(0..bt);
            dev.softmax_xent_forward(s, probs, losses.reborrow(), targets, d.v)?;
            dev.mean(s, self.loss.view_mut(), losses.as_view())?;
            self.bwd_next = Some(layer);
        }
        self.fwd_next = layer + 1;
        Ok(())
    }

    /// Backward of `layer`, adding into the gradients of its units; each position's
    /// cross-entropy has gradient weight `grad_scale`.
    pub fn backward(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        params: &[DView<'_, D, F>],
        grads: &mut [DViewMut<'_, D, F>],
        grad_scale: F,
    ) -> Result<(), ModelError> {
        if self.bwd_next != Some(layer) {
            return Err(bad_call(format!(
                "backward of layer {layer}, expected {:?} (forward all layers first; backward \
                 runs in reverse order)",
                self.bwd_next
            )));
        }
        let lens: Vec<usize> = params.iter().map(|p| p.len()).collect();
        self.check_units(layer, &lens, "parameter")?;
        let lens: Vec<usize> = grads.iter().map(|p| p.len()).collect();
        self.check_units(layer, &lens, "gradient")?;
        let (dev, s) = (cx.dev, cx.stream);
        let d = self.dims;
        let (bt, c, v) = (d.bt(), d.c, d.v);
        let kind = self.layers[layer];
        let (rows, last) = self.vocab_block(kind);
        let start = d.layer_start(self.region(kind));
        let end = start + d.layer_len(self.region(kind));
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
        let mut parts = self.arena.split_mut(&ranges)?.into_iter();
        let acts = parts.next().ok_or_else(|| bad_call("arena split".into()))?;
        let acts = acts.as_view();
        let x = acts.slice(start.saturating_sub(bt * c)..start);
        let ids = self.inputs.slice(0..bt);
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
                    let targets = self.targets.slice(0..bt);
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
        self.bwd_next = layer.checked_sub(1);
        Ok(())
    }

    /// Run every layer forward and backward on per-unit parameter and gradient buffers
    /// (indexed by unit), adding into the gradients. Returns the micro-batch's mean loss
    /// (in f64).
    pub fn forward_backward(
        &mut self,
        cx: Compute<'_, D>,
        batch: &TokenBatch<'_>,
        params: &[D::Buf<F>],
        grads: &mut [D::Buf<F>],
        grad_scale: F,
    ) -> Result<f64, ModelError> {
        let loss = self.forward_all(cx, batch, params)?;
        for layer in (0..self.spec.layers.len()).rev() {
            let units = self.spec.layers[layer].units.clone();
            let p: Vec<DView<'_, D, F>> = units.iter().map(|&u| params[u].view()).collect();
            let mut picked: Vec<(usize, DViewMut<'_, D, F>)> = grads
                .iter_mut()
                .enumerate()
                .filter(|(u, _)| units.contains(u))
                .map(|(u, g)| (u, g.view_mut()))
                .collect();
            picked.sort_by_key(|(u, _)| units.iter().position(|x| x == u));
            let mut g: Vec<DViewMut<'_, D, F>> = picked.into_iter().map(|(_, g)| g).collect();
            self.backward(cx, layer, &p, &mut g, grad_scale)?;
        }
        Ok(loss)
    }

    /// Forward only (evaluation): the micro-batch's mean loss (in f64).
    pub fn forward_all(
        &mut self,
        cx: Compute<'_, D>,
        batch: &TokenBatch<'_>,
        params: &[D::Buf<F>],
    ) -> Result<f64, ModelError> {
        if params.len() != self.spec.units.len() {
            return Err(bad_call(format!(
                "{} parameter buffers for {} units",
                params.len(),
                self.spec.units.len()
            )));
        }
        self.begin(cx, batch)?;
        for layer in 0..self.spec.layers.len() {
            let p: Vec<DView<'_, D, F>> = self.spec.layers[layer]
                .units
                .iter()
                .map(|&u| params[u].view())
                .collect();
            self.forward(cx, layer, &p)?;
        }
        self.loss_f64(cx)
    }
}

impl<D: Device> Model<D> for Gpt<D, f32> {
    type Batch<'a> = TokenBatch<'a>;

    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Panics if `unit` is not a unit of the spec or `out` is shorter than it (engine bugs).
    fn init_unit(&self, seed: u64, unit: usize, out: &mut [f32]) {
        init::init_unit(&self.spec.units[unit], self.cfg.n_layer, seed, out);
    }

    fn begin_micro_step(
        &mut self,
        cx: Compute<'_, D>,
        batch: &TokenBatch<'_>,
    ) -> Result<(), ModelError> {
        self.begin(cx, batch)
    }

    fn forward_layer(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        params: &[UnitParams<'_, D>],
    ) -> Result<(), ModelError> {
        let p: Vec<DView<'_, D, f32>> = params.iter().map(UnitParams::view).collect();
        self.forward(cx, layer, &p)
    }

    fn loss(&self) -> DView<'_, D, f32> {
        self.loss.view()
    }

    fn backward_layer(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        params: &[UnitParams<'_, D>],
        grads: &mut [UnitGrads<'_, D>],
        weight: f32,
    ) -> Result<(), ModelError> {
        let p: Vec<DView<'_, D, f32>> = params.iter().map(UnitParams::view).collect();
        let mut g: Vec<DViewMut<'_, D, f32>> = grads.iter_mut().map(|g| g.view()).collect();
        // The loss is the mean over B x T positions: each position's weight.
        let per_position = weight / self.dims.bt() as f32;
        self.backward(cx, layer, &p, &mut g, per_position)
    }

    fn activation_bytes(&self) -> usize {
        self.arena_bytes()
    }
}
