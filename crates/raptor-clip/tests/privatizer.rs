#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Gaussian privatizer: noise std, public denominators, noise-only releases, errors.

use raptor_clip::{
    Block, ClipError, Grouping, Privatizer, PublicDenominator, clip_blocks, clip_rows,
};

/// Sample mean and standard deviation (f64).
fn mean_std(x: &[f32]) -> (f64, f64) {
    let n = x.len() as f64;
    let m = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let v = x.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / (n - 1.0);
    (m, v.sqrt())
}

/// With n = 200 000 Gaussian draws the sample std has relative standard error
/// 1/sqrt(2(n-1)) ≈ 0.00158 and the mean has standard error std/sqrt(n). We accept within 6
/// standard errors; for a correct sampler each check fails with probability ≈ 2e-9 (two-sided
/// 6σ normal tail), so the false-positive rate of this test is below 1e-8.
fn check_noise(values: &[f32], expected_std: f64) {
    let n = values.len() as f64;
    let (m, s) = mean_std(values);
    let se_std = 1.0 / (2.0 * (n - 1.0)).sqrt();
    assert!(
        (s / expected_std - 1.0).abs() < 6.0 * se_std,
        "std {s} vs {expected_std}"
    );
    assert!(m.abs() < 6.0 * expected_std / n.sqrt(), "mean {m}");
    // a wrong std by 1 % would be caught: 0.01 > 6 · 0.00158
}

#[test]
fn noise_has_the_requested_std_seeded_and_os() {
    let n = 200_000;
    let (sigma, delta, d) = (1.3, 0.7, 4.0);
    let denom = PublicDenominator::new(d).unwrap();
    let mut seeded = Privatizer::seeded_insecure(sigma, 11).unwrap();
    assert!(seeded.is_seeded_insecure());
    let r = seeded.release_noise_only("x", n, delta, denom).unwrap();
    assert_eq!(r.noise_std(), sigma * delta);
    assert_eq!(r.denominator(), d);
    assert!(r.is_seeded_insecure(), "a seeded release must say so");
    check_noise(r.values(), sigma * delta / d);
    let mut os = Privatizer::new(sigma).unwrap();
    assert!(!os.is_seeded_insecure());
    let r = os.release_noise_only("x", n, delta, denom).unwrap();
    assert!(!r.is_seeded_insecure());
    check_noise(r.values(), sigma * delta / d);
}

/// The hardened sampler ((z1+z2+z3+z4)/2) is Gaussian, not just of the right variance: excess
/// kurtosis 0 (sd sqrt(24/n) ≈ 0.011 at n = 200 000) and the mass beyond 3 sd is 0.0027
/// (binomial sd ≈ 1.2e-4); both within 6 sd. A sampler that forgot to halve, or summed
/// uniforms instead, fails one of these or the std check above.
#[test]
fn noise_is_gaussian_in_shape() {
    let n = 200_000usize;
    let denom = PublicDenominator::new(1.0).unwrap();
    for mut p in [
        Privatizer::seeded_insecure(1.0, 5).unwrap(),
        Privatizer::new(1.0).unwrap(),
    ] {
        let r = p.release_noise_only("x", n, 1.0, denom).unwrap();
        let (m, sd) = mean_std(r.values());
        let nf = n as f64;
        let k4 = r
            .values()
            .iter()
            .map(|&v| ((f64::from(v) - m) / sd).powi(4))
            .sum::<f64>()
            / nf
            - 3.0;
        assert!(k4.abs() < 6.0 * (24.0 / nf).sqrt(), "excess kurtosis {k4}");
        let tail = r.values().iter().filter(|v| v.abs() > 3.0).count() as f64 / nf;
        let p3 = 0.002_699_796;
        assert!(
            (tail - p3).abs() < 6.0 * (p3 * (1.0 - p3) / nf).sqrt(),
            "mass beyond 3 sd {tail}"
        );
    }
}

