//! Running the experiment grid: one run folder per config under `results/runs/<key>/`, reused
//! when it already holds a finished run (so an interrupted reproduce resumes), with a progress
//! bar per run and an overall ETA.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use raptor_run::{train_in, write_atomic};
use raptor_train::config::Choice as _;
use raptor_train::config::RunConfig;

use sha2::{Digest, Sha256};

/// What the tables and plots need from one finished run: raptor-run's summary, the one `raptor
/// train` writes too (`summary.json` and its private part `private/summary.json` in the run
/// folder; [`Summary::group_accuracy`] filled by the worker from [`GROUPS_FILE`]).
pub use raptor_run::Summary;

/// A run folder's list of validation groups (JSON: `[[name, file], …]`): when present, the
/// worker scores the finished run on each file ([`raptor_run::eval_run`]) into
/// [`Summary::group_accuracy`].
pub const GROUPS_FILE: &str = "groups.json";

/// One run of the grid.
#[derive(Debug, Clone)]
pub struct Job {
    /// Human-readable label (`rt raptor eps=8 seed=1`).
    pub label: String,
    /// The run's config.
    pub cfg: RunConfig,
}

/// The folder name of a config: the first 16 hex digits of the SHA-256 of its TOML and of the
/// contents of the files it names ([`input_files`]), after the method name (so `results/runs/`
/// can be browsed). The contents count because a file can change under the same path: a
/// pretrained model or tokenizer made again by a newer version, a corpus fetched again; a run
/// cached under the old contents is then not reused.
pub fn run_key(cfg: &RunConfig) -> anyhow::Result<String> {
    let mut text = cfg.to_toml()?;
    for f in input_files(cfg) {
        if f.is_file() {
            text.push_str(&format!("\n{}={}", f.display(), cached_file_hash(&f)?));
        }
    }
    let digest = Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Ok(format!("{}-{hex}", cfg.method.name().name()))
}

/// The files a run reads, by its config: the data files, the tokenizer file and, for
/// `model.path`, the checkpoint (a file, or a folder's `config.json`, weights and tokenizer).
pub fn input_files(cfg: &RunConfig) -> Vec<PathBuf> {
    let mut out = vec![cfg.data.train.clone()];
    out.extend(cfg.data.validation.clone());
    out.extend(cfg.data.public.clone());
    if let raptor_train::config::TokenizerSpec::File(p) = &cfg.model.tokenizer {
        out.push(p.clone());
    }
    if let Some(m) = &cfg.model.path {
        if m.is_dir() {
            for f in ["config.json", "model.safetensors", "tokenizer.json"] {
                out.push(m.join(f));
            }
        } else {
            out.push(m.clone());
        }
    }
    out
}

/// [`file_hash`], computed once per process for a file of the same length and modification
/// time (a grid's runs share their inputs).
fn cached_file_hash(path: &Path) -> anyhow::Result<String> {
    use std::sync::{Mutex, OnceLock};
    type Seen = std::collections::HashMap<(PathBuf, u64, Option<std::time::SystemTime>), String>;
    static SEEN: OnceLock<Mutex<Seen>> = OnceLock::new();
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let key = (path.to_path_buf(), meta.len(), meta.modified().ok());
    let seen = SEEN.get_or_init(|| Mutex::new(Seen::new()));
    if let Some(h) = seen.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(h);
    }
    let h = file_hash(path)?;
    if let Ok(mut m) = seen.lock() {
        m.insert(key, h.clone());
    }
    Ok(h)
}

