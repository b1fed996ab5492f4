// Shared build-script logic (included by the `build.rs` of every crate whose binaries link
// libtorch: raptor-models, raptor-optim, raptor-train, raptor-reproduce, raptor-benches).
//
// Force-link libtorch's CUDA libraries when the libtorch in use has them.
//
// torch-sys emits `-ltorch_cuda`, but nothing in a Rust binary references a symbol of
// `libtorch_cuda.so` directly (its kernels register themselves from static initializers), so
// the linker's `--as-needed` default drops it, and `tch::Cuda::is_available()` is then false
// even on a GPU machine. rustc's `-as-needed` link modifier is still unstable, and
// `cargo:rustc-link-arg` only reaches the package's own binaries, tests, benches and examples,
// so every crate that produces such binaries includes this file from its `build.rs` and emits
//
//     -Wl,--push-state,--no-as-needed,-ltorch_cuda,-lc10_cuda,--pop-state
//
// which keeps `libtorch_cuda.so` in the binary's NEEDED list wherever the argument lands on the
// linker command line. The libtorch library folder comes from torch-sys (`links = "tch"`,
// exported to direct dependents as `DEP_TCH_LIBTORCH_LIB`), which is why these crates depend
// on torch-sys directly.

#[allow(dead_code)]
fn link_cuda_if_present() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rustc-check-cfg=cfg(raptor_cuda_linked)");
    let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB").map(std::path::PathBuf::from) else {
        return;
    };
    rpath_libtorch(&lib);
    let present: Vec<&str> = ["torch_cuda", "c10_cuda"]
        .into_iter()
        .filter(|name| lib.join(format!("lib{name}.so")).exists())
        .collect();
    if present.is_empty() {
        return;
    }
    let libs: Vec<String> = present.iter().map(|n| format!("-l{n}")).collect();
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!(
        "cargo:rustc-link-arg=-Wl,--push-state,--no-as-needed,{},--pop-state",
        libs.join(",")
    );
    println!("cargo:rustc-cfg=raptor_cuda_linked");
}

/// An absolute rpath to the libtorch in use, for the binaries that run away from `target/`:
/// rustdoc links and runs doc tests in a temporary folder, where the relative `$ORIGIN` rpath of
/// `.cargo/config.toml` cannot reach `target/libtorch` (cargo's `[env]` does not reach them
/// either). Build-script link arguments do reach doc tests, so plain `cargo test` (doc tests
/// included) works after `cargo xtask setup` with nothing to export.
fn rpath_libtorch(lib: &std::path::Path) {
    let abs = lib.canonicalize().unwrap_or_else(|_| lib.to_path_buf());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", abs.display());
}

/// Build scripts of crates whose libtorch path is an optional feature (raptor-clip,
/// raptor-muon): the rpath only, when torch-sys is linked.
#[allow(dead_code)]
fn rpath_libtorch_if_linked() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB").map(std::path::PathBuf::from) {
        rpath_libtorch(&lib);
    }
}

/// Build scripts of crates that never depend on torch-sys themselves but whose doc tests can
/// still link libtorch through workspace feature unification (raptor-cli and raptor-config:
/// `cargo test --workspace --doc` builds raptor-routing and raptor-muon with their `tch`
/// feature): the rpath from `LIBTORCH`
/// (which `.cargo/config.toml` sets to `target/libtorch`), when that folder has a `lib/`.
#[allow(dead_code)]
fn rpath_libtorch_from_env() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Some(dir) = std::env::var_os("LIBTORCH").map(std::path::PathBuf::from) {
        let lib = dir.join("lib");
        if lib.is_dir() {
            rpath_libtorch(&lib);
        }
    }
}
