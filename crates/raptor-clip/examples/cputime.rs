#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Load-tolerant comparison of the fused kernel with the STREAM-like read: CPU time of all
//! threads per call (Linux `/proc/self/task/*/schedstat`), so that time slices lost to other
//! processes on a shared box do not count; also the minimum wall time.
//! `cargo run --release -p raptor-clip --example cputime B P` (flat and grouped, as the bench),
//! or `... --example cputime 0` for read bandwidth against buffer size (cache capacity).
//! "cpu ratio read/fused" estimates the quiet-machine "read time / fused time".
use raptor_clip::workload::{GroupedWorkload, synthetic_gradients};
use raptor_clip::{clip_blocks, clip_rows, stream_read_sum};
use std::time::Instant;

/// Nanoseconds on CPU of all threads of this process so far.
fn cpu_ns() -> u64 {
    let mut t = 0;
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let p = e.unwrap().path().join("schedstat");
        if let Ok(s) = std::fs::read_to_string(p) {
            t += s.split_whitespace().next().unwrap().parse::<u64>().unwrap();
        }
    }
    t
}
/// (CPU ms per call, minimum wall ms) over `reps` calls after one warm-up call.
fn meas(mut f: impl FnMut(), reps: usize) -> (f64, f64) {
    f();
    let c0 = cpu_ns();
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    ((cpu_ns() - c0) as f64 / reps as f64 / 1e6, best * 1e3)
}
fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    if a.len() == 1 {
        for mb in [1usize, 2, 4, 6, 8, 12, 16, 20, 24, 32, 64] {
            let d = synthetic_gradients(mb << 18, 1);
            let (c, w) = meas(
                || {
                    std::hint::black_box(stream_read_sum(&d));
                },
                200,
            );
            let d1 = &d[..];
            let (c1, w1) = meas(
                || {
                    std::hint::black_box(
                        d1.chunks(1 << 16)
                            .map(|c| c.iter().sum::<f32>())
                            .sum::<f32>(),
                    );
                },
                50,
            );
            println!(
                "{mb} MB: 2 threads cpu {:.1} GB/s/core (min wall {:.1} GB/s); 1 thread (scalar sum) {:.1} GB/s",
                (mb << 20) as f64 / c / 1e6,
                (mb << 20) as f64 / w / 1e6,
                (mb << 20) as f64 / c1 / 1e6
            );
            let _ = w1;
        }
        return;
    }
    let (b, p) = (a[0], a[1]);
    let reps = if b * p > 100_000_000 { 10 } else { 30 };
    let data = synthetic_gradients(b * p, 3);
    let bound = (p as f64).sqrt() * 0.0029;
    let (cf, wf) = meas(
        || {
            std::hint::black_box(clip_rows(&data, p, bound, None).unwrap());
        },
        reps,
    );
    let (cr, wr) = meas(
        || {
            std::hint::black_box(stream_read_sum(&data));
        },
        reps,
    );
    println!(
        "flat    B{b} P{p}: fused cpu {cf:.2} ms (min wall {wf:.2}), read cpu {cr:.2} ms (min wall {wr:.2}) => cpu ratio read/fused {:.2}, wall {:.2}",
        cr / cf,
        wr / wf
    );
    drop(data);
    let work = GroupedWorkload::new(b, p);
    let data = &work.data;
    let blocks = work.blocks();
    let grouping = work.grouping();
    let (cf, wf) = meas(
        || {
            std::hint::black_box(clip_blocks(&blocks, &grouping, None).unwrap());
        },
        reps,
    );
    let (cr, wr) = meas(
        || {
            std::hint::black_box(data.iter().map(|d| stream_read_sum(d)).sum::<f32>());
        },
        reps,
    );
    println!(
        "grouped B{b} P{p}: fused cpu {cf:.2} ms (min wall {wf:.2}), read cpu {cr:.2} ms (min wall {wr:.2}) => cpu ratio read/fused {:.2}, wall {:.2}",
        cr / cf,
        wr / wf
    );
}
