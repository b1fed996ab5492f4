#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Physical floors for an exact clip-and-sum over records larger than L2, next to the fused
//! kernel and the STREAM-like read, repeated so that a machine whose memory speed changes
//! over time shows each state on its own line.
//!
//! `cargo run --release -p raptor-clip --example floor [B P LINES]` (default 256 1000000 20).
//! Columns (min wall ms of 4 calls, and in brackets read time / that time):
//! - `read`: the STREAM-like parallel read of the B × P entries (every byte once);
//! - `twice`: one contiguous record range per thread, each record read, then read again
//!   right away (forward): two touches, no writes — the floor of any exact kernel that reads
//!   each byte from memory once (a record's factor needs its whole norm before any of its
//!   entries can be summed);
//! - `part R`: the same plus the per-thread partial sums (P entries) updated once per R
//!   records (norms of R records, then `p += Σ c_r · row_r`): what any such kernel must add
//!   when a record does not fit in L2, since every record touches every output entry;
//! - `fused`: `clip_rows`, the library's kernel (its schedule planned as in production; the
//!   schedule is printed, and `twice / fused`: 1.0 means at the write-free floor, 0.9 within
//!   10 % of it).
use raptor_clip::workload::synthetic_gradients;
use raptor_clip::{clip_rows, stream_read_sum};
use rayon::prelude::*;
use std::time::Instant;

/// Minimum wall time (ms) of `reps` calls after one warm-up call.
fn best(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    let mut b = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        b = b.min(t.elapsed().as_secs_f64());
    }
    b * 1e3
}

/// Sum of squares (`square`) or sum with 16 f32 lanes; a stand-in for the norm: the same
/// bytes, less work.
#[inline(always)]
fn lanes(x: &[f32], square: bool) -> f32 {
    let mut acc = [0f32; 16];
    if square {
        for c in x.chunks_exact(16) {
            for j in 0..16 {
                acc[j] += c[j] * c[j];
            }
        }
    } else {
        for c in x.chunks_exact(16) {
            for j in 0..16 {
                acc[j] += c[j];
            }
        }
    }
    acc.iter().sum()
}

/// `p += Σ_r a[r] · rows[r]`, one pass over `p`.
#[inline(always)]
fn accumulate(p: &mut [f32], a: &[f32], rows: &[&[f32]]) {
    let n = p.len();
    match *rows {
        [r0] => {
            for (y, &x0) in p.iter_mut().zip(&r0[..n]) {
                *y += a[0] * x0;
            }
        }
        [r0, r1] => {
            for ((y, &x0), &x1) in p.iter_mut().zip(&r0[..n]).zip(&r1[..n]) {
                *y += a[0] * x0 + a[1] * x1;
            }
        }
        [r0, r1, r2, r3] => {
            let it = p.iter_mut().zip(&r0[..n]).zip(&r1[..n]);
            for ((((y, &x0), &x1), &x2), &x3) in it.zip(&r2[..n]).zip(&r3[..n]) {
                *y += (a[0] * x0 + a[1] * x1) + (a[2] * x2 + a[3] * x3);
            }
        }
        _ => {
            for (r, row) in rows.iter().enumerate() {
                for (y, &x) in p.iter_mut().zip(&row[..n]) {
                    *y += a[r] * x;
                }
            }
        }
    }
}

/// [`lanes`] and [`accumulate`] compiled for AVX2 + FMA (the kernel's own instruction set).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    #[target_feature(enable = "avx2,fma")]
    pub fn lanes(x: &[f32], square: bool) -> f32 {
        super::lanes(x, square)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn accumulate(p: &mut [f32], a: &[f32], rows: &[&[f32]]) {
        super::accumulate(p, a, rows)
    }

    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
}

/// [`lanes`], with AVX2 + FMA where the CPU has them.
fn sum_lanes(x: &[f32], square: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 and FMA are present (checked just above).
        return unsafe { avx2::lanes(x, square) };
    }
    lanes(x, square)
}

/// [`accumulate`], with AVX2 + FMA where the CPU has them.
fn add_rows(p: &mut [f32], a: &[f32], rows: &[&[f32]]) {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 and FMA are present (checked just above).
        return unsafe { avx2::accumulate(p, a, rows) };
    }
    accumulate(p, a, rows)
}

/// Run `per_range` on one contiguous record range per thread.
fn per_thread(data: &[f32], p: usize, threads: usize, per_range: impl Fn(&[f32]) + Sync + Send) {
    let batch = data.len() / p;
    let per = batch.div_ceil(threads);
    data.par_chunks(per * p).for_each(per_range);
}

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|x| x.parse().expect("arguments: B P LINES"))
        .collect();
    let (b, p, lines) = match a[..] {
        [] => (256, 1_000_000, 20),
        [b, p] => (b, p, 20),
        [b, p, l] => (b, p, l),
        _ => {
            eprintln!("arguments: [B P [LINES]]");
            std::process::exit(2);
        }
    };
    let threads = rayon::current_num_threads();
    let data = synthetic_gradients(b * p, 3);
    let bound = (p as f64).sqrt() * 0.0029;
    println!(
        "B = {b}, P = {p} ({} MB), {threads} threads; min wall ms of 4 calls (read / time)",
        b * p * 4 / 1_000_000
    );
    for line in 0..lines {
        let read = best(
            || {
                std::hint::black_box(stream_read_sum(&data));
            },
            4,
        );
        let mut out = format!("{line:2} read {read:6.2} |");
        let twice = best(
            || {
                per_thread(&data, p, threads, |range| {
                    let mut s = 0f32;
                    for row in range.chunks(p) {
                        s += sum_lanes(row, true);
                        s += sum_lanes(row, false);
                    }
                    std::hint::black_box(s);
                })
            },
            4,
        );
        out += &format!(" twice {twice:6.2} ({:.2})", read / twice);
        for r in [1usize, 2, 4] {
            let t = best(
                || {
                    per_thread(&data, p, threads, |range| {
                        let mut part = vec![0f32; p];
                        let rows: Vec<&[f32]> = range.chunks(p).collect();
                        for step in rows.chunks(r) {
                            let f: Vec<f32> = step
                                .iter()
                                .map(|row| {
                                    let n = f64::from(sum_lanes(row, true)).sqrt();
                                    (if n > bound { bound / n } else { 1.0 }) as f32
                                })
                                .collect();
                            add_rows(&mut part, &f, step);
                        }
                        std::hint::black_box(part);
                    })
                },
                4,
            );
            out += &format!(" part{r} {t:6.2} ({:.2})", read / t);
        }
        let fused = best(
            || {
                std::hint::black_box(clip_rows(&data, p, bound, None).unwrap());
            },
            4,
        );
        let sched = raptor_clip::plan::planned(b, &[p], 1).map_or("-".into(), |s| s.to_string());
        out += &format!(
            " | fused {fused:6.2} ({:.2}) [{sched}] twice / fused {:.2}",
            read / fused,
            twice / fused
        );
        println!("{out}");
    }
}
