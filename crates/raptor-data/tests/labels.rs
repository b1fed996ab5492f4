//! Label maps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use raptor_data::{DataError, LabelMap, Record};

fn rec(id: usize, label: &str) -> Record {
    Record {
        id,
        text: "t".into(),
        text_pair: None,
        label: Some(label.into()),
    }
}

#[test]
fn sorted_unique_and_deterministic() {
    let a = LabelMap::from_records(&[rec(0, "b"), rec(1, "a"), rec(2, "c"), rec(3, "a")]).unwrap();
    let b = LabelMap::from_records(&[rec(0, "c"), rec(1, "b"), rec(2, "a")]).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.labels(), ["a", "b", "c"]);
    assert_eq!(a.len(), 3);
    assert_eq!(a.index("c"), Some(2));
    assert_eq!(a.name(1), Some("b"));
    assert_eq!(a.name(3), None);
}

#[test]
fn explicit_order_is_kept() {
    let m =
        LabelMap::from_list(vec!["negative".into(), "neutral".into(), "positive".into()]).unwrap();
    assert_eq!(m.encode(&rec(5, "positive")).unwrap(), 2);
    let err = m.encode(&rec(9, "mixed")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "record 9: label `mixed` is not in the label map (labels: negative, neutral, positive)"
    );
    assert!(matches!(
        LabelMap::from_list(vec!["a".into(), "b".into(), "a".into()]),
        Err(DataError::InvalidLabels(_))
    ));
    assert!(matches!(
        LabelMap::from_list(vec![]),
        Err(DataError::InvalidLabels(_))
    ));
}

#[test]
fn serde_round_trip_and_validation() {
    let m = LabelMap::from_list(vec!["rotten".into(), "fresh".into()]).unwrap();
    let json = serde_json::to_string(&m).unwrap();
    assert_eq!(json, r#"{"labels":["rotten","fresh"]}"#);
    let back: LabelMap = serde_json::from_str(&json).unwrap();
    assert_eq!(back, m);
    assert!(serde_json::from_str::<LabelMap>(r#"{"labels":["a","a"]}"#).is_err());
    assert!(serde_json::from_str::<LabelMap>(r#"{"labels":[]}"#).is_err());
    assert!(serde_json::from_str::<LabelMap>(r#"{"labels":["a"],"x":1}"#).is_err());
}
