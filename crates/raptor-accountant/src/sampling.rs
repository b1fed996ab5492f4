//! Poisson subsampling: the sampling this crate's accountants certify.
//!
//! Every accountant here (PRV and RDP) bounds the privacy loss of the *Poisson*-subsampled
//! Gaussian mechanism: at each step every record of the population joins the batch
//! independently with probability q, so the batch size is random (Binomial(N, q)) and the
//! presence of one record says nothing about the others. Fixed-size batches, shuffling into
//! epochs or "at least one record" rules are other mechanisms, and the ε computed for q does not
//! cover them. [`PoissonSampler`] draws exactly what is certified:
//!
//! - one independent Bernoulli draw per record per step (rand's [`Bernoulli`], which includes a
//!   record with probability ⌊q·2⁶⁴⌋ / 2⁶⁴ ≤ q: never more often than q, so the ε certified for
//!   q is an upper bound for the sampler's real rate; q = 1 includes every record);
//! - from ChaCha20 seeded by the operating system ([`PoissonSampler::new`]); a fixed seed only
//!   through [`PoissonSampler::seeded_insecure`] (anyone who knows the seed knows every batch,
//!   which voids the amplification by subsampling);
//! - an empty batch is a valid draw (it happens with probability (1 − q)^N) and a step must
//!   still be taken and released (noise only) and counted;
//! - the public denominator of a release is [`PoissonSampler::expected_batch`] = q·N, never the
//!   realized size.
//!
//! ```
//! use raptor_accountant::{PoissonSampler, SamplingRate};
//! let mut sampler = PoissonSampler::new(SamplingRate::from_batch(64.0, 10_000.0)?, 10_000)?;
//! let batch: Vec<usize> = sampler.sample(); // sorted record indices, size ~ Binomial(10 000, q)
//! assert!(batch.windows(2).all(|w| w[0] < w[1]));
//! assert_eq!(sampler.expected_batch(), 64.0); // the public denominator
//! # Ok::<(), raptor_accountant::AccountantError>(())
//! ```

use crate::error::{AccountantError, Result};
use crate::types::SamplingRate;
use rand::distr::{Bernoulli, Distribution};
use rand_chacha::ChaCha20Rng;
use rand_core::{SeedableRng, TryRngCore};

/// Independent per-record Bernoulli(q) sampling of a population of `N` records, from a
/// cryptographically secure generator (see the [module docs](self)).
///
/// Deliberately not `Clone`: a clone would carry the generator's state and replay every future
/// batch of the original, so the batches would no longer be independent of what an observer of
/// one copy has seen. Two reproducible samplers are built from the same seed instead
/// ([`PoissonSampler::seeded_insecure`]).
#[derive(Debug)]
pub struct PoissonSampler {
    rate: SamplingRate,
    population: usize,
    draw: Bernoulli,
    rng: ChaCha20Rng,
    seeded: bool,
}

impl PoissonSampler {
    /// A sampler at rate q over records `0..population`, ChaCha20 seeded by the OS.
    ///
    /// Errors: an empty population ([`AccountantError::InvalidPopulation`]) or an OS generator
    /// failure ([`AccountantError::Rng`]).
    pub fn new(rate: SamplingRate, population: usize) -> Result<Self> {
        let mut seed = [0u8; 32];
        rand_core::OsRng
            .try_fill_bytes(&mut seed)
            .map_err(|e| AccountantError::Rng(e.to_string()))?;
        Self::build(rate, population, ChaCha20Rng::from_seed(seed), false)
    }

    /// **NOT FOR PRODUCTION.** A sampler whose batches come from ChaCha20 with a fixed,
    /// user-given seed: anyone who knows the seed knows which records were in every batch, and
    /// the privacy amplification by subsampling that the ε relies on is gone. Use it only for
    /// reproducible experiments and tests.
    pub fn seeded_insecure(rate: SamplingRate, population: usize, seed: u64) -> Result<Self> {
        Self::build(rate, population, ChaCha20Rng::seed_from_u64(seed), true)
    }

    fn build(
        rate: SamplingRate,
        population: usize,
        rng: ChaCha20Rng,
        seeded: bool,
    ) -> Result<Self> {
        if population == 0 {
            return Err(AccountantError::InvalidPopulation(population));
        }
        let draw = Bernoulli::new(rate.get())
            .map_err(|_| AccountantError::InvalidSamplingRate(rate.get()))?;
        Ok(Self {
            rate,
            population,
            draw,
            rng,
            seeded,
        })
    }

    /// Whether the batches come from a user-given seed (not private).
    pub fn is_seeded_insecure(&self) -> bool {
        self.seeded
    }

    /// The sampling rate q.
    pub fn rate(&self) -> SamplingRate {
        self.rate
    }

    /// The population size N.
    pub fn population(&self) -> usize {
        self.population
    }

    /// The expected batch size q·N: the public denominator of a release (never divide by the
    /// realized batch size, which depends on who is in the data).
    pub fn expected_batch(&self) -> f64 {
        self.rate.get() * self.population as f64
    }

    /// One step's batch: the indices of the records drawn, in increasing order. May be empty.
    pub fn sample(&mut self) -> Vec<usize> {
        let draw = self.draw;
        let rng = &mut self.rng;
        (0..self.population).filter(|_| draw.sample(rng)).collect()
    }

    /// One step's batch as a membership mask of length N (`true`: the record is in the batch).
    pub fn sample_mask(&mut self) -> Vec<bool> {
        let draw = self.draw;
        let rng = &mut self.rng;
        (0..self.population).map(|_| draw.sample(rng)).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn rate(q: f64) -> SamplingRate {
        SamplingRate::new(q).unwrap()
    }

    #[test]
    fn bad_population_is_an_error() {
        assert!(matches!(
            PoissonSampler::new(rate(0.1), 0),
            Err(AccountantError::InvalidPopulation(0))
        ));
    }

    #[test]
    fn os_seeded_samplers_differ_and_seeded_ones_repeat() {
        let mut a = PoissonSampler::new(rate(0.5), 256).unwrap();
        let mut b = PoissonSampler::new(rate(0.5), 256).unwrap();
        assert!(!a.is_seeded_insecure());
        // two OS-seeded samplers agree on all 256 draws with probability 2^-256
        assert_ne!(a.sample_mask(), b.sample_mask());
        let mut c = PoissonSampler::seeded_insecure(rate(0.5), 256, 7).unwrap();
        let mut d = PoissonSampler::seeded_insecure(rate(0.5), 256, 7).unwrap();
        assert!(c.is_seeded_insecure());
        assert_eq!(c.sample(), d.sample());
    }

    #[test]
    fn rate_one_takes_everyone() {
        let mut s = PoissonSampler::new(rate(1.0), 17).unwrap();
        assert_eq!(s.sample(), (0..17).collect::<Vec<_>>());
        assert_eq!(s.expected_batch(), 17.0);
    }

    #[test]
    fn sample_and_mask_agree_on_the_same_stream() {
        // Two samplers from one seed (a sampler is not Clone).
        let mut a = PoissonSampler::seeded_insecure(rate(0.3), 1000, 3).unwrap();
        let mut b = PoissonSampler::seeded_insecure(rate(0.3), 1000, 3).unwrap();
        let idx = a.sample();
        let mask = b.sample_mask();
        let from_mask: Vec<usize> = (0..1000).filter(|&i| mask[i]).collect();
        assert_eq!(idx, from_mask);
    }
}
