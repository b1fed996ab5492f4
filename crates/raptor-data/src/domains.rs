//! Multi-domain classification tasks built from labelled records: a domain for each record from
//! a keyword rule on its own text (or one fixed domain for a whole source), the same number of
//! records of every label in every domain, and a binary label whose meaning is flipped in chosen
//! domains — a task that cannot be solved without knowing the domain.
//!
//! A record's domain depends on that record's text alone ([`DomainRules::domain_of`]: exactly
//! one rule's keyword occurs in the lower-cased text; none or several give no domain), so the
//! rule can be applied to public and private records alike without one record's domain
//! depending on another. Balancing ([`balance_per_domain`]) takes an evenly strided subset of
//! each (domain, label) cell in file order and interleaves the cells, so any evenly strided
//! subset of the result is balanced too.
//!
//! ```
//! use raptor_data::domains::{DomainRecord, DomainRules, KeywordRule, balance_per_domain, flip_labels};
//!
//! let rules = DomainRules::new(vec![
//!     KeywordRule::new("airline", &["@united", "flight"]),
//!     KeywordRule::new("festival", &["coachella"]),
//! ])?;
//! assert_eq!(rules.domain_of("My FLIGHT was late"), Some(0));
//! assert_eq!(rules.domain_of("coachella flight deals"), None); // two rules match
//! let recs: Vec<DomainRecord> = [
//!     ("late flight", "negative", 0), ("great flight", "positive", 0), ("ok flight", "positive", 0),
//!     ("coachella rocks", "positive", 1), ("coachella sold out", "negative", 1),
//! ]
//! .iter()
//! .map(|&(t, l, d)| DomainRecord::new(t, l, d))
//! .collect();
//! let labels = ["negative".to_string(), "positive".to_string()];
//! let mut task = balance_per_domain(&recs, 2, &labels, 1)?;
//! assert_eq!(task.len(), 4);
//! flip_labels(&mut task, &[1], &labels)?;
//! assert_eq!(task.iter().filter(|r| r.domain == 1 && r.label == "negative").count(), 1);
//! # Ok::<(), raptor_data::DataError>(())
//! ```

use std::path::Path;

use crate::DataError;

/// One domain's keywords: a record belongs to the domain when one of them occurs in its
/// lower-cased text (a plain substring match).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeywordRule {
    /// The domain's name.
    pub domain: String,
    /// Lower-case keywords (substrings).
    pub keywords: Vec<String>,
}

impl KeywordRule {
    /// A rule for `domain` with `keywords` (lower-cased here).
    pub fn new(domain: &str, keywords: &[&str]) -> Self {
        Self {
            domain: domain.to_string(),
            keywords: keywords.iter().map(|k| k.to_lowercase()).collect(),
        }
    }
}

/// Keyword rules of several domains, in domain-index order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRules {
    rules: Vec<KeywordRule>,
}

impl DomainRules {
    /// Checks the rules: at least one, distinct non-empty domain names, every rule with at
    /// least one non-empty keyword.
    ///
    /// # Errors
    /// [`DataError::InvalidDomains`] naming the offending rule.
    pub fn new(rules: Vec<KeywordRule>) -> Result<Self, DataError> {
        if rules.is_empty() {
            return Err(DataError::InvalidDomains("no domain rule".into()));
        }
        for (i, r) in rules.iter().enumerate() {
            if r.domain.trim().is_empty() {
                return Err(DataError::InvalidDomains(format!("rule {i} has no name")));
            }
            if rules[..i].iter().any(|o| o.domain == r.domain) {
                return Err(DataError::InvalidDomains(format!(
                    "domain `{}` is named twice",
                    r.domain
                )));
            }
            if r.keywords.is_empty() || r.keywords.iter().any(|k| k.is_empty()) {
                return Err(DataError::InvalidDomains(format!(
                    "domain `{}` needs non-empty keywords",
                    r.domain
                )));
            }
        }
        Ok(Self { rules })
    }

