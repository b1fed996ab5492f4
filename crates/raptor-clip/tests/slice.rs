#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Slice backend against slow per-example-loop references (f64), for every clipping form.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use raptor_clip::{Block, ClipError, Grouping, clip_blocks, clip_rows};

/// Reference result: per block sums (f64), per (record, group) norms and factors.
struct Ref {
    sums: Vec<Vec<f64>>,
    /// Σ_i |clipped_i| per entry (the scale for the rounding error of a sum).
    abs_sums: Vec<Vec<f64>>,
    norms: Vec<f64>,
    factors: Vec<f64>,
}

/// Slow obvious reference. `block_group[k]` = group of block k; `joint` = one bound over all.
fn reference(
    blocks: &[(Vec<f32>, usize)],
    block_group: &[usize],
    n_groups: usize,
    bounds: &[f64],
    joint: Option<f64>,
    weights: Option<&[f64]>,
) -> Ref {
    let batch = blocks[0].0.len() / blocks[0].1;
    let mut sums: Vec<Vec<f64>> = blocks.iter().map(|(_, w)| vec![0.0; *w]).collect();
    let mut abs_sums: Vec<Vec<f64>> = blocks.iter().map(|(_, w)| vec![0.0; *w]).collect();
    let mut norms = vec![0.0; batch * n_groups];
    let mut factors = vec![0.0; batch * n_groups];
    for i in 0..batch {
        let w = weights.map_or(1.0, |w| w[i]);
        // weighted record
        let rec: Vec<Vec<f64>> = blocks
            .iter()
            .map(|(d, wd)| {
                d[i * wd..(i + 1) * wd]
                    .iter()
                    .map(|&x| w * f64::from(x))
                    .collect()
            })
            .collect();
        let mut gsq = vec![0.0; n_groups];
        for (k, r) in rec.iter().enumerate() {
            gsq[block_group[k]] += r.iter().map(|x| x * x).sum::<f64>();
        }
        let total: f64 = gsq.iter().sum::<f64>().sqrt();
        for g in 0..n_groups {
            let n = gsq[g].sqrt();
            norms[i * n_groups + g] = n;
            let scale = match joint {
                Some(c) => (c / total).min(1.0),
                None => (bounds[g] / n).min(1.0),
            };
            let scale = if scale.is_nan() { 1.0 } else { scale };
            factors[i * n_groups + g] = w * scale;
        }
        for (k, r) in rec.iter().enumerate() {
            let g = block_group[k];
            let scale = factors[i * n_groups + g] / if w == 0.0 { 1.0 } else { w };
            for ((s, a), x) in sums[k].iter_mut().zip(abs_sums[k].iter_mut()).zip(r) {
                let v = if w == 0.0 { 0.0 } else { scale * x };
                *s += v;
                *a += v.abs();
            }
        }
    }
    Ref {
        sums,
        abs_sums,
        norms,
        factors,
    }
}

fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - y).powi(2))
        .sum::<f64>()
        .sqrt();
    let den: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    if den == 0.0 { num } else { num / den }
}

/// Error of a computed sum relative to the scale of its terms: ‖a − b‖ / ‖Σ_i |terms_i|‖.
fn sum_err(a: &[f32], b: &[f64], abs: &[f64]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - y).powi(2))
        .sum::<f64>()
        .sqrt();
    let den: f64 = abs.iter().map(|y| y * y).sum::<f64>().sqrt();
    if den == 0.0 { num } else { num / den }
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1e-300))
        .fold(0.0, f64::max)
}

