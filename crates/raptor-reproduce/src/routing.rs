//! Reproduce part `routing`: public-corpus layer selection on a generated corpus with a planted
//! imbalance per layer, beside what the rule should pick (the planted answer).

use std::time::Instant;

use raptor_routing::synth::{SynthSpec, generate, profile_entropy, zipf_profile};
use raptor_routing::{OwnerRule, PublicCorpus, SelectionConfig, owner_map, select_layer};

use crate::context::{Context, Table};

/// Sparse-layer ids (every other block of a 12-block encoder, as in Switch) and their planted
/// owner profiles over E = 8 experts.
fn planted(e: usize) -> Vec<(usize, &'static str, Vec<f64>)> {
    let mut dominant = vec![0.5 / (e - 1) as f64; e];
    dominant[0] = 0.5;
    let mut dead2 = vec![1.0; e];
    dead2[e - 2..].iter_mut().for_each(|x| *x = 0.0);
    vec![
        (1, "Zipf s=1.2", zipf_profile(e, 1.2)),
        (3, "one expert 50%", dominant),
        (5, "Zipf s=0.25", zipf_profile(e, 0.25)),
        (7, "2 dead experts", dead2),
        (9, "Zipf s=0.6", zipf_profile(e, 0.6)),
        (11, "Zipf s=0.8", zipf_profile(e, 0.8)),
    ]
}

fn corpus(n: usize, seq_len: usize, seed: u64) -> anyhow::Result<PublicCorpus> {
    let layers = planted(8);
    let spec = SynthSpec {
        num_records: n,
        seq_len,
        min_valid: 8,
        num_experts: 8,
        top_k: 2,
        topic_strength: 0.5,
        profiles: layers.iter().map(|l| l.2.clone()).collect(),
        seed,
    };
    let mut c = PublicCorpus::new();
    for ((id, _, _), routing) in layers.iter().zip(generate(&spec)?) {
        c.add_layer(*id, routing)?;
    }
    Ok(c)
}

