//! Folders the tests of several crates look in.

use std::path::{Path, PathBuf};

/// The workspace root: the folder holding `Cargo.toml`, `crates/` and `fixtures/`.
pub fn workspace_root() -> PathBuf {
    // This crate is `crates/raptor-testkit`, two levels below the root.
    let kit = Path::new(env!("CARGO_MANIFEST_DIR"));
    kit.ancestors()
        .nth(2)
        .map_or_else(|| kit.join("../.."), Path::to_path_buf)
}

/// `fixtures/<relative>` under the workspace root.
pub fn fixture(relative: impl AsRef<Path>) -> PathBuf {
    workspace_root().join("fixtures").join(relative)
}

/// The folder of real data sets that are not in the repository (E2E, DART, …):
/// `$RAPTOR_SHARED_DATA` when set, else `shared/data` in the nearest folder above the workspace
/// root that has one (beside the checkout, or beside the checkout a git worktree hangs off).
/// `None` when there is none: the tests that need it print one `skipped …` line and pass.
pub fn shared_data_dir() -> Option<PathBuf> {
    std::env::var_os("RAPTOR_SHARED_DATA")
        .map(PathBuf::from)
        .or_else(|| {
            workspace_root()
                .ancestors()
                .skip(1)
                .map(|a| a.join("shared/data"))
                .find(|p| p.is_dir())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_holds_the_workspace() {
        let root = workspace_root();
        assert!(root.join("Cargo.toml").is_file(), "{}", root.display());
        assert!(root.join("crates/raptor-testkit/Cargo.toml").is_file());
        assert!(fixture("bad-inputs").is_dir());
    }
}
