//! Running the experiment grid: one run folder per config under `results/runs/<key>/`, reused
//! when it already holds a finished run (so an interrupted reproduce resumes), with a progress
//! bar per run and an overall ETA.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::RunConfig;
use crate::run::{Record, train_in, write_atomic};

/// What the tables and plots need from one finished run (`summary.json` in its folder).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Method name.
    pub method: String,
    /// Validation accuracy (classifiers).
    pub accuracy: Option<f64>,
    /// Validation loss (classifiers: cross-entropy; decoders: mean token NLL).
    pub loss: Option<f64>,
    /// Corpus BLEU (data-to-text).
    pub bleu: Option<f64>,
    /// ROUGE-L F (data-to-text).
    pub rouge_l: Option<f64>,
    /// Certified ε (upper bound) spent; None for non-private methods.
    pub epsilon: Option<f64>,
    /// Updates applied.
    pub updates: u64,
    /// Wall seconds per update (training loop only).
    pub seconds_per_update: f64,
    /// Peak resident memory of the process during the run (MiB; Linux), None elsewhere.
    pub peak_rss_mib: Option<f64>,
    /// Training loss per update.
    pub loss_curve: Vec<(u64, f64)>,
    /// Validation (update, loss, accuracy) every `eval_every` updates and at the end.
    pub eval_curve: Vec<(u64, f64, Option<f64>)>,
    /// Certified ε spent after an update.
    pub epsilon_curve: Vec<(u64, f64)>,
    /// RAPTOR's trained sparse layer.
    pub layer: Option<usize>,
    /// Public routing entropy per sparse layer (layer, normalized entropy).
    pub public_entropy: Vec<(usize, f64)>,
    /// Per-expert SNR (diagnostics); None where undefined (an expert no held-out record uses).
    pub snr: Vec<Option<f64>>,
    /// SNR coefficient of variation.
    pub snr_cv: Option<f64>,
    /// Role mismatch M_role.
    pub role_mismatch: Option<f64>,
}

