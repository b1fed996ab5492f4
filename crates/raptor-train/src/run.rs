//! Run folders: `config.toml` (resolved), `record.json` (what may be published beside the model),
//! `private/` (`record.json`, `metrics.jsonl`: computed from private records without noise, never
//! published), `checkpoint/`
//! (trainable parameters and optimizer state as safetensors named by update, `state.json` with
//! their SHA-256 and the update counter, `ledger.json`), a lock file; training with checkpoints
//! and resume; evaluation of a finished run.
//!
//! A run folder that holds a `buffer-tap.json` ([`BUFFER_TAP_FILE`]: `{"every": k,
//! "max_matrices": n}`) when training starts also keeps what Newton–Schulz orthogonalized at
//! every k-th update for the first n Muon matrices, with its per-entry noise std, under
//! `diagnostics/buffers-<update>.{safetensors,json}` (released momentum buffers: post-processing
//! of the noised gradients; [`raptor_optim::BufferTap`]). Experiments use it to measure
//! Newton–Schulz's noise bias on the buffers a real run releases.
//!
//! Durability: every file is written to a temporary name, fsynced and renamed; `state.json` is
//! the commit point of a checkpoint, and it and the ledger carry the SHA-256 of their content. The ledger is
//! written after each update's releases are charged and before they are applied, so after a
//! crash the ledger can only be ahead of the parameters (it over-counts, never under-counts).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use raptor_accountant::{Accuracy, Ledger, PrvAccountant};
use raptor_models::checkpoint::{read_safetensors, write_safetensors};
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::error::{Result, TrainError, io};
use crate::optim::{OptimScalars, OptimSettings};
use crate::session::{Session, prepare};
use crate::trainer::{EvalMetrics, Trainer, TrainerOptions, UpdateMetrics, evaluate};

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    {
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io(path))?;
    Ok(())
}

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
    /// Training records N.
    pub train_records: usize,
    /// Validation records.
    pub validation_records: usize,
    /// Class names.
    pub labels: Option<Vec<String>>,
    /// The privacy plan.
    pub privacy_plan: crate::methods::PrivacyPlan,
    /// RAPTOR's layer choice (public).
    pub layer: Option<crate::methods::LayerChoice>,
    /// Trainable parameters per phase.
    pub trainable_parameters: BTreeMap<String, i64>,
    /// Updates applied.
    pub updates: u64,
    /// Validation metrics every `train.eval_every` updates (update, metrics); the final
    /// evaluation is `eval`. Empty when `eval_every` is 0 or after a resume (this process only).
    pub eval_curve: Vec<(u64, EvalMetrics)>,
    /// Certified ε spent after an update (update, ε), every 10 updates and at the end
    /// (private methods; this process only).
    pub epsilon_curve: Vec<(u64, f64)>,
    /// Validation metrics at the end.
    pub eval: Option<EvalMetrics>,
    /// Data-to-text generation metrics on the validation sources.
    pub generation: Option<GenerationMetrics>,
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
    /// Where the validation metrics (`eval`, `eval_curve`) come from: the user's validation
    /// file, or records held out of the training file (then they are computed on private
    /// records without noise, like everything under `private/`).
    pub validation_source: Option<String>,
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
    /// A few examples: (source, generated, first reference).
    pub samples: Vec<(String, String, String)>,
}

/// Generates for every source and scores against its references.
pub fn generation_metrics(
    model: &dyn raptor_models::Model,
    tok: &dyn raptor_models::tokenizer::TextTokenizer,
    sources: &[crate::session::SourceRefs],
    cfg: &RunConfig,
    device: tch::Device,
) -> Result<GenerationMetrics> {
    let prompts: Vec<Vec<i64>> = sources.iter().map(|s| s.prompt.clone()).collect();
    let gcfg = raptor_models::generate::GenerateConfig {
        max_new_tokens: cfg.eval.max_new_tokens,
        beams: cfg.eval.beams,
        eos: i64::from(crate::session::eos_id(cfg)),
        pad: i64::from(tok.pad_id()),
        length_penalty: 1.0,
        max_positions: cfg.data.max_length.max(2),
        batch_size: cfg.train.micro_batch.max(1),
    };
    let out = raptor_models::generate::generate(model, &prompts, &gcfg, device)?;
    let mut hyps = Vec::with_capacity(out.len());
    for ids in &out {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        hyps.push(tok.decode(&ids)?.trim().to_string());
    }
    let refs: Vec<Vec<String>> = sources.iter().map(|s| s.references.clone()).collect();
    let bleu = raptor_eval::corpus_bleu(&hyps, &refs)
        .map_err(|e| TrainError::Data(e.to_string()))?
        .score;
    // rouge-score's F-measure is in [0, 1]; reported ×100 like BLEU.
    let rouge = 100.0
        * raptor_eval::corpus_rouge_l(&hyps, &refs).map_err(|e| TrainError::Data(e.to_string()))?;
    Ok(GenerationMetrics {
        sources: sources.len(),
        bleu,
        rouge_l: rouge,
        beams: cfg.eval.beams,
        samples: sources
            .iter()
            .zip(&hyps)
            .take(5)
            .map(|(s, h)| {
                (
                    s.source.clone(),
                    h.clone(),
                    s.references.first().cloned().unwrap_or_default(),
                )
            })
            .collect(),
    })
}

/// State saved with a checkpoint. It names the tensor files of its checkpoint (written under
/// names that carry the update, so the set `state.json` points at is always complete: a crash
/// between files leaves the previous state pointing at the previous files) and their SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointState {
    update: u64,
    optim: OptimScalars,
    resumed: u32,
    trainable_file: String,
    trainable_sha256: String,
    optimizer_file: String,
    optimizer_sha256: String,
}

