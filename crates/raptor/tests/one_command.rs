//! The one-command path end to end, without network: a per-user cache laid out as the pinned
//! backbone's folder but holding the tiny BERT fixture (`fixtures/models/bert`, with its
//! WordPiece tokenizer) stands in for all-MiniLM-L6-v2 (`RAPTOR_CACHE_DIR` points the child
//! `raptor` at it).
//!
//! - `raptor train --data train.csv` detects the columns, trains DP-Adam LoRA from the cached
//!   backbone, prints the start summary and, stderr not being a terminal, plain progress lines;
//! - `--quiet` prints neither;
//! - a config file without a [model] table trains from the same cached backbone;
//! - `raptor init --data` writes the same config, commented, which `raptor train --config`
//!   accepts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use raptor_data::pretrained::{ALL_MINILM_L6_V2, MANIFEST, folder_is_complete};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("raptor-one-command-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sha(p: &Path) -> String {
    raptor_data::cache::sha256_file(p).unwrap()
}

/// A cache whose `models/all-minilm-l6-v2/` is complete by the manifest's rule but holds the
/// tiny BERT fixture (the files the fixture lacks are placeholders).
fn fixture_cache(dir: &Path) -> PathBuf {
    let cache = dir.join("cache");
    let m = cache.join("models").join(ALL_MINILM_L6_V2.name);
    std::fs::create_dir_all(m.join("1_Pooling")).unwrap();
    let fx = root().join("fixtures/models");
    std::fs::copy(fx.join("bert/config.json"), m.join("config.json")).unwrap();
    std::fs::copy(
        fx.join("bert/model.safetensors"),
        m.join("model.safetensors"),
    )
    .unwrap();
    std::fs::copy(
        fx.join("bert_tokenizer/tokenizer.json"),
        m.join("tokenizer.json"),
    )
    .unwrap();
    let mut files = serde_json::Map::new();
    for (_, rel) in ALL_MINILM_L6_V2.files {
        let p = m.join(rel);
        if !p.exists() {
            std::fs::write(&p, b"{}").unwrap();
        }
        files.insert((*rel).to_string(), sha(&p).into());
    }
    let manifest = serde_json::json!({
        "name": ALL_MINILM_L6_V2.name,
        "wheel_sha256": ALL_MINILM_L6_V2.sha256,
        "note": "test fixture: the tiny BERT of fixtures/models/bert",
        "files": files,
    });
    std::fs::write(m.join(MANIFEST), manifest.to_string()).unwrap();
    assert!(folder_is_complete(&ALL_MINILM_L6_V2, &m));
    cache
}

/// 150 records, 3 topics, under column names the detector must find by name (`comment`,
/// `topic`) beside an `id` column it must leave out.
fn data(dir: &Path) -> PathBuf {
    let words = ["the private model", "a mix of expert", "fine cafe naive"];
    let mut s = String::from("id,comment,topic\n");
    for i in 0..150 {
        let c = i % 3;
        s.push_str(&format!(
            "{i},\"{} {}, {}\",t{c}\n",
            words[c],
            words[c],
            i % 10
        ));
    }
    let p = dir.join("train.csv");
    std::fs::write(&p, s).unwrap();
    p
}

