//! A stateful ledger of the steps taken during training: one charge per Poisson sample
//! ([`Ledger::charge`], the rule in [`crate::charge`]), never one per release.

use serde::{Deserialize, Serialize};

use crate::charge::SampleCharge;
use crate::error::{AccountantError, Result};
use crate::prv::{EpsilonBounds, PrvAccountant};
use crate::types::{
    Composition, Delta, Epsilon, MAX_TOTAL_STEPS, ParallelGroup, Steps, SubsampledGaussian,
};

/// One distinct mechanism and how many times it ran.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// The mechanism.
    pub mechanism: SubsampledGaussian,
    /// Number of steps.
    pub count: Steps,
}

/// One named parallel group of a ledger written by an earlier version of raptor, which charged
/// the expert streams of a RAPTOR layer as a parallel group of their own (every record touches
/// exactly one member, so the group costs its worst member's whole history). Such a ledger
/// still loads and is accounted as it was written; new charges never create one: a sample's
/// parallel releases are folded into its one [`SampleCharge`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParallelEntry {
    /// The group's name (e.g. `experts[layer 3]`).
    pub group: String,
    /// Per member, its compressed history (mechanism, count).
    pub members: Vec<Vec<LedgerEntry>>,
    /// Number of parallel steps taken by the group.
    pub steps: u64,
}

/// The samples charged so far, one mechanism per sample ([`Ledger::charge`]), compressed to
/// counts per distinct mechanism (in first-use order), and the number of releases they made.
///
/// A sample that made several releases (RAPTOR's shared and expert streams without
/// alternation, the expert streams of a layer) is charged once, with the one mechanism that
/// all its releases together amount to ([`SampleCharge`]): charging its releases one by one
/// would treat them as independent samples and under-report ε. [`Ledger::step`] is the charge
/// of a sample that made one release.
///
/// Serialization stores the history only (not numerical state): a resumed run re-accounts the
/// same composition and can never under-count ε.
///
/// ```
/// use raptor_accountant::{Ledger, PrvAccountant, SubsampledGaussian};
/// let mut ledger = Ledger::new();
/// let m = SubsampledGaussian::new(0.01, 1.0)?;
/// for _ in 0..100 {
///     ledger.step(m)?;
/// }
/// assert_eq!((ledger.len(), ledger.releases()), (100, 100));
/// let json = serde_json::to_string(&ledger).unwrap();
/// let back: Ledger = serde_json::from_str(&json).unwrap();
/// assert_eq!(back, ledger);
/// # Ok::<(), raptor_accountant::AccountantError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "LedgerRecord", into = "LedgerRecord")]
pub struct Ledger {
    history: Vec<LedgerEntry>,
    parallel: Vec<ParallelEntry>,
    steps: u64,
    releases: u64,
}

#[derive(Serialize, Deserialize)]
struct LedgerRecord {
    history: Vec<LedgerEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    parallel: Vec<ParallelRecord>,
    /// Releases charged; absent in ledgers of earlier versions (one release per sequential
    /// step and one per member of each parallel step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    releases: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct ParallelRecord {
    group: String,
    members: Vec<Vec<LedgerEntry>>,
    steps: u64,
}

fn push_entry(history: &mut Vec<LedgerEntry>, mech: SubsampledGaussian, count: u64) -> Result<()> {
    if let Some(e) = history.iter_mut().find(|e| e.mechanism.key() == mech.key()) {
        e.count = Steps::new(e.count.get() + count)?;
    } else {
        history.push(LedgerEntry {
            mechanism: mech,
            count: Steps::new(count)?,
        });
    }
    Ok(())
}

impl TryFrom<LedgerRecord> for Ledger {
    type Error = AccountantError;
    fn try_from(r: LedgerRecord) -> Result<Self> {
        let mut l = Ledger::new();
        for e in r.history {
            l.step_many(e.mechanism, e.count.get())?;
        }
        let recorded = r.releases;
        for p in r.parallel {
            if p.members.is_empty() {
                return Err(AccountantError::EmptyParallelGroup);
            }
            // Each member's history must hold exactly `steps` steps (one per parallel step).
            for m in &p.members {
                let total: u128 = m.iter().map(|e| u128::from(e.count.get())).sum();
                if total != u128::from(p.steps) {
                    return Err(AccountantError::ParallelWidth {
                        group: p.group.clone(),
                        expected: p.steps as usize,
                        got: total as usize,
                    });
                }
            }
            l.add_steps(p.steps)?;
            l.releases = l
                .releases
                .saturating_add(p.steps.saturating_mul(p.members.len() as u64));
            l.parallel.push(ParallelEntry {
                group: p.group,
                members: p.members,
                steps: p.steps,
            });
        }
        if let Some(n) = recorded {
            // Every charged sample made at least one release.
            if n < l.steps {
                return Err(AccountantError::InvalidCount(n));
            }
            l.releases = n;
        }
        Ok(l)
    }
}

