//! One Poisson sample, one charge: what a training update that draws one sample and makes
//! several releases from it costs.
//!
//! # The rule
//!
//! An update draws one Poisson sample S (every record independently with probability q) and
//! makes releases from it. Release j adds the clipped contributions of the sampled records
//! (each of L2 norm at most Δ_j) and Gaussian noise of standard deviation σ_j·Δ_j. Some
//! releases come in *parallel groups* (the expert streams of one RAPTOR layer): each record
//! contributes to exactly one member of the group (its owner), and to none of the others.
//!
//! Divide each release by its own noise scale σ_j·Δ_j (a public, invertible post-processing).
//! Every coordinate then carries unit-variance noise, and one record x moves the whole vector
//! of releases by at most
//!
//! ```text
//!   ‖v(x)‖² ≤ Σ_sequential 1/σ_j²  +  Σ_groups max_{m ∈ group} 1/σ_m²  =:  1/σ_eff²
//! ```
//!
//! (the group term is a maximum because x reaches one member only, and the worst member bounds
//! whichever it reaches). The update is therefore a Gaussian mechanism of sensitivity 1/σ_eff
//! and unit noise applied to the Poisson sample, i.e. one [`SubsampledGaussian`] with rate q
//! and noise multiplier σ_eff: that single mechanism, charged once, is what the update costs.
//! The bound is tight (a record whose contributions reach their bounds, in the worst member of
//! each group, attains it), so nothing is lost against a correct finer analysis.
//!
//! Charging each release as if it had drawn its own sample — one step per release, or a
//! release and a parallel group as two compositions — under-reports ε: the releases share the
//! sample, so a record is in all of them or in none, and their privacy losses add inside one
//! subsampling, not across independent ones (at q = 0.015, σ = 0.8 for two releases over 50
//! updates, δ = 1e-4: 1.53 charged that way against 3.72 for the one-sample mechanism).
//!
//! Parallel composition across a group's members over a whole run is kept by this rule: every
//! update charges the group's worst member, which is the cost of the member a record belongs
//! to whenever the members' noise multipliers are equal (they are in every raptor plan), and
//! an upper bound on it otherwise.
//!
//! Rounding: σ_eff is rounded toward more privacy loss (a few units in the last place below
//! the exact value); a charge of one release is that release's own mechanism, bit for bit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{AccountantError, Result};
use crate::types::{NoiseMultiplier, SamplingRate, SubsampledGaussian};

/// The releases made from one Poisson sample, reduced to the one mechanism that the sample
/// costs ([`SampleCharge::mechanism`]; the derivation is in the [module docs](self)).
///
/// ```
/// use raptor_accountant::{Ledger, PrvAccountant, SampleCharge, SubsampledGaussian};
/// // RAPTOR without alternation: a shared release (σ_s = 1) and one layer of four expert
/// // releases (σ_e = 1.5) from the same sample.
/// let mut charge = SampleCharge::new(0.015)?;
/// charge.release(1.0)?;
/// for e in 0..4 {
///     charge.member_release(3, e, 1.5)?; // expert e of layer 3's parallel group
/// }
/// let sigma_eff = charge.mechanism()?.sigma();
/// assert!((sigma_eff - 1.0 / (1.0 + 1.0 / 2.25f64).sqrt()).abs() < 1e-12);
/// let mut ledger = Ledger::new();
/// ledger.charge(&charge)?;
/// assert_eq!((ledger.len(), ledger.releases()), (1, 5));
/// # Ok::<(), raptor_accountant::AccountantError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleCharge {
    q: SamplingRate,
    sequential: Vec<NoiseMultiplier>,
    /// Parallel group → member → its noise multiplier.
    groups: BTreeMap<usize, BTreeMap<usize, NoiseMultiplier>>,
}

impl SampleCharge {
    /// A sample drawn at rate `q`, before any release.
    pub fn new(q: f64) -> Result<Self> {
        Ok(Self {
            q: SamplingRate::new(q)?,
            sequential: Vec::new(),
            groups: BTreeMap::new(),
        })
    }

    /// The charge of a sample that made one release with noise multiplier `sigma`.
    pub fn single(mech: SubsampledGaussian) -> Self {
        Self {
            q: mech.sampling_rate,
            sequential: vec![mech.noise_multiplier],
            groups: BTreeMap::new(),
        }
    }

    /// A release every sampled record contributes to, with noise multiplier `sigma` (its
    /// noise standard deviation over its L2 sensitivity).
    pub fn release(&mut self, sigma: f64) -> Result<&mut Self> {
        self.sequential.push(NoiseMultiplier::new(sigma)?);
        Ok(self)
    }

    /// Member `member` of the parallel group `group` (the caller's index of the group; RAPTOR:
    /// the sparse layer whose experts form it, each expert a member): each record contributes
    /// to exactly one member of the group (for the whole run), with noise multiplier `sigma`. A
    /// member given twice is an error (it would be two releases, not one member).
    pub fn member_release(&mut self, group: usize, member: usize, sigma: f64) -> Result<&mut Self> {
        let sigma = NoiseMultiplier::new(sigma)?;
        let members = self.groups.entry(group).or_default();
        if members.insert(member, sigma).is_some() {
            return Err(AccountantError::DuplicateMember { group, member });
        }
        Ok(self)
    }

    /// The sampling rate.
    pub fn q(&self) -> f64 {
        self.q.get()
    }

