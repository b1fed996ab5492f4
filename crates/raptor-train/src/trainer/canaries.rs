//! The white-box audit's hook in the loop (`DiracCanaries`: crate `raptor-audit`, behind
//! `raptor audit --kind dirac|paired`, is the one caller).
//!
//! A white-box audit run adds *Dirac canaries*: records whose gradient, before clipping, is a
//! fixed vector of a few coordinates of trainable parameters (one coordinate, or a shared
//! coordinate and a coordinate of the canary's owner expert). The included canaries are
//! records of the run past the real ones: the Poisson sampler draws every record, real or
//! canary, at the plan's q. A drawn canary skips the forward pass; what it adds to the clipped
//! sums of the phase is what the phase's clipping and owner masks make of its gradient, by the
//! same rules as for a real record: each coordinate in a routed expert's parameter counts only
//! when the expert is the canary's owner (owner masks), and each clip group's part is scaled by
//! [`raptor_models::clip_factors`] of its norm (or, under global clipping, of the whole
//! gradient's), so a canary never moves a release by more than its sensitivity admits. After
//! the noise, every release that carries a canary's coordinates reports them, whitened by the
//! release's planned noise std, and the update's observations of one canary are combined into
//! one score, the projection on the canary's whitened shift (for a canary that moves a shared
//! release by Δ_s and its owner's release by Δ_e in one update, a shift of norm
//! sqrt(1/σ_s² + 1/σ_e²) = 1/σ_eff: exactly what the one-sample charge covers), reported to its
//! [`DiracTrace`]. Release events, denominators, σ's and charges are untouched: the ledger
//! charges what it charges without canaries.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use raptor_accountant::{PoissonSampler, SamplingRate};
use raptor_eval::audit::DiracTrace;
use raptor_models::roles::ExpertId;
use tch::{Device, Kind, Tensor};

use super::Trainer;
#[cfg(feature = "planted-faults")]
use super::make_privatizers;
use crate::error::{Result, TrainError};
#[cfg(feature = "planted-faults")]
use crate::streams::Charge;
use crate::streams::{Phase, Plan, ReleaseSpec};

/// One coordinate of a Dirac canary's gradient.
#[derive(Debug, Clone, PartialEq)]
pub struct CanaryCoord {
    /// The parameter (a trainable one of the plan).
    pub param: String,
    /// Flat (row-major) index into the parameter.
    pub index: i64,
    /// The canary's gradient there, before clipping (finite, > 0).
    pub gradient: f64,
}

/// One white-box (Dirac) canary: a record whose gradient is `gradient` at each of its
/// coordinates and zero everywhere else, owned by `owner` where the plan has routed experts.
#[derive(Debug, Clone, PartialEq)]
pub struct DiracCanary {
    /// The coordinates its gradient touches (at least one; no two canaries share one).
    pub coords: Vec<CanaryCoord>,
    /// The canary record's owner expert: like any record's, its gradient in another expert of
    /// that layer is masked out (None: it reaches no routed expert).
    pub owner: Option<ExpertId>,
}

impl DiracCanary {
    /// A canary of one coordinate.
    pub fn single(param: impl Into<String>, index: i64, gradient: f64) -> Self {
        Self {
            coords: vec![CanaryCoord {
                param: param.into(),
                index,
                gradient,
            }],
            owner: None,
        }
    }
}

/// A canary's coordinate: (canary, coordinate) numbers.
type CoordId = (usize, usize);

