#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The ledger and RAPTOR's budget plans.

use raptor_accountant::{
    AccountantError, Accuracy, Composition, Ledger, MAX_LAYERS, MAX_TOTAL_STEPS, PlanRequest,
    PrvAccountant, SampleCharge, Stream, StreamSampling, SubsampledGaussian, plan_budget,
};

#[test]
fn ledger_compresses_and_round_trips() {
    let acc = PrvAccountant::new(Accuracy::relative(0.02)).unwrap();
    let s = SubsampledGaussian::new(0.01, 1.2).unwrap();
    let e = SubsampledGaussian::new(0.01, 2.0).unwrap();
    let mut l = Ledger::new();
    for i in 0..300 {
        l.step(s).unwrap();
        if i % 3 == 0 {
            l.step(e).unwrap();
        }
    }
    assert_eq!(l.len(), 400);
    assert_eq!(l.history().len(), 2);
    assert_eq!(l.history()[0].count.get(), 300);
    let json = serde_json::to_string(&l).unwrap();
    let back: Ledger = serde_json::from_str(&json).unwrap();
    assert_eq!(back, l);
    let direct = Composition::single(s, 300).unwrap().with(e, 100).unwrap();
    assert_eq!(
        l.epsilon(1e-5, &acc).unwrap(),
        acc.epsilon(&direct, 1e-5).unwrap()
    );
    let spent = l.epsilon(1e-5, &acc).unwrap().upper;
    assert!(!l.would_exceed(s, spent * 1.1, 1e-5, &acc).unwrap());
    assert!(l.would_exceed(s, spent * 0.9, 1e-5, &acc).unwrap());
}

#[test]
fn budget_plans_meet_the_budget_and_joint_needs_less_noise() {
    let acc = PrvAccountant::new(Accuracy::relative(0.02)).unwrap();
    let req = PlanRequest {
        epsilon: 4.0,
        delta: 1e-5,
        rho: 0.9,
        shared: Stream {
            q: 0.02,
            steps: 500,
        },
        expert: Stream {
            q: 0.02,
            steps: 500,
        },
        layers: 2,
        sampling: StreamSampling::Alternating,
    };
    let p = plan_budget(&req, &acc).unwrap();
    // additive: each stream meets its share (the expert updates' share covers both layers,
    // which release from one sample per update); the sum of shares meets ε
    assert!(p.additive.shared.epsilon_alone <= 0.9 * 4.0);
    assert!(p.additive.expert.epsilon_alone <= 0.1 * 4.0);
    assert!(p.additive.epsilon_claimed <= 4.0);
    // composing the additive plan's σ's in one PRV spends less than claimed
    assert!(p.additive.epsilon_composed.upper <= p.additive.epsilon_claimed);
    // joint: the composed bound meets ε, with the documented variance ratio
    assert!(p.joint.epsilon_composed.upper <= 4.0);
    let r = (p.joint.expert.sigma / p.joint.shared.sigma).powi(2);
    assert!((r / p.variance_ratio - 1.0).abs() < 1e-9);
    // the joint plan needs less noise on the shared stream than the additive plan
    assert!(p.joint.shared.sigma < p.additive.shared.sigma, "{p:?}");
}

