//! The paper tables and plots, computed from the run summaries. Every sentence under a table is
//! computed from that run's numbers.

use std::path::Path;

use raptor_report::{
    BarPlot, Estimate, LinePlot, Series, Table, bar_plot, estimate, line_plot, ordering,
};
use raptor_train::config::Choice as _;
use raptor_train::config::{ExpertClip, ExpertDenominator, Method, ResidualWeight, RunConfig};

use super::{Results, label};

/// The private classification methods of Table 1 (the non-private references are added):
/// RAPTOR and the two baselines its claim is tested against.
pub const CLASSIFICATION_METHODS: [Method; 3] =
    [Method::DpAdamLora, Method::SharedOnly, Method::Raptor];

/// An ablation: its name and the change to RAPTOR's config.
pub type Ablation = (&'static str, fn(&mut RunConfig));

/// Paper Table 5's ablations of RAPTOR.
pub const ABLATIONS: [Ablation; 4] = [
    ("no-alternation", |c| {
        if let Some(a) = c.method.alternation_mut() {
            a.alternate = false;
        }
    }),
    ("no-public-denominator", |c| {
        if let Some(s) = c.method.expert_streams_mut() {
            s.expert_denominator = ExpertDenominator::Batch;
        }
    }),
    ("no-expert-clipping", |c| {
        if let Some(s) = c.method.expert_streams_mut() {
            s.expert_clip = ExpertClip::Global;
        }
    }),
    ("no-residual-weight", |c| {
        if let Some(s) = c.method.expert_streams_mut() {
            s.residual = ResidualWeight::None;
        }
    }),
];

fn pretty(m: &str) -> &str {
    match m {
        "lora" => "LoRA (non-private)",
        "dp-adam-lora" => "DP-Adam LoRA (monolithic)",
        "matched-scope" => "matched scope",
        "shared-only" => "shared only",
        "expert-only" => "expert only",
        "raptor" => "RAPTOR",
        "dp-adam" => "DP-Adam",
        "dp-muon" => "DP-Muon",
        "dp-muonbc" => "DP-MuonBC",
        "adam" => "Adam (non-private)",
        "muon" => "Muon (non-private)",
        other => other,
    }
}

/// Values of one metric over the seeds of a cell (runs that lack it are skipped).
fn values(
    r: &Results,
    task: &str,
    method: &str,
    variant: &str,
    eps: Option<f64>,
    f: impl Fn(&super::Summary) -> Option<f64>,
) -> Vec<f64> {
    r.scale
        .seeds
        .iter()
        .filter_map(|&s| r.runs.get(&label(task, method, variant, eps, s)))
        .filter_map(&f)
        .filter(|v| v.is_finite())
        .collect()
}

fn est(v: &[f64]) -> Option<Estimate> {
    estimate(v).ok()
}

fn cell(e: Option<Estimate>, scale: f64, digits: usize) -> String {
    match e {
        Some(e) => Estimate {
            mean: e.mean * scale,
            half_width: e.half_width * scale,
            sd: e.sd * scale,
            n: e.n,
        }
        .fmt(digits),
        None => "—".into(),
    }
}

fn acc(s: &super::Summary) -> Option<f64> {
    s.accuracy
}

fn max_eps(r: &Results) -> f64 {
    r.scale.epsilons.iter().copied().fold(f64::MIN, f64::max)
}

/// Seeds (the first of the profile's) on which the ablations and the layer choice run.
pub const ABLATION_SEEDS: usize = 3;

/// The seeds note of the ablation and layer-choice tables: their variants run on fewer seeds
/// than the full method's row.
fn ablation_seeds_note(r: &Results) -> String {
    let n = r.scale.seeds.len().min(ABLATION_SEEDS);
    format!(
        "{} The full method's row is over all {} seeds; each variant over the first {n} ({:?}).",
        seeds_note(r),
        r.scale.seeds.len(),
        &r.scale.seeds[..n]
    )
}

fn seeds_note(r: &Results) -> String {
    format!(
        "Mean ± 95 % Student-t confidence half-width over {} seeds (seeds {:?}); each seed fixes the initialization of the adapters, the Poisson samples and the noise.",
        r.scale.seeds.len(),
        r.scale.seeds
    )
}

fn plot_note(file: &str, what: &str) -> String {
    format!("Plot: {what}\n\n  ![{what}]({file})")
}

/// The classification tables and their plots: the evidence table and the per-domain table
/// always; when the DP stage ran, Table 1, the ablations and layer choice (when they ran), the
/// diagnostics and the cost.
pub fn classification_tables(
    r: &Results,
    out: &Path,
    missing: Option<&str>,
) -> anyhow::Result<Vec<Table>> {
    if r.cls.is_empty() {
        let why = missing.unwrap_or("no classification task");
        return Ok(vec![Table {
            slug: PAPER_EVIDENCE.slug.into(),
            title: format!("{}: skipped", PAPER_EVIDENCE.title),
            columns: vec!["reason".into()],
            rows: vec![vec![why.into()]],
            notes: vec![],
        }]);
    }
    let mut tables = evidence_tables(r, out, &PAPER_EVIDENCE)?;
    if dp_ran(r) {
        tables.push(table1(r, out)?);
        // The ablations and the layer choice run outside the default profile only.
        if r.ablations {
            tables.push(ablation(r)?);
            tables.push(layer_choice(r, out)?);
        }
        tables.push(diagnostics(r, out, &PAPER_DIAGNOSTICS)?);
        tables.push(cost(r)?);
    }
    if let Some(m) = missing {
        for t in &mut tables {
            t.notes.push(format!("Some corpora are missing: {m}"));
        }
    }
    Ok(tables)
}

/// Whether any task's DP stage ran.
pub(crate) fn dp_ran(r: &Results) -> bool {
    r.gate.values().any(|g| g.dp)
}

/// The decision rule of the RAPTOR evidence table, stated before any number.
pub const DECISION_RULE: &str = "Decision rule (fixed before the runs): first the gate — the DP stage of a task runs only when non-private LoRA beats the bag-of-words baselines (mean validation accuracy above the better of naive Bayes and logistic regression on word counts; otherwise the backbone does not learn the task) and the positive control passes (the 95 % Student-t interval of the paired differences over seeds, non-private LoRA with − without expert adapters, lies above +3 points); a task that fails the gate reads \"uninformative\". Then, in each (task, ε) cell, RAPTOR's advantage is reproduced when the 95 % intervals of the paired differences RAPTOR − DP-Adam LoRA and RAPTOR − shared-only (each seed: the same initialization, Poisson samples and noise seed for every method) both lie above 0; the two comparisons are reported separately, each with its minimum detectable effect (paired t-test, two-sided 5 %, 80 % power, from the observed SD of the paired differences). Hyperparameters of every method come from the public proxy only.";

/// Per-seed paired differences `a − b` of validation accuracy in a cell (seeds where both ran).
fn paired(
    r: &Results,
    task: &str,
    a: (&str, &str, Option<f64>),
    b: (&str, &str, Option<f64>),
) -> Vec<f64> {
    r.scale
        .seeds
        .iter()
        .filter_map(|&s| {
            let x = r.runs.get(&label(task, a.0, a.1, a.2, s))?.accuracy?;
            let y = r.runs.get(&label(task, b.0, b.1, b.2, s))?.accuracy?;
            (x.is_finite() && y.is_finite()).then_some(x - y)
        })
        .collect()
}

/// `mean ± half [MDE m]` in points, and whether the interval lies above 0.
fn diff_cell(d: &[f64]) -> (String, Option<bool>) {
    match est(d) {
        Some(e) if e.n >= 2 => {
            let mde = raptor_eval::min_detectable_effect(e.sd, e.n, 0.05, 0.8)
                .map_or(String::new(), |m| format!(" [MDE {:.1}]", 100.0 * m));
            (
                format!("{:+.1} ± {:.1}{mde}", 100.0 * e.mean, 100.0 * e.half_width),
                Some(e.mean - e.half_width > 0.0),
            )
        }
        Some(e) => (format!("{:+.1} (1 seed)", 100.0 * e.mean), None),
        None => ("—".into(), None),
    }
}

/// Where an evidence table goes: its slug, title, the file of its paired-differences plot and
/// the slug of its per-domain table.
pub(crate) struct EvidenceNames {
    /// Table slug (file name without `.md`).
    pub slug: &'static str,
    /// Table title.
    pub title: &'static str,
    /// The plot's file name.
    pub plot: &'static str,
    /// The per-domain table's slug.
    pub domains: &'static str,
}

/// The miniature's evidence table.
const PAPER_EVIDENCE: EvidenceNames = EvidenceNames {
    slug: "paper-evidence",
    title: "RAPTOR vs its baselines on multi-domain sentiment (Switch miniature: experts specialised on public data, a gated positive control, tuned on public data, paired seeds)",
    plot: "raptor-paired-differences.png",
    domains: "paper-domains",
};

/// One cell's bars: label, RAPTOR − DP-Adam LoRA (mean, half-width), RAPTOR − shared only.
type Bar = (String, f64, f64, f64, f64);

fn pct(x: f64) -> String {
    format!("{:.1}", 100.0 * x)
}

/// The evidence table and the per-domain table of a classification grid.
pub(crate) fn evidence_tables(
    r: &Results,
    out: &Path,
    names: &EvidenceNames,
) -> anyhow::Result<Vec<Table>> {
    Ok(vec![evidence(r, out, names)?, domains(r, names)?])
}

/// The evidence table: per task and ε, the baselines (majority class, bag of words, the
/// pretrained start), the non-private references (the positive control: LoRA with and without
/// the experts), every private method, RAPTOR's paired differences against DP-Adam LoRA and
/// shared-only with their minimum detectable effects, and the verdict of [`DECISION_RULE`].
pub(crate) fn evidence(r: &Results, out: &Path, names: &EvidenceNames) -> anyhow::Result<Table> {
    let columns: Vec<String> = [
        "task",
        "ε",
        "majority class",
        "bag of words (NB / LR)",
        "start (no update)",
        "LoRA (non-private)",
        "LoRA without experts (non-private)",
        "DP-Adam LoRA",
        "shared only",
        "RAPTOR",
        "RAPTOR − DP-Adam LoRA (paired) [MDE]",
        "RAPTOR − shared only (paired) [MDE]",
        "verdict",
    ]
    .map(String::from)
    .to_vec();
    let mut rows = Vec::new();
    let mut notes = vec![DECISION_RULE.to_string(), seeds_note(r)];
    let (mut reproduced, mut cells) = (0usize, 0usize);
    let mut bars: Vec<Bar> = Vec::new();
    for t in &r.cls {
        let start = est(&values(r, t, "lora", "start", None, acc));
        let lora = est(&values(r, t, "lora", "", None, acc));
        let no_exp = est(&values(r, t, "lora", "no-experts", None, acc));
        let bow = r.bow.get(t);
        let gate = r.gate.get(t);
        for &e in &r.scale.epsilons {
            let ra = paired(r, t, ("raptor", "", Some(e)), ("dp-adam-lora", "", Some(e)));
            let rs = paired(r, t, ("raptor", "", Some(e)), ("shared-only", "", Some(e)));
            let (ca, ua) = diff_cell(&ra);
            let (cs, us) = diff_cell(&rs);
            let verdict = match gate {
                Some(g) if !g.dp => format!(
                    "uninformative ({})",
                    gate_reason(g, r.scale.gate.backbone_must_learn)
                ),
                _ => match (ua, us) {
                    (Some(true), Some(true)) => {
                        reproduced += 1;
                        "reproduced".to_string()
                    }
                    (Some(a), Some(b)) => format!(
                        "not reproduced ({})",
                        match (a, b) {
                            (false, false) => "neither interval above 0",
                            (false, true) => "vs DP-Adam LoRA: interval not above 0",
                            _ => "vs shared only: interval not above 0",
                        }
                    ),
                    _ => "undecided (fewer than 2 paired seeds)".to_string(),
                },
            };
            cells += 1;
            if let (Some(a), Some(b)) = (est(&ra), est(&rs)) {
                bars.push((
                    format!("{t} ε={e}"),
                    100.0 * a.mean,
                    100.0 * a.half_width,
                    100.0 * b.mean,
                    100.0 * b.half_width,
                ));
            }
            let private = |m: &str| -> String {
                if gate.is_some_and(|g| !g.dp) {
                    "not run".into()
                } else {
                    cell(est(&values(r, t, m, "", Some(e), acc)), 100.0, 1)
                }
            };
            rows.push(vec![
                t.clone(),
                format!("{e}"),
                bow.map_or("—".into(), |b| pct(b.all.majority)),
                bow.map_or("—".into(), |b| {
                    format!(
                        "{} / {}",
                        pct(b.all.naive_bayes),
                        pct(b.all.logistic_regression)
                    )
                }),
                cell(start, 100.0, 1),
                cell(lora, 100.0, 1),
                cell(no_exp, 100.0, 1),
                private("dp-adam-lora"),
                private("shared-only"),
                private("raptor"),
                if gate.is_some_and(|g| !g.dp) {
                    "—".into()
                } else {
                    ca
                },
                if gate.is_some_and(|g| !g.dp) {
                    "—".into()
                } else {
                    cs
                },
                verdict,
            ]);
        }
        // The baselines, the headroom and the gate, computed.
        if let Some(b) = bow {
            let best_simple = [
                Some(b.all.majority),
                Some(b.all.best_bag_of_words()),
                start.map(|s| s.mean),
            ]
            .into_iter()
            .flatten()
            .fold(f64::MIN, f64::max);
            notes.push(format!(
                "{t}: baselines on the same split (non-private, fitted on the private training records' word counts, {} words): majority class {} %, multinomial naive Bayes {} %, logistic regression {} %; the pretrained start {}.{}",
                b.all.vocabulary,
                pct(b.all.majority),
                pct(b.all.naive_bayes),
                pct(b.all.logistic_regression),
                start.map_or("—".into(), |s| format!("{} %", pct(s.mean))),
                match lora {
                    Some(l) => format!(
                        " Headroom, from the best of these ({} %): non-private LoRA gains {:+.1} points ({} %); {}.",
                        pct(best_simple),
                        100.0 * (l.mean - best_simple),
                        pct(l.mean),
                        if l.mean > b.all.best_bag_of_words() {
                            "it beats the bag-of-words baselines: the backbone learns this task"
                        } else {
                            "it does NOT beat the bag-of-words baselines: the backbone does not learn this task, and its verdicts are uninformative"
                        }
                    ),
                    None => String::new(),
                }
            ));
        }
        if let Some(g) = gate {
            let (c, _) = diff_cell(&g.control);
            notes.push(format!(
                "{t}: positive control (non-private LoRA with − without expert adapters, paired over {} seeds): {c} points; the gate (interval above {:+} points{}) {}: {}.",
                g.control.len(),
                r.scale.gate.min_points,
                if r.scale.gate.backbone_must_learn {
                    ", and the backbone beating bag of words"
                } else {
                    "; this profile does not ask the backbone to beat bag of words"
                },
                if g.dp { "PASSES" } else { "FAILS" },
                if g.dp {
                    "the DP stage ran".to_string()
                } else {
                    format!(
                        "the DP stage was not run ({})",
                        gate_reason(g, r.scale.gate.backbone_must_learn)
                    )
                }
            ));
        }
        notes.extend(domain_notes(r, t));
        notes.extend(sigma_notes(r, t));
    }
    notes.push(format!(
        "RAPTOR's advantage reproduced in {reproduced} of {cells} (task, ε) cells by the decision rule."
    ));
    // Every private method spends its whole ε: the spent range per target.
    for &e in &r.scale.epsilons {
        let spent: Vec<f64> = r
            .runs
            .iter()
            .filter(|(k, _)| !k.starts_with("proxy ") && k.contains(&format!(" eps={e} ")))
            .filter_map(|(_, s)| s.epsilon)
            .collect();
        if let (Some(lo), Some(hi)) = (
            spent.iter().copied().reduce(f64::min),
            spent.iter().copied().reduce(f64::max),
        ) {
            notes.push(format!(
                "Target ε = {e}: the {} private runs spent certified ε from {lo:.4} to {hi:.4} ({}).",
                spent.len(),
                if hi <= e && lo >= 0.99 * e {
                    "every one within 1 % below the target"
                } else if hi <= e {
                    "within the target, but some more than 1 % below it"
                } else {
                    "SOME ABOVE THE TARGET"
                }
            ));
        }
    }
    notes.extend(r.notes.iter().cloned());
    if !bars.is_empty() {
        let file = names.plot;
        let series = |name: &str, pick: fn(&Bar) -> (f64, f64)| Series {
            name: name.into(),
            points: bars
                .iter()
                .enumerate()
                .map(|(i, b)| (i as f64, pick(b).0))
                .collect(),
            // A half-width is NaN with one seed: no whisker then.
            err: Some(
                bars.iter()
                    .map(|b| {
                        if pick(b).1.is_finite() {
                            pick(b).1
                        } else {
                            0.0
                        }
                    })
                    .collect(),
            ),
        };
        bar_plot(
            &out.join(file),
            &BarPlot {
                title: "RAPTOR − baseline, paired over seeds (points, 95 % CI)".into(),
                y_label: "accuracy difference (points)".into(),
                categories: bars.iter().map(|b| b.0.clone()).collect(),
                groups: vec![
                    series("RAPTOR − DP-Adam LoRA", |b| (b.1, b.2)),
                    series("RAPTOR − shared only", |b| (b.3, b.4)),
                ],
            },
        )?;
        notes.push(plot_note(file, "RAPTOR's paired differences per cell"));
    }
    Ok(Table {
        slug: names.slug.into(),
        title: names.title.into(),
        columns,
        rows,
        notes,
    })
}

/// Why a task's gate stopped its DP stage.
fn gate_reason(g: &super::GateOutcome, must_learn: bool) -> &'static str {
    match (g.control_passes, g.learns || !must_learn) {
        (false, false) => "positive control failed; the backbone does not beat bag of words",
        (false, true) => "positive control failed",
        (true, false) => "the backbone does not learn this task",
        (true, true) => "gate passed",
    }
}

