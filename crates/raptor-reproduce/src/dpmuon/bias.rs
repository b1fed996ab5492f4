//! Newton–Schulz's noise bias on the buffers a real DP-Muon run releases.
//!
//! A tapped run keeps, at every few updates, what Newton–Schulz orthogonalized for its first
//! matrices: the released buffer `M̃` (momentum of noised gradients, post-processing of the
//! release) and its per-entry noise std `s` (the running variance DP-MuonBC uses; public, from
//! σ, the clip bound, the denominator and β). For each kept `M̃` this module draws
//! `Z ~ N(0, s² I)` many times and estimates, with the crate's Monte Carlo
//! ([`raptor_muon::diagnostics::bias_monte_carlo`], debiased norms and standard errors):
//!
//! - `‖E_Z[f(M̃ + Z)] − f(M̃)‖_F`: the bias of plain DP-Muon's direction, and
//! - `‖E_Z[O_BC(M̃ + Z)] − f(M̃)‖_F`: the bias left after DP-MuonBC's correction,
//!
//! both divided by `‖f(M̃)‖_F`. This is the bias *at the released point* `M̃` under the release's
//! own noise model, which is post-processing and costs no privacy. It is not the bias at the
//! un-noised buffer `M` (that would need the clipped sums, a computation on private data); the
//! two differ by how much the bias changes over one noise radius. The same buffers are also
//! measured at `s` scaled by 1/16, 1/4 and 4 (the last update of the DP-Muon run), to show where
//! the correction starts to matter.

use std::path::Path;

use raptor_muon::diagnostics::bias_monte_carlo;
use raptor_muon::faer::Mat;
use raptor_muon::{BcConfig, NsConfig, newton_schulz};
use raptor_run::BufferSampleInfo;
use raptor_train::config::RunConfig;
use serde::{Deserialize, Serialize};

/// One bias estimate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BiasRow {
    /// Task.
    pub task: String,
    /// Run label.
    pub run: String,
    /// Update after which the buffer was kept.
    pub update: u64,
    /// Matrix name.
    pub matrix: String,
    /// rows × cols.
    pub shape: (usize, usize),
    /// The run's per-entry noise std of the buffer.
    pub noise_std: f64,
    /// Factor applied to it here (1: the run's own).
    pub multiplier: f64,
    /// `(s·multiplier)² · rows · cols / ‖M̃‖_F²`: the share of the buffer's energy the noise
    /// accounts for (at multiplier 1 ≈ 1 means the buffer is mostly noise).
    pub noise_share: f64,
    /// `‖E f(M̃+Z) − f(M̃)‖_F / ‖f(M̃)‖_F`.
    pub plain: f64,
    /// Its Monte Carlo standard error (same scale).
    pub plain_se: f64,
    /// `‖E O_BC(M̃+Z) − f(M̃)‖_F / ‖f(M̃)‖_F`.
    pub corrected: f64,
    /// Its Monte Carlo standard error.
    pub corrected_se: f64,
    /// z of the paired difference of the squared biases (positive: the correction helps).
    pub z: f64,
    /// Noise draws.
    pub draws: usize,
}

/// The Newton–Schulz map a run used (as `raptor train` builds it from the config; Muon's
/// defaults for a method without Muon).
pub fn ns_of(cfg: &RunConfig) -> NsConfig {
    cfg.method.muon().copied().unwrap_or_default().ns_config()
}

/// Measures the kept buffers of the run in `dir` (nothing when it kept none) and writes the
/// rows to `<dir>/diagnostics/bias.json`; reuses that file when present.
pub fn measure(
    task: &str,
    label: &str,
    cfg: &RunConfig,
    dir: &Path,
    draws: usize,
) -> anyhow::Result<Vec<BiasRow>> {
    let diag = dir.join("diagnostics");
    let cached = diag.join("bias.json");
    if let Ok(bytes) = std::fs::read(&cached)
        && let Ok(rows) = serde_json::from_slice::<Vec<BiasRow>>(&bytes)
        && rows.iter().all(|r| r.draws == draws)
    {
        return Ok(rows);
    }
    let Ok(entries) = std::fs::read_dir(&diag) else {
        return Ok(Vec::new());
    };
    let mut files: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("buffers-") && n.ends_with(".json"))
        })
        .collect();
    files.sort();
    let ns = ns_of(cfg);
    let bc = BcConfig {
        probe_pairs: cfg
            .method
            .bias_correction()
            .copied()
            .unwrap_or_default()
            .bc_probe_pairs
            .max(1),
        ..BcConfig::default()
    };
    let sweep_last = cfg.method.name() == raptor_train::config::Method::DpMuon;
    let mut rows = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        let info: Vec<BufferSampleInfo> = serde_json::from_slice(&std::fs::read(f)?)?;
        let update: u64 = f
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.strip_prefix("buffers-"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let tensors = tch::Tensor::read_safetensors(f.with_extension("safetensors"))?;
        let last = fi + 1 == files.len();
        for (k, i) in info.iter().enumerate() {
            let Some((_, t)) = tensors.iter().find(|(n, _)| n == &i.name) else {
                continue;
            };
            let size = t.size();
            let [r, c] = size.as_slice() else { continue };
            let (r, c) = (*r as usize, *c as usize);
            let v: Vec<f32> = Vec::try_from(t.f_to_kind(tch::Kind::Float)?.f_flatten(0, -1)?)?;
            // Row-major r × c is the column-major c × r transpose; NS commutes with transposition.
            let m = Mat::<f32>::from_fn(c, r, |a, b| v[b * c + a]);
            let energy: f64 = v.iter().map(|x| f64::from(*x).powi(2)).sum();
            let f0 = newton_schulz(m.as_ref(), &ns)?;
            let mut f2 = 0.0f64;
            for col in 0..f0.ncols() {
                f2 += f0
                    .col_as_slice(col)
                    .iter()
                    .map(|x| f64::from(*x).powi(2))
                    .sum::<f64>();
            }
            let fnorm = f2.sqrt().max(1e-300);
            let mults: &[f64] = if last && sweep_last {
                &[0.0625, 0.25, 1.0, 4.0]
            } else {
                &[1.0]
            };
            for (j, &mult) in mults.iter().enumerate() {
                let s = i.noise_std * mult;
                if s.is_nan() || s <= 0.0 {
                    continue;
                }
                let seed = 0xb1a5 + 1000 * update + 10 * k as u64 + j as u64;
                let b = bias_monte_carlo(m.as_ref(), s, &ns, &bc, draws.max(2), seed)?;
                rows.push(BiasRow {
                    task: task.into(),
                    run: label.into(),
                    update,
                    matrix: i.name.clone(),
                    shape: (r, c),
                    noise_std: i.noise_std,
                    multiplier: mult,
                    noise_share: s * s * (r * c) as f64 / energy.max(1e-300),
                    plain: b.plain / fnorm,
                    plain_se: b.plain_se / fnorm,
                    corrected: b.corrected / fnorm,
                    corrected_se: b.corrected_se / fnorm,
                    z: b.diff_sq / b.diff_sq_se.max(1e-300),
                    draws: b.draws,
                });
            }
        }
    }
    if !rows.is_empty() {
        raptor_run::write_atomic(&cached, &serde_json::to_vec_pretty(&rows)?)?;
    }
    Ok(rows)
}
