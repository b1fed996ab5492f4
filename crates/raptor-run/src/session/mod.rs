//! Everything a run needs before its first update, built from the config: records and
//! tokenizer (the input half, in `inputs`), label map, model, RAPTOR's layer and owner maps,
//! the plan.

use std::collections::BTreeMap;
use std::path::Path;

use raptor_data::LabelMap;
use raptor_models::factory::{ModelSource, ModelSpec, ScratchDims};
use raptor_models::tokenizer::TextTokenizer;
use raptor_models::{Batch, BertPooling, Model, Task};
use tch::Device;

use crate::device::open_device;
use crate::error::{Result, RunError};
use raptor_train::config::{
    DataConfig, LayerSpec, Method, MethodConfig, ModelConfig, ModelKind, Pooling, RunConfig,
};
use raptor_train::methods::{LayerChoice, PrivacyPlan, build_plan, choose_layer, owner_rule};
use raptor_train::streams::Plan;
use raptor_train::trainer::Example;

mod inputs;
pub use inputs::{
    Encoding, d2t_prompt, eos_id, gguf_model_file, is_classifier, open_model_tokenizer,
    open_run_tokenizer, open_tokenizer, read_d2t, read_records, to_d2t_examples, to_examples,
};
use inputs::{data_err, model_source, setup_hint};

/// A prepared run.
pub struct Session {
    /// The resolved config.
    pub cfg: RunConfig,
    /// The model (scope set: LoRA attached, frozen parts frozen).
    pub model: Box<dyn Model>,
    /// The tokenizer.
    pub tokenizer: Box<dyn TextTokenizer>,
    /// Class names (classification).
    pub labels: Option<LabelMap>,
    /// Private training records.
    pub train: Vec<Example>,
    /// Validation records.
    pub validation: Vec<Example>,
    /// The plan.
    pub plan: Plan,
    /// The privacy plan.
    pub privacy: PrivacyPlan,
    /// RAPTOR's layer choice.
    pub layer: Option<LayerChoice>,
    /// Owner maps of the trained layers over the training records.
    pub owners: BTreeMap<usize, Vec<i64>>,
    /// Device.
    pub device: Device,
    /// Padding id.
    pub pad_id: i64,
    /// Data-to-text validation sources (prompt tokens, references) for generation metrics.
    pub validation_sources: Vec<SourceRefs>,
    /// A white-box audit run's Dirac canaries (set only by
    /// [`crate::train_prepared_with_canaries`]; None for every other run).
    pub(crate) canaries: Option<raptor_train::trainer::DiracCanaries>,
    /// Seconds each part of the preparation took, in order (the model's load, the records,
    /// public routing, the privacy plan, the owner maps, ...): where the time before the first
    /// update goes.
    pub prepare_seconds: Vec<(&'static str, f64)>,
}

/// Seconds of the parts of a preparation, lap by lap.
struct Laps {
    last: std::time::Instant,
    laps: Vec<(&'static str, f64)>,
}

impl Laps {
    fn new() -> Self {
        Self {
            last: std::time::Instant::now(),
            laps: Vec::new(),
        }
    }

