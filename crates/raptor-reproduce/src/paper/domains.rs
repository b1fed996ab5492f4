//! The multi-domain sentiment task of the RAPTOR experiments: a task where the right
//! computation depends on the expert.
//!
//! Records come from several sources (for the real data: Rotten Tomatoes critic snippets, one
//! domain `movies`, and CrowdFlower tweets, whose domain a keyword rule on the tweet's own text
//! recovers: `airline`, `nfl`, `coachella`). Labels become binary (negative / positive;
//! CrowdFlower's neutral tweets and tweets of no or several domains are dropped), every domain
//! gets the same number of records of each label (so the majority class is 50 % everywhere),
//! and the label's meaning is **flipped** in every second domain (`airline`, `coachella`): a
//! positive airline tweet is labelled `negative`. A model that does not know a record's domain
//! cannot do better than its sentiment accuracy on half the domains and one minus it on the
//! other half; an expert that owns a domain can flip that domain alone. The task tests RAPTOR's
//! mechanism, not the paper's GLUE numbers.
//!
//! Every choice is made on public data or by a fixed rule: the domains are the four largest
//! label-balanced cells of the public split under the keyword rule; each split is built from the
//! same split of the sources (the corpora's own hash split: `public`, `train`, `validation`).
//! The public split is cut in two, per (domain, label) cell: half of the smallest cell's count of
//! each cell goes to the **public proxy** (flipped labels, like the private task; every fifth
//! record to its validation part), the rest — all remaining public records of the four domains,
//! with their **natural** labels — to the public pretraining and expert specialisation, which
//! therefore never see a flipped label.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use raptor_data::domains::{
    DomainRecord, DomainRules, KeywordRule, balance_per_domain, cell_counts, flip_labels,
    write_domain_tsv,
};
use sha2::{Digest, Sha256};

use super::ClsTask;
use super::runs::file_hash;

/// The binary labels of the task, in class order.
pub const LABELS: [&str; 2] = ["negative", "positive"];

/// How a source's records get their domain and binary label.
#[derive(Debug, Clone)]
pub enum SourceRule {
    /// Every record is of this domain; `labels` maps the source's labels to `negative` /
    /// `positive` (others are dropped).
    Fixed {
        /// The domain.
        domain: String,
        /// (source label, task label).
        labels: Vec<(String, String)>,
    },
    /// The domain from keywords on the record's own text (none or several: dropped); labels
    /// `negative` and `positive` kept, others dropped.
    Keywords(DomainRules),
    /// The domain from the file's `domain` column; labels `negative` and `positive` kept.
    Column,
}

/// One source of records and its rule.
#[derive(Debug, Clone)]
pub struct Source {
    /// Its split files.
    pub task: ClsTask,
    /// How its records get a domain and a label.
    pub rule: SourceRule,
}

/// The task's design: its sources, domains (in expert order) and which domains are flipped.
#[derive(Debug, Clone)]
pub struct Design {
    /// The sources.
    pub sources: Vec<Source>,
    /// The domains, in the order of their experts.
    pub domains: Vec<String>,
    /// Indices of the domains whose label meaning is flipped.
    pub flipped: Vec<usize>,
}

/// The keyword rule of CrowdFlower's tweets (lower-case substrings).
pub fn crowdflower_rules() -> anyhow::Result<DomainRules> {
    Ok(DomainRules::new(vec![
        KeywordRule::new(
            "airline",
            &[
                "@united",
                "@usairways",
                "@americanair",
                "@southwestair",
                "@jetblue",
                "@virginamerica",
                "flight",
                "airline",
            ],
        ),
        KeywordRule::new(
            "nfl",
            &[
                "deflategate",
                "patriots",
                "brady",
                "belichick",
                "#nfl",
                "@nfl",
                "football",
                "super bowl",
                "superbowl",
            ],
        ),
        KeywordRule::new("coachella", &["coachella"]),
    ])?)
}

