//! Training that tells what it is about to do: [`train_reporting`] prepares the run, hands a
//! [`StartInfo`] (records, q, σ per stream, the planned ε and δ, updates, a time estimate from
//! a short probe, the frozen-prefix cache's plan, and warnings about runs unlikely to learn) to
//! the caller before the first update, then trains as [`crate::train_with`] does.
//!
//! Privacy of what it reports: N (records), the label set (read from the training file) and
//! every field of the privacy plan are treated as public, as everywhere in raptor. The time
//! probe runs the model on synthetic records, never on private ones. Two statistics of the
//! private records are shown, both computed without noise and marked as such wherever they are
//! shown (diagnostics for the data owner, like the per-update losses; `StartInfo` goes to the
//! caller only, never into the run's record): [`StartInfo::unknown_token_fraction`] (how much of
//! the training text the tokenizer maps to its unknown token) and the probe's
//! [`TimeEstimate::padded_length`] (the expected longest record of a micro-batch, from the
//! records' lengths). The frozen-prefix cache is planned from public sizes only.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::error::Result;
use crate::session::{Session, prepare};
use crate::{Progress, Record, StopFlag};
use raptor_train::config::RunConfig;
use raptor_train::methods::PrivacyPlan;

/// Updates below which a randomly initialized model is flagged as unlikely to learn.
pub const RANDOM_INIT_MIN_UPDATES: u64 = 1000;

/// Expected batch size below which a private run is flagged (too much noise per record).
pub const MIN_EXPECTED_BATCH: f64 = 32.0;

/// Fraction of training tokens mapped to the unknown token above which the vocabulary is
/// flagged as not covering the data.
pub const MAX_UNKNOWN_FRACTION: f64 = 0.05;

/// How long the run is expected to take, from a short probe of the run's own update.
///
/// The probe runs the run's update (per-record clipping for a private method, on each phase of
/// the plan's pattern) over synthetic records of [`TimeEstimate::padded_length`] tokens: the
/// expected length a micro-batch is padded to, its longest record. That length comes from the
/// training records' lengths, which are private: it is computed without noise, said to be where
/// it is shown, and kept out of the run's record. With the frozen-prefix cache the probe also
/// times the update started from cached states, and the total follows the cache as it fills (a
/// record is cached from its first draw: at update t a drawn record is new with probability
/// (1 − q)^t).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimeEstimate {
    /// Seconds for one forward pass (no gradient) over one synthetic record.
    pub forward_seconds_per_record: f64,
    /// Seconds of the run's update per record, computing every block (the first epoch).
    pub step_seconds_per_record: f64,
    /// Seconds of the run's update per record started from cached states (None: no cache).
    pub cached_step_seconds_per_record: Option<f64>,
    /// Tokens of the synthetic records: the expected longest record of a micro-batch of the
    /// run's size, from the training records' lengths (private, without noise).
    pub padded_length: usize,
    /// Expected seconds of the first update (expected batch × the uncached cost per record).
    pub seconds_per_update: f64,
    /// Expected seconds of an update once every record is cached (equal to the first without
    /// a cache).
    pub later_seconds_per_update: f64,
    /// Expected seconds of the whole run: the updates, plus the final evaluation and
    /// membership-inference passes (forward only).
    pub total_seconds: f64,
}

/// Tensors the size of the trainable parameters that a run holds and its probe does not
/// create: the optimizer's state (AdamW's two moments; SGD's and Muon's momentum need fewer),
/// the update's noised release, and a temporary of the optimizer's step. Measured once, on
/// full fine-tuning of the upcycled MiniLM (72 M parameters, where the state dominates): the
/// probe's part came to 1,530 MiB and the run peaked at 2,597 MiB, 3.9 copies above it.
pub const STATE_COPIES: u64 = 4;

