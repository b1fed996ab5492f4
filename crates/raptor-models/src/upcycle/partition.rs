//! Routers trained toward a **public partition** of the records: each record carries a part
//! (a domain or source label, or a cluster of public records), and every sparse layer's router
//! is trained, non-privately and on public records only, so that each valid token of a record
//! goes to the expert of the record's part (cross-entropy of the router's softmax against the
//! part, over every valid token). The routers then stay frozen like every router: a record's
//! owner expert — what RAPTOR's expert streams are keyed by — is the expert of its kind of
//! record rather than an arbitrary one.
//!
//! Works on any model of this crate whose sparse layers report their router inputs
//! ([`crate::ForwardCtx::router_inputs`]: the Switch encoder and MoE-BERT). The router inputs
//! are computed once with the current model and the routers are trained on them: exact while
//! the experts are identical (right after upcycling, the hidden states before a sparse layer do
//! not depend on its router), and for the first sparse layer of any model; a later sparse
//! layer's inputs move with the routing of the layers before it, which is why
//! [`PartitionReport`] measures the agreement with a fresh forward pass after training.

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Kind, Tensor};

use super::RouterTraining;
use crate::checkpoint::{LoadOptions, load_bert, load_switch_encoder, save_pretrained_without};
use crate::error::{ModelError, Result};
use crate::hf_config::HfConfig;
use crate::layers::ForwardCtx;
use crate::model::Model;
use crate::{Batch, BertPooling};

/// How well one sparse layer's routing follows the partition.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayerAgreement {
    /// The sparse layer.
    pub layer: usize,
    /// Fraction of the labelled records' valid tokens whose top-1 expert is their record's part.
    pub tokens: f64,
    /// Fraction of the labelled records whose owner expert (gate-weighted plurality over their
    /// tokens, the owner rule of a private run) is their part.
    pub records: f64,
    /// Fraction of the labelled records' top-1 token assignments that go to each expert.
    pub load: Vec<f64>,
}

/// What [`train_routers_to_partition`] did: per sparse layer, the agreement with the partition
/// before (the routers as they were) and after training (a fresh forward pass).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PartitionReport {
    /// Records with a part (the others were ignored).
    pub records: usize,
    /// Agreement per sparse layer before training.
    pub before: Vec<LayerAgreement>,
    /// Agreement per sparse layer after training.
    pub after: Vec<LayerAgreement>,
    /// How far apart the experts are ([`route_folder`] measures it; empty otherwise).
    #[serde(default)]
    pub spread: Vec<ExpertSpread>,
}

impl PartitionReport {
    /// The smallest record-level agreement over the sparse layers after training (0 without
    /// a layer).
    pub fn min_record_agreement(&self) -> f64 {
        self.after
            .iter()
            .map(|a| a.records)
            .reduce(f64::min)
            .unwrap_or(0.0)
    }
}

/// Every sparse layer's router weight name, by layer (the routers of [`Model::router_params`]
/// in the order of [`Model::sparse_layers`]), and its bias name when it has one.
fn router_names<M: Model + ?Sized>(model: &M) -> Result<BTreeMap<usize, (String, Option<String>)>> {
    let params = model.router_params();
    let weights: Vec<&String> = params.iter().filter(|p| p.ends_with(".weight")).collect();
    let layers = model.sparse_layers();
    if layers.is_empty() {
        return Err(ModelError::InvalidConfig(
            "router training needs a model with sparse layers".into(),
        ));
    }
    if weights.len() != layers.len() {
        return Err(ModelError::InvalidConfig(format!(
            "{} router weights for {} sparse layers",
            weights.len(),
            layers.len()
        )));
    }
    Ok(layers
        .into_iter()
        .zip(weights)
        .map(|(l, w)| {
            let b = format!("{}.bias", w.trim_end_matches(".weight"));
            let bias = params.contains(&b).then_some(b);
            (l, (w.clone(), bias))
        })
        .collect())
}

