//! The paper parts of `raptor-reproduce`, end to end at the `quick` scale: public pretraining
//! (tokenizer and model from the public split only, cached), the private fine-tuning grid, the
//! tables with their computed notes, the plots, the results index, and reuse of finished runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use crate::driver::{Context, run};
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

fn md(out: &Path, slug: &str) -> String {
    std::fs::read_to_string(out.join(format!("{slug}.md")))
        .unwrap_or_else(|e| panic!("{slug}.md: {e}"))
}

#[test]
fn quick_paper_grid_runs_end_to_end_and_reuses_finished_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let toy = root().join("examples").join("toy");
    let d2t = tmp.path().join("d2t");
    std::fs::create_dir_all(&d2t).unwrap();
    e2e_file(&d2t.join("dev.csv"), 30, 0);
    e2e_file(&d2t.join("test.csv"), 6, 100);
    let inputs = Inputs {
        cls: vec![ClsTask {
            name: "toy".into(),
            // Labelled public records (pretraining is supervised on the public split).
            public: toy.join("test.csv"),
            train: toy.join("train.csv"),
            validation: toy.join("valid.csv"),
        }],
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
    let ctx = Context {
        root: root(),
        out: out.clone(),
        profile: crate::driver::Profile::Quick,
        cache: None,
        d2t_data: d2t.clone(),
        inputs: Some(inputs),
        backbones: None,
        device: raptor_train::config::DeviceSpec::Cpu,
        exe: Some(super::worker_exe()),
        workers: 2,
        json: false,
    };
    let only = vec!["paper".to_string()];
    let tables = run(&ctx, &only).unwrap();
    let slugs: Vec<&str> = tables.iter().map(|t| t.slug.as_str()).collect();
    assert_eq!(
        slugs,
        [
            "paper-evidence",
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
    // The evidence table: one row per (task, ε), every cell computed, a verdict by the rule
    // written before the numbers, the positive control and the public-only tuning recorded.
    let ev = &tables[0];
    assert_eq!(ev.rows.len(), 2);
    for row in &ev.rows {
        assert_eq!(row.len(), ev.columns.len());
        for c in &row[2..8] {
            assert!(c.contains('±'), "{row:?}");
        }
        assert!(
            row[10].starts_with("reproduced")
                || row[10].starts_with("not reproduced")
                || row[10].starts_with("undecided"),
            "{row:?}"
        );
    }
    let evtext = ev.notes.join("\n");
    assert!(
        evtext.starts_with("Decision rule (fixed before the runs)"),
        "{evtext}"
    );
    assert!(evtext.contains("positive control"), "{evtext}");
    assert!(
        evtext.contains("RAPTOR's advantage reproduced in"),
        "{evtext}"
    );
    assert!(evtext.contains("headroom"), "{evtext}");
    assert!(md(&out, "paper-evidence").contains("(raptor-paired-differences.png)"));
    // Table 1: the non-private row and the three private methods, one column per ε (quick: 1, 8).
    let t1 = &tables[1];
    assert_eq!(t1.columns, ["method", "toy ε=1", "toy ε=8"]);
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
    assert!(text.contains("pretraining on toy's public split"), "{text}");
    assert!(
        text.contains("hyperparameters chosen on the public proxy only"),
        "{text}"
    );
    // Plots exist and are PNG files; the notes link them.
    for f in [
        "accuracy-vs-epsilon-toy.png",
        "training-loss-toy.png",
        "validation-accuracy-toy.png",
        "routing-entropy-toy.png",
        "raptor-paired-differences.png",
    ] {
        let bytes = std::fs::read(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{f}");
    }
    assert!(md(&out, "paper-table1").contains("(accuracy-vs-epsilon-toy.png)"));
    // Ablation: the full method plus four ablations, each with a delta.
    assert_eq!(tables[2].rows.len(), 5);
    // Layer choice: three rules; the entropy-selected row names a sparse block.
    let lc = &tables[3];
    assert_eq!(lc.rows.len(), 3);
    assert!(lc.rows[0][1].parse::<usize>().is_ok(), "{:?}", lc.rows[0]);
    let index = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(index.contains("Table 1 (miniature)"));

    // Every run folder holds a summary; a second reproduce reuses them (no new folder, same
    // numbers) and reuses the cached pretrained models and tokenizers.
    let runs: Vec<_> = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(runs.iter().all(|r| r.join("summary.json").exists()));
    let before = md(&out, "paper-table1");
    let cached_models = std::fs::read_dir(tmp.path().join("cache/reproduce/pretrained"))
        .unwrap()
        .count();
    assert_eq!(cached_models, 1);
    let again = run(&ctx, &only).unwrap();
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
    let ctx = Context {
        root: root(),
        out: out.clone(),
        profile: crate::driver::Profile::Quick,
        cache: None,
        d2t_data: tmp.path().to_path_buf(),
        inputs: Some(inputs),
        backbones: None,
        device: raptor_train::config::DeviceSpec::Cpu,
        exe: None,
        workers: 1,
        json: false,
    };
    let tables = run(&ctx, &["paper".into(), "dpmuon".into()]).unwrap();
    assert_eq!(tables.len(), 4);
    assert!(tables[0].rows[0][0].contains("cargo xtask setup --data"));
    assert!(
        tables[1].notes.iter().any(|n| n.contains("E2E-cleaned")),
        "{:?}",
        tables[1]
    );
    let err = run(&ctx, &["tables".into()]).unwrap_err().to_string();
    assert!(err.contains("unknown part"), "{err}");
}
