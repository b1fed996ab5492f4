//! Data-parallel training's side of the loop (see [`crate::dist`]): one broadcast of the
//! trainable parameters at the start, one all-reduce of the clipped sums and diagnostics per
//! update.

use std::collections::BTreeMap;

use tch::{Kind, Tensor};

use super::Trainer;
use crate::dist::Collective;
use crate::error::{Result, TrainError};
use crate::streams::{GroupId, Phase};

impl<'a> Trainer<'a> {
    /// Train data-parallel over the ranks of `comm` (see [`crate::dist`]): every rank builds the
    /// same trainer, then calls this, which makes the trainable parameters rank 0's (one
    /// broadcast), so all ranks start from the same point whatever their initialization did.
    pub fn with_collective(mut self, comm: &'a dyn Collective) -> Result<Self> {
        self.comm = comm;
        if comm.size() > 1 {
            // The frozen weights are not broadcast: check that every rank built the same model
            // (a sum and a sum of squares over every variable, compared with rank 0's).
            let (mut sum, mut sq) = (0.0f64, 0.0f64);
            for (name, t) in &self.vars {
                if self.scope.binary_search(name).is_ok() {
                    continue; // broadcast below
                }
                let d = t.f_detach()?.f_to_kind(Kind::Double)?;
                sum += d.f_sum(Kind::Double)?.f_double_value(&[])?;
                sq += d.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?;
            }
            let mut mine = vec![sum.to_bits(), sq.to_bits()];
            comm.broadcast_u64(&mut mine)?;
            let (s0, q0) = (f64::from_bits(mine[0]), f64::from_bits(mine[1]));
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
            if !(close(s0, sum) && close(q0, sq)) {
                return Err(TrainError::Run(format!(
                    "rank {} built a different model than rank 0 (parameter sums {sum} vs {s0}): every rank must load the same weights with the same config",
                    comm.rank()
                )));
            }
            let vars: Vec<Tensor> = self
                .scope
                .iter()
                .map(|n| self.vars[n].shallow_clone())
                .collect();
            let mut buf = flatten(&vars)?;
            comm.broadcast_f32(&mut buf)?;
            let synced = unflatten(&buf, &vars)?;
            tch::no_grad(|| -> Result<()> {
                for (mut v, s) in vars.into_iter().zip(synced) {
                    v.f_copy_(&s)?;
                }
                Ok(())
            })?;
        }
        Ok(self)
    }

    /// Sum this rank's clipped sums and diagnostics with the other ranks' (one all-reduce of
    /// every released parameter's sum in one buffer, one of the diagnostics).
    pub(super) fn all_reduce_sums(
        &self,
        phase: &Phase,
        sums: &mut BTreeMap<String, Tensor>,
        loss_sum: &mut f64,
        clipped: &mut BTreeMap<GroupId, f64>,
        owned: &mut BTreeMap<(usize, i64), usize>,
    ) -> Result<()> {
        let mut names: Vec<String> = Vec::new();
        for r in &phase.releases {
            for gname in &r.groups {
                if let Some(g) = phase.group(gname) {
                    names.extend(g.params.iter().cloned());
                }
            }
        }
        let mut local = Vec::with_capacity(names.len());
        for p in &names {
            local.push(match sums.remove(p) {
                Some(s) => s,
                None => self.vars[p].f_zeros_like()?.f_detach()?,
            });
        }
        let mut buf = flatten(&local)?;
        self.comm.all_reduce_sum_f32(&mut buf)?;
        for (p, t) in names.into_iter().zip(unflatten(&buf, &local)?) {
            sums.insert(p, t);
        }
        // Diagnostics: loss sum, clip counts per group, owner counts per (layer, expert).
        let experts = self.model.num_experts().max(1);
        let mut diag = vec![*loss_sum];
        diag.extend(
            phase
                .groups
                .iter()
                .map(|g| clipped.get(&g.name).copied().unwrap_or(0.0)),
        );
        for &l in &phase.owner_layers {
            diag.extend((0..experts).map(|e| owned.get(&(l, e)).copied().unwrap_or(0) as f64));
        }
        self.comm.all_reduce_sum_f64(&mut diag)?;
        *loss_sum = diag[0];
        let mut at = 1;
        for g in &phase.groups {
            clipped.insert(g.name.clone(), diag[at]);
            at += 1;
        }
        owned.clear();
        for &l in &phase.owner_layers {
            for e in 0..experts {
                let n = diag[at].round() as usize;
                if n > 0 {
                    owned.insert((l, e), n);
                }
                at += 1;
            }
        }
        Ok(())
    }
}

/// Flatten tensors (any float kind, any device) into one `f32` buffer, in order.
pub(super) fn flatten(tensors: &[tch::Tensor]) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(tensors.iter().map(|t| t.numel()).sum());
    for t in tensors {
        let c = t
            .f_detach()?
            .f_to_kind(tch::Kind::Float)?
            .f_to(tch::Device::Cpu)?
            .f_contiguous()?
            .f_view([-1])?;
        let v: Vec<f32> = Vec::<f32>::try_from(&c).map_err(TrainError::Torch)?;
        out.extend_from_slice(&v);
    }
    Ok(out)
}

/// The inverse of [`flatten`]: tensors shaped, typed and placed like `like`.
pub(super) fn unflatten(buf: &[f32], like: &[tch::Tensor]) -> Result<Vec<tch::Tensor>> {
    let need: usize = like.iter().map(|t| t.numel()).sum();
    if need != buf.len() {
        return Err(TrainError::Run(format!(
            "a collective buffer has {} values for tensors of {need}: the ranks disagree on the parameters",
            buf.len()
        )));
    }
    let mut out = Vec::with_capacity(like.len());
    let mut at = 0usize;
    for t in like {
        let n = t.numel();
        let v = tch::Tensor::f_from_slice(&buf[at..at + n])?
            .f_view(t.size().as_slice())?
            .f_to_kind(t.kind())?
            .f_to(t.device())?;
        out.push(v);
        at += n;
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn flatten_unflatten_round_trips_shapes_and_kinds() {
        let a = tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).view([2, 3]);
        let b = tch::Tensor::from_slice(&[7.0f64, 8.0]);
        let flat = flatten(&[a.shallow_clone(), b.shallow_clone()]).unwrap();
        assert_eq!(flat, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let back = unflatten(&flat, &[a.shallow_clone(), b.shallow_clone()]).unwrap();
        assert_eq!(back[0].size(), vec![2, 3]);
        assert_eq!(back[1].kind(), tch::Kind::Double);
        assert!(back[0].equal(&a) && back[1].equal(&b));
        // A buffer of the wrong length is an error naming the disagreement, not a panic.
        let err = unflatten(&flat[..7], &[a, b]).unwrap_err().to_string();
        assert!(err.contains("ranks disagree"), "{err}");
    }
}
