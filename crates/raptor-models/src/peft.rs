//! A model trained with LoRA adapters, written in the two forms Hugging Face tools read.
//!
//! - **Adapter folder** ([`save_adapter`]): `adapter_config.json` + `adapter_model.safetensors`,
//!   the layout HF PEFT's `PeftModel.from_pretrained(base, folder)` loads onto the base
//!   checkpoint. Each adapted linear `m` (raptor's variable names are the Hugging Face names)
//!   gives `base_model.model.{m}.lora_A.weight` `[r, in]` and `...lora_B.weight` `[out, r]`;
//!   `lora_alpha` is α = scale · r, so PEFT's `scaling = lora_alpha / r` is raptor's scale.
//!   Every other trained module (the classification head) is written whole under
//!   `base_model.model.{module}.{weight,bias}` and listed in `modules_to_save`, as PEFT saves
//!   the extra modules it trains. `target_modules` lists the adapted modules by their full
//!   names, so PEFT attaches adapters to exactly those.
//! - **Merged folder** ([`save_merged`]): the adapters folded into the base weights,
//!   `W ← W + scale · B · A` (in f64, then the weight's kind), written with
//!   [`crate::checkpoint::save_pretrained_without`] (`config.json` + `model.safetensors`, the
//!   head included): a plain checkpoint that transformers and `model.path` of a raptor run
//!   read without PEFT.
//!
//! Both forms write a `README.md` that says how the logits are computed — a mean-pooled BERT
//! ([`crate::BertPooling::Mean`], sentence-transformers' pooling) has no Hugging Face class of
//! its own: its logits are `classifier(mean of the encoder's last hidden state over the valid
//! tokens)`, not `BertForSequenceClassification`'s pooler path — and copy the tokenizer files
//! of a folder the caller names. Nothing else is written: no training data, metrics or run
//! state.
//!
//! Checked against PEFT and transformers by `fixtures/peft/generate.py` (the golden logits of
//! `tests/peft_export.rs`: both forms of a tiny BERT, mean-pooled and pooler-pooled, loaded by
//! PEFT and transformers give raptor's logits).
//!
//! The adapter form is written for dense BERT classifiers (the layout checked against PEFT);
//! other families, and raptor's MoE-BERT (not a transformers architecture), are refused with
//! a typed error that names the merged form, which every family with a Hugging Face export
//! supports.

use crate::BertPooling;
use crate::checkpoint::{glob_match, save_pretrained_without, write_safetensors};
use crate::error::{ModelError, Result};
use crate::model::Model;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use tch::{Kind, Tensor};

/// File name of the adapter's configuration.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// File name of the adapter's weights.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// The prefix PEFT gives every tensor of an adapter saved from a `PeftModel`.
pub const PEFT_PREFIX: &str = "base_model.model.";
/// The model card both forms write.
pub const CARD: &str = "README.md";

/// Tokenizer files copied from [`ExportOptions::tokenizer_from`] when present.
const TOKENIZER_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
];

/// What an export records beside the weights.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExportOptions {
    /// The base checkpoint (a folder path or a hub id): `base_model_name_or_path` of the
    /// adapter, and the folder the card tells to load it onto.
    pub base_model: String,
    /// A BERT classifier's pooling (the card says how its logits are computed); None for
    /// other families.
    pub pooling: Option<BertPooling>,
    /// A folder whose tokenizer files (`tokenizer.json`, `tokenizer_config.json`,
    /// `special_tokens_map.json`, `vocab.txt`) are copied beside the weights, when present.
    /// Name only a tokenizer that is public (a pretrained checkpoint's), never one learned
    /// from private records.
    pub tokenizer_from: Option<std::path::PathBuf>,
}

/// What [`save_adapter`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterReport {
    /// The adapted modules (`target_modules`), sorted.
    pub target_modules: Vec<String>,
    /// The modules saved whole (`modules_to_save`), sorted.
    pub modules_to_save: Vec<String>,
    /// Rank r.
    pub r: i64,
    /// α (`lora_alpha`).
    pub alpha: f64,
    /// The tensor names written, sorted.
    pub tensors: Vec<String>,
}

/// One adapted linear: its module name and adapter.
struct Adapter {
    module: String,
    a: Tensor,
    b: Tensor,
    scale: f64,
    dropout: f64,
}

