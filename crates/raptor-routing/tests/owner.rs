//! Owner maps: hand-computed cases, ties, empty records, E = 1, top-k > 1, storage variants,
//! validation errors, and agreement with a brute-force reference.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Rec, reference_owner};
use raptor_routing::{
    LayerRouting, OwnerMap, OwnerRule, RoutingError, WeightPrecision, owner_map, record_owner,
};

const GW: OwnerRule = OwnerRule::GateWeighted;
const TC: OwnerRule = OwnerRule::TokenCount;

#[test]
fn hand_computed_top2() {
    // E = 4, k = 2, weights exactly representable so that sums are exact.
    let mut layer = LayerRouting::new(4, 2).unwrap();
    // Exactly representable weights: t0: (1, .5) (2, .25); t1: (2, .5) (1, .25);
    // t2: (3, .75) (2, .25). Scores: e1 = .75, e2 = 1.0, e3 = .75 -> owner 2.
    layer
        .push_record(
            &[1, 2, 2, 1, 3, 2],
            &[0.5, 0.25, 0.5, 0.25, 0.75, 0.25],
            &[true; 3],
        )
        .unwrap();
    // Same but t1 is padding: e1 = .5, e2 = .5, e3 = .75 -> owner 3.
    layer
        .push_record(
            &[1, 2, 2, 1, 3, 2],
            &[0.5, 0.25, 0.5, 0.25, 0.75, 0.25],
            &[true, false, true],
        )
        .unwrap();
    let m = owner_map(&layer, GW);
    assert_eq!(m.owners(), &[2, 3]);
    // Token count (top-1 = slot of max weight): record 0 tops are 1, 2, 3 -> three-way tie -> 1.
    // Record 1 tops are 1, 3 -> tie -> 1.
    assert_eq!(owner_map(&layer, TC).owners(), &[1, 1]);
    assert_eq!(m.counts(), vec![0, 0, 1, 1]);
    assert_eq!(m.groups(), vec![vec![], vec![], vec![0], vec![1]]);
}

#[test]
fn ties_go_to_lowest_index() {
    let mut layer = LayerRouting::new(5, 1).unwrap();
    layer
        .push_record(&[4, 3], &[0.5, 0.5], &[true, true])
        .unwrap();
    layer
        .push_record(&[3, 4, 1, 1], &[0.25, 0.25, 0.125, 0.125], &[true; 4])
        .unwrap();
    assert_eq!(owner_map(&layer, GW).owners(), &[3, 1]);
    assert_eq!(owner_map(&layer, TC).owners(), &[3, 1]);
    // Token count ties inside a token: equal weights -> lowest expert index is the top-1.
    let mut l2 = LayerRouting::new(5, 2).unwrap();
    l2.push_record(&[4, 2], &[0.5, 0.5], &[true]).unwrap();
    assert_eq!(owner_map(&l2, TC).owners(), &[2]);
}

#[test]
fn empty_and_all_padding_records_go_to_expert_zero() {
    let mut layer = LayerRouting::new(3, 2).unwrap();
    layer.push_record(&[], &[], &[]).unwrap();
    // Padding may carry garbage (out-of-range index, NaN weight): never read.
    layer
        .push_record(&[99, 7], &[f32::NAN, -1.0], &[false])
        .unwrap();
    // Valid tokens with zero weights -> all scores zero -> expert 0 under gate weighting.
    layer.push_record(&[2, 1], &[0.0, 0.0], &[true]).unwrap();
    assert_eq!(owner_map(&layer, GW).owners(), &[0, 0, 0]);
    // Token count still counts the top-1 (tie at weight 0 -> lowest index 1).
    assert_eq!(owner_map(&layer, TC).owners(), &[0, 0, 1]);
    let r = layer.record(1).unwrap();
    assert!(!r.is_valid(0));
    assert_eq!(r.choice(0, 0), Some((0, 0.0)));
}

