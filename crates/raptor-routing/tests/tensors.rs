//! `LayerRouting::push_tensors` (feature `tch`): same owners as `push_record` on the same data,
//! mask kinds, shape and value errors.
#![cfg(feature = "tch")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use raptor_routing::{LayerRouting, OwnerRule, RoutingError, owner_map};
use tch::{Kind, Tensor};

#[test]
fn push_tensors_matches_push_record() {
    // B = 3 records, T = 4 tokens, k = 2, E = 5.
    let (b, t, k) = (3usize, 4usize, 2usize);
    let experts: Vec<i64> = (0..b * t * k)
        .map(|i| ((i * 7 + i / 3) % 5) as i64)
        .collect();
    let weights: Vec<f32> = (0..b * t * k)
        .map(|i| ((i * 13) % 11) as f32 / 11.0)
        .collect();
    let mask: Vec<i64> = vec![1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0];
    let et = Tensor::from_slice(&experts).reshape([3, 4, 2]);
    let wt = Tensor::from_slice(&weights).reshape([3, 4, 2]);
    let mut via_tensors = LayerRouting::new(5, 2).unwrap();
    // Masks as int64, bool and float must give the same result.
    for m in [
        Tensor::from_slice(&mask).reshape([3, 4]),
        Tensor::from_slice(&mask)
            .reshape([3, 4])
            .to_kind(Kind::Bool),
        Tensor::from_slice(&mask)
            .reshape([3, 4])
            .to_kind(Kind::Float),
    ] {
        via_tensors
            .push_tensors(&et, &wt.to_kind(Kind::Double), &m)
            .unwrap();
    }
    let mut via_slices = LayerRouting::new(5, 2).unwrap();
    for _ in 0..3 {
        for r in 0..b {
            let e: Vec<u32> = experts[r * t * k..(r + 1) * t * k]
                .iter()
                .map(|&x| x as u32)
                .collect();
            let m: Vec<bool> = mask[r * t..(r + 1) * t].iter().map(|&x| x == 1).collect();
            via_slices
                .push_record(&e, &weights[r * t * k..(r + 1) * t * k], &m)
                .unwrap();
        }
    }
    assert_eq!(via_tensors.num_records(), 9);
    for rule in [OwnerRule::GateWeighted, OwnerRule::TokenCount] {
        assert_eq!(owner_map(&via_tensors, rule), owner_map(&via_slices, rule));
    }
    // The all-padding record goes to expert 0.
    assert_eq!(
        owner_map(&via_tensors, OwnerRule::GateWeighted).owners()[2],
        0
    );
}

#[test]
fn push_tensors_errors_append_nothing() {
    let mut l = LayerRouting::new(4, 2).unwrap();
    let e = Tensor::from_slice(&[0i64, 1, 2, 3]).reshape([1, 2, 2]);
    let w = Tensor::from_slice(&[0.5f32, 0.5, 0.5, 0.5]).reshape([1, 2, 2]);
    let m = Tensor::from_slice(&[1i64, 1]).reshape([1, 2]);
    // Wrong k.
    let e3 = Tensor::from_slice(&[0i64, 1, 2, 3, 0, 1]).reshape([1, 2, 3]);
    assert!(matches!(
        l.push_tensors(&e3, &w, &m),
        Err(RoutingError::ShapeMismatch {
            what: "experts",
            ..
        })
    ));
    // Wrong rank.
    assert!(matches!(
        l.push_tensors(&e.reshape([2, 2]), &w, &m),
        Err(RoutingError::ShapeMismatch {
            what: "experts",
            ..
        })
    ));
    // Mismatched weights / mask.
    assert!(matches!(
        l.push_tensors(&e, &w.reshape([2, 1, 2]), &m),
        Err(RoutingError::ShapeMismatch {
            what: "weights",
            ..
        })
    ));
    assert!(matches!(
        l.push_tensors(&e, &w, &m.reshape([2, 1])),
        Err(RoutingError::ShapeMismatch { what: "mask", .. })
    ));
    // Out-of-range and negative indices, bad mask values, negative weights.
    let bad = Tensor::from_slice(&[0i64, 1, 2, 4]).reshape([1, 2, 2]);
    assert!(matches!(
        l.push_tensors(&bad, &w, &m),
        Err(RoutingError::ExpertOutOfRange { index: 4, .. })
    ));
    let neg = Tensor::from_slice(&[0i64, -1, 2, 3]).reshape([1, 2, 2]);
    assert!(matches!(
        l.push_tensors(&neg, &w, &m),
        Err(RoutingError::ExpertOutOfRange { index: -1, .. })
    ));
    let m2 = Tensor::from_slice(&[1i64, 2]).reshape([1, 2]);
    assert!(matches!(
        l.push_tensors(&e, &w, &m2),
        Err(RoutingError::InvalidMask { .. })
    ));
    let wn = Tensor::from_slice(&[0.5f32, -0.5, 0.5, 0.5]).reshape([1, 2, 2]);
    assert!(matches!(
        l.push_tensors(&e, &wn, &m),
        Err(RoutingError::InvalidWeight { .. })
    ));
    assert_eq!(l.num_records(), 0);
    // A valid batch goes through.
    l.push_tensors(&e, &w, &m).unwrap();
    assert_eq!(owner_map(&l, OwnerRule::GateWeighted).owners(), &[0]);
}
