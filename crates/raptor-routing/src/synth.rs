//! Seeded synthetic router outputs with a **planted** owner distribution per layer, for tests,
//! benchmarks and `raptor reproduce`.
//!
//! Generative model, per record and layer `ℓ`: draw a topic expert `z ~ p_ℓ` (the planted
//! profile); each valid token's first choice is `z` with probability `topic_strength`, else a
//! uniform expert; its other `k − 1` choices are distinct uniform experts; gate weights are
//! `w₁ ~ U(0.5, 0.9)` for the first choice and a random split of `1 − w₁`, in decreasing
//! order, for the rest. With enough tokens the owner is the topic, so the owner distribution is
//! close to `p_ℓ` and the planted answer of layer selection is `argmax_ℓ H(p_ℓ)`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::{LayerRouting, RoutingError};

/// Specification of a synthetic corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    /// Number of records.
    pub num_records: usize,
    /// Tokens per record including padding (every record has this length).
    pub seq_len: usize,
    /// Fewest valid tokens per record (valid length is uniform in `min_valid..=seq_len`; 0 allows
    /// all-padding records).
    pub min_valid: usize,
    /// Experts per layer.
    pub num_experts: usize,
    /// Router choices per token.
    pub top_k: usize,
    /// Probability that a token's first choice is its record's topic expert.
    pub topic_strength: f64,
    /// Planted owner profile of each layer (non-negative, length `num_experts`; normalized here).
    pub profiles: Vec<Vec<f64>>,
    /// ChaCha20 seed.
    pub seed: u64,
}

/// Zipf profile `p_e ∝ (e + 1)^(−s)` over `num_experts` experts (`s = 0` is uniform).
pub fn zipf_profile(num_experts: usize, s: f64) -> Vec<f64> {
    normalize(
        &(0..num_experts)
            .map(|e| ((e + 1) as f64).powf(-s))
            .collect::<Vec<_>>(),
    )
}

/// Entropy (nats) of a non-negative profile after normalization.
pub fn profile_entropy(profile: &[f64]) -> f64 {
    -normalize(profile)
        .iter()
        .filter(|&&p| p > 0.0)
        .map(|p| p * p.ln())
        .sum::<f64>()
}

fn normalize(p: &[f64]) -> Vec<f64> {
    let s: f64 = p.iter().sum();
    p.iter().map(|x| x / s).collect()
}

fn sample(cdf: &[f64], u: f64) -> usize {
    cdf.iter().position(|&c| u < c).unwrap_or(cdf.len() - 1)
}

/// Generate one [`LayerRouting`] per profile. Deterministic in the spec (seed included).
pub fn generate(spec: &SynthSpec) -> Result<Vec<LayerRouting>, RoutingError> {
    let (e, k) = (spec.num_experts, spec.top_k);
    if spec.profiles.is_empty() {
        return Err(RoutingError::InvalidSynth("no layer profiles".into()));
    }
    if spec.min_valid > spec.seq_len {
        return Err(RoutingError::InvalidSynth(format!(
            "min_valid {} > seq_len {}",
            spec.min_valid, spec.seq_len
        )));
    }
    if !(0.0..=1.0).contains(&spec.topic_strength) {
        return Err(RoutingError::InvalidSynth(format!(
            "topic_strength {} not in [0, 1]",
            spec.topic_strength
        )));
    }
    let mut cdfs = Vec::with_capacity(spec.profiles.len());
    for (l, p) in spec.profiles.iter().enumerate() {
        if p.len() != e
            || p.iter().any(|x| !x.is_finite() || *x < 0.0)
            || p.iter().sum::<f64>() <= 0.0
        {
            return Err(RoutingError::InvalidSynth(format!(
                "profile of layer {l} must be {e} non-negative finite numbers with a positive sum"
            )));
        }
        let mut acc = 0.0;
        cdfs.push(
            normalize(p)
                .iter()
                .map(|x| {
                    acc += x;
                    acc
                })
                .collect::<Vec<f64>>(),
        );
    }
    let mut layers = Vec::with_capacity(cdfs.len());
    for _ in &cdfs {
        let mut l = LayerRouting::new(e, k)?;
        l.reserve(spec.num_records, spec.seq_len);
        layers.push(l);
    }
    let mut rng = ChaCha20Rng::seed_from_u64(spec.seed);
    let t = spec.seq_len;
    let (mut ex, mut wt, mut mask) = (vec![0u32; t * k], vec![0f32; t * k], vec![false; t]);
    let mut chosen = Vec::with_capacity(k);
    let mut rest: Vec<f32> = Vec::with_capacity(k);
    for _ in 0..spec.num_records {
        let valid = rng.random_range(spec.min_valid..=t);
        mask.iter_mut()
            .enumerate()
            .for_each(|(i, m)| *m = i < valid);
        for (layer, cdf) in layers.iter_mut().zip(&cdfs) {
            let topic = sample(cdf, rng.random::<f64>()) as u32;
            for tok in 0..valid {
                chosen.clear();
                let first = if rng.random::<f64>() < spec.topic_strength {
                    topic
                } else {
                    rng.random_range(0..e as u32)
                };
                chosen.push(first);
                while chosen.len() < k {
                    let c = rng.random_range(0..e as u32);
                    if !chosen.contains(&c) {
                        chosen.push(c);
                    }
                }
                let w1: f32 = rng.random_range(0.5..0.9);
                rest.clear();
                rest.extend((1..k).map(|_| rng.random::<f32>() + 1e-3));
                rest.sort_by(|a, b| b.total_cmp(a));
                let s: f32 = rest.iter().sum();
                for slot in 0..k {
                    ex[tok * k + slot] = chosen[slot];
                    wt[tok * k + slot] = if slot == 0 {
                        w1
                    } else {
                        (1.0 - w1) * rest[slot - 1] / s
                    };
                }
            }
            layer.push_record(&ex[..t * k], &wt[..t * k], &mask)?;
        }
    }
    Ok(layers)
}