/// Up to `n` records of `data`, evenly strided (deterministic, independent of the values).
fn strided(data: &[crate::trainer::Example], n: usize) -> Vec<crate::trainer::Example> {
    if data.len() <= n {
        return data.to_vec();
    }
    (0..n).map(|i| data[i * data.len() / n].clone()).collect()
}

/// The loss-threshold attack of [`PrivateRecord::membership_inference`]: `None` when either side has
/// fewer than 2 records.
fn membership_inference(
    model: &dyn raptor_models::Model,
    train: &[crate::trainer::Example],
    validation: &[crate::trainer::Example],
    micro_batch: usize,
    pad_id: i64,
    device: tch::Device,
) -> Result<Option<raptor_eval::mia::MiaReport>> {
    let n = train.len().min(validation.len()).min(1000);
    if n < 2 {
        return Ok(None);
    }
    let members =
        crate::trainer::per_record_losses(model, &strided(train, n), micro_batch, pad_id, device)?;
    let others = crate::trainer::per_record_losses(
        model,
        &strided(validation, n),
        micro_batch,
        pad_id,
        device,
    )?;
    raptor_eval::mia::loss_attack(&members, &others)
        .map(Some)
        .map_err(|e| TrainError::Data(format!("membership inference: {e}")))
}

/// Hex SHA-256 of `bytes`.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Write `value` as JSON wrapped with the SHA-256 of its canonical form
/// (`{"sha256": …, "content": …}`), atomically.
pub(crate) fn write_checked_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let content = serde_json::to_value(value)?;
    let sha = sha256_hex(&serde_json::to_vec(&content)?);
    let wrapped = serde_json::json!({ "sha256": sha, "content": content });
    write_atomic(path, &serde_json::to_vec_pretty(&wrapped)?)
}

/// Read a file written by `write_checked_json` (this module's atomic writer), verifying its checksum: a flipped byte or a
/// torn write is an error naming the file, never a silently different ledger or state.
pub fn read_checked_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let corrupt = |why: String| {
        TrainError::Run(format!(
            "{} is corrupt ({why}); restore it from a backup or start the run again",
            path.display()
        ))
    };
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("not JSON: {e}")))?;
    let (Some(sha), Some(content)) = (v.get("sha256").and_then(|s| s.as_str()), v.get("content"))
    else {
        return Err(corrupt("no sha256/content fields".into()));
    };
    let found = sha256_hex(&serde_json::to_vec(content)?);
    if found != sha {
        return Err(corrupt(format!(
            "checksum mismatch: recorded {sha}, content hashes to {found}"
        )));
    }
    serde_json::from_value(content.clone()).map_err(|e| corrupt(format!("unexpected content: {e}")))
}

/// Read a checkpoint tensor file, verifying its SHA-256 against the state's.
fn read_checked_tensors(path: &Path, sha: &str) -> Result<Vec<(String, tch::Tensor)>> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let found = sha256_hex(&bytes);
    if found != sha {
        return Err(TrainError::Run(format!(
            "{} is corrupt (checksum mismatch: state.json recorded {sha}, the file hashes to {found}); restore it from a backup or start the run again",
            path.display()
        )));
    }
    read_safetensors(path).map_err(Into::into)
}

/// A lock on a run folder (released on drop).
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
}

impl RunLock {
    /// Takes the lock; a second process on the same folder gets an error naming the holder.
    pub fn acquire(dir: &Path) -> Result<Self> {
        let path = dir.join("lock");
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                let _ = writeln!(f, "{}", std::process::id());
                Ok(Self { path })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                let pid = holder.trim();
                let alive = !pid.is_empty() && Path::new(&format!("/proc/{pid}")).exists();
                if alive {
                    Err(TrainError::Run(format!(
                        "{} is in use by process {pid} (remove {} if that process is gone)",
                        dir.display(),
                        path.display()
                    )))
                } else {
                    // A stale lock from a process that died: take it over.
                    std::fs::remove_file(&path).map_err(io(&path))?;
                    Self::acquire(dir)
                }
            }
            Err(e) => Err(io(&path)(e)),
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn optim_settings(cfg: &RunConfig) -> Result<OptimSettings> {
    let m = &cfg.method;
    let ns = m.ns_config();
    ns.validate()?;
    Ok(OptimSettings {
        lr: cfg.train.lr,
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: cfg.train.weight_decay,
        muon_lr: m.muon_lr,
        muon_beta: m.muon_beta,
        muon_form: m.muon_momentum.into(),
        ns,
        bc_probe_pairs: m.bc_probe_pairs,
    })
}

/// The file of a run folder that asks training to keep Muon inputs (see the module docs).
pub const BUFFER_TAP_FILE: &str = "buffer-tap.json";

#[derive(Deserialize)]
struct TapRequest {
    every: u64,
    max_matrices: usize,
}

/// The buffer tap a run folder asks for, if any.
fn buffer_tap(dir: &Path) -> Result<Option<raptor_optim::BufferTap>> {
    let path = dir.join(BUFFER_TAP_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    let r: TapRequest = serde_json::from_slice(&bytes)
        .map_err(|e| TrainError::Run(format!("{}: {e}", path.display())))?;
    Ok(Some(raptor_optim::BufferTap::new(r.every, r.max_matrices)))
}

/// One kept Muon input as listed in `diagnostics/buffers-<update>.json` (its tensor, under the
/// same name, is in the `.safetensors` file beside it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BufferSampleInfo {
    /// The parameter.
    pub name: String,
    /// The matrix's optimizer step (1-based).
    pub step: u64,
    /// Per-entry noise std of the kept input.
    pub noise_std: f64,
    /// Whether that step applied DP-MuonBC's correction.
    pub corrected: bool,
}

fn save_buffer_samples(dir: &Path, update: u64, kept: &[raptor_optim::BufferSample]) -> Result<()> {
    let d = dir.join("diagnostics");
    std::fs::create_dir_all(&d).map_err(io(&d))?;
    let tensors: Vec<(String, tch::Tensor)> = kept
        .iter()
        .map(|k| (k.name.clone(), k.input.shallow_clone()))
        .collect();
    let info: Vec<BufferSampleInfo> = kept
        .iter()
        .map(|k| BufferSampleInfo {
            name: k.name.clone(),
            step: k.step,
            noise_std: k.noise_std,
            corrected: k.corrected,
        })
        .collect();
    write_safetensors(
        d.join(format!("buffers-{update:06}.safetensors")),
        &tensors,
        None,
    )?;
    write_atomic(
        &d.join(format!("buffers-{update:06}.json")),
        &serde_json::to_vec_pretty(&info)?,
    )
}

/// A fresh run id: `<method>-<unix seconds>-<pid>`, with `-<n>` after the first run of the
/// process (unique within the process, whatever the clock).
pub fn new_run_id(cfg: &RunConfig) -> String {
    // Runs of one process started within the same second (an audit's two runs, tests) get a
    // sequence number: without it the second would write into the first one's folder.
    static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let base = format!("{}-{secs}-{}", cfg.method.name.name(), std::process::id());
    match STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) {
        0 => base,
        n => format!("{base}-{n}"),
    }
}

