//! Wall-clock timing of owner maps on the benchmark shape without criterion or libtorch:
//! 100k records × 128 tokens × top-2 × E = 8 (all valid). `cargo run --release -p
//! raptor-routing --example owner_timing` (set `RAYON_NUM_THREADS=1` for one core). The criterion
//! bench with the libtorch comparison is `cargo bench -p raptor-benches --bench routing`.

use std::time::Instant;

use raptor_routing::synth::{SynthSpec, generate, zipf_profile};
use raptor_routing::{LayerRouting, OwnerRule, RoutingError, WeightPrecision, owner_map};

/// User + system CPU time of this process in seconds (Linux `/proc/self/stat`, 100 Hz ticks);
/// 0 elsewhere.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn main() -> Result<(), RoutingError> {
    let spec = SynthSpec {
        num_records: 100_000,
        seq_len: 128,
        min_valid: 128,
        num_experts: 8,
        top_k: 2,
        topic_strength: 0.4,
        profiles: vec![zipf_profile(8, 0.5)],
        seed: 7,
    };
    let t = Instant::now();
    let layer = generate(&spec)?.remove(0);
    println!(
        "generate: {:.2} s, {} MB",
        t.elapsed().as_secs_f64(),
        layer.heap_bytes() >> 20
    );
    let mut f16 = LayerRouting::with_precision(8, 2, WeightPrecision::F16)?;
    f16.append(&layer)?;
    let threads = rayon::current_num_threads();
    for (name, l, rule) in [
        ("gate-weighted f32", &layer, OwnerRule::GateWeighted),
        ("token-count f32", &layer, OwnerRule::TokenCount),
        ("gate-weighted f16", &f16, OwnerRule::GateWeighted),
    ] {
        let _ = owner_map(l, rule); // warm-up
        let mut best = f64::INFINITY;
        let mut total = 0.0;
        let reps = 10;
        let cpu0 = cpu_seconds();
        for _ in 0..reps {
            let t = Instant::now();
            std::hint::black_box(owner_map(l, rule));
            let s = t.elapsed().as_secs_f64();
            best = best.min(s);
            total += s;
        }
        let cpu = (cpu_seconds() - cpu0) / reps as f64;
        println!(
            "{name}: wall mean {:.1} ms, best {:.1} ms; CPU {:.1} ms per map ({threads} threads, {} MB)",
            total / reps as f64 * 1e3,
            best * 1e3,
            cpu * 1e3,
            l.heap_bytes() >> 20
        );
    }
    Ok(())
}
