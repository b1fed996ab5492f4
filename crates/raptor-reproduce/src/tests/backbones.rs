//! The `backbones` part of `raptor-reproduce` end to end at the `quick` scale, on tiny
//! checkpoints built here (a BERT and a Llama-style decoder with random weights, byte
//! tokenizer) instead of the real all-MiniLM-L6-v2 and SmolLM2: the dense BERT is upcycled
//! (cached), its routers trained toward the toy task's domains and its experts trained further
//! (cached), the gated positive control, RAPTOR and DP-Adam LoRA fine-tune it privately,
//! DP-Adam / DP-Muon / DP-MuonBC
//! fine-tune the decoder's LoRA on E2E-style records; the tables with their computed notes, the
//! plots, and reuse of finished runs and of the upcycled checkpoint. Missing checkpoints and
//! corpora make skipped tables that say why.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use raptor_models::checkpoint::save_pretrained;
use raptor_models::{Bert, BertConfig, Decoder, DecoderConfig, DecoderFamily, DecoderHead};

use crate::backbones::{Inputs, ModelInput};
use crate::driver::{Context, Overrides, run};
use crate::paper::D2tTask;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A small E2E-style file: `sources` meaning representations, two references each.
fn e2e_file(path: &Path, sources: usize, offset: usize) {
    let foods = ["Thai", "Italian", "French", "Indian"];
    let mut s = String::from("mr,ref\n");
    for i in 0..sources {
        let name = format!("Place{}", i + offset);
        let food = foods[(i + offset) % foods.len()];
        let mr = format!("name[{name}], food[{food}]");
        s.push_str(&format!("\"{mr}\",\"{name} serves {food} food.\"\n"));
        s.push_str(&format!("\"{mr}\",\"{name} has {food} dishes.\"\n"));
    }
    std::fs::write(path, s).unwrap();
}

/// Tiny dense checkpoints in Hugging Face folders: a 2-layer BERT and a 2-layer Llama, both
/// with room for the byte tokenizer's 259 ids.
fn tiny_models(dir: &Path) -> (PathBuf, PathBuf) {
    let rng = raptor_models::rng::global_rng();
    rng.seed(11);
    let mut bc = BertConfig::tiny(2);
    bc.vocab_size = 260;
    bc.max_position_embeddings = 32;
    let bert = Bert::new(bc, tch::Device::Cpu).unwrap();
    save_pretrained(&bert, dir.join("bert")).unwrap();
    let mut dc = DecoderConfig::tiny(DecoderFamily::Llama, DecoderHead::LanguageModel);
    dc.vocab_size = 260;
    let llama = Decoder::new(dc, tch::Device::Cpu).unwrap();
    save_pretrained(&llama, dir.join("llama")).unwrap();
    (dir.join("bert"), dir.join("llama"))
}

fn ctx(out: &Path, d2t: &Path, backbones: Inputs, exe: bool) -> (Context, Overrides) {
    let over = Overrides {
        paper: None,
        backbones: Some(backbones),
    };
    let c = Context {
        root: root(),
        out: out.to_path_buf(),
        profile: crate::driver::Profile::Quick,
        cache: None,
        d2t_data: d2t.to_path_buf(),
        device: raptor_train::config::DeviceSpec::Cpu,
        exe: exe.then(super::worker_exe),
        workers: 2,
        json: false,
    };
    (c, over)
}

fn md(out: &Path, slug: &str) -> String {
    std::fs::read_to_string(out.join(format!("{slug}.md")))
        .unwrap_or_else(|e| panic!("{slug}.md: {e}"))
}

