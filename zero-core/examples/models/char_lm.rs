//! A small character-level language model as a zero-core model, with a block that is
//! not a transformer's: no attention, no positions. Each block mixes every position
//! with the one before it (a causal token shift) inside a GELU MLP, and the head is tied
//! to the embedding (a unit used by two layers, as GPT-2's is):
//!
//! ```text
//! x0 = wte[token]                                   embed      (unit embed)
//! block i:  n = LN(x);  s = shift(n)  (s_t = n_{t-1}, s_0 = 0)
//!           u = n Wnow^T + s Wprev^T + b;  g = gelu(u)
//!           x' = x + g Wout^T + bout                 block i    (unit block.i)
//! logits = LN_f(x_L) wte^T;  loss = mean xent        head       (units ln_f, embed)
//! ```
//!
//! Shapes: B rows of T characters, C channels, H = 4C hidden, V characters.

use zero_core::model::{Compute, Model, ModelError, UnitGrads, UnitParams};
use zero_core::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};
use zero_kernels::device::{
    Buffer, DView, Device, LayerNormGrads, LayerNormOut, LayerNormSaved, MatLayout, MatMul,
};
use zero_kernels::KernelError;

use super::init;

/// One micro-batch: rows of `seq_len` input characters and their next characters.
#[derive(Clone, Copy, Debug)]
pub struct TokenBatch<'a> {
    /// Input ids, [B, T].
    pub inputs: &'a [u32],
    /// Target ids (the next character), [B, T].
    pub targets: &'a [u32],
    /// T.
    pub seq_len: usize,
}

/// The shape of the model.
#[derive(Clone, Copy, Debug)]
pub struct CharLmConfig {
    /// V: distinct characters.
    pub vocab: usize,
    /// C: channels.
    pub width: usize,
    /// Blocks.
    pub blocks: usize,
    /// Most rows x characters of a micro-batch.
    pub max_tokens: usize,
}

struct BlockActs<D: Device> {
    n: D::Buf<f32>,
    mean: D::Buf<f32>,
    rstd: D::Buf<f32>,
    s: D::Buf<f32>,
    u: D::Buf<f32>,
    g: D::Buf<f32>,
    out: D::Buf<f32>,
}

/// The model and its activations on device `D`.
pub struct CharLm<D: Device> {
    cfg: CharLmConfig,
    spec: ModelSpec,
    tokens: usize,
    seq_len: usize,
    inputs: D::Buf<u32>,
    targets: D::Buf<u32>,
    x0: D::Buf<f32>,
    blocks: Vec<BlockActs<D>>,
    lnf: BlockActs<D>,
    probs: D::Buf<f32>,
    losses: D::Buf<f32>,
    loss: D::Buf<f32>,
    dres: D::Buf<f32>,
    dn: D::Buf<f32>,
    ds: D::Buf<f32>,
    dg: D::Buf<f32>,
    bytes: usize,
}

fn rm(rows: usize, cols: usize) -> MatLayout {
    MatLayout::rm(rows, cols, cols)
}

