//! The Gaussian privatizer: clipped sum + N(0, (σΔ)²) per coordinate, divided by a public
//! denominator.
//!
//! # How the noise is generated
//!
//! - **Source.** ChaCha20 (a CSPRNG) keyed with 32 bytes from the operating system
//!   ([`Privatizer::new`]). A user-given seed ([`Privatizer::seeded_insecure`]) is an explicit
//!   opt-in for reproducible experiments: such a privatizer prints a warning to stderr once, and
//!   every [`Release`] it makes says so ([`Release::is_seeded_insecure`]). A release of more
//!   than [`NOISE_CHUNK`] coordinates is drawn in chunks of that many, each from its own
//!   ChaCha20 keyed with 32 bytes of the privatizer's generator (drawn in chunk order before
//!   any chunk is filled), so that the chunks fill in parallel; the noise depends on the seed
//!   and the release's length only, not on the thread count.
//! - **Floating-point mitigation.** Each noise coordinate is `(z₁ + z₂ + z₃ + z₄) / 2` with
//!   `zₖ` independent standard normals drawn in f64 (Ziggurat), scaled by σΔ and added to the
//!   clipped sum in f64 before the one rounding to the output type. The sum of four
//!   independent N(0, 1) is N(0, 4), so the result is exactly N(0, 1) in distribution and the
//!   accountant's analysis is unchanged, while the fine structure of one sampler's output (the
//!   gaps between representable values and the tails of a single draw that floating-point
//!   attacks on Gaussian samplers exploit; Holohan et al. 2021, "Are we there yet? Timing and
//!   floating-point attacks on differential privacy systems") is smoothed by the convolution.
//!   This is the mitigation Opacus uses in its secure mode (the same four draws halved); we
//!   add it always, not as an option, because it costs four draws per coordinate and nothing
//!   else.
//! - **Why not an exact discrete Gaussian on a grid** (OpenDP's approach): it removes the
//!   floating-point question entirely, but then the released quantity is a lattice point and
//!   the clipped sum must be rounded to the grid first, which changes the sensitivity (by up to
//!   half a grid step per coordinate, summed over millions of coordinates) and the mechanism
//!   the accountant certifies (the discrete Gaussian's privacy curve differs from the
//!   continuous one). Our ε is certified for the continuous Gaussian, so we keep that
//!   mechanism and harden its sampler.
//! - **One path.** The slice releases ([`Privatizer::release`] and friends) and the tensor
//!   release (`Privatizer::release_tensor`, feature `tch`) draw their noise from the same
//!   function, in the same order, so a seeded privatizer gives the same noise on both paths.
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

/// One released (noisy, averaged) block. Only a [`Privatizer`] creates one.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleasedBlock {
    name: String,
    values: Vec<f32>,
}

impl ReleasedBlock {
    /// Block name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// (clipped sum + noise) / denominator.
    pub fn values(&self) -> &[f32] {
        &self.values
    }
    /// The values, consuming the block.
    pub fn into_values(self) -> Vec<f32> {
        self.values
    }
}

/// A differentially private release. Only a [`Privatizer`] creates one: the fields are private,
/// so no caller can assemble a release without noise or restate the sensitivity it was
/// calibrated to.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    blocks: Vec<ReleasedBlock>,
    sensitivity: f64,
    noise_multiplier: f64,
    noise_std: f64,
    denominator: f64,
    seeded_insecure: bool,
}

impl Release {
    /// The values of the first block (convenience for single-block releases).
    pub fn values(&self) -> &[f32] {
        self.blocks.first().map_or(&[], |b| b.values.as_slice())
    }
    /// The released blocks, in the order given to the privatizer.
    pub fn blocks(&self) -> &[ReleasedBlock] {
        &self.blocks
    }
    /// The released block named `name`, if any.
    pub fn block(&self, name: &str) -> Option<&ReleasedBlock> {
        self.blocks.iter().find(|b| b.name == name)
    }
    /// The L2 sensitivity Δ the noise was calibrated to.
    pub fn sensitivity(&self) -> f64 {
        self.sensitivity
    }
    /// The noise multiplier σ.
    pub fn noise_multiplier(&self) -> f64 {
        self.noise_multiplier
    }
    /// The noise std per coordinate of the sum, σ·Δ (before division).
    pub fn noise_std(&self) -> f64 {
        self.noise_std
    }
    /// The public denominator used.
    pub fn denominator(&self) -> f64 {
        self.denominator
    }
    /// Whether the noise came from a user-given seed: **such a release is not private** (anyone
    /// who knows the seed can subtract the noise). Records built from this release must say so.
    pub fn is_seeded_insecure(&self) -> bool {
        self.seeded_insecure
    }
}

/// The warning printed (to stderr, once per privatizer) when a privatizer is seeded.
pub const SEEDED_WARNING: &str = "raptor-clip WARNING: noise from a user-given seed \
(Privatizer::seeded_insecure): anyone who knows the seed can remove the noise, so these \
releases are NOT differentially private. Use it only for reproducible experiments and tests.";

