//! Host kernels of the model layers: the CPU implementations of every op a language model
//! calls between (and including) its matrix multiplies, over plain slices, generic over
//! the compute scalar ([`Scalar`]: f32 for training, f64 for the reference that gradient
//! checks hold the f32 code against). A device runs them as its CPU ops; the GPT-2 of
//! zero-models is written on them.
//!
//! - [`gemm`]: `C = alpha * A B + beta * C` over strided views ([`MatLayout`]), with
//!   threads over row bands ([`Gemm`]); [`sgemm`]: its f32 kernels (AVX-512F, AVX2 + FMA,
//!   `matrixmultiply`); [`gemm_bf16`]: the same product with bf16 operands and f32 sums
//!   (AMX, AVX-512 BF16, AVX2 or portable), for bf16 training;
//! - [`norm`]: LayerNorm; [`activation`]: GELU (tanh approximation);
//! - Llama's: [`rmsnorm`], [`rope`] (rotary embeddings and GQA's shared key/value heads
//!   into the packed qkv of [`attention`]), [`swiglu`] (the gated MLP's elementwise part);
//! - [`softmax`]: the causal row softmax; [`attention`]: causal multi-head attention over
//!   a packed qkv, in query bands;
//! - [`xent`]: softmax cross-entropy of a classifier and the mean loss;
//! - [`rows`]: biases, embedding gather/scatter, position tables, a causal token shift,
//!   elementwise sums.
//!
//! Conventions:
//!
//! - Buffers are **row-major**; shapes are named as in llm.c's `train_gpt2.c`: B rows
//!   (sequences) per micro-batch, T tokens per sequence, C channels, H heads, V classes
//!   (vocabulary); `[B, T, C]` is B*T rows of C.
//! - Every backward function says for each output whether it **writes** it or **adds**
//!   (`+=`) into it. Parameter gradients are always added (gradient accumulation);
//!   gradients of activations are written or added as documented.
//! - Shapes that disagree, slices too short and ids past a table panic: they are bugs of
//!   the calling layer, never user input (models validate token ids when a batch comes
//!   in). Nothing here is `unsafe` except the GEMM call, whose views are bounds-checked
//!   first.
//! - Levels: a CPU device runs these functions compiled for its instruction-set level
//!   (`isa_ops`), which is why the op bodies and the helpers they call are
//!   `#[inline(always)]`; called directly, they run as the crate was built (baseline).
//! - Numerics: each function is a fixed sequence of IEEE operations, the same on every
//!   call and thread count, and no function here but the GEMMs uses a fused multiply-add.
//!   The GEMM ([`sgemm`]: this crate's AVX-512F or AVX2 + FMA kernel, else
//!   `matrixmultiply`'s, chosen at run time) depends on the CPU, so unlike the
//!   optimizer kernels of this crate, results that go through a GEMM are reproducible on
//!   one kind of CPU, not bitwise across instruction set levels.

pub mod activation;
pub mod attention;
pub mod gemm;
pub mod gemm_bf16;
pub(crate) mod isa_ops;
pub mod norm;
pub mod rmsnorm;
pub mod rope;
pub mod rows;
pub mod scalar;
pub mod sgemm;
#[cfg(target_arch = "x86_64")]
mod sgemm_avx2;
pub mod softmax;
pub mod swiglu;
#[cfg(test)]
mod testvals;
pub mod xent;

pub use activation::{gelu_backward_inplace, gelu_forward};
pub use attention::{attention_backward, attention_forward, AttnShape};
pub use gemm::{Gemm, MatLayout};
pub use norm::{layernorm_backward, layernorm_forward, LN_EPS};
pub use rmsnorm::{rmsnorm_backward, rmsnorm_forward, RMS_EPS};
pub use rope::{rope_gqa_backward, rope_gqa_forward, RopeShape};
pub use rows::{
    add_into, add_periodic_rows, add_rows, bias_backward, fill_rows, gather_rows,
    gather_rows_block, periodic_rows_backward, scale_into, scatter_add_rows,
    scatter_add_rows_block, shift_rows_backward, shift_rows_forward,
};
pub use scalar::{exp_f32, tanh_f32, Scalar};
pub use softmax::{softmax_row_backward_inplace, softmax_row_inplace};
pub use swiglu::{swiglu_backward, swiglu_forward};
pub use xent::{mean_f64, mean_into, softmax_xent_backward, softmax_xent_forward};

/// Elements of a buffer of the shape `dims` (their product); `None` when the product of
/// the nonzero dims overflows `usize`. Zeros are skipped rather than short-circuiting, so
/// an empty batch of an impossible shape is refused as well: kernels derive sizes such
/// as `T * 3C` from the dims without a batch factor to make them 0.
pub(crate) fn checked_elems(dims: &[usize]) -> Option<usize> {
    let mut n: usize = 1;
    let mut empty = false;
    for &d in dims {
        if d == 0 {
            empty = true;
        } else {
            n = n.checked_mul(d)?;
        }
    }
    Some(if empty { 0 } else { n })
}
