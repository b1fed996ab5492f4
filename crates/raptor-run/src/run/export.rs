//! A finished run: evaluation on labelled records ([`eval_run`]) and export of its model
//! ([`export_run`], [`export_run_as`], [`export_encoder`]): a Hugging Face folder, or for a LoRA
//! run a PEFT adapter folder or a merged Hugging Face folder (`raptor_models::peft`).

#[allow(clippy::wildcard_imports)]
use super::*;

/// A finished (or checkpointed) run's model, rebuilt as training built it.
pub(crate) struct RunModel {
    cfg: RunConfig,
    model: Box<dyn raptor_models::Model>,
    tokenizer: Box<dyn raptor_models::tokenizer::TextTokenizer>,
    labels: Option<raptor_data::LabelMap>,
    device: tch::Device,
}

/// Rebuilds the model of run folder `run` (config `cfg`): the base model, the trainable scope
/// (LoRA adapters) as training set it up, and the trained weights of its checkpoint.
pub(crate) fn load_run_model(run: &Path, cfg: RunConfig) -> Result<RunModel> {
    let classify = crate::session::is_classifier(&cfg.model);
    let device = crate::device::open_device(cfg.train.device)?;
    let tok = crate::session::open_run_tokenizer(&cfg.model)?;
    let labels = if classify {
        let lp = run.join("labels.json");
        let names: Vec<String> = serde_json::from_slice(&std::fs::read(&lp).map_err(io(&lp))?)?;
        Some(raptor_data::LabelMap::from_list(names).map_err(|e| RunError::Data(e.to_string()))?)
    } else {
        None
    };
    let num_labels = labels.as_ref().map_or(0, |l| l.len() as i64);
    let mut model = crate::session::build_model(
        &cfg.model,
        cfg.data.max_length,
        cfg.train.seed,
        tok.vocab_size() as i64,
        num_labels,
        device,
    )?;
    // Rebuild the trainable scope (LoRA adapters) as training did, then load its weights.
    let layer = if cfg.method.name().needs_experts() {
        let rec: serde_json::Value = serde_json::from_slice(
            &std::fs::read(run.join("record.json")).map_err(io(run.join("record.json")))?,
        )?;
        rec["layer"]["layer"].as_u64().map(|l| l as usize)
    } else {
        None
    };
    raptor_models::rng::seeded(cfg.train.seed.wrapping_add(1) as i64, || {
        raptor_train::methods::setup_scope((&cfg).into(), model.as_mut(), layer)
    })?;
    load_trainable(run, model.as_ref())?;
    Ok(RunModel {
        cfg,
        model,
        tokenizer: tok,
        labels,
        device,
    })
}

/// How a run that trained LoRA adapters is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExportForm {
    /// A PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`, the head
    /// saved whole as `modules_to_save`) that HF PEFT loads onto the run's base checkpoint.
    #[default]
    Adapter,
    /// A Hugging Face folder with the adapters merged into the base weights (W + scale·B·A),
    /// the head included.
    Merged,
}

/// What [`export_run_as`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub enum Exported {
    /// A run without adapters: its model as a Hugging Face folder.
    Full,
    /// A PEFT adapter folder.
    Adapter(raptor_models::peft::AdapterReport),
    /// A Hugging Face folder with these modules' adapters merged in.
    Merged(Vec<String>),
}

/// Exports the model of a finished run folder: a run without LoRA adapters as a Hugging Face
/// folder (`config.json` + `model.safetensors`) that `model.path` of another run can start
/// from (e.g. a non-private pretraining run on public text, fine-tuned privately afterwards);
/// a LoRA run as a PEFT adapter folder ([`ExportForm::Adapter`]; [`export_run_as`] for the
/// merged form).
pub fn export_run(run: &Path, out: &Path) -> Result<()> {
    export_run_as(run, out, ExportForm::Adapter).map(|_| ())
}

/// [`export_run`] with the form of a LoRA run chosen (`form` is ignored for a run without
/// adapters). Reads only the run's `config.toml`, `labels.json`, `record.json` and checkpoint
/// (never `private/`); writes only model files, the card and the base checkpoint's tokenizer
/// files (`raptor_models::peft`).
pub fn export_run_as(run: &Path, out: &Path, form: ExportForm) -> Result<Exported> {
    export_run_skipping(run, out, &[], form)
}

