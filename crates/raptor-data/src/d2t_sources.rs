//! The data-to-text corpora (E2E NLG cleaned, DART v1.1.1) at pinned versions, checked by
//! SHA-256, in the per-user cache.
//!
//! No package on a reachable registry carries these files, so they come from their canonical
//! public repositories at a pinned commit ([`E2E_CLEANED`], [`DART`]). [`ensure_d2t`] looks for
//! each file, in this order:
//!
//! 1. `<cache>/data/<name>/<file>` with the pinned SHA-256 (a complete earlier fetch);
//! 2. `<folder>/<name>/<file>` in each fallback folder (a user's `--d2t-data`, a shared data
//!    folder) with the pinned SHA-256: copied into the cache (a temporary file renamed into
//!    place), so later runs need neither the folder nor the network;
//! 3. the canonical URL, downloaded by `curl` into a temporary file in the cache, checked
//!    against the pinned SHA-256 and renamed into place (a download with another hash is
//!    deleted and is an error);
//! 4. a fallback folder's file with *another* SHA-256 (a different release, or an edited copy):
//!    used where it is, and the returned [`D2tOrigin::Unpinned`] says so, so that a table can
//!    say its data are not the pinned release.
//!
//! When none of these works the error says exactly which files to download from where, with
//! their SHA-256, and where to put them.
//!
//! The pinned SHA-256s are those of the files at the pinned commits: each was computed from a
//! copy whose git blob id equals the blob id that the commit's tree records for that path, so
//! the bytes are the release's.
//!
//! Neither release's training split is pinned here: the E2E training file
//! (`train-fixed.no-ol.csv`) and DART's training file were not available when the pins were
//! made, so their SHA-256s could not be computed; the experiments that use these corpora train
//! privately on the dev splits.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::DataError;
use crate::cache::sha256_file;

/// One pinned file of a data-to-text release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct D2tFile {
    /// File name (in the release folder, the cache folder and a fallback folder alike).
    pub name: &'static str,
    /// Canonical download URL (the file at the pinned commit).
    pub url: &'static str,
    /// SHA-256 of the file (hex).
    pub sha256: &'static str,
    /// Size in bytes.
    pub bytes: u64,
}

/// A data-to-text release: its dev and test files and where they come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct D2tRelease {
    /// Folder name under `<cache>/data/` and under a fallback folder (`e2e`, `dart`).
    pub name: &'static str,
    /// Reader format ([`crate::read_d2t`]): `e2e` or `dart`.
    pub format: &'static str,
    /// The dev split.
    pub dev: D2tFile,
    /// The test split.
    pub test: D2tFile,
    /// Other pinned files fetched beside them (the licence).
    pub extra: &'static [D2tFile],
    /// Repository and commit the files come from.
    pub source: &'static str,
    /// Licence and the works to cite.
    pub credit: &'static str,
}

impl D2tRelease {
    /// Every pinned file: dev, test, then the extras.
    pub fn files(&self) -> Vec<D2tFile> {
        let mut v = vec![self.dev, self.test];
        v.extend_from_slice(self.extra);
        v
    }
}

/// The cleaned E2E NLG release (Dušek, Howcroft and Rieser, 2019): `cleaned-data/` of
/// `tuetschek/e2e-cleaning` at commit `164acdf`.
pub const E2E_CLEANED: D2tRelease = D2tRelease {
    name: "e2e",
    format: "e2e",
    dev: D2tFile {
        name: "devel-fixed.no-ol.csv",
        url: "https://raw.githubusercontent.com/tuetschek/e2e-cleaning/164acdf986146d76f18893b3de9488725deda4c2/cleaned-data/devel-fixed.no-ol.csv",
        sha256: "bb88df2565826a463f96e93a5ab69a8c6460de54f2e68179eb94f0019f430d4d",
        bytes: 1_581_285,
    },
    test: D2tFile {
        name: "test-fixed.csv",
        url: "https://raw.githubusercontent.com/tuetschek/e2e-cleaning/164acdf986146d76f18893b3de9488725deda4c2/cleaned-data/test-fixed.csv",
        sha256: "99b43c2769a09d62fc5d37dcffaa59d4092bcffdc611f226258681df61269b17",
        bytes: 1_915_378,
    },
    extra: &[],
    source: "github.com/tuetschek/e2e-cleaning, folder cleaned-data/, commit 164acdf986146d76f18893b3de9488725deda4c2",
    credit: "E2E NLG Challenge data (Novikova, Dušek and Rieser, 2017), cleaned release (Dušek, Howcroft and Rieser, 2019); CC BY-SA 4.0",
};

