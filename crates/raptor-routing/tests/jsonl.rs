//! The JSON-lines reader: the example fixture (hand-computed owners), E inference, and
//! malformed input reported with line and field, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use raptor_routing::jsonl::read_jsonl;
use raptor_routing::{
    OwnerRule, PublicCorpus, RoutingError, SelectionConfig, WeightPrecision, owner_map,
    select_layer,
};

fn read(s: &str, e: Option<usize>) -> Result<raptor_routing::jsonl::JsonlCorpus, RoutingError> {
    read_jsonl(s.as_bytes(), e, WeightPrecision::F32)
}

fn fixture() -> String {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/routing/example.jsonl"
    );
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn example_fixture() {
    let c = read(&fixture(), None).unwrap();
    assert_eq!(c.num_records, 6);
    assert_eq!(c.num_experts, 4);
    assert!(c.num_experts_inferred);
    assert_eq!(c.layers.len(), 2);
    assert_eq!(c.layers[0].top_k(), 2);
    assert_eq!(c.layers[0].num_tokens(), 18);
    assert_eq!(c.layers[0].num_valid_tokens(), 16);
    // Hand-computed in fixtures/routing/README.md.
    assert_eq!(
        owner_map(&c.layers[0], OwnerRule::GateWeighted).owners(),
        &[0, 0, 0, 1, 0, 0]
    );
    assert_eq!(
        owner_map(&c.layers[1], OwnerRule::GateWeighted).owners(),
        &[1, 2, 3, 0, 1, 2]
    );
    let corpus = PublicCorpus::from_layers(c.layers).unwrap();
    let sel = select_layer(&corpus, &SelectionConfig::default()).unwrap();
    assert_eq!(sel.layer, 1);
    // Given E larger than inferred: same owners, more empty experts.
    let c = read(&fixture(), Some(6)).unwrap();
    assert!(!c.num_experts_inferred);
    assert_eq!(c.layers[1].num_experts(), 6);
    // Given E too small: error names the line and field.
    let err = read(&fixture(), Some(3)).unwrap_err();
    assert!(
        matches!(&err, RoutingError::Parse { line: 1, field, .. } if field == "layers[1].experts[2][0]"),
        "{err}"
    );
}

fn field_of(s: &str) -> (usize, String) {
    match read(s, None).unwrap_err() {
        RoutingError::Parse { line, field, .. } => (line, field),
        other => (usize::MAX, format!("not a parse error: {other}")),
    }
}

#[test]
fn malformed_inputs_name_line_and_field() {
    let ok = r#"{"layers": [{"experts": [[0, 1]], "weights": [[0.5, 0.5]]}]}"#;
    let cases: Vec<(String, (usize, &str))> = vec![
        (format!("{ok}\n{{not json"), (2, "<record>")),
        (format!("{ok}\n[1, 2]"), (2, "<record>")),
        (format!("{ok}\n{{\"lay\": []}}"), (2, "layers")),
        (r#"{"layers": []}"#.into(), (1, "layers")),
        (r#"{"layers": 3}"#.into(), (1, "layers")),
        (
            format!("{ok}\n\n{{\"layers\": [{{}}, {{}}]}}"),
            (3, "layers"),
        ),
        (r#"{"layers": [7]}"#.into(), (1, "layers[0]")),
        (
            r#"{"layers": [{"weights": []}]}"#.into(),
            (1, "layers[0].experts"),
        ),
        (
            r#"{"layers": [{"experts": []}]}"#.into(),
            (1, "layers[0].weights"),
        ),
        (
            r#"{"layers": [{"experts": [[0]], "weights": []}]}"#.into(),
            (1, "layers[0].weights"),
        ),
        (
            r#"{"layers": [{"experts": [[-1]], "weights": [[1]]}]}"#.into(),
            (1, "layers[0].experts[0][0]"),
        ),
        (
            r#"{"layers": [{"experts": [[1.5]], "weights": [[1]]}]}"#.into(),
            (1, "layers[0].experts[0][0]"),
        ),
        (
            r#"{"layers": [{"experts": [3], "weights": [[1]]}]}"#.into(),
            (1, "layers[0].experts[0]"),
        ),
        (
            r#"{"layers": [{"experts": [[]], "weights": [[]]}]}"#.into(),
            (1, "layers[0].experts[0]"),
        ),
        (
            format!("{ok}\n{{\"layers\": [{{\"experts\": [[0]], \"weights\": [[1]]}}]}}"),
            (2, "layers[0].experts[0]"),
        ),
        (
            r#"{"layers": [{"experts": [[0, 1]], "weights": [[1]]}]}"#.into(),
            (1, "layers[0].weights[0]"),
        ),
        (
            r#"{"layers": [{"experts": [[0]], "weights": [["x"]]}]}"#.into(),
            (1, "layers[0].weights[0][0]"),
        ),
        (
            r#"{"layers": [{"experts": [[0]], "weights": [[-0.5]]}]}"#.into(),
            (1, "layers[0].weights[0][0]"),
        ),
        (
            r#"{"layers": [{"experts": [[0]], "weights": [[1e300]]}]}"#.into(),
            (1, "layers[0].weights[0][0]"),
        ),
        (
            r#"{"layers": [{"experts": [[0]], "weights": [[1]], "mask": [2]}]}"#.into(),
            (1, "layers[0].mask[0]"),
        ),
        (
            r#"{"layers": [{"experts": [[0]], "weights": [[1]], "mask": [1, 1]}]}"#.into(),
            (1, "layers[0].mask"),
        ),
        (
            r#"{"layers": [{"experts": [[0]], "weights": [[1]], "mask": "1"}]}"#.into(),
            (1, "layers[0].mask"),
        ),
        (String::new(), (0, "<file>")),
    ];
    for (input, (line, field)) in cases {
        assert_eq!(
            field_of(&input),
            (line, field.to_string()),
            "input: {input}"
        );
    }
    // Padding tokens are not checked.
    let c = read(
        r#"{"layers": [{"experts": [[0], [-7]], "weights": [[1], ["x"]], "mask": [1, 0]}]}"#,
        None,
    )
    .unwrap();
    assert_eq!(c.layers[0].num_valid_tokens(), 1);
    // Messages are readable.
    let msg = read(
        r#"{"layers": [{"experts": [[-1]], "weights": [[1]]}]}"#,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("line 1") && msg.contains("layers[0].experts[0][0]"),
        "{msg}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Arbitrary text never panics the reader.
    #[test]
    fn arbitrary_text_never_panics(s in "[\\[\\]{}\":,0-9a-z. \\-\n]{0,120}") {
        let _ = read(&s, None);
        let _ = read(&s, Some(2));
    }

    /// Mutating one character of a valid record never panics.
    #[test]
    fn mutated_records_never_panic(pos in 0usize..200, ch in "[\\[\\]{}\":,0-9a-z. \\-]") {
        let mut s: Vec<char> = fixture().chars().collect();
        let p = pos % s.len();
        s[p] = ch.chars().next().unwrap();
        let s: String = s.into_iter().collect();
        let _ = read(&s, None);
    }
}
