//! Validated parameters, the mechanism and compositions.

use serde::{Deserialize, Serialize};

use crate::error::{AccountantError, Result};

/// The most trained sparse layers a budget plan takes (a bound on the work of folding an expert
/// update's layers into one mechanism; models have tens).
pub const MAX_LAYERS: u64 = 4096;

/// The largest total number of steps a composition may have.
pub const MAX_TOTAL_STEPS: u64 = 1_000_000_000;

/// Poisson sampling rate q ∈ (0, 1] (expected batch size / population size).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct SamplingRate(f64);

impl SamplingRate {
    /// Validate a sampling rate.
    ///
    /// ```
    /// use raptor_accountant::SamplingRate;
    /// assert!(SamplingRate::new(0.01).is_ok());
    /// assert!(SamplingRate::new(0.0).is_err());
    /// ```
    pub fn new(q: f64) -> Result<Self> {
        if q.is_finite() && q > 0.0 && q <= 1.0 {
            Ok(Self(q))
        } else {
            Err(AccountantError::InvalidSamplingRate(q))
        }
    }

    /// The rate q = batch / population, for an explicit expected batch size and population.
    pub fn from_batch(expected_batch: f64, population: f64) -> Result<Self> {
        Self::new(expected_batch / population)
    }

    /// The value.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl TryFrom<f64> for SamplingRate {
    type Error = AccountantError;
    fn try_from(v: f64) -> Result<Self> {
        Self::new(v)
    }
}

impl From<SamplingRate> for f64 {
    fn from(v: SamplingRate) -> f64 {
        v.0
    }
}

/// Noise multiplier σ > 0 (noise standard deviation / L2 sensitivity).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct NoiseMultiplier(f64);

impl NoiseMultiplier {
    /// Validate a noise multiplier.
    pub fn new(sigma: f64) -> Result<Self> {
        if sigma.is_finite() && sigma > 0.0 {
            Ok(Self(sigma))
        } else {
            Err(AccountantError::InvalidNoiseMultiplier(sigma))
        }
    }

    /// The value.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl TryFrom<f64> for NoiseMultiplier {
    type Error = AccountantError;
    fn try_from(v: f64) -> Result<Self> {
        Self::new(v)
    }
}

impl From<NoiseMultiplier> for f64 {
    fn from(v: NoiseMultiplier) -> f64 {
        v.0
    }
}

/// δ ∈ (0, 1).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Delta(f64);

impl Delta {
    /// Validate δ.
    pub fn new(delta: f64) -> Result<Self> {
        if delta.is_finite() && delta > 0.0 && delta < 1.0 {
            Ok(Self(delta))
        } else {
            Err(AccountantError::InvalidDelta(delta))
        }
    }

    /// The value.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl TryFrom<f64> for Delta {
    type Error = AccountantError;
    fn try_from(v: f64) -> Result<Self> {
        Self::new(v)
    }
}

impl From<Delta> for f64 {
    fn from(v: Delta) -> f64 {
        v.0
    }
}

/// ε ≥ 0, finite.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Epsilon(f64);

impl Epsilon {
    /// Validate ε.
    pub fn new(eps: f64) -> Result<Self> {
        if eps.is_finite() && eps >= 0.0 {
            Ok(Self(eps))
        } else {
            Err(AccountantError::InvalidEpsilon(eps))
        }
    }

    /// The value.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl TryFrom<f64> for Epsilon {
    type Error = AccountantError;
    fn try_from(v: f64) -> Result<Self> {
        Self::new(v)
    }
}

impl From<Epsilon> for f64 {
    fn from(v: Epsilon) -> f64 {
        v.0
    }
}

/// A number of steps (≥ 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Steps(u64);

impl Steps {
    /// Validate a step count.
    pub fn new(t: u64) -> Result<Self> {
        if t == 0 {
            Err(AccountantError::InvalidCount(t))
        } else if t > MAX_TOTAL_STEPS {
            Err(AccountantError::TooManySteps(
                u128::from(t),
                MAX_TOTAL_STEPS,
            ))
        } else {
            Ok(Self(t))
        }
    }

    /// The value.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl TryFrom<u64> for Steps {
    type Error = AccountantError;
    fn try_from(v: u64) -> Result<Self> {
        Self::new(v)
    }
}

impl From<Steps> for u64 {
    fn from(v: Steps) -> u64 {
        v.0
    }
}

