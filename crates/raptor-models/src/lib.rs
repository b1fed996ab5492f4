//! raptor-models: MoE and dense transformers on libtorch (see the crate README).

/// Whether this build force-linked libtorch's CUDA libraries (the libtorch in use has
/// `libtorch_cuda.so`). When true, `tch::Cuda::is_available()` reports the GPU at run time.
pub const CUDA_LINKED: bool = cfg!(raptor_cuda_linked);
