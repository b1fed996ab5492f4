//! The DP-Muon tables and plots. The decision rule comes first; every sentence under a table is
//! computed from that run's numbers.

use std::path::Path;

use raptor_report::{BarPlot, Estimate, LinePlot, Series, Table, bar_plot, estimate, line_plot};
use raptor_train::config::Choice as _;
use raptor_train::config::Method;

use super::{
    CellResults, NON_PRIVATE, PRIVATE, Results, Setting, TaskResults, bias::BiasRow, eps_of,
    run_label,
};

/// One row of the paper's numbers: (task, method, NLL, BLEU, ROUGE-L).
pub type PaperRow = (
    &'static str,
    &'static str,
    Option<f64>,
    Option<f64>,
    Option<f64>,
);

/// The DP-Muon paper's numbers (GPT-2, ε ≈ 8).
pub const PAPER: [PaperRow; 4] = [
    ("e2e", "dp-adam", Some(0.4961), Some(18.49), None),
    ("e2e", "dp-muon", Some(0.4553), Some(32.91), None),
    ("e2e", "dp-muonbc", Some(0.4490), Some(34.92), None),
    ("dart", "dp-muonbc", Some(0.4460), Some(7.50), Some(34.42)),
];

/// The decision rule, stated before any number.
pub const DECISION_RULE: &str = "Decision rule (fixed before the runs): for an ordering \"A ≤ B in test NLL\", d = NLL(A) − NLL(B) is taken per seed (paired: same seed, same initialization, Poisson sampler and noise seeds, same pretrained start, same setting); the ordering **holds** when the 95 % Student-t interval of the mean d lies below 0, is **reversed** when it lies above 0, and is **not resolved** otherwise. BLEU orderings \"A ≥ B in BLEU\" are read the same way on d = BLEU(A) − BLEU(B). Each metric has its own positive control, at each expected batch: non-private Adam fine-tuning must lower the test NLL below the pretrained start's (the upper end of its 95 % interval over seeds below the start) for the NLL verdicts to count, and must raise BLEU above the start's (the lower end of its interval above the start) for the BLEU verdicts to count; a metric whose control fails has every verdict **uninformative**. A setting's verdict is computed from its own runs; the curve reports every setting.";

