//! An absolute rpath to libtorch for doc tests when the workspace build links it in through
//! feature unification (see `build-support/link_cuda.rs`); raptor-config itself has no libtorch.
include!("../../build-support/link_cuda.rs");

fn main() {
    rpath_libtorch_from_env();
}
