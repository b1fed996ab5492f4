#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Newton–Schulz planning: every schedule agrees with the others within the documented
//! tolerance; the batch API equals one-by-one calls; the choice is remembered and reused.
//! No test depends on wall-clock time.

use faer::Mat;
use proptest::prelude::*;
use raptor_muon::diagnostics::gaussian_matrix;
use raptor_muon::{
    NsConfig, NsProducts, NsSchedule, newton_schulz, newton_schulz_batch, planned_ns_schedule,
    with_ns_schedule,
};

fn all() -> Vec<NsSchedule> {
    let mut v = Vec::new();
    for products in [NsProducts::Symmetric, NsProducts::Full, NsProducts::Gram] {
        for parallel in [false, true] {
            v.push(NsSchedule { products, parallel });
        }
    }
    v.push(NsSchedule {
        products: NsProducts::Team,
        parallel: true,
    });
    v
}

/// The documented agreement between schedules, relative to the result's largest entry: 1e-4
/// for the symmetric and plain products, 1e-3 for the Gram-space iteration.
fn tol(s: NsSchedule) -> f32 {
    if s.products == NsProducts::Gram {
        1e-3
    } else {
        1e-4
    }
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

fn max_abs(m: &Mat<f32>) -> f32 {
    let mut v = 0f32;
    for j in 0..m.ncols() {
        for i in 0..m.nrows() {
            v = v.max(m[(i, j)].abs());
        }
    }
    v
}

fn max_diff(a: &Mat<f32>, b: &Mat<f32>) -> f32 {
    assert_eq!((a.nrows(), a.ncols()), (b.nrows(), b.ncols()));
    let mut v = 0f32;
    for j in 0..a.ncols() {
        for i in 0..a.nrows() {
            v = v.max((a[(i, j)] - b[(i, j)]).abs());
        }
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// All six schedules agree within their tolerance of the result's largest entry (Keller,
    /// 5 steps; Taylor p₂, 8 steps), in either orientation.
    #[test]
    fn schedules_agree_within_tolerance(
        rows in 1usize..90,
        cols in 1usize..90,
        seed in 0u64..500,
        taylor in any::<bool>(),
    ) {
        let m = gaussian_matrix(rows, cols, 1.0, seed);
        let cfg = if taylor { NsConfig::taylor(2, 8) } else { NsConfig::keller() };
        let base = with_ns_schedule(all()[0], || newton_schulz(m.as_ref(), &cfg).unwrap());
        let scale = max_abs(&base).max(1e-6);
        for s in all() {
            let o = with_ns_schedule(s, || newton_schulz(m.as_ref(), &cfg).unwrap());
            prop_assert!(max_diff(&o, &base) <= tol(s) * scale, "{s}: {}", max_diff(&o, &base));
        }
    }
}

/// The batch result equals one-by-one calls bitwise under every schedule, on 1–3 threads,
/// for a mix of wide and tall matrices of one shape.
#[test]
fn batch_equals_one_by_one() {
    let cfg = NsConfig::keller();
    let mats: Vec<Mat<f32>> = (0..5)
        .map(|k| {
            let m = gaussian_matrix(48, 80, 1.0, 200 + k);
            if k % 2 == 0 {
                m
            } else {
                m.transpose().to_owned()
            }
        })
        .collect();
    let refs: Vec<_> = mats.iter().map(|m| m.as_ref()).collect();
    for s in all() {
        for threads in [1, 2, 3] {
            pool(threads).install(|| {
                let batch = with_ns_schedule(s, || newton_schulz_batch(&refs, &cfg).unwrap());
                // the batch runs each matrix's products on one thread
                let seq = NsSchedule {
                    parallel: false,
                    ..s
                };
                for (m, b) in refs.iter().zip(&batch) {
                    let one = with_ns_schedule(seq, || newton_schulz(*m, &cfg).unwrap());
                    assert_eq!(max_diff(&one, b), 0.0, "{s} threads {threads}");
                    let par = with_ns_schedule(s, || newton_schulz(*m, &cfg).unwrap());
                    assert!(
                        max_diff(&par, b) <= tol(s) * max_abs(b),
                        "{s} threads {threads}"
                    );
                }
            });
        }
    }
}

/// Planned (unforced) batch and one-by-one calls agree within the tolerance, and bad input in
/// any matrix is an error.
#[test]
fn planned_batch_agrees_and_reports_errors() {
    let cfg = NsConfig::keller();
    let mats: Vec<Mat<f32>> = (0..4)
        .map(|k| gaussian_matrix(40, 64, 1.0, 300 + k))
        .collect();
    let refs: Vec<_> = mats.iter().map(|m| m.as_ref()).collect();
    let batch = pool(2).install(|| newton_schulz_batch(&refs, &cfg).unwrap());
    for (m, b) in refs.iter().zip(&batch) {
        let one = newton_schulz(*m, &cfg).unwrap();
        assert!(max_diff(&one, b) <= 1e-3 * max_abs(b));
    }
    let mut bad = mats.clone();
    bad[2][(3, 4)] = f32::NAN;
    let refs: Vec<_> = bad.iter().map(|m| m.as_ref()).collect();
    assert!(
        pool(2)
            .install(|| newton_schulz_batch(&refs, &cfg))
            .is_err()
    );
    assert!(newton_schulz_batch(&[], &cfg).unwrap().is_empty());
}

/// The first call of a shape class plans and remembers; its result is the chosen schedule's.
#[test]
fn the_choice_is_remembered_and_reused() {
    let cfg = NsConfig::keller();
    let m = gaussian_matrix(33, 150, 1.0, 7);
    pool(2).install(|| {
        assert_eq!(planned_ns_schedule(33, 150, &cfg), None);
        let first = newton_schulz(m.as_ref(), &cfg).unwrap();
        let chosen = planned_ns_schedule(33, 150, &cfg).expect("planned");
        assert!(NsSchedule::candidates(33, 150, 2, &cfg).contains(&chosen));
        let forced = with_ns_schedule(chosen, || newton_schulz(m.as_ref(), &cfg).unwrap());
        assert_eq!(max_diff(&first, &forced), 0.0);
        // the transposed shape is the same class
        assert_eq!(planned_ns_schedule(150, 33, &cfg), Some(chosen));
    });
}

#[test]
fn schedules_print_and_parse() {
    for s in all() {
        assert_eq!(s.to_string().parse::<NsSchedule>().unwrap(), s);
    }
    for bad in ["", "sym", "sym/", "tri/par", "full/fast", "sym/par/x"] {
        assert!(bad.parse::<NsSchedule>().is_err(), "{bad}");
    }
}

/// Ill-conditioned inputs (singular values spread over 10⁶; rank 8 plus 10⁻⁴ noise; a large
/// rank-one part): every schedule, the Gram-space one included, stays within its tolerance of
/// the f64 SVD reference (Keller, 5 steps; Taylor p₂, 5 steps).
#[test]
fn every_schedule_is_close_to_the_f64_reference_on_ill_conditioned_inputs() {
    use raptor_muon::reference::newton_schulz_via_svd;
    let (m, n) = (48, 160);
    let g = gaussian_matrix(m, n, 1.0, 41);
    let u = gaussian_matrix(m, 8, 1.0, 42);
    let v = gaussian_matrix(8, n, 1.0, 43);
    let low_rank = Mat::<f32>::from_fn(m, n, |i, j| {
        (0..8).map(|k| u[(i, k)] * v[(k, j)]).sum::<f32>() + 1e-4 * g[(i, j)]
    });
    // Decaying rows of a Gaussian matrix: singular values spread over about 10⁶.
    let decay = Mat::<f32>::from_fn(m, n, |i, j| {
        g[(i, j)] * 10f32.powf(-6.0 * i as f32 / (m - 1) as f32)
    });
    let spike = Mat::<f32>::from_fn(m, n, |i, j| g[(i, j)] + 5.0 * u[(i, 0)] * v[(0, j)]);
    for (name, x) in [
        ("low rank", &low_rank),
        ("decay", &decay),
        ("spike", &spike),
    ] {
        for cfg in [NsConfig::keller(), NsConfig::taylor(2, 5)] {
            let want = newton_schulz_via_svd(x.as_ref(), &cfg).unwrap();
            let want32 = Mat::<f32>::from_fn(m, n, |i, j| want[(i, j)] as f32);
            let scale = max_abs(&want32);
            for s in all() {
                let o = with_ns_schedule(s, || newton_schulz(x.as_ref(), &cfg).unwrap());
                let d = max_diff(&o, &want32);
                assert!(
                    d <= tol(s) * scale,
                    "{name} {cfg:?} {s}: {d} (scale {scale})"
                );
            }
        }
    }
}

/// The team schedule (plain products split by columns over the persistent team, whose threads spin between
/// products) agrees with the plain products on one thread for every team size, odd shapes and
/// more threads than rows included, both orientations; for a given team size it is
/// deterministic (bitwise the same on a second call).
#[test]
fn team_schedule_agrees_with_plain_products_for_every_team_size() {
    let team = NsSchedule {
        products: NsProducts::Team,
        parallel: true,
    };
    let seq = NsSchedule {
        products: NsProducts::Full,
        parallel: false,
    };
    for (k, (r, c)) in [(37, 101), (64, 64), (3, 50), (90, 20), (1, 9)]
        .into_iter()
        .enumerate()
    {
        let x = gaussian_matrix(r, c, 1.0, 70 + k as u64);
        // Polynomials of degree 1 (no Horner product), 2 (Keller; one) and 3 (two).
        for cfg in [
            NsConfig::keller(),
            NsConfig::taylor(1, 6),
            NsConfig::taylor(2, 4),
            NsConfig::taylor(3, 3),
        ] {
            let want = with_ns_schedule(seq, || newton_schulz(x.as_ref(), &cfg).unwrap());
            let scale = max_abs(&want);
            for threads in [1, 2, 3, 4, 7] {
                let (a, b) = pool(threads).install(|| {
                    (
                        with_ns_schedule(team, || newton_schulz(x.as_ref(), &cfg).unwrap()),
                        with_ns_schedule(team, || newton_schulz(x.as_ref(), &cfg).unwrap()),
                    )
                });
                let d = max_diff(&a, &want);
                assert!(
                    d <= 1e-4 * scale,
                    "{r}x{c} {cfg:?} {threads} threads: {d} (scale {scale})"
                );
                assert_eq!(
                    max_diff(&a, &b),
                    0.0,
                    "{r}x{c} {threads} threads: not deterministic"
                );
            }
        }
    }
    // parsed like the others; sequentially it is the plain products
    assert_eq!("team/par".parse::<NsSchedule>().unwrap(), team);
    assert_eq!(team.to_string(), "team/par");
}

/// The team schedule is a candidate with two or more threads on matrices that fit a quarter
/// of the last-level cache, never on one thread.
#[test]
fn team_is_a_candidate_only_with_threads() {
    let keller = NsConfig::keller();
    let has_team = |m, n, t| {
        NsSchedule::candidates(m, n, t, &keller)
            .iter()
            .any(|s| s.products == NsProducts::Team)
    };
    assert!(has_team(256, 256, 2));
    assert!(has_team(64, 256, 4));
    assert!(!has_team(256, 256, 1));
}

/// The Gram-space iteration is offered only where it saves flops (wide matrices) and its gain
/// on small singular values is bounded; it is then among the candidates, else not.
#[test]
fn gram_is_offered_only_where_it_pays_and_is_safe() {
    let keller = NsConfig::keller();
    assert!(NsSchedule::gram_allowed(768, 3072, &keller));
    assert!(
        NsSchedule::gram_allowed(3072, 768, &keller),
        "either orientation"
    );
    assert!(NsSchedule::gram_allowed(1024, 4096, &keller));
    assert!(
        !NsSchedule::gram_allowed(768, 768, &keller),
        "square: more flops"
    );
    assert!(
        !NsSchedule::gram_allowed(768, 1000, &keller),
        "not wide enough"
    );
    let mut six = keller;
    six.steps = 6;
    assert!(!NsSchedule::gram_allowed(768, 3072, &six), "3.44⁶ > 2⁹");
    assert!(NsSchedule::gram_allowed(768, 3072, &NsConfig::taylor(2, 5)));
    assert!(!NsSchedule::gram_allowed(
        768,
        3072,
        &NsConfig::taylor(2, 30)
    ));
    for threads in [1, 2, 4] {
        let wide = NsSchedule::candidates(768, 3072, threads, &keller);
        assert!(
            wide.iter().any(|s| s.products == NsProducts::Gram),
            "{wide:?}"
        );
        let square = NsSchedule::candidates(768, 768, threads, &keller);
        assert!(
            square.iter().all(|s| s.products != NsProducts::Gram),
            "{square:?}"
        );
        // no duplicates, each schedule at most once
        for (i, s) in wide.iter().enumerate() {
            assert!(!wide[i + 1..].contains(s), "{wide:?}");
        }
    }
}