#[test]
fn quick_backbones_part_runs_end_to_end_and_reuses_finished_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (bert, llama) = tiny_models(tmp.path());
    let d2t = tmp.path().join("d2t");
    std::fs::create_dir_all(&d2t).unwrap();
    e2e_file(&d2t.join("dev.csv"), 30, 0);
    e2e_file(&d2t.join("test.csv"), 5, 100);
    let cache = tmp.path().join("cache");
    let inputs = Inputs {
        bert: Ok(ModelInput {
            path: bert,
            tokenizer: raptor_train::config::TokenizerSpec::Bytes,
        }),
        cls: Ok(super::paper::multidomain_toy(
            &tmp.path().join("toy"),
            [30, 40, 20],
        )),
        cls_source: None,
        llama: Ok(ModelInput {
            path: llama,
            tokenizer: raptor_train::config::TokenizerSpec::Bytes,
        }),
        d2t: Ok(D2tTask {
            name: "e2e".into(),
            format: "e2e".into(),
            dev: d2t.join("dev.csv"),
            test: d2t.join("test.csv"),
        }),
        cache: cache.clone(),
        device: raptor_train::config::DeviceSpec::Cpu,
    };
    let out = tmp.path().join("results");
    let c = ctx(&out, &d2t, inputs, true);
    let only = vec!["backbones".to_string()];
    let tables = run(&c.0, &c.1, &only).unwrap();
    let slugs: Vec<&str> = tables.iter().map(|t| t.slug.as_str()).collect();
    assert_eq!(
        slugs,
        [
            "backbones-minilm-moe",
            "backbones-minilm-moe-domains",
            "backbones-minilm-moe-diagnostics",
            "backbones-smollm2"
        ]
    );
    for t in &tables {
        t.check().unwrap();
    }
    // The upcycled checkpoint is cached in raptor's MoE-BERT layout (quick: E = 4, top-1, the
    // last layer only).
    let up: Vec<PathBuf> = std::fs::read_dir(cache.join("reproduce/upcycled"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(up.len(), 1, "{up:?}");
    let cfg = std::fs::read_to_string(up[0].join("config.json")).unwrap();
    assert!(
        cfg.contains("raptor_moe") && cfg.contains("\"num_experts\": 4"),
        "{cfg}"
    );
    let sparse: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    assert_eq!(
        sparse["raptor_moe"]["sparse_layers"],
        serde_json::json!([1]),
        "{cfg}"
    );

    // Classification: the paper part's evidence grid on the upcycled encoder: one row per
    // quick ε (1, 8), every cell computed, a verdict by the rule written before the numbers,
    // the gated positive control, the routers and the experts' training recorded.
    let t = &tables[0];
    assert_eq!(t.rows.len(), 2);
    for row in &t.rows {
        assert_eq!(row.len(), t.columns.len());
        for c in &row[4..10] {
            let mean: f64 = c.split(' ').next().unwrap().parse().unwrap();
            assert!((0.0..=100.0).contains(&mean), "{row:?}");
            assert!(c.contains('±'), "{row:?}");
        }
        assert!(
            row[12].starts_with("reproduced")
                || row[12].starts_with("not reproduced")
                || row[12].starts_with("undecided"),
            "{row:?}"
        );
    }
    let notes = t.notes.join("\n");
    assert!(
        notes.starts_with("Decision rule (fixed before the runs)"),
        "{notes}"
    );
    assert!(notes.contains("positive control"), "{notes}");
    assert!(
        notes.contains("RAPTOR's advantage reproduced in"),
        "{notes}"
    );
    assert!(
        notes.contains("Target ε = 8:") && notes.contains("within 1 % below the target"),
        "{notes}"
    );
    assert!(!notes.contains("ABOVE"), "{notes}");
    assert!(
        notes.contains("last layer's FFN copied into E = 4"),
        "{notes}"
    );
    assert!(
        notes.contains("routers trained toward the domains"),
        "{notes}"
    );
    assert!(notes.contains("experts' relative distance"), "{notes}");
    assert!(
        notes.contains("hyperparameters chosen on the public proxy only"),
        "{notes}"
    );
    // The experts' continued public training is cached, head dropped.
    let pre: Vec<PathBuf> = std::fs::read_dir(cache.join("reproduce/pretrained"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(pre.len(), 1, "{pre:?}");
    let hf = std::fs::read_to_string(pre[0].join("hf/config.json")).unwrap();
    assert!(hf.contains("raptor_moe"), "{hf}");

    // Diagnostics at the largest ε: RAPTOR and the baseline, every cell measured at a batch of
    // the run's size (quick: B = 32 of the 200 validation records), a per-expert SNR plot.
    let dg = &tables[2];
    assert_eq!(dg.rows.len(), 2);
    for row in &dg.rows {
        assert_eq!(row.len(), dg.columns.len());
        for c in &row[2..8] {
            assert!(c != "—", "{row:?}");
        }
        assert_eq!(row[8], "32", "{row:?}");
    }
    assert!(
        dg.notes
            .iter()
            .any(|n| n.contains("RAPTOR's expert streams have")),
        "{:?}",
        dg.notes
    );
    assert!(
        md(&out, "backbones-minilm-moe-diagnostics")
            .contains("backbones-minilm-moe-snr-per-expert-multidomain.png")
    );

    // Data-to-text: three private methods, NLL, BLEU and ROUGE-L present, ε within target.
    let d = &tables[3];
    assert_eq!(d.rows.len(), 3);
    let methods: Vec<&str> = d.rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(methods, ["DP-Adam", "DP-Muon", "DP-MuonBC"]);
    for row in &d.rows {
        for cell in &row[2..5] {
            assert!(cell != "—", "{row:?}");
        }
        let eps: f64 = row[5].parse().unwrap();
        assert!(eps > 0.0 && eps <= 8.0, "{row:?}");
    }
    let dn = d.notes.join("\n");
    assert!(dn.contains("DP-Muon's test NLL ≤ DP-Adam's in"), "{dn}");
    assert!(
        dn.contains("within the target") && !dn.contains("ABOVE"),
        "{dn}"
    );

    for (f, slug) in [
        (
            "backbones-minilm-moe-paired-differences.png",
            "backbones-minilm-moe",
        ),
        ("backbones-smollm2-e2e.png", "backbones-smollm2"),
    ] {
        let bytes = std::fs::read(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{f}");
        assert!(md(&out, slug).contains(f), "{f}");
    }
    let index = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(index.contains("upcycled all-MiniLM-L6-v2"), "{index}");

    // A second reproduce reuses every run folder and the upcycled checkpoint: same tables.
    // Quick: the proxy (2 non-private, 4 monolithic private and 4 RAPTOR expert settings),
    // 2 seeds × (start, LoRA with and without experts, 3 private methods × 2 ε), and 3 decoder
    // methods × 2 seeds.
    let runs = std::fs::read_dir(out.join("runs")).unwrap().count();
    assert_eq!(runs, 10 + 2 * (3 + 3 * 2) + 3 * 2);
    let before = (
        md(&out, "backbones-minilm-moe"),
        md(&out, "backbones-smollm2"),
    );
    let c2 = ctx(&out, &d2t, c.1.backbones.clone().unwrap(), false);
    let again = run(&c2.0, &c2.1, &only).unwrap();
    assert_eq!(again.len(), 4);
    assert_eq!(
        (
            md(&out, "backbones-minilm-moe"),
            md(&out, "backbones-smollm2")
        ),
        before
    );
    assert_eq!(std::fs::read_dir(out.join("runs")).unwrap().count(), runs);
    assert_eq!(
        std::fs::read_dir(cache.join("reproduce/upcycled"))
            .unwrap()
            .count(),
        1
    );
}

#[test]
fn missing_checkpoints_and_corpora_are_skipped_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let inputs = Inputs::real(
        &tmp.path().join("empty-cache"),
        tmp.path(),
        raptor_train::config::DeviceSpec::Cpu,
    );
    let out = tmp.path().join("results");
    let c = ctx(&out, tmp.path(), inputs, false);
    let tables = run(&c.0, &c.1, &["backbones".into()]).unwrap();
    assert_eq!(tables.len(), 2);
    let why = &tables[0].rows[0][0];
    assert!(tables[0].title.ends_with("skipped"), "{}", tables[0].title);
    assert!(
        why.contains("all-MiniLM-L6-v2") && why.contains("cargo xtask setup --models"),
        "{why}"
    );
    assert!(why.contains("cargo xtask setup --data"), "{why}");
    let why = &tables[1].rows[0][0];
    assert!(
        why.contains("SmolLM2") && why.contains("E2E-cleaned"),
        "{why}"
    );
    // No run was started.
    assert_eq!(std::fs::read_dir(out.join("runs")).unwrap().count(), 0);
}
