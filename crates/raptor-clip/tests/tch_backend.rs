#![allow(clippy::unwrap_used, clippy::expect_used)]
//! libtorch backend: agreement with the slice backend, and the linear-layer kernels against
//! loops of explicit per-example outer products (with token masks).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use raptor_clip::linear::{
    NormMethod, bias_per_example_sq_norms, bias_weighted_grad_sum, clip_coefficients,
    linear_per_example_sq_norms, linear_per_example_sq_norms_with, linear_weighted_grad_sum,
};
use raptor_clip::{Block, ClipError, Grouping, Privatizer, PublicDenominator, tensor};
use tch::{Device, Kind, Tensor};

fn devices() -> Vec<Device> {
    let mut d = vec![Device::Cpu];
    if tch::Cuda::is_available() {
        d.push(Device::Cuda(0));
    } else {
        eprintln!("CUDA cases skipped: no CUDA device visible to libtorch (CPU cases run)");
    }
    d
}

fn rand_vec(rng: &mut ChaCha8Rng, n: usize, scale: f64) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.random_range(-1.0..1.0) * scale) as f32)
        .collect()
}

fn to_vec64(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.to_kind(Kind::Double).to_device(Device::Cpu).reshape([-1])).unwrap()
}

fn rel(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt();
    let den: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    num / den.max(1e-300)
}

#[test]
fn rows_agree_with_slice_backend() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (b, p) = (24, 301);
    let mut rows = Vec::new();
    for i in 0..b {
        rows.extend(rand_vec(&mut rng, p, 0.01 * (1.5f64).powi(i)));
    }
    let w: Vec<f64> = (0..b)
        .map(|i| {
            if i == 2 {
                0.0
            } else {
                rng.random_range(0.0..1.0)
            }
        })
        .collect();
    for dev in devices() {
        let t = Tensor::from_slice(&rows)
            .reshape([b as i64, p as i64])
            .to_device(dev);
        let wt = Tensor::from_slice(&w).to_device(dev);
        for weights in [None, Some(&w)] {
            let s = raptor_clip::clip_rows(&rows, p, 0.8, weights.map(|v| v.as_slice())).unwrap();
            let o = tensor::clip_rows(&t, 0.8, weights.map(|_| &wt)).unwrap();
            let s_sum: Vec<f64> = s.sum().iter().map(|&x| f64::from(x)).collect();
            assert!(rel(&to_vec64(&o.sum), &s_sum) < 1e-6);
            assert!(rel(&to_vec64(&o.factors), s.factors()) < 1e-6);
            assert!(rel(&to_vec64(&o.norms), s.norms()) < 1e-6);
        }
    }
}

#[test]
fn blocks_agree_with_slice_backend_in_every_grouping() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let b = 10;
    let widths = [40usize, 3, 128];
    let data: Vec<Vec<f32>> = widths
        .iter()
        .map(|&w| rand_vec(&mut rng, b * w, 0.3))
        .collect();
    let w: Vec<f64> = (0..b).map(|_| rng.random_range(0.0..1.0)).collect();
    let groups = vec![vec![0, 2], vec![1]];
    let groupings = [
        Grouping::Flat { bound: 1.0 },
        Grouping::Grouped {
            groups: groups.clone(),
            bounds: vec![0.5, 0.2],
        },
        Grouping::PerBlock {
            bounds: vec![0.3, 0.1, 0.6],
        },
        Grouping::GlobalOverGroups { groups, bound: 0.9 },
    ];
    let names = ["w0", "w1", "w2"];
    let blocks: Vec<Block<'_>> = (0..3)
        .map(|k| Block::new(names[k], &data[k], widths[k]))
        .collect();
    for dev in devices() {
        let tensors: Vec<Tensor> = (0..3)
            .map(|k| {
                Tensor::from_slice(&data[k])
                    .reshape([b as i64, widths[k] as i64])
                    .to_device(dev)
            })
            .collect();
        let tb: Vec<(&str, &Tensor)> = (0..3).map(|k| (names[k], &tensors[k])).collect();
        let wt = Tensor::from_slice(&w).to_device(dev);
        for g in &groupings {
            for weights in [None, Some(&w)] {
                let s =
                    raptor_clip::clip_blocks(&blocks, g, weights.map(|v| v.as_slice())).unwrap();
                let o = tensor::clip_blocks(&tb, g, weights.map(|_| &wt)).unwrap();
                for k in 0..3 {
                    let ss: Vec<f64> = s.sums()[k].iter().map(|&x| f64::from(x)).collect();
                    assert!(rel(&to_vec64(&o.sums[k]), &ss) < 1e-6, "{g:?} {k}");
                }
                assert!(rel(&to_vec64(&o.factors), s.factors()) < 1e-6);
                assert!(rel(&to_vec64(&o.norms), s.norms()) < 1e-6);
                assert!(rel(&to_vec64(&o.total_norms), s.total_norms()) < 1e-6);
                assert!((o.sensitivity() - s.sensitivity()).abs() < 1e-12);
            }
        }
    }
}

