#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Accountant benchmarks: ε of one stream, of two interleaved streams, and a σ calibration
//! (default accuracy: relative eps_error 0.01, delta_error 1e-3·δ).

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use raptor_accountant::{Composition, PrvAccountant, SubsampledGaussian, calibrate_sigma};

fn bench(c: &mut Criterion) {
    let acc = PrvAccountant::default();
    let one = Composition::single(SubsampledGaussian::new(0.01, 1.0).unwrap(), 10_000).unwrap();
    let two = one
        .clone()
        .with(SubsampledGaussian::new(0.05, 2.0).unwrap(), 10_000)
        .unwrap();
    let mut g = c.benchmark_group("accountant");
    g.measurement_time(Duration::from_secs(3)).sample_size(10);
    g.bench_function("epsilon q=0.01 sigma=1 T=1e4 delta=1e-5", |b| {
        b.iter(|| acc.epsilon(std::hint::black_box(&one), 1e-5).unwrap())
    });
    g.bench_function("epsilon two streams (0.01,1,1e4)+(0.05,2,1e4)", |b| {
        b.iter(|| acc.epsilon(std::hint::black_box(&two), 1e-5).unwrap())
    });
    g.bench_function("calibrate eps=1 delta=1e-5 q=0.01 T=1e4", |b| {
        b.iter(|| calibrate_sigma(1.0, 1e-5, 0.01, std::hint::black_box(10_000), &acc).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
