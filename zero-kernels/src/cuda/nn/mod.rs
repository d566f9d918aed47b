//! Launchers of the CUDA model kernels (`src/nn/cuda/*.cu`): each takes the device, the
//! stream to queue on and raw device addresses (already range- and length-checked by the
//! caller, [`super::CudaDevice`]'s `Device` implementation), and queues one kernel. Each
//! kernel has a CPU twin of the same operation order in [`crate::twin`].

pub(crate) mod attention;
pub(crate) mod elementwise;
pub(crate) mod llama;
pub(crate) mod norm;
pub(crate) mod rows;
pub(crate) mod xent;
