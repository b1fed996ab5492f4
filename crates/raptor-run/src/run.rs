//! Run folders and the run loop. A run folder holds `config.toml` (resolved), `record.json`
//! (what may be published beside the model), `private/` (`record.json`, `metrics.jsonl`:
//! computed from private records without noise, never published), `checkpoint/` and a lock
//! file.
//!
//! - this module: the run loop ([`train`], [`train_with`], [`train_in`]; resume, checkpoints
//!   and evaluation on the way, the final ε and the record);
//! - [`folder`]: durability (atomic writes, checksummed JSON, the lock, run ids);
//! - [`checkpoint`]: checkpoints and resume state, the Newton–Schulz buffer tap;
//! - [`record`]: the record, the private record, generation metrics;
//! - [`export`]: evaluation and export of a finished run;
//! - [`summary`]: the run's summary for scripts and tables (`summary.json`, its private part in
//!   `private/summary.json`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use raptor_accountant::{Accuracy, Ledger, PrvAccountant};
use raptor_models::PrefixCache;
use raptor_models::checkpoint::{read_safetensors, write_safetensors};
use serde::{Deserialize, Serialize};

use crate::error::{Result, RunError, io};
use crate::session::{Session, prepare};
use raptor_train::config::{DataConfig, MethodConfig, RunConfig, TrainConfig};
use raptor_train::optim::{OptimScalars, OptimSettings};
use raptor_train::trainer::{EvalMetrics, Trainer, TrainerOptions, UpdateMetrics, evaluate};

pub mod checkpoint;
pub mod export;
pub mod folder;
pub mod record;
pub mod summary;

pub use checkpoint::*;
pub use export::*;
pub use folder::*;
pub use record::*;
pub use summary::*;

/// The optimizers' settings of `[method]` and `[train]`.
fn optim_settings(method: &MethodConfig, train: &TrainConfig) -> Result<OptimSettings> {
    // A method without Muon (or its bias correction) reads their defaults, which its
    // optimizers never use.
    let muon = method.muon().copied().unwrap_or_default();
    let bc = method.bias_correction().copied().unwrap_or_default();
    let ns = muon.ns_config();
    ns.validate()?;
    Ok(OptimSettings {
        lr: train.lr,
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: train.weight_decay,
        muon_lr: muon.muon_lr,
        muon_beta: muon.muon_beta,
        muon_form: muon.muon_momentum.into(),
        ns,
        bc_probe_pairs: bc.bc_probe_pairs,
    })
}

/// Progress callback: (updates done, total, last metrics, ε spent so far if computed).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64, &UpdateMetrics, Option<f64>);

/// What to do when a stop is requested (SIGINT/SIGTERM): checked between updates.
pub type StopFlag = std::sync::Arc<std::sync::atomic::AtomicBool>;

/// Trains: a new run under `runs_dir` (or `resume` an existing run folder). Returns the run
/// folder and its record.
pub fn train(
    cfg: &RunConfig,
    runs_dir: &Path,
    resume: Option<&Path>,
    progress: Progress<'_>,
    stop: Option<StopFlag>,
) -> Result<(PathBuf, Record)> {
    train_with(
        cfg,
        runs_dir,
        resume,
        progress,
        stop,
        &raptor_train::dist::Solo,
    )
}

/// [`train`], data-parallel over the ranks of `comm` (every rank calls it with the same
/// arguments; see [`raptor_train::dist`]). Rank 0 names the run folder and is the only one that
/// writes to it; a resume needs the folder on a file system every rank can read.
pub fn train_with(
    cfg: &RunConfig,
    runs_dir: &Path,
    resume: Option<&Path>,
    progress: Progress<'_>,
    stop: Option<StopFlag>,
    comm: &dyn raptor_train::dist::Collective,
) -> Result<(PathBuf, Record)> {
    let (cfg, dir, resuming) = resolve_run(cfg, runs_dir, resume, comm)?;
    let session = prepare(&cfg)?;
    train_session(session, dir, resuming, progress, stop, comm)
        .map(|(dir, record, _)| (dir, record))
}