/// The Poisson-subsampled Gaussian mechanism: each record is included independently with
/// probability q, the clipped sum (L2 sensitivity 1 after scaling) gets N(0, σ²) noise.
///
/// Accounting is for add/remove adjacency, both directions.
///
/// ```
/// use raptor_accountant::SubsampledGaussian;
/// let m = SubsampledGaussian::new(0.01, 1.0)?;
/// assert_eq!(m.q(), 0.01);
/// # Ok::<(), raptor_accountant::AccountantError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SubsampledGaussian {
    /// Sampling rate.
    pub sampling_rate: SamplingRate,
    /// Noise multiplier.
    pub noise_multiplier: NoiseMultiplier,
}

impl SubsampledGaussian {
    /// Validate and build.
    pub fn new(q: f64, sigma: f64) -> Result<Self> {
        Ok(Self {
            sampling_rate: SamplingRate::new(q)?,
            noise_multiplier: NoiseMultiplier::new(sigma)?,
        })
    }

    /// The plain Gaussian mechanism (q = 1).
    pub fn gaussian(sigma: f64) -> Result<Self> {
        Self::new(1.0, sigma)
    }

    /// Sampling rate q.
    pub fn q(&self) -> f64 {
        self.sampling_rate.get()
    }

    /// Noise multiplier σ.
    pub fn sigma(&self) -> f64 {
        self.noise_multiplier.get()
    }

    /// Bitwise identity of the parameters (used to merge identical mechanisms).
    pub(crate) fn key(&self) -> (u64, u64) {
        (self.q().to_bits(), self.sigma().to_bits())
    }
}

/// Sequential composition of mechanisms, each repeated a number of times, optionally followed by
/// parallel groups (see [`ParallelGroup`]). The whole list is composed exactly in one PRV (never by
/// adding ε's).
///
/// ```
/// use raptor_accountant::{Composition, SubsampledGaussian};
/// let c = Composition::new()
///     .with(SubsampledGaussian::new(0.01, 1.0)?, 10_000)?
///     .with(SubsampledGaussian::new(0.05, 2.0)?, 10_000)?;
/// assert_eq!(c.total_steps(), 20_000);
/// # Ok::<(), raptor_accountant::AccountantError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Composition {
    parts: Vec<(SubsampledGaussian, Steps)>,
    parallel: Vec<ParallelGroup>,
}

impl Composition {
    /// The empty composition (accounting it is an error until something is added).
    pub fn new() -> Self {
        Self::default()
    }

    /// A single mechanism repeated `count` times.
    pub fn single(mech: SubsampledGaussian, count: u64) -> Result<Self> {
        Self::new().with(mech, count)
    }

    /// Add `count` steps of `mech` (merged with an identical mechanism already present).
    pub fn with(mut self, mech: SubsampledGaussian, count: u64) -> Result<Self> {
        self.push(mech, count)?;
        Ok(self)
    }

    /// Add `count` steps of `mech` in place.
    pub fn push(&mut self, mech: SubsampledGaussian, count: u64) -> Result<()> {
        let count = Steps::new(count)?;
        let total = u128::from(self.total_steps()) + u128::from(count.get());
        if total > u128::from(MAX_TOTAL_STEPS) {
            return Err(AccountantError::TooManySteps(total, MAX_TOTAL_STEPS));
        }
        if let Some(entry) = self.parts.iter_mut().find(|(m, _)| m.key() == mech.key()) {
            entry.1 = Steps::new(entry.1.get() + count.get())?;
        } else {
            self.parts.push((mech, count));
        }
        Ok(())
    }

    /// Follow the composition by a parallel group (a record touches exactly one member).
    pub fn then_parallel(mut self, group: ParallelGroup) -> Self {
        self.parallel.push(group);
        self
    }

