//! GPT-2 as a [`zero_core::Model`]: layers [embed, h.0 .. h.{L-1}, head], each run on the
//! parameter slices of the units it uses, handed in per call (nothing is kept between
//! calls but activations). The LM head is tied to `wte`: the head's backward adds
//! dlogits^T lnf into `wte`'s gradient, and the embed layer's backward adds its rows later.
//!
//! Generic over the scalar: `Gpt<f32>` is the model the engine trains, `Gpt<f64>` the
//! reference the gradient checks hold it against.

use crate::block::{block_backward, block_forward};
use crate::config::{ConfigError, GptConfig};
use crate::gemm::{Gemm, Lay};
use crate::init;
use crate::layout::{carve, carve_ref, Dims};
use crate::ops::{layernorm_backward, layernorm_forward};
use crate::real::Real;
use zero_core::model::{UnitSlices, UnitSlicesMut};
use zero_core::{Batch, Model, ModelError, ModelSpec};

/// GPT-2 with its activation arena.
pub struct Gpt<F: Real = f32> {
    cfg: GptConfig,
    spec: ModelSpec,
    gemm: Gemm,
    max_rows: usize,
    arena: Vec<F>,
    dims: Dims,
    inputs: Vec<u32>,
    targets: Vec<u32>,
    loss: f64,
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
    dims_for(cfg, rows, seq_len).total() * elem_bytes
}

fn dims_for(cfg: &GptConfig, b: usize, t: usize) -> Dims {
    Dims {
        b,
        t,
        c: cfg.n_embd,
        h: cfg.n_head,
        v: cfg.vocab_size,
        l: cfg.n_layer,
    }
}

fn bad_call(msg: String) -> ModelError {
    ModelError::BadCall(msg)
}

impl<F: Real> Gpt<F> {
    /// A model for micro-batches of up to `max_rows` x `cfg.max_seq_len` tokens, its GEMMs
    /// on `threads` threads. Allocates the activation arena now (see
    /// [`Self::activation_bytes`]); parameters live with the caller.
    pub fn new(cfg: GptConfig, max_rows: usize, threads: usize) -> Result<Self, ConfigError> {
        cfg.validate()?;
        if max_rows == 0 {
            return Err(ConfigError::Zero { name: "max_rows" });
        }
        let dims = dims_for(&cfg, max_rows, cfg.max_seq_len);
        let tokens = max_rows * cfg.max_seq_len;
        Ok(Gpt {
            cfg,
            spec: cfg.spec(),
            gemm: Gemm::new(threads),
            max_rows,
            arena: vec![F::ZERO; dims.total()],
            dims,
            inputs: Vec::with_capacity(tokens),
            targets: Vec::with_capacity(tokens),
            loss: f64::NAN,
            fwd_next: 0,
            bwd_next: None,
        })
    }

    /// The shape.
    pub fn config(&self) -> &GptConfig {
        &self.cfg
    }

    /// Threads the GEMMs use.
    pub fn threads(&self) -> usize {
        self.gemm.threads()
    }

    /// Fresh parameters, one flat buffer per unit (no padding).
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

    /// Zeroed gradient buffers, one per unit.
    pub fn zero_grads(&self) -> Vec<Vec<F>> {
        self.spec
            .units
            .iter()
            .map(|u| vec![F::ZERO; u.numel()])
            .collect()
    }

    /// Bytes of the activation arena (fixed at construction).
    pub fn arena_bytes(&self) -> usize {
        self.arena.len() * std::mem::size_of::<F>()
    }

    /// Start a micro-step: check and copy the batch, lay the arena out for its B x T.
    pub fn begin(&mut self, batch: &Batch<'_>) -> Result<(), ModelError> {
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
        self.inputs.clear();
        self.inputs.extend_from_slice(batch.inputs);
        self.targets.clear();
        self.targets.extend_from_slice(batch.targets);
        self.dims = dims_for(&self.cfg, b, t);
        self.loss = f64::NAN;
        self.fwd_next = 0;
        self.bwd_next = None;
        Ok(())
    }

    /// Mean cross-entropy of the micro-step (after the head's forward).
    pub fn loss_f64(&self) -> f64 {
        self.loss
    }

    fn check_units(&self, layer: usize, lens: &[usize], what: &str) -> Result<(), ModelError> {
        let units = &self.spec.layers[layer].units;
        if lens.len() != units.len() {
            return Err(bad_call(format!(
                "layer {layer} uses {} units, got {} {what} slices",
                units.len(),
                lens.len()
            )));
        }
        for (&u, &len) in units.iter().zip(lens) {
            let need = self.spec.units[u].numel();
            if len < need {
                return Err(bad_call(format!(
                    "{what} slice of unit '{}' has {len} elements, needs {need}",
                    self.spec.units[u].name
                )));
            }
        }
        Ok(())
    }