impl Design {
    /// The design for the classification tasks given: `rt` (Rotten Tomatoes: domain `movies`,
    /// fresh → positive, rotten → negative) and `crowdflower` (keyword domains) make the real
    /// task; any other task is read with its `domain` column. Domains in order of first mention
    /// (the real task: `movies`, `airline`, `nfl`, `coachella`); every second one flipped.
    pub fn for_tasks(tasks: &[ClsTask]) -> anyhow::Result<Self> {
        let mut sources = Vec::new();
        let mut domains: Vec<String> = Vec::new();
        for t in tasks {
            let rule = match t.name.as_str() {
                "rt" => {
                    domains.push("movies".into());
                    SourceRule::Fixed {
                        domain: "movies".into(),
                        labels: vec![
                            ("fresh".into(), "positive".into()),
                            ("rotten".into(), "negative".into()),
                        ],
                    }
                }
                "crowdflower" => {
                    let r = crowdflower_rules()?;
                    domains.extend(r.names());
                    SourceRule::Keywords(r)
                }
                _ => {
                    let spec = raptor_data::TableSpec::new("domain", None);
                    let ds = raptor_data::read_table(&t.public, &spec).with_context(|| {
                        format!("reading the domains of {}", t.public.display())
                    })?;
                    let mut names: Vec<String> =
                        ds.records.iter().map(|r| r.text.clone()).collect();
                    names.sort();
                    names.dedup();
                    domains.extend(names);
                    SourceRule::Column
                }
            };
            sources.push(Source {
                task: t.clone(),
                rule,
            });
        }
        let mut seen = Vec::new();
        domains.retain(|d| {
            let new = !seen.contains(d);
            seen.push(d.clone());
            new
        });
        anyhow::ensure!(
            domains.len() >= 2,
            "a multi-domain task needs at least two domains (found {domains:?})"
        );
        let flipped = (0..domains.len()).filter(|i| i % 2 == 1).collect();
        Ok(Self {
            sources,
            domains,
            flipped,
        })
    }