    /// The sequential parts (mechanism, count).
    pub fn parts(&self) -> impl Iterator<Item = (SubsampledGaussian, u64)> + '_ {
        self.parts.iter().map(|(m, t)| (*m, t.get()))
    }

    /// The parallel groups.
    pub fn parallel_groups(&self) -> &[ParallelGroup] {
        &self.parallel
    }

    /// Number of steps in the sequential parts (parallel groups not included).
    pub fn total_steps(&self) -> u64 {
        self.parts.iter().map(|(_, t)| t.get()).sum()
    }

    /// True when there is nothing to account for.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty() && self.parallel.is_empty()
    }

    /// Expand parallel groups into the list of flat compositions a single record can see
    /// (one per combination of distinct members). The privacy cost is the maximum over them.
    pub(crate) fn expand(&self, limit: u64) -> Result<Vec<Vec<(SubsampledGaussian, u64)>>> {
        if self.is_empty() {
            return Err(AccountantError::EmptyComposition);
        }
        let base: Vec<(SubsampledGaussian, u64)> = self.parts().collect();
        let mut out = vec![base];
        for g in &self.parallel {
            let mut members: Vec<Vec<(SubsampledGaussian, u64)>> = Vec::new();
            for m in g.members() {
                for flat in m.expand(limit)? {
                    let norm = normalize(flat);
                    if !members.contains(&norm) {
                        members.push(norm);
                    }
                }
            }
            let combos = (out.len() as u64).saturating_mul(members.len() as u64);
            if combos > limit {
                return Err(AccountantError::TooManyCombinations(combos, limit));
            }
            let mut next = Vec::with_capacity(combos as usize);
            for o in &out {
                for m in &members {
                    let mut v = o.clone();
                    v.extend(m.iter().copied());
                    next.push(v);
                }
            }
            out = next;
        }
        let mut flat_out = Vec::with_capacity(out.len());
        for v in out {
            let norm = normalize(v);
            let total: u128 = norm.iter().map(|(_, t)| u128::from(*t)).sum();
            if total > u128::from(MAX_TOTAL_STEPS) {
                return Err(AccountantError::TooManySteps(total, MAX_TOTAL_STEPS));
            }
            if norm.is_empty() {
                return Err(AccountantError::EmptyComposition);
            }
            if !flat_out.contains(&norm) {
                flat_out.push(norm);
            }
        }
        Ok(flat_out)
    }
}

/// Merge identical mechanisms and sort by (q, σ) so equal compositions compare equal.
fn normalize(v: Vec<(SubsampledGaussian, u64)>) -> Vec<(SubsampledGaussian, u64)> {
    let mut out: Vec<(SubsampledGaussian, u64)> = Vec::new();
    for (m, t) in v {
        if let Some(e) = out.iter_mut().find(|(x, _)| x.key() == m.key()) {
            e.1 += t;
        } else {
            out.push((m, t));
        }
    }
    out.sort_by(|a, b| {
        a.0.q()
            .total_cmp(&b.0.q())
            .then(a.0.sigma().total_cmp(&b.0.sigma()))
    });
    out
}

/// Parallel composition over a partition: every record touches exactly one member (for
/// example the experts of one RAPTOR layer, each trained on the records it owns). Under
/// add/remove adjacency the group costs its worst member, never the sum of members.
///
/// This type has no way to add its members' costs: accounting it (alone, or inside a
/// [`Composition`] via [`Composition::then_parallel`]) always takes the maximum over members.
///
/// ```
/// use raptor_accountant::{Composition, ParallelGroup, SubsampledGaussian};
/// let expert = Composition::single(SubsampledGaussian::new(0.02, 1.5)?, 1000)?;
/// let layer = ParallelGroup::new(vec![expert.clone(); 8])?;
/// assert_eq!(layer.members().len(), 8);
/// # Ok::<(), raptor_accountant::AccountantError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ParallelGroupRecord", into = "ParallelGroupRecord")]
pub struct ParallelGroup {
    members: Vec<Composition>,
}

/// Serialized form of [`ParallelGroup`]; deserializing re-checks [`ParallelGroup::new`]'s rules
/// (a group with no members would otherwise account as ε = 0).
#[derive(Serialize, Deserialize)]
struct ParallelGroupRecord {
    members: Vec<Composition>,
}

impl TryFrom<ParallelGroupRecord> for ParallelGroup {
    type Error = AccountantError;
    fn try_from(r: ParallelGroupRecord) -> Result<Self> {
        ParallelGroup::new(r.members)
    }
}

impl From<ParallelGroup> for ParallelGroupRecord {
    fn from(g: ParallelGroup) -> Self {
        Self { members: g.members }
    }
}

impl ParallelGroup {
    /// Build from the members (at least one; each non-empty).
    pub fn new(members: Vec<Composition>) -> Result<Self> {
        if members.is_empty() {
            return Err(AccountantError::EmptyParallelGroup);
        }
        if members.iter().any(Composition::is_empty) {
            return Err(AccountantError::EmptyComposition);
        }
        Ok(Self { members })
    }

    /// The members.
    pub fn members(&self) -> &[Composition] {
        &self.members
    }

    /// As a composition (the group alone).
    pub fn into_composition(self) -> Composition {
        Composition::new().then_parallel(self)
    }
}