/// DART v1.1.1 (Nan et al., 2021): `data/v1.1.1/` of `Yale-LILY/dart` at commit `bb644b1`, with
/// the repository's MIT licence.
pub const DART: D2tRelease = D2tRelease {
    name: "dart",
    format: "dart",
    dev: D2tFile {
        name: "dart-v1.1.1-full-dev.json",
        url: "https://raw.githubusercontent.com/Yale-LILY/dart/bb644b12ec1d0264f96a31145534b9a94f6ff5f5/data/v1.1.1/dart-v1.1.1-full-dev.json",
        sha256: "56606eac12baa7f0ddb81c61890f9f1a95bace4df8f8989852786358fe5d2b88",
        bytes: 2_468_789,
    },
    test: D2tFile {
        name: "dart-v1.1.1-full-test.xml",
        url: "https://raw.githubusercontent.com/Yale-LILY/dart/bb644b12ec1d0264f96a31145534b9a94f6ff5f5/data/v1.1.1/dart-v1.1.1-full-test.xml",
        sha256: "4f6994d633030278798c114555549a13202780fe0d78ee2e7ac7dcce45a8e233",
        bytes: 3_958_498,
    },
    extra: &[D2tFile {
        name: "LICENSE",
        url: "https://raw.githubusercontent.com/Yale-LILY/dart/bb644b12ec1d0264f96a31145534b9a94f6ff5f5/LICENSE",
        sha256: "70452dc19e86c3404b4970cde6233c04f405a0c634ecf5a666a6e60a01f28d7f",
        bytes: 1_100,
    }],
    source: "github.com/Yale-LILY/dart, folder data/v1.1.1/, commit bb644b12ec1d0264f96a31145534b9a94f6ff5f5",
    credit: "DART: open-domain structured data record to text (Nan et al., 2021, NAACL); MIT licence",
};

/// Both releases, E2E first.
pub const D2T_RELEASES: [D2tRelease; 2] = [E2E_CLEANED, DART];

/// Where a release's files were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum D2tOrigin {
    /// Already in the cache with the pinned SHA-256.
    Cache,
    /// Copied into the cache from this folder (pinned SHA-256).
    Copied(PathBuf),
    /// Downloaded from the canonical URLs into the cache (pinned SHA-256).
    Downloaded,
    /// Files in this folder whose SHA-256 differs from the pin, used where they are.
    Unpinned(PathBuf),
}

/// The dev and test files of a release, ready to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct D2tFiles {
    /// The release.
    pub release: D2tRelease,
    /// The dev file.
    pub dev: PathBuf,
    /// The test file.
    pub test: PathBuf,
    /// Where they came from (the least verified of the files).
    pub origin: D2tOrigin,
}

impl D2tFiles {
    /// One sentence naming the data and where they came from (for a table's notes).
    pub fn describe(&self) -> String {
        let r = &self.release;
        let how = match &self.origin {
            D2tOrigin::Cache => "from the per-user cache, SHA-256 as pinned".to_string(),
            D2tOrigin::Copied(f) => {
                format!(
                    "copied into the per-user cache from {}, SHA-256 as pinned",
                    f.display()
                )
            }
            D2tOrigin::Downloaded => {
                "downloaded into the per-user cache, SHA-256 as pinned".to_string()
            }
            D2tOrigin::Unpinned(f) => format!(
                "read from {}: NOT the pinned release (SHA-256 differs)",
                f.display()
            ),
        };
        format!(
            "{}: {} and {} from {} ({how}); {}.",
            r.name, r.dev.name, r.test.name, r.source, r.credit
        )
    }
}

/// How a file is downloaded: `(url, destination)`.
pub type Downloader<'a> = &'a dyn Fn(&str, &Path) -> Result<(), DataError>;