/// Rows with widely spread norms (some far above, some below the bound).
fn random_rows(rng: &mut ChaCha8Rng, batch: usize, width: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(batch * width);
    for _ in 0..batch {
        let scale: f64 = 10f64.powf(rng.random_range(-2.0..2.0)) / (width as f64).sqrt();
        for _ in 0..width {
            v.push((rng.random_range(-1.0..1.0) * scale * 1.7) as f32);
        }
    }
    v
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn flat_rows_match_reference_both_schedules() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for &(batch, width) in &[
        (1, 5),
        (3, 40_000),
        (7, 1),
        (17, 1000),
        (64, 333),
        (9, 70_001),
        // records above the per-thread cache budget: the column pipeline even for B ≥ 2 threads
        (5, 600_001),
    ] {
        let rows = random_rows(&mut rng, batch, width);
        let r = reference(&[(rows.clone(), width)], &[0], 1, &[1.0], None, None);
        // 4 threads: B < 8 takes the column-parallel pipeline, B ≥ 8 the per-thread row
        // pipeline (4, then 8 records per step as records get smaller), 2.4 MB records the
        // column pipeline; 2 threads: B = 9 has 5 records per thread (ragged steps).
        for threads in [1, 2, 4] {
            let out = in_pool(threads, || clip_rows(&rows, width, 1.0, None).unwrap());
            assert!(
                sum_err(out.sum(), &r.sums[0], &r.abs_sums[0]) < 1e-6,
                "B={batch} P={width} t={threads}"
            );
            assert!(max_rel(out.norms(), &r.norms) < 1e-6);
            assert!(max_rel(out.factors(), &r.factors) < 1e-6);
            assert_eq!(out.batch(), batch);
        }
    }
}

#[test]
fn weighted_rows_match_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (batch, width) = (33, 513);
    let rows = random_rows(&mut rng, batch, width);
    let mut w: Vec<f64> = (0..batch).map(|_| rng.random_range(0.0..1.0)).collect();
    w[0] = 0.0;
    w[1] = 1.0;
    let r = reference(&[(rows.clone(), width)], &[0], 1, &[0.7], None, Some(&w));
    let out = clip_rows(&rows, width, 0.7, Some(&w)).unwrap();
    assert!(sum_err(out.sum(), &r.sums[0], &r.abs_sums[0]) < 1e-6);
    assert!(max_rel(&out.factors()[1..], &r.factors[1..]) < 1e-6);
    assert_eq!(out.factors()[0], 0.0);
    // norms reported are ‖w_i g_i‖
    assert!(max_rel(&out.norms()[1..], &r.norms[1..]) < 1e-6);
    assert_eq!(out.norms()[0], 0.0);
}

fn make_blocks(rng: &mut ChaCha8Rng, batch: usize, widths: &[usize]) -> Vec<(Vec<f32>, usize)> {
    widths
        .iter()
        .map(|&w| (random_rows(rng, batch, w), w))
        .collect()
}

fn as_blocks<'a>(names: &'a [String], data: &'a [(Vec<f32>, usize)]) -> Vec<Block<'a>> {
    names
        .iter()
        .zip(data)
        .map(|(n, (d, w))| Block::new(n, d, *w))
        .collect()
}

/// (grouping, block → group, number of groups, per-group bounds, joint bound).
type Case = (Grouping, Vec<usize>, usize, Vec<f64>, Option<f64>);

