//! Clipping bounds from public data, privacy-free (`train.clip_from_public = q`).
//!
//! A clip bound that is too small throws the signal away; one that is too large buys noise
//! (σ·C per coordinate). Choosing it from private gradients would cost privacy, so raptor
//! chooses it from **public** records: with the initial model (the scope set, nothing trained
//! yet), each public record's per-sample gradient norm in every clip group of every private
//! phase, and each group's bound is the q-quantile of the norms of the records that reach it
//! (an expert group: the public records its expert owns, by the same frozen-router owner rule as
//! the private data). Residual weights are left out (w = 1): weighted norms are no larger.
//! Under global clipping the phase's one bound is the quantile of the records' total norms.
//!
//! Nothing here reads a private record: the bounds are public, decided before training, and
//! recorded in the run's privacy plan.

use std::collections::BTreeMap;

use raptor_models::{ClippedStep, Model};
use tch::{Device, Kind, Tensor};

use crate::error::{Result, RunError};
use raptor_train::streams::{GroupId, Plan};
use raptor_train::trainer::{Example, make_batch};

/// Public records per forward pass.
const CHUNK: usize = 32;

pub use raptor_train::methods::PublicClip;

/// The q-quantile (nearest rank, q ∈ (0, 1)) of `values` (at least one).
pub fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1])
}

/// Sets the clip bound of every group of every private phase of `plan` to the `q`-quantile of
/// the per-sample gradient norms of the `public` records (labelled, tokenized like the private
/// ones) under the model as it is now. `owners`: per sparse layer, each public record's owner
/// expert. A group that no public record reaches keeps its configured bound (noted in the
/// result with 0 records).
pub fn calibrate(
    model: &dyn Model,
    plan: &mut Plan,
    public: &[Example],
    owners: &BTreeMap<usize, Vec<i64>>,
    q: f64,
    pad_id: i64,
    device: Device,
) -> Result<PublicClip> {
    if !(q.is_finite() && q > 0.0 && q < 1.0) {
        return Err(RunError::Config(format!(
            "train.clip_from_public: quantile {q} is outside (0, 1)"
        )));
    }
    if public.is_empty() {
        return Err(RunError::Config(
            "train.clip_from_public: the public file has no record".into(),
        ));
    }
    let task = model.task();
    let mut out = PublicClip {
        quantile: q,
        records: public.len(),
        bounds: Vec::new(),
    };
    for phase in plan.phases.iter_mut().filter(|p| p.private) {
        // Per group, each record's squared norm (records in order).
        let mut sq: BTreeMap<GroupId, Vec<f64>> = BTreeMap::new();
        for (ci, chunk) in public.chunks(CHUNK).enumerate() {
            let refs: Vec<&Example> = chunk.iter().collect();
            let batch = make_batch(&refs, task, pad_id, device)?;
            let first = ci * CHUNK;
            let mut own = BTreeMap::new();
            for &l in &phase.owner_layers {
                let o = owners.get(&l).ok_or_else(|| {
                    RunError::Config(format!("no public owner map for layer {l}"))
                })?;
                let part: Vec<i64> = o[first..first + chunk.len()].to_vec();
                own.insert(l, Tensor::f_from_slice(&part)?.f_to(device)?);
            }
            let (_, grads) = ClippedStep::new(model)?.per_sample(&batch, &own, false)?;
            let reached = grads.params();
            for g in &phase.groups {
                let mut total = Tensor::f_zeros([chunk.len() as i64], (Kind::Double, device))?;
                for p in g.params.iter().filter(|p| reached.contains(p)) {
                    total = total.f_add(&grads.sq_norms(p)?.f_to_kind(Kind::Double)?)?;
                }
                let v: Vec<f64> = Vec::try_from(total.f_to(Device::Cpu)?)?;
                sq.entry(g.name.clone()).or_default().extend(v);
            }
        }
        if let Some(c) = phase.global_clip {
            // One factor over every group: the quantile of the records' total norms.
            let n = public.len();
            let mut totals: Vec<f64> = (0..n)
                .map(|i| sq.values().map(|v| v[i]).sum::<f64>().sqrt())
                .filter(|x| *x > 0.0 && x.is_finite())
                .collect();
            let bound = quantile(&mut totals, q).unwrap_or(c);
            phase.global_clip = Some(bound);
            out.bounds
                .push((phase.name, "global".into(), bound, totals.len()));
            continue;
        }
        for g in &mut phase.groups {
            let mut norms: Vec<f64> = sq
                .get(&g.name)
                .map(|v| {
                    v.iter()
                        .map(|x| x.sqrt())
                        .filter(|x| *x > 0.0 && x.is_finite())
                        .collect()
                })
                .unwrap_or_default();
            let reached = norms.len();
            if let Some(b) = quantile(&mut norms, q) {
                g.bound = b;
            }
            out.bounds
                .push((phase.name, g.name.to_string(), g.bound, reached));
        }
    }
    plan.check().map_err(raptor_train::TrainError::from)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quantile_is_the_nearest_rank() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(quantile(&mut v, 0.5), Some(3.0));
        assert_eq!(quantile(&mut v, 0.01), Some(1.0));
        assert_eq!(quantile(&mut v, 0.99), Some(5.0));
        assert_eq!(quantile(&mut [], 0.5), None);
    }

    proptest! {
        /// At least a q share of the values is ≤ the q-quantile, and fewer than that are below it.
        #[test]
        fn quantile_splits_the_values(mut v in prop::collection::vec(0.0f64..10.0, 1..50), q in 0.01f64..0.99) {
            let n = v.len() as f64;
            let x = quantile(&mut v, q).unwrap();
            let at_or_below = v.iter().filter(|&&y| y <= x).count() as f64;
            let below = v.iter().filter(|&&y| y < x).count() as f64;
            prop_assert!(at_or_below >= q * n - 1e-9);
            prop_assert!(below < q * n + 1e-9);
        }
    }
}
