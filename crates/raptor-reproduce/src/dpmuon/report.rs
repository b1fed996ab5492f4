//! The DP-Muon tables and plots. The decision rule comes first; every sentence under a table is
//! computed from that run's numbers.

use std::path::Path;

use raptor_report::{BarPlot, Estimate, LinePlot, Series, Table, bar_plot, estimate, line_plot};
use raptor_train::config::Method;

use super::{METHODS, Results, TaskResults, bias::BiasRow, eps_of};
use crate::paper::label;

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
pub const DECISION_RULE: &str = "Decision rule (fixed before the runs): for an ordering \"A ≤ B in test NLL\", d = NLL(A) − NLL(B) is taken per seed (paired: same seed, same initialization, Poisson sampler and noise seeds, same pretrained start); the ordering **holds** when the 95 % Student-t interval of the mean d lies below 0, is **reversed** when it lies above 0, and is **not resolved** otherwise. The experiment can tell only if its positive control passes: non-private Adam fine-tuning must lower the test NLL below the pretrained start's (the upper end of its 95 % interval over seeds below the start) and raise BLEU above the start's; when it does not, every verdict of that task reads **uninformative**.";

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
    m: Method,
    f: impl Fn(&crate::paper::runs::Summary) -> Option<f64>,
) -> Vec<(u64, f64)> {
    r.scale
        .seeds
        .iter()
        .filter_map(|&s| {
            let sm = r
                .runs
                .get(&label(task, m.name(), "", eps_of(m, &r.scale), s))?;
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
fn verdict(d: &[f64]) -> (&'static str, Option<Estimate>) {
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

/// Whether the positive control passes, and the sentence saying so.
fn positive_control(r: &Results, t: &TaskResults) -> (bool, String) {
    let nll = est(&values(r, &t.task, Method::Adam, |s| s.loss));
    let bleu = est(&values(r, &t.task, Method::Adam, |s| s.bleu));
    match (&t.start, nll, bleu) {
        (Some(st), Some(n), Some(b)) => {
            let upper = if n.has_interval() {
                n.mean + n.half_width
            } else {
                n.mean
            };
            let ok = upper < st.nll && st.bleu.is_some_and(|sb| b.mean > sb);
            (
                ok,
                format!(
                    "{}: positive control {}: non-private Adam fine-tuning reaches test NLL {} (pretrained start {:.3}) and BLEU {} (start {}).",
                    t.task,
                    if ok { "passes" } else { "FAILS" },
                    n.fmt(3),
                    st.nll,
                    b.fmt(1),
                    st.bleu.map_or("—".into(), |b| format!("{b:.1}"))
                ),
            )
        }
        (None, ..) => (
            false,
            format!(
                "{}: no pretrained-start score (a user-given checkpoint), so the positive control cannot be checked.",
                t.task
            ),
        ),
        _ => (
            false,
            format!("{}: the positive control has no runs to score.", t.task),
        ),
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// The main table, the learning-rate table, the bias table, and their plots.
pub fn tables(r: &Results, out: &Path) -> anyhow::Result<Vec<Table>> {
    let mut rows = Vec::new();
    let mut notes = vec![DECISION_RULE.to_string()];
    notes.push(format!(
        "Mean ± 95 % Student-t half-width over {} paired seeds (seeds {:?}); {} private updates at expected batch {} (ε = {}, certified PRV upper bound), per-example clip {}; learning rates chosen on public data only (table `dpmuon-lr`). Sampling and noise are seeded, so these runs are not private releases.",
        r.scale.seeds.len(),
        r.scale.seeds,
        r.scale.steps,
        r.scale.batch,
        r.scale.epsilon,
        r.scale.clip
    ));
    notes.extend(r.missing.iter().map(|m| format!("Skipped: {m}")));
    let mut bars = Vec::new();
    for t in &r.tasks {
        notes.push(t.note.clone());
        if let Some(s) = t.sigma {
            notes.push(format!(
                "{}: noise multiplier σ = {s:.4} in the private runs.",
                t.task
            ));
        }
        let paper = |m: &str| PAPER.iter().find(|p| p.0 == t.task && p.1 == m);
        if let Some(st) = &t.start {
            rows.push(vec![
                t.task.clone(),
                "pretrained start (no fine-tuning)".into(),
                "—".into(),
                "—".into(),
                format!("{:.3}", st.nll),
                st.bleu.map_or("—".into(), |b| format!("{b:.1}")),
                st.rouge_l.map_or("—".into(), |b| format!("{b:.1}")),
                "—".into(),
                "—".into(),
            ]);
        }
        let mut cats = Vec::new();
        let mut pts = Vec::new();
        let mut errs = Vec::new();
        for m in METHODS {
            let nll = est(&values(r, &t.task, m, |s| s.loss));
            let bleu = est(&values(r, &t.task, m, |s| s.bleu));
            let rouge = est(&values(r, &t.task, m, |s| s.rouge_l));
            let lr = t.lrs.get(m.name()).map_or("—".into(), |c| {
                if matches!(m, Method::DpMuon | Method::DpMuonbc) {
                    format!("Muon {} / AdamW {}", c.lr, c.adam_lr)
                } else {
                    format!("{}", c.lr)
                }
            });
            let p = paper(m.name());
            rows.push(vec![
                t.task.clone(),
                pretty(m.name()).into(),
                if m.is_private() {
                    format!("{}", r.scale.epsilon)
                } else {
                    "∞".into()
                },
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
        let (ok, pc) = positive_control(r, t);
        notes.push(pc);
        let nll = |m: Method| values(r, &t.task, m, |s| s.loss);
        let bleu = |m: Method| values(r, &t.task, m, |s| s.bleu);
        let mut verdicts = Vec::new();
        for (a, b) in [
            (Method::DpMuon, Method::DpAdam),
            (Method::DpMuonbc, Method::DpMuon),
            (Method::DpMuonbc, Method::DpAdam),
        ] {
            let (v, e) = verdict(&paired(&nll(a), &nll(b)));
            let v = if ok { v } else { "uninformative" };
            verdicts.push(v);
            let db = estimate(&paired(&bleu(a), &bleu(b))).ok();
            notes.push(format!(
                "{}: {} ≤ {} in test NLL: **{v}**; paired NLL difference {} nats/token; paired BLEU difference {}.",
                t.task,
                pretty(a.name()),
                pretty(b.name()),
                fmt_d(e, 4),
                fmt_d(db, 2)
            ));
        }
        let whole = if verdicts[..2].iter().all(|v| *v == "holds") {
            "reproduced"
        } else if verdicts[..2].contains(&"uninformative") {
            "not testable here (the positive control failed)"
        } else if verdicts[..2].contains(&"reversed") {
            "contradicted (at least one step reversed)"
        } else {
            "not reproduced (at least one step not resolved)"
        };
        notes.push(format!(
            "{}: the paper's ordering DP-MuonBC ≤ DP-Muon ≤ DP-Adam in NLL is {whole} by this run.",
            t.task
        ));
        let mine: Vec<&BiasRow> = r
            .bias
            .iter()
            .filter(|b| b.task == t.task && b.multiplier == 1.0)
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
        title: format!(
            "DP-Muon family on data-to-text (ε = {}; decoder pretrained on the other task's public corpus; paper: GPT-2)",
            r.scale.epsilon
        ),
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
    Ok(vec![main, lr_table(r), bias_table(r, out)?])
}

fn lr_table(r: &Results) -> Table {
    let mut rows = Vec::new();
    let mut notes = vec![
        "Each method's learning rate is the grid point with the lowest validation NLL of its public proxy run: the private run's config (same updates, expected batch, clip, ε and as many records, hence the same σ) fine-tuning the same pretrained start on a held-out part of the public corpus, scored on another held-out public part, first seed. DP-Muon and DP-MuonBC tune the Muon matrices' rate; their other parameters (embeddings, biases, norms) use DP-Adam's chosen AdamW rate. Nothing here reads private or test data.".to_string(),
    ];
    for t in &r.tasks {
        for (m, c) in &t.lrs {
            for (lr, l) in &c.grid {
                rows.push(vec![
                    t.task.clone(),
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
        if let (Some(ps), Some(dp)) = (t.sigma, t.lrs.get("dp-adam").and_then(|c| c.sigma)) {
            notes.push(format!(
                "{}: σ of the proxy runs {dp:.4}, of the private runs {ps:.4} ({}).",
                t.task,
                if (dp - ps).abs() <= 1e-9 * ps.max(1.0) {
                    "the same"
                } else {
                    "different: the public proxy is smaller than the private set"
                }
            ));
        }
    }
    Table {
        slug: "dpmuon-lr".into(),
        title: "DP-Muon family: learning rates chosen on public data (proxy runs)".into(),
        columns: [
            "task",
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
    let mut rows = Vec::new();
    let mut keys: Vec<(String, String, u64, f64)> = r
        .bias
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
        let g: Vec<&BiasRow> = r
            .bias
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
        format!("Noise draws per estimate: {}; per-matrix rows in each run folder's diagnostics/bias.json.", r.bias.first().map_or(0, |b| b.draws)),
    ];
    let mut series = Vec::new();
    for task in r.tasks.iter().map(|t| t.task.clone()) {
        let sweep: Vec<&BiasRow> = r
            .bias
            .iter()
            .filter(|b| {
                b.task == task && b.run.contains("dp-muon ") && {
                    let last = r
                        .bias
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