/// Router inputs per sparse layer: the valid tokens' inputs `[n, d]` (f32) and the index `[n]`
/// of each token's record.
type Inputs = BTreeMap<usize, (Tensor, Tensor)>;

/// One forward pass over `batches` (no grad) that collects both every sparse layer's routing
/// (as a private run's owner maps read it) and its router inputs.
fn routing_pass<M: Model + ?Sized>(
    model: &M,
    batches: &[Batch],
) -> Result<(BTreeMap<usize, raptor_routing::LayerRouting>, Inputs)> {
    let (e, k) = (model.num_experts(), model.top_k());
    let mut routing = BTreeMap::new();
    for l in model.sparse_layers() {
        routing.insert(
            l,
            raptor_routing::LayerRouting::new(e.max(0) as usize, k.max(0) as usize)
                .map_err(|err| ModelError::Routing(err.to_string()))?,
        );
    }
    let mut per: BTreeMap<usize, (Vec<Tensor>, Vec<Tensor>)> = BTreeMap::new();
    let mut offset = 0i64;
    for b in batches {
        let mut ctx = ForwardCtx::new(false);
        ctx.router_inputs = Some(Vec::new());
        ctx.collect_routing = true;
        let _ = tch::no_grad(|| model.forward(b, &mut ctx))?;
        for r in &ctx.routing {
            let layer = routing.get_mut(&r.layer).ok_or_else(|| {
                ModelError::Routing(format!(
                    "router output for layer {} which is not a sparse layer",
                    r.layer
                ))
            })?;
            r.push_into(layer)?;
        }
        let valid = b.attention_mask.f_gt(0)?;
        let (n, t) = (b.batch_size(), b.seq_len());
        let rec = Tensor::f_arange(n, (Kind::Int64, valid.device()))?
            .f_add_scalar(offset)?
            .f_unsqueeze(1)?
            .f_expand([n, t], false)?;
        let rec = rec.f_index(&[Some(&valid)])?;
        let inputs = ctx.router_inputs.take().unwrap_or_default();
        if inputs.is_empty() {
            return Err(ModelError::InvalidConfig(
                "the model's sparse layers do not report their router inputs".into(),
            ));
        }
        for (layer, x) in inputs {
            let rows = x.f_index(&[Some(&valid)])?.f_to_kind(Kind::Float)?;
            let e = per.entry(layer).or_default();
            e.0.push(rows);
            e.1.push(rec.shallow_clone());
        }
        offset += n;
    }
    let inputs = per
        .into_iter()
        .map(|(l, (x, r))| Ok((l, (Tensor::f_cat(&x, 0)?, Tensor::f_cat(&r, 0)?))))
        .collect::<Result<Inputs>>()?;
    Ok((routing, inputs))
}

/// The valid tokens' router inputs `[n, d]` (f32) of every sparse layer over `batches`, with
/// the index `[n]` of each token's record (counted over the batches in order); no grad.
///
/// # Errors
/// A model whose sparse layers do not report router inputs, or a batch the model rejects.
pub fn router_inputs<M: Model + ?Sized>(
    model: &M,
    batches: &[Batch],
) -> Result<BTreeMap<usize, (Tensor, Tensor)>> {
    Ok(routing_pass(model, batches)?.1)
}

/// Router logits `[n, E]` of inputs `x` `[n, d]` (f32) under weight `w` `[E, d]` and bias.
fn logits(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let z = x.f_matmul(&w.f_tr()?)?;
    Ok(match bias {
        Some(b) => z.f_add(&b.f_to_kind(Kind::Float)?)?,
        None => z,
    })
}

/// Per sparse layer, how the model's own routing (a fresh forward pass) follows `parts` (one
/// per record over `batches` in order; a negative part: not counted).
///
/// # Errors
/// `parts` of the wrong length, a part outside the experts, or a batch the model rejects.
pub fn partition_agreement<M: Model + ?Sized>(
    model: &M,
    batches: &[Batch],
    parts: &[i64],
) -> Result<Vec<LayerAgreement>> {
    Ok(agreement_and_inputs(model, batches, parts)?.0)
}

