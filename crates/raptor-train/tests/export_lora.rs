//! A LoRA run leaves raptor: `run::export_run_as` writes the run's trained adapters and head as
//! a PEFT adapter folder for its base checkpoint, or merged into a Hugging Face folder. Checked
//! here on a tiny BERT (the base made by exporting a toy run started from scratch, then a
//! DP-Adam LoRA run on it): the adapter holds exactly the run's trained tensors under PEFT's
//! names, the merged folder holds W + (α/r)·B·A for every adapted weight and the base's other
//! weights, the head included, and neither holds the planted text of a training record. (That
//! PEFT and transformers read these layouts to raptor's logits is `raptor-models`'
//! `tests/peft_export.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use raptor_models::checkpoint::read_safetensors;
use raptor_models::peft::{ADAPTER_CONFIG, ADAPTER_WEIGHTS, PEFT_PREFIX};
use raptor_run::{ExportForm, Exported, export_run, export_run_as};
use raptor_train::config::RunConfig;
use std::collections::BTreeMap;
use std::path::Path;
use tch::{Kind, Tensor};

const SECRET: &str = "qzxloraexportsecretvkw";

fn tensors(path: &Path) -> BTreeMap<String, Tensor> {
    read_safetensors(path).unwrap().into_iter().collect()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn holds_secret(dir: &Path) -> bool {
    files(dir).iter().any(|f| {
        std::fs::read(f)
            .unwrap()
            .windows(SECRET.len())
            .any(|w| w == SECRET.as_bytes())
    })
}

fn config(train: &Path, model: &str, method: &str) -> RunConfig {
    let toy = common::root().join("examples/toy");
    RunConfig::from_toml(&format!(
        r#"[data]
train = "{}"
validation = "{}"
max_length = 40

[model]
kind = "bert"
tokenizer = "bytes"
d_model = 32
layers = 2
heads = 2
d_ff = 64
{model}

[method]
name = "{method}"
scope = "{}"

[privacy]
epsilon = 8.0

[train]
batch_size = 32.0
steps = 2
lr = 0.05
micro_batch = 32
insecure_seed = 3
"#,
        train.display(),
        toy.join("valid.csv").display(),
        if method == "adam" { "full" } else { "lora" }
    ))
    .unwrap()
}

#[test]
fn a_lora_run_exports_as_a_peft_adapter_and_as_a_merged_folder() {
    let d = tempfile::tempdir().unwrap();
    // Training records with a planted string (text the exports must not hold).
    let toy = common::root().join("examples/toy/train.csv");
    let text = std::fs::read_to_string(&toy).unwrap();
    let train = d.path().join("train.csv");
    let planted: String = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i > 0 && i % 4 == 0 {
                format!("{SECRET} {l}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&train, &planted).unwrap();

    // The base: a toy BERT trained from scratch, exported as a Hugging Face folder.
    let (base_run, _) =
        common::train_quietly(&config(&train, "", "adam"), &d.path().join("base-run")).unwrap();
    let base = d.path().join("base");
    export_run(&base_run, &base).unwrap();

    // A DP-Adam LoRA run on it.
    let cfg = config(&train, &format!("path = \"{}\"", base.display()), "dp-adam");
    let (run, _) = common::train_quietly(&cfg, &d.path().join("lora-run")).unwrap();

    let adapter = d.path().join("adapter");
    let Exported::Adapter(report) = export_run_as(&run, &adapter, ExportForm::Adapter).unwrap()
    else {
        panic!("a LoRA run exports as an adapter");
    };
    assert_eq!(report.modules_to_save, ["classifier"]);
    assert_eq!(report.target_modules.len(), 8, "{report:?}");
    assert_eq!((report.r, report.alpha), (cfg.lora.r, cfg.lora.alpha));
    let conf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(adapter.join(ADAPTER_CONFIG)).unwrap()).unwrap();
    assert_eq!(conf["base_model_name_or_path"], base.display().to_string());
    assert_eq!(conf["peft_type"], "LORA");
    assert_eq!(conf["task_type"], "SEQ_CLS");

    // The adapter's tensors are the run's trained ones (the checkpoint) under PEFT's names.
    let ckpt: BTreeMap<String, Tensor> = files(&run.join("checkpoint"))
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "safetensors"))
        .flat_map(|f| tensors(&f))
        .collect();
    let ad = tensors(&adapter.join(ADAPTER_WEIGHTS));
    for (name, t) in &ad {
        let var = name.strip_prefix(PEFT_PREFIX).unwrap();
        let c = ckpt
            .get(var)
            .unwrap_or_else(|| panic!("{var} is not in the run's checkpoint"));
        assert_eq!(max_diff(t, c), 0.0, "{var}");
    }
    let lora_b = ad.keys().filter(|k| k.ends_with("lora_B.weight")).count();
    assert_eq!(lora_b, 8);
    assert!(
        ad.iter()
            .filter(|(k, _)| k.ends_with("lora_B.weight"))
            .any(|(_, t)| t.abs().max().double_value(&[]) > 0.0),
        "training moved the adapters off zero"
    );

    // The merged folder: W + (α/r)·B·A on the adapted weights, the base elsewhere, the head.
    let merged = d.path().join("merged");
    let Exported::Merged(m) = export_run_as(&run, &merged, ExportForm::Merged).unwrap() else {
        panic!("a LoRA run exports merged with --merged");
    };
    assert_eq!(m, report.target_modules);
    let (w, b0) = (
        tensors(&merged.join("model.safetensors")),
        tensors(&base.join("model.safetensors")),
    );
    let scale = report.alpha / report.r as f64;
    let mut adapted = 0;
    for (name, t) in &w {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let want = if report.target_modules.iter().any(|x| x == module) {
            adapted += 1;
            let a = &ad[&format!("{PEFT_PREFIX}{module}.lora_A.weight")];
            let bb = &ad[&format!("{PEFT_PREFIX}{module}.lora_B.weight")];
            b0[name].to_kind(Kind::Double)
                + bb.to_kind(Kind::Double).matmul(&a.to_kind(Kind::Double)) * scale
        } else if name.starts_with("classifier") {
            ad[&format!("{PEFT_PREFIX}{name}")].shallow_clone()
        } else {
            b0[name].shallow_clone()
        };
        assert!(max_diff(t, &want) < 1e-6, "{name}");
    }
    assert_eq!(adapted, 8);
    assert!(w.contains_key("classifier.weight"));

    for out in [&adapter, &merged] {
        assert!(
            !holds_secret(out),
            "{} holds a training record's text",
            out.display()
        );
        assert!(!out.join("private").exists());
        assert!(out.join("README.md").is_file());
    }
    // A run without adapters exports as it did.
    let e = export_run_as(&base_run, &d.path().join("full"), ExportForm::Adapter).unwrap();
    assert_eq!(e, Exported::Full);
}
