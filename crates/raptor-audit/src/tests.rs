//! The audit's tests: canaries, scores, reports, and the planted faults it must catch.

use super::dirac::{dirac_params, place_dirac};
#[cfg(feature = "planted-faults")]
use super::planted::PlantedFault;
use super::planted::{toy_data, toy_switch};
use super::*;
use proptest::prelude::*;
use raptor_train::config::{Method, ModelKind};
use raptor_train::trainer::UpdateMetrics;

/// The broken mechanism: no noise, no clipping (test-only; see [`Tamper`]).
pub(super) fn break_mechanism(plan: &mut Plan) {
    for ph in &mut plan.phases {
        ph.global_clip = ph.global_clip.map(|_| 1e30);
        for g in &mut ph.groups {
            g.bound = 1e30;
        }
        for r in &mut ph.releases {
            r.sigma = 0.0;
        }
    }
}

/// A tiny GPT-2 language model on the toy text (16 byte tokens), DP-Adam over every
/// parameter, 200 updates of B = 64 at a high learning rate: random-token canaries are
/// memorized quickly once noise and clipping are off.
fn small_cfg(epsilon: f64) -> RunConfig {
    let (steps, lr) = (300, 0.02);
    let mut c = toy_data();
    c.model.kind = ModelKind::Gpt2;
    c.model.d_model = 32;
    c.model.layers = 2;
    c.model.heads = 2;
    c.model.d_ff = 64;
    c.model.experts = 2;
    c.method = raptor_train::config::MethodConfig::new(Method::DpAdam);
    c.privacy.epsilon = epsilon;
    c.privacy.accuracy = 0.01;
    // 2·m·δ enters the bound: δ = 1/N (10⁻³ here) would leave almost no power to 300
    // canaries.
    c.privacy.delta = Some(1e-5);
    c.train.batch_size = 64.0;
    c.train.micro_batch = 128;
    c.train.steps = Some(steps);
    c.train.lr = lr;
    c.train.weight_decay = 0.0;
    c.train.checkpoint_every = 0;
    c.train.eval_every = 0;
    c.train.insecure_seed = Some(7);
    c
}

fn info(classifier: bool) -> DataInfo {
    DataInfo {
        classifier,
        num_labels: if classifier { 3 } else { 0 },
        vocab: 50,
        pad_id: 0,
        eos_id: 2,
        max_length: 16,
        max_id: 999,
    }
}

fn records(n: usize) -> Vec<Example> {
    (0..n)
        .map(|i| Example {
            id: i as u64 * 2,
            tokens: vec![3 + (i % 40) as i64; 4 + i % 5],
            label: Some((i % 3) as i64),
            prompt_len: 0,
        })
        .collect()
}

#[test]
fn mislabeled_canaries_leave_the_training_set_with_another_label_and_fresh_ids() {
    let opts = AuditOptions::default();
    let mut train = records(100);
    let orig = train.clone();
    let mut coins = ChaCha20Rng::seed_from_u64(1);
    let c = insert_canaries(
        &mut train,
        &info(true),
        &opts,
        CanaryKind::Mislabel,
        &mut coins,
    )
    .unwrap();
    assert_eq!(c.examples.len(), 25); // N/4
    assert_eq!(c.real_records, 75);
    let included = c.coins.iter().filter(|b| **b).count();
    assert!(included > 0 && included < 25);
    assert_eq!(train.len(), 75 + included);
    for (k, e) in c.examples.iter().enumerate() {
        assert_eq!(e.id, 1000 + k as u64);
        let src = orig.iter().find(|o| Some(o.id) == c.sources[k]).unwrap();
        assert_eq!(src.tokens, e.tokens);
        assert_ne!(src.label, e.label);
        assert!((0..3).contains(&e.label.unwrap()));
        // The source record left; the canary is in iff its coin says so.
        assert!(!train.iter().any(|t| t.id == src.id));
        assert_eq!(train.iter().any(|t| t.id == e.id), c.coins[k]);
    }
    // Deterministic design given the seed; the coins come from their own generator.
    let mut again = records(100);
    let c2 = insert_canaries(
        &mut again,
        &info(true),
        &opts,
        CanaryKind::Mislabel,
        &mut ChaCha20Rng::seed_from_u64(2),
    )
    .unwrap();
    assert_eq!(c.examples, c2.examples);
    assert_ne!(c.coins, c2.coins);
}

