//! What GPT-2 (`crate::gpt`) and Llama (`crate::llama`) share around their layers: the
//! token batch, the activation arena with the batch's tokens and loss ([`TokenArena`]),
//! the checks of a call's order and views, the passes over every layer ([`LayeredLm`]'s
//! provided methods), and the [`zero_core::Model`] implementation (`impl_model!`). Each
//! family says only what its layers compute.

use std::ops::Range;

use zero_core::model::Compute;
use zero_core::{ModelError, ModelSpec, UnitSpec};
use zero_kernels::device::{Buffer, DView, DViewMut, Device, Scalar};
use zero_kernels::nn::mean_f64;
use zero_kernels::KernelError;

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

/// What one layer of a token model computes, in forward order
/// ([`TokenLayer::sequence`]); the large token tables are held in row blocks, block k
/// being the k-th range of the model's `vocab_blocks` (`crate::GptConfig::vocab_blocks`,
/// `crate::LlamaConfig::vocab_blocks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenLayer {
    /// Look up the tokens that fall in block k >= 1 of the token table (rows of x0).
    Lookup(usize),
    /// Look up block 0's tokens (GPT-2 then adds the positions: `x0 = wte[token] +
    /// wpe[t]`).
    Embed,
    /// Transformer block i.
    Block(usize),
    /// The final norm and the logits of block 0 (and the loss, when the table is one
    /// block).
    Head,
    /// The logits of block k >= 1 (and the loss, after the last block).
    Logits(usize),
}

impl TokenLayer {
    /// The layers of a model of `n_layer` blocks and `table_blocks` table blocks, in
    /// forward order: lookups of blocks 1.., embed, blocks, head, logits of blocks 1...
    pub fn sequence(n_layer: usize, table_blocks: usize) -> Vec<TokenLayer> {
        let mut out: Vec<TokenLayer> = (1..table_blocks).map(TokenLayer::Lookup).collect();
        out.push(TokenLayer::Embed);
        out.extend((0..n_layer).map(TokenLayer::Block));
        out.push(TokenLayer::Head);
        out.extend((1..table_blocks).map(TokenLayer::Logits));
        out
    }

    /// Whether the layer's backward reads its units' parameters: not a lookup's, which
    /// only adds the output's gradient into rows of the table's
    /// (`zero_core::LayerSpec::backward_reads_params`).
    pub fn backward_reads_params(self) -> bool {
        !matches!(self, TokenLayer::Lookup(_) | TokenLayer::Embed)
    }

    /// Where the layer's activations live in a model of `n_layer` blocks: region 0 = x0,
    /// 1..=L the blocks, L+1 the head.
    pub(crate) fn region(self, n_layer: usize) -> usize {
        match self {
            TokenLayer::Lookup(_) | TokenLayer::Embed => 0,
            TokenLayer::Block(i) => i + 1,
            TokenLayer::Head | TokenLayer::Logits(_) => n_layer + 1,
        }
    }

    /// The rows of the table block the layer uses (block 0 for the others), and whether
    /// it is the last block (the one the loss follows).
    pub(crate) fn table_rows(self, blocks: &[Range<usize>]) -> (Range<usize>, bool) {
        let k = match self {
            TokenLayer::Lookup(k) | TokenLayer::Logits(k) => k,
            _ => 0,
        };
        (blocks[k].clone(), k + 1 == blocks.len())
    }
}

pub(crate) fn bad_call(msg: String) -> ModelError {
    ModelError::BadCall(msg)
}

/// Whether the activations of `rows` x `seq_len` tokens, for a model of `layers` blocks
/// whose widest activation is `widest` (C, 3C, 4C or F) per token, with `heads`
/// attention heads and `vocab` logits, stay under 2^62 bytes: an upper
/// bound counted in u128 (per block 16 pieces of B T widest, plus the B H T^2 attention
/// probabilities; then the head's B T V logits; 8 bytes each, f64's, the widest element
/// a model computes in), so that the exact sizes, counted in usize, cannot wrap.
pub(crate) fn arena_fits(
    (rows, seq_len): (usize, usize),
    (widest, heads, vocab, layers): (usize, usize, usize, usize),
) -> bool {
    let [b, t, w, h, v, l] = [rows, seq_len, widest, heads, vocab, layers].map(|x| x as u128);
    let product = |xs: &[u128]| xs.iter().fold(1u128, |p, &x| p.saturating_mul(x));
    let block = product(&[16, b, t, w]).saturating_add(product(&[b, h, t, t]));
    let elems = product(&[l + 1, block]).saturating_add(product(&[b, t, v + 16]));
    product(&[elems, 8]) < 1 << 62
}

