//! Agreement with independent Python implementations: sacrebleu 2.6.0, rouge-score 0.1.2 and
//! scipy 1.17.1 (`fixtures/eval/generate.py`, which writes the golden files read here).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use raptor_eval::{
    audit, corpus_bleu, corpus_rouge_l, mean_ci, mia, rouge_l_multi, tokenize_13a, wilson_interval,
};
use raptor_testkit::golden;
use serde_json::Value;

fn load(name: &str) -> Value {
    golden::json(&format!("eval/{name}"))
}

fn close(a: f64, b: f64, tol: f64, what: &str) {
    assert!(
        (a - b).abs() <= tol,
        "{what}: raptor {a} vs reference {b} (|diff| {:e} > {tol:e})",
        (a - b).abs()
    );
}

#[test]
fn tokenizer_13a_matches_sacrebleu() {
    let g = load("text_metrics.json");
    let cases = g["tokens_13a"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        assert_eq!(
            tokenize_13a(text),
            golden::strings(&c["tokens"]),
            "13a of {text:?}"
        );
    }
}

#[test]
fn bleu_and_rouge_l_match_sacrebleu_and_rouge_score() {
    let g = load("text_metrics.json");
    assert_eq!(g["versions"]["sacrebleu"], "2.6.0");
    let corpora = g["corpora"].as_array().unwrap();
    assert!(corpora.len() >= 40);
    let mut worst_bleu = 0.0f64;
    let mut worst_rouge = 0.0f64;
    for c in corpora {
        let name = c["name"].as_str().unwrap();
        let hyps = golden::strings(&c["hypotheses"]);
        let refs: Vec<Vec<String>> = c["references"]
            .as_array()
            .unwrap()
            .iter()
            .map(golden::strings)
            .collect();
        let b = corpus_bleu(&hyps, &refs).unwrap();
        close(
            b.score,
            c["bleu"].as_f64().unwrap(),
            1e-4,
            &format!("{name}: BLEU"),
        );
        worst_bleu = worst_bleu.max((b.score - c["bleu"].as_f64().unwrap()).abs());
        for (p, q) in b.precisions.iter().zip(golden::f64s(&c["bleu_precisions"])) {
            close(*p, q, 1e-9, &format!("{name}: precision"));
        }
        close(
            b.brevity_penalty,
            c["bleu_bp"].as_f64().unwrap(),
            1e-12,
            &format!("{name}: BP"),
        );
        assert_eq!(
            b.stats.sys_len,
            c["bleu_sys_len"].as_u64().unwrap(),
            "{name}: sys_len"
        );
        assert_eq!(
            b.stats.ref_len,
            c["bleu_ref_len"].as_u64().unwrap(),
            "{name}: ref_len"
        );
        let r = corpus_rouge_l(&hyps, &refs).unwrap();
        close(
            r,
            c["rouge_l"].as_f64().unwrap(),
            1e-4,
            &format!("{name}: ROUGE-L"),
        );
        worst_rouge = worst_rouge.max((r - c["rouge_l"].as_f64().unwrap()).abs());
        for (i, (h, want)) in hyps
            .iter()
            .zip(golden::f64s(&c["rouge_l_each"]))
            .enumerate()
        {
            let got = rouge_l_multi(i, &refs[i], h).unwrap().fmeasure;
            close(
                got,
                want,
                1e-12,
                &format!("{name}: ROUGE-L of hypothesis {i}"),
            );
        }
    }
    println!(
        "worst |ΔBLEU| = {worst_bleu:e}, worst |ΔROUGE-L| = {worst_rouge:e} over {} corpora",
        corpora.len()
    );
}

