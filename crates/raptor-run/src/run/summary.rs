//! One file per run for scripts and tables: [`Summary`] (`summary.json`, what may be published;
//! `private/summary.json`, what was computed from private records without noise), written by
//! `raptor train` and by the experiment driver's workers alike.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The summary file of a run folder (publishable part).
pub const SUMMARY_FILE: &str = "summary.json";

/// The fields of a [`Summary`] that are always publishable: the method, the plan's public
/// quantities, the certified ε and its curve, timing and memory, RAPTOR's layer choice and the
/// public routing entropy. The validation fields ([`VALIDATION_FIELDS`]) are publishable only
/// when the validation records are public; every other field (present or added later) goes to
/// `private/summary.json`.
pub const PUBLIC_FIELDS: [&str; 11] = [
    "method",
    "validation_public",
    "epsilon",
    "updates",
    "seconds_per_update",
    "peak_rss_mib",
    "epsilon_curve",
    "layer",
    "public_entropy",
    "sigmas",
    "q",
];

/// The fields of a [`Summary`] measured on the validation records: in `summary.json` when
/// they are public (`data.validation_public` with a validation file), else in
/// `private/summary.json`.
pub const VALIDATION_FIELDS: [&str; 6] = [
    "accuracy",
    "loss",
    "bleu",
    "rouge_l",
    "eval_curve",
    "group_accuracy",
];

/// What tables, plots and scripts need from one finished run. Written by
/// [`Summary::write`] as two files, `summary.json` (the [`PUBLIC_FIELDS`], and the
/// [`VALIDATION_FIELDS`] when the validation records are public) and
/// `private/summary.json` (the rest: per-update losses of the private batches, RAPTOR's
/// diagnostics on held-out records, private validation metrics; under `notice`, the
/// warning every private file carries), and read back whole by [`Summary::read`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Summary {
    /// Method name.
    pub method: String,
    /// Whether the validation records are public (their metrics are then publishable).
    #[serde(default)]
    pub validation_public: bool,
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
    /// Wall seconds per update (training loop, periodic evaluations excluded).
    pub seconds_per_update: f64,
    /// Peak resident memory of the process during the run (MiB; Linux), None elsewhere.
    pub peak_rss_mib: Option<f64>,
    /// Training loss per update (of the private batches: private).
    #[serde(default)]
    pub loss_curve: Vec<(u64, f64)>,
    /// Validation (update, loss, accuracy) every `eval_every` updates and at the end.
    #[serde(default)]
    pub eval_curve: Vec<(u64, f64, Option<f64>)>,
    /// Certified ε spent after an update.
    #[serde(default)]
    pub epsilon_curve: Vec<(u64, f64)>,
    /// RAPTOR's trained sparse layer.
    pub layer: Option<usize>,
    /// Public routing entropy per sparse layer (layer, normalized entropy).
    #[serde(default)]
    pub public_entropy: Vec<(usize, f64)>,
    /// Per-expert SNR (diagnostics); None where undefined (an expert no held-out record uses).
    #[serde(default)]
    pub snr: Vec<Option<f64>>,
    /// SNR coefficient of variation.
    #[serde(default)]
    pub snr_cv: Option<f64>,
    /// Role mismatch M_role.
    #[serde(default)]
    pub role_mismatch: Option<f64>,
    /// The shared stream's SNR (signal / noise norm) in the diagnostics.
    #[serde(default)]
    pub shared_snr: Option<f64>,
    /// Fraction of owned rows whose global clip factor suppresses the expert gradient.
    #[serde(default)]
    pub clip_suppressed: Option<f64>,
    /// Least-loaded expert's expected owned records per batch / D_e.
    #[serde(default)]
    pub dilution: Option<f64>,
    /// Held-out records the diagnostics read.
    #[serde(default)]
    pub diagnostic_records: Option<usize>,
    /// The noise multiplier of every stream of the run's plan (empty for a non-private run).
    #[serde(default)]
    pub sigmas: Vec<(String, f64)>,
    /// Sampling rate q = B/N of the run.
    #[serde(default)]
    pub q: Option<f64>,
    /// Validation accuracy per group of validation records (a domain, a subset), when the caller
    /// scored the run on groups (the experiment driver does; empty otherwise).
    #[serde(default)]
    pub group_accuracy: Vec<(String, f64)>,
}