/// Progress callback: (updates done, total, last metrics, ε spent so far if computed).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64, &UpdateMetrics, Option<f64>);

/// What to do when a stop is requested (SIGINT/SIGTERM): checked between updates.
pub type StopFlag = std::sync::Arc<std::sync::atomic::AtomicBool>;

fn save_checkpoint(dir: &Path, trainer: &Trainer<'_>, resumed: u32) -> Result<()> {
    let ck = dir.join("checkpoint");
    std::fs::create_dir_all(&ck).map_err(io(&ck))?;
    let vars = trainer.model().var_store().variables();
    let mut params: Vec<(String, tch::Tensor)> = Vec::new();
    for p in trainer.plan().params() {
        if let Some(t) = vars.get(&p) {
            params.push((p, t.f_detach()?.f_contiguous()?));
        }
    }
    let update = trainer.update();
    let (tname, oname) = (
        format!("trainable-{update}.safetensors"),
        format!("optimizer-{update}.safetensors"),
    );
    let tmp = ck.join(format!("{tname}.tmp"));
    write_safetensors(&tmp, &params, None)?;
    let (ots, scalars) = trainer.optimizers().export()?;
    let otmp = ck.join(format!("{oname}.tmp"));
    write_safetensors(&otmp, &ots, None)?;
    let mut sums = Vec::new();
    for f in [&tmp, &otmp] {
        std::fs::File::open(f)
            .and_then(|h| h.sync_all())
            .map_err(io(f))?;
        sums.push(sha256_hex(&std::fs::read(f).map_err(io(f))?));
    }
    std::fs::rename(&tmp, ck.join(&tname)).map_err(io(&tmp))?;
    std::fs::rename(&otmp, ck.join(&oname)).map_err(io(&otmp))?;
    let state = CheckpointState {
        update,
        optim: scalars,
        resumed,
        trainable_file: tname.clone(),
        trainable_sha256: sums[0].clone(),
        optimizer_file: oname.clone(),
        optimizer_sha256: sums[1].clone(),
    };
    // The state is the commit point: once it is renamed into place, the older files are unused.
    write_checked_json(&ck.join("state.json"), &state)?;
    if let Ok(entries) = std::fs::read_dir(&ck) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            // Completed files only: a `.tmp` is never left by this process (it is renamed or the
            // write failed and the error is reported).
            let ours = (name.starts_with("trainable-") || name.starts_with("optimizer-"))
                && name.ends_with(".safetensors");
            if ours && name != tname && name != oname {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}

/// The state of a run folder's checkpoint, if it has one (verified).
fn checkpoint_state(dir: &Path) -> Result<Option<CheckpointState>> {
    let p = dir.join("checkpoint").join("state.json");
    if !p.exists() {
        return Ok(None);
    }
    read_checked_json(&p).map(Some)
}

/// The trainable tensors of a run folder's checkpoint (checksum verified).
pub fn checkpoint_tensors(dir: &Path) -> Result<Vec<(String, tch::Tensor)>> {
    let st = checkpoint_state(dir)?.ok_or_else(|| {
        TrainError::Run(format!(
            "{} has no checkpoint (no checkpoint/state.json)",
            dir.display()
        ))
    })?;
    read_checked_tensors(
        &dir.join("checkpoint").join(&st.trainable_file),
        &st.trainable_sha256,
    )
}

fn load_trainable(dir: &Path, model: &dyn raptor_models::Model) -> Result<()> {
    let path = dir.join("checkpoint");
    let vars = model.var_store().variables();
    for (name, t) in checkpoint_tensors(dir)? {
        let v = vars.get(&name).ok_or_else(|| {
            TrainError::Run(format!("{}: unknown parameter {name}", path.display()))
        })?;
        if v.size() != t.size() {
            return Err(TrainError::Run(format!(
                "{}: {name} has shape {:?}, the model {:?}",
                path.display(),
                t.size(),
                v.size()
            )));
        }
        tch::no_grad(|| {
            v.shallow_clone()
                .f_copy_(&t.f_to_kind(v.kind())?.f_to(v.device())?)
        })?;
    }
    Ok(())
}

/// Trains: a new run under `runs_dir` (or `resume` an existing run folder). Returns the run
/// folder and its record.
pub fn train(
    cfg: &RunConfig,
    runs_dir: &Path,
    resume: Option<&Path>,
    progress: Progress<'_>,
    stop: Option<StopFlag>,
) -> Result<(PathBuf, Record)> {
    train_with(cfg, runs_dir, resume, progress, stop, &crate::dist::Solo)
}

/// [`train`], data-parallel over the ranks of `comm` (every rank calls it with the same
/// arguments; see [`crate::dist`]). Rank 0 names the run folder and is the only one that
/// writes to it; a resume needs the folder on a file system every rank can read.
pub fn train_with(
    cfg: &RunConfig,
    runs_dir: &Path,
    resume: Option<&Path>,
    progress: Progress<'_>,
    stop: Option<StopFlag>,
    comm: &dyn crate::dist::Collective,
) -> Result<(PathBuf, Record)> {
    let (cfg, dir, resuming) = match resume {
        Some(d) => {
            let c = RunConfig::from_toml(
                &std::fs::read_to_string(d.join("config.toml"))
                    .map_err(io(d.join("config.toml")))?,
            )?;
            (c, d.to_path_buf(), true)
        }
        None => {
            let mut name = new_run_id(cfg);
            broadcast_string(comm, &mut name)?;
            (cfg.clone(), runs_dir.join(name), false)
        }
    };
    let session = prepare(&cfg)?;
    train_session(session, dir, resuming, progress, stop, comm)
        .map(|(dir, record, _)| (dir, record))
}

/// Broadcast a string from rank 0 (as bytes packed in `u64`s).
pub(crate) fn broadcast_string(comm: &dyn crate::dist::Collective, s: &mut String) -> Result<()> {
    if comm.size() < 2 {
        return Ok(());
    }
    let bytes = s.as_bytes();
    let mut buf: Vec<u64> = vec![bytes.len() as u64];
    buf.extend(bytes.chunks(8).map(|c| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(b)
    }));
    comm.broadcast_u64(&mut buf)?;
    let n = buf.first().copied().unwrap_or(0) as usize;
    let mut out: Vec<u8> = buf.iter().skip(1).flat_map(|w| w.to_le_bytes()).collect();
    out.truncate(n);
    *s = String::from_utf8(out).map_err(|_| {
        TrainError::Run("rank 0 broadcast a run folder name that is not UTF-8".into())
    })?;
    Ok(())
}