#[test]
fn audit_p_values_and_bounds_match_scipy() {
    let g = load("audit.json");
    for c in g["p_values"].as_array().unwrap() {
        let (m, r, v) = (
            c["m"].as_u64().unwrap(),
            c["r"].as_u64().unwrap(),
            c["v"].as_u64().unwrap(),
        );
        let p = audit::p_value(
            m,
            r,
            v,
            c["eps"].as_f64().unwrap(),
            c["delta"].as_f64().unwrap(),
        )
        .unwrap();
        let want = c["p"].as_f64().unwrap();
        // Relative 1e-9 or absolute 1e-15 (tiny tail probabilities).
        assert!(
            (p - want).abs() <= 1e-9 * want.abs() + 1e-15,
            "{c}: {p} vs {want}"
        );
    }
    for c in g["epsilon_bounds"].as_array().unwrap() {
        let (m, r, v) = (
            c["m"].as_u64().unwrap(),
            c["r"].as_u64().unwrap(),
            c["v"].as_u64().unwrap(),
        );
        let e = audit::epsilon_lower_bound(
            m,
            r,
            v,
            c["delta"].as_f64().unwrap(),
            c["confidence"].as_f64().unwrap(),
        )
        .unwrap();
        close(
            e,
            c["epsilon_lower"].as_f64().unwrap(),
            1e-6,
            &format!("ε lower bound of {c}"),
        );
    }
}

#[test]
fn audit_search_matches_scipy() {
    let g = load("audit.json");
    for c in g["searches"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let scores = golden::f64s(&c["scores"]);
        let included: Vec<bool> = c["included"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_bool().unwrap())
            .collect();
        let grid: Vec<(usize, usize)> = c["grid"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p[0].as_u64().unwrap() as usize,
                    p[1].as_u64().unwrap() as usize,
                )
            })
            .collect();
        let a = audit::audit_search(
            &scores,
            &included,
            c["delta"].as_f64().unwrap(),
            c["confidence"].as_f64().unwrap(),
            &grid,
        )
        .unwrap();
        close(
            a.epsilon_lower,
            c["epsilon_lower"].as_f64().unwrap(),
            1e-6,
            name,
        );
        assert_eq!(
            (a.k_plus, a.k_minus),
            (
                c["k_plus"].as_u64().unwrap() as usize,
                c["k_minus"].as_u64().unwrap() as usize
            ),
            "{name}"
        );
        assert_eq!(
            (a.guesses, a.correct),
            (
                c["guesses"].as_u64().unwrap(),
                c["correct"].as_u64().unwrap()
            ),
            "{name}"
        );
        assert_eq!(a.pairs_tried, grid.len());
        close(a.per_pair_level, 0.05 / grid.len() as f64, 1e-15, name);
    }
}

#[test]
fn mia_matches_scipy() {
    let g = load("audit.json");
    for c in g["mia"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let (pos, neg) = (golden::f64s(&c["members"]), golden::f64s(&c["non_members"]));
        let r = mia::mia_report(&pos, &neg).unwrap();
        close(
            r.auc,
            c["auc"].as_f64().unwrap(),
            1e-6,
            &format!("{name}: AUC"),
        );
        close(
            r.tpr_at_1pct_fpr,
            c["tpr_at_1pct_fpr"].as_f64().unwrap(),
            1e-6,
            &format!("{name}: TPR@1%"),
        );
        close(
            r.tpr_at_0_1pct_fpr,
            c["tpr_at_0_1pct_fpr"].as_f64().unwrap(),
            1e-6,
            &format!("{name}: TPR@0.1%"),
        );
        close(
            mia::tpr_at_fpr(&pos, &neg, 0.1).unwrap(),
            c["tpr_at_10pct_fpr"].as_f64().unwrap(),
            1e-6,
            name,
        );
    }
}

#[test]
fn intervals_match_scipy() {
    let g = load("audit.json");
    for c in g["t_intervals"].as_array().unwrap() {
        let ci = mean_ci(&golden::f64s(&c["values"]), c["level"].as_f64().unwrap()).unwrap();
        close(ci.mean, c["mean"].as_f64().unwrap(), 1e-12, "mean");
        close(
            ci.lower(),
            c["lower"].as_f64().unwrap(),
            1e-9,
            &format!("t lower of {c}"),
        );
        close(
            ci.upper(),
            c["upper"].as_f64().unwrap(),
            1e-9,
            &format!("t upper of {c}"),
        );
    }
    for c in g["wilson"].as_array().unwrap() {
        let ci = wilson_interval(
            c["successes"].as_u64().unwrap(),
            c["trials"].as_u64().unwrap(),
            c["level"].as_f64().unwrap(),
        )
        .unwrap();
        close(
            ci.lower,
            c["lower"].as_f64().unwrap(),
            1e-9,
            &format!("Wilson lower of {c}"),
        );
        close(
            ci.upper,
            c["upper"].as_f64().unwrap(),
            1e-9,
            &format!("Wilson upper of {c}"),
        );
    }
}