    /// Forward of `layer` on the parameters of its units.
    pub fn forward(&mut self, layer: usize, params: &[&[F]]) -> Result<(), ModelError> {
        if layer != self.fwd_next || layer >= self.spec.layers.len() {
            return Err(bad_call(format!(
                "forward of layer {layer}, expected layer {} (call begin_micro_step first; \
                 layers run in order)",
                self.fwd_next
            )));
        }
        let lens: Vec<usize> = params.iter().map(|p| p.len()).collect();
        self.check_units(layer, &lens, "parameter")?;
        let d = self.dims;
        let (bt, c, l) = (d.bt(), d.c, d.l);
        let (before, rest) = self.arena.split_at_mut(d.layer_start(layer));
        let region = &mut rest[..d.layer_len(layer)];
        if layer == 0 {
            // x0[b,t] = wte[token] + wpe[t]
            let (wte, wpe) = params[0].split_at(self.cfg.vocab_size * c);
            for (i, (x, &tok)) in region.chunks_exact_mut(c).zip(&self.inputs).enumerate() {
                let (e, p) = (&wte[tok as usize * c..][..c], &wpe[(i % d.t) * c..][..c]);
                x.iter_mut()
                    .zip(e.iter().zip(p))
                    .for_each(|(x, (&e, &p))| *x = e + p);
            }
        } else if layer <= l {
            let x = &before[before.len() - bt * c..];
            block_forward(&self.gemm, d, params[0], x, region);
        } else {
            let x = &before[before.len() - bt * c..];
            self.loss = head_forward(
                &self.gemm,
                d,
                params[0],
                params[1],
                x,
                region,
                &self.targets,
            );
            self.bwd_next = Some(layer);
        }
        self.fwd_next = layer + 1;
        Ok(())
    }

    /// Backward of `layer`, adding into the gradients of its units; each position's
    /// cross-entropy has gradient weight `grad_scale`.
    pub fn backward(
        &mut self,
        layer: usize,
        params: &[&[F]],
        grads: &mut [&mut [F]],
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
        let d = self.dims;
        let (bt, c, l, v) = (d.bt(), d.c, d.l, d.v);
        let (before, rest) = self.arena.split_at_mut(d.layer_start(layer));
        let (region, rest) = rest.split_at_mut(d.layer_len(layer));
        let scratch = &mut rest[d.scratch_start() - d.layer_start(layer) - d.layer_len(layer)..];
        if layer == 0 {
            // wte[token] += dx0; wpe[t] += dx0 (the head added its part of wte already).
            let dres = &scratch[..bt * c];
            let (dwte, dwpe) = grads[0].split_at_mut(v * c);
            for (i, (g, &tok)) in dres.chunks_exact(c).zip(&self.inputs).enumerate() {
                let e = &mut dwte[tok as usize * c..][..c];
                e.iter_mut().zip(g).for_each(|(e, &g)| *e += g);
                let p = &mut dwpe[(i % d.t) * c..][..c];
                p.iter_mut().zip(g).for_each(|(p, &g)| *p += g);
            }
        } else if layer <= l {
            let x = &before[before.len() - bt * c..];
            block_backward(&self.gemm, d, params[0], grads[0], x, region, scratch);
        } else {
            let x = &before[before.len() - bt * c..];
            let (g0, g1) = grads.split_at_mut(1);
            head_backward(
                &self.gemm,
                d,
                params[0],
                params[1],
                g0[0],
                g1[0],
                x,
                region,
                scratch,
                &self.targets,
                grad_scale,
            );
        }
        self.bwd_next = layer.checked_sub(1);
        Ok(())
    }

    /// Run every layer forward and backward on per-unit parameter and gradient buffers
    /// (indexed by unit), adding into the gradients. Returns the micro-batch's mean loss.
    pub fn forward_backward<P: AsRef<[F]>, G: AsMut<[F]>>(
        &mut self,
        batch: &Batch<'_>,
        params: &[P],
        grads: &mut [G],
        grad_scale: F,
    ) -> Result<f64, ModelError> {
        self.forward_all(batch, params)?;
        for layer in (0..self.spec.layers.len()).rev() {
            let units = self.spec.layers[layer].units.clone();
            let p: Vec<&[F]> = units.iter().map(|&u| params[u].as_ref()).collect();
            let mut picked: Vec<(usize, &mut [F])> = grads
                .iter_mut()
                .enumerate()
                .filter(|(u, _)| units.contains(u))
                .map(|(u, g)| (u, g.as_mut()))
                .collect();
            picked.sort_by_key(|(u, _)| units.iter().position(|x| x == u));
            let mut g: Vec<&mut [F]> = picked.into_iter().map(|(_, g)| g).collect();
            self.backward(layer, &p, &mut g, grad_scale)?;
        }
        Ok(self.loss)
    }

    /// Forward only (evaluation): the micro-batch's mean loss.
    pub fn forward_all<P: AsRef<[F]>>(
        &mut self,
        batch: &Batch<'_>,
        params: &[P],
    ) -> Result<f64, ModelError> {
        if params.len() != self.spec.units.len() {
            return Err(bad_call(format!(
                "{} parameter buffers for {} units",
                params.len(),
                self.spec.units.len()
            )));
        }
        self.begin(batch)?;
        for layer in 0..self.spec.layers.len() {
            let p: Vec<&[F]> = self.spec.layers[layer]
                .units
                .iter()
                .map(|&u| params[u].as_ref())
                .collect();
            self.forward(layer, &p)?;
        }
        Ok(self.loss)
    }
}

