//! The `Model` trait: what the engine needs from a model to train it under any ZeRO
//! stage. Research code implements it for its own models; `zero-models` implements it
//! for GPT-2.
//!
//! The engine drives, layer by layer, so that at stage 3 only the units a layer uses need
//! to be resident:
//!
//! ```text
//! begin_micro_step(batch)
//! for l in 0..layers:          forward_layer(l, params of the units layer l uses)
//! loss()
//! for l in (0..layers).rev():  backward_layer(l, params, grads of those units, grad_scale)
//! ```
//!
//! Parameters and gradients are passed per unit as flat fp32 slices laid out as
//! [`crate::spec::UnitSpec::offsets`] says (the engine widens 16-bit storage before the
//! call). A slice may be longer than the unit (partition padding at the end); the model
//! reads and writes only the first `unit.numel()` elements.

use crate::spec::ModelSpec;

/// Errors a model reports to the engine.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A batch of the wrong size, or a token outside the vocabulary.
    #[error("bad batch: {0}")]
    BadBatch(String),
    /// The engine passed the wrong units or a too-short slice (an engine bug).
    #[error("bad call: {0}")]
    BadCall(String),
    /// Anything else, with what failed.
    #[error("{0}")]
    Other(String),
}

/// One micro-batch of this rank: `rows` sequences of `seq_len` tokens and their targets
/// (the next token), row-major.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// B: sequences in the micro-batch.
    pub rows: usize,
    /// T: tokens per sequence.
    pub seq_len: usize,
    /// Input tokens, `rows * seq_len`.
    pub inputs: &'a [u32],
    /// Target tokens, `rows * seq_len`.
    pub targets: &'a [u32],
}

/// The parameters (or gradients) of the units one layer uses, in the order of
/// [`crate::spec::LayerSpec::units`].
pub type UnitSlices<'a, 'b> = &'b [&'a [f32]];
/// Mutable per-unit gradient slices, in the order of [`crate::spec::LayerSpec::units`].
pub type UnitSlicesMut<'a, 'b> = &'b mut [&'a mut [f32]];

/// A model the ZeRO engine can train.
pub trait Model {
    /// Units (parameter ownership) and layers (compute order).
    fn spec(&self) -> &ModelSpec;

    /// Write unit `unit`'s initial parameters into `out` (length >= unit numel). Must
    /// depend only on `(seed, unit)` and the parameter's identity, never on the world
    /// size or the rank, so every partitioning starts from the same model.
    fn init_unit(&self, seed: u64, unit: usize, out: &mut [f32]);

    /// Start a micro-step on this batch (activations of the previous one are dropped).
    fn begin_micro_step(&mut self, batch: &Batch<'_>) -> Result<(), ModelError>;

    /// Forward of layer `layer`; `params[i]` holds unit `spec().layers[layer].units[i]`.
    fn forward_layer(&mut self, layer: usize, params: UnitSlices<'_, '_>)
        -> Result<(), ModelError>;

    /// Mean cross-entropy over this micro-batch's `rows * seq_len` positions; valid after
    /// the last layer's forward.
    fn loss(&self) -> f32;

    /// Backward of layer `layer`, accumulating (`+=`) into `grads[i]` for unit
    /// `spec().layers[layer].units[i]`. The gradient of the loss w.r.t. each position's
    /// cross-entropy is `grad_scale` (the engine passes loss_scale / (N*A*B*T) so the sum
    /// over ranks and micro-steps is the gradient of the global-batch mean).
    fn backward_layer(
        &mut self,
        layer: usize,
        params: UnitSlices<'_, '_>,
        grads: UnitSlicesMut<'_, '_>,
        grad_scale: f32,
    ) -> Result<(), ModelError>;

    /// Bytes of the activation arena this model holds for one micro-step.
    fn activation_bytes(&self) -> usize;
}
