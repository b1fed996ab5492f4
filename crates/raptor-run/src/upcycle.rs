//! Sparse upcycling of a dense checkpoint folder (Komatsuzaki et al., 2023) with routers trained
//! on public text read through a run's data settings: the library form of `raptor upcycle` (the
//! reproduce driver's `backbones` part calls it too). The folder work is
//! [`raptor_models::upcycle::upcycle_folder`]; this module reads and tokenizes the public text
//! ([`RouterData`]) as a run would, then hands the tokens to it.

use std::path::{Path, PathBuf};

use raptor_models::upcycle::{RouterTokens, UpcycleOptions};
pub use raptor_models::upcycle::{UpcycleReport, UpcycledLayout};

use crate::error::{Result, RunError};

/// Public text to train the routers of an upcycled MoE-BERT on (see [`upcycle_folder`]).
#[derive(Debug, Clone)]
pub struct RouterData {
    /// The public file (CSV, TSV or JSONL); never private records.
    pub file: PathBuf,
    /// Its text column.
    pub text_column: String,
    /// `model.tokenizer` of the records (`model`: the dense folder's tokenizer.json).
    pub tokenizer: raptor_train::config::TokenizerSpec,
    /// Tokens per record (special tokens included).
    pub max_length: usize,
    /// Records used at most (an evenly strided subset; 0: all).
    pub max_records: usize,
    /// Steps and learning rate.
    pub training: raptor_models::upcycle::RouterTraining,
}

/// Upcycles the dense folder `model` into `out` with `opts`
/// ([`raptor_models::upcycle::upcycle_folder`]: a BERT folder into a MoE-BERT folder, anything
/// else into a Mixtral folder). With `router` (MoE-BERT only) the new routers are trained first
/// on that public text, tokenized as `model.tokenizer = router.tokenizer` reads it for a BERT in
/// `model`.
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
    use raptor_models::hf_config::HfConfig;
    let Some(r) = router else {
        return Ok(raptor_models::upcycle::upcycle_folder(
            model, out, opts, None,
        )?);
    };
    let vocab = match HfConfig::from_file(model)? {
        HfConfig::Bert(c) => c.vocab_size,
        _ => {
            return Err(RunError::Config(format!(
                "router training (--router-data) is implemented for BERT folders only; {} is a decoder",
                model.display()
            )));
        }
    };
    let records = public_tokens(model, r, vocab)?;
    let tokens = RouterTokens {
        records: &records,
        training: &r.training,
    };
    Ok(raptor_models::upcycle::upcycle_folder(
        model,
        out,
        opts,
        Some(tokens),
    )?)
}

/// The public records of `r` (an evenly strided subset of at most `r.max_records`), tokenized as
/// `model.tokenizer = r.tokenizer` reads them for a BERT in `model`.
fn public_tokens(model: &Path, r: &RouterData, vocab: i64) -> Result<Vec<Vec<i64>>> {
    let spec = raptor_data::TableSpec::new(&r.text_column, None);
    let ds = raptor_data::read_table(&r.file, &spec)
        .map_err(|e| RunError::Data(format!("reading {}: {e}", r.file.display())))?;
    let n = ds.records.len();
    if n == 0 {
        return Err(RunError::Data(format!(
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
    let bert = raptor_train::config::ModelConfig {
        kind: raptor_train::config::ModelKind::Bert,
        path: Some(model.to_path_buf()),
        tokenizer: r.tokenizer.clone(),
        ..Default::default()
    };
    let tok = crate::session::open_run_tokenizer(&bert)?;
    let enc = crate::session::Encoding {
        max_length: r.max_length,
        language_model: false,
        eos: crate::session::eos_id(&bert),
    };
    let examples = crate::session::to_examples(enc, tok.as_ref(), &records, None, vocab)?;
    Ok(examples.into_iter().map(|e| e.tokens).collect())
}