/// The tables of this part.
pub fn tables(ctx: &Context) -> anyhow::Result<Vec<Table>> {
    let (n, seq_len) = if ctx.quick() {
        (2_000, 32)
    } else {
        (20_000, 64)
    };
    let layers = planted(8);
    let planted_h: Vec<f64> = layers.iter().map(|l| profile_entropy(&l.2)).collect();
    let best = (0..layers.len())
        .max_by(|&a, &b| planted_h[a].total_cmp(&planted_h[b]))
        .ok_or_else(|| anyhow::anyhow!("no planted layers"))?;
    let planted_layer = layers[best].0;

    let t0 = Instant::now();
    let c = corpus(n, seq_len, 4)?;
    let gen_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let sel = select_layer(&c, &SelectionConfig::default())?;
    let sel_s = t1.elapsed().as_secs_f64();
    let tc = select_layer(
        &c,
        &SelectionConfig {
            rule: OwnerRule::TokenCount,
            ..Default::default()
        },
    )?;

    let ln_e = 8f64.ln();
    let rows: Vec<Vec<String>> = layers
        .iter()
        .zip(&planted_h)
        .zip(&sel.stats)
        .map(|(((id, desc, _), ph), (_, s))| {
            vec![
                id.to_string(),
                desc.to_string(),
                format!("{ph:.4}"),
                format!("{:.4}", ph / ln_e),
                format!("{:.4}", s.entropy()),
                format!("{:.4}", s.normalized_entropy()),
                format!("{:.4}", s.chi2()),
                format!("{:.4}", s.load_cv()),
                s.empty_experts().to_string(),
                if *id == sel.layer {
                    "selected".into()
                } else {
                    String::new()
                },
                if *id == planted_layer {
                    "planted".into()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    let margin = sel.margin_nats.map_or("n/a".into(), |m| format!("{m:.4}"));
    let mut notes = vec![
        format!(
            "Generated public corpus: {n} records × {seq_len} tokens (valid length uniform in 8..={seq_len}, rest padding), \
             E = 8, top-2, 6 sparse layers; per record and layer a topic expert is drawn from the planted profile and each \
             valid token's first choice is the topic with probability 0.5 (ChaCha20 seed 4)."
        ),
        format!(
            "Rule: argmax of owner entropy H (gate-weighted owners) over the candidate layers. Selected layer {} \
             (runner-up {}, margin {margin} nats); planted answer (argmax of the planted profiles' entropy): layer {planted_layer} — {}.",
            sel.layer,
            sel.runner_up.map_or("none".into(), |r| r.to_string()),
            if sel.layer == planted_layer {
                "match"
            } else {
                "MISMATCH"
            },
        ),
        format!(
            "Token-count owners (the public code's Switch rule) select layer {} ({}).",
            tc.layer,
            if tc.layer == planted_layer {
                "match"
            } else {
                "MISMATCH"
            }
        ),
        format!(
            "Measured H sits slightly above the planted H: a few records with few valid tokens are owned by a non-topic \
             expert, which spreads q towards uniform. Generation {gen_s:.2} s, owner maps + statistics for 6 layers {sel_s:.3} s."
        ),
    ];
    notes.extend(sel.warnings.iter().map(|w| format!("warning: {w}")));
    let main = Table {
        slug: "routing-layer-selection".into(),
        title: "Routing: per-layer owner statistics and public-corpus layer selection (planted imbalance)".into(),
        columns: [
            "layer", "planted profile", "planted H", "planted H/lnE", "H", "H/lnE", "chi2", "CV", "empty",
            "rule picks", "should pick",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows,
        notes,
    };

    // Corpus-size sweep: how often the rule recovers the planted layer, and the warnings.
    let sizes: &[usize] = if ctx.quick() {
        &[100, 1_000]
    } else {
        &[100, 300, 1_000, 3_000, 10_000]
    };
    let seeds: u64 = if ctx.quick() { 3 } else { 10 };
    let mut sweep = Vec::new();
    for &size in sizes {
        let (mut hits, mut margins, mut warned) = (0usize, Vec::new(), 0usize);
        for seed in 0..seeds {
            let c = corpus(size, 32, 1_000 + seed)?;
            let s = select_layer(&c, &SelectionConfig::default())?;
            hits += usize::from(s.layer == planted_layer);
            margins.push(s.margin_nats.unwrap_or(0.0));
            warned += usize::from(
                s.warnings
                    .iter()
                    .any(|w| matches!(w, raptor_routing::SelectionWarning::SmallMargin { .. })),
            );
        }
        let mean = margins.iter().sum::<f64>() / margins.len() as f64;
        sweep.push(vec![
            size.to_string(),
            seeds.to_string(),
            format!("{hits}/{seeds}"),
            format!("{mean:.4}"),
            format!("{warned}/{seeds}"),
            if size < 1000 {
                "yes".into()
            } else {
                "no".into()
            },
        ]);
    }
    // The owner of each record depends only on that record: a check on the main corpus.
    let (id, layer) = &c.layers()[best];
    let full = owner_map(layer, OwnerRule::GateWeighted);
    let mut half = raptor_routing::LayerRouting::new(8, 2)?;
    for r in (0..layer.num_records()).rev().take(500) {
        let rec = layer
            .record(r)
            .ok_or_else(|| anyhow::anyhow!("record {r}"))?;
        let (mut e, mut w, mut m) = (Vec::new(), Vec::new(), Vec::new());
        for t in 0..rec.num_tokens() {
            m.push(rec.is_valid(t));
            for k in 0..2 {
                let (x, y) = rec.choice(t, k).ok_or_else(|| anyhow::anyhow!("choice"))?;
                e.push(x);
                w.push(y);
            }
        }
        half.push_record(&e, &w, &m)?;
    }
    let rebatched = owner_map(&half, OwnerRule::GateWeighted);
    let n_rec = layer.num_records();
    let same = rebatched
        .owners()
        .iter()
        .enumerate()
        .all(|(j, &o)| full.owners()[n_rec - 1 - j] == o);
    let sweep_table = Table {
        slug: "routing-corpus-size".into(),
        title: "Routing: layer selection versus public-corpus size (same planted layers)".into(),
        columns: [
            "records",
            "seeds",
            "picks planted layer",
            "mean margin (nats)",
            "margin < 0.05 warned",
            "small-corpus warning",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows: sweep,
        notes: vec![
            format!(
                "Each row: independent corpora (32 tokens per record, ChaCha20 seeds 1000..), planted answer layer {planted_layer} \
                 (planted margin to layer 9: {:.4} nats).",
                planted_h[best] - planted_h[4]
            ),
            format!(
                "Batch independence check on layer {id}: the last 500 records re-pushed in reverse order as a separate layer get \
                 the same owners: {same}."
            ),
        ],
    };
    if !same {
        anyhow::bail!("owner map depends on batch composition");
    }
    Ok(vec![main, sweep_table])
}