fn adapters<M: Model + ?Sized>(model: &mut M) -> Result<Vec<Adapter>> {
    let (_, linears) = model.linears_mut();
    let mut out = Vec::new();
    for l in linears {
        if let Some(lora) = &l.lora {
            out.push(Adapter {
                module: l.name.clone(),
                a: lora.a.f_detach()?,
                b: lora.b.f_detach()?,
                scale: lora.scale,
                dropout: lora.dropout,
            });
        }
    }
    out.sort_by(|x, y| x.module.cmp(&y.module));
    Ok(out)
}

/// The module of a variable name (`classifier.weight` → `classifier`).
fn module_of(var: &str) -> &str {
    var.rsplit_once('.').map_or(var, |(m, _)| m)
}

fn invalid(why: impl Into<String>) -> ModelError {
    ModelError::InvalidConfig(why.into())
}

fn io_err(path: &Path, source: std::io::Error) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `bytes` to `dir/name` through a temporary name (an interrupted export leaves no
/// half-written file under the final name).
fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, bytes).map_err(|e| io_err(&tmp, e))?;
    let dst = dir.join(name);
    std::fs::rename(&tmp, &dst).map_err(|e| io_err(&dst, e))
}

/// Whether `model` is a dense BERT classifier (the family the adapter form is written for).
fn is_dense_bert(config: Option<&serde_json::Value>) -> bool {
    config.is_some_and(|c| {
        c.get("model_type").and_then(|v| v.as_str()) == Some("bert")
            && c.get("raptor_moe").is_none()
    })
}

/// Writes the LoRA adapters of `model` and its other trained modules as a PEFT adapter folder
/// `dir` (see the module docs): `adapter_config.json`, `adapter_model.safetensors`, the card and
/// the tokenizer files of [`ExportOptions::tokenizer_from`].
///
/// The trained modules are those with a variable that requires grad and is not a LoRA factor
/// (the head of a LoRA run). Files are written through temporary names.
///
/// # Errors
/// A model that is not a dense BERT classifier, one without adapters, adapters of different
/// ranks or scales (PEFT's one `r` and `lora_alpha`), a module both adapted and trained whole,
/// or an I/O failure.
pub fn save_adapter<M: Model + ?Sized>(
    model: &mut M,
    dir: impl AsRef<Path>,
    opts: &ExportOptions,
) -> Result<AdapterReport> {
    let dir = dir.as_ref();
    if !is_dense_bert(model.hf_config_json().as_ref()) {
        return Err(invalid(
            "a PEFT adapter folder is written for dense BERT classifiers (the layout checked \
             against PEFT); this model is another family (or raptor's MoE-BERT, which \
             transformers does not read): export the merged folder instead",
        ));
    }
    let adapters = adapters(model)?;
    let first = adapters.first().ok_or_else(|| {
        invalid("the model has no LoRA adapter: export the merged folder instead")
    })?;
    let r = first.a.size().first().copied().unwrap_or(0);
    let (scale, dropout) = (first.scale, first.dropout);
    for ad in &adapters {
        let ar = ad.a.size().first().copied().unwrap_or(0);
        if ar != r || ad.scale != scale {
            return Err(invalid(format!(
                "adapters of different ranks or scales ({} has r {ar}, scale {}; {} has r {r}, scale {scale}): an adapter folder holds one r and one lora_alpha",
                ad.module, ad.scale, first.module
            )));
        }
    }
    let adapted: BTreeSet<String> = adapters.iter().map(|a| a.module.clone()).collect();
    // Every trained variable that is not a LoRA factor: its module is saved whole.
    let vars = model.var_store().variables();
    let is_lora = |n: &str| glob_match("*.lora_A.weight", n) || glob_match("*.lora_B.weight", n);
    let modules: BTreeSet<String> = vars
        .iter()
        .filter(|(n, t)| t.requires_grad() && !is_lora(n))
        .map(|(n, _)| module_of(n).to_string())
        .collect();
    if let Some(m) = modules.iter().find(|m| adapted.contains(*m)) {
        return Err(invalid(format!(
            "{m} carries a LoRA adapter and is trained whole too: PEFT cannot load such an adapter"
        )));
    }
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for ad in &adapters {
        tensors.push((
            format!("{PEFT_PREFIX}{}.lora_A.weight", ad.module),
            ad.a.shallow_clone(),
        ));
        tensors.push((
            format!("{PEFT_PREFIX}{}.lora_B.weight", ad.module),
            ad.b.shallow_clone(),
        ));
    }
    let mut sorted: Vec<(&String, &Tensor)> = vars
        .iter()
        .filter(|(n, _)| !is_lora(n) && modules.contains(module_of(n)))
        .collect();
    sorted.sort_by(|x, y| x.0.cmp(y.0));
    for (n, t) in sorted {
        tensors.push((format!("{PEFT_PREFIX}{n}"), t.f_detach()?));
    }
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let alpha = scale * r as f64;
    let config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "SEQ_CLS",
        "base_model_name_or_path": opts.base_model,
        "revision": null,
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": adapted.iter().collect::<Vec<_>>(),
        "modules_to_save": modules.iter().collect::<Vec<_>>(),
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
    });
    let text = serde_json::to_string_pretty(&config)
        .map_err(|e| invalid(format!("{ADAPTER_CONFIG}: {e}")))?;
    let tmp = dir.join(format!("{ADAPTER_WEIGHTS}.tmp"));
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    write_safetensors(&tmp, &tensors, Some(meta))?;
    let dst = dir.join(ADAPTER_WEIGHTS);
    std::fs::rename(&tmp, &dst).map_err(|e| io_err(&dst, e))?;
    write_file(dir, ADAPTER_CONFIG, text.as_bytes())?;
    let report = AdapterReport {
        target_modules: adapted.into_iter().collect(),
        modules_to_save: modules.into_iter().collect(),
        r,
        alpha,
        tensors: {
            let mut t: Vec<String> = tensors.into_iter().map(|(n, _)| n).collect();
            t.sort();
            t
        },
    };
    let labels = model.num_labels();
    finish(dir, &card(Form::Adapter(&report), opts, labels), opts)?;
    Ok(report)
}