fn raptor(cache: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_raptor"))
        .args(args)
        .current_dir(cwd)
        .env("RAPTOR_CACHE_DIR", cache)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn only_run(runs: &Path) -> PathBuf {
    let v: Vec<PathBuf> = std::fs::read_dir(runs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(v.len(), 1, "{v:?}");
    v[0].clone()
}

#[test]
fn one_command_trains_from_the_cached_backbone_with_progress_lines() {
    let dir = tmp("data");
    let cache = fixture_cache(&dir);
    data(&dir);
    let out = raptor(
        &cache,
        &dir,
        &["train", "--data", "train.csv", "--runs-dir", "runs"],
    );
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{so}\nstderr:\n{se}");
    // What was detected and assumed.
    for want in [
        "150 records",
        "text column `comment`",
        "label column `topic`",
        "left out: `id`",
        "3 labels",
        "data.max_length: 32 tokens",
    ] {
        assert!(se.contains(want), "{want:?} missing from stderr:\n{se}");
    }
    // The start summary: 135 training records (10 % held out) -> B 32, and the documented rule
    // clamp(ceil(6 · N / B), 20, 100) = ceil(6 · 135 / 32) = 26 updates.
    let t = 26;
    let updates = format!("updates: {t}");
    for want in [
        "records: 135 training, 15 validation",
        "labels (3): t0, t1, t2\n",
        "privacy: epsilon 8",
        "q = 0.2370",
        "sigma per stream: all ",
        updates.as_str(),
        "time: about",
        "memory: about",
        "frozen-prefix cache:",
        // Where the time before the first update went, part by part.
        "prepared in ",
        "model ",
        "tokenizing ",
        "privacy plan ",
        "probe ",
    ] {
        assert!(se.contains(want), "{want:?} missing from stderr:\n{se}");
    }
    // The label set comes from the private file: said once.
    assert_eq!(
        se.matches("the label set was read from the private training file")
            .count(),
        1,
        "{se}"
    );
    // Not a terminal: plain lines, the first and the last among them, never the private loss.
    let lines: Vec<&str> = se.lines().filter(|l| l.starts_with("update ")).collect();
    assert!(lines.len() >= 5, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!("update 1/{t} (")),
        "{lines:?}"
    );
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with(&format!("update {t}/{t} (100%)")),
        "{lines:?}"
    );
    assert!(
        !lines.last().unwrap().contains("eps spent -"),
        "the certified epsilon is shown once computed: {lines:?}"
    );
    assert!(
        lines[0].contains("eps spent ") && lines[0].contains(" planned"),
        "the epsilon spent and planned are shown from the first update: {lines:?}"
    );
    assert!(
        !se.contains("loss"),
        "the private loss is shown only when asked:\n{se}"
    );
    // The end: the record, where things are and what to run next.
    assert!(so.contains("privacy: epsilon <="), "{so}");
    assert!(so.contains("evaluate: raptor eval --run"), "{so}");
    assert!(so.contains("repeat:   raptor train --config"), "{so}");
    let run = only_run(&dir.join("runs"));
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("record.json")).unwrap()).unwrap();
    assert_eq!(rec["method"], "dp-adam");
    assert_eq!(rec["train_records"], 135);
    assert!(rec["epsilon"]["upper"].as_f64().unwrap() <= 8.0 + 1e-9);
    // The resolved config names the cached backbone and the detected columns.
    let cfg = raptor_train::config::RunConfig::from_file(&run.join("config.toml")).unwrap();
    assert_eq!(cfg.data.text_column, "comment");
    assert_eq!(cfg.data.label_column, "topic");
    assert!(
        cfg.model.path.as_ref().unwrap().starts_with(&cache),
        "{:?}",
        cfg.model.path
    );

    // `raptor init` writes the same config, commented; it trains as it is (quiet: no lines).
    let init = raptor(&cache, &dir, &["init", "--data", "train.csv"]);
    assert!(init.status.success(), "{}", text(&init.stderr));
    let toml_text = text(&init.stdout);
    assert!(
        toml_text.starts_with("# raptor run configuration"),
        "{toml_text}"
    );
    assert!(toml_text.contains("label column `topic`"), "{toml_text}");
    let written = dir.join("run.toml");
    std::fs::write(&written, &toml_text).unwrap();
    let mut from_init = raptor_train::config::RunConfig::from_file(&written).unwrap();
    from_init.data.max_length = cfg.data.max_length;
    from_init.model.path = cfg.model.path.clone();
    assert_eq!(
        from_init.differences(&cfg).unwrap(),
        Vec::<String>::new(),
        "init and train resolve the same config"
    );
}

#[test]
fn quiet_runs_and_configs_without_a_model_use_the_cached_backbone() {
    let dir = tmp("nomodel");
    let cache = fixture_cache(&dir);
    let train = data(&dir);
    let cfg = format!(
        "[data]\ntrain = \"{}\"\ntext_column = \"comment\"\nlabel_column = \"topic\"\nmax_length = 24\n\n[method]\nname = \"dp-adam\"\nscope = \"lora\"\n\n[train]\nbatch_size = 32.0\nsteps = 3\n",
        train.display()
    );
    std::fs::write(dir.join("run.toml"), cfg).unwrap();
    let out = raptor(
        &cache,
        &dir,
        &[
            "train",
            "--config",
            "run.toml",
            "--runs-dir",
            "runs",
            "--quiet",
        ],
    );
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{so}\nstderr:\n{se}");
    assert!(
        !se.lines()
            .any(|l| l.starts_with("update ") || l.starts_with("starting run")),
        "--quiet shows no progress:\n{se}"
    );
    let run = only_run(&dir.join("runs"));
    let stored = raptor_train::config::RunConfig::from_file(&run.join("config.toml")).unwrap();
    assert_eq!(stored.model.kind, raptor_train::config::ModelKind::Bert);
    assert_eq!(
        stored.model.path.as_deref(),
        Some(cache.join("models").join(ALL_MINILM_L6_V2.name).as_path())
    );
    // Bad input is an error, not a panic: a file with one column.
    std::fs::write(dir.join("one.csv"), "text\na\nb\n").unwrap();
    let out = raptor(&cache, &dir, &["train", "--data", "one.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("needs a text and a label column"));
}