/// [`partition_agreement`] and the router inputs of the same forward pass.
fn agreement_and_inputs<M: Model + ?Sized>(
    model: &M,
    batches: &[Batch],
    parts: &[i64],
) -> Result<(Vec<LayerAgreement>, Inputs)> {
    let n: i64 = batches.iter().map(Batch::batch_size).sum();
    check_parts(parts, n, model.num_experts())?;
    let (routing, inputs) = routing_pass(model, batches)?;
    let names = router_names(model)?;
    let vars = model.var_store().variables();
    let e = model.num_experts();
    let labelled = parts.iter().filter(|&&p| p >= 0).count().max(1) as f64;
    let target = Tensor::f_from_slice(parts)?;
    let mut out = Vec::new();
    for (l, (x, rec)) in &inputs {
        let (wn, bn) = names
            .get(l)
            .ok_or_else(|| ModelError::InvalidConfig(format!("no router for layer {l}")))?;
        let w = vars
            .get(wn)
            .ok_or_else(|| ModelError::InvalidConfig(format!("the model lacks {wn}")))?
            .f_to_kind(Kind::Float)?;
        let b = bn.as_ref().and_then(|b| vars.get(b));
        let top = logits(x, &w, b)?.f_argmax(-1, false)?;
        let want = target.f_index_select(0, rec)?;
        let keep = want.f_ge(0)?;
        let tokens = keep.f_sum(Kind::Int64)?.f_int64_value(&[])?.max(1) as f64;
        let hit = top
            .f_eq_tensor(&want)?
            .f_logical_and(&keep)?
            .f_sum(Kind::Int64)?
            .f_int64_value(&[])? as f64;
        let counts = top
            .f_index(&[Some(&keep)])?
            .f_bincount(None::<Tensor>, e)?
            .f_to_kind(Kind::Double)?;
        let load: Vec<f64> = Vec::<f64>::try_from(&counts.f_div_scalar(tokens)?)?;
        let own: Vec<u32> = match routing.get(l) {
            Some(r) => raptor_routing::owner_map(r, raptor_routing::OwnerRule::GateWeighted)
                .owners()
                .to_vec(),
            None => Vec::new(),
        };
        let rec_hit = parts
            .iter()
            .zip(&own)
            .filter(|(p, o)| **p >= 0 && **p == i64::from(**o))
            .count() as f64;
        out.push(LayerAgreement {
            layer: *l,
            tokens: hit / tokens,
            records: rec_hit / labelled,
            load,
        });
    }
    Ok((out, inputs))
}

fn check_parts(parts: &[i64], records: i64, experts: i64) -> Result<()> {
    if parts.len() as i64 != records {
        return Err(ModelError::InvalidConfig(format!(
            "{} parts for {records} records",
            parts.len()
        )));
    }
    if let Some(p) = parts.iter().find(|&&p| p >= experts) {
        return Err(ModelError::InvalidConfig(format!(
            "part {p} has no expert ({experts} experts per layer)"
        )));
    }
    if parts.iter().all(|&p| p < 0) {
        return Err(ModelError::InvalidConfig(
            "router training toward a partition needs at least one record with a part".into(),
        ));
    }
    Ok(())
}

