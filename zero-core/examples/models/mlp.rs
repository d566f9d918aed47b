//! An MLP classifier as a zero-core model: features -> fc1 -> GELU -> fc2 -> softmax
//! cross-entropy over K classes. Two units (`fc1`, `fc2`), two layers; the batch is the
//! model's own type (feature rows and class labels), not tokens.
//!
//! Shapes: B rows, F features, H hidden, K classes. Weights are [out, in].
//!   h = x W1^T + b1;  a = gelu(h);  z = a W2^T + b2;  loss = mean_b xent(softmax(z_b), y_b)

use zero_core::model::{Compute, Model, ModelError, UnitGrads, UnitParams};
use zero_core::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};
use zero_kernels::device::{Buffer, DView, Device, MatLayout, MatMul};
use zero_kernels::KernelError;

use super::init;

/// One micro-batch: `labels.len()` rows of `features` values each.
#[derive(Clone, Copy, Debug)]
pub struct ClassBatch<'a> {
    /// [B, F], row-major.
    pub features: &'a [f32],
    /// [B], each < K.
    pub labels: &'a [u32],
}

/// The classifier and its activations on device `D`.
pub struct Mlp<D: Device> {
    spec: ModelSpec,
    dims: (usize, usize, usize),
    max_rows: usize,
    rows: usize,
    x: D::Buf<f32>,
    labels: D::Buf<u32>,
    h: D::Buf<f32>,
    a: D::Buf<f32>,
    probs: D::Buf<f32>,
    losses: D::Buf<f32>,
    loss: D::Buf<f32>,
    da: D::Buf<f32>,
}

fn rm(rows: usize, cols: usize) -> MatLayout {
    MatLayout::rm(rows, cols, cols)
}

impl<D: Device> Mlp<D> {
    /// A classifier of `features` -> `hidden` -> `classes` for micro-batches of up to
    /// `max_rows` rows.
    pub fn new(
        dev: &D,
        features: usize,
        hidden: usize,
        classes: usize,
        max_rows: usize,
    ) -> Result<Self, KernelError> {
        let (f, h, k, b) = (features, hidden, classes, max_rows);
        let unit = |name: &str, out: usize, inp: usize| UnitSpec {
            name: name.into(),
            params: vec![
                ParamSpec::new(format!("{name}.weight"), &[out, inp]),
                ParamSpec::new(format!("{name}.bias"), &[out]),
            ],
        };
        let spec = ModelSpec {
            units: vec![unit("fc1", h, f), unit("fc2", k, h)],
            layers: vec![
                LayerSpec::new("fc1", vec![0]),
                LayerSpec::new("fc2", vec![1]),
            ],
        };
        Ok(Mlp {
            spec,
            dims: (f, h, k),
            max_rows,
            rows: 0,
            x: dev.alloc(b * f, "mlp x")?,
            labels: dev.alloc(b, "mlp labels")?,
            h: dev.alloc(b * h, "mlp h")?,
            a: dev.alloc(b * h, "mlp a")?,
            probs: dev.alloc(b * k, "mlp probs")?,
            losses: dev.alloc(b, "mlp losses")?,
            loss: dev.alloc(1, "mlp loss")?,
            da: dev.alloc(b * h, "mlp da")?,
        })
    }
}

impl<D: Device> Model<D> for Mlp<D> {
    type Batch<'a> = ClassBatch<'a>;

    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Weights N(0, 1/fan_in) (LeCun), biases 0.
    fn init_unit(&self, seed: u64, unit: usize, out: &mut [f32]) {
        let u = &self.spec.units[unit];
        let (w, fan_in) = (&u.params[0], u.params[0].shape[1]);
        init::normal(
            seed,
            &w.name,
            1.0 / (fan_in as f64).sqrt(),
            &mut out[..w.numel()],
        );
        out[w.numel()..u.numel()].fill(0.0);
    }

    fn begin_micro_step(
        &mut self,
        cx: Compute<'_, D>,
        b: &ClassBatch<'_>,
    ) -> Result<(), ModelError> {
        let (f, _, k) = self.dims;
        let rows = b.labels.len();
        if rows == 0 || rows > self.max_rows || b.features.len() != rows * f {
            return Err(ModelError::BadBatch(format!(
                "{} labels and {} feature values; this model takes 1..={} rows of {f} features",
                rows,
                b.features.len(),
                self.max_rows
            )));
        }
        if let Some(i) = b.labels.iter().position(|&y| y as usize >= k) {
            return Err(ModelError::BadBatch(format!(
                "labels[{i}] = {} is not one of the {k} classes",
                b.labels[i]
            )));
        }
        self.rows = rows;
        cx.dev
            .upload(cx.stream, b.features, self.x.slice_mut(0..rows * f))?;
        cx.dev
            .upload(cx.stream, b.labels, self.labels.slice_mut(0..rows))?;
        Ok(())
    }

