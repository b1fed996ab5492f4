//! The white-box Dirac audit: the canaries' coordinates, their placement in the releases,
//! the expert stream's own ε, and the scores read from the released updates.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The parameters a Dirac audit may place canaries in, each with its canary value (the
/// smallest bound of a clip group, or global clip, that holds it in any phase): every
/// parameter a phase releases, or with `expert` only those of the clip group of that routed
/// expert of `layer`.
pub(super) fn dirac_params(
    plan: &Plan,
    layer: Option<usize>,
    expert: Option<usize>,
) -> Result<BTreeMap<String, f64>> {
    let wanted: Option<GroupId> = match (expert, layer) {
        (None, _) => None,
        (Some(expert), Some(layer)) => Some(GroupId::Expert(ExpertId { layer, expert })),
        (Some(_), None) => {
            return Err(AuditError::Config(
                "--expert: the method trains no expert stream (RAPTOR or expert-only)".into(),
            ));
        }
    };
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for ph in &plan.phases {
        for r in &ph.releases {
            for g in r.groups.iter().filter_map(|g| ph.group(g)) {
                if wanted.as_ref().is_some_and(|w| *w != g.name) {
                    continue;
                }
                for p in &g.params {
                    out.entry(p.clone()).or_insert(f64::INFINITY);
                }
            }
        }
    }
    if out.is_empty() {
        return Err(AuditError::Config(match (expert, layer) {
            (Some(e), Some(l)) => format!(
                "--expert {e}: layer {l} has no released expert {e} (experts are numbered from 0)"
            ),
            _ => "the plan releases no parameter to place canaries in".into(),
        }));
    }
    // The value: within every bound that applies to the parameter, in any phase.
    for ph in &plan.phases {
        for g in &ph.groups {
            let bound = ph.global_clip.unwrap_or(g.bound);
            for p in &g.params {
                if let Some(v) = out.get_mut(p) {
                    *v = v.min(bound);
                }
            }
        }
    }
    Ok(out)
}

/// `m` canaries at distinct coordinates of `params` (name → value), drawn uniformly by the
/// design seed among all their coordinates (`numel`: each parameter's element count); a canary
/// in a routed expert's parameter (`routed`) is owned by that expert.
pub(super) fn place_dirac(
    params: &BTreeMap<String, f64>,
    numel: &BTreeMap<String, usize>,
    routed: &BTreeMap<String, ExpertId>,
    m: usize,
    design_seed: u64,
) -> Result<Vec<DiracCanary>> {
    let mut starts = Vec::with_capacity(params.len());
    let mut total = 0usize;
    for p in params.keys() {
        let n = numel
            .get(p)
            .copied()
            .ok_or_else(|| AuditError::Config(format!("parameter {p} is not in the model")))?;
        starts.push((total, p));
        total += n;
    }
    if m > total {
        return Err(AuditError::Config(format!(
            "--canaries {m}: the audited parameters have {total} coordinates; a canary needs one of its own"
        )));
    }
    let mut rng = ChaCha20Rng::seed_from_u64(design_seed);
    let mut out = Vec::with_capacity(m);
    for flat in sample(&mut rng, total, m).into_iter() {
        // The last parameter whose first coordinate is ≤ flat.
        let at = starts.partition_point(|(s, _)| *s <= flat) - 1;
        let (start, p) = starts[at];
        let mut c = DiracCanary::single(p.clone(), (flat - start) as i64, params[p]);
        c.owner = routed.get(p).copied();
        out.push(c);
    }
    Ok(out)
}

/// How far past its bound a paired canary's gradient reaches at each coordinate: clipping must
/// bring it back (the canary goes through clipping, not around it).
pub(super) const PAIRED_OVERSHOOT: f64 = 4.0;