/// The Dirac canaries of a white-box audit run (module docs). Only the audit (crate
/// `raptor-audit`) builds them, and they enter a run only through
/// crate `raptor-run`'s `train_prepared_with_canaries`; a run without them is untouched. Each canary
/// is checked against the plan before the first update (coordinates of released parameters, no
/// two the same, finite positive gradients, an owner the plan trains, a release it reaches).
#[derive(Debug)]
pub struct DiracCanaries {
    /// Every canary, in or out (each coordinate is watched).
    canaries: Vec<DiracCanary>,
    /// The included canaries (secret coins = true), in order: record `N + j` of the run is
    /// canary `included[j]` (N real records).
    included: Vec<usize>,
    /// What each canary's coordinates showed, shared with the audit.
    traces: Arc<Mutex<Vec<DiracTrace>>>,
    /// Per watched parameter: flat indices and (canary, coordinate) numbers (filled by the
    /// trainer).
    watch: BTreeMap<String, (Tensor, Vec<CoordId>)>,
    /// Per phase, canary and coordinate: what clipping and owner masks make of the coordinate
    /// when the canary is drawn in an update of the phase (0: not released there, or masked).
    shift: Vec<Vec<Vec<f64>>>,
    /// This update's observations per canary: Σ z·μ and Σ μ² (whitened value, whitened shift).
    pending: Mutex<Vec<(f64, f64)>>,
    /// A planted bug (the test/audit-only `planted-faults` feature only).
    #[cfg(feature = "planted-faults")]
    pub fault: Option<PlantedFault>,
}

impl DiracCanaries {
    /// Canaries `canaries`, of which those with `coins[i]` are records of the run; returns them
    /// with the handle on which their traces can be read after training.
    pub fn new(
        canaries: Vec<DiracCanary>,
        coins: &[bool],
    ) -> Result<(Self, Arc<Mutex<Vec<DiracTrace>>>)> {
        if coins.len() != canaries.len() {
            return Err(TrainError::Run(format!(
                "{} coins for {} canaries",
                coins.len(),
                canaries.len()
            )));
        }
        let traces = Arc::new(Mutex::new(vec![DiracTrace::default(); canaries.len()]));
        let included = (0..canaries.len()).filter(|&i| coins[i]).collect();
        let pending = Mutex::new(vec![(0.0, 0.0); canaries.len()]);
        Ok((
            Self {
                canaries,
                included,
                traces: Arc::clone(&traces),
                watch: BTreeMap::new(),
                shift: Vec::new(),
                pending,
                #[cfg(feature = "planted-faults")]
                fault: None,
            },
            traces,
        ))
    }
}

/// The parameters `phase` releases (every parameter of a group one of its releases names).
fn released_params(phase: &Phase) -> BTreeSet<&str> {
    phase
        .releases
        .iter()
        .flat_map(|r| r.groups.iter())
        .filter_map(|g| phase.group(g))
        .flat_map(|g| g.params.iter().map(String::as_str))
        .collect()
}

/// What `canary` adds at each of its coordinates when drawn in an update of `phase`, by the
/// rules a real record's gradient follows: owner masks drop a coordinate of a routed expert
/// other than the canary's owner; a private phase scales each clip group's part by the clip
/// factor of its norm (one factor over every group under global clipping); a parameter the
/// phase does not release gets nothing.
fn canary_shift(plan: &Plan, phase: &Phase, canary: &DiracCanary) -> Result<Vec<f64>> {
    let released = released_params(phase);
    let admitted = |c: &CanaryCoord| match plan.routed.get(&c.param) {
        Some(id) => canary.owner == Some(*id),
        None => true,
    };
    // The clip group of each admitted coordinate in this phase.
    let group_of: Vec<Option<usize>> = canary
        .coords
        .iter()
        .map(|c| {
            if admitted(c) {
                phase
                    .groups
                    .iter()
                    .position(|g| g.params.contains(&c.param))
            } else {
                None
            }
        })
        .collect();
    let mut sq = vec![0.0f64; phase.groups.len()];
    for (c, g) in canary.coords.iter().zip(&group_of) {
        if let Some(g) = g {
            sq[*g] += c.gradient * c.gradient;
        }
    }
    let factor = |sq_norm: f64, bound: f64| -> Result<f64> {
        let t = Tensor::f_from_slice(&[sq_norm])?;
        Ok(raptor_models::clip_factors(&t, bound)?.f_double_value(&[0])?)
    };
    let factors: Vec<f64> = if !phase.private {
        vec![1.0; phase.groups.len()]
    } else if let Some(c) = phase.global_clip {
        vec![factor(sq.iter().sum(), c)?; phase.groups.len()]
    } else {
        phase
            .groups
            .iter()
            .zip(&sq)
            .map(|(g, &s)| factor(s, g.bound))
            .collect::<Result<_>>()?
    };
    Ok(canary
        .coords
        .iter()
        .zip(&group_of)
        .map(|(c, g)| match g {
            Some(g) if released.contains(c.param.as_str()) => c.gradient * factors[*g],
            _ => 0.0,
        })
        .collect())
}