/// Explicit per-example gradients G_i = Σ_t m_it g_itᵀ a_it, in f64, by loops.
fn explicit_grads(
    a: &[f64],
    g: &[f64],
    mask: &[f64],
    b: usize,
    t: usize,
    din: usize,
    dout: usize,
) -> Vec<Vec<f64>> {
    (0..b)
        .map(|i| {
            let mut gi = vec![0.0; dout * din];
            for s in 0..t {
                let m = mask[i * t + s];
                if m == 0.0 {
                    continue;
                }
                for o in 0..dout {
                    for k in 0..din {
                        gi[o * din + k] += g[(i * t + s) * dout + o] * a[(i * t + s) * din + k];
                    }
                }
            }
            gi
        })
        .collect()
}

#[test]
fn ghost_materialized_and_loop_agree_with_masks() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for &(b, t, din, dout) in &[(3usize, 5usize, 4usize, 6usize), (4, 1, 7, 2), (2, 9, 3, 3)] {
        let a: Vec<f64> = (0..b * t * din)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let g: Vec<f64> = (0..b * t * dout)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mask: Vec<f64> = (0..b * t)
            .map(|k| if k % 3 == 1 { 0.0 } else { 1.0 })
            .collect();
        let grads = explicit_grads(&a, &g, &mask, b, t, din, dout);
        let ref_sq: Vec<f64> = grads
            .iter()
            .map(|gi| gi.iter().map(|x| x * x).sum())
            .collect();
        let coef: Vec<f64> = (0..b).map(|_| rng.random_range(0.0..1.0)).collect();
        let mut ref_sum = vec![0.0; dout * din];
        for i in 0..b {
            for (s, x) in ref_sum.iter_mut().zip(&grads[i]) {
                *s += coef[i] * x;
            }
        }
        // bias: Σ_t m g_t
        let bias: Vec<Vec<f64>> = (0..b)
            .map(|i| {
                (0..dout)
                    .map(|o| {
                        (0..t)
                            .map(|s| mask[i * t + s] * g[(i * t + s) * dout + o])
                            .sum()
                    })
                    .collect()
            })
            .collect();
        let ref_bsq: Vec<f64> = bias.iter().map(|v| v.iter().map(|x| x * x).sum()).collect();
        let ref_bsum: Vec<f64> = (0..dout)
            .map(|o| (0..b).map(|i| coef[i] * bias[i][o]).sum())
            .collect();
        for dev in devices() {
            let at = Tensor::from_slice(&a)
                .reshape([b as i64, t as i64, din as i64])
                .to_device(dev);
            let gt = Tensor::from_slice(&g)
                .reshape([b as i64, t as i64, dout as i64])
                .to_device(dev);
            let mf = Tensor::from_slice(&mask)
                .reshape([b as i64, t as i64])
                .to_device(dev);
            let mb = mf.gt(0.5);
            let ct = Tensor::from_slice(&coef).to_device(dev);
            for m in [&mf, &mb] {
                for method in [
                    NormMethod::Ghost,
                    NormMethod::Materialized,
                    NormMethod::Auto,
                ] {
                    let sq = linear_per_example_sq_norms_with(&at, &gt, Some(m), method).unwrap();
                    assert_eq!(sq.kind(), Kind::Double);
                    assert!(rel(&to_vec64(&sq), &ref_sq) < 1e-12, "{method:?}");
                }
                let sum = linear_weighted_grad_sum(&at, &gt, &ct, Some(m)).unwrap();
                assert_eq!(sum.size(), [dout as i64, din as i64]);
                assert!(rel(&to_vec64(&sum), &ref_sum) < 1e-12);
                assert!(
                    rel(
                        &to_vec64(&bias_per_example_sq_norms(&gt, Some(m)).unwrap()),
                        &ref_bsq
                    ) < 1e-12
                );
                assert!(
                    rel(
                        &to_vec64(&bias_weighted_grad_sum(&gt, &ct, Some(m)).unwrap()),
                        &ref_bsum
                    ) < 1e-12
                );
            }
            // f32 inputs: f32 output within 1e-5
            let sq32 = linear_per_example_sq_norms(
                &at.to_kind(Kind::Float),
                &gt.to_kind(Kind::Float),
                Some(&mb),
            )
            .unwrap();
            assert_eq!(sq32.kind(), Kind::Float);
            assert!(rel(&to_vec64(&sq32), &ref_sq) < 1e-5);
        }
    }
}