#[test]
fn os_privatizers_draw_different_noise_and_seeds_reproduce() {
    let denom = PublicDenominator::new(1.0).unwrap();
    let a = Privatizer::new(1.0)
        .unwrap()
        .release_noise_only("x", 8, 1.0, denom)
        .unwrap();
    let b = Privatizer::new(1.0)
        .unwrap()
        .release_noise_only("x", 8, 1.0, denom)
        .unwrap();
    assert_ne!(a.values(), b.values());
    let c = Privatizer::seeded_insecure(1.0, 5)
        .unwrap()
        .release_noise_only("x", 8, 1.0, denom)
        .unwrap();
    let d = Privatizer::seeded_insecure(1.0, 5)
        .unwrap()
        .release_noise_only("x", 8, 1.0, denom)
        .unwrap();
    assert_eq!(c.values(), d.values());
}

/// The released value is (sum + noise)/D with D the public denominator whatever the realized
/// count. With the same seed, a noise-only release gives the same noise, so
/// D·(release(sum) − release(0)) must equal the clipped sum. An implementation that divided by
/// the realized count (3 here, or 0 for the empty release) would fail.
#[test]
fn denominator_is_public_never_the_realized_count() {
    let width = 6;
    let rows: Vec<f32> = (0..3 * width).map(|k| (k as f32 * 0.37).sin()).collect();
    let clipped = clip_rows(&rows, width, 0.5, None).unwrap();
    let d = 7.5;
    let denom = PublicDenominator::new(d).unwrap();
    let rel = Privatizer::seeded_insecure(2.0, 42)
        .unwrap()
        .release_rows(&clipped, denom)
        .unwrap();
    let empty = clip_rows(&[], width, 0.5, None).unwrap();
    let noise = Privatizer::seeded_insecure(2.0, 42)
        .unwrap()
        .release_rows(&empty, denom)
        .unwrap();
    assert!(
        noise.values().iter().all(|v| *v != 0.0),
        "a zero-record release is still noise"
    );
    for j in 0..width {
        let recovered = f64::from(rel.values()[j] - noise.values()[j]) * d;
        assert!(
            (recovered - f64::from(clipped.sum()[j])).abs() < 1e-5,
            "{recovered} vs {}",
            clipped.sum()[j]
        );
    }
}

/// A record with weight 0 leaves the release bit-identical to the release without it
/// (same seed): it leaks neither through the sum nor through the denominator.
#[test]
fn zero_weight_record_does_not_change_the_release() {
    let width = 5;
    let mut rows: Vec<f32> = (0..4 * width).map(|k| (k as f32 * 0.71).cos()).collect();
    for v in &mut rows[width..2 * width] {
        *v = 1e4;
    }
    let with = clip_rows(&rows, width, 1.0, Some(&[1.0, 0.0, 1.0, 1.0])).unwrap();
    let mut others = rows[..width].to_vec();
    others.extend_from_slice(&rows[2 * width..]);
    let without = clip_rows(&others, width, 1.0, None).unwrap();
    let denom = PublicDenominator::new(10.0).unwrap();
    let a = Privatizer::seeded_insecure(1.0, 3)
        .unwrap()
        .release_rows(&with, denom)
        .unwrap();
    let b = Privatizer::seeded_insecure(1.0, 3)
        .unwrap()
        .release_rows(&without, denom)
        .unwrap();
    for (x, y) in a.values().iter().zip(b.values()) {
        assert!((x - y).abs() < 1e-6);
    }
}

#[test]
fn block_releases_use_joint_and_group_sensitivities() {
    let a: Vec<f32> = (0..20).map(|k| k as f32).collect();
    let b: Vec<f32> = (0..8).map(|k| -(k as f32)).collect();
    let blocks = [Block::new("a", &a, 5), Block::new("b", &b, 2)];
    let grouping = Grouping::Grouped {
        groups: vec![vec![0], vec![1]],
        bounds: vec![3.0, 4.0],
    };
    let out = clip_blocks(&blocks, &grouping, None).unwrap();
    let denom = PublicDenominator::new(2.0).unwrap();
    let mut p = Privatizer::seeded_insecure(0.5, 1).unwrap();
    let joint = p.release_blocks(&out, denom).unwrap();
    assert!((joint.sensitivity() - 5.0).abs() < 1e-12);
    assert_eq!(joint.blocks().len(), 2);
    assert_eq!(joint.blocks()[1].values().len(), 2);
    let expert = p.release_group(&out, 1, denom).unwrap();
    assert_eq!(expert.sensitivity(), 4.0);
    assert_eq!(expert.blocks().len(), 1);
    assert_eq!(expert.blocks()[0].name(), "b");
    assert!(matches!(
        p.release_group(&out, 2, denom),
        Err(ClipError::InvalidGrouping { .. })
    ));
}

