//! The frozen-prefix cache of a run: whether it applies, where it is kept, what the run says
//! about it at start.
//!
//! When no parameter of the embeddings and the first k blocks trains in any phase and none of
//! them carries a LoRA adapter (`raptor_models::Model::frozen_prefix`), each record's hidden
//! states after block k are the same at every update. The trainer (crate `raptor-train`) then computes them the first
//! time a record is drawn and keeps them ([`raptor_models::PrefixCache`]); later updates, the
//! validation passes and the membership-inference check start at block k. The released updates
//! do not change beyond float round-off (the prefix was computed in another batch shape).
//!
//! Where the cache goes is decided from public sizes only — the records N, `data.max_length`,
//! the width d — and the memory the machine has free: in memory in f32 when N · T_max · d · 4
//! bytes fit the budget ([`memory_budget`]); else in half precision when that fits and a
//! measured check on synthetic records ([`F16_TOLERANCE`]) allows it; else in a file of the
//! run's `private/` folder (the states are computed from private records: never published,
//! readable by the owner only, deleted when the run ends); else (no private folder) the run
//! says so and computes as without a cache. Which records are cached, and how many bytes they
//! take, follow the private sample and the records' lengths; neither is written anywhere, and
//! nothing that is released or charged depends on the cache.

use std::path::PathBuf;

use raptor_models::{Batch, FrozenPrefix, Model, PrefixCache, PrefixPrecision, PrefixStore};
use serde::Serialize;
use tch::Device;

use raptor_train::config::PrefixCacheMode;

use crate::error::Result;

/// Largest relative change of the logits (over the largest logit, on synthetic records) that
/// admits half-precision storage when f32 does not fit in memory. f16 keeps 11 significant
/// bits (a relative rounding of at most 4.9e-4 per value).
pub const F16_TOLERANCE: f64 = 1e-3;

/// Fraction of the memory the machine has available (`MemAvailable`) that a cache may take.
pub const MEMORY_FRACTION: f64 = 0.25;

/// What a run does about the frozen-prefix cache (decided from public sizes; said at start).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub enum PrefixPlan {
    /// `train.prefix_cache = "off"`.
    Off,
    /// The model has no frozen prefix while the run trains (why, in words).
    NotApplicable {
        /// Why.
        why: String,
    },
    /// Neither in memory within the budget nor in a file (no private folder to put it in).
    TooLarge {
        /// The frozen prefix.
        prefix: FrozenPrefix,
        /// Bytes at most, f32 (N · T_max · d · 4).
        bound_bytes: u64,
        /// The memory budget.
        budget_bytes: u64,
    },
    /// The run caches the states after `prefix.layers` blocks.
    Cache {
        /// The frozen prefix.
        prefix: FrozenPrefix,
        /// Storage precision.
        precision: PrefixPrecision,
        /// In a file of the run's private folder (else in memory).
        file: bool,
        /// Bytes at most at this precision (N · T_max · d · bytes), from public sizes.
        bound_bytes: u64,
        /// The memory budget.
        budget_bytes: u64,
        /// The measured relative logit change of f16 storage, when it was measured.
        f16_error: Option<f64>,
    },
}

impl PrefixPlan {
    /// Whether the run caches.
    pub fn caches(&self) -> bool {
        matches!(self, PrefixPlan::Cache { .. })
    }

    /// One sentence for the start report.
    pub fn describe(&self) -> String {
        let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
        match self {
            PrefixPlan::Off => "frozen-prefix cache: off (train.prefix_cache)".into(),
            PrefixPlan::NotApplicable { why } => format!("frozen-prefix cache: not used ({why})"),
            PrefixPlan::TooLarge {
                prefix,
                bound_bytes,
                budget_bytes,
            } => format!(
                "frozen-prefix cache: not used, it would not fit: up to {:.0} MiB for the states after {} of {} blocks, above the memory budget of {:.0} MiB, and the run has no private folder for a file; every update computes the frozen blocks again",
                mb(*bound_bytes),
                prefix.layers,
                prefix.of,
                mb(*budget_bytes)
            ),
            PrefixPlan::Cache {
                prefix,
                precision,
                file,
                bound_bytes,
                budget_bytes,
                f16_error,
            } => format!(
                "frozen-prefix cache: the embeddings and blocks 0..{} of {} are frozen, so each record's hidden states after them are computed once (when first drawn) and reused; up to {:.0} MiB in {:?}{}{}",
                prefix.layers,
                prefix.of,
                mb(*bound_bytes),
                precision,
                if *file {
                    format!(
                        " in a file of the run's private folder (above the memory budget of {:.0} MiB; deleted when the run ends)",
                        mb(*budget_bytes)
                    )
                } else {
                    format!(" in memory (budget {:.0} MiB)", mb(*budget_bytes))
                },
                match f16_error {
                    Some(e) => format!(
                        "; f16 storage moved the logits of synthetic records by {e:.1e} of the largest (tolerance {F16_TOLERANCE:.0e})"
                    ),
                    None => String::new(),
                }
            ),
        }
    }

