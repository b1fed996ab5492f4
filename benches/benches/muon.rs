//! Newton–Schulz and DP-MuonBC benchmarks: raptor-muon's pure-Rust (faer) backend beside
//! libtorch (tch, CPU, f32) on the same matrices, in the same run; then a batch of same-shape
//! matrices (a Muon step over several layers: `newton_schulz_batch` against one-by-one calls
//! and a libtorch loop), and a summary table per shape from criterion's medians of this run:
//! the schedule the planner chose and the speed-up over libtorch (libtorch time / ours).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group};
use raptor_benches::{criterion_median_s, machine_line, mark_ran, ran};
use raptor_muon::diagnostics::gaussian_matrix;
use raptor_muon::faer::Mat;
use raptor_muon::tch_backend::{
    TchPrecision, newton_schulz_tch, newton_schulz_tch_batch, tensor_from_slice,
};
use raptor_muon::{
    BcConfig, NsConfig, bias_corrected_direction, newton_schulz, newton_schulz_batch,
    planned_ns_schedule, probe_rng_seeded,
};
use tch::Device;

/// Row-major N(0, 1) data and the same matrix in faer.
fn data(rows: usize, cols: usize) -> (Vec<f32>, Mat<f32>) {
    let m = gaussian_matrix(rows, cols, 1.0, 42);
    let v = (0..rows * cols).map(|k| m[(k / cols, k % cols)]).collect();
    (v, m)
}

/// Newton–Schulz bench shapes.
const SHAPES: [(usize, usize); 4] = [(256, 256), (768, 768), (768, 3072), (1024, 4096)];

/// Layers in the batch bench (768 × 768 each).
const LAYERS: usize = 6;

fn ns5(c: &mut Criterion) {
    let mut g = c.benchmark_group("ns5");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let cfg = NsConfig::keller();
    for (rows, cols) in SHAPES {
        let (v, m) = data(rows, cols);
        let t = tensor_from_slice(&v, rows, cols, Device::Cpu).unwrap();
        let id = format!("{rows}x{cols}");
        g.bench_function(BenchmarkId::new("raptor-faer", &id), |b| {
            mark_ran("ns5", &id);
            b.iter(|| black_box(newton_schulz(m.as_ref(), &cfg).unwrap()))
        });
        g.bench_function(BenchmarkId::new("libtorch-f32", &id), |b| {
            b.iter(|| black_box(newton_schulz_tch(&t, &cfg, TchPrecision::F32).unwrap()))
        });
    }
    g.finish();
}

fn dp_muonbc_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("dp_muonbc_step");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let (rows, cols) = (768usize, 768usize);
    let m = gaussian_matrix(rows, cols, 0.01, 43);
    let mut rng = probe_rng_seeded(1);
    for (name, ns) in [
        ("taylor-k2-q5", NsConfig::taylor(2, 5)),
        ("keller-q5", NsConfig::keller()),
    ] {
        g.bench_function(format!("{name}/K1/{rows}x{cols}"), |b| {
            b.iter(|| {
                black_box(
                    bias_corrected_direction(m.as_ref(), 0.01, &ns, &BcConfig::default(), &mut rng)
                        .unwrap(),
                )
            })
        });
    }
    g.finish();
}

/// Batches of same-shape matrices: a Muon step over several layers (6 × 768²) and over the
/// experts of an MoE model (24 × 64 × 256: 8 experts × 3 layers).
const BATCHES: [(usize, usize, usize); 2] = [(LAYERS, 768, 768), (24, 64, 256)];

fn ns5_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("ns5_batch");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let cfg = NsConfig::keller();
    for (count, rows, cols) in BATCHES {
        let mats: Vec<(Vec<f32>, Mat<f32>)> = (0..count)
            .map(|k| {
                let m = gaussian_matrix(rows, cols, 1.0, 100 + k as u64);
                let v = (0..rows * cols).map(|i| m[(i / cols, i % cols)]).collect();
                (v, m)
            })
            .collect();
        let refs: Vec<_> = mats.iter().map(|(_, m)| m.as_ref()).collect();
        let ts: Vec<_> = mats
            .iter()
            .map(|(v, _)| tensor_from_slice(v, rows, cols, Device::Cpu).unwrap())
            .collect();
        let trefs: Vec<&tch::Tensor> = ts.iter().collect();
        let id = format!("{count}x{rows}x{cols}");
        g.bench_function(BenchmarkId::new("raptor-batch", &id), |b| {
            mark_ran("ns5_batch", &id);
            b.iter(|| black_box(newton_schulz_batch(&refs, &cfg).unwrap()))
        });
        g.bench_function(BenchmarkId::new("raptor-one-by-one", &id), |b| {
            b.iter(|| {
                for m in &refs {
                    black_box(newton_schulz(*m, &cfg).unwrap());
                }
            })
        });
        g.bench_function(BenchmarkId::new("libtorch-f32", &id), |b| {
            b.iter(|| {
                for t in &ts {
                    let _ = black_box(newton_schulz_tch(t, &cfg, TchPrecision::F32).unwrap());
                }
            })
        });
        g.bench_function(BenchmarkId::new("libtorch-f32-batched", &id), |b| {
            b.iter(|| black_box(newton_schulz_tch_batch(&trefs, &cfg, TchPrecision::F32).unwrap()))
        });
    }
    g.finish();
}

/// The per-shape table of this run: schedule chosen, criterion medians, speed-up.
fn summary() {
    let cfg = NsConfig::keller();
    let mut rows = Vec::new();
    for (r, c) in SHAPES {
        let id = format!("{r}x{c}");
        if !ran("ns5", &id) {
            continue;
        }
        let sched = planned_ns_schedule(r, c, &cfg).map_or("-".to_string(), |s| s.to_string());
        let ours = criterion_median_s("ns5", "raptor-faer", &id);
        let torch = criterion_median_s("ns5", "libtorch-f32", &id);
        if let (Some(o), Some(t)) = (ours, torch) {
            rows.push(format!(
                "| {id} | {sched} | {:.3} | {:.3} | {:.2} |",
                o * 1e3,
                t * 1e3,
                t / o
            ));
        }
    }
    for (count, r, c) in BATCHES {
        let id = format!("{count}x{r}x{c}");
        if !ran("ns5_batch", &id) {
            continue;
        }
        let get = |f: &str| criterion_median_s("ns5_batch", f, &id);
        if let (Some(o), Some(one), Some(t), Some(tb)) = (
            get("raptor-batch"),
            get("raptor-one-by-one"),
            get("libtorch-f32"),
            get("libtorch-f32-batched"),
        ) {
            rows.push(format!(
                "| {id} batch (ours one by one: {:.3} ms; libtorch batched: {:.3} ms, {:.2}x its loop) | batch | {:.3} | {:.3} | {:.2} |",
                one * 1e3,
                tb * 1e3,
                t / tb,
                o * 1e3,
                t * 1e3,
                t / o
            ));
        }
    }
    if rows.is_empty() {
        return;
    }
    println!(
        "\nNewton-Schulz summary (Keller, 5 steps; criterion medians of this run); {}",
        machine_line()
    );
    println!("| shape | schedule | ours ms | libtorch f32 ms | speed-up (libtorch / ours) |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}

criterion_group!(benches, ns5, ns5_batch, dp_muonbc_step);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
}
