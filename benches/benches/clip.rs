#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Clip-and-sum throughput: raptor-clip's fused slice kernel beside libtorch's two-pass
//! (norms, then a matrix-vector product) on the same data, plus a STREAM-like read of the same
//! bytes (the physical reference). Flat (one bound) and grouped (a shared block of P/2 and four
//! expert blocks of P/8, each group its own bound) for B ∈ {64, 256, 1024}, P ∈ {1e4, 1e5, 1e6};
//! combinations above 1.1 GB of gradients are skipped to keep the run short on a 24 GiB box.
//!
//! Then an interleaved comparison for flat B = 256, P = 1e6: each printed line times the read,
//! the fused kernel and libtorch back to back (min wall of 4 calls each), so that a machine
//! whose memory speed changes over time (this VM switches between ≈ 30 and ≈ 20 ms per GB read
//! within seconds) is compared within one state per line. `RAPTOR_CLIP_INTERLEAVED=N` sets
//! the number of lines (default 8; 0 skips it).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use raptor_clip::workload::{GroupedWorkload, synthetic_gradients};
use raptor_clip::{clip_blocks, clip_rows, stream_read_sum, tensor};
use tch::Tensor;

const MAX_BYTES: usize = 1_100_000_000;

fn sizes() -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    for &p in &[10_000usize, 100_000, 1_000_000] {
        for &b in &[64usize, 256, 1024] {
            if b * p * 4 <= MAX_BYTES {
                v.push((b, p));
            }
        }
    }
    v
}

fn bench_flat(c: &mut Criterion) {
    let mut group = c.benchmark_group("clip_flat");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    for (b, p) in sizes() {
        let data = synthetic_gradients(b * p, (b * p) as u64);
        let bound = 0.5 * (p as f64).sqrt() * 0.01 / 12f64.sqrt() * 2.0;
        let t = Tensor::from_slice(&data).reshape([b as i64, p as i64]);
        group.throughput(Throughput::Bytes((b * p * 4) as u64));
        let id = format!("B{b}_P{p}");
        group.bench_function(BenchmarkId::new("raptor_fused", &id), |bch| {
            bch.iter(|| black_box(clip_rows(black_box(&data), p, bound, None).unwrap()))
        });
        group.bench_function(BenchmarkId::new("libtorch_two_pass", &id), |bch| {
            bch.iter(|| black_box(tensor::clip_rows(black_box(&t), bound, None).unwrap()))
        });
        group.bench_function(BenchmarkId::new("stream_read", &id), |bch| {
            bch.iter(|| black_box(stream_read_sum(black_box(&data))))
        });
    }
    group.finish();
}

fn bench_grouped(c: &mut Criterion) {
    let mut group = c.benchmark_group("clip_grouped");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    for (b, p) in sizes() {
        let work = GroupedWorkload::new(b, p);
        let (widths, data, names) = (work.widths, &work.data, GroupedWorkload::NAMES);
        let blocks = work.blocks();
        let grouping = work.grouping();
        let tensors: Vec<Tensor> = (0..5)
            .map(|k| Tensor::from_slice(&data[k]).reshape([b as i64, widths[k] as i64]))
            .collect();
        let tb: Vec<(&str, &Tensor)> = (0..5).map(|k| (names[k], &tensors[k])).collect();
        group.throughput(Throughput::Bytes((b * p * 4) as u64));
        let id = format!("B{b}_P{p}");
        group.bench_function(BenchmarkId::new("raptor_fused", &id), |bch| {
            bch.iter(|| black_box(clip_blocks(black_box(&blocks), &grouping, None).unwrap()))
        });
        group.bench_function(BenchmarkId::new("libtorch_two_pass", &id), |bch| {
            bch.iter(|| black_box(tensor::clip_blocks(black_box(&tb), &grouping, None).unwrap()))
        });
        group.bench_function(BenchmarkId::new("stream_read", &id), |bch| {
            bch.iter(|| black_box(data.iter().map(|d| stream_read_sum(d)).sum::<f32>()))
        });
    }
    group.finish();
}

/// Minimum wall time (ms) of 4 calls after one warm-up call.
fn min_ms(mut f: impl FnMut()) -> f64 {
    f();
    (0..4)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

fn interleaved(_c: &mut Criterion) {
    let lines: usize = std::env::var("RAPTOR_CLIP_INTERLEAVED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    if lines == 0 {
        return;
    }
    let (b, p) = (256usize, 1_000_000usize);
    let data = synthetic_gradients(b * p, (b * p) as u64);
    let bound = 0.5 * (p as f64).sqrt() * 0.01 / 12f64.sqrt() * 2.0;
    let t = Tensor::from_slice(&data).reshape([b as i64, p as i64]);
    println!("\ninterleaved, flat B{b} P{p} (min wall of 4 calls per cell):");
    println!(
        "| line | read ms | fused ms | libtorch ms | fused / libtorch speed-up | read time / fused time |"
    );
    println!("|---|---|---|---|---|---|");
    for line in 0..lines {
        let read = min_ms(|| {
            black_box(stream_read_sum(black_box(&data)));
        });
        let fused = min_ms(|| {
            black_box(clip_rows(black_box(&data), p, bound, None).unwrap());
        });
        let torch = min_ms(|| {
            black_box(tensor::clip_rows(black_box(&t), bound, None).unwrap());
        });
        println!(
            "| {line} | {read:.2} | {fused:.2} | {torch:.2} | {:.2} | {:.2} |",
            torch / fused,
            read / fused
        );
    }
}

criterion_group!(benches, bench_flat, bench_grouped, interleaved);
criterion_main!(benches);
