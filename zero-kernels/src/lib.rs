//! zero-kernels: where the bytes of the model state live and the math on them.
//!
//! The lowest layer of zero-rs. It knows nothing of ranks or stages: it holds typed
//! element buffers (host today, CUDA device buffers behind the `cuda` feature) and the
//! memory-bound kernels of an optimizer step:
//!
//! - [`adamw`]: fused mixed-precision AdamW (master, m, v in f32; gradient f32/bf16/f16;
//!   optional 16-bit parameter copy written in the same pass);
//! - [`gradstats`]: unscale + inf/NaN detection + sum of squares in one pass;
//! - [`cast`]: f32 <-> bf16/f16 (round to nearest even) and accumulate into f32;
//! - [`nn`]: host kernels of the model layers (GEMM, LayerNorm, GELU, attention, softmax
//!   cross-entropy, row ops), generic over f32/f64, compiled for the device's level too
//!   (see its docs for their numerics).
//!
//! Every kernel has a scalar `reference` (the test oracle) and vectorised paths chosen at
//! run time ([`Isa`]: AVX-512, AVX2+FMA+F16C or scalar, by `is_x86_feature_detected!`, so
//! a plain `cargo build` takes the fast path; forced through [`Exec`] in tests). The
//! matrix products are the exception below: FMA chains (`nn/sgemm.rs`), the same bits
//! across thread counts but not across kernels, tested against f64 within a bound. The
//! optimizer kernels ([`adamw`], [`gradstats`], [`cast`], [`quant`]) and the
//! elementwise and row ops of [`nn`] are bitwise identical across levels, thread counts
//! and the CUDA kernels:
//!
//! - the same IEEE operations in the same order on every path, and **no fused
//!   multiply-add** in them (a scalar fallback without FMA hardware would need a slow
//!   software `fma`; the kernels are memory-bound, so FMA would buy nothing; the PTX is
//!   built with `--fmad=false` and explicit `_rn` intrinsics);
//! - 16-bit conversions by one bit recipe (round to nearest even, subnormals, inf, NaN);
//! - the sum of squares accumulated in **f64 in a fixed blocked order** (16 lanes per
//!   4096-element block, fixed fold, blocks in order), which threads and GPUs follow too;
//! - NaN results are NaN everywhere, with unspecified payload (LLVM may commute operands).
//!
//! Threads ([`Exec::with_threads`]) are off by default: under MPI every rank owns a core.
//! The [`device`] layer puts buffers, streams, events and every kernel (these and the
//! model's, [`nn`]) behind one trait, with an eager CPU device and a simulated one for
//! tests. CUDA (feature `cuda`): `cuda::CudaDevice`, device buffers, and `cuda` submodules of
//! each kernel; the PTX is checked in (see [`ptx`]).
#![deny(missing_docs)]

pub mod adamw;
pub mod cast;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod dtype;
mod env;
pub mod error;
pub mod float;
pub mod gradstats;
pub mod isa;
pub mod nn;
mod par;
mod pool;
pub mod ptx;
pub mod quant;
mod simd;
pub mod slices;
#[cfg(test)]
mod testutil;
pub mod twin;

pub use dtype::{DType, Element};
pub use error::KernelError;
pub use float::Float;
pub use par::run_parts;

/// Result of a zero-kernels call.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;
pub use isa::{Exec, Isa};
pub use slices::{FloatSlice, HalfSliceMut};
