//! The one description every method is made of: **phases** of **releases** over **clip groups**.
//!
//! - A [`ClipGroup`] is a set of parameters clipped together per record (one bound; optionally
//!   weighted by a per-record residual weight before clipping).
//! - A [`ReleaseSpec`] is one released quantity: the clipped sums of some groups + Gaussian
//!   noise of std σΔ (Δ = the L2 sensitivity of those sums) ÷ a public denominator, charged to
//!   the ledger before it is applied, as a sequential step or as one member of a named parallel
//!   group (the experts of one RAPTOR layer).
//! - A [`Phase`] draws one Poisson sample, runs one forward/backward over it and makes its
//!   releases, and is charged **once** for all of them ([`Phase::charge`]: every release of
//!   one sample folded into the one mechanism the sample costs; the rule and its derivation
//!   live in `raptor_accountant::charge`). The [`Plan`] repeats a fixed pattern of phases (RAPTOR's alternation) for a fixed
//!   number of updates, decided before training from public quantities only.
//!
//! ```text
//! raptor (alternating) = phase shared  [group shared: attention LoRA + head, C_s] -> release σ_s, ÷B
//!                      + phase experts [group expert[l,e] per e, owner rows, weight w, C_e]
//!                                      -> one release per expert, σ_e, ÷B/E, parallel over layer l
//! dp-adam-lora         = one phase, one group (all LoRA + head), one release
//! dp-muon              = one phase, one group per hidden matrix (C_W) + one for the rest,
//!                        one release with Δ = sqrt(Σ C_W²)
//! lora / full          = one phase, not private (mean gradient, no clipping, no noise)
//! ```

use std::collections::BTreeMap;
use std::fmt;

use raptor_accountant::{AccountantError, SampleCharge};
use raptor_clip::{ClipError, ClipPolicy, ParamGroups};
use raptor_models::roles::ExpertId;
use serde::{Serialize, Serializer};

/// The streams a plan calibrates noise for. Declared in the order of their names, so that maps
/// keyed by a stream (a record's updates per phase) list them as maps keyed by the name did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stream {
    /// The one stream of a monolithic method (every trainable parameter), or RAPTOR's shared
    /// and expert releases from one sample.
    All,
    /// RAPTOR's expert stream (the routed experts of its layer, one release per expert).
    Experts,
    /// RAPTOR's shared stream (everything trainable outside the routed experts).
    Shared,
}

impl Stream {
    /// The stream's name in records (`shared`, `experts`, `all`).
    pub fn name(self) -> &'static str {
        match self {
            Stream::Shared => "shared",
            Stream::Experts => "experts",
            Stream::All => "all",
        }
    }
}

impl Serialize for Stream {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The noise multiplier of every stream of a plan (0 for a non-private method). Recorded as a
/// map from stream name to σ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sigmas {
    /// One stream: a monolithic method, or one of RAPTOR's one-stream ablations.
    One {
        /// The stream.
        stream: Stream,
        /// Its σ.
        sigma: f64,
    },
    /// RAPTOR: the shared and the expert stream, each with its own σ.
    SharedAndExperts {
        /// σ_s.
        shared: f64,
        /// σ_e.
        experts: f64,
    },
}

impl Sigmas {
    /// Every (stream, σ), in stream-name order (`all`, `experts`, `shared`).
    pub fn iter(&self) -> impl Iterator<Item = (Stream, f64)> {
        let v = match *self {
            Sigmas::One { stream, sigma } => vec![(stream, sigma)],
            Sigmas::SharedAndExperts { shared, experts } => {
                vec![(Stream::Experts, experts), (Stream::Shared, shared)]
            }
        };
        v.into_iter()
    }

    /// σ of the stream that carries the routed experts' coordinates (RAPTOR's expert stream,
    /// else the one stream), if the plan has one.
    pub fn experts(&self) -> Option<f64> {
        match *self {
            Sigmas::SharedAndExperts { experts, .. } => Some(experts),
            Sigmas::One {
                stream: Stream::Experts | Stream::All,
                sigma,
            } => Some(sigma),
            Sigmas::One {
                stream: Stream::Shared,
                ..
            } => None,
        }
    }
}

impl Serialize for Sigmas {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let m: BTreeMap<&str, f64> = self.iter().map(|(k, v)| (k.name(), v)).collect();
        m.serialize(s)
    }
}