impl<D: Device> CharLm<D> {
    /// A model of shape `cfg`, its activations allocated on `dev`.
    pub fn new(dev: &D, cfg: CharLmConfig) -> Result<Self, KernelError> {
        let (v, c, l, bt) = (cfg.vocab, cfg.width, cfg.blocks, cfg.max_tokens);
        let h = 4 * c;
        let mut units = vec![UnitSpec {
            name: "embed".into(),
            params: vec![ParamSpec::new("wte", &[v, c])],
        }];
        for i in 0..l {
            let p = |s: &str, shape: &[usize]| ParamSpec::new(format!("block.{i}.{s}"), shape);
            units.push(UnitSpec {
                name: format!("block.{i}"),
                params: vec![
                    p("ln.weight", &[c]),
                    p("ln.bias", &[c]),
                    p("mix.now.weight", &[h, c]),
                    p("mix.prev.weight", &[h, c]),
                    p("mix.bias", &[h]),
                    p("out.weight", &[c, h]),
                    p("out.bias", &[c]),
                ],
            });
        }
        units.push(UnitSpec {
            name: "ln_f".into(),
            params: vec![
                ParamSpec::new("ln_f.weight", &[c]),
                ParamSpec::new("ln_f.bias", &[c]),
            ],
        });
        // The embedding's backward adds into rows of wte's gradient and reads no
        // parameter: a lookup, which stage 3 does not gather for the backward.
        let mut layers = vec![LayerSpec::lookup("embed", vec![0])];
        for i in 0..l {
            layers.push(LayerSpec::new(format!("block.{i}"), vec![1 + i]));
        }
        layers.push(LayerSpec::new("head", vec![l + 1, 0]));
        let mut bytes = 0usize;
        let mut buf = |n: usize, name: &str| -> Result<D::Buf<f32>, KernelError> {
            let b = dev.alloc::<f32>(n, name)?;
            bytes += b.allocated_bytes() as usize;
            Ok(b)
        };
        let mut acts = |i: usize, hidden: usize| -> Result<BlockActs<D>, KernelError> {
            let name = |what: &str| format!("block {i} {what}");
            Ok(BlockActs {
                n: buf(bt * c, &name("n"))?,
                mean: buf(bt, &name("mean"))?,
                rstd: buf(bt, &name("rstd"))?,
                s: buf(bt * c * usize::from(hidden > 0), &name("s"))?,
                u: buf(bt * hidden, &name("u"))?,
                g: buf(bt * hidden, &name("g"))?,
                out: buf(bt * c * usize::from(hidden > 0), &name("out"))?,
            })
        };
        let blocks = (0..l).map(|i| acts(i, h)).collect::<Result<Vec<_>, _>>()?;
        let lnf = acts(l, 0)?;
        let model = CharLm {
            cfg,
            spec: ModelSpec { units, layers },
            tokens: 0,
            seq_len: 0,
            x0: buf(bt * c, "x0")?,
            probs: buf(bt * v, "probs")?,
            losses: buf(bt, "losses")?,
            loss: buf(1, "loss")?,
            dres: buf(bt * c, "dres")?,
            dn: buf(bt * c, "dn")?,
            ds: buf(bt * c, "ds")?,
            dg: buf(bt * h, "dg")?,
            blocks,
            lnf,
            inputs: dev.alloc(bt, "inputs")?,
            targets: dev.alloc(bt, "targets")?,
            bytes: 0,
        };
        Ok(CharLm {
            bytes: bytes + 8 * bt,
            ..model
        })
    }

    /// The shape.
    pub fn config(&self) -> CharLmConfig {
        self.cfg
    }
}

/// The input of layer `layer` (blocks are layers 1..=L, the head L + 1): the embedding's
/// output or the previous block's, `n` elements.
fn input_of<'a, D: Device>(
    x0: &'a D::Buf<f32>,
    blocks: &'a [BlockActs<D>],
    layer: usize,
    n: usize,
) -> DView<'a, D, f32> {
    if layer == 1 {
        x0.slice(0..n)
    } else {
        blocks[layer - 2].out.slice(0..n)
    }
}

impl<D: Device> Model<D> for CharLm<D> {
    type Batch<'a> = TokenBatch<'a>;

    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Embedding N(0, 0.02); mixing weights N(0, 1/C); output weights N(0, 0.02/sqrt(2L))
    /// (GPT-2's residual scaling); biases 0; layer norm scales 1.
    fn init_unit(&self, seed: u64, unit: usize, out: &mut [f32]) {
        let mut at = 0;
        let c = self.cfg.width as f64;
        for p in &self.spec.units[unit].params {
            let o = &mut out[at..at + p.numel()];
            if p.name.ends_with("ln.weight") || p.name == "ln_f.weight" {
                o.fill(1.0);
            } else if p.shape.len() == 1 {
                o.fill(0.0);
            } else if p.name == "wte" {
                init::normal(seed, &p.name, 0.02, o);
            } else if p.name.ends_with("out.weight") {
                init::normal(
                    seed,
                    &p.name,
                    0.02 / (2.0 * self.cfg.blocks as f64).sqrt(),
                    o,
                );
            } else {
                init::normal(seed, &p.name, 1.0 / c.sqrt(), o);
            }
            at += p.numel();
        }
    }

