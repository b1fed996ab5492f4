//! RAPTOR's diagnostics (defined as the public Python implementation of RAPTOR, GitHub
//! `leduckhai/RAPTOR`, computes them), computed after training on a few held-out records (never
//! on training records): role mismatch M_role, per-expert SNR and its CV, clip
//! suppression and dilution.
//!
//! - **M_role** = ½ Σ_r |norm_share_r − param_share_r| over the roles {attention, head,
//!   experts of the trained layer}: the total-variation distance between where the per-record
//!   gradient norm mass sits and where the trainable parameters sit.
//! - **SNR_e** = ‖Σ_{owned rows} clip(g_i^{(e)})‖ / (σ_e C_e √d_e): the clip is role-wise for
//!   RAPTOR and the method's own (global) clip for monolithic methods; σ_e C_e the noise std the
//!   method adds to expert e's coordinates; d_e its trainable parameters. **SNR-CV** = population
//!   std / mean over the layer's experts.
//! - **Clip suppression**: fraction of owned rows whose global clip factor (over all roles) is
//!   smaller than the factor of the expert gradient alone (a dense-dominated norm shrinking an
//!   expert gradient that was within its bound).
//! - **Dilution** = (owned records per expert on average in a batch of B) / D_e.

use std::collections::BTreeMap;
use std::fmt;

use raptor_models::roles::{Naming, Role, RoleIndex};
use raptor_models::{ClipPolicy, ClippedStep, Model, ParamGroups};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::error::Result;
use crate::trainer::{Example, make_batch};

/// The roles the diagnostics tell apart (clip groups of the role-wise clip).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum DiagRole {
    Attention,
    Head,
    /// One routed expert of the diagnosed layer.
    Expert(usize),
}

impl DiagRole {
    /// The role M_role compares (every expert of the layer together).
    fn mass_role(self) -> &'static str {
        match self {
            DiagRole::Attention => "attention",
            DiagRole::Head => "head",
            DiagRole::Expert(_) => "experts",
        }
    }
}

impl fmt::Display for DiagRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiagRole::Expert(x) => write!(f, "expert[{x}]"),
            DiagRole::Attention | DiagRole::Head => f.write_str(self.mass_role()),
        }
    }
}

/// The diagnostics of one run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Diagnostics {
    /// Records used (held-out).
    pub records: usize,
    /// The trained sparse layer.
    pub layer: usize,
    /// Role mismatch M_role.
    pub role_mismatch: f64,
    /// Per role: (gradient-norm share, parameter share).
    pub roles: BTreeMap<String, (f64, f64)>,
    /// Per expert SNR.
    pub snr: Vec<f64>,
    /// SNR-CV.
    pub snr_cv: f64,
    /// Fraction of owned rows whose global factor suppresses the expert gradient.
    pub clip_suppressed_fraction: f64,
    /// Least-loaded expert's expected owned records per batch / D_e.
    pub dilution: f64,
}