/// Trains every router of `model` toward the public partition `parts` (one per record over
/// `public` in order: the expert index of the record's part; negative: no part, the record is
/// ignored): `opts.steps` full-batch Adam steps per layer on the mean cross-entropy, over the
/// labelled records' valid tokens, between the router's softmax and the record's part. The
/// routers stay frozen (`requires_grad` false); the report measures the agreement before and
/// after with fresh forward passes.
///
/// Only public records may be passed: nothing here is private.
///
/// # Errors
/// No batch, `parts` of the wrong length or with a part outside the experts, no labelled
/// record, a model without sparse layers or router inputs, or a non-finite loss.
pub fn train_routers_to_partition<M: Model + ?Sized>(
    model: &mut M,
    public: &[Batch],
    parts: &[i64],
    opts: &RouterTraining,
) -> Result<PartitionReport> {
    if public.is_empty() {
        return Err(ModelError::InvalidConfig(
            "router training needs at least one public batch".into(),
        ));
    }
    let (before, inputs) = agreement_and_inputs(&*model, public, parts)?;
    let names = router_names(&*model)?;
    let vars = model.var_store().variables();
    let target = Tensor::f_from_slice(parts)?;
    for (l, (x, rec)) in &inputs {
        let want = target.f_index_select(0, rec)?;
        let keep = want.f_ge(0)?;
        let x = x.f_index(&[Some(&keep)])?;
        let want = want.f_index(&[Some(&keep)])?;
        let (wn, bn) = names
            .get(l)
            .ok_or_else(|| ModelError::InvalidConfig(format!("no router for layer {l}")))?;
        let mut target_w = vars
            .get(wn)
            .ok_or_else(|| ModelError::InvalidConfig(format!("the model lacks {wn}")))?
            .shallow_clone();
        let bias = bn
            .as_ref()
            .and_then(|b| vars.get(b))
            .map(Tensor::f_detach)
            .transpose()?;
        super::adam_train_router(&mut target_w, *l, opts.steps, opts.lr, |w| {
            Ok(
                logits(&x, w, bias.as_ref())?.f_cross_entropy_loss::<Tensor>(
                    &want,
                    None,
                    tch::Reduction::Mean,
                    -100,
                    0.0,
                )?,
            )
        })?;
    }
    let after = partition_agreement(&*model, public, parts)?;
    Ok(PartitionReport {
        records: parts.iter().filter(|&&p| p >= 0).count(),
        before,
        after,
        spread: Vec::new(),
    })
}

/// How far apart one sparse layer's experts are: over every pair of experts, the distance of
/// their parameters relative to their mean norm, `‖θ_i − θ_j‖ / ((‖θ_i‖ + ‖θ_j‖) / 2)` (0 for
/// identical copies, as right after upcycling).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExpertSpread {
    /// The sparse layer.
    pub layer: usize,
    /// Mean relative distance over the pairs.
    pub mean: f64,
    /// The smallest relative distance of a pair (the two most alike experts).
    pub min: f64,
}

/// The [`ExpertSpread`] of every sparse layer of `model` (its experts' parameters by `naming`).
///
/// # Errors
/// A model without sparse layers or with fewer than two experts, or an expert without
/// parameters.
pub fn expert_spread<M: Model + ?Sized>(
    model: &M,
    naming: crate::roles::Naming,
) -> Result<Vec<ExpertSpread>> {
    let e = usize::try_from(model.num_experts()).unwrap_or(0);
    if model.sparse_layers().is_empty() || e < 2 {
        return Err(ModelError::InvalidConfig(
            "expert spread needs sparse layers with at least two experts".into(),
        ));
    }
    let roles = crate::roles::RoleIndex::of_model(model, naming);
    let vars = model.var_store().variables();
    let mut out = Vec::new();
    for layer in model.sparse_layers() {
        let mut flat = Vec::with_capacity(e);
        for expert in 0..e {
            let names = roles.expert_params(crate::roles::ExpertId { layer, expert });
            if names.is_empty() {
                return Err(ModelError::InvalidConfig(format!(
                    "expert {expert} of layer {layer} has no parameter"
                )));
            }
            let parts = names
                .iter()
                .filter_map(|n| vars.get(n))
                .map(|t| t.f_detach()?.f_to_kind(Kind::Double)?.f_reshape([-1]))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            flat.push(Tensor::f_cat(&parts, 0)?);
        }
        let norms = flat
            .iter()
            .map(|t| t.f_norm()?.f_double_value(&[]))
            .collect::<std::result::Result<Vec<f64>, _>>()?;
        let (mut sum, mut min, mut pairs) = (0.0, f64::INFINITY, 0usize);
        for i in 0..e {
            for j in i + 1..e {
                let d = flat[i].f_sub(&flat[j])?.f_norm()?.f_double_value(&[])?;
                let scale = (norms[i] + norms[j]) / 2.0;
                let r = if scale > 0.0 { d / scale } else { 0.0 };
                sum += r;
                min = min.min(r);
                pairs += 1;
            }
        }
        out.push(ExpertSpread {
            layer,
            mean: sum / pairs as f64,
            min,
        });
    }
    Ok(out)
}