#[test]
fn masked_tokens_are_ignored_even_if_non_finite() {
    let a = Tensor::from_slice(&[1.0f32, 2.0, f32::NAN, 4.0]).reshape([1, 2, 2]);
    let g = Tensor::from_slice(&[1.0f32, f32::INFINITY]).reshape([1, 2, 1]);
    let mask = Tensor::from_slice(&[true, false]).reshape([1, 2]);
    let sq = linear_per_example_sq_norms(&a, &g, Some(&mask)).unwrap();
    assert!((to_vec64(&sq)[0] - 5.0).abs() < 1e-6);
    // unmasked, the record is non-finite: no error naming it, a non-finite norm instead
    let r = linear_per_example_sq_norms(&a, &g, None).unwrap();
    assert!(!to_vec64(&r)[0].is_finite());
    let coef = Tensor::from_slice(&[0.5f32]);
    let s = linear_weighted_grad_sum(&a, &g, &coef, Some(&mask)).unwrap();
    assert_eq!(to_vec64(&s), vec![0.5, 1.0]);
}

#[test]
fn zero_coefficient_records_contribute_nothing() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let a = Tensor::from_slice(&rand_vec(&mut rng, 3 * 4 * 5, 1.0)).reshape([3, 4, 5]);
    let g = Tensor::from_slice(&rand_vec(&mut rng, 3 * 4 * 2, 1.0)).reshape([3, 4, 2]);
    let coef = Tensor::from_slice(&[1.0f32, 0.0, 1.0]);
    let all = linear_weighted_grad_sum(&a, &g, &coef, None).unwrap();
    let idx = Tensor::from_slice(&[0i64, 2]);
    let sub = linear_weighted_grad_sum(
        &a.index_select(0, &idx),
        &g.index_select(0, &idx),
        &Tensor::from_slice(&[1.0f32, 1.0]),
        None,
    )
    .unwrap();
    assert!(rel(&to_vec64(&all), &to_vec64(&sub)) < 1e-6);
}

#[test]
fn clip_coefficients_match_formula() {
    let sq = [0.0f64, 0.25, 4.0, 100.0];
    let w = [1.0f64, 0.5, 0.5, 0.0];
    let c = 1.0;
    let t = clip_coefficients(&Tensor::from_slice(&sq), c, None).unwrap();
    let expect: Vec<f64> = sq
        .iter()
        .map(|&n| (c / (n.sqrt() + 1e-12)).min(1.0))
        .collect();
    assert!(rel(&to_vec64(&t), &expect) < 1e-12);
    let t = clip_coefficients(&Tensor::from_slice(&sq), c, Some(&Tensor::from_slice(&w))).unwrap();
    let expect: Vec<f64> = sq
        .iter()
        .zip(&w)
        .map(|(&n, &w)| w * (c / (w * n.sqrt() + 1e-12)).min(1.0))
        .collect();
    assert!(rel(&to_vec64(&t), &expect) < 1e-12);
    // f32 in, f32 out
    let t32 = clip_coefficients(&Tensor::from_slice(&[4.0f32]), 1.0, None).unwrap();
    assert_eq!(t32.kind(), Kind::Float);
}

