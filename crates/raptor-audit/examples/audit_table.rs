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
#[derive(Clone, Copy)]
struct Row {
    what: &'static str,
    method: Method,
    epsilon: f64,
    steps: u64,
    expert: Option<usize>,
    fault: Option<PlantedFault>,
    /// Paired canaries on RAPTOR without alternation (one sample per update for both streams).
    paired: bool,
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
        paired: false,
    }
}

/// A row of paired canaries on RAPTOR without alternation, `steps` updates at target `epsilon`.
const fn paired(what: &'static str, epsilon: f64, steps: u64, fault: Option<PlantedFault>) -> Row {
    Row {
        what,
        method: Method::Raptor,
        epsilon,
        steps,
        expert: None,
        fault,
        paired: true,
    }
}

const ROWS: [Row; 15] = [
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
    paired("correct, paired, no alternation", 1.0, SPLIT_STEPS, None),
    paired("correct, paired, no alternation", 4.0, SPLIT_STEPS, None),
    paired("correct, paired, no alternation", 8.0, SPLIT_STEPS, None),
    paired(
        "**planted: streams charged as separate samples**, paired, no alternation",
        SPLIT_EPSILON,
        SPLIT_STEPS,
        Some(PlantedFault::SplitCharge),
    ),
    paired(
        "**planted: streams charged as separate samples**, paired, no alternation",
        2.0 * SPLIT_EPSILON,
        SPLIT_STEPS,
        Some(PlantedFault::SplitCharge),
    ),
];

/// Updates of the split-charge rows: few, so that each step's privacy loss is large, where one
/// subsampled mechanism of σ_eff costs most over two of σ_s and σ_e.
const SPLIT_STEPS: u64 = 50;

/// The most paired canaries the toy model takes: each needs a shared coordinate of its own
/// (the shared stream has 32,898).
const PAIRED_MAX: usize = 30_000;

/// The target ε of the split-charge row.
const SPLIT_EPSILON: f64 = 8.0;

/// The command line: `--canaries M`, `--seeds a,b,c` (defaults 40,000 and 11, 12, 13), `--rows
/// paired|split` (only the paired-canary rows, or only the split-charge rows), the paired rows'
/// `--split-steps T` and the first split-charge row's `--split-epsilon E` (the second at 2E).
struct Args {
    m: usize,
    seeds: Vec<u64>,
    rows: Option<String>,
    split_steps: u64,
    split_epsilon: f64,
}

fn args() -> anyhow::Result<Args> {
    let (mut m, mut seeds) = (40_000usize, vec![11u64, 12, 13]);
    let (mut rows, mut split_steps, mut split_epsilon) = (None, SPLIT_STEPS, SPLIT_EPSILON);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().with_context(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--canaries" => m = v.parse().with_context(|| format!("--canaries {v}"))?,
            "--rows" if v == "paired" || v == "split" => rows = Some(v),
            "--split-steps" => split_steps = v.parse().with_context(|| format!("{a} {v}"))?,
            "--split-epsilon" => split_epsilon = v.parse().with_context(|| format!("{a} {v}"))?,
            "--seeds" => {
                seeds = v
                    .split(',')
                    .map(|s| s.trim().parse::<u64>())
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("--seeds {v}"))?;
            }
            _ => bail!(
                "unknown argument {a} {v} (--canaries M, --seeds a,b,c, --rows paired|split, --split-steps T, --split-epsilon E)"
            ),
        }
    }
    if seeds.is_empty() {
        bail!("--seeds: at least one seed");
    }
    Ok(Args {
        m,
        seeds,
        rows,
        split_steps,
        split_epsilon,
    })
}

fn main() -> anyhow::Result<()> {
    let Args {
        m,
        seeds,
        rows,
        split_steps,
        split_epsilon,
    } = args()?;
    // One libtorch thread: the machine's cores may be shared (OpenMP spinning would stall).
    tch::set_num_threads(1);
    let runs = std::env::temp_dir().join(format!("raptor-audit-table-{}", std::process::id()));
    let start = Instant::now();
    let seed_list: Vec<String> = seeds.iter().map(u64::to_string).collect();
    let mut out = vec![
        format!(
            "| run | method | target ε | certified ε_upper (run's ledger) | ε of the audited expert stream, or of the one-sample charge | ε_lower, seeds {} | seed {}: statistic, correct / guesses |",
            seed_list.join(" / "),
            seeds[0]
        ),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    let split = |r: &Row| r.fault == Some(PlantedFault::SplitCharge);
    let rows: Vec<Row> = ROWS
        .iter()
        .filter(|r| match rows.as_deref() {
            Some("paired") => r.paired,
            Some(_) => split(r),
            None => true,
        })
        .map(|r| Row {
            epsilon: if split(r) {
                r.epsilon * split_epsilon / SPLIT_EPSILON
            } else {
                r.epsilon
            },
            steps: if r.paired { split_steps } else { r.steps },
            ..*r
        })
        .collect();
    for r in &rows {
        let mut lows = Vec::new();
        let mut first: Option<AuditReport> = None;
        let mut one_sample: Option<f64> = None;
        let m = if r.paired { m.min(PAIRED_MAX) } else { m };
        for &seed in &seeds {
            let mut cfg = toy_switch(r.method, r.epsilon, m, r.steps);
            cfg.train.insecure_seed = Some(seed);
            if let Some(a) = cfg.method.alternation_mut() {
                a.alternate = !r.paired;
            }
            let opts = AuditOptions {
                canaries: Some(m),
                kind: Some(if r.paired {
                    CanaryKind::Paired
                } else {
                    CanaryKind::Dirac
                }),
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
            // What the plan certifies by the one-sample rule (the run's ledger may differ only
            // with a planted ledger fault).
            let record: serde_json::Value = serde_json::from_slice(
                &std::fs::read(rep.run.join("record.json")).context("reading record.json")?,
            )?;
            one_sample = one_sample.or(record["privacy_plan"]["planned_epsilon"].as_f64());
            std::fs::remove_dir_all(&rep.run)
                .with_context(|| format!("removing {}", rep.run.display()))?;
            lows.push(format!("{:.2}", rep.epsilon_lower));
            first.get_or_insert(rep);
        }
        let rep = first.context("no seed ran")?;
        let upper = rep
            .epsilon_upper
            .map_or("∞ (not private)".to_string(), |u| format!("{u:.3}"));
        let stream = match (&rep.expert, r.paired) {
            (Some(x), _) => x
                .epsilon_stream
                .map_or("—".to_string(), |e| format!("{e:.3} (the expert stream)")),
            (None, true) => {
                one_sample.map_or("—".to_string(), |e| format!("{e:.3} (one-sample charge)"))
            }
            (None, false) => "—".to_string(),
        };
        let target = if r.method.is_private() {
            format!("{}", r.epsilon)
        } else {
            "—".to_string()
        };
        let what = if r.paired {
            format!("{} (m = {m})", r.what)
        } else {
            r.what.to_string()
        };
        out.push(format!(
            "| {what} | {} | {target} | {upper} | {stream} | {} | {}, {} / {} |",
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
        rows.len() * seeds.len(),
        start.elapsed().as_secs_f64()
    );
    for l in out {
        println!("{l}");
    }
    Ok(())
}