/// The bytes [`arena_fits`] refuses (2^62, less than anything a host holds, and far
/// from overflowing when a budget adds it to other sizes).
pub(crate) const TOO_LARGE_ARENA: usize = 1 << 62;

/// Bytes of a [`TokenArena`] of `elems` activations of `elem_bytes` for micro-batches of
/// `rows` x `seq_len` tokens: the activations, the inputs and targets (u32), the loss.
pub(crate) fn arena_bytes_for(
    elems: usize,
    rows: usize,
    seq_len: usize,
    elem_bytes: usize,
) -> usize {
    elems * elem_bytes + 2 * rows * seq_len * 4 + elem_bytes
}

/// A model's device memory between calls: the activation arena (laid out by the family),
/// the micro-batch's tokens, the loss, and where the layer sequence stands.
pub(crate) struct TokenArena<D: Device, F: Scalar> {
    /// The activations and the gradient scratch, one buffer.
    pub acts: D::Buf<F>,
    /// Input tokens of the micro-batch.
    pub inputs: D::Buf<u32>,
    /// Target tokens.
    pub targets: D::Buf<u32>,
    /// The mean loss (written after the last logits layer).
    pub loss: D::Buf<F>,
    max_rows: usize,
    max_seq_len: usize,
    vocab_size: usize,
    /// Next forward layer expected (the layer count when all are done).
    fwd_next: usize,
    /// Next backward layer expected (None when none may run).
    bwd_next: Option<usize>,
}

impl<D: Device, F: Scalar> TokenArena<D, F> {
    /// Allocate `elems` activations and room for `max_rows` x `max_seq_len` tokens of a
    /// vocabulary of `vocab_size`; `family` names the allocations.
    pub fn new(
        dev: &D,
        elems: usize,
        (max_rows, max_seq_len, vocab_size): (usize, usize, usize),
        family: &str,
    ) -> Result<Self, KernelError> {
        let tokens = max_rows * max_seq_len;
        Ok(TokenArena {
            acts: dev.alloc(elems, &format!("{family} activations"))?,
            inputs: dev.alloc(tokens, &format!("{family} inputs"))?,
            targets: dev.alloc(tokens, &format!("{family} targets"))?,
            loss: dev.alloc(1, &format!("{family} loss"))?,
            max_rows,
            max_seq_len,
            vocab_size,
            fwd_next: 0,
            bwd_next: None,
        })
    }

    /// Bytes allocated (what [`arena_bytes_for`] predicts).
    pub fn bytes(&self) -> usize {
        (self.acts.allocated_bytes()
            + self.inputs.allocated_bytes()
            + self.targets.allocated_bytes()
            + self.loss.allocated_bytes()) as usize
    }

