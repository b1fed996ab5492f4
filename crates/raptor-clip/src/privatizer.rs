//! The Gaussian privatizer: clipped sum + N(0, (σΔ)²) per coordinate, divided by a public
//! denominator.
//!
//! The types make the two classic mistakes hard: a [`Release`] can only be produced by a
//! [`Privatizer`], which always adds noise (σ > 0 is enforced), and the denominator is a
//! [`PublicDenominator`], built from public quantities (e.g. the expected lot size q·N), never
//! from the number of records that happened to be sampled.

use rand::RngCore;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_core::TryRngCore;
use rand_distr::{Distribution, StandardNormal};

use crate::ClipError;
use crate::slice::{BlockClipOutput, ClipOutput};

/// A denominator that does not depend on the data: the expected lot size B = q·N for the
/// shared stream, D_e = B/E for an expert stream. Dividing by the realized number of sampled
/// records would leak it; this type exists so that call sites say which one they use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PublicDenominator(f64);

impl PublicDenominator {
    /// A public denominator with the given value (must be finite and > 0). The caller asserts
    /// that `value` is a public constant (not derived from the sampled batch).
    pub fn new(value: f64) -> Result<Self, ClipError> {
        if value.is_finite() && value > 0.0 {
            Ok(PublicDenominator(value))
        } else {
            Err(ClipError::InvalidDenominator { value })
        }
    }
    /// The expected lot size q·N of Poisson sampling with rate q from N records.
    pub fn expected_lot_size(sampling_rate: f64, dataset_size: usize) -> Result<Self, ClipError> {
        Self::new(sampling_rate * dataset_size as f64)
    }
    /// The value.
    pub fn value(&self) -> f64 {
        self.0
    }
}

/// One released (noisy, averaged) block.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleasedBlock {
    /// Block name.
    pub name: String,
    /// (clipped sum + noise) / denominator.
    pub values: Vec<f32>,
}

/// A differentially private release. Only a [`Privatizer`] creates one.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    /// The released blocks.
    pub blocks: Vec<ReleasedBlock>,
    /// The L2 sensitivity Δ the noise was calibrated to.
    pub sensitivity: f64,
    /// The noise multiplier σ.
    pub noise_multiplier: f64,
    /// The noise std per coordinate of the sum, σ·Δ (before division).
    pub noise_std: f64,
    /// The public denominator used.
    pub denominator: f64,
}

impl Release {
    /// The values of the first block (convenience for single-block releases).
    pub fn values(&self) -> &[f32] {
        self.blocks.first().map_or(&[], |b| b.values.as_slice())
    }
}

/// Adds calibrated Gaussian noise to clipped sums.
///
/// By default ([`Privatizer::new`]) the noise comes from ChaCha20 seeded from the operating
/// system (a cryptographically secure generator).
pub struct Privatizer {
    noise_multiplier: f64,
    rng: ChaCha20Rng,
    seeded: bool,
}

impl std::fmt::Debug for Privatizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Privatizer")
            .field("noise_multiplier", &self.noise_multiplier)
            .field("seeded", &self.seeded)
            .finish_non_exhaustive()
    }
}

fn check_sigma(noise_multiplier: f64) -> Result<(), ClipError> {
    if noise_multiplier.is_finite() && noise_multiplier > 0.0 {
        Ok(())
    } else {
        Err(ClipError::InvalidNoiseMultiplier {
            value: noise_multiplier,
        })
    }
}

impl Privatizer {
    /// A privatizer with noise multiplier σ (> 0), noise from ChaCha20 seeded by the OS.
    pub fn new(noise_multiplier: f64) -> Result<Self, ClipError> {
        check_sigma(noise_multiplier)?;
        let mut seed = [0u8; 32];
        rand_core::OsRng
            .try_fill_bytes(&mut seed)
            .map_err(|e| ClipError::Rng(e.to_string()))?;
        Ok(Privatizer {
            noise_multiplier,
            rng: ChaCha20Rng::from_seed(seed),
            seeded: false,
        })
    }

    /// **NOT FOR PRODUCTION.** A privatizer whose noise comes from ChaCha20 with a fixed,
    /// user-given seed: anyone who knows the seed can subtract the noise, so the release is
    /// not private. Use it only for reproducible experiments and tests.
    pub fn seeded_insecure(noise_multiplier: f64, seed: u64) -> Result<Self, ClipError> {
        check_sigma(noise_multiplier)?;
        Ok(Privatizer {
            noise_multiplier,
            rng: ChaCha20Rng::seed_from_u64(seed),
            seeded: true,
        })
    }

