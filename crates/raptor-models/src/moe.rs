//! Token routing to experts: router outputs per sparse layer and the dispatch loop.

use crate::error::{ModelError, Result};
pub use crate::layers::RouterOutput;
use crate::layers::{ForwardCtx, RowSpec};
use std::collections::BTreeMap;
use tch::{Kind, Tensor};

/// Runs `expert(e, x_e, rows, owner_mask, ctx)` on the tokens routed to each expert and sums
/// the gate-weighted outputs. `x` `[B, T, d]`, `sel`/`gate` `[B, T, k]`, `keep` optional
/// `[B, T, k]` bool (capacity), `owners` optional `[B]` i64.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dispatch<F>(
    x: &Tensor,
    sel: &Tensor,
    gate: &Tensor,
    keep: Option<&Tensor>,
    num_experts: i64,
    owners: Option<&Tensor>,
    ctx: &mut ForwardCtx,
    mut expert: F,
) -> Result<Tensor>
where
    F: FnMut(usize, &Tensor, RowSpec<'_>, Option<&Tensor>, &mut ForwardCtx) -> Result<Tensor>,
{
    let size = x.size();
    let (b, t, d) = (size[0], size[1], size[2]);
    let k = sel.size().last().copied().unwrap_or(1);
    let n = b * t;
    let xf = x.f_reshape([n, d])?;
    let self_flat = sel.f_reshape([n, k])?;
    let gate_flat = gate.f_reshape([n, k])?;
    let keep_flat = match keep {
        Some(kp) => Some(kp.f_reshape([n, k])?),
        None => None,
    };
    let mut out = xf.f_zeros_like()?;
    for e in 0..num_experts {
        let mut hit = self_flat.f_eq(e)?;
        if let Some(kp) = &keep_flat {
            hit = hit.f_logical_and(kp)?;
        }
        let any = hit.f_any_dim(1, false)?;
        let idx = any.f_nonzero()?.f_reshape([-1])?;
        let ne = idx.size()[0];
        if ne == 0 {
            continue;
        }
        let xe = xf.f_index_select(0, &idx)?;
        let ge = gate_flat
            .f_mul(&hit.f_to_kind(gate_flat.kind())?)?
            .f_sum_dim_intlist(1, false, None::<Kind>)?
            .f_index_select(0, &idx)?
            .f_unsqueeze(1)?;
        let rec = idx.f_floor_divide_scalar(t)?;
        let mask = match owners {
            Some(o) => Some(
                o.f_index_select(0, &rec)?
                    .f_eq(e)?
                    .f_to_kind(x.kind())?
                    .f_unsqueeze(1)?,
            ),
            None => None,
        };
        let ye = expert(e as usize, &xe, RowSpec::Routed(&rec), mask.as_ref(), ctx)?;
        out = out.f_index_add(0, &idx, &ye.f_mul(&ge)?)?;
    }
    Ok(out.f_reshape([b, t, d])?)
}

/// A sparse layer's bookkeeping after its router: pushes the [`RouterOutput`] when the context
/// collects routing (gate weights detached), and returns the layer's owner map `[B]` from the
/// context, checked against the batch size `b` and `num_experts`, if one is set.
pub(crate) fn routing_and_owners(
    ctx: &mut ForwardCtx,
    layer: usize,
    sel: &Tensor,
    gate: &Tensor,
    mask: &Tensor,
    b: i64,
    num_experts: i64,
) -> Result<Option<Tensor>> {
    if ctx.collect_routing {
        ctx.routing.push(RouterOutput {
            layer,
            indices: sel.shallow_clone(),
            weights: gate.f_detach()?,
            mask: mask.shallow_clone(),
        });
    }
    let owners = ctx.owners.get(&layer).map(Tensor::shallow_clone);
    if let Some(o) = &owners {
        check_owners(layer, o, b, num_experts)?;
    }
    Ok(owners)
}

/// Checks an owner map `[B]` against the batch and the number of experts.
pub(crate) fn check_owners(layer: usize, owners: &Tensor, b: i64, num_experts: i64) -> Result<()> {
    if owners.size() != [b] {
        return Err(ModelError::InvalidOwners {
            layer,
            why: format!("shape {:?}, expected [{b}]", owners.size()),
        });
    }
    if owners.kind() != Kind::Int64 {
        return Err(ModelError::InvalidOwners {
            layer,
            why: format!("kind {:?}, expected Int64", owners.kind()),
        });
    }
    let v: Vec<i64> = Vec::try_from(owners.f_to(tch::Device::Cpu)?)?;
    if let Some((r, &e)) = v
        .iter()
        .enumerate()
        .find(|(_, e)| **e < 0 || **e >= num_experts)
    {
        return Err(ModelError::InvalidOwners {
            layer,
            why: format!("record {r} owned by expert {e}, outside [0, {num_experts})"),
        });
    }
    Ok(())
}

impl RouterOutput {
    /// Appends this batch's router decisions to a `raptor_routing::LayerRouting` (created with
    /// the model's number of experts and top-k).
    pub fn push_into(&self, layer: &mut raptor_routing::LayerRouting) -> Result<()> {
        let w = self.weights.f_to_kind(Kind::Float)?;
        layer
            .push_tensors(&self.indices, &w, &self.mask)
            .map_err(|e| ModelError::Routing(e.to_string()))
    }
}

/// Runs the model (no grad, natural routing, no owner masks) over `batches` and collects every
/// sparse layer's decisions into one `raptor_routing::LayerRouting` per layer, records in
/// order, ready for `raptor_routing::owner_map` and the routing statistics.
pub fn collect_routing<'a, M, I>(
    model: &M,
    batches: I,
) -> Result<BTreeMap<usize, raptor_routing::LayerRouting>>
where
    M: crate::Model + ?Sized,
    I: IntoIterator<Item = &'a crate::Batch>,
{
    let (e, k) = (model.num_experts(), model.top_k());
    let mut out = BTreeMap::new();
    for l in model.sparse_layers() {
        out.insert(
            l,
            raptor_routing::LayerRouting::new(e as usize, k as usize)
                .map_err(|err| ModelError::Routing(err.to_string()))?,
        );
    }
    for batch in batches {
        let mut ctx = ForwardCtx::new(false);
        ctx.collect_routing = true;
        let _ = tch::no_grad(|| model.forward(batch, &mut ctx))?;
        for r in &ctx.routing {
            let layer = out.get_mut(&r.layer).ok_or_else(|| {
                ModelError::Routing(format!(
                    "router output for layer {} which is not a sparse layer",
                    r.layer
                ))
            })?;
            r.push_into(layer)?;
        }
    }
    Ok(out)
}

