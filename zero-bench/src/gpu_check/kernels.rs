//! Every model and optimizer op of the Device trait on the device under test against a
//! reference on the same inputs, one line per op.
//!
//! On a GPU the reference is the CUDA kernels' CPU twins (`SimDevice::gpu_twin`): the
//! same IEEE operations in the same order, so the results must be bitwise equal, except
//! where the order is not ours to fix (cuBLAS's matrix products: a relative tolerance;
//! bf16 tensor-core products: a bf16 tolerance) or the math library's (the log-sum-exp
//! of the loss: a few ulp). In the dry run the device under test is the simulated GPU and
//! the reference the host's vectorised kernels, whose reductions group differently: a
//! rounding tolerance for every op that computes, bitwise for those that move data and
//! for those whose twin keeps the host kernel's order (Llama's rotary/GQA and SwiGLU).

use half::{bf16, f16};
use std::time::Instant;

use zero_kernels::adamw::{AdamWHyper, AdamWSegment};
use zero_kernels::device::{
    AdamWStep, AdamWViews, AttnShape, Buffer, Device, LayerNormGrads, LayerNormOut, LayerNormSaved,
    MatLayout, MatMul, RopeShape,
};
use zero_kernels::twin::attention_products::AttentionKernels;
use zero_kernels::{Element, Float};

use super::report::{figure, Check, Kind, Report};
use super::stats::{diff, Rng};
use crate::device::BenchDevice;

/// The shape the ops run at: B x T rows of width C, H heads, V classes.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// B.
    pub b: usize,
    /// T.
    pub t: usize,
    /// C.
    pub c: usize,
    /// H.
    pub h: usize,
    /// V.
    pub v: usize,
}

impl Shape {
    /// GPT-2 124M's widths at a short sequence (the GPU's results are checked on the CPU,
    /// single-threaded twins included).
    pub const FULL: Shape = Shape {
        b: 4,
        t: 128,
        c: 768,
        h: 12,
        v: 50257,
    };
    /// Small enough for the dry run in a test.
    pub const QUICK: Shape = Shape {
        b: 2,
        t: 32,
        c: 64,
        h: 4,
        v: 512,
    };
    fn rows(&self) -> usize {
        self.b * self.t
    }
    /// Llama's rotary/GQA shape at these widths: hd = C/H, H/2 key/value heads.
    fn rope(&self) -> RopeShape {
        RopeShape {
            b: self.b,
            t: self.t,
            h: self.h,
            kv_h: self.h / 2,
            hd: self.c / self.h,
            theta: 10000.0,
        }
    }
    /// Rows of the lookup tables (at most 4096: a GPT table's rows are all alike).
    fn table_rows(&self) -> usize {
        self.v.min(4096)
    }
}

/// How close an op's result must be to the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tol {
    /// Every element's bits equal (NaNs equal NaNs).
    Bitwise,
    /// max |a - b| / max |b| at most this.
    Rel(f64),
}

/// Which reference the device is held against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Against {
    /// The CUDA kernels' CPU twins (a GPU under test).
    Twin,
    /// The host's vectorised kernels (the dry run).
    Host,
}

/// The ops checked, each one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    MatmulXWt,
    MatmulDyW,
    MatmulDytXAcc,
    MatmulBf16,
    LnFwd,
    LnBwd,
    RmsFwd,
    RmsBwd,
    RopeFwd,
    RopeBwd,
    SwigluFwd,
    SwigluBwd,
    GeluFwd,
    GeluBwd,
    AttnFwd,
    AttnBwd,
    AttnFwdProducts,
    AttnBwdProducts,
    XentFwd,
    XentBwd,
    Mean,
    FillRows,
    AddRows,
    BiasBwd,
    GatherRows,
    ScatterAddRows,
    GatherRowsBlock,
    ScatterAddRowsBlock,
    AddPeriodicRows,
    PeriodicRowsBwd,
    ShiftFwd,
    ShiftBwd,
    Add,
    Scale,
    CastF32Bf16,
    CastF32F16,
    CastBf16F32,
    AccumBf16IntoF32,
    AccumF32IntoBf16,
    GradStatsF32,
    GradStatsBf16Inf,
    QuantizeF32,
    DequantizeBf16,
    Quantize4F32,
    Dequantize4Bf16,
    AdamW,
}

impl Op {
    /// Every op, in the order of the report.
    pub const ALL: [Op; 44] = [
        Op::MatmulXWt,
        Op::MatmulDyW,
        Op::MatmulDytXAcc,
        Op::MatmulBf16,
        Op::LnFwd,
        Op::LnBwd,
        Op::RmsFwd,
        Op::RmsBwd,
        Op::RopeFwd,
        Op::RopeBwd,
        Op::SwigluFwd,
        Op::SwigluBwd,
        Op::GeluFwd,
        Op::GeluBwd,
        Op::AttnFwd,
        Op::AttnBwd,
        Op::XentFwd,
        Op::XentBwd,
        Op::Mean,
        Op::FillRows,
        Op::AddRows,
        Op::BiasBwd,
        Op::GatherRows,
        Op::ScatterAddRows,
        Op::GatherRowsBlock,
        Op::ScatterAddRowsBlock,
        Op::AddPeriodicRows,
        Op::PeriodicRowsBwd,
        Op::ShiftFwd,
        Op::ShiftBwd,
        Op::Add,
        Op::Scale,
        Op::CastF32Bf16,
        Op::CastF32F16,
        Op::CastBf16F32,
        Op::AccumBf16IntoF32,
        Op::AccumF32IntoBf16,
        Op::GradStatsF32,
        Op::GradStatsBf16Inf,
        Op::QuantizeF32,
        Op::DequantizeBf16,
        Op::Quantize4F32,
        Op::Dequantize4Bf16,
        Op::AdamW,
    ];