/// The accuracy of a summary on a group: a domain's own, or — for [`FLIPPED`] and
/// [`UNFLIPPED`] — the mean over those domains (they have equally many validation records).
fn group_of(groups: &[(String, bool)], acc: &[(String, f64)], group: &str) -> Option<f64> {
    let pick = |want: bool| -> Option<f64> {
        let v: Vec<f64> = groups
            .iter()
            .filter(|(_, f)| *f == want)
            .map(|(g, _)| acc.iter().find(|(x, _)| x == g).map(|(_, a)| *a))
            .collect::<Option<Vec<f64>>>()?;
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    match group {
        FLIPPED => pick(true),
        UNFLIPPED => pick(false),
        g => acc.iter().find(|(x, _)| x == g).map(|(_, a)| *a),
    }
}

/// The group of the flipped domains.
const FLIPPED: &str = "flipped";
/// The group of the other domains.
const UNFLIPPED: &str = "unflipped";

/// Accuracy of a cell on one validation group, per seed.
fn group_values(
    r: &Results,
    t: &str,
    method: &str,
    variant: &str,
    eps: Option<f64>,
    group: &str,
) -> Vec<f64> {
    let groups = r.groups.get(t).cloned().unwrap_or_default();
    values(r, t, method, variant, eps, |s| {
        group_of(&groups, &s.group_accuracy, group)
    })
}

/// A bag-of-words baseline's accuracy on a group.
fn bow_group(
    r: &Results,
    t: &str,
    b: &super::BowSummary,
    group: &str,
    f: fn(&raptor_eval::bow::BowReport) -> f64,
) -> Option<f64> {
    let groups = r.groups.get(t).cloned().unwrap_or_default();
    let acc: Vec<(String, f64)> = b.groups.iter().map(|(g, v)| (g.clone(), f(v))).collect();
    group_of(&groups, &acc, group)
}

/// Sentences on the flipped and unflipped domains: where the experts must act.
fn domain_notes(r: &Results, t: &str) -> Vec<String> {
    let (f, u) = (FLIPPED, UNFLIPPED);
    let mut out = Vec::new();
    let show = |method: &str, variant: &str, eps: Option<f64>| -> Option<String> {
        let a = est(&group_values(r, t, method, variant, eps, f))?;
        let b = est(&group_values(r, t, method, variant, eps, u))?;
        Some(format!(
            "{} {} % on the flipped domains vs {} % on the others",
            pretty(method),
            pct(a.mean),
            pct(b.mean)
        ))
    };
    let mut parts: Vec<String> = [("lora", ""), ("lora", "no-experts")]
        .iter()
        .filter_map(|(m, v)| {
            show(m, v, None).map(|s| {
                if v.is_empty() {
                    s
                } else {
                    s.replace("LoRA (non-private)", "LoRA without experts")
                }
            })
        })
        .collect();
    for &e in &r.scale.epsilons {
        for m in CLASSIFICATION_METHODS {
            if let Some(s) = show(m.name(), "", Some(e)) {
                parts.push(format!("{s} (ε = {e})"));
            }
        }
    }
    if let Some(b) = r.bow.get(t) {
        let nb = |g| bow_group(r, t, b, g, |x| x.naive_bayes);
        let lr = |g| bow_group(r, t, b, g, |x| x.logistic_regression);
        if let (Some(a), Some(c), Some(d), Some(e)) = (nb(f), nb(u), lr(f), lr(u)) {
            parts.push(format!(
                "naive Bayes {} % vs {} %, logistic regression {} % vs {} %",
                pct(a),
                pct(c),
                pct(d),
                pct(e)
            ));
        }
    }
    if !parts.is_empty() {
        out.push(format!(
            "{t}: accuracy where the experts must act (the domains whose label meaning is flipped) and elsewhere, mean over seeds: {}.",
            parts.join("; ")
        ));
    }
    out
}

/// Sentences comparing the σ of each private cell with its proxy's.
fn sigma_notes(r: &Results, t: &str) -> Vec<String> {
    let mut parts = Vec::new();
    for &e in &r.scale.epsilons {
        for m in CLASSIFICATION_METHODS {
            let private = r
                .scale
                .seeds
                .iter()
                .find_map(|&s| r.runs.get(&label(t, m.name(), "", Some(e), s)));
            let prefix = format!("proxy {t} {}[", m.name());
            let suffix = format!(" eps={e} seed=0");
            let proxy = r.runs.iter().find_map(|(k, v)| {
                (k.starts_with(&prefix) && k.ends_with(&suffix) && !v.sigmas.is_empty())
                    .then_some(v)
            });
            if let (Some(p), Some(q)) = (private, proxy)
                && !p.sigmas.is_empty()
            {
                let fmt = |s: &super::Summary| {
                    s.sigmas
                        .iter()
                        .map(|(n, x)| format!("{n} {x:.3}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                parts.push(format!(
                    "{} at ε = {e}: σ {} (private) vs {} (proxy)",
                    pretty(m.name()),
                    fmt(p),
                    fmt(q)
                ));
            }
        }
    }
    if parts.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "{t}: the noise the proxy tuned at against the private runs' (expected batch equal): {}.",
            parts.join("; ")
        )]
    }
}

