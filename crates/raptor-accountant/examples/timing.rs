//! Per-call timing of the benchmark cases (release build; set RAPTOR_ACCOUNTANT_TRACE=1 for
//! per-phase timings): `cargo run --release -p raptor-accountant --example timing [REPS] [ONLY]`.
//!
//! Prints, for each accuracy preset (fast, default, tight), the best-of-REPS wall time and the
//! certified bounds of the benchmark cases: one stream (q = 0.01, σ = 1, T = 10⁴), two streams
//! (+ q = 0.05, σ = 2, T = 10⁴), one stream with T = 10⁶, all at δ = 1e-5, and the calibration
//! of σ for ε = 1 (q = 0.01, T = 10⁴). Repetitions of the cases are interleaved so that a
//! change in machine load affects them alike. ONLY restricts to one preset name.
//!
//! `timing bench PRESET CASE REPS` (CASE: one, two, big, calib, d12a, d12b, smallq) prints one machine-readable line
//! `RESULT preset case best_ms upper estimate lower` after one warm-up call; this is what
//! fixtures/accountant/bench_vs_dp_accounting.py runs, interleaved with dp_accounting.

use std::time::Instant;

use raptor_accountant::{
    Accuracy, Composition, PrvAccountant, SubsampledGaussian, calibrate_sigma,
};

fn preset(name: &str) -> Option<Accuracy> {
    match name {
        "fast" => Some(Accuracy::fast()),
        "default" => Some(Accuracy::default()),
        "tight" => Some(Accuracy::tight()),
        _ => None,
    }
}

/// `bench PRESET CASE REPS`: best-of-REPS after a warm-up, one RESULT line.
fn bench(args: &[String]) -> Result<(), raptor_accountant::AccountantError> {
    let (Some(pname), Some(case)) = (args.first(), args.get(1)) else {
        eprintln!("usage: timing bench PRESET CASE REPS");
        return Ok(());
    };
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let Some(accuracy) = preset(pname) else {
        eprintln!("unknown preset {pname}");
        return Ok(());
    };
    let acc = PrvAccountant::new(accuracy)?;
    let one = Composition::single(SubsampledGaussian::new(0.01, 1.0)?, 10_000)?;
    let comp = match case.as_str() {
        "one" => Some(one),
        "two" => Some(one.with(SubsampledGaussian::new(0.05, 2.0)?, 10_000)?),
        "big" => Some(Composition::single(
            SubsampledGaussian::new(0.01, 1.0)?,
            1_000_000,
        )?),
        // The δ = 1e-12 golden cases (T = 1000).
        "d12a" => Some(Composition::single(
            SubsampledGaussian::new(0.01, 1.0)?,
            1_000,
        )?),
        "d12b" => Some(Composition::single(
            SubsampledGaussian::new(0.1, 2.0)?,
            1_000,
        )?),
        _ => None,
    };
    let comp = if case == "smallq" {
        Some(Composition::single(
            SubsampledGaussian::new(1e-4, 1.0)?,
            100_000,
        )?)
    } else {
        comp
    };
    let delta = if case.starts_with("d12") { 1e-12 } else { 1e-5 };
    let mut best = f64::INFINITY;
    let (mut upper, mut est, mut low) = (f64::NAN, f64::NAN, f64::NAN);
    for i in 0..=reps {
        let t = Instant::now();
        if let Some(c) = &comp {
            let e = acc.epsilon(c, delta)?;
            (upper, est, low) = (e.upper, e.estimate, e.lower);
        } else {
            let c = calibrate_sigma(1.0, 1e-5, 0.01, 10_000, &acc)?;
            (upper, est, low) = (c.epsilon.upper, c.sigma, c.epsilon.lower);
        }
        if i > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    println!(
        "RESULT {pname} {case} {:.4} {upper:.9} {est:.9} {low:.9}",
        best * 1e3
    );
    Ok(())
}

fn main() -> Result<(), raptor_accountant::AccountantError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("bench") {
        return bench(&args[1..]);
    }
    let one = Composition::single(SubsampledGaussian::new(0.01, 1.0)?, 10_000)?;
    let two = one
        .clone()
        .with(SubsampledGaussian::new(0.05, 2.0)?, 10_000)?;
    let big = Composition::single(SubsampledGaussian::new(0.01, 1.0)?, 1_000_000)?;
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let only = std::env::args().nth(2).unwrap_or_default();
    let presets = [
        ("fast", Accuracy::fast()),
        ("default", Accuracy::default()),
        ("tight", Accuracy::tight()),
    ];
    for (pname, accuracy) in presets {
        if !only.is_empty() && only != pname {
            continue;
        }
        let acc = PrvAccountant::new(accuracy)?;
        let cases = [("one", &one), ("two", &two), ("T=1e6", &big)];
        let mut best = [f64::INFINITY; 4];
        let mut out = Vec::new();
        for _ in 0..reps {
            out.clear();
            for (i, (_, comp)) in cases.iter().enumerate() {
                let t = Instant::now();
                let e = acc.epsilon(comp, 1e-5)?;
                best[i] = best[i].min(t.elapsed().as_secs_f64());
                out.push(e);
            }
            let t = Instant::now();
            let s = calibrate_sigma(1.0, 1e-5, 0.01, 10_000, &acc)?;
            best[3] = best[3].min(t.elapsed().as_secs_f64());
            out.push(s.epsilon);
            println!("# {pname}: calibrated sigma {:.6}", s.sigma);
        }
        for (i, (name, _)) in cases.iter().enumerate() {
            let e = out[i];
            println!(
                "{pname:8} {name:6}: best {:8.2} ms  upper {:.7} est {:.7} lower {:.7}",
                best[i] * 1e3,
                e.upper,
                e.estimate,
                e.lower
            );
        }
        println!(
            "{pname:8} calib : best {:8.2} ms  upper {:.7}",
            best[3] * 1e3,
            out[3].upper
        );
    }
    Ok(())
}