#[test]
fn random_canaries_have_the_median_length_and_no_special_token() {
    let mut train = records(40);
    let opts = AuditOptions {
        canaries: Some(30),
        ..AuditOptions::default()
    };
    let lm = info(false);
    let c = insert_canaries(
        &mut train,
        &lm,
        &opts,
        CanaryKind::Random,
        &mut ChaCha20Rng::seed_from_u64(3),
    )
    .unwrap();
    assert_eq!(c.real_records, 40);
    let med = typical_length(&records(40), 16);
    for e in &c.examples {
        assert_eq!(e.tokens.len(), med);
        assert_eq!(e.tokens.last(), Some(&2)); // EOS ends LM text
        assert!(e.tokens[..med - 1].iter().all(|&t| (3..50).contains(&t)));
        assert_eq!(e.label, None);
    }
    // Too few records for the default count, too many mislabeled canaries: errors.
    let few = AuditOptions::default();
    assert!(canary_count(&few, CanaryKind::Random, 7).is_err());
    let many = AuditOptions {
        canaries: Some(51),
        ..AuditOptions::default()
    };
    assert!(canary_count(&many, CanaryKind::Mislabel, 100).is_err());
    assert_eq!(canary_count(&many, CanaryKind::Random, 100).unwrap(), 51);
    let mut t = records(40);
    assert!(
        insert_canaries(
            &mut t,
            &lm,
            &opts,
            CanaryKind::Mislabel,
            &mut ChaCha20Rng::seed_from_u64(3)
        )
        .is_err()
    );
}

/// One audit into a temporary runs folder: its report, the report read back from its audit
/// file (before the folder goes), and when it started.
fn audited(
    cfg: &RunConfig,
    opts: &AuditOptions,
    tamper: Tamper,
) -> (AuditReport, AuditReport, std::time::Instant) {
    // One libtorch thread: the machine's cores may be busy (OpenMP spinning would stall).
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    let mut quiet = |_: u64, _: u64, _: &UpdateMetrics, _: Option<f64>| {};
    let r = audit_impl(cfg, opts, dir.path(), &mut quiet, tamper).unwrap();
    assert!(r.run.join("record.json").exists());
    let back = read_report(&r.run).unwrap();
    (r, back, t)
}

fn run(cfg: &RunConfig, opts: &AuditOptions, tamper: Tamper) -> AuditReport {
    let (r, back, t) = audited(cfg, opts, tamper);
    assert_eq!(
        (back.coins.as_slice(), back.search.correct),
        (r.coins.as_slice(), r.search.correct)
    );
    let mean = |v: &[f64], want: bool| {
        let x: Vec<f64> = v
            .iter()
            .zip(&r.coins)
            .filter(|(_, c)| **c == want)
            .map(|(a, _)| *a)
            .collect();
        x.iter().sum::<f64>() / x.len().max(1) as f64
    };
    eprintln!(
        "members init {:.3} final {:.3}; non-members init {:.3} final {:.3}",
        mean(&r.initial_losses, true),
        mean(&r.final_losses, true),
        mean(&r.initial_losses, false),
        mean(&r.final_losses, false)
    );
    eprintln!(
        "{:?} eps target {} lower {:.3} upper {:?} (k+ {}, k- {}, {}/{} correct, included {}/{}, N {}, mia {:?}) in {:.1}s",
        tamper,
        r.epsilon_target,
        r.epsilon_lower,
        r.epsilon_upper,
        r.search.k_plus,
        r.search.k_minus,
        r.search.correct,
        r.search.guesses,
        r.included,
        r.canaries,
        r.train_records,
        r.mia.map(|m| m.auc),
        t.elapsed().as_secs_f64()
    );
    r
}