    fn begin_micro_step(
        &mut self,
        cx: Compute<'_, D>,
        b: &TokenBatch<'_>,
    ) -> Result<(), ModelError> {
        let n = b.inputs.len();
        if n == 0
            || n > self.cfg.max_tokens
            || b.targets.len() != n
            || b.seq_len == 0
            || !n.is_multiple_of(b.seq_len)
        {
            return Err(ModelError::BadBatch(format!(
                "{n} inputs, {} targets in rows of {}; this model takes up to {} tokens in whole rows",
                b.targets.len(),
                b.seq_len,
                self.cfg.max_tokens
            )));
        }
        for (what, ids) in [("inputs", b.inputs), ("targets", b.targets)] {
            if let Some(i) = ids.iter().position(|&t| t as usize >= self.cfg.vocab) {
                return Err(ModelError::BadBatch(format!(
                    "{what}[{i}] = {} is outside the {} characters",
                    ids[i], self.cfg.vocab
                )));
            }
        }
        self.tokens = n;
        self.seq_len = b.seq_len;
        cx.dev
            .upload(cx.stream, b.inputs, self.inputs.slice_mut(0..n))?;
        cx.dev
            .upload(cx.stream, b.targets, self.targets.slice_mut(0..n))?;
        Ok(())
    }

