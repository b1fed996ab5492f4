//! Atomic file writes: the bytes go to a temporary file beside the target, which is then
//! renamed over it, so a reader never sees a half-written table or plot.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{ReportError, Result};

/// Distinguishes temporary files of concurrent writers in one process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

fn io_err(path: &Path, source: std::io::Error) -> ReportError {
    ReportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates `dir` and its parents when missing.
pub(crate) fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))
}

/// The temporary file a write of `path` goes through: `.<name>.<pid>.<n>.tmp` beside it.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// Writes `bytes` to `path` atomically (temporary file, flush, rename). The parent folder must
/// exist. The temporary file is removed when anything fails.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut file = std::fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
        file.write_all(bytes).map_err(|e| io_err(&tmp, e))?;
        file.sync_all().map_err(|e| io_err(&tmp, e))?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))
    })();
    if result.is_err() {
        // Best effort: the original error is the one worth reporting.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