    /// Number of releases (sequential ones plus every member of every group).
    pub fn releases(&self) -> u64 {
        let members: usize = self.groups.values().map(BTreeMap::len).sum();
        (self.sequential.len() + members) as u64
    }

    /// The noise multiplier σ_eff of the one mechanism the sample costs:
    /// 1/σ_eff² = Σ_sequential 1/σ_j² + Σ_groups max_member 1/σ_m², rounded toward more
    /// privacy loss. An error when nothing was released.
    pub fn noise_multiplier(&self) -> Result<NoiseMultiplier> {
        let mut terms: Vec<NoiseMultiplier> = self.sequential.clone();
        for members in self.groups.values() {
            // The worst member: the smallest σ.
            if let Some(worst) = members
                .values()
                .copied()
                .min_by(|a, b| a.get().total_cmp(&b.get()))
            {
                terms.push(worst);
            }
        }
        match terms.as_slice() {
            [] => Err(AccountantError::EmptyComposition),
            [only] => Ok(*only),
            many => {
                let inv: f64 = many.iter().map(|s| (1.0 / s.get()).powi(2)).sum();
                let sigma = 1.0 / inv.sqrt();
                // Each of the ≤ n + 3 roundings above moves σ by at most half an ulp; rounding
                // down by (n + 4) ulps lands at or below the exact value.
                let slack = (many.len() as f64 + 4.0) * f64::EPSILON;
                NoiseMultiplier::new(sigma * (1.0 - slack))
            }
        }
    }

    /// The one mechanism the sample costs (rate q, noise multiplier
    /// [`noise_multiplier`](Self::noise_multiplier)).
    pub fn mechanism(&self) -> Result<SubsampledGaussian> {
        Ok(SubsampledGaussian {
            sampling_rate: self.q,
            noise_multiplier: self.noise_multiplier()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_release_is_its_own_mechanism_bit_for_bit() {
        let mut c = SampleCharge::new(0.02).unwrap();
        c.release(1.234_567).unwrap();
        assert_eq!(
            c.mechanism().unwrap(),
            SubsampledGaussian::new(0.02, 1.234_567).unwrap()
        );
        let mut g = SampleCharge::new(0.02).unwrap();
        for m in 0..3 {
            g.member_release(0, m, 0.9).unwrap();
        }
        assert_eq!(g.mechanism().unwrap().sigma(), 0.9);
        assert_eq!(g.releases(), 3);
        let s = SampleCharge::single(SubsampledGaussian::new(0.5, 2.0).unwrap());
        assert_eq!(
            s.mechanism().unwrap(),
            SubsampledGaussian::new(0.5, 2.0).unwrap()
        );
    }

    #[test]
    fn errors() {
        assert!(SampleCharge::new(0.0).is_err());
        let mut c = SampleCharge::new(0.1).unwrap();
        assert!(matches!(
            c.mechanism(),
            Err(AccountantError::EmptyComposition)
        ));
        assert!(c.release(0.0).is_err());
        assert!(c.release(f64::NAN).is_err());
        c.member_release(0, 1, 1.0).unwrap();
        assert!(matches!(
            c.member_release(0, 1, 1.0),
            Err(AccountantError::DuplicateMember {
                group: 0,
                member: 1
            })
        ));
        // Another group may use the same index.
        c.member_release(1, 1, 1.0).unwrap();
    }

    proptest! {
        /// σ_eff against the formula in f64 (never above it), the worst member of each group,
        /// order independence, and never above the smallest term.
        #[test]
        fn sigma_eff_is_the_root_of_the_summed_inverse_variances(
            seq in prop::collection::vec(0.3f64..20.0, 0..4),
            groups in prop::collection::vec(prop::collection::vec(0.3f64..20.0, 1..6), 0..3),
        ) {
            prop_assume!(!seq.is_empty() || !groups.is_empty());
            let mut c = SampleCharge::new(0.01).unwrap();
            for s in &seq {
                c.release(*s).unwrap();
            }
            for (i, g) in groups.iter().enumerate() {
                for (m, s) in g.iter().enumerate() {
                    c.member_release(i, m, *s).unwrap();
                }
            }
            let mut inv: f64 = seq.iter().map(|s| 1.0 / (s * s)).sum();
            for g in &groups {
                let worst = g.iter().copied().fold(f64::INFINITY, f64::min);
                inv += 1.0 / (worst * worst);
            }
            let want = 1.0 / inv.sqrt();
            let got = c.noise_multiplier().unwrap().get();
            prop_assert!(got <= want * (1.0 + 1e-15), "{got} vs {want}");
            prop_assert!(got >= want * (1.0 - 1e-13), "{got} vs {want}");
            let smallest = seq
                .iter()
                .chain(groups.iter().flatten())
                .copied()
                .fold(f64::INFINITY, f64::min);
            prop_assert!(got <= smallest);
            let n = seq.len() + groups.iter().map(Vec::len).sum::<usize>();
            prop_assert_eq!(c.releases(), n as u64);
            // Reversed order: same σ_eff up to the rounding slack.
            let mut r = SampleCharge::new(0.01).unwrap();
            for s in seq.iter().rev() {
                r.release(*s).unwrap();
            }
            for (i, g) in groups.iter().enumerate().rev() {
                for (m, s) in g.iter().enumerate().rev() {
                    r.member_release(i, m, *s).unwrap();
                }
            }
            let back = r.noise_multiplier().unwrap().get();
            prop_assert!((back - got).abs() <= 1e-14 * got);
        }
    }
}