/// SHA-256 (hex) of a file, for cache keys that depend on data.
pub fn file_hash(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The hidden subcommand of `raptor-reproduce` that runs one job: the worker process of a
/// parallel reproduce (`raptor-reproduce run-one --config <job.toml> --dir <run folder>`, see
/// [`run_one`]).
pub const WORKER_COMMAND: &str = "run-one";

/// Trains one job in folder `dir` in this process (resuming an interrupted run there) and
/// writes its `summary.json`. What the worker of a parallel reproduce
/// (`raptor-reproduce run-one`, [`WORKER_COMMAND`]) runs.
pub fn run_one(
    cfg: &RunConfig,
    dir: &Path,
    progress: raptor_run::Progress<'_>,
) -> anyhow::Result<Summary> {
    let rss_reset = raptor_run::reset_peak_rss();
    let (_, record) = train_in(cfg, dir, progress, None)?;
    let rss = if rss_reset {
        raptor_run::peak_rss_mib()
    } else {
        None
    };
    let mut summary = Summary::from_record(&record, rss);
    summary.group_accuracy = group_accuracy(dir)?;
    summary.write(dir)?;
    Ok(summary)
}

/// The finished run in `dir` scored on each file of its [`GROUPS_FILE`] (none: empty).
fn group_accuracy(dir: &Path) -> anyhow::Result<Vec<(String, f64)>> {
    let path = dir.join(GROUPS_FILE);
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let groups: Vec<(String, PathBuf)> = serde_json::from_slice(&std::fs::read(&path)?)
        .with_context(|| format!("parsing {}", path.display()))?;
    let mut out = Vec::new();
    for (name, file) in groups {
        let r = raptor_run::eval_run(dir, Some(&file))
            .with_context(|| format!("scoring {} on {}", dir.display(), file.display()))?;
        if let Some(a) = r.metrics.accuracy {
            out.push((name, a));
        }
    }
    Ok(out)
}

fn read_summary(dir: &Path) -> anyhow::Result<Summary> {
    Summary::read(dir).with_context(|| format!("reading the summary of {}", dir.display()))
}

fn what(s: &Summary) -> String {
    match (s.accuracy, s.bleu, s.loss) {
        (Some(a), _, _) => format!("accuracy {a:.3}"),
        (None, Some(b), Some(l)) => format!("NLL {l:.3}, BLEU {b:.1}"),
        _ => String::new(),
    }
}

/// The last lines of a worker's log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("WARNING: noise from a user-given seed"))
        .collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// Runs jobs (reusing finished ones) and returns their summaries by label: in parallel worker
/// processes (`raptor-reproduce run-one`, one libtorch thread each: on small models this is much
/// faster than one process with several threads, and immune to oversubscription) when the
/// program's path is known, else one after another in this process.
pub struct Runner {
    runs: PathBuf,
    exe: Option<PathBuf>,
    workers: usize,
    multi: MultiProgress,
    overall: ProgressBar,
    started: Instant,
    done: usize,
    groups: Vec<(String, PathBuf)>,
}

/// A job in its folder.
pub type Placed = (Job, PathBuf);

impl Runner {
    /// A runner writing under `runs`; `exe`: the `raptor-reproduce` program for parallel workers;
    /// `workers`: how many at once.
    pub fn new(runs: &Path, exe: Option<PathBuf>, workers: usize) -> anyhow::Result<Self> {
        std::fs::create_dir_all(runs).with_context(|| format!("creating {}", runs.display()))?;
        let multi = MultiProgress::new();
        let overall = multi.add(ProgressBar::new(0));
        overall.set_style(
            ProgressStyle::with_template(
                "reproduce [{bar:30}] {pos}/{len} runs, {elapsed} elapsed, ETA {eta} {msg}",
            )
            .map_err(|e| anyhow::anyhow!("progress template: {e}"))?
            .progress_chars("=> "),
        );
        Ok(Self {
            runs: runs.to_path_buf(),
            exe,
            workers: workers.max(1),
            multi,
            overall,
            started: Instant::now(),
            done: 0,
            groups: Vec::new(),
        })
    }

    /// The keyed folder of a config under the runs folder.
    pub fn dir_of(&self, cfg: &RunConfig) -> anyhow::Result<PathBuf> {
        Ok(self.runs.join(run_key(cfg)?))
    }

    /// Places jobs in their keyed folders.
    pub fn place(&self, jobs: Vec<Job>) -> anyhow::Result<Vec<Placed>> {
        jobs.into_iter()
            .map(|j| {
                let d = self.dir_of(&j.cfg)?;
                Ok((j, d))
            })
            .collect()
    }

    /// The validation groups every job run from now on is scored on (its [`GROUPS_FILE`];
    /// empty: none).
    pub fn set_groups(&mut self, groups: Vec<(String, PathBuf)>) {
        self.groups = groups;
    }

    /// Writes the groups file into a job's folder (when groups are set).
    fn write_groups(&self, dir: &Path) -> anyhow::Result<()> {
        if !self.groups.is_empty() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            write_atomic(&dir.join(GROUPS_FILE), &serde_json::to_vec(&self.groups)?)?;
        }
        Ok(())
    }

    /// Counts a step that needed no run (e.g. a cached pretrained model).
    pub fn skip(&mut self, label: &str, what: &str) {
        self.overall.inc_length(1);
        self.finish(label, what);
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

    fn bar(&self, label: &str, total: u64) -> anyhow::Result<ProgressBar> {
        let bar = self.multi.add(ProgressBar::new(total));
        bar.set_style(
            ProgressStyle::with_template("  {prefix} [{bar:25}] {pos}/{len} {msg}")
                .map_err(|e| anyhow::anyhow!("progress template: {e}"))?
                .progress_chars("=> "),
        );
        bar.set_prefix(label.to_string());
        Ok(bar)
    }

    /// Runs every job (reusing finished ones); summaries by label.
    pub fn run_all(&mut self, jobs: &[Placed]) -> anyhow::Result<BTreeMap<String, Summary>> {
        self.overall.inc_length(jobs.len() as u64);
        let mut out = BTreeMap::new();
        let mut todo = Vec::new();
        for (j, d) in jobs {
            if d.join("summary.json").exists() {
                let mut s = read_summary(d)?;
                if !self.groups.is_empty() && s.group_accuracy.is_empty() {
                    // A run finished before its groups were asked for: score it now.
                    self.write_groups(d)?;
                    s.group_accuracy = group_accuracy(d)?;
                    s.write(d)?;
                }
                out.insert(j.label.clone(), s);
                self.finish(&j.label, "reused");
            } else {
                self.write_groups(d)?;
                todo.push((j, d));
            }
        }
        match self.exe.clone() {
            Some(exe) => self.run_parallel(&exe, &todo, &mut out)?,
            None => {
                for (j, d) in todo {
                    let bar = self.bar(&j.label, j.cfg.train.steps.unwrap_or(0))?;
                    let mut progress = |done: u64,
                                        total: u64,
                                        m: &raptor_train::trainer::UpdateMetrics,
                                        eps: Option<f64>| {
                        bar.set_length(total);
                        bar.set_position(done);
                        match eps {
                            Some(e) => bar.set_message(format!("loss {:.3} ε {:.2}", m.loss, e)),
                            None => bar.set_message(format!("loss {:.3}", m.loss)),
                        }
                    };
                    let r = run_one(&j.cfg, d, &mut progress);
                    bar.finish_and_clear();
                    let s = r.with_context(|| format!("run {} ({})", j.label, d.display()))?;
                    self.finish(&j.label, &what(&s));
                    out.insert(j.label.clone(), s);
                }
            }
        }
        Ok(out)
    }

    fn run_parallel(
        &mut self,
        exe: &Path,
        todo: &[(&Job, &PathBuf)],
        out: &mut BTreeMap<String, Summary>,
    ) -> anyhow::Result<()> {
        struct Worker<'a> {
            job: &'a Job,
            dir: &'a PathBuf,
            child: std::process::Child,
            bar: ProgressBar,
        }
        let mut next = 0;
        let mut running: Vec<Worker<'_>> = Vec::new();
        let result = (|| -> anyhow::Result<()> {
            loop {
                while running.len() < self.workers && next < todo.len() {
                    let (job, dir) = todo[next];
                    next += 1;
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                    let jpath = dir.join("job.toml");
                    write_atomic(&jpath, job.cfg.to_toml()?.as_bytes())?;
                    let log = std::fs::File::create(dir.join("log.txt"))
                        .with_context(|| format!("creating {}/log.txt", dir.display()))?;
                    let child = std::process::Command::new(exe)
                        .arg(WORKER_COMMAND)
                        .arg("--config")
                        .arg(&jpath)
                        .arg("--dir")
                        .arg(dir)
                        .env("OMP_NUM_THREADS", "1")
                        .env("MKL_NUM_THREADS", "1")
                        .stdout(std::process::Stdio::null())
                        .stderr(log)
                        .spawn()
                        .with_context(|| format!("starting {}", exe.display()))?;
                    let bar = self.bar(&job.label, job.cfg.train.steps.unwrap_or(0))?;
                    running.push(Worker {
                        job,
                        dir,
                        child,
                        bar,
                    });
                }
                if running.is_empty() {
                    return Ok(());
                }
                std::thread::sleep(std::time::Duration::from_millis(250));
                let mut i = 0;
                while i < running.len() {
                    let w = &mut running[i];
                    let lines = std::fs::read(w.dir.join("private").join("metrics.jsonl"))
                        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
                        .unwrap_or(0);
                    w.bar.set_position(lines as u64);
                    match w.child.try_wait()? {
                        None => i += 1,
                        Some(status) => {
                            let w = running.swap_remove(i);
                            w.bar.finish_and_clear();
                            if !status.success() {
                                anyhow::bail!(
                                    "run {} failed ({status}); its folder is {}; log:\n{}",
                                    w.job.label,
                                    w.dir.display(),
                                    log_tail(&w.dir.join("log.txt"))
                                );
                            }
                            let s = read_summary(w.dir)?;
                            self.finish(&w.job.label, &what(&s));
                            out.insert(w.job.label.clone(), s);
                        }
                    }
                }
            }
        })();
        if result.is_err() {
            for mut w in running {
                let _ = w.child.kill();
                let _ = w.child.wait();
                w.bar.finish_and_clear();
            }
        }
        result
    }

    /// Ends the overall bar.
    pub fn finish_all(&self) {
        self.overall.finish_and_clear();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A run's key follows the contents of the files its config names, not only their paths:
    /// a pretrained model or tokenizer made again under the same path gets new runs.
    #[test]
    fn the_run_key_follows_the_contents_of_the_named_files() {
        let dir = tempfile::tempdir().unwrap();
        let (data, tok) = (dir.path().join("train.csv"), dir.path().join("tok.json"));
        std::fs::write(&data, "text,label\na,0\n").unwrap();
        std::fs::write(&tok, "{\"v\": 1}").unwrap();
        let mut cfg = RunConfig::default();
        cfg.data.train = data.clone();
        cfg.model.tokenizer = raptor_train::config::TokenizerSpec::File(tok.clone());
        let first = run_key(&cfg).unwrap();
        assert_eq!(run_key(&cfg).unwrap(), first);
        assert!(first.starts_with("raptor-"), "{first}");
        // Another tokenizer under the same path (another length: another memo entry).
        std::fs::write(&tok, "{\"v\": 22}").unwrap();
        let second = run_key(&cfg).unwrap();
        assert_ne!(second, first);
        // Another model folder's weights, and another data file, move it too.
        let model = dir.path().join("model");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("model.safetensors"), [1u8; 8]).unwrap();
        cfg.model.path = Some(model.clone());
        let third = run_key(&cfg).unwrap();
        assert_ne!(third, second);
        std::fs::write(model.join("model.safetensors"), [2u8; 9]).unwrap();
        assert_ne!(run_key(&cfg).unwrap(), third);
        assert!(input_files(&cfg).contains(&data));
    }
}