fn check_forms(batch: usize, threads: usize, weighted: bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(3 + batch as u64);
    let widths = [300, 17, 1, 2048, 64];
    let data = make_blocks(&mut rng, batch, &widths);
    let names: Vec<String> = (0..widths.len()).map(|k| format!("b{k}")).collect();
    let blocks = as_blocks(&names, &data);
    let w: Option<Vec<f64>> = weighted.then(|| {
        (0..batch)
            .map(|i| {
                if i % 5 == 0 {
                    0.0
                } else {
                    rng.random_range(0.0..1.0)
                }
            })
            .collect()
    });
    let wref = w.as_deref();
    // groups: shared {0, 3}, expert a {1, 2}, expert b {4}
    let groups = vec![vec![0, 3], vec![2, 1], vec![4]];
    let block_group = [0, 1, 1, 0, 2];
    let cases: Vec<Case> = vec![
        (
            Grouping::Flat { bound: 0.9 },
            vec![0; 5],
            1,
            vec![0.9],
            Some(0.9),
        ),
        (
            Grouping::Grouped {
                groups: groups.clone(),
                bounds: vec![1.0, 0.3, 2.0],
            },
            block_group.to_vec(),
            3,
            vec![1.0, 0.3, 2.0],
            None,
        ),
        (
            Grouping::PerBlock {
                bounds: vec![0.5, 0.1, 0.2, 1.5, 0.05],
            },
            (0..5).collect(),
            5,
            vec![0.5, 0.1, 0.2, 1.5, 0.05],
            None,
        ),
        (
            Grouping::GlobalOverGroups { groups, bound: 1.1 },
            block_group.to_vec(),
            3,
            vec![1.1; 3],
            Some(1.1),
        ),
    ];
    for (grouping, bg, ng, bounds, joint) in cases {
        let r = reference(&data, &bg, ng, &bounds, joint, wref);
        let out = in_pool(threads, || clip_blocks(&blocks, &grouping, wref).unwrap());
        assert_eq!(out.n_groups(), ng);
        assert_eq!(out.block_group(), bg);
        assert_eq!(out.batch(), batch);
        assert_eq!(out.block_names(), names);
        assert_eq!(out.group_bounds(), bounds);
        for (g, &c) in bounds.iter().enumerate() {
            assert_eq!(out.group_sensitivity(g), Some(c));
        }
        assert_eq!(out.group_sensitivity(ng), None);
        assert_eq!(out.norms().len(), batch * ng);
        assert_eq!(out.factors().len(), batch * ng);
        // The norm over all groups of the weighted record: sqrt(Σ_g norm_g²).
        assert_eq!(out.total_norms().len(), batch);
        for i in 0..batch {
            let want = r.norms[i * ng..(i + 1) * ng]
                .iter()
                .map(|n| n * n)
                .sum::<f64>()
                .sqrt();
            let got = out.total_norms()[i];
            assert!(
                (got - want).abs() <= 1e-9 * want.max(1e-30),
                "total norm {i}: {got} vs {want}"
            );
        }
        for k in 0..widths.len() {
            assert!(
                sum_err(&out.sums()[k], &r.sums[k], &r.abs_sums[k]) < 1e-6,
                "{grouping:?} block {k}"
            );
        }
        for i in 0..batch {
            for g in 0..ng {
                let (a, b) = (out.factor(i, g).unwrap(), r.factors[i * ng + g]);
                assert!(
                    (a - b).abs() <= 1e-9 * b.abs().max(1e-300),
                    "factor {i} {g}: {a} vs {b}"
                );
                let (a, b) = (out.norm(i, g).unwrap(), r.norms[i * ng + g]);
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1e-30),
                    "norm {i} {g}: {a} vs {b}"
                );
            }
        }
        let expect_sens = match joint {
            Some(c) => c,
            None => bounds.iter().map(|c| c * c).sum::<f64>().sqrt(),
        };
        assert!((out.sensitivity() - expect_sens).abs() < 1e-12);
    }
}

#[test]
fn every_grouping_matches_reference() {
    for &(batch, threads) in &[(2, 4), (13, 2), (40, 4)] {
        check_forms(batch, threads, false);
        check_forms(batch, threads, true);
    }
}

#[test]
fn flat_blocks_equal_rows_of_the_concatenation() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let batch = 12;
    let data = make_blocks(&mut rng, batch, &[10, 30]);
    let names = vec!["x".to_string(), "y".to_string()];
    let out = clip_blocks(
        &as_blocks(&names, &data),
        &Grouping::Flat { bound: 0.5 },
        None,
    )
    .unwrap();
    let mut cat = Vec::new();
    for i in 0..batch {
        cat.extend_from_slice(&data[0].0[i * 10..(i + 1) * 10]);
        cat.extend_from_slice(&data[1].0[i * 30..(i + 1) * 30]);
    }
    let rows = clip_rows(&cat, 40, 0.5, None).unwrap();
    let joined: Vec<f32> = out.sums()[0]
        .iter()
        .chain(&out.sums()[1])
        .copied()
        .collect();
    let joined64: Vec<f64> = joined.iter().map(|&x| f64::from(x)).collect();
    assert!(rel_err(rows.sum(), &joined64) < 1e-6);
    assert!(max_rel(rows.factors(), out.factors()) < 1e-12);
}