/// A planted bug, for the audit's tests and its measured table. Noise faults: the releases'
/// noise is not what the plan says, while the ledger still charges the planned σ. The ledger
/// fault: the noise is as planned, but the ledger charges one sample's releases as if they
/// came from separate samples. It exists only under the cargo feature `planted-faults`
/// (test/audit-only, off by default; the `raptor` program refuses to build with it), and only a
/// white-box audit can plant it (crate `raptor-audit`, its `planted` module).
#[cfg(feature = "planted-faults")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedFault {
    /// No noise at all.
    Off,
    /// Every release's noise at half its planned σ.
    Half,
    /// The expert releases' (parallel group members') noise at half their σ.
    HalfExperts,
    /// Noise as planned; the ledger charges an update's sequential (shared) releases and its
    /// parallel groups (expert releases) as separate samples, each its own mechanism — the
    /// under-count the one-sample rule exists to prevent.
    SplitCharge,
}

#[cfg(feature = "planted-faults")]
fn fault_scale(fault: PlantedFault, release: &ReleaseSpec) -> f64 {
    match fault {
        PlantedFault::Off => 0.0,
        PlantedFault::Half => 0.5,
        PlantedFault::HalfExperts if matches!(release.charge, Charge::Parallel(_)) => 0.5,
        PlantedFault::HalfExperts | PlantedFault::SplitCharge => 1.0,
    }
}

