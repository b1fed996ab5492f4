//! A stateful ledger of the steps taken during training.

use serde::{Deserialize, Serialize};

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

/// One named parallel group of a ledger (e.g. the expert streams of one RAPTOR layer): every
/// record touches exactly one member, so the group costs its worst member's whole history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParallelEntry {
    /// The group's name (e.g. `experts[layer 3]`).
    pub group: String,
    /// Per member, its compressed history (mechanism, count).
    pub members: Vec<Vec<LedgerEntry>>,
    /// Number of parallel steps taken by the group.
    pub steps: u64,
}

/// The steps taken so far, compressed to counts per distinct mechanism (in first-use order),
/// plus named parallel groups ([`Ledger::step_parallel`]).
///
/// Serialization stores the history only (not numerical state): a resumed run re-accounts the
/// same composition, parallel groups included, and can never under-count ε.
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
    parallel: Vec<ParallelEntry>,
    steps: u64,
}

#[derive(Serialize, Deserialize)]
struct LedgerRecord {
    history: Vec<LedgerEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    parallel: Vec<ParallelRecord>,
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
            l.parallel.push(ParallelEntry {
                group: p.group,
                members: p.members,
                steps: p.steps,
            });
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
        }
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
        self.check_room(count)?;
        push_entry(&mut self.history, mech, count)?;
        self.steps += count;
        Ok(())
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

    /// Record one parallel step of the named group: member `i` (e.g. expert `i` of a RAPTOR
    /// layer) ran `members[i]` on the records it owns. Every record belongs to exactly one
    /// member for the whole run (the caller's partition is fixed), so the group costs the worst
    /// member's whole history, never the sum over members. The first step fixes the number of
    /// members; a later step with another width is an error.
    ///
    /// ```
    /// use raptor_accountant::{Ledger, PrvAccountant, SubsampledGaussian};
    /// let m = SubsampledGaussian::new(0.05, 1.0)?;
    /// let (mut one, mut eight) = (Ledger::new(), Ledger::new());
    /// for _ in 0..50 {
    ///     one.step(m)?;
    ///     eight.step_parallel("experts[layer 1]", &[m; 8])?;
    /// }
    /// let acc = PrvAccountant::default();
    /// assert_eq!(one.epsilon(1e-5, &acc)?.upper, eight.epsilon(1e-5, &acc)?.upper);
    /// # Ok::<(), raptor_accountant::AccountantError>(())
    /// ```
    pub fn step_parallel(&mut self, group: &str, members: &[SubsampledGaussian]) -> Result<()> {
        if members.is_empty() {
            return Err(AccountantError::EmptyParallelGroup);
        }
        self.check_room(1)?;
        let pos = match self.parallel.iter().position(|p| p.group == group) {
            Some(i) => {
                let expected = self.parallel[i].members.len();
                if expected != members.len() {
                    return Err(AccountantError::ParallelWidth {
                        group: group.to_string(),
                        expected,
                        got: members.len(),
                    });
                }
                i
            }
            None => {
                self.parallel.push(ParallelEntry {
                    group: group.to_string(),
                    members: vec![Vec::new(); members.len()],
                    steps: 0,
                });
                self.parallel.len() - 1
            }
        };
        let entry = &mut self.parallel[pos];
        for (hist, m) in entry.members.iter_mut().zip(members) {
            push_entry(hist, *m, 1)?;
        }
        entry.steps += 1;
        self.steps += 1;
        Ok(())
    }

    /// The named parallel groups.
    pub fn parallel_groups(&self) -> &[ParallelEntry] {
        &self.parallel
    }

    /// Number of steps recorded (a parallel step counts once).
    pub fn len(&self) -> u64 {
        self.steps
    }

    /// Number of releases recorded: sequential steps plus, per parallel step, one per member.
    pub fn releases(&self) -> u64 {
        let seq: u64 = self.history.iter().map(|e| e.count.get()).sum();
        let par: u64 = self
            .parallel
            .iter()
            .map(|p| p.steps.saturating_mul(p.members.len() as u64))
            .sum();
        seq.saturating_add(par)
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
