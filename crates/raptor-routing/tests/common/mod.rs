//! Shared helpers for the integration tests: a slow, obvious reference owner rule.
#![allow(dead_code)]

use raptor_routing::OwnerRule;

/// One record as plain vectors: experts and weights `tokens × k`, mask per token.
#[derive(Debug, Clone)]
pub struct Rec {
    /// Expert indices, `tokens × k`.
    pub experts: Vec<u32>,
    /// Gate weights, `tokens × k`.
    pub weights: Vec<f32>,
    /// Validity per token.
    pub mask: Vec<bool>,
}

/// Reference owner: score every expert by brute force, argmax with ties to the lowest index.
pub fn reference_owner(rec: &Rec, num_experts: usize, k: usize, rule: OwnerRule) -> u32 {
    let mut best_e = 0u32;
    let mut best_s = f64::NEG_INFINITY;
    for e in 0..num_experts as u32 {
        let mut s = 0f64;
        for t in 0..rec.mask.len() {
            if !rec.mask[t] {
                continue;
            }
            let ch: Vec<(u32, f32)> = (0..k)
                .map(|j| (rec.experts[t * k + j], rec.weights[t * k + j]))
                .collect();
            match rule {
                OwnerRule::GateWeighted => {
                    s += ch
                        .iter()
                        .filter(|c| c.0 == e)
                        .map(|c| f64::from(c.1))
                        .sum::<f64>();
                }
                OwnerRule::TokenCount => {
                    // top-1: largest weight, ties to the lowest expert index.
                    let mut sorted = ch.clone();
                    sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                    if sorted[0].0 == e {
                        s += 1.0;
                    }
                }
            }
        }
        if s > best_s {
            best_s = s;
            best_e = e;
        }
    }
    best_e
}
