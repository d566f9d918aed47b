//! zero-comm: collectives over real MPI for the ZeRO engine.
#![deny(missing_docs)]

pub use zero_kernels::{DType, Element};
