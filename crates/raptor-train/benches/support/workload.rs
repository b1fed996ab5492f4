//! The workload shared by the `step` bench and the `step_cost` example: a Switch encoder
//! (d 128, 4 blocks, 8 experts, LoRA r 8) and N = 1024 records of 32 tokens, B = 64.

use std::time::{Duration, Instant};

use raptor_models::{Model, SwitchConfig, SwitchEncoder};
use raptor_train::config::{Method, RunConfig};
use raptor_train::methods::build_plan;
use raptor_train::optim::{OptimSettings, Optimizers};
use raptor_train::trainer::{Example, Trainer, TrainerOptions};
use tch::Device;

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
    SwitchEncoder::new(c, Device::Cpu).unwrap()
}

/// Time of `updates` updates of `method` (rounded up to an even number so RAPTOR's two phases
/// weigh equally), after two warm-up updates; setup is not timed.
pub fn timed_updates(method: Method, updates: u64) -> Duration {
    let mut m = model();
    let d = data(m.vocab_size());
    let mut cfg = RunConfig::default();
    cfg.method.name = method;
    cfg.method.layer = "3".into();
    cfg.train.batch_size = B;
    cfg.train.steps = Some(1_000_000);
    cfg.privacy.accuracy = 0.05;
    let (plan, _) = build_plan(&cfg, &mut m, N, Some(3)).unwrap();
    let owners = {
        let toks: Vec<Vec<i64>> = d.iter().map(|e| e.tokens.clone()).collect();
        let labels: Vec<i64> = d.iter().map(|e| e.label.unwrap()).collect();
        let b = raptor_models::Batch::from_records(&toks, 0, Some(&labels), Device::Cpu).unwrap();
        raptor_models::owner_tensors(
            &m,
            [&b],
            raptor_routing::OwnerRule::GateWeighted,
            Device::Cpu,
        )
        .unwrap()
        .into_iter()
        .map(|(l, t)| (l, Vec::<i64>::try_from(&t).unwrap()))
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
        device: Device::Cpu,
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