    /// The attention of batched products, checked in their own group, last (a fault
    /// there must not cost the other checks).
    pub const PRODUCTS: [Op; 2] = [Op::AttnFwdProducts, Op::AttnBwdProducts];

    fn name(self, s: &Shape) -> String {
        let (r, c, n) = (s.rows(), s.c, 4 * s.c);
        match self {
            Op::MatmulXWt => format!("matmul f32 x W^T [{r}x{c} . {c}x{n}]"),
            Op::MatmulDyW => format!("matmul f32 dy W [{r}x{n} . {n}x{c}]"),
            Op::MatmulDytXAcc => format!("matmul f32 dW += dy^T x [{n}x{r} . {r}x{c}]"),
            Op::MatmulBf16 => format!("matmul bf16 x W^T [{r}x{c} . {c}x{n}]"),
            Op::LnFwd => format!("layernorm_forward [{r}x{c}]"),
            Op::LnBwd => format!("layernorm_backward [{r}x{c}]"),
            Op::RmsFwd => format!("rmsnorm_forward [{r}x{c}]"),
            Op::RmsBwd => format!("rmsnorm_backward [{r}x{c}]"),
            Op::RopeFwd | Op::RopeBwd => {
                let rs = s.rope();
                let dir = if self == Op::RopeFwd {
                    "forward"
                } else {
                    "backward"
                };
                format!(
                    "rope_gqa_{dir} B{} T{} H{} Hkv{} hd{}",
                    rs.b, rs.t, rs.h, rs.kv_h, rs.hd
                )
            }
            Op::SwigluFwd => format!("swiglu_forward [{}]", r * n),
            Op::SwigluBwd => format!("swiglu_backward [{}]", r * n),
            Op::GeluFwd => format!("gelu_forward [{}]", r * n),
            Op::GeluBwd => format!("gelu_backward [{}]", r * n),
            Op::AttnFwd => format!("attention_forward B{} T{} C{c} H{}", s.b, s.t, s.h),
            Op::AttnBwd => format!("attention_backward B{} T{} C{c} H{}", s.b, s.t, s.h),
            Op::AttnFwdProducts => format!(
                "attention_forward, batched products B{} T{} C{c} H{}",
                s.b, s.t, s.h
            ),
            Op::AttnBwdProducts => format!(
                "attention_backward, batched products B{} T{} C{c} H{}",
                s.b, s.t, s.h
            ),
            Op::XentFwd => format!("softmax_xent_forward [{r}x{}]", s.v),
            Op::XentBwd => format!("softmax_xent_backward [{r}x{}]", s.v),
            Op::Mean => format!("mean [{r}]"),
            Op::FillRows => format!("fill_rows [{r}x{c}]"),
            Op::AddRows => format!("add_rows [{r}x{c}]"),
            Op::BiasBwd => format!("bias_backward [{r}x{c}]"),
            Op::GatherRows => format!("gather_rows [{r}x{c}] of {}", s.table_rows()),
            Op::ScatterAddRows => format!("scatter_add_rows [{r}x{c}] into {}", s.table_rows()),
            Op::GatherRowsBlock => format!("gather_rows_block [{r}x{c}]"),
            Op::ScatterAddRowsBlock => format!("scatter_add_rows_block [{r}x{c}]"),
            Op::AddPeriodicRows => format!("add_periodic_rows [{r}x{c}] period {}", s.t),
            Op::PeriodicRowsBwd => format!("periodic_rows_backward [{r}x{c}] period {}", s.t),
            Op::ShiftFwd => format!("shift_rows_forward [{r}x{c}]"),
            Op::ShiftBwd => format!("shift_rows_backward [{r}x{c}]"),
            Op::Add => format!("add [{}]", r * c),
            Op::Scale => format!("scale [{}]", r * c),
            Op::CastF32Bf16 => format!("cast f32->bf16 [{}]", r * c),
            Op::CastF32F16 => format!("cast f32->f16 [{}]", r * c),
            Op::CastBf16F32 => format!("cast bf16->f32 [{}]", r * c),
            Op::AccumBf16IntoF32 => format!("accumulate f32 += bf16 [{}]", r * c),
            Op::AccumF32IntoBf16 => format!("accumulate bf16 += f32 [{}]", r * c),
            Op::GradStatsF32 => format!("grad_stats f32 [{}]", r * n),
            Op::GradStatsBf16Inf => format!("grad_stats bf16 with inf [{}]", r * n),
            Op::QuantizeF32 => format!("quantize_int8 f32, blocks of 256 [{}]", r * n + 5),
            Op::DequantizeBf16 => format!("dequantize_int8 to bf16, blocks of 256 [{}]", r * n + 5),
            Op::Quantize4F32 => format!("quantize_int4 f32, blocks of 256 [{}]", r * n + 5),
            Op::Dequantize4Bf16 => {
                format!("dequantize_int4 to bf16, blocks of 256 [{}]", r * n + 5)
            }
            Op::AdamW => format!("adamw bf16 grad, bf16 copy [{}]", r * n),
        }
    }

    fn is_matmul(self) -> bool {
        matches!(
            self,
            Op::MatmulXWt | Op::MatmulDyW | Op::MatmulDytXAcc | Op::MatmulBf16
        )
    }