/// Trains into the run folder `dir`: a new run when `dir` holds no `config.toml`, otherwise a
/// resume of the run there, which must have been started with the same config (else an error:
/// a folder is never silently reused for another experiment).
pub fn train_in(
    cfg: &RunConfig,
    dir: &Path,
    progress: Progress<'_>,
    stop: Option<StopFlag>,
) -> Result<(PathBuf, Record)> {
    let cpath = dir.join("config.toml");
    if cpath.exists() {
        let stored = RunConfig::from_toml(&std::fs::read_to_string(&cpath).map_err(io(&cpath))?)?;
        if &stored != cfg {
            return Err(TrainError::Run(format!(
                "{} holds a run of another config; remove it or choose another folder",
                dir.display()
            )));
        }
        train_impl(&stored, dir.to_path_buf(), true, progress, stop)
    } else {
        train_impl(cfg, dir.to_path_buf(), false, progress, stop)
    }
}

fn train_impl(
    cfg: &RunConfig,
    dir: PathBuf,
    resuming: bool,
    progress: Progress<'_>,
    stop: Option<StopFlag>,
) -> Result<(PathBuf, Record)> {
    // Everything is read and checked before the folder is created.
    let session = prepare(cfg)?;
    train_session(session, dir, resuming, progress, stop, &crate::dist::Solo)
        .map(|(dir, record, _)| (dir, record))
}

/// Trainable parameters per phase (what the record reports).
fn trainable_parameters(
    plan: &crate::streams::Plan,
    model: &dyn raptor_models::Model,
) -> std::collections::BTreeMap<String, i64> {
    let vars = model.var_store().variables();
    plan.phases
        .iter()
        .map(|ph| {
            let n: i64 = ph
                .params()
                .iter()
                .filter_map(|p| vars.get(p))
                .map(|t| t.numel() as i64)
                .sum();
            (ph.name.clone(), n)
        })
        .collect()
}

/// Where a run starts: from scratch, or from its folder's last checkpoint and ledger.
struct Resume {
    /// How many times the run was resumed before (0 for a fresh run).
    resumed: u32,
    /// The first update to run.
    start_update: u64,
    /// The releases already charged (possibly ahead of the checkpoint: ε only over-counts).
    ledger: Ledger,
    /// The optimizer state to restore.
    optimizer: Option<(Vec<(String, tch::Tensor)>, OptimScalars)>,
}

impl Resume {
    fn fresh() -> Self {
        Self {
            resumed: 0,
            start_update: 0,
            ledger: Ledger::new(),
            optimizer: None,
        }
    }
}

/// Reads a run folder's checkpoint (trainable parameters into `model`, optimizer state) and its
/// ledger, every file checked against its checksum; notes a ledger ahead of the checkpoint.
fn read_resume(
    dir: &Path,
    model: &dyn raptor_models::Model,
    notes: &mut Vec<String>,
) -> Result<Resume> {
    let mut r = Resume::fresh();
    if let Some(st) = checkpoint_state(dir)? {
        load_trainable(dir, model)?;
        let opath = dir.join("checkpoint").join(&st.optimizer_file);
        r.optimizer = Some((
            read_checked_tensors(&opath, &st.optimizer_sha256)?,
            st.optim,
        ));
        r.start_update = st.update;
        r.resumed = st.resumed + 1;
    }
    let lpath = dir.join("checkpoint").join("ledger.json");
    if lpath.exists() {
        r.ledger = read_checked_json(&lpath)?;
    }
    if r.ledger.len() > r.start_update {
        notes.push(format!(
            "resumed at update {}; the ledger already held {} steps (releases charged before a stop are kept: ε only over-counts)",
            r.start_update,
            r.ledger.len()
        ));
    }
    Ok(r)
}