#[test]
fn tch_errors_are_typed() {
    let sq = Tensor::from_slice(&[1.0f32, 2.0]);
    assert!(matches!(
        clip_coefficients(&sq, 0.0, None),
        Err(ClipError::InvalidBound { .. })
    ));
    assert!(matches!(
        clip_coefficients(&sq, -1.0, None),
        Err(ClipError::InvalidBound { .. })
    ));
    assert!(matches!(
        clip_coefficients(&sq, 1.0, Some(&Tensor::from_slice(&[0.5f32, 1.5]))),
        Err(ClipError::InvalidWeight { index: 1, .. })
    ));
    assert!(matches!(
        clip_coefficients(&sq, 1.0, Some(&Tensor::from_slice(&[0.5f32]))),
        Err(ClipError::ShapeMismatch { .. })
    ));
    let c = clip_coefficients(&Tensor::from_slice(&[f32::NAN, 4.0]), 1.0, None).unwrap();
    assert_eq!(to_vec64(&c)[0], 0.0);
    assert!((to_vec64(&c)[1] - 0.5).abs() < 1e-6);
    let a = Tensor::zeros([2, 3, 4], (Kind::Float, Device::Cpu));
    let g = Tensor::zeros([2, 2, 5], (Kind::Float, Device::Cpu));
    assert!(matches!(
        linear_per_example_sq_norms(&a, &g, None),
        Err(ClipError::ShapeMismatch { .. })
    ));
    let g = Tensor::zeros([2, 3, 5], (Kind::Float, Device::Cpu));
    let bad_mask = Tensor::zeros([2, 2], (Kind::Float, Device::Cpu));
    assert!(matches!(
        linear_per_example_sq_norms(&a, &g, Some(&bad_mask)),
        Err(ClipError::ShapeMismatch { .. })
    ));
    let half_mask = Tensor::full([2, 3], 0.5, (Kind::Float, Device::Cpu));
    assert!(matches!(
        linear_per_example_sq_norms(&a, &g, Some(&half_mask)),
        Err(ClipError::InvalidMask { .. })
    ));
    assert!(matches!(
        linear_weighted_grad_sum(&a, &g, &Tensor::from_slice(&[1.0f32]), None),
        Err(ClipError::ShapeMismatch { .. })
    ));
    let rows = Tensor::from_slice(&[1.0f32, f32::INFINITY, 0.0, 1.0]).reshape([2, 2]);
    let out = tensor::clip_rows(&rows, 1.0, None).unwrap();
    assert_eq!(to_vec64(&out.factors)[0], 0.0);
    assert_eq!(to_vec64(&out.sum), vec![0.0, 1.0]);
    assert!(matches!(
        tensor::clip_rows(
            &Tensor::ones([2, 2], (Kind::Float, Device::Cpu)),
            1.0,
            Some(&Tensor::from_slice(&[-0.1f32, 1.0]))
        ),
        Err(ClipError::InvalidWeight { index: 0, .. })
    ));
}

/// Same statistics as the slice privatizer test: 6 standard errors, false-positive rate < 1e-8.
#[test]
fn tensor_release_noise_std_and_denominator() {
    let n = 200_000i64;
    let zeros = Tensor::zeros([n], (Kind::Float, Device::Cpu));
    let d = PublicDenominator::new(3.0).unwrap();
    let r = Privatizer::new(2.0)
        .unwrap()
        .release_tensor(&zeros, 0.5, d)
        .unwrap();
    let v = to_vec64(&r);
    let m = v.iter().sum::<f64>() / n as f64;
    let s = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n as f64 - 1.0)).sqrt();
    let expected = 2.0 * 0.5 / 3.0;
    assert!((s / expected - 1.0).abs() < 6.0 / (2.0 * (n as f64 - 1.0)).sqrt());
    assert!(m.abs() < 6.0 * expected / (n as f64).sqrt());
    // the sum is divided by the public denominator
    let sum = Tensor::from_slice(&[3.0f32, -6.0]);
    let a = Privatizer::seeded_insecure(1.0, 9)
        .unwrap()
        .release_tensor(&sum, 1.0, d)
        .unwrap();
    let z = Privatizer::seeded_insecure(1.0, 9)
        .unwrap()
        .release_tensor(&sum.zeros_like(), 1.0, d)
        .unwrap();
    let diff: Vec<f64> = to_vec64(&(a - z)).iter().map(|x| x * 3.0).collect();
    assert!((diff[0] - 3.0).abs() < 1e-5 && (diff[1] + 6.0).abs() < 1e-5);
}

