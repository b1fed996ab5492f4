//! Records, batches and evaluation: what the loop feeds the model, and how a trained model is
//! scored (no gradient, no dropout, natural routing).

use tch::{Device, Kind, Tensor};

use raptor_models::{Batch, ForwardCtx, Model, PrefixCache, Task};
use serde::Serialize;

use crate::error::{Result, TrainError};

/// One training record, already tokenized.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// Stable id of the record in its dataset (keys its dropout masks).
    pub id: u64,
    /// Token ids (non-empty).
    pub tokens: Vec<i64>,
    /// Class index (classification).
    pub label: Option<i64>,
    /// Language modelling: the first `prompt_len` tokens are context, not targets (the
    /// meaning representation of a data-to-text record); 0 for plain text.
    pub prompt_len: usize,
}

/// A right-padded batch of `examples` (labels for classifiers, prompt masks for prompts).
pub fn make_batch(examples: &[&Example], task: Task, pad_id: i64, device: Device) -> Result<Batch> {
    let toks: Vec<Vec<i64>> = examples.iter().map(|e| e.tokens.clone()).collect();
    let labels: Option<Vec<i64>> = if task == Task::Classification {
        let mut v = Vec::with_capacity(examples.len());
        for e in examples {
            v.push(
                e.label
                    .ok_or_else(|| TrainError::Data(format!("record {} has no label", e.id)))?,
            );
        }
        Some(v)
    } else {
        None
    };
    let b = Batch::from_records(&toks, pad_id, labels.as_deref(), device)?;
    if task == Task::LanguageModel && examples.iter().any(|e| e.prompt_len > 0) {
        let pl: Vec<usize> = examples.iter().map(|e| e.prompt_len).collect();
        return Ok(b.with_prompt_lengths(&pl)?);
    }
    Ok(b)
}

/// Runs `model` over the records `data[positions]` (all of `data` when `positions` is None)
/// in micro-batches (no gradient, no dropout, natural routing) and hands each chunk, its
/// batch, the logits and the per-record losses to `each`. With a frozen-prefix `cache` over
/// the record set `data`, each pass starts from the cached hidden states.
#[allow(clippy::too_many_arguments)]
fn forward_chunks(
    model: &dyn Model,
    data: &[Example],
    positions: Option<&[usize]>,
    micro_batch: usize,
    pad_id: i64,
    device: Device,
    mut cache: Option<&mut PrefixCache>,
    mut each: impl FnMut(&[&Example], &Batch, &Tensor, &Tensor) -> Result<()>,
) -> Result<()> {
    let all: Vec<usize>;
    let positions = match positions {
        Some(p) => p,
        None => {
            all = (0..data.len()).collect();
            &all
        }
    };
    if let Some(&i) = positions.iter().find(|&&i| i >= data.len()) {
        return Err(TrainError::Data(format!(
            "record {i} of a set of {}",
            data.len()
        )));
    }
    for chunk in positions.chunks(micro_batch.max(1)) {
        let refs: Vec<&Example> = chunk.iter().map(|&i| &data[i]).collect();
        let batch = make_batch(&refs, model.task(), pad_id, device)?;
        let mut ctx = ForwardCtx::new(false);
        ctx.prefix =
            super::prefix::cached_prefix(cache.as_deref_mut(), model, data, chunk, pad_id, device)?;
        let logits = tch::no_grad(|| model.forward(&batch, &mut ctx))?;
        let losses = raptor_models::per_record_loss(&logits, &batch, model.task())?;
        each(&refs, &batch, &logits, &losses)?;
    }
    Ok(())
}

/// Each record's loss under `model` (no gradient, no dropout), in order.
pub fn per_record_losses(
    model: &dyn Model,
    data: &[Example],
    micro_batch: usize,
    pad_id: i64,
    device: Device,
) -> Result<Vec<f64>> {
    per_record_losses_cached(model, data, None, micro_batch, pad_id, device, None)
}

/// [`per_record_losses`] of the records `data[positions]` (all when None), in that order,
/// starting from a frozen-prefix `cache` over the record set `data` when given.
pub fn per_record_losses_cached(
    model: &dyn Model,
    data: &[Example],
    positions: Option<&[usize]>,
    micro_batch: usize,
    pad_id: i64,
    device: Device,
    cache: Option<&mut PrefixCache>,
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(positions.map_or(data.len(), <[usize]>::len));
    forward_chunks(
        model,
        data,
        positions,
        micro_batch,
        pad_id,
        device,
        cache,
        |_, _, _, losses| {
            let l: Vec<f64> = Vec::try_from(losses.f_to_kind(Kind::Double)?.f_to(Device::Cpu)?)?;
            out.extend(l);
            Ok(())
        },
    )?;
    Ok(out)
}

/// Evaluation metrics.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EvalMetrics {
    /// Records evaluated.
    pub records: usize,
    /// Mean per-record loss (cross-entropy; for language models the mean token NLL).
    pub loss: f64,
    /// Accuracy (classification).
    pub accuracy: Option<f64>,
    /// Correct predictions (classification).
    pub correct: Option<usize>,
    /// exp(mean token NLL) (language models).
    pub perplexity: Option<f64>,
}

/// Evaluates `model` on `data` (no dropout, natural routing, no owner masks).
pub fn evaluate(
    model: &dyn Model,
    data: &[Example],
    micro_batch: usize,
    pad_id: i64,
    device: Device,
) -> Result<EvalMetrics> {
    evaluate_cached(model, data, micro_batch, pad_id, device, None)
}

/// [`evaluate`], starting from a frozen-prefix `cache` over `data` when given.
pub fn evaluate_cached(
    model: &dyn Model,
    data: &[Example],
    micro_batch: usize,
    pad_id: i64,
    device: Device,
    cache: Option<&mut PrefixCache>,
) -> Result<EvalMetrics> {
    if data.is_empty() {
        return Err(TrainError::Data(
            "nothing to evaluate: the set is empty".into(),
        ));
    }
    let classify = model.task() == Task::Classification;
    let (mut loss, mut correct, mut tokens_nll, mut tokens) = (0.0f64, 0usize, 0.0f64, 0.0f64);
    forward_chunks(
        model,
        data,
        None,
        micro_batch,
        pad_id,
        device,
        cache,
        |chunk, batch, logits, losses| {
            loss += losses.f_sum(Kind::Double)?.f_double_value(&[])?;
            if classify {
                let pred = logits.f_argmax(-1, false)?;
                let y = batch
                    .labels
                    .as_ref()
                    .ok_or_else(|| TrainError::Data("labels".into()))?;
                correct += pred
                    .f_eq_tensor(y)?
                    .f_sum(Kind::Int64)?
                    .f_int64_value(&[])? as usize;
            } else {
                // Token-weighted NLL: per-record mean × its number of targets.
                let n: Vec<f64> = chunk
                    .iter()
                    .map(|e| e.tokens.len().saturating_sub(e.prompt_len.max(1)) as f64)
                    .collect();
                let l: Vec<f64> =
                    Vec::try_from(losses.f_to_kind(Kind::Double)?.f_to(Device::Cpu)?)?;
                for (a, b) in l.iter().zip(&n) {
                    tokens_nll += a * b;
                    tokens += b;
                }
            }
            Ok(())
        },
    )?;
    let records = data.len();
    Ok(EvalMetrics {
        records,
        loss: if classify {
            loss / records as f64
        } else {
            tokens_nll / tokens.max(1.0)
        },
        accuracy: classify.then(|| correct as f64 / records as f64),
        correct: classify.then_some(correct),
        perplexity: (!classify).then(|| (tokens_nll / tokens.max(1.0)).exp()),
    })
}