impl Summary {
    /// Extracts the summary of a finished run.
    pub fn from_record(r: &Record, peak_rss_mib: Option<f64>) -> Self {
        let mut eval_curve: Vec<(u64, f64, Option<f64>)> = r
            .eval_curve
            .iter()
            .map(|(u, m)| (*u, m.loss, m.accuracy))
            .collect();
        if let Some(m) = &r.eval {
            eval_curve.push((r.updates, m.loss, m.accuracy));
        }
        // JSON has no NaN: a non-finite point would not read back.
        eval_curve.retain(|(_, l, a)| l.is_finite() && a.is_none_or(f64::is_finite));
        let public_entropy = r
            .layer
            .as_ref()
            .map(|l| {
                l.public_stats
                    .iter()
                    .filter_map(|v| {
                        Some((
                            v.get("layer")?.as_u64()? as usize,
                            v.get("normalized_entropy")?.as_f64()?,
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            method: r.method.clone(),
            accuracy: r.eval.as_ref().and_then(|e| e.accuracy),
            loss: r.eval.as_ref().map(|e| e.loss),
            bleu: r.generation.as_ref().map(|g| g.bleu),
            rouge_l: r.generation.as_ref().map(|g| g.rouge_l),
            epsilon: r.epsilon.as_ref().map(|e| e.upper),
            updates: r.updates,
            seconds_per_update: if r.updates > 0 {
                r.wall_seconds / r.updates as f64
            } else {
                0.0
            },
            peak_rss_mib,
            loss_curve: r
                .metrics
                .iter()
                .filter(|m| m.loss.is_finite())
                .map(|m| (m.update + 1, m.loss))
                .collect(),
            eval_curve,
            epsilon_curve: r
                .epsilon_curve
                .iter()
                .copied()
                .filter(|(_, e)| e.is_finite())
                .collect(),
            layer: r.layer.as_ref().map(|l| l.layer),
            public_entropy,
            snr: r
                .diagnostics
                .as_ref()
                .map(|d| d.snr.iter().map(|&x| x.is_finite().then_some(x)).collect())
                .unwrap_or_default(),
            snr_cv: r.diagnostics.as_ref().map(|d| d.snr_cv),
            role_mismatch: r.diagnostics.as_ref().map(|d| d.role_mismatch),
        }
    }
}

/// One run of the grid.
#[derive(Debug, Clone)]
pub struct Job {
    /// Human-readable label (`rt raptor eps=8 seed=1`).
    pub label: String,
    /// The run's config.
    pub cfg: RunConfig,
}

/// The folder name of a config: the first 16 hex digits of the SHA-256 of its TOML, after the
/// method name (so `results/runs/` can be browsed).
pub fn run_key(cfg: &RunConfig) -> anyhow::Result<String> {
    let text = cfg.to_toml()?;
    let digest = Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Ok(format!("{}-{hex}", cfg.method.name.name()))
}

/// SHA-256 (hex) of a file, for cache keys that depend on data.
pub fn file_hash(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Resets the peak-RSS counter of this process (Linux: `/proc/self/clear_refs`); false where
/// that is not possible.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak RSS (`VmHWM`) of this process in MiB (Linux).
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Runs jobs (reusing finished ones) and returns their summaries by label.
pub struct Runner {
    runs: PathBuf,
    multi: MultiProgress,
    overall: ProgressBar,
    started: Instant,
    done: usize,
}

impl Runner {
    /// A runner writing under `runs` for `total` jobs.
    pub fn new(runs: &Path, total: usize) -> anyhow::Result<Self> {
        std::fs::create_dir_all(runs).with_context(|| format!("creating {}", runs.display()))?;
        let multi = MultiProgress::new();
        let overall = multi.add(ProgressBar::new(total as u64));
        overall.set_style(
            ProgressStyle::with_template(
                "reproduce [{bar:30}] {pos}/{len} runs, {elapsed} elapsed, ETA {eta} {msg}",
            )
            .map_err(|e| anyhow::anyhow!("progress template: {e}"))?
            .progress_chars("=> "),
        );
        Ok(Self {
            runs: runs.to_path_buf(),
            multi,
            overall,
            started: Instant::now(),
            done: 0,
        })
    }

    /// The folder of a job.
    pub fn dir_of(&self, cfg: &RunConfig) -> anyhow::Result<PathBuf> {
        Ok(self.runs.join(run_key(cfg)?))
    }

    /// Runs (or reuses) one job in its keyed folder under the runs folder.
    pub fn run(&mut self, job: &Job) -> anyhow::Result<Summary> {
        let dir = self.dir_of(&job.cfg)?;
        self.run_at(job, &dir)
    }

    /// Counts a step that needed no run (e.g. a cached pretrained model).
    pub fn skip(&mut self, label: &str, what: &str) {
        self.finish(label, what);
    }

    /// Runs (or reuses) one job in folder `dir`.
    pub fn run_at(&mut self, job: &Job, dir: &Path) -> anyhow::Result<Summary> {
        let dir = dir.to_path_buf();
        let spath = dir.join("summary.json");
        if spath.exists() {
            let s: Summary = serde_json::from_slice(
                &std::fs::read(&spath).with_context(|| format!("reading {}", spath.display()))?,
            )
            .with_context(|| format!("parsing {}", spath.display()))?;
            self.finish(&job.label, "reused");
            return Ok(s);
        }
        let bar = self.multi.add(ProgressBar::new(0));
        bar.set_style(
            ProgressStyle::with_template("  {prefix} [{bar:25}] {pos}/{len} {msg}")
                .map_err(|e| anyhow::anyhow!("progress template: {e}"))?
                .progress_chars("=> "),
        );
        bar.set_prefix(job.label.clone());
        let rss_reset = reset_peak_rss();
        let mut progress =
            |done: u64, total: u64, m: &crate::trainer::UpdateMetrics, eps: Option<f64>| {
                bar.set_length(total);
                bar.set_position(done);
                match eps {
                    Some(e) => bar.set_message(format!("loss {:.3} ε {:.2}", m.loss, e)),
                    None => bar.set_message(format!("loss {:.3}", m.loss)),
                }
            };
        let result = train_in(&job.cfg, &dir, &mut progress, None);
        bar.finish_and_clear();
        let (_, record) =
            result.with_context(|| format!("run {} ({})", job.label, dir.display()))?;
        let rss = if rss_reset { peak_rss_mib() } else { None };
        let summary = Summary::from_record(&record, rss);
        write_atomic(&spath, &serde_json::to_vec_pretty(&summary)?)?;
        let what = match (summary.accuracy, summary.bleu) {
            (Some(a), _) => format!("accuracy {:.3}", a),
            (None, Some(b)) => format!("BLEU {:.1}", b),
            _ => String::new(),
        };
        self.finish(&job.label, &what);
        Ok(summary)
    }

    fn finish(&mut self, label: &str, what: &str) {
        self.done += 1;
        self.overall.inc(1);
        self.overall.set_message(format!("last: {label} {what}"));
        if self.overall.is_hidden() {
            eprintln!(
                "[{}/{} {:.0}s] {label} {what}",
                self.done,
                self.overall.length().unwrap_or(0),
                self.started.elapsed().as_secs_f64()
            );
        }
    }

    /// Runs every job in order; summaries by label.
    pub fn run_all(&mut self, jobs: &[Job]) -> anyhow::Result<BTreeMap<String, Summary>> {
        let mut out = BTreeMap::new();
        for j in jobs {
            let s = self.run(j)?;
            out.insert(j.label.clone(), s);
        }
        Ok(out)
    }

    /// Adds jobs to the overall count (e.g. pretraining runs discovered late).
    pub fn add_total(&self, n: usize) {
        self.overall.inc_length(n as u64);
    }

    /// Ends the overall bar.
    pub fn finish_all(&self) {
        self.overall.finish_and_clear();
    }
}