/// Computes the diagnostics of an MoE classifier on `data` (held-out records). `sigma_e`,
/// `clip_e`: the noise multiplier and bound that expert coordinates receive under the method;
/// `global`: whether the method clips globally; `d_e`: its expert denominator; `batch`: B.
#[allow(clippy::too_many_arguments)]
pub fn diagnostics(
    model: &dyn Model,
    naming: Naming,
    layer: usize,
    data: &[Example],
    sigma_e: f64,
    clip_e: f64,
    global: bool,
    d_e: f64,
    batch: f64,
    pad_id: i64,
    device: Device,
) -> Result<Diagnostics> {
    let e_count = model.num_experts();
    let vars = model.var_store().variables();
    let index = RoleIndex::of_model(model, naming);
    // Roles over the LoRA / head parameters present in the model.
    let role_of = |name: &str| -> Option<DiagRole> {
        match index.role(name) {
            Role::Head => Some(DiagRole::Head),
            _ if !name.contains("lora_") => None,
            Role::RoutedExpert(id) if id.layer == layer => Some(DiagRole::Expert(id.expert)),
            Role::Attention => Some(DiagRole::Attention),
            Role::RoutedExpert(_) | Role::Router | Role::Other => None,
        }
    };
    let mut groups = ParamGroups::new();
    let mut params_per_group: BTreeMap<DiagRole, i64> = BTreeMap::new();
    let mut role_of_group: BTreeMap<String, DiagRole> = BTreeMap::new();
    let saved: Vec<(Tensor, bool)> = vars
        .values()
        .map(|t| (t.shallow_clone(), t.requires_grad()))
        .collect();
    for (n, t) in &vars {
        let r = role_of(n);
        let _ = t.f_set_requires_grad(r.is_some())?;
        if let Some(r) = r {
            *params_per_group.entry(r).or_default() += t.numel() as i64;
            role_of_group.insert(r.to_string(), r);
            groups.assign(n.clone(), r.to_string());
        }
    }
    let result = (|| -> Result<Diagnostics> {
        // Owner map of the diagnostic records, from the current model (as the reference code).
        let refs: Vec<&Example> = data.iter().collect();
        let b = make_batch(&refs, model.task(), pad_id, device)?;
        let maps = raptor_models::owner_tensors(
            model,
            [&b],
            raptor_routing::OwnerRule::GateWeighted,
            Device::Cpu,
        )?;
        let owners_v: Vec<i64> = match maps.get(&layer) {
            Some(t) => Vec::<i64>::try_from(t)?,
            None => vec![0; data.len()],
        };
        let mut owners = BTreeMap::new();
        owners.insert(layer, Tensor::f_from_slice(&owners_v)?.f_to(device)?);
        let (_, grads) = ClippedStep::new(model)?
            .with_record_ids(data.iter().map(|e| e.id).collect())
            .per_sample(&b, &owners, false)?;
        let bounds: BTreeMap<String, f64> =
            role_of_group.keys().map(|g| (g.clone(), clip_e)).collect();
        let role_clip = grads.clip(&groups, &ClipPolicy::RoleWise(bounds), &BTreeMap::new())?;
        let global_clip = grads.clip(&groups, &ClipPolicy::Global(clip_e), &BTreeMap::new())?;
        let n = data.len() as f64;
        // Roles: attention, head, experts (all experts of the layer together).
        let mut norm_mass: BTreeMap<String, f64> = BTreeMap::new();
        let mut param_mass: BTreeMap<String, f64> = BTreeMap::new();
        for (g, sq) in &role_clip.group_sq_norms {
            let Some(&r) = role_of_group.get(g) else {
                continue;
            };
            let role = r.mass_role().to_string();
            let mean_norm = sq.f_sqrt()?.f_sum(Kind::Double)?.f_double_value(&[])? / n;
            *norm_mass.entry(role.clone()).or_default() += mean_norm;
            *param_mass.entry(role).or_default() +=
                params_per_group.get(&r).copied().unwrap_or(0) as f64;
        }
        let (tn, tp): (f64, f64) = (norm_mass.values().sum(), param_mass.values().sum());
        let mut roles = BTreeMap::new();
        let mut m_role = 0.0;
        for (r, nm) in &norm_mass {
            let ns = if tn > 0.0 { nm / tn } else { 0.0 };
            let ps = param_mass[r] / tp.max(1.0);
            m_role += 0.5 * (ns - ps).abs();
            roles.insert(r.clone(), (ns, ps));
        }
        // Per-expert SNR from the clipped sums of the expert's parameters.
        let chosen = if global { &global_clip } else { &role_clip };
        let mut snr = Vec::new();
        for x in 0..e_count {
            let g = DiagRole::Expert(x as usize).to_string();
            let mut sq = 0.0f64;
            let mut d = 0i64;
            for (p, grp) in groups.iter() {
                if grp == g {
                    d += vars[p].numel() as i64;
                    if let Some(s) = chosen.sums.get(p) {
                        sq += s.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?;
                    }
                }
            }
            let noise = sigma_e * clip_e * (d.max(1) as f64).sqrt();
            snr.push(if noise > 0.0 {
                sq.sqrt() / noise
            } else {
                f64::INFINITY
            });
        }
        let mean = snr.iter().sum::<f64>() / snr.len().max(1) as f64;
        let var = snr.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / snr.len().max(1) as f64;
        // Clip suppression on owned rows.
        let mut suppressed = 0usize;
        let mut owned_rows = 0usize;
        let gf: Vec<f64> = match global_clip.clip_factors.values().next() {
            Some(f) => Vec::try_from(f.f_to_kind(Kind::Double)?.f_to(Device::Cpu)?)?,
            None => vec![1.0; data.len()],
        };
        for (i, &o) in owners_v.iter().enumerate() {
            let own_group = usize::try_from(o).map(|x| DiagRole::Expert(x).to_string());
            if let Some(f) = own_group.ok().and_then(|g| role_clip.clip_factors.get(&g)) {
                let own = f.f_to_kind(Kind::Double)?.f_double_value(&[i as i64])?;
                owned_rows += 1;
                if gf[i] < own - 1e-12 {
                    suppressed += 1;
                }
            }
        }
        Ok(Diagnostics {
            records: data.len(),
            layer,
            role_mismatch: m_role,
            roles,
            snr,
            snr_cv: if mean > 0.0 {
                var.sqrt() / mean
            } else {
                f64::NAN
            },
            clip_suppressed_fraction: suppressed as f64 / owned_rows.max(1) as f64,
            dilution: {
                // The least-loaded expert's expected owned records per batch over D_e.
                let mut counts = vec![0usize; e_count.max(1) as usize];
                for &o in &owners_v {
                    if let Some(c) = counts.get_mut(o as usize) {
                        *c += 1;
                    }
                }
                let min = counts.iter().copied().min().unwrap_or(0) as f64;
                batch * (min / n) / d_e
            },
        })
    })();
    for (t, rg) in saved {
        let _ = t.f_set_requires_grad(rg)?;
    }
    result
}
