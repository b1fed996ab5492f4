#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Clip-and-sum throughput: raptor-clip's planned slice kernel beside libtorch's two-pass
//! (norms, then a matrix-vector product) on the same data, plus a STREAM-like read of the same
//! bytes (the physical reference). Flat (one bound) and grouped (a shared block of P/2 and four
//! expert blocks of P/8, each group its own bound) for B ∈ {64, 256, 1024}, P ∈ {1e4, 1e5, 1e6};
//! combinations above 1.1 GB of gradients are skipped to keep the run short on a 24 GiB box.
//!
//! After the criterion groups, a summary table per size from criterion's medians of this run:
//! the schedule the planner chose (`raptor_clip::plan`; planning happens during criterion's
//! warm-up), our time, libtorch's, the speed-up (libtorch time / ours) and the fraction of the
//! read bandwidth, with the machine (CPU model, caches) and both backends' thread counts.
//!
//! Then an interleaved comparison for flat B = 256, P = 1e6: each printed line times the read,
//! the fused kernel and libtorch back to back (min wall of 4 calls each), so that a machine
//! whose memory speed changes over time (this VM switches between ≈ 30 and ≈ 20 ms per GB read
//! within seconds) is compared within one state per line. `RAPTOR_CLIP_INTERLEAVED=N` sets
//! the number of lines (default 8; 0 skips it).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use raptor_benches::{criterion_median_s, machine_line, mark_ran, ran};
use raptor_clip::workload::{GroupedWorkload, synthetic_gradients};
use raptor_clip::{clip_blocks, clip_rows, plan, stream_read_sum, tensor};
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
            mark_ran("clip_flat", &id);
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
            mark_ran("clip_grouped", &id);
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

/// The per-size table of this run: schedule chosen, criterion medians, ratios.
fn summary() {
    let mut rows = Vec::new();
    for (form, group) in [("flat", "clip_flat"), ("grouped", "clip_grouped")] {
        for (b, p) in sizes() {
            let id = format!("B{b}_P{p}");
            if !ran(group, &id) {
                continue;
            }
            let widths: Vec<usize> = if form == "flat" {
                vec![p]
            } else {
                GroupedWorkload::new(0, p).widths.to_vec()
            };
            let ng = widths.len();
            let sched = plan::planned(b, &widths, ng).map_or("-".to_string(), |s| s.to_string());
            let get = |f: &str| criterion_median_s(group, f, &id).map(|s| s * 1e3);
            if let (Some(ours), Some(torch)) = (get("raptor_fused"), get("libtorch_two_pass")) {
                let read = get("stream_read");
                rows.push(format!(
                    "| {form} | B{b}, P{p} | {} | {sched} | {ours:.3} | {torch:.3} | {} | {:.2} | {} |",
                    b * p * 4 / 1_000_000,
                    read.map_or("-".into(), |r| format!("{r:.3}")),
                    torch / ours,
                    read.map_or("-".into(), |r| format!("{:.2}", r / ours)),
                ));
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    println!(
        "\nclip summary (criterion medians of this run); {}",
        machine_line()
    );
    println!(
        "| form | size | MB | schedule | ours ms | libtorch ms | read ms | speed-up (libtorch / ours) | read time / our time |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}

criterion_group!(benches, bench_flat, bench_grouped, interleaved);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
}
