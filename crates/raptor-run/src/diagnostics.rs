//! RAPTOR's diagnostics (defined as the public Python implementation of RAPTOR, GitHub
//! `leduckhai/RAPTOR`, computes them), computed after training on a few held-out records (never
//! on training records): this module gathers the per-record numbers from the model (clipped
//! gradient norms per role, per-stream clipped sums, clip factors, owner maps) and
//! [`raptor_eval::moe`] turns them into role mismatch M_role, per-stream SNR and its CV, clip
//! suppression and dilution (its docs define each).
//!
//! - **Roles** are {attention, head, experts of the trained layer}; each role's norm mass is the
//!   mean per-record norm of its clipped gradient (every role clipped at the expert bound).
//! - **Streams** are clipped as the method clips, over a batch of the run's expected size B (at
//!   most 256 held-out records, passed through the model in the run's micro-batches, so the
//!   diagnostics take no more memory than an update): RAPTOR's shared group (attention adapters with the head) at C_s
//!   and each routed expert of the diagnosed layer at C_e, or one global factor at C for a
//!   monolithic method; the noise is that of the release carrying them (σ_e, C_e, D_e; σ_s, C_s).
//! - **Clip suppression** compares, on owned records, the global clip factor with the factor of
//!   the owned expert's gradient alone, both at the expert bound.

use std::collections::BTreeMap;
use std::fmt;

use raptor_models::roles::{Naming, Role, RoleIndex};
use raptor_models::{ClipOutput, ClipPolicy, ClippedStep, GroupKey, Model, ParamGroups};
use tch::{Device, Kind, Tensor};

pub use raptor_eval::moe::{Diagnostics, StreamSnr};
use raptor_eval::moe::{
    clip_suppressed_fraction, coefficient_of_variation, dilution, role_mismatch,
};

use crate::error::Result;
use raptor_train::trainer::{Example, make_batch};

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

/// The streams the diagnostics clip as the method does (clip groups of the per-stream clip).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum DiagStream {
    /// The shared stream (attention adapters with the head).
    Shared,
    /// One routed expert of the diagnosed layer.
    Expert(usize),
}

impl fmt::Display for DiagStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiagStream::Shared => f.write_str("shared"),
            DiagStream::Expert(x) => write!(f, "expert[{x}]"),
        }
    }
}

/// The noise a method gives the diagnosed coordinates: the release carrying the routed
/// experts and the one carrying the shared stream (the same release for a monolithic method),
/// and the expected batch B.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiagNoise {
    /// The expert releases' σ_e, bound C_e (C for a global clip), denominator D_e.
    pub expert: raptor_train::streams::ReleaseNoiseSpec,
    /// The shared release's σ_s and bound C_s.
    pub shared: raptor_train::streams::ReleaseNoiseSpec,
    /// Expected batch B.
    pub batch: f64,
}

/// One clipping's per-record norms and factors (concatenated over micro-batches) and sums
/// (added).
struct Merged<K: GroupKey> {
    records: i64,
    out: ClipOutput<K>,
}

impl<K: GroupKey> Merged<K> {
    fn new() -> Self {
        Self {
            records: 0,
            out: ClipOutput {
                group_sq_norms: BTreeMap::new(),
                clip_factors: BTreeMap::new(),
                sums: BTreeMap::new(),
                from_cache: Default::default(),
            },
        }
    }

