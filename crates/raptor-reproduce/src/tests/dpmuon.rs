//! The `dpmuon` part end to end at the `quick` scale on small E2E- and DART-style files:
//! cross-domain public pretraining, public proxy runs choosing each method's learning rate,
//! paired seeds, kept buffers and their bias, the tables with their computed notes, and reuse.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use crate::driver::{Context, Overrides, run};
use crate::paper::{D2tTask, Inputs};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

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

/// DART-style entries: `n` about colleges and 3 E2E-derived ones (E2E attributes as relations),
/// whose references repeat the E2E file's.
fn dart_entries(n: usize, offset: usize) -> Vec<(Vec<[String; 3]>, Vec<String>)> {
    let mut v = Vec::new();
    for i in 0..n {
        let c = format!("College{}", i + offset);
        let year = 1900 + (i + offset) % 90;
        v.push((
            vec![
                [c.clone(), "JOINED".into(), year.to_string()],
                [c.clone(), "NICKNAME".into(), format!("Team{}", i % 7)],
            ],
            vec![
                format!("{c} joined in {year} and is called Team{}.", i % 7),
                format!("The Team{} of {c} joined in {year}.", i % 7),
            ],
        ));
    }
    for i in 0..3 {
        let name = format!("Place{}", i + offset);
        v.push((
            vec![[name.clone(), "area".into(), "riverside".into()]],
            vec![format!("{name} is in the riverside.")],
        ));
    }
    v
}

fn dart_json(path: &Path, n: usize, offset: usize) {
    let entries: Vec<serde_json::Value> = dart_entries(n, offset)
        .into_iter()
        .map(|(ts, refs)| {
            serde_json::json!({
                "tripleset": ts,
                "annotations": refs.iter().map(|r| serde_json::json!({"source": "x", "text": r})).collect::<Vec<_>>(),
            })
        })
        .collect();
    std::fs::write(path, serde_json::to_string(&entries).unwrap()).unwrap();
}

fn dart_xml(path: &Path, n: usize, offset: usize) {
    let mut s = String::from("<?xml version='1.0' encoding='utf-8'?>\n<benchmark><entries>\n");
    for (i, (ts, refs)) in dart_entries(n, offset).into_iter().enumerate() {
        s.push_str(&format!("<entry eid=\"Id{i}\"><modifiedtripleset>"));
        for t in ts {
            s.push_str(&format!(
                "<mtriple>{} | {} | {}</mtriple>",
                t[0], t[1], t[2]
            ));
        }
        s.push_str("</modifiedtripleset>");
        for r in refs {
            s.push_str(&format!("<lex>{r}</lex>"));
        }
        s.push_str("</entry>\n");
    }
    s.push_str("</entries></benchmark>\n");
    std::fs::write(path, s).unwrap();
}

