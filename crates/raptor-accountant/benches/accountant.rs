#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Accountant benchmarks: ε(δ = 1e-5) of one stream (q 0.01, σ 1, T 10⁴), of two
//! streams (+ q 0.05, σ 2, T 10⁴), of one stream at T = 10⁶, and a σ calibration (ε = 1,
//! δ = 1e-5, q 0.01, T 10⁴), for each accuracy preset (`fast`, `default`, `tight`).
//!
//! Targets (at the tight preset): ≥ 20× faster than dp_accounting's PLD (pessimistic, connect
//! the dots, 1e-4 grid) on one and on two streams, T = 10⁶ under 100 ms, calibration under
//! 100 ms. dp_accounting's side of the table comes from the same run of
//! `fixtures/accountant/bench_vs_dp_accounting.py --criterion`, which times dp_accounting before
//! and after `cargo bench -p raptor-accountant --bench accountant` and reads this bench's
//! medians from `target/criterion` (see the crate README, Benchmarks).
//!
//! The certified ε of each case is printed once per preset (`RESULT` lines) so that the script
//! can compare it with dp_accounting's ε and the extrapolated truth.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use raptor_accountant::{
    Accuracy, Composition, PrvAccountant, SubsampledGaussian, calibrate_sigma,
};

fn bench(c: &mut Criterion) {
    let one = Composition::single(SubsampledGaussian::new(0.01, 1.0).unwrap(), 10_000).unwrap();
    let two = one
        .clone()
        .with(SubsampledGaussian::new(0.05, 2.0).unwrap(), 10_000)
        .unwrap();
    let big = Composition::single(SubsampledGaussian::new(0.01, 1.0).unwrap(), 1_000_000).unwrap();
    for (name, accuracy) in [
        ("fast", Accuracy::fast()),
        ("default", Accuracy::default()),
        ("tight", Accuracy::tight()),
    ] {
        let acc = PrvAccountant::new(accuracy).unwrap();
        for (case, comp) in [("one", &one), ("two", &two), ("big", &big)] {
            let e = acc.epsilon(comp, 1e-5).unwrap();
            println!(
                "RESULT {name} {case} {:.9} {:.9} {:.9}",
                e.upper, e.estimate, e.lower
            );
        }
        let s = calibrate_sigma(1.0, 1e-5, 0.01, 10_000, &acc).unwrap();
        println!(
            "RESULT {name} calib {:.9} {:.9} {:.9}",
            s.epsilon.upper, s.sigma, s.epsilon.lower
        );
        let mut g = c.benchmark_group(format!("accountant-{name}"));
        g.measurement_time(Duration::from_secs(3)).sample_size(10);
        g.bench_function("one", |b| {
            b.iter(|| acc.epsilon(std::hint::black_box(&one), 1e-5).unwrap())
        });
        g.bench_function("two", |b| {
            b.iter(|| acc.epsilon(std::hint::black_box(&two), 1e-5).unwrap())
        });
        g.bench_function("big", |b| {
            b.iter(|| acc.epsilon(std::hint::black_box(&big), 1e-5).unwrap())
        });
        g.bench_function("calib", |b| {
            b.iter(|| calibrate_sigma(1.0, 1e-5, 0.01, std::hint::black_box(10_000), &acc).unwrap())
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