/// DP-MuonBC's probe seed. The probes are data-independent randomness; over several ranks they
/// must be the same on every rank (rank 0 draws the seed from the OS unless the run is seeded).
fn probe_seed(cfg: &RunConfig, comm: &dyn crate::dist::Collective) -> Result<Option<u64>> {
    Ok(match (cfg.train.insecure_seed, comm.size() > 1) {
        (Some(s), _) => Some(s),
        (None, false) => None,
        (None, true) => {
            let mut s = vec![rand::random::<u64>()];
            comm.broadcast_u64(&mut s)?;
            s.first().copied()
        }
    })
}

/// Where a run's label set comes from (recorded beside it).
fn labels_source(cfg: &RunConfig) -> String {
    if cfg.data.labels.is_some() {
        "declared in the config (data.labels)".into()
    } else {
        format!(
            "read from the private training file {}: the head's shape and labels.json reveal every label that occurs there",
            cfg.data.train.display()
        )
    }
}

/// Where a run's validation metrics come from (recorded beside them).
fn validation_source(cfg: &RunConfig, records: usize) -> Option<String> {
    if records == 0 {
        return None;
    }
    Some(match &cfg.data.validation {
        Some(p) => format!("the validation file {} ({records} records)", p.display()),
        None => format!(
            "{records} records held out of the private training file {} (data.validation_fraction = {}): computed on private records without noise",
            cfg.data.train.display(),
            cfg.data.validation_fraction
        ),
    })
}

/// The certified ε of a private run's ledger; none for a non-private run, an empty ledger, or
/// releases not yet charged (a stop between a release and its charge).
fn final_epsilon(
    trainer: &Trainer<'_>,
    privacy: &crate::methods::PrivacyPlan,
    acc: &PrvAccountant,
) -> Result<Option<FinalEpsilon>> {
    if !privacy.private || trainer.ledger().is_empty() || trainer.unaccounted_releases() > 0 {
        return Ok(None);
    }
    let e = trainer.ledger().epsilon(privacy.delta, acc)?;
    Ok(Some(FinalEpsilon {
        upper: e.upper,
        estimate: e.estimate,
        lower: e.lower,
        delta: privacy.delta,
        releases: trainer.ledger().releases(),
        steps: trainer.ledger().len(),
    }))
}

/// RAPTOR's diagnostics of a private MoE classifier on (at most 32) validation records, with
/// the noise, bound and denominator that the method gives the expert coordinates.
fn run_diagnostics(
    cfg: &RunConfig,
    expert_noise: Option<crate::streams::ReleaseNoiseSpec>,
    model: &dyn raptor_models::Model,
    layer: Option<&crate::methods::LayerChoice>,
    validation: &[crate::trainer::Example],
    pad_id: i64,
    device: tch::Device,
) -> Result<Option<crate::diagnostics::Diagnostics>> {
    // A non-private run has no private release (no noise to diagnose).
    if !(expert_noise.is_some()
        && !validation.is_empty()
        && model.num_experts() > 0
        && crate::session::is_classifier(cfg))
    {
        return Ok(None);
    }
    let naming = cfg.model.kind.naming();
    let Some(layer_id) = layer
        .map(|l| l.layer)
        .or_else(|| model.sparse_layers().last().copied())
    else {
        return Ok(None);
    };
    // σ, bound and denominator of the releases that carry the experts, as the plan made them
    // (after any calibration of the bounds).
    let Some(noise) = expert_noise else {
        return Ok(None);
    };
    let (sigma_e, clip_e, d_e, global) = (
        noise.sigma,
        noise.bound,
        noise.denominator,
        noise.global_clip || !cfg.method.name.needs_experts(),
    );
    let n = validation.len().min(32);
    Ok(Some(crate::diagnostics::diagnostics(
        model,
        naming,
        layer_id,
        &validation[..n],
        sigma_e,
        clip_e,
        global,
        d_e,
        cfg.train.batch_size,
        pad_id,
        device,
    )?))
}

/// `cpu`, `cuda:N`.
fn device_name(device: tch::Device) -> String {
    match device {
        tch::Device::Cpu => "cpu".to_string(),
        tch::Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}"),
    }
}

/// Where the run's noise came from, as the record states it.
fn noise_source(cfg: &RunConfig, device_name: &str) -> String {
    format!(
        "{} ChaCha20 on the CPU (rand_chacha), f64 standard normals; on rank 0 only; added to the clipped sums {}",
        if cfg.train.insecure_seed.is_some() {
            "seeded (NOT private: train.insecure_seed)"
        } else {
            "OS-seeded CSPRNG"
        },
        if device_name == "cpu" {
            "on the CPU".to_string()
        } else {
            format!("after one copy per release to {device_name} (no device generator is used)")
        }
    )
}