    /// Appends a micro-batch of `n` records. A group the micro-batch does not reach (an expert
    /// none of its records routes to) has norm 0 and factor 1 for its records, as it would in
    /// one batch.
    fn push(&mut self, part: ClipOutput<K>, n: i64) -> Result<()> {
        fn cat<K: GroupKey>(
            acc: &mut BTreeMap<K, Tensor>,
            part: BTreeMap<K, Tensor>,
            before: i64,
            n: i64,
            fill: f64,
        ) -> Result<()> {
            let keys: std::collections::BTreeSet<K> =
                acc.keys().chain(part.keys()).cloned().collect();
            for k in keys {
                let p = match part.get(&k) {
                    Some(t) => t.f_to(Device::Cpu)?,
                    None => Tensor::f_full([n], fill, (tch::Kind::Float, Device::Cpu))?,
                };
                let a = match acc.remove(&k) {
                    Some(t) => t,
                    None => Tensor::f_full([before], fill, (p.kind(), Device::Cpu))?,
                };
                let p = p.f_to_kind(a.kind())?;
                acc.insert(k, Tensor::f_cat(&[a, p], 0)?);
            }
            Ok(())
        }
        cat(
            &mut self.out.group_sq_norms,
            part.group_sq_norms,
            self.records,
            n,
            0.0,
        )?;
        cat(
            &mut self.out.clip_factors,
            part.clip_factors,
            self.records,
            n,
            1.0,
        )?;
        for (k, v) in part.sums {
            let v = match self.out.sums.remove(&k) {
                Some(a) => a.f_add(&v)?,
                None => v,
            };
            self.out.sums.insert(k, v);
        }
        self.out.from_cache.extend(part.from_cache);
        self.records += n;
        Ok(())
    }
}