/// The config, folder and resume flag of a run: a resumed run's own `config.toml` and folder,
/// or `cfg` in a new folder under `runs_dir` (its name chosen on rank 0 and broadcast).
pub(crate) fn resolve_run(
    cfg: &RunConfig,
    runs_dir: &Path,
    resume: Option<&Path>,
    comm: &dyn raptor_train::dist::Collective,
) -> Result<(RunConfig, PathBuf, bool)> {
    Ok(match resume {
        Some(d) => {
            let path = d.join("config.toml");
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            (RunConfig::from_written_toml(&text)?, d.to_path_buf(), true)
        }
        None => {
            let mut name = new_run_id(cfg.method.name());
            broadcast_string(comm, &mut name)?;
            (cfg.clone(), runs_dir.join(name), false)
        }
    })
}

/// Broadcast a string from rank 0 (as bytes packed in `u64`s).
pub(crate) fn broadcast_string(
    comm: &dyn raptor_train::dist::Collective,
    s: &mut String,
) -> Result<()> {
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
        RunError::Run("rank 0 broadcast a run folder name that is not UTF-8".into())
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
        let stored =
            RunConfig::from_written_toml(&std::fs::read_to_string(&cpath).map_err(io(&cpath))?)?;
        if &stored != cfg {
            return Err(RunError::Run(format!(
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
    train_session(
        session,
        dir,
        resuming,
        progress,
        stop,
        &raptor_train::dist::Solo,
    )
    .map(|(dir, record, _)| (dir, record))
}

/// Trainable parameters per phase (what the record reports).
fn trainable_parameters(
    plan: &raptor_train::streams::Plan,
    model: &dyn raptor_models::Model,
) -> std::collections::BTreeMap<raptor_train::streams::Stream, i64> {
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
            (ph.name, n)
        })
        .collect()
}

/// DP-MuonBC's probe seed. The probes are data-independent randomness; over several ranks they
/// must be the same on every rank (rank 0 draws the seed from the OS unless the run is seeded).
fn probe_seed(
    insecure_seed: Option<u64>,
    comm: &dyn raptor_train::dist::Collective,
) -> Result<Option<u64>> {
    Ok(match (insecure_seed, comm.size() > 1) {
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
fn labels_source(data: &DataConfig) -> String {
    if data.labels.is_some() {
        "declared in the config (data.labels)".into()
    } else {
        format!(
            "read from the private training file {}: the head's shape and labels.json reveal every label that occurs there",
            data.train.display()
        )
    }
}

/// The certified ε of a private run's ledger; none for a non-private run, an empty ledger, or
/// releases not yet charged (a stop between a release and its charge).
fn final_epsilon(
    trainer: &Trainer<'_>,
    privacy: &raptor_train::methods::PrivacyPlan,
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

/// The records RAPTOR's diagnostics read: a batch of about the run's expected size B (at least
/// 32, at most 256 held-out records, fewer when the validation split is smaller).
pub(crate) fn diagnostic_records(batch: f64, available: usize) -> usize {
    let b = if batch.is_finite() {
        batch.round()
    } else {
        0.0
    };
    (b.clamp(32.0, 256.0) as usize).min(available)
}

/// RAPTOR's diagnostics of a private MoE classifier on a batch of validation records of about
/// the run's size, with the noise, bound and denominator that the method gives the expert
/// coordinates and the shared ones.
fn run_diagnostics(
    cfg: raptor_train::methods::PlanSettings<'_>,
    expert_noise: Option<(
        raptor_train::streams::ReleaseNoiseSpec,
        raptor_train::streams::ReleaseNoiseSpec,
    )>,
    model: &dyn raptor_models::Model,
    layer: Option<&raptor_train::methods::LayerChoice>,
    validation: &[raptor_train::trainer::Example],
    pad_id: i64,
    device: tch::Device,
) -> Result<Option<crate::diagnostics::Diagnostics>> {
    // A non-private run has no private release (no noise to diagnose).
    if expert_noise.is_none()
        || validation.is_empty()
        || model.num_experts() <= 0
        || cfg.kind.is_language_model()
    {
        return Ok(None);
    }
    let naming = raptor_train::methods::naming(cfg.kind);
    let Some(layer_id) = layer
        .map(|l| l.layer)
        .or_else(|| model.sparse_layers().last().copied())
    else {
        return Ok(None);
    };
    // σ, bound and denominator of the releases that carry the experts, as the plan made them
    // (after any calibration of the bounds).
    let Some((mut expert, shared)) = expert_noise else {
        return Ok(None);
    };
    expert.global_clip = expert.global_clip || !cfg.method.name().needs_experts();
    let n = diagnostic_records(cfg.train.batch_size, validation.len());
    Ok(Some(crate::diagnostics::diagnostics(
        model,
        naming,
        layer_id,
        &validation[..n],
        &crate::diagnostics::DiagNoise {
            expert,
            shared,
            batch: cfg.train.batch_size,
        },
        cfg.train.micro_batch,
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

/// Where the run's noise came from, as the record states it (`seeded`: `train.insecure_seed`
/// is set).
fn noise_source(seeded: bool, device_name: &str) -> String {
    format!(
        "{} ChaCha20 on the CPU (rand_chacha), f64 standard normals; on rank 0 only; added to the clipped sums {}",
        if seeded {
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

/// A resumed run's ledger must hold a charge for every private update the checkpoint has
/// applied: a missing or short `checkpoint/ledger.json` would make the run report ε for the
/// updates after the resume only. Refused, naming the file.
fn ledger_covers_checkpoint(
    plan: &raptor_train::streams::Plan,
    ledger: &Ledger,
    start_update: u64,
    dir: &Path,
) -> Result<()> {
    let needed = plan.charged_updates(start_update)?;
    if ledger.len() < needed {
        let path = dir.join("checkpoint").join("ledger.json");
        let state = if path.exists() {
            format!("holds {} charged steps", ledger.len())
        } else {
            "is missing".to_string()
        };
        return Err(RunError::Run(format!(
            "cannot resume {}: the checkpoint is at update {start_update}, whose releases need {needed} charged steps, but {} {state}; resuming would report epsilon for the updates after the resume only. Restore the ledger file or start a new run",
            dir.display(),
            path.display()
        )));
    }
    Ok(())
}

/// Under MPI: fails unless every rank resumes at the update rank 0 resumes at (they must read
/// the same run folder).
fn same_start_on_every_rank(
    comm: &dyn raptor_train::dist::Collective,
    start_update: u64,
    dir: &Path,
) -> Result<()> {
    if comm.size() > 1 {
        let mut at = vec![start_update];
        comm.broadcast_u64(&mut at)?;
        if at.first() != Some(&start_update) {
            return Err(RunError::Run(format!(
                "rank {} resumes at update {start_update} but rank 0 at {:?}: every rank must read the same run folder {} (a file system shared by all ranks)",
                comm.rank(),
                at.first(),
                dir.display()
            )));
        }
    }
    Ok(())
}

/// The plan's optimizers, with the run folder's buffer tap and a resumed run's state.
fn resumed_optimizers(
    method: &MethodConfig,
    train: &TrainConfig,
    plan: &raptor_train::streams::Plan,
    dir: &Path,
    state: Option<(Vec<(String, tch::Tensor)>, OptimScalars)>,
    device: tch::Device,
    comm: &dyn raptor_train::dist::Collective,
) -> Result<raptor_train::optim::Optimizers> {
    let mut optim = raptor_train::methods::optimizers(
        train,
        plan,
        optim_settings(method, train)?,
        probe_seed(train.insecure_seed, comm)?,
    )?;
    if let Some(tap) = buffer_tap(dir)? {
        optim = optim.with_tap(tap);
    }
    if let Some((ts, sc)) = state {
        optim.import(ts, &sc, device)?;
    }
    Ok(optim)
}

/// The record's notes known before training: an insecure seed (also warned on stderr), the
/// layer choice's warnings, and (`labels_from_private`: a new run whose label set was read
/// from the private training file, noted on stderr) that the head reveals the labels.
fn start_notes(
    seeded: bool,
    data: &DataConfig,
    layer: Option<&raptor_train::methods::LayerChoice>,
    labels_from_private: bool,
) -> Vec<String> {
    let mut notes = Vec::new();
    if seeded {
        let msg = "NOT PRIVATE: train.insecure_seed seeds the Poisson sampler and the noise; anyone who knows the seed can undo both".to_string();
        eprintln!("warning: {msg}");
        notes.push(msg);
    }
    if let Some(l) = layer {
        notes.extend(l.warnings.iter().cloned());
    }
    if labels_from_private && data.labels.is_none() {
        let msg = format!(
            "the label set was read from the private training file ({}): the model's head and labels.json reveal every label that occurs there; declare data.labels = [...] to fix it publicly",
            data.train.display()
        );
        eprintln!("note: {msg}");
        notes.push(msg);
    }
    notes
}

/// What rank 0 measures on the trained model for the record.
#[derive(Default)]
struct Measured {
    eval: Option<EvalMetrics>,
    generation: Option<(GenerationMetrics, Vec<GenerationSample>)>,
    diagnostics: Option<crate::diagnostics::Diagnostics>,
    membership_inference: Option<raptor_eval::mia::MiaReport>,
}

/// Validation metrics, generation metrics (data-to-text), RAPTOR's diagnostics and the
/// membership-inference check of the trained `model` (each only where its records exist).
#[allow(clippy::too_many_arguments)]
fn measure(
    model: &dyn raptor_models::Model,
    tokenizer: &dyn raptor_models::tokenizer::TextTokenizer,
    settings: raptor_train::methods::PlanSettings<'_>,
    eval_cfg: &raptor_train::config::EvalConfig,
    enc: crate::session::Encoding,
    train_set: &[raptor_train::trainer::Example],
    validation: &[raptor_train::trainer::Example],
    validation_sources: &[crate::session::SourceRefs],
    expert_noise: Option<(
        raptor_train::streams::ReleaseNoiseSpec,
        raptor_train::streams::ReleaseNoiseSpec,
    )>,
    layer: Option<&raptor_train::methods::LayerChoice>,
    pad_id: i64,
    device: tch::Device,
    caches: &mut (Option<PrefixCache>, Option<PrefixCache>),
) -> Result<Measured> {
    let mb = settings.train.micro_batch;
    let eval = if validation.is_empty() {
        None
    } else {
        Some(raptor_train::trainer::evaluate_cached(
            model,
            validation,
            mb,
            pad_id,
            device,
            caches.1.as_mut(),
        )?)
    };
    let generation = if validation_sources.is_empty() {
        None
    } else {
        Some(generation_metrics(
            model,
            tokenizer,
            validation_sources,
            eval_cfg,
            enc,
            mb,
            device,
        )?)
    };
    let diagnostics = run_diagnostics(
        settings,
        expert_noise,
        model,
        layer,
        validation,
        pad_id,
        device,
    )?;
    let membership_inference = if validation.is_empty() {
        None
    } else {
        membership_inference(model, train_set, validation, mb, pad_id, device, caches)?
    };
    Ok(Measured {
        eval,
        generation,
        diagnostics,
        membership_inference,
    })
}

/// The frozen-prefix cache settings (`train.prefix_cache`, records of at most `max_tokens`
/// tokens: `data.max_length`) of a run over `records` records (training and validation), a
/// file cache in `private_dir` when given.
pub(crate) fn prefix_settings(
    mode: raptor_train::config::PrefixCacheMode,
    max_tokens: usize,
    records: usize,
    private_dir: Option<&Path>,
) -> crate::prefix::PrefixSettings {
    crate::prefix::PrefixSettings {
        mode,
        private_dir: private_dir.map(Path::to_path_buf),
        memory_budget: None,
        max_tokens,
        records,
    }
}

/// Where the update loop writes: rank 0's metrics file (under `private/`) and ledger.
struct LoopFiles {
    dir: PathBuf,
    writer: bool,
    metrics: Option<std::fs::File>,
    metrics_path: PathBuf,
    ledger_path: PathBuf,
}

impl LoopFiles {
    /// Opens (rank 0: creates) `private/metrics.jsonl` and the checkpoint folder of `dir`.
    fn open(dir: &Path, writer: bool) -> Result<Self> {
        let private_dir = dir.join("private");
        let metrics_path = private_dir.join("metrics.jsonl");
        let metrics = if writer {
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
        Ok(LoopFiles {
            dir: dir.to_path_buf(),
            writer,
            metrics,
            metrics_path,
            ledger_path,
        })
    }
}

/// What the update loop reads besides the trainer.
struct LoopContext<'a> {
    cfg: &'a RunConfig,
    privacy: &'a raptor_train::methods::PrivacyPlan,
    accountant: &'a PrvAccountant,
    validation: &'a [raptor_train::trainer::Example],
    resumed: u32,
    comm: &'a dyn raptor_train::dist::Collective,
}

/// What the update loop collected.
struct LoopOutcome {
    metrics: Vec<UpdateMetrics>,
    eval_curve: Vec<(u64, EvalMetrics)>,
    eval_seconds: f64,
    epsilon_curve: Vec<(u64, f64)>,
    interrupted: bool,
}

/// Runs the trainer's remaining updates: each update's ledger written (rank 0) after its
/// releases are charged and before they are applied, its metrics appended under `private/`,
/// ε computed after the first update and every 10, validation every `train.eval_every`, a
/// checkpoint every `train.checkpoint_every`; a stop requested on any rank stops every rank at
/// the same update.
fn run_updates(
    trainer: &mut Trainer<'_>,
    cx: &LoopContext<'_>,
    files: &mut LoopFiles,
    progress: Progress<'_>,
    stop: Option<&StopFlag>,
) -> Result<LoopOutcome> {
    let (cfg, comm, writer) = (cx.cfg, cx.comm, files.writer);
    let mut out = LoopOutcome {
        metrics: Vec::new(),
        eval_curve: Vec::new(),
        eval_seconds: 0.0,
        epsilon_curve: Vec::new(),
        interrupted: false,
    };
    let total = trainer.plan().updates;
    let every = cfg.train.checkpoint_every;
    while !trainer.done() {
        let mut stopping = stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst));
        if comm.size() > 1 {
            // A stop on any rank stops every rank at the same update.
            let mut any = [f64::from(u8::from(stopping))];
            comm.all_reduce_sum_f64(&mut any)?;
            stopping = any[0] > 0.0;
        }
        if stopping {
            out.interrupted = true;
            break;
        }
        #[cfg(feature = "mpi")]
        raptor_train::dist::fault_injection(comm, trainer.update());
        let ledger_path = &files.ledger_path;
        // The trainer speaks its own error type: a failed write becomes its `Run` error, which
        // names the file.
        let mut write_ledger = |l: &Ledger| -> raptor_train::Result<()> {
            if writer {
                write_checked_json(ledger_path, l)
                    .map_err(|e| raptor_train::TrainError::Run(e.to_string()))?;
            }
            Ok(())
        };
        let m = trainer.step(&mut write_ledger)?;
        let kept = trainer.optimizers_mut().take_samples();
        if writer && !kept.is_empty() {
            save_buffer_samples(&files.dir, trainer.update(), &kept)?;
        }
        if let Some(f) = files.metrics.as_mut() {
            writeln!(f, "{}", serde_json::to_string(&m)?).map_err(io(&files.metrics_path))?;
        }
        let done = trainer.update();
        let eps_now = if cx.privacy.private
            && (done == 1 || done.is_multiple_of(10) || done == total)
            && !trainer.ledger().is_empty()
        {
            trainer
                .ledger()
                .epsilon(cx.privacy.delta, cx.accountant)
                .ok()
                .map(|e| e.upper)
        } else {
            None
        };
        progress(done, total, &m, eps_now);
        out.metrics.push(m);
        if let Some(e) = eps_now {
            out.epsilon_curve.push((done, e));
        }
        let ev = cfg.train.eval_every;
        if writer && ev > 0 && done.is_multiple_of(ev) && done < total && !cx.validation.is_empty()
        {
            let t0 = Instant::now();
            let em = trainer.evaluate_validation(cx.validation)?;
            out.eval_seconds += t0.elapsed().as_secs_f64();
            out.eval_curve.push((done, em));
        }
        if writer && every > 0 && done.is_multiple_of(every) && done < total {
            save_checkpoint(&files.dir, trainer, cx.resumed)?;
        }
    }
    Ok(out)
}

/// Trains a prepared session (from [`crate::session::prepare_with`] or
/// [`crate::session::prepare_counting`]) as a new single-process run in the folder `dir`, and
/// returns the folder, the record and the trained model (`raptor audit`, crate `raptor-audit`,
/// scores its loss canaries with it).
pub fn train_prepared(
    session: Session,
    dir: PathBuf,
    progress: Progress<'_>,
) -> Result<(PathBuf, Record, Box<dyn raptor_models::Model>)> {
    train_session(
        session,
        dir,
        false,
        progress,
        None,
        &raptor_train::dist::Solo,
    )
}

/// [`train_prepared`] with the white-box audit's Dirac canaries in the run (crate
/// `raptor-audit` is the one caller; see [`raptor_train::trainer::DiracCanaries`]): the one way
/// canaries enter a run. The session must have been prepared by
/// [`crate::session::prepare_counting`] with room for the canaries in its plan; each canary is
/// checked against the plan before the first update.
pub fn train_prepared_with_canaries(
    mut session: Session,
    canaries: raptor_train::trainer::DiracCanaries,
    dir: PathBuf,
    progress: Progress<'_>,
) -> Result<(PathBuf, Record, Box<dyn raptor_models::Model>)> {
    session.canaries = Some(canaries);
    train_prepared(session, dir, progress)
}

/// Trains a prepared session into the run folder `dir` (a new run, or a resume when `resuming`)
/// and returns the folder, the record and the trained model.
pub(crate) fn train_session(
    session: Session,
    dir: PathBuf,
    resuming: bool,
    progress: Progress<'_>,
    stop: Option<StopFlag>,
    comm: &dyn raptor_train::dist::Collective,
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
        prepare_seconds: _,
    } = session;
    let trainable_parameters = trainable_parameters(&plan, model.as_ref());
    let mut notes = start_notes(
        cfg.train.insecure_seed.is_some(),
        &cfg.data,
        layer.as_ref(),
        labels.is_some() && writer && !resuming,
    );
    let labels_source = labels.as_ref().map(|_| labels_source(&cfg.data));
    let validation_info = ValidationInfo::of(&cfg.data, validation.len());
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
    if resuming {
        ledger_covers_checkpoint(&plan, &ledger, start_update, &dir)?;
    }
    same_start_on_every_rank(comm, start_update, &dir)?;
    let optim = resumed_optimizers(
        &cfg.method,
        &cfg.train,
        &plan,
        &dir,
        optimizer,
        device,
        comm,
    )?;
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
    // The frozen-prefix caches (said at start: `launch`; see `trainer::prefix`), the file
    // kind in the private folder, deleted with the caches.
    let prefix_plan = crate::prefix::plan_prefix_cache(
        trainer.model(),
        trainer.scope(),
        &prefix_settings(
            cfg.train.prefix_cache,
            cfg.data.max_length,
            train_set.len() + validation.len(),
            writer.then_some(&private_dir),
        ),
    )?;
    let train_cache = prefix_plan.open(train_set.len(), "train", Some(&private_dir))?;
    let val_cache = match validation.len() {
        0 => None,
        n => prefix_plan.open(n, "validation", Some(&private_dir))?,
    };
    trainer = trainer.with_prefix_caches(train_cache, val_cache)?;
    let mut files = LoopFiles::open(&dir, writer)?;
    let started = Instant::now();
    let total = trainer.plan().updates;
    let LoopOutcome {
        metrics: all_metrics,
        eval_curve,
        eval_seconds,
        epsilon_curve,
        interrupted,
    } = run_updates(
        &mut trainer,
        &LoopContext {
            cfg: &cfg,
            privacy: &privacy,
            accountant: &acc,
            validation: &validation,
            resumed,
            comm,
        },
        &mut files,
        progress,
        stop.as_ref(),
    )?;
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
    let expert_noise = match (
        trainer.plan().expert_release_noise()?,
        trainer.plan().shared_release_noise()?,
    ) {
        (Some(e), Some(s)) => Some((e, s)),
        _ => None,
    };
    let mut caches = trainer.take_prefix_caches();
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
    let Measured {
        eval,
        generation,
        diagnostics,
        membership_inference,
    } = if writer {
        measure(
            model.as_ref(),
            tokenizer.as_ref(),
            (&cfg).into(),
            &cfg.eval,
            crate::session::Encoding::of(&cfg.data, &cfg.model),
            &train_set,
            &validation,
            &validation_sources,
            expert_noise,
            layer.as_ref(),
            pad_id,
            device,
            &mut caches,
        )?
    } else {
        Measured::default()
    };
    drop(caches);
    let device_name = device_name(device);
    let noise_source = noise_source(cfg.train.insecure_seed.is_some(), &device_name);
    // Validation metrics are computed without noise: published only for public records.
    let (generation, generation_samples) = generation.unzip();
    let validation_metrics = validation_info.as_ref().map(|_| ValidationMetrics {
        records: validation.len(),
        eval,
        eval_curve,
        generation,
    });
    let (public_metrics, private_metrics) = match &validation_info {
        Some(v) if v.public => (validation_metrics, None),
        _ => (None, validation_metrics),
    };
    let record = Record {
        raptor_version: env!("CARGO_PKG_VERSION").into(),
        device: device_name,
        noise_source,
        ranks: comm.size(),
        communicated_bytes: comm_stats.bytes,
        libtorch: raptor_train::libtorch_version(),
        method: cfg.method.name().to_string(),
        seed: cfg.train.seed,
        insecure_seeded: cfg.train.insecure_seed.is_some(),
        train_records: train_set.len(),
        labels: labels.map(|l| l.labels().to_vec()),
        privacy_plan: privacy,
        layer,
        trainable_parameters,
        updates,
        epsilon_curve,
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
        validation: validation_info,
        validation_metrics: public_metrics,
        labels_source,
        private: PrivateRecord {
            notice: PRIVATE_NOTICE.into(),
            metrics: all_metrics,
            membership_inference,
            diagnostics,
            validation_metrics: private_metrics,
            generation_samples: generation_samples.unwrap_or_default(),
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
        return Err(RunError::Run(format!(
            "stopped at update {updates} of {total}; checkpoint written. Resume with: raptor train --resume {}",
            dir.display()
        )));
    }
    Ok((dir, record, model))
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
        let ids: std::collections::BTreeSet<String> =
            (0..50).map(|_| new_run_id(cfg.method.name())).collect();
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
            optim_settings(&cfg.method, &cfg.train).unwrap(),
            OptimSettings::adamw(cfg.train.lr)
        );
    }
}
