//! One query, for investigations: `cargo run --release -p raptor-accountant --example probe --
//! PRESET Q SIGMA T DELTA` prints the certified bounds (set RAPTOR_ACCOUNTANT_TRACE=1 for the
//! composition's trace).

use raptor_accountant::{Accuracy, Composition, PrvAccountant, SubsampledGaussian};

fn main() -> Result<(), raptor_accountant::AccountantError> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 5 {
        eprintln!("usage: probe PRESET Q SIGMA T DELTA");
        return Ok(());
    }
    let accuracy = match a[0].as_str() {
        "fast" => Accuracy::fast(),
        "tight" => Accuracy::tight(),
        _ => Accuracy::default(),
    };
    let num = |i: usize| a[i].parse::<f64>().unwrap_or(f64::NAN);
    let comp = Composition::single(SubsampledGaussian::new(num(1), num(2))?, num(3) as u64)?;
    let acc = PrvAccountant::new(accuracy)?;
    let t = std::time::Instant::now();
    let e = acc.epsilon(&comp, num(4))?;
    println!(
        "upper {:.12} estimate {:.12} lower {:.12} remove {:.12} add {:.12} {:?} {:.2} s",
        e.upper,
        e.estimate,
        e.lower,
        e.upper_remove,
        e.upper_add,
        e.method,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