/// The audit can fail: without noise and clipping, the canaries are memorized and ε_lower
/// lies far above the claimed ε = 1.
#[test]
fn audit_catches_a_mechanism_without_noise_or_clipping() {
    let cfg = small_cfg(1.0);
    let opts = AuditOptions {
        canaries: Some(300),
        kind: Some(CanaryKind::Random),
        ..AuditOptions::default()
    };
    let r = run(&cfg, &opts, Tamper::BreakMechanism);
    assert_eq!(r.epsilon_target, 1.0);
    assert_eq!(r.epsilon_upper, None, "σ = 0 releases are not accounted");
    assert!(
        r.epsilon_lower > 2.0,
        "ε_lower {} on a broken mechanism claimed at ε = 1",
        r.epsilon_lower
    );
    assert!(r.mia.unwrap().auc > 0.9);
}

/// On correct runs (ε = 1 and ε = 8) the empirical lower bound stays below the certified
/// upper bound.
#[test]
fn audit_lower_bound_is_below_the_certified_bound_on_correct_runs() {
    let opts = AuditOptions {
        canaries: Some(300),
        kind: Some(CanaryKind::Random),
        ..AuditOptions::default()
    };
    for eps in [1.0, 8.0] {
        let r = run(&small_cfg(eps), &opts, Tamper::None);
        let upper = r.epsilon_upper.unwrap();
        assert!(
            upper <= eps * (1.0 + 1e-9),
            "certified {upper} above target {eps}"
        );
        assert!(
            r.epsilon_lower <= upper,
            "ε_lower {} > ε_upper {upper}",
            r.epsilon_lower
        );
        assert_eq!(r.coins.len(), 300);
        assert_eq!(r.train_records, r.real_records + r.included);
    }
}

// ---- White-box (Dirac) canaries ----

fn dirac_run(cfg: &RunConfig, opts: &AuditOptions, tamper: Tamper) -> AuditReport {
    let (r, back, t) = audited(cfg, opts, tamper);
    assert_eq!(back.dirac, r.dirac);
    assert_eq!(back.search, r.search);
    eprintln!(
        "{:?} {} eps target {} lower {:.3} upper {:?} stream {:?} ({} k+ {} k- {}, {}/{} correct, included {}/{}, q {:.4}) in {:.1}s",
        tamper,
        r.method,
        r.epsilon_target,
        r.epsilon_lower,
        r.epsilon_upper,
        r.expert.as_ref().map(|x| x.epsilon_stream),
        r.dirac.as_ref().map_or("", |d| d.statistic.as_str()),
        r.search.k_plus,
        r.search.k_minus,
        r.search.correct,
        r.search.guesses,
        r.included,
        r.canaries,
        r.sampling_rate,
        t.elapsed().as_secs_f64()
    );
    r
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Canaries get distinct coordinates inside their parameters, their parameter's value,
    /// and the design seed alone decides where.
    #[test]
    fn dirac_canaries_sit_at_distinct_coordinates(
        sizes in prop::collection::vec(1usize..300, 1..6),
        frac in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let params: BTreeMap<String, f64> = sizes
            .iter()
            .enumerate()
            .map(|(i, _)| (format!("p{i}"), 0.25 + i as f64))
            .collect();
        let numel: BTreeMap<String, usize> =
            sizes.iter().enumerate().map(|(i, &n)| (format!("p{i}"), n)).collect();
        let total: usize = sizes.iter().sum();
        let m = ((frac * total as f64) as usize).clamp(1, total);
        let routed = BTreeMap::new();
        let c = place_dirac(&params, &numel, &routed, m, seed).unwrap();
        prop_assert_eq!(c.len(), m);
        let mut seen = std::collections::BTreeSet::new();
        for c in &c {
            prop_assert_eq!(c.coords.len(), 1);
            prop_assert_eq!(c.owner, None);
            let d = &c.coords[0];
            prop_assert!(d.index >= 0 && (d.index as usize) < numel[&d.param]);
            prop_assert_eq!(d.gradient, params[&d.param]);
            prop_assert!(seen.insert((d.param.clone(), d.index)));
        }
        prop_assert_eq!(&c, &place_dirac(&params, &numel, &routed, m, seed).unwrap());
        prop_assert!(place_dirac(&params, &numel, &routed, total + 1, seed).is_err());
    }
}

