//! Quick timing of the pure-Rust NS5 (no libtorch), every schedule interleaved, and the
//! planner's choice: `cargo run --release -p raptor-muon --example ns_speed [SHAPE...]`
//! (shapes as `256x256`; default the four bench shapes). Min wall of 5 calls per schedule.
use std::time::Instant;

use raptor_muon::diagnostics::gaussian_matrix;
use raptor_muon::{
    NsConfig, NsProducts, NsSchedule, NsWorkspace, newton_schulz_with, planned_ns_schedule,
    with_ns_schedule,
};

fn main() -> Result<(), raptor_muon::MuonError> {
    let cfg = NsConfig::keller();
    let mut shapes: Vec<(usize, usize)> = std::env::args()
        .skip(1)
        .filter_map(|a| {
            let (r, c) = a.split_once('x')?;
            Some((r.parse().ok()?, c.parse().ok()?))
        })
        .collect();
    if shapes.is_empty() {
        shapes = vec![(256, 256), (768, 768), (768, 3072), (1024, 4096)];
    }
    let mut scheds: Vec<NsSchedule> = [NsProducts::Symmetric, NsProducts::Full, NsProducts::Gram]
        .into_iter()
        .flat_map(|products| [true, false].map(|parallel| NsSchedule { products, parallel }))
        .collect();
    scheds.push(NsSchedule {
        products: NsProducts::Team,
        parallel: true,
    });
    for (r, c) in shapes {
        let m = gaussian_matrix(r, c, 1.0, 1);
        let mut ws = NsWorkspace::new(r, c);
        newton_schulz_with(m.as_ref(), &cfg, &mut ws)?; // plans
        let mut best = vec![f64::INFINITY; scheds.len()];
        for _ in 0..5 {
            for (k, s) in scheds.iter().enumerate() {
                let t = Instant::now();
                with_ns_schedule(*s, || newton_schulz_with(m.as_ref(), &cfg, &mut ws))?;
                best[k] = best[k].min(t.elapsed().as_secs_f64());
            }
        }
        let (ours, full) = cfg.flops(r, c);
        let planned = planned_ns_schedule(r, c, &cfg).map_or("-".into(), |s| s.to_string());
        let cells: Vec<String> = scheds
            .iter()
            .zip(&best)
            .map(|(s, t)| format!("{s} {:.2} ms", t * 1e3))
            .collect();
        let b = best.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "{r}x{c}: planned {planned}; {}; best {:.1} GFLOP/s executed (sym), {:.1} libtorch-equivalent",
            cells.join(", "),
            ours / b / 1e9,
            full / b / 1e9
        );
    }
    Ok(())
}
