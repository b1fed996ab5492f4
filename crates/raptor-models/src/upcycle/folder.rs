//! Sparse upcycling of a dense checkpoint folder into an MoE checkpoint folder: a BERT folder
//! into raptor's MoE-BERT layout (`model.kind = "moe-bert"`), a Llama-style folder into the
//! Hugging Face Mixtral layout; the tokenizer and generation files beside the checkpoint are
//! copied. With [`RouterTokens`] (MoE-BERT only) the new routers are first trained briefly on
//! that **public** text, non-privately ([`super::train_bert_routers`]), then frozen like random
//! ones.

use std::path::Path;

use super::{
    RouterLoad, RouterTraining, UpcycleOptions, train_bert_routers, upcycle_bert, upcycle_llama,
};
use crate::checkpoint::{
    LoadOptions, load_bert, load_decoder, save_pretrained, save_pretrained_without,
};
use crate::error::{ModelError, Result};
use crate::hf_config::HfConfig;
use crate::{Batch, BertPooling, DecoderHead};

/// Public token sequences to train an upcycled MoE-BERT's routers on (see [`upcycle_folder`]).
#[derive(Debug, Clone, Copy)]
pub struct RouterTokens<'a> {
    /// The public records as token ids of the dense folder's tokenizer (special tokens
    /// included); never private records.
    pub records: &'a [Vec<i64>],
    /// Steps and learning rate.
    pub training: &'a RouterTraining,
}

/// What [`upcycle_folder`] wrote.
#[derive(Debug, Clone)]
pub struct UpcycleReport {
    /// The layout of the written folder.
    pub layout: UpcycledLayout,
    /// With router training: the routers' loads on the public tokens before (random) and
    /// after training, per sparse layer.
    pub router_loads: Option<(Vec<RouterLoad>, Vec<RouterLoad>)>,
    /// Public records the routers were trained on.
    pub router_records: usize,
}

/// The layout an upcycled folder was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpcycledLayout {
    /// raptor's MoE-BERT layout (`model.kind = "moe-bert"`).
    MoeBert,
    /// The Hugging Face Mixtral layout (`model.kind = "mixtral"`).
    Mixtral,
}

impl UpcycledLayout {
    /// The `model_type` name printed by `--json` (`moe-bert` or `mixtral`).
    pub fn name(self) -> &'static str {
        match self {
            Self::MoeBert => "moe-bert",
            Self::Mixtral => "mixtral",
        }
    }
}

/// Tokenizer and generation files copied from the dense folder when present.
pub(super) const SIDE_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.txt",
];

/// Records per router-training batch.
const ROUTER_BATCH: usize = 64;

/// Upcycles the dense folder `model` into `out` with `opts`: a BERT folder into a MoE-BERT
/// folder, anything else is read as a Llama-style decoder into a Mixtral folder. The tokenizer
/// files beside the checkpoint are copied. With `router` (MoE-BERT only) the new routers are
/// trained on those public tokens first ([`train_bert_routers`]).
///
/// # Errors
/// A folder that is not a BERT or Llama checkpoint, bad options (E < 1, k outside 1..=E),
/// router training asked for a decoder or given no record, a token outside the vocabulary, or
/// an I/O failure.
pub fn upcycle_folder(
    model: &Path,
    out: &Path,
    opts: &UpcycleOptions,
    router: Option<RouterTokens<'_>>,
) -> Result<UpcycleReport> {
    let mut router_loads = None;
    let mut router_records = 0;
    let layout = match HfConfig::from_file(model)? {
        HfConfig::Bert(c) => {
            // The pooler is kept (pooling by it reads it back); a head the source lacks (a
            // `BertModel`) is not written.
            let dense = load_bert(
                model,
                c.num_labels.unwrap_or(2),
                BertPooling::Pooler,
                tch::Device::Cpu,
                &LoadOptions::strict(),
            )?;
            let skip: Vec<&str> = if dense
                .report
                .missing
                .iter()
                .any(|m| m.starts_with("classifier"))
            {
                vec!["classifier.*"]
            } else {
                vec![]
            };
            let mut moe = upcycle_bert(&dense.model, opts)?;
            if let Some(r) = router {
                if r.records.is_empty() {
                    return Err(ModelError::InvalidConfig(
                        "router training needs at least one public record".into(),
                    ));
                }
                let batches = r
                    .records
                    .chunks(ROUTER_BATCH)
                    .map(|c| Batch::from_records(c, 0, None, tch::Device::Cpu))
                    .collect::<Result<Vec<_>>>()?;
                router_records = r.records.len();
                router_loads = Some(train_bert_routers(&mut moe, &batches, r.training)?);
            }
            save_pretrained_without(&moe, out, &skip)?;
            UpcycledLayout::MoeBert
        }
        _ => {
            if router.is_some() {
                return Err(ModelError::InvalidConfig(format!(
                    "router training (--router-data) is implemented for BERT folders only; {} is a decoder",
                    model.display()
                )));
            }
            let dense = load_decoder(
                model,
                DecoderHead::LanguageModel,
                tch::Device::Cpu,
                &LoadOptions::strict(),
            )?;
            let moe = upcycle_llama(&dense.model, opts)?;
            save_pretrained(&moe, out)?;
            UpcycledLayout::Mixtral
        }
    };
    for f in SIDE_FILES {
        let src = model.join(f);
        if src.is_file() {
            std::fs::copy(&src, out.join(f)).map_err(|source| ModelError::Io {
                path: src.display().to_string(),
                source,
            })?;
        }
    }
    Ok(UpcycleReport {
        layout,
        router_loads,
        router_records,
    })
}