/// A clip group's identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupId {
    /// RAPTOR's shared stream.
    Shared,
    /// One routed expert's stream.
    Expert(ExpertId),
    /// Every trainable parameter (a monolithic method).
    All,
    /// One hidden matrix, clipped on its own (the DP-Muon family).
    Matrix(String),
    /// What the DP-Muon family clips together outside the hidden matrices.
    Rest,
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupId::Shared => f.write_str("shared"),
            GroupId::Expert(id) => id.fmt(f),
            GroupId::All => f.write_str("all"),
            GroupId::Matrix(name) => f.write_str(name),
            GroupId::Rest => f.write_str("rest"),
        }
    }
}

impl Serialize for GroupId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Parameters clipped together per record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClipGroup {
    /// The group (written `shared`, `expert[3,5]`, `all`, a matrix name, `rest` in records).
    pub name: GroupId,
    /// Parameter names (Hugging Face names).
    pub params: Vec<String>,
    /// Per-record L2 bound of the group's (weighted) gradient.
    pub bound: f64,
    /// Multiply each record's gradient by its residual weight before clipping.
    pub weighted: bool,
    /// False: the group only enters the global clip factor (its sums are not released in this
    /// phase, e.g. the shared stream under RAPTOR's `expert_clip = "global"` ablation).
    pub release: bool,
}

/// How a release is charged to the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Charge {
    /// A sequential step.
    Sequential,
    /// The release of one routed expert: a member of its layer's parallel group (each
    /// record touches exactly one member: its owner's).
    Parallel(ExpertId),
    /// Not private: nothing is charged (ε = ∞).
    None,
}

/// One released quantity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReleaseSpec {
    /// Release name.
    pub name: String,
    /// The clip groups released together.
    pub groups: Vec<GroupId>,
    /// Noise multiplier σ (0 only for non-private phases and tests).
    pub sigma: f64,
    /// The public denominator (B, or B/E for experts).
    pub denominator: f64,
    /// How it is charged.
    pub charge: Charge,
}

/// Residual weighting of weighted groups (RAPTOR's expert loss).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Residual {
    /// No weighting (w = 1).
    None,
    /// w = 1 − p_shared(y|x) (detached, expert LoRA switched off).
    Prob,
    /// w = 1 if the shared margin p(y) − max_{c≠y} p(c) < 0.2, else 0.
    Margin,
}

/// One sample, one forward/backward, its releases.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    /// The stream the phase releases: `shared`, `experts`, or `all` (a monolithic method, or
    /// RAPTOR's shared and expert releases from one sample).
    pub name: Stream,
    /// Clip groups (every parameter trained in this phase is in exactly one).
    pub groups: Vec<ClipGroup>,
    /// `Some(C)`: one clip factor per record over all groups together (global clipping).
    pub global_clip: Option<f64>,
    /// Releases (every group is in exactly one).
    pub releases: Vec<ReleaseSpec>,
    /// Owner masks (expert gradients from owned records only), per sparse layer.
    pub owner_layers: Vec<usize>,
    /// Residual weighting of the weighted groups.
    pub residual: Residual,
    /// LoRA modules switched off for the residual's shared-only logits.
    pub residual_disable: Vec<String>,
    /// False: a non-private phase (mean gradient ÷ the public denominator, no clip, no noise).
    pub private: bool,
}

