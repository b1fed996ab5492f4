//! Throughput of the fused slice kernel against a STREAM-like read of the same bytes and (with
//! `--features tch`) libtorch's two-pass clip-and-sum, flat and grouped:
//! `cargo run --release -p raptor-clip --features tch --example throughput [B P]`.
//! Prints a Markdown table (GB = 1e9 bytes of gradient read; median of 7 runs).

use std::time::Instant;

use raptor_clip::workload::{GroupedWorkload, synthetic_gradients};
use raptor_clip::{ClipError, clip_blocks, clip_rows, stream_read_sum};

fn median(mut f: impl FnMut() -> Result<(), ClipError>, reps: usize) -> Result<f64, ClipError> {
    f()?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    Ok(v[reps / 2])
}

fn row(kind: &str, b: usize, p: usize, ours: f64, torch: Option<f64>, read: f64) {
    let gb = (b * p * 4) as f64 / 1e9;
    let (o, r) = (gb / ours, gb / read);
    let (t, ratio) = match torch {
        Some(t) => (format!("{:.1}", gb / t), format!("{:.2}", t / ours)),
        None => ("-".into(), "-".into()),
    };
    println!(
        "| {kind} | {b} | {p:.0e} | {:.0} | {o:.1} | {t} | {r:.1} | {ratio} | {:.2} |",
        gb * 1e3,
        read / ours
    );
}

fn main() -> Result<(), ClipError> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if args.len() == 2 {
        vec![(args[0], args[1])]
    } else {
        vec![
            (64, 10_000),
            (256, 10_000),
            (1024, 10_000),
            (64, 100_000),
            (256, 100_000),
            (1024, 100_000),
            (64, 1_000_000),
            (256, 1_000_000),
        ]
    };
    let reps = 7;
    println!(
        "| form | B | P | MB | fused GB/s | libtorch GB/s | read GB/s | fused / libtorch | fused / read |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &(b, p) in &sizes {
        let data = synthetic_gradients(b * p, (b * p) as u64);
        let bound = (p as f64).sqrt() * 0.0029;
        let t_ours = median(|| clip_rows(&data, p, bound, None).map(|_| ()), reps)?;
        let t_read = median(
            || {
                std::hint::black_box(stream_read_sum(&data));
                Ok(())
            },
            reps,
        )?;
        #[cfg(feature = "tch")]
        let t_torch = {
            let t = tch::Tensor::from_slice(&data).reshape([b as i64, p as i64]);
            Some(median(
                || raptor_clip::tensor::clip_rows(&t, bound, None).map(|_| ()),
                reps,
            )?)
        };
        #[cfg(not(feature = "tch"))]
        let t_torch = None;
        row("flat", b, p, t_ours, t_torch, t_read);
    }
    for &(b, p) in &sizes {
        let work = GroupedWorkload::new(b, p);
        let data = &work.data;
        let blocks = work.blocks();
        let grouping = work.grouping();
        let t_ours = median(|| clip_blocks(&blocks, &grouping, None).map(|_| ()), reps)?;
        let t_read = median(
            || {
                std::hint::black_box(data.iter().map(|d| stream_read_sum(d)).sum::<f32>());
                Ok(())
            },
            reps,
        )?;
        #[cfg(feature = "tch")]
        let t_torch = {
            let ts: Vec<tch::Tensor> = (0..5)
                .map(|k| {
                    tch::Tensor::from_slice(&data[k]).reshape([b as i64, work.widths[k] as i64])
                })
                .collect();
            let tb: Vec<(&str, &tch::Tensor)> = (0..5)
                .map(|k| (GroupedWorkload::NAMES[k], &ts[k]))
                .collect();
            Some(median(
                || raptor_clip::tensor::clip_blocks(&tb, &grouping, None).map(|_| ()),
                reps,
            )?)
        };
        #[cfg(not(feature = "tch"))]
        let t_torch = None;
        row("grouped (5 groups)", b, p, t_ours, t_torch, t_read);
    }
    Ok(())
}