    /// An empty cache for `records` records (None when the plan does not cache). A file cache
    /// is `prefix-cache-<name>.bin` in `private_dir`.
    ///
    /// # Errors
    /// A file that cannot be created.
    pub fn open(
        &self,
        records: usize,
        name: &str,
        private_dir: Option<&std::path::Path>,
    ) -> Result<Option<PrefixCache>> {
        let PrefixPlan::Cache {
            prefix,
            precision,
            file,
            ..
        } = self
        else {
            return Ok(None);
        };
        let store = match (file, private_dir) {
            (true, Some(d)) => {
                std::fs::create_dir_all(d).map_err(crate::error::io(d))?;
                PrefixStore::File(d.join(format!("prefix-cache-{name}.bin")))
            }
            _ => PrefixStore::Memory,
        };
        Ok(Some(PrefixCache::new(
            prefix.layers,
            prefix.width,
            records,
            *precision,
            store,
        )?))
    }
}

/// What [`plan_prefix_cache`] reads besides the model.
#[derive(Debug, Clone)]
pub struct PrefixSettings {
    /// `train.prefix_cache`.
    pub mode: PrefixCacheMode,
    /// The run's private folder (for a file cache); None: memory only.
    pub private_dir: Option<PathBuf>,
    /// Bytes the cache may take in memory; None: [`memory_budget`].
    pub memory_budget: Option<u64>,
    /// Tokens per record at most (`data.max_length`).
    pub max_tokens: usize,
    /// Records to cache (training and validation together).
    pub records: usize,
}

/// [`MEMORY_FRACTION`] of the machine's available memory (`MemAvailable` of `/proc/meminfo`;
/// 1 GiB where it cannot be read), read once per process (so the start report and the run
/// decide alike).
pub fn memory_budget() -> u64 {
    static BUDGET: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(read_memory_budget)
}

fn read_memory_budget() -> u64 {
    let avail = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024);
    match avail {
        Some(b) => (b as f64 * MEMORY_FRACTION) as u64,
        None => 1 << 30,
    }
}

/// What the run does about the cache for `model` while the parameters in `scope` train (every
/// phase's), from public sizes only (see the module docs).
///
/// # Errors
/// What the model reports in the f16 check.
pub fn plan_prefix_cache(
    model: &dyn Model,
    scope: &[String],
    settings: &PrefixSettings,
) -> Result<PrefixPlan> {
    if settings.mode == PrefixCacheMode::Off {
        return Ok(PrefixPlan::Off);
    }
    let Some(prefix) = model.frozen_prefix(scope) else {
        return Ok(PrefixPlan::NotApplicable {
            why: "the embeddings or the first block train or carry an adapter, or the model family cannot start from cached states".into(),
        });
    };
    let budget = settings.memory_budget.unwrap_or_else(memory_budget);
    let bound = |p: PrefixPrecision| {
        PrefixCache::bound_bytes(settings.records, settings.max_tokens, prefix.width, p)
    };
    let cache = |precision, file, f16_error| PrefixPlan::Cache {
        prefix,
        precision,
        file,
        bound_bytes: bound(precision),
        budget_bytes: budget,
        f16_error,
    };
    let file_ok = settings.private_dir.is_some();
    match settings.mode {
        PrefixCacheMode::Off => Ok(PrefixPlan::Off),
        PrefixCacheMode::Memory => Ok(cache(PrefixPrecision::F32, false, None)),
        PrefixCacheMode::File if file_ok => Ok(cache(PrefixPrecision::F32, true, None)),
        PrefixCacheMode::File | PrefixCacheMode::Auto => {
            if bound(PrefixPrecision::F32) <= budget {
                return Ok(cache(PrefixPrecision::F32, false, None));
            }
            if bound(PrefixPrecision::F16) <= budget {
                let e = f16_error(model, prefix.layers, settings.max_tokens)?;
                if e <= F16_TOLERANCE {
                    return Ok(cache(PrefixPrecision::F16, false, Some(e)));
                }
            }
            if file_ok {
                Ok(cache(PrefixPrecision::F32, true, None))
            } else {
                Ok(PrefixPlan::TooLarge {
                    prefix,
                    bound_bytes: bound(PrefixPrecision::F32),
                    budget_bytes: budget,
                })
            }
        }
    }
}

/// The relative logit change of f16 storage on 4 synthetic records of `max_tokens` tokens
/// (ids from a fixed generator: public).
fn f16_error(model: &dyn Model, layers: usize, max_tokens: usize) -> Result<f64> {
    let vocab = model.vocab_size().max(2);
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let records: Vec<Vec<i64>> = (0..4)
        .map(|_| {
            (0..max_tokens.max(2))
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    1 + (s % (vocab as u64 - 1)) as i64
                })
                .collect()
        })
        .collect();
    let device = model
        .var_store()
        .variables()
        .values()
        .next()
        .map_or(Device::Cpu, tch::Tensor::device);
    let batch = Batch::from_records(&records, 0, None, device)?;
    Ok(raptor_models::precision_error(
        model,
        &batch,
        layers,
        PrefixPrecision::F16,
    )?)
}

/// Every parameter a trainer over `plan` makes trainable at some update: those trainable in
/// `model` now (the method's scope) and the plan's (what [`plan_prefix_cache`] takes, and what
/// the trainer's `scope` holds).
pub fn training_scope(model: &dyn Model, plan: &raptor_train::streams::Plan) -> Vec<String> {
    let mut scope = raptor_models::trainable_params(model);
    scope.extend(plan.params());
    scope.sort();
    scope.dedup();
    scope
}