#[cfg(test)]
thread_local! {
    /// Warnings printed on this thread (tests count them).
    pub(crate) static WARNINGS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn warn_seeded() {
    eprintln!("{SEEDED_WARNING}");
    #[cfg(test)]
    WARNINGS.with(|w| w.set(w.get() + 1));
}

/// Noise draws per chunk when a release is long enough to be drawn in parallel (see
/// [`Privatizer`]'s module docs, "Source").
pub const NOISE_CHUNK: usize = 1 << 16;

/// One standard normal for the noise: (z₁ + z₂ + z₃ + z₄)/2 of four independent N(0, 1) draws
/// in f64 (see the [module docs](self)).
#[inline]
fn hardened_standard_normal(rng: &mut ChaCha20Rng) -> f64 {
    let mut acc = 0f64;
    for _ in 0..4 {
        let z: f64 = StandardNormal.sample(rng);
        acc += z;
    }
    acc / 2.0
}

/// Adds calibrated Gaussian noise to clipped sums.
///
/// By default ([`Privatizer::new`]) the noise comes from ChaCha20 seeded from the operating
/// system (a cryptographically secure generator).
pub struct Privatizer {
    noise_multiplier: f64,
    rng: ChaCha20Rng,
    seeded: bool,
    warned: bool,
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
            warned: false,
        })
    }

    /// **NOT FOR PRODUCTION.** A privatizer whose noise comes from ChaCha20 with a fixed,
    /// user-given seed: anyone who knows the seed can subtract the noise, so the release is
    /// not private. Use it only for reproducible experiments and tests.
    ///
    /// The first noise it draws prints [`SEEDED_WARNING`] to stderr (once per privatizer), and
    /// every [`Release`] it makes answers `true` to [`Release::is_seeded_insecure`].
    pub fn seeded_insecure(noise_multiplier: f64, seed: u64) -> Result<Self, ClipError> {
        check_sigma(noise_multiplier)?;
        Ok(Privatizer {
            noise_multiplier,
            rng: ChaCha20Rng::seed_from_u64(seed),
            seeded: true,
            warned: false,
        })
    }

    /// Print the seeded-noise warning if this privatizer is seeded and has not warned yet.
    fn warn_once(&mut self) {
        if self.seeded && !self.warned {
            self.warned = true;
            warn_seeded();
        }
    }

    /// Whether the noise comes from a user-given seed (not private).
    pub fn is_seeded_insecure(&self) -> bool {
        self.seeded
    }

    /// The noise multiplier σ.
    pub fn noise_multiplier(&self) -> f64 {
        self.noise_multiplier
    }

    /// Fill `out` with standard normal noise draws (the hardened sampler of the module docs;
    /// the one source of noise of both the slice and the tensor path). Warns once if seeded.
    ///
    /// Up to [`NOISE_CHUNK`] draws come straight from this privatizer's generator. A longer
    /// `out` is filled in chunks of [`NOISE_CHUNK`]: chunk k from its own ChaCha20 keyed with
    /// 32 bytes that this privatizer's generator produces, in chunk order, before any chunk is
    /// filled; the chunks are then filled in parallel (rayon). The result depends on the seed
    /// and on `out.len()` only, never on the thread count.
    pub(crate) fn standard_normals(&mut self, out: &mut [f64]) {
        use rayon::prelude::*;
        self.warn_once();
        if out.len() <= NOISE_CHUNK {
            for v in out.iter_mut() {
                *v = hardened_standard_normal(&mut self.rng);
            }
            return;
        }
        let keys: Vec<[u8; 32]> = (0..out.len().div_ceil(NOISE_CHUNK))
            .map(|_| {
                let mut k = [0u8; 32];
                self.rng.fill_bytes(&mut k);
                k
            })
            .collect();
        out.par_chunks_mut(NOISE_CHUNK)
            .zip(keys.par_iter())
            .for_each(|(chunk, key)| {
                let mut rng = ChaCha20Rng::from_seed(*key);
                for v in chunk.iter_mut() {
                    *v = hardened_standard_normal(&mut rng);
                }
            });
    }

    fn noisy(&mut self, sum: &[f32], std: f64, denom: f64) -> Vec<f32> {
        let mut z = vec![0f64; sum.len()];
        self.standard_normals(&mut z);
        sum.iter()
            .zip(&z)
            .map(|(&s, &z)| ((f64::from(s) + std * z) / denom) as f32)
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
        self.warn_once();
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
            seeded_insecure: self.seeded,
        })
    }

    /// Release the clipped sum of [`crate::clip_rows`] (Δ = C).
    pub fn release_rows(
        &mut self,
        clipped: &ClipOutput,
        denominator: PublicDenominator,
    ) -> Result<Release, ClipError> {
        self.release(
            &[("rows", clipped.sum())],
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
            .block_names()
            .iter()
            .zip(clipped.sums())
            .map(|(n, s)| (n.as_str(), s.as_slice()))
            .collect();
        self.release(&sums, clipped.sensitivity(), denominator)
    }

    /// Release the blocks of group `group` alone (Δ = that group's bound), e.g. one expert
    /// stream with its denominator D_e.
    pub fn release_group(
        &mut self,
        clipped: &BlockClipOutput,
        group: usize,
        denominator: PublicDenominator,
    ) -> Result<Release, ClipError> {
        let Some(sensitivity) = clipped.group_sensitivity(group) else {
            return Err(ClipError::InvalidGrouping {
                reason: format!(
                    "group {group} requested, only {} groups",
                    clipped.n_groups()
                ),
            });
        };
        let sums: Vec<(&str, &[f32])> = clipped
            .block_names()
            .iter()
            .zip(clipped.sums())
            .zip(clipped.block_group())
            .filter(|(_, g)| **g == group)
            .map(|((n, s), _)| (n.as_str(), s.as_slice()))
            .collect();
        self.release(&sums, sensitivity, denominator)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded privatizer warns exactly once (on its first noise, whichever path draws it); an
    /// OS-seeded one never does.
    #[test]
    fn seeded_privatizer_warns_once_and_secure_one_never() {
        let d = PublicDenominator::new(1.0).unwrap();
        let before = WARNINGS.with(|w| w.get());
        let mut p = Privatizer::seeded_insecure(1.0, 3).unwrap();
        let r1 = p.release(&[("a", &[0.0, 1.0])], 1.0, d).unwrap();
        let r2 = p.release_noise_only("b", 3, 1.0, d).unwrap();
        let mut z = [0f64; 2];
        p.standard_normals(&mut z);
        assert_eq!(WARNINGS.with(|w| w.get()) - before, 1);
        assert!(r1.is_seeded_insecure() && r2.is_seeded_insecure());
        let mut q = Privatizer::seeded_insecure(1.0, 3).unwrap();
        q.standard_normals(&mut z);
        assert_eq!(
            WARNINGS.with(|w| w.get()) - before,
            2,
            "once per privatizer"
        );
        let mut s = Privatizer::new(1.0).unwrap();
        let r3 = s.release(&[("a", &[0.0, 1.0])], 1.0, d).unwrap();
        assert!(!r3.is_seeded_insecure());
        assert_eq!(WARNINGS.with(|w| w.get()) - before, 2);
    }

    /// A draw longer than NOISE_CHUNK: chunk k is the hardened sampler on ChaCha20 keyed with
    /// the k-th 32 bytes of the privatizer's generator, the same on 1 and 2 threads; the chunks
    /// differ, and the draws have mean 0 and variance 1 across the chunk boundaries.
    #[test]
    fn long_draws_come_in_keyed_chunks_whatever_the_thread_count() {
        let n = 2 * NOISE_CHUNK + 17;
        let draw = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| {
                    let mut p = Privatizer::seeded_insecure(1.0, 9).unwrap();
                    let mut z = vec![0.0; n];
                    p.standard_normals(&mut z);
                    z
                })
        };
        let one = draw(1);
        assert_eq!(one, draw(2));
        let mut parent = ChaCha20Rng::seed_from_u64(9);
        let mut want = Vec::with_capacity(n);
        for k in 0..3 {
            let mut key = [0u8; 32];
            parent.fill_bytes(&mut key);
            let mut rng = ChaCha20Rng::from_seed(key);
            for _ in 0..NOISE_CHUNK.min(n - k * NOISE_CHUNK) {
                want.push(hardened_standard_normal(&mut rng));
            }
        }
        assert_eq!(one, want);
        assert_ne!(one[..64], one[NOISE_CHUNK..NOISE_CHUNK + 64]);
        let mean = one.iter().sum::<f64>() / n as f64;
        let var = one.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n as f64 - 1.0);
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "{mean} {var}"
        );
        // A draw of exactly NOISE_CHUNK is still one sequential stream.
        let mut p = Privatizer::seeded_insecure(1.0, 9).unwrap();
        let mut z = vec![0.0; NOISE_CHUNK];
        p.standard_normals(&mut z);
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        assert!(z.iter().all(|&v| v == hardened_standard_normal(&mut rng)));
    }

    /// The noise of a seeded privatizer is exactly (z1+z2+z3+z4)/2 of consecutive ChaCha20
    /// standard normals (the hardened sampler), on the slice path.
    #[test]
    fn noise_is_the_halved_sum_of_four_draws() {
        let mut p = Privatizer::seeded_insecure(2.0, 11).unwrap();
        let d = PublicDenominator::new(4.0).unwrap();
        let r = p.release(&[("a", &[1.0, -1.0, 0.5])], 3.0, d).unwrap();
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        for (k, &s) in [1.0f64, -1.0, 0.5].iter().enumerate() {
            let z: f64 = (0..4)
                .map(|_| -> f64 { StandardNormal.sample(&mut rng) })
                .sum::<f64>()
                / 2.0;
            let want = ((s + 6.0 * z) / 4.0) as f32;
            assert_eq!(r.values()[k], want, "coordinate {k}");
        }
    }
}