    /// Pure data movement (no arithmetic, or one IEEE operation per element): bitwise on
    /// every reference.
    fn moves_data(self) -> bool {
        matches!(
            self,
            Op::FillRows
                | Op::GatherRows
                | Op::GatherRowsBlock
                | Op::ShiftFwd
                | Op::Add
                | Op::Scale
                | Op::CastF32Bf16
                | Op::CastF32F16
                | Op::CastBf16F32
                | Op::AccumBf16IntoF32
                | Op::AccumF32IntoBf16
                // An integer maximum per block, then one rounded operation per value.
                | Op::QuantizeF32
                | Op::DequantizeBf16
                | Op::Quantize4F32
                | Op::Dequantize4Bf16
        )
    }

    /// The tolerance against `against`, and why it is what it is.
    pub fn tolerance(self, against: Against) -> (Tol, &'static str) {
        match (against, self) {
            (_, Op::MatmulBf16) => (
                Tol::Rel(1e-2),
                "bf16 tensor cores vs fp32 product of the bf16-rounded inputs: 2^-7",
            ),
            (_, op) if op.is_matmul() => (
                Tol::Rel(1e-5),
                "fp32, the summation order is the GEMM library's",
            ),
            (_, op) if op.moves_data() => (Tol::Bitwise, "no reordering possible"),
            (_, Op::AttnFwdProducts | Op::AttnBwdProducts) => (
                Tol::Rel(1e-5),
                "fp32 products in cuBLAS's summation order, the rows kernels' twin as reference",
            ),
            (Against::Twin, Op::XentFwd) => (Tol::Rel(1e-6), "exp/ln of the loss: a few ulp"),
            (Against::Twin, _) => (Tol::Bitwise, "same operations in the same order"),
            (Against::Host, Op::RopeFwd | Op::RopeBwd) => (
                Tol::Bitwise,
                "the host's cos/sin table, operations and head order",
            ),
            (Against::Host, Op::SwigluFwd | Op::SwigluBwd) => (
                Tol::Bitwise,
                "the host kernel's operations per element",
            ),
            (Against::Host, Op::XentFwd) => (
                Tol::Rel(1e-4),
                "twin vs host kernel: exp/ln and a V-long sum grouped differently (the twin's own tests allow 5e-5)",
            ),
            (Against::Host, _) => (
                Tol::Rel(1e-5),
                "twin vs vectorised host kernel: reductions grouped differently",
            ),
        }
    }
}

/// A host-side output of one op, as f64 (every element type converts exactly).
pub struct Out {
    name: &'static str,
    vals: Vec<f64>,
}

fn f64s<T: Float>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| f64::from(x.to_f32())).collect()
}

/// A device and the stream every op of a check is queued on.
struct On<'a, D: Device> {
    dev: &'a D,
    s: D::Stream,
}

impl<'a, D: Device> On<'a, D> {
    fn new(dev: &'a D) -> zero_kernels::Result<Self> {
        Ok(On {
            dev,
            s: dev.stream("check")?,
        })
    }
    fn up<T: Element>(&self, v: &[T], name: &str) -> zero_kernels::Result<D::Buf<T>> {
        let mut b = self.dev.alloc::<T>(v.len(), name)?;
        self.dev.upload(&self.s, v, b.view_mut())?;
        Ok(b)
    }
    fn zeros<T: Element>(&self, n: usize, name: &str) -> zero_kernels::Result<D::Buf<T>> {
        self.dev.alloc::<T>(n, name)
    }
    fn down<T: Element>(&self, b: &D::Buf<T>) -> zero_kernels::Result<Vec<T>> {
        let mut v = vec![T::default(); b.len()];
        self.dev.download(&self.s, b.view(), &mut v)?;
        Ok(v)
    }
    fn out(&self, name: &'static str, b: &D::Buf<f32>) -> zero_kernels::Result<Out> {
        Ok(Out {
            name,
            vals: self.down(b)?.into_iter().map(f64::from).collect(),
        })
    }
}

/// Rows of random non-negative numbers that sum to one (with zeros above the diagonal of
/// each T x T block when `causal`): probabilities for the backward ops.
fn prob_rows(rng: &mut Rng, rows: usize, width: usize, causal_t: Option<usize>) -> Vec<f32> {
    let mut p = vec![0f32; rows * width];
    for (r, row) in p.chunks_mut(width).enumerate() {
        let live = causal_t.map_or(width, |t| r % t + 1);
        let mut sum = 0f64;
        for x in row.iter_mut().take(live) {
            *x = (rng.uniform() + 1.0) * 0.5 + 1e-3;
            sum += f64::from(*x);
        }
        for x in row.iter_mut().take(live) {
            *x = (f64::from(*x) / sum) as f32;
        }
    }
    p
}