impl Phase {
    /// Every parameter whose gradient the phase computes (released or norm-only).
    pub fn params(&self) -> Vec<String> {
        let mut v: Vec<String> = self.groups.iter().flat_map(|g| g.params.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// The group `id`.
    pub fn group(&self, id: &GroupId) -> Option<&ClipGroup> {
        self.groups.iter().find(|g| g.name == *id)
    }

    /// The phase's grouped clipping, in raptor-clip's one definition: every parameter in its
    /// group (norm-only groups included: they enter a global clip factor), and each group's
    /// bound, or the one global bound. The engine clips with it, and each release's
    /// sensitivity comes from it.
    pub fn clipping(&self) -> (ParamGroups<GroupId>, ClipPolicy<GroupId>) {
        let mut groups = ParamGroups::new();
        for g in &self.groups {
            for p in &g.params {
                groups.assign(p.clone(), g.name.clone());
            }
        }
        let policy = match self.global_clip {
            Some(c) => ClipPolicy::Global(c),
            None => ClipPolicy::RoleWise(
                self.groups
                    .iter()
                    .map(|g| (g.name.clone(), g.bound))
                    .collect(),
            ),
        };
        (groups, policy)
    }

    /// L2 sensitivity of a release's sums under the phase's clipping: C under global clipping,
    /// else √(Σ bound²) over its groups. A group the phase does not have, a bad bound or a
    /// release of no group is an error (never a silent 0).
    pub fn sensitivity(&self, release: &ReleaseSpec) -> Result<f64, ClipError> {
        if let Some(g) = release.groups.iter().find(|g| self.group(g).is_none()) {
            return Err(ClipError::InvalidGrouping {
                reason: format!(
                    "release {} names group {g}, which the phase lacks",
                    release.name
                ),
            });
        }
        self.clipping().1.sensitivity(&release.groups)
    }
}

/// What one update of a phase costs the ledger.
#[derive(Debug, Clone, PartialEq)]
pub enum PhaseCharge {
    /// Every release of the update's sample, folded into one charge (one ledger step).
    Charged(SampleCharge),
    /// A non-private phase: nothing is charged (ε = ∞).
    NotPrivate,
    /// A private phase with `releases` releases of σ ≤ 0 (tests only): the update cannot be
    /// charged, and the run has no finite ε.
    Unaccountable {
        /// How many releases have σ ≤ 0.
        releases: u64,
    },
}

impl Phase {
    /// What one update of this phase costs: its releases all come from the update's one
    /// Poisson sample (rate `q`), so they are charged together as one [`SampleCharge`] —
    /// sequential releases add their 1/σ², a parallel group (the experts of a layer) adds its
    /// worst member's — never release by release.
    pub fn charge(&self, q: f64) -> Result<PhaseCharge, AccountantError> {
        if !self.private || self.releases.iter().all(|r| r.charge == Charge::None) {
            return Ok(PhaseCharge::NotPrivate);
        }
        let zero = self
            .releases
            .iter()
            .filter(|r| r.charge != Charge::None && (r.sigma.is_nan() || r.sigma <= 0.0))
            .count() as u64;
        if zero > 0 {
            return Ok(PhaseCharge::Unaccountable { releases: zero });
        }
        Ok(PhaseCharge::Charged(sample_charge(
            q,
            self.releases.iter().map(|r| (&r.charge, r.sigma)),
        )?))
    }
}

/// Noise multiplier, bound (L2 sensitivity), public denominator of one release.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReleaseNoiseSpec {
    /// σ.
    pub sigma: f64,
    /// The release's sensitivity (its bound).
    pub bound: f64,
    /// The public denominator.
    pub denominator: f64,
    /// Whether its phase clips globally (one factor over every group).
    pub global_clip: bool,
}

/// The one charge of the releases `releases` (how each is charged, its noise multiplier) made
/// from one Poisson sample at rate `q`: sequential releases add their 1/σ², each layer's
/// parallel group of expert releases its worst member's ([`SampleCharge`]). The plan's charge
/// ([`Phase::charge`]) and the trainer's charge of the releases it made are both this.
pub fn sample_charge<'a>(
    q: f64,
    releases: impl IntoIterator<Item = (&'a Charge, f64)>,
) -> Result<SampleCharge, AccountantError> {
    let mut sample = SampleCharge::new(q)?;
    for (charge, sigma) in releases {
        match charge {
            Charge::None => {}
            Charge::Sequential => {
                sample.release(sigma)?;
            }
            Charge::Parallel(id) => {
                sample.member_release(id.layer, id.expert, sigma)?;
            }
        }
    }
    Ok(sample)
}

/// Which optimizer updates a parameter (defined in `raptor-optim`).
pub use raptor_optim::Optim;

/// How many times each of `phases` phases runs in `updates` updates of a repeated `pattern`
/// (a pattern entry that names no phase counts for none; an empty pattern runs nothing).
pub fn pattern_counts(pattern: &[usize], phases: usize, updates: u64) -> Vec<u64> {
    let mut c = vec![0u64; phases];
    let per = pattern.len() as u64;
    if per == 0 {
        return c;
    }
    let (full, rest) = (updates / per, updates % per);
    for (i, &p) in pattern.iter().enumerate() {
        if let Some(n) = c.get_mut(p) {
            *n += full + u64::from((i as u64) < rest);
        }
    }
    c
}

/// The whole schedule, fixed before training.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The phases.
    pub phases: Vec<Phase>,
    /// The cyclic pattern of phase indices (e.g. `[0, 1]`: shared then experts).
    pub pattern: Vec<usize>,
    /// Total updates (phase executions).
    pub updates: u64,
    /// Sampling rate q = B/N of every phase.
    pub q: f64,
    /// Expected batch B = qN.
    pub expected_batch: f64,
    /// Optimizer of each trainable parameter.
    pub optim: Vec<(String, Optim)>,
    /// Trainable parameters of routed experts, with the expert that owns each: the only ones
    /// that may get no per-sample gradient from a non-empty micro-batch (no token routed to
    /// the expert). Any other trainable parameter of a phase that a non-empty micro-batch
    /// leaves without gradient is an error, not a noise-only release: its forward pass does
    /// not use it.
    pub routed: BTreeMap<String, ExpertId>,
}