    /// The domain names, in index order.
    pub fn names(&self) -> Vec<String> {
        self.rules.iter().map(|r| r.domain.clone()).collect()
    }

    /// Number of domains.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether there is no rule (never, once built).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The index of the one domain whose keyword occurs in the lower-cased `text`; None when no
    /// rule or more than one rule matches.
    pub fn domain_of(&self, text: &str) -> Option<usize> {
        let t = text.to_lowercase();
        let mut hit = None;
        for (i, r) in self.rules.iter().enumerate() {
            if r.keywords.iter().any(|k| t.contains(k.as_str())) {
                if hit.is_some() {
                    return None;
                }
                hit = Some(i);
            }
        }
        hit
    }
}

/// A labelled record with its domain index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRecord {
    /// The text.
    pub text: String,
    /// The label.
    pub label: String,
    /// The domain index.
    pub domain: usize,
}

impl DomainRecord {
    /// A record.
    pub fn new(text: &str, label: &str, domain: usize) -> Self {
        Self {
            text: text.to_string(),
            label: label.to_string(),
            domain,
        }
    }
}

/// Records per (domain, label) cell, domains by rows, labels in the order of `labels` (records
/// with another label or a domain ≥ `domains` are not counted).
pub fn cell_counts(records: &[DomainRecord], domains: usize, labels: &[String]) -> Vec<Vec<usize>> {
    let mut c = vec![vec![0usize; labels.len()]; domains];
    for r in records {
        if let (Some(row), Some(j)) = (
            c.get_mut(r.domain),
            labels.iter().position(|l| *l == r.label),
        ) {
            row[j] += 1;
        }
    }
    c
}

/// The same number, `per_cell`, of records of every label in every domain: each (domain,
/// label) cell's records in input order, an evenly strided subset of `per_cell` of them; the
/// cells are interleaved (one record of each cell in turn, domains outer, labels inner), so an
/// evenly strided subset of the result stays about balanced. Records with another label or a
/// domain ≥ `domains` are dropped.
///
/// # Errors
/// No domain or label, `per_cell` = 0, or a cell with fewer than `per_cell` records
/// ([`DataError::InvalidDomains`], naming the cell and its count).
pub fn balance_per_domain(
    records: &[DomainRecord],
    domains: usize,
    labels: &[String],
    per_cell: usize,
) -> Result<Vec<DomainRecord>, DataError> {
    if domains == 0 || labels.is_empty() || per_cell == 0 {
        return Err(DataError::InvalidDomains(format!(
            "balancing needs at least one domain ({domains}), one label ({}) and a positive count per cell ({per_cell})",
            labels.len()
        )));
    }
    let mut cells: Vec<Vec<&DomainRecord>> = vec![Vec::new(); domains * labels.len()];
    for r in records {
        if r.domain < domains
            && let Some(j) = labels.iter().position(|l| *l == r.label)
        {
            cells[r.domain * labels.len() + j].push(r);
        }
    }
    let mut picked: Vec<Vec<&DomainRecord>> = Vec::with_capacity(cells.len());
    for (c, v) in cells.iter().enumerate() {
        if v.len() < per_cell {
            return Err(DataError::InvalidDomains(format!(
                "domain {} has {} records labelled `{}`, fewer than the {per_cell} asked for",
                c / labels.len(),
                v.len(),
                labels[c % labels.len()]
            )));
        }
        picked.push((0..per_cell).map(|i| v[i * v.len() / per_cell]).collect());
    }
    let mut out = Vec::with_capacity(per_cell * picked.len());
    for i in 0..per_cell {
        for cell in &picked {
            out.push(cell[i].clone());
        }
    }
    Ok(out)
}

