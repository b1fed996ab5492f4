//! Durability of a run folder: every file is written to a temporary name, fsynced and renamed
//! ([`write_atomic`]); JSON files that must not be silently corrupted carry the SHA-256 of their
//! content (`write_checked_json`, [`read_checked_json`]); one process at a time holds a run
//! folder ([`RunLock`]); run ids are unique within a process ([`new_run_id`]).

#[allow(clippy::wildcard_imports)]
use super::*;

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    {
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io(path))?;
    Ok(())
}

/// Hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Write `value` as JSON wrapped with the SHA-256 of its canonical form
/// (`{"sha256": …, "content": …}`), atomically.
pub fn write_checked_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let content = serde_json::to_value(value)?;
    let sha = sha256_hex(&serde_json::to_vec(&content)?);
    let wrapped = serde_json::json!({ "sha256": sha, "content": content });
    write_atomic(path, &serde_json::to_vec_pretty(&wrapped)?)
}

/// Read a file written by [`write_checked_json`] (this module's atomic writer), verifying its checksum: a flipped byte or a
/// torn write is an error naming the file, never a silently different ledger or state.
pub fn read_checked_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let corrupt = |why: String| {
        RunError::Run(format!(
            "{} is corrupt ({why}); restore it from a backup or start the run again",
            path.display()
        ))
    };
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("not JSON: {e}")))?;
    let (Some(sha), Some(content)) = (v.get("sha256").and_then(|s| s.as_str()), v.get("content"))
    else {
        return Err(corrupt("no sha256/content fields".into()));
    };
    let found = sha256_hex(&serde_json::to_vec(content)?);
    if found != sha {
        return Err(corrupt(format!(
            "checksum mismatch: recorded {sha}, content hashes to {found}"
        )));
    }
    serde_json::from_value(content.clone()).map_err(|e| corrupt(format!("unexpected content: {e}")))
}

/// Read a checkpoint tensor file, verifying its SHA-256 against the state's.
pub(crate) fn read_checked_tensors(path: &Path, sha: &str) -> Result<Vec<(String, tch::Tensor)>> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let found = sha256_hex(&bytes);
    if found != sha {
        return Err(RunError::Run(format!(
            "{} is corrupt (checksum mismatch: state.json recorded {sha}, the file hashes to {found}); restore it from a backup or start the run again",
            path.display()
        )));
    }
    read_safetensors(path).map_err(Into::into)
}

/// A lock on a run folder (released on drop).
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
}

impl RunLock {
    /// Takes the lock; a second process on the same folder gets an error naming the holder.
    pub fn acquire(dir: &Path) -> Result<Self> {
        let path = dir.join("lock");
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                let _ = writeln!(f, "{}", std::process::id());
                Ok(Self { path })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                let pid = holder.trim();
                let alive = !pid.is_empty() && Path::new(&format!("/proc/{pid}")).exists();
                if alive {
                    Err(RunError::Run(format!(
                        "{} is in use by process {pid} (remove {} if that process is gone)",
                        dir.display(),
                        path.display()
                    )))
                } else {
                    // A stale lock from a process that died: take it over.
                    std::fs::remove_file(&path).map_err(io(&path))?;
                    Self::acquire(dir)
                }
            }
            Err(e) => Err(io(&path)(e)),
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A fresh run id: `<method>-<unix seconds>-<pid>`, with `-<n>` after the first run of the
/// process (unique within the process, whatever the clock).
pub fn new_run_id(method: raptor_train::config::Method) -> String {
    // Runs of one process started within the same second (an audit's two runs, tests) get a
    // sequence number: without it the second would write into the first one's folder.
    static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let base = format!("{method}-{secs}-{}", std::process::id());
    match STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) {
        0 => base,
        n => format!("{base}-{n}"),
    }
}