/// The per-domain table: validation accuracy on every group of validation records (each
/// domain, the flipped and the unflipped ones, all), per method, mean ± 95 % CI over seeds; the
/// baselines' single numbers beside them.
fn domains(r: &Results, names: &EvidenceNames) -> anyhow::Result<Table> {
    let mut columns = vec!["task".to_string(), "method".to_string()];
    let mut groups: Vec<String> = r
        .groups
        .values()
        .next()
        .map(|g| g.iter().map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    groups.push(FLIPPED.into());
    groups.push(UNFLIPPED.into());
    columns.extend(groups.iter().cloned());
    columns.push("all".into());
    let mut rows = Vec::new();
    for t in &r.cls {
        if let Some(b) = r.bow.get(t) {
            for (name, f) in [
                (
                    "majority class",
                    (|x: &raptor_eval::bow::BowReport| x.majority)
                        as fn(&raptor_eval::bow::BowReport) -> f64,
                ),
                ("naive Bayes (word counts)", |x| x.naive_bayes),
                ("logistic regression (word counts)", |x| {
                    x.logistic_regression
                }),
            ] {
                let mut row = vec![t.clone(), name.to_string()];
                for g in &groups {
                    row.push(bow_group(r, t, b, g, f).map_or("—".into(), pct));
                }
                row.push(pct(f(&b.all)));
                rows.push(row);
            }
        }
        let mut cellset: Vec<(String, &str, &str, Option<f64>)> = vec![
            ("start (no update)".into(), "lora", "start", None),
            ("LoRA (non-private)".into(), "lora", "", None),
            (
                "LoRA without experts (non-private)".into(),
                "lora",
                "no-experts",
                None,
            ),
        ];
        for &e in &r.scale.epsilons {
            for m in CLASSIFICATION_METHODS {
                cellset.push((format!("{} ε={e}", pretty(m.name())), m.name(), "", Some(e)));
            }
        }
        for (name, m, v, e) in cellset {
            let all = values(r, t, m, v, e, acc);
            if all.is_empty() {
                continue;
            }
            let mut row = vec![t.clone(), name];
            for g in &groups {
                row.push(cell(est(&group_values(r, t, m, v, e, g)), 100.0, 1));
            }
            row.push(cell(est(&all), 100.0, 1));
            rows.push(row);
        }
    }
    Ok(Table {
        slug: names.domains.into(),
        title: "Validation accuracy per domain: where the experts must act (flipped domains) and elsewhere".into(),
        columns,
        rows,
        notes: vec![
            seeds_note(r),
            "Each domain's column scores the validation set's records of that domain (every domain has as many negative as positive records, and as many records as every other domain); `flipped` is the mean over the domains whose label meaning is flipped, `unflipped` over the others. The bag-of-words baselines are fitted once on the private training records (no seeds).".into(),
        ],
    })
}

fn table1(r: &Results, out: &Path) -> anyhow::Result<Table> {
    let mut columns = vec!["method".to_string()];
    for t in &r.cls {
        for e in &r.scale.epsilons {
            columns.push(format!("{t} ε={e}"));
        }
    }
    let mut methods: Vec<&str> = vec!["lora"];
    methods.extend(CLASSIFICATION_METHODS.iter().map(|m| m.name()));
    let mut rows = Vec::new();
    for m in &methods {
        let mut row = vec![pretty(m).to_string()];
        for t in &r.cls {
            for &e in &r.scale.epsilons {
                let eps = (*m != "lora").then_some(e);
                row.push(cell(est(&values(r, t, m, "", eps, acc)), 100.0, 1));
            }
        }
        rows.push(row);
    }
    let mut notes = vec![
        "Validation accuracy (%) of private fine-tuning (LoRA adapters + head, rank 8) on the multi-domain task from a Switch-style MoE encoder pretrained, routed and specialised on public records only. The LoRA row is non-private (ε = ∞) and repeats across ε columns.".to_string(),
        seeds_note(r),
    ];
    let pairs = |a: &str, b: &str| -> Vec<(Estimate, Estimate)> {
        let mut v = Vec::new();
        for t in &r.cls {
            for &e in &r.scale.epsilons {
                if let (Some(x), Some(y)) = (
                    est(&values(r, t, a, "", Some(e), acc)),
                    est(&values(r, t, b, "", Some(e), acc)),
                ) {
                    v.push((x, y));
                }
            }
        }
        v
    };
    for b in ["dp-adam-lora", "shared-only"] {
        notes.push(ordering(&pairs("raptor", b)).sentence("RAPTOR", pretty(b)));
    }
    // ε actually spent: the largest certified upper bound of any run, per target.
    for &e in &r.scale.epsilons {
        let spent: Vec<f64> = r
            .runs
            .iter()
            .filter(|(k, _)| !k.starts_with("proxy ") && k.contains(&format!(" eps={e} ")))
            .filter_map(|(_, s)| s.epsilon)
            .collect();
        if let Some(mx) = spent.iter().copied().reduce(f64::max) {
            notes.push(format!(
                "Target ε = {e}: the largest certified ε spent by any of its {} runs is {mx:.4} ({}).",
                spent.len(),
                if mx <= e * (1.0 + 1e-9) {
                    "within the target"
                } else {
                    "ABOVE the target"
                }
            ));
        }
    }
    notes.push(
        "How the task, the backbone and the proxy were made: the notes of the evidence table."
            .to_string(),
    );
    for t in &r.cls {
        let mut series = Vec::new();
        for m in CLASSIFICATION_METHODS {
            let mut pts = Vec::new();
            let mut err = Vec::new();
            for &e in &r.scale.epsilons {
                if let Some(x) = est(&values(r, t, m.name(), "", Some(e), acc)) {
                    pts.push((e, 100.0 * x.mean));
                    err.push(if x.half_width.is_finite() {
                        100.0 * x.half_width
                    } else {
                        0.0
                    });
                }
            }
            if !pts.is_empty() {
                series.push(Series {
                    name: pretty(m.name()).into(),
                    points: pts,
                    err: Some(err),
                });
            }
        }
        if series.is_empty() {
            continue;
        }
        let file = format!("accuracy-vs-epsilon-{t}.png");
        line_plot(
            &out.join(&file),
            &LinePlot {
                title: format!("{t}: validation accuracy vs ε (95 % CI)"),
                x_label: "ε".into(),
                y_label: "accuracy (%)".into(),
                series,
                x_log: false,
                secondary: None,
            },
        )?;
        notes.push(plot_note(&file, &format!("{t}: accuracy vs ε")));
        // Training curves of seed 0 at the largest ε.
        let seed = r.scale.seeds.first().copied().unwrap_or(0);
        let e = max_eps(r);
        let mut loss = Vec::new();
        let mut eps_series = Vec::new();
        let mut acc_series = Vec::new();
        for m in ["raptor", "dp-adam-lora"] {
            if let Some(s) = r.runs.get(&label(t, m, "", Some(e), seed)) {
                loss.push(Series {
                    name: format!("{} train loss", pretty(m)),
                    points: s.loss_curve.iter().map(|&(u, l)| (u as f64, l)).collect(),
                    err: None,
                });
                if !s.epsilon_curve.is_empty() {
                    eps_series.push(Series {
                        name: format!("{} ε spent", pretty(m)),
                        points: s
                            .epsilon_curve
                            .iter()
                            .map(|&(u, x)| (u as f64, x))
                            .collect(),
                        err: None,
                    });
                }
                let pts: Vec<(f64, f64)> = s
                    .eval_curve
                    .iter()
                    .filter_map(|&(u, _, a)| a.map(|a| (u as f64, 100.0 * a)))
                    .collect();
                if !pts.is_empty() {
                    acc_series.push(Series {
                        name: pretty(m).into(),
                        points: pts,
                        err: None,
                    });
                }
            }
        }
        if loss.iter().all(|s| !s.points.is_empty()) && !loss.is_empty() {
            let file = format!("training-loss-{t}.png");
            line_plot(
                &out.join(&file),
                &LinePlot {
                    title: format!("{t}: training loss and ε spent (ε = {e}, seed {seed})"),
                    x_label: "update".into(),
                    y_label: "training loss (sampled records)".into(),
                    series: loss,
                    x_log: false,
                    secondary: (!eps_series.is_empty())
                        .then(|| ("certified ε spent".to_string(), eps_series)),
                },
            )?;
            notes.push(plot_note(&file, &format!("{t}: training loss, ε spent")));
            notes.push(
                "The training loss is measured on the private Poisson samples before noise: a diagnostic for the data owner, not part of the differentially private release (ε covers the model only)."
                    .to_string(),
            );
        }
        if !acc_series.is_empty() {
            let file = format!("validation-accuracy-{t}.png");
            line_plot(
                &out.join(&file),
                &LinePlot {
                    title: format!(
                        "{t}: validation accuracy during training (ε = {e}, seed {seed})"
                    ),
                    x_label: "update".into(),
                    y_label: "accuracy (%)".into(),
                    series: acc_series,
                    x_log: false,
                    secondary: None,
                },
            )?;
            notes.push(plot_note(&file, &format!("{t}: accuracy during training")));
        }
    }
    Ok(Table {
        slug: "paper-table1".into(),
        title: "Table 1 (miniature): private fine-tuning accuracy".into(),
        columns,
        rows,
        notes,
    })
}

fn ablation(r: &Results) -> anyhow::Result<Table> {
    let task = r.cls.first().cloned().unwrap_or_default();
    let e = max_eps(r);
    let full = est(&values(r, &task, "raptor", "", Some(e), acc));
    let mut rows = vec![vec![
        "RAPTOR (all components)".to_string(),
        cell(full, 100.0, 1),
        "—".into(),
    ]];
    let mut lower = 0;
    let mut overlapping = 0;
    let mut compared = 0;
    for (variant, _) in ABLATIONS {
        let x = est(&values(r, &task, "raptor", variant, Some(e), acc));
        let delta = match (x, full) {
            (Some(a), Some(b)) => {
                compared += 1;
                if a.mean < b.mean {
                    lower += 1;
                }
                if a.overlaps(&b) {
                    overlapping += 1;
                }
                format!("{:+.1}", 100.0 * (a.mean - b.mean))
            }
            _ => "—".into(),
        };
        rows.push(vec![
            format!(
                "minus {}",
                variant.trim_start_matches("no-").replace('-', " ")
            ),
            cell(x, 100.0, 1),
            delta,
        ]);
    }
    Ok(Table {
        slug: "paper-table5-ablation".into(),
        title: format!("Ablation (paper Table 5, miniature): RAPTOR on {task} at ε = {e}"),
        columns: vec![
            "variant".into(),
            "accuracy (%)".into(),
            "Δ vs full (points)".into(),
        ],
        rows,
        notes: vec![
            ablation_seeds_note(r),
            format!(
                "Removing a component lowered mean accuracy in {lower} of {compared} ablations (the paper: every component helps); the CI of the ablated run overlaps the full method's in {overlapping} of {compared}."
            ),
        ],
    })
}

fn layer_choice(r: &Results, out: &Path) -> anyhow::Result<Table> {
    let task = r.cls.first().cloned().unwrap_or_default();
    let e = max_eps(r);
    let seed = r.scale.seeds.first().copied().unwrap_or(0);
    let any = |variant: &str| {
        r.scale
            .seeds
            .iter()
            .find_map(|&s| r.runs.get(&label(&task, "raptor", variant, Some(e), s)))
    };
    let entropy_of = |l: Option<usize>| -> String {
        let stats = any("")
            .map(|s| s.public_entropy.clone())
            .unwrap_or_default();
        l.and_then(|l| {
            stats
                .iter()
                .find(|(k, _)| *k == l)
                .map(|(_, h)| format!("{h:.4}"))
        })
        .unwrap_or_else(|| "—".into())
    };
    let mut rows = Vec::new();
    let mut ests = Vec::new();
    let mut blocks = Vec::new();
    for (name, variant) in [
        ("entropy-selected", ""),
        ("first sparse layer", "layer=first"),
        ("last sparse layer", "layer=last"),
    ] {
        let l = any(variant).and_then(|s| s.layer);
        let x = est(&values(r, &task, "raptor", variant, Some(e), acc));
        ests.push(x);
        blocks.push(l);
        rows.push(vec![
            name.to_string(),
            l.map_or("—".into(), |l| l.to_string()),
            entropy_of(l),
            cell(x, 100.0, 1),
        ]);
    }
    let mut notes = vec![
        ablation_seeds_note(r),
        "Normalized routing entropy of the public split through the pretrained (frozen) routers; RAPTOR trains the sparse layer with the highest one.".to_string(),
    ];
    if let (Some(Some(sel)), others) = (ests.first(), &ests[1..]) {
        let beats = others
            .iter()
            .flatten()
            .filter(|o| sel.mean >= o.mean)
            .count();
        let n = others.iter().flatten().count();
        let same: Vec<&str> = ["first", "last"]
            .iter()
            .zip(&blocks[1..])
            .filter(|(_, b)| b.is_some() && **b == blocks[0])
            .map(|(name, _)| *name)
            .collect();
        let same = if same.is_empty() {
            "it differs from both fixed choices".to_string()
        } else {
            format!(
                "it is the same block as the {} rule, so that comparison is between two runs of one layer",
                same.join(" and ")
            )
        };
        notes.push(format!(
            "The entropy-selected layer (block {}) scored at least as high as {beats} of {n} fixed choices; {same}.",
            blocks[0].map_or("—".to_string(), |b| b.to_string())
        ));
    }
    if let Some(s) = any("")
        && !s.public_entropy.is_empty()
    {
        let file = format!("routing-entropy-{task}.png");
        bar_plot(
            &out.join(&file),
            &BarPlot {
                title: format!("{task}: public routing entropy per sparse layer"),
                y_label: "normalized entropy".into(),
                categories: s
                    .public_entropy
                    .iter()
                    .map(|(l, _)| format!("layer {l}"))
                    .collect(),
                groups: vec![Series {
                    name: "public split".into(),
                    points: s
                        .public_entropy
                        .iter()
                        .enumerate()
                        .map(|(i, &(_, h))| (i as f64, h))
                        .collect(),
                    err: None,
                }],
            },
        )?;
        notes.push(plot_note(&file, "routing entropy per layer"));
    }
    let _ = seed;
    Ok(Table {
        slug: "paper-layer-choice".into(),
        title: format!("Layer choice: RAPTOR on {task} at ε = {e}"),
        columns: vec![
            "layer rule".into(),
            "block".into(),
            "public normalized entropy".into(),
            "accuracy (%)".into(),
        ],
        rows,
        notes,
    })
}

/// Where a diagnostics table goes: its slug and the prefix of its per-expert SNR plots.
pub(crate) struct DiagnosticsNames {
    /// Table slug.
    pub slug: &'static str,
    /// Plot file prefix (`<prefix>-<task>.png`).
    pub plot_prefix: &'static str,
}

const PAPER_DIAGNOSTICS: DiagnosticsNames = DiagnosticsNames {
    slug: "paper-diagnostics",
    plot_prefix: "snr-per-expert",
};

/// Diagnostics at the largest ε: why RAPTOR's mechanism did or did not engage. Per task and
/// method: the role mismatch, the shared stream's SNR and the experts' (mean and CV) at a
/// batch of the run's size, clip suppression and dilution; a per-expert SNR plot.
pub(crate) fn diagnostics(
    r: &Results,
    out: &Path,
    names: &DiagnosticsNames,
) -> anyhow::Result<Table> {
    let e = max_eps(r);
    let mut rows = Vec::new();
    let mut cv_lower = 0;
    let mut compared = 0;
    let mut stream_notes = Vec::new();
    for t in &r.cls {
        let mut cvs = Vec::new();
        let mut shared_snr = Vec::new();
        let mut expert_snr = Vec::new();
        for m in ["raptor", "dp-adam-lora"] {
            let mrole = est(&values(r, t, m, "", Some(e), |s| s.role_mismatch));
            let snr = est(&values(r, t, m, "", Some(e), |s| {
                let v: Vec<f64> = s.snr.iter().flatten().copied().collect();
                (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
            }));
            let shared = est(&values(r, t, m, "", Some(e), |s| s.shared_snr));
            let cv = est(&values(r, t, m, "", Some(e), |s| s.snr_cv));
            let records = values(r, t, m, "", Some(e), |s| {
                s.diagnostic_records.map(|n| n as f64)
            });
            cvs.push(cv);
            shared_snr.push(shared);
            expert_snr.push(snr);
            rows.push(vec![
                t.clone(),
                pretty(m).into(),
                cell(mrole, 1.0, 3),
                cell(shared, 1.0, 3),
                cell(snr, 1.0, 3),
                cell(cv, 1.0, 3),
                cell(
                    est(&values(r, t, m, "", Some(e), |s| s.clip_suppressed)),
                    100.0,
                    1,
                ),
                cell(est(&values(r, t, m, "", Some(e), |s| s.dilution)), 1.0, 2),
                records
                    .iter()
                    .copied()
                    .reduce(f64::max)
                    .map_or("—".into(), |n| format!("{n:.0}")),
            ]);
        }
        if let (Some(Some(a)), Some(Some(b))) = (cvs.first(), cvs.get(1)) {
            compared += 1;
            if a.mean < b.mean {
                cv_lower += 1;
            }
        }
        // Which stream the noise drowns, from these numbers.
        if let (Some(Some(rs)), Some(Some(re)), Some(Some(ms)), Some(Some(me))) = (
            shared_snr.first(),
            expert_snr.first(),
            shared_snr.get(1),
            expert_snr.get(1),
        ) {
            stream_notes.push(format!(
                "{t}: at ε = {e}, RAPTOR's expert streams have {:.2}× the SNR the monolithic baseline gives the same coordinates ({:.3} vs {:.3}) and its shared stream {:.2}× ({:.3} vs {:.3}); {}",
                re.mean / me.mean.max(f64::MIN_POSITIVE),
                re.mean,
                me.mean,
                rs.mean / ms.mean.max(f64::MIN_POSITIVE),
                rs.mean,
                ms.mean,
                if re.mean < 1.0 && rs.mean < 1.0 {
                    "both of RAPTOR's streams are below SNR 1 (noise dominates every release)."
                } else if re.mean < 1.0 {
                    "RAPTOR's expert releases are noise-dominated (SNR < 1): its expert stream cannot carry much signal at this batch size."
                } else {
                    "RAPTOR's expert releases carry more signal than noise."
                }
            ));
        }
    }
    let mut notes = vec![
        seeds_note(r),
        format!(
            "Held-out diagnostics at ε = {e} on the trained sparse layer, over a batch of the run's expected size (at most 256 validation records; `records` column): M_role (role mismatch of gradient-norm vs parameter shares); SNR = ‖Σ clip(g)‖ / (σ·C·√d), the norm of a release's clipped sum over the norm of its noise on the same coordinates, for the shared stream (attention adapters and head) and each expert of the layer (mean and CV over experts), clipped as each method clips (RAPTOR role-wise at C_s and C_e, the baseline globally at C); clip suppression: owned rows whose expert gradient a clip of the whole per-record gradient at the method's expert bound (RAPTOR's C_e, the baseline's C) shrinks more than a clip of the expert's own gradient at that bound would (%; near 100 % whenever the bound is far below the whole gradient's norm, as RAPTOR's public-quantile C_e is: then it says how far apart the two bounds are, not what RAPTOR's clipping does); dilution: the least-loaded expert's expected owned records per batch over D_e."
        ),
        format!(
            "RAPTOR's SNR-CV was lower (more balanced experts) than the monolithic baseline's in {cv_lower} of {compared} tasks."
        ),
    ];
    notes.extend(stream_notes);
    if let Some(t) = r.cls.first() {
        let seed = r.scale.seeds.first().copied().unwrap_or(0);
        let mut groups = Vec::new();
        let mut n = 0;
        for m in ["raptor", "dp-adam-lora"] {
            if let Some(s) = r.runs.get(&label(t, m, "", Some(e), seed))
                && !s.snr.is_empty()
            {
                n = n.max(s.snr.len());
                groups.push(Series {
                    name: pretty(m).into(),
                    points: s
                        .snr
                        .iter()
                        .enumerate()
                        .map(|(i, v)| (i as f64, v.unwrap_or(0.0)))
                        .collect(),
                    err: None,
                });
            }
        }
        if !groups.is_empty() && groups.iter().all(|g| g.points.len() == n) {
            let file = format!("{}-{t}.png", names.plot_prefix);
            bar_plot(
                &out.join(&file),
                &BarPlot {
                    title: format!("{t}: per-expert SNR (ε = {e}, seed {seed})"),
                    y_label: "SNR".into(),
                    categories: (0..n).map(|i| format!("expert {i}")).collect(),
                    groups,
                },
            )?;
            notes.push(plot_note(&file, "per-expert SNR"));
        }
    }
    Ok(Table {
        slug: names.slug.into(),
        title: "Diagnostics: role mismatch, per-stream SNR, clip suppression, dilution".into(),
        columns: vec![
            "task".into(),
            "method".into(),
            "M_role".into(),
            "shared SNR".into(),
            "mean expert SNR".into(),
            "expert SNR-CV".into(),
            "clip suppression (%)".into(),
            "dilution".into(),
            "records".into(),
        ],
        rows,
        notes,
    })
}

fn cost(r: &Results) -> anyhow::Result<Table> {
    let task = r.cls.first().cloned().unwrap_or_default();
    let e = max_eps(r);
    let mut methods: Vec<(&str, Option<f64>)> = vec![("lora", None)];
    methods.extend(CLASSIFICATION_METHODS.iter().map(|m| (m.name(), Some(e))));
    let base = est(&values(r, &task, "dp-adam-lora", "", Some(e), |s| {
        Some(s.seconds_per_update)
    }));
    let mut rows = Vec::new();
    let mut raptor_ratio = None;
    for (m, eps) in methods {
        let t = est(&values(r, &task, m, "", eps, |s| {
            Some(s.seconds_per_update)
        }));
        let mem = est(&values(r, &task, m, "", eps, |s| s.peak_rss_mib));
        let ratio = match (t, base) {
            (Some(a), Some(b)) if b.mean > 0.0 => {
                let x = a.mean / b.mean;
                if m == "raptor" {
                    raptor_ratio = Some(x);
                }
                format!("{x:.2}×")
            }
            _ => "—".into(),
        };
        rows.push(vec![
            pretty(m).into(),
            cell(t, 1000.0, 1),
            ratio,
            cell(mem, 1.0, 0),
        ]);
    }
    let mut notes = vec![
        seeds_note(r),
        format!(
            "Wall time of the training loop per update (evaluation excluded) and the process's peak resident memory during the run, on {task} at ε = {e}, on this machine ({} CPU threads; {}).",
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            if r.workers > 0 {
                format!(
                    "{} runs at a time, each a process with one libtorch thread",
                    r.workers
                )
            } else {
                "one run at a time in one process".to_string()
            }
        ),
    ];
    if let Some(x) = raptor_ratio {
        notes.push(format!(
            "RAPTOR took {x:.2}× the time per update of monolithic DP-Adam LoRA ({}).",
            if x <= 1.0 {
                "faster or equal"
            } else {
                "slower"
            }
        ));
    }
    Ok(Table {
        slug: "paper-cost".into(),
        title: "Cost per method".into(),
        columns: vec![
            "method".into(),
            "ms per update".into(),
            "time vs DP-Adam LoRA".into(),
            "peak RSS (MiB)".into(),
        ],
        rows,
        notes,
    })
}