/// Non-finite records contribute zero on the tensor path as on the slice path (same factors,
/// same sums), in every clipping form, and the linear kernels leave them out of the weighted
/// sums.
#[test]
fn non_finite_records_contribute_zero_like_the_slice_path() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (b, w1, w2) = (5usize, 6usize, 3usize);
    let mut x1 = rand_vec(&mut rng, b * w1, 2.0);
    let x2 = rand_vec(&mut rng, b * w2, 2.0);
    for bad in [f32::NAN, f32::INFINITY] {
        x1[2 * w1 + 4] = bad; // record 2
        let blocks = [Block::new("a", &x1, w1), Block::new("e", &x2, w2)];
        let t1 = Tensor::from_slice(&x1).reshape([b as i64, w1 as i64]);
        let t2 = Tensor::from_slice(&x2).reshape([b as i64, w2 as i64]);
        let groupings = [
            Grouping::Flat { bound: 1.0 },
            Grouping::Grouped {
                groups: vec![vec![0], vec![1]],
                bounds: vec![1.0, 0.5],
            },
        ];
        for grouping in &groupings {
            let s = raptor_clip::clip_blocks(&blocks, grouping, None).unwrap();
            let t = tensor::clip_blocks(&[("a", &t1), ("e", &t2)], grouping, None).unwrap();
            assert_eq!(s.factor(2, 0), Some(0.0));
            assert!(rel(&to_vec64(&t.factors), s.factors()) < 1e-6);
            for (k, sum) in t.sums.iter().enumerate() {
                let want: Vec<f64> = s.sums()[k].iter().map(|&v| f64::from(v)).collect();
                assert!(rel(&to_vec64(sum), &want) < 1e-5, "{grouping:?} block {k}");
            }
        }
        let s = raptor_clip::clip_rows(&x1, w1, 1.0, None).unwrap();
        let t = tensor::clip_rows(&t1, 1.0, None).unwrap();
        let want: Vec<f64> = s.sum().iter().map(|&v| f64::from(v)).collect();
        assert!(rel(&to_vec64(&t.sum), &want) < 1e-5);
        // linear kernels: the record's norm is non-finite, its coefficient 0, the sum finite
        let a = Tensor::from_slice(&x1).reshape([b as i64, 2, 3]);
        let g = Tensor::from_slice(&rand_vec(&mut rng, b * 2, 1.0)).reshape([b as i64, 2, 1]);
        let sq = linear_per_example_sq_norms(&a, &g, None).unwrap();
        let c = clip_coefficients(&sq, 1.0, None).unwrap();
        assert_eq!(to_vec64(&c)[2], 0.0);
        let sum = linear_weighted_grad_sum(&a, &g, &c, None).unwrap();
        assert!(to_vec64(&sum).iter().all(|v| v.is_finite()));
        let bsum = bias_weighted_grad_sum(&a, &c, None).unwrap();
        assert!(to_vec64(&bsum).iter().all(|v| v.is_finite()));
    }
}

