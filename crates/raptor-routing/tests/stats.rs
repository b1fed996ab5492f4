//! Statistics and stability: hand-computed values, the private/public markers, errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use raptor_routing::{OwnerMap, RoutingError, RoutingStats, private_stats, stability};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn hand_computed_stats() {
    // Owners 0, 0, 1, 2 over E = 4: q = (1/2, 1/4, 1/4, 0).
    let m = OwnerMap::from_owners(vec![0, 1, 0, 2], 4).unwrap();
    let s = private_stats(&m).unwrap().declassify_without_dp();
    assert_eq!(s.counts(), &[2, 1, 1, 0]);
    assert_eq!(s.num_records(), 4);
    // H = 1/2 ln 2 + 2 · 1/4 ln 4 = 1.5 ln 2.
    assert!(close(s.entropy(), 1.5 * 2f64.ln()));
    assert!(close(s.normalized_entropy(), 1.5 * 2f64.ln() / 4f64.ln())); // 0.75
    assert!(close(s.deficit(), 4f64.ln() - 1.5 * 2f64.ln()));
    // χ² = 4 (1/4 + 1/16 + 1/16) − 1 = 0.5.
    assert!(close(s.chi2(), 0.5));
    // CV: deviations (1/4, 0, 0, −1/4): var = (1/16 + 1/16)/4 = 1/32; sqrt / (1/4) = sqrt(1/2).
    assert!(close(s.load_cv(), 0.5f64.sqrt()));
    assert_eq!(s.min_q(), 0.0);
    assert_eq!(s.max_q(), 0.5);
    assert_eq!(s.empty_experts(), 1);
    assert_eq!(s.provenance(), "public");
}

#[test]
fn uniform_and_degenerate() {
    let s = RoutingStats::from_public_counts(&[5, 5, 5, 5, 5, 5, 5, 5]).unwrap();
    assert!(close(s.entropy(), 8f64.ln()));
    assert!(close(s.normalized_entropy(), 1.0));
    assert!(close(s.chi2(), 0.0));
    assert!(close(s.load_cv(), 0.0));
    assert!(close(s.deficit(), 0.0));
    // All records on one of E = 8 experts: H = 0, χ² = E − 1, CV = sqrt(E − 1).
    let s = RoutingStats::from_public_counts(&[0, 0, 9, 0, 0, 0, 0, 0]).unwrap();
    assert_eq!(s.entropy(), 0.0);
    assert!(close(s.chi2(), 7.0));
    assert!(close(s.load_cv(), 7f64.sqrt()));
    assert_eq!(s.empty_experts(), 7);
    assert_eq!(
        RoutingStats::from_public_counts(&[0, 0]).unwrap_err(),
        RoutingError::EmptyOwnerMap
    );
    assert!(RoutingStats::from_public_counts(&[]).is_err());
    let empty = OwnerMap::from_owners(vec![], 3).unwrap();
    assert_eq!(empty.stats().unwrap_err(), RoutingError::EmptyOwnerMap);
}

#[test]
fn private_stats_are_redacted_public_are_printable() {
    let m = OwnerMap::from_owners(vec![0, 1, 1], 2).unwrap();
    let private = m.stats().unwrap();
    assert_eq!(
        format!("{private:?}"),
        "<redacted private routing statistics>"
    );
    assert_eq!(private.provenance(), "private");
    let public = private.declassify_without_dp();
    let json = serde_json::to_value(&public).unwrap();
    assert_eq!(json["provenance"], "public");
    assert_eq!(json["counts"], serde_json::json!([1, 2]));
    assert!(format!("{public}").contains("n=3 E=2"));
}

#[test]
fn stability_hand_computed() {
    let a = OwnerMap::from_owners(vec![0, 0, 1, 2, 2], 3).unwrap();
    let b = OwnerMap::from_owners(vec![0, 1, 1, 2, 0], 3).unwrap();
    let s = stability(&a, &b).unwrap();
    assert_eq!(format!("{s:?}"), "<redacted private ownership stability>");
    let s = s.declassify_without_dp();
    assert_eq!(s.changed(), 2);
    assert!(close(s.fraction_changed(), 0.4));
    // q = (2, 1, 2)/5, q~ = (2, 2, 1)/5 -> l1 = 2/5.
    assert!(close(s.l1(), 0.4));
    // A permutation of owners changes records but not q.
    let c = OwnerMap::from_owners(vec![2, 2, 1, 0, 0], 3).unwrap();
    let s = stability(&a, &c).unwrap().declassify_without_dp();
    assert_eq!(s.changed(), 4);
    assert_eq!(s.l1(), 0.0);
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["changed"], 4);
    // Mismatches.
    let d = OwnerMap::from_owners(vec![0, 0], 3).unwrap();
    assert!(matches!(
        stability(&a, &d),
        Err(RoutingError::Mismatch {
            what: "num_records",
            ..
        })
    ));
    let e = OwnerMap::from_owners(vec![0, 0, 1, 2, 2], 4).unwrap();
    assert!(matches!(
        stability(&a, &e),
        Err(RoutingError::Mismatch {
            what: "num_experts",
            ..
        })
    ));
    let z = OwnerMap::from_owners(vec![], 3).unwrap();
    assert_eq!(stability(&z, &z).unwrap_err(), RoutingError::EmptyOwnerMap);
}
