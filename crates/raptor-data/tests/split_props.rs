//! Deterministic splits: properties and a snapshot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use raptor_data::{DataError, held_out_size, public_private_split, split_key, validation_split};

fn ids_strategy() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::btree_set(0usize..100_000, 0..300).prop_map(|s| s.into_iter().collect())
}

proptest! {
    #[test]
    fn disjoint_covering_sized(ids in ids_strategy(), frac in 0.0f64..=1.0, seed in any::<u64>()) {
        for s in [validation_split(&ids, frac, seed).unwrap(), public_private_split(&ids, frac, seed).unwrap()] {
            let mut all: Vec<usize> = s.kept.iter().chain(&s.held_out).copied().collect();
            all.sort_unstable();
            prop_assert_eq!(&all, &ids);                       // covering and disjoint
            prop_assert_eq!(s.held_out.len(), (frac * ids.len() as f64).round() as usize);
            prop_assert!(s.kept.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(s.held_out.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn order_independent_and_deterministic(ids in ids_strategy(), frac in 0.0f64..=1.0, seed in any::<u64>(), rot in 0usize..300) {
        let a = validation_split(&ids, frac, seed).unwrap();
        let mut shuffled = ids.clone();
        shuffled.reverse();
        if !shuffled.is_empty() { let r = rot % shuffled.len(); shuffled.rotate_left(r); }
        prop_assert_eq!(&validation_split(&shuffled, frac, seed).unwrap(), &a);
        prop_assert_eq!(&validation_split(&ids, frac, seed).unwrap(), &a);
    }

    #[test]
    fn seed_sensitive(seed in any::<u64>()) {
        let ids: Vec<usize> = (0..200).collect();
        let a = validation_split(&ids, 0.5, seed).unwrap();
        let b = validation_split(&ids, 0.5, seed.wrapping_add(1)).unwrap();
        // Two independent halvings of 200 ids coincide with probability 1/C(200,100).
        prop_assert_ne!(&a, &b);
        // The public partition uses a different key, so it differs from validation's.
        prop_assert_ne!(&public_private_split(&ids, 0.5, seed).unwrap(), &a);
    }

    #[test]
    fn held_out_by_smallest_keys(ids in ids_strategy(), frac in 0.0f64..=1.0, seed in any::<u64>()) {
        // Slow obvious reference: compute every key, sort, take the first k.
        let s = validation_split(&ids, frac, seed).unwrap();
        let mut keyed: Vec<(u64, usize)> = ids.iter().map(|&i| (split_key(b"raptor-data/validation/v1", seed, i), i)).collect();
        keyed.sort();
        let k = held_out_size(ids.len(), frac);
        let mut want: Vec<usize> = keyed[..k].iter().map(|p| p.1).collect();
        want.sort_unstable();
        prop_assert_eq!(s.held_out, want);
    }
}

#[test]
fn subset_stability_of_membership() {
    // An id's key does not depend on the other ids: a record held out of a set stays
    // among the smallest keys of any subset containing it.
    let all: Vec<usize> = (0..1000).collect();
    let s = validation_split(&all, 0.1, 3).unwrap();
    let sub: Vec<usize> = all.iter().copied().filter(|i| i % 2 == 0).collect();
    let t = validation_split(&sub, 0.1, 3).unwrap();
    let overlap = t.held_out.iter().filter(|i| s.held_out.contains(i)).count();
    assert!(
        overlap * 2 >= t.held_out.len(),
        "{overlap} of {}",
        t.held_out.len()
    );
}

#[test]
fn invalid_inputs() {
    for f in [-0.1, 1.1, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            validation_split(&[1, 2], f, 0),
            Err(DataError::InvalidFraction { .. })
        ));
    }
    assert_eq!(
        validation_split(&[1, 2, 1], 0.5, 0),
        Err(DataError::DuplicateId(1))
    );
    let s = validation_split(&[], 0.5, 0).unwrap();
    assert!(s.kept.is_empty() && s.held_out.is_empty());
}

#[test]
fn snapshot_of_a_small_split() {
    // Pins the documented hash construction: changing it changes every user's splits.
    let ids: Vec<usize> = (0..20).collect();
    let v = validation_split(&ids, 0.25, 1234).unwrap();
    let p = public_private_split(&ids, 0.25, 1234).unwrap();
    insta::assert_json_snapshot!((
        v.held_out,
        p.held_out,
        format!("{:016x}", split_key(b"raptor-data/validation/v1", 0, 0))
    ));
}
