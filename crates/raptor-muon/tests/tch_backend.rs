//! The libtorch backend agrees with the pure-Rust one (CPU, and CUDA when present; f32 tightly,
//! bf16 loosely) and reports bad tensors as typed errors.
#![cfg(feature = "tch")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use raptor_muon::tch_backend::{TchPrecision, newton_schulz_tch, tensor_from_slice, tensor_to_vec};
use raptor_muon::{MuonError, NsConfig, newton_schulz_slice};
use tch::{Device, Kind, Tensor};

fn devices() -> Vec<Device> {
    let mut d = vec![Device::Cpu];
    if tch::Cuda::is_available() {
        d.push(Device::Cuda(0));
    } else {
        eprintln!("CUDA cases skipped: no CUDA device visible to libtorch (CPU cases run)");
    }
    d
}

#[test]
fn backends_agree() {
    let mut r = rng(30);
    for &(rows, cols) in &[(1usize, 1usize), (5, 5), (7, 19), (40, 12), (64, 96)] {
        let m = gaussian(&mut r, rows, cols, 0.7);
        let v: Vec<f32> = (0..rows * cols).map(|k| m[(k / cols, k % cols)]).collect();
        for cfg in [
            NsConfig::keller(),
            NsConfig::taylor(1, 6),
            NsConfig::taylor(2, 5),
            NsConfig::taylor(4, 3),
        ] {
            let want = newton_schulz_slice(&v, rows, cols, &cfg).unwrap();
            let norm = want.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            for dev in devices() {
                let t = tensor_from_slice(&v, rows, cols, dev).unwrap();
                let got = tensor_to_vec(&newton_schulz_tch(&t, &cfg, TchPrecision::F32).unwrap())
                    .unwrap();
                let maxd = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                // CUDA may use TF32 matmuls; allow a looser bound there.
                let tol = if dev == Device::Cpu { 2e-4 } else { 2e-2 };
                assert!(
                    maxd < tol * norm.max(1.0),
                    "{rows}x{cols} {cfg:?} {dev:?}: max diff {maxd}"
                );
                let bf = tensor_to_vec(&newton_schulz_tch(&t, &cfg, TchPrecision::Bf16).unwrap())
                    .unwrap();
                let rel = bf
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).powi(2))
                    .sum::<f32>()
                    .sqrt()
                    / norm;
                assert!(
                    rel < 0.1,
                    "{rows}x{cols} {cfg:?} {dev:?} bf16: rel err {rel}"
                );
            }
        }
    }
}

#[test]
fn output_keeps_kind_and_shape() {
    let t = Tensor::randn([6, 3], (Kind::Float, Device::Cpu));
    let o = newton_schulz_tch(&t, &NsConfig::keller(), TchPrecision::Bf16).unwrap();
    assert_eq!(o.size(), vec![6, 3]);
    assert_eq!(o.kind(), Kind::Float);
}

#[test]
fn bad_tensors_are_typed_errors() {
    let cfg = NsConfig::keller();
    let one_d = Tensor::zeros([4], (Kind::Float, Device::Cpu));
    assert!(matches!(
        newton_schulz_tch(&one_d, &cfg, TchPrecision::F32),
        Err(MuonError::BadTensor { .. })
    ));
    let ints = Tensor::zeros([2, 2], (Kind::Int64, Device::Cpu));
    assert!(matches!(
        newton_schulz_tch(&ints, &cfg, TchPrecision::F32),
        Err(MuonError::BadTensor { .. })
    ));
    let empty = Tensor::zeros([0, 3], (Kind::Float, Device::Cpu));
    assert!(matches!(
        newton_schulz_tch(&empty, &cfg, TchPrecision::F32),
        Err(MuonError::EmptyMatrix { rows: 0, cols: 3 })
    ));
    let nan = tensor_from_slice(&[1.0, f32::NAN, 0.0, 1.0], 2, 2, Device::Cpu).unwrap();
    assert!(matches!(
        newton_schulz_tch(&nan, &cfg, TchPrecision::F32),
        Err(MuonError::NonFinite { index: 1, .. })
    ));
    let ok = Tensor::eye(2, (Kind::Float, Device::Cpu));
    assert!(matches!(
        newton_schulz_tch(&ok, &NsConfig::taylor(0, 2), TchPrecision::F32),
        Err(MuonError::InvalidHyperParameter { .. })
    ));
}