/// `m` paired canaries: each gets an owner expert of `layer` (uniform by the design seed), one
/// coordinate of a shared-stream parameter and one of a parameter of its owner expert (each
/// uniform over that set's coordinates, all distinct), with gradient [`PAIRED_OVERSHOOT`] times
/// the parameter's value in `params` (its smallest clip bound).
pub(super) fn place_paired(
    plan: &Plan,
    params: &BTreeMap<String, f64>,
    numel: &BTreeMap<String, usize>,
    layer: Option<usize>,
    m: usize,
    design_seed: u64,
) -> Result<Vec<DiracCanary>> {
    let layer = layer.ok_or_else(|| {
        AuditError::Config(
            "--kind paired: the method trains no expert stream (RAPTOR, or expert-only with shared releases)".into(),
        )
    })?;
    let mut shared: Vec<String> = Vec::new();
    let mut experts: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for ph in &plan.phases {
        for r in &ph.releases {
            let names = r
                .groups
                .iter()
                .filter_map(|g| ph.group(g))
                .flat_map(|g| g.params.iter().cloned());
            match &r.charge {
                Charge::Sequential => shared.extend(names),
                Charge::Parallel(id) if id.layer == layer => {
                    experts.entry(id.expert).or_default().extend(names);
                }
                _ => {}
            }
        }
    }
    shared.sort();
    shared.dedup();
    shared.retain(|p| params.contains_key(p) && !plan.routed.contains_key(p));
    for v in experts.values_mut() {
        v.sort();
        v.dedup();
        v.retain(|p| params.contains_key(p));
    }
    experts.retain(|_, v| !v.is_empty());
    if shared.is_empty() || experts.is_empty() {
        return Err(AuditError::Config(
            "--kind paired: the plan does not release both a shared stream and routed experts"
                .into(),
        ));
    }
    let count = |ps: &[String]| -> Result<Vec<(usize, String)>> {
        let mut out = Vec::with_capacity(ps.len());
        let mut total = 0usize;
        for p in ps {
            out.push((total, p.clone()));
            total += numel
                .get(p)
                .copied()
                .ok_or_else(|| AuditError::Config(format!("parameter {p} is not in the model")))?;
        }
        out.push((total, String::new()));
        Ok(out)
    };
    let shared_starts = count(&shared)?;
    let shared_total = shared_starts.last().map_or(0, |s| s.0);
    let expert_ids: Vec<usize> = experts.keys().copied().collect();
    let expert_starts: BTreeMap<usize, Vec<(usize, String)>> = experts
        .iter()
        .map(|(e, ps)| Ok((*e, count(ps)?)))
        .collect::<Result<_>>()?;
    let mut rng = ChaCha20Rng::seed_from_u64(design_seed);
    let owners: Vec<usize> = (0..m)
        .map(|_| expert_ids[rng.random_range(0..expert_ids.len())])
        .collect();
    for e in &expert_ids {
        let need = owners.iter().filter(|o| *o == e).count();
        let have = expert_starts[e].last().map_or(0, |s| s.0);
        if need > have {
            return Err(AuditError::Config(format!(
                "--canaries {m}: expert {e} has {have} coordinates for its {need} paired canaries"
            )));
        }
    }
    if m > shared_total {
        return Err(AuditError::Config(format!(
            "--canaries {m}: the shared stream has {shared_total} coordinates; a paired canary needs one of its own"
        )));
    }
    let at = |starts: &[(usize, String)], flat: usize| -> (String, i64) {
        let i = starts.partition_point(|(s, _)| *s <= flat) - 1;
        (starts[i].1.clone(), (flat - starts[i].0) as i64)
    };
    let shared_flat = sample(&mut rng, shared_total, m).into_vec();
    let mut expert_flat: BTreeMap<usize, std::vec::IntoIter<usize>> = BTreeMap::new();
    for e in &expert_ids {
        let need = owners.iter().filter(|o| *o == e).count();
        let have = expert_starts[e].last().map_or(0, |s| s.0);
        expert_flat.insert(*e, sample(&mut rng, have, need).into_vec().into_iter());
    }
    let mut out = Vec::with_capacity(m);
    for (i, &e) in owners.iter().enumerate() {
        let (sp, si) = at(&shared_starts, shared_flat[i]);
        let flat = expert_flat
            .get_mut(&e)
            .and_then(Iterator::next)
            .ok_or_else(|| {
                AuditError::Run("paired canary placement ran out of coordinates".into())
            })?;
        let (ep, ei) = at(&expert_starts[&e], flat);
        let shared_value = params[&sp];
        let expert_value = params[&ep];
        out.push(DiracCanary {
            coords: vec![
                CanaryCoord {
                    param: sp,
                    index: si,
                    gradient: PAIRED_OVERSHOOT * shared_value,
                },
                CanaryCoord {
                    param: ep,
                    index: ei,
                    gradient: PAIRED_OVERSHOOT * expert_value,
                },
            ],
            owner: Some(ExpertId { layer, expert: e }),
        });
    }
    Ok(out)
}

/// The certified ε of one expert stream alone: every update that releases expert `expert` of
/// `layer`, at that release's σ, composed (None when it has no noise).
pub(super) fn expert_stream_epsilon(
    plan: &Plan,
    layer: usize,
    expert: usize,
    delta: f64,
    accuracy: f64,
) -> Result<ExpertAudit> {
    let counts = plan.phase_counts();
    let mut comp = Composition::new();
    let (mut updates, mut sigma, mut noiseless) = (0u64, f64::NAN, false);
    for (ph, &count) in plan.phases.iter().zip(&counts) {
        for r in &ph.releases {
            if r.charge == Charge::Parallel(ExpertId { layer, expert }) && count > 0 {
                updates += count;
                sigma = r.sigma;
                if ph.private && r.sigma > 0.0 {
                    comp.push(SubsampledGaussian::new(plan.q, r.sigma)?, count)?;
                } else {
                    noiseless = true;
                }
            }
        }
    }
    let epsilon_stream = if updates == 0 || noiseless {
        None
    } else {
        let acc = PrvAccountant::new(Accuracy::relative(accuracy))?;
        Some(acc.epsilon(&comp, delta)?.upper)
    };
    Ok(ExpertAudit {
        layer,
        expert,
        stream_updates: updates,
        sigma,
        epsilon_stream,
    })
}

