//! First libtorch checks: a small forward and backward pass on CPU through tch, with the
//! gradient checked against central finite differences, and the CUDA force-link (see
//! `build-support/link_cuda.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tch::{Device, Kind, Tensor};

/// loss(W, b) = Σ_i log-sum-exp(x_i Wᵀ + b) − (x_i Wᵀ + b)[y_i]: a tiny softmax regression.
fn loss(x: &Tensor, w: &Tensor, b: &Tensor, y: &Tensor) -> Tensor {
    let logits = x.matmul(&w.tr()) + b;
    // (tch's `cross_entropy_for_logits` computes in f32; stay in f64 for the difference check.)
    logits.log_softmax(-1, Kind::Double).nll_loss(y) * (x.size()[0] as f64)
}

#[test]
fn backward_matches_central_finite_differences() {
    let opts = (Kind::Double, Device::Cpu);
    tch::manual_seed(7);
    let x = Tensor::randn([6, 4], opts);
    let y = Tensor::from_slice(&[0i64, 2, 1, 1, 0, 2]);
    let w = Tensor::randn([3, 4], opts).set_requires_grad(true);
    let b = Tensor::randn([3], opts).set_requires_grad(true);

    let l = loss(&x, &w, &b, &y);
    l.backward();
    let gw = w.grad();
    let gb = b.grad();

    let h = 1e-6;
    let w0 = w.detach();
    let b0 = b.detach();
    let mut max_rel = 0.0f64;
    for i in 0..3 {
        for j in 0..4 {
            let e = Tensor::zeros([3, 4], opts);
            let _ = e.get(i).get(j).fill_(h);
            let lp = loss(&x, &(&w0 + &e), &b0, &y).double_value(&[]);
            let lm = loss(&x, &(&w0 - &e), &b0, &y).double_value(&[]);
            let fd = (lp - lm) / (2.0 * h);
            let an = gw.double_value(&[i, j]);
            max_rel = max_rel.max((fd - an).abs() / an.abs().max(1e-3));
        }
        let e = Tensor::zeros([3], opts);
        let _ = e.get(i).fill_(h);
        let lp = loss(&x, &w0, &(&b0 + &e), &y).double_value(&[]);
        let lm = loss(&x, &w0, &(&b0 - &e), &y).double_value(&[]);
        let fd = (lp - lm) / (2.0 * h);
        let an = gb.double_value(&[i]);
        max_rel = max_rel.max((fd - an).abs() / an.abs().max(1e-3));
    }
    assert!(
        max_rel < 1e-6,
        "autograd vs finite differences: max relative error {max_rel}"
    );
    // The gradient is not trivially zero.
    assert!(gw.abs().sum(Kind::Double).double_value(&[]) > 1e-3);
}

/// When the libtorch in use ships `libtorch_cuda.so`, our binaries must have it loaded (the
/// linker's as-needed default would drop it and CUDA would silently be unavailable).
#[test]
fn cuda_library_is_linked_when_libtorch_has_it() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let loaded = maps.contains("libtorch_cuda.so");
    assert_eq!(
        loaded,
        raptor_models::CUDA_LINKED,
        "libtorch_cuda.so loaded = {loaded}, but the build {} force-link it",
        if raptor_models::CUDA_LINKED {
            "meant to"
        } else {
            "did not"
        }
    );
    if raptor_models::CUDA_LINKED && tch::Cuda::is_available() {
        // On a GPU machine the same build runs a kernel on the device.
        let t = Tensor::ones([4], (Kind::Float, Device::Cuda(0)));
        assert_eq!(t.sum(Kind::Float).double_value(&[]), 4.0);
    } else {
        eprintln!(
            "CUDA kernel check skipped: {}",
            if raptor_models::CUDA_LINKED {
                "no CUDA device is visible"
            } else {
                "this build links the CPU-only libtorch"
            }
        );
    }
}
