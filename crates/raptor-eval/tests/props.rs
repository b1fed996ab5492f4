//! Properties and slow obvious references.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use raptor_eval::{
    EvalError, audit, corpus_bleu, lcs_len, mean_ci, mia, nll_perplexity, rouge_l, wilson_interval,
};

/// LCS by enumerating every subsequence of the shorter sequence (exponential; tiny inputs only).
fn lcs_brute(a: &[u8], b: &[u8]) -> usize {
    let (s, t) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let mut best = 0;
    for mask in 0u32..(1 << s.len()) {
        let sub: Vec<u8> = (0..s.len())
            .filter(|i| mask >> i & 1 == 1)
            .map(|i| s[i])
            .collect();
        let mut it = t.iter();
        if sub.iter().all(|c| it.any(|x| x == c)) {
            best = best.max(sub.len());
        }
    }
    best
}

fn auc_brute(pos: &[f64], neg: &[f64]) -> f64 {
    let mut w = 0.0;
    for p in pos {
        for n in neg {
            w += if p > n {
                1.0
            } else if p == n {
                0.5
            } else {
                0.0
            };
        }
    }
    w / (pos.len() * neg.len()) as f64
}

fn tpr_brute(pos: &[f64], neg: &[f64], alpha: f64) -> f64 {
    // Every threshold in a fine grid over the score range and beyond.
    let mut best = 0.0f64;
    let mut ts: Vec<f64> = pos.iter().chain(neg).copied().collect();
    ts.push(f64::INFINITY);
    for t in ts {
        let fpr = neg.iter().filter(|&&x| x >= t).count() as f64 / neg.len() as f64;
        if fpr <= alpha {
            best = best.max(pos.iter().filter(|&&x| x >= t).count() as f64 / pos.len() as f64);
        }
    }
    best
}

proptest! {
    #[test]
    fn lcs_matches_brute_force(a in proptest::collection::vec(0u8..4, 0..10), b in proptest::collection::vec(0u8..4, 0..10)) {
        prop_assert_eq!(lcs_len(&a, &b), lcs_brute(&a, &b));
    }

    #[test]
    fn auc_and_tpr_match_brute_force(
        pos in proptest::collection::vec(-5i32..5, 1..40),
        neg in proptest::collection::vec(-5i32..5, 1..40),
        alpha in 0.0f64..1.0,
    ) {
        // Small integer scores: many ties.
        let pos: Vec<f64> = pos.into_iter().map(f64::from).collect();
        let neg: Vec<f64> = neg.into_iter().map(f64::from).collect();
        prop_assert!((mia::roc_auc(&pos, &neg).unwrap() - auc_brute(&pos, &neg)).abs() < 1e-12);
        prop_assert_eq!(mia::tpr_at_fpr(&pos, &neg, alpha).unwrap(), tpr_brute(&pos, &neg, alpha));
    }

    #[test]
    fn bleu_in_range_and_perfect_on_copies(words in proptest::collection::vec("[a-z]{1,5}", 4..20)) {
        let s = words.join(" ");
        let b = corpus_bleu(&[s.as_str()], &[vec![s.as_str()]]).unwrap();
        prop_assert!((b.score - 100.0).abs() < 1e-9);
        let half = words[..words.len() / 2].join(" ");
        let b = corpus_bleu(&[half.as_str()], &[vec![s.as_str()]]).unwrap();
        prop_assert!((0.0..100.0).contains(&b.score));
        prop_assert!(b.brevity_penalty < 1.0);
    }

    #[test]
    fn rouge_l_in_unit_interval(a in "[a-z ]{0,30}", b in "[a-z ]{0,30}") {
        let s = rouge_l(&a, &b);
        prop_assert!((0.0..=1.0).contains(&s.fmeasure));
        // F is symmetric in its two arguments (P and R swap).
        prop_assert!((s.fmeasure - rouge_l(&b, &a).fmeasure).abs() < 1e-12);
    }

    #[test]
    fn p_value_monotone_in_epsilon(r in 1u64..200, frac in 0.0f64..=1.0, e1 in 0.0f64..5.0, e2 in 0.0f64..5.0, delta in 0.0f64..1e-3) {
        let v = ((r as f64) * frac).round() as u64;
        let (lo, hi) = if e1 <= e2 { (e1, e2) } else { (e2, e1) };
        let p_lo = audit::p_value(1000, r, v, lo, delta).unwrap();
        let p_hi = audit::p_value(1000, r, v, hi, delta).unwrap();
        prop_assert!(p_lo <= p_hi + 1e-12, "{} > {}", p_lo, p_hi);
        prop_assert!((0.0..=1.0).contains(&p_lo));
    }

    #[test]
    fn bound_monotone_in_correct_guesses(r in 10u64..300, v in 0u64..300) {
        let v = v.min(r - 1);
        let a = audit::epsilon_lower_bound(1000, r, v, 1e-5, 0.95).unwrap();
        let b = audit::epsilon_lower_bound(1000, r, v + 1, 1e-5, 0.95).unwrap();
        prop_assert!(a <= b + 1e-9);
        // The bound is the edge of rejection: just below it the null is rejected.
        if a > 0.0 {
            prop_assert!(audit::p_value(1000, r, v, a, 1e-5).unwrap() < 0.05);
            prop_assert!(audit::p_value(1000, r, v, a + 1e-8, 1e-5).unwrap() >= 0.05);
        }
    }
}

