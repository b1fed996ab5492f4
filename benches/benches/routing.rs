#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Owner maps for 100k records × 128 tokens × top-2 × E = 8 (all tokens valid): raptor-routing
//! (gate-weighted and token-count rules; f32 and f16 weight storage) beside libtorch
//! (`scatter_add` of masked gate weights into `[B, E]` scores, then `argmax`) on the same data.
//! Target: under 100 ms on 2 cores. Run with `RAYON_NUM_THREADS=1` for the one-core figure.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use raptor_routing::synth::{SynthSpec, generate, zipf_profile};
use raptor_routing::{LayerRouting, OwnerRule, WeightPrecision, owner_map};
use tch::{Kind, Tensor};

const B: usize = 100_000;
const T: usize = 128;
const K: usize = 2;
const E: usize = 8;

fn data() -> LayerRouting {
    let spec = SynthSpec {
        num_records: B,
        seq_len: T,
        min_valid: T,
        num_experts: E,
        top_k: K,
        topic_strength: 0.4,
        profiles: vec![zipf_profile(E, 0.5)],
        seed: 7,
    };
    generate(&spec).unwrap().remove(0)
}

fn bench(c: &mut Criterion) {
    let layer = data();
    let mut f16 = LayerRouting::with_precision(E, K, WeightPrecision::F16).unwrap();
    f16.append(&layer).unwrap();
    // The same data as tensors.
    let (mut ex, mut wt, mut mk) = (
        Vec::with_capacity(B * T * K),
        Vec::with_capacity(B * T * K),
        Vec::with_capacity(B * T),
    );
    for r in 0..B {
        let rec = layer.record(r).unwrap();
        for t in 0..T {
            mk.push(if rec.is_valid(t) { 1f32 } else { 0.0 });
            for k in 0..K {
                let (e, w) = rec.choice(t, k).unwrap();
                ex.push(i64::from(e));
                wt.push(w);
            }
        }
    }
    let (b, t, k) = (B as i64, T as i64, K as i64);
    let ex = Tensor::from_slice(&ex).reshape([b, t, k]);
    let wt = Tensor::from_slice(&wt).reshape([b, t, k]);
    let mk = Tensor::from_slice(&mk).reshape([b, t]);
    let torch_owners = || {
        let src = (&wt * mk.unsqueeze(-1)).reshape([b, t * k]);
        Tensor::zeros([b, E as i64], (Kind::Float, tch::Device::Cpu))
            .scatter_add(1, &ex.reshape([b, t * k]), &src)
            .argmax(1, false)
    };
    // Sanity: libtorch agrees with us (float32 sums may break near-ties differently; count them).
    let ours = owner_map(&layer, OwnerRule::GateWeighted);
    let theirs: Vec<i64> = Vec::try_from(&torch_owners()).unwrap();
    let differ = ours
        .owners()
        .iter()
        .zip(&theirs)
        .filter(|(a, b)| i64::from(**a) != **b)
        .count();
    eprintln!(
        "routing bench: {differ} of {B} owners differ between raptor (f64 sums) and libtorch (f32 sums)"
    );

    let mut g = c.benchmark_group("owner_map_100k_x128_top2_e8");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    g.throughput(Throughput::Elements(B as u64));
    g.bench_function("raptor_gate_weighted_f32", |bch| {
        bch.iter(|| black_box(owner_map(black_box(&layer), OwnerRule::GateWeighted)))
    });
    g.bench_function("raptor_token_count_f32", |bch| {
        bch.iter(|| black_box(owner_map(black_box(&layer), OwnerRule::TokenCount)))
    });
    g.bench_function("raptor_gate_weighted_f16", |bch| {
        bch.iter(|| black_box(owner_map(black_box(&f16), OwnerRule::GateWeighted)))
    });
    g.bench_function("libtorch_scatter_add_argmax", |bch| {
        bch.iter(|| black_box(torch_owners()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
