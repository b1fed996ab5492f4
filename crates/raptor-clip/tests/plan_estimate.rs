#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `PlanMode::Estimate`: no timing, the cache-model estimate runs and nothing is remembered.
//! (Its own process: the mode is global.)

use raptor_clip::{clip_rows, plan};

#[test]
fn estimate_mode_runs_the_estimate_and_remembers_nothing() {
    plan::set_mode(plan::PlanMode::Estimate);
    let (batch, width) = (64usize, 5000usize);
    let g: Vec<f32> = (0..batch * width)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.01)
        .collect();
    let out = clip_rows(&g, width, 0.1, None).unwrap();
    assert_eq!(plan::planned(batch, &[width], 1), None);
    let threads = rayon::current_num_threads();
    let est = plan::estimate(batch, width, threads);
    let want = plan::with_schedule(est, || clip_rows(&g, width, 0.1, None)).unwrap();
    assert_eq!(out.sum(), want.sum());
}
