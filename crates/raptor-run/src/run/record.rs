//! What a run reports: [`Record`] (`record.json`, what may be published beside the model, with
//! the certified [`FinalEpsilon`]) and [`PrivateRecord`] (`private/record.json`: computed from
//! private records without noise, never published; the membership-inference check of the
//! trained model), the validation metrics ([`ValidationMetrics`]: in the record only when the
//! validation file is declared public, else in the private record) and the generation metrics
//! of data-to-text runs (their text samples are always private).

#[allow(clippy::wildcard_imports)]
use super::*;

/// The final ε of a run, from its ledger.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FinalEpsilon {
    /// Certified upper bound (what may be claimed).
    pub upper: f64,
    /// Estimate.
    pub estimate: f64,
    /// Lower bound.
    pub lower: f64,
    /// δ.
    pub delta: f64,
    /// Releases charged.
    pub releases: u64,
    /// Ledger steps (a parallel expert step counts once).
    pub steps: u64,
}

/// Everything a run reports (`record.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// raptor's version.
    pub raptor_version: String,
    /// The device the run trained on (`cpu`, `cuda:N`).
    pub device: String,
    /// Where the noise came from and how it reached the device.
    pub noise_source: String,
    /// MPI ranks that trained the run data-parallel (1: one process).
    pub ranks: usize,
    /// Payload bytes rank 0 sent or received in collectives during the run (0 on one process).
    pub communicated_bytes: u64,
    /// libtorch version in use.
    pub libtorch: String,
    /// Method name.
    pub method: String,
    /// Seed of initialization.
    pub seed: u64,
    /// Whether sampling and noise were seeded (NOT private).
    pub insecure_seeded: bool,
    /// Training records N. Treated as public, as in every DP-SGD accountant: the sampling rate
    /// q = B/N of the privacy plan is derived from it. (The validation records' count is with
    /// their metrics.)
    pub train_records: usize,
    /// Class names.
    pub labels: Option<Vec<String>>,
    /// The privacy plan.
    pub privacy_plan: raptor_train::methods::PrivacyPlan,
    /// RAPTOR's layer choice (public).
    pub layer: Option<raptor_train::methods::LayerChoice>,
    /// Trainable parameters per phase.
    pub trainable_parameters: BTreeMap<raptor_train::streams::Stream, i64>,
    /// Updates applied.
    pub updates: u64,
    /// Certified ε spent after an update (update, ε), every 10 updates and at the end
    /// (private methods; this process only).
    pub epsilon_curve: Vec<(u64, f64)>,
    /// Final ε from the ledger (None for non-private methods: ε = ∞).
    pub epsilon: Option<FinalEpsilon>,
    /// Wall time of training (seconds, this process), periodic evaluations included.
    pub wall_seconds: f64,
    /// Of `wall_seconds`, the time spent in the periodic evaluations (`train.eval_every`).
    pub eval_seconds: f64,
    /// Updates per second.
    pub updates_per_second: f64,
    /// Times the run was resumed.
    pub resumed: u32,
    /// Notes (warnings) produced by the run.
    pub notes: Vec<String>,
    /// Where the validation records come from, whether they are public, and where their
    /// metrics are (none without validation records).
    pub validation: Option<ValidationInfo>,
    /// The validation metrics, here only when the validation records are public
    /// (`data.validation_public`); otherwise they are in `private/record.json` (see
    /// [`Record::validation_metrics`] for either).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation_metrics: Option<ValidationMetrics>,
    /// Where the label set comes from: declared in the config (`data.labels`), or read from the
    /// private training file (then the head's shape and `labels.json` reveal every label that
    /// occurs there, one that occurs only in private data included).
    pub labels_source: Option<String>,
    /// What the run computed from private records without noise, written to
    /// `private/record.json` (not differentially private: never publish it). Not part of
    /// `record.json`.
    #[serde(skip)]
    pub private: PrivateRecord,
}

impl Record {
    /// The validation metrics wherever they are: in the record (public validation records) or
    /// in its private part.
    pub fn validation_metrics(&self) -> Option<&ValidationMetrics> {
        self.validation_metrics
            .as_ref()
            .or(self.private.validation_metrics.as_ref())
    }

    /// The final validation metrics (public or private, see [`Record::validation_metrics`]).
    pub fn eval(&self) -> Option<&EvalMetrics> {
        self.validation_metrics().and_then(|v| v.eval.as_ref())
    }

