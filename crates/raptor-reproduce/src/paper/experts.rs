//! Experts that are experts: after the public pretraining (or sparse upcycling) of a MoE
//! encoder, its routers are trained toward the task's **domains** on public records
//! ([`raptor_models::upcycle::route_folder`]: every token of a record to the expert of the
//! record's domain) and frozen, then the experts are trained further, non-privately, on the
//! public records with their natural labels: LoRA adapters (rank [`CONTINUED_RANK`]) on every
//! expert of every sparse layer and a temporary head, everything else frozen, merged into the
//! experts afterwards. Each expert learns from the records routed to it (its domain's), so the
//! experts move apart, and the routing cannot drift (nothing before a router changes). Both
//! steps read public records only and are cached. The report says how well the final model's
//! routing follows the domains (the owner rule of a private run, on public records) and how
//! far apart its experts are.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use raptor_models::upcycle::{
    ExpertSpread, LayerAgreement, PartitionReport, PartitionTokens, RouterTraining,
};
use raptor_train::config::{DeviceSpec, Method, MethodConfig, RunConfig};
use sha2::{Digest, Sha256};

use super::runs::file_hash;
use super::{Backbone, domains::domain_parts, fit_batch, pretrain};
use crate::context::Schedule;

/// The settings of the specialisation.
#[derive(Debug, Clone)]
pub struct Specialisation {
    /// Public records with natural labels and a `domain` column (never a private record).
    pub public: PathBuf,
    /// Public records that score the continued training (natural labels).
    pub validation: PathBuf,
    /// The domains, in expert order.
    pub domains: Vec<String>,
    /// Router training toward the domains.
    pub router: RouterTraining,
    /// Public records the router training and the report read at most (evenly strided; 0:
    /// all).
    pub max_records: usize,
    /// Continued public training: updates, expected batch, learning rate.
    pub cont: Schedule,
    /// Records per forward pass of the continued training.
    pub micro_batch: usize,
    /// The per-user cache (the routed folders go to `<cache>/reproduce/routed/`, the continued
    /// training beside the pretrained models).
    pub cache: PathBuf,
    /// Device of the continued training.
    pub device: DeviceSpec,
    /// Tokens per record.
    pub max_len: usize,
}

/// What the specialisation produced and measured.
#[derive(Debug, Clone)]
pub struct Specialised {
    /// The continued training (its exported folder is the model every run starts from).
    pub cont: pretrain::Pretraining,
    /// The router training's report (agreement before and right after it).
    pub routing: PartitionReport,
    /// The final model's routing agreement with the domains on the public records.
    pub agreement: Vec<LayerAgreement>,
    /// How far apart the experts were before the continued training (right after routing).
    pub spread_before: Vec<ExpertSpread>,
    /// How far apart the final model's experts are.
    pub spread: Vec<ExpertSpread>,
    /// Public records the router training and the report read.
    pub records: usize,
}

