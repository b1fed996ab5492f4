//! Force-link libtorch's CUDA libraries when present; see `build-support/link_cuda.rs`.
include!("../../build-support/link_cuda.rs");

fn main() {
    link_cuda_if_present();
}
