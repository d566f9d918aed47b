//! The `Model` trait: what the engine needs from a model to train it under any ZeRO
//! stage, on any device. Research code implements it for its own models (see
//! `zero-core/examples/`); `zero-models` implements it for its reference model.
//!
//! The engine drives, layer by layer, so that at stage 3 only the units a layer uses need
//! to be resident:
//!
//! ```text
//! begin_micro_step(batch)
//! for l in 0..layers:          forward_layer(l, params of the units layer l uses)
//! loss()                       the micro-batch's mean loss, on the device
//! for l in (0..layers).rev():  backward_layer(l, params (none for a lookup), grads of
//!                               those units, weight)
//! ```
//!
//! Contract:
//! - Parameters and gradients come per unit as f32 device views ([`UnitParams`],
//!   [`UnitGrads`]) laid out as [`UnitSpec::offsets`] says (the engine widens 16-bit
//!   storage before the call). A view may be longer than the unit (partition padding at
//!   the end); the model reads and writes only the first `unit.numel()` elements.
//! - Every op goes on the stream in [`Compute`]; the engine orders everything else
//!   (gathers, reductions) around that stream with events. A model keeps no view between
//!   calls (at stage 3 the memory behind it is reused).
//! - The loss is the mean over the model's own micro-batch. The backward adds (`+=`) the
//!   gradient of `weight x loss` into the gradient views: the engine passes
//!   `weight = loss_scale / (N x A)`, so the sum over ranks and micro-steps is the
//!   gradient of the mean over the global batch (every micro-batch weighs the same).
//! - The model owns its batch type: any supervised or self-supervised objective fits.

use std::ops::Range;

use zero_kernels::device::{Buffer, DView, DViewMut, Device};

use crate::spec::{ModelSpec, UnitSpec};

/// Errors a model reports to the engine.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A batch of the wrong size, or an input or label outside the model's range.
    #[error("bad batch: {0}")]
    BadBatch(String),
    /// The engine passed the wrong units or a too-short view (an engine bug), or calls
    /// came out of order.
    #[error("bad call: {0}")]
    BadCall(String),
    /// A device op failed.
    #[error("device: {0}")]
    Device(#[from] zero_kernels::KernelError),
    /// Anything else, with what failed.
    #[error("{0}")]
    Other(String),
}

/// Where a model's ops go: the device and the compute stream of this step.
pub struct Compute<'a, D: Device> {
    /// The device.
    pub dev: &'a D,
    /// The stream every model op is queued on.
    pub stream: &'a D::Stream,
}

impl<D: Device> Clone for Compute<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<D: Device> Copy for Compute<'_, D> {}

/// The parameters of one unit for one layer call: an f32 view of the unit's flat buffer
/// and the unit's spec, so each tensor can be picked by index or name with its shape.
pub struct UnitParams<'a, D: Device> {
    unit: &'a UnitSpec,
    view: DView<'a, D, f32>,
}

impl<'a, D: Device> UnitParams<'a, D> {
    /// Unit `unit`'s parameters in `view` (at least `unit.numel()` elements).
    pub fn new(unit: &'a UnitSpec, view: DView<'a, D, f32>) -> Self {
        UnitParams { unit, view }
    }

    /// The unit.
    pub fn spec(&self) -> &'a UnitSpec {
        self.unit
    }

    /// The whole flat view (padding included).
    pub fn view(&self) -> DView<'a, D, f32> {
        self.view.clone()
    }

    /// Parameter `i` of the unit (declaration order), as a view of its elements.
    ///
    /// # Panics
    /// When the unit has no parameter `i`.
    pub fn param(&self, i: usize) -> DView<'a, D, f32> {
        self.view.slice(param_range(self.unit, i))
    }

    /// Parameter `i`'s shape.
    ///
    /// # Panics
    /// When the unit has no parameter `i`.
    pub fn shape(&self, i: usize) -> &'a [usize] {
        &self.unit.params[i].shape
    }

    /// The parameter named `name`, if the unit has it.
    pub fn by_name(&self, name: &str) -> Option<DView<'a, D, f32>> {
        let i = self.unit.params.iter().position(|p| p.name == name)?;
        Some(self.param(i))
    }

    /// Parameter `i` as an ndarray of its shape (a host copy: downloads after the work
    /// queued on `stream`).
    pub fn to_ndarray(
        &self,
        cx: Compute<'_, D>,
        i: usize,
    ) -> Result<ndarray::ArrayD<f32>, ModelError> {
        no_such_param(self.unit, i)?;
        let v = self.param(i);
        let mut host = vec![0.0f32; v.len()];
        cx.dev.download(cx.stream, v, &mut host)?;
        ndarray::ArrayD::from_shape_vec(self.shape(i).to_vec(), host)
            .map_err(|e| ModelError::Other(format!("parameter {i} of '{}': {e}", self.unit.name)))
    }
}

/// The gradients of one unit for one backward call (added into).
pub struct UnitGrads<'a, D: Device> {
    unit: &'a UnitSpec,
    view: DViewMut<'a, D, f32>,
}

impl<'a, D: Device> UnitGrads<'a, D> {
    /// Unit `unit`'s gradients in `view` (at least `unit.numel()` elements).
    pub fn new(unit: &'a UnitSpec, view: DViewMut<'a, D, f32>) -> Self {
        UnitGrads { unit, view }
    }