    /// The validation metrics every `train.eval_every` updates (public or private).
    pub fn eval_curve(&self) -> &[(u64, EvalMetrics)] {
        self.validation_metrics()
            .map_or(&[], |v| v.eval_curve.as_slice())
    }

    /// The data-to-text generation metrics (public or private).
    pub fn generation(&self) -> Option<&GenerationMetrics> {
        self.validation_metrics()
            .and_then(|v| v.generation.as_ref())
    }
}

/// Where a run's validation records come from and where their metrics are.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ValidationInfo {
    /// The source: the validation file, or the part held out of the private training file.
    pub source: String,
    /// Whether the records are public (`data.validation_public` with a validation file).
    pub public: bool,
    /// The file holding the metrics, relative to the run folder: `record.json` (public
    /// records) or `private/record.json`.
    pub metrics_in: String,
}

impl ValidationInfo {
    /// What a run over `[data]` with `records` validation records says of them (none without).
    pub fn of(data: &raptor_train::config::DataConfig, records: usize) -> Option<Self> {
        if records == 0 {
            return None;
        }
        let public = data.validation_public && data.validation.is_some();
        let source = match &data.validation {
            Some(p) if public => format!("the public validation file {}", p.display()),
            Some(p) => format!(
                "the validation file {} (private: data.validation_public is not set)",
                p.display()
            ),
            None => format!(
                "records held out of the private training file {} (data.validation_fraction = {}): private",
                data.train.display(),
                data.validation_fraction
            ),
        };
        Some(Self {
            source,
            public,
            metrics_in: if public {
                "record.json".into()
            } else {
                "private/record.json".into()
            },
        })
    }
}

/// What a run measured on its validation records (without noise): the final metrics, the
/// periodic ones and, for data-to-text, generation scores.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ValidationMetrics {
    /// The number of validation records.
    pub records: usize,
    /// Validation metrics at the end.
    pub eval: Option<EvalMetrics>,
    /// Validation metrics every `train.eval_every` updates (update, metrics); the final
    /// evaluation is `eval`. Empty when `eval_every` is 0 or after a resume (this process only).
    pub eval_curve: Vec<(u64, EvalMetrics)>,
    /// Data-to-text generation metrics on the validation sources (scores only: the generated
    /// text and the references are in the private record's `generation_samples`).
    pub generation: Option<GenerationMetrics>,
}

/// The warning every file under a run's `private/` folder carries.
pub const PRIVATE_NOTICE: &str = "not differentially private: computed from private records \
     without noise; do not publish or share this file (the model, record.json and the epsilon \
     are what a run may publish)";

/// What a run computed from private records without noise (`private/record.json`): per-update
/// metrics of the private batches, membership inference on training records, RAPTOR's
/// diagnostics. For the data owner only: `raptor export` and `record.json` never include it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PrivateRecord {
    /// [`PRIVATE_NOTICE`].
    pub notice: String,
    /// Per-update metrics of the private batches (also appended to `private/metrics.jsonl`
    /// as training goes).
    pub metrics: Vec<UpdateMetrics>,
    /// Loss-threshold membership inference after training: training records (members) against
    /// held-out validation records (non-members), up to 1,000 of each (evenly strided). AUC near
    /// 0.5 and TPR near the FPR mean the losses do not tell members apart. Computed on private
    /// records: a diagnostic for the data owner, not part of the DP release.
    pub membership_inference: Option<raptor_eval::mia::MiaReport>,
    /// RAPTOR's diagnostics on held-out records (MoE classifiers, private methods).
    pub diagnostics: Option<crate::diagnostics::Diagnostics>,
    /// The validation metrics when the validation records are private (held out of the
    /// training file, or a validation file not declared public).
    pub validation_metrics: Option<ValidationMetrics>,
    /// A few generated examples of a data-to-text run, with their source and first reference
    /// (record text: always private, whatever the validation records are).
    pub generation_samples: Vec<GenerationSample>,
}

/// One generated example: record text, so only ever in the private record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GenerationSample {
    /// The source (the linearized meaning representation).
    pub source: String,
    /// What the model generated.
    pub generated: String,
    /// The first reference.
    pub reference: String,
}