#[test]
fn single_expert() {
    let mut layer = LayerRouting::new(1, 1).unwrap();
    layer
        .push_record(&[0, 0], &[0.3, 1.0], &[true, true])
        .unwrap();
    layer.push_record(&[], &[], &[]).unwrap();
    let m = owner_map(&layer, GW);
    assert_eq!(m.owners(), &[0, 0]);
    let s = m.stats().unwrap().declassify_without_dp();
    assert_eq!(s.entropy(), 0.0);
    assert_eq!(s.normalized_entropy(), 1.0);
    assert_eq!(s.chi2(), 0.0);
    assert_eq!(s.load_cv(), 0.0);
}

#[test]
fn gate_weighting_differs_from_token_count() {
    // top-2, E = 3: expert 0 is the top-1 of two tokens with weight .5 each; expert 1 is the
    // second choice of both with .5 and the top-1 of a third token with .75.
    // Gate: e0 = 1.0, e1 = .5+.5+.75 = 1.75 -> 1. Count: e0 = 2, e1 = 1 -> 0.
    let e = [0, 1, 0, 1, 1, 2];
    let w = [0.5, 0.5, 0.5, 0.5, 0.75, 0.25];
    // Slot order does not matter for top-1 (max weight) except ties: t0 and t1 tie at .5 ->
    // lowest index 0.
    assert_eq!(record_owner(&e, &w, &[true; 3], 3, 2, GW).unwrap(), 1);
    assert_eq!(record_owner(&e, &w, &[true; 3], 3, 2, TC).unwrap(), 0);
}

#[test]
fn storage_widths_and_precision() {
    for (e, bytes) in [
        (8usize, 1usize),
        (256, 1),
        (257, 2),
        (65_536, 2),
        (65_537, 4),
    ] {
        let l = LayerRouting::new(e, 2).unwrap();
        assert_eq!(l.expert_index_bytes(), bytes, "E = {e}");
    }
    // Large E uses the sparse argmax path: compare with the reference.
    for e in [300usize, 5000] {
        let rec = Rec {
            experts: vec![(e - 1) as u32, 7, 7, 3, 4000 % e as u32, (e - 1) as u32],
            weights: vec![0.5, 0.25, 0.5, 0.125, 0.5, 0.5],
            mask: vec![true, true, true],
        };
        let mut l = LayerRouting::new(e, 2).unwrap();
        l.push_record(&rec.experts, &rec.weights, &rec.mask)
            .unwrap();
        for rule in [GW, TC] {
            assert_eq!(
                owner_map(&l, rule).owners()[0],
                reference_owner(&rec, e, 2, rule)
            );
        }
    }
    // f16 storage: weights exactly representable in f16 give the same owners.
    let mut a = LayerRouting::new(4, 2).unwrap();
    let mut b = LayerRouting::with_precision(4, 2, WeightPrecision::F16).unwrap();
    for l in [&mut a, &mut b] {
        l.push_record(
            &[1, 2, 2, 1, 3, 2],
            &[0.5, 0.25, 0.5, 0.25, 0.75, 0.25],
            &[true; 3],
        )
        .unwrap();
        l.push_record(&[3, 0], &[0.875, 0.125], &[true]).unwrap();
    }
    assert_eq!(b.precision(), WeightPrecision::F16);
    assert_eq!(owner_map(&a, GW), owner_map(&b, GW));
    assert!(b.heap_bytes() < a.heap_bytes());
}