/// bf16/f16 gradients: norms and factors are computed in f32/f64, so a record whose norm
/// rounds below C in the input dtype is still clipped, and no clipped record (factor times
/// its exactly represented entries, in f64) exceeds C. With norms taken in bf16 (8-bit
/// mantissa) this fails: the bf16 norm of these records is below C although the true norm
/// is above it, so they pass unclipped.
#[test]
fn half_precision_records_never_exceed_the_bound() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for kind in [Kind::BFloat16, Kind::Half] {
        let (b, p) = (64usize, 257usize);
        let x = rand_vec(&mut rng, b * p, 1.0);
        let t = Tensor::from_slice(&x)
            .reshape([b as i64, p as i64])
            .to_kind(kind);
        // the exact values the tensor holds, in f64
        let exact = to_vec64(&t);
        let norms: Vec<f64> = (0..b)
            .map(|i| {
                exact[i * p..(i + 1) * p]
                    .iter()
                    .map(|v| v * v)
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        for &c in &norms {
            // bounds at (and just under) each record's true norm: the hardest cases
            for bound in [c, c * (1.0 - 1e-3), c * (1.0 - 4e-3)] {
                let out = tensor::clip_rows(&t, bound, None).unwrap();
                let f = to_vec64(&out.factors);
                for i in 0..b {
                    let clipped = f[i] * norms[i];
                    assert!(
                        clipped <= bound * (1.0 + 1e-6),
                        "{kind:?}: record {i} has norm {clipped} > C = {bound}"
                    );
                }
                let blocks =
                    tensor::clip_blocks(&[("w", &t)], &Grouping::Flat { bound }, None).unwrap();
                let f = to_vec64(&blocks.factors);
                for i in 0..b {
                    assert!(
                        f[i] * norms[i] <= bound * (1.0 + 1e-6),
                        "{kind:?} blocks: {i}"
                    );
                }
            }
        }
    }
}

/// The tensor release draws the same noise, in the same order, as the slice release of a
/// privatizer with the same seed (one hardened sampler for both paths).
#[test]
fn tensor_and_slice_releases_draw_the_same_noise() {
    let sum = [0.5f32, -1.0, 2.0, 0.0, 3.0, 1.5];
    let d = PublicDenominator::new(2.0).unwrap();
    let mut a = Privatizer::seeded_insecure(1.3, 77).unwrap();
    let mut b = Privatizer::seeded_insecure(1.3, 77).unwrap();
    let r = a.release(&[("x", &sum)], 0.7, d).unwrap();
    assert!(r.is_seeded_insecure());
    let t = b
        .release_tensor(&Tensor::from_slice(&sum).to_kind(Kind::Double), 0.7, d)
        .unwrap();
    let tv = to_vec64(&t);
    for (x, y) in r.values().iter().zip(&tv) {
        assert!(
            (f64::from(*x) - y).abs() < 1e-5 * (1.0 + y.abs()),
            "{x} vs {y}"
        );
    }
}

/// Several tensors released together get the noise of one slice release of their concatenation
/// from a privatizer with the same seed, bitwise, for f32 sums: short releases (the same draws
/// as consecutive single releases) and long ones (drawn in parallel chunks).
#[test]
fn releasing_tensors_together_is_one_release_of_their_concatenation() {
    let d = PublicDenominator::new(3.0).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for (na, nb) in [(5usize, 7usize), (raptor_clip::NOISE_CHUNK, 1000)] {
        let a: Vec<f32> = rand_vec(&mut rng, na, 2.0);
        let b: Vec<f32> = rand_vec(&mut rng, nb, 2.0);
        let ta = Tensor::from_slice(&a).reshape([-1, 1]);
        let tb = Tensor::from_slice(&b);
        let together = Privatizer::seeded_insecure(1.5, 4)
            .unwrap()
            .release_tensors(&[&ta, &tb], 0.8, d)
            .unwrap();
        assert_eq!(together[0].size(), ta.size());
        assert_eq!(together[0].kind(), Kind::Float);
        let cat: Vec<f32> = a.iter().chain(&b).copied().collect();
        let slice = Privatizer::seeded_insecure(1.5, 4)
            .unwrap()
            .release(&[("x", &cat)], 0.8, d)
            .unwrap();
        let got: Vec<f32> = [&together[0], &together[1]]
            .iter()
            .flat_map(|t| Vec::<f32>::try_from(t.reshape([-1])).unwrap())
            .collect();
        assert_eq!(got, slice.values(), "{na} + {nb}");
        if na + nb <= raptor_clip::NOISE_CHUNK {
            let mut p = Privatizer::seeded_insecure(1.5, 4).unwrap();
            let one = p.release_tensor(&ta, 0.8, d).unwrap();
            let two = p.release_tensor(&tb, 0.8, d).unwrap();
            assert!(one.equal(&together[0]) && two.equal(&together[1]));
        }
    }
}

/// The typed release: its sensitivity is the policy's for its groups, its noise the same draws
/// as `release_tensors` at that sensitivity, and a release that is not whole (a parameter of
/// its group missing, a parameter of another group, an unknown parameter, a repeat) is refused.
#[test]
fn clipped_sums_carry_the_policys_sensitivity_into_a_typed_release() {
    use raptor_clip::tensor::ClippedSum;
    use raptor_clip::{ClipPolicy, ParamGroups};
    let mut groups = ParamGroups::new();
    groups.assign("s.a", "shared");
    groups.assign("s.b", "shared");
    groups.assign("e.w", "expert0");
    let policy = ClipPolicy::RoleWise([("shared", 3.0), ("expert0", 4.0)].into());
    let t = |v: &[f32]| Tensor::from_slice(v);
    let parts = || {
        vec![
            ("s.a".to_string(), t(&[1.0, 2.0])),
            ("s.b".to_string(), t(&[0.5])),
            ("e.w".to_string(), t(&[3.0, -1.0, 0.0])),
        ]
    };
    let d = PublicDenominator::new(8.0).unwrap();
    let both = ClippedSum::new(&groups, &policy, &["shared", "expert0"], parts()).unwrap();
    assert_eq!(both.sensitivity(), 5.0);
    let released = Privatizer::seeded_insecure(1.3, 17)
        .unwrap()
        .release_clipped(both, d)
        .unwrap();
    assert_eq!(released.sensitivity(), 5.0);
    assert_eq!(released.noise_multiplier(), 1.3);
    assert!((released.released_noise_std() - 1.3 * 5.0 / 8.0).abs() < 1e-15);
    assert!(released.is_seeded_insecure());
    let ps = parts();
    let refs: Vec<&Tensor> = ps.iter().map(|(_, t)| t).collect();
    let by_hand = Privatizer::seeded_insecure(1.3, 17)
        .unwrap()
        .release_tensors(&refs, 5.0, d)
        .unwrap();
    assert_eq!(released.names(), ["s.a", "s.b", "e.w"]);
    assert_eq!(released.groups(), ["shared", "expert0"]);
    for (a, b) in released.tensors().iter().zip(&by_hand) {
        assert!(a.equal(b));
    }
    // One group alone: its own bound.
    let expert = ClippedSum::new(&groups, &policy, &["expert0"], vec![parts().remove(2)]).unwrap();
    assert_eq!(expert.sensitivity(), 4.0);
    // A global policy: the one bound whatever the groups.
    let global = ClippedSum::new(
        &groups,
        &ClipPolicy::Global(2.0),
        &["expert0"],
        vec![parts().remove(2)],
    )
    .unwrap();
    assert_eq!(global.sensitivity(), 2.0);
    // Releases that are not whole.
    let refused = |rg: &[&str], ps: Vec<(String, Tensor)>| {
        ClippedSum::new(&groups, &policy, rg, ps)
            .unwrap_err()
            .to_string()
    };
    let mut missing = parts();
    drop(missing.remove(1));
    assert!(
        refused(&["shared", "expert0"], missing)
            .contains("s.b of released group shared is missing")
    );
    assert!(refused(&["shared"], parts()).contains("e.w of group expert0 is not in this release"));
    let mut unknown = parts();
    unknown.push(("zz".into(), t(&[1.0])));
    assert!(refused(&["shared", "expert0"], unknown).contains("zz is in no group"));
    let mut twice = parts();
    twice.push(("s.a".into(), t(&[1.0, 2.0])));
    assert!(refused(&["shared", "expert0"], twice).contains("twice"));
    assert!(refused(&["expert1"], vec![]).contains("no clipping bound for group expert1"));
    assert!(refused(&[], vec![]).contains("no group"));
    // A bad bound of a released group is an error (the whole policy is checked by the engine
    // before clipping; a release checks its own groups' bounds).
    let bad = ClipPolicy::RoleWise([("shared", 3.0), ("expert0", f64::NAN)].into());
    let e = ClippedSum::new(&groups, &bad, &["expert0"], vec![parts().remove(2)]).unwrap_err();
    assert!(e.to_string().contains("expert0"), "{e}");
}