impl From<Ledger> for LedgerRecord {
    fn from(l: Ledger) -> Self {
        Self {
            history: l.history,
            parallel: l
                .parallel
                .into_iter()
                .map(|p| ParallelRecord {
                    group: p.group,
                    members: p.members,
                    steps: p.steps,
                })
                .collect(),
            releases: Some(l.releases),
        }
    }
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Charge one sample that made one release of `mech`.
    pub fn step(&mut self, mech: SubsampledGaussian) -> Result<()> {
        self.step_many(mech, 1)
    }

    /// Charge `count` samples, each of which made one release of `mech`.
    pub fn step_many(&mut self, mech: SubsampledGaussian, count: u64) -> Result<()> {
        let count = Steps::new(count)?.get();
        self.check_room(count)?;
        push_entry(&mut self.history, mech, count)?;
        self.steps += count;
        self.releases = self.releases.saturating_add(count);
        Ok(())
    }

    /// Charge one sample with everything it released: one step of the one mechanism all its
    /// releases amount to ([`SampleCharge::mechanism`]; the derivation is in
    /// [`crate::charge`]). Returns that mechanism.
    ///
    /// ```
    /// use raptor_accountant::{Ledger, PrvAccountant, SampleCharge, SubsampledGaussian};
    /// // Two releases of σ = 1 from one sample cost one step of σ = 1/√2, not two of σ = 1.
    /// let mut charge = SampleCharge::new(0.05)?;
    /// charge.release(1.0)?;
    /// charge.release(1.0)?;
    /// let (mut one_sample, mut two_samples) = (Ledger::new(), Ledger::new());
    /// for _ in 0..50 {
    ///     let m = one_sample.charge(&charge)?;
    ///     assert!((m.sigma() - 0.5f64.sqrt()).abs() < 1e-12);
    ///     two_samples.step_many(SubsampledGaussian::new(0.05, 1.0)?, 2)?;
    /// }
    /// assert_eq!((one_sample.len(), one_sample.releases()), (50, 100));
    /// let acc = PrvAccountant::default();
    /// let eps = |l: &Ledger| l.epsilon(1e-5, &acc).map(|e| e.upper);
    /// assert!(eps(&one_sample)? > 1.2 * eps(&two_samples)?);
    /// # Ok::<(), raptor_accountant::AccountantError>(())
    /// ```
    pub fn charge(&mut self, sample: &SampleCharge) -> Result<SubsampledGaussian> {
        let mech = sample.mechanism()?;
        self.check_room(1)?;
        push_entry(&mut self.history, mech, 1)?;
        self.steps += 1;
        self.releases = self.releases.saturating_add(sample.releases());
        Ok(mech)
    }

    fn check_room(&self, count: u64) -> Result<()> {
        let total = u128::from(self.steps) + u128::from(count);
        if total > u128::from(MAX_TOTAL_STEPS) {
            return Err(AccountantError::TooManySteps(total, MAX_TOTAL_STEPS));
        }
        Ok(())
    }

    fn add_steps(&mut self, count: u64) -> Result<()> {
        self.check_room(count)?;
        self.steps += count;
        Ok(())
    }

    /// The named parallel groups of a ledger written by an earlier version (empty for a ledger
    /// charged by this one).
    pub fn parallel_groups(&self) -> &[ParallelEntry] {
        &self.parallel
    }

    /// Number of samples charged (a sample that made several releases counts once).
    pub fn len(&self) -> u64 {
        self.steps
    }

    /// Number of releases the charged samples made.
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// True when no step was recorded.
    pub fn is_empty(&self) -> bool {
        self.steps == 0
    }

    /// The compressed history.
    pub fn history(&self) -> &[LedgerEntry] {
        &self.history
    }

    /// The composition of all recorded steps: the sequential history, then each parallel
    /// group as a [`ParallelGroup`] of its members' histories.
    pub fn composition(&self) -> Result<Composition> {
        let mut c = Composition::new();
        for e in &self.history {
            c.push(e.mechanism, e.count.get())?;
        }
        for p in &self.parallel {
            let mut members = Vec::with_capacity(p.members.len());
            for m in &p.members {
                let mut mc = Composition::new();
                for e in m {
                    mc.push(e.mechanism, e.count.get())?;
                }
                members.push(mc);
            }
            c = c.then_parallel(ParallelGroup::new(members)?);
        }
        Ok(c)
    }

    /// ε(δ) spent so far (an error for an empty ledger).
    pub fn epsilon(&self, delta: f64, accountant: &PrvAccountant) -> Result<EpsilonBounds> {
        accountant.epsilon(&self.composition()?, delta)
    }

    /// Would one more sample charged as `next` push the certified ε upper bound at `delta` above
    /// `epsilon_budget`?
    pub fn would_exceed(
        &self,
        next: SubsampledGaussian,
        epsilon_budget: f64,
        delta: f64,
        accountant: &PrvAccountant,
    ) -> Result<bool> {
        let budget = Epsilon::new(epsilon_budget)?.get();
        let delta = Delta::new(delta)?.get();
        let mut c = self.composition()?;
        c.push(next, 1)?;
        Ok(accountant.epsilon(&c, delta)?.upper > budget)
    }
}
