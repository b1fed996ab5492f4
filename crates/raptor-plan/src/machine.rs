//! Facts about the machine the process runs on, read at run time: data-cache sizes (from
//! Linux sysfs, `/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}`), the number of
//! hardware threads the process may use, and the CPU model (from `/proc/cpuinfo`, for
//! reports only). Where sysfs is missing (another OS, a container that hides it), conservative
//! generic sizes are used ([`MachineInfo::FALLBACK`]) and [`MachineInfo::source`] says so.

use std::path::Path;
use std::sync::OnceLock;

/// Where the cache sizes of a [`MachineInfo`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSource {
    /// Read from Linux sysfs.
    Sysfs,
    /// Not readable: the generic fallback sizes.
    Fallback,
}

/// Caches and cores of the machine (the caches of CPU 0; sizes in bytes, per instance).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    /// Level-1 data cache of one core.
    pub l1d_bytes: usize,
    /// Level-2 cache (unified or data) of one core.
    pub l2_bytes: usize,
    /// Last-level cache shared by the cores (one instance; equals `l2_bytes` where there is no
    /// third level).
    pub l3_bytes: usize,
    /// Hardware threads available to the process (`std::thread::available_parallelism`).
    pub threads: usize,
    /// CPU model name (`/proc/cpuinfo`), or "unknown".
    pub model: String,
    /// Where the cache sizes came from.
    pub source: CacheSource,
}

impl MachineInfo {
    /// Generic sizes used when nothing can be read: 32 KiB L1d, 512 KiB L2, 8 MiB L3 — at or
    /// below the caches of every x86-64 and ARM server core of the last decade, so blocks
    /// sized from them are never too large (only possibly too small).
    pub const FALLBACK: (usize, usize, usize) = (32 << 10, 512 << 10, 8 << 20);

    /// A short one-line description: `model, L1d 48 KiB, L2 2 MiB, L3 260 MiB, 2 threads`.
    pub fn describe(&self) -> String {
        let src = match self.source {
            CacheSource::Sysfs => "",
            CacheSource::Fallback => " (cache sizes: generic fallback)",
        };
        format!(
            "{}, L1d {}, L2 {}, L3 {}, {} threads{src}",
            self.model,
            human(self.l1d_bytes),
            human(self.l2_bytes),
            human(self.l3_bytes),
            self.threads
        )
    }

    /// A signature of the facts the planner's choices depend on (model, caches, threads); a
    /// wisdom file written on a machine with another signature is not used.
    pub fn signature(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}",
            self.model.replace(['|', '\t', '\n', '\r'], " "),
            self.l1d_bytes,
            self.l2_bytes,
            self.l3_bytes,
            self.threads
        )
    }

    /// Read the caches from a sysfs-like folder holding `index*/{level,type,size}` (the
    /// `cache` folder of one CPU). `None` when no data or unified cache is found there.
    pub fn caches_from_sysfs(cache_dir: &Path) -> Option<(usize, usize, usize)> {
        let mut l1 = None;
        let mut l2 = None;
        let mut l3 = None;
        let entries = std::fs::read_dir(cache_dir).ok()?;
        for e in entries.flatten() {
            let name = e.file_name();
            if !name.to_string_lossy().starts_with("index") {
                continue;
            }
            let dir = e.path();
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
            let Some(level) = read("level").and_then(|s| s.trim().parse::<u32>().ok()) else {
                continue;
            };
            let kind = read("type").unwrap_or_default();
            let kind = kind.trim();
            if kind != "Data" && kind != "Unified" {
                continue;
            }
            let Some(size) = read("size").and_then(|s| parse_size(&s)) else {
                continue;
            };
            let slot = match level {
                1 => &mut l1,
                2 => &mut l2,
                3 | 4 => &mut l3,
                _ => continue,
            };
            *slot = Some(slot.map_or(size, |v: usize| v.max(size)));
        }
        let (f1, _, _) = Self::FALLBACK;
        let l2v = l2.or(l1)?;
        Some((l1.unwrap_or(f1.min(l2v)), l2v, l3.unwrap_or(l2v).max(l2v)))
    }

    /// Detect the machine (uncached; see [`machine`] for the process-wide value).
    pub fn detect() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "unknown".into());
        let sysfs = Path::new("/sys/devices/system/cpu/cpu0/cache");
        let (caches, source) = match Self::caches_from_sysfs(sysfs) {
            Some(c) => (c, CacheSource::Sysfs),
            None => (Self::FALLBACK, CacheSource::Fallback),
        };
        MachineInfo {
            l1d_bytes: caches.0,
            l2_bytes: caches.1,
            l3_bytes: caches.2,
            threads,
            model,
            source,
        }
    }
}