/// The audit can fail, and is sound on a mechanism that truly is ε-DP: randomized response.
#[test]
fn audit_on_simulated_mechanisms() {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(14);
    let m = 10_000usize;
    let included: Vec<bool> = (0..m).map(|_| rng.random::<bool>()).collect();
    let grid = [(100, 100), (500, 500), (2000, 2000), (5000, 5000)];
    // Broken mechanism (no noise, no clipping): scores reveal membership.
    let leaky: Vec<f64> = included
        .iter()
        .map(|&b| if b { 1.0 } else { 0.0 } + rng.random::<f64>() * 0.1)
        .collect();
    let a = audit::audit_search(&leaky, &included, 1e-5, 0.95, &grid).unwrap();
    assert!(a.epsilon_lower > 4.0, "a leaky run must be caught: {a:?}");
    // Exactly ε-DP mechanism (randomized response with ε = 1 on each canary's bit); its
    // score is the released bit plus a tiny tie-breaking jitter.
    for eps in [1.0f64, 4.0] {
        let q = eps.exp() / (1.0 + eps.exp());
        let rr: Vec<f64> = included
            .iter()
            .map(|&b| {
                let bit = if rng.random::<f64>() < q { b } else { !b };
                f64::from(u8::from(bit)) + rng.random::<f64>() * 1e-3
            })
            .collect();
        let a = audit::audit_search(&rr, &included, 1e-5, 0.95, &grid).unwrap();
        assert!(
            a.epsilon_lower <= eps,
            "ε = {eps}: lower bound {} above the truth",
            a.epsilon_lower
        );
        assert!(
            a.epsilon_lower > 0.5 * eps,
            "ε = {eps}: bound {} should be informative",
            a.epsilon_lower
        );
    }
}

