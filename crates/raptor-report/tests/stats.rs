//! Estimates against slow obvious references and properties; orderings on hand-made cells.

use proptest::prelude::*;
use raptor_report::{Estimate, ReportError, estimate, estimate_at, ordering, t_quantile};

/// Two-pass mean and sample standard deviation, written out.
fn reference(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mut sum = 0.0;
    for v in values {
        sum += v;
    }
    let mean = sum / n;
    let mut ss = 0.0;
    for v in values {
        ss += (v - mean) * (v - mean);
    }
    (mean, (ss / (n - 1.0)).sqrt())
}

#[test]
fn t_quantiles_match_tables_and_closed_forms() -> Result<(), ReportError> {
    // Tabulated t_{0.975, 2}.
    assert!((t_quantile(0.95, 2)? - 4.302652729911275).abs() < 1e-9);
    // df = 2 closed form: t_p = (2p − 1) / sqrt(2 p (1 − p)).
    for level in [0.5, 0.8, 0.9, 0.95, 0.99] {
        let p: f64 = 0.5 + level / 2.0;
        let exact = (2.0 * p - 1.0) / (2.0 * p * (1.0 - p)).sqrt();
        assert!(
            (t_quantile(level, 2)? - exact).abs() < 1e-8 * exact,
            "level {level}"
        );
    }
    // df = 1 (Cauchy): t_p = tan(π (p − 1/2)).
    let exact = (std::f64::consts::PI * 0.475).tan();
    assert!((t_quantile(0.95, 1)? - exact).abs() < 1e-8 * exact);
    // Tabulated t_{0.975, 4} = 2.776445105 and t_{0.975, 9} = 2.262157163.
    assert!((t_quantile(0.95, 4)? - 2.776_445_105).abs() < 1e-8);
    assert!((t_quantile(0.95, 9)? - 2.262_157_163).abs() < 1e-8);
    // Tabulated t_{0.975, 30}, t_{0.975, 100} and t_{0.975, 1000}, tending to z = 1.959964.
    assert!((t_quantile(0.95, 30)? - 2.042_272_456).abs() < 1e-8);
    assert!((t_quantile(0.95, 100)? - 1.983_971_519).abs() < 1e-8);
    assert!((t_quantile(0.95, 1000)? - 1.962_339_081).abs() < 1e-8);
    Ok(())
}

#[test]
fn estimate_matches_direct_formula() -> Result<(), ReportError> {
    let values = [80.0, 82.0, 84.0];
    let e = estimate(&values)?;
    assert_eq!(e.n, 3);
    assert!((e.mean - 82.0).abs() < 1e-12);
    assert!((e.sd - 2.0).abs() < 1e-12);
    assert!((e.half_width - 4.302652729911275 * 2.0 / 3f64.sqrt()).abs() < 1e-9);
    assert!((e.lo() - (82.0 - e.half_width)).abs() < 1e-12);
    assert!((e.hi() - (82.0 + e.half_width)).abs() < 1e-12);
    let values = [0.71, 0.74, 0.69, 0.73, 0.70];
    for level in [0.9, 0.95, 0.99] {
        let e = estimate_at(&values, level)?;
        let (mean, sd) = reference(&values);
        let half = t_quantile(level, 4)? * sd / 5f64.sqrt();
        assert!((e.mean - mean).abs() < 1e-12);
        assert!((e.sd - sd).abs() < 1e-12);
        assert!((e.half_width - half).abs() < 1e-12);
    }
    // Wider at higher levels.
    assert!(estimate_at(&values, 0.99)?.half_width > estimate_at(&values, 0.9)?.half_width);
    Ok(())
}

#[test]
fn single_value_has_no_interval() -> Result<(), ReportError> {
    let e = estimate(&[81.25])?;
    assert_eq!(e.n, 1);
    assert_eq!(e.mean, 81.25);
    assert!(e.half_width.is_nan() && e.sd.is_nan() && e.lo().is_nan() && e.hi().is_nan());
    assert!(!e.has_interval());
    assert_eq!(e.fmt(1), "81.2");
    assert_eq!(e.fmt(3), "81.250");
    Ok(())
}

