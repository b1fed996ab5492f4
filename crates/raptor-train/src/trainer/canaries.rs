//! The white-box audit's hook in the loop (`DiracCanaries`: crate `raptor-audit`, behind
//! `raptor audit --kind dirac`, is the one caller).
//!
//! A white-box audit run adds *Dirac canaries*: records whose clipped gradient is a fixed
//! coordinate direction `v·e_k` of one trainable parameter (v at most the bound of every clip
//! group that holds the parameter: a record the sensitivity analysis admits). The included
//! canaries are records of the run past the real ones: the Poisson sampler draws every record,
//! real or canary, at the plan's q; a drawn canary skips the forward pass and adds `v` at its
//! coordinate to the clipped sums of the phase that releases its parameter (nothing elsewhere).
//! After the noise, each release that carries watched coordinates reports the released
//! component there to the canary's [`DiracTrace`] (in units of the release's planned noise
//! std). Release events, denominators, σ's and charges are untouched: the ledger charges what
//! it charges without canaries.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use raptor_accountant::{PoissonSampler, SamplingRate};
use raptor_eval::audit::DiracTrace;
use tch::{Device, Kind, Tensor};

use super::Trainer;
#[cfg(feature = "planted-faults")]
use super::make_privatizers;
use crate::error::{Result, TrainError};
#[cfg(feature = "planted-faults")]
use crate::streams::Charge;
use crate::streams::{Phase, ReleaseSpec};

/// One white-box (Dirac) canary: a record whose clipped gradient is `value` at flat index
/// `index` of parameter `param` and zero everywhere else.
#[derive(Debug, Clone, PartialEq)]
pub struct DiracCanary {
    /// The parameter (a trainable one of the plan).
    pub param: String,
    /// Flat (row-major) index into the parameter.
    pub index: i64,
    /// The canary's gradient there (0 < value ≤ every bound of a group holding `param`).
    pub value: f64,
}

/// The Dirac canaries of a white-box audit run (module docs). Only the audit (crate
/// `raptor-audit`) builds them, and they enter a run only through
/// [`crate::run::train_prepared_with_canaries`]; a run without them is untouched. Each canary is checked against the plan before the first update (a coordinate
/// of a released parameter, no two the same, a value within every bound that holds it), so a
/// canary is always a record the sensitivity analysis admits.
#[derive(Debug)]
pub struct DiracCanaries {
    /// Every canary, in or out (each coordinate is watched).
    canaries: Vec<DiracCanary>,
    /// The included canaries (secret coins = true), in order: record `N + j` of the run is
    /// canary `included[j]` (N real records).
    included: Vec<usize>,
    /// What each canary's coordinate showed, shared with the audit.
    traces: Arc<Mutex<Vec<DiracTrace>>>,
    /// Per watched parameter: flat indices and canary numbers (filled by the trainer).
    watch: BTreeMap<String, (Tensor, Vec<usize>)>,
    /// A planted bug (the test/audit-only `planted-faults` feature only).
    #[cfg(feature = "planted-faults")]
    pub fault: Option<NoiseFault>,
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
        Ok((
            Self {
                canaries,
                included,
                traces: Arc::clone(&traces),
                watch: BTreeMap::new(),
                #[cfg(feature = "planted-faults")]
                fault: None,
            },
            traces,
        ))
    }
}

/// A planted bug of the mechanism, for the audit's tests and its measured table: the releases'
/// noise is not what the plan says, while the ledger still charges the planned σ. It exists
/// only under the cargo feature `planted-faults` (test/audit-only, off by default; the `raptor`
/// program refuses to build with it), and only a white-box audit can plant it (crate
/// `raptor-audit`, its `planted` module).
#[cfg(feature = "planted-faults")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoiseFault {
    /// No noise at all.
    Off,
    /// Every release's noise at half its planned σ.
    Half,
    /// The expert releases' (parallel group members') noise at half their σ.
    HalfExperts,
}

#[cfg(feature = "planted-faults")]
fn fault_scale(fault: NoiseFault, release: &ReleaseSpec) -> f64 {
    match fault {
        NoiseFault::Off => 0.0,
        NoiseFault::Half => 0.5,
        NoiseFault::HalfExperts if matches!(release.charge, Charge::Parallel(_)) => 0.5,
        NoiseFault::HalfExperts => 1.0,
    }
}

