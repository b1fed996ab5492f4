//! Text generation with a language-model head: greedy and beam search, batched, deterministic,
//! with a length limit and an end-of-sequence id.
//!
//! Each step runs the model over the whole prefix (no key/value cache: the models here are
//! small and this keeps one forward path, the one the per-sample engine checks). Candidates are
//! ranked on the CPU in f64 with ties broken by (beam, token) index, so results do not depend on
//! libtorch's top-k tie order.

use crate::batch::{Batch, Task};
use crate::error::{ModelError, Result};
use crate::layers::ForwardCtx;
use crate::model::Model;
use tch::{Device, Kind, Tensor};

/// Generation settings.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateConfig {
    /// At most this many new tokens per prompt.
    pub max_new_tokens: usize,
    /// Beam width (1: greedy).
    pub beams: usize,
    /// End-of-sequence id (generation of a sequence stops after it; it is not returned).
    pub eos: i64,
    /// Padding id of the batches.
    pub pad: i64,
    /// Beam scores are `log p / len^length_penalty` (1.0: mean log-probability per token).
    pub length_penalty: f64,
    /// The model's longest input (prompt + generated); generation stops there.
    pub max_positions: usize,
    /// Prompts per forward pass (greedy).
    pub batch_size: usize,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            beams: 1,
            eos: 0,
            pad: 0,
            length_penalty: 1.0,
            max_positions: 1024,
            batch_size: 16,
        }
    }
}

fn check<M: Model + ?Sized>(model: &M, prompts: &[Vec<i64>], cfg: &GenerateConfig) -> Result<()> {
    if model.task() != Task::LanguageModel {
        return Err(ModelError::InvalidConfig(
            "generation needs a language-model head".into(),
        ));
    }
    if cfg.beams == 0 || cfg.batch_size == 0 {
        return Err(ModelError::InvalidConfig(
            "beams and batch_size must be at least 1".into(),
        ));
    }
    if let Some((r, _)) = prompts.iter().enumerate().find(|(_, p)| p.is_empty()) {
        return Err(ModelError::EmptyRecord {
            record: r,
            why: "an empty prompt".into(),
        });
    }
    Ok(())
}

/// Log-probabilities `[n, V]` (f64, CPU) of the next token after each sequence.
fn next_logprobs<M: Model + ?Sized>(
    model: &M,
    seqs: &[Vec<i64>],
    pad: i64,
    device: Device,
) -> Result<Vec<Vec<f64>>> {
    let batch = Batch::from_records(seqs, pad, None, device)?;
    let mut ctx = ForwardCtx::new(false);
    let logits = tch::no_grad(|| model.forward(&batch, &mut ctx))?;
    let v = logits.size().last().copied().unwrap_or(0);
    let last: Vec<i64> = seqs.iter().map(|s| s.len() as i64 - 1).collect();
    let idx = Tensor::f_from_slice(&last)?
        .f_to(logits.device())?
        .f_reshape([-1, 1, 1])?
        .f_expand([seqs.len() as i64, 1, v], false)?;
    let lp = logits
        .f_gather(1, &idx, false)?
        .f_squeeze_dim(1)?
        .f_to_kind(Kind::Double)?
        .f_log_softmax(-1, Kind::Double)?
        .f_to(Device::Cpu)?;
    let flat: Vec<f64> = Vec::try_from(lp.f_flatten(0, -1)?)?;
    Ok(flat.chunks(v as usize).map(<[f64]>::to_vec).collect())
}

fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

/// Generates a continuation of every prompt (returned without the prompt and without EOS).
pub fn generate<M: Model + ?Sized>(
    model: &M,
    prompts: &[Vec<i64>],
    cfg: &GenerateConfig,
    device: Device,
) -> Result<Vec<Vec<i64>>> {
    check(model, prompts, cfg)?;
    if cfg.beams == 1 {
        greedy(model, prompts, cfg, device)
    } else {
        prompts
            .iter()
            .map(|p| beam(model, p, cfg, device))
            .collect()
    }
}

