//! Quick timing of the pure-Rust NS5 (no libtorch): `cargo run --release -p raptor-muon --example ns_speed`.
use std::time::Instant;

use raptor_muon::diagnostics::gaussian_matrix;
use raptor_muon::{NsConfig, NsWorkspace, newton_schulz_with};

fn main() -> Result<(), raptor_muon::MuonError> {
    let cfg = NsConfig::keller();
    for (r, c) in [(256usize, 256usize), (768, 768), (768, 3072), (1024, 4096)] {
        let m = gaussian_matrix(r, c, 1.0, 1);
        let mut ws = NsWorkspace::new(r, c);
        newton_schulz_with(m.as_ref(), &cfg, &mut ws)?;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            newton_schulz_with(m.as_ref(), &cfg, &mut ws)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        let (ours, full) = cfg.flops(r, c);
        println!(
            "{r}x{c}: {:.2} ms, {:.1} GFLOP/s executed, {:.1} GFLOP/s libtorch-equivalent",
            best * 1e3,
            ours / best / 1e9,
            full / best / 1e9
        );
    }
    Ok(())
}