/// Downloads `url` to `dest` with `curl` (follows redirects, fails on HTTP errors, 30 s
/// connection timeout, two retries). `file://` URLs work too.
///
/// # Errors
/// `curl` missing or failing.
pub fn curl_download(url: &str, dest: &Path) -> Result<(), DataError> {
    let out = Command::new("curl")
        .args(["-fsSL", "--retry", "2", "--connect-timeout", "30", "-o"])
        .arg(dest)
        .arg(url)
        .stdin(Stdio::null())
        .output();
    let fail = |message: String| DataError::Fetch {
        what: url.to_string(),
        message,
    };
    match out {
        Err(e) => Err(fail(format!("could not run `curl`: {e}"))),
        Ok(o) if !o.status.success() => Err(fail(format!(
            "`curl` failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
        ))),
        Ok(_) => Ok(()),
    }
}

/// The cache folder of a release: `<cache>/data/<name>`.
pub fn release_dir(cache: &Path, r: &D2tRelease) -> PathBuf {
    cache.join("data").join(r.name)
}

/// What to download by hand, and where to put it (for error messages).
pub fn how_to_fetch(r: &D2tRelease, cache: &Path) -> String {
    let files: Vec<String> = r
        .files()
        .iter()
        .map(|f| format!("{} (SHA-256 {}, {} bytes)", f.url, f.sha256, f.bytes))
        .collect();
    format!(
        "download {} into {} (or into <folder>/{}/ and pass --d2t-data <folder>)",
        files.join(", "),
        release_dir(cache, r).display(),
        r.name
    )
}

fn has_pin(path: &Path, f: &D2tFile) -> bool {
    path.is_file() && sha256_file(path).is_ok_and(|h| h.eq_ignore_ascii_case(f.sha256))
}

fn tmp_of(path: &Path) -> PathBuf {
    path.with_extension(format!("part-{}", std::process::id()))
}

fn copy_into(src: &Path, dest: &Path, f: &D2tFile) -> Result<(), DataError> {
    let tmp = tmp_of(dest);
    let bytes = std::fs::read(src).map_err(|e| DataError::io(src, &e))?;
    let mut out = std::fs::File::create(&tmp).map_err(|e| DataError::io(&tmp, &e))?;
    out.write_all(&bytes).map_err(|e| DataError::io(&tmp, &e))?;
    out.sync_all().map_err(|e| DataError::io(&tmp, &e))?;
    drop(out);
    if !has_pin(&tmp, f) {
        let _ = std::fs::remove_file(&tmp);
        return Err(DataError::Fetch {
            what: f.name.into(),
            message: format!("{} changed while it was copied", src.display()),
        });
    }
    std::fs::rename(&tmp, dest).map_err(|e| DataError::io(dest, &e))
}

