#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Bad input gives typed errors carrying the offending value, never a panic or a number.

use raptor_accountant::{
    AccountantError as E, Accuracy, Composition, Ledger, Method, ParallelGroup, PlanRequest,
    PrvAccountant, RdpAccountant, Stream, StreamSampling, SubsampledGaussian, calibrate_sigma,
    plan_budget,
};

fn comp() -> Composition {
    Composition::single(SubsampledGaussian::new(0.01, 1.0).unwrap(), 100).unwrap()
}

#[test]
fn invalid_mechanisms() {
    assert_eq!(
        SubsampledGaussian::new(0.0, 1.0),
        Err(E::InvalidSamplingRate(0.0))
    );
    assert_eq!(
        SubsampledGaussian::new(1.5, 1.0),
        Err(E::InvalidSamplingRate(1.5))
    );
    assert_eq!(
        SubsampledGaussian::new(-0.1, 1.0),
        Err(E::InvalidSamplingRate(-0.1))
    );
    assert!(
        matches!(SubsampledGaussian::new(f64::NAN, 1.0), Err(E::InvalidSamplingRate(v)) if v.is_nan())
    );
    assert_eq!(
        SubsampledGaussian::new(0.1, 0.0),
        Err(E::InvalidNoiseMultiplier(0.0))
    );
    assert_eq!(
        SubsampledGaussian::new(0.1, -2.0),
        Err(E::InvalidNoiseMultiplier(-2.0))
    );
    assert_eq!(
        SubsampledGaussian::new(0.1, f64::INFINITY),
        Err(E::InvalidNoiseMultiplier(f64::INFINITY))
    );
    assert!(
        matches!(SubsampledGaussian::new(0.1, f64::NAN), Err(E::InvalidNoiseMultiplier(v)) if v.is_nan())
    );
}

#[test]
fn invalid_counts_and_compositions() {
    let m = SubsampledGaussian::new(0.01, 1.0).unwrap();
    assert_eq!(Composition::single(m, 0), Err(E::InvalidCount(0)));
    assert!(matches!(
        Composition::single(m, 2_000_000_000),
        Err(E::TooManySteps(..))
    ));
    let acc = PrvAccountant::default();
    assert_eq!(
        acc.epsilon(&Composition::new(), 1e-5),
        Err(E::EmptyComposition)
    );
    assert_eq!(
        acc.delta(&Composition::new(), 1.0),
        Err(E::EmptyComposition)
    );
    assert_eq!(
        RdpAccountant::default().epsilon(&Composition::new(), 1e-5),
        Err(E::EmptyComposition)
    );
    assert_eq!(ParallelGroup::new(vec![]), Err(E::EmptyParallelGroup));
    assert_eq!(
        ParallelGroup::new(vec![Composition::new()]),
        Err(E::EmptyComposition)
    );
}

#[test]
fn invalid_delta_and_epsilon() {
    let acc = PrvAccountant::default();
    for d in [0.0, 1.0, -1e-5, 2.0] {
        assert_eq!(acc.epsilon(&comp(), d), Err(E::InvalidDelta(d)));
        assert_eq!(
            RdpAccountant::default().epsilon(&comp(), d),
            Err(E::InvalidDelta(d))
        );
    }
    assert!(matches!(acc.epsilon(&comp(), f64::NAN), Err(E::InvalidDelta(v)) if v.is_nan()));
    assert_eq!(acc.delta(&comp(), -1.0), Err(E::InvalidEpsilon(-1.0)));
    assert_eq!(
        acc.delta(&comp(), f64::INFINITY),
        Err(E::InvalidEpsilon(f64::INFINITY))
    );
    assert!(matches!(acc.delta(&comp(), f64::NAN), Err(E::InvalidEpsilon(v)) if v.is_nan()));
}

#[test]
fn invalid_accuracy_and_orders() {
    assert!(matches!(
        PrvAccountant::new(Accuracy::relative(0.0)),
        Err(E::InvalidAccuracy { .. })
    ));
    assert!(matches!(
        PrvAccountant::new(Accuracy::absolute(f64::NAN)),
        Err(E::InvalidAccuracy { .. })
    ));
    assert!(matches!(
        PrvAccountant::new(Accuracy::relative(0.01).with_delta_error_rel(1.0)),
        Err(E::InvalidAccuracy {
            name: "delta_error_rel",
            ..
        })
    ));
    assert_eq!(
        RdpAccountant::with_orders(vec![2.0, 1.0]),
        Err(E::InvalidOrder(1.0))
    );
    // An empty list is named as such (it once read "order NaN").
    let empty = RdpAccountant::with_orders(vec![]);
    assert_eq!(empty, Err(E::NoOrders));
    assert!(empty.unwrap_err().to_string().contains("empty"));
}