/// The white-box audit (module docs) with the secret `coins` (one per canary).
pub(super) fn audit_dirac(
    cfg: &RunConfig,
    opts: &AuditOptions,
    kind: CanaryKind,
    runs_dir: &Path,
    progress: Progress<'_>,
    tamper: Tamper,
    coins: Vec<bool>,
) -> Result<AuditReport> {
    let m = coins.len();
    if m < 2 {
        return Err(AuditError::Config(format!(
            "--canaries {m}: an audit needs at least 2 canaries"
        )));
    }
    let mut session: Session = prepare_counting(cfg, None, m.div_ceil(2))?;
    apply_tamper(&mut session.plan, tamper);
    let layer = session.layer.as_ref().map(|l| l.layer);
    if kind == CanaryKind::Paired && opts.expert.is_some() {
        return Err(AuditError::Config(
            "--expert with --kind paired: a paired canary reaches its own owner expert; use --kind dirac for a per-expert audit".into(),
        ));
    }
    let params = dirac_params(&session.plan, layer, opts.expert)?;
    let numel: BTreeMap<String, usize> = session
        .model
        .var_store()
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.numel()))
        .collect();
    let placed = if kind == CanaryKind::Paired {
        place_paired(&session.plan, &params, &numel, layer, m, opts.design_seed)?
    } else {
        place_dirac(&params, &numel, &session.plan.routed, m, opts.design_seed)?
    };
    let names: Vec<String> = params.keys().cloned().collect();
    let position = |p: &str| names.iter().position(|n| n == p).unwrap_or(0);
    let param_of: Vec<usize> = placed
        .iter()
        .map(|c| position(&c.coords[0].param))
        .collect();
    let index: Vec<i64> = placed.iter().map(|c| c.coords[0].index).collect();
    let value: Vec<f64> = placed.iter().map(|c| c.coords[0].gradient).collect();
    let paired: Vec<PairedCoord> = placed
        .iter()
        .filter_map(|c| {
            let second = c.coords.get(1)?;
            Some(PairedCoord {
                param: position(&second.param),
                index: second.index,
                gradient: second.gradient,
                owner: c.owner.map_or(0, |o| o.expert),
            })
        })
        .collect();
    let real_records = session.train.len();
    let plan_records = real_records + m.div_ceil(2);
    let plan = session.plan.clone();
    #[cfg_attr(not(feature = "planted-faults"), allow(unused_mut))]
    let (mut canaries, traces) = DiracCanaries::new(placed, &coins)?;
    #[cfg(feature = "planted-faults")]
    if let Tamper::Fault(f) = tamper {
        canaries.fault = Some(f);
    }
    let dir = runs_dir.join(format!("audit-{}", new_run_id(cfg.method.name())));
    let (dir, mut record, _model) = train_prepared_with_canaries(session, canaries, dir, progress)?;
    let traces: Vec<raptor_eval::audit::DiracTrace> = traces
        .lock()
        .map_err(|_| AuditError::Run("the canary traces are poisoned".into()))?
        .clone();
    let sum_scores: Vec<f64> = traces.iter().map(|t| t.sum_score()).collect();
    let max_scores: Vec<f64> = traces.iter().map(|t| t.max_score()).collect();
    let grid = default_grid(m);
    let delta = record.privacy_plan.delta;
    let (stat, search) = audit_search_many(
        &[&sum_scores, &max_scores],
        &coins,
        delta,
        opts.confidence,
        &grid,
    )?;
    let (statistic, scores) = if stat == 0 {
        ("sum", sum_scores.clone())
    } else {
        ("max", max_scores.clone())
    };
    let mia = canary_mia(&scores, &coins)?;
    let expert = match (opts.expert, layer) {
        (Some(e), Some(l)) => Some(expert_stream_epsilon(
            &plan,
            l,
            e,
            delta,
            cfg.privacy.accuracy,
        )?),
        _ => None,
    };
    let notes = run_notes(cfg, &record);
    let included = coins.iter().filter(|c| **c).count();
    let report = AuditReport {
        notice: PRIVATE_NOTICE.into(),
        run: dir.clone(),
        method: record.method.clone(),
        kind,
        canaries: m,
        design_seed: opts.design_seed,
        insecure_seeded: cfg.train.insecure_seed.is_some(),
        real_records,
        train_records: real_records + included,
        sampling_rate: record.privacy_plan.q,
        included,
        canary_ids: Vec::new(),
        source_ids: Vec::new(),
        canary_labels: Vec::new(),
        coins,
        initial_losses: Vec::new(),
        final_losses: Vec::new(),
        scores,
        grid,
        epsilon_lower: search.epsilon_lower,
        confidence: opts.confidence,
        search,
        epsilon_upper: record.epsilon.as_ref().map(|e| e.upper),
        epsilon_target: record.privacy_plan.epsilon,
        delta,
        mia,
        dirac: Some(DiracReport {
            plan_records,
            params: names,
            param: param_of,
            index,
            value,
            paired,
            releases: traces.iter().map(|t| t.releases()).collect(),
            sum_scores,
            max_scores,
            statistic: statistic.into(),
        }),
        expert,
        notes,
    };
    finish(report, &dir, &mut record)
}