#[test]
fn privatizer_errors_are_typed() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            Privatizer::new(bad),
            Err(ClipError::InvalidNoiseMultiplier { .. })
        ));
        assert!(matches!(
            Privatizer::seeded_insecure(bad, 0),
            Err(ClipError::InvalidNoiseMultiplier { .. })
        ));
        assert!(matches!(
            PublicDenominator::new(bad),
            Err(ClipError::InvalidDenominator { .. })
        ));
        let mut p = Privatizer::seeded_insecure(1.0, 0).unwrap();
        let d = PublicDenominator::new(1.0).unwrap();
        assert!(matches!(
            p.release(&[("x", &[1.0])], bad, d),
            Err(ClipError::InvalidSensitivity { .. })
        ));
    }
    let d = PublicDenominator::expected_lot_size(0.01, 5000).unwrap();
    assert!((d.value() - 50.0).abs() < 1e-9);
}

/// What a release reports about itself: σ, Δ, σΔ, the denominator, its blocks by position
/// and by name (the first block's values for `values`, nothing for a release without blocks),
/// and the values (also when taken out of a block).
#[test]
fn a_release_reports_how_it_was_made() {
    let d = PublicDenominator::new(3.0).unwrap();
    let mut p = Privatizer::seeded_insecure(1.7, 8).unwrap();
    assert_eq!(p.noise_multiplier(), 1.7);
    let r = p
        .release(&[("first", &[1.0, 2.0]), ("second", &[3.0])], 0.4, d)
        .unwrap();
    assert_eq!(r.noise_multiplier(), 1.7);
    assert_eq!(r.sensitivity(), 0.4);
    assert_eq!(r.noise_std(), 1.7 * 0.4);
    assert_eq!(r.denominator(), 3.0);
    assert_eq!(r.values(), r.blocks()[0].values());
    assert_eq!(r.values().len(), 2);
    assert_eq!(r.block("second").unwrap().name(), "second");
    assert_eq!(r.block("second").unwrap().values(), r.blocks()[1].values());
    assert_eq!(r.block("first").unwrap().values(), r.values());
    assert!(r.block("third").is_none());
    let second = r.blocks()[1].clone();
    assert_eq!(second.clone().into_values(), second.values().to_vec());
    let none = p.release(&[], 0.4, d).unwrap();
    assert!(none.values().is_empty() && none.blocks().is_empty());
}

/// `next_u64` draws from the privatizer's own generator: reproducible from a seed, fresh for
/// each call and each OS-seeded privatizer, and it moves the noise stream on.
#[test]
fn next_u64_comes_from_the_privatizers_generator() {
    use rand::{RngCore, SeedableRng};
    let mut a = Privatizer::seeded_insecure(1.0, 21).unwrap();
    let mut b = Privatizer::seeded_insecure(1.0, 21).unwrap();
    let mut reference = rand_chacha::ChaCha20Rng::seed_from_u64(21);
    for _ in 0..3 {
        let x = a.next_u64();
        assert_eq!(x, b.next_u64());
        assert_eq!(x, reference.next_u64());
    }
    let (x, y) = (a.next_u64(), a.next_u64());
    assert_ne!(x, y);
    let mut os1 = Privatizer::new(1.0).unwrap();
    let mut os2 = Privatizer::new(1.0).unwrap();
    assert_ne!(
        (os1.next_u64(), os1.next_u64()),
        (os2.next_u64(), os2.next_u64())
    );
}

/// The debug form names σ and whether the noise is seeded, and never prints the generator
/// (whose state is the noise).
#[test]
fn debug_shows_sigma_and_seeding_but_not_the_generator() {
    let p = Privatizer::seeded_insecure(1.25, 99).unwrap();
    let s = format!("{p:?}");
    assert!(s.starts_with("Privatizer"), "{s}");
    assert!(s.contains("noise_multiplier: 1.25"), "{s}");
    assert!(s.contains("seeded: true"), "{s}");
    assert!(!s.contains("rng") && !s.contains("ChaCha"), "{s}");
    let q = format!("{:?}", Privatizer::new(2.0).unwrap());
    assert!(q.contains("seeded: false"), "{q}");
}
