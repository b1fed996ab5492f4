//! raptor's side of `scripts/speed_bench.py`: training updates of the one-command configuration
//! (all-MiniLM-L6-v2, mean pooling and a new 2-class head, LoRA r 8 / α 16 on the attention
//! projections of layers 3–5, AdamW at lr 0.01, clip 1) on B records of T tokens, one process
//! per measurement so that its peak memory is its own.
//!
//! ```text
//! cargo run --release -p raptor-train --example minilm_speed -- \
//!     --method dp-adam|adam|raptor|lora --batch 64 --tokens 128 --steps 3 --cache on|off \
//!     [--model DIR] [--layer 5] [--micro-batch 64] [--interleave]
//! ```
//!
//! The records are N = B synthetic records of T token ids (`[CLS]`, ids from a fixed generator,
//! `[SEP]`; the same ids `scripts/speed_bench.py` gives PyTorch and Opacus), so q = 1: every
//! update draws all B records, and after the first update (which fills the frozen-prefix cache
//! when it is on) every update is an update of a later epoch. One untimed warm-up update, then
//! `--steps` timed updates (each: Poisson sample, forward, per-record clipping, noise, the
//! accountant's charge, AdamW). Prints one JSON line: the first update's seconds, each timed
//! update's seconds (wall clock and CPU time), the peak RSS of the timed updates (VmHWM after a reset with
//! `/proc/self/clear_refs`), libtorch's threads. `raptor` (RAPTOR) and `lora` (its
//! non-private reference, expert adapters in every layer) train the upcycled MoE-BERT of
//! `--method raptor` (`all-minilm-l6-v2-moe8` of the cache; RAPTOR's layer `--layer`), and the
//! line adds the seconds of the owner maps (each record routed alone, as a run does) and the
//! peak RSS before the timed updates. With `--interleave`, cached and uncached
//! updates of one trainer alternate (ABBA) and both series are printed instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Instant;

use raptor_models::checkpoint::{LoadOptions, load_bert};
use raptor_models::{BertPooling, Model};
use raptor_run::prefix::{PrefixSettings, plan_prefix_cache};
use raptor_train::config::{Method, ModelKind, PrefixCacheMode, RunConfig, Scope};
use raptor_train::methods::build_plan;
use raptor_train::optim::{OptimSettings, Optimizers};
use raptor_train::trainer::{Example, Trainer, TrainerOptions};
use tch::Device;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// CPU seconds this process has used (user + system, `/proc/self/stat`, 100 ticks a second):
/// under other load on the machine a steadier measure of the work than the wall clock.
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(f64::NAN)
}

fn status_kb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with(field)).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .unwrap_or(f64::NAN)
}