/// The verdict that counts: `v` when the metric's positive control passed, else
/// `uninformative`.
pub fn gate(v: &'static str, control: bool) -> &'static str {
    if control { v } else { "uninformative" }
}

/// The NLL positive control: non-private Adam's test NLL over seeds lies below the pretrained
/// start's (the upper end of its 95 % interval; the mean with one seed). False without runs.
pub fn nll_control(start: f64, adam: &[f64]) -> bool {
    estimate(adam).ok().is_some_and(|e| {
        let upper = if e.has_interval() {
            e.mean + e.half_width
        } else {
            e.mean
        };
        upper < start
    })
}

/// The BLEU positive control: non-private Adam's BLEU over seeds lies above the pretrained
/// start's (the lower end of its 95 % interval; the mean with one seed). False without runs or
/// without a start BLEU.
pub fn bleu_control(start: Option<f64>, adam: &[f64]) -> bool {
    let Some(start) = start else { return false };
    estimate(adam).ok().is_some_and(|e| {
        let lower = if e.has_interval() {
            e.mean - e.half_width
        } else {
            e.mean
        };
        lower > start
    })
}

fn pretty(m: &str) -> &str {
    match m {
        "dp-adam" => "DP-Adam",
        "dp-muon" => "DP-Muon",
        "dp-muonbc" => "DP-MuonBC",
        "adam" => "Adam (non-private)",
        "muon" => "Muon (non-private)",
        other => other,
    }
}

fn values(
    r: &Results,
    task: &str,
    st: &Setting,
    m: Method,
    f: impl Fn(&crate::paper::runs::Summary) -> Option<f64>,
) -> Vec<(u64, f64)> {
    r.scale
        .seeds
        .iter()
        .filter_map(|&s| {
            let sm = r.runs.get(&run_label(task, m, st, s))?;
            f(sm).filter(|v| v.is_finite()).map(|v| (s, v))
        })
        .collect()
}

fn est(v: &[(u64, f64)]) -> Option<Estimate> {
    let xs: Vec<f64> = v.iter().map(|x| x.1).collect();
    estimate(&xs).ok()
}

fn cell(e: Option<Estimate>, digits: usize) -> String {
    e.map_or_else(|| "—".into(), |e| e.fmt(digits))
}

/// Per-seed differences a − b over the seeds both have.
fn paired(a: &[(u64, f64)], b: &[(u64, f64)]) -> Vec<f64> {
    a.iter()
        .filter_map(|(s, x)| b.iter().find(|(t, _)| t == s).map(|(_, y)| x - y))
        .collect()
}

/// The verdict on "d < 0" from paired differences.
pub fn verdict(d: &[f64]) -> (&'static str, Option<Estimate>) {
    match estimate(d).ok() {
        Some(e) if e.has_interval() => {
            if e.mean + e.half_width < 0.0 {
                ("holds", Some(e))
            } else if e.mean - e.half_width > 0.0 {
                ("reversed", Some(e))
            } else {
                ("not resolved", Some(e))
            }
        }
        e => ("not resolved (fewer than 2 paired seeds)", e),
    }
}

fn fmt_d(e: Option<Estimate>, digits: usize) -> String {
    match e {
        Some(e) if e.has_interval() => format!(
            "{:+.digits$} ± {:.digits$} (n = {})",
            e.mean,
            e.half_width,
            e.n,
            digits = digits
        ),
        Some(e) => format!("{:+.digits$} (n = {})", e.mean, e.n, digits = digits),
        None => "—".into(),
    }
}

/// The orderings the paper claims, as (A, B) for "A ≤ B in test NLL".
const ORDERINGS: [(Method, Method); 3] = [
    (Method::DpMuon, Method::DpAdam),
    (Method::DpMuonbc, Method::DpMuon),
    (Method::DpMuonbc, Method::DpAdam),
];

/// The non-private references' ordering, reported beside the private ones on the curve: where
/// the updates are few, Muon's orthogonalized steps may beat Adam's without any noise, and this
/// difference shows how much of a private difference that explains.
const REFERENCE: (Method, Method) = (Method::Muon, Method::Adam);

/// Both positive controls of a cell (Adam at the cell's expected batch), and their sentences.
fn controls(r: &Results, t: &TaskResults, c: &CellResults) -> (bool, bool, Vec<String>) {
    let adam_nll = values(r, &t.task, &c.setting, Method::Adam, |s| s.loss);
    let adam_bleu = values(r, &t.task, &c.setting, Method::Adam, |s| s.bleu);
    let Some(st) = &t.start else {
        return (
            false,
            false,
            vec![format!(
                "{} at {}: no pretrained-start score (a user-given checkpoint), so the positive controls cannot be checked.",
                t.task,
                c.setting.variant()
            )],
        );
    };
    let xs = |v: &[(u64, f64)]| v.iter().map(|x| x.1).collect::<Vec<f64>>();
    let nll_ok = nll_control(st.nll, &xs(&adam_nll));
    let bleu_ok = bleu_control(st.bleu, &xs(&adam_bleu));
    let word = |ok: bool| if ok { "passes" } else { "FAILS" };
    (
        nll_ok,
        bleu_ok,
        vec![format!(
            "{} at {}: NLL positive control {}: non-private Adam fine-tuning reaches test NLL {} (pretrained start {:.3}); BLEU positive control {}: BLEU {} (start {}).",
            t.task,
            c.setting.variant(),
            word(nll_ok),
            cell(est(&adam_nll), 3),
            st.nll,
            word(bleu_ok),
            cell(est(&adam_bleu), 1),
            st.bleu.map_or("—".into(), |b| format!("{b:.1}"))
        )],
    )
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// The median Newton–Schulz bias at the released point of a cell's first-seed DP-Muon buffers
/// (plain, after DP-MuonBC's correction), at the run's own noise level.
fn ns_bias(r: &Results, task: &str, st: &Setting) -> Option<(f64, f64)> {
    let run = run_label(task, Method::DpMuon, st, r.scale.seeds[0]);
    let rows: Vec<&BiasRow> = r
        .bias
        .iter()
        .filter(|b| b.run == run && b.multiplier == 1.0)
        .collect();
    Some((
        median(rows.iter().map(|b| b.plain).collect())?,
        median(rows.iter().map(|b| b.corrected).collect())?,
    ))
}

/// The median noise share of the kept buffers of a cell's first-seed DP-Muon run (at the run's
/// own noise level).
fn noise_share(r: &Results, task: &str, st: &Setting) -> Option<f64> {
    let run = run_label(task, Method::DpMuon, st, r.scale.seeds[0]);
    median(
        r.bias
            .iter()
            .filter(|b| b.run == run && b.multiplier == 1.0)
            .map(|b| b.noise_share)
            .collect(),
    )
}

fn eps_cell(m: Method, st: &Setting) -> String {
    eps_of(m, st).map_or("∞".into(), |e| format!("{e}"))
}

/// The main table, the curve, the learning-rate table, the bias table, and their plots.
pub fn tables(r: &Results, out: &Path) -> anyhow::Result<Vec<Table>> {
    let mut rows = Vec::new();
    let mut notes = vec![DECISION_RULE.to_string()];
    notes.push(format!(
        "Mean ± 95 % Student-t half-width over {} paired seeds (seeds {:?}); this table is each task's first setting (the curve, table `dpmuon-curve`, has the others); per-example clip {}; {} epochs of private fine-tuning at every setting (updates = epochs · N / B, at least {}); ε is the certified PRV upper bound's target; learning rates chosen on public data only, at each setting (table `dpmuon-lr`). Sampling and noise are seeded, so these runs are not private releases.",
        r.scale.seeds.len(),
        r.scale.seeds,
        r.scale.clip,
        r.scale.epochs,
        r.scale.min_steps,
    ));
    notes.extend(r.sources.iter().map(|s| format!("Data: {s}")));
    notes.extend(r.missing.iter().map(|m| format!("Skipped: {m}")));
    let mut bars = Vec::new();
    for t in &r.tasks {
        notes.push(t.note.clone());
        let Some(c) = t.cells.first() else { continue };
        let st = &c.setting;
        notes.push(format!(
            "{}: first setting: expected batch {}, ε = {}, {} updates{}.",
            t.task,
            st.batch,
            st.epsilon,
            c.steps,
            c.sigma
                .map_or(String::new(), |s| format!(", noise multiplier σ = {s:.4}"))
        ));
        let paper = |m: &str| PAPER.iter().find(|p| p.0 == t.task && p.1 == m);
        if let Some(start) = &t.start {
            rows.push(vec![
                t.task.clone(),
                "pretrained start (no fine-tuning)".into(),
                "—".into(),
                "—".into(),
                format!("{:.3}", start.nll),
                start.bleu.map_or("—".into(), |b| format!("{b:.1}")),
                start.rouge_l.map_or("—".into(), |b| format!("{b:.1}")),
                "—".into(),
                "—".into(),
            ]);
        }
        let mut cats = Vec::new();
        let mut pts = Vec::new();
        let mut errs = Vec::new();
        for m in PRIVATE.iter().chain(&NON_PRIVATE).copied() {
            let nll = est(&values(r, &t.task, st, m, |s| s.loss));
            if nll.is_none() && !c.lrs.contains_key(m.name()) {
                continue;
            }
            let bleu = est(&values(r, &t.task, st, m, |s| s.bleu));
            let rouge = est(&values(r, &t.task, st, m, |s| s.rouge_l));
            let lr = c.lrs.get(m.name()).map_or("—".into(), |ch| {
                if matches!(m, Method::DpMuon | Method::DpMuonbc | Method::Muon) {
                    format!("Muon {} / AdamW {}", ch.lr, ch.adam_lr)
                } else {
                    format!("{}", ch.lr)
                }
            });
            let p = paper(m.name());
            rows.push(vec![
                t.task.clone(),
                pretty(m.name()).into(),
                eps_cell(m, st),
                lr,
                cell(nll, 3),
                cell(bleu, 1),
                cell(rouge, 1),
                p.and_then(|p| p.2)
                    .map_or("—".into(), |v| format!("{v:.4}")),
                p.and_then(|p| p.3)
                    .map_or("—".into(), |v| format!("{v:.2}")),
            ]);
            if let Some(e) = nll {
                cats.push(pretty(m.name()).to_string());
                pts.push((cats.len() as f64, e.mean));
                errs.push(if e.half_width.is_finite() {
                    e.half_width
                } else {
                    0.0
                });
            }
        }
        let (nll_ok, bleu_ok, pc) = controls(r, t, c);
        notes.extend(pc);
        let nll = |m: Method| values(r, &t.task, st, m, |s| s.loss);
        let bleu = |m: Method| values(r, &t.task, st, m, |s| s.bleu);
        let mut verdicts = Vec::new();
        for (a, b) in ORDERINGS {
            let (v, e) = verdict(&paired(&nll(a), &nll(b)));
            let v = gate(v, nll_ok);
            verdicts.push(v);
            // BLEU: "A ≥ B" holds when B − A < 0.
            let (bv, be) = verdict(&paired(&bleu(b), &bleu(a)));
            let be = be.map(|e| Estimate { mean: -e.mean, ..e });
            notes.push(format!(
                "{}: {} ≤ {} in test NLL: **{v}**; paired NLL difference {} nats/token. {} ≥ {} in BLEU: **{}**; paired BLEU difference {}.",
                t.task,
                pretty(a.name()),
                pretty(b.name()),
                fmt_d(e, 4),
                pretty(a.name()),
                pretty(b.name()),
                gate(bv, bleu_ok),
                fmt_d(be, 2)
            ));
        }
        let whole = if verdicts[..2].iter().all(|v| *v == "holds") {
            "reproduced"
        } else if verdicts[..2].contains(&"uninformative") {
            "not testable here (the NLL positive control failed)"
        } else if verdicts[..2].contains(&"reversed") {
            "contradicted (at least one step reversed)"
        } else {
            "not reproduced (at least one step not resolved)"
        };
        notes.push(format!(
            "{}: at its first setting, the paper's ordering DP-MuonBC ≤ DP-Muon ≤ DP-Adam in NLL is {whole} by this run.",
            t.task
        ));
        let first = run_label(&t.task, Method::DpMuon, st, r.scale.seeds[0]);
        let first_bc = run_label(&t.task, Method::DpMuonbc, st, r.scale.seeds[0]);
        let mine: Vec<&BiasRow> = r
            .bias
            .iter()
            .filter(|b| (b.run == first || b.run == first_bc) && b.multiplier == 1.0)
            .collect();
        if let (Some(p), Some(c)) = (
            median(mine.iter().map(|b| b.plain).collect()),
            median(mine.iter().map(|b| b.corrected).collect()),
        ) {
            let pmax = mine.iter().map(|b| b.plain).fold(0.0f64, f64::max);
            let share = median(mine.iter().map(|b| b.noise_share).collect()).unwrap_or(f64::NAN);
            notes.push(format!(
                "{}: Newton–Schulz's noise bias on {} released buffers at the runs' own noise level (table `dpmuon-bias`): median {:.2} % of ‖f(M̃)‖_F (largest {:.2} %) for plain DP-Muon, {:.2} % after DP-MuonBC's correction; the noise makes up a median {:.0} % of those buffers' energy.",
                t.task,
                mine.len(),
                100.0 * p,
                100.0 * pmax,
                100.0 * c,
                100.0 * share
            ));
        }
        if !pts.is_empty() {
            bars.push((t.task.clone(), cats, pts, errs));
        }
    }
    for (task, cats, pts, errs) in bars {
        let file = format!("dpmuon-nll-{task}.png");
        bar_plot(
            &out.join(&file),
            &BarPlot {
                title: format!("{task}: test NLL by method (mean ± 95 % CI over seeds)"),
                y_label: "mean token NLL".into(),
                categories: cats,
                groups: vec![Series {
                    name: "test NLL".into(),
                    points: pts,
                    err: Some(errs),
                }],
            },
        )?;
        notes.push(format!(
            "Plot: {task}: test NLL by method\n\n  ![{task}: test NLL by method]({file})"
        ));
    }
    notes.push(format!(
        "This part took {:.0} s (wall, this run; finished runs reused count as 0).",
        r.seconds
    ));
    let main = Table {
        slug: "dpmuon-d2t".into(),
        title: "DP-Muon family on data-to-text (first setting of each task; decoder pretrained on the other task's public corpus; paper: GPT-2)".into(),
        columns: [
            "task",
            "method",
            "ε",
            "learning rate (public proxy)",
            "test NLL",
            "BLEU",
            "ROUGE-L",
            "paper NLL",
            "paper BLEU",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows,
        notes,
    };
    Ok(vec![
        main,
        curve_table(r, out)?,
        lr_table(r),
        bias_table(r, out)?,
    ])
}

/// One ordering's verdict at one cell, gated on the NLL control.
fn cell_verdict(
    r: &Results,
    t: &TaskResults,
    c: &CellResults,
    (a, b): (Method, Method),
    nll_ok: bool,
) -> (&'static str, Option<Estimate>) {
    let nll = |m: Method| values(r, &t.task, &c.setting, m, |s| s.loss);
    let (v, e) = verdict(&paired(&nll(a), &nll(b)));
    (gate(v, nll_ok), e)
}

/// One point of an ordering's curve: (noise share, expected batch, paired difference).
type CurvePoint = (f64, f64, Estimate);

/// The signal-per-update curve: every cell of every task, the paired NLL differences with
/// their verdicts, the noise share of the released buffers, and a plot.
fn curve_table(r: &Results, out: &Path) -> anyhow::Result<Table> {
    let mut rows = Vec::new();
    let mut notes = vec![
        "Each row is one setting (expected batch B, ε) of a task, at the same number of epochs, so a larger B means fewer, less noisy updates: σ is the noise multiplier the accountant gives for the setting's sampling rate, updates and ε, and the noise share is the median, over the buffers the first seed's DP-Muon run kept, of (per-entry noise std)² · entries / ‖M̃‖²_F, the part of the released momentum buffer's energy that is noise; the last column is the median Newton–Schulz bias at those released buffers under their own noise (‖E f(M̃+Z) − f(M̃)‖ / ‖f(M̃)‖, plain and after DP-MuonBC's correction; table `dpmuon-bias` explains the estimate). Differences are paired over seeds (mean ± 95 % Student-t half-width, nats/token; negative: the first method is better) with the decision rule's verdict, gated on the NLL positive control at the same B; the column \"Muon − Adam\" is the same difference between the non-private references (Muon − Adam at the same B and updates): where it is negative too, few large orthogonalized steps beat Adam's without any noise, so a private difference of the same sign is not evidence that DP-Muon copes better with noise. Learning rates were chosen on the public proxy at each setting (same B, updates, clip, ε and records, hence the same σ).".to_string(),
    ];
    let mut series: Vec<Series> = Vec::new();
    let mut by_share = true;
    let mut curves: Vec<(String, Vec<CurvePoint>)> = Vec::new();
    for t in &r.tasks {
        for (a, b) in ORDERINGS.into_iter().chain([REFERENCE]) {
            let mut pts = Vec::new();
            for (i, c) in t.cells.iter().enumerate() {
                // The references ran once per B: one point each, at that B's first setting.
                if (a, b) == REFERENCE
                    && t.cells[..i]
                        .iter()
                        .any(|o| o.setting.batch == c.setting.batch)
                {
                    continue;
                }
                let (ok, _, _) = controls(r, t, c);
                let (_, e) = cell_verdict(r, t, c, (a, b), ok);
                let share = noise_share(r, &t.task, &c.setting);
                if share.is_none() {
                    by_share = false;
                }
                if let Some(e) = e {
                    pts.push((share.unwrap_or(f64::NAN), c.setting.batch, e));
                }
            }
            curves.push((
                format!("{}: {} − {}", t.task, pretty(a.name()), pretty(b.name())),
                pts,
            ));
        }
        for c in &t.cells {
            let st = &c.setting;
            let (ok, _, _) = controls(r, t, c);
            let n = |m: Method| cell(est(&values(r, &t.task, st, m, |s| s.loss)), 3);
            let d = |o: (Method, Method)| {
                let (v, e) = cell_verdict(r, t, c, o, ok);
                format!("{} {v}", fmt_d(e, 3))
            };
            rows.push(vec![
                t.task.clone(),
                format!("{}", st.batch),
                format!("{}", st.epsilon),
                c.steps.to_string(),
                c.sigma.map_or("—".into(), |s| format!("{s:.3}")),
                noise_share(r, &t.task, st).map_or("—".into(), |s| format!("{:.0} %", 100.0 * s)),
                n(Method::DpAdam),
                n(Method::DpMuon),
                n(Method::DpMuonbc),
                format!("{} / {}", n(Method::Adam), n(Method::Muon)),
                d(ORDERINGS[0]),
                d(ORDERINGS[1]),
                d(ORDERINGS[2]),
                d(REFERENCE),
                ns_bias(r, &t.task, st).map_or("—".into(), |(p, c)| {
                    format!("{:.0} % / {:.0} %", 100.0 * p, 100.0 * c)
                }),
            ]);
        }
        if t.cells.len() < 2 {
            continue;
        }
        // Where DP-Muon overtakes DP-Adam: the settings where "DP-Muon ≤ DP-Adam" holds, from
        // the noisiest to the least noisy.
        let mut order: Vec<&CellResults> = t.cells.iter().collect();
        order.sort_by(|x, y| {
            let sx = noise_share(r, &t.task, &x.setting).unwrap_or(f64::NAN);
            let sy = noise_share(r, &t.task, &y.setting).unwrap_or(f64::NAN);
            sy.total_cmp(&sx)
        });
        let mut said = Vec::new();
        let mut holds = Vec::new();
        for c in &order {
            let (ok, _, _) = controls(r, t, c);
            let (v, e) = cell_verdict(r, t, c, ORDERINGS[0], ok);
            let (rv, re) = cell_verdict(r, t, c, REFERENCE, ok);
            said.push(format!(
                "{} ε = {} (noise share {}): {} {v} (non-private Muon − Adam {} {rv})",
                c.setting.variant(),
                c.setting.epsilon,
                noise_share(r, &t.task, &c.setting)
                    .map_or("—".into(), |s| format!("{:.0} %", 100.0 * s)),
                fmt_d(e, 3),
                fmt_d(re, 3)
            ));
            if v == "holds" {
                holds.push(format!("{} ε = {}", c.setting.variant(), c.setting.epsilon));
            }
        }
        notes.push(format!(
            "{}: DP-Muon − DP-Adam from the noisiest setting to the least noisy: {}. {}",
            t.task,
            said.join("; "),
            if holds.is_empty() {
                "DP-Muon overtakes DP-Adam at none of these settings.".to_string()
            } else {
                format!("DP-Muon ≤ DP-Adam holds at {}.", holds.join(", "))
            }
        ));
    }
    for (name, pts) in curves {
        if pts.len() < 2 {
            continue;
        }
        let mut pts = pts;
        if by_share {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        } else {
            pts.sort_by(|a, b| a.1.total_cmp(&b.1));
        }
        series.push(Series {
            name,
            points: pts
                .iter()
                .map(|(s, b, e)| (if by_share { 100.0 * s } else { *b }, e.mean))
                .collect(),
            err: Some(
                pts.iter()
                    .map(|(_, _, e)| {
                        if e.half_width.is_finite() {
                            e.half_width
                        } else {
                            0.0
                        }
                    })
                    .collect(),
            ),
        });
    }
    if !series.is_empty() {
        let file = "dpmuon-curve.png";
        line_plot(
            &out.join(file),
            &LinePlot {
                title: "Paired test-NLL difference vs the released buffers' noise share".into(),
                x_label: if by_share {
                    "noise share of the DP-Muon buffers' energy (%)".into()
                } else {
                    "expected batch B".into()
                },
                y_label: "paired NLL difference (nats/token; < 0: first better)".into(),
                series,
                x_log: !by_share,
                secondary: None,
            },
        )?;
        notes.push(format!(
            "Plot: the paired differences against the noise share, one line per ordering (mean ± 95 % CI)\n\n  ![paired NLL difference vs noise share]({file})"
        ));
    }
    Ok(Table {
        slug: "dpmuon-curve".into(),
        title: "DP-Muon vs DP-Adam as the signal per update grows (expected batch and ε at fixed epochs)".into(),
        columns: [
            "task",
            "B",
            "ε",
            "updates",
            "σ",
            "noise share",
            "DP-Adam NLL",
            "DP-Muon NLL",
            "DP-MuonBC NLL",
            "Adam / Muon NLL (non-private)",
            "DP-Muon − DP-Adam",
            "DP-MuonBC − DP-Muon",
            "DP-MuonBC − DP-Adam",
            "Muon − Adam (non-private)",
            "NS bias / ‖f(M̃)‖, plain / after BC",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows,
        notes,
    })
}

fn lr_table(r: &Results) -> Table {
    let mut rows = Vec::new();
    let mut notes = vec![
        "Each method's learning rate is the grid point with the lowest validation NLL of its public proxy run: the private run's config at the same setting (same updates, expected batch, clip, ε and as many records, hence the same σ) fine-tuning the same pretrained start on a held-out part of the public corpus, scored on another held-out public part, first seed. DP-Muon, DP-MuonBC and Muon tune the Muon matrices' rate; their other parameters (embeddings, biases, norms) use the AdamW rate DP-Adam (for Muon: Adam) chose at the same setting. Nothing here reads private or test data.".to_string(),
    ];
    for t in &r.tasks {
        for cr in &t.cells {
            let st = &cr.setting;
            for (m, c) in &cr.lrs {
                for (lr, l) in &c.grid {
                    rows.push(vec![
                        t.task.clone(),
                        format!("{}", st.batch),
                        format!("{}", st.epsilon),
                        pretty(m).into(),
                        format!("{lr}"),
                        l.map_or("—".into(), |l| format!("{l:.4}")),
                        if *lr == c.lr {
                            "✓".into()
                        } else {
                            String::new()
                        },
                        c.sigma.map_or("—".into(), |s| format!("{s:.4}")),
                    ]);
                }
            }
            if let (Some(ps), Some(dp)) = (cr.sigma, cr.lrs.get("dp-adam").and_then(|c| c.sigma)) {
                notes.push(format!(
                    "{} at {} ε = {}: σ of the proxy runs {dp:.4}, of the private runs {ps:.4} ({}).",
                    t.task,
                    st.variant(),
                    st.epsilon,
                    if (dp - ps).abs() <= 1e-9 * ps.max(1.0) {
                        "the same"
                    } else {
                        "different: the public proxy is smaller than the private set"
                    }
                ));
            }
        }
    }
    Table {
        slug: "dpmuon-lr".into(),
        title: "DP-Muon family: learning rates chosen on public data (proxy runs)".into(),
        columns: [
            "task",
            "B",
            "ε",
            "method",
            "learning rate",
            "proxy validation NLL",
            "chosen",
            "σ",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows,
        notes,
    }
}

fn bias_table(r: &Results, out: &Path) -> anyhow::Result<Table> {
    // The first setting's tapped runs (the curve's other settings give their noise share to
    // table `dpmuon-curve`).
    let first: Vec<String> = r
        .tasks
        .iter()
        .filter_map(|t| t.cells.first().map(|c| (t, c)))
        .flat_map(|(t, c)| {
            [Method::DpMuon, Method::DpMuonbc]
                .map(|m| run_label(&t.task, m, &c.setting, r.scale.seeds[0]))
        })
        .collect();
    let bias: Vec<BiasRow> = r
        .bias
        .iter()
        .filter(|b| first.contains(&b.run))
        .cloned()
        .collect();
    let mut rows = Vec::new();
    let mut keys: Vec<(String, String, u64, f64)> = bias
        .iter()
        .map(|b| (b.task.clone(), b.run.clone(), b.update, b.multiplier))
        .collect();
    keys.dedup();
    keys.sort_by(|a, b| {
        (&a.0, &a.1, a.2)
            .cmp(&(&b.0, &b.1, b.2))
            .then(a.3.total_cmp(&b.3))
    });
    keys.dedup();
    for (task, run, update, mult) in &keys {
        let g: Vec<&BiasRow> = bias
            .iter()
            .filter(|b| {
                &b.task == task && &b.run == run && b.update == *update && b.multiplier == *mult
            })
            .collect();
        let n = g.len() as f64;
        let mean = |f: &dyn Fn(&BiasRow) -> f64| g.iter().map(|b| f(b)).sum::<f64>() / n;
        let shapes: Vec<String> = {
            let mut s: Vec<String> = g
                .iter()
                .map(|b| format!("{}×{}", b.shape.0, b.shape.1))
                .collect();
            s.dedup();
            s
        };
        rows.push(vec![
            task.clone(),
            run.clone(),
            update.to_string(),
            format!("{} ({})", g.len(), shapes.join(", ")),
            format!("{:.3e}", mean(&|b| b.noise_std * b.multiplier)),
            format!("{mult}"),
            format!("{:.0} %", 100.0 * mean(&|b| b.noise_share)),
            format!(
                "{:.3} % ± {:.3}",
                100.0 * mean(&|b| b.plain),
                100.0 * mean(&|b| b.plain_se)
            ),
            format!(
                "{:.3} % ± {:.3}",
                100.0 * mean(&|b| b.corrected),
                100.0 * mean(&|b| b.corrected_se)
            ),
            format!("{:.1}", mean(&|b| b.z)),
        ]);
    }
    let mut notes = vec![
        "What is computed: the DP-Muon and DP-MuonBC runs of the first seed keep what Newton–Schulz orthogonalized (the released momentum buffer M̃, Nesterov look-ahead) at every few updates for the first matrices, with its per-entry noise std s (DP-MuonBC's running variance; public). Around each kept M̃, Z ~ N(0, s² I) is drawn repeatedly and ‖E f(M̃+Z) − f(M̃)‖_F (plain) and ‖E O_BC(M̃+Z) − f(M̃)‖_F (after the antithetic correction, K = 1 pair, τ = s) are estimated, debiased, divided by ‖f(M̃)‖_F and averaged over the matrices of the row (± the mean Monte Carlo standard error). This is the bias at the released point under the release's own noise model: post-processing, no privacy cost. It is not the bias at the un-noised buffer M, which would need the clipped sums (private data without noise); the two differ by how much the bias changes over one noise radius. z > 0: the correction lowers the squared bias. Rows with multiplier ≠ 1 rescale s on the DP-Muon run's last kept buffers, to show where the correction would matter.".to_string(),
        format!("Noise draws per estimate: {}; per-matrix rows in each run folder's diagnostics/bias.json.", bias.first().map_or(0, |b| b.draws)),
    ];
    let mut series = Vec::new();
    for task in r.tasks.iter().map(|t| t.task.clone()) {
        let sweep: Vec<&BiasRow> = bias
            .iter()
            .filter(|b| {
                b.task == task && b.run.contains("dp-muon[") && {
                    let last = bias
                        .iter()
                        .filter(|c| c.run == b.run)
                        .map(|c| c.update)
                        .max();
                    Some(b.update) == last
                }
            })
            .collect();
        let mut mults: Vec<f64> = sweep.iter().map(|b| b.multiplier).collect();
        mults.sort_by(f64::total_cmp);
        mults.dedup();
        if mults.len() < 2 {
            continue;
        }
        let avg = |m: f64, f: &dyn Fn(&BiasRow) -> f64| {
            let g: Vec<f64> = sweep
                .iter()
                .filter(|b| b.multiplier == m)
                .map(|b| f(b))
                .collect();
            g.iter().sum::<f64>() / g.len().max(1) as f64
        };
        let pts = |f: &dyn Fn(&BiasRow) -> f64| -> Vec<(f64, f64)> {
            mults.iter().map(|&m| (m, 100.0 * avg(m, f))).collect()
        };
        series.push(Series {
            name: format!("{task}: plain DP-Muon"),
            points: pts(&|b| b.plain),
            err: None,
        });
        series.push(Series {
            name: format!("{task}: after DP-MuonBC"),
            points: pts(&|b| b.corrected),
            err: None,
        });
        let at1 = avg(1.0, &|b| b.plain);
        let hi = mults.last().copied().unwrap_or(1.0);
        notes.push(format!(
            "{task}: on the DP-Muon run's last kept buffers the plain bias is {:.3} % of ‖f‖ at the run's noise level and {:.3} % at {hi}× that noise ({:.3} % after the correction there).",
            100.0 * at1,
            100.0 * avg(hi, &|b| b.plain),
            100.0 * avg(hi, &|b| b.corrected),
        ));
    }
    if !series.is_empty() {
        let file = "dpmuon-bias.png";
        line_plot(
            &out.join(file),
            &LinePlot {
                title: "Newton–Schulz noise bias on released buffers vs noise scale".into(),
                x_label: "noise std / the run's own".into(),
                y_label: "‖bias‖ / ‖f(M̃)‖ (%)".into(),
                series,
                x_log: true,
                secondary: None,
            },
        )?;
        notes.push(format!(
            "Plot: bias vs noise scale\n\n  ![bias vs noise scale]({file})"
        ));
    }
    if rows.is_empty() {
        notes.push("No kept buffers (no DP-Muon run of this profile kept any).".into());
    }
    Ok(Table {
        slug: "dpmuon-bias".into(),
        title: "DP-Muon: Newton–Schulz's noise bias on the buffers the runs released".into(),
        columns: [
            "task",
            "run",
            "update",
            "matrices",
            "noise std s",
            "s multiplier",
            "noise share of ‖M̃‖²",
            "plain bias / ‖f‖",
            "after BC / ‖f‖",
            "z (BC helps > 0)",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows,
        notes,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::context::ProfileScale;
    use crate::dpmuon::{Scale, StartScore};

    #[test]
    fn controls_read_the_interval_on_the_right_side() {
        // NLL: the upper end of Adam's interval must lie below the start.
        assert!(nll_control(6.31, &[4.47, 4.52, 4.49]));
        assert!(!nll_control(4.5, &[4.3, 4.7]));
        assert!(nll_control(4.5, &[4.3]));
        assert!(!nll_control(4.5, &[]));
        // BLEU: the lower end must lie above the start.
        assert!(bleu_control(Some(1.0), &[5.0, 5.2, 4.9]));
        assert!(!bleu_control(Some(1.0), &[0.5, 9.0]));
        assert!(!bleu_control(Some(0.0), &[0.0, 0.0, 0.0]));
        assert!(!bleu_control(None, &[5.0, 5.2]));
        assert_eq!(gate("reversed", true), "reversed");
        assert_eq!(gate("holds", false), "uninformative");
    }

    fn summary(method: &str, loss: f64, bleu: f64) -> crate::paper::runs::Summary {
        serde_json::from_value(serde_json::json!({
            "method": method, "loss": loss, "bleu": bleu, "rouge_l": 1.0, "updates": 4,
            "seconds_per_update": 0.1, "loss_curve": [], "eval_curve": [], "epsilon_curve": [],
            "public_entropy": [], "snr": [],
        }))
        .unwrap()
    }

    /// The DART case: BLEU is 0 for every method while non-private fine-tuning lowers the test
    /// NLL far below the start, so the NLL verdicts count and the BLEU verdicts read
    /// uninformative.
    #[test]
    fn nll_verdicts_are_gated_on_nll_and_bleu_verdicts_on_bleu() {
        let st = Setting {
            batch: 64.0,
            epsilon: 8.0,
        };
        let mut scale = Scale::quick();
        scale.seeds = vec![0, 1, 2];
        scale.settings = vec![st];
        let nll: [(Method, [f64; 3]); 5] = [
            (Method::DpAdam, [4.90, 5.00, 4.95]),
            (Method::DpMuon, [5.10, 5.20, 5.12]),
            (Method::DpMuonbc, [5.05, 5.16, 5.08]),
            (Method::Adam, [4.47, 4.50, 4.48]),
            (Method::Muon, [4.60, 4.62, 4.61]),
        ];
        let mut runs = BTreeMap::new();
        for (m, v) in nll {
            for (seed, x) in v.iter().enumerate() {
                runs.insert(
                    run_label("dart", m, &st, seed as u64),
                    summary(m.name(), *x, 0.0),
                );
            }
        }
        let r = Results {
            scale,
            tasks: vec![TaskResults {
                task: "dart".into(),
                note: "dart: test data.".into(),
                start: Some(StartScore {
                    nll: 6.31,
                    bleu: Some(0.0),
                    rouge_l: Some(1.0),
                }),
                cells: vec![CellResults {
                    setting: st,
                    steps: 4,
                    lrs: BTreeMap::new(),
                    sigma: Some(1.0),
                }],
            }],
            runs,
            missing: vec![],
            sources: vec![],
            bias: vec![],
            seconds: 0.0,
        };
        let tmp = tempfile::tempdir().unwrap();
        let t = tables(&r, tmp.path()).unwrap();
        let text = t[0].notes.join("\n");
        assert!(
            text.contains("NLL positive control passes")
                && text.contains("BLEU positive control FAILS"),
            "{text}"
        );
        assert!(
            text.contains("dart: DP-Muon ≤ DP-Adam in test NLL: **reversed**"),
            "{text}"
        );
        assert!(
            text.contains("DP-MuonBC ≤ DP-Muon in test NLL: **holds**"),
            "{text}"
        );
        assert!(text.contains("in BLEU: **uninformative**"), "{text}");
        assert!(!text.contains("in test NLL: **uninformative**"), "{text}");
        assert!(text.contains("is contradicted"), "{text}");
        // The curve row carries the same gated verdicts.
        assert!(t[1].rows[0][10].ends_with("reversed"), "{:?}", t[1].rows);
        assert!(t[1].rows[0][11].ends_with("holds"), "{:?}", t[1].rows);
    }
}