/// Flips a binary label (`labels[0]` ↔ `labels[1]`) in every record whose domain is in
/// `flipped`.
///
/// # Errors
/// `labels` does not hold exactly two distinct labels, or a record of a flipped domain has
/// another label ([`DataError::InvalidDomains`]).
pub fn flip_labels(
    records: &mut [DomainRecord],
    flipped: &[usize],
    labels: &[String],
) -> Result<(), DataError> {
    let [a, b] = labels else {
        return Err(DataError::InvalidDomains(format!(
            "flipping needs exactly two labels, got {}",
            labels.len()
        )));
    };
    if a == b {
        return Err(DataError::InvalidDomains(format!(
            "flipping needs two distinct labels, got `{a}` twice"
        )));
    }
    for r in records.iter_mut().filter(|r| flipped.contains(&r.domain)) {
        r.label = if r.label == *a {
            b.clone()
        } else if r.label == *b {
            a.clone()
        } else {
            return Err(DataError::InvalidDomains(format!(
                "a record of flipped domain {} is labelled `{}`, not `{a}` or `{b}`",
                r.domain, r.label
            )));
        };
    }
    Ok(())
}

/// Writes `records` as a TSV table with the columns `text`, `label` and `domain` (the domain's
/// name from `names`); tabs and line breaks in a text become spaces. Written through a
/// temporary file renamed into place.
///
/// # Errors
/// A record whose domain has no name, or an I/O failure.
pub fn write_domain_tsv(
    path: &Path,
    records: &[DomainRecord],
    names: &[String],
) -> Result<(), DataError> {
    let clean = |t: &str| t.replace(['\t', '\n', '\r'], " ");
    let mut text = String::from("text\tlabel\tdomain\n");
    for r in records {
        let name = names.get(r.domain).ok_or_else(|| {
            DataError::InvalidDomains(format!(
                "domain {} has no name ({} names)",
                r.domain,
                names.len()
            ))
        })?;
        text.push_str(&clean(&r.text));
        text.push('\t');
        text.push_str(&clean(&r.label));
        text.push('\t');
        text.push_str(&clean(name));
        text.push('\n');
    }
    let tmp = path.with_extension("tsv.tmp");
    std::fs::write(&tmp, text.as_bytes()).map_err(|e| DataError::io(&tmp, &e))?;
    std::fs::rename(&tmp, path).map_err(|e| DataError::io(path, &e))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn labels() -> Vec<String> {
        vec!["negative".into(), "positive".into()]
    }

    #[test]
    fn a_domain_needs_exactly_one_matching_rule() {
        let r = DomainRules::new(vec![
            KeywordRule::new("air", &["Flight", "@united"]),
            KeywordRule::new("music", &["coachella"]),
        ])
        .unwrap();
        assert_eq!(r.names(), vec!["air".to_string(), "music".to_string()]);
        assert_eq!(r.domain_of("@United lost my bag"), Some(0));
        assert_eq!(r.domain_of("#Coachella2015 lineup"), Some(1));
        assert_eq!(r.domain_of("a flight to coachella"), None);
        assert_eq!(r.domain_of("nothing here"), None);
    }

    #[test]
    fn bad_rules_are_errors() {
        assert!(DomainRules::new(vec![]).is_err());
        assert!(DomainRules::new(vec![KeywordRule::new("a", &[])]).is_err());
        assert!(DomainRules::new(vec![KeywordRule::new("a", &[""])]).is_err());
        assert!(DomainRules::new(vec![KeywordRule::new(" ", &["x"])]).is_err());
        let e = DomainRules::new(vec![
            KeywordRule::new("a", &["x"]),
            KeywordRule::new("a", &["y"]),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("named twice"), "{e}");
    }

    #[test]
    fn balancing_strides_each_cell_and_interleaves() {
        let mut recs = Vec::new();
        for i in 0..10 {
            recs.push(DomainRecord::new(&format!("n{i}"), "negative", 0));
        }
        for i in 0..4 {
            recs.push(DomainRecord::new(&format!("p{i}"), "positive", 0));
        }
        recs.push(DomainRecord::new("other", "neutral", 0));
        recs.push(DomainRecord::new("far", "positive", 5));
        let out = balance_per_domain(&recs, 1, &labels(), 2).unwrap();
        let texts: Vec<&str> = out.iter().map(|r| r.text.as_str()).collect();
        // Negatives 0 and 5 of 10, positives 0 and 2 of 4; one of each cell in turn.
        assert_eq!(texts, vec!["n0", "p0", "n5", "p2"]);
        let e = balance_per_domain(&recs, 1, &labels(), 5).unwrap_err();
        assert!(
            e.to_string().contains("4 records labelled `positive`"),
            "{e}"
        );
        assert!(balance_per_domain(&recs, 1, &labels(), 0).is_err());
        assert!(balance_per_domain(&recs, 0, &labels(), 1).is_err());
    }

    #[test]
    fn flipping_swaps_the_two_labels_in_flipped_domains_only() {
        let mut recs = vec![
            DomainRecord::new("a", "negative", 0),
            DomainRecord::new("b", "positive", 1),
            DomainRecord::new("c", "negative", 1),
        ];
        flip_labels(&mut recs, &[1], &labels()).unwrap();
        let got: Vec<&str> = recs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(got, vec!["negative", "negative", "positive"]);
        let mut odd = vec![DomainRecord::new("x", "neutral", 1)];
        assert!(flip_labels(&mut odd, &[1], &labels()).is_err());
        assert!(flip_labels(&mut recs, &[1], &labels()[..1]).is_err());
        let same = vec!["a".to_string(), "a".to_string()];
        assert!(flip_labels(&mut recs, &[1], &same).is_err());
    }

    #[test]
    fn a_written_task_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("task.tsv");
        let recs = vec![
            DomainRecord::new("late\tflight", "negative", 0),
            DomainRecord::new("great\nshow", "positive", 1),
        ];
        let names = vec!["air".to_string(), "music".to_string()];
        write_domain_tsv(&path, &recs, &names).unwrap();
        let ds = crate::read_table(&path, &crate::TableSpec::new("text", Some("label"))).unwrap();
        assert_eq!(ds.records.len(), 2);
        assert_eq!(ds.records[0].text, "late flight");
        assert_eq!(ds.records[1].label.as_deref(), Some("positive"));
        let dom = crate::read_table(&path, &crate::TableSpec::new("domain", None)).unwrap();
        assert_eq!(dom.records[1].text, "music");
        assert!(write_domain_tsv(&path, &[DomainRecord::new("x", "y", 2)], &names).is_err());
    }

    proptest! {
        /// Whatever the input, a balanced task has exactly `per_cell` records in every cell,
        /// every one of them taken from the input.
        #[test]
        fn balanced_cells_are_equal(
            raw in prop::collection::vec((0usize..3, 0usize..3), 0..80),
            per_cell in 1usize..6,
        ) {
            let names = ["negative", "positive", "neutral"];
            let recs: Vec<DomainRecord> = raw
                .iter()
                .enumerate()
                .map(|(i, &(d, l))| DomainRecord::new(&format!("t{i}"), names[l], d))
                .collect();
            let counts = cell_counts(&recs, 2, &labels());
            let fewest = counts.iter().flatten().copied().min().unwrap_or(0);
            match balance_per_domain(&recs, 2, &labels(), per_cell) {
                Ok(out) => {
                    prop_assert!(fewest >= per_cell);
                    let c = cell_counts(&out, 2, &labels());
                    prop_assert!(c.iter().flatten().all(|&n| n == per_cell));
                    prop_assert_eq!(out.len(), 4 * per_cell);
                    prop_assert!(out.iter().all(|r| recs.contains(r)));
                }
                Err(_) => prop_assert!(fewest < per_cell),
            }
        }
    }
}