/// A Switch encoder or MoE-BERT folder, its head (if any) read and kept, and its naming.
fn load_routed(model: &Path) -> Result<(Box<dyn Model>, crate::roles::Naming)> {
    let opts = LoadOptions::strict();
    let (labels, pooler) = head_labels(model)?;
    match HfConfig::from_file(model)? {
        HfConfig::Switch(_) => Ok((
            Box::new(load_switch_encoder(model, labels, tch::Device::Cpu, &opts)?.model),
            crate::roles::Naming::Switch,
        )),
        HfConfig::Bert(_) => {
            let pooling = if pooler {
                BertPooling::Pooler
            } else {
                BertPooling::Mean
            };
            let m = load_bert(model, labels, pooling, tch::Device::Cpu, &opts)?.model;
            if m.config().moe.is_none() {
                return Err(ModelError::InvalidConfig(format!(
                    "{} is a dense BERT: upcycle it first",
                    model.display()
                )));
            }
            Ok((Box::new(m), crate::roles::Naming::MoeBert))
        }
        other => Err(ModelError::InvalidConfig(format!(
            "routing toward a partition needs a Switch encoder or a MoE-BERT, not {}",
            other.model_type()
        ))),
    }
}

/// What a checkpoint folder's routing and experts look like on public records: the agreement
/// of every sparse layer's routing with `parts` ([`partition_agreement`]) and how far apart
/// its experts are ([`expert_spread`]). For a folder trained further after its routers were
/// trained (the routers frozen, the layers before them not), this measures where the routing
/// ended up.
///
/// # Errors
/// A folder that is not a Switch encoder or a MoE-BERT, or bad records or parts.
pub fn folder_report(
    model: &Path,
    records: &[Vec<i64>],
    parts: &[i64],
    pad_id: i64,
) -> Result<(Vec<LayerAgreement>, Vec<ExpertSpread>)> {
    if records.is_empty() {
        return Err(ModelError::InvalidConfig(
            "a routing report needs at least one public record".into(),
        ));
    }
    let (m, naming) = load_routed(model)?;
    let batches = records
        .chunks(ROUTE_BATCH)
        .map(|c| Batch::from_records(c, pad_id, None, tch::Device::Cpu))
        .collect::<Result<Vec<_>>>()?;
    Ok((
        partition_agreement(m.as_ref(), &batches, parts)?,
        expert_spread(m.as_ref(), naming)?,
    ))
}

/// Public records with their parts, to train a folder's routers on (see [`route_folder`]).
#[derive(Debug, Clone, Copy)]
pub struct PartitionTokens<'a> {
    /// The public records as token ids of the folder's tokenizer; never private records.
    pub records: &'a [Vec<i64>],
    /// One part per record: the expert index of its part, or negative for none.
    pub parts: &'a [i64],
    /// The id that pads a batch (any id of the vocabulary: padded positions are masked).
    pub pad_id: i64,
    /// Steps and learning rate.
    pub training: &'a RouterTraining,
}

/// The classes of the folder's classification head (`classifier.bias`; 2 without one: the
/// head is read so that the folder loads strictly, and is not written back), and whether it
/// holds a BERT pooler (an encoder exported for mean pooling has none).
fn head_labels(model: &Path) -> Result<(i64, bool)> {
    let tensors = crate::checkpoint::read_safetensors(model.join("model.safetensors"))?;
    let labels = tensors
        .iter()
        .find(|(n, _)| n == "classifier.bias")
        .and_then(|(_, t)| t.size().first().copied())
        .unwrap_or(2);
    let pooler = tensors.iter().any(|(n, _)| n.starts_with("bert.pooler."));
    Ok((labels, pooler))
}

