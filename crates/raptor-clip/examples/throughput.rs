//! Quick throughput check of the fused slice kernel against a STREAM-like read of the same
//! bytes: `cargo run --release -p raptor-clip --example throughput [B P]`.

use std::time::Instant;

fn fill(n: usize) -> Vec<f32> {
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.01
        })
        .collect()
}

fn median(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[reps / 2]
}

fn main() -> Result<(), raptor_clip::ClipError> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if args.len() == 2 {
        vec![(args[0], args[1])]
    } else {
        vec![
            (64, 10_000),
            (256, 100_000),
            (1024, 100_000),
            (64, 1_000_000),
            (256, 1_000_000),
        ]
    };
    for (b, p) in sizes {
        let data = fill(b * p);
        let bound = (p as f64).sqrt() * 0.0029;
        let gb = (b * p * 4) as f64 / 1e9;
        let mut err = None;
        let t_fused = median(
            || {
                if let Err(e) = raptor_clip::clip_rows(&data, p, bound, None) {
                    err = Some(e);
                }
            },
            7,
        );
        if let Some(e) = err {
            return Err(e);
        }
        let t_read = median(
            || {
                std::hint::black_box(raptor_clip::stream_read_sum(&data));
            },
            7,
        );
        println!(
            "B={b:5} P={p:8}  fused {:6.1} GB/s  read {:6.1} GB/s  fused/read {:.2}",
            gb / t_fused,
            gb / t_read,
            t_read / t_fused
        );
    }
    Ok(())
}
