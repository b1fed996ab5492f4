//! The frozen-prefix cache does not change what a run releases: with the same insecure seed,
//! runs without a cache, with one in memory and with one in a file make the same releases (SGD
//! at lr 1, so each update's parameter change is the released gradient) up to float round-off,
//! for DP-Adam over LoRA on the upper blocks of a BERT (LoRA dropout on) and for RAPTOR on a
//! MoE-BERT (owner masks, residual weights). The run's plan says when the cache applies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use raptor_models::{Bert, BertConfig, BertMoeConfig, Model, PrefixStore};
use raptor_run::prefix::{PrefixPlan, PrefixSettings, plan_prefix_cache};
use raptor_train::config::{LayerSpec, Method, ModelKind, PrefixCacheMode, RunConfig};
use raptor_train::methods::build_plan;
use raptor_train::optim::{OptimSettings, Optimizers};
use raptor_train::streams::{Optim, Plan};
use raptor_train::trainer::{Example, Trainer, TrainerOptions};
use tch::{Device, Tensor};

const N: usize = 24;

fn examples(vocab: i64) -> Vec<Example> {
    let mut s = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as i64
    };
    (0..N)
        .map(|i| {
            let len = 2 + (next() % 9) as usize;
            let tokens: Vec<i64> = (0..len).map(|_| 1 + next() % (vocab - 1)).collect();
            Example {
                id: 40 + 3 * i as u64,
                label: Some(tokens.iter().sum::<i64>() % 3),
                tokens,
                prompt_len: 0,
            }
        })
        .collect()
}

fn model(moe: bool) -> Bert {
    let _rng = raptor_models::rng::global_rng();
    tch::manual_seed(21);
    let mut c = BertConfig::tiny(3);
    c.num_hidden_layers = 3;
    if moe {
        c.moe = Some(BertMoeConfig {
            num_experts: 2,
            num_experts_per_tok: 1,
            sparse_layers: vec![0, 1, 2],
        });
    }
    Bert::new(c, Device::Cpu).unwrap()
}

fn cfg(method: Method) -> RunConfig {
    let mut c = RunConfig {
        method: raptor_train::config::MethodConfig::new(method),
        ..RunConfig::default()
    };
    c.model.kind = if method == Method::Raptor {
        ModelKind::MoeBert
    } else {
        ModelKind::Bert
    };
    if let Some(e) = c.method.expert_layer_mut() {
        e.layer = LayerSpec::Block(2);
    }
    if let Some(scope) = c.method.scope_mut() {
        *scope = raptor_train::config::Scope::Lora;
    }
    c.lora.attention_targets = vec!["layer.1.attention".into(), "layer.2.attention".into()];
    c.lora.r = 2;
    c.lora.dropout = 0.1;
    c.train.batch_size = 8.0;
    c.train.steps = Some(3);
    c.privacy.accuracy = 0.05;
    c
}

fn sgd(plan: &Plan) -> Optimizers {
    let params: Vec<(String, Optim)> = plan
        .optim
        .iter()
        .map(|(n, _)| (n.clone(), Optim::Sgd))
        .collect();
    let mut s = OptimSettings::adamw(1.0);
    s.weight_decay = 0.0;
    Optimizers::new(s, &params, Some(1))
}

fn opts(seed: u64) -> TrainerOptions {
    TrainerOptions {
        micro_batch: 3,
        insecure_seed: Some(seed),
        pad_id: 0,
        device: Device::Cpu,
        warmup_steps: 0,
        cosine: false,
    }
}

/// A model with its method's scope set (LoRA attached), seeded under the generator's lock.
fn scoped(method: Method) -> Bert {
    let moe = method == Method::Raptor;
    let _rng = raptor_models::rng::global_rng();
    let mut m = model(moe);
    tch::manual_seed(22);
    raptor_train::methods::setup_scope((&cfg(method)).into(), &mut m, moe.then_some(2)).unwrap();
    m
}

/// The method's plan (built once: σ calibration is the slow part).
fn plan_of(method: Method) -> Plan {
    let mut m = model(method == Method::Raptor);
    let layer = (method == Method::Raptor).then_some(2);
    build_plan((&cfg(method)).into(), &mut m, N, layer)
        .unwrap()
        .0
}

/// Each update's change of every planned parameter, run with the given cache store.
fn run(
    method: Method,
    plan: &Plan,
    store: Option<PrefixStore>,
    seed: u64,
) -> (Vec<BTreeMap<String, Tensor>>, usize) {
    let mut m = scoped(method);
    let data = examples(m.vocab_size());
    let names = plan.params();
    let owners = if method == Method::Raptor {
        let toks: Vec<Vec<i64>> = data.iter().map(|e| e.tokens.clone()).collect();
        raptor_models::owners_per_record(
            &m,
            &toks,
            0,
            raptor_routing::OwnerRule::GateWeighted,
            Device::Cpu,
        )
        .unwrap()
    } else {
        BTreeMap::new()
    };
    let optim = sgd(plan);
    let updates = plan.updates as usize;
    let mut tr = Trainer::new(&mut m, plan.clone(), &data, owners, optim, opts(seed)).unwrap();
    let frozen = tr.model().frozen_prefix(tr.scope()).map(|p| p.layers);
    assert_eq!(
        frozen,
        Some(1),
        "{method:?}: LoRA from block 1 leaves block 0 frozen"
    );
    if let Some(store) = store {
        let cache =
            raptor_models::PrefixCache::new(1, 16, N, raptor_models::PrefixPrecision::F32, store)
                .unwrap();
        tr = tr.with_prefix_caches(Some(cache), None).unwrap();
    }
    let snap = |tr: &Trainer<'_>| -> BTreeMap<String, Tensor> {
        let vars = tr.model().var_store().variables();
        names
            .iter()
            .map(|n| (n.clone(), vars[n].detach().copy()))
            .collect()
    };
    let mut steps = Vec::new();
    for _ in 0..updates {
        let before = snap(&tr);
        tr.step(&mut |_| Ok(())).unwrap();
        let after = snap(&tr);
        steps.push(
            names
                .iter()
                .map(|n| (n.clone(), &after[n] - &before[n]))
                .collect(),
        );
    }
    let events = tr.events().len();
    (steps, events)
}

