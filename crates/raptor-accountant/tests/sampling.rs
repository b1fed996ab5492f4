#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Statistical tests that `PoissonSampler` draws what the accountants certify: every record
//! independently with probability q at every step. Each test compares a statistic with its
//! exact mean under Poisson sampling and fails beyond 6 standard deviations (a false-positive
//! rate below 2e-9 per check for any seed); the seeds are fixed so that a run is reproducible.
//! A negative control shows that the independence check catches fixed-size batches, the most
//! common way to break the Poisson assumption.

use raptor_accountant::{PoissonSampler, SamplingRate};

fn sampler(q: f64, n: usize, seed: u64) -> PoissonSampler {
    PoissonSampler::seeded_insecure(SamplingRate::new(q).unwrap(), n, seed).unwrap()
}

/// |x − mean| ≤ 6 sd.
fn within_6_sd(x: f64, mean: f64, var: f64, what: &str) {
    let z = (x - mean) / var.sqrt();
    assert!(z.abs() <= 6.0, "{what}: {x} vs mean {mean} (z = {z:.2})");
}

#[test]
fn batch_sizes_have_the_binomial_mean_and_variance() {
    let (q, n, steps) = (0.05, 10_000usize, 2000usize);
    let mut s = sampler(q, n, 1);
    let sizes: Vec<f64> = (0..steps).map(|_| s.sample().len() as f64).collect();
    let total: f64 = sizes.iter().sum();
    let p = n as f64 * q * (1.0 - q); // variance of one batch size
    within_6_sd(
        total,
        steps as f64 * n as f64 * q,
        steps as f64 * p,
        "total drawn",
    );
    // sample variance of the batch sizes: mean p, variance ≈ 2p²/(steps − 1) (near-normal sizes)
    let mean = total / steps as f64;
    let var = sizes.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (steps - 1) as f64;
    within_6_sd(
        var,
        p,
        2.0 * p * p / (steps - 1) as f64,
        "batch size variance",
    );
}

#[test]
fn every_record_is_drawn_at_rate_q() {
    // per-record counts over many steps: Σ_i (c_i − Tq)² / (Tq(1 − q)) is ≈ χ²(N), mean N,
    // variance 2N (plus a small excess-kurtosis term, included below)
    let (q, n, steps) = (0.05, 2000usize, 2000usize);
    let mut s = sampler(q, n, 2);
    let mut counts = vec![0u32; n];
    for _ in 0..steps {
        for i in s.sample() {
            counts[i] += 1;
        }
    }
    let (t, v) = (steps as f64, steps as f64 * q * (1.0 - q));
    let chi2: f64 = counts
        .iter()
        .map(|&c| (f64::from(c) - t * q).powi(2) / v)
        .sum();
    // Var[(c − Tq)²/v] = 2 + (1 − 6q(1 − q)) / (T q (1 − q)) for a binomial count
    let var_one = 2.0 + (1.0 - 6.0 * q * (1.0 - q)) / v;
    within_6_sd(chi2, n as f64, n as f64 * var_one, "per-record chi-square");
    // and no record is systematically left out or always taken
    assert!(counts.iter().all(|&c| c > 0 && c < steps as u32));
}

#[test]
fn empty_batches_happen_at_their_rate_and_are_returned() {
    // no "at least one record" rule: P(empty) = (1 − q)^N
    let (q, n, steps) = (0.1, 5usize, 20_000usize);
    let mut s = sampler(q, n, 3);
    let empties = (0..steps).filter(|_| s.sample().is_empty()).count() as f64;
    let p = (1.0 - q).powi(n as i32);
    within_6_sd(
        empties,
        steps as f64 * p,
        steps as f64 * p * (1.0 - p),
        "empty batches",
    );
}

/// Mean number of other records drawn when record 0 is in the batch minus when it is not, and
/// its standard deviation under independence.
fn membership_dependence(mut draw: impl FnMut() -> Vec<bool>, steps: usize) -> (f64, f64) {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let m = draw();
        let others = m[1..].iter().filter(|&&b| b).count() as f64;
        if m[0] {
            with.push(others)
        } else {
            without.push(others)
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let var = |v: &[f64]| {
        let m = mean(v);
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
    };
    let diff = mean(&with) - mean(&without);
    let sd = (var(&with) / with.len() as f64 + var(&without) / without.len() as f64).sqrt();
    (diff, sd)
}

#[test]
fn one_records_membership_says_nothing_about_the_others() {
    let (q, n, steps) = (0.3, 20usize, 20_000usize);
    let mut s = sampler(q, n, 4);
    let (diff, sd) = membership_dependence(|| s.sample_mask(), steps);
    assert!(diff.abs() <= 6.0 * sd, "dependence {diff} (sd {sd})");

    // Negative control: fixed-size batches of round(qN) records (uniform without replacement,
    // from the same generator family) make the others' count fall by exactly one when record
    // 0 is in: the same check must reject them.
    use rand::SeedableRng;
    use rand::seq::index::sample;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
    let b = (q * n as f64).round() as usize;
    let fixed = || {
        let mut m = vec![false; n];
        for i in sample(&mut rng, n, b) {
            m[i] = true;
        }
        m
    };
    let (diff, sd) = membership_dependence(fixed, steps);
    assert!(
        diff < -6.0 * sd,
        "fixed-size batches not caught: {diff} (sd {sd})"
    );
}

/// A clone of a sampler would replay the original's future batches (same generator state), so
/// `PoissonSampler` must not implement `Clone`. This test does not compile if it does: the
/// method call below is ambiguous exactly when a second impl (for `Clone` types) applies.
#[test]
fn a_sampler_cannot_be_cloned() {
    trait NotClone<M>: Sized {
        fn check() {}
    }
    struct ForAll;
    struct ForClone;
    impl<T> NotClone<ForAll> for T {}
    impl<T: Clone> NotClone<ForClone> for T {}
    <PoissonSampler as NotClone<_>>::check();
}

/// Reproducible runs build two samplers from the same seed instead of cloning one.
#[test]
fn two_samplers_from_one_seed_draw_the_same_batches() {
    let mut a = sampler(0.3, 50, 7);
    let mut b = sampler(0.3, 50, 7);
    for _ in 0..20 {
        assert_eq!(a.sample(), b.sample());
    }
    assert!(a.is_seeded_insecure());
}

/// The accessors report what the sampler was built with, and every draw covers exactly the
/// population: masks of length N, indices below N.
#[test]
fn a_sampler_reports_its_rate_and_population_and_draws_within_it() {
    for (q, n) in [(0.25, 1usize), (0.5, 37), (0.01, 1000)] {
        let mut s = sampler(q, n, 9);
        assert_eq!(s.population(), n);
        assert_eq!(s.rate().get(), q);
        assert_eq!(s.expected_batch(), q * n as f64);
        for _ in 0..10 {
            assert_eq!(s.sample_mask().len(), n);
            assert!(s.sample().iter().all(|&i| i < n));
        }
    }
}
