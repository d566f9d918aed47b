//! Llama (Touvron et al. 2023; Meta's `llama/model.py`) as a [`zero_core::Model`] on any
//! [`Device`], beside GPT-2 and built the same way: layers [embed, layers.0 ..
//! layers.{L-1}, head], each run on the parameter views of the units it uses, handed in
//! per call (nothing is kept between calls but activations).
//!
//! What differs from GPT-2 (`crate::gpt`): RMSNorm instead of LayerNorm, rotary position
//! embeddings instead of a position table, grouped-query attention (Hkv key/value heads
//! shared by H/Hkv query heads each), a SwiGLU MLP of width F, no biases, and an untied
//! output head (its own unit with the final norm). Each of those is a device op
//! (`rmsnorm_*`, `rope_gqa_*`, `swiglu_*`; CPU kernels in `zero_kernels::nn`), so the
//! same code runs on the host and the simulated device; the CUDA device has no kernels
//! for them yet and returns `KernelError::NoCudaKernel`.
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

use zero_core::model::{Compute, UnitGrads, UnitParams};
use zero_core::{Model, ModelError, ModelSpec};
use zero_kernels::device::{Buffer, DView, DViewMut, Device, Scalar};
use zero_kernels::nn::mean_f64;

use crate::gpt::{GptError, TokenBatch};
use crate::head::{logits_backward, logits_forward};
use crate::init;
use crate::layout::Dims;
use block::{block_backward, block_forward, block_internals};
use layout::LlamaDims;

/// Llama with its activation arena on device `D`.
pub struct Llama<D: Device, F: Scalar = f32> {
    cfg: LlamaConfig,
    spec: ModelSpec,
    layers: Vec<LlamaLayer>,
    /// The row ranges of the tables' blocks.
    vocab_blocks: Vec<Range<usize>>,
    max_rows: usize,
    arena: D::Buf<F>,
    inputs: D::Buf<u32>,
    targets: D::Buf<u32>,
    loss: D::Buf<F>,
    dims: LlamaDims,
    fwd_next: usize,
    bwd_next: Option<usize>,
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
    let tokens = rows * seq_len;
    dims_for(cfg, rows, seq_len).total() * elem_bytes + 2 * tokens * 4 + elem_bytes
}