/// A ledger written by an earlier version, with a named parallel group of expert streams that
/// drew their own samples, still loads, costs the group's worst member, and round-trips.
#[test]
fn an_earlier_ledgers_parallel_groups_cost_the_worst_member_and_round_trip() {
    let acc = PrvAccountant::new(Accuracy::relative(0.02)).unwrap();
    let shared = SubsampledGaussian::new(0.02, 1.1).unwrap();
    let quiet = SubsampledGaussian::new(0.02, 2.0).unwrap();
    let loud = SubsampledGaussian::new(0.02, 1.0).unwrap();
    let mech = |m: SubsampledGaussian| {
        format!(
            r#"{{"mechanism":{{"sampling_rate":{},"noise_multiplier":{}}},"count":40}}"#,
            m.q(),
            m.sigma()
        )
    };
    // member 2 is the worst (smallest sigma); the others are quieter
    let members: Vec<String> = [quiet, quiet, loud, quiet]
        .iter()
        .map(|m| format!("[{}]", mech(*m)))
        .collect();
    let file = format!(
        r#"{{"history":[{}],"parallel":[{{"group":"experts[layer 1]","members":[{}],"steps":40}}]}}"#,
        mech(shared),
        members.join(",")
    );
    let l: Ledger = serde_json::from_str(&file).unwrap();
    assert_eq!(l.len(), 80);
    // No release count in the file: one per sequential step and per member of a parallel one.
    assert_eq!(l.releases(), 40 + 40 * 4);
    let groups = l.parallel_groups();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].group, "experts[layer 1]");
    assert_eq!(groups[0].steps, 40);
    let mechanisms: Vec<SubsampledGaussian> =
        groups[0].members.iter().map(|m| m[0].mechanism).collect();
    assert_eq!(mechanisms, [quiet, quiet, loud, quiet]);
    assert_eq!(l.history().len(), 1);
    // The group costs its worst member's history: shared ∘ 40 × loud.
    let worst = Composition::single(shared, 40)
        .unwrap()
        .with(loud, 40)
        .unwrap();
    let sum_all = Composition::single(shared, 40)
        .unwrap()
        .with(loud, 40)
        .unwrap()
        .with(quiet, 120)
        .unwrap();
    let got = l.epsilon(1e-5, &acc).unwrap();
    assert_eq!(got, acc.epsilon(&worst, 1e-5).unwrap());
    assert!(got.upper < acc.epsilon(&sum_all, 1e-5).unwrap().upper);
    // Round trip keeps the structure (a resumed run re-accounts the same thing).
    let json = serde_json::to_string(&l).unwrap();
    let back: Ledger = serde_json::from_str(&json).unwrap();
    assert_eq!(back, l);
    assert_eq!(back.epsilon(1e-5, &acc).unwrap(), got);
}

/// An alternating RAPTOR run charged one sample at a time (a shared sample of one release, an
/// expert sample of a parallel group of releases) costs what the earlier per-group ledger
/// charged: the worst member's history, never the sum over members; its releases are counted.
#[test]
fn alternating_samples_cost_the_worst_member_of_each_expert_sample() {
    let acc = PrvAccountant::new(Accuracy::relative(0.02)).unwrap();
    let shared = SubsampledGaussian::new(0.02, 1.1).unwrap();
    let loud = SubsampledGaussian::new(0.02, 1.0).unwrap();
    let mut experts = SampleCharge::new(0.02).unwrap();
    for (m, sigma) in [2.0, 2.0, 1.0, 2.0].into_iter().enumerate() {
        experts.member_release(1, m, sigma).unwrap();
    }
    let mut l = Ledger::new();
    for _ in 0..40 {
        l.step(shared).unwrap();
        assert_eq!(l.charge(&experts).unwrap(), loud);
    }
    assert_eq!((l.len(), l.releases()), (80, 40 + 40 * 4));
    assert!(l.parallel_groups().is_empty());
    let worst = Composition::single(shared, 40)
        .unwrap()
        .with(loud, 40)
        .unwrap();
    assert_eq!(
        l.epsilon(1e-5, &acc).unwrap(),
        acc.epsilon(&worst, 1e-5).unwrap()
    );
    let back: Ledger = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
    assert_eq!(back, l);
    // A recorded release count below the step count is refused.
    let json = serde_json::to_string(&l)
        .unwrap()
        .replace("\"releases\":200", "\"releases\":79");
    assert!(serde_json::from_str::<Ledger>(&json).is_err());
}

