//! One training step of a small Switch MoE encoder (d_model 256, 4 blocks, 8 experts, seq 64,
//! batch 64; full fine-tuning of everything but the routers): non-private (forward + backward)
//! versus private (forward + one backward to op outputs + per-sample norms of every trainable
//! parameter + role-wise clipped sums). Also measures peak memory of each step in a child
//! process (peak RSS with glibc's mmap threshold lowered so freed tensors leave the heap), and
//! ends with the private/non-private ratio from interleaved steps (`RAPTOR_MODELS_RATIO_REPS`,
//! default 5). `RAPTOR_MODELS_BREAKDOWN=1` adds where the private step's time goes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, SamplingMode, criterion_group};
use raptor_models::{
    Batch, ClipPolicy, ClippedStep, ForwardCtx, Model, ParamGroups, SwitchConfig, SwitchEncoder,
    trainable_params,
};
use std::collections::BTreeMap;
use std::time::Duration;
use tch::{Device, Kind, Tensor};

const B: usize = 64;
const T: usize = 64;

fn config() -> SwitchConfig {
    SwitchConfig {
        vocab_size: 4096,
        d_model: 256,
        d_kv: 32,
        d_ff: 1024,
        num_layers: 4,
        num_heads: 8,
        num_experts: 8,
        encoder_sparse_step: 2,
        relative_attention_num_buckets: 32,
        relative_attention_max_distance: 128,
        layer_norm_epsilon: 1e-6,
        expert_capacity: None,
        router_bias: false,
        dense_act_fn: raptor_models::Act::Relu,
        num_labels: 2,
    }
}

fn setup() -> (
    SwitchEncoder,
    Batch,
    ParamGroups<String>,
    ClipPolicy<String>,
) {
    tch::manual_seed(0);
    let m = SwitchEncoder::new(config(), Device::Cpu).unwrap();
    let mut s = 12345u64;
    let recs: Vec<Vec<i64>> = (0..B)
        .map(|i| {
            // Lengths 33..=64 (padding exercised).
            let len = T - (i * 7) % 32;
            (0..len)
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((s >> 33) % 4095) as i64 + 1
                })
                .collect()
        })
        .collect();
    let labels: Vec<i64> = (0..B as i64).map(|i| i % 2).collect();
    let batch = Batch::from_records(&recs, 0, Some(&labels), Device::Cpu).unwrap();
    let names = trainable_params(&m);
    let groups = ParamGroups::from_fn(names.iter().cloned(), |p| {
        Some(if p.contains(".experts.") {
            let parts: Vec<&str> = p.split('.').collect();
            format!("expert[{},{}]", parts[2], parts[7])
        } else {
            "shared".to_string()
        })
    });
    let mut bounds = BTreeMap::new();
    for (_, g) in groups.iter() {
        bounds.insert(g.to_string(), 1.0);
    }
    (m, batch, groups, ClipPolicy::RoleWise(bounds))
}

fn non_private(m: &SwitchEncoder, b: &Batch) -> Vec<Tensor> {
    let params: Vec<Tensor> = m
        .var_store()
        .trainable_variables()
        .into_iter()
        .filter(|t| t.requires_grad())
        .collect();
    let loss = m
        .per_record_loss(b, &mut ForwardCtx::new(true))
        .unwrap()
        .sum(Kind::Float);
    Tensor::run_backward(&[loss], &params, false, false)
}

fn private(m: &SwitchEncoder, b: &Batch, g: &ParamGroups<String>, p: &ClipPolicy<String>) -> usize {
    let step = ClippedStep::new(m).unwrap();
    let out = step
        .run(b, &BTreeMap::new(), g, p, &BTreeMap::new(), true)
        .unwrap();
    out.clip.sums.len()
}

fn bench(c: &mut Criterion) {
    tch::set_num_threads(num_threads());
    let (m, b, g, p) = setup();
    let mut grp = c.benchmark_group("switch_step_d256_l4_e8_t64_b64");
    // One step takes ~0.5–1 s on 2 cores: flat sampling (one step per sample) keeps the whole
    // bench (both modes + the memory children + the ratio line) at about a minute.
    grp.sampling_mode(SamplingMode::Flat)
        .measurement_time(Duration::from_secs(3))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1));
    grp.bench_function("non_private", |bch| bch.iter(|| non_private(&m, &b)));
    grp.bench_function("private_per_sample_clip", |bch| {
        bch.iter(|| private(&m, &b, &g, &p))
    });
    grp.finish();
}

/// Step-time ratio private / non-private from interleaved steps (load affects both alike):
/// medians of `RAPTOR_MODELS_RATIO_REPS` (default 5) steps per mode.
fn ratio_report() {
    tch::set_num_threads(num_threads());
    let (m, b, g, p) = setup();
    let reps: usize = std::env::var("RAPTOR_MODELS_RATIO_REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5)
        .max(1);
    let _ = non_private(&m, &b);
    let _ = private(&m, &b, &g, &p);
    let (mut np, mut pr) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t0 = std::time::Instant::now();
        let _ = non_private(&m, &b);
        np.push(t0.elapsed().as_secs_f64());
        let t0 = std::time::Instant::now();
        let _ = private(&m, &b, &g, &p);
        pr.push(t0.elapsed().as_secs_f64());
    }
    np.sort_by(|a, b| a.total_cmp(b));
    pr.sort_by(|a, b| a.total_cmp(b));
    let (n, q) = (np[reps / 2], pr[reps / 2]);
    println!(
        "step time (interleaved, median of {reps}): non_private {n:.3} s, private {q:.3} s, ratio {:.3} (min/min {:.3})",
        q / n,
        pr[0] / np[0]
    );
}

