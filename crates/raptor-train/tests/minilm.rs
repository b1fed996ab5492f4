//! The real all-MiniLM-L6-v2 checkpoint (`cargo xtask setup --models`) fine-tunes privately end
//! to end through `raptor train`: by name (`model.path = "all-minilm-l6-v2"`), with its own
//! tokenizer (`model.tokenizer = "model"`), DP-Adam (`scope = "lora"`) over attention LoRA and a new head, a few
//! updates on the toy sentiment data; the certified ε stays within the target and the
//! validation loss goes down. Prints one `skipped …` line and passes when the model is not in
//! the cache.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cache_dir() -> Option<PathBuf> {
    raptor_data::cache::default_cache_dir()
}

#[test]
fn minilm_fine_tunes_privately_by_name() {
    let Some(model) = cache_dir().map(|c| c.join("models").join("all-minilm-l6-v2")) else {
        println!("skipped minilm_fine_tunes_privately_by_name: no cache folder");
        return;
    };
    if !model.join("raptor-model.json").is_file() {
        println!(
            "skipped minilm_fine_tunes_privately_by_name: {} not found (run `cargo xtask setup --models`)",
            model.display()
        );
        return;
    }
    let d = std::env::temp_dir().join(format!("raptor-minilm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    // A small fixture: the first 240 toy training records and 80 validation records.
    let toy = root().join("examples/toy");
    for (src, dst, n) in [
        ("train.csv", "train.csv", 240),
        ("valid.csv", "valid.csv", 80),
    ] {
        let text = std::fs::read_to_string(toy.join(src)).unwrap();
        let rows: Vec<&str> = text.lines().take(n + 1).collect();
        std::fs::write(d.join(dst), rows.join("\n") + "\n").unwrap();
    }
    let target = 4.0;
    let cfg = format!(
        r#"[data]
train = "train.csv"
validation = "valid.csv"
max_length = 24

[model]
kind = "bert"
path = "all-minilm-l6-v2"
tokenizer = "model"

[method]
name = "dp-adam"
scope = "lora"

[privacy]
epsilon = {target}

[lora]
r = 4

[train]
batch_size = 48.0
steps = 8
lr = 0.02
clip = 1.0
micro_batch = 48
eval_every = 1
insecure_seed = 3
"#
    );
    std::fs::write(d.join("minilm.toml"), cfg).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_raptor"))
        .env("OMP_NUM_THREADS", "1")
        .args(["train", "--config"])
        .arg(d.join("minilm.toml"))
        .arg("--runs-dir")
        .arg(d.join("runs"))
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let eps = rec["epsilon"]["upper"].as_f64().unwrap();
    assert!(eps.is_finite() && eps <= target, "epsilon {eps} > {target}");
    assert_eq!(rec["updates"].as_u64(), Some(8));
    // The resolved config names the cached folder.
    let resolved = std::fs::read_to_string(
        std::fs::read_dir(d.join("runs"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("config.toml"),
    )
    .unwrap();
    assert!(
        resolved.contains(&model.display().to_string()),
        "{resolved}"
    );
    // Only LoRA adapters and the new head are trained.
    let trainable = rec["trainable_parameters"].as_object().unwrap();
    assert!(!trainable.is_empty());
    let curve = rec["eval_curve"].as_array().unwrap();
    let loss = |i: usize| curve[i][1]["loss"].as_f64().unwrap();
    let (first, last) = (loss(0), loss(curve.len() - 1));
    let first_batch = rec["metrics"][0]["loss"].as_f64().unwrap();
    println!(
        "MiniLM DP-Adam LoRA, 8 updates: ε {eps:.3} (target {target}); validation loss {first:.4} after \
         update 1 -> {last:.4} after update 8 (first private batch {first_batch:.4}); accuracy {}",
        rec["eval"]["accuracy"]
    );
    assert!(
        last < first,
        "validation loss did not go down: {first} -> {last}"
    );
    std::fs::remove_dir_all(&d).ok();
}