/// The machine this process runs on, detected once.
pub fn machine() -> &'static MachineInfo {
    static M: OnceLock<MachineInfo> = OnceLock::new();
    M.get_or_init(MachineInfo::detect)
}

/// Parse a sysfs cache size: `"32K"`, `"1024K"`, `"32M"`, `"512"` (bytes). `None` if malformed.
///
/// ```
/// use raptor_plan::machine::parse_size;
/// assert_eq!(parse_size("48K\n"), Some(48 << 10));
/// assert_eq!(parse_size("32M"), Some(32 << 20));
/// assert_eq!(parse_size("bogus"), None);
/// ```
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1usize << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
}

/// `1536` → `"1.5 KiB"`, `33554432` → `"32 MiB"`.
fn human(b: usize) -> String {
    let (v, u) = if b >= 1 << 20 {
        (b as f64 / f64::from(1u32 << 20), "MiB")
    } else {
        (b as f64 / 1024.0, "KiB")
    };
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0} {u}")
    } else {
        format!("{v:.1} {u}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write(dir: &Path, idx: usize, level: &str, kind: &str, size: &str) {
        let d = dir.join(format!("index{idx}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("level"), level).unwrap();
        std::fs::write(d.join("type"), kind).unwrap();
        std::fs::write(d.join("size"), size).unwrap();
    }

    #[test]
    fn sysfs_tree_is_read() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), 0, "1\n", "Data\n", "48K\n");
        write(t.path(), 1, "1\n", "Instruction\n", "32K\n");
        write(t.path(), 2, "2\n", "Unified\n", "2048K\n");
        write(t.path(), 3, "3\n", "Unified\n", "260M\n");
        assert_eq!(
            MachineInfo::caches_from_sysfs(t.path()),
            Some((48 << 10, 2 << 20, 260 << 20))
        );
    }

    #[test]
    fn missing_or_garbage_sysfs_gives_none_or_partial() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(MachineInfo::caches_from_sysfs(t.path()), None);
        assert_eq!(MachineInfo::caches_from_sysfs(&t.path().join("nope")), None);
        write(t.path(), 0, "x", "Data", "48K");
        write(t.path(), 1, "2", "Unified", "lots");
        assert_eq!(MachineInfo::caches_from_sysfs(t.path()), None);
        // only an L2: L1 from the fallback, L3 = L2
        write(t.path(), 2, "2", "Unified", "1M");
        assert_eq!(
            MachineInfo::caches_from_sysfs(t.path()),
            Some((32 << 10, 1 << 20, 1 << 20))
        );
    }

    #[test]
    fn this_machine_is_detected_sanely() {
        let m = machine();
        assert!(m.threads >= 1);
        assert!(m.l1d_bytes >= 1024 && m.l1d_bytes <= m.l2_bytes && m.l2_bytes <= m.l3_bytes);
        assert!(!m.describe().is_empty());
        assert!(!m.signature().contains('\n'));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(32 << 20), "32 MiB");
        assert_eq!(human(48 << 10), "48 KiB");
        assert_eq!(human(1536), "1.5 KiB");
    }
}