/// The run's expected peak memory, from the same probe: what is resident before it (the model,
/// the records) plus the most resident memory a probe update added per synthetic record, times
/// the records of a micro-batch, plus the frozen-prefix cache when it is kept in memory (its
/// bound from public sizes), plus [`STATE_COPIES`] copies of the trainable parameters (small
/// for LoRA; for full fine-tuning of the upcycled MiniLM, 72 M parameters, about 1.1 GiB).
/// Read from `/proc/self/status` (Linux), sampled every 2 ms while the probe's updates run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MemoryEstimate {
    /// Resident bytes before the probe.
    pub resident_bytes: u64,
    /// Largest resident bytes a probe update added, per record of its batch.
    pub per_record_bytes: u64,
    /// Records of a micro-batch of the run (`train.micro_batch`, at most the expected batch).
    pub micro_batch: usize,
    /// The frozen-prefix cache's bound when it is kept in memory (0 otherwise).
    pub cache_bytes: u64,
    /// The optimizer's state and the release: [`STATE_COPIES`] × the trainable parameters'
    /// bytes.
    pub state_bytes: u64,
    /// `resident + per_record × micro_batch + cache + state`.
    pub peak_bytes: u64,
}

impl MemoryEstimate {
    /// The estimate from its parts (`peak_bytes` summed, saturating).
    pub fn new(
        resident_bytes: u64,
        per_record_bytes: u64,
        micro_batch: usize,
        cache_bytes: u64,
        state_bytes: u64,
    ) -> Self {
        let peak_bytes = resident_bytes
            .saturating_add(per_record_bytes.saturating_mul(micro_batch as u64))
            .saturating_add(cache_bytes)
            .saturating_add(state_bytes);
        Self {
            resident_bytes,
            per_record_bytes,
            micro_batch,
            cache_bytes,
            state_bytes,
            peak_bytes,
        }
    }
}