/// Computes the diagnostics of an MoE classifier on `data` (held-out records; a batch of about
/// the run's B) under the noise `noise` of the method, `micro_batch` records per forward and
/// backward pass (memory only: the numbers are those of one pass up to float round-off).
#[allow(clippy::too_many_arguments)]
pub fn diagnostics(
    model: &dyn Model,
    naming: Naming,
    layer: usize,
    data: &[Example],
    noise: &DiagNoise,
    micro_batch: usize,
    pad_id: i64,
    device: Device,
) -> Result<Diagnostics> {
    let (sigma_e, clip_e, d_e, batch) = (
        noise.expert.sigma,
        noise.expert.bound,
        noise.expert.denominator,
        noise.batch,
    );
    let global = noise.expert.global_clip;
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
    let mut groups: ParamGroups<DiagRole> = ParamGroups::new();
    let mut params_per_group: BTreeMap<DiagRole, i64> = BTreeMap::new();
    let saved: Vec<(Tensor, bool)> = vars
        .values()
        .map(|t| (t.shallow_clone(), t.requires_grad()))
        .collect();
    for (n, t) in &vars {
        let r = role_of(n);
        let _ = t.f_set_requires_grad(r.is_some())?;
        if let Some(r) = r {
            *params_per_group.entry(r).or_default() += t.numel() as i64;
            groups.assign(n.clone(), r);
        }
    }
    let result = (|| -> Result<Diagnostics> {
        let bounds: BTreeMap<DiagRole, f64> = groups.groups().map(|&g| (g, clip_e)).collect();
        // Per-stream grouping, clipped as the method clips: RAPTOR's shared group at C_s and
        // each expert at C_e, or one global factor at C.
        let mut streams: ParamGroups<DiagStream> = ParamGroups::new();
        let mut stream_params: BTreeMap<DiagStream, i64> = BTreeMap::new();
        for (p, &grp) in groups.iter() {
            let s = match grp {
                DiagRole::Expert(x) => DiagStream::Expert(x),
                DiagRole::Attention | DiagRole::Head => DiagStream::Shared,
            };
            *stream_params.entry(s).or_default() += vars[p].numel() as i64;
            streams.assign(p, s);
        }
        let policy = if global {
            ClipPolicy::Global(clip_e)
        } else {
            let mut b: BTreeMap<DiagStream, f64> =
                stream_params.keys().map(|&g| (g, clip_e)).collect();
            b.insert(DiagStream::Shared, noise.shared.bound);
            ClipPolicy::RoleWise(b)
        };
        // The owner of each record from the current model, each routed alone (as a run's owner
        // maps: a record's owner does not depend on the records beside it, nor on the
        // micro-batches); then, micro-batch by micro-batch, the three clippings of the records'
        // per-record gradients.
        let tokens: Vec<Vec<i64>> = data.iter().map(|e| e.tokens.clone()).collect();
        let all_owners: Vec<i64> = raptor_models::owners_per_record(
            model,
            &tokens,
            pad_id,
            raptor_routing::OwnerRule::GateWeighted,
            device,
        )?
        .remove(&layer)
        .unwrap_or_else(|| vec![0; data.len()]);
        let (mut role_clip, mut global_clip, mut stream_clip) =
            (Merged::new(), Merged::new(), Merged::new());
        let mut owners_v: Vec<i64> = Vec::with_capacity(data.len());
        for (ci, chunk) in data.chunks(micro_batch.max(1)).enumerate() {
            let refs: Vec<&Example> = chunk.iter().collect();
            let b = make_batch(&refs, model.task(), pad_id, device)?;
            let start = ci * micro_batch.max(1);
            let own: Vec<i64> = all_owners[start..start + chunk.len()].to_vec();
            let mut owners = BTreeMap::new();
            owners.insert(layer, Tensor::f_from_slice(&own)?.f_to(device)?);
            owners_v.extend(own);
            let (_, grads) = ClippedStep::new(model)?
                .with_record_ids(chunk.iter().map(|e| e.id).collect())
                .per_sample(&b, &owners, false)?;
            let n = chunk.len() as i64;
            role_clip.push(
                grads.clip(
                    &groups,
                    &ClipPolicy::RoleWise(bounds.clone()),
                    &BTreeMap::new(),
                )?,
                n,
            )?;
            global_clip.push(
                grads.clip(&groups, &ClipPolicy::Global(clip_e), &BTreeMap::new())?,
                n,
            )?;
            stream_clip.push(grads.into_clip(&streams, &policy, &BTreeMap::new())?, n)?;
        }
        let (role_clip, global_clip, stream_clip) =
            (role_clip.out, global_clip.out, stream_clip.out);
        let n = data.len() as f64;
        // Roles: attention, head, experts (all experts of the layer together).
        // Added in the order of the groups' names (expert[10] before expert[2]), so that the
        // masses' rounding does not depend on how the role type orders the groups.
        let mut by_name: Vec<(String, DiagRole, &Tensor)> = role_clip
            .group_sq_norms
            .iter()
            .map(|(g, sq)| (g.to_string(), *g, sq))
            .collect();
        by_name.sort_by(|a, b| a.0.cmp(&b.0));
        let mut norm_mass: BTreeMap<String, f64> = BTreeMap::new();
        let mut param_mass: BTreeMap<String, f64> = BTreeMap::new();
        for (_, r, sq) in by_name {
            let role = r.mass_role().to_string();
            let mean_norm = sq.f_sqrt()?.f_sum(Kind::Double)?.f_double_value(&[])? / n;
            *norm_mass.entry(role.clone()).or_default() += mean_norm;
            *param_mass.entry(role).or_default() +=
                params_per_group.get(&r).copied().unwrap_or(0) as f64;
        }
        let (m_role, roles) = role_mismatch(&norm_mass, &param_mass);
        let signal = |g: DiagStream| -> Result<f64> {
            let mut sq = 0.0f64;
            for (p, &grp) in streams.iter() {
                if grp == g
                    && let Some(s) = stream_clip.sums.get(p)
                {
                    sq += s.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?;
                }
            }
            Ok(sq.sqrt())
        };
        let mut snr = Vec::new();
        let mut expert_signal_norms = Vec::new();
        let mut expert_noise_norms = Vec::new();
        for x in 0..e_count {
            let g = DiagStream::Expert(x as usize);
            let d = stream_params.get(&g).copied().unwrap_or(0);
            let st = StreamSnr::new(signal(g)?, sigma_e, clip_e, d);
            snr.push(st.snr);
            expert_signal_norms.push(st.signal_norm);
            expert_noise_norms.push(st.noise_norm);
        }
        let shared = StreamSnr::new(
            signal(DiagStream::Shared)?,
            noise.shared.sigma,
            noise.shared.bound,
            stream_params.get(&DiagStream::Shared).copied().unwrap_or(0),
        );
        // Clip suppression on owned rows.
        // Clip suppression on owned rows: (global factor, own expert's factor).
        let gf: Vec<f64> = match global_clip.clip_factors.values().next() {
            Some(f) => Vec::try_from(f.f_to_kind(Kind::Double)?.f_to(Device::Cpu)?)?,
            None => vec![1.0; data.len()],
        };
        let mut owned_rows: Vec<(f64, f64)> = Vec::new();
        for (i, &o) in owners_v.iter().enumerate() {
            let own_group = usize::try_from(o).map(DiagRole::Expert);
            if let Some(f) = own_group.ok().and_then(|g| role_clip.clip_factors.get(&g)) {
                let own = f.f_to_kind(Kind::Double)?.f_double_value(&[i as i64])?;
                owned_rows.push((gf[i], own));
            }
        }
        let snr_cv = coefficient_of_variation(&snr);
        Ok(Diagnostics {
            records: data.len(),
            layer,
            role_mismatch: m_role,
            roles,
            snr,
            expert_signal_norms,
            expert_noise_norms,
            shared,
            snr_cv,
            clip_suppressed_fraction: clip_suppressed_fraction(&owned_rows),
            dilution: dilution(&owners_v, e_count.max(0) as usize, batch, d_e),
        })
    })();
    for (t, rg) in saved {
        let _ = t.f_set_requires_grad(rg)?;
    }
    result
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use raptor_train::config::{Method, ModelKind, RunConfig};
    use raptor_train::streams::ReleaseNoiseSpec;

    /// A tiny Switch classifier with RAPTOR's scope (attention LoRA, head, expert LoRA of one
    /// sparse layer) and a few records of random tokens.
    fn toy() -> (Box<dyn Model>, usize, Vec<Example>) {
        let mut cfg = RunConfig::default();
        cfg.model.kind = ModelKind::Switch;
        (
            cfg.model.d_model,
            cfg.model.layers,
            cfg.model.heads,
            cfg.model.d_ff,
            cfg.model.experts,
        ) = (16, 2, 2, 32, 3);
        cfg.method = raptor_train::config::MethodConfig::new(Method::Raptor);
        cfg.lora.r = 2;
        let mut model = crate::session::build_model(
            &cfg.model,
            cfg.data.max_length,
            cfg.train.seed,
            50,
            2,
            Device::Cpu,
        )
        .unwrap();
        let layer = *model.sparse_layers().last().unwrap();
        raptor_models::rng::seeded(3, || {
            raptor_train::methods::setup_scope((&cfg).into(), model.as_mut(), Some(layer))
        })
        .unwrap();
        let data = (0..7u64)
            .map(|i| Example {
                id: i,
                tokens: (0..(3 + i as i64 % 4))
                    .map(|k| 2 + (i as i64 * 7 + k * 3) % 45)
                    .collect(),
                label: Some(i as i64 % 2),
                prompt_len: 0,
            })
            .collect();
        (model, layer, data)
    }

    fn spec(sigma: f64, bound: f64, global: bool) -> ReleaseNoiseSpec {
        ReleaseNoiseSpec {
            sigma,
            bound,
            denominator: 2.0,
            global_clip: global,
        }
    }

    /// The slow reference of a stream's signal: each record alone through the engine (a batch
    /// of one), its raw gradient on the stream's coordinates, clipped by hand, then summed.
    fn reference_signal(
        model: &dyn Model,
        layer: usize,
        data: &[Example],
        stream: &dyn Fn(&str) -> bool,
        bound_of: &dyn Fn(&BTreeMap<String, Tensor>) -> f64,
    ) -> f64 {
        let mut total: BTreeMap<String, Tensor> = BTreeMap::new();
        for ex in data {
            let b = make_batch(&[ex], model.task(), 0, Device::Cpu).unwrap();
            let maps = raptor_models::owner_tensors(
                model,
                [&b],
                raptor_routing::OwnerRule::GateWeighted,
                Device::Cpu,
            )
            .unwrap();
            let mut owners = BTreeMap::new();
            owners.insert(layer, maps[&layer].shallow_clone());
            let (_, grads) = ClippedStep::new(model)
                .unwrap()
                .with_record_ids(vec![ex.id])
                .per_sample(&b, &owners, false)
                .unwrap();
            let mut all = ParamGroups::new();
            for p in grads.params() {
                all.assign(p.clone(), "all".to_string());
            }
            let raw = grads
                .clip(&all, &ClipPolicy::Global(f64::MAX), &BTreeMap::new())
                .unwrap()
                .sums;
            let g: BTreeMap<String, Tensor> = raw.into_iter().filter(|(p, _)| stream(p)).collect();
            let bound = bound_of(&g);
            let norm = g
                .values()
                .map(|t| t.square().sum(Kind::Double).double_value(&[]))
                .sum::<f64>()
                .sqrt();
            let f = if norm > bound { bound / norm } else { 1.0 };
            for (p, t) in g {
                let v = &t * f;
                let acc = match total.remove(&p) {
                    Some(a) => a + v,
                    None => v,
                };
                total.insert(p, acc);
            }
        }
        total
            .values()
            .map(|t| t.square().sum(Kind::Double).double_value(&[]))
            .sum::<f64>()
            .sqrt()
    }

    /// Role-wise (RAPTOR): the shared stream's and each expert's signal match the slow
    /// reference (each record alone, clipped by hand at C_s or C_e), the noise norms are
    /// σ·C·√d, SNR = signal / noise, and the records are the ones given.
    #[test]
    fn stream_signals_and_noise_match_a_slow_reference() {
        tch::set_num_threads(1);
        let (model, layer, data) = toy();
        let naming = Naming::Switch;
        let (c_s, c_e, s_s, s_e) = (0.05, 0.01, 0.7, 1.9);
        let noise = DiagNoise {
            expert: spec(s_e, c_e, false),
            shared: spec(s_s, c_s, false),
            batch: 6.0,
        };
        // Micro-batches of 3 (3 + 3 + 1 records): the slow reference takes one record at a time.
        let d = diagnostics(
            model.as_ref(),
            naming,
            layer,
            &data,
            &noise,
            3,
            0,
            Device::Cpu,
        )
        .unwrap();
        assert_eq!(d.records, data.len());
        let index = RoleIndex::of_model(model.as_ref(), naming);
        let vars = model.var_store().variables();
        let is_shared = |p: &str| {
            vars[p].requires_grad()
                && match index.role(p) {
                    Role::Head => true,
                    Role::Attention => p.contains("lora_"),
                    _ => false,
                }
        };
        let want = reference_signal(model.as_ref(), layer, &data, &is_shared, &|_| c_s);
        assert!(
            (d.shared.signal_norm - want).abs() <= 1e-6 * want.max(1e-12),
            "shared signal {} vs reference {want}",
            d.shared.signal_norm
        );
        assert!(d.shared.signal_norm > 0.0);
        let d_s: i64 = vars
            .iter()
            .filter(|(p, _)| is_shared(p))
            .map(|(_, t)| t.numel() as i64)
            .sum();
        assert_eq!(d.shared.params, d_s);
        assert!((d.shared.noise_norm - s_s * c_s * (d_s as f64).sqrt()).abs() < 1e-12);
        assert!((d.shared.snr - d.shared.signal_norm / d.shared.noise_norm).abs() < 1e-12);
        assert_eq!(d.snr.len(), model.num_experts() as usize);
        for x in 0..d.snr.len() {
            let of_x = |p: &str| {
                vars[p].requires_grad()
                    && p.contains("lora_")
                    && matches!(index.role(p), Role::RoutedExpert(id) if id.layer == layer && id.expert == x)
            };
            let want = reference_signal(model.as_ref(), layer, &data, &of_x, &|_| c_e);
            assert!(
                (d.expert_signal_norms[x] - want).abs() <= 1e-6 * want.max(1e-9),
                "expert {x}: {} vs reference {want}",
                d.expert_signal_norms[x]
            );
            let d_x: i64 = vars
                .iter()
                .filter(|(p, _)| of_x(p))
                .map(|(_, t)| t.numel() as i64)
                .sum();
            let n = s_e * c_e * (d_x as f64).sqrt();
            assert!((d.expert_noise_norms[x] - n).abs() < 1e-12);
            assert!((d.snr[x] - d.expert_signal_norms[x] / n).abs() < 1e-9);
        }
        // Doubling σ halves every SNR; the signals do not move.
        let loud = DiagNoise {
            expert: spec(2.0 * s_e, c_e, false),
            shared: spec(2.0 * s_s, c_s, false),
            batch: 6.0,
        };
        let d2 = diagnostics(
            model.as_ref(),
            naming,
            layer,
            &data,
            &loud,
            3,
            0,
            Device::Cpu,
        )
        .unwrap();
        assert!((d2.shared.snr - d.shared.snr / 2.0).abs() < 1e-9);
        assert_eq!(d2.expert_signal_norms, d.expert_signal_norms);
        // One batch of all the records: the same numbers up to float round-off.
        let one = diagnostics(
            model.as_ref(),
            naming,
            layer,
            &data,
            &noise,
            64,
            0,
            Device::Cpu,
        )
        .unwrap();
        assert!(
            (one.shared.signal_norm - d.shared.signal_norm).abs() <= 1e-6 * d.shared.signal_norm
        );
        assert!((one.role_mismatch - d.role_mismatch).abs() <= 1e-6);
        let (a, b) = (one.clip_suppressed_fraction, d.clip_suppressed_fraction);
        assert!(
            (a - b).abs() <= 1e-9 || (a.is_nan() && b.is_nan()),
            "{a} vs {b}"
        );
    }

    /// A monolithic method's global clip: one factor over every diagnosed coordinate, so the
    /// shared and expert signals are pieces of one clipped sum whose norm is at most n·C.
    #[test]
    fn a_global_clip_bounds_the_whole_sum() {
        tch::set_num_threads(1);
        let (model, layer, data) = toy();
        let c = 0.02;
        let noise = DiagNoise {
            expert: spec(1.0, c, true),
            shared: spec(1.0, c, true),
            batch: 6.0,
        };
        let d = diagnostics(
            model.as_ref(),
            Naming::Switch,
            layer,
            &data,
            &noise,
            2,
            0,
            Device::Cpu,
        )
        .unwrap();
        let total = (d.shared.signal_norm.powi(2)
            + d.expert_signal_norms.iter().map(|s| s * s).sum::<f64>())
        .sqrt();
        assert!(total <= data.len() as f64 * c * (1.0 + 1e-9), "{total}");
        assert!(total > 0.0);
    }

    /// The diagnostic batch is the run's expected size, within [32, 256] and the records held.
    #[test]
    fn the_diagnostic_batch_follows_the_run() {
        use crate::diagnostic_records;
        assert_eq!(diagnostic_records(64.0, 400), 64);
        assert_eq!(diagnostic_records(8.0, 400), 32);
        assert_eq!(diagnostic_records(1000.0, 4000), 256);
        assert_eq!(diagnostic_records(64.0, 10), 10);
        assert_eq!(diagnostic_records(f64::NAN, 100), 32);
    }
}