/// Owner maps (gate-weighted or token-count plurality, `raptor_routing::owner_map`) of every
/// sparse layer over `batches`, as `[N]` i64 tensors on `device` for [`ForwardCtx::owners`]
/// (slice them per batch with `narrow`).
pub fn owner_tensors<'a, M, I>(
    model: &M,
    batches: I,
    rule: raptor_routing::OwnerRule,
    device: tch::Device,
) -> Result<BTreeMap<usize, Tensor>>
where
    M: crate::Model + ?Sized,
    I: IntoIterator<Item = &'a crate::Batch>,
{
    let mut out = BTreeMap::new();
    for (l, routing) in collect_routing(model, batches)? {
        let map = raptor_routing::owner_map(&routing, rule);
        let v: Vec<i64> = map.owners().iter().map(|&o| i64::from(o)).collect();
        out.insert(l, Tensor::f_from_slice(&v)?.f_to(device)?);
    }
    Ok(out)
}

/// libtorch's intra-op threads set to 1 on this thread until dropped (then the former count).
struct OneThread(i32);

impl OneThread {
    fn new() -> Self {
        let before = tch::get_num_threads();
        tch::set_num_threads(1);
        Self(before)
    }
}

impl Drop for OneThread {
    fn drop(&mut self) {
        tch::set_num_threads(self.0.max(1));
    }
}

/// Owner maps of every sparse layer for `records` (token ids), each record routed **on its
/// own** (a batch of one, no padding): a record's owner depends on that record alone, never on
/// which other records share a micro-batch (padding to a batch's longest record changes the
/// shapes of the router's float reductions, which can flip a near-tie). This is the map a
/// private run must use: each record's owner decides which expert stream it may touch. On the
/// CPU the passes run on one libtorch thread (restored after): a record alone is too small to
/// share.
/// Returns, per sparse layer, one owner per record, in order.
pub fn owners_per_record<M>(
    model: &M,
    records: &[Vec<i64>],
    pad_id: i64,
    rule: raptor_routing::OwnerRule,
    device: tch::Device,
) -> Result<BTreeMap<usize, Vec<i64>>>
where
    M: crate::Model + ?Sized,
{
    let mut batches = Vec::with_capacity(records.len());
    for r in records {
        batches.push(crate::Batch::from_records(
            std::slice::from_ref(r),
            pad_id,
            None,
            device,
        )?);
    }
    // One record's forward pass is many small operations: on the CPU, libtorch's threads
    // would meet at a barrier after each (a team of two spent 6 s a record on a 2-core machine
    // with other work, one thread 0.2 s). One thread for the routing passes, restored after.
    let _one = (device == tch::Device::Cpu).then(OneThread::new);
    let routing = collect_routing(model, batches.iter())?;
    drop(_one);
    let mut out = BTreeMap::new();
    for (l, routing) in routing {
        let map = raptor_routing::owner_map(&routing, rule);
        out.insert(l, map.owners().iter().map(|&o| i64::from(o)).collect());
    }
    Ok(out)
}