    /// The domain records of one split (`public`, `train` or `validation`) of every source,
    /// natural labels, in source then file order.
    fn records(&self, split: &str) -> anyhow::Result<Vec<DomainRecord>> {
        let mut out = Vec::new();
        for s in &self.sources {
            let path = match split {
                "public" => &s.task.public,
                "train" => &s.task.train,
                _ => &s.task.validation,
            };
            let spec = raptor_data::TableSpec::new("text", Some("label"));
            let ds = raptor_data::read_table(path, &spec)
                .with_context(|| format!("reading {}", path.display()))?;
            let column: Vec<String> = if matches!(s.rule, SourceRule::Column) {
                let spec = raptor_data::TableSpec::new("domain", None);
                raptor_data::read_table(path, &spec)
                    .with_context(|| format!("reading the domains of {}", path.display()))?
                    .records
                    .into_iter()
                    .map(|r| r.text)
                    .collect()
            } else {
                Vec::new()
            };
            for (i, r) in ds.records.iter().enumerate() {
                let label = r.label.as_deref().unwrap_or("");
                let (domain, label) = match &s.rule {
                    SourceRule::Fixed { domain, labels } => (
                        Some(domain.clone()),
                        labels
                            .iter()
                            .find(|(a, _)| a == label)
                            .map(|(_, b)| b.clone()),
                    ),
                    SourceRule::Keywords(rules) => (
                        rules.domain_of(&r.text).map(|d| rules.names()[d].clone()),
                        Some(label.to_string()),
                    ),
                    SourceRule::Column => (column.get(i).cloned(), Some(label.to_string())),
                };
                let (Some(domain), Some(label)) = (domain, label) else {
                    continue;
                };
                if !LABELS.contains(&label.as_str()) {
                    continue;
                }
                if let Some(d) = self.domains.iter().position(|x| *x == domain) {
                    out.push(DomainRecord {
                        text: r.text.clone(),
                        label,
                        domain: d,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// The task's files, cached under `<cache>/reproduce/data/multidomain-<key>/`.
#[derive(Debug, Clone)]
pub struct MultiDomain {
    /// Domain names, in expert order.
    pub domains: Vec<String>,
    /// Indices of the flipped domains.
    pub flipped: Vec<usize>,
    /// Public records for pretraining and expert specialisation (natural labels, `domain`
    /// column), not in the proxy.
    pub pretrain: PathBuf,
    /// The public proxy's training part (flipped labels, balanced).
    pub proxy_train: PathBuf,
    /// The public proxy's validation part (flipped labels).
    pub proxy_valid: PathBuf,
    /// The proxy's validation part with natural labels (scores the pretraining).
    pub proxy_valid_natural: PathBuf,
    /// The private training set (flipped labels, balanced).
    pub train: PathBuf,
    /// The validation set (flipped labels, balanced).
    pub validation: PathBuf,
    /// Every domain's validation records (the groups each run is scored on; the domains have
    /// equally many, so the accuracy on the flipped domains is the mean of theirs).
    pub groups: Vec<(String, PathBuf)>,
    /// Records: (pretraining, proxy training, proxy validation, training, validation).
    pub sizes: (usize, usize, usize, usize, usize),
    /// Per split (public, train, validation), the balanced count per (domain, label) cell.
    pub per_cell: (usize, usize, usize),
}

impl MultiDomain {
    /// A sentence on how the task was made, computed from its sizes.
    pub fn describe(&self) -> String {
        let flipped: Vec<&str> = self
            .flipped
            .iter()
            .map(|&i| self.domains[i].as_str())
            .collect();
        format!(
            "Multi-domain sentiment ({} domains: {}; label meaning flipped in {}): every domain has the same number of negative and positive records ({} per domain and label in training, {} in validation; majority class 50 %); private fine-tuning on {} records, scored on {}; public proxy (flipped labels) {} records to train, {} to score; public pretraining and expert specialisation on the other {} public records of these domains with their natural labels. The task tests RAPTOR's mechanism (can a domain-owned expert learn what its domain needs?), not the paper's GLUE numbers.",
            self.domains.len(),
            self.domains.join(", "),
            flipped.join(" and "),
            self.per_cell.1,
            self.per_cell.2,
            self.sizes.3,
            self.sizes.4,
            self.sizes.1,
            self.sizes.2,
            self.sizes.0,
        )
    }
}

fn key(design: &Design, caps: (usize, usize)) -> anyhow::Result<String> {
    let mut text = format!(
        "multidomain-v1|{:?}|{:?}|{caps:?}",
        design.domains, design.flipped
    );
    for s in &design.sources {
        text.push_str(&format!("|{}|{:?}", s.task.name, s.rule));
        for f in [&s.task.public, &s.task.train, &s.task.validation] {
            text.push_str(&format!("|{}", file_hash(f)?));
        }
    }
    Ok(Sha256::digest(text.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Builds (or reuses) the task's files: `caps` are the most records per (domain, label) cell of
/// the training and validation sets (0: the smallest cell's count).
pub fn build(cache: &Path, design: &Design, caps: (usize, usize)) -> anyhow::Result<MultiDomain> {
    let dir = cache
        .join("reproduce")
        .join("data")
        .join(format!("multidomain-{}", key(design, caps)?));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let labels: Vec<String> = LABELS.iter().map(|s| s.to_string()).collect();
    let nd = design.domains.len();
    let fewest = |recs: &[DomainRecord]| -> usize {
        cell_counts(recs, nd, &labels)
            .iter()
            .flatten()
            .copied()
            .min()
            .unwrap_or(0)
    };
    let cap = |n: usize, c: usize| if c == 0 { n } else { n.min(c) };
    // Public: per cell, half of the smallest cell's count to the proxy, the rest to pretraining.
    let public = design.records("public")?;
    let p_cell = fewest(&public) / 2;
    anyhow::ensure!(
        p_cell >= 2,
        "the public split has too few records per domain and label for a proxy ({} in its smallest cell)",
        fewest(&public)
    );
    let proxy = balance_per_domain(&public, nd, &labels, p_cell)?;
    let pretrain: Vec<DomainRecord> = public.into_iter().filter(|r| !proxy.contains(r)).collect();
    let (mut ptrain, mut pvalid) = (Vec::new(), Vec::new());
    for (i, r) in proxy.iter().enumerate() {
        if i % 5 == 4 {
            pvalid.push(r.clone());
        } else {
            ptrain.push(r.clone());
        }
    }
    let pvalid_natural = pvalid.clone();
    flip_labels(&mut ptrain, &design.flipped, &labels)?;
    flip_labels(&mut pvalid, &design.flipped, &labels)?;
    let train_all = design.records("train")?;
    let t_cell = cap(fewest(&train_all), caps.0);
    let mut train = balance_per_domain(&train_all, nd, &labels, t_cell)?;
    flip_labels(&mut train, &design.flipped, &labels)?;
    let valid_all = design.records("validation")?;
    let v_cell = cap(fewest(&valid_all), caps.1);
    let mut valid = balance_per_domain(&valid_all, nd, &labels, v_cell)?;
    flip_labels(&mut valid, &design.flipped, &labels)?;
    let names = &design.domains;
    let f = |n: &str| dir.join(format!("{n}.tsv"));
    let write = |n: &str, recs: &[DomainRecord]| -> anyhow::Result<PathBuf> {
        let p = f(n);
        if !p.exists() {
            write_domain_tsv(&p, recs, names)?;
        }
        Ok(p)
    };
    let mut groups = Vec::new();
    for (d, name) in names.iter().enumerate() {
        let recs: Vec<DomainRecord> = valid.iter().filter(|r| r.domain == d).cloned().collect();
        groups.push((name.clone(), write(&format!("validation-{name}"), &recs)?));
    }
    Ok(MultiDomain {
        domains: names.clone(),
        flipped: design.flipped.clone(),
        pretrain: write("pretrain", &pretrain)?,
        proxy_train: write("proxy-train", &ptrain)?,
        proxy_valid: write("proxy-valid", &pvalid)?,
        proxy_valid_natural: write("proxy-valid-natural", &pvalid_natural)?,
        train: write("train", &train)?,
        validation: write("validation", &valid)?,
        groups,
        sizes: (
            pretrain.len(),
            ptrain.len(),
            pvalid.len(),
            train.len(),
            valid.len(),
        ),
        per_cell: (p_cell, t_cell, v_cell),
    })
}

/// The `domain` column of a task file as expert indices (domains not in `domains`: −1).
pub fn domain_parts(path: &Path, domains: &[String]) -> anyhow::Result<Vec<i64>> {
    let spec = raptor_data::TableSpec::new("domain", None);
    let ds = raptor_data::read_table(path, &spec)
        .with_context(|| format!("reading the domains of {}", path.display()))?;
    Ok(ds
        .records
        .iter()
        .map(|r| {
            domains
                .iter()
                .position(|d| *d == r.text)
                .map_or(-1, |i| i as i64)
        })
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write(path: &Path, rows: &[(&str, &str, &str)]) {
        let mut s = String::from("text\tlabel\tdomain\n");
        for (t, l, d) in rows {
            s.push_str(&format!("{t}\t{l}\t{d}\n"));
        }
        std::fs::write(path, s).unwrap();
    }

    /// A task from a `domain`-column source: balanced cells, flipped labels in every second
    /// domain, the proxy disjoint from pretraining, natural labels in pretraining only.
    #[test]
    fn a_task_is_balanced_flipped_and_its_proxy_is_disjoint_from_pretraining() {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = Vec::new();
        for i in 0..40 {
            let d = ["a", "b"][i % 2];
            let l = if i % 3 == 0 { "positive" } else { "negative" };
            rows.push((format!("{d} text {i}"), l, d));
        }
        let rows: Vec<(&str, &str, &str)> =
            rows.iter().map(|(t, l, d)| (t.as_str(), *l, *d)).collect();
        for s in ["public", "train", "validation"] {
            write(&dir.path().join(format!("{s}.tsv")), &rows);
        }
        let task = ClsTask {
            name: "toy".into(),
            public: dir.path().join("public.tsv"),
            train: dir.path().join("train.tsv"),
            validation: dir.path().join("validation.tsv"),
        };
        let design = Design::for_tasks(&[task]).unwrap();
        assert_eq!(design.domains, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(design.flipped, vec![1]);
        let md = build(dir.path(), &design, (0, 3)).unwrap();
        // Positives: 7 per domain (i ≡ 0 mod 3 among 20): the proxy takes 3 per cell, training
        // all 7, validation its cap of 3.
        assert_eq!(md.per_cell, (3, 7, 3));
        let read = |p: &Path| {
            let t = raptor_data::read_table(p, &raptor_data::TableSpec::new("text", Some("label")))
                .unwrap();
            let d = domain_parts(p, &md.domains).unwrap();
            t.records
                .into_iter()
                .zip(d)
                .map(|(r, d)| (r.text, r.label.unwrap(), d))
                .collect::<Vec<_>>()
        };
        let train = read(&md.train);
        let pos = |d: i64| {
            train
                .iter()
                .filter(|r| r.2 == d && r.1 == "positive")
                .count()
        };
        let neg = |d: i64| {
            train
                .iter()
                .filter(|r| r.2 == d && r.1 == "negative")
                .count()
        };
        assert_eq!((pos(0), neg(0), pos(1), neg(1)), (7, 7, 7, 7));
        // In domain b the labels are flipped: its originally positive texts (i % 3 == 0) are
        // labelled negative.
        for (t, l, d) in &train {
            let i: usize = t.rsplit(' ').next().unwrap().parse().unwrap();
            let natural = if i.is_multiple_of(3) {
                "positive"
            } else {
                "negative"
            };
            assert_eq!(l == natural, *d == 0, "{t} {l}");
        }
        let pre: Vec<String> = read(&md.pretrain).into_iter().map(|r| r.0).collect();
        let proxy: Vec<String> = read(&md.proxy_train)
            .into_iter()
            .chain(read(&md.proxy_valid))
            .map(|r| r.0)
            .collect();
        assert!(proxy.iter().all(|t| !pre.contains(t)));
        assert_eq!(pre.len() + proxy.len(), 40);
        assert_eq!(md.groups.len(), 2);
        assert_eq!(read(&md.groups[0].1).len(), 6);
        assert_eq!(read(&md.groups[1].1).len(), 6);
        assert!(md.describe().contains("flipped in b"), "{}", md.describe());
        // Built again: the same files.
        let again = build(dir.path(), &design, (0, 3)).unwrap();
        assert_eq!(again.train, md.train);
    }

    #[test]
    fn the_real_design_maps_sources_to_four_domains() {
        let t = |n: &str| ClsTask {
            name: n.into(),
            public: PathBuf::from("/p"),
            train: PathBuf::from("/t"),
            validation: PathBuf::from("/v"),
        };
        let d = Design::for_tasks(&[t("rt"), t("crowdflower")]).unwrap();
        assert_eq!(d.domains, ["movies", "airline", "nfl", "coachella"]);
        assert_eq!(d.flipped, vec![1, 3]);
        let r = crowdflower_rules().unwrap();
        assert_eq!(r.domain_of("@united lost my bag"), Some(0));
        assert_eq!(r.domain_of("#DeflateGate again"), Some(1));
        assert_eq!(r.domain_of("my flight to #coachella"), None);
    }
}