#[test]
fn zero_weight_and_zero_records_leak_nothing() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let width = 100;
    let mut rows = random_rows(&mut rng, 10, width);
    // record 3 is enormous but has weight 0
    for v in &mut rows[3 * width..4 * width] {
        *v = 1e6;
    }
    let mut w = vec![1.0; 10];
    w[3] = 0.0;
    let with = clip_rows(&rows, width, 1.0, Some(&w)).unwrap();
    let mut without_rows = rows[..3 * width].to_vec();
    without_rows.extend_from_slice(&rows[4 * width..]);
    let without = clip_rows(&without_rows, width, 1.0, None).unwrap();
    let w64: Vec<f64> = without.sum().iter().map(|&x| f64::from(x)).collect();
    assert!(rel_err(with.sum(), &w64) < 1e-6);
    // zero records: zero sum of the right length
    let empty = clip_rows(&[], width, 1.0, None).unwrap();
    assert_eq!(empty.sum(), vec![0.0; width]);
    assert_eq!(empty.batch(), 0);
}

#[test]
fn errors_are_typed() {
    let g = vec![1.0f32; 12];
    assert!(matches!(
        clip_rows(&g, 5, 1.0, None),
        Err(ClipError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        clip_rows(&g, 0, 1.0, None),
        Err(ClipError::ShapeMismatch { .. })
    ));
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            clip_rows(&g, 4, bad, None),
            Err(ClipError::InvalidBound { .. })
        ));
    }
    assert!(matches!(
        clip_rows(&g, 4, 1.0, Some(&[0.5, 1.5, 0.0])),
        Err(ClipError::InvalidWeight { index: 1, .. })
    ));
    assert!(matches!(
        clip_rows(&g, 4, 1.0, Some(&[0.5, f64::NAN, 0.0])),
        Err(ClipError::InvalidWeight { index: 1, .. })
    ));
    assert!(matches!(
        clip_rows(&g, 4, 1.0, Some(&[0.5])),
        Err(ClipError::ShapeMismatch { .. })
    ));
    let a = vec![1.0f32; 6];
    let b = vec![1.0f32; 4];
    let blocks = [Block::new("a", &a, 3), Block::new("b", &b, 1)];
    assert!(matches!(
        clip_blocks(&blocks, &Grouping::Flat { bound: 1.0 }, None),
        Err(ClipError::ShapeMismatch { .. })
    ));
    let b = vec![1.0f32; 2];
    let blocks = [Block::new("a", &a, 3), Block::new("b", &b, 1)];
    let bad_groupings = [
        Grouping::Grouped {
            groups: vec![vec![0]],
            bounds: vec![1.0],
        },
        Grouping::Grouped {
            groups: vec![vec![0, 1, 1]],
            bounds: vec![1.0],
        },
        Grouping::Grouped {
            groups: vec![vec![0, 2]],
            bounds: vec![1.0],
        },
        Grouping::GlobalOverGroups {
            groups: vec![vec![1]],
            bound: 1.0,
        },
    ];
    for gr in &bad_groupings {
        assert!(
            matches!(
                clip_blocks(&blocks, gr, None),
                Err(ClipError::InvalidGrouping { .. })
            ),
            "{gr:?}"
        );
    }
    assert!(matches!(
        clip_blocks(
            &blocks,
            &Grouping::Grouped {
                groups: vec![vec![0, 1]],
                bounds: vec![]
            },
            None
        ),
        Err(ClipError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        clip_blocks(
            &blocks,
            &Grouping::PerBlock {
                bounds: vec![1.0, -2.0]
            },
            None
        ),
        Err(ClipError::InvalidBound { .. })
    ));
    assert!(matches!(
        clip_blocks(&[], &Grouping::Flat { bound: 1.0 }, None),
        Err(ClipError::InvalidGrouping { .. })
    ));
}