#[test]
fn quick_dpmuon_part_runs_end_to_end_and_reuses_finished_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d2t");
    std::fs::create_dir_all(&d).unwrap();
    e2e_file(&d.join("e2e-dev.csv"), 30, 0);
    // Each test file is public for the other task: large enough for a proxy as big as the
    // private set.
    e2e_file(&d.join("e2e-test.csv"), 60, 100);
    dart_json(&d.join("dart-dev.json"), 30, 0);
    dart_xml(&d.join("dart-test.xml"), 60, 200);
    let inputs = Inputs {
        cls: vec![],
        cls_missing: None,
        d2t: vec![
            D2tTask {
                name: "e2e".into(),
                format: "e2e".into(),
                dev: d.join("e2e-dev.csv"),
                test: d.join("e2e-test.csv"),
            },
            D2tTask {
                name: "dart".into(),
                format: "dart".into(),
                dev: d.join("dart-dev.json"),
                test: d.join("dart-test.xml"),
            },
        ],
        d2t_missing: vec![],
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
        d2t_data: d.clone(),
        device: raptor_train::config::DeviceSpec::Cpu,
        exe: Some(super::worker_exe()),
        workers: 2,
        json: false,
    };
    let only = vec!["dpmuon".to_string()];
    let tables = run(&ctx, &over, &only).unwrap();
    let slugs: Vec<&str> = tables.iter().map(|t| t.slug.as_str()).collect();
    assert_eq!(
        slugs,
        ["dpmuon-d2t", "dpmuon-curve", "dpmuon-lr", "dpmuon-bias"]
    );
    for t in &tables {
        t.check().unwrap();
    }
    let main = &tables[0];
    // Per task: the pretrained start, the three private methods and the two non-private
    // references at the first setting, every NLL measured.
    assert_eq!(main.rows.len(), 12, "{:?}", main.rows);
    for row in &main.rows {
        assert_ne!(row[4], "—", "{row:?}");
    }
    assert!(main.rows[0][1].starts_with("pretrained start"));
    // The decision rule comes before any number; the verdicts and the controls are computed.
    assert!(main.notes[0].starts_with("Decision rule"));
    let text = main.notes.join("\n");
    for t in ["e2e", "dart"] {
        assert!(
            text.contains(&format!("{t} at B=16: NLL positive control")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{t}: DP-Muon ≤ DP-Adam in test NLL: **")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{t}: at its first setting, the paper's ordering")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "{t}: first setting: expected batch 16, ε = 8, 4 updates, noise multiplier σ"
            )),
            "{text}"
        );
    }
    // DART's E2E-derived entries are dropped; the public corpora never hold a private or test
    // reference.
    assert!(
        text.contains("DART's E2E-derived entries dropped"),
        "{text}"
    );
    assert!(text.contains("after dropping 0 whose reference"), "{text}");
    // The curve: E2E at both settings (ε = 8 and 1 at B = 16), DART at the first only; each
    // row has its paired differences with a verdict and the measured noise share.
    let curve = &tables[1];
    assert_eq!(curve.rows.len(), 3, "{:?}", curve.rows);
    assert_eq!(
        curve.rows.iter().map(|r| r[2].as_str()).collect::<Vec<_>>(),
        ["8", "1", "8"]
    );
    for row in &curve.rows {
        assert!(row[5].ends_with('%'), "noise share measured: {row:?}");
        assert!(
            row[14].ends_with('%'),
            "Newton–Schulz bias measured: {row:?}"
        );
        assert!(row[10].contains("(n = 2)"), "{row:?}");
    }
    // Non-private references once per expected batch: the ε = 1 cell shares those of ε = 8.
    assert_eq!(curve.rows[0][9], curve.rows[1][9]);
    let curve_text = curve.notes.join("\n");
    assert!(
        curve_text.contains("e2e: DP-Muon − DP-Adam from the noisiest setting to the least noisy"),
        "{curve_text}"
    );
    // Learning rates: every grid point of every method in every cell, one chosen each (five
    // methods where the references run, three in the ε = 1 cell); σ of the proxy equals the
    // private runs' (as many proxy records as private ones).
    let lr = &tables[2];
    assert_eq!(lr.rows.len(), (5 + 3 + 5) * 2);
    assert_eq!(lr.rows.iter().filter(|r| r[6] == "✓").count(), 13);
    let lr_text = lr.notes.join("\n");
    assert!(lr_text.contains("(the same)"), "{lr_text}");
    assert!(!lr_text.contains("different"), "{lr_text}");
    // The chosen rates are those the private runs used.
    for row in main.rows.iter().filter(|r| r[1] == "DP-Adam") {
        let chosen = lr
            .rows
            .iter()
            .find(|l| l[0] == row[0] && l[2] == "8" && l[3] == "DP-Adam" && l[6] == "✓")
            .unwrap();
        assert_eq!(row[3], chosen[4]);
    }
    // Bias: kept buffers of both DP-Muon runs of the first seed, measured, with the sweep, at
    // the first setting; every setting's first-seed DP-Muon family kept its buffers.
    let bias = &tables[3];
    assert!(!bias.rows.is_empty());
    assert!(bias.rows.iter().any(|r| r[5] == "4"), "{:?}", bias.rows);
    assert!(bias.rows.iter().any(|r| r[1].contains("dp-muonbc")));
    assert!(bias.rows.iter().all(|r| r[1].contains("eps=8")));
    let runs: Vec<PathBuf> = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let kept: Vec<&PathBuf> = runs
        .iter()
        .filter(|r| r.join("diagnostics").join("bias.json").exists())
        .collect();
    assert_eq!(
        kept.len(),
        6,
        "three cells × DP-Muon and DP-MuonBC of the first seed"
    );
    for r in &kept {
        assert!(
            r.join("diagnostics")
                .join("buffers-000002.safetensors")
                .exists()
        );
    }
    for f in [
        "dpmuon-nll-e2e.png",
        "dpmuon-nll-dart.png",
        "dpmuon-bias.png",
        "dpmuon-curve.png",
    ] {
        let bytes = std::fs::read(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{f}");
    }
    // A second reproduce reuses every run, the pretraining and the bias estimates.
    let before = std::fs::read_to_string(out.join("dpmuon-lr.md")).unwrap();
    let again = run(&ctx, &over, &only).unwrap();
    assert_eq!(again.len(), 4);
    assert_eq!(
        std::fs::read_to_string(out.join("dpmuon-lr.md")).unwrap(),
        before
    );
    assert_eq!(again[1].rows, tables[1].rows);
    assert_eq!(again[3].rows, tables[3].rows);
    assert_eq!(
        std::fs::read_dir(out.join("runs")).unwrap().count(),
        runs.len()
    );
}