fn download_into(
    f: &D2tFile,
    dest: &Path,
    download: Downloader<'_>,
    quiet: bool,
) -> Result<(), DataError> {
    let tmp = tmp_of(dest);
    if !quiet {
        eprintln!(
            "fetching {} ({} bytes) into {}",
            f.url,
            f.bytes,
            dest.display()
        );
    }
    let got = download(f.url, &tmp);
    if let Err(e) = got {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let actual = sha256_file(&tmp)?;
    if !actual.eq_ignore_ascii_case(f.sha256) {
        let _ = std::fs::remove_file(&tmp);
        return Err(DataError::Checksum {
            path: dest.to_path_buf(),
            expected: f.sha256.into(),
            actual,
        });
    }
    std::fs::rename(&tmp, dest).map_err(|e| DataError::io(dest, &e))
}

/// The dev and test files of `r`, from the cache, a fallback folder (`<folder>/<name>/`) or
/// the canonical URLs, in the order the module documentation gives. Says what it fetches on
/// stderr unless `quiet`.
///
/// # Errors
/// [`DataError::Fetch`] naming every file to bring by hand when no copy is found and the
/// download fails; [`DataError::Checksum`] when a download has another SHA-256 (and no
/// fallback folder has the files); I/O errors of the cache.
pub fn ensure_d2t(
    r: &D2tRelease,
    cache: &Path,
    folders: &[PathBuf],
    download: Downloader<'_>,
    quiet: bool,
) -> Result<D2tFiles, DataError> {
    let dir = release_dir(cache, r);
    let files = r.files();
    let mut origin = D2tOrigin::Cache;
    let mut first_error: Option<DataError> = None;
    for f in &files {
        let dest = dir.join(f.name);
        if has_pin(&dest, f) {
            continue;
        }
        std::fs::create_dir_all(&dir).map_err(|e| DataError::io(&dir, &e))?;
        if let Some(folder) = folders
            .iter()
            .find(|d| has_pin(&d.join(r.name).join(f.name), f))
        {
            copy_into(&folder.join(r.name).join(f.name), &dest, f)?;
            if origin == D2tOrigin::Cache {
                origin = D2tOrigin::Copied(folder.join(r.name));
            }
            continue;
        }
        if first_error.is_some() {
            // One failed download is enough to know the source is out of reach.
            continue;
        }
        match download_into(f, &dest, download, quiet) {
            Ok(()) => {
                if matches!(origin, D2tOrigin::Cache) {
                    origin = D2tOrigin::Downloaded;
                }
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let (dev, test) = (dir.join(r.dev.name), dir.join(r.test.name));
    let Some(err) = first_error else {
        return Ok(D2tFiles {
            release: *r,
            dev,
            test,
            origin,
        });
    };
    // No pinned copy of some file: a fallback folder's own dev and test files, if any.
    let dev_ok = has_pin(&dev, &r.dev);
    let test_ok = has_pin(&test, &r.test);
    if dev_ok && test_ok {
        // Only an extra (the licence) is missing: the data are the pinned release.
        if !quiet {
            eprintln!("warning: {err}");
        }
        return Ok(D2tFiles {
            release: *r,
            dev,
            test,
            origin,
        });
    }
    if let Some(folder) = folders
        .iter()
        .map(|d| d.join(r.name))
        .find(|d| d.join(r.dev.name).is_file() && d.join(r.test.name).is_file())
    {
        if !quiet {
            eprintln!(
                "warning: {} holds {} and {} with another SHA-256 than the pinned release; using them as they are",
                folder.display(),
                r.dev.name,
                r.test.name
            );
        }
        return Ok(D2tFiles {
            release: *r,
            dev: folder.join(r.dev.name),
            test: folder.join(r.test.name),
            origin: D2tOrigin::Unpinned(folder),
        });
    }
    let looked: Vec<String> = folders
        .iter()
        .map(|d| d.join(r.name).display().to_string())
        .collect();
    Err(DataError::Fetch {
        what: format!("{} ({})", r.name, r.source),
        message: format!(
            "{err}; not found in {} either. Without access to the source: {}",
            if looked.is_empty() {
                "any fallback folder".to_string()
            } else {
                looked.join(", ")
            },
            how_to_fetch(r, cache)
        ),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    /// A release whose two files live under `src` and are served as `file://` URLs.
    fn release(src: &Path, dev: &[u8], test: &[u8]) -> D2tRelease {
        std::fs::create_dir_all(src).unwrap();
        let file = |name: &'static str, bytes: &[u8]| {
            let p = src.join(name);
            std::fs::write(&p, bytes).unwrap();
            D2tFile {
                name,
                url: leak(format!("file://{}", p.display())),
                sha256: leak(sha256_file(&p).unwrap()),
                bytes: bytes.len() as u64,
            }
        };
        D2tRelease {
            name: "e2e",
            format: "e2e",
            dev: file("dev.csv", dev),
            test: file("test.csv", test),
            extra: &[],
            source: "a test folder",
            credit: "test data",
        }
    }

    const DEV: &[u8] = b"mr,ref\n\"name[A]\",\"A is here.\"\n";
    const TEST: &[u8] = b"mr,ref\n\"name[B]\",\"B is there.\"\n";

    fn no_network(url: &str, _: &Path) -> Result<(), DataError> {
        Err(DataError::Fetch {
            what: url.into(),
            message: "no network in this test".into(),
        })
    }

    #[test]
    fn pins_are_well_formed() {
        for r in D2T_RELEASES {
            for f in r.files() {
                assert_eq!(f.sha256.len(), 64, "{}", f.name);
                assert!(f.url.starts_with("https://") && f.url.ends_with(f.name));
                assert!(f.bytes > 0);
            }
            assert!(matches!(r.format, "e2e" | "dart"));
        }
    }

    /// Downloads through `file://` URLs with curl, checks the hash, then reuses the cache
    /// without the network.
    #[test]
    fn downloads_into_the_cache_then_reuses_it() {
        let tmp = tempfile::tempdir().unwrap();
        let r = release(&tmp.path().join("src"), DEV, TEST);
        let cache = tmp.path().join("cache");
        let got = ensure_d2t(&r, &cache, &[], &curl_download, true).unwrap();
        assert_eq!(got.origin, D2tOrigin::Downloaded);
        assert_eq!(std::fs::read(&got.dev).unwrap(), DEV);
        assert_eq!(got.test, release_dir(&cache, &r).join("test.csv"));
        assert!(
            got.describe()
                .contains("downloaded into the per-user cache")
        );
        let again = ensure_d2t(&r, &cache, &[], &no_network, true).unwrap();
        assert_eq!(again.origin, D2tOrigin::Cache);
        assert_eq!(again.dev, got.dev);
        // A corrupted cached file is fetched again.
        std::fs::write(&got.dev, b"tampered").unwrap();
        let fixed = ensure_d2t(&r, &cache, &[], &curl_download, true).unwrap();
        assert_eq!(std::fs::read(&fixed.dev).unwrap(), DEV);
    }

    /// A download with another hash is refused and leaves nothing in the cache.
    #[test]
    fn a_download_with_another_hash_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut r = release(&tmp.path().join("src"), DEV, TEST);
        r.dev.sha256 = "00".repeat(32).leak();
        let cache = tmp.path().join("cache");
        let e = ensure_d2t(&r, &cache, &[], &curl_download, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("SHA-256"), "{e}");
        assert!(!release_dir(&cache, &r).join("dev.csv").exists());
        let left: Vec<_> = std::fs::read_dir(release_dir(&cache, &r))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            left.iter().all(|n| n == "test.csv"),
            "no partial file left: {left:?}"
        );
    }

    /// Without the network: a folder with the pinned files is copied into the cache; one with
    /// other files is used where it is and labelled; nothing at all names what to download.
    #[test]
    fn fallback_folders_and_the_message_without_access() {
        let tmp = tempfile::tempdir().unwrap();
        let r = release(&tmp.path().join("src"), DEV, TEST);
        let shared = tmp.path().join("shared");
        std::fs::create_dir_all(shared.join("e2e")).unwrap();
        std::fs::write(shared.join("e2e/dev.csv"), DEV).unwrap();
        std::fs::write(shared.join("e2e/test.csv"), TEST).unwrap();
        let cache = tmp.path().join("cache");
        let empty = tmp.path().join("empty");
        let got = ensure_d2t(
            &r,
            &cache,
            &[empty.clone(), shared.clone()],
            &no_network,
            true,
        )
        .unwrap();
        assert_eq!(got.origin, D2tOrigin::Copied(shared.join("e2e")));
        assert!(got.dev.starts_with(&cache));
        assert_eq!(std::fs::read(&got.test).unwrap(), TEST);

        let edited = tmp.path().join("edited");
        std::fs::create_dir_all(edited.join("e2e")).unwrap();
        std::fs::write(edited.join("e2e/dev.csv"), b"mr,ref\n").unwrap();
        std::fs::write(edited.join("e2e/test.csv"), TEST).unwrap();
        let cache2 = tmp.path().join("cache2");
        let got = ensure_d2t(
            &r,
            &cache2,
            std::slice::from_ref(&edited),
            &no_network,
            true,
        )
        .unwrap();
        assert_eq!(got.origin, D2tOrigin::Unpinned(edited.join("e2e")));
        assert_eq!(got.dev, edited.join("e2e/dev.csv"));
        assert!(got.describe().contains("NOT the pinned release"));

        // One failed download stops the others (the source is out of reach).
        let tries = std::cell::Cell::new(0);
        let counting = |url: &str, dest: &Path| {
            tries.set(tries.get() + 1);
            no_network(url, dest)
        };
        let e = ensure_d2t(&r, &tmp.path().join("cache3"), &[empty], &counting, true)
            .unwrap_err()
            .to_string();
        assert_eq!(tries.get(), 1);
        for want in [
            r.dev.url,
            r.dev.sha256,
            r.test.url,
            "--d2t-data",
            "no network",
        ] {
            assert!(e.contains(want), "{want} in {e}");
        }
    }
}