/// Seventeen terms that cancel to about 0.06 (their sizes add to 790): the plain sum's relative error is large for any
/// f32 accumulation, but its absolute error stays within the round-off of the terms' sizes.
#[test]
fn a_cancelling_sum_is_within_the_round_off_of_its_terms() {
    let rows: [f32; 17] = [
        -10.408721, 56.228184, 70.791115, -72.073425, -2.0438442, 69.89313, -46.946503, -59.024155,
        -32.82034, 55.136677, -32.626633, 74.23417, -48.285286, 17.056894, 51.98515, -39.466934,
        -51.686905,
    ];
    let out = clip_rows(&rows, 1, 1e9, None).unwrap();
    let plain: f64 = rows.iter().map(|&x| f64::from(x)).sum();
    let scale: f64 = rows.iter().map(|&x| f64::from(x).abs()).sum();
    assert!(plain.abs() < 0.1 && scale > 700.0);
    assert!((f64::from(out.sum()[0]) - plain).abs() <= 17.0 * 6e-8 * scale);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn rows_strategy() -> impl Strategy<Value = (usize, usize, Vec<f32>, f64)> {
        (1usize..20, 1usize..50).prop_flat_map(|(b, p)| {
            (
                Just(b),
                Just(p),
                proptest::collection::vec(-100.0f32..100.0, b * p),
                0.01f64..50.0,
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn clipped_records_respect_the_bound((b, p, rows, c) in rows_strategy()) {
            let out = clip_rows(&rows, p, c, None).unwrap();
            let mut total = 0.0;
            for i in 0..b {
                let f = out.factors()[i];
                prop_assert!((0.0..=1.0).contains(&f));
                let n: f64 = rows[i * p..(i + 1) * p].iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
                prop_assert!(f * n <= c * (1.0 + 1e-9));
                total += f * n;
            }
            let sum_norm: f64 = out.sum().iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
            prop_assert!(sum_norm <= total * (1.0 + 1e-5) + 1e-6);
        }

        #[test]
        fn large_bound_is_plain_sum_and_order_is_irrelevant((b, p, rows, _c) in rows_strategy()) {
            let out = clip_rows(&rows, p, 1e9, None).unwrap();
            let plain: Vec<f64> = (0..p).map(|j| (0..b).map(|i| f64::from(rows[i * p + j])).sum()).collect();
            // A float sum of b terms is off by at most about b·u·Σ|x| (u the unit round-off of
            // f32, 6e-8), whatever the order: that, not the size of the sum, is the scale of a
            // correct answer's error when the terms cancel.
            let scale: Vec<f64> = (0..p).map(|j| (0..b).map(|i| f64::from(rows[i * p + j]).abs()).sum()).collect();
            let tol = |j: usize| 1e-6 * b as f64 * scale[j] + 1e-6;
            for (j, (&x, &y)) in out.sum().iter().zip(&plain).enumerate() {
                prop_assert!((f64::from(x) - y).abs() <= tol(j), "coordinate {j}: {x} vs {y}");
            }
            let mut rev = Vec::with_capacity(rows.len());
            for i in (0..b).rev() {
                rev.extend_from_slice(&rows[i * p..(i + 1) * p]);
            }
            let out2 = clip_rows(&rev, p, 1e9, None).unwrap();
            for (j, (x, y)) in out.sum().iter().zip(out2.sum()).enumerate() {
                prop_assert!(f64::from((x - y).abs()) <= 2.0 * tol(j), "coordinate {j}: {x} vs {y}");
            }
        }

        #[test]
        fn weight_then_clip_is_clip_of_scaled_rows((b, p, rows, c) in rows_strategy(), w in 0.0f64..=1.0) {
            let weights = vec![w; b];
            let out = clip_rows(&rows, p, c, Some(&weights)).unwrap();
            let scaled: Vec<f32> = rows.iter().map(|&x| (f64::from(x) * w) as f32).collect();
            let direct = clip_rows(&scaled, p, c, None).unwrap();
            for (x, y) in out.sum().iter().zip(direct.sum()) {
                prop_assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()));
            }
        }
    }
}

/// Snapshot of a small RAPTOR-like grouped clip (rounded); the same numbers are checked
/// against the per-example reference in `every_grouping_matches_reference`.
#[test]
fn grouped_clip_snapshot() {
    let shared: Vec<f32> = (0..12).map(|k| ((k * 7 % 5) as f32 - 2.0) * 0.5).collect();
    let expert: Vec<f32> = (0..6).map(|k| (k as f32 - 2.5) * 0.8).collect();
    let blocks = [
        Block::new("attn.lora_a", &shared, 4),
        Block::new("expert0.w", &expert, 2),
    ];
    let grouping = Grouping::Grouped {
        groups: vec![vec![0], vec![1]],
        bounds: vec![1.0, 1.5],
    };
    let out = clip_blocks(&blocks, &grouping, Some(&[1.0, 0.5, 0.25])).unwrap();
    let round = |v: &[f64]| {
        v.iter()
            .map(|x| (x * 1e6).round() / 1e6)
            .collect::<Vec<_>>()
    };
    let sums: Vec<Vec<f64>> = out
        .sums()
        .iter()
        .map(|s| round(&s.iter().map(|&x| f64::from(x)).collect::<Vec<_>>()))
        .collect();
    let json = serde_json_like(
        &[
            ("norms", round(out.norms())),
            ("factors", round(out.factors())),
        ],
        &sums,
    );
    insta::assert_snapshot!(json);
}

fn serde_json_like(fields: &[(&str, Vec<f64>)], sums: &[Vec<f64>]) -> String {
    let mut s = String::new();
    for (k, v) in fields {
        s.push_str(&format!("{k}: {v:?}\n"));
    }
    for (i, v) in sums.iter().enumerate() {
        s.push_str(&format!("sum[{i}]: {v:?}\n"));
    }
    s
}

/// A non-finite per-record gradient does not abort the step (an error naming the record would
/// be an event that depends on private data): the record contributes zero (factor 0, so it
/// stays within its bound), with or without weights, in every thread count, and the other
/// records' clipped sum is unchanged.
#[test]
fn non_finite_records_contribute_zero() {
    let g: Vec<f32> = (0..12).map(|k| 0.1 * (k as f32 + 1.0)).collect();
    let without: Vec<f32> = g[..8].to_vec(); // records 0 and 1 only
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut h = g.clone();
        h[9] = bad; // record 2
        for threads in [1, 4] {
            for weights in [None, Some(&[1.0, 0.5, 0.0][..]), Some(&[1.0, 0.5, 1.0][..])] {
                let out = in_pool(threads, || clip_rows(&h, 4, 1.0, weights)).unwrap();
                let w2 = weights.map(|w| &w[..2]);
                let reference = clip_rows(&without, 4, 1.0, w2).unwrap();
                assert_eq!(out.factor(2), Some(0.0));
                assert!(!&out.norms()[2].is_finite() || weights.is_some());
                for (x, y) in out.sum().iter().zip(reference.sum()) {
                    assert!((x - y).abs() < 1e-6, "{bad} t={threads}: {x} vs {y}");
                }
            }
        }
        // blocks: a non-finite entry in one group zeroes the record in every group
        let e = vec![0.5f32; 3];
        let blocks = [Block::new("a", &h, 4), Block::new("e", &e, 1)];
        let grouping = Grouping::Grouped {
            groups: vec![vec![0], vec![1]],
            bounds: vec![1.0, 1.0],
        };
        let out = clip_blocks(&blocks, &grouping, None).unwrap();
        assert_eq!(out.factor(2, 0), Some(0.0));
        assert_eq!(out.factor(2, 1), Some(0.0));
        assert!(
            (&out.sums()[1][0] - 1.0).abs() < 1e-6,
            "{:?}",
            &out.sums()[1]
        );
        assert!(&out.sums()[0].iter().all(|x| x.is_finite()));
    }
}