#[test]
fn validation_errors_leave_layer_unchanged() {
    let mut l = LayerRouting::new(4, 2).unwrap();
    l.push_record(&[0, 1], &[0.5, 0.5], &[true]).unwrap();
    let err = l
        .push_record(&[0, 1, 4, 0], &[0.5, 0.5, 0.5, 0.5], &[true, true])
        .unwrap_err();
    assert_eq!(
        err,
        RoutingError::ExpertOutOfRange {
            token: 1,
            slot: 0,
            index: 4,
            num_experts: 4
        }
    );
    let err = l
        .push_record(&[0, 1], &[0.5, f32::INFINITY], &[true])
        .unwrap_err();
    assert!(matches!(
        err,
        RoutingError::InvalidWeight {
            token: 0,
            slot: 1,
            ..
        }
    ));
    let err = l.push_record(&[0, 1], &[0.5, -0.1], &[true]).unwrap_err();
    assert!(matches!(err, RoutingError::InvalidWeight { .. }));
    let err = l
        .push_record(&[0, 1, 2], &[0.5, 0.5, 0.5], &[true])
        .unwrap_err();
    assert!(matches!(
        err,
        RoutingError::ShapeMismatch {
            what: "experts",
            ..
        }
    ));
    let err = l.push_record(&[0, 1], &[0.5], &[true]).unwrap_err();
    assert!(matches!(
        err,
        RoutingError::ShapeMismatch {
            what: "weights",
            ..
        }
    ));
    assert_eq!(l.num_records(), 1);
    assert_eq!(l.num_tokens(), 1);
    assert_eq!(l.num_valid_tokens(), 1);
    assert_eq!(owner_map(&l, GW).owners(), &[0]);

    assert_eq!(
        LayerRouting::new(0, 1).unwrap_err(),
        RoutingError::NoExperts(0)
    );
    assert_eq!(
        LayerRouting::new(4, 5).unwrap_err(),
        RoutingError::InvalidTopK {
            top_k: 5,
            num_experts: 4
        }
    );
    assert!(matches!(
        LayerRouting::new(4, 0),
        Err(RoutingError::InvalidTopK { .. })
    ));
    assert!(OwnerMap::from_owners(vec![0, 4], 4).is_err());
    assert!(OwnerMap::from_owners(vec![], 0).is_err());
    let mut other = LayerRouting::new(4, 1).unwrap();
    other.push_record(&[1], &[1.0], &[true]).unwrap();
    assert!(matches!(
        l.append(&other),
        Err(RoutingError::Mismatch { what: "top_k", .. })
    ));
}

#[test]
fn append_preserves_records() {
    let mut a = LayerRouting::new(3, 1).unwrap();
    a.push_record(&[2, 2, 1], &[0.5, 0.5, 0.9], &[true, true, false])
        .unwrap();
    let mut b = LayerRouting::new(3, 1).unwrap();
    b.push_record(&[1], &[0.5], &[true]).unwrap();
    b.push_record(&[], &[], &[]).unwrap();
    a.append(&b).unwrap();
    assert_eq!(a.num_records(), 3);
    assert_eq!(a.num_tokens(), 4);
    assert_eq!(a.num_valid_tokens(), 3);
    assert_eq!(owner_map(&a, GW).owners(), &[2, 1, 0]);
}

/// Many experts (E > 1024, the sparse argmax) and records whose experts no other record uses:
/// every owner must come from the record's own tokens (top-2, gate-weighted and token count).
#[test]
fn sparse_argmax_reads_each_records_own_tokens() {
    let (e, k) = (1500usize, 2usize);
    let mut layer = LayerRouting::new(e, k).unwrap();
    let mut want_gate = Vec::new();
    let mut want_count = Vec::new();
    for r in 0..20u32 {
        // Record r: three tokens over experts 7r+1 .. 7r+4; expert 7r+3 has the largest total
        // gate weight, expert 7r+2 the most top-1 choices.
        let b = 7 * r + 1;
        let experts = [b + 1, b + 2, b + 1, b, b + 2, b + 3];
        let weights = [0.6, 0.4, 0.55, 0.45, 0.9, 0.95];
        layer
            .push_record(&experts, &weights, &[true, true, true])
            .unwrap();
        want_gate.push(b + 2); // 0.4 + 0.9 = 1.3 against 0.6 + 0.55 = 1.15 and 0.95
        want_count.push(b + 1); // top-1 of the tokens: b+1, b+1, b+3
    }
    assert_eq!(
        owner_map(&layer, OwnerRule::GateWeighted).owners(),
        want_gate
    );
    assert_eq!(
        owner_map(&layer, OwnerRule::TokenCount).owners(),
        want_count
    );
}
