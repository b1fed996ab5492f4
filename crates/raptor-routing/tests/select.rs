//! Layer selection: argmax entropy, ties, margins, warnings, the no-corpus default.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use raptor_routing::{
    LayerRouting, PublicCorpus, RoutingError, SelectionConfig, SelectionReason, SelectionWarning,
    default_layer, select_layer,
};

/// A top-1 layer whose record `r` is owned by `owners[r]`.
fn layer(e: usize, owners: &[u32]) -> LayerRouting {
    let mut l = LayerRouting::new(e, 1).unwrap();
    for &o in owners {
        l.push_record(&[o], &[1.0], &[true]).unwrap();
    }
    l
}

/// `n` owners with `counts[e]` records on expert `e`.
fn owners(counts: &[usize]) -> Vec<u32> {
    counts
        .iter()
        .enumerate()
        .flat_map(|(e, &c)| std::iter::repeat_n(e as u32, c))
        .collect()
}

#[test]
fn picks_max_entropy_with_margin() {
    // 1200 records, E = 4. Layer 3: uniform (H = ln 4); layer 7: (600, 200, 200, 200);
    // layer 9 (last): (900, 100, 100, 100).
    let mut c = PublicCorpus::new();
    c.add_layer(9, layer(4, &owners(&[900, 100, 100, 100])))
        .unwrap();
    c.add_layer(3, layer(4, &owners(&[300, 300, 300, 300])))
        .unwrap();
    c.add_layer(7, layer(4, &owners(&[600, 200, 200, 200])))
        .unwrap();
    let sel = select_layer(&c, &SelectionConfig::default()).unwrap();
    assert_eq!(sel.layer, 3);
    assert_eq!(sel.reason, SelectionReason::MaxEntropy);
    assert_eq!(sel.runner_up, Some(7));
    // H(1/2, 1/6, 1/6, 1/6) = 1/2 ln 2 + 1/2 ln 6.
    let h7 = 0.5 * 2f64.ln() + 0.5 * 6f64.ln();
    assert!((sel.margin_nats.unwrap() - (4f64.ln() - h7)).abs() < 1e-12);
    assert!(sel.warnings.is_empty(), "{:?}", sel.warnings);
    assert_eq!(
        sel.stats.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![3, 7, 9]
    );
    let json = serde_json::to_value(&sel).unwrap();
    assert_eq!(json["layer"], 3);
    assert_eq!(json["stats"][0][1]["provenance"], "public");
}

#[test]
fn small_margin_small_corpus_and_prefer_last() {
    // 100 records: layer 0 (51, 49), layer 1 (52, 48): margin tiny; corpus small.
    let c = PublicCorpus::from_layers(vec![
        layer(2, &owners(&[51, 49])),
        layer(2, &owners(&[52, 48])),
    ])
    .unwrap();
    let sel = select_layer(&c, &SelectionConfig::default()).unwrap();
    assert_eq!(sel.layer, 0);
    let m = sel.margin_nats.unwrap();
    assert!(m > 0.0 && m < 0.05);
    assert!(sel.warnings.contains(&SelectionWarning::SmallMargin {
        margin: m,
        threshold: 0.05
    }));
    assert!(sel.warnings.contains(&SelectionWarning::SmallCorpus {
        records: 100,
        min: 1000
    }));
    let cfg = SelectionConfig {
        prefer_last_within_margin: true,
        ..Default::default()
    };
    let sel = select_layer(&c, &cfg).unwrap();
    assert_eq!(sel.layer, 1);
    assert_eq!(sel.reason, SelectionReason::LastWithinMargin);
    for w in &sel.warnings {
        assert!(!w.to_string().is_empty());
    }
}

#[test]
fn ties_go_to_the_later_layer_and_single_candidate_warns() {
    let c = PublicCorpus::from_layers(vec![
        layer(2, &owners(&[700, 300])),
        layer(2, &owners(&[300, 700])),
    ])
    .unwrap();
    let sel = select_layer(&c, &SelectionConfig::default()).unwrap();
    assert_eq!(sel.layer, 1);
    assert_eq!(sel.margin_nats, Some(0.0));
    let one = PublicCorpus::from_layers(vec![layer(2, &owners(&[700, 300]))]).unwrap();
    let sel = select_layer(&one, &SelectionConfig::default()).unwrap();
    assert_eq!(sel.layer, 0);
    assert_eq!(sel.margin_nats, None);
    assert!(sel.warnings.contains(&SelectionWarning::SingleCandidate));
}

#[test]
fn default_and_errors() {
    let sel = default_layer(&[1, 3, 5, 11]).unwrap();
    assert_eq!(sel.layer, 11);
    assert_eq!(sel.reason, SelectionReason::NoPublicCorpus);
    assert_eq!(sel.warnings, vec![SelectionWarning::NoPublicCorpus]);
    assert_eq!(
        default_layer(&[]).unwrap_err(),
        RoutingError::NoCandidateLayers
    );
    assert_eq!(
        select_layer(&PublicCorpus::new(), &SelectionConfig::default()).unwrap_err(),
        RoutingError::NoCandidateLayers
    );
    let mut c = PublicCorpus::new();
    c.add_layer(0, layer(2, &[0, 1])).unwrap();
    assert_eq!(
        c.add_layer(0, layer(2, &[0, 1])).unwrap_err(),
        RoutingError::DuplicateLayer(0)
    );
    assert!(matches!(
        c.add_layer(1, layer(2, &[0])),
        Err(RoutingError::Mismatch { .. })
    ));
    let empty = PublicCorpus::from_layers(vec![LayerRouting::new(2, 1).unwrap()]).unwrap();
    assert_eq!(
        select_layer(&empty, &SelectionConfig::default()).unwrap_err(),
        RoutingError::EmptyOwnerMap
    );
}
