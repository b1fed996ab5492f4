//! Force-link libtorch's CUDA libraries when present; see `build-support/link_cuda.rs`.
include!("../../build-support/link_cuda.rs");

/// The version of `tch` in the workspace's Cargo.lock (what this build compiles against).
fn tch_version() -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let lock = std::path::Path::new(&dir).join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(lock).ok()?;
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.trim() == "name = \"tch\"" {
            let v = lines.next()?.trim().strip_prefix("version = \"")?;
            return Some(v.trim_end_matches('"').to_string());
        }
    }
    None
}

fn main() {
    link_cuda_if_present();
    println!(
        "cargo:rustc-env=RAPTOR_TCH_VERSION={}",
        tch_version().unwrap_or_else(|| "unknown".into())
    );
}