/// A record with an infinite entry (and no NaN) has total norm +∞; its group norms are reported
/// as computed (the weighted norm, w·‖g‖, finite in the groups without the infinite entry),
/// and its factors are 0 everywhere.
#[test]
fn non_finite_records_report_their_norms() {
    let a = [0.6f32, 0.8, 3.0, f32::INFINITY];
    let e = [2.0f32, 4.0];
    let blocks = [Block::new("a", &a, 2), Block::new("e", &e, 1)];
    let grouping = Grouping::Grouped {
        groups: vec![vec![0], vec![1]],
        bounds: vec![1.0, 1.0],
    };
    let w = [0.5, 0.25];
    let out = clip_blocks(&blocks, &grouping, Some(&w)).unwrap();
    assert_eq!(out.total_norms()[1], f64::INFINITY);
    assert_eq!(out.norm(1, 0), Some(f64::INFINITY));
    assert_eq!(out.norm(1, 1), Some(0.25 * 4.0));
    assert_eq!((out.factor(1, 0), out.factor(1, 1)), (Some(0.0), Some(0.0)));
    // Record 0 is finite: norms 0.5·1 and 0.5·2, factors 0.5·1 and 0.5·(1/1).
    assert!((out.norm(0, 0).unwrap() - 0.5).abs() < 1e-7);
    assert!((out.norm(0, 1).unwrap() - 1.0).abs() < 1e-12);
    assert!((out.total_norms()[0] - 0.5 * 5f64.sqrt()).abs() < 1e-7);
    assert!((out.sums()[1][0] - 1.0).abs() < 1e-6);
    // One row: a NaN entry gives a NaN total norm, never a finite one.
    let rows = clip_rows(&[f32::NAN, 1.0], 2, 1.0, None).unwrap();
    assert!(rows.norms()[0].is_nan());
    assert_eq!(rows.factors(), &[0.0]);
}