impl Specialised {
    /// The notes on routing and experts, computed from the reports.
    pub fn notes(&self, task: &str) -> Vec<String> {
        let layers = |a: &[LayerAgreement], f: fn(&LayerAgreement) -> f64| -> String {
            a.iter()
                .map(|x| format!("{:.1} %", 100.0 * f(x)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let spread = |s: &[ExpertSpread]| -> String {
            s.iter()
                .map(|x| format!("mean {:.3}, closest pair {:.3}", x.mean, x.min))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let min_final = self
            .agreement
            .iter()
            .map(|a| a.records)
            .reduce(f64::min)
            .unwrap_or(0.0);
        vec![
            format!(
                "{task}: routers trained toward the domains on {} public records (owner–domain agreement, the private runs' gate-weighted owner rule, per sparse layer: {} before → {} after router training; tokens routed to their record's domain expert: {} → {}), then frozen.",
                self.records,
                layers(&self.routing.before, |a| a.records),
                layers(&self.routing.after, |a| a.records),
                layers(&self.routing.before, |a| a.tokens),
                layers(&self.routing.after, |a| a.tokens),
            ),
            format!(
                "{task}: after the continued public training ({} updates), the routing of the model every run starts from agrees with the domains on {} of the public records ({}; tokens {}) — {} the 90 % the design aims for; the experts' relative distance (‖θ_i − θ_j‖ over their mean norm) went from {} to {}.",
                self.cont.job.cfg.train.steps.unwrap_or(0),
                layers(&self.agreement, |a| a.records),
                if self.agreement.len() == 1 {
                    "one sparse layer".to_string()
                } else {
                    format!("{} sparse layers", self.agreement.len())
                },
                layers(&self.agreement, |a| a.tokens),
                if min_final >= 0.9 {
                    "at least"
                } else {
                    "BELOW"
                },
                spread(&self.spread_before),
                spread(&self.spread),
            ),
        ]
    }
}

fn short(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The public records (evenly strided, at most `max`) as token ids of the backbone's tokenizer
/// for the model in `folder`, with their domain parts.
fn public_tokens(
    folder: &Path,
    backbone: &Backbone,
    spec: &Specialisation,
) -> anyhow::Result<(Vec<Vec<i64>>, Vec<i64>, i64)> {
    let ds = raptor_data::read_table(
        &spec.public,
        &raptor_data::TableSpec::new("text", Some("label")),
    )
    .with_context(|| format!("reading {}", spec.public.display()))?;
    let parts = domain_parts(&spec.public, &spec.domains)?;
    let n = ds.records.len();
    let take = if spec.max_records == 0 {
        n
    } else {
        spec.max_records.min(n)
    };
    let idx: Vec<usize> = (0..take).map(|i| i * n / take.max(1)).collect();
    let records: Vec<raptor_data::Record> = idx.iter().map(|&i| ds.records[i].clone()).collect();
    let mut cfg = RunConfig::default();
    cfg.model.kind = backbone.kind;
    cfg.model.path = Some(folder.to_path_buf());
    cfg.model.tokenizer = backbone.tokenizer.clone();
    cfg.data.max_length = spec.max_len;
    let tok = raptor_run::session::open_run_tokenizer(&cfg.model)?;
    let vocab = raptor_models::hf_config::HfConfig::from_file(folder)?.vocab_size();
    let ex = raptor_run::session::to_examples(
        raptor_run::session::Encoding::of(&cfg.data, &cfg.model),
        tok.as_ref(),
        &records,
        None,
        vocab,
    )?;
    Ok((
        ex.into_iter().map(|e| e.tokens).collect(),
        idx.iter().map(|&i| parts[i]).collect(),
        i64::from(tok.pad_id()),
    ))
}

/// Trains the routers of the MoE folder `base` toward the domains (cached under
/// `<cache>/reproduce/routed/`, keyed by the folder's weights, the public file and the
/// settings); returns the routed folder and the router training's report.
pub fn route(
    name: &str,
    base: &Path,
    backbone: &Backbone,
    spec: &Specialisation,
) -> anyhow::Result<(PathBuf, PartitionReport, usize)> {
    let key = short(&format!(
        "routed-v2|{}|{}|{:?}|{:?}|{}|{}|{}|{:?}",
        file_hash(&base.join("model.safetensors"))?,
        file_hash(&spec.public)?,
        spec.domains,
        backbone.tokenizer,
        spec.max_len,
        spec.max_records,
        spec.router.steps,
        spec.router.lr.to_bits(),
    ));
    let root = spec.cache.join("reproduce").join("routed");
    let dir = root.join(format!("{name}-{key}"));
    let report_path = dir.join("partition.json");
    if dir.join("model.safetensors").is_file() && report_path.is_file() {
        let bytes = std::fs::read(&report_path)?;
        let r: PartitionReport = serde_json::from_slice(&bytes)
            .with_context(|| format!("parsing {}", report_path.display()))?;
        let n = r.records;
        return Ok((dir, r, n));
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let (records, parts, pad) = public_tokens(base, backbone, spec)?;
    let tmp = root.join(format!(".{name}-{key}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let report = raptor_models::upcycle::route_folder(
        base,
        &tmp,
        PartitionTokens {
            records: &records,
            parts: &parts,
            pad_id: pad,
            training: &spec.router,
        },
    )
    .with_context(|| {
        format!(
            "training the routers of {} toward the domains",
            base.display()
        )
    })?;
    // A tokenizer file the backbone names by path stays where it is; one inside the folder was
    // copied by `route_folder`.
    raptor_run::write_atomic(
        &tmp.join("partition.json"),
        &serde_json::to_vec_pretty(&report)?,
    )?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).with_context(|| format!("writing {}", dir.display()))?;
    let n = report.records;
    Ok((dir, report, n))
}

/// LoRA rank of the experts' continued public training.
pub const CONTINUED_RANK: i64 = 16;

/// The continued public training of the routed folder: LoRA on every expert (rank
/// [`CONTINUED_RANK`]) and a head, non-private, on the public records with their natural
/// labels; attention, embeddings and routers frozen (cached like a pretraining; exported with
/// the adapters merged into the experts and without the head).
pub fn continued(
    name: &str,
    routed: &Path,
    backbone: &Backbone,
    spec: &Specialisation,
) -> anyhow::Result<pretrain::Pretraining> {
    let n = super::read_lines(&spec.public, "text")?.len();
    let mut p = RunConfig::default();
    p.data.train = spec.public.clone();
    p.data.validation = Some(spec.validation.clone());
    p.data.max_length = spec.max_len;
    p.data.labels = Some(
        super::domains::LABELS
            .iter()
            .map(|l| l.to_string())
            .collect(),
    );
    p.model.kind = backbone.kind;
    p.model.path = Some(routed.to_path_buf());
    p.model.tokenizer = backbone.tokenizer.clone();
    if let Some(pool) = backbone.pooling {
        p.model.pooling = pool;
    }
    p.method = MethodConfig::new(Method::Lora);
    p.lora.attention = false;
    p.lora.experts = true;
    p.lora.r = CONTINUED_RANK;
    p.lora.alpha = 2.0 * CONTINUED_RANK as f64;
    p.train.steps = Some(spec.cont.updates);
    p.train.batch_size = fit_batch(spec.cont.batch, n);
    p.train.lr = spec.cont.lr;
    p.train.micro_batch = spec.micro_batch;
    p.train.checkpoint_every = 0;
    p.train.insecure_seed = Some(7);
    p.train.device = spec.device;
    // The routed folder's weights key the cache (its path is keyed by them too).
    let h = format!(
        "{}|{}",
        file_hash(&routed.join("model.safetensors"))?,
        file_hash(&spec.public)?
    );
    let mut pre = pretrain::Pretraining::plan(&spec.cache, &format!("{name}-experts"), &p, &h)?;
    pre.drop_head = true;
    Ok(pre)
}

/// The final folder's routing agreement with the domains and its experts' spread, on the
/// public records.
pub fn measure(
    folder: &Path,
    backbone: &Backbone,
    spec: &Specialisation,
) -> anyhow::Result<(Vec<LayerAgreement>, Vec<ExpertSpread>)> {
    let (records, parts, pad) = public_tokens(folder, backbone, spec)?;
    Ok(raptor_models::upcycle::folder_report(
        folder, &records, &parts, pad,
    )?)
}