#[test]
fn estimate_rejects_bad_input() {
    assert!(matches!(estimate(&[]), Err(ReportError::Empty { .. })));
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        match estimate(&[1.0, bad, 2.0]) {
            Err(ReportError::InvalidValue { index, .. }) => assert_eq!(index, 1),
            other => panic!("{bad} accepted: {other:?}"),
        }
    }
    for level in [0.0, 1.0, -0.5, 1.5, f64::NAN] {
        assert!(matches!(
            estimate_at(&[1.0, 2.0], level),
            Err(ReportError::OutOfRange { .. })
        ));
    }
    assert!(t_quantile(0.95, 0).is_err());
}

#[test]
fn fmt_rounds_mean_and_half_width() -> Result<(), ReportError> {
    let e = Estimate {
        mean: 81.249,
        half_width: 1.25,
        n: 3,
        sd: 0.5,
    };
    assert_eq!(e.fmt(1), "81.2 ± 1.2");
    assert_eq!(e.fmt(0), "81 ± 1");
    let e = estimate(&[0.8, 0.82, 0.84])?;
    assert_eq!(e.fmt(3), "0.820 ± 0.050");
    Ok(())
}

#[test]
fn json_round_trip_keeps_nan_as_null() -> Result<(), Box<dyn std::error::Error>> {
    let e = estimate(&[1.0, 2.0, 4.0])?;
    let back: Estimate = serde_json::from_str(&serde_json::to_string(&e)?)?;
    // serde_json's default float parser may be off by one ulp.
    let close = |a: f64, b: f64| (a - b).abs() <= 4.0 * f64::EPSILON * a.abs();
    assert_eq!(back.n, e.n);
    assert!(close(back.mean, e.mean) && close(back.half_width, e.half_width));
    assert!(close(back.sd, e.sd));
    let single = estimate(&[3.5])?;
    let json = serde_json::to_string(&single)?;
    assert_eq!(json, r#"{"mean":3.5,"half_width":null,"n":1,"sd":null}"#);
    let back: Estimate = serde_json::from_str(&json)?;
    assert_eq!((back.mean, back.n), (3.5, 1));
    assert!(back.half_width.is_nan() && back.sd.is_nan());
    Ok(())
}

fn est(mean: f64, half_width: f64) -> Estimate {
    Estimate {
        mean,
        half_width,
        n: 3,
        sd: half_width,
    }
}

fn single(mean: f64) -> Estimate {
    Estimate {
        mean,
        half_width: f64::NAN,
        n: 1,
        sd: f64::NAN,
    }
}

#[test]
fn overlaps_on_hand_made_intervals() {
    assert!(est(1.0, 0.5).overlaps(&est(1.8, 0.5)));
    assert!(est(1.0, 0.5).overlaps(&est(2.0, 0.5))); // touching ends
    assert!(!est(1.0, 0.5).overlaps(&est(2.1, 0.5)));
    assert!(!est(2.1, 0.5).overlaps(&est(1.0, 0.5)));
    assert!(est(1.0, 3.0).overlaps(&est(1.5, 0.1))); // nested
    // Without an interval only equal means overlap.
    assert!(!single(1.0).overlaps(&est(1.1, 5.0)));
    assert!(single(1.0).overlaps(&est(1.0, 5.0)));
    assert!(single(2.0).overlaps(&single(2.0)));
    assert!(!single(2.0).overlaps(&single(2.5)));
}

#[test]
fn ordering_counts_hand_made_cells() {
    let pairs = [
        (est(82.0, 1.0), est(78.0, 1.0)), // A better, significant
        (est(80.0, 2.0), est(79.0, 2.0)), // A ≥ B, overlap
        (est(79.0, 2.0), est(80.0, 2.0)), // B ≥ A, overlap
        (est(70.0, 1.0), est(75.0, 1.0)), // B better, significant
        (est(75.0, 1.0), est(75.0, 1.0)), // tie: A ≥ B, overlap
        (single(90.0), est(60.0, 1.0)),   // A ≥ B, no interval: never significant
    ];
    let s = ordering(&pairs);
    assert_eq!(s.cells, 6);
    assert_eq!(s.a_ge_b, 4);
    assert_eq!(s.overlapping, 3);
    assert_eq!(s.a_significantly_better, 1);
    assert_eq!(s.b_significantly_better, 1);
    assert_eq!(s.without_interval, 1);
    assert_eq!(
        s.sentence("RAPTOR", "DP-Adam LoRA"),
        "RAPTOR ≥ DP-Adam LoRA in 4 of 6 cells (CIs overlap in 3; significantly better in 1, \
         worse in 1; 1 without an interval (one seed))"
    );
    let s = ordering(&pairs[..2]);
    assert_eq!(
        s.sentence("A", "B"),
        "A ≥ B in 2 of 2 cells (CIs overlap in 1; significantly better in 1, worse in 0)"
    );
    let s = ordering(&pairs[3..4]);
    assert_eq!(
        s.sentence("A", "B"),
        "A ≥ B in 0 of 1 cell (CIs overlap in 0; significantly better in 0, worse in 1)"
    );
    let s = ordering(&[]);
    assert_eq!(s.cells, 0);
    assert_eq!(s.sentence("A", "B"), "no cell to compare");
}

#[test]
fn ordering_snapshot() -> Result<(), ReportError> {
    let a = [
        estimate(&[81.0, 82.0, 80.5])?,
        estimate(&[75.0, 74.0, 76.5])?,
        estimate(&[60.0])?,
    ];
    let b = [
        estimate(&[78.0, 79.5, 78.2])?,
        estimate(&[74.0, 75.5, 75.0])?,
        estimate(&[59.0])?,
    ];
    let pairs: Vec<_> = a.into_iter().zip(b).collect();
    let cells: Vec<String> = pairs
        .iter()
        .map(|(a, b)| format!("{} vs {}", a.fmt(2), b.fmt(2)))
        .collect();
    insta::assert_json_snapshot!((cells, ordering(&pairs)));
    Ok(())
}

proptest! {
    #[test]
    fn mean_in_range_and_half_width_non_negative(
        values in prop::collection::vec(-1e6f64..1e6, 1..30),
    ) {
        let e = estimate(&values).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        prop_assert!(min <= e.mean && e.mean <= max, "{} not in [{min}, {max}]", e.mean);
        prop_assert_eq!(e.n, values.len());
        if values.len() == 1 {
            prop_assert!(e.half_width.is_nan() && e.sd.is_nan());
        } else {
            prop_assert!(e.half_width >= 0.0 && e.sd >= 0.0);
            let (mean, sd) = reference(&values);
            prop_assert!((e.mean - mean).abs() <= 1e-9 * (1.0 + mean.abs()));
            prop_assert!((e.sd - sd).abs() <= 1e-9 * (1.0 + sd));
            prop_assert!(e.overlaps(&e));
        }
    }

    #[test]
    fn order_invariant(
        (values, shuffled) in prop::collection::vec(-1e3f64..1e3, 1..20)
            .prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle())),
    ) {
        let a = estimate(&values).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let b = estimate(&shuffled).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(a.n, b.n);
        prop_assert!((a.mean - b.mean).abs() <= 1e-9);
        if a.n > 1 {
            prop_assert!((a.half_width - b.half_width).abs() <= 1e-9 * (1.0 + a.half_width));
        }
    }

    #[test]
    fn ordering_counts_are_consistent(
        cells in prop::collection::vec((0f64..10.0, 0f64..2.0, 0f64..10.0, 0f64..2.0), 0..12),
    ) {
        let pairs: Vec<_> = cells.iter().map(|&(a, ha, b, hb)| (est(a, ha), est(b, hb))).collect();
        let s = ordering(&pairs);
        prop_assert_eq!(s.cells, pairs.len());
        prop_assert_eq!(s.overlapping + s.a_significantly_better + s.b_significantly_better, s.cells);
        prop_assert!(s.a_significantly_better <= s.a_ge_b);
        let swapped: Vec<_> = pairs.iter().map(|&(a, b)| (b, a)).collect();
        let t = ordering(&swapped);
        prop_assert_eq!(t.a_significantly_better, s.b_significantly_better);
        prop_assert_eq!(t.overlapping, s.overlapping);
    }
}