/// Trains a prepared session into the run folder `dir` (a new run, or a resume when `resuming`)
/// and returns the folder, the record and the trained model (for `raptor audit`, which scores
/// its canaries with it).
pub(crate) fn train_session(
    session: Session,
    dir: PathBuf,
    resuming: bool,
    progress: Progress<'_>,
    stop: Option<StopFlag>,
    comm: &dyn crate::dist::Collective,
) -> Result<(PathBuf, Record, Box<dyn raptor_models::Model>)> {
    // Only rank 0 writes (and locks) the run folder; the other ranks only read a resume's
    // checkpoint.
    let writer = comm.is_writer();
    let _lock = if writer {
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        Some(RunLock::acquire(&dir)?)
    } else {
        None
    };
    if writer && !resuming {
        write_atomic(&dir.join("config.toml"), session.cfg.to_toml()?.as_bytes())?;
        if let Some(l) = &session.labels {
            write_atomic(&dir.join("labels.json"), &serde_json::to_vec(l.labels())?)?;
        }
    }
    let Session {
        cfg,
        mut model,
        labels,
        train: train_set,
        validation,
        plan,
        privacy,
        layer,
        owners,
        device,
        pad_id,
        tokenizer,
        validation_sources,
        canaries,
    } = session;
    let trainable_parameters = trainable_parameters(&plan, model.as_ref());
    let mut notes = Vec::new();
    if cfg.train.insecure_seed.is_some() {
        let msg = "NOT PRIVATE: train.insecure_seed seeds the Poisson sampler and the noise; anyone who knows the seed can undo both".to_string();
        eprintln!("warning: {msg}");
        notes.push(msg);
    }
    if let Some(l) = &layer {
        notes.extend(l.warnings.iter().cloned());
    }
    let labels_source = labels.as_ref().map(|_| labels_source(&cfg));
    if labels.is_some() && cfg.data.labels.is_none() && writer && !resuming {
        let msg = format!(
            "the label set was read from the private training file ({}): the model's head and labels.json reveal every label that occurs there; declare data.labels = [...] to fix it publicly",
            cfg.data.train.display()
        );
        eprintln!("note: {msg}");
        notes.push(msg);
    }
    let validation_source = validation_source(&cfg, validation.len());
    let Resume {
        resumed,
        start_update,
        ledger,
        optimizer,
    } = if resuming {
        read_resume(&dir, model.as_ref(), &mut notes)?
    } else {
        Resume::fresh()
    };
    if comm.size() > 1 {
        // Every rank must resume at the update rank 0 resumes at (they read the same folder).
        let mut at = vec![start_update];
        comm.broadcast_u64(&mut at)?;
        if at.first() != Some(&start_update) {
            return Err(TrainError::Run(format!(
                "rank {} resumes at update {start_update} but rank 0 at {:?}: every rank must read the same run folder {} (a file system shared by all ranks)",
                comm.rank(),
                at.first(),
                dir.display()
            )));
        }
    }
    let mut optim =
        crate::methods::optimizers(&cfg, &plan, optim_settings(&cfg)?, probe_seed(&cfg, comm)?)?;
    if let Some(tap) = buffer_tap(&dir)? {
        optim = optim.with_tap(tap);
    }
    if let Some((ts, sc)) = optimizer {
        optim.import(ts, &sc, device)?;
    }
    let opts = TrainerOptions {
        micro_batch: cfg.train.micro_batch,
        insecure_seed: cfg
            .train
            .insecure_seed
            .map(|s| s.wrapping_add(start_update)),
        pad_id,
        device,
        warmup_steps: cfg.train.warmup_steps,
        cosine: cfg.train.cosine,
    };
    let acc = PrvAccountant::new(Accuracy::relative(cfg.privacy.accuracy))?;
    let mut trainer = Trainer::new(model.as_mut(), plan, &train_set, owners, optim, opts)?
        .with_collective(comm)?;
    if let Some(c) = canaries {
        // `raptor audit --kind dirac` only (see `trainer`'s module docs).
        trainer = trainer.with_dirac_canaries(c)?;
    }
    trainer.resume(ledger, start_update)?;
    let private_dir = dir.join("private");
    let metrics_path = private_dir.join("metrics.jsonl");
    let mut metrics_file = if writer {
        std::fs::create_dir_all(&private_dir).map_err(io(&private_dir))?;
        Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&metrics_path)
                .map_err(io(&metrics_path))?,
        )
    } else {
        None
    };
    let ledger_path = dir.join("checkpoint").join("ledger.json");
    if writer {
        std::fs::create_dir_all(dir.join("checkpoint")).map_err(io(dir.join("checkpoint")))?;
    }
    let started = Instant::now();
    let mut all_metrics = Vec::new();
    let total = trainer.plan().updates;
    let every = cfg.train.checkpoint_every;
    let mut interrupted = false;
    let mut eval_curve: Vec<(u64, EvalMetrics)> = Vec::new();
    let mut eval_seconds = 0.0f64;
    let mut epsilon_curve: Vec<(u64, f64)> = Vec::new();
    while !trainer.done() {
        let mut stopping = stop
            .as_ref()
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst));
        if comm.size() > 1 {
            // A stop on any rank stops every rank at the same update.
            let mut any = [f64::from(u8::from(stopping))];
            comm.all_reduce_sum_f64(&mut any)?;
            stopping = any[0] > 0.0;
        }
        if stopping {
            interrupted = true;
            break;
        }
        #[cfg(feature = "mpi")]
        crate::dist::fault_injection(comm, trainer.update());
        let mut write_ledger = |l: &Ledger| -> Result<()> {
            if writer {
                write_checked_json(&ledger_path, l)?;
            }
            Ok(())
        };
        let m = trainer.step(&mut write_ledger)?;
        let kept = trainer.optimizers_mut().take_samples();
        if writer && !kept.is_empty() {
            save_buffer_samples(&dir, trainer.update(), &kept)?;
        }
        if let Some(f) = metrics_file.as_mut() {
            writeln!(f, "{}", serde_json::to_string(&m)?).map_err(io(&metrics_path))?;
        }
        let done = trainer.update();
        let eps_now =
            if privacy.private && (done % 10 == 0 || done == total) && !trainer.ledger().is_empty()
            {
                trainer
                    .ledger()
                    .epsilon(privacy.delta, &acc)
                    .ok()
                    .map(|e| e.upper)
            } else {
                None
            };
        progress(done, total, &m, eps_now);
        all_metrics.push(m);
        if let Some(e) = eps_now {
            epsilon_curve.push((done, e));
        }
        let ev = cfg.train.eval_every;
        if writer && ev > 0 && done % ev == 0 && done < total && !validation.is_empty() {
            let t0 = Instant::now();
            let em = evaluate(
                trainer.model(),
                &validation,
                cfg.train.micro_batch,
                pad_id,
                device,
            )?;
            eval_seconds += t0.elapsed().as_secs_f64();
            eval_curve.push((done, em));
        }
        if writer && every > 0 && done % every == 0 && done < total {
            save_checkpoint(&dir, &trainer, resumed)?;
        }
    }
    if writer {
        save_checkpoint(&dir, &trainer, resumed)?;
    }
    let wall = started.elapsed().as_secs_f64();
    let applied = trainer.update() - start_update;
    let epsilon = final_epsilon(&trainer, &privacy, &acc)?;
    if let Some(e) = &epsilon
        && e.upper > privacy.epsilon * (1.0 + 1e-9)
    {
        notes.push(format!(
            "the certified epsilon {:.4} exceeds the target {} (releases charged before a stop were redone)",
            e.upper, privacy.epsilon
        ));
    }
    let updates = trainer.update();
    let comm_stats = comm.stats();
    let expert_noise = trainer.plan().expert_release_noise()?;
    drop(trainer);
    if comm.size() > 1 {
        notes.push(format!(
            "data-parallel over {} MPI ranks: rank 0 sampled and added the noise once per release; {} collective calls, {:.3} MB on rank 0 ({:.1} kB per update)",
            comm.size(),
            comm_stats.calls,
            comm_stats.bytes as f64 / 1e6,
            comm_stats.bytes as f64 / 1e3 / (applied.max(1) as f64)
        ));
    }
    // The other ranks hold the same model: evaluation and the record file are rank 0's.
    let eval = if !writer || validation.is_empty() {
        None
    } else {
        Some(evaluate(
            model.as_ref(),
            &validation,
            cfg.train.micro_batch,
            pad_id,
            device,
        )?)
    };
    let generation = if !writer || validation_sources.is_empty() {
        None
    } else {
        Some(generation_metrics(
            model.as_ref(),
            tokenizer.as_ref(),
            &validation_sources,
            &cfg,
            device,
        )?)
    };
    let diagnostics = if writer {
        run_diagnostics(
            &cfg,
            expert_noise,
            model.as_ref(),
            layer.as_ref(),
            &validation,
            pad_id,
            device,
        )?
    } else {
        None
    };
    let device_name = device_name(device);
    let noise_source = noise_source(&cfg, &device_name);
    let membership_inference = if writer && !validation.is_empty() {
        membership_inference(
            model.as_ref(),
            &train_set,
            &validation,
            cfg.train.micro_batch,
            pad_id,
            device,
        )?
    } else {
        None
    };
    let record = Record {
        raptor_version: env!("CARGO_PKG_VERSION").into(),
        device: device_name,
        noise_source,
        ranks: comm.size(),
        communicated_bytes: comm_stats.bytes,
        libtorch: crate::libtorch_version(),
        method: cfg.method.name.name().into(),
        seed: cfg.train.seed,
        insecure_seeded: cfg.train.insecure_seed.is_some(),
        train_records: train_set.len(),
        validation_records: validation.len(),
        labels: labels.map(|l| l.labels().to_vec()),
        privacy_plan: privacy,
        layer,
        trainable_parameters,
        updates,
        eval_curve,
        epsilon_curve,
        eval,
        generation,
        epsilon,
        wall_seconds: wall,
        eval_seconds,
        updates_per_second: if wall > 0.0 {
            applied as f64 / wall
        } else {
            0.0
        },
        resumed,
        notes,
        validation_source,
        labels_source,
        private: PrivateRecord {
            notice: PRIVATE_NOTICE.into(),
            metrics: all_metrics,
            membership_inference,
            diagnostics,
        },
    };
    if writer {
        write_atomic(
            &private_dir.join("record.json"),
            &serde_json::to_vec_pretty(&record.private)?,
        )?;
        write_atomic(
            &dir.join("record.json"),
            &serde_json::to_vec_pretty(&record)?,
        )?;
    }
    if interrupted {
        return Err(TrainError::Run(format!(
            "stopped at update {updates} of {total}; checkpoint written. Resume with: raptor train --resume {}",
            dir.display()
        )));
    }
    Ok((dir, record, model))
}

