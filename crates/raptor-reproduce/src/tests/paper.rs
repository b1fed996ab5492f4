//! The paper parts of `raptor-reproduce`, end to end at the `quick` scale: the multi-domain
//! task from a toy corpus with a `domain` column, public pretraining (tokenizer and model from
//! public records only, cached), the routers trained toward the domains and the experts'
//! continued training (cached), the gated positive control and the DP stage, the tables with
//! their computed notes, the plots, the results index, and reuse of finished runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use crate::driver::{Context, Overrides, run};
use crate::paper::{ClsTask, D2tTask, Inputs};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A small E2E-style file: `sources` meaning representations, two references each.
fn e2e_file(path: &Path, sources: usize, offset: usize) {
    let foods = ["Thai", "Italian", "French", "Indian", "Chinese", "English"];
    let areas = ["riverside", "city centre"];
    let mut s = String::from("mr,ref\n");
    for i in 0..sources {
        let name = format!("Place{}", i + offset);
        let food = foods[(i + offset) % foods.len()];
        let area = areas[(i + offset) % areas.len()];
        let mr = format!("name[{name}], food[{food}], area[{area}]");
        s.push_str(&format!(
            "\"{mr}\",\"{name} serves {food} food in the {area}.\"\n"
        ));
        s.push_str(&format!(
            "\"{mr}\",\"In the {area}, {name} offers {food} dishes.\"\n"
        ));
    }
    std::fs::write(path, s).unwrap();
}

/// A toy multi-domain corpus (`text`, `label`, `domain`): two domains with their own words,
/// the same sentiment words in both, `per_cell` records per (domain, label) in each of the
/// `public`, `train` and `validation` files.
pub(crate) fn multidomain_toy(dir: &Path, per_cell: [usize; 3]) -> ClsTask {
    let domain_words = [
        ["flight", "gate", "seat", "crew"],
        ["stage", "band", "lineup", "tent"],
    ];
    let sentiment = [
        ["awful", "late", "hate", "rude"],
        ["great", "love", "fine", "fun"],
    ];
    let filler = ["the", "a", "today", "again", "so"];
    std::fs::create_dir_all(dir).unwrap();
    let mut k = 0usize;
    for (split, n) in ["public", "train", "validation"].iter().zip(per_cell) {
        let mut s = String::from("text\tlabel\tdomain\n");
        for i in 0..n {
            for (d, dw) in domain_words.iter().enumerate() {
                for (l, sw) in sentiment.iter().enumerate() {
                    k += 1;
                    let text = format!(
                        "{} {} {} {} {} {k}",
                        dw[(i + l) % 4],
                        filler[(i + d) % 5],
                        sw[i % 4],
                        dw[(i + 2) % 4],
                        sw[(i + 1) % 4]
                    );
                    let label = ["negative", "positive"][l];
                    s.push_str(&format!("{text}\t{label}\t{}\n", ["a", "b"][d]));
                }
            }
        }
        std::fs::write(dir.join(format!("{split}.tsv")), s).unwrap();
    }
    ClsTask {
        name: "toy".into(),
        public: dir.join("public.tsv"),
        train: dir.join("train.tsv"),
        validation: dir.join("validation.tsv"),
    }
}

fn md(out: &Path, slug: &str) -> String {
    std::fs::read_to_string(out.join(format!("{slug}.md")))
        .unwrap_or_else(|e| panic!("{slug}.md: {e}"))
}