impl Trainer<'_> {
    /// Adds the Dirac canaries of a white-box audit run (module docs): the
    /// sampler then draws the real records and the included canaries at the plan's q. Before
    /// the first update, on one process only. Each canary must name a coordinate of a planned
    /// parameter, no two the same, with 0 < value ≤ the bound of every private clip group (or
    /// global clip) that holds its parameter.
    pub(crate) fn with_dirac_canaries(mut self, mut canaries: DiracCanaries) -> Result<Self> {
        if self.update != 0 || self.comm.size() > 1 {
            return Err(TrainError::Run(
                "Dirac canaries join a fresh single-process run only".into(),
            ));
        }
        let planned: BTreeSet<String> = self.plan.params().into_iter().collect();
        let mut seen = BTreeSet::new();
        let mut watch: BTreeMap<String, (Vec<i64>, Vec<usize>)> = BTreeMap::new();
        for (i, c) in canaries.canaries.iter().enumerate() {
            let numel = match self.vars.get(&c.param) {
                Some(v) if planned.contains(&c.param) => v.numel() as i64,
                _ => {
                    return Err(TrainError::Config(format!(
                        "canary {i}: {} is not a trainable parameter of the plan",
                        c.param
                    )));
                }
            };
            if !(0..numel).contains(&c.index) || !seen.insert((c.param.as_str(), c.index)) {
                return Err(TrainError::Config(format!(
                    "canary {i}: index {} of {} is out of range or taken",
                    c.index, c.param
                )));
            }
            for ph in self.plan.phases.iter().filter(|p| p.private) {
                for g in ph.groups.iter().filter(|g| g.params.contains(&c.param)) {
                    let bound = ph.global_clip.unwrap_or(g.bound);
                    if !(c.value > 0.0 && c.value <= bound) {
                        return Err(TrainError::Config(format!(
                            "canary {i}: value {} is not in (0, {bound}] (group {} of phase {})",
                            c.value, g.name, ph.name
                        )));
                    }
                }
            }
            let w = watch.entry(c.param.clone()).or_default();
            w.0.push(c.index);
            w.1.push(i);
        }
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
    /// sums of the parameters `phase` releases: `value` at each one's coordinate.
    pub(super) fn add_canaries(
        &self,
        phase: &Phase,
        drawn: &[usize],
        sums: &mut BTreeMap<String, Tensor>,
    ) -> Result<()> {
        let Some(c) = &self.canaries else {
            return Ok(());
        };
        let released: BTreeSet<&str> = phase
            .releases
            .iter()
            .flat_map(|r| r.groups.iter())
            .filter_map(|g| phase.group(g))
            .flat_map(|g| g.params.iter().map(String::as_str))
            .collect();
        let mut per: BTreeMap<&str, (Vec<i64>, Vec<f64>)> = BTreeMap::new();
        for &i in drawn {
            let k = i
                .checked_sub(self.data.len())
                .and_then(|j| c.included.get(j))
                .ok_or_else(|| TrainError::Run(format!("record {i} is no canary")))?;
            let d = &c.canaries[*k];
            if released.contains(d.param.as_str()) {
                let e = per.entry(d.param.as_str()).or_default();
                e.0.push(d.index);
                e.1.push(d.value);
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

    /// Reports a release's components at the watched coordinates to the canaries' traces:
    /// `x·D/(σΔ)` (planned σ) for a noised release, `x·D/value` for one without noise.
    pub(super) fn observe_canaries(
        &self,
        phase: &Phase,
        release: &ReleaseSpec,
        sensitivity: f64,
        names: &[String],
        outs: &[Tensor],
    ) -> Result<()> {
        let Some(c) = &self.canaries else {
            return Ok(());
        };
        let noise_std = if phase.private {
            release.sigma * sensitivity
        } else {
            0.0
        };
        let mut traces = c
            .traces
            .lock()
            .map_err(|_| TrainError::Run("the canary traces are poisoned".into()))?;
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
            for (&i, x) in ids.iter().zip(got) {
                let unit = if noise_std > 0.0 {
                    noise_std
                } else {
                    c.canaries[i].value
                };
                traces[i].observe(x * release.denominator / unit);
            }
        }
        Ok(())
    }

    /// Whether an audit's test planted a noise fault (never outside the `planted-faults`
    /// feature).
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
}