    fn forward_layer(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        p: &[UnitParams<'_, D>],
    ) -> Result<(), ModelError> {
        let ((f, h, k), b) = (self.dims, self.rows);
        let (dev, s) = (cx.dev, cx.stream);
        let w = p[0].param(0);
        if layer == 0 {
            // h = x W1^T + b1; a = gelu(h)
            dev.fill_rows(s, self.h.slice_mut(0..b * h), p[0].param(1))?;
            let mm = MatMul {
                alpha: 1.0,
                beta: 1.0,
                a: rm(b, f),
                b: rm(h, f).t(),
                c: rm(b, h),
            };
            dev.matmul(s, mm, self.x.slice(0..b * f), w, self.h.slice_mut(0..b * h))?;
            dev.gelu_forward(s, self.a.slice_mut(0..b * h), self.h.slice(0..b * h))?;
        } else {
            // z = a W2^T + b2, then softmax cross-entropy and its mean.
            dev.fill_rows(s, self.probs.slice_mut(0..b * k), p[0].param(1))?;
            let mm = MatMul {
                alpha: 1.0,
                beta: 1.0,
                a: rm(b, h),
                b: rm(k, h).t(),
                c: rm(b, k),
            };
            dev.matmul(
                s,
                mm,
                self.a.slice(0..b * h),
                w,
                self.probs.slice_mut(0..b * k),
            )?;
            let (probs, losses) = (self.probs.slice_mut(0..b * k), self.losses.slice_mut(0..b));
            dev.softmax_xent_forward(s, probs, losses, self.labels.slice(0..b), k)?;
            dev.mean(s, self.loss.view_mut(), self.losses.slice(0..b))?;
        }
        Ok(())
    }

    fn loss(&self) -> DView<'_, D, f32> {
        self.loss.view()
    }

    fn backward_layer(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        p: &[UnitParams<'_, D>],
        g: &mut [UnitGrads<'_, D>],
        weight: f32,
    ) -> Result<(), ModelError> {
        let ((f, h, k), b) = (self.dims, self.rows);
        let (dev, s) = (cx.dev, cx.stream);
        if layer == 1 {
            // dz = (p - onehot) weight / B; dW2 += dz^T a; db2 += sum dz; da = dz W2.
            let scale = weight / b as f32;
            dev.softmax_xent_backward(
                s,
                self.probs.slice_mut(0..b * k),
                self.labels.slice(0..b),
                k,
                scale,
            )?;
            let mm = MatMul {
                alpha: 1.0,
                beta: 1.0,
                a: rm(b, k).t(),
                b: rm(b, h),
                c: rm(k, h),
            };
            dev.matmul(
                s,
                mm,
                self.probs.slice(0..b * k),
                self.a.slice(0..b * h),
                g[0].param(0),
            )?;
            dev.bias_backward(s, g[0].param(1), self.probs.slice(0..b * k))?;
            let mm = MatMul {
                alpha: 1.0,
                beta: 0.0,
                a: rm(b, k),
                b: rm(k, h),
                c: rm(b, h),
            };
            dev.matmul(
                s,
                mm,
                self.probs.slice(0..b * k),
                p[0].param(0),
                self.da.slice_mut(0..b * h),
            )?;
        } else {
            // dh = da gelu'(h); dW1 += dh^T x; db1 += sum dh.
            dev.gelu_backward(s, self.da.slice_mut(0..b * h), self.h.slice(0..b * h))?;
            let mm = MatMul {
                alpha: 1.0,
                beta: 1.0,
                a: rm(b, h).t(),
                b: rm(b, f),
                c: rm(h, f),
            };
            dev.matmul(
                s,
                mm,
                self.da.slice(0..b * h),
                self.x.slice(0..b * f),
                g[0].param(0),
            )?;
            dev.bias_backward(s, g[0].param(1), self.da.slice(0..b * h))?;
        }
        Ok(())
    }

    fn activation_bytes(&self) -> usize {
        [
            self.x.allocated_bytes(),
            self.labels.allocated_bytes(),
            self.h.allocated_bytes(),
            self.a.allocated_bytes(),
            self.probs.allocated_bytes(),
            self.losses.allocated_bytes(),
            self.loss.allocated_bytes(),
            self.da.allocated_bytes(),
        ]
        .iter()
        .sum::<u64>() as usize
    }
}