#[test]
fn quick_paper_grid_runs_end_to_end_and_reuses_finished_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let d2t = tmp.path().join("d2t");
    std::fs::create_dir_all(&d2t).unwrap();
    e2e_file(&d2t.join("dev.csv"), 30, 0);
    e2e_file(&d2t.join("test.csv"), 6, 100);
    let inputs = Inputs {
        cls: vec![multidomain_toy(&tmp.path().join("toy"), [30, 40, 20])],
        cls_missing: None,
        d2t: vec![D2tTask {
            name: "e2e".into(),
            format: "e2e".into(),
            dev: d2t.join("dev.csv"),
            test: d2t.join("test.csv"),
        }],
        d2t_missing: vec!["DART: not in this test".into()],
        cache: tmp.path().join("cache"),
        device: raptor_train::config::DeviceSpec::Cpu,
    };
    let out = tmp.path().join("results");
    let over = Overrides {
        paper: Some(inputs),
        backbones: None,
    };
    let ctx = Context {
        root: root(),
        out: out.clone(),
        profile: crate::driver::Profile::Quick,
        cache: None,
        d2t_data: d2t.clone(),
        device: raptor_train::config::DeviceSpec::Cpu,
        exe: Some(super::worker_exe()),
        workers: 2,
        json: false,
    };
    let only = vec!["paper".to_string()];
    let tables = run(&ctx, &over, &only).unwrap();
    let slugs: Vec<&str> = tables.iter().map(|t| t.slug.as_str()).collect();
    assert_eq!(
        slugs,
        [
            "paper-evidence",
            "paper-domains",
            "paper-table1",
            "paper-table5-ablation",
            "paper-layer-choice",
            "paper-diagnostics",
            "paper-cost",
        ]
    );
    for t in &tables {
        t.check().unwrap();
    }
    // The evidence table: one row per (task, ε), the baselines beside the backbone, every cell
    // computed, a verdict by the rule written before the numbers, the gated positive control,
    // the experts' specialisation and the public-only tuning recorded.
    let ev = &tables[0];
    assert_eq!(ev.rows.len(), 2);
    for row in &ev.rows {
        assert_eq!(row.len(), ev.columns.len());
        assert_eq!(row[2], "50.0", "{row:?}");
        assert!(row[3].contains(" / "), "{row:?}");
        for c in &row[4..10] {
            assert!(c.contains('±'), "{row:?}");
        }
        assert!(row[10].contains("[MDE"), "{row:?}");
        assert!(
            row[12].starts_with("reproduced")
                || row[12].starts_with("not reproduced")
                || row[12].starts_with("undecided"),
            "{row:?}"
        );
    }
    let evtext = ev.notes.join("\n");
    assert!(
        evtext.starts_with("Decision rule (fixed before the runs)"),
        "{evtext}"
    );
    for want in [
        "positive control",
        "PASSES",
        "RAPTOR's advantage reproduced in",
        "Headroom, from the best of these",
        "naive Bayes",
        "routers trained toward the domains",
        "owner–domain agreement",
        "on the flipped domains vs",
        "label meaning flipped in b",
        "the ε that calibrates the private run's σ",
        "(proxy)",
    ] {
        assert!(evtext.contains(want), "{want}: {evtext}");
    }
    assert!(md(&out, "paper-evidence").contains("(raptor-paired-differences.png)"));
    // The per-domain table: the baselines, then every method, on each group of validation
    // records.
    let dm = &tables[1];
    assert_eq!(
        dm.columns,
        ["task", "method", "a", "b", "flipped", "unflipped", "all"]
    );
    assert_eq!(dm.rows.len(), 3 + 3 + 6);
    assert!(dm.rows[4][2].contains('±'), "{:?}", dm.rows[4]);
    // Table 1: the non-private row and the three private methods, one column per ε (quick: 1, 8).
    let t1 = &tables[2];
    assert_eq!(t1.columns, ["method", "multidomain ε=1", "multidomain ε=8"]);
    assert_eq!(t1.rows.len(), 4);
    for row in &t1.rows {
        for c in &row[1..] {
            // "mean ± half-width" over 2 seeds, accuracy in percent.
            let mean: f64 = c.split(' ').next().unwrap().parse().unwrap();
            assert!((0.0..=100.0).contains(&mean), "{c}");
            assert!(c.contains('±'), "{c}");
        }
    }
    // The ordering sentences are computed, and ε never exceeds its target.
    let text = t1.notes.join("\n");
    assert!(
        text.contains("RAPTOR ≥ DP-Adam LoRA (monolithic) in"),
        "{text}"
    );
    assert!(text.contains("Target ε = 1:") && text.contains("within the target"));
    assert!(!text.contains("ABOVE"), "{text}");
    assert!(
        evtext.contains("hyperparameters chosen on the public proxy only"),
        "{evtext}"
    );
    // Plots exist and are PNG files; the notes link them.
    for f in [
        "accuracy-vs-epsilon-multidomain.png",
        "training-loss-multidomain.png",
        "validation-accuracy-multidomain.png",
        "routing-entropy-multidomain.png",
        "raptor-paired-differences.png",
    ] {
        let bytes = std::fs::read(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{f}");
    }
    assert!(md(&out, "paper-table1").contains("(accuracy-vs-epsilon-multidomain.png)"));
    // Ablation: the full method plus four ablations, each with a delta.
    assert_eq!(tables[3].rows.len(), 5);
    // Layer choice: three rules; the entropy-selected row names a sparse block.
    let lc = &tables[4];
    assert_eq!(lc.rows.len(), 3);
    assert!(lc.rows[0][1].parse::<usize>().is_ok(), "{:?}", lc.rows[0]);
    let index = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(index.contains("Table 1 (miniature)"));
    // Every gate and DP run was scored per group of validation records.
    let summaries: Vec<crate::paper::runs::Summary> = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .map(|e| crate::paper::runs::Summary::read(&e.unwrap().path()).unwrap())
        .collect();
    let grouped = summaries
        .iter()
        .filter(|s| !s.group_accuracy.is_empty())
        .count();
    // 2 seeds × (start, LoRA, LoRA without experts, 3 methods × 2 ε) + ablations.
    assert!(grouped >= 18, "{grouped}");

    // Every run folder holds a summary; a second reproduce reuses them (no new folder, same
    // numbers) and reuses the cached pretrained models and tokenizers.
    let runs: Vec<_> = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(runs.iter().all(|r| r.join("summary.json").exists()));
    let before = md(&out, "paper-table1");
    // The pretraining and the experts' continued training; the routed model.
    let cached_models = std::fs::read_dir(tmp.path().join("cache/reproduce/pretrained"))
        .unwrap()
        .count();
    assert_eq!(cached_models, 2);
    let routed = std::fs::read_dir(tmp.path().join("cache/reproduce/routed"))
        .unwrap()
        .count();
    assert_eq!(routed, 1);
    let again = run(&ctx, &over, &only).unwrap();
    assert_eq!(again.len(), tables.len());
    assert_eq!(md(&out, "paper-table1"), before);
    let runs_after = std::fs::read_dir(out.join("runs")).unwrap().count();
    assert_eq!(runs_after, runs.len());
}