/// Where the private step's time goes: forward alone (no grad), forward + backward (recording,
/// `ClippedStep::per_sample`), then norms + clip + sums (`PerSampleGrads::into_clip`).
fn breakdown() {
    tch::set_num_threads(num_threads());
    let (m, b, g, p) = setup();
    let step = ClippedStep::new(&m).unwrap();
    let (mut fwd, mut fb, mut clip) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..4 {
        let t0 = std::time::Instant::now();
        tch::no_grad(|| {
            let _ = m.forward(&b, &mut ForwardCtx::new(true)).unwrap();
        });
        let t1 = std::time::Instant::now();
        let (_, grads) = step.per_sample(&b, &BTreeMap::new(), true).unwrap();
        let t2 = std::time::Instant::now();
        let _ = grads.into_clip(&g, &p, &BTreeMap::new()).unwrap();
        let t3 = std::time::Instant::now();
        if i > 0 {
            fwd.push((t1 - t0).as_secs_f64());
            fb.push((t2 - t1).as_secs_f64());
            clip.push((t3 - t2).as_secs_f64());
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    // The two halves of the clip separately, through the public per-parameter API.
    let (_, grads) = step.per_sample(&b, &BTreeMap::new(), true).unwrap();
    let params = grads.params();
    let ones = Tensor::ones([B as i64], (Kind::Float, Device::Cpu));
    let t0 = std::time::Instant::now();
    for q in &params {
        let _ = grads.sq_norms(q).unwrap();
    }
    let t1 = std::time::Instant::now();
    for q in &params {
        let _ = grads.weighted_sum(q, &ones).unwrap();
    }
    let t2 = std::time::Instant::now();
    println!(
        "per-parameter norms (no Gram sharing) {:.3} s, weighted sums {:.3} s",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64()
    );
    println!(
        "private step breakdown (median of 3): forward without grad {:.3} s, forward + backward to op outputs {:.3} s, norms + clip + clipped sums {:.3} s",
        med(&mut fwd),
        med(&mut fb),
        med(&mut clip)
    );
}

fn num_threads() -> i32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as i32)
        .unwrap_or(1)
}

fn vm_hwm_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in s.lines() {
        if let Some(v) = line.strip_prefix("VmHWM:") {
            return v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
        }
    }
    0
}

fn vm_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in s.lines() {
        if let Some(v) = line.strip_prefix("VmRSS:") {
            return v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
        }
    }
    0
}

/// Child: build, one warm-up forward without grad, then one step of `mode`; prints
/// `base_kib peak_kib` (RSS before the step, peak RSS during it).
fn child(mode: &str) {
    tch::set_num_threads(num_threads());
    let (m, b, g, p) = setup();
    tch::no_grad(|| {
        let _ = m.forward(&b, &mut ForwardCtx::new(false)).unwrap();
    });
    let base = vm_rss_kib();
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    match mode {
        "non_private" => {
            let _ = non_private(&m, &b);
        }
        _ => {
            let _ = private(&m, &b, &g, &p);
        }
    }
    println!("{base} {}", vm_hwm_kib());
}

fn memory_report() {
    let exe = std::env::current_exe().unwrap();
    let mut res = Vec::new();
    for mode in ["non_private", "private"] {
        let out = std::process::Command::new(&exe)
            .env("RAPTOR_MODELS_MEM_CHILD", mode)
            .env("MALLOC_MMAP_THRESHOLD_", "65536")
            .env("MALLOC_TRIM_THRESHOLD_", "0")
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        let v: Vec<u64> = s
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() == 2 {
            res.push((mode, v[0], v[1]));
        }
    }
    for (mode, base, peak) in &res {
        println!(
            "memory {mode}: RSS before step {:.1} MiB, peak {:.1} MiB, step increment {:.1} MiB",
            *base as f64 / 1024.0,
            *peak as f64 / 1024.0,
            (*peak - base.min(peak)) as f64 / 1024.0
        );
    }
    if res.len() == 2 {
        let inc = |i: usize| (res[i].2 - res[i].1.min(res[i].2)) as f64;
        println!(
            "memory ratio private/non-private: peak {:.3}, step increment {:.3}",
            res[1].2 as f64 / res[0].2 as f64,
            inc(1) / inc(0)
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    if let Ok(mode) = std::env::var("RAPTOR_MODELS_MEM_CHILD") {
        child(&mode);
        return;
    }
    memory_report();
    benches();
    Criterion::default().configure_from_args().final_summary();
    ratio_report();
    if std::env::var_os("RAPTOR_MODELS_BREAKDOWN").is_some() {
        breakdown();
    }
}