impl Plan {
    /// The phase run at update `t` (0-based).
    pub fn phase_at(&self, t: u64) -> usize {
        self.pattern[(t % self.pattern.len() as u64) as usize]
    }

    /// How many of the first `updates` updates charge the ledger (one step each: every update of
    /// a private phase is one [`SampleCharge`]); what a resumed run's ledger must hold at least.
    pub fn charged_updates(&self, updates: u64) -> Result<u64, AccountantError> {
        let charges: Vec<bool> = self
            .phases
            .iter()
            .map(|p| {
                p.charge(self.q)
                    .map(|c| matches!(c, PhaseCharge::Charged(_)))
            })
            .collect::<Result<_, _>>()?;
        let per_phase = pattern_counts(&self.pattern, self.phases.len(), updates);
        Ok(per_phase
            .iter()
            .zip(&charges)
            .filter(|(_, c)| **c)
            .map(|(n, _)| n)
            .sum())
    }

    /// How many times each phase runs in `updates` updates.
    pub fn phase_counts(&self) -> Vec<u64> {
        pattern_counts(&self.pattern, self.phases.len(), self.updates)
    }

    /// The noise multiplier, clip bound and public denominator of the releases that carry the
    /// routed experts' coordinates: RAPTOR's expert releases (a parallel group's member), else
    /// the first private release of a one-release phase (a monolithic method). None when no
    /// private phase releases anything.
    pub fn expert_release_noise(&self) -> Result<Option<ReleaseNoiseSpec>, ClipError> {
        let private = || self.phases.iter().filter(|p| p.private);
        let pick = |ph: &Phase, r: &ReleaseSpec| -> Result<ReleaseNoiseSpec, ClipError> {
            Ok(ReleaseNoiseSpec {
                sigma: r.sigma,
                bound: ph.sensitivity(r)?,
                denominator: r.denominator,
                global_clip: ph.global_clip.is_some(),
            })
        };
        for ph in private() {
            if let Some(r) = ph
                .releases
                .iter()
                .find(|r| matches!(r.charge, Charge::Parallel(_)))
            {
                return pick(ph, r).map(Some);
            }
        }
        private()
            .find_map(|ph| ph.releases.first().map(|r| (ph, r)))
            .map(|(ph, r)| pick(ph, r))
            .transpose()
    }

    /// The noise multiplier, clip bound and public denominator of the release that carries the
    /// shared stream: RAPTOR's shared release, else (a monolithic method) the first private
    /// release, as [`Self::expert_release_noise`]. None when no private phase releases anything.
    pub fn shared_release_noise(&self) -> Result<Option<ReleaseNoiseSpec>, ClipError> {
        let private = || self.phases.iter().filter(|p| p.private);
        for ph in private() {
            if let Some(r) = ph
                .releases
                .iter()
                .find(|r| r.groups.contains(&GroupId::Shared))
            {
                return Ok(Some(ReleaseNoiseSpec {
                    sigma: r.sigma,
                    bound: ph.sensitivity(r)?,
                    denominator: r.denominator,
                    global_clip: ph.global_clip.is_some(),
                }));
            }
        }
        let first = private().find_map(|ph| ph.releases.first().map(|r| (ph, r)));
        first
            .map(|(ph, r)| {
                Ok(ReleaseNoiseSpec {
                    sigma: r.sigma,
                    bound: ph.sensitivity(r)?,
                    denominator: r.denominator,
                    global_clip: ph.global_clip.is_some(),
                })
            })
            .transpose()
    }