/// Run `op` on `dev` with the inputs of `seed`; `round_bf16`: round the matrix product's
/// inputs to bf16 on the host first (the reference of a bf16 product).
pub fn run_op<D: Device>(
    dev: &D,
    op: Op,
    s: &Shape,
    seed: u64,
    round_bf16: bool,
) -> zero_kernels::Result<Vec<Out>> {
    let on = On::new(dev)?;
    let mut rng = Rng::new(seed);
    let (rows, c, n, t) = (s.rows(), s.c, 4 * s.c, s.t);
    let tv = s.table_rows();
    let round = |v: Vec<f32>| -> Vec<f32> {
        if round_bf16 {
            v.into_iter().map(|x| bf16::from_f32(x).to_f32()).collect()
        } else {
            v
        }
    };
    let outs = match op {
        Op::MatmulXWt | Op::MatmulBf16 => {
            let x = on.up(&round(rng.vec(rows * c, 1.0)), "x")?;
            let w = on.up(&round(rng.vec(n * c, 0.05)), "w")?;
            let mut y = on.zeros::<f32>(rows * n, "y")?;
            let mm = MatMul {
                alpha: 1.0,
                beta: 0.0,
                a: MatLayout::rm(rows, c, c),
                b: MatLayout::rm(n, c, c).t(),
                c: MatLayout::rm(rows, n, n),
            };
            dev.matmul(&on.s, mm, x.view(), w.view(), y.view_mut())?;
            vec![on.out("y", &y)?]
        }
        Op::MatmulDyW => {
            let dy = on.up(&rng.vec(rows * n, 1.0), "dy")?;
            let w = on.up(&rng.vec(n * c, 0.05), "w")?;
            let mut dx = on.zeros::<f32>(rows * c, "dx")?;
            let mm = MatMul {
                alpha: 1.0,
                beta: 0.0,
                a: MatLayout::rm(rows, n, n),
                b: MatLayout::rm(n, c, c),
                c: MatLayout::rm(rows, c, c),
            };
            dev.matmul(&on.s, mm, dy.view(), w.view(), dx.view_mut())?;
            vec![on.out("dx", &dx)?]
        }
        Op::MatmulDytXAcc => {
            let dy = on.up(&rng.vec(rows * n, 1.0), "dy")?;
            let x = on.up(&rng.vec(rows * c, 1.0), "x")?;
            let mut dw = on.up(&rng.vec(n * c, 1.0), "dw")?;
            let mm = MatMul {
                alpha: 1.0,
                beta: 1.0,
                a: MatLayout::rm(rows, n, n).t(),
                b: MatLayout::rm(rows, c, c),
                c: MatLayout::rm(n, c, c),
            };
            dev.matmul(&on.s, mm, dy.view(), x.view(), dw.view_mut())?;
            vec![on.out("dw", &dw)?]
        }
        Op::LnFwd => {
            let x = on.up(&rng.vec_offset(rows * c, 2.0, 0.5), "x")?;
            let w = on.up(&rng.vec_offset(c, 0.1, 1.0), "w")?;
            let b = on.up(&rng.vec(c, 0.1), "b")?;
            let mut out = on.zeros::<f32>(rows * c, "out")?;
            let mut mean = on.zeros::<f32>(rows, "mean")?;
            let mut rstd = on.zeros::<f32>(rows, "rstd")?;
            let o = LayerNormOut {
                out: out.view_mut(),
                mean: mean.view_mut(),
                rstd: rstd.view_mut(),
            };
            dev.layernorm_forward(&on.s, o, x.view(), w.view(), b.view(), c)?;
            vec![
                on.out("out", &out)?,
                on.out("mean", &mean)?,
                on.out("rstd", &rstd)?,
            ]
        }
        Op::LnBwd => {
            let xh = rng.vec_offset(rows * c, 2.0, 0.5);
            let (mut mh, mut rh) = (vec![0f32; rows], vec![0f32; rows]);
            for (r, row) in xh.chunks(c).enumerate() {
                let m = row.iter().map(|&v| f64::from(v)).sum::<f64>() / c as f64;
                let var = row.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / c as f64;
                mh[r] = m as f32;
                rh[r] = (1.0 / (var + 1e-5).sqrt()) as f32;
            }
            let x = on.up(&xh, "x")?;
            let w = on.up(&rng.vec_offset(c, 0.1, 1.0), "w")?;
            let mean = on.up(&mh, "mean")?;
            let rstd = on.up(&rh, "rstd")?;
            let dout = on.up(&rng.vec(rows * c, 1.0), "dout")?;
            let mut dx = on.up(&rng.vec(rows * c, 1.0), "dx")?;
            let mut dw = on.up(&rng.vec(c, 1.0), "dw")?;
            let mut db = on.up(&rng.vec(c, 1.0), "db")?;
            let g = LayerNormGrads {
                dx: dx.view_mut(),
                dw: dw.view_mut(),
                db: db.view_mut(),
            };
            let saved = LayerNormSaved {
                x: x.view(),
                w: w.view(),
                mean: mean.view(),
                rstd: rstd.view(),
            };
            dev.layernorm_backward(&on.s, g, dout.view(), saved, c)?;
            vec![on.out("dx", &dx)?, on.out("dw", &dw)?, on.out("db", &db)?]
        }
        Op::RmsFwd => {
            let x = on.up(&rng.vec_offset(rows * c, 2.0, 0.5), "x")?;
            let w = on.up(&rng.vec_offset(c, 0.1, 1.0), "w")?;
            let mut out = on.zeros::<f32>(rows * c, "out")?;
            let mut rstd = on.zeros::<f32>(rows, "rstd")?;
            dev.rmsnorm_forward(
                &on.s,
                out.view_mut(),
                rstd.view_mut(),
                x.view(),
                w.view(),
                c,
                1e-5,
            )?;
            vec![on.out("out", &out)?, on.out("rstd", &rstd)?]
        }
        Op::RmsBwd => {
            let xh = rng.vec_offset(rows * c, 2.0, 0.5);
            let rh: Vec<f32> = xh
                .chunks(c)
                .map(|row| {
                    let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / c as f64;
                    (1.0 / (ms + 1e-5).sqrt()) as f32
                })
                .collect();
            let x = on.up(&xh, "x")?;
            let w = on.up(&rng.vec_offset(c, 0.1, 1.0), "w")?;
            let rstd = on.up(&rh, "rstd")?;
            let dout = on.up(&rng.vec(rows * c, 1.0), "dout")?;
            let mut dx = on.up(&rng.vec(rows * c, 1.0), "dx")?;
            let mut dw = on.up(&rng.vec(c, 1.0), "dw")?;
            dev.rmsnorm_backward(
                &on.s,
                dx.view_mut(),
                dw.view_mut(),
                dout.view(),
                x.view(),
                w.view(),
                rstd.view(),
                c,
            )?;
            vec![on.out("dx", &dx)?, on.out("dw", &dw)?]
        }
        Op::RopeFwd => {
            let rs = s.rope();
            let q = on.up(&rng.vec(rows * rs.c(), 1.0), "q")?;
            let k = on.up(&rng.vec(rows * rs.c_kv(), 1.0), "k")?;
            let v = on.up(&rng.vec(rows * rs.c_kv(), 1.0), "v")?;
            let mut qkv = on.zeros::<f32>(rows * 3 * rs.c(), "qkv")?;
            dev.rope_gqa_forward(&on.s, qkv.view_mut(), q.view(), k.view(), v.view(), rs)?;
            vec![on.out("qkv", &qkv)?]
        }
        Op::RopeBwd => {
            let rs = s.rope();
            let dqkv = on.up(&rng.vec(rows * 3 * rs.c(), 1.0), "dqkv")?;
            let mut dq = on.zeros::<f32>(rows * rs.c(), "dq")?;
            let mut dk = on.zeros::<f32>(rows * rs.c_kv(), "dk")?;
            let mut dv = on.zeros::<f32>(rows * rs.c_kv(), "dv")?;
            dev.rope_gqa_backward(
                &on.s,
                dq.view_mut(),
                dk.view_mut(),
                dv.view_mut(),
                dqkv.view(),
                rs,
            )?;
            vec![on.out("dq", &dq)?, on.out("dk", &dk)?, on.out("dv", &dv)?]
        }
        Op::SwigluFwd => {
            let a = on.up(&rng.vec(rows * n, 8.0), "a")?;
            let b = on.up(&rng.vec(rows * n, 1.0), "b")?;
            let mut out = on.zeros::<f32>(rows * n, "out")?;
            dev.swiglu_forward(&on.s, out.view_mut(), a.view(), b.view())?;
            vec![on.out("out", &out)?]
        }
        Op::SwigluBwd => {
            let a = on.up(&rng.vec(rows * n, 8.0), "a")?;
            let b = on.up(&rng.vec(rows * n, 1.0), "b")?;
            let dout = on.up(&rng.vec(rows * n, 1.0), "dout")?;
            let mut da = on.zeros::<f32>(rows * n, "da")?;
            let mut db = on.zeros::<f32>(rows * n, "db")?;
            dev.swiglu_backward(
                &on.s,
                da.view_mut(),
                db.view_mut(),
                dout.view(),
                a.view(),
                b.view(),
            )?;
            vec![on.out("da", &da)?, on.out("db", &db)?]
        }
        Op::GeluFwd => {
            let x = on.up(&rng.vec(rows * n, 4.0), "x")?;
            let mut out = on.zeros::<f32>(rows * n, "out")?;
            dev.gelu_forward(&on.s, out.view_mut(), x.view())?;
            vec![on.out("out", &out)?]
        }
        Op::GeluBwd => {
            let x = on.up(&rng.vec(rows * n, 4.0), "x")?;
            let mut d = on.up(&rng.vec(rows * n, 1.0), "d")?;
            dev.gelu_backward(&on.s, d.view_mut(), x.view())?;
            vec![on.out("d", &d)?]
        }
        Op::AttnFwd | Op::AttnFwdProducts => {
            let shape = AttnShape {
                b: s.b,
                t,
                c,
                h: s.h,
            };
            let qkv = on.up(&rng.vec(rows * 3 * c, 1.0), "qkv")?;
            let mut y = on.zeros::<f32>(rows * c, "y")?;
            let mut p = on.zeros::<f32>(s.b * s.h * t * t, "p")?;
            dev.attention_forward(&on.s, y.view_mut(), p.view_mut(), qkv.view(), shape)?;
            vec![on.out("y", &y)?, on.out("p", &p)?]
        }
        Op::AttnBwd | Op::AttnBwdProducts => {
            let shape = AttnShape {
                b: s.b,
                t,
                c,
                h: s.h,
            };
            let qkv = on.up(&rng.vec(rows * 3 * c, 1.0), "qkv")?;
            let p = on.up(&prob_rows(&mut rng, s.b * s.h * t, t, Some(t)), "p")?;
            let dy = on.up(&rng.vec(rows * c, 1.0), "dy")?;
            let mut dqkv = on.zeros::<f32>(rows * 3 * c, "dqkv")?;
            let mut scratch = on.zeros::<f32>(t * t, "scratch")?;
            dev.attention_backward(
                &on.s,
                dqkv.view_mut(),
                scratch.view_mut(),
                dy.view(),
                p.view(),
                qkv.view(),
                shape,
            )?;
            vec![on.out("dqkv", &dqkv)?]
        }
        Op::XentFwd => {
            let mut logits = on.up(&rng.vec(rows * s.v, 8.0), "logits")?;
            let targets = on.up(&rng.ids(rows, s.v), "targets")?;
            let mut losses = on.zeros::<f32>(rows, "losses")?;
            dev.softmax_xent_forward(
                &on.s,
                logits.view_mut(),
                losses.view_mut(),
                targets.view(),
                s.v,
            )?;
            vec![on.out("probs", &logits)?, on.out("losses", &losses)?]
        }
        Op::XentBwd => {
            let mut probs = on.up(&prob_rows(&mut rng, rows, s.v, None), "probs")?;
            let targets = on.up(&rng.ids(rows, s.v), "targets")?;
            let scale = 1.0 / rows as f32;
            dev.softmax_xent_backward(&on.s, probs.view_mut(), targets.view(), s.v, scale)?;
            vec![on.out("dlogits", &probs)?]
        }
        Op::Mean => {
            let src = on.up(&rng.vec_offset(rows, 1.0, 3.0), "src")?;
            let mut dst = on.zeros::<f32>(1, "dst")?;
            dev.mean(&on.s, dst.view_mut(), src.view())?;
            vec![on.out("mean", &dst)?]
        }
        Op::FillRows | Op::AddRows | Op::BiasBwd => {
            let mut out = on.up(&rng.vec(rows * c, 1.0), "out")?;
            let mut row = on.up(&rng.vec(c, 1.0), "row")?;
            match op {
                Op::FillRows => dev.fill_rows(&on.s, out.view_mut(), row.view())?,
                Op::AddRows => dev.add_rows(&on.s, out.view_mut(), row.view())?,
                _ => {
                    dev.bias_backward(&on.s, row.view_mut(), out.view())?;
                    return Ok(vec![on.out("db", &row)?]);
                }
            }
            vec![on.out("out", &out)?]
        }
        Op::GatherRows | Op::ScatterAddRows => {
            let ids = on.up(&rng.ids(rows, tv), "ids")?;
            let mut table = on.up(&rng.vec(tv * c, 1.0), "table")?;
            let mut rowsb = on.up(&rng.vec(rows * c, 1.0), "rows")?;
            if op == Op::GatherRows {
                dev.gather_rows(&on.s, rowsb.view_mut(), ids.view(), table.view(), c)?;
                vec![on.out("out", &rowsb)?]
            } else {
                dev.scatter_add_rows(&on.s, table.view_mut(), ids.view(), rowsb.view(), c)?;
                vec![on.out("dtable", &table)?]
            }
        }
        Op::GatherRowsBlock | Op::ScatterAddRowsBlock => {
            let (first, nb) = (tv / 4, tv / 2);
            let ids = on.up(&rng.ids(rows, tv), "ids")?;
            let mut block = on.up(&rng.vec(nb * c, 1.0), "block")?;
            let mut rowsb = on.up(&rng.vec(rows * c, 1.0), "rows")?;
            if op == Op::GatherRowsBlock {
                dev.gather_rows_block(&on.s, rowsb.view_mut(), ids.view(), block.view(), first, c)?;
                vec![on.out("out", &rowsb)?]
            } else {
                dev.scatter_add_rows_block(
                    &on.s,
                    block.view_mut(),
                    ids.view(),
                    rowsb.view(),
                    first,
                    c,
                )?;
                vec![on.out("dblock", &block)?]
            }
        }
        Op::AddPeriodicRows | Op::PeriodicRowsBwd => {
            let mut table = on.up(&rng.vec(t * c, 1.0), "table")?;
            let mut rowsb = on.up(&rng.vec(rows * c, 1.0), "rows")?;
            if op == Op::AddPeriodicRows {
                dev.add_periodic_rows(&on.s, rowsb.view_mut(), table.view(), t, c)?;
                vec![on.out("out", &rowsb)?]
            } else {
                dev.periodic_rows_backward(&on.s, table.view_mut(), rowsb.view(), t, c)?;
                vec![on.out("dtable", &table)?]
            }
        }
        Op::ShiftFwd | Op::ShiftBwd => {
            let x = on.up(&rng.vec(rows * c, 1.0), "x")?;
            let mut out = on.up(&rng.vec(rows * c, 1.0), "out")?;
            if op == Op::ShiftFwd {
                dev.shift_rows_forward(&on.s, out.view_mut(), x.view(), t, c)?;
            } else {
                dev.shift_rows_backward(&on.s, out.view_mut(), x.view(), t, c)?;
            }
            vec![on.out("out", &out)?]
        }
        Op::Add | Op::Scale => {
            let src = on.up(&rng.vec(rows * c, 1.0), "src")?;
            let mut dst = on.up(&rng.vec(rows * c, 1.0), "dst")?;
            if op == Op::Add {
                dev.add(&on.s, dst.view_mut(), src.view())?;
            } else {
                dev.scale(&on.s, dst.view_mut(), 0.37)?;
            }
            vec![on.out("dst", &dst)?]
        }
        Op::CastF32Bf16 | Op::CastF32F16 => {
            let src = on.up(&rng.wide(rows * c), "src")?;
            if op == Op::CastF32Bf16 {
                let mut dst = on.zeros::<bf16>(rows * c, "dst")?;
                dev.cast::<f32, bf16>(&on.s, src.view(), dst.view_mut())?;
                vec![Out {
                    name: "dst",
                    vals: f64s(&on.down(&dst)?),
                }]
            } else {
                let mut dst = on.zeros::<f16>(rows * c, "dst")?;
                dev.cast::<f32, f16>(&on.s, src.view(), dst.view_mut())?;
                vec![Out {
                    name: "dst",
                    vals: f64s(&on.down(&dst)?),
                }]
            }
        }
        Op::CastBf16F32 => {
            let h: Vec<bf16> = rng.wide(rows * c).into_iter().map(bf16::from_f32).collect();
            let src = on.up(&h, "src")?;
            let mut dst = on.zeros::<f32>(rows * c, "dst")?;
            dev.cast::<bf16, f32>(&on.s, src.view(), dst.view_mut())?;
            vec![on.out("dst", &dst)?]
        }
        Op::AccumBf16IntoF32 => {
            let h: Vec<bf16> = rng
                .vec(rows * c, 1.0)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            let src = on.up(&h, "src")?;
            let mut dst = on.up(&rng.vec(rows * c, 1.0), "dst")?;
            dev.accumulate::<bf16, f32>(&on.s, dst.view_mut(), src.view())?;
            vec![on.out("dst", &dst)?]
        }
        Op::AccumF32IntoBf16 => {
            let h: Vec<bf16> = rng
                .vec(rows * c, 1.0)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            let mut dst = on.up(&h, "dst")?;
            let src = on.up(&rng.vec(rows * c, 1.0), "src")?;
            dev.accumulate::<f32, bf16>(&on.s, dst.view_mut(), src.view())?;
            vec![Out {
                name: "dst",
                vals: f64s(&on.down(&dst)?),
            }]
        }
        Op::QuantizeF32 | Op::DequantizeBf16 | Op::Quantize4F32 | Op::Dequantize4Bf16 => {
            let int4 = matches!(op, Op::Quantize4F32 | Op::Dequantize4Bf16);
            // A last block shorter than the rest; magnitudes that differ per block.
            let len = rows * n + 5;
            let block = zero_kernels::quant::DEFAULT_BLOCK;
            let ns = zero_kernels::quant::scale_count(len, block);
            // Special blocks: all tiny (127 / amax overflows: zeros), one NaN, one infinity.
            let mut xs = rng.wide(len);
            if len > 3 * block {
                xs[..block].iter_mut().for_each(|v| *v *= 1e-38);
                xs[block + 3] = f32::NAN;
                xs[2 * block + 7] = f32::NEG_INFINITY;
            }
            let x = on.up(&xs, "x")?;
            let code_bytes = if int4 {
                zero_kernels::quant::code_bytes_int4(len)
            } else {
                len
            };
            let mut codes = on.zeros::<u8>(code_bytes, "codes")?;
            let mut scales = on.zeros::<f32>(ns, "scales")?;
            let (x, q, s) = (x.view(), codes.view_mut(), scales.view_mut());
            if int4 {
                dev.quantize_int4::<f32>(&on.s, x, block, q, s)?;
            } else {
                dev.quantize_int8::<f32>(&on.s, x, block, q, s)?;
            }
            if matches!(op, Op::QuantizeF32 | Op::Quantize4F32) {
                // int8: the signed codes; int4: the bytes of two codes each.
                let codes: Vec<f64> = on
                    .down(&codes)?
                    .iter()
                    .map(|&b| {
                        if int4 {
                            f64::from(b)
                        } else {
                            f64::from(b as i8)
                        }
                    })
                    .collect();
                vec![
                    Out {
                        name: "codes",
                        vals: codes,
                    },
                    Out {
                        name: "scales",
                        vals: f64s(&on.down(&scales)?),
                    },
                ]
            } else {
                let mut back = on.zeros::<bf16>(len, "back")?;
                let (q, s, out) = (codes.view(), scales.view(), back.view_mut());
                if int4 {
                    dev.dequantize_int4::<bf16>(&on.s, q, s, block, out)?;
                } else {
                    dev.dequantize_int8::<bf16>(&on.s, q, s, block, out)?;
                }
                vec![Out {
                    name: "values",
                    vals: f64s(&on.down(&back)?),
                }]
            }
        }
        Op::GradStatsF32 | Op::GradStatsBf16Inf => {
            let mut out = on.zeros::<f64>(2, "stats")?;
            if op == Op::GradStatsF32 {
                let g = on.up(&rng.wide(rows * n), "grad")?;
                dev.grad_stats::<f32>(&on.s, g.view(), 0.5, out.view_mut())?;
            } else {
                let mut h: Vec<bf16> = rng
                    .vec(rows * n, 3.0)
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect();
                let at = h.len() / 3;
                h[at] = bf16::INFINITY;
                let g = on.up(&h, "grad")?;
                dev.grad_stats::<bf16>(&on.s, g.view(), 0.5, out.view_mut())?;
            }
            let v = on.down(&out)?;
            vec![
                Out {
                    name: "sum_sq",
                    vals: vec![v[0]],
                },
                Out {
                    name: "overflow",
                    vals: vec![v[1]],
                },
            ]
        }
        Op::AdamW => {
            let len = rows * n;
            let g: Vec<bf16> = rng.vec(len, 0.1).into_iter().map(bf16::from_f32).collect();
            let grad = on.up(&g, "grad")?;
            let mut master = on.up(&rng.vec(len, 1.0), "master")?;
            let mut m = on.up(&rng.vec(len, 0.01), "m")?;
            let vh: Vec<f32> = rng.vec(len, 1e-4).into_iter().map(f32::abs).collect();
            let mut v = on.up(&vh, "v")?;
            let mut param = on.zeros::<bf16>(len, "param")?;
            let groups = [AdamWHyper::default()];
            let segments = [
                AdamWSegment {
                    range: 0..len / 2,
                    group: 0,
                    decay: true,
                },
                AdamWSegment {
                    range: len / 2..len,
                    group: 0,
                    decay: false,
                },
            ];
            let step = AdamWStep {
                groups: &groups,
                segments: &segments,
                t: 7,
                grad_scale: 0.25,
            };
            let state = AdamWViews {
                master: master.view_mut(),
                m: m.view_mut(),
                v: v.view_mut(),
            };
            dev.adamw::<bf16, bf16>(&on.s, &step, grad.view(), state, Some(param.view_mut()))?;
            vec![
                on.out("master", &master)?,
                on.out("m", &m)?,
                on.out("v", &v)?,
                Out {
                    name: "param",
                    vals: f64s(&on.down(&param)?),
                },
            ]
        }
    };
    Ok(outs)
}