impl Trainer<'_> {
    /// Adds the Dirac canaries of a white-box audit run (module docs): the sampler then draws
    /// the real records and the included canaries at the plan's q. Before the first update, on
    /// one process only. The one caller is crate `raptor-run`'s `train_prepared_with_canaries`,
    /// the audit's door into a run. Each coordinate must be one of a planned parameter, no two the same
    /// (in any canary), with a finite gradient > 0; an owner must be an expert the plan trains;
    /// every canary must reach a release of some phase.
    pub fn with_dirac_canaries(mut self, mut canaries: DiracCanaries) -> Result<Self> {
        if self.update != 0 || self.comm.size() > 1 {
            return Err(TrainError::Run(
                "Dirac canaries join a fresh single-process run only".into(),
            ));
        }
        let planned: BTreeSet<String> = self.plan.params().into_iter().collect();
        let experts: BTreeSet<ExpertId> = self.plan.routed.values().copied().collect();
        let mut seen = BTreeSet::new();
        let mut watch: BTreeMap<String, (Vec<i64>, Vec<CoordId>)> = BTreeMap::new();
        for (i, c) in canaries.canaries.iter().enumerate() {
            if c.coords.is_empty() {
                return Err(TrainError::Config(format!("canary {i} has no coordinate")));
            }
            if let Some(o) = c.owner
                && !experts.contains(&o)
            {
                return Err(TrainError::Config(format!(
                    "canary {i}: owner expert {} of layer {} is not an expert the plan trains",
                    o.expert, o.layer
                )));
            }
            for (j, d) in c.coords.iter().enumerate() {
                let numel = match self.vars.get(&d.param) {
                    Some(v) if planned.contains(&d.param) => v.numel() as i64,
                    _ => {
                        return Err(TrainError::Config(format!(
                            "canary {i}: {} is not a trainable parameter of the plan",
                            d.param
                        )));
                    }
                };
                if !(0..numel).contains(&d.index) || !seen.insert((d.param.as_str(), d.index)) {
                    return Err(TrainError::Config(format!(
                        "canary {i}: index {} of {} is out of range or taken",
                        d.index, d.param
                    )));
                }
                if !(d.gradient.is_finite() && d.gradient > 0.0) {
                    return Err(TrainError::Config(format!(
                        "canary {i}: gradient {} at {}[{}] is not finite and > 0",
                        d.gradient, d.param, d.index
                    )));
                }
                let w = watch.entry(d.param.clone()).or_default();
                w.0.push(d.index);
                w.1.push((i, j));
            }
        }
        let mut shift = Vec::with_capacity(self.plan.phases.len());
        for ph in &self.plan.phases {
            shift.push(
                canaries
                    .canaries
                    .iter()
                    .map(|c| canary_shift(&self.plan, ph, c))
                    .collect::<Result<Vec<_>>>()?,
            );
        }
        for i in 0..canaries.canaries.len() {
            if !shift.iter().any(|ph| ph[i].iter().any(|&v| v > 0.0)) {
                return Err(TrainError::Config(format!(
                    "canary {i} reaches no release (its coordinates are not released, or owner masks drop them)"
                )));
            }
        }
        canaries.shift = shift;
        for (p, (idx, ids)) in watch {
            let t = Tensor::f_from_slice(&idx)?.f_to(self.opts.device)?;
            canaries.watch.insert(p, (t, ids));
        }
        let rate = SamplingRate::new(self.plan.q)?;
        let population = self.data.len() + canaries.included.len();
        self.sampler = match self.opts.insecure_seed {
            Some(s) => PoissonSampler::seeded_insecure(rate, population, s)?,
            None => PoissonSampler::new(rate, population)?,
        };
        #[cfg(feature = "planted-faults")]
        if let Some(f) = canaries.fault {
            self.privatizers =
                make_privatizers(&self.plan, self.opts.insecure_seed, &|r| fault_scale(f, r))?;
        }
        self.canaries = Some(canaries);
        Ok(self)
    }

    /// Adds the drawn canaries (record numbers `drawn`, past the real records) to the clipped
    /// sums of phase `pi`: at each coordinate, what the phase's clipping and owner masks make
    /// of the canary's gradient (module docs).
    pub(super) fn add_canaries(
        &self,
        pi: usize,
        drawn: &[usize],
        sums: &mut BTreeMap<String, Tensor>,
    ) -> Result<()> {
        let Some(c) = &self.canaries else {
            return Ok(());
        };
        let mut per: BTreeMap<&str, (Vec<i64>, Vec<f64>)> = BTreeMap::new();
        for &i in drawn {
            let k = i
                .checked_sub(self.data.len())
                .and_then(|j| c.included.get(j))
                .ok_or_else(|| TrainError::Run(format!("record {i} is no canary")))?;
            for (d, &v) in c.canaries[*k].coords.iter().zip(&c.shift[pi][*k]) {
                if v > 0.0 {
                    let e = per.entry(d.param.as_str()).or_default();
                    e.0.push(d.index);
                    e.1.push(v);
                }
            }
        }
        for (p, (idx, val)) in per {
            let base = match sums.remove(p) {
                Some(s) => s,
                None => self.vars[p].f_zeros_like()?.f_detach()?,
            };
            let idx = Tensor::f_from_slice(&idx)?.f_to(base.device())?;
            let val = Tensor::f_from_slice(&val)?
                .f_to_kind(base.kind())?
                .f_to(base.device())?;
            let out = base
                .f_reshape([-1])?
                .f_index_add(0, &idx, &val)?
                .f_reshape(base.size())?;
            sums.insert(p.to_string(), out);
        }
        Ok(())
    }

    /// Notes a release's components at the watched coordinates (of phase `pi`) for the
    /// canaries' scores of this update: whitened, `z = x·D/(σΔ)` (planned σ) for a noised
    /// release, `x·D/shift` for one without noise, each with its whitened shift μ (`shift/(σΔ)`,
    /// or 1 without noise); [`Trainer::flush_canaries`] combines them.
    pub(super) fn observe_canaries(
        &self,
        pi: usize,
        release: &ReleaseSpec,
        sensitivity: f64,
        names: &[String],
        outs: &[Tensor],
    ) -> Result<()> {
        let Some(c) = &self.canaries else {
            return Ok(());
        };
        let noise_std = if self.plan.phases[pi].private {
            release.sigma * sensitivity
        } else {
            0.0
        };
        let mut pending = c
            .pending
            .lock()
            .map_err(|_| TrainError::Run("the canary scores are poisoned".into()))?;
        for (p, out) in names.iter().zip(outs) {
            let Some((idx, ids)) = c.watch.get(p) else {
                continue;
            };
            let got: Vec<f64> = Vec::try_from(
                out.f_reshape([-1])?
                    .f_index_select(0, idx)?
                    .f_to_kind(Kind::Double)?
                    .f_to(Device::Cpu)?,
            )?;
            for (&(i, j), x) in ids.iter().zip(got) {
                let v = c.shift[pi][i][j];
                if v <= 0.0 {
                    continue;
                }
                let (z, mu) = if noise_std > 0.0 {
                    (x * release.denominator / noise_std, v / noise_std)
                } else {
                    (x * release.denominator / v, 1.0)
                };
                pending[i].0 += z * mu;
                pending[i].1 += mu * mu;
            }
        }
        Ok(())
    }

    /// Ends an update for the canaries: each canary observed in it gets one score, its
    /// observations projected on its whitened shift, `Σ z·μ / sqrt(Σ μ²)` (under the noise
    /// alone a standard normal; a drawn canary adds sqrt(Σ μ²)).
    pub(super) fn flush_canaries(&self) -> Result<()> {
        let Some(c) = &self.canaries else {
            return Ok(());
        };
        let mut pending = c
            .pending
            .lock()
            .map_err(|_| TrainError::Run("the canary scores are poisoned".into()))?;
        let mut traces = c
            .traces
            .lock()
            .map_err(|_| TrainError::Run("the canary traces are poisoned".into()))?;
        for (i, (num, den)) in pending.iter_mut().enumerate() {
            if *den > 0.0 {
                traces[i].observe(*num / den.sqrt());
            }
            (*num, *den) = (0.0, 0.0);
        }
        Ok(())
    }

    /// Whether an audit's test planted a fault (never outside the `planted-faults` feature).
    pub(super) fn fault_planted(&self) -> bool {
        #[cfg(feature = "planted-faults")]
        {
            self.canaries.as_ref().is_some_and(|c| c.fault.is_some())
        }
        #[cfg(not(feature = "planted-faults"))]
        {
            false
        }
    }

    /// The planted ledger fault ([`PlantedFault::SplitCharge`]): the charges a buggy ledger
    /// would make for one update of `phase` — its sequential releases as one sample, and each
    /// parallel group as a sample of its own. None when no such fault is planted.
    #[cfg(feature = "planted-faults")]
    pub(super) fn split_charges(
        &self,
        phase: &Phase,
    ) -> Result<Option<Vec<raptor_accountant::SampleCharge>>> {
        if !self
            .canaries
            .as_ref()
            .is_some_and(|c| c.fault == Some(PlantedFault::SplitCharge))
            || !phase.private
        {
            return Ok(None);
        }
        let q = self.plan.q;
        let mut sequential: Option<raptor_accountant::SampleCharge> = None;
        let mut groups: BTreeMap<usize, raptor_accountant::SampleCharge> = BTreeMap::new();
        for r in &phase.releases {
            match &r.charge {
                Charge::None => {}
                Charge::Sequential => {
                    let s = match sequential.as_mut() {
                        Some(s) => s,
                        None => sequential.insert(raptor_accountant::SampleCharge::new(q)?),
                    };
                    s.release(r.sigma)?;
                }
                Charge::Parallel(id) => {
                    let g = match groups.entry(id.layer) {
                        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::btree_map::Entry::Vacant(e) => {
                            e.insert(raptor_accountant::SampleCharge::new(q)?)
                        }
                    };
                    g.member_release(id.layer, id.expert, r.sigma)?;
                }
            }
        }
        Ok(Some(
            sequential.into_iter().chain(groups.into_values()).collect(),
        ))
    }
}