#[test]
fn errors_and_undefined_values() {
    assert!(mean_ci(&[0.7], 0.95).unwrap().half_width.is_nan());
    assert_eq!(
        mean_ci(&[0.7], 0.95).unwrap().to_string(),
        "0.70 ± undefined (n = 1)"
    );
    assert_eq!(
        mean_ci(&[0.5, 0.7], 0.95).unwrap().to_string(),
        "0.60 ± 1.27"
    );
    assert_eq!(mean_ci(&[], 0.95), Err(EvalError::Empty { what: "values" }));
    assert!(matches!(
        mean_ci(&[1.0, f64::NAN], 0.95),
        Err(EvalError::InvalidValue { index: 1, .. })
    ));
    assert!(matches!(
        mean_ci(&[1.0], 1.0),
        Err(EvalError::OutOfRange { .. })
    ));
    assert!(matches!(
        wilson_interval(3, 2, 0.95),
        Err(EvalError::InvalidCounts(_))
    ));
    assert!(matches!(
        wilson_interval(0, 0, 0.95),
        Err(EvalError::Empty { .. })
    ));
    assert!(matches!(
        nll_perplexity(&[(1.0, 0)]),
        Err(EvalError::Empty { .. })
    ));
    assert!(matches!(
        nll_perplexity(&[(f64::INFINITY, 3)]),
        Err(EvalError::InvalidValue { .. })
    ));
    assert!(matches!(
        audit::p_value(10, 5, 6, 1.0, 0.0),
        Err(EvalError::InvalidCounts(_))
    ));
    assert!(matches!(
        audit::p_value(10, 11, 6, 1.0, 0.0),
        Err(EvalError::InvalidCounts(_))
    ));
    assert!(matches!(
        audit::epsilon_lower_bound(10, 5, 5, 2.0, 0.95),
        Err(EvalError::OutOfRange { .. })
    ));
    assert!(matches!(
        audit::guesses(&[1.0, 2.0], &[true, false], 2, 1),
        Err(EvalError::InvalidCounts(_))
    ));
    assert!(matches!(
        audit::guesses(&[1.0, f64::NAN], &[true, false], 1, 1),
        Err(EvalError::InvalidValue { .. })
    ));
    assert!(matches!(
        audit::audit_search(&[1.0], &[true], 0.0, 0.95, &[]),
        Err(EvalError::Empty { .. })
    ));
    assert!(matches!(
        mia::roc_auc(&[], &[1.0]),
        Err(EvalError::Empty { .. })
    ));
    assert!(matches!(
        mia::tpr_at_fpr(&[1.0], &[1.0], 1.5),
        Err(EvalError::OutOfRange { .. })
    ));
    let no_refs: Vec<Vec<&str>> = vec![vec![]];
    assert_eq!(
        corpus_bleu(&["a"], &no_refs).unwrap_err(),
        EvalError::NoReference { index: 0 }
    );
    assert!(matches!(
        corpus_bleu(&["a", "b"], &[vec!["a"]]),
        Err(EvalError::LengthMismatch { .. })
    ));
    assert!(matches!(
        raptor_eval::corpus_rouge_l::<&str, Vec<&str>, &str>(&[], &[]),
        Err(EvalError::Empty { .. })
    ));
    assert!(matches!(
        raptor_eval::accuracy(&[1], &[1, 2]),
        Err(EvalError::LengthMismatch { .. })
    ));
}

#[test]
fn snapshot_of_rounded_values() {
    let r6 = |x: f64| (x * 1e6).round() / 1e6;
    let hyps = [
        "The Eagle is a coffee shop near Burger King.",
        "Aromi serves Thai food.",
    ];
    let refs = [
        vec![
            "The Eagle coffee shop is near Burger King.",
            "Near Burger King is The Eagle, a coffee shop.",
        ],
        vec!["Aromi is a Thai restaurant."],
    ];
    let b = corpus_bleu(&hyps, &refs).unwrap();
    let a = audit::epsilon_lower_bound(1000, 200, 170, 1e-5, 0.95).unwrap();
    let ci = mean_ci(&[0.81, 0.84, 0.83], 0.95).unwrap();
    let w = wilson_interval(90, 100, 0.95).unwrap();
    let values = serde_json::json!({
        "bleu": r6(b.score),
        "rouge_l": r6(raptor_eval::corpus_rouge_l(&hyps, &refs).unwrap()),
        "eps_lower_1000_200_170": r6(a),
        "mean_ci": [r6(ci.mean), r6(ci.half_width)],
        "wilson_90_100": [r6(w.lower), r6(w.upper)],
    });
    insta::assert_json_snapshot!(values);
}