/// The audited parameters and their values on real plans: every released parameter (the
/// smallest bound that holds it), or one expert's, which a method without expert streams
/// cannot give.
#[test]
fn dirac_parameters_follow_the_plan() {
    let cfg = toy_switch(Method::Raptor, 4.0, 100, 4);
    let mut s = prepare_counting(&cfg, None, 50).unwrap();
    assert_eq!(s.plan.q, cfg.train.batch_size / 650.0);
    let layer = s.layer.as_ref().map(|l| l.layer);
    let all = dirac_params(&s.plan, layer, None).unwrap();
    assert_eq!(all.keys().cloned().collect::<Vec<_>>(), s.plan.params());
    let e2 = dirac_params(&s.plan, layer, Some(2)).unwrap();
    assert!(!e2.is_empty());
    for (p, v) in &e2 {
        assert!(p.contains("expert_2."), "{p}");
        assert_eq!(*v, cfg.train.clip_expert);
    }
    assert!(dirac_params(&s.plan, layer, Some(4)).is_err()); // 4 experts: 0..3
    // A smaller bound anywhere lowers the value.
    let g = &mut s.plan.phases[0].groups[0];
    g.bound = 0.125;
    let p0 = g.params[0].clone();
    assert_eq!(dirac_params(&s.plan, layer, None).unwrap()[&p0], 0.125);
    let mono = raptor_run::session::prepare(&toy_switch(Method::DpAdamLora, 4.0, 100, 4)).unwrap();
    assert!(dirac_params(&mono.plan, None, Some(0)).is_err());
}

