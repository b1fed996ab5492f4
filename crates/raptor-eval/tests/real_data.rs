//! Leave-one-out BLEU and ROUGE-L on the real E2E and DART evaluation files, read with
//! raptor-data, against sacrebleu and rouge-score on the same files (`fixtures/eval/
//! real_data.json`, numbers only). Skipped, with one line, when the files are absent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use raptor_data::{D2tDataset, read_dart_xml, read_e2e};
use raptor_eval::{corpus_bleu, corpus_rouge_l};

/// For each source with ≥ 2 references: the first as hypothesis, the others as references.
fn leave_one_out(ds: &D2tDataset) -> (Vec<String>, Vec<Vec<String>>) {
    let groups: Vec<_> = ds
        .group_by_source()
        .into_iter()
        .filter(|g| g.references.len() >= 2)
        .collect();
    let hyps = groups.iter().map(|g| g.references[0].clone()).collect();
    let refs = groups.iter().map(|g| g.references[1..].to_vec()).collect();
    (hyps, refs)
}

#[test]
fn leave_one_out_scores_match_sacrebleu_and_rouge_score() {
    let Some(shared) = raptor_testkit::paths::shared_data_dir() else {
        println!("skipped: no shared/data folder beside the workspace");
        return;
    };
    let golden = raptor_testkit::golden::json("eval/real_data.json");
    let mut ran = 0;
    for (rel, read) in [
        (
            "e2e/test-fixed.csv",
            read_e2e as fn(&Path) -> Result<D2tDataset, raptor_data::DataError>,
        ),
        ("e2e/devel-fixed.no-ol.csv", read_e2e),
        ("dart/dart-v1.1.1-full-test.xml", read_dart_xml),
    ] {
        let path = shared.join(rel);
        if !path.exists() {
            println!("skipped: {} not present", path.display());
            continue;
        }
        let want = &golden["files"][rel];
        let (hyps, refs) = leave_one_out(&read(&path).unwrap());
        assert_eq!(
            hyps.len() as u64,
            want["groups"].as_u64().unwrap(),
            "{rel}: groups"
        );
        let bleu = corpus_bleu(&hyps, &refs).unwrap().score;
        let rouge = corpus_rouge_l(&hyps, &refs).unwrap();
        let db = (bleu - want["bleu"].as_f64().unwrap()).abs();
        let dr = (rouge - want["rouge_l"].as_f64().unwrap()).abs();
        println!(
            "{rel}: {} groups, BLEU {bleu:.4} (|Δ| {db:.1e}), ROUGE-L {rouge:.6} (|Δ| {dr:.1e})",
            hyps.len()
        );
        assert!(db < 1e-4, "{rel}: BLEU {bleu}");
        assert!(dr < 1e-4, "{rel}: ROUGE-L {rouge}");
        ran += 1;
    }
    if ran == 0 {
        println!("skipped: no E2E/DART file under {}", shared.display());
    }
}