/// Judge one op's outputs against the reference's.
fn judge(check: Check, got: &[Out], want: &[Out], tol: Tol, why: &str) -> Check {
    let mut worst_rel = 0f64;
    let mut differ = 0usize;
    let mut total = 0usize;
    let mut parts = Vec::new();
    for (g, w) in got.iter().zip(want) {
        let d = diff(&g.vals, &w.vals);
        worst_rel = worst_rel.max(d.rel);
        differ += d.differ;
        total += d.len;
        parts.push(serde_json::json!({
            "output": g.name, "elements": d.len, "differ": d.differ, "rel": figure(d.rel),
        }));
    }
    let check = check.with_data(serde_json::Value::Array(parts));
    match tol {
        Tol::Bitwise => check.at_most(
            differ as f64,
            0.0,
            format!(
                "bitwise: {differ} of {total} elements differ (max|d|/max|ref| {worst_rel:.1e}; {why})"
            ),
        ),
        Tol::Rel(limit) => check.at_most(
            worst_rel,
            limit,
            format!("max|d|/max|ref| {worst_rel:.2e} <= {limit:.0e} ({why})"),
        ),
    }
}

/// Check every op of `dut` against `reference` at shape `s` (group `kernel`).
pub fn check_all<D: BenchDevice, R: Device>(
    dut: &D,
    reference: &R,
    against: Against,
    s: &Shape,
    report: &mut Report,
) -> anyhow::Result<()> {
    check_ops(dut, reference, against, s, "kernel", &Op::ALL, report)
}