#[test]
fn default_grid_is_valid_for_every_size() {
    for m in 0..3000usize {
        let g = audit::default_grid(m);
        assert_eq!(g.is_empty(), m < 2, "m = {m}");
        assert!(
            g.iter().all(|&(a, b)| a >= 1 && a + b <= m),
            "m = {m}: {g:?}"
        );
        let mut d = g.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), g.len(), "m = {m}: duplicates");
        if m >= 2 {
            let scores: Vec<f64> = (0..m).map(|i| i as f64).collect();
            let included: Vec<bool> = (0..m).map(|i| i % 3 == 0).collect();
            if m % 500 == 0 {
                audit::audit_search(&scores, &included, 1e-5, 0.95, &g).unwrap();
            }
        }
    }
}

/// The stated confidence holds: on a mechanism that is exactly ε-DP (randomized response on each
/// canary's coin), the 95 % lower bound exceeds the true ε in at most about 5 % of audits.
#[test]
fn false_alarm_rate_is_at_most_the_stated_level() {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(2023);
    let (eps, m, trials) = (1.0f64, 1000usize, 300);
    let q = eps.exp() / (1.0 + eps.exp());
    let mut above = 0;
    for _ in 0..trials {
        // All m canaries guessed (k₊ + k₋ = m): v ~ Binomial(m, q) exactly.
        let v = (0..m).filter(|_| rng.random::<f64>() < q).count() as u64;
        let e = audit::epsilon_lower_bound(m as u64, m as u64, v, 0.0, 0.95).unwrap();
        if e > eps {
            above += 1;
        }
    }
    // Expected ≤ 15 of 300; 30 would be > 4 standard deviations above.
    assert!(above <= 30, "{above} of {trials} audits claimed ε > {eps}");
    println!("{above} of {trials} audits above the true ε");
}