fn greedy<M: Model + ?Sized>(
    model: &M,
    prompts: &[Vec<i64>],
    cfg: &GenerateConfig,
    device: Device,
) -> Result<Vec<Vec<i64>>> {
    let mut out = Vec::with_capacity(prompts.len());
    for chunk in prompts.chunks(cfg.batch_size) {
        let mut seqs: Vec<Vec<i64>> = chunk.to_vec();
        let mut produced: Vec<Vec<i64>> = vec![Vec::new(); chunk.len()];
        let mut done: Vec<bool> = seqs.iter().map(|s| s.len() >= cfg.max_positions).collect();
        for _ in 0..cfg.max_new_tokens {
            let live: Vec<usize> = (0..seqs.len()).filter(|&i| !done[i]).collect();
            if live.is_empty() {
                break;
            }
            let batch: Vec<Vec<i64>> = live.iter().map(|&i| seqs[i].clone()).collect();
            let lps = next_logprobs(model, &batch, cfg.pad, device)?;
            for (k, &i) in live.iter().enumerate() {
                let tok = argmax(&lps[k]) as i64;
                if tok == cfg.eos {
                    done[i] = true;
                    continue;
                }
                seqs[i].push(tok);
                produced[i].push(tok);
                if seqs[i].len() >= cfg.max_positions {
                    done[i] = true;
                }
            }
        }
        out.extend(produced);
    }
    Ok(out)
}

fn beam<M: Model + ?Sized>(
    model: &M,
    prompt: &[i64],
    cfg: &GenerateConfig,
    device: Device,
) -> Result<Vec<i64>> {
    let k = cfg.beams;
    let score = |lp: f64, len: usize| lp / (len.max(1) as f64).powf(cfg.length_penalty);
    // (generated tokens, summed log-probability)
    let mut live: Vec<(Vec<i64>, f64)> = vec![(Vec::new(), 0.0)];
    let mut finished: Vec<(Vec<i64>, f64)> = Vec::new();
    for _ in 0..cfg.max_new_tokens {
        if live.is_empty() || prompt.len() + live[0].0.len() >= cfg.max_positions {
            break;
        }
        let seqs: Vec<Vec<i64>> = live
            .iter()
            .map(|(g, _)| {
                let mut s = prompt.to_vec();
                s.extend(g);
                s
            })
            .collect();
        let lps = next_logprobs(model, &seqs, cfg.pad, device)?;
        // Candidates (total log p, beam, token), best first; ties by (beam, token).
        let mut cands: Vec<(f64, usize, usize)> = Vec::new();
        for (b, lp) in lps.iter().enumerate() {
            // Only the top 2k tokens of each beam can make the global top 2k.
            let mut idx: Vec<usize> = (0..lp.len()).collect();
            idx.sort_by(|&x, &y| lp[y].total_cmp(&lp[x]).then(x.cmp(&y)));
            for &t in idx.iter().take(2 * k) {
                cands.push((live[b].1 + lp[t], b, t));
            }
        }
        cands.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
        let mut next = Vec::with_capacity(k);
        for (lp, b, t) in cands {
            if next.len() >= k {
                break;
            }
            let mut g = live[b].0.clone();
            if t as i64 == cfg.eos {
                finished.push((g, lp));
            } else {
                g.push(t as i64);
                next.push((g, lp));
            }
        }
        live = next;
        // Early stopping (as Hugging Face's `early_stopping=True`): k finished hypotheses.
        if finished.len() >= k {
            break;
        }
    }
    finished.extend(live);
    let best = finished
        .into_iter()
        .enumerate()
        .max_by(|(i, (ga, la)), (j, (gb, lb))| {
            score(*la, ga.len() + 1)
                .total_cmp(&score(*lb, gb.len() + 1))
                .then(j.cmp(i))
        })
        .map(|(_, (g, _))| g)
        .unwrap_or_default();
    Ok(best)
}
