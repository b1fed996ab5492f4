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

/// The batched libtorch iteration equals the one-matrix one, matrix by matrix (each normalized
/// by its own norm: matrices of very different scales in one batch), for wide, tall and square
/// shapes and both polynomial families; and the pure-Rust reference agrees with both.
#[test]
fn batch_equals_one_by_one() {
    use raptor_muon::tch_backend::newton_schulz_tch_batch;
    let mut r = rng(31);
    for &(rows, cols) in &[(8usize, 8usize), (12, 40), (40, 12), (1, 5)] {
        for cfg in [NsConfig::keller(), NsConfig::taylor(2, 5)] {
            for dev in devices() {
                let mats: Vec<(Vec<f32>, Tensor)> = [0.01f32, 1.0, 30.0]
                    .iter()
                    .map(|&scale| {
                        let m = gaussian(&mut r, rows, cols, scale);
                        let v: Vec<f32> =
                            (0..rows * cols).map(|k| m[(k / cols, k % cols)]).collect();
                        let t = tensor_from_slice(&v, rows, cols, dev).unwrap();
                        (v, t)
                    })
                    .collect();
                let refs: Vec<&Tensor> = mats.iter().map(|m| &m.1).collect();
                let batch = newton_schulz_tch_batch(&refs, &cfg, TchPrecision::F32).unwrap();
                assert_eq!(batch.len(), 3);
                for ((v, t), b) in mats.iter().zip(&batch) {
                    assert_eq!(b.size(), vec![rows as i64, cols as i64]);
                    let one =
                        tensor_to_vec(&newton_schulz_tch(t, &cfg, TchPrecision::F32).unwrap())
                            .unwrap();
                    let got = tensor_to_vec(b).unwrap();
                    let want = newton_schulz_slice(v, rows, cols, &cfg).unwrap();
                    let norm = want.iter().map(|x| x * x).sum::<f32>().sqrt().max(1.0);
                    let d_one = got
                        .iter()
                        .zip(&one)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    let d_ref = got
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    let tol = if dev == Device::Cpu { 1e-5 } else { 1e-2 };
                    assert!(
                        d_one <= tol * norm,
                        "{rows}x{cols} {cfg:?} {dev:?}: batch vs one {d_one}"
                    );
                    assert!(
                        d_ref
                            <= 2e-4 * norm.max(1.0) * if dev == Device::Cpu { 1.0 } else { 100.0 },
                        "{rows}x{cols} {cfg:?} {dev:?}: batch vs faer {d_ref}"
                    );
                }
            }
        }
    }
}

#[test]
fn batch_rejects_mixed_and_bad_inputs() {
    use raptor_muon::tch_backend::newton_schulz_tch_batch;
    let cfg = NsConfig::keller();
    assert!(
        newton_schulz_tch_batch(&[], &cfg, TchPrecision::F32)
            .unwrap()
            .is_empty()
    );
    let a = Tensor::randn([4, 6], (Kind::Float, Device::Cpu));
    let b = Tensor::randn([6, 4], (Kind::Float, Device::Cpu));
    assert!(matches!(
        newton_schulz_tch_batch(&[&a, &b], &cfg, TchPrecision::F32),
        Err(MuonError::BadTensor { .. })
    ));
    let d = Tensor::randn([4, 6], (Kind::Double, Device::Cpu));
    assert!(matches!(
        newton_schulz_tch_batch(&[&a, &d], &cfg, TchPrecision::F32),
        Err(MuonError::BadTensor { .. })
    ));
    let nan = tensor_from_slice(&[0.0, 1.0, f32::INFINITY, 0.0], 2, 2, Device::Cpu).unwrap();
    let ok = Tensor::eye(2, (Kind::Float, Device::Cpu));
    assert!(matches!(
        newton_schulz_tch_batch(&[&ok, &nan], &cfg, TchPrecision::F32),
        Err(MuonError::NonFinite { index: 2, .. })
    ));
}
