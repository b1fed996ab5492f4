//! Time and peak memory of training updates, one method per process (so each peak RSS is that
//! method's own): `cargo run -p raptor-train --release --example step_cost -- <method> [updates]`,
//! or with no argument it runs itself once per method and prints the table with ratios.
//!
//! Model: a Switch encoder (d 128, 4 blocks, 8 experts, LoRA r 8), B = 64 records of 32 tokens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use raptor_models::{SwitchConfig, SwitchEncoder};
use raptor_train::config::{Method, RunConfig};
use raptor_train::methods::build_plan;
use raptor_train::optim::{OptimSettings, Optimizers};
use raptor_train::trainer::{Example, Trainer, TrainerOptions};
use tch::Device;

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
    tch::manual_seed(1);
    let mut c = SwitchConfig::tiny();
    c.vocab_size = 512;
    c.d_model = 128;
    c.d_kv = 32;
    c.num_heads = 4;
    c.d_ff = 256;
    c.num_layers = 4;
    c.num_experts = 8;
    c.num_labels = 2;
    let mut m = SwitchEncoder::new(c, Device::Cpu).unwrap();
    let n = 1024usize;
    let mut s = 7u64;
    let data: Vec<Example> = (0..n)
        .map(|i| {
            let tokens = (0..32)
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    1 + ((s >> 33) as i64) % 511
                })
                .collect();
            Example {
                id: i as u64,
                tokens,
                label: Some((i % 2) as i64),
                prompt_len: 0,
            }
        })
        .collect();
    let mut cfg = RunConfig::default();
    cfg.method.name = method;
    cfg.method.layer = "3".into();
    cfg.train.batch_size = 64.0;
    cfg.train.steps = Some(1_000_000);
    let (plan, _) = build_plan(&cfg, &mut m, n, Some(3)).unwrap();
    let toks: Vec<Vec<i64>> = data.iter().map(|e| e.tokens.clone()).collect();
    let labels: Vec<i64> = data.iter().map(|e| e.label.unwrap()).collect();
    let b = raptor_models::Batch::from_records(&toks, 0, Some(&labels), Device::Cpu).unwrap();
    let owners = raptor_models::owner_tensors(
        &m,
        [&b],
        raptor_routing::OwnerRule::GateWeighted,
        Device::Cpu,
    )
    .unwrap()
    .into_iter()
    .map(|(l, t)| (l, Vec::<i64>::try_from(&t).unwrap()))
    .collect();
    let optim = Optimizers::new(
        OptimSettings {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            muon_lr: 0.02,
            muon_beta: 0.95,
            muon_form: raptor_muon::MomentumForm::Nesterov,
            ns: raptor_muon::NsConfig::keller(),
            bc_probe_pairs: 1,
        },
        &plan.optim,
        Some(1),
    );
    let opts = TrainerOptions {
        micro_batch: 64,
        insecure_seed: Some(3),
        pad_id: 0,
        device: Device::Cpu,
        warmup_steps: 0,
        cosine: false,
    };
    let mut tr = Trainer::new(&mut m, plan, &data, owners, optim, opts).unwrap();
    let mut noop = |_: &raptor_accountant::Ledger| Ok(());
    for _ in 0..2 {
        tr.step(&mut noop).unwrap();
    }
    let start = Instant::now();
    for _ in 0..updates {
        tr.step(&mut noop).unwrap();
    }
    (
        start.elapsed().as_secs_f64() * 1e3 / updates as f64,
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