impl Summary {
    /// Extracts the summary of a finished run (`peak_rss_mib`: the process's peak memory,
    /// e.g. [`peak_rss_mib`], where the caller measured it).
    pub fn from_record(r: &Record, peak_rss_mib: Option<f64>) -> Self {
        let mut eval_curve: Vec<(u64, f64, Option<f64>)> = r
            .eval_curve()
            .iter()
            .map(|(u, m)| (*u, m.loss, m.accuracy))
            .collect();
        if let Some(m) = r.eval() {
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
        let diag = r.private.diagnostics.as_ref();
        Self {
            method: r.method.clone(),
            validation_public: r.validation.as_ref().is_some_and(|v| v.public),
            accuracy: r.eval().and_then(|e| e.accuracy),
            loss: r.eval().map(|e| e.loss).filter(|l| l.is_finite()),
            bleu: r.generation().map(|g| g.bleu),
            rouge_l: r.generation().map(|g| g.rouge_l),
            epsilon: r.epsilon.as_ref().map(|e| e.upper),
            updates: r.updates,
            seconds_per_update: if r.updates > 0 {
                (r.wall_seconds - r.eval_seconds).max(0.0) / r.updates as f64
            } else {
                0.0
            },
            peak_rss_mib,
            loss_curve: r
                .private
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
            snr: diag
                .map(|d| d.snr.iter().map(|&x| x.is_finite().then_some(x)).collect())
                .unwrap_or_default(),
            snr_cv: diag.map(|d| d.snr_cv).filter(|x| x.is_finite()),
            role_mismatch: diag.map(|d| d.role_mismatch).filter(|x| x.is_finite()),
            shared_snr: diag.map(|d| d.shared.snr).filter(|x| x.is_finite()),
            clip_suppressed: diag
                .map(|d| d.clip_suppressed_fraction)
                .filter(|x| x.is_finite()),
            dilution: diag.map(|d| d.dilution).filter(|x| x.is_finite()),
            diagnostic_records: diag.map(|d| d.records),
            sigmas: if r.privacy_plan.private {
                r.privacy_plan
                    .sigmas
                    .iter()
                    .map(|(st, x)| (st.name().to_string(), x))
                    .collect()
            } else {
                Vec::new()
            },
            q: Some(r.privacy_plan.q),
            group_accuracy: Vec::new(),
        }
    }

    /// The two files' contents: (publishable, private). See [`PUBLIC_FIELDS`] and
    /// [`VALIDATION_FIELDS`].
    ///
    /// # Errors
    /// A summary that does not serialize (never for one [`Summary::from_record`] made).
    pub fn split(&self) -> Result<(serde_json::Value, serde_json::Value)> {
        let serde_json::Value::Object(all) = serde_json::to_value(self)? else {
            return Err(RunError::Run("a summary serializes to an object".into()));
        };
        let mut public = serde_json::Map::new();
        let mut private = serde_json::Map::new();
        private.insert("notice".into(), PRIVATE_NOTICE.into());
        for (k, v) in all {
            let publishable = PUBLIC_FIELDS.contains(&k.as_str())
                || (self.validation_public && VALIDATION_FIELDS.contains(&k.as_str()));
            if publishable {
                public.insert(k, v);
            } else {
                private.insert(k, v);
            }
        }
        Ok((public.into(), private.into()))
    }

    /// Writes `summary.json` and `private/summary.json` into the run folder `dir` (atomically,
    /// each).
    ///
    /// # Errors
    /// An I/O failure.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let (public, private) = self.split()?;
        let pdir = dir.join("private");
        std::fs::create_dir_all(&pdir).map_err(io(&pdir))?;
        write_atomic(
            &pdir.join(SUMMARY_FILE),
            &serde_json::to_vec_pretty(&private)?,
        )?;
        write_atomic(
            &dir.join(SUMMARY_FILE),
            &serde_json::to_vec_pretty(&public)?,
        )
    }