/// A finished (or checkpointed) run's model, rebuilt as training built it.
struct RunModel {
    cfg: RunConfig,
    model: Box<dyn raptor_models::Model>,
    tokenizer: Box<dyn raptor_models::tokenizer::TextTokenizer>,
    labels: Option<raptor_data::LabelMap>,
    device: tch::Device,
}

/// Rebuilds the model of run folder `run` (config `cfg`): the base model, the trainable scope
/// (LoRA adapters) as training set it up, and the trained weights of its checkpoint.
fn load_run_model(run: &Path, cfg: RunConfig) -> Result<RunModel> {
    let classify = crate::session::is_classifier(&cfg);
    let device = crate::device::open_device(cfg.train.device)?;
    let tok = crate::session::open_run_tokenizer(&cfg)?;
    let labels = if classify {
        let lp = run.join("labels.json");
        let names: Vec<String> = serde_json::from_slice(&std::fs::read(&lp).map_err(io(&lp))?)?;
        Some(raptor_data::LabelMap::from_list(names).map_err(|e| TrainError::Data(e.to_string()))?)
    } else {
        None
    };
    let num_labels = labels.as_ref().map_or(0, |l| l.len() as i64);
    let mut model = crate::session::build_model(&cfg, tok.vocab_size() as i64, num_labels, device)?;
    // Rebuild the trainable scope (LoRA adapters) as training did, then load its weights.
    let layer = if cfg.method.name.needs_experts() {
        let rec: serde_json::Value = serde_json::from_slice(
            &std::fs::read(run.join("record.json")).map_err(io(run.join("record.json")))?,
        )?;
        rec["layer"]["layer"].as_u64().map(|l| l as usize)
    } else {
        None
    };
    raptor_models::rng::seeded(cfg.train.seed.wrapping_add(1) as i64, || {
        crate::methods::setup_scope(&cfg, model.as_mut(), layer)
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

/// Exports the model of a finished run folder as a Hugging Face folder (`config.json` +
/// `model.safetensors`) that `model.path` of another run can start from (e.g. a non-private
/// pretraining run on public text, fine-tuned privately afterwards). Runs that trained LoRA
/// adapters are refused (their adapters are not merged into the base weights).
pub fn export_run(run: &Path, out: &Path) -> Result<()> {
    export_run_skipping(run, out, &[])
}

fn export_run_skipping(run: &Path, out: &Path, skip: &[&str]) -> Result<()> {
    let cpath = run.join("config.toml");
    if !run.join("record.json").exists() {
        return Err(TrainError::Run(format!(
            "{} is not a finished run folder (no record.json)",
            run.display()
        )));
    }
    let cfg = RunConfig::from_toml(&std::fs::read_to_string(&cpath).map_err(io(&cpath))?)?;
    let rm = load_run_model(run, cfg)?;
    if rm
        .model
        .var_store()
        .variables()
        .keys()
        .any(|k| k.contains(".lora_"))
    {
        return Err(TrainError::Run(format!(
            "{}: runs with LoRA adapters cannot be exported yet (adapters are not merged); export a run of method full or adam",
            run.display()
        )));
    }
    raptor_models::checkpoint::save_pretrained_without(rm.model.as_ref(), out, skip)?;
    Ok(())
}

/// [`export_run`] without the task head (`classifier.*`, `score.*`): an encoder to fine-tune
/// on another task, whose runs get a new head of their own label count.
pub fn export_encoder(run: &Path, out: &Path) -> Result<()> {
    export_run_skipping(run, out, &["classifier.*", "score.*"])
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
        return Err(TrainError::Run(format!(
            "{} is not a run folder (no config.toml)",
            run.display()
        )));
    }
    let cfg = RunConfig::from_toml(&std::fs::read_to_string(&cpath).map_err(io(&cpath))?)?;
    let RunModel {
        cfg,
        model,
        tokenizer: tok,
        labels,
        device,
    } = load_run_model(run, cfg)?;
    let classify = crate::session::is_classifier(&cfg);
    let path = data
        .map(Path::to_path_buf)
        .or(cfg.data.validation.clone())
        .ok_or_else(|| {
            TrainError::Config("no evaluation data: pass --data or set data.validation".into())
        })?;
    let pad = i64::from(tok.pad_id());
    if cfg.data.format.is_data_to_text() {
        let ds = crate::session::read_d2t(&cfg, &path)?;
        let ex =
            crate::session::to_d2t_examples(&cfg, tok.as_ref(), &ds.records, model.vocab_size())?;
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
        let generation = Some(generation_metrics(
            model.as_ref(),
            tok.as_ref(),
            &sources,
            &cfg,
            device,
        )?);
        return Ok(EvalReport {
            metrics,
            generation,
        });
    }
    let ds = crate::session::read_records(&cfg, &path, classify)?;
    let ex = crate::session::to_examples(
        &cfg,
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Runs started in the same second by one process get distinct folders (an audit's two
    /// runs did not, and the second overwrote the first's report).
    #[test]
    fn run_ids_of_one_process_are_distinct() {
        let cfg = RunConfig::default();
        let ids: std::collections::BTreeSet<String> = (0..50).map(|_| new_run_id(&cfg)).collect();
        assert_eq!(ids.len(), 50);
        let pid = std::process::id().to_string();
        assert!(
            ids.iter()
                .all(|id| id.starts_with("raptor-") && id.contains(&pid)),
            "{ids:?}"
        );
    }

    /// A checked JSON file holding arbitrary f64 values (as a ledger's ε and σ are) reads back
    /// with its checksum intact and every value bit for bit. Fails without serde_json's
    /// `float_roundtrip`: its fast parser can return a float 1 ulp off, which re-serializes to
    /// other bytes and made a good ledger look corrupt on resume.
    #[test]
    fn checked_json_round_trips_every_float() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("values.json");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for _ in 0..20 {
            let values: Vec<f64> = (0..500)
                .map(|_| {
                    let m: f64 = rng.random::<f64>();
                    let e: i32 = rng.random_range(-30..30);
                    m * 10f64.powi(e)
                })
                .collect();
            write_checked_json(&path, &values).unwrap();
            let back: Vec<f64> = read_checked_json(&path).unwrap();
            assert_eq!(
                values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                back.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    /// The optimizer crate's documented defaults are the ones a default `run.toml` trains with.
    #[test]
    fn default_config_trains_with_the_optimizer_crates_defaults() {
        let cfg = RunConfig::default();
        assert_eq!(
            optim_settings(&cfg).unwrap(),
            OptimSettings::adamw(cfg.train.lr)
        );
    }
}
