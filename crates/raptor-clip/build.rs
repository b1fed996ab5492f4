//! With the `tch` feature: an absolute rpath to libtorch for doc tests (see
//! `build-support/link_cuda.rs`).
include!("../../build-support/link_cuda.rs");

fn main() {
    rpath_libtorch_if_linked();
}
