//! Accountant part of `raptor-reproduce`: our certified PRV bounds against the golden values of
//! dp_accounting (PLD) and prv_accountant (fixtures/accountant/golden.csv), and RAPTOR's budget
//! plans.

use std::time::Instant;

use anyhow::Context as _;
use raptor_accountant::{
    Accuracy, Composition, PlanRequest, PrvAccountant, RdpAccountant, Stream, StreamSampling,
    SubsampledGaussian, plan_budget,
};

use crate::context::{Context, Table};

struct Golden {
    name: String,
    mechs: String,
    delta: f64,
    cols: Vec<String>,
    notes: String,
}

fn read_golden(ctx: &Context) -> anyhow::Result<Vec<Golden>> {
    let path = ctx.root.join("fixtures/accountant/golden.csv");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')).skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 11 {
            anyhow::bail!("{}: malformed line {line:?}", path.display());
        }
        out.push(Golden {
            name: f[0].to_string(),
            mechs: f[1].to_string(),
            delta: f[2].parse()?,
            cols: f[3..8].iter().map(|s| s.to_string()).collect(),
            notes: f[10].to_string(),
        });
    }
    Ok(out)
}

fn composition(mechs: &str) -> anyhow::Result<Composition> {
    let mut c = Composition::new();
    for m in mechs.split(';') {
        let v: Vec<&str> = m.split(':').collect();
        if v.len() != 3 {
            anyhow::bail!("bad mechanism {m:?}");
        }
        c.push(
            SubsampledGaussian::new(v[0].parse()?, v[1].parse()?)?,
            v[2].parse()?,
        )?;
    }
    Ok(c)
}

fn fmt(x: &str) -> String {
    x.parse::<f64>()
        .map(|v| format!("{v:.4}"))
        .unwrap_or_else(|_| "—".into())
}

/// The tables.
pub fn tables(ctx: &Context) -> anyhow::Result<Vec<Table>> {
    let rel = if ctx.quick() { 0.01 } else { 0.003 };
    let acc = PrvAccountant::new(Accuracy::relative(rel))?;
    let golden = read_golden(ctx)?;
    let mut rows = Vec::new();
    let (mut within, mut compared, mut sound) = (0, 0, 0);
    for (i, g) in golden.iter().enumerate() {
        if ctx.quick()
            && !(i % 4 == 0 || g.name.starts_with("trap") || g.name.starts_with("two-stream"))
        {
            continue;
        }
        let comp = composition(&g.mechs)?;
        let t0 = Instant::now();
        let e = acc.epsilon(&comp, g.delta)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let rdp = RdpAccountant::default().epsilon(&comp, g.delta)?;
        let dp_up: Option<f64> = g.cols[0].parse().ok();
        let lowers: Vec<f64> = [&g.cols[1], &g.cols[2]]
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect();
        if lowers.iter().all(|&l| e.upper >= l) {
            sound += 1;
        }
        if let Some(d) = dp_up.filter(|d| *d >= 0.1) {
            compared += 1;
            if e.upper <= 1.01 * d {
                within += 1;
            }
        }
        rows.push(vec![
            g.name.clone(),
            g.mechs.replace(';', " + "),
            format!("{:e}", g.delta),
            format!("{:.4}", e.upper),
            format!("{:.4}", e.estimate),
            format!("{:.4}", e.lower),
            format!("{:.4}", rdp.epsilon),
            fmt(&g.cols[0]),
            fmt(&g.cols[1]),
            fmt(&g.cols[3]),
            fmt(&g.cols[4]),
            format!("{ms:.0}"),
            if g.notes.is_empty() {
                String::new()
            } else {
                g.notes.clone()
            },
        ]);
    }
    let columns = [
        "case",
        "mechanisms q:σ:T",
        "δ",
        "ours upper",
        "ours estimate",
        "ours lower",
        "RDP",
        "dp_accounting PLD (pessimistic)",
        "dp_accounting PLD (optimistic)",
        "prv_accountant estimate",
        "prv_accountant upper",
        "ours ms",
        "reference notes",
    ];
    let comparison = Table {
        slug: "accountant-golden".into(),
        title: "Accountant: certified PRV bounds vs dp_accounting and prv_accountant".into(),
        columns: columns.iter().map(|s| s.to_string()).collect(),
        rows,
        notes: vec![
            format!(
                "ours: raptor-accountant PRV, relative eps_error {rel}, delta_error 1e-3·δ; both add and remove adjacency (max)."
            ),
            format!(
                "upper bound at or above every reference lower bound in {sound} cases; within 1 % of dp_accounting's PLD ε (ε ≥ 0.1) in {within}/{compared}."
            ),
            "golden values from fixtures/accountant/generate.py (dp-accounting 0.6.0 PLD at value_discretization_interval 1e-4; prv-accountant 0.2.0 at eps_error 0.01; removal only).".into(),
            "trap case (q 0.25, σ 8, T 10⁴, δ 1e-5; dp_accounting's PLD at a 1e-5 grid and Opacus's PRV agree): truth in [17.67680, 17.67711]; our estimate lies inside; prv-accountant 0.2.0's estimate 17.6805 is biased upward (at absolute eps_error 0.002, tests/golden.rs, our certified upper bound is below it; this table's coarser accuracy gives wider bounds).".into(),
        ],
    };

    // Budget plans.
    let mut plan_rows = Vec::new();
    let epsilons: &[f64] = if ctx.quick() {
        &[1.0, 8.0]
    } else {
        &[1.0, 4.0, 8.0]
    };
    let plan_acc = PrvAccountant::new(Accuracy::relative(0.01))?;
    for &eps in epsilons {
        let req = PlanRequest {
            epsilon: eps,
            delta: 1e-5,
            rho: 0.9,
            shared: Stream {
                q: 0.01,
                steps: 2000,
            },
            expert: Stream {
                q: 0.01,
                steps: 2000,
            },
            layers: 2,
            sampling: StreamSampling::Alternating,
        };
        let p = plan_budget(&req, &plan_acc)?;
        for (name, plan) in [("(i) additive", &p.additive), ("(ii) joint", &p.joint)] {
            plan_rows.push(vec![
                format!("{eps}"),
                name.into(),
                format!("{:.4}", plan.shared.sigma),
                format!("{:.4}", plan.expert.sigma),
                format!("{:.4}", plan.epsilon_claimed),
                format!("{:.4}", plan.epsilon_composed.upper),
            ]);
        }
    }
    let plans = Table {
        slug: "accountant-budget-plans".into(),
        title: "Accountant: RAPTOR budget plans (additive vs joint split)".into(),
        columns: ["ε", "plan", "σ_shared", "σ_expert", "ε claimed", "ε composed (PRV upper)"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        rows: plan_rows,
        notes: vec![
            "δ = 1e-5, ρ = 0.9, shared stream q = 0.01, T = 2000; expert stream q = 0.01, T = 2000 expert updates; L = 2 trained layers (experts of a layer compose in parallel; an expert update draws one sample for both layers, so it is charged as one mechanism with 1/σ_eff² = L/σ_e²).".into(),
            "additive: ε_s = ρε for the shared stream, ε_e = (1−ρ)ε for the expert updates (δ likewise), each calibrated alone; claimed ε = ε_s + ε_e.".into(),
            "joint: σ_e²/σ_s² = ρ·L·T_e·q_e² / ((1−ρ)·T_s·q_s²), common scale calibrated so that the one-PRV composition meets (ε, δ).".into(),
        ],
    };
    Ok(vec![comparison, plans])
}