/// Folds every LoRA adapter of `model` into its base weight, `W ← W + scale · B · A`
/// (computed in f64, stored in the weight's kind), and detaches the adapter from the forward
/// pass; returns the merged module names, sorted. The adapters' variables stay in the
/// VarStore (unused; [`crate::checkpoint::save_pretrained`] leaves them out). The model's
/// logits are unchanged up to the weight kind's rounding (dropout aside: adapters dropped no
/// input at evaluation).
///
/// # Errors
/// A libtorch failure.
pub fn merge_lora<M: Model + ?Sized>(model: &mut M) -> Result<Vec<String>> {
    let (_, linears) = model.linears_mut();
    let mut merged = Vec::new();
    tch::no_grad(|| -> Result<()> {
        for l in linears {
            let Some(lora) = l.lora.take() else {
                continue;
            };
            let kind = l.weight.f_kind()?;
            let delta = lora
                .b
                .f_to_kind(Kind::Double)?
                .f_matmul(&lora.a.f_to_kind(Kind::Double)?)?
                .f_mul_scalar(lora.scale)?;
            let w = l
                .weight
                .f_to_kind(Kind::Double)?
                .f_add(&delta.f_to_device(l.weight.device())?)?
                .f_to_kind(kind)?;
            l.weight.f_copy_(&w)?;
            merged.push(l.name.clone());
        }
        Ok(())
    })?;
    merged.sort();
    Ok(merged)
}

/// Merges `model`'s adapters ([`merge_lora`]) and writes it as a Hugging Face folder `dir`
/// (`config.json` + `model.safetensors` by
/// [`crate::checkpoint::save_pretrained_without`], leaving out the variables that match
/// `skip`), with the card and the tokenizer files of [`ExportOptions::tokenizer_from`].
/// Returns the merged module names (empty for a model without adapters).
///
/// # Errors
/// A family that cannot be exported as a Hugging Face folder, or an I/O failure.
pub fn save_merged<M: Model + ?Sized>(
    model: &mut M,
    dir: impl AsRef<Path>,
    skip: &[&str],
    opts: &ExportOptions,
) -> Result<Vec<String>> {
    let dir = dir.as_ref();
    let merged = merge_lora(model)?;
    save_pretrained_without(model, dir, skip)?;
    finish(
        dir,
        &card(Form::Merged(&merged), opts, model.num_labels()),
        opts,
    )?;
    Ok(merged)
}