/// A noise multiplier so small that one step's privacy loss overflows is named as such, by
/// both accountants (it once read "numerical failure in RDP order").
#[test]
fn a_vanishing_noise_multiplier_is_named() {
    for q in [0.01, 1.0] {
        let c = Composition::single(SubsampledGaussian::new(q, 1e-300).unwrap(), 10).unwrap();
        let want = E::NoiseTooSmall { sigma: 1e-300 };
        assert_eq!(
            RdpAccountant::default().epsilon(&c, 1e-5),
            Err(want.clone())
        );
        assert_eq!(
            PrvAccountant::default().epsilon(&c, 1e-5),
            Err(want.clone())
        );
        assert!(want.to_string().contains("noise multiplier sigma = 1e-300"));
    }
}

/// A query whose requested accuracy needs more grid points than allowed is answered from the
/// finest grid that fits (certified, the grid's tolerance reported), or from the RDP bound where
/// no grid fits; composing at that accuracy by hand stays a typed error with a remedy.
#[test]
fn too_fine_a_grid_answers_from_the_finest_grid_that_fits() {
    let acc = PrvAccountant::new(Accuracy::absolute(1e-7).with_max_points(1 << 16)).unwrap();
    let c = Composition::single(SubsampledGaussian::new(0.25, 0.6).unwrap(), 10_000).unwrap();
    let e = acc.epsilon(&c, 1e-5).unwrap();
    let Method::Prv { eps_error } = e.method else {
        panic!("expected a PRV answer, got {e:?}")
    };
    assert!(eps_error > 1e-7, "{e:?}");
    // Certified: at or above the lower bound of an answer at the default accuracy, and close.
    let reference = PrvAccountant::default().epsilon(&c, 1e-5).unwrap();
    assert!(
        e.upper >= reference.lower && e.upper >= reference.estimate,
        "{e:?} {reference:?}"
    );
    assert!(e.upper <= reference.upper * 1.01, "{e:?} {reference:?}");
    match acc.compose(&c, 1e-7, 1e-10) {
        Err(E::GridTooLarge {
            needed,
            limit,
            suggested_eps_error,
            ..
        }) => {
            assert!(needed > limit as u64);
            assert!(suggested_eps_error > 1e-7);
            let msg = acc.compose(&c, 1e-7, 1e-10).unwrap_err().to_string();
            assert!(
                msg.contains("coarser accuracy") && msg.contains("RDP"),
                "{msg}"
            );
        }
        other => panic!("expected GridTooLarge, got {other:?}"),
    }
    // No grid fits 16 points: the RDP bound answers, and says so.
    let tiny = PrvAccountant::new(Accuracy::default().with_max_points(16)).unwrap();
    let e = tiny.epsilon(&c, 1e-5).unwrap();
    let rdp = RdpAccountant::default().epsilon(&c, 1e-5).unwrap();
    assert_eq!(e.method, Method::Rdp { order: rdp.order });
    assert_eq!((e.upper, e.lower), (rdp.epsilon, 0.0));
}

#[test]
fn calibration_and_planning_errors() {
    let acc = PrvAccountant::default();
    assert_eq!(
        calibrate_sigma(-1.0, 1e-5, 0.01, 100, &acc).unwrap_err(),
        E::InvalidEpsilon(-1.0)
    );
    assert_eq!(
        calibrate_sigma(0.0, 1e-5, 0.01, 100, &acc).unwrap_err(),
        E::InvalidEpsilon(0.0)
    );
    assert_eq!(
        calibrate_sigma(1.0, 1e-5, 0.0, 100, &acc).unwrap_err(),
        E::InvalidSamplingRate(0.0)
    );
    assert_eq!(
        calibrate_sigma(1.0, 1e-5, 0.01, 0, &acc).unwrap_err(),
        E::InvalidCount(0)
    );
    assert_eq!(
        calibrate_sigma(1.0, 1.0, 0.01, 10, &acc).unwrap_err(),
        E::InvalidDelta(1.0)
    );
    let req = PlanRequest {
        epsilon: 1.0,
        delta: 1e-5,
        rho: 1.0,
        shared: Stream {
            q: 0.01,
            steps: 100,
        },
        expert: Stream {
            q: 0.01,
            steps: 100,
        },
        layers: 1,
        sampling: StreamSampling::Alternating,
    };
    assert_eq!(plan_budget(&req, &acc).unwrap_err(), E::InvalidRho(1.0));
    assert_eq!(
        plan_budget(
            &PlanRequest {
                rho: 0.5,
                layers: 0,
                ..req
            },
            &acc
        )
        .unwrap_err(),
        E::InvalidLayers(0)
    );
    // Streams released from one sample must share q and steps.
    let one = PlanRequest {
        rho: 0.5,
        sampling: StreamSampling::Simultaneous,
        ..req
    };
    let mismatch = PlanRequest {
        expert: Stream { q: 0.01, steps: 99 },
        ..one
    };
    assert_eq!(
        plan_budget(&mismatch, &acc).unwrap_err(),
        E::OneSampleMismatch {
            shared_q: 0.01,
            shared_steps: 100,
            expert_q: 0.01,
            expert_steps: 99
        }
    );
    let mismatch = PlanRequest {
        expert: Stream {
            q: 0.02,
            steps: 100,
        },
        ..one
    };
    assert!(matches!(
        plan_budget(&mismatch, &acc).unwrap_err(),
        E::OneSampleMismatch { .. }
    ));
    assert_eq!(
        plan_budget(
            &PlanRequest {
                rho: 0.5,
                shared: Stream { q: 2.0, steps: 1 },
                ..req
            },
            &acc
        )
        .unwrap_err(),
        E::InvalidSamplingRate(2.0)
    );
}