/// Generation metrics of a data-to-text run (corpus BLEU and ROUGE-L over the sources).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GenerationMetrics {
    /// Sources generated for.
    pub sources: usize,
    /// Corpus BLEU (sacrebleu-compatible, 0–100).
    pub bleu: f64,
    /// ROUGE-L F-measure (0–100).
    pub rouge_l: f64,
    /// Beam width used.
    pub beams: usize,
}

/// Generates for every source and scores against its references; returns the scores and the
/// first few examples (record text: private).
/// `eval` is `[eval]` (new tokens, beams), `enc` the run's encoding (length limit, EOS) and
/// `micro_batch` `train.micro_batch` (sources generated at once).
pub fn generation_metrics(
    model: &dyn raptor_models::Model,
    tok: &dyn raptor_models::tokenizer::TextTokenizer,
    sources: &[crate::session::SourceRefs],
    eval: &raptor_train::config::EvalConfig,
    enc: crate::session::Encoding,
    micro_batch: usize,
    device: tch::Device,
) -> Result<(GenerationMetrics, Vec<GenerationSample>)> {
    let prompts: Vec<Vec<i64>> = sources.iter().map(|s| s.prompt.clone()).collect();
    let gcfg = raptor_models::generate::GenerateConfig {
        max_new_tokens: eval.max_new_tokens,
        beams: eval.beams,
        eos: i64::from(enc.eos),
        pad: i64::from(tok.pad_id()),
        length_penalty: 1.0,
        max_positions: enc.max_length.max(2),
        batch_size: micro_batch.max(1),
    };
    let out = raptor_models::generate::generate(model, &prompts, &gcfg, device)?;
    let mut hyps = Vec::with_capacity(out.len());
    for ids in &out {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        hyps.push(tok.decode(&ids)?.trim().to_string());
    }
    let refs: Vec<Vec<String>> = sources.iter().map(|s| s.references.clone()).collect();
    let bleu = raptor_eval::corpus_bleu(&hyps, &refs)
        .map_err(|e| RunError::Data(e.to_string()))?
        .score;
    // rouge-score's F-measure is in [0, 1]; reported ×100 like BLEU.
    let rouge = 100.0
        * raptor_eval::corpus_rouge_l(&hyps, &refs).map_err(|e| RunError::Data(e.to_string()))?;
    let samples = sources
        .iter()
        .zip(&hyps)
        .take(5)
        .map(|(s, h)| GenerationSample {
            source: s.source.clone(),
            generated: h.clone(),
            reference: s.references.first().cloned().unwrap_or_default(),
        })
        .collect();
    Ok((
        GenerationMetrics {
            sources: sources.len(),
            bleu,
            rouge_l: rouge,
            beams: eval.beams,
        },
        samples,
    ))
}

/// Positions of up to `n` of `len` records, evenly strided (deterministic, independent of the
/// values).
pub(crate) fn strided(len: usize, n: usize) -> Vec<usize> {
    if len <= n {
        return (0..len).collect();
    }
    (0..n).map(|i| i * len / n).collect()
}

/// The loss-threshold attack of [`PrivateRecord::membership_inference`]: `None` when either side has
/// fewer than 2 records.
pub(crate) fn membership_inference(
    model: &dyn raptor_models::Model,
    train: &[raptor_train::trainer::Example],
    validation: &[raptor_train::trainer::Example],
    micro_batch: usize,
    pad_id: i64,
    device: tch::Device,
    caches: &mut (
        Option<raptor_models::PrefixCache>,
        Option<raptor_models::PrefixCache>,
    ),
) -> Result<Option<raptor_eval::mia::MiaReport>> {
    let n = train.len().min(validation.len()).min(1000);
    if n < 2 {
        return Ok(None);
    }
    let members = raptor_train::trainer::per_record_losses_cached(
        model,
        train,
        Some(&strided(train.len(), n)),
        micro_batch,
        pad_id,
        device,
        caches.0.as_mut(),
    )?;
    let others = raptor_train::trainer::per_record_losses_cached(
        model,
        validation,
        Some(&strided(validation.len(), n)),
        micro_batch,
        pad_id,
        device,
        caches.1.as_mut(),
    )?;
    raptor_eval::mia::loss_attack(&members, &others)
        .map(Some)
        .map_err(|e| RunError::Data(format!("membership inference: {e}")))
}