/// The largest resident memory while `f` runs, sampled every 2 ms on a thread of its own.
fn peak_resident_during<T>(f: impl FnOnce() -> T) -> (T, Option<u64>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(crate::memory::resident_bytes().unwrap_or(0)));
    let sampler = {
        let (stop, peak) = (Arc::clone(&stop), Arc::clone(&peak));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(r) = crate::memory::resident_bytes() {
                    peak.fetch_max(r, Ordering::Relaxed);
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let out = f();
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let p = peak.load(Ordering::Relaxed);
    (out, (p > 0).then_some(p))
}

/// Expected seconds of `updates` updates at sampling rate `q`, expected batch `b`, when a
/// record costs `full` seconds until its first draw and `cached` after it: Σ_t b·(u_t·full +
/// (1 − u_t)·cached) with u_t = (1 − q)^t.
pub fn expected_update_seconds(updates: u64, q: f64, b: f64, full: f64, cached: f64) -> f64 {
    let t = updates as f64;
    let fresh = if q > 0.0 {
        (1.0 - (1.0 - q).powf(t)) / q
    } else {
        t
    };
    b * (cached * t + (full - cached) * fresh)
}

/// The expected length of the longest of `m` records drawn with replacement from `lengths`
/// (the length a micro-batch of `m` records is padded to), by 512 seeded draws, rounded up.
pub fn expected_padded_length(lengths: &[usize], m: usize) -> usize {
    use rand::{Rng, SeedableRng};
    if lengths.is_empty() || m == 0 {
        return 0;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let draws = 512;
    let mut sum = 0usize;
    for _ in 0..draws {
        let longest = (0..m)
            .map(|_| lengths[rng.random_range(0..lengths.len())])
            .max()
            .unwrap_or(0);
        sum += longest;
    }
    sum.div_ceil(draws)
}

/// What a run is about to do, handed to the caller before its first update.
#[derive(Debug, Clone, Serialize)]
pub struct StartInfo {
    /// The run folder.
    pub dir: PathBuf,
    /// Whether the run resumes from its folder.
    pub resuming: bool,
    /// Method name.
    pub method: String,
    /// The model: `kind` and where it comes from.
    pub model: String,
    /// Training records N (public by convention).
    pub train_records: usize,
    /// Validation records.
    pub validation_records: usize,
    /// The label set, read from the training file (so revealed by the run).
    pub labels: Option<Vec<String>>,
    /// The privacy plan (q, σ per stream, planned ε, δ, updates).
    pub privacy: PrivacyPlan,
    /// Trainable parameters (all phases).
    pub trainable_parameters: i64,
    /// Tokens per record at most (`data.max_length`).
    pub max_length: usize,
    /// The time estimate (None when the probe could not run). Its padded length comes from
    /// the private records' lengths: shown to the data owner, never written to the record.
    pub estimate: Option<TimeEstimate>,
    /// What the run does about the frozen-prefix cache (None when it could not be planned).
    pub prefix_cache: Option<crate::prefix::PrefixPlan>,
    /// The expected peak memory (None when the probe could not measure it).
    pub memory: Option<MemoryEstimate>,
    /// Seconds each part of the preparation took ([`Session::prepare_seconds`]), then the
    /// frozen-prefix cache's plan and the probe's: where the time before the first update goes.
    /// The owner maps' and tokenizing's times depend on the private records' lengths: shown to
    /// the data owner, never written to the run's record.
    pub prepare_seconds: Vec<(&'static str, f64)>,
    /// Fraction of the training tokens the tokenizer maps to its unknown token. Computed on the
    /// private training records **without noise**: a diagnostic for the data owner, not part of
    /// the release. None for tokenizers without an unknown token.
    pub unknown_token_fraction: Option<f64>,
    /// Why the run may not learn, and settings it ignores ([`RunConfig::ignored_settings`])
    /// (empty when nothing was found), one sentence each.
    pub warnings: Vec<String>,
}

/// Called once before the first update.
pub type OnStart<'a> = &'a mut dyn FnMut(&StartInfo);

/// [`crate::train_with`], calling `on_start` with what the run is about to do after
/// everything is read and checked and before the first update.
///
/// # Errors
/// As [`crate::train_with`].
pub fn train_reporting(
    cfg: &RunConfig,
    runs_dir: &Path,
    resume: Option<&Path>,
    on_start: OnStart<'_>,
    progress: Progress<'_>,
    stop: Option<StopFlag>,
    comm: &dyn raptor_train::dist::Collective,
) -> Result<(PathBuf, Record)> {
    let (cfg, dir, resuming) = crate::run::resolve_run(cfg, runs_dir, resume, comm)?;
    let session = prepare(&cfg)?;
    if comm.is_writer() {
        let info = start_info(&session, &dir, resuming);
        on_start(&info);
    }
    crate::train_session(session, dir, resuming, progress, stop, comm)
        .map(|(dir, record, _)| (dir, record))
}

/// The [`StartInfo`] of a prepared session (runs the time probe).
pub fn start_info(session: &Session, dir: &Path, resuming: bool) -> StartInfo {
    let cfg = &session.cfg;
    let vars = session.model.var_store().variables();
    let trainable_parameters: i64 = session
        .plan
        .params()
        .iter()
        .filter_map(|p| vars.get(p))
        .map(|t| t.numel() as i64)
        .sum();
    let model = match &cfg.model.path {
        Some(p) => format!("{} from {}", cfg.model.kind, p.display()),
        None => format!(
            "{} initialized at random (d_model {}, {} layers)",
            cfg.model.kind, cfg.model.d_model, cfg.model.layers
        ),
    };
    let unknown_token_fraction = session.tokenizer.unk_id().map(|unk| {
        let (mut total, mut unknown) = (0usize, 0usize);
        for e in &session.train {
            total += e.tokens.len();
            unknown += e.tokens.iter().filter(|&&t| t == i64::from(unk)).count();
        }
        if total == 0 {
            0.0
        } else {
            unknown as f64 / total as f64
        }
    });
    let mut prepare_seconds = session.prepare_seconds.clone();
    let t0 = std::time::Instant::now();
    let scope = crate::prefix::training_scope(session.model.as_ref(), &session.plan);
    let prefix_cache = crate::prefix::plan_prefix_cache(
        session.model.as_ref(),
        &scope,
        &crate::prefix_settings(
            cfg.train.prefix_cache,
            cfg.data.max_length,
            session.train.len() + session.validation.len(),
            Some(&dir.join("private")),
        ),
    )
    .ok();
    let t1 = std::time::Instant::now();
    prepare_seconds.push(("prefix cache plan", (t1 - t0).as_secs_f64()));
    let (estimate, memory) = match probe(session, prefix_cache.as_ref()) {
        Ok((t, m)) => (Some(t), m),
        Err(_) => (None, None),
    };
    prepare_seconds.push(("probe", t1.elapsed().as_secs_f64()));
    let mut warnings = learnability_warnings(&Learnability::of(
        &cfg.model,
        &session.privacy,
        unknown_token_fraction,
    ));
    warnings.extend(cfg.ignored_settings());
    StartInfo {
        dir: dir.to_path_buf(),
        resuming,
        method: cfg.method.name().to_string(),
        model,
        train_records: session.train.len(),
        validation_records: session.validation.len(),
        labels: session.labels.as_ref().map(|l| l.labels().to_vec()),
        privacy: session.privacy.clone(),
        trainable_parameters,
        max_length: cfg.data.max_length,
        estimate,
        prefix_cache,
        memory,
        prepare_seconds,
        unknown_token_fraction,
        warnings,
    }
}

/// What [`learnability_warnings`] looks at (all public but the unknown-token fraction).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Learnability {
    /// No `model.path`: the model is initialized at random.
    pub random_init: bool,
    /// The method is private.
    pub private: bool,
    /// Planned updates.
    pub updates: u64,
    /// Training records N.
    pub records: usize,
    /// Expected batch B.
    pub expected_batch: f64,
    /// Fraction of training tokens unknown to the tokenizer (computed on private records,
    /// without noise), if the tokenizer has an unknown token.
    pub unknown_token_fraction: Option<f64>,
}

impl Learnability {
    /// What a prepared run's `[model]` and plan say.
    pub fn of(
        model: &raptor_train::config::ModelConfig,
        privacy: &PrivacyPlan,
        unknown_token_fraction: Option<f64>,
    ) -> Self {
        Self {
            random_init: model.path.is_none(),
            private: privacy.private,
            updates: privacy.updates,
            records: privacy.records,
            expected_batch: privacy.expected_batch,
            unknown_token_fraction,
        }
    }
}

/// Why a run is unlikely to learn, one sentence each:
///
/// - a randomly initialized model (no `model.path`) with fewer than
///   [`RANDOM_INIT_MIN_UPDATES`] updates;
/// - a private run whose expected batch is below [`MIN_EXPECTED_BATCH`];
/// - more than [`MAX_UNKNOWN_FRACTION`] of the training tokens unknown to the tokenizer (said
///   to be computed on the private records without noise).
pub fn learnability_warnings(l: &Learnability) -> Vec<String> {
    let mut out = Vec::new();
    if l.random_init && l.updates < RANDOM_INIT_MIN_UPDATES {
        out.push(format!(
            "the model is initialized at random and trains for {} updates: such a model rarely \
             learns a text task from {} records. The pretrained default learns: remove the \
             [model] section (or set model.kind = \"bert\", model.path = \"all-minilm-l6-v2\", \
             model.tokenizer = \"model\")",
            l.updates, l.records
        ));
    }
    if l.private && l.expected_batch < MIN_EXPECTED_BATCH {
        out.push(format!(
            "the expected batch is {:.0} records (below {MIN_EXPECTED_BATCH:.0}): the noise of each \
             update is large against the signal of so few records; raise train.batch_size",
            l.expected_batch
        ));
    }
    if let Some(f) = l.unknown_token_fraction
        && f > MAX_UNKNOWN_FRACTION
    {
        out.push(format!(
            "the tokenizer does not cover the data's vocabulary: {:.0} % of the training tokens are \
             its unknown token (computed on the private records, without noise); choose a model \
             whose tokenizer fits the language of the data",
            100.0 * f
        ));
    }
    out
}

/// Times the run's update over synthetic records of the expected padded length (see
/// [`TimeEstimate`]): one warm-up, then the faster of two timed passes per phase of the plan's
/// pattern (other work on the machine only slows), from the token ids and, with a
/// frozen-prefix cache, from cached states; then scales to the run. The resident memory it
/// adds gives the [`MemoryEstimate`].
fn probe(
    session: &Session,
    prefix: Option<&crate::prefix::PrefixPlan>,
) -> Result<(TimeEstimate, Option<MemoryEstimate>)> {
    use raptor_models::{ClippedStep, ForwardCtx};
    use std::collections::BTreeMap;
    let cfg = &session.cfg;
    let b = session.privacy.expected_batch;
    let m = (cfg.train.micro_batch.max(1) as f64)
        .min(b.max(1.0))
        .round() as usize;
    let n = 16usize.min(m.max(1));
    let vocab = session.model.vocab_size().max(2);
    let filler = (session.pad_id + 1).rem_euclid(vocab);
    let lengths: Vec<usize> = session.train.iter().map(|e| e.tokens.len()).collect();
    let len = expected_padded_length(&lengths, m)
        .min(cfg.data.max_length)
        .max(2);
    let (pre, post) = session.tokenizer.special_ids();
    let mut record: Vec<i64> = pre.iter().map(|&t| i64::from(t)).collect();
    let body = len.saturating_sub(pre.len() + post.len()).max(1);
    record.extend(std::iter::repeat_n(filler, body));
    record.extend(post.iter().map(|&t| i64::from(t)));
    let records = vec![record; n];
    let labels = vec![0i64; n];
    let classify = crate::session::is_classifier(&cfg.model);
    let batch = raptor_models::Batch::from_records(
        &records,
        session.pad_id,
        classify.then_some(labels.as_slice()),
        session.device,
    )?;
    let model = session.model.as_ref();
    let cached = match prefix {
        Some(crate::prefix::PrefixPlan::Cache { prefix, .. }) => {
            Some((prefix.layers, model.prefix_hidden(&batch, prefix.layers)?))
        }
        _ => None,
    };
    let ids: Vec<u64> = (0..n as u64).collect();
    // One update of a phase over the probe batch (the run's engine for a private phase; plain
    // gradients otherwise), from the token ids or the cached states. Gradients are asked of
    // autograd for the trainable tensors directly (nothing accumulates into `.grad`), on a
    // public, synthetic batch.
    let run = |phase: &raptor_train::streams::Phase,
               from: Option<&(usize, tch::Tensor)>|
     -> Result<f64> {
        let t0 = Instant::now();
        let vars = model.var_store().variables();
        let keep = phase.params();
        let saved: Vec<(tch::Tensor, bool)> = vars
            .values()
            .map(|t| (t.shallow_clone(), t.requires_grad()))
            .collect();
        for (name, t) in &vars {
            let _ = t.f_set_requires_grad(keep.binary_search(name).is_ok())?;
        }
        let result = (|| -> Result<()> {
            if phase.private {
                let mut owners = BTreeMap::new();
                for &l in &phase.owner_layers {
                    owners.insert(
                        l,
                        tch::Tensor::f_zeros([n as i64], (tch::Kind::Int64, session.device))?,
                    );
                }
                let (groups, policy) = phase.clipping();
                let mut step = ClippedStep::new(model)?.with_record_ids(ids.clone());
                if let Some((k, h)) = from {
                    step = step.with_prefix(*k, h.shallow_clone());
                }
                let _ = step.run(&batch, &owners, &groups, &policy, &BTreeMap::new(), true)?;
            } else {
                let mut ctx = ForwardCtx::new(true);
                ctx.record_ids = Some(ids.clone());
                ctx.prefix = from.map(|(k, h)| (*k, h.shallow_clone()));
                let loss = model
                    .per_record_loss(&batch, &mut ctx)?
                    .f_sum(tch::Kind::Float)?;
                let trainable: Vec<tch::Tensor> = keep
                    .iter()
                    .filter_map(|p| vars.get(p).map(tch::Tensor::shallow_clone))
                    .collect();
                if !trainable.is_empty() {
                    let _ = tch::Tensor::f_run_backward(&[&loss], &trainable, false, false)?;
                }
            }
            Ok(())
        })();
        for (t, rg) in saved {
            let _ = t.f_set_requires_grad(rg)?;
        }
        result?;
        Ok(t0.elapsed().as_secs_f64())
    };
    let plan = &session.plan;
    let mut distinct: Vec<usize> = plan.pattern.clone();
    distinct.sort_unstable();
    distinct.dedup();
    // Per-record seconds of each phase, uncached and cached; averaged over the pattern. The
    // resident memory is sampled meanwhile (the cached update needs less: the uncached one's
    // peak is the run's first epoch).
    let mut full: BTreeMap<usize, f64> = BTreeMap::new();
    let mut from_cache: BTreeMap<usize, f64> = BTreeMap::new();
    // The free space glibc keeps inside its arenas is given back first (as the run does after
    // every update): otherwise the probe's updates reuse it, and the memory they add, the
    // basis of the expected peak, reads as almost nothing.
    crate::memory::release_free_memory();
    let before = crate::memory::resident_bytes();
    let (timed, peak) = peak_resident_during(|| -> Result<()> {
        for &pi in &distinct {
            let ph = &plan.phases[pi];
            run(ph, None)?;
            full.insert(pi, run(ph, None)?.min(run(ph, None)?) / n as f64);
            if let Some(c) = &cached {
                run(ph, Some(c))?;
                from_cache.insert(pi, run(ph, Some(c))?.min(run(ph, Some(c))?) / n as f64);
            }
        }
        Ok(())
    });
    timed?;
    let micro = m.max(1);
    let cache_bytes = match prefix {
        Some(crate::prefix::PrefixPlan::Cache {
            file: false,
            bound_bytes,
            ..
        }) => *bound_bytes,
        _ => 0,
    };
    let vars = model.var_store().variables();
    let trainable_bytes: u64 = plan
        .params()
        .iter()
        .filter_map(|p| vars.get(p))
        .map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
        .sum();
    let memory = match (before, peak) {
        (Some(before), Some(peak)) => Some(MemoryEstimate::new(
            before,
            peak.saturating_sub(before).div_ceil(n as u64),
            micro,
            cache_bytes,
            STATE_COPIES * trainable_bytes,
        )),
        _ => None,
    };
    let mean = |m: &BTreeMap<usize, f64>| -> f64 {
        let v: Vec<f64> = plan
            .pattern
            .iter()
            .filter_map(|p| m.get(p))
            .copied()
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let per_record_step = mean(&full);
    let per_record_cached = cached.as_ref().map(|_| mean(&from_cache));
    let t0 = Instant::now();
    let mut ctx = ForwardCtx::new(false);
    ctx.prefix = cached.as_ref().map(|(k, h)| (*k, h.shallow_clone()));
    let _logits = tch::no_grad(|| model.forward(&batch, &mut ctx))?;
    let per_record = t0.elapsed().as_secs_f64() / n as f64;
    let later = per_record_cached.unwrap_or(per_record_step);
    let updates =
        expected_update_seconds(session.privacy.updates, plan.q, b, per_record_step, later);
    let eval_records = session.validation.len() as f64
        + 2.0 * session.train.len().min(session.validation.len()).min(1000) as f64;
    Ok((
        TimeEstimate {
            forward_seconds_per_record: per_record,
            step_seconds_per_record: per_record_step,
            cached_step_seconds_per_record: per_record_cached,
            padded_length: len,
            seconds_per_update: per_record_step * b,
            later_seconds_per_update: later * b,
            total_seconds: updates + per_record * eval_records,
        },
        memory,
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_counts_every_part() {
        // 400 MiB resident, 3 MiB per record of 64, a 100 MiB cache, 72 M f32 parameters.
        let mib = 1u64 << 20;
        let state = STATE_COPIES * 72_000_000 * 4;
        let m = MemoryEstimate::new(400 * mib, 3 * mib, 64, 100 * mib, state);
        assert_eq!(m.peak_bytes, 400 * mib + 192 * mib + 100 * mib + state);
        // Full fine-tuning's state is not small: more than 1 GiB here.
        assert!(m.state_bytes > 1024 * mib);
        // Saturates instead of wrapping.
        assert_eq!(
            MemoryEstimate::new(u64::MAX, 1, 2, 3, 4).peak_bytes,
            u64::MAX
        );
    }

    fn l(random_init: bool, private: bool, batch: f64, updates: u64) -> Learnability {
        Learnability {
            random_init,
            private,
            updates,
            records: 1000,
            expected_batch: batch,
            unknown_token_fraction: None,
        }
    }

    #[test]
    fn each_reason_not_to_learn_is_named_and_only_then() {
        // Random init, 81 updates: flagged; with many updates: not.
        let w = learnability_warnings(&l(true, true, 64.0, 81));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("initialized at random"), "{w:?}");
        assert!(learnability_warnings(&l(true, true, 64.0, 5000)).is_empty());
        // A small expected batch: flagged, privately only.
        let w = learnability_warnings(&l(false, true, 16.0, 40));
        assert!(
            w.len() == 1 && w[0].contains("expected batch is 16"),
            "{w:?}"
        );
        assert!(learnability_warnings(&l(false, false, 16.0, 40)).is_empty());
        // Unknown tokens: above the threshold only, and said to come from private records.
        let mut x = l(false, true, 64.0, 40);
        x.unknown_token_fraction = Some(0.01);
        assert!(learnability_warnings(&x).is_empty());
        x.unknown_token_fraction = Some(0.3);
        let w = learnability_warnings(&x);
        assert!(w.len() == 1 && w[0].contains("30 %") && w[0].contains("without noise"));
        // All three at once.
        x.random_init = true;
        x.expected_batch = 8.0;
        assert_eq!(learnability_warnings(&x).len(), 3);
    }
}