    /// Start a micro-step: check the batch on the host, upload its tokens, expect layer 0.
    pub fn begin(&mut self, cx: Compute<'_, D>, batch: &TokenBatch<'_>) -> Result<(), ModelError> {
        let (b, t) = (batch.rows, batch.seq_len);
        if b == 0 || b > self.max_rows || t == 0 || t > self.max_seq_len {
            return Err(ModelError::BadBatch(format!(
                "batch of {b} rows x {t} tokens; this model takes 1..={} rows x 1..={} tokens",
                self.max_rows, self.max_seq_len
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
            if let Some(i) = v.iter().position(|&x| x as usize >= self.vocab_size) {
                return Err(ModelError::BadBatch(format!(
                    "{what}[{i}] = {} is outside the vocabulary (V = {})",
                    v[i], self.vocab_size
                )));
            }
        }
        cx.dev
            .upload(cx.stream, batch.inputs, self.inputs.slice_mut(0..b * t))?;
        cx.dev
            .upload(cx.stream, batch.targets, self.targets.slice_mut(0..b * t))?;
        self.fwd_next = 0;
        self.bwd_next = None;
        Ok(())
    }

    /// Check that `layer` (of `layers`) is the forward expected next.
    pub fn expect_forward(&self, layer: usize, layers: usize) -> Result<(), ModelError> {
        if layer != self.fwd_next || layer >= layers {
            return Err(bad_call(format!(
                "forward of layer {layer}, expected layer {} (call begin_micro_step first; \
                 layers run in order)",
                self.fwd_next
            )));
        }
        Ok(())
    }

    /// The forward of `layer` is done; `loss_done`: it wrote the loss, the backward may
    /// start there.
    pub fn forward_done(&mut self, layer: usize, loss_done: bool) {
        if loss_done {
            self.bwd_next = Some(layer);
        }
        self.fwd_next = layer + 1;
    }

    /// Check that `layer` is the backward expected next.
    pub fn expect_backward(&self, layer: usize) -> Result<(), ModelError> {
        if self.bwd_next != Some(layer) {
            return Err(bad_call(format!(
                "backward of layer {layer}, expected {:?} (forward all layers first; backward \
                 runs in reverse order)",
                self.bwd_next
            )));
        }
        Ok(())
    }

    /// The backward of `layer` is done.
    pub fn backward_done(&mut self, layer: usize) {
        self.bwd_next = layer.checked_sub(1);
    }

    /// The mean of the per-position losses at `at..at + bt` of the arena, in f64 (a host
    /// copy: waits for the stream).
    pub fn mean_loss(&self, cx: Compute<'_, D>, at: usize, bt: usize) -> Result<f64, ModelError> {
        let mut losses = vec![F::ZERO; bt];
        cx.dev
            .download(cx.stream, self.acts.slice(at..at + bt), &mut losses)?;
        Ok(mean_f64(&losses))
    }
}

/// Check that a call for `layer` got one view per unit the layer uses, each long enough.
pub(crate) fn check_units(
    spec: &ModelSpec,
    layer: usize,
    lens: &[usize],
    what: &str,
) -> Result<(), ModelError> {
    check_views(spec, &spec.layers[layer].units, layer, lens, what)
}

/// [`check_units`] for the parameters a backward gets: none for a layer whose backward
/// reads none (`zero_core::LayerSpec::backward_units`).
pub(crate) fn check_backward_params(
    spec: &ModelSpec,
    layer: usize,
    lens: &[usize],
) -> Result<(), ModelError> {
    let units = spec.layers[layer].backward_units();
    check_views(spec, units, layer, lens, "backward parameter")
}

fn check_views(
    spec: &ModelSpec,
    units: &[usize],
    layer: usize,
    lens: &[usize],
    what: &str,
) -> Result<(), ModelError> {
    if lens.len() != units.len() {
        return Err(bad_call(format!(
            "layer {layer} takes {} {what} views, got {}",
            units.len(),
            lens.len()
        )));
    }
    for (&u, &len) in units.iter().zip(lens) {
        let need = spec.units[u].numel();
        if len < need {
            return Err(bad_call(format!(
                "{what} view of unit '{}' has {len} elements, needs {need}",
                spec.units[u].name
            )));
        }
    }
    Ok(())
}

/// One host buffer per unit of `spec`, filled by `init` (zeros when it does nothing).
pub(crate) fn host_units<F: Scalar>(
    spec: &ModelSpec,
    mut init: impl FnMut(&UnitSpec, &mut [F]),
) -> Vec<Vec<F>> {
    spec.units
        .iter()
        .map(|u| {
            let mut v = vec![F::ZERO; u.numel()];
            init(u, &mut v);
            v
        })
        .collect()
}

/// A token model run layer by layer on any device and scalar (GPT-2, Llama): the calls
/// the engine makes through [`zero_core::Model`], here on plain views and any scalar (the
/// f64 models the gradient checks use), plus whole passes over every layer for tests,
/// benchmarks and reference runs.
pub trait LayeredLm<D: Device, F: Scalar> {
    /// Units and layers (the same as `zero_core::Model::spec`).
    fn layer_spec(&self) -> &ModelSpec;

    /// Start a micro-step: check the batch on the host, upload it, lay the arena out for
    /// its B x T.
    fn begin(&mut self, cx: Compute<'_, D>, batch: &TokenBatch<'_>) -> Result<(), ModelError>;

    /// Forward of `layer` on the parameters of its units (in the layer's unit order).
    fn forward(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        params: &[DView<'_, D, F>],
    ) -> Result<(), ModelError>;

    /// Backward of `layer`, adding into the gradients of its units; each position's
    /// cross-entropy has gradient weight `grad_scale`.
    fn backward(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        params: &[DView<'_, D, F>],
        grads: &mut [DViewMut<'_, D, F>],
        grad_scale: F,
    ) -> Result<(), ModelError>;

    /// The micro-step's mean cross-entropy in f64, from the per-position losses (after
    /// the last logits layer's forward; a host copy, waits for the stream).
    fn loss_f64(&self, cx: Compute<'_, D>) -> Result<f64, ModelError>;

    /// Every layer forward on per-unit parameter buffers (indexed by unit): the
    /// micro-batch's mean loss in f64 (evaluation).
    fn forward_all(
        &mut self,
        cx: Compute<'_, D>,
        batch: &TokenBatch<'_>,
        params: &[D::Buf<F>],
    ) -> Result<f64, ModelError> {
        let units = self.layer_spec().units.len();
        if params.len() != units {
            return Err(bad_call(format!(
                "{} parameter buffers for {units} units",
                params.len()
            )));
        }
        self.begin(cx, batch)?;
        for layer in 0..self.layer_spec().layers.len() {
            let used = self.layer_spec().layers[layer].units.clone();
            let p: Vec<DView<'_, D, F>> = used.iter().map(|&u| params[u].view()).collect();
            self.forward(cx, layer, &p)?;
        }
        self.loss_f64(cx)
    }

    /// Every layer forward, then backward adding into per-unit gradient buffers (indexed
    /// by unit, as the parameters); each position's cross-entropy has gradient weight
    /// `grad_scale`. Returns the micro-batch's mean loss in f64.
    fn forward_backward(
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
        for layer in (0..self.layer_spec().layers.len()).rev() {
            let spec = &self.layer_spec().layers[layer];
            let (used, read) = (spec.units.clone(), spec.backward_units().to_vec());
            let p: Vec<DView<'_, D, F>> = read.iter().map(|&u| params[u].view()).collect();
            // One mutable view per unit the layer uses, in the layer's order.
            let mut picked: Vec<(usize, DViewMut<'_, D, F>)> = grads
                .iter_mut()
                .enumerate()
                .filter_map(|(u, g)| Some((used.iter().position(|&x| x == u)?, g.view_mut())))
                .collect();
            picked.sort_by_key(|(at, _)| *at);
            let mut g: Vec<DViewMut<'_, D, F>> = picked.into_iter().map(|(_, g)| g).collect();
            self.backward(cx, layer, &p, &mut g, grad_scale)?;
        }
        Ok(loss)
    }
}

/// `impl zero_core::Model<D> for $model<D, f32>`: the engine's calls on the family's
/// [`LayeredLm`] methods; the model has fields `spec`, `cfg` (with `n_layer`), `io` (a
/// [`TokenArena`]), `dims` (with `bt()`) and `init_threads`; `$family`
/// ([`crate::init::Family`]) picks the rule of a unit's fresh parameters.
macro_rules! impl_model {
    ($model:ident, $family:expr) => {
        impl<D: Device> zero_core::Model<D> for $model<D, f32> {
            type Batch<'a> = $crate::lm::TokenBatch<'a>;

            fn spec(&self) -> &zero_core::ModelSpec {
                &self.spec
            }

            /// Panics if `unit` is not a unit of the spec or `out` is shorter than it
            /// (engine bugs).
            fn init_unit(&self, seed: u64, unit: usize, out: &mut [f32]) {
                let unit = &self.spec.units[unit];
                let (n_layer, threads) = (self.cfg.n_layer, self.init_threads);
                $crate::init::init_unit($family, unit, n_layer, seed, out, threads);
            }

            /// Draws only `range` (each tensor's stream skips to it). Panics if `unit`
            /// is not a unit of the spec, `range` leaves it, or `out` is not as long as
            /// `range` (engine bugs).
            fn init_unit_range(
                &self,
                seed: u64,
                unit: usize,
                range: std::ops::Range<usize>,
                out: &mut [f32],
            ) {
                let unit = &self.spec.units[unit];
                let (n_layer, threads) = (self.cfg.n_layer, self.init_threads);
                $crate::init::init_unit_range($family, unit, n_layer, seed, range, out, threads);
            }

            fn begin_micro_step(
                &mut self,
                cx: zero_core::model::Compute<'_, D>,
                batch: &$crate::lm::TokenBatch<'_>,
            ) -> Result<(), zero_core::ModelError> {
                $crate::lm::LayeredLm::begin(self, cx, batch)
            }

            fn forward_layer(
                &mut self,
                cx: zero_core::model::Compute<'_, D>,
                layer: usize,
                params: &[zero_core::model::UnitParams<'_, D>],
            ) -> Result<(), zero_core::ModelError> {
                let p: Vec<_> = params
                    .iter()
                    .map(zero_core::model::UnitParams::view)
                    .collect();
                $crate::lm::LayeredLm::forward(self, cx, layer, &p)
            }

            fn loss(&self) -> zero_kernels::device::DView<'_, D, f32> {
                zero_kernels::device::Buffer::view(&self.io.loss)
            }

            fn backward_layer(
                &mut self,
                cx: zero_core::model::Compute<'_, D>,
                layer: usize,
                params: &[zero_core::model::UnitParams<'_, D>],
                grads: &mut [zero_core::model::UnitGrads<'_, D>],
                weight: f32,
            ) -> Result<(), zero_core::ModelError> {
                let p: Vec<_> = params
                    .iter()
                    .map(zero_core::model::UnitParams::view)
                    .collect();
                let mut g: Vec<_> = grads.iter_mut().map(|g| g.view()).collect();
                // The loss is the mean over B x T positions: each position's weight.
                let per_position = weight / self.dims.bt() as f32;
                $crate::lm::LayeredLm::backward(self, cx, layer, &p, &mut g, per_position)
            }

            fn activation_bytes(&self) -> usize {
                self.io.bytes()
            }
        }
    };
}
pub(crate) use impl_model;