    /// Every trainable parameter.
    pub fn params(&self) -> Vec<String> {
        let mut v: Vec<String> = self.phases.iter().flat_map(Phase::params).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Checks the plan's invariants: every group in exactly one release, parallel members
    /// numbered 0..n, σ > 0 in private phases, positive denominators and bounds.
    pub fn check(&self) -> Result<(), PlanIssue> {
        if self.pattern.is_empty() || self.pattern.iter().any(|&p| p >= self.phases.len()) {
            return Err(PlanIssue::Pattern);
        }
        for ph in &self.phases {
            for g in &ph.groups {
                let n = ph
                    .releases
                    .iter()
                    .filter(|r| r.groups.contains(&g.name))
                    .count();
                if n != usize::from(g.release) {
                    return Err(PlanIssue::GroupReleases {
                        group: g.name.clone(),
                        phase: ph.name,
                        releases: n,
                    });
                }
                if g.bound.is_nan() || g.bound <= 0.0 {
                    return Err(PlanIssue::Bound {
                        group: g.name.clone(),
                        bound: g.bound,
                    });
                }
            }
            for r in &ph.releases {
                if !(r.denominator.is_finite() && r.denominator > 0.0) {
                    return Err(PlanIssue::Denominator {
                        release: r.name.clone(),
                        denominator: r.denominator,
                    });
                }
                if ph.private && !(r.sigma.is_finite() && r.sigma >= 0.0) {
                    return Err(PlanIssue::Sigma {
                        release: r.name.clone(),
                        sigma: r.sigma,
                    });
                }
            }
        }
        Ok(())
    }
}

/// A broken invariant of a [`Plan`] ([`Plan::check`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanIssue {
    /// The phase pattern is empty or names a phase that does not exist.
    #[error("the phase pattern is empty or names a missing phase")]
    Pattern,
    /// A released group is not in exactly one release of its phase (a norm-only group in none).
    #[error("group {group} is in {releases} releases of phase {phase}")]
    GroupReleases {
        /// The group.
        group: GroupId,
        /// Its phase.
        phase: Stream,
        /// The releases that name it.
        releases: usize,
    },
    /// A clip bound that is not positive.
    #[error("group {group} has bound {bound}")]
    Bound {
        /// The group.
        group: GroupId,
        /// Its bound.
        bound: f64,
    },
    /// A public denominator that is not finite and positive.
    #[error("release {release} has denominator {denominator}")]
    Denominator {
        /// The release.
        release: String,
        /// Its denominator.
        denominator: f64,
    },
    /// A private release's noise multiplier that is not finite and ≥ 0.
    #[error("release {release} has sigma {sigma}")]
    Sigma {
        /// The release.
        release: String,
        /// Its σ.
        sigma: f64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn group(name: &str, bound: f64, release: bool) -> ClipGroup {
        ClipGroup {
            name: GroupId::Matrix(name.into()),
            params: vec![format!("{name}.weight")],
            bound,
            weighted: false,
            release,
        }
    }

    fn release(name: &str, groups: &[&str], sigma: f64, denominator: f64) -> ReleaseSpec {
        ReleaseSpec {
            name: name.into(),
            groups: groups
                .iter()
                .map(|g| GroupId::Matrix(g.to_string()))
                .collect(),
            sigma,
            denominator,
            charge: Charge::Sequential,
        }
    }

    fn phase(name: &str, groups: Vec<ClipGroup>, releases: Vec<ReleaseSpec>) -> Phase {
        Phase {
            name: match name {
                "shared" => Stream::Shared,
                "experts" => Stream::Experts,
                _ => Stream::All,
            },
            groups,
            global_clip: None,
            releases,
            owner_layers: vec![],
            residual: Residual::None,
            residual_disable: vec![],
            private: true,
        }
    }

    fn plan(phases: Vec<Phase>, pattern: Vec<usize>, updates: u64) -> Plan {
        Plan {
            phases,
            pattern,
            updates,
            q: 0.01,
            expected_batch: 10.0,
            optim: vec![],
            routed: BTreeMap::new(),
        }
    }

    fn valid() -> Plan {
        plan(
            vec![
                phase(
                    "shared",
                    vec![group("a", 1.0, true), group("b", 2.0, true)],
                    vec![release("s", &["a", "b"], 1.5, 10.0)],
                ),
                phase(
                    "experts",
                    vec![group("e0", 0.5, true), group("g", 1.0, false)],
                    vec![release("e0", &["e0"], 0.0, 2.5)],
                ),
            ],
            vec![0, 0, 1],
            10,
        )
    }

    proptest! {
        #[test]
        fn phase_counts_count_phase_at_over_the_run(
            pattern in prop::collection::vec(0usize..4, 1..9),
            updates in 0u64..200,
        ) {
            let phases = (0..4).map(|i| phase(&format!("p{i}"), vec![], vec![])).collect();
            let p = plan(phases, pattern, updates);
            let mut want = vec![0u64; 4];
            for t in 0..updates {
                want[p.phase_at(t)] += 1;
            }
            prop_assert_eq!(p.phase_counts(), want);
        }
    }

    #[test]
    fn phase_at_repeats_the_pattern() {
        let p = valid();
        let got: Vec<usize> = (0..7).map(|t| p.phase_at(t)).collect();
        assert_eq!(got, vec![0, 0, 1, 0, 0, 1, 0]);
        // 10 updates of [0, 0, 1]: 3 full rounds and one more update of phase 0
        assert_eq!(p.phase_counts(), vec![7, 3]);
    }

    #[test]
    fn sensitivity_is_the_global_bound_or_the_root_sum_of_squares() {
        let mut p = valid();
        let ph = &p.phases[0];
        assert_eq!(ph.sensitivity(&ph.releases[0]), Ok(5f64.sqrt()));
        p.phases[0].global_clip = Some(0.75);
        let ph = &p.phases[0];
        assert_eq!(ph.sensitivity(&ph.releases[0]), Ok(0.75));
        // Never a silent 0 (the old form summed over the groups it found): a release naming a
        // group the phase lacks, or of no group, is an error.
        let mut r = ph.releases[0].clone();
        r.groups.push(GroupId::Matrix("absent".into()));
        assert!(
            ph.sensitivity(&r)
                .unwrap_err()
                .to_string()
                .contains("absent")
        );
        r.groups.clear();
        assert!(ph.sensitivity(&r).is_err());
    }

    #[test]
    fn check_accepts_a_valid_plan_and_names_each_broken_invariant() {
        assert_eq!(valid().check(), Ok(()));
        let broken = |f: &dyn Fn(&mut Plan)| {
            let mut p = valid();
            f(&mut p);
            p.check().unwrap_err().to_string()
        };
        assert!(broken(&|p| p.pattern.clear()).contains("pattern"));
        assert!(broken(&|p| p.pattern.push(2)).contains("missing phase"));
        // a released group in no release, and in two
        let e = broken(&|p| p.phases[0].releases[0].groups.pop().map_or((), |_| ()));
        assert!(
            e.contains("group b is in 0 releases of phase shared"),
            "{e}"
        );
        let e = broken(&|p| {
            let r = release("s2", &["a"], 1.0, 10.0);
            p.phases[0].releases.push(r)
        });
        assert!(e.contains("group a is in 2 releases"), "{e}");
        // a norm-only group must be in no release
        let e = broken(&|p| {
            p.phases[1].releases[0]
                .groups
                .push(GroupId::Matrix("g".into()))
        });
        assert!(e.contains("group g is in 1 releases"), "{e}");
        for bad in [0.0, -1.0, f64::NAN] {
            let e = broken(&|p| p.phases[0].groups[1].bound = bad);
            assert!(e.contains("group b has bound"), "{bad}: {e}");
        }
        for bad in [0.0, -2.0, f64::NAN, f64::INFINITY] {
            let e = broken(&|p| p.phases[0].releases[0].denominator = bad);
            assert!(e.contains("release s has denominator"), "{bad}: {e}");
        }
        for bad in [-0.5, f64::NAN, f64::INFINITY] {
            let e = broken(&|p| p.phases[0].releases[0].sigma = bad);
            assert!(e.contains("release s has sigma"), "{bad}: {e}");
        }
        // σ is not checked in a non-private phase; a tiny positive bound is fine
        let mut p = valid();
        p.phases[0].private = false;
        p.phases[0].releases[0].sigma = f64::NAN;
        p.phases[1].groups[0].bound = f64::MIN_POSITIVE;
        assert_eq!(p.check(), Ok(()));
    }
}