/// Check `ops` of `dut` against `reference` at shape `s`, as checks of `group`.
pub fn check_ops<D: BenchDevice, R: Device>(
    dut: &D,
    reference: &R,
    against: Against,
    s: &Shape,
    group: &'static str,
    ops: &[Op],
    report: &mut Report,
) -> anyhow::Result<()> {
    for (i, &op) in ops.iter().enumerate() {
        let started = Instant::now();
        let seed = 0x6b65_726e_0000 + i as u64;
        let check = Check::new(group, op.name(s), Kind::Correctness);
        report.start(format!("{group}/{}", check.name))?;
        let (tol, why) = op.tolerance(against);
        // The products attention runs on the device under test only (the reference
        // computes the rows kernels' semantics either way).
        let products = matches!(op, Op::AttnFwdProducts | Op::AttnBwdProducts);
        let before = if products {
            dut.set_attention_kernels(AttentionKernels::Products)
        } else {
            None
        };
        let mut check = if op == Op::MatmulBf16 && !dut.set_bf16_products(true) {
            check.skip("this device has no bf16 matrix-product mode")
        } else if products && before.is_none() {
            check.skip("this device has one kind of attention kernels")
        } else {
            let got = run_op(dut, op, s, seed, false);
            if op == Op::MatmulBf16 {
                dut.set_bf16_products(false);
            }
            if let Some(k) = before {
                dut.set_attention_kernels(k);
            }
            match (got, run_op(reference, op, s, seed, op == Op::MatmulBf16)) {
                (Ok(got), Ok(want)) => judge(check, &got, &want, tol, why),
                (Err(e), _) => check.fail(format!("device under test: {e}")),
                (_, Err(e)) => check.fail(format!("reference: {e}")),
            }
        };
        check.seconds = started.elapsed().as_secs_f64();
        report.add(check)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zero_kernels::device::HostDevice;

    /// The comparison is not vacuous: other inputs fail both kinds of tolerance, the
    /// same inputs pass bitwise.
    #[test]
    fn judge_tells_equal_from_different() {
        let dev = HostDevice::new();
        let s = Shape::QUICK;
        let a = run_op(&dev, Op::LnFwd, &s, 1, false).unwrap();
        let same = run_op(&dev, Op::LnFwd, &s, 1, false).unwrap();
        let other = run_op(&dev, Op::LnFwd, &s, 2, false).unwrap();
        let new = || Check::new("kernel", "ln", Kind::Correctness);
        use super::super::report::Status;
        assert_eq!(judge(new(), &same, &a, Tol::Bitwise, "").status, Status::Ok);
        assert_eq!(
            judge(new(), &other, &a, Tol::Bitwise, "").status,
            Status::Fail
        );
        assert_eq!(
            judge(new(), &other, &a, Tol::Rel(1e-5), "").status,
            Status::Fail
        );
    }

    /// The bf16 reference rounds the product's inputs: close to, not equal to, fp32.
    #[test]
    fn bf16_reference_rounds_the_inputs() {
        let dev = HostDevice::new();
        let s = Shape::QUICK;
        let f = run_op(&dev, Op::MatmulBf16, &s, 3, false).unwrap();
        let b = run_op(&dev, Op::MatmulBf16, &s, 3, true).unwrap();
        let d = diff(&b[0].vals, &f[0].vals);
        assert!(d.differ > 0 && d.rel < 1e-2, "{d:?}");
    }
}