    /// Whether the noise comes from a user-given seed (not private).
    pub fn is_seeded_insecure(&self) -> bool {
        self.seeded
    }

    /// The noise multiplier σ.
    pub fn noise_multiplier(&self) -> f64 {
        self.noise_multiplier
    }

    /// Fill `out` with standard normal draws.
    #[cfg(feature = "tch")]
    pub(crate) fn standard_normals(&mut self, out: &mut [f64]) {
        for v in out.iter_mut() {
            *v = StandardNormal.sample(&mut self.rng);
        }
    }

    fn noisy(&mut self, sum: &[f32], std: f64, denom: f64) -> Vec<f32> {
        sum.iter()
            .map(|&s| {
                let z: f64 = StandardNormal.sample(&mut self.rng);
                ((f64::from(s) + std * z) / denom) as f32
            })
            .collect()
    }

    /// Release named sums of clipped gradients with L2 sensitivity `sensitivity`:
    /// (sum + N(0, (σΔ)² I)) / denominator for every block. The caller vouches that `sums`
    /// are clipped sums with that sensitivity (prefer [`Privatizer::release_rows`] /
    /// [`Privatizer::release_blocks`], which take it from the clipping output).
    pub fn release(
        &mut self,
        sums: &[(&str, &[f32])],
        sensitivity: f64,
        denominator: PublicDenominator,
    ) -> Result<Release, ClipError> {
        if !(sensitivity.is_finite() && sensitivity > 0.0) {
            return Err(ClipError::InvalidSensitivity { value: sensitivity });
        }
        let std = self.noise_multiplier * sensitivity;
        let d = denominator.value();
        let blocks = sums
            .iter()
            .map(|(name, s)| ReleasedBlock {
                name: name.to_string(),
                values: self.noisy(s, std, d),
            })
            .collect();
        Ok(Release {
            blocks,
            sensitivity,
            noise_multiplier: self.noise_multiplier,
            noise_std: std,
            denominator: d,
        })
    }

    /// Release the clipped sum of [`crate::clip_rows`] (Δ = C).
    pub fn release_rows(
        &mut self,
        clipped: &ClipOutput,
        denominator: PublicDenominator,
    ) -> Result<Release, ClipError> {
        self.release(
            &[("rows", &clipped.sum)],
            clipped.sensitivity(),
            denominator,
        )
    }

    /// Release all block sums of [`crate::clip_blocks`] jointly (Δ = sqrt(Σ_g C_g²), or C for
    /// the one-bound forms).
    pub fn release_blocks(
        &mut self,
        clipped: &BlockClipOutput,
        denominator: PublicDenominator,
    ) -> Result<Release, ClipError> {
        let sums: Vec<(&str, &[f32])> = clipped
            .block_names
            .iter()
            .zip(&clipped.sums)
            .map(|(n, s)| (n.as_str(), s.as_slice()))
            .collect();
        self.release(&sums, clipped.sensitivity, denominator)
    }

    /// Release the blocks of group `group` alone (Δ = that group's bound), e.g. one expert
    /// stream with its denominator D_e.
    pub fn release_group(
        &mut self,
        clipped: &BlockClipOutput,
        group: usize,
        denominator: PublicDenominator,
    ) -> Result<Release, ClipError> {
        if group >= clipped.n_groups() {
            return Err(ClipError::InvalidGrouping {
                reason: format!(
                    "group {group} requested, only {} groups",
                    clipped.n_groups()
                ),
            });
        }
        let sums: Vec<(&str, &[f32])> = clipped
            .block_names
            .iter()
            .zip(&clipped.sums)
            .zip(&clipped.block_group)
            .filter(|(_, g)| **g == group)
            .map(|((n, s), _)| (n.as_str(), s.as_slice()))
            .collect();
        self.release(&sums, clipped.group_sensitivity(group), denominator)
    }

    /// A noise-only release of `len` coordinates (a stream whose sampled group is empty still
    /// takes a step: N(0, (σΔ)²)/denominator).
    pub fn release_noise_only(
        &mut self,
        name: &str,
        len: usize,
        sensitivity: f64,
        denominator: PublicDenominator,
    ) -> Result<Release, ClipError> {
        let zeros = vec![0f32; len];
        self.release(&[(name, &zeros)], sensitivity, denominator)
    }

    /// The next 64 random bits (for callers that need data-independent randomness from the
    /// same source).
    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }
}
