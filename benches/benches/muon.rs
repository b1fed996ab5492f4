//! Newton–Schulz and DP-MuonBC benchmarks: raptor-muon's pure-Rust (faer) backend beside
//! libtorch (tch, CPU, f32) on the same matrices, in the same run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use raptor_muon::diagnostics::gaussian_matrix;
use raptor_muon::faer::Mat;
use raptor_muon::tch_backend::{TchPrecision, newton_schulz_tch, tensor_from_slice};
use raptor_muon::{BcConfig, NsConfig, bias_corrected_direction, newton_schulz, probe_rng_seeded};
use tch::Device;

/// Row-major N(0, 1) data and the same matrix in faer.
fn data(rows: usize, cols: usize) -> (Vec<f32>, Mat<f32>) {
    let m = gaussian_matrix(rows, cols, 1.0, 42);
    let v = (0..rows * cols).map(|k| m[(k / cols, k % cols)]).collect();
    (v, m)
}

fn ns5(c: &mut Criterion) {
    let mut g = c.benchmark_group("ns5");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let cfg = NsConfig::keller();
    for (rows, cols) in [(256usize, 256usize), (768, 768), (768, 3072), (1024, 4096)] {
        let (v, m) = data(rows, cols);
        let t = tensor_from_slice(&v, rows, cols, Device::Cpu).unwrap();
        let id = format!("{rows}x{cols}");
        g.bench_function(format!("raptor-faer/{id}"), |b| {
            b.iter(|| black_box(newton_schulz(m.as_ref(), &cfg).unwrap()))
        });
        g.bench_function(format!("libtorch-f32/{id}"), |b| {
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

criterion_group!(benches, ns5, dp_muonbc_step);
criterion_main!(benches);