/// Records per batch of [`route_folder`].
const ROUTE_BATCH: usize = 64;

/// Reads the encoder checkpoint folder `model` (a Switch encoder or a MoE-BERT), trains its
/// routers toward the partition ([`train_routers_to_partition`]) and writes the result to
/// `out` (Hugging Face layout, without a classification head: the routing moved the features a
/// head would read), with the tokenizer files beside it.
///
/// # Errors
/// A folder that is neither, a dense BERT, bad records or parts, or an I/O failure.
pub fn route_folder(
    model: &Path,
    out: &Path,
    public: PartitionTokens<'_>,
) -> Result<PartitionReport> {
    if public.records.is_empty() {
        return Err(ModelError::InvalidConfig(
            "router training needs at least one public record".into(),
        ));
    }
    let batches = public
        .records
        .chunks(ROUTE_BATCH)
        .map(|c| Batch::from_records(c, public.pad_id, None, tch::Device::Cpu))
        .collect::<Result<Vec<_>>>()?;
    let (mut m, naming) = load_routed(model)?;
    let mut report =
        train_routers_to_partition(m.as_mut(), &batches, public.parts, public.training)?;
    report.spread = expert_spread(m.as_ref(), naming)?;
    save_pretrained_without(m.as_ref(), out, &["classifier.*"])?;
    for f in super::folder::SIDE_FILES {
        let src = model.join(f);
        if src.is_file() {
            std::fs::copy(&src, out.join(f)).map_err(|source| ModelError::Io {
                path: src.display().to_string(),
                source,
            })?;
        }
    }
    Ok(report)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{Bert, BertConfig, SwitchConfig, SwitchEncoder};

    /// Records of two kinds: part 0 uses tokens 3..10, part 1 tokens 10..17 (a domain that
    /// the tokens reveal), plus one record without a part.
    fn public() -> (Vec<Vec<i64>>, Vec<i64>) {
        let mut recs = Vec::new();
        let mut parts = Vec::new();
        for i in 0..24i64 {
            let p = i % 2;
            let base = 3 + 7 * p;
            recs.push((0..6).map(|j| base + (i + j) % 7).collect());
            parts.push(p);
        }
        recs.push(vec![5, 12, 7]);
        parts.push(-1);
        (recs, parts)
    }

    fn batches(recs: &[Vec<i64>]) -> Vec<Batch> {
        recs.chunks(8)
            .map(|c| Batch::from_records(c, 0, None, tch::Device::Cpu).unwrap())
            .collect()
    }

    /// The slow obvious reference of the record-level agreement: each labelled record routed
    /// alone, its owner by gate-weighted plurality, compared with its part.
    fn reference_record_agreement<M: Model>(m: &M, recs: &[Vec<i64>], parts: &[i64]) -> f64 {
        let owners = crate::moe::owners_per_record(
            m,
            recs,
            0,
            raptor_routing::OwnerRule::GateWeighted,
            tch::Device::Cpu,
        )
        .unwrap();
        let own = owners.values().next().unwrap();
        let labelled = parts.iter().filter(|&&p| p >= 0).count() as f64;
        parts
            .iter()
            .zip(own)
            .filter(|(p, o)| **p >= 0 && p == o)
            .count() as f64
            / labelled
    }

    #[test]
    fn switch_routers_learn_a_token_revealed_partition() {
        let (recs, parts) = public();
        let mut cfg = SwitchConfig::tiny();
        cfg.num_layers = 2;
        cfg.encoder_sparse_step = 2;
        cfg.num_experts = 4;
        let mut m = crate::rng::seeded(5, || SwitchEncoder::new(cfg, tch::Device::Cpu).unwrap());
        let b = batches(&recs);
        let opts = RouterTraining {
            steps: 200,
            lr: 5e-2,
        };
        let r = train_routers_to_partition(&mut m, &b, &parts, &opts).unwrap();
        assert_eq!(r.records, 24);
        assert_eq!(r.after.len(), 1);
        let a = &r.after[0];
        assert!(a.tokens > 0.95, "{r:?}");
        assert!(a.records >= 0.99, "{r:?}");
        // Experts 2 and 3 have no part: they get (almost) no token.
        assert!(a.load[2] + a.load[3] < 0.05, "{r:?}");
        assert!((a.load.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        let reference = reference_record_agreement(&m, &recs, &parts);
        assert!((reference - a.records).abs() < 1e-9, "{reference} vs {a:?}");
        // The routers stay frozen.
        for p in m.router_params() {
            assert!(!m.var_store().variables()[&p].requires_grad(), "{p}");
        }
    }

    #[test]
    fn moe_bert_routers_learn_it_too_and_the_reference_agrees_before_training() {
        let (recs, parts) = public();
        // Seeded: an unseeded tiny BERT now and then starts where 200 steps do not reach 99 %.
        let mut m = crate::rng::seeded(5, || {
            let dense = Bert::new(BertConfig::tiny(2), tch::Device::Cpu).unwrap();
            let mut o = super::super::UpcycleOptions::new(2, 1);
            o.layers = Some(vec![1]);
            super::super::upcycle_bert(&dense, &o).unwrap()
        });
        let b = batches(&recs);
        let before = partition_agreement(&m, &b, &parts).unwrap();
        let reference = reference_record_agreement(&m, &recs, &parts);
        assert!((reference - before[0].records).abs() < 1e-9);
        let opts = RouterTraining {
            steps: 200,
            lr: 5e-2,
        };
        let r = train_routers_to_partition(&mut m, &b, &parts, &opts).unwrap();
        assert_eq!(r.before, before);
        assert!(r.min_record_agreement() >= 0.99, "{r:?}");
    }

    /// Upcycled copies are 0 apart; a perturbed expert moves the spread by exactly its
    /// relative distance (checked against the norm computed by hand).
    #[test]
    fn expert_spread_measures_how_far_experts_moved() {
        let dense = Bert::new(BertConfig::tiny(2), tch::Device::Cpu).unwrap();
        let m =
            super::super::upcycle_bert(&dense, &super::super::UpcycleOptions::new(3, 1)).unwrap();
        let s = expert_spread(&m, crate::roles::Naming::MoeBert).unwrap();
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|x| x.mean == 0.0 && x.min == 0.0), "{s:?}");
        let name = "bert.encoder.layer.1.moe.experts.0.output.dense.bias";
        let vars = m.var_store().variables();
        let mut t = vars[name].shallow_clone();
        tch::no_grad(|| {
            let _ = t.f_add_scalar_(1.0).unwrap();
        });
        let roles = crate::roles::RoleIndex::of_model(&m, crate::roles::Naming::MoeBert);
        let params = roles.expert_params(crate::roles::ExpertId {
            layer: 1,
            expert: 1,
        });
        let sq: f64 = params
            .iter()
            .map(|n| {
                vars[n]
                    .f_to_kind(Kind::Double)
                    .unwrap()
                    .f_square()
                    .unwrap()
                    .f_sum(Kind::Double)
                    .unwrap()
                    .f_double_value(&[])
                    .unwrap()
            })
            .sum();
        let n1 = sq.sqrt();
        let len = vars[name].size()[0] as f64;
        let n0 = (sq
            + 2.0
                * vars["bert.encoder.layer.1.moe.experts.1.output.dense.bias"]
                    .f_sum(Kind::Double)
                    .unwrap()
                    .f_double_value(&[])
                    .unwrap()
            + len)
            .sqrt();
        let d = len.sqrt() / ((n0 + n1) / 2.0);
        let s = expert_spread(&m, crate::roles::Naming::MoeBert).unwrap();
        // Pairs (0,1), (0,2) at d, (1,2) at 0.
        assert!((s[1].mean - 2.0 * d / 3.0).abs() < 1e-9, "{s:?} vs {d}");
        assert_eq!(s[1].min, 0.0);
        assert_eq!(s[0].mean, 0.0);
    }

    #[test]
    fn bad_parts_are_errors() {
        let (recs, mut parts) = public();
        let mut m = SwitchEncoder::new(SwitchConfig::tiny(), tch::Device::Cpu).unwrap();
        let b = batches(&recs);
        let opts = RouterTraining::default();
        assert!(train_routers_to_partition(&mut m, &b, &parts[1..], &opts).is_err());
        let e = m.num_experts();
        parts[0] = e;
        let err = train_routers_to_partition(&mut m, &b, &parts, &opts).unwrap_err();
        assert!(err.to_string().contains("has no expert"), "{err}");
        let none = vec![-1; parts.len()];
        assert!(train_routers_to_partition(&mut m, &b, &none, &opts).is_err());
        assert!(train_routers_to_partition(&mut m, &[], &[], &opts).is_err());
        let mut dense = Bert::new(BertConfig::tiny(2), tch::Device::Cpu).unwrap();
        assert!(train_routers_to_partition(&mut dense, &b, &parts[..25], &opts).is_err());
    }

    #[test]
    fn a_folder_is_routed_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let (src, out) = (dir.path().join("src"), dir.path().join("out"));
        let mut cfg = SwitchConfig::tiny();
        cfg.num_layers = 2;
        cfg.encoder_sparse_step = 2;
        cfg.num_experts = 2;
        let m = SwitchEncoder::new(cfg, tch::Device::Cpu).unwrap();
        crate::checkpoint::save_pretrained(&m, &src).unwrap();
        std::fs::write(src.join("tokenizer.json"), "{}").unwrap();
        let (recs, parts) = public();
        let training = RouterTraining {
            steps: 150,
            lr: 5e-2,
        };
        let r = route_folder(
            &src,
            &out,
            PartitionTokens {
                records: &recs,
                parts: &parts,
                pad_id: 0,
                training: &training,
            },
        )
        .unwrap();
        assert!(r.min_record_agreement() >= 0.99, "{r:?}");
        assert!(out.join("tokenizer.json").is_file());
        let back = load_switch_encoder(&out, 2, tch::Device::Cpu, &LoadOptions::strict())
            .unwrap()
            .model;
        let again = partition_agreement(&back, &batches(&recs), &parts).unwrap();
        assert!((again[0].records - r.after[0].records).abs() < 1e-9);
        let (agree, spread) = folder_report(&out, &recs, &parts, 0).unwrap();
        assert_eq!(agree, again);
        assert_eq!(spread.len(), 1);
        // Not an encoder folder with routers: a typed error.
        let dense = dir.path().join("dense");
        crate::checkpoint::save_pretrained(
            &Bert::new(BertConfig::tiny(2), tch::Device::Cpu).unwrap(),
            &dense,
        )
        .unwrap();
        let e = route_folder(
            &dense,
            &dir.path().join("x"),
            PartitionTokens {
                records: &recs,
                parts: &parts,
                pad_id: 0,
                training: &training,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("dense BERT"), "{e}");
        // A MoE-BERT exported for mean pooling (no pooler tensors) reads back too.
        let mut bc = BertConfig::tiny(2);
        bc.pooling = BertPooling::Mean;
        let mut o = super::super::UpcycleOptions::new(2, 1);
        o.layers = Some(vec![1]);
        let moe =
            super::super::upcycle_bert(&Bert::new(bc, tch::Device::Cpu).unwrap(), &o).unwrap();
        let mean = dir.path().join("mean");
        crate::checkpoint::save_pretrained(&moe, &mean).unwrap();
        let (agree, spread) = folder_report(&mean, &recs, &parts, 0).unwrap();
        assert_eq!((agree.len(), spread.len()), (1, 1));
    }
}
