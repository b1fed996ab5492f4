#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The planner: every schedule agrees with a slow f64 reference and with the others within
//! the documented tolerance; the choice is remembered per shape class and reused; wisdom
//! round-trips through a file; corrupt wisdom is an error, never a panic; a forced schedule
//! overrides everything. No test depends on wall-clock time.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use raptor_clip::plan::{self, Schedule};
use raptor_clip::{Block, BlockClipOutput, Grouping, clip_blocks, clip_rows};

const ALL: [Schedule; 8] = [
    Schedule::Rows(1),
    Schedule::Rows(2),
    Schedule::Rows(4),
    Schedule::Rows(8),
    Schedule::Columns(1),
    Schedule::Columns(2),
    Schedule::Columns(4),
    Schedule::TwoPass,
];

fn data(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let scale = if i % 97 == 0 { 3.0 } else { 0.1 };
            rng.random_range(-1.0f32..1.0) * scale
        })
        .collect()
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

/// Slow f64 reference of grouped clipping: (sums, Σ|terms| per block entry, factors).
fn reference(
    blocks: &[Vec<f32>],
    widths: &[usize],
    groups: &[usize],
    bounds: &[f64],
    batch: usize,
    weights: Option<&[f64]>,
) -> (Vec<Vec<f64>>, Vec<Vec<f64>>, Vec<f64>) {
    let ng = bounds.len();
    let mut sums: Vec<Vec<f64>> = widths.iter().map(|&w| vec![0.0; w]).collect();
    let mut abs: Vec<Vec<f64>> = widths.iter().map(|&w| vec![0.0; w]).collect();
    let mut factors = vec![0.0; batch * ng];
    for i in 0..batch {
        let w = weights.map_or(1.0, |w| w[i]);
        let mut sq = vec![0.0f64; ng];
        for (k, d) in blocks.iter().enumerate() {
            for &x in &d[i * widths[k]..(i + 1) * widths[k]] {
                sq[groups[k]] += f64::from(x) * f64::from(x);
            }
        }
        for g in 0..ng {
            let n = w * sq[g].sqrt();
            factors[i * ng + g] = w * if n > bounds[g] { bounds[g] / n } else { 1.0 };
        }
        for (k, d) in blocks.iter().enumerate() {
            let f = factors[i * ng + groups[k]];
            for (j, &x) in d[i * widths[k]..(i + 1) * widths[k]].iter().enumerate() {
                sums[k][j] += f * f64::from(x);
                abs[k][j] += (f * f64::from(x)).abs();
            }
        }
    }
    (sums, abs, factors)
}

fn run(
    blocks: &[Vec<f32>],
    widths: &[usize],
    groups: &[usize],
    bounds: &[f64],
    weights: Option<&[f64]>,
) -> BlockClipOutput {
    let names: Vec<String> = (0..blocks.len()).map(|k| format!("b{k}")).collect();
    let bl: Vec<Block<'_>> = (0..blocks.len())
        .map(|k| Block::new(&names[k], &blocks[k], widths[k]))
        .collect();
    let ng = bounds.len();
    let grouping = Grouping::Grouped {
        groups: (0..ng)
            .map(|g| (0..blocks.len()).filter(|&k| groups[k] == g).collect())
            .collect(),
        bounds: bounds.to_vec(),
    };
    clip_blocks(&bl, &grouping, weights).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every schedule, on 1–3 threads, against the f64 reference: factors to 1e-12 relative,
    /// sums to 1e-6 of Σ|clipped terms| (the documented tolerance).
    #[test]
    fn every_schedule_matches_the_reference(
        batch in 1usize..24,
        widths in proptest::collection::vec(1usize..300, 1..4),
        two_groups in any::<bool>(),
        weighted in any::<bool>(),
        seed in 0u64..1000,
        threads in 1usize..4,
    ) {
        let blocks: Vec<Vec<f32>> = widths
            .iter()
            .enumerate()
            .map(|(k, &w)| data(seed * 10 + k as u64, batch * w))
            .collect();
        let groups: Vec<usize> = (0..widths.len())
            .map(|k| if two_groups && widths.len() > 1 { k % 2 } else { 0 })
            .collect();
        let ng = groups.iter().max().unwrap() + 1;
        let bounds: Vec<f64> = (0..ng).map(|g| 0.4 + 0.3 * g as f64).collect();
        let weights: Vec<f64> = (0..batch).map(|i| [1.0, 0.5, 0.0][i % 3]).collect();
        let w = weighted.then_some(&weights[..]);
        let (sums, abs, factors) = reference(&blocks, &widths, &groups, &bounds, batch, w);
        let p = pool(threads);
        for s in ALL {
            let out = p.install(|| plan::with_schedule(s, || run(&blocks, &widths, &groups, &bounds, w)));
            for (a, b) in out.factors().iter().zip(&factors) {
                prop_assert!((a - b).abs() <= 1e-12 * b.abs().max(1e-300), "{s}: factor {a} vs {b}");
            }
            for k in 0..widths.len() {
                let err: f64 = out.sums()[k]
                    .iter()
                    .zip(&sums[k])
                    .map(|(&x, &y)| (f64::from(x) - y).powi(2))
                    .sum::<f64>()
                    .sqrt();
                let scale: f64 = abs[k].iter().map(|y| y * y).sum::<f64>().sqrt();
                prop_assert!(err <= 1e-6 * scale + 1e-30, "{s} block {k}: {err} vs {scale}");
            }
        }
    }
}