/// The p-value with α summed term by term from `statrs` (the slow obvious reference of the
/// recurrence in `p_value`).
fn p_value_naive(m: u64, r: u64, v: u64, eps: f64, delta: f64) -> f64 {
    use statrs::distribution::{Binomial, Discrete, DiscreteCDF};
    if v == 0 || r == 0 {
        return 1.0;
    }
    let q = 1.0 / (1.0 + (-eps).exp());
    let bin = Binomial::new(q, r).unwrap();
    let beta = bin.sf(v - 1);
    let (mut alpha, mut sum) = (0.0f64, 0.0);
    for i in 1..=v {
        sum += bin.pmf(v - i);
        alpha = alpha.max(sum / i as f64);
    }
    (beta + alpha * delta * 2.0 * m as f64).min(1.0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    /// The p-value agrees with the term-by-term reference, large r (white-box audits) included.
    #[test]
    fn p_value_matches_the_term_by_term_reference(
        r in 1u64..30_000,
        frac in 0.0f64..=1.0,
        eps in 0.0f64..12.0,
        delta in prop::sample::select(vec![0.0, 1e-8, 1e-6, 1e-5, 1e-3]),
    ) {
        let v = ((frac * r as f64).round() as u64).min(r);
        let m = 2 * r + 7;
        let got = audit::p_value(m, r, v, eps, delta).unwrap();
        let want = p_value_naive(m, r, v, eps, delta);
        prop_assert!(
            (got - want).abs() <= 1e-9 * want.max(1e-300) + 1e-300,
            "r {} v {} eps {} delta {}: {} vs {}", r, v, eps, delta, got, want
        );
    }
}

/// The multi-statistic search: one statistic is exactly `audit_search`; with several, every
/// (statistic, pair) is tested at (1 − c)/(S·K), so the bound is that of the best statistic at
/// the stricter level, and it is never above what that statistic alone reports.
#[test]
fn audit_search_many_corrects_over_statistics() {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
    let m = 4000usize;
    let included: Vec<bool> = (0..m).map(|_| rng.random::<bool>()).collect();
    let noise: Vec<f64> = (0..m).map(|_| rng.random::<f64>()).collect();
    let good: Vec<f64> = included
        .iter()
        .map(|&b| f64::from(u8::from(b)) * 0.8 + rng.random::<f64>())
        .collect();
    let grid = audit::default_grid(m);
    let single = audit::audit_search(&good, &included, 1e-6, 0.95, &grid).unwrap();
    let (s, one) = audit::audit_search_many(&[&good], &included, 1e-6, 0.95, &grid).unwrap();
    assert_eq!((s, &one), (0, &single));
    let (s, two) =
        audit::audit_search_many(&[&noise, &good], &included, 1e-6, 0.95, &grid).unwrap();
    assert_eq!(s, 1);
    assert_eq!(two.pairs_tried, 2 * grid.len());
    assert!((two.per_pair_level - 0.05 / (2 * grid.len()) as f64).abs() < 1e-15);
    assert!(two.epsilon_lower <= single.epsilon_lower && two.epsilon_lower > 0.0);
    // The bound the chosen pair gives at the corrected level, recomputed from its counts.
    let level_confidence = 1.0 - two.per_pair_level;
    let again =
        audit::epsilon_lower_bound(m as u64, two.guesses, two.correct, 1e-6, level_confidence)
            .unwrap();
    assert!(
        (again - two.epsilon_lower).abs() < 1e-8,
        "{again} vs {two:?}"
    );
    assert!(audit::audit_search_many(&[], &included, 1e-6, 0.95, &grid).is_err());
    assert!(audit::audit_search_many(&[&good[..10]], &included, 1e-6, 0.95, &grid).is_err());
}

/// White-box canaries of a Gaussian mechanism that is exactly μ-GDP per canary (one release of
/// a canary's coordinate, noise 1, member shift μ): scored by both statistics of
/// [`audit::DiracTrace`], the 95 % bound stays below the mechanism's ε at δ in (nearly) every
/// audit, and a broken mechanism (no noise) is caught far above it.
#[test]
fn dirac_statistics_are_sound_on_a_gaussian_mechanism() {
    // μ = 1: ε(δ = 1e-6) of 1-GDP is about 4.9 (Dong, Roth & Su's formula); audit well below.
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(77);
    let gauss = |r: &mut rand_chacha::ChaCha20Rng| {
        let (u1, u2): (f64, f64) = (r.random::<f64>().max(1e-300), r.random());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    };
    let m = 4000usize;
    let grid = audit::default_grid(m);
    let mut above = 0;
    let runs = 40;
    for _ in 0..runs {
        let included: Vec<bool> = (0..m).map(|_| rng.random::<bool>()).collect();
        let traces: Vec<audit::DiracTrace> = included
            .iter()
            .map(|&b| {
                let mut t = audit::DiracTrace::default();
                t.observe(f64::from(u8::from(b)) + gauss(&mut rng));
                t
            })
            .collect();
        let sum: Vec<f64> = traces.iter().map(|t| t.sum_score()).collect();
        let max: Vec<f64> = traces.iter().map(|t| t.max_score()).collect();
        let (_, a) = audit::audit_search_many(&[&sum, &max], &included, 1e-6, 0.95, &grid).unwrap();
        if a.epsilon_lower > 4.9 {
            above += 1;
        }
    }
    assert!(above <= 2, "{above} of {runs} audits above the truth");
    let included: Vec<bool> = (0..m).map(|_| rng.random::<bool>()).collect();
    let leaky: Vec<f64> = included.iter().map(|&b| f64::from(u8::from(b))).collect();
    let (_, a) = audit::audit_search_many(&[&leaky, &leaky], &included, 1e-6, 0.95, &grid).unwrap();
    assert!(a.epsilon_lower > 5.0, "{a:?}");
}

proptest! {
    /// M_role is a total-variation distance: in [0, 1], 0 when the norm shares equal the
    /// parameter shares; each kind of share sums to 1 when there is mass; the SNRs' CV does not
    /// change with their scale.
    #[test]
    fn moe_diagnostics_are_distances_and_scale_free(
        masses in prop::collection::vec((0.0f64..10.0, 1.0f64..1e6), 1..6),
        scale in 0.01f64..100.0,
    ) {
        use raptor_eval::moe::{coefficient_of_variation, role_mismatch};
        use std::collections::BTreeMap;
        let norms: BTreeMap<String, f64> =
            masses.iter().enumerate().map(|(i, m)| (format!("r{i}"), m.0)).collect();
        let params: BTreeMap<String, f64> =
            masses.iter().enumerate().map(|(i, m)| (format!("r{i}"), m.1)).collect();
        let (m, shares) = role_mismatch(&norms, &params);
        prop_assert!((-1e-12..=1.0 + 1e-12).contains(&m), "{m}");
        let ps: f64 = shares.values().map(|s| s.1).sum();
        prop_assert!((ps - 1.0).abs() < 1e-9);
        if norms.values().sum::<f64>() > 0.0 {
            let ns: f64 = shares.values().map(|s| s.0).sum();
            prop_assert!((ns - 1.0).abs() < 1e-9);
        }
        // Norm mass proportional to the parameters: no mismatch.
        let (same, _) = role_mismatch(&params, &params);
        prop_assert!(same.abs() < 1e-12);
        let snr: Vec<f64> = masses.iter().map(|m| m.1).collect();
        let scaled: Vec<f64> = snr.iter().map(|s| s * scale).collect();
        let (a, b) = (coefficient_of_variation(&snr), coefficient_of_variation(&scaled));
        prop_assert!((a - b).abs() <= 1e-9 * a.max(1.0), "{a} vs {b}");
    }
}

/// The minimum detectable effect against the slow obvious check: simulate paired studies whose
/// true mean difference is that effect and count how often a two-sided t-test (the interval of
/// `mean_ci` lying above 0 or below 0) detects it. The exact power at this approximation's
/// effect is 0.798 at n = 8 (scipy's non-central t); 4,000 studies put the estimate within
/// ±0.03 of it with overwhelming probability.
#[test]
fn the_minimum_detectable_effect_is_detected_with_the_stated_power() {
    let n = 8;
    let sd = 2.0;
    let mde = raptor_eval::min_detectable_effect(sd, n, 0.05, 0.8).unwrap();
    // (t_{0.975,7} + t_{0.8,7}) · 2 / √8 with scipy's quantiles 2.364624, 0.896030.
    assert!((mde - 2.305630).abs() < 1e-5, "{mde}");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let normal = |rng: &mut rand_chacha::ChaCha8Rng| {
        let (u1, u2): (f64, f64) = (rng.random::<f64>().max(1e-300), rng.random());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    };
    let studies = 4000;
    let mut detected = 0;
    for _ in 0..studies {
        let d: Vec<f64> = (0..n).map(|_| mde + sd * normal(&mut rng)).collect();
        let ci = mean_ci(&d, 0.95).unwrap();
        if ci.lower() > 0.0 || ci.upper() < 0.0 {
            detected += 1;
        }
    }
    let power = detected as f64 / studies as f64;
    assert!((power - 0.798).abs() < 0.03, "{power}");
    assert!(raptor_eval::min_detectable_effect(sd, 1, 0.05, 0.8).is_err());
    assert!(raptor_eval::min_detectable_effect(-1.0, 8, 0.05, 0.8).is_err());
    assert!(raptor_eval::min_detectable_effect(1.0, 8, 0.0, 0.8).is_err());
    assert!(raptor_eval::min_detectable_effect(1.0, 8, 0.05, 1.0).is_err());
}
