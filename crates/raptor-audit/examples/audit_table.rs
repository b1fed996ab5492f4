//! The white-box audit table of the READMEs (`scripts/audit-table.sh` runs it): every row is one
//! white-box audit of the tiny Switch of `raptor_audit::planted::toy_switch` on the toy
//! data (m canaries, q = 0.01, δ = 10⁻⁶, 95 % confidence) for each insecure seed, of a correct
//! run or of one with a planted noise bug. Prints Markdown rows; measured, not asserted (the
//! assertions are the audit's tests in crate `raptor-audit`).
//!
//! Test/audit-only: needs the `planted-faults` feature, which no real run is built with.
//!
//! ```sh
//! cargo run -p raptor-audit --example audit_table --features planted-faults \
//!     [-- --canaries 40000 --seeds 11,12,13]
//! ```

use std::time::Instant;

use anyhow::{Context, bail};
use raptor_audit::planted::{PlantedFault, audit_with_fault, toy_switch};
use raptor_audit::{AuditOptions, AuditReport, CanaryKind, audit};
use raptor_train::config::Method;
use raptor_train::trainer::UpdateMetrics;

/// One row of the table.
struct Row {
    what: &'static str,
    method: Method,
    epsilon: f64,
    steps: u64,
    expert: Option<usize>,
    fault: Option<PlantedFault>,
}

const fn row(
    what: &'static str,
    method: Method,
    epsilon: f64,
    steps: u64,
    expert: Option<usize>,
    fault: Option<PlantedFault>,
) -> Row {
    Row {
        what,
        method,
        epsilon,
        steps,
        expert,
        fault,
    }
}

const ROWS: [Row; 10] = [
    row("non-private LoRA", Method::Lora, 1.0, 100, None, None),
    row("correct", Method::DpAdamLora, 1.0, 100, None, None),
    row("correct", Method::DpAdamLora, 4.0, 100, None, None),
    row("correct", Method::DpAdamLora, 8.0, 100, None, None),
    row(
        "**planted: no noise**",
        Method::DpAdamLora,
        1.0,
        100,
        None,
        Some(PlantedFault::Off),
    ),
    row(
        "**planted: noise at σ/2**",
        Method::DpAdamLora,
        1.0,
        100,
        None,
        Some(PlantedFault::Half),
    ),
    row(
        "**planted: noise at σ/2**",
        Method::DpAdamLora,
        2.0,
        100,
        None,
        Some(PlantedFault::Half),
    ),
    row(
        "correct, per-expert",
        Method::Raptor,
        1.0,
        200,
        Some(0),
        None,
    ),
    row(
        "correct, per-expert",
        Method::Raptor,
        8.0,
        200,
        Some(0),
        None,
    ),
    row(
        "**planted: expert stream at σ_e/2**, per-expert",
        Method::Raptor,
        1.0,
        200,
        Some(0),
        Some(PlantedFault::HalfExperts),
    ),
];

/// `--canaries M` and `--seeds a,b,c` (defaults 40,000 and 11, 12, 13).
fn args() -> anyhow::Result<(usize, Vec<u64>)> {
    let (mut m, mut seeds) = (40_000usize, vec![11u64, 12, 13]);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().with_context(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--canaries" => m = v.parse().with_context(|| format!("--canaries {v}"))?,
            "--seeds" => {
                seeds = v
                    .split(',')
                    .map(|s| s.trim().parse::<u64>())
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("--seeds {v}"))?;
            }
            _ => bail!("unknown argument {a} (--canaries M, --seeds a,b,c)"),
        }
    }
    if seeds.is_empty() {
        bail!("--seeds: at least one seed");
    }
    Ok((m, seeds))
}

fn main() -> anyhow::Result<()> {
    let (m, seeds) = args()?;
    // One libtorch thread: the machine's cores may be shared (OpenMP spinning would stall).
    tch::set_num_threads(1);
    let runs = std::env::temp_dir().join(format!("raptor-audit-table-{}", std::process::id()));
    let start = Instant::now();
    let seed_list: Vec<String> = seeds.iter().map(u64::to_string).collect();
    let mut out = vec![
        format!(
            "| run | method | target ε | certified ε_upper (run) | ε of the audited expert stream | ε_lower, seeds {} | seed {}: statistic, correct / guesses |",
            seed_list.join(" / "),
            seeds[0]
        ),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    for r in &ROWS {
        let mut lows = Vec::new();
        let mut first: Option<AuditReport> = None;
        for &seed in &seeds {
            let mut cfg = toy_switch(r.method, r.epsilon, m, r.steps);
            cfg.train.insecure_seed = Some(seed);
            let opts = AuditOptions {
                canaries: Some(m),
                kind: Some(CanaryKind::Dirac),
                expert: r.expert,
                ..AuditOptions::default()
            };
            let mut quiet = |_: u64, _: u64, _: &UpdateMetrics, _: Option<f64>| {};
            let t = Instant::now();
            let rep = match r.fault {
                None => audit(&cfg, &opts, &runs, &mut quiet)?,
                Some(f) => audit_with_fault(&cfg, &opts, &runs, &mut quiet, f)?,
            };
            eprintln!(
                "{} {:?} ε {} seed {seed}: ε_lower {:.3} ({:.1} s)",
                rep.method,
                r.fault,
                r.epsilon,
                rep.epsilon_lower,
                t.elapsed().as_secs_f64()
            );
            std::fs::remove_dir_all(&rep.run)
                .with_context(|| format!("removing {}", rep.run.display()))?;
            lows.push(format!("{:.2}", rep.epsilon_lower));
            first.get_or_insert(rep);
        }
        let rep = first.context("no seed ran")?;
        let upper = rep
            .epsilon_upper
            .map_or("∞ (not private)".to_string(), |u| format!("{u:.3}"));
        let stream = rep
            .expert
            .as_ref()
            .and_then(|x| x.epsilon_stream)
            .map_or("—".to_string(), |e| format!("{e:.3}"));
        let target = if r.method.is_private() {
            format!("{}", r.epsilon)
        } else {
            "—".to_string()
        };
        out.push(format!(
            "| {} | {} | {target} | {upper} | {stream} | {} | {}, {} / {} |",
            r.what,
            rep.method,
            lows.join(" / "),
            rep.dirac.as_ref().map_or("", |d| d.statistic.as_str()),
            rep.search.correct,
            rep.search.guesses,
        ));
    }
    // Only the (now empty) folder of this process's runs is left.
    std::fs::remove_dir_all(&runs).with_context(|| format!("removing {}", runs.display()))?;
    println!(
        "AUDIT TABLE (m = {m}, q = 0.01, δ = 1e-6, 95 % confidence; {} audits in {:.0} s)",
        ROWS.len() * seeds.len(),
        start.elapsed().as_secs_f64()
    );
    for l in out {
        println!("{l}");
    }
    Ok(())
}
