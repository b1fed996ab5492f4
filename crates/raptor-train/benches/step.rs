//! Per-update time of the trainer core on one model and batch: RAPTOR (alternating shared and
//! expert updates, averaged over both), monolithic DP-Adam LoRA and non-private LoRA on a Switch
//! encoder; DP-Adam, DP-Muon and DP-MuonBC (K = 1 probe pair) fully fine-tuning a GPT-2-style
//! decoder. Ratios are printed at the end of each group (best of 3 interleaved runs).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use raptor_train::config::{Choice, Method};

#[path = "support/workload.rs"]
mod workload;

fn per_update(method: Method, iters: u64) -> Duration {
    workload::timed_updates(method, iters)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("train_step_switch_d128_e8_b64");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    for m in [Method::Raptor, Method::DpAdamLora, Method::Lora] {
        g.bench_function(m.name(), |b| b.iter_custom(|iters| per_update(m, iters)));
    }
    g.finish();
    // Ratios from one interleaved run (best of 3 × 20 updates each).
    let mut best = [f64::INFINITY; 3];
    for _ in 0..3 {
        for (i, m) in [Method::Raptor, Method::DpAdamLora, Method::Lora]
            .into_iter()
            .enumerate()
        {
            best[i] = best[i].min(per_update(m, 20).as_secs_f64() / 20.0);
        }
    }
    println!(
        "TRAIN_STEP raptor {:.1} ms, dp-adam-lora {:.1} ms, lora {:.1} ms; raptor/dp-adam-lora {:.3}, dp-adam-lora/lora {:.3}",
        best[0] * 1e3,
        best[1] * 1e3,
        best[2] * 1e3,
        best[0] / best[1],
        best[1] / best[2]
    );
}

fn bench_decoder(c: &mut Criterion) {
    let methods = [Method::DpAdam, Method::DpMuon, Method::DpMuonbc];
    let mut g = c.benchmark_group("train_step_gpt2_d128_l4_b32");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    for m in methods {
        g.bench_function(m.name(), |b| {
            b.iter_custom(|iters| workload::timed_decoder_updates(m, iters))
        });
    }
    g.finish();
    let mut best = [f64::INFINITY; 3];
    for _ in 0..3 {
        for (i, m) in methods.into_iter().enumerate() {
            best[i] = best[i].min(workload::timed_decoder_updates(m, 10).as_secs_f64() / 10.0);
        }
    }
    println!(
        "TRAIN_STEP_DECODER dp-adam {:.1} ms, dp-muon {:.1} ms, dp-muonbc {:.1} ms; dp-muon/dp-adam {:.3} (target <= 1.3), dp-muonbc/dp-adam {:.3} (target <= 1.6)",
        best[0] * 1e3,
        best[1] * 1e3,
        best[2] * 1e3,
        best[1] / best[0],
        best[2] / best[0]
    );
}

criterion_group!(benches, bench, bench_decoder);
criterion_main!(benches);
