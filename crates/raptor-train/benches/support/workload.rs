//! The workload shared by the `step` bench and the `step_cost` example: a Switch encoder
//! (d 128, 4 blocks, 8 experts, LoRA r 8) and N = 1024 records of 32 tokens, B = 64.

use std::time::{Duration, Instant};

use raptor_models::{Model, SwitchConfig, SwitchEncoder};
use raptor_train::config::{Method, RunConfig};
use raptor_train::methods::build_plan;
use raptor_train::optim::{OptimSettings, Optimizers};
use raptor_train::trainer::{Example, Trainer, TrainerOptions};
use tch::Device;

/// The device the step bench runs on: `RAPTOR_BENCH_DEVICE` (`cpu`, `cuda`, `cuda:N`), default
/// the CPU (`scripts/gpu-check.sh` sets `cuda`).
pub fn bench_device() -> Device {
    match std::env::var("RAPTOR_BENCH_DEVICE") {
        Ok(s) => raptor_run::device::open_device(
            s.parse()
                .expect("RAPTOR_BENCH_DEVICE is cpu, cuda or cuda:N"),
        )
        .expect("RAPTOR_BENCH_DEVICE names an available device"),
        Err(_) => Device::Cpu,
    }
}

const N: usize = 1024;
const B: f64 = 64.0;

fn data(vocab: i64) -> Vec<Example> {
    let mut s = 12345u64;
    (0..N)
        .map(|i| {
            let tokens = (0..32)
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    1 + ((s >> 33) as i64) % (vocab - 1)
                })
                .collect();
            Example {
                id: i as u64,
                tokens,
                label: Some((i % 2) as i64),
                prompt_len: 0,
            }
        })
        .collect()
}

fn model() -> SwitchEncoder {
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
    SwitchEncoder::new(c, bench_device()).unwrap()
}

/// Time of `updates` updates of `method` (rounded up to an even number so RAPTOR's two phases
/// weigh equally), after two warm-up updates; setup is not timed.
pub fn timed_updates(method: Method, updates: u64) -> Duration {
    let mut m = model();
    let d = data(m.vocab_size());
    let mut cfg = RunConfig {
        method: raptor_train::config::MethodConfig::new(method),
        ..RunConfig::default()
    };
    if let Some(e) = cfg.method.expert_layer_mut() {
        e.layer = raptor_train::config::LayerSpec::Block(3);
    }
    cfg.train.batch_size = B;
    cfg.train.steps = Some(1_000_000);
    cfg.privacy.accuracy = 0.05;
    let (plan, _) = build_plan((&cfg).into(), &mut m, N, Some(3)).unwrap();
    let owners = {
        let toks: Vec<Vec<i64>> = d.iter().map(|e| e.tokens.clone()).collect();
        let labels: Vec<i64> = d.iter().map(|e| e.label.unwrap()).collect();
        let b =
            raptor_models::Batch::from_records(&toks, 0, Some(&labels), bench_device()).unwrap();
        raptor_models::owner_tensors(
            &m,
            [&b],
            raptor_routing::OwnerRule::GateWeighted,
            bench_device(),
        )
        .unwrap()
        .into_iter()
        .map(|(l, t)| (l, Vec::<i64>::try_from(&t.to_device(Device::Cpu)).unwrap()))
        .collect()
    };
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
        device: bench_device(),
        warmup_steps: 0,
        cosine: false,
    };
    let mut tr = Trainer::new(&mut m, plan, &d, owners, optim, opts).unwrap();
    let mut noop = |_: &raptor_accountant::Ledger| Ok(());
    for _ in 0..2 {
        tr.step(&mut noop).unwrap();
    }
    let updates = updates + updates % 2;
    let start = Instant::now();
    for _ in 0..updates {
        tr.step(&mut noop).unwrap();
    }
    start.elapsed()
}

/// The decoder workload of the DP-Muon family: a GPT-2-style model (d 128, 4 blocks, 4 heads,
/// d_ff 512, vocab 512), N = 512 records of 32 tokens, B = 32, full fine-tuning (Newton–Schulz on
/// every hidden matrix for DP-Muon / DP-MuonBC, Adam on the rest).
#[allow(dead_code)] // used by the step bench, not by the step_cost example
pub fn timed_decoder_updates(method: Method, updates: u64) -> Duration {
    use raptor_models::{DecoderHead, Gpt2, Gpt2Config};
    tch::manual_seed(2);
    let mut c = Gpt2Config::tiny(DecoderHead::LanguageModel);
    c.vocab_size = 512;
    c.n_positions = 64;
    c.n_embd = 128;
    c.n_layer = 4;
    c.n_head = 4;
    c.n_inner = 512;
    let mut m = Gpt2::new(c, bench_device()).unwrap();
    let n = 512usize;
    let mut s = 777u64;
    let d: Vec<Example> = (0..n)
        .map(|i| Example {
            id: i as u64,
            tokens: (0..32)
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    1 + ((s >> 33) as i64) % 511
                })
                .collect(),
            label: None,
            prompt_len: 8,
        })
        .collect();
    // The full scope: every scoped method's default.
    let mut cfg = RunConfig {
        method: raptor_train::config::MethodConfig::new(method),
        ..RunConfig::default()
    };
    cfg.model.kind = raptor_train::config::ModelKind::Gpt2;
    cfg.train.batch_size = 32.0;
    cfg.train.steps = Some(1_000_000);
    cfg.privacy.accuracy = 0.05;
    let (plan, _) = build_plan((&cfg).into(), &mut m, n, None).unwrap();
    let optim = Optimizers::new(
        OptimSettings {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
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
        micro_batch: 32,
        insecure_seed: Some(3),
        pad_id: 0,
        device: bench_device(),
        warmup_steps: 0,
        cosine: false,
    };
    let mut tr = Trainer::new(&mut m, plan, &d, Default::default(), optim, opts).unwrap();
    let mut noop = |_: &raptor_accountant::Ledger| Ok(());
    for _ in 0..2 {
        tr.step(&mut noop).unwrap();
    }
    let start = Instant::now();
    for _ in 0..updates {
        tr.step(&mut noop).unwrap();
    }
    start.elapsed()
}