    /// The unit.
    pub fn spec(&self) -> &'a UnitSpec {
        self.unit
    }

    /// Parameter `i`'s gradient, for as long as this borrow lasts.
    ///
    /// # Panics
    /// When the unit has no parameter `i`.
    pub fn param(&mut self, i: usize) -> DViewMut<'_, D, f32> {
        self.view.reborrow().slice_mut(param_range(self.unit, i))
    }

    /// Every parameter's gradient at once (disjoint views, declaration order).
    pub fn split(self) -> Vec<DViewMut<'a, D, f32>> {
        let mut rest = self.view;
        let mut out = Vec::with_capacity(self.unit.params.len());
        for p in &self.unit.params {
            let (head, tail) = rest.split_at(p.numel());
            out.push(head);
            rest = tail;
        }
        out
    }

    /// Every parameter's gradient at once, for as long as this borrow lasts (disjoint
    /// views, declaration order).
    pub fn split_mut(&mut self) -> Vec<DViewMut<'_, D, f32>> {
        let mut rest = self.view.reborrow();
        let mut out = Vec::with_capacity(self.unit.params.len());
        for p in &self.unit.params {
            let (head, tail) = rest.split_at(p.numel());
            out.push(head);
            rest = tail;
        }
        out
    }

    /// The whole flat view, padding included: write the parameters' elements only (the
    /// padding starts at zero and must stay so: it enters the gradient norm and clipping).
    pub fn view(&mut self) -> DViewMut<'_, D, f32> {
        self.view.reborrow()
    }

    /// Parameter `i`'s gradient so far as an ndarray of its shape (a host copy:
    /// downloads after the work queued on `stream`).
    pub fn to_ndarray(
        &mut self,
        cx: Compute<'_, D>,
        i: usize,
    ) -> Result<ndarray::ArrayD<f32>, ModelError> {
        no_such_param(self.unit, i)?;
        let shape = self.unit.params[i].shape.clone();
        let name = self.unit.name.clone();
        let v = self.param(i);
        let mut host = vec![0.0f32; v.len()];
        cx.dev.download(cx.stream, v.as_view(), &mut host)?;
        ndarray::ArrayD::from_shape_vec(shape, host)
            .map_err(|e| ModelError::Other(format!("gradient {i} of '{name}': {e}")))
    }
}

/// An error when `unit` has no parameter `i` (for the calls that return one).
fn no_such_param(unit: &UnitSpec, i: usize) -> Result<(), ModelError> {
    match unit.params.get(i) {
        Some(_) => Ok(()),
        None => Err(ModelError::BadCall(format!(
            "unit '{}' has parameters 0..{}; there is no parameter {i}",
            unit.name,
            unit.params.len()
        ))),
    }
}

fn param_range(unit: &UnitSpec, i: usize) -> Range<usize> {
    let start: usize = unit.params[..i].iter().map(|p| p.numel()).sum();
    start..start + unit.params[i].numel()
}

/// A model the ZeRO engine can train on device `D`.
pub trait Model<D: Device> {
    /// One micro-batch of this rank, as the model takes it.
    type Batch<'a>;

    /// Units (parameter ownership) and layers (compute order).
    fn spec(&self) -> &ModelSpec;

    /// Write unit `unit`'s initial parameters into `out` (length >= unit numel), on the
    /// host. Must depend only on `(seed, unit)` and the parameter's identity, never on
    /// the world size or the rank, so every partitioning starts from the same model.
    fn init_unit(&self, seed: u64, unit: usize, out: &mut [f32]);

    /// Write elements `range` of unit `unit`'s flat initial parameters into `out`
    /// (length `range.len()`; `range` non-empty, within the unit's numel): exactly the
    /// values [`Self::init_unit`] writes there. At every stage the engine asks each rank
    /// for its own 1/N block of every unit and all-gathers the blocks where it keeps the
    /// whole unit, so a model whose initialiser can skip ahead (a counter-based stream, as
    /// the reference models' in `zero-models/src/init.rs`) makes start-up fall as 1/N
    /// too. The default draws the whole unit and copies the range.
    fn init_unit_range(&self, seed: u64, unit: usize, range: Range<usize>, out: &mut [f32]) {
        let mut whole = vec![0.0f32; self.spec().units[unit].numel()];
        self.init_unit(seed, unit, &mut whole);
        out.copy_from_slice(&whole[range]);
    }

    /// Start a micro-step on this batch (the previous one's activations are dropped).
    fn begin_micro_step(
        &mut self,
        cx: Compute<'_, D>,
        batch: &Self::Batch<'_>,
    ) -> Result<(), ModelError>;

    /// Forward of layer `layer`; `params[i]` holds unit `spec().layers[layer].units[i]`.
    fn forward_layer(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        params: &[UnitParams<'_, D>],
    ) -> Result<(), ModelError>;

    /// The micro-batch's mean loss (one f32 on the device), valid after the last layer's
    /// forward.
    fn loss(&self) -> DView<'_, D, f32>;

    /// Backward of layer `layer`, adding the gradient of `weight x loss` into `grads[i]`
    /// for unit `spec().layers[layer].units[i]`. `params` holds the same units as in the
    /// forward, or none when the layer's `backward_reads_params` is false (a lookup; at
    /// stage 3 they are not gathered for it).
    fn backward_layer(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        params: &[UnitParams<'_, D>],
        grads: &mut [UnitGrads<'_, D>],
        weight: f32,
    ) -> Result<(), ModelError>;

    /// Bytes of device memory this model holds for activations (its arena).
    fn activation_bytes(&self) -> usize;
}

/// Bytes of a buffer, for a model's [`Model::activation_bytes`].
pub fn buffer_bytes<B: Buffer>(b: &B) -> usize {
    b.allocated_bytes() as usize
}
