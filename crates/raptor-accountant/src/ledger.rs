//! A stateful ledger of the steps taken during training.

use serde::{Deserialize, Serialize};

use crate::error::{AccountantError, Result};
use crate::prv::{EpsilonBounds, PrvAccountant};
use crate::types::{Composition, Delta, Epsilon, MAX_TOTAL_STEPS, Steps, SubsampledGaussian};

/// One distinct mechanism and how many times it ran.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// The mechanism.
    pub mechanism: SubsampledGaussian,
    /// Number of steps.
    pub count: Steps,
}

/// The steps taken so far, compressed to counts per distinct mechanism (in first-use order).
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
/// assert_eq!(ledger.len(), 100);
/// let json = serde_json::to_string(&ledger).unwrap();
/// let back: Ledger = serde_json::from_str(&json).unwrap();
/// assert_eq!(back, ledger);
/// # Ok::<(), raptor_accountant::AccountantError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "LedgerRecord", into = "LedgerRecord")]
pub struct Ledger {
    history: Vec<LedgerEntry>,
    steps: u64,
}

#[derive(Serialize, Deserialize)]
struct LedgerRecord {
    history: Vec<LedgerEntry>,
}

impl TryFrom<LedgerRecord> for Ledger {
    type Error = AccountantError;
    fn try_from(r: LedgerRecord) -> Result<Self> {
        let mut l = Ledger::new();
        for e in r.history {
            l.step_many(e.mechanism, e.count.get())?;
        }
        Ok(l)
    }
}

impl From<Ledger> for LedgerRecord {
    fn from(l: Ledger) -> Self {
        Self { history: l.history }
    }
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record one step of `mech`.
    pub fn step(&mut self, mech: SubsampledGaussian) -> Result<()> {
        self.step_many(mech, 1)
    }

    /// Record `count` steps of `mech`.
    pub fn step_many(&mut self, mech: SubsampledGaussian, count: u64) -> Result<()> {
        let count = Steps::new(count)?.get();
        let total = u128::from(self.steps) + u128::from(count);
        if total > u128::from(MAX_TOTAL_STEPS) {
            return Err(AccountantError::TooManySteps(total, MAX_TOTAL_STEPS));
        }
        if let Some(e) = self
            .history
            .iter_mut()
            .find(|e| e.mechanism.key() == mech.key())
        {
            e.count = Steps::new(e.count.get() + count)?;
        } else {
            self.history.push(LedgerEntry {
                mechanism: mech,
                count: Steps::new(count)?,
            });
        }
        self.steps += count;
        Ok(())
    }

    /// Number of steps recorded.
    pub fn len(&self) -> u64 {
        self.steps
    }

    /// True when no step was recorded.
    pub fn is_empty(&self) -> bool {
        self.steps == 0
    }

    /// The compressed history.
    pub fn history(&self) -> &[LedgerEntry] {
        &self.history
    }

    /// The composition of all recorded steps.
    pub fn composition(&self) -> Result<Composition> {
        let mut c = Composition::new();
        for e in &self.history {
            c.push(e.mechanism, e.count.get())?;
        }
        Ok(c)
    }

    /// ε(δ) spent so far (an error for an empty ledger).
    pub fn epsilon(&self, delta: f64, accountant: &PrvAccountant) -> Result<EpsilonBounds> {
        accountant.epsilon(&self.composition()?, delta)
    }

    /// Would one more step of `next` push the certified ε upper bound at `delta` above
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