/// A drawn canary moves the release that carries its coordinate by exactly its value (in
/// units of the planned noise std: v/(σΔ)), and nothing else: two runs that differ only in
/// the coins (every canary in, every canary out; q = 1, the same seeds, so the same real
/// records and the same noise) differ by exactly that at every canary, on every release
/// that carries it, and the per-expert canaries appear only in expert updates.
#[test]
fn a_drawn_canary_moves_its_release_by_exactly_its_value() {
    for (method, expert) in [(Method::DpAdamLora, None), (Method::Raptor, Some(1))] {
        let m = 40;
        let mut cfg = toy_switch(method, 4.0, m, 3);
        // 60 real records (q = 1 makes every update see all of them).
        let data = tempfile::tempdir().unwrap();
        let text = std::fs::read_to_string(&cfg.data.train).unwrap();
        let head: Vec<&str> = text.lines().take(61).collect();
        cfg.data.train = data.path().join("train.csv");
        std::fs::write(&cfg.data.train, head.join("\n") + "\n").unwrap();
        cfg.train.batch_size = (60 + m / 2) as f64; // q = 1
        cfg.train.lr = 1e-12; // the parameters (hence the real gradients) stay put
        let opts = AuditOptions {
            canaries: Some(m),
            kind: Some(CanaryKind::Dirac),
            expert,
            ..AuditOptions::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let mut quiet = |_: u64, _: u64, _: &UpdateMetrics, _: Option<f64>| {};
        let mut go = |coins: Vec<bool>| {
            audit_dirac(
                &cfg,
                &opts,
                CanaryKind::Dirac,
                dir.path(),
                &mut quiet,
                Tamper::None,
                coins,
            )
            .unwrap()
        };
        let inn = go(vec![true; m]);
        let out = go(vec![false; m]);
        assert_eq!(inn.sampling_rate, 1.0);
        assert_eq!(inn.epsilon_upper, out.epsilon_upper);
        let (a, b) = (inn.dirac.unwrap(), out.dirac.unwrap());
        assert_eq!((&a.param, &a.index), (&b.param, &b.index));
        let phases = raptor_run::session::prepare_counting(&cfg, None, m / 2)
            .unwrap()
            .plan;
        let sigma = |param: &str| {
            phases
                .phases
                .iter()
                .find_map(|ph| {
                    ph.releases.iter().find_map(|r| {
                        let g = ph.group(&r.groups[0])?;
                        g.params
                            .iter()
                            .any(|p| p == param)
                            .then(|| (r.sigma, ph.sensitivity(r).unwrap()))
                    })
                })
                .unwrap()
        };
        for i in 0..m {
            let p = &a.params[a.param[i]];
            let (s, delta) = sigma(p);
            let n = a.releases[i];
            assert_eq!(n, b.releases[i]);
            let want = match expert {
                None => 3,
                // alternating 1:1, ending on a shared update: 1 expert update of 3
                Some(_) => 1,
            };
            assert_eq!(n, want, "canary {i} in {p}");
            // Σ over n releases, reported as Σ/√n.
            let diff = (a.sum_scores[i] - b.sum_scores[i]) * (n as f64).sqrt();
            let exact = n as f64 * a.value[i] / (s * delta);
            assert!(
                (diff - exact).abs() <= 1e-3 * exact.max(1.0),
                "canary {i} in {p}: moved {diff}, value/(σΔ) × {n} = {exact}"
            );
        }
    }
}

/// RAPTOR without alternation on the q = 1 toy set of the exactness tests: 60 real records,
/// `m` canaries, `steps` updates, learning rate 1e-12 (the real gradients stay put).
fn one_sample_raptor(m: usize, steps: u64, data: &Path) -> RunConfig {
    let mut cfg = toy_switch(Method::Raptor, 4.0, m, steps);
    cfg.method.alternation_mut().unwrap().alternate = false;
    let text = std::fs::read_to_string(&cfg.data.train).unwrap();
    let head: Vec<&str> = text.lines().take(61).collect();
    cfg.data.train = data.join("train.csv");
    std::fs::write(&cfg.data.train, head.join("\n") + "\n").unwrap();
    cfg.train.batch_size = (60 + m / 2) as f64; // q = 1
    cfg.train.lr = 1e-12;
    cfg
}

/// A drawn paired canary goes through clipping (its gradient, four times each bound, comes out
/// at the bound) and through its owner's mask, and moves its update's score by exactly
/// sqrt(1/σ_s² + 1/σ_e²) = 1/σ_eff in whitened units, the one-sample mechanism's shift: two
/// runs that differ only in the coins (all in, all out; q = 1, same seeds) differ by that at
/// every canary. Each canary's expert coordinate sits in its owner expert.
#[test]
fn a_drawn_paired_canary_moves_its_score_by_one_over_sigma_eff() {
    let m = 40;
    let data = tempfile::tempdir().unwrap();
    let cfg = one_sample_raptor(m, 3, data.path());
    let opts = AuditOptions {
        canaries: Some(m),
        kind: Some(CanaryKind::Paired),
        ..AuditOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut quiet = |_: u64, _: u64, _: &UpdateMetrics, _: Option<f64>| {};
    let mut go = |coins: Vec<bool>| {
        audit_dirac(
            &cfg,
            &opts,
            CanaryKind::Paired,
            dir.path(),
            &mut quiet,
            Tamper::None,
            coins,
        )
        .unwrap()
    };
    let (inn, out) = (go(vec![true; m]), go(vec![false; m]));
    assert_eq!((inn.kind, inn.sampling_rate), (CanaryKind::Paired, 1.0));
    let (a, b) = (inn.dirac.unwrap(), out.dirac.unwrap());
    assert_eq!(a.paired.len(), m);
    let plan = raptor_run::session::prepare_counting(&cfg, None, m / 2)
        .unwrap()
        .plan;
    // One phase: the shared release and the expert releases of one sample.
    assert_eq!(plan.phases.len(), 1);
    let ph = &plan.phases[0];
    // (σ, Δ of its release, bound of its group) of the release that carries `param`.
    let noise = |param: &str| {
        ph.releases
            .iter()
            .find_map(|r| {
                let g = r
                    .groups
                    .iter()
                    .filter_map(|g| ph.group(g))
                    .find(|g| g.params.iter().any(|p| p == param))?;
                Some((r.sigma, ph.sensitivity(r).unwrap(), g.bound))
            })
            .unwrap()
    };
    for i in 0..m {
        let (shared, pc) = (&a.params[a.param[i]], &a.paired[i]);
        let expert = &a.params[pc.param];
        assert!(
            expert.contains(&format!("expert_{}.", pc.owner)),
            "canary {i}: {expert} is not in its owner {}",
            pc.owner
        );
        assert!(!shared.contains("expert_"), "{shared}");
        let (ss, ds, cs) = noise(shared);
        let (se, de, ce) = noise(expert);
        // Clipped to the bounds, not the 4× gradient.
        assert_eq!(a.value[i], 4.0 * cs);
        assert_eq!(pc.gradient, 4.0 * ce);
        let n = a.releases[i];
        assert_eq!((n, b.releases[i]), (3, 3), "one score per update");
        let diff = (a.sum_scores[i] - b.sum_scores[i]) * (n as f64).sqrt();
        let exact = n as f64 * ((cs / (ss * ds)).powi(2) + (ce / (se * de)).powi(2)).sqrt();
        assert!(
            (diff - exact).abs() <= 1e-3 * exact,
            "canary {i}: moved {diff}, want {exact}"
        );
    }
}

/// Owner masks apply to canaries as to any record: a canary whose only coordinate sits in an
/// expert other than its owner reaches no release and is refused before training; owned by
/// that expert, it trains. A paired audit of a method without expert streams is refused.
#[test]
fn owner_masks_apply_to_canaries() {
    let data = tempfile::tempdir().unwrap();
    let cfg = one_sample_raptor(2, 1, data.path());
    let session = || raptor_run::session::prepare_counting(&cfg, None, 1).unwrap();
    let s = session();
    let layer = s.layer.as_ref().unwrap().layer;
    let (param, id) = s
        .plan
        .routed
        .iter()
        .find(|(_, id)| id.expert == 2)
        .map(|(p, id)| (p.clone(), *id))
        .unwrap();
    assert_eq!(id.layer, layer);
    let canary = |owner: usize| {
        let mut c = DiracCanary::single(param.clone(), 0, 0.5);
        c.owner = Some(ExpertId {
            layer,
            expert: owner,
        });
        vec![c, DiracCanary::single(param.clone(), 1, 0.5)]
    };
    let dir = tempfile::tempdir().unwrap();
    let mut quiet = |_: u64, _: u64, _: &UpdateMetrics, _: Option<f64>| {};
    // Owner 1: the coordinate of expert 2 is masked out (and the second canary has no owner).
    let (c, _) = DiracCanaries::new(canary(1), &[true, false]).unwrap();
    let err = match train_prepared_with_canaries(s, c, dir.path().join("a"), &mut quiet) {
        Ok(_) => panic!("a canary masked out everywhere was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("canary 0 reaches no release"), "{err}");
    let mut owned = canary(2);
    owned[1].owner = Some(id);
    let (c, _) = DiracCanaries::new(owned, &[true, false]).unwrap();
    train_prepared_with_canaries(session(), c, dir.path().join("b"), &mut quiet).unwrap();
    // Paired canaries need a shared stream and routed experts.
    let mono = toy_switch(Method::DpAdamLora, 4.0, 10, 1);
    let opts = AuditOptions {
        canaries: Some(10),
        kind: Some(CanaryKind::Paired),
        ..AuditOptions::default()
    };
    let err = audit(&mono, &opts, dir.path(), &mut quiet)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--kind paired"), "{err}");
}

/// The quick check, through the public path of the planted bugs: at m = 10,000 canaries and
/// 30 updates, a run without noise charged at ε = 1 is caught (ε_lower above the certified
/// ε), and the same run without the bug is not (ε_lower ≤ ε_upper). Its audit file sits
/// under `private/`, marked, and nothing of it at the top of the run folder.
#[cfg(feature = "planted-faults")]
#[test]
fn a_planted_bug_is_caught_and_the_correct_run_is_not() {
    tch::set_num_threads(1);
    let m = 10_000;
    let cfg = toy_switch(Method::DpAdamLora, 1.0, m, 30);
    let opts = AuditOptions {
        canaries: Some(m),
        ..AuditOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut quiet = |_: u64, _: u64, _: &UpdateMetrics, _: Option<f64>| {};
    let bad =
        planted::audit_with_fault(&cfg, &opts, dir.path(), &mut quiet, PlantedFault::Off).unwrap();
    let good = audit(&cfg, &opts, dir.path(), &mut quiet).unwrap();
    for r in [&bad, &good] {
        assert_eq!(r.kind, CanaryKind::Dirac);
        assert_eq!(r.notice, PRIVATE_NOTICE);
        assert_eq!(&read_report(&r.run).unwrap(), r);
        assert!(r.run.join("private").join("audit.json").is_file());
        assert!(!r.run.join("audit.json").exists());
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(r.run.join("record.json")).unwrap()).unwrap();
        for key in ["coins", "scores", "mia", "dirac", "epsilon_lower"] {
            assert!(record.get(key).is_none(), "record.json has {key}");
        }
        let notes = record["notes"].as_array().unwrap();
        assert!(
            notes
                .iter()
                .any(|n| n.as_str().unwrap().starts_with("audit run"))
        );
    }
    let (upper_bad, upper_good) = (bad.epsilon_upper.unwrap(), good.epsilon_upper.unwrap());
    eprintln!(
        "no noise: ε_lower {:.3}; correct: ε_lower {:.3}; certified {:?}",
        bad.epsilon_lower, good.epsilon_lower, good.epsilon_upper
    );
    // The ledger charges the plan either way: the bug is invisible to it.
    assert_eq!(upper_bad, upper_good);
    assert!(upper_good <= 1.0 + 1e-9);
    assert!(
        bad.epsilon_lower > upper_bad,
        "planted bug not caught: ε_lower {} ≤ certified {upper_bad}",
        bad.epsilon_lower
    );
    assert!(
        good.epsilon_lower <= upper_good,
        "correct run: ε_lower {} > certified {upper_good}",
        good.epsilon_lower
    );
    // A planted bug needs white-box canaries.
    let loss = AuditOptions {
        kind: Some(CanaryKind::Random),
        ..opts.clone()
    };
    assert!(
        planted::audit_with_fault(&cfg, &loss, dir.path(), &mut quiet, PlantedFault::Half).is_err()
    );
}

/// The planted ledger fault charges one sample's shared and expert releases as separate
/// samples: on RAPTOR without alternation its ledger certifies far less than the one-sample
/// charge the plan was calibrated on (the under-count the one-sample rule prevents), while the
/// noise is as planned — so the paired canaries of the two runs see the same mechanism and the
/// audit's bound stays under the one-sample ε. (A one-run audit cannot reach the buggy ledger's
/// claim at affordable m here: see the crate README's table.)
#[cfg(feature = "planted-faults")]
#[test]
fn the_planted_split_charge_under_reports_what_the_releases_cost() {
    tch::set_num_threads(1);
    let m = 4_000;
    let mut cfg = toy_switch(Method::Raptor, 8.0, m, 20);
    cfg.method.alternation_mut().unwrap().alternate = false;
    let opts = AuditOptions {
        canaries: Some(m),
        kind: Some(CanaryKind::Paired),
        ..AuditOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut quiet = |_: u64, _: u64, _: &UpdateMetrics, _: Option<f64>| {};
    let bad = planted::audit_with_fault(
        &cfg,
        &opts,
        dir.path(),
        &mut quiet,
        PlantedFault::SplitCharge,
    )
    .unwrap();
    let good = audit(&cfg, &opts, dir.path(), &mut quiet).unwrap();
    assert_eq!(
        (bad.kind, good.kind),
        (CanaryKind::Paired, CanaryKind::Paired)
    );
    let (upper_bad, upper_good) = (bad.epsilon_upper.unwrap(), good.epsilon_upper.unwrap());
    eprintln!(
        "split charge: certified {upper_bad:.3} (correct ledger {upper_good:.3}); ε_lower {:.3} / {:.3}",
        bad.epsilon_lower, good.epsilon_lower
    );
    assert!(upper_good <= 8.0 * (1.0 + 1e-9) && upper_good > 7.9);
    assert!(upper_bad < 0.6 * upper_good, "{upper_bad} vs {upper_good}");
    // The same mechanism (same seeds, same noise): the same canary scores, and a bound below
    // the one-sample ε.
    assert_eq!(bad.scores, good.scores);
    assert!(good.epsilon_lower <= upper_good);
}

/// The audit catches each planted noise bug: ε_lower clearly above the ε the ledger
/// certifies (the whole run's, and for the expert bug the expert stream's alone too).
#[cfg(feature = "planted-faults")]
#[test]
fn white_box_audit_catches_planted_noise_bugs() {
    let m = 40_000;
    let opts = |expert| AuditOptions {
        canaries: Some(m),
        kind: Some(CanaryKind::Dirac),
        expert,
        ..AuditOptions::default()
    };
    // No noise at all, charged at ε = 1.
    let r = dirac_run(
        &toy_switch(Method::DpAdamLora, 1.0, m, 100),
        &opts(None),
        Tamper::Fault(PlantedFault::Off),
    );
    let upper = r.epsilon_upper.unwrap();
    assert!(upper <= 1.0 + 1e-9);
    assert!(
        r.epsilon_lower > 3.0 * upper,
        "{} vs {upper}",
        r.epsilon_lower
    );
    // Half the planned σ, charged at ε = 1.
    let r = dirac_run(
        &toy_switch(Method::DpAdamLora, 1.0, m, 100),
        &opts(None),
        Tamper::Fault(PlantedFault::Half),
    );
    let upper = r.epsilon_upper.unwrap();
    assert!(
        r.epsilon_lower > 1.3 * upper,
        "{} vs {upper}",
        r.epsilon_lower
    );
    // RAPTOR's expert stream at half its σ, canaries in expert 0, charged at ε = 1.
    let r = dirac_run(
        &toy_switch(Method::Raptor, 1.0, m, 200),
        &opts(Some(0)),
        Tamper::Fault(PlantedFault::HalfExperts),
    );
    let upper = r.epsilon_upper.unwrap();
    let stream = r.expert.as_ref().unwrap().epsilon_stream.unwrap();
    assert!(stream < upper);
    assert!(
        r.epsilon_lower > 1.5 * stream,
        "{} vs {stream}",
        r.epsilon_lower
    );
    assert!(
        r.epsilon_lower > 1.2 * upper,
        "{} vs {upper}",
        r.epsilon_lower
    );
}

/// On correct runs the white-box bound stays at or below the certified one: the whole run
/// at ε = 1 and 8, and RAPTOR's expert stream against its own ε.
#[test]
fn white_box_audit_stays_below_the_certified_bound_on_correct_runs() {
    let m = 40_000;
    for eps in [1.0, 8.0] {
        let opts = AuditOptions {
            canaries: Some(m),
            kind: Some(CanaryKind::Dirac),
            ..AuditOptions::default()
        };
        let r = dirac_run(
            &toy_switch(Method::DpAdamLora, eps, m, 100),
            &opts,
            Tamper::None,
        );
        let upper = r.epsilon_upper.unwrap();
        assert!(upper <= eps * (1.0 + 1e-9));
        assert!(r.epsilon_lower <= upper, "{} > {upper}", r.epsilon_lower);
        assert_eq!(r.coins.len(), m);
        assert_eq!(r.train_records, r.real_records + r.included);
        let d = r.dirac.unwrap();
        assert_eq!(d.plan_records, r.real_records + m / 2);
        assert!(d.releases.iter().all(|&n| n == 100));
    }
    let opts = AuditOptions {
        canaries: Some(m),
        kind: Some(CanaryKind::Dirac),
        expert: Some(0),
        ..AuditOptions::default()
    };
    let r = dirac_run(
        &toy_switch(Method::Raptor, 1.0, m, 200),
        &opts,
        Tamper::None,
    );
    let stream = r.expert.as_ref().unwrap().epsilon_stream.unwrap();
    assert!(r.epsilon_lower <= stream, "{} > {stream}", r.epsilon_lower);
    assert!(stream < r.epsilon_upper.unwrap());
    let d = r.dirac.unwrap();
    assert!(d.params.iter().all(|p| p.contains("expert_0.")));
    assert!(d.releases.iter().all(|&n| n == 100)); // the expert half of 200 updates
}