    /// Reads the summary of run folder `dir` whole: `summary.json` and, when present,
    /// `private/summary.json` (a summary written before the split holds every field in
    /// `summary.json`).
    ///
    /// # Errors
    /// A missing or malformed `summary.json`, or a malformed private part.
    pub fn read(dir: &Path) -> Result<Self> {
        let read = |p: &Path| -> Result<serde_json::Map<String, serde_json::Value>> {
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).map_err(io(p))?)
                .map_err(|e| RunError::Run(format!("{} is not a summary: {e}", p.display())))?;
            match v {
                serde_json::Value::Object(m) => Ok(m),
                _ => Err(RunError::Run(format!(
                    "{} is not a JSON object",
                    p.display()
                ))),
            }
        };
        let mut all = read(&dir.join(SUMMARY_FILE))?;
        let private = dir.join("private").join(SUMMARY_FILE);
        if private.is_file() {
            for (k, v) in read(&private)? {
                if k != "notice" {
                    all.insert(k, v);
                }
            }
        }
        serde_json::from_value(all.into())
            .map_err(|e| RunError::Run(format!("{}: not a summary: {e}", dir.display())))
    }
}

/// Resets the peak-RSS counter of this process (Linux: `/proc/self/clear_refs`); false where
/// that is not possible.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak RSS (`VmHWM`) of this process in MiB (Linux; None elsewhere).
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn full(validation_public: bool) -> Summary {
        Summary {
            method: "raptor".into(),
            validation_public,
            accuracy: Some(0.75),
            loss: Some(0.5),
            bleu: Some(12.0),
            rouge_l: Some(30.0),
            epsilon: Some(7.99),
            updates: 48,
            seconds_per_update: 1.5,
            peak_rss_mib: Some(1800.0),
            loss_curve: vec![(1, 0.69), (2, 0.6)],
            eval_curve: vec![(48, 0.5, Some(0.75))],
            epsilon_curve: vec![(10, 4.1), (48, 7.99)],
            layer: Some(3),
            public_entropy: vec![(3, 0.97)],
            snr: vec![Some(1.0), None],
            snr_cv: Some(0.2),
            role_mismatch: Some(0.1),
            shared_snr: Some(2.0),
            clip_suppressed: Some(0.05),
            dilution: Some(0.8),
            diagnostic_records: Some(400),
            sigmas: vec![("shared".into(), 0.9)],
            q: Some(0.125),
            group_accuracy: vec![("flipped".into(), 0.7)],
        }
    }

    fn keys(v: &serde_json::Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    /// The publishable file holds exactly the public fields (and the validation fields only
    /// for public validation records); the private file the rest with the notice; reading both
    /// gives the summary back. Every field of the type lands in one of the two.
    #[test]
    fn summary_splits_into_a_public_and_a_private_file_and_reads_back_whole() {
        for public_validation in [false, true] {
            let s = full(public_validation);
            let d = tempfile::tempdir().unwrap();
            s.write(d.path()).unwrap();
            let pubv: serde_json::Value =
                serde_json::from_slice(&std::fs::read(d.path().join(SUMMARY_FILE)).unwrap())
                    .unwrap();
            let privv: serde_json::Value = serde_json::from_slice(
                &std::fs::read(d.path().join("private").join(SUMMARY_FILE)).unwrap(),
            )
            .unwrap();
            let mut want: Vec<String> = PUBLIC_FIELDS.iter().map(|s| s.to_string()).collect();
            if public_validation {
                want.extend(VALIDATION_FIELDS.iter().map(|s| s.to_string()));
            }
            want.sort();
            assert_eq!(keys(&pubv), want);
            for k in ["loss_curve", "snr", "role_mismatch", "diagnostic_records"] {
                assert!(pubv.get(k).is_none() && privv.get(k).is_some(), "{k}");
            }
            assert_eq!(privv["notice"], PRIVATE_NOTICE);
            for k in VALIDATION_FIELDS {
                assert_eq!(privv.get(k).is_some(), !public_validation, "{k}");
            }
            let all = serde_json::to_value(&s).unwrap();
            assert_eq!(
                keys(&pubv).len() + keys(&privv).len() - 1,
                keys(&all).len(),
                "every field is in exactly one file"
            );
            assert_eq!(Summary::read(d.path()).unwrap(), s);
        }
    }

    /// A summary written before the split (every field in `summary.json`) still reads.
    #[test]
    fn an_unsplit_summary_reads() {
        let s = full(false);
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(SUMMARY_FILE), serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(Summary::read(d.path()).unwrap(), s);
        std::fs::write(d.path().join(SUMMARY_FILE), b"[1]").unwrap();
        assert!(Summary::read(d.path()).is_err());
    }
}