    /// Ends the part named `name` (the time since the previous lap).
    fn lap(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.laps.push((name, (now - self.last).as_secs_f64()));
        self.last = now;
    }
}

/// A data-to-text source and its references (for BLEU / ROUGE-L).
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRefs {
    /// The source text.
    pub source: String,
    /// The prompt tokens.
    pub prompt: Vec<i64>,
    /// All references of the source.
    pub references: Vec<String>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("method", &self.cfg.method.name())
            .field("train", &self.train.len())
            .field("validation", &self.validation.len())
            .finish_non_exhaustive()
    }
}

/// raptor-models' pooling of `model.pooling`.
pub(crate) fn bert_pooling(pooling: Pooling) -> BertPooling {
    match pooling {
        Pooling::Pooler => BertPooling::Pooler,
        Pooling::Mean => BertPooling::Mean,
    }
}

/// Builds the model of `[model]` (from a Hugging Face folder, a GGUF file or from scratch,
/// seeded by `seed`, the run's `train.seed`) with raptor-models' factory; `max_length` is
/// `data.max_length` (a model built from scratch has that many positions).
pub fn build_model(
    m: &ModelConfig,
    max_length: usize,
    seed: u64,
    vocab: i64,
    num_labels: i64,
    device: Device,
) -> Result<Box<dyn Model>> {
    let source = match &m.path {
        None => None,
        Some(p) if m.kind.is_bert() => {
            if !p.exists() {
                return Err(RunError::Config(format!(
                    "model.path {} does not exist{}",
                    p.display(),
                    setup_hint(p)
                )));
            }
            Some(ModelSource::Folder(p.clone()))
        }
        Some(p)
            if matches!(
                m.kind,
                ModelKind::Llama | ModelKind::Mixtral | ModelKind::Qwen2Moe
            ) =>
        {
            Some(match model_source(p)? {
                (f, true) => ModelSource::Gguf(f),
                (f, false) => ModelSource::Folder(f),
            })
        }
        Some(p) => Some(ModelSource::Folder(p.clone())),
    };
    let spec = ModelSpec {
        family: raptor_train::methods::naming(m.kind),
        source,
        dims: ScratchDims {
            d_model: m.d_model,
            heads: m.heads,
            d_ff: m.d_ff,
            layers: m.layers,
            experts: m.experts,
        },
        vocab,
        num_labels,
        pooling: bert_pooling(m.pooling),
        max_positions: max_length as i64,
        seed: seed as i64,
    };
    raptor_models::factory::build(&spec, device).map_err(|e| match e {
        // A checkpoint of another family: say which settings disagree.
        raptor_models::ModelError::WrongFamily { path, found, .. } => RunError::Config(format!(
            "model.path {path} holds a {found} checkpoint, not model.kind {:?}",
            m.kind
        )),
        other => other.into(),
    })
}

/// Batches of `examples` (for routing collection), `size` records each.
fn batches(
    examples: &[Example],
    size: usize,
    pad: i64,
    device: Device,
    labelled: bool,
) -> Result<Vec<Batch>> {
    let mut out = Vec::new();
    for chunk in examples.chunks(size.max(1)) {
        let toks: Vec<Vec<i64>> = chunk.iter().map(|e| e.tokens.clone()).collect();
        let labels: Option<Vec<i64>> =
            labelled.then(|| chunk.iter().map(|e| e.label.unwrap_or(0)).collect());
        out.push(Batch::from_records(&toks, pad, labels.as_deref(), device)?);
    }
    Ok(out)
}

/// What a [`prepare_with`] hook knows about the data when it may change the training records.
#[derive(Debug, Clone, PartialEq)]
pub struct DataInfo {
    /// Whether the model classifies (else: language modelling).
    pub classifier: bool,
    /// Number of classes (0 for language models).
    pub num_labels: usize,
    /// The model's vocabulary size.
    pub vocab: i64,
    /// Padding id.
    pub pad_id: i64,
    /// End-of-sequence id.
    pub eos_id: i64,
    /// `data.max_length`.
    pub max_length: usize,
    /// The largest record id among the training and validation records (fresh ids start above).
    pub max_id: u64,
}

impl DataInfo {
    /// What a hook is told of records tokenized by `enc` for a model of `vocab` tokens (the
    /// largest record id is filled in by the preparation).
    fn new(enc: Encoding, classifier: bool, num_labels: usize, vocab: i64, pad_id: i64) -> Self {
        Self {
            classifier,
            num_labels,
            vocab,
            pad_id,
            eos_id: i64::from(enc.eos),
            max_length: enc.max_length,
            max_id: 0,
        }
    }
}

/// The plan of `settings` over `model` for `n` records, its adapters initialised from `seed`
/// (the run's `train.seed` + 1, as every run of that seed).
fn plan_seeded(
    settings: raptor_train::methods::PlanSettings<'_>,
    seed: u64,
    model: &mut dyn Model,
    n: usize,
    layer: Option<usize>,
) -> Result<(Plan, PrivacyPlan)> {
    Ok(raptor_models::rng::seeded(seed as i64, || {
        build_plan(settings, model, n, layer)
    })?)
}

/// A hook that may change the training records after they are read and before anything is
/// computed from them (the plan's N and q, owner maps): the canaries of `raptor audit`.
pub type TrainHook<'a> = &'a mut dyn FnMut(&mut Vec<Example>, &DataInfo) -> Result<()>;

fn apply_hook(
    hook: Option<TrainHook<'_>>,
    train: &mut Vec<Example>,
    validation: &[Example],
    info: DataInfo,
) -> Result<()> {
    if let Some(h) = hook {
        let max_id = train
            .iter()
            .chain(validation)
            .map(|e| e.id)
            .max()
            .unwrap_or(0);
        h(train, &DataInfo { max_id, ..info })?;
        if train.is_empty() {
            return Err(RunError::Data(
                "no training record is left after the hook".into(),
            ));
        }
    }
    Ok(())
}

/// Prepares a run from its config: reads and checks everything before training starts, so a
/// bad input fails here, with nothing written.
pub fn prepare(cfg: &RunConfig) -> Result<Session> {
    prepare_with(cfg, None)
}

/// [`prepare`], with a hook that may change the training records before the plan (N, q, σ) and
/// the owner maps are computed from them.
pub fn prepare_with(cfg: &RunConfig, hook: Option<TrainHook<'_>>) -> Result<Session> {
    prepare_counting(cfg, hook, 0)
}

/// The label set of a classifier: `data.labels` when declared (public), else the labels of
/// the training records; at least two.
fn label_map(data: &DataConfig, train_ds: &raptor_data::Dataset) -> Result<LabelMap> {
    let m = match &data.labels {
        Some(list) => LabelMap::from_list(list.clone())
            .map_err(|e| RunError::Config(format!("data.labels: {e}")))?,
        None => LabelMap::from_records(&train_ds.records).map_err(data_err)?,
    };
    if m.len() < 2 {
        return Err(RunError::Data(format!(
            "{}: column {} holds fewer than two distinct labels ({:?})",
            data.train.display(),
            data.label_column,
            m.labels()
        )));
    }
    Ok(m)
}

/// Training and validation records: `data.validation` when given, else a seeded split of the
/// training file by `data.validation_fraction` (seeded by `seed`, the run's `train.seed`), else
/// no validation.
fn split_records(
    data: &DataConfig,
    seed: u64,
    train_ds: &raptor_data::Dataset,
    classify: bool,
) -> Result<(Vec<raptor_data::Record>, Vec<raptor_data::Record>)> {
    Ok(match &data.validation {
        Some(p) => (
            train_ds.records.clone(),
            read_records(data, p, classify)?.records,
        ),
        None if data.validation_fraction > 0.0 => {
            let split =
                raptor_data::validation_split(&train_ds.ids(), data.validation_fraction, seed)
                    .map_err(data_err)?;
            (
                train_ds.select(&split.kept),
                train_ds.select(&split.held_out),
            )
        }
        None => (train_ds.records.clone(), Vec::new()),
    })
}

/// RAPTOR's sparse layer (methods with experts), from the public corpus's routing under the
/// entropy rule, or by the configured position; no private record is involved. Methods
/// without experts get none (a classifier trained with (DP-Adam) LoRA must still have a sparse
/// layer: its experts are part of the scope).
fn public_layer(
    method: &MethodConfig,
    data: &DataConfig,
    enc: Encoding,
    model: &dyn Model,
    tokenizer: &dyn TextTokenizer,
    pad_id: i64,
    device: Device,
) -> Result<Option<LayerChoice>> {
    let model_vocab = model.vocab_size();
    if method.name().needs_experts() {
        let sparse = model.sparse_layers();
        // Only the entropy rule reads the public corpus's routing.
        let public = match (&data.public, method.layer()) {
            (Some(p), Some(LayerSpec::Entropy)) => {
                let ds = read_records(data, p, false)?;
                let mut ex = to_examples(enc, tokenizer, &ds.records, None, model_vocab)?;
                // Batched by length: a batch is padded to its longest record, and the layer
                // choice reads only counts of owners over the corpus, whatever the order (a
                // record's routing does not depend on its batch beyond float round-off).
                ex.sort_by_key(|e| e.tokens.len());
                let bs = batches(&ex, 64, pad_id, device, !enc.language_model)?;
                let routing = raptor_models::collect_routing(model, bs.iter())?;
                let mut corpus = raptor_routing::PublicCorpus::new();
                for (l, r) in routing {
                    corpus.add_layer(l, r)?;
                }
                Some(corpus)
            }
            _ => None,
        };
        Ok(Some(choose_layer(method, &sparse, public.as_ref())?))
    } else {
        if !enc.language_model
            && matches!(method.name(), Method::DpAdamLora | Method::Lora)
            && model.sparse_layers().is_empty()
        {
            return Err(RunError::Config("the model has no sparse layer".into()));
        }
        Ok(None)
    }
}

/// Owner maps of the plan's owner layers over the private training records, once, from the
/// frozen model (expert LoRA B = 0 at this point, so the routing is the pretrained one). Each
/// record is routed on its own: its owner cannot depend on the other records.
fn owner_maps(
    rule: raptor_routing::OwnerRule,
    model: &dyn Model,
    plan: &Plan,
    train: &[Example],
    pad_id: i64,
    device: Device,
) -> Result<BTreeMap<usize, Vec<i64>>> {
    let mut owners = BTreeMap::new();
    let owner_layers: Vec<usize> = plan
        .phases
        .iter()
        .flat_map(|p| p.owner_layers.clone())
        .collect();
    if !owner_layers.is_empty() {
        let tokens: Vec<Vec<i64>> = train.iter().map(|e| e.tokens.clone()).collect();
        let maps = raptor_models::owners_per_record(model, &tokens, pad_id, rule, device)?;
        for l in owner_layers {
            let v = maps
                .get(&l)
                .ok_or_else(|| RunError::Config(format!("no routing for layer {l}")))?;
            owners.insert(l, v.clone());
        }
    }
    Ok(owners)
}

/// At most `cap` of `records`, evenly strided (every record at `cap` = 0 or ≥ their number);
/// public records only, so the choice may depend on their count.
fn strided<T: Clone>(records: &[T], cap: usize) -> Vec<T> {
    let n = records.len();
    if cap == 0 || cap >= n {
        return records.to_vec();
    }
    (0..cap).map(|i| records[i * n / cap].clone()).collect()
}

/// The public records of `public_file` that clip bounds are calibrated on: at most `cap`
/// (`train.clip_public_records`), evenly strided, labelled with the run's label set.
fn public_clip_records(
    data: &DataConfig,
    enc: Encoding,
    public_file: &Path,
    cap: usize,
    tokenizer: &dyn TextTokenizer,
    labels: Option<&LabelMap>,
    vocab: i64,
) -> Result<Vec<Example>> {
    let ds = read_records(data, public_file, !enc.language_model)?;
    let records = strided(&ds.records, cap);
    to_examples(enc, tokenizer, &records, labels, vocab)
}

/// Clip bounds from `public` records (quantile `q` of their gradient norms, each routed on its
/// own by `rule`), written into `plan`; what was chosen, for the record.
fn public_clip_bounds(
    rule: raptor_routing::OwnerRule,
    model: &dyn Model,
    plan: &mut Plan,
    public: &[Example],
    q: f64,
    pad_id: i64,
    device: Device,
) -> Result<crate::public_clip::PublicClip> {
    let layers: Vec<usize> = plan
        .phases
        .iter()
        .flat_map(|ph| ph.owner_layers.clone())
        .collect();
    let public_owners = if layers.is_empty() {
        BTreeMap::new()
    } else {
        let tokens: Vec<Vec<i64>> = public.iter().map(|e| e.tokens.clone()).collect();
        raptor_models::owners_per_record(model, &tokens, pad_id, rule, device)?
    };
    crate::public_clip::calibrate(model, plan, public, &public_owners, q, pad_id, device)
}

/// [`prepare_with`], the plan made for `extra_records` records beside the training records
/// (a white-box audit's canaries: records without tokens).
pub fn prepare_counting(
    cfg: &RunConfig,
    hook: Option<TrainHook<'_>>,
    extra_records: usize,
) -> Result<Session> {
    cfg.validate()?;
    let mut laps = Laps::new();
    let device = open_device(cfg.train.device)?;
    if !cfg.data.train.exists() {
        let hint = match raptor_data::cache::default_cache_dir() {
            Some(c) if cfg.data.train.starts_with(c.join("data")) => {
                " (a corpus of the cache: run `cargo xtask setup --data` first)"
            }
            _ => "",
        };
        return Err(RunError::Data(format!(
            "training file {} does not exist{hint}",
            cfg.data.train.display()
        )));
    }
    let classify = is_classifier(&cfg.model);
    let tokenizer = open_run_tokenizer(&cfg.model)?;
    let vocab = tokenizer.vocab_size() as i64;
    let pad_id = i64::from(tokenizer.pad_id());
    if cfg.data.format.is_data_to_text() {
        let (train_recs, valid_recs) = d2t_split(&cfg.data, cfg.train.seed)?;
        if train_recs.is_empty() {
            return Err(RunError::Data(
                "no training record is left after the validation split".into(),
            ));
        }
        laps.lap("reading the records");
        let mut model = build_model(
            &cfg.model,
            cfg.data.max_length,
            cfg.train.seed,
            vocab,
            0,
            device,
        )?;
        laps.lap("model");
        let model_vocab = model.vocab_size();
        let enc = Encoding::of(&cfg.data, &cfg.model);
        let mut train = to_d2t_examples(enc, tokenizer.as_ref(), &train_recs, model_vocab)?;
        let validation = to_d2t_examples(enc, tokenizer.as_ref(), &valid_recs, model_vocab)?;
        apply_hook(
            hook,
            &mut train,
            &validation,
            DataInfo::new(enc, false, 0, model_vocab, pad_id),
        )?;
        let validation_sources = d2t_sources(
            valid_recs,
            &cfg.data.train,
            cfg.eval.max_sources,
            tokenizer.as_ref(),
            cfg.data.max_length,
        )?;
        laps.lap("records");
        let (plan, privacy) = plan_seeded(
            cfg.into(),
            cfg.train.seed.wrapping_add(1),
            model.as_mut(),
            train.len() + extra_records,
            None,
        )?;
        laps.lap("privacy plan");
        crate::memory::release_free_memory();
        return Ok(Session {
            cfg: cfg.clone(),
            model,
            tokenizer,
            labels: None,
            train,
            validation,
            plan,
            privacy,
            layer: None,
            owners: BTreeMap::new(),
            device,
            pad_id,
            validation_sources,
            canaries: None,
            prepare_seconds: laps.laps,
        });
    }
    let train_ds = read_records(&cfg.data, &cfg.data.train, classify)?;
    let labels = if classify {
        Some(label_map(&cfg.data, &train_ds)?)
    } else {
        None
    };
    let (train_recs, valid_recs) = split_records(&cfg.data, cfg.train.seed, &train_ds, classify)?;
    if train_recs.is_empty() {
        return Err(RunError::Data(
            "no training record is left after the validation split".into(),
        ));
    }
    let num_labels = labels.as_ref().map_or(0, |m| m.len() as i64);
    laps.lap("reading the records");
    let mut model = build_model(
        &cfg.model,
        cfg.data.max_length,
        cfg.train.seed,
        vocab,
        num_labels,
        device,
    )?;
    laps.lap("model");
    let model_vocab = model.vocab_size();
    let enc = Encoding::of(&cfg.data, &cfg.model);
    let mut train = to_examples(
        enc,
        tokenizer.as_ref(),
        &train_recs,
        labels.as_ref(),
        model_vocab,
    )?;
    let validation = to_examples(
        enc,
        tokenizer.as_ref(),
        &valid_recs,
        labels.as_ref(),
        model_vocab,
    )?;
    apply_hook(
        hook,
        &mut train,
        &validation,
        DataInfo::new(enc, classify, num_labels as usize, model_vocab, pad_id),
    )?;
    laps.lap("tokenizing");
    // RAPTOR's layer from public routing (no private record is involved).
    let layer = public_layer(
        &cfg.method,
        &cfg.data,
        enc,
        model.as_ref(),
        tokenizer.as_ref(),
        pad_id,
        device,
    )?;
    laps.lap("public routing");
    let (plan, privacy) = plan_seeded(
        cfg.into(),
        cfg.train.seed.wrapping_add(1),
        model.as_mut(),
        train.len() + extra_records,
        layer.as_ref().map(|l| l.layer),
    )?;
    laps.lap("privacy plan");
    if cfg.lora.dropout > 0.0 && train.iter().any(|e| e.id == u64::MAX) {
        return Err(RunError::Config("LoRA dropout needs record ids".into()));
    }
    let owners = owner_maps(
        owner_rule(&cfg.method),
        model.as_ref(),
        &plan,
        &train,
        pad_id,
        device,
    )?;
    laps.lap("owner maps");
    if model.task() == Task::Classification && labels.is_none() {
        return Err(RunError::Config("a classifier needs a label column".into()));
    }
    let mut plan = plan;
    let mut privacy = privacy;
    if let (Some(q), Some(p)) = (cfg.train.clip_from_public, &cfg.data.public) {
        let public = public_clip_records(
            &cfg.data,
            enc,
            p,
            cfg.train.clip_public_records,
            tokenizer.as_ref(),
            labels.as_ref(),
            model.vocab_size(),
        )?;
        privacy.public_clip = Some(public_clip_bounds(
            owner_rule(&cfg.method),
            model.as_ref(),
            &mut plan,
            &public,
            q,
            pad_id,
            device,
        )?);
        laps.lap("public clip bounds");
    }
    crate::memory::release_free_memory();
    Ok(Session {
        cfg: cfg.clone(),
        model,
        tokenizer,
        labels,
        train,
        validation,
        plan,
        privacy,
        layer,
        owners,
        device,
        pad_id,
        validation_sources: Vec::new(),
        canaries: None,
        prepare_seconds: laps.laps,
    })
}

/// The data-to-text records of `[data]`: the training file's, and the validation file's or a
/// seeded split (by `seed`, the run's `train.seed`) of the training file's.
fn d2t_split(
    data: &DataConfig,
    seed: u64,
) -> Result<(Vec<raptor_data::D2tRecord>, Vec<raptor_data::D2tRecord>)> {
    let train_ds = read_d2t(data, &data.train)?;
    Ok(match &data.validation {
        Some(p) => (train_ds.records.clone(), read_d2t(data, p)?.records),
        None if data.validation_fraction > 0.0 => {
            let ids: Vec<usize> = train_ds.records.iter().map(|r| r.id).collect();
            let split = raptor_data::validation_split(&ids, data.validation_fraction, seed)
                .map_err(data_err)?;
            let pick = |keep: &[usize]| -> Vec<raptor_data::D2tRecord> {
                train_ds
                    .records
                    .iter()
                    .filter(|r| keep.binary_search(&r.id).is_ok())
                    .cloned()
                    .collect()
            };
            let mut kept = split.kept.clone();
            kept.sort_unstable();
            let mut held = split.held_out.clone();
            held.sort_unstable();
            (pick(&kept), pick(&held))
        }
        None => (train_ds.records.clone(), Vec::new()),
    })
}

/// The validation sources of data-to-text records with their references and prompts (at most
/// `max_sources`, `eval.max_sources`; 0: all), for generation metrics.
fn d2t_sources(
    valid: Vec<raptor_data::D2tRecord>,
    path: &Path,
    max_sources: usize,
    tokenizer: &dyn TextTokenizer,
    max_length: usize,
) -> Result<Vec<SourceRefs>> {
    let valid_ds = raptor_data::D2tDataset {
        path: path.to_path_buf(),
        records: valid,
        skipped_empty: 0,
    };
    let mut sources = Vec::new();
    for g in valid_ds.group_by_source() {
        if max_sources > 0 && sources.len() >= max_sources {
            break;
        }
        sources.push(SourceRefs {
            prompt: d2t_prompt(tokenizer, &g.source, max_length)?,
            source: g.source,
            references: g.references,
        });
    }
    Ok(sources)
}

#[cfg(test)]
mod tests {
    use super::strided;

    /// The cap takes evenly spaced records, every one when it is 0 or not below their number.
    #[test]
    fn strided_takes_evenly_spaced_records() {
        let v: Vec<usize> = (0..10).collect();
        assert_eq!(strided(&v, 0), v);
        assert_eq!(strided(&v, 10), v);
        assert_eq!(strided(&v, 25), v);
        assert_eq!(strided(&v, 5), [0, 2, 4, 6, 8]);
        assert_eq!(strided(&v, 3), [0, 3, 6]);
        assert_eq!(strided(&v, 1), [0]);
    }
}
