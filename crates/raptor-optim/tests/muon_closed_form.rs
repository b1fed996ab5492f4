//! The Muon momentum and DP-MuonBC's noise variance of the tensor optimizers against
//! raptor-muon's closed forms, on random inputs: what Newton–Schulz orthogonalizes at step `t`
//! is `Σ_k w_k g_k` with the weights of `raptor_muon::update_weights` (heavy-ball, EMA and
//! Nesterov), its noise variance is `Σ_k w_k² v_k` (`raptor_muon::buffer_noise_variance` for a
//! constant noise level), and a checkpoint taken mid-way resumes the same recursion.
//! Both are read through the optimizers' public `BufferTap`, which keeps exactly what
//! Newton–Schulz (or DP-MuonBC's correction) is given.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use raptor_muon::{MomentumForm, NoiseSpec, NsConfig, buffer_noise_variance, update_weights};
use raptor_optim::{BufferSample, BufferTap, Optim, OptimSettings, Optimizers, ReleaseNoise};
use tch::{Device, Kind, Tensor};

const FORMS: [MomentumForm; 3] = [
    MomentumForm::HeavyBall,
    MomentumForm::Ema,
    MomentumForm::Nesterov,
];

fn settings(form: MomentumForm, beta: f64) -> OptimSettings {
    OptimSettings {
        muon_beta: beta,
        muon_form: form,
        ns: NsConfig::keller(),
        weight_decay: 0.01,
        ..OptimSettings::adamw(0.1)
    }
}

/// Optimizers for one matrix `w` of `kind`, keeping what Newton–Schulz sees at every step.
fn tapped(form: MomentumForm, beta: f64, kind: Optim) -> Optimizers {
    Optimizers::new(settings(form, beta), &[("w".into(), kind)], Some(5))
        .with_tap(BufferTap::new(1, 1))
}

/// One step of `w` along `g` (row-major `rows × cols`) with noise std `std`; what the tap kept.
fn step(
    o: &mut Optimizers,
    w: &mut Tensor,
    g: &[f32],
    (rows, cols): (i64, i64),
    std: f64,
) -> BufferSample {
    let g = Tensor::from_slice(g).reshape([rows, cols]);
    o.step("w", w, &g, 1.0, ReleaseNoise { std }).unwrap();
    let mut kept = o.take_samples();
    assert_eq!(kept.len(), 1);
    kept.remove(0)
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::try_from(t.flatten(0, -1)).unwrap()
}

/// A case: form, β, the kind (Muon or DP-MuonBC), shape, per-step gradients and noise stds
/// (constant or not), and the step after which a checkpoint is taken.
#[allow(clippy::type_complexity)]
fn case() -> impl Strategy<
    Value = (
        MomentumForm,
        f64,
        Optim,
        (i64, i64),
        Vec<(Vec<f32>, f64)>,
        bool,
        usize,
    ),
> {
    (
        (0usize..3).prop_map(|i| FORMS[i]),
        0.0f64..0.99,
        prop_oneof![Just(Optim::Muon), Just(Optim::MuonBc)],
        (1i64..5, 1i64..5),
        1usize..12,
        any::<bool>(),
    )
        .prop_flat_map(|(form, beta, kind, (rows, cols), t, constant)| {
            let n = (rows * cols) as usize;
            let steps = prop::collection::vec(
                (
                    prop::collection::vec(-3.0f32..3.0, n),
                    prop_oneof![Just(0.0f64), 1e-4f64..0.5],
                ),
                t,
            );
            (
                Just(form),
                Just(beta),
                Just(kind),
                Just((rows, cols)),
                steps,
                Just(constant),
                0..t,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn momentum_and_noise_variance_follow_raptor_muons_closed_form(
        (form, beta, kind, shape, mut steps, constant, split) in case()
    ) {
        if constant {
            let std = steps[0].1;
            steps.iter_mut().for_each(|s| s.1 = std);
        }
        let (rows, cols) = shape;
        let n = (rows * cols) as usize;
        let mut o = tapped(form, beta, kind);
        let mut w = Tensor::zeros([rows, cols], (Kind::Float, Device::Cpu));
        let mut samples = Vec::new();
        for t in 1..=steps.len() {
            let s = step(&mut o, &mut w, &steps[t - 1].0, shape, steps[t - 1].1);
            prop_assert_eq!(s.step, t as u64);
            let weights = update_weights(form, beta, t as u64).unwrap();
            let u = values(&s.input);
            for i in 0..n {
                let want: f64 = weights.iter().zip(&steps).map(|(w, (g, _))| w * g[i] as f64).sum();
                let scale: f64 =
                    weights.iter().zip(&steps).map(|(w, (g, _))| (w * g[i] as f64).abs()).sum();
                // f32 tensors (coefficients rounded to f32 too): a few roundings per step.
                let tol = 4.0 * (t as f64 + 2.0) * f32::EPSILON as f64 * (scale + 1e-30);
                prop_assert!(
                    (u[i] as f64 - want).abs() <= tol,
                    "{:?} β {} t {} entry {}: optimizer {} vs closed form {}", form, beta, t, i, u[i], want
                );
            }
            let var: f64 =
                weights.iter().zip(&steps).map(|(w, (_, std))| w * w * std * std).sum();
            let got = s.noise_std * s.noise_std;
            prop_assert!(
                (got - var).abs() <= 1e-12 * var,
                "{:?} β {} t {}: noise variance {} vs closed form {}", form, beta, t, got, var
            );
            if constant && steps[0].1 > 0.0 {
                let spec = NoiseSpec { sigma: steps[0].1, sensitivity: 1.0, denominator: 1.0 };
                let closed = buffer_noise_variance(form, &spec, beta, t as u64).unwrap();
                prop_assert!(
                    (got - closed).abs() <= 1e-12 * closed,
                    "{:?} β {} t {}: {} vs buffer_noise_variance {}", form, beta, t, got, closed
                );
            }
            prop_assert_eq!(s.corrected, kind == Optim::MuonBc && var > 0.0);
            samples.push((values(&s.input), s.noise_std.to_bits()));
        }
        // A checkpoint after `split` steps resumes the same momentum and variance recursion
        // (the scalars keep the Nesterov buffer's variance apart), bit for bit.
        let mut first = tapped(form, beta, kind);
        let mut w1 = Tensor::zeros([rows, cols], (Kind::Float, Device::Cpu));
        for (g, std) in &steps[..split] {
            step(&mut first, &mut w1, g, shape, *std);
        }
        let (tensors, scalars) = first.export().unwrap();
        let mut resumed = tapped(form, beta, kind);
        resumed.import(tensors, &scalars, Device::Cpu).unwrap();
        for (t, (g, std)) in steps.iter().enumerate().skip(split) {
            let s = step(&mut resumed, &mut w1, g, shape, *std);
            prop_assert_eq!(&(values(&s.input), s.noise_std.to_bits()), &samples[t], "step {}", t + 1);
        }
    }
}