/// Head forward: lnf = LN(x); logits = lnf wte^T; per position the cross-entropy
/// -log softmax(logits)[target], computed as log-sum-exp so it never takes log(0).
/// Leaves the probabilities in the arena; returns the mean loss.
fn head_forward<F: Real>(
    g: &Gemm,
    d: Dims,
    lnf_params: &[F],
    embed: &[F],
    x: &[F],
    region: &mut [F],
    targets: &[u32],
) -> f64 {
    let (bt, c, v) = (d.bt(), d.c, d.v);
    let [w, b] = carve_ref(lnf_params, [c, c]);
    let [lnf, mean, rstd, probs, losses] = carve(region, d.head_sizes());
    layernorm_forward(lnf, mean, rstd, x, w, b, c);
    g.run(
        F::ONE,
        lnf,
        Lay::rm(bt, c, c),
        &embed[..v * c],
        Lay::rm(v, c, c).t(),
        F::ZERO,
        probs,
        Lay::rm(bt, v, v),
    );
    let mut total = 0.0f64;
    for ((row, loss), &tgt) in probs
        .chunks_exact_mut(v)
        .zip(losses.iter_mut())
        .zip(targets)
    {
        let mut max = F::MIN;
        row.iter().for_each(|&z| {
            if z > max {
                max = z
            }
        });
        let zt = row[tgt as usize] - max;
        let mut sum = F::ZERO;
        for z in row.iter_mut() {
            *z = (*z - max).exp();
            sum += *z;
        }
        // loss = log(sum_j e^(z_j - max)) - (z_t - max)
        *loss = sum.ln() - zt;
        let inv = F::ONE / sum;
        row.iter_mut().for_each(|z| *z *= inv);
        total += loss.to_f64();
    }
    total / bt as f64
}

/// Head backward: dlogits = (probs - onehot(target)) * grad_scale (in place over probs);
/// dwte += dlogits^T lnf (the tied head); dlnf = dlogits wte; then LayerNorm backward
/// writes dres = d(x) (the gradient scratch's first piece) and adds into ln_f's grads.
#[allow(clippy::too_many_arguments)]
fn head_backward<F: Real>(
    g: &Gemm,
    d: Dims,
    lnf_params: &[F],
    embed: &[F],
    lnf_grads: &mut [F],
    embed_grads: &mut [F],
    x: &[F],
    region: &mut [F],
    scratch: &mut [F],
    targets: &[u32],
    grad_scale: F,
) {
    let (bt, c, v) = (d.bt(), d.c, d.v);
    let [w, _] = carve_ref(lnf_params, [c, c]);
    let [dw, db] = carve(lnf_grads, [c, c]);
    let [lnf, mean, rstd, probs, _] = carve(region, d.head_sizes());
    let [dres, dln, ..] = carve(scratch, d.scratch_sizes());
    for (row, &tgt) in probs.chunks_exact_mut(v).zip(targets) {
        row[tgt as usize] -= F::ONE;
        row.iter_mut().for_each(|z| *z *= grad_scale);
    }
    g.run(
        F::ONE,
        probs,
        Lay::rm(bt, v, v).t(),
        lnf,
        Lay::rm(bt, c, c),
        F::ONE,
        &mut embed_grads[..v * c],
        Lay::rm(v, c, c),
    );
    g.run(
        F::ONE,
        probs,
        Lay::rm(bt, v, v),
        &embed[..v * c],
        Lay::rm(v, c, c),
        F::ZERO,
        dln,
        Lay::rm(bt, c, c),
    );
    dres.fill(F::ZERO);
    layernorm_backward(dres, dw, db, dln, x, w, mean, rstd, c);
}

impl Model for Gpt<f32> {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Panics if `unit` is not a unit of the spec or `out` is shorter than it (engine bugs).
    fn init_unit(&self, seed: u64, unit: usize, out: &mut [f32]) {
        init::init_unit(&self.spec.units[unit], self.cfg.n_layer, seed, out);
    }

    fn begin_micro_step(&mut self, batch: &Batch<'_>) -> Result<(), ModelError> {
        self.begin(batch)
    }

    fn forward_layer(
        &mut self,
        layer: usize,
        params: UnitSlices<'_, '_>,
    ) -> Result<(), ModelError> {
        self.forward(layer, params)
    }

    fn loss(&self) -> f32 {
        self.loss as f32
    }

    fn backward_layer(
        &mut self,
        layer: usize,
        params: UnitSlices<'_, '_>,
        grads: UnitSlicesMut<'_, '_>,
        grad_scale: f32,
    ) -> Result<(), ModelError> {
        self.backward(layer, params, grads, grad_scale)
    }

    fn activation_bytes(&self) -> usize {
        self.arena_bytes()
    }
}