/// The bound a row clip reports is the bound it clipped to, and it is the sensitivity; the
/// joint sensitivity of independently clipped parts is sqrt(Σ C²).
#[test]
fn bounds_and_sensitivities_are_reported() {
    let g = [3.0f32, 4.0, 0.3, 0.4];
    for c in [0.25, 1.0, 7.5] {
        let rows = clip_rows(&g, 2, c, None).unwrap();
        assert_eq!(rows.bound(), c);
        assert_eq!(rows.sensitivity(), c);
        // Record 0 has norm 5 exactly: factor min(1, C/5); record 1 has norm 0.5 (to f32
        // rounding of 0.3 and 0.4).
        assert_eq!(rows.factor(0), Some(if c < 5.0 { c / 5.0 } else { 1.0 }));
        assert_eq!(rows.norm(0), Some(5.0));
        let n1 = rows.norm(1).unwrap();
        assert!((n1 - 0.5).abs() < 1e-7);
        assert_eq!(rows.factor(1), Some(if n1 > c { c / n1 } else { 1.0 }));
    }
    assert_eq!(raptor_clip::joint_sensitivity(&[3.0, 4.0]), 5.0);
    assert_eq!(raptor_clip::joint_sensitivity(&[2.0]), 2.0);
    assert_eq!(raptor_clip::joint_sensitivity(&[]), 0.0);
    let s = raptor_clip::joint_sensitivity(&[0.5, 1.5, 2.5]);
    assert!((s - (0.25f64 + 2.25 + 6.25).sqrt()).abs() < 1e-15);
}

/// The per-record accessors of the slice outputs return `None` out of range instead of
/// panicking, and so does a group's sensitivity.
#[test]
fn accessors_are_checked() {
    let g = [3.0f32, 4.0, 0.3, 0.4];
    let rows = clip_rows(&g, 2, 1.0, None).unwrap();
    assert_eq!(rows.factor(2), None);
    assert_eq!(rows.norm(usize::MAX), None);
    assert!(rows.factor(1).is_some());
    let a = [1.0f32, 2.0];
    let blocks = [Block::new("a", &a, 1)];
    let out = clip_blocks(&blocks, &Grouping::Flat { bound: 1.0 }, None).unwrap();
    assert_eq!(out.norm(0, 1), None);
    assert_eq!(out.factor(2, 0), None);
    assert_eq!(out.factor(usize::MAX, usize::MAX), None);
    assert_eq!(out.group_sensitivity(1), None);
    assert_eq!(out.group_sensitivity(0), Some(1.0));
    assert!(out.factor(1, 0).is_some());
}

/// A block whose data is not a whole number of records of its width (or whose width is 0) is
/// a shape error, whatever the other blocks hold.
#[test]
fn blocks_of_a_broken_shape_are_errors() {
    let ok = [1.0f32, 2.0];
    let seven = [0.5f32; 7];
    let flat = Grouping::Flat { bound: 1.0 };
    for bad in [
        Block::new("seven", &seven, 3),
        Block::new("zero-width", &[], 0),
        Block::new("zero-width-data", &ok, 0),
    ] {
        let r = clip_blocks(&[Block::new("ok", &ok, 1), bad], &flat, None);
        assert!(matches!(r, Err(ClipError::ShapeMismatch { .. })), "{r:?}");
    }
}