#[test]
fn ledger_and_parallel_group_reject_empty_groups_on_load() {
    let bad = r#"{"history":[],"parallel":[{"group":"g","members":[],"steps":3}]}"#;
    assert!(serde_json::from_str::<Ledger>(bad).is_err());
    // member histories must match the group's step count
    let m = r#"{"mechanism":{"sampling_rate":0.1,"noise_multiplier":1.0},"count":2}"#;
    let short =
        format!(r#"{{"history":[],"parallel":[{{"group":"g","members":[[{m}]],"steps":3}}]}}"#);
    assert!(serde_json::from_str::<Ledger>(&short).is_err());
    let group = r#"{"members":[]}"#;
    assert!(serde_json::from_str::<raptor_accountant::ParallelGroup>(group).is_err());
}

/// The ledger's total-step cap is [`MAX_TOTAL_STEPS`] exactly: reaching it is allowed, one step
/// beyond it is an error (for a one-release sample and for a sample of several releases), and a refused step leaves
/// the ledger as it was. Two mechanisms are used so that the per-entry count check (which
/// only sees one mechanism's count) cannot stand in for the total check.
#[test]
fn total_step_cap_is_exact_and_a_refused_step_changes_nothing() {
    let a = SubsampledGaussian::new(0.01, 1.0).unwrap();
    let b = SubsampledGaussian::new(0.02, 1.0).unwrap();
    let mut l = Ledger::new();
    assert!(l.is_empty());
    assert_eq!(l.len(), 0);
    l.step_many(a, MAX_TOTAL_STEPS - 1).unwrap();
    assert!(!l.is_empty());
    assert_eq!(l.len(), MAX_TOTAL_STEPS - 1);
    // The last allowed step, of another mechanism: exactly at the cap.
    l.step(b).unwrap();
    assert_eq!(l.len(), MAX_TOTAL_STEPS);
    let full = l.clone();
    let over = u128::from(MAX_TOTAL_STEPS) + 1;
    assert_eq!(
        l.step(b).unwrap_err(),
        AccountantError::TooManySteps(over, MAX_TOTAL_STEPS)
    );
    assert_eq!(
        l.step_many(SubsampledGaussian::new(0.03, 1.0).unwrap(), 1)
            .unwrap_err(),
        AccountantError::TooManySteps(over, MAX_TOTAL_STEPS)
    );
    let mut two = SampleCharge::new(0.01).unwrap();
    two.release(1.0).unwrap();
    two.member_release(0, 0, 2.0).unwrap();
    assert_eq!(
        l.charge(&two).unwrap_err(),
        AccountantError::TooManySteps(over, MAX_TOTAL_STEPS)
    );
    assert_eq!(l, full);
    assert_eq!(l.len(), MAX_TOTAL_STEPS);
    assert_eq!(l.releases(), MAX_TOTAL_STEPS);

    // A sample of two releases may also take the ledger exactly to the cap, not beyond.
    let mut p = Ledger::new();
    p.step_many(a, MAX_TOTAL_STEPS - 1).unwrap();
    p.charge(&two).unwrap();
    assert_eq!(p.len(), MAX_TOTAL_STEPS);
    assert_eq!(p.releases(), MAX_TOTAL_STEPS - 1 + 2);
    assert_eq!(
        p.charge(&two).unwrap_err(),
        AccountantError::TooManySteps(over, MAX_TOTAL_STEPS)
    );
    // Small counts add (not multiply): 3 + 4 steps on an empty ledger are 7.
    let mut s = Ledger::new();
    s.step_many(a, 3).unwrap();
    s.step_many(b, 4).unwrap();
    assert_eq!(s.len(), 7);
    assert_eq!(s.releases(), 7);
}

/// A ledger loaded from a file is held to the same cap: the parallel groups' steps count
/// toward it, and a file beyond it is refused.
#[test]
fn total_step_cap_applies_to_a_loaded_ledger() {
    let m = r#"{"mechanism":{"sampling_rate":0.1,"noise_multiplier":1.0},"count":COUNT}"#;
    let entry = |c: u64| m.replace("COUNT", &c.to_string());
    let file = |seq: u64, par: u64| {
        format!(
            r#"{{"history":[{}],"parallel":[{{"group":"g","members":[[{}]],"steps":{par}}}]}}"#,
            entry(seq),
            entry(par)
        )
    };
    let at_cap: Ledger = serde_json::from_str(&file(MAX_TOTAL_STEPS - 5, 5)).unwrap();
    assert_eq!(at_cap.len(), MAX_TOTAL_STEPS);
    assert!(serde_json::from_str::<Ledger>(&file(MAX_TOTAL_STEPS - 5, 6)).is_err());
}

/// `would_exceed` answers "strictly above the budget": a step whose certified ε equals the
/// budget is allowed (as calibration allows ε = target), the next float below is not.
#[test]
fn would_exceed_allows_spending_exactly_the_budget() {
    let acc = PrvAccountant::new(Accuracy::relative(0.02)).unwrap();
    let s = SubsampledGaussian::new(0.02, 1.1).unwrap();
    let mut l = Ledger::new();
    for _ in 0..20 {
        l.step(s).unwrap();
    }
    let mut next = l.clone();
    next.step(s).unwrap();
    let after = next.epsilon(1e-5, &acc).unwrap().upper;
    assert!(!l.would_exceed(s, after, 1e-5, &acc).unwrap());
    assert!(l.would_exceed(s, after.next_down(), 1e-5, &acc).unwrap());
    // An empty ledger's first step is judged the same way.
    let empty = Ledger::new();
    let one = acc
        .epsilon(&Composition::single(s, 1).unwrap(), 1e-5)
        .unwrap()
        .upper;
    assert!(!empty.would_exceed(s, one, 1e-5, &acc).unwrap());
    assert!(empty.would_exceed(s, one.next_down(), 1e-5, &acc).unwrap());
}

/// Relative difference below 1e-12 (the same formula evaluated in another order).
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

/// Every figure of a budget plan, re-derived from its definition. The streams differ in q and
/// T and L = 3, so that no factor of a formula can be dropped or swapped without changing a
/// number (with equal streams most of them cancel).
#[test]
fn budget_plan_figures_are_what_they_claim() {
    let acc = PrvAccountant::new(Accuracy::relative(0.02)).unwrap();
    let (eps, delta, rho, l) = (3.0, 1e-5, 0.7, 3u64);
    let (qs, ts, qe, te) = (0.02, 300u64, 0.05, 120u64);
    let req = PlanRequest {
        epsilon: eps,
        delta,
        rho,
        shared: Stream { q: qs, steps: ts },
        expert: Stream { q: qe, steps: te },
        layers: l,
        sampling: StreamSampling::Alternating,
    };
    let p = plan_budget(&req, &acc).unwrap();
    assert_eq!(p.request, req);
    let mech = |q: f64, s: f64| SubsampledGaussian::new(q, s).unwrap();
    let alone = |q: f64, s: f64, t: u64, d: f64| {
        acc.epsilon(&Composition::single(mech(q, s), t).unwrap(), d)
            .unwrap()
            .upper
    };
    // An expert update: one sample releasing L layers, one mechanism of σ_e/√L (rounded toward
    // more privacy loss, as `SampleCharge` folds it).
    let expert = |se: f64| {
        let mut c = SampleCharge::new(qe).unwrap();
        for layer in 0..l {
            c.member_release(layer as usize, 0, se).unwrap();
        }
        let m = c.mechanism().unwrap();
        assert!(close(m.sigma(), se / (l as f64).sqrt()), "{m:?}");
        m
    };
    let whole = |ss: f64, se: f64| {
        let c = Composition::single(mech(qs, ss), ts)
            .unwrap()
            .with(expert(se), te)
            .unwrap();
        acc.epsilon(&c, delta).unwrap()
    };
    let expert_alone = |se: f64, d: f64| {
        acc.epsilon(&Composition::single(expert(se), te).unwrap(), d)
            .unwrap()
            .upper
    };

    // Additive: ε_s = ρε, δ_s = ρδ for the shared stream; ε_e = (1 − ρ)ε, δ_e = (1 − ρ)δ for the
    // expert updates (all L layers); each σ meets its own target and 1 % less noise would not.
    let a = &p.additive;
    let s = &a.shared;
    assert!(close(s.epsilon_target, rho * eps), "{s:?}");
    assert!(close(s.delta_target, rho * delta), "{s:?}");
    assert_eq!(s.steps, ts);
    assert_eq!(
        s.epsilon_alone,
        alone(s.q, s.sigma, ts, s.delta_target),
        "{s:?}"
    );
    assert!(s.epsilon_alone <= s.epsilon_target, "{s:?}");
    assert!(alone(s.q, s.sigma * 0.99, ts, s.delta_target) > s.epsilon_target);
    let e = &a.expert;
    assert!(close(e.epsilon_target, (1.0 - rho) * eps), "{e:?}");
    assert!(close(e.delta_target, (1.0 - rho) * delta), "{e:?}");
    assert_eq!(e.steps, te);
    assert_eq!(
        e.epsilon_alone,
        expert_alone(e.sigma, e.delta_target),
        "{e:?}"
    );
    assert!(e.epsilon_alone <= e.epsilon_target, "{e:?}");
    assert!(expert_alone(e.sigma * 0.99, e.delta_target) > e.epsilon_target);
    assert_eq!((a.shared.q, a.expert.q), (qs, qe));
    assert!(close(
        a.epsilon_claimed,
        a.shared.epsilon_alone + a.expert.epsilon_alone
    ));
    assert!(a.epsilon_claimed <= eps);
    assert_eq!(a.epsilon_composed, whole(a.shared.sigma, a.expert.sigma));

    // Joint: σ_e²/σ_s² = ρ·L·T_e·q_e² / ((1 − ρ)·T_s·q_s²), the whole run certified at (ε, δ)
    // and not wastefully (1 % less noise on both streams would miss ε).
    let j = &p.joint;
    let ratio = rho * 3.0 * 120.0 * qe * qe / ((1.0 - rho) * 300.0 * qs * qs);
    assert!(
        close(p.variance_ratio, ratio),
        "{} vs {ratio}",
        p.variance_ratio
    );
    assert!(
        close(j.expert.sigma, j.shared.sigma * ratio.sqrt()),
        "{j:?}"
    );
    assert_eq!(j.epsilon_composed, whole(j.shared.sigma, j.expert.sigma));
    assert_eq!(j.epsilon_claimed, j.epsilon_composed.upper);
    assert!(j.epsilon_claimed <= eps);
    assert!(whole(j.shared.sigma * 0.99, j.expert.sigma * 0.99).upper > eps);
    assert_eq!(
        j.shared.epsilon_alone,
        alone(qs, j.shared.sigma, ts, delta),
        "{j:?}"
    );
    assert_eq!(
        j.expert.epsilon_alone,
        expert_alone(j.expert.sigma, delta),
        "{j:?}"
    );
    assert!(j.shared.epsilon_target.is_nan() && j.expert.delta_target.is_nan());

    // The run's composition: the shared stream's T_s steps, then T_e expert updates of L layers.
    let c = raptor_accountant::calibrate::run_composition(&req, 1.3, 2.1).unwrap();
    assert_eq!(acc.epsilon(&c, delta).unwrap(), whole(1.3, 2.1));
}

/// ρ must lie strictly between 0 and 1: both ends are errors, values inside are not.
#[test]
fn rho_must_be_strictly_inside_the_unit_interval() {
    let acc = PrvAccountant::new(Accuracy::relative(0.05)).unwrap();
    let req = |rho: f64| PlanRequest {
        epsilon: 2.0,
        delta: 1e-5,
        rho,
        shared: Stream { q: 0.02, steps: 50 },
        expert: Stream { q: 0.02, steps: 50 },
        layers: 1,
        sampling: StreamSampling::Alternating,
    };
    for bad in [0.0, -0.1, 1.0, 1.5, f64::NAN, f64::INFINITY] {
        assert!(
            matches!(
                plan_budget(&req(bad), &acc),
                Err(AccountantError::InvalidRho(_))
            ),
            "rho {bad}"
        );
    }
    for good in [1e-3, 0.5, 0.999] {
        assert!(plan_budget(&req(good), &acc).is_ok(), "rho {good}");
    }
}

/// The expert stream's steps and the number of layers are checked: beyond the caps they are
/// errors (an expert update of L layers is one mechanism: T_e steps, not T_e·L).
#[test]
fn run_composition_rejects_too_many_steps_or_layers() {
    let req = |steps: u64, layers: u64| PlanRequest {
        epsilon: 1.0,
        delta: 1e-5,
        rho: 0.5,
        shared: Stream { q: 0.01, steps: 10 },
        expert: Stream { q: 0.01, steps },
        layers,
        sampling: StreamSampling::Alternating,
    };
    let run = raptor_accountant::calibrate::run_composition;
    assert_eq!(
        run(&req(10, 1 << 30), 1.0, 1.0).unwrap_err(),
        AccountantError::InvalidLayers(1 << 30)
    );
    let too_many = run(&req(10, MAX_LAYERS + 1), 1.0, 1.0).unwrap_err();
    assert_eq!(too_many, AccountantError::InvalidLayers(MAX_LAYERS + 1));
    // The message names the cap.
    assert!(
        too_many
            .to_string()
            .contains(&format!("between 1 and {MAX_LAYERS}")),
        "{too_many}"
    );
    assert_eq!(
        run(&req(10, 0), 1.0, 1.0).unwrap_err(),
        AccountantError::InvalidLayers(0)
    );
    assert!(matches!(
        run(&req(MAX_TOTAL_STEPS + 1, 2), 1.0, 1.0),
        Err(AccountantError::TooManySteps(..))
    ));
    // The shared and expert steps together are capped too.
    assert!(matches!(
        run(&req(MAX_TOTAL_STEPS - 5, 2), 1.0, 1.0),
        Err(AccountantError::TooManySteps(..))
    ));
    assert!(run(&req(MAX_TOTAL_STEPS / 2, MAX_LAYERS), 1.0, 1.0).is_ok());
}

/// A plan whose streams share one sample per update is calibrated on the one mechanism each
/// update costs: T updates of σ_eff (1/σ_eff² = 1/σ_s² + L/σ_e²) meet the target, with ρ the
/// shared stream's share of 1/σ_eff²; charging the same σ's as two independent streams (what
/// the alternating plan's composition does) gives a smaller, wrong ε.
#[test]
fn a_simultaneous_plan_is_calibrated_on_the_one_sample_mechanism() {
    let acc = PrvAccountant::new(Accuracy::relative(0.01)).unwrap();
    for (layers, rho) in [(1u64, 0.5), (2, 0.7)] {
        let req = PlanRequest {
            epsilon: 2.0,
            delta: 1e-5,
            rho,
            shared: Stream {
                q: 0.02,
                steps: 300,
            },
            expert: Stream {
                q: 0.02,
                steps: 300,
            },
            layers,
            sampling: StreamSampling::Simultaneous,
        };
        let p = plan_budget(&req, &acc).unwrap();
        let (s, e) = (p.joint.shared.sigma, p.joint.expert.sigma);
        assert_eq!((p.additive.shared.sigma, p.additive.expert.sigma), (s, e));
        // ρ is the shared stream's share of 1/σ_eff².
        let inv = 1.0 / (s * s) + layers as f64 / (e * e);
        assert!(((1.0 / (s * s)) / inv - rho).abs() < 1e-9, "{p:?}");
        // The ledger of the run (one charge per update) spends exactly the plan's ε, ≤ target.
        let mut charge = SampleCharge::new(0.02).unwrap();
        charge.release(s).unwrap();
        for l in 0..layers {
            for m in 0..4 {
                charge.member_release(l as usize, m, e).unwrap();
            }
        }
        let mut ledger = Ledger::new();
        for _ in 0..300 {
            ledger.charge(&charge).unwrap();
        }
        let spent = ledger.epsilon(1e-5, &acc).unwrap().upper;
        assert!(spent <= 2.0, "{spent}");
        assert!(
            (spent - p.joint.epsilon_composed.upper).abs() <= 1e-9 * spent,
            "{spent} vs {:?}",
            p.joint.epsilon_composed
        );
        // Calibrated to the target (within the bisection's tolerance on σ).
        assert!(spent >= 2.0 * 0.98, "{spent}");
        // The same σ's composed as independent streams claim less: that would be the bug.
        let wrong = Composition::single(SubsampledGaussian::new(0.02, s).unwrap(), 300)
            .unwrap()
            .with(SubsampledGaussian::new(0.02, e).unwrap(), 300 * layers)
            .unwrap();
        assert!(acc.epsilon(&wrong, 1e-5).unwrap().upper < 0.9 * spent);
    }
}
