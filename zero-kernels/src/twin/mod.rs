//! CPU twins of the CUDA model kernels: the same arithmetic in the same order as the GPU
//! kernel (its thread layout's reduction trees included), in plain Rust, so that
//!
//! - CI executes the logic of every GPU kernel without a GPU ([`crate::device::SimDevice`]
//!   in its GPU-order mode runs the twins), and
//! - on a GPU the check binary compares each kernel with its twin bit for bit (the PTX is
//!   built with `--fmad=false` and IEEE division and square root, see [`crate::ptx`]).
//!
//! The model twins are generic over [`crate::nn::Scalar`]; for f32 they give the GPU's
//! bits. [`quant`] is the twin of the int4 quantization kernels (generic over
//! [`crate::float::Float`]; it gives the reference's bits, the block maximum being an
//! integer maximum).
//! Their order differs from the vectorised CPU kernels of [`crate::nn`] only in how
//! reductions are grouped, so the two agree to rounding (tested per kernel).

pub mod attention;
pub mod attention_products;
pub mod elementwise;
pub mod llama;
pub mod norm;
pub mod quant;
pub mod reduce;
pub mod rows;
pub mod xent;