#[test]
fn ledger_rejects_bad_records() {
    let mut l = Ledger::new();
    assert_eq!(
        l.step_many(SubsampledGaussian::new(0.01, 1.0).unwrap(), 0),
        Err(E::InvalidCount(0))
    );
    assert!(l.epsilon(1e-5, &PrvAccountant::default()).is_err());
    // A serialized record with an invalid mechanism or count is refused on load.
    let bad =
        r#"{"history":[{"mechanism":{"sampling_rate":1.5,"noise_multiplier":1.0},"count":3}]}"#;
    assert!(serde_json::from_str::<Ledger>(bad).is_err());
    let zero =
        r#"{"history":[{"mechanism":{"sampling_rate":0.5,"noise_multiplier":1.0},"count":0}]}"#;
    assert!(serde_json::from_str::<Ledger>(zero).is_err());
}

/// The grid limit budgets the total over member combinations (bounded memory on every input): a
/// heterogeneous parallel group whose members fit one at a time but not together is a typed error;
/// the same group fits a larger budget.
#[test]
fn grid_limit_budgets_all_member_combinations_together() {
    let members: Vec<Composition> = (0..6)
        .map(|i| {
            Composition::single(
                SubsampledGaussian::new(0.02, 1.0 + 0.1 * i as f64).unwrap(),
                100,
            )
            .unwrap()
        })
        .collect();
    let one = members[0].clone();
    let group = ParallelGroup::new(members).unwrap().into_composition();
    let tol = Accuracy::absolute(1e-3);
    // Points of one member (both directions) at this tolerance.
    let alone = PrvAccountant::new(tol)
        .unwrap()
        .compose(&one, 1e-3, 1e-10)
        .unwrap()
        .grid_points();
    let limit = 2 * alone;
    let small = PrvAccountant::new(tol.with_max_points(limit)).unwrap();
    assert!(small.compose(&one, 1e-3, 1e-10).is_ok());
    match small.compose(&group, 1e-3, 1e-10) {
        Err(E::GridTooLarge {
            needed, limit: l, ..
        }) => {
            assert_eq!(l, 2 * limit);
            assert!(needed > 2 * limit as u64);
        }
        other => panic!("expected GridTooLarge, got {other:?}"),
    }
    let big = PrvAccountant::new(tol.with_max_points(8 * limit)).unwrap();
    assert!(big.compose(&group, 1e-3, 1e-10).is_ok());
}

/// `compose`'s two error budgets are checked at their boundaries: an ε tolerance must be
/// positive and finite, a δ error budget must lie strictly inside (0, 1). A budget of exactly
/// 0 is refused (no composition can spend nothing on truncation and round-off), and the error
/// names the budget and carries the value given.
#[test]
fn compose_refuses_error_budgets_outside_their_ranges() {
    let acc = PrvAccountant::default();
    let c = comp();
    for eps_error in [0.0, -1e-3, f64::NAN, f64::INFINITY] {
        match acc.compose(&c, eps_error, 1e-10) {
            Err(E::InvalidAccuracy { name, value, .. }) => {
                assert_eq!(name, "eps_error");
                assert!(value == eps_error || (value.is_nan() && eps_error.is_nan()));
            }
            other => panic!("eps_error {eps_error}: expected InvalidAccuracy, got {other:?}"),
        }
    }
    for delta_error in [0.0, -0.0, 1.0, 1.5, -1e-10, f64::NAN, f64::INFINITY] {
        match acc.compose(&c, 1e-3, delta_error) {
            Err(E::InvalidAccuracy { name, value, .. }) => {
                assert_eq!(name, "delta_error");
                assert!(value == delta_error || (value.is_nan() && delta_error.is_nan()));
            }
            other => panic!("delta_error {delta_error}: expected InvalidAccuracy, got {other:?}"),
        }
    }
    // Just inside both ranges: accepted.
    assert!(acc.compose(&c, 1e-3, 1e-300).is_ok());
    assert!(acc.compose(&c, 1e-3, 0.5).is_ok());
}