#[test]
fn missing_corpora_are_reported_not_fatal() {
    let tmp = tempfile::tempdir().unwrap();
    let inputs = Inputs::real(
        &tmp.path().join("empty-cache"),
        tmp.path(),
        raptor_train::config::DeviceSpec::Cpu,
    );
    assert!(inputs.cls.is_empty());
    let why = inputs.cls_missing.clone().unwrap();
    assert!(why.contains("cargo xtask setup --data"), "{why}");
    assert_eq!(inputs.d2t_missing.len(), 2);
    let out = tmp.path().join("results");
    let over = Overrides {
        paper: Some(inputs),
        backbones: None,
    };
    let ctx = Context {
        root: root(),
        out: out.clone(),
        profile: crate::driver::Profile::Quick,
        cache: None,
        d2t_data: tmp.path().to_path_buf(),
        device: raptor_train::config::DeviceSpec::Cpu,
        exe: None,
        workers: 1,
        json: false,
    };
    let tables = run(&ctx, &over, &["paper".into(), "dpmuon".into()]).unwrap();
    // One skipped paper table, then the data-to-text part's.
    assert!(tables.len() >= 2, "{}", tables.len());
    assert_eq!(
        tables
            .iter()
            .filter(|t| t.slug.starts_with("paper"))
            .count(),
        1
    );
    assert!(tables[0].title.ends_with("skipped"), "{}", tables[0].title);
    assert!(tables[0].rows[0][0].contains("cargo xtask setup --data"));
    assert!(
        tables[1].notes.iter().any(|n| n.contains("E2E-cleaned")),
        "{:?}",
        tables[1]
    );
    let err = run(&ctx, &over, &["tables".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown part"), "{err}");
}
