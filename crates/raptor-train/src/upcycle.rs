//! Sparse upcycling of a dense checkpoint folder (Komatsuzaki et al., 2023), the library form
//! of `raptor upcycle` (the reproduce driver's `backbones` part calls it too).
//!
//! A dense Llama-style folder becomes a Mixtral-style folder, a BERT folder a MoE-BERT folder
//! (raptor's layout, `model.kind = "moe-bert"`): every layer's MLP is copied into E experts
//! under a new router drawn N(0, σ²) from a seeded stream; the router is frozen in training.
//! With [`RouterData`] (MoE-BERT) the routers are first trained briefly on that **public**
//! text, non-privately, with the Switch load-balancing loss, then frozen like random ones.

use std::path::{Path, PathBuf};

use raptor_models::upcycle::UpcycleOptions;

use crate::error::{Result, TrainError, io};

/// Public text to train the routers of an upcycled MoE-BERT on (see [`upcycle_folder`]).
#[derive(Debug, Clone)]
pub struct RouterData {
    /// The public file (CSV, TSV or JSONL); never private records.
    pub file: PathBuf,
    /// Its text column.
    pub text_column: String,
    /// `model.tokenizer` of the records (`model`: the dense folder's tokenizer.json).
    pub tokenizer: crate::config::TokenizerSpec,
    /// Tokens per record (special tokens included).
    pub max_length: usize,
    /// Records used at most (an evenly strided subset; 0: all).
    pub max_records: usize,
    /// Steps and learning rate.
    pub training: raptor_models::upcycle::RouterTraining,
}

/// What [`upcycle_folder`] wrote.
#[derive(Debug, Clone)]
pub struct UpcycleReport {
    /// The layout of the written folder.
    pub layout: UpcycledLayout,
    /// With router training: the routers' loads on the public tokens before (random) and
    /// after training, per sparse layer.
    pub router_loads: Option<(
        Vec<raptor_models::upcycle::RouterLoad>,
        Vec<raptor_models::upcycle::RouterLoad>,
    )>,
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
const SIDE_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.txt",
];

/// Upcycles the dense folder `model` into `out` with `opts`: a BERT folder into a MoE-BERT
/// folder, anything else is read as a Llama-style decoder into a Mixtral folder. The tokenizer
/// files beside the checkpoint are copied. With `router` (MoE-BERT only) the new routers are
/// trained on that public text first ([`raptor_models::upcycle::train_bert_routers`]).
///
/// # Errors
/// A folder that is not a BERT or Llama checkpoint, bad options (E < 1, k outside 1..=E),
/// router training asked for a decoder, an unreadable or empty public file, or an I/O failure.
pub fn upcycle_folder(
    model: &Path,
    out: &Path,
    opts: &UpcycleOptions,
    router: Option<&RouterData>,
) -> Result<UpcycleReport> {
    use raptor_models::checkpoint::{
        LoadOptions, load_bert, load_decoder, save_pretrained, save_pretrained_without,
    };
    use raptor_models::hf_config::HfConfig;
    let mut router_loads = None;
    let mut router_records = 0;
    let layout = match HfConfig::from_file(model)? {
        HfConfig::Bert(c) => {
            // The pooler is kept (pooling by it reads it back); a head the source lacks (a
            // `BertModel`) is not written.
            let dense = load_bert(
                model,
                c.num_labels.unwrap_or(2),
                raptor_models::BertPooling::Pooler,
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
            let mut moe = raptor_models::upcycle::upcycle_bert(&dense.model, opts)?;
            if let Some(r) = router {
                let batches = public_batches(model, r, moe.config().vocab_size)?;
                router_records = batches.iter().map(|b| b.batch_size() as usize).sum();
                router_loads = Some(raptor_models::upcycle::train_bert_routers(
                    &mut moe,
                    &batches,
                    &r.training,
                )?);
            }
            save_pretrained_without(&moe, out, &skip)?;
            UpcycledLayout::MoeBert
        }
        _ => {
            if router.is_some() {
                return Err(TrainError::Config(format!(
                    "router training (--router-data) is implemented for BERT folders only; {} is a decoder",
                    model.display()
                )));
            }
            let dense = load_decoder(
                model,
                raptor_models::DecoderHead::LanguageModel,
                tch::Device::Cpu,
                &LoadOptions::strict(),
            )?;
            let moe = raptor_models::upcycle::upcycle_llama(&dense.model, opts)?;
            save_pretrained(&moe, out)?;
            UpcycledLayout::Mixtral
        }
    };
    for f in SIDE_FILES {
        let src = model.join(f);
        if src.is_file() {
            std::fs::copy(&src, out.join(f)).map_err(io(&src))?;
        }
    }
    Ok(UpcycleReport {
        layout,
        router_loads,
        router_records,
    })
}

/// The public records of `r`, tokenized as `model.tokenizer = r.tokenizer` reads them for a
/// BERT in `model`, in batches of 64.
fn public_batches(model: &Path, r: &RouterData, vocab: i64) -> Result<Vec<raptor_models::Batch>> {
    let spec = raptor_data::TableSpec::new(&r.text_column, None);
    let ds = raptor_data::read_table(&r.file, &spec)
        .map_err(|e| TrainError::Data(format!("reading {}: {e}", r.file.display())))?;
    let n = ds.records.len();
    if n == 0 {
        return Err(TrainError::Data(format!(
            "{}: no public record",
            r.file.display()
        )));
    }
    let take = if r.max_records == 0 {
        n
    } else {
        r.max_records.min(n)
    };
    let records: Vec<raptor_data::Record> = (0..take)
        .filter_map(|i| ds.records.get(i * n / take).cloned())
        .collect();
    let mut cfg = crate::config::RunConfig::default();
    cfg.model.kind = crate::config::ModelKind::Bert;
    cfg.model.path = Some(model.to_path_buf());
    cfg.model.tokenizer = r.tokenizer.clone();
    cfg.data.max_length = r.max_length;
    let tok = crate::session::open_run_tokenizer(&cfg)?;
    let examples = crate::session::to_examples(&cfg, tok.as_ref(), &records, None, vocab)?;
    examples
        .chunks(64)
        .map(|c| -> Result<raptor_models::Batch> {
            let ids: Vec<Vec<i64>> = c.iter().map(|e| e.tokens.clone()).collect();
            Ok(raptor_models::Batch::from_records(
                &ids,
                0,
                None,
                tch::Device::Cpu,
            )?)
        })
        .collect()
}