enum Form<'a> {
    Adapter(&'a AdapterReport),
    Merged(&'a [String]),
}

/// The card and the tokenizer files.
fn finish(dir: &Path, card: &str, opts: &ExportOptions) -> Result<()> {
    write_file(dir, CARD, card.as_bytes())?;
    if let Some(src) = &opts.tokenizer_from {
        for f in TOKENIZER_FILES {
            let from = src.join(f);
            if from.is_file() {
                let bytes = std::fs::read(&from).map_err(|e| io_err(&from, e))?;
                write_file(dir, f, &bytes)?;
            }
        }
    }
    Ok(())
}

/// The model card: what the folder holds and how its logits are computed.
fn card(form: Form<'_>, opts: &ExportOptions, num_labels: Option<i64>) -> String {
    let c = num_labels.map_or_else(|| "C".to_string(), |c| c.to_string());
    let mut s = String::from("# A model exported by raptor\n\n");
    let base = if opts.base_model.is_empty() {
        "<the base checkpoint>".to_string()
    } else {
        opts.base_model.clone()
    };
    match form {
        Form::Adapter(r) => {
            s.push_str(&format!(
                "A PEFT LoRA adapter (r {}, lora_alpha {}) on {} modules of the base checkpoint \
                 `{base}`; {} saved whole (`modules_to_save`). Load it onto that checkpoint:\n\n",
                r.r,
                r.alpha,
                r.target_modules.len(),
                r.modules_to_save.join(", ")
            ));
            s.push_str("```python\nfrom transformers import AutoModelForSequenceClassification\n");
            s.push_str("from peft import PeftModel\n\n");
            s.push_str(&format!(
                "base = AutoModelForSequenceClassification.from_pretrained(\"{base}\", num_labels={c})\n"
            ));
            s.push_str("model = PeftModel.from_pretrained(base, \"<this folder>\").eval()\n");
            match opts.pooling {
                Some(BertPooling::Mean) => {
                    s.push_str("bert, head = model.base_model.model.bert, model.base_model.model.classifier\n");
                }
                _ => s.push_str("logits = model(input_ids=ids, attention_mask=mask).logits\n"),
            }
        }
        Form::Merged(m) => {
            s.push_str(&format!(
                "A Hugging Face checkpoint (`config.json` + `model.safetensors`, the head \
                 included) with {} LoRA adapters merged into the base weights (W + scale·B·A); \
                 it needs no PEFT:\n\n",
                m.len()
            ));
            s.push_str(
                "```python\nfrom transformers import AutoModelForSequenceClassification\n\n",
            );
            s.push_str(
                "model = AutoModelForSequenceClassification.from_pretrained(\"<this folder>\").eval()\n",
            );
            match opts.pooling {
                Some(BertPooling::Mean) => {
                    s.push_str("bert, head = model.bert, model.classifier\n");
                }
                _ => s.push_str("logits = model(input_ids=ids, attention_mask=mask).logits\n"),
            }
        }
    }
    if opts.pooling == Some(BertPooling::Mean) {
        s.push_str("h = bert(input_ids=ids, attention_mask=mask).last_hidden_state\n");
        s.push_str("m = mask.unsqueeze(-1).to(h.dtype)\n");
        s.push_str("logits = head((h * m).sum(1) / m.sum(1))\n```\n\n");
        s.push_str(
            "The classifier reads the **mean of the encoder's last hidden state over the valid \
             tokens** (sentence-transformers' pooling), not the `[CLS]` pooler of \
             `BertForSequenceClassification`: calling the model's own forward (`model(...).logits`) \
             would use the pooler, which this model did not train with (transformers initializes it \
             at random when the checkpoint lacks it, and says so).\n",
        );
    } else {
        s.push_str("```\n");
    }
    s.push_str(
        "\nClass i is the run's i-th label (the `labels.json` of a raptor run folder). Tokenize \
         with the base checkpoint's tokenizer (copied here when the run used it).\n",
    );
    s
}

/// The adapter tensors PEFT reads back from `dir`, by their names without [`PEFT_PREFIX`]
/// (raptor's variable names): a convenience for checks and for loading an adapter folder back
/// into a model built the same way.
///
/// # Errors
/// An unreadable or corrupt weights file, or a tensor name without the prefix.
pub fn read_adapter(dir: impl AsRef<Path>) -> Result<BTreeMap<String, Tensor>> {
    let path = dir.as_ref().join(ADAPTER_WEIGHTS);
    let mut out = BTreeMap::new();
    for (n, t) in crate::checkpoint::read_safetensors(&path)? {
        let Some(name) = n.strip_prefix(PEFT_PREFIX) else {
            return Err(ModelError::CorruptCheckpoint {
                path: path.display().to_string(),
                why: format!("tensor {n} lacks the prefix {PEFT_PREFIX}"),
            });
        };
        out.insert(name.to_string(), t);
    }
    Ok(out)
}