    fn forward_layer(
        &mut self,
        cx: Compute<'_, D>,
        layer: usize,
        p: &[UnitParams<'_, D>],
    ) -> Result<(), ModelError> {
        let (dev, s) = (cx.dev, cx.stream);
        let (bt, c, v, l) = (self.tokens, self.cfg.width, self.cfg.vocab, self.cfg.blocks);
        let h = 4 * c;
        if layer == 0 {
            let wte = p[0].param(0);
            dev.gather_rows(
                s,
                self.x0.slice_mut(0..bt * c),
                self.inputs.slice(0..bt),
                wte,
                c,
            )?;
        } else if layer <= l {
            let pp = &p[0];
            // This block's activations, and its input (an earlier block's, or x0).
            let (before, rest) = self.blocks.split_at_mut(layer - 1);
            let a = &mut rest[0];
            let x = input_of(&self.x0, before, layer, bt * c);
            let out = LayerNormOut {
                out: a.n.slice_mut(0..bt * c),
                mean: a.mean.slice_mut(0..bt),
                rstd: a.rstd.slice_mut(0..bt),
            };
            dev.layernorm_forward(s, out, x.clone(), pp.param(0), pp.param(1), c)?;
            dev.shift_rows_forward(
                s,
                a.s.slice_mut(0..bt * c),
                a.n.slice(0..bt * c),
                self.seq_len,
                c,
            )?;
            dev.fill_rows(s, a.u.slice_mut(0..bt * h), pp.param(4))?;
            let mix = MatMul {
                alpha: 1.0,
                beta: 1.0,
                a: rm(bt, c),
                b: rm(h, c).t(),
                c: rm(bt, h),
            };
            dev.matmul(
                s,
                mix,
                a.n.slice(0..bt * c),
                pp.param(2),
                a.u.slice_mut(0..bt * h),
            )?;
            dev.matmul(
                s,
                mix,
                a.s.slice(0..bt * c),
                pp.param(3),
                a.u.slice_mut(0..bt * h),
            )?;
            dev.gelu_forward(s, a.g.slice_mut(0..bt * h), a.u.slice(0..bt * h))?;
            dev.copy(s, x, a.out.slice_mut(0..bt * c))?;
            dev.add_rows(s, a.out.slice_mut(0..bt * c), pp.param(6))?;
            let proj = MatMul {
                alpha: 1.0,
                beta: 1.0,
                a: rm(bt, h),
                b: rm(c, h).t(),
                c: rm(bt, c),
            };
            dev.matmul(
                s,
                proj,
                a.g.slice(0..bt * h),
                pp.param(5),
                a.out.slice_mut(0..bt * c),
            )?;
        } else {
            let (lnf, wte) = (&p[0], p[1].param(0));
            let x = input_of(&self.x0, &self.blocks, layer, bt * c);
            let out = LayerNormOut {
                out: self.lnf.n.slice_mut(0..bt * c),
                mean: self.lnf.mean.slice_mut(0..bt),
                rstd: self.lnf.rstd.slice_mut(0..bt),
            };
            dev.layernorm_forward(s, out, x, lnf.param(0), lnf.param(1), c)?;
            let head = MatMul {
                alpha: 1.0,
                beta: 0.0,
                a: rm(bt, c),
                b: rm(v, c).t(),
                c: rm(bt, v),
            };
            dev.matmul(
                s,
                head,
                self.lnf.n.slice(0..bt * c),
                wte,
                self.probs.slice_mut(0..bt * v),
            )?;
            let (probs, losses) = (
                self.probs.slice_mut(0..bt * v),
                self.losses.slice_mut(0..bt),
            );
            dev.softmax_xent_forward(s, probs, losses, self.targets.slice(0..bt), v)?;
            dev.mean(s, self.loss.view_mut(), self.losses.slice(0..bt))?;
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
        let (dev, s) = (cx.dev, cx.stream);
        let (bt, c, v, l) = (self.tokens, self.cfg.width, self.cfg.vocab, self.cfg.blocks);
        let h = 4 * c;
        if layer == l + 1 {
            // dz = (p - onehot) weight / (B T); dwte += dz^T lnf; dlnf = dz wte;
            // dres = LN_f backward (the residual stream's gradient starts here).
            let scale = weight / bt as f32;
            dev.softmax_xent_backward(
                s,
                self.probs.slice_mut(0..bt * v),
                self.targets.slice(0..bt),
                v,
                scale,
            )?;
            let (lnf_g, wte_g) = g.split_at_mut(1);
            let dwte = MatMul {
                alpha: 1.0,
                beta: 1.0,
                a: rm(bt, v).t(),
                b: rm(bt, c),
                c: rm(v, c),
            };
            dev.matmul(
                s,
                dwte,
                self.probs.slice(0..bt * v),
                self.lnf.n.slice(0..bt * c),
                wte_g[0].param(0),
            )?;
            let dlnf = MatMul {
                alpha: 1.0,
                beta: 0.0,
                a: rm(bt, v),
                b: rm(v, c),
                c: rm(bt, c),
            };
            dev.matmul(
                s,
                dlnf,
                self.probs.slice(0..bt * v),
                p[1].param(0),
                self.dn.slice_mut(0..bt * c),
            )?;
            dev.fill(s, self.dres.slice_mut(0..bt * c), 0.0)?;
            let mut lg = lnf_g[0].split_mut().into_iter();
            let (dw, db) = (lg.next(), lg.next());
            let (Some(dw), Some(db)) = (dw, db) else {
                return Err(ModelError::BadCall("ln_f has two parameters".into()));
            };
            let grads = LayerNormGrads {
                dx: self.dres.slice_mut(0..bt * c),
                dw,
                db,
            };
            let saved = LayerNormSaved {
                x: input_of(&self.x0, &self.blocks, layer, bt * c),
                w: p[0].param(0),
                mean: self.lnf.mean.slice(0..bt),
                rstd: self.lnf.rstd.slice(0..bt),
            };
            dev.layernorm_backward(s, grads, self.dn.slice(0..bt * c), saved, c)?;
        } else if layer >= 1 {
            let a = &self.blocks[layer - 1];
            let pp = &p[0];
            let mut gs = g[0].split_mut().into_iter();
            let mut next = || {
                gs.next()
                    .ok_or_else(|| ModelError::BadCall("a block unit has 7 parameters".into()))
            };
            let (dlnw, dlnb, dnow, dprev, dmixb, dout_w, dout_b) = (
                next()?,
                next()?,
                next()?,
                next()?,
                next()?,
                next()?,
                next()?,
            );
            // Output projection: dWout += dres^T g; dbout += sum dres; dg = dres Wout.
            let dw = MatMul {
                alpha: 1.0,
                beta: 1.0,
                a: rm(bt, c).t(),
                b: rm(bt, h),
                c: rm(c, h),
            };
            dev.matmul(
                s,
                dw,
                self.dres.slice(0..bt * c),
                a.g.slice(0..bt * h),
                dout_w,
            )?;
            dev.bias_backward(s, dout_b, self.dres.slice(0..bt * c))?;
            let dgm = MatMul {
                alpha: 1.0,
                beta: 0.0,
                a: rm(bt, c),
                b: rm(c, h),
                c: rm(bt, h),
            };
            dev.matmul(
                s,
                dgm,
                self.dres.slice(0..bt * c),
                pp.param(5),
                self.dg.slice_mut(0..bt * h),
            )?;
            // du = dg gelu'(u); dWnow += du^T n; dWprev += du^T s; db += sum du.
            dev.gelu_backward(s, self.dg.slice_mut(0..bt * h), a.u.slice(0..bt * h))?;
            let dwm = MatMul {
                alpha: 1.0,
                beta: 1.0,
                a: rm(bt, h).t(),
                b: rm(bt, c),
                c: rm(h, c),
            };
            dev.matmul(s, dwm, self.dg.slice(0..bt * h), a.n.slice(0..bt * c), dnow)?;
            dev.matmul(
                s,
                dwm,
                self.dg.slice(0..bt * h),
                a.s.slice(0..bt * c),
                dprev,
            )?;
            dev.bias_backward(s, dmixb, self.dg.slice(0..bt * h))?;
            // dn = du Wnow + shift^T(du Wprev); then the layer norm adds into dres.
            let dx = MatMul {
                alpha: 1.0,
                beta: 0.0,
                a: rm(bt, h),
                b: rm(h, c),
                c: rm(bt, c),
            };
            dev.matmul(
                s,
                dx,
                self.dg.slice(0..bt * h),
                pp.param(2),
                self.dn.slice_mut(0..bt * c),
            )?;
            dev.matmul(
                s,
                dx,
                self.dg.slice(0..bt * h),
                pp.param(3),
                self.ds.slice_mut(0..bt * c),
            )?;
            dev.shift_rows_backward(
                s,
                self.dn.slice_mut(0..bt * c),
                self.ds.slice(0..bt * c),
                self.seq_len,
                c,
            )?;
            let grads = LayerNormGrads {
                dx: self.dres.slice_mut(0..bt * c),
                dw: dlnw,
                db: dlnb,
            };
            let saved = LayerNormSaved {
                x: input_of(&self.x0, &self.blocks, layer, bt * c),
                w: pp.param(0),
                mean: a.mean.slice(0..bt),
                rstd: a.rstd.slice(0..bt),
            };
            dev.layernorm_backward(s, grads, self.dn.slice(0..bt * c), saved, c)?;
        } else {
            // wte[token] += dres (the head added its part of wte already).
            dev.scatter_add_rows(
                s,
                g[0].param(0),
                self.inputs.slice(0..bt),
                self.dres.slice(0..bt * c),
                c,
            )?;
        }
        Ok(())
    }

    fn activation_bytes(&self) -> usize {
        self.bytes
    }
}
