//! Time and peak memory of training updates, one method per process (so each peak RSS is that
//! method's own): `cargo run -p raptor-train --release --example step_cost -- <method> [updates]`,
//! or with no argument it runs itself once per method and prints the table with ratios.
//!
//! Model: a Switch encoder (d 128, 4 blocks, 8 experts, LoRA r 8), B = 64 records of 32 tokens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use raptor_train::config::Method;

#[path = "../benches/support/workload.rs"]
mod workload;

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn run(method: Method, updates: u64) -> (f64, f64) {
    let t = workload::timed_updates(method, updates);
    (
        t.as_secs_f64() * 1e3 / (updates + updates % 2) as f64,
        peak_rss_mb(),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() >= 2 {
        let method = match args[1].as_str() {
            "raptor" => Method::Raptor,
            "dp-adam-lora" => Method::DpAdamLora,
            "lora" => Method::Lora,
            other => {
                eprintln!("unknown method {other} (raptor, dp-adam-lora or lora)");
                std::process::exit(2);
            }
        };
        let updates = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20);
        let (ms, mb) = run(method, updates);
        println!("{ms:.3} {mb:.1}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut rows = Vec::new();
    for m in ["raptor", "dp-adam-lora", "lora"] {
        let out = std::process::Command::new(&exe)
            .args([m, "20"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<f64> = text
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        rows.push((m, v[0], v[1]));
    }
    println!("| method | ms / update | peak RSS (MB) |");
    println!("|---|---|---|");
    for (m, ms, mb) in &rows {
        println!("| {m} | {ms:.1} | {mb:.0} |");
    }
    println!(
        "\nraptor / dp-adam-lora time {:.3}; dp-adam-lora / lora time {:.3}, peak RSS {:.3}",
        rows[0].1 / rows[1].1,
        rows[1].1 / rows[2].1,
        rows[1].2 / rows[2].2
    );
}