/// The two-pass and column schedules give bitwise the same result whatever the thread count.
#[test]
fn two_pass_and_column_schedules_do_not_depend_on_the_thread_count() {
    let (batch, width) = (13usize, 150_001usize);
    let g = data(5, batch * width);
    for s in [
        Schedule::TwoPass,
        Schedule::Columns(2),
        Schedule::Columns(1),
    ] {
        let one = pool(1).install(|| plan::with_schedule(s, || clip_rows(&g, width, 0.7, None)));
        let one = one.unwrap();
        for t in [2, 3] {
            let other = pool(t)
                .install(|| plan::with_schedule(s, || clip_rows(&g, width, 0.7, None)))
                .unwrap();
            assert_eq!(one.sum(), other.sum(), "{s} threads {t}");
            assert_eq!(one.norms(), other.norms(), "{s} threads {t}");
        }
    }
}

/// The first call of a shape class plans (one of the candidates) and remembers the choice;
/// later calls run it and give bitwise what that schedule gives.
#[test]
fn the_choice_is_remembered_and_reused() {
    let (batch, width) = (37usize, 1234usize);
    let g = data(7, batch * width);
    let p = pool(2);
    p.install(|| {
        assert_eq!(plan::planned(batch, &[width], 1), None);
        let first = clip_rows(&g, width, 0.5, None).unwrap();
        let chosen = plan::planned(batch, &[width], 1).expect("planned on the first call");
        assert!(
            plan::candidates(batch, width, 2).contains(&chosen),
            "{chosen}"
        );
        let forced = plan::with_schedule(chosen, || clip_rows(&g, width, 0.5, None)).unwrap();
        assert_eq!(
            first.sum(),
            forced.sum(),
            "the first call returns the chosen schedule's result"
        );
        let again = clip_rows(&g, width, 0.5, None).unwrap();
        assert_eq!(again.sum(), forced.sum());
        // a neighbouring batch size in the same class reuses it without planning
        assert_eq!(plan::planned(batch + 3, &[width], 1), Some(chosen));
    });
}

/// A remembered choice (from wisdom) is used as is; an unparsable one is replanned.
#[test]
fn wisdom_entries_drive_the_choice() {
    let (batch, width) = (300usize, 77usize);
    let g = data(8, batch * width);
    let p = pool(2);
    p.install(|| {
        let key = plan::shape_class(batch, &[width], 1);
        raptor_plan::remember(&key, "columns(4)");
        assert_eq!(
            plan::planned(batch, &[width], 1),
            Some(Schedule::Columns(4))
        );
        let out = clip_rows(&g, width, 0.5, None).unwrap();
        let want = plan::with_schedule(Schedule::Columns(4), || clip_rows(&g, width, 0.5, None));
        assert_eq!(out.sum(), want.unwrap().sum());
        raptor_plan::remember(&key, "rows(3)");
        assert_eq!(plan::planned(batch, &[width], 1), None);
        clip_rows(&g, width, 0.5, None).unwrap();
        let replanned = plan::planned(batch, &[width], 1).expect("replanned");
        assert!(plan::candidates(batch, width, 2).contains(&replanned));
    });
}

/// Save, forget, load: the same choice comes back; corrupt files are errors, not panics, and
/// leave the choices alone.
#[test]
fn wisdom_file_round_trip_and_corrupt_files() {
    let (batch, width) = (5usize, 40_000usize);
    let g = data(9, batch * width);
    let p = pool(2);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wisdom");
    p.install(|| {
        clip_rows(&g, width, 0.5, None).unwrap();
        let chosen = plan::planned(batch, &[width], 1).unwrap();
        plan::save_wisdom(&path).unwrap();
        let key = plan::shape_class(batch, &[width], 1);
        raptor_plan::forget(&key);
        assert_eq!(plan::planned(batch, &[width], 1), None);
        assert!(plan::load_wisdom(&path).unwrap() >= 1);
        assert_eq!(plan::planned(batch, &[width], 1), Some(chosen));
        for bad in [
            "",
            "raptor-wisdom 1\n",
            "garbage\u{0}\n",
            "raptor-wisdom 1\nmachine\tx\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = plan::load_wisdom(&path).unwrap_err();
            let e: raptor_clip::ClipError = e.into();
            assert!(e.to_string().contains("wisdom"), "{e}");
            assert_eq!(plan::planned(batch, &[width], 1), Some(chosen));
        }
        assert!(plan::load_wisdom(&dir.path().join("missing")).is_err());
    });
}

/// A forced schedule wins over wisdom and nests.
#[test]
fn forced_schedule_overrides_and_nests() {
    let key = plan::shape_class(9, &[10], 1);
    raptor_plan::remember(&key, "two-pass");
    plan::with_schedule(Schedule::Rows(2), || {
        assert_eq!(plan::planned(9, &[10], 1), Some(Schedule::Rows(2)));
        plan::with_schedule(Schedule::Columns(1), || {
            assert_eq!(plan::planned(9, &[10], 1), Some(Schedule::Columns(1)));
        });
        assert_eq!(plan::planned(9, &[10], 1), Some(Schedule::Rows(2)));
    });
    assert_eq!(plan::planned(9, &[10], 1), Some(Schedule::TwoPass));
}