fn bad_call(msg: String) -> ModelError {
    ModelError::BadCall(msg)
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
        let dims = dims_for(&cfg, max_rows, cfg.max_seq_len);
        let tokens = max_rows * cfg.max_seq_len;
        Ok(Llama {
            cfg,
            spec: cfg.spec(),
            layers: cfg.layers(),
            vocab_blocks: cfg.vocab_blocks(),
            max_rows,
            arena: dev.alloc(dims.total(), "llama activations")?,
            inputs: dev.alloc(tokens, "llama inputs")?,
            targets: dev.alloc(tokens, "llama targets")?,
            loss: dev.alloc(1, "llama loss")?,
            dims,
            fwd_next: 0,
            bwd_next: None,
        })
    }

    /// The shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// Fresh parameters, one flat host buffer per unit.
    pub fn init_params(&self, seed: u64) -> Vec<Vec<F>> {
        self.spec
            .units
            .iter()
            .map(|u| {
                let mut v = vec![F::ZERO; u.numel()];
                init::init_llama_unit(u, self.cfg.n_layer, seed, &mut v);
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

    /// The micro-step's mean cross-entropy in f64 (after the head's forward; waits).
    pub fn loss_f64(&self, cx: Compute<'_, D>) -> Result<f64, ModelError> {
        let d = self.dims;
        let at = d.region_start(d.l + 1) + d.head_sizes()[..3].iter().sum::<usize>();
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
    fn region(&self, layer: LlamaLayer) -> usize {
        match layer {
            LlamaLayer::Lookup(_) | LlamaLayer::Embed => 0,
            LlamaLayer::Block(i) => i + 1,
            LlamaLayer::Head | LlamaLayer::Logits(_) => self.cfg.n_layer + 1,
        }
    }

    /// The rows of the table block a layer uses (block 0 for the others), and whether it
    /// is the last block (the one the loss follows).
    fn vocab_block(&self, layer: LlamaLayer) -> (Range<usize>, bool) {
        let k = match layer {
            LlamaLayer::Lookup(k) | LlamaLayer::Logits(k) => k,
            _ => 0,
        };
        (
            self.vocab_blocks[k].clone(),
            k + 1 == self.vocab_blocks.len(),
        )
    }

    /// Forward of `layer` on the parameters of its unit.
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
        let (bt, c, v) = (d.bt(), d.c, d.v);
        let kind = self.layers[layer];
        let (rows, last) = self.vocab_block(kind);
        let n = rows.len() * c;
        let start = d.region_start(self.region(kind));
        let end = start + d.region_len(self.region(kind));
        let recompute = d.recompute_start()..d.recompute_start() + d.recompute_len();
        let mut parts = self
            .arena
            .split_mut(&[0..start, start..end, recompute])?
            .into_iter();
        let (Some(before), Some(region), Some(spare)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad_call("arena split".into()));
        };
        let x = before.as_view().slice(start.saturating_sub(bt * c)..start);
        let ids = self.inputs.slice(0..bt);
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
        if let Some((probs, mut losses)) = head {
            // Every column is in: the cross-entropy per position, the probabilities left
            // in the arena for the backward.
            let targets = self.targets.slice(0..bt);
            dev.softmax_xent_forward(s, probs, losses.reborrow(), targets, v)?;
            dev.mean(s, self.loss.view_mut(), losses.as_view())?;
            self.bwd_next = Some(layer);
        }
        self.fwd_next = layer + 1;
        Ok(())
    }

    /// Backward of `layer`, adding into the gradients of its unit; each position's
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
        let n = rows.len() * c;
        let start = d.region_start(self.region(kind));
        let end = start + d.region_len(self.region(kind));
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
        let mut parts = self.arena.split_mut(&ranges)?.into_iter();
        let acts = parts.next().ok_or_else(|| bad_call("arena split".into()))?;
        let acts = acts.as_view();
        let x = acts.slice(start.saturating_sub(bt * c)..start);
        match kind {
            LlamaLayer::Lookup(_) | LlamaLayer::Embed => {
                // tok_embeddings[token] += dx0, for the tokens in this block.
                let scratch = parts.next().ok_or_else(|| bad_call("arena split".into()))?;
                let dres = scratch.as_view().slice(0..bt * c);
                let ids = self.inputs.slice(0..bt);
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
                    let targets = self.targets.slice(0..bt);
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
        self.bwd_next = layer.checked_sub(1);
        Ok(())
    }

    /// Every layer forward and backward on per-unit parameter and gradient buffers
    /// (indexed by unit; each layer reads one), adding into the gradients. Returns the
    /// micro-batch's mean loss (in f64).
    pub fn forward_backward(
        &mut self,
        cx: Compute<'_, D>,
        batch: &TokenBatch<'_>,
        params: &[D::Buf<F>],
        grads: &mut [D::Buf<F>],
        grad_scale: F,
    ) -> Result<f64, ModelError> {
        let loss = self.forward_all(cx, batch, params)?;
        if grads.len() != params.len() {
            return Err(bad_call(format!(
                "{} gradient buffers for {} units",
                grads.len(),
                params.len()
            )));
        }
        for layer in (0..self.spec.layers.len()).rev() {
            let u = self.spec.layers[layer].units[0];
            let p = [params[u].view()];
            let mut g = [grads[u].view_mut()];
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
            let u = self.spec.layers[layer].units[0];
            self.forward(cx, layer, &[params[u].view()])?;
        }
        self.loss_f64(cx)
    }
}

impl<D: Device> Model<D> for Llama<D, f32> {
    type Batch<'a> = TokenBatch<'a>;

    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Panics if `unit` is not a unit of the spec or `out` is shorter than it (engine bugs).
    fn init_unit(&self, seed: u64, unit: usize, out: &mut [f32]) {
        init::init_llama_unit(&self.spec.units[unit], self.cfg.n_layer, seed, out);
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