pub(crate) fn export_run_skipping(
    run: &Path,
    out: &Path,
    skip: &[&str],
    form: ExportForm,
) -> Result<Exported> {
    let cpath = run.join("config.toml");
    if !run.join("record.json").exists() {
        return Err(RunError::Run(format!(
            "{} is not a finished run folder (no record.json)",
            run.display()
        )));
    }
    let cfg = RunConfig::from_written_toml(&std::fs::read_to_string(&cpath).map_err(io(&cpath))?)?;
    let mut rm = load_run_model(run, cfg)?;
    let has_adapters = rm
        .model
        .var_store()
        .variables()
        .keys()
        .any(|k| k.contains(".lora_"));
    if !has_adapters {
        raptor_models::checkpoint::save_pretrained_without(rm.model.as_ref(), out, skip)?;
        return Ok(Exported::Full);
    }
    let opts = export_options(&rm.cfg.model);
    match form {
        ExportForm::Merged => Ok(Exported::Merged(raptor_models::peft::save_merged(
            rm.model.as_mut(),
            out,
            skip,
            &opts,
        )?)),
        ExportForm::Adapter => {
            if rm.cfg.model.path.is_none() {
                return Err(RunError::Run(format!(
                    "{}: the run's base model was initialized at random (no model.path), so there is no checkpoint to load an adapter onto: export it with --merged",
                    run.display()
                )));
            }
            if !skip.is_empty() {
                return Err(RunError::Run(
                    "an adapter folder keeps the head (modules_to_save); export the merged form to leave it out".into(),
                ));
            }
            Ok(Exported::Adapter(raptor_models::peft::save_adapter(
                rm.model.as_mut(),
                out,
                &opts,
            )?))
        }
    }
}

/// What an export of a run of `cfg` records beside the weights: the base checkpoint, the
/// pooling of a BERT classifier, and the base checkpoint's own tokenizer files (public: a
/// tokenizer given as a file may have been made from private text and is not copied).
fn export_options(model: &raptor_train::config::ModelConfig) -> raptor_models::peft::ExportOptions {
    let base = model.path.clone();
    raptor_models::peft::ExportOptions {
        base_model: base
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        pooling: model
            .kind
            .is_bert()
            .then_some(crate::session::bert_pooling(model.pooling)),
        tokenizer_from: match (&model.tokenizer, base) {
            (raptor_train::config::TokenizerSpec::Model, Some(p)) if p.is_dir() => Some(p),
            _ => None,
        },
    }
}

/// [`export_run`] without the task head (`classifier.*`, `score.*`): an encoder to fine-tune
/// on another task, whose runs get a new head of their own label count (a LoRA run's adapters
/// are merged in).
pub fn export_encoder(run: &Path, out: &Path) -> Result<()> {
    export_run_skipping(run, out, &["classifier.*", "score.*"], ExportForm::Merged).map(|_| ())
}

/// What `raptor eval` reports.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    /// Loss / accuracy / NLL.
    pub metrics: EvalMetrics,
    /// BLEU and ROUGE-L (data-to-text).
    pub generation: Option<GenerationMetrics>,
}

/// Evaluates a finished (or checkpointed) run on `data` (a table with the run's columns).
pub fn eval_run(run: &Path, data: Option<&Path>) -> Result<EvalReport> {
    let cpath = run.join("config.toml");
    if !cpath.exists() {
        return Err(RunError::Run(format!(
            "{} is not a run folder (no config.toml)",
            run.display()
        )));
    }
    let cfg = RunConfig::from_written_toml(&std::fs::read_to_string(&cpath).map_err(io(&cpath))?)?;
    let RunModel {
        cfg,
        model,
        tokenizer: tok,
        labels,
        device,
    } = load_run_model(run, cfg)?;
    let classify = crate::session::is_classifier(&cfg.model);
    let enc = crate::session::Encoding::of(&cfg.data, &cfg.model);
    let path = data
        .map(Path::to_path_buf)
        .or(cfg.data.validation.clone())
        .ok_or_else(|| {
            RunError::Config("no evaluation data: pass --data or set data.validation".into())
        })?;
    let pad = i64::from(tok.pad_id());
    if cfg.data.format.is_data_to_text() {
        let ds = crate::session::read_d2t(&cfg.data, &path)?;
        let ex =
            crate::session::to_d2t_examples(enc, tok.as_ref(), &ds.records, model.vocab_size())?;
        let metrics = evaluate(model.as_ref(), &ex, cfg.train.micro_batch, pad, device)?;
        let mut sources = Vec::new();
        for g in ds.group_by_source() {
            if cfg.eval.max_sources > 0 && sources.len() >= cfg.eval.max_sources {
                break;
            }
            sources.push(crate::session::SourceRefs {
                prompt: crate::session::d2t_prompt(tok.as_ref(), &g.source, cfg.data.max_length)?,
                source: g.source,
                references: g.references,
            });
        }
        let (generation, _samples) = generation_metrics(
            model.as_ref(),
            tok.as_ref(),
            &sources,
            &cfg.eval,
            enc,
            cfg.train.micro_batch,
            device,
        )?;
        let generation = Some(generation);
        return Ok(EvalReport {
            metrics,
            generation,
        });
    }
    let ds = crate::session::read_records(&cfg.data, &path, classify)?;
    let ex = crate::session::to_examples(
        enc,
        tok.as_ref(),
        &ds.records,
        labels.as_ref(),
        model.vocab_size(),
    )?;
    Ok(EvalReport {
        metrics: evaluate(model.as_ref(), &ex, cfg.train.micro_batch, pad, device)?,
        generation: None,
    })
}