fn worst(a: &[BTreeMap<String, Tensor>], b: &[BTreeMap<String, Tensor>]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut w = 0.0f64;
    for (x, y) in a.iter().zip(b) {
        for (n, t) in x {
            let scale = t.abs().max().double_value(&[]).max(1e-6);
            w = w.max((t - &y[n]).abs().max().double_value(&[]) / scale);
        }
    }
    w
}

#[test]
fn cached_and_uncached_runs_release_the_same_updates() {
    for method in [Method::DpAdamLora, Method::Raptor] {
        let plan = plan_of(method);
        let (plain, events) = run(method, &plan, None, 9);
        assert!(!plain.is_empty());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cache.bin");
        let mut stores = vec![PrefixStore::Memory];
        if method == Method::DpAdamLora {
            stores.push(PrefixStore::File(file.clone()));
        }
        for store in stores {
            let (cached, ev) = run(method, &plan, Some(store), 9);
            assert_eq!(ev, events);
            let w = worst(&plain, &cached);
            assert!(w < 1e-4, "{method:?}: released updates differ by {w:e}");
        }
        assert!(!file.exists(), "the cache file is deleted with the run");
        if method == Method::DpAdamLora {
            // The comparison can fail: another seed's releases differ.
            let (other, _) = run(method, &plan, None, 10);
            assert!(worst(&plain, &other) > 1e-2, "{method:?}: another seed");
        }
    }
}

#[test]
fn the_plan_says_when_and_where_the_cache_applies() {
    let mut m = model(false);
    let c = cfg(Method::DpAdamLora);
    let (plan, _) = build_plan((&c).into(), &mut m, N, None).unwrap();
    let scope = plan.params();
    let dir = tempfile::tempdir().unwrap();
    let settings = |mode, budget, private: bool| PrefixSettings {
        mode,
        private_dir: private.then(|| dir.path().to_path_buf()),
        memory_budget: Some(budget),
        max_tokens: 10,
        records: N,
    };
    // Bound: 24 records × 10 tokens × 16 × 4 bytes = 15,360.
    let p = plan_prefix_cache(&m, &scope, &settings(PrefixCacheMode::Auto, 1 << 20, true)).unwrap();
    assert!(
        matches!(
            p,
            PrefixPlan::Cache {
                file: false,
                bound_bytes: 15_360,
                ..
            }
        ),
        "{p:?}"
    );
    assert!(
        p.describe().contains("blocks 0..1 of 3"),
        "{}",
        p.describe()
    );
    // Only f16 fits the budget: half precision after the measured check.
    let p = plan_prefix_cache(&m, &scope, &settings(PrefixCacheMode::Auto, 10_000, true)).unwrap();
    match &p {
        PrefixPlan::Cache {
            precision,
            f16_error: Some(e),
            file: false,
            ..
        } => assert!(
            *precision == raptor_models::PrefixPrecision::F16 && *e < 1e-3,
            "{p:?}"
        ),
        _ => panic!("{p:?}"),
    }
    // Neither fits: a file in the private folder, or (none) computed as without a cache.
    let p = plan_prefix_cache(&m, &scope, &settings(PrefixCacheMode::Auto, 1000, true)).unwrap();
    assert!(matches!(p, PrefixPlan::Cache { file: true, .. }), "{p:?}");
    let cache = p.open(N, "train", Some(dir.path())).unwrap().unwrap();
    let path = cache.path().unwrap().to_path_buf();
    assert!(path.starts_with(dir.path()) && path.exists());
    drop(cache);
    assert!(!path.exists());
    let p = plan_prefix_cache(&m, &scope, &settings(PrefixCacheMode::Auto, 1000, false)).unwrap();
    assert!(matches!(p, PrefixPlan::TooLarge { .. }), "{p:?}");
    assert!(p.describe().contains("would not fit"));
    assert!(p.open(N, "train", None).unwrap().is_none());
    let p = plan_prefix_cache(&m, &scope, &settings(PrefixCacheMode::Off, 1 << 20, true)).unwrap();
    assert_eq!(p, PrefixPlan::Off);
    // Trained embeddings: nothing to cache.
    let mut scope2 = scope.clone();
    scope2.push("bert.embeddings.word_embeddings.weight".into());
    let p =
        plan_prefix_cache(&m, &scope2, &settings(PrefixCacheMode::Auto, 1 << 20, true)).unwrap();
    assert!(matches!(p, PrefixPlan::NotApplicable { .. }), "{p:?}");
}

#[test]
fn a_cache_that_skips_a_trained_block_is_refused() {
    let mut m = model(false);
    let data = examples(m.vocab_size());
    let c = cfg(Method::DpAdamLora);
    let (plan, _) = build_plan((&c).into(), &mut m, N, None).unwrap();
    let optim = sgd(&plan);
    let tr = Trainer::new(&mut m, plan, &data, BTreeMap::new(), optim, opts(9)).unwrap();
    let cache = raptor_models::PrefixCache::new(
        2,
        16,
        N,
        raptor_models::PrefixPrecision::F32,
        PrefixStore::Memory,
    )
    .unwrap();
    let e = tr.with_prefix_caches(Some(cache), None).unwrap_err();
    assert!(e.to_string().contains("only 1 are frozen"), "{e}");
}