/// `n` records of `t` tokens: [CLS] (101), ids from the generator below in [1000, 30000),
/// [SEP] (102); labels alternate. `scripts/speed_bench.py` makes the same ids.
fn records(n: usize, t: usize) -> Vec<Example> {
    let mut s: u64 = 12345;
    (0..n)
        .map(|i| {
            let mut tokens = vec![101i64];
            for _ in 0..t.saturating_sub(2) {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                tokens.push(1000 + ((s >> 33) % 29000) as i64);
            }
            tokens.push(102);
            Example {
                id: i as u64,
                tokens,
                label: Some((i % 2) as i64),
                prompt_len: 0,
            }
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let method = match arg(&args, "--method").as_deref() {
        Some("adam") => Method::Adam,
        Some("raptor") => Method::Raptor,
        Some("lora") => Method::Lora,
        _ => Method::DpAdam,
    };
    // RAPTOR and its non-private reference train the upcycled MiniLM (8 experts, top-1, in
    // every layer) of `raptor train --data ... --method raptor`; `--layer` is RAPTOR's layer.
    let moe = matches!(method, Method::Raptor | Method::Lora);
    let layer: usize = arg(&args, "--layer").map_or(5, |s| s.parse().unwrap());
    let micro: usize = arg(&args, "--micro-batch").map_or(64, |s| s.parse().unwrap());
    let b: usize = arg(&args, "--batch").map_or(64, |s| s.parse().unwrap());
    let t: usize = arg(&args, "--tokens").map_or(128, |s| s.parse().unwrap());
    let steps: usize = arg(&args, "--steps").map_or(3, |s| s.parse().unwrap());
    let cache_on = arg(&args, "--cache").as_deref() != Some("off");
    let dir = match arg(&args, "--model") {
        Some(d) => PathBuf::from(d),
        None if moe => raptor_data::cache::default_cache_dir()
            .expect("a cache folder")
            .join("models")
            .join("all-minilm-l6-v2-moe8"),
        None => {
            let cache = raptor_data::cache::default_cache_dir().expect("a cache folder");
            raptor_data::pretrained::ensure_model(
                &raptor_data::pretrained::ALL_MINILM_L6_V2,
                &cache,
                false,
            )
            .expect("the MiniLM checkpoint")
        }
    };
    let mut model: Box<dyn Model> = Box::new(
        load_bert(
            &dir,
            2,
            BertPooling::Mean,
            Device::Cpu,
            &LoadOptions::strict(),
        )
        .expect("MiniLM loads")
        .model,
    );
    let data = records(b, t);
    let mut cfg = RunConfig {
        method: raptor_train::config::MethodConfig::new(method),
        ..RunConfig::default()
    };
    if let Some(scope) = cfg.method.scope_mut() {
        *scope = Scope::Lora;
    }
    cfg.model.kind = if moe {
        ModelKind::MoeBert
    } else {
        ModelKind::Bert
    };
    if let Some(e) = cfg.method.expert_layer_mut() {
        e.layer = raptor_train::config::LayerSpec::Block(layer);
    }
    cfg.lora.attention_targets = (3..6).map(|i| format!("layer.{i}.attention")).collect();
    cfg.lora.r = 8;
    cfg.lora.alpha = 16.0;
    cfg.train.batch_size = b as f64;
    cfg.train.steps = Some(100);
    cfg.train.lr = 0.01;
    cfg.train.clip = 1.0;
    cfg.train.micro_batch = micro;
    cfg.train.prefix_cache = if cache_on {
        PrefixCacheMode::Auto
    } else {
        PrefixCacheMode::Off
    };
    let (plan, _) = raptor_models::rng::seeded(1, || {
        build_plan((&cfg).into(), model.as_mut(), b, moe.then_some(layer))
    })
    .expect("the plan");
    // Owner maps as a run makes them (each record routed on its own), timed.
    let t0 = Instant::now();
    let owners = if method == Method::Raptor {
        let toks: Vec<Vec<i64>> = data.iter().map(|e| e.tokens.clone()).collect();
        raptor_models::owners_per_record(
            model.as_ref(),
            &toks,
            0,
            raptor_routing::OwnerRule::GateWeighted,
            Device::Cpu,
        )
        .unwrap()
        .into_iter()
        .filter(|(l, _)| *l == layer)
        .collect()
    } else {
        Default::default()
    };
    let owner_seconds = t0.elapsed().as_secs_f64();
    let before_training_rss = status_kb("VmRSS:") / 1024.0;
    let optim = Optimizers::new(OptimSettings::adamw(cfg.train.lr), &plan.optim, Some(1));
    let opts = TrainerOptions {
        micro_batch: cfg.train.micro_batch,
        insecure_seed: Some(7),
        pad_id: 0,
        device: Device::Cpu,
        warmup_steps: 0,
        cosine: false,
    };
    let mut tr = Trainer::new(model.as_mut(), plan, &data, owners, optim, opts).unwrap();
    let prefix = plan_prefix_cache(
        tr.model(),
        tr.scope(),
        &PrefixSettings {
            mode: cfg.train.prefix_cache,
            private_dir: None,
            memory_budget: None,
            max_tokens: t,
            records: b,
        },
    )
    .unwrap();
    eprintln!("{}", prefix.describe());
    let cache = prefix.open(b, "train", None).unwrap();
    tr = tr.with_prefix_caches(cache, None).unwrap();
    let mut noop = |_: &raptor_accountant::Ledger| Ok(());
    let t0 = Instant::now();
    tr.step(&mut noop).unwrap();
    let first = t0.elapsed().as_secs_f64();
    // Peak RSS of the timed updates only (5: reset VmHWM to the current RSS).
    let process_peak = status_kb("VmHWM:") / 1024.0;
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    if args.iter().any(|a| a == "--interleave") {
        // Cached and uncached updates of one trainer in ABBA order (the cache taken out and put
        // back): a paired comparison within one process, steadier than two processes on a
        // busy machine.
        let (mut on, mut off) = (Vec::new(), Vec::new());
        let mut caches = tr.take_prefix_caches();
        for i in 0..steps {
            for use_cache in [i % 2 == 0, i % 2 == 1] {
                if use_cache {
                    tr = tr.with_prefix_caches(caches.0.take(), None).unwrap();
                }
                let (t0, c0) = (Instant::now(), cpu_seconds());
                tr.step(&mut noop).unwrap();
                let m = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
                if use_cache {
                    caches = tr.take_prefix_caches();
                    on.push(m);
                } else {
                    off.push(m);
                }
            }
        }
        println!(
            "{}",
            serde_json::json!({
                "cached_step_seconds": on.iter().map(|m| m.0).collect::<Vec<_>>(),
                "cached_step_cpu_seconds": on.iter().map(|m| m.1).collect::<Vec<_>>(),
                "uncached_step_seconds": off.iter().map(|m| m.0).collect::<Vec<_>>(),
                "uncached_step_cpu_seconds": off.iter().map(|m| m.1).collect::<Vec<_>>(),
            })
        );
        return;
    }
    for _ in 0..steps {
        let (t0, c0) = (Instant::now(), cpu_seconds());
        tr.step(&mut noop).unwrap();
        times.push(t0.elapsed().as_secs_f64());
        cpu.push(cpu_seconds() - c0);
    }
    println!(
        "{}",
        serde_json::json!({
            "first_step_seconds": first,
            "step_seconds": times,
            "step_cpu_seconds": cpu,
            "peak_rss_mb": status_kb("VmHWM:") / 1024.0,
            "threads": tch::get_num_threads(),
            "prefix_cache": prefix.caches(),
            "owner_map_seconds": owner_seconds,
            "rss_before_training_mb": before_training_rss,
            "process_peak_rss_mb_before_reset": process_peak,
        })
    );
}
