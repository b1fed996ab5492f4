//! Insta snapshot of the public statistics table for a fixed generated corpus, plus the
//! generator's planted structure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use raptor_routing::stats::stats_table;
use raptor_routing::synth::{SynthSpec, generate, profile_entropy, zipf_profile};
use raptor_routing::{OwnerRule, PublicCorpus, SelectionConfig, select_layer};

fn spec() -> SynthSpec {
    SynthSpec {
        num_records: 2000,
        seq_len: 32,
        min_valid: 4,
        num_experts: 8,
        top_k: 2,
        topic_strength: 0.6,
        profiles: vec![
            zipf_profile(8, 1.2),
            zipf_profile(8, 0.2),
            vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
            zipf_profile(8, 0.7),
        ],
        seed: 20260,
    }
}

#[test]
fn stats_table_snapshot() {
    let corpus = PublicCorpus::from_layers(generate(&spec()).unwrap()).unwrap();
    let stats = corpus.layer_stats(OwnerRule::GateWeighted).unwrap();
    insta::assert_snapshot!(stats_table(&stats));
    let sel = select_layer(&corpus, &SelectionConfig::default()).unwrap();
    // Planted answer: the flattest profile.
    let planted: Vec<f64> = spec().profiles.iter().map(|p| profile_entropy(p)).collect();
    let best = (0..planted.len())
        .max_by(|&a, &b| planted[a].total_cmp(&planted[b]))
        .unwrap();
    assert_eq!(sel.layer, best);
    assert!(sel.warnings.is_empty(), "{:?}", sel.warnings);
    // Layer 2 has two experts that are never a topic: they own under 2% of the records — only records
    // with few valid tokens whose random choices outweigh the topic.
    assert!(
        stats[2].1.counts()[6] + stats[2].1.counts()[7] < 40,
        "{:?}",
        stats[2].1.counts()
    );
    // Measured entropies stay close to the planted ones.
    for (l, s) in &stats {
        assert!(
            (s.entropy() - planted[*l]).abs() < 0.08,
            "layer {l}: {} vs {}",
            s.entropy(),
            planted[*l]
        );
    }
}

#[test]
fn generator_is_deterministic_and_validated() {
    let a = generate(&spec()).unwrap();
    let b = generate(&spec()).unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            raptor_routing::owner_map(x, OwnerRule::TokenCount),
            raptor_routing::owner_map(y, OwnerRule::TokenCount)
        );
    }
    let bad = SynthSpec {
        profiles: vec![vec![1.0; 3]],
        ..spec()
    };
    assert!(generate(&bad).is_err());
    let bad = SynthSpec {
        min_valid: 40,
        ..spec()
    };
    assert!(generate(&bad).is_err());
    let bad = SynthSpec {
        topic_strength: 1.5,
        ..spec()
    };
    assert!(generate(&bad).is_err());
    let bad = SynthSpec {
        profiles: vec![],
        ..spec()
    };
    assert!(generate(&bad).is_err());
}
