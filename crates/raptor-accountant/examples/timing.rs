//! Per-call timing of the benchmark cases (release build; set RAPTOR_ACCOUNTANT_TRACE=1 for
//! per-phase timings): `cargo run --release -p raptor-accountant --example timing`.

use std::time::Instant;

use raptor_accountant::{Composition, PrvAccountant, SubsampledGaussian, calibrate_sigma};

fn main() -> Result<(), raptor_accountant::AccountantError> {
    let acc = PrvAccountant::default();
    let one = Composition::single(SubsampledGaussian::new(0.01, 1.0)?, 10_000)?;
    let two = one
        .clone()
        .with(SubsampledGaussian::new(0.05, 2.0)?, 10_000)?;
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let only = std::env::args().nth(2).unwrap_or_default();
    for (name, comp) in [("one", &one), ("two", &two)] {
        if !only.is_empty() && only != name {
            continue;
        }
        let mut best = f64::INFINITY;
        let mut e = acc.epsilon(comp, 1e-5)?;
        for _ in 0..reps {
            let t = Instant::now();
            e = acc.epsilon(comp, 1e-5)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{name}: best {:.2} ms  upper {:.6} est {:.6} lower {:.6}",
            best * 1e3,
            e.upper,
            e.estimate,
            e.lower
        );
    }
    if !only.is_empty() && only != "calibrate" {
        return Ok(());
    }
    let t = Instant::now();
    let s = calibrate_sigma(1.0, 1e-5, 0.01, 10_000, &acc)?;
    println!(
        "calibrate: {:.1} ms  sigma {:.6}",
        t.elapsed().as_secs_f64() * 1e3,
        s.sigma
    );
    Ok(())
}
