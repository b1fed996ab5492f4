//! Data-to-text corpora: E2E-style CSV, DART JSON and DART/WebNLG-style XML.
//!
//! Every reader returns a [`D2tDataset`] of [`D2tRecord`]s, one per (source, reference) pair,
//! with 0-based ids in file order (for E2E: the data row index; for DART: entries in file order,
//! each entry's references in file order). Training uses one record per pair (the prompt is
//! `source`, the loss is on `target`); evaluation uses [`D2tDataset::group_by_source`], which
//! gives each distinct source once with all its references.
//!
//! **Triple linearization (DART, one fixed way).** A tripleset becomes
//! `subject : predicate : object | subject : predicate : object | ...`: the triples in their
//! order in the file, each as its three parts (leading and trailing whitespace trimmed) joined
//! by `" : "`, the triples joined by `" | "`. Nothing else is changed (no lower-casing, no
//! rewriting of `[TABLECONTEXT]` or `[TITLE]` markers, no removal of underscores). See
//! [`linearize`].
//!
//! E2E sources are the `mr` column exactly as written (e.g.
//! `name[Alimentum], area[city centre], familyFriendly[no]`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::DataError;

/// The largest data-to-text file read (1 GiB): a guard against unbounded inputs.
pub const MAX_D2T_BYTES: u64 = 1 << 30;

/// One (source, reference) pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct D2tRecord {
    /// 0-based id in file order (see the module docs).
    pub id: usize,
    /// The source: an E2E meaning representation or a linearized DART tripleset.
    pub source: String,
    /// The reference text.
    pub target: String,
}

/// A source with all its references, for evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceGroup {
    /// The source.
    pub source: String,
    /// The references, in record order.
    pub references: Vec<String>,
    /// The ids of the records the references came from.
    pub ids: Vec<usize>,
}

/// The records of one data-to-text file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct D2tDataset {
    /// The file.
    pub path: PathBuf,
    /// The (source, reference) records, ids increasing.
    pub records: Vec<D2tRecord>,
    /// Empty references skipped (DART only: an empty annotation text or `<lex/>`; the real
    /// DART v1.1.1 test XML has one). They get no id.
    pub skipped_empty: usize,
}

impl D2tDataset {
    /// Number of (source, reference) records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether there are no records (never true for a dataset returned by the readers).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Each distinct source once, in order of first appearance, with all its references.
    /// Records with the same source text are grouped even when they are not adjacent.
    ///
    /// ```
    /// use raptor_data::{read_e2e_from, D2tDataset};
    /// let csv = "mr,ref\n\"name[A], food[Thai]\",A serves Thai.\nname[B],B.\n\"name[A], food[Thai]\",Thai at A.\n";
    /// let ds = read_e2e_from(csv.as_bytes(), "inline.csv".as_ref())?;
    /// let groups = ds.group_by_source();
    /// assert_eq!(groups.len(), 2);
    /// assert_eq!(groups[0].references, ["A serves Thai.", "Thai at A."]);
    /// assert_eq!(groups[0].ids, [0, 2]);
    /// # Ok::<(), raptor_data::DataError>(())
    /// ```
    pub fn group_by_source(&self) -> Vec<SourceGroup> {
        let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let mut groups: Vec<SourceGroup> = Vec::new();
        for r in &self.records {
            let g = *index.entry(r.source.as_str()).or_insert_with(|| {
                groups.push(SourceGroup {
                    source: r.source.clone(),
                    references: Vec::new(),
                    ids: Vec::new(),
                });
                groups.len() - 1
            });
            if let Some(group) = groups.get_mut(g) {
                group.references.push(r.target.clone());
                group.ids.push(r.id);
            }
        }
        groups
    }

    /// Number of distinct sources.
    pub fn num_sources(&self) -> usize {
        let mut s: Vec<&str> = self.records.iter().map(|r| r.source.as_str()).collect();
        s.sort_unstable();
        s.dedup();
        s.len()
    }
}

/// A (subject, predicate, object) triple.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Triple {
    /// Subject.
    pub subject: String,
    /// Predicate (relation).
    pub predicate: String,
    /// Object.
    pub object: String,
}

/// Linearize triples in the crate's one fixed way (see the module docs).
///
/// ```
/// use raptor_data::{linearize, Triple};
/// let t = |s: &str, p: &str, o: &str| Triple { subject: s.into(), predicate: p.into(), object: o.into() };
/// assert_eq!(
///     linearize(&[t("Mars Hill College", "JOINED", "1973"), t(" Mars Hill College", "LOCATION", "Mars Hill, NC ")]),
///     "Mars Hill College : JOINED : 1973 | Mars Hill College : LOCATION : Mars Hill, NC"
/// );
/// ```
pub fn linearize(triples: &[Triple]) -> String {
    triples
        .iter()
        .map(|t| {
            format!(
                "{} : {} : {}",
                t.subject.trim(),
                t.predicate.trim(),
                t.object.trim()
            )
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn open_bounded(path: &Path) -> Result<std::fs::File, DataError> {
    let file = std::fs::File::open(path).map_err(|e| DataError::io(path, &e))?;
    let len = file.metadata().map_err(|e| DataError::io(path, &e))?.len();
    if len > MAX_D2T_BYTES {
        return Err(DataError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_D2T_BYTES,
        });
    }
    Ok(file)
}

fn read_bounded_string(path: &Path) -> Result<String, DataError> {
    use std::io::Read;
    let mut s = String::new();
    open_bounded(path)?
        .take(MAX_D2T_BYTES)
        .read_to_string(&mut s)
        .map_err(|e| DataError::io(path, &e))?;
    Ok(s)
}

/// Read an E2E-style CSV (header with at least `mr` and `ref`; other columns are ignored).
///
/// An empty `mr` or `ref` is an error naming the line.
pub fn read_e2e(path: &Path) -> Result<D2tDataset, DataError> {
    read_e2e_from(std::io::BufReader::new(open_bounded(path)?), path)
}

/// [`read_e2e`] from any reader; `name` is used in error messages.
pub fn read_e2e_from<R: std::io::Read>(reader: R, name: &Path) -> Result<D2tDataset, DataError> {
    let spec = crate::TableSpec::new("mr", None)
        .with_text_pair("ref")
        .with_format(crate::Format::Csv);
    let ds = crate::read_table_from(reader, name, crate::Format::Csv, &spec)?;
    let records = ds
        .records
        .into_iter()
        .map(|r| D2tRecord {
            id: r.id,
            source: r.text,
            target: r.text_pair.unwrap_or_default(),
        })
        .collect();
    Ok(D2tDataset {
        path: name.to_path_buf(),
        records,
        skipped_empty: 0,
    })
}

#[derive(Deserialize)]
struct DartEntry {
    tripleset: Vec<Vec<String>>,
    annotations: Vec<DartAnnotation>,
}

#[derive(Deserialize)]
struct DartAnnotation {
    text: String,
}

/// Read DART JSON: a list of `{tripleset: [[s, p, o], ...], annotations: [{source, text}, ...],
/// ...}`; one record per annotation, the source the linearized tripleset.
///
/// A triple that is not exactly three strings, an empty tripleset, or an entry without a
/// non-empty annotation text is an error naming the entry (0-based) and the file; empty
/// annotation texts are skipped and counted in [`D2tDataset::skipped_empty`].
pub fn read_dart_json(path: &Path) -> Result<D2tDataset, DataError> {
    let text = read_bounded_string(path)?;
    read_dart_json_str(&text, path)
}

/// [`read_dart_json`] from a string; `name` is used in error messages.
pub fn read_dart_json_str(text: &str, name: &Path) -> Result<D2tDataset, DataError> {
    let entries: Vec<DartEntry> = serde_json::from_str(text).map_err(|e| DataError::Malformed {
        path: name.to_path_buf(),
        line: e.line() as u64,
        message: format!("column {}: {e}", e.column()),
    })?;
    let entry_error = |entry: usize, message: String| DataError::BadEntry {
        path: name.to_path_buf(),
        entry,
        message,
    };
    let mut records = Vec::new();
    let mut skipped = 0;
    for (i, e) in entries.into_iter().enumerate() {
        let mut triples = Vec::with_capacity(e.tripleset.len());
        for (j, t) in e.tripleset.into_iter().enumerate() {
            let [s, p, o]: [String; 3] = t.try_into().map_err(|t: Vec<String>| {
                entry_error(i, format!("triple {j} has {} parts, expected 3", t.len()))
            })?;
            triples.push(Triple {
                subject: s,
                predicate: p,
                object: o,
            });
        }
        if triples.is_empty() {
            return Err(entry_error(i, "empty tripleset".to_string()));
        }
        if e.annotations.iter().all(|a| a.text.trim().is_empty()) {
            return Err(entry_error(
                i,
                "no annotation with a non-empty text".to_string(),
            ));
        }
        let source = linearize(&triples);
        for a in e.annotations {
            if a.text.trim().is_empty() {
                skipped += 1;
                continue;
            }
            records.push(D2tRecord {
                id: records.len(),
                source: source.clone(),
                target: a.text,
            });
        }
    }
    finish(name, records, skipped)
}

fn finish(
    name: &Path,
    records: Vec<D2tRecord>,
    skipped_empty: usize,
) -> Result<D2tDataset, DataError> {
    if records.is_empty() {
        return Err(DataError::EmptyDataset {
            path: name.to_path_buf(),
            skipped: 0,
        });
    }
    Ok(D2tDataset {
        path: name.to_path_buf(),
        records,
        skipped_empty,
    })
}

/// Read DART/WebNLG-style XML: `<entry>` elements (anywhere in the document) with
/// `<modifiedtripleset><mtriple>s | p | o</mtriple>...</modifiedtripleset>` and `<lex>`
/// references; one record per `<lex>`, the source the linearized tripleset.
///
/// An `<mtriple>` is split at the first two `" | "` separators (an object may contain `|`); one
/// with fewer than two separators, or an entry without triples or without a non-empty `<lex>`
/// is an error naming the line of the element; empty `<lex>` elements are skipped and counted
/// in [`D2tDataset::skipped_empty`].
pub fn read_dart_xml(path: &Path) -> Result<D2tDataset, DataError> {
    let text = read_bounded_string(path)?;
    read_dart_xml_str(&text, path)
}

/// Read a data-to-text file by format: `"e2e"` is the E2E CSV ([`read_e2e`]); any other format
/// (`"dart"`) is DART, as XML when the file name ends in `.xml` (any case, [`read_dart_xml`])
/// and as JSON otherwise ([`read_dart_json`]).
pub fn read_d2t(format: &str, path: &Path) -> Result<D2tDataset, DataError> {
    if format == "e2e" {
        read_e2e(path)
    } else if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("xml"))
    {
        read_dart_xml(path)
    } else {
        read_dart_json(path)
    }
}

/// [`read_dart_xml`] from a string; `name` is used in error messages.
pub fn read_dart_xml_str(text: &str, name: &Path) -> Result<D2tDataset, DataError> {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: false,
        nodes_limit: u32::MAX,
    };
    let doc =
        roxmltree::Document::parse_with_options(text, opts).map_err(|e| DataError::Malformed {
            path: name.to_path_buf(),
            line: u64::from(e.pos().row),
            message: format!("invalid XML: {e}"),
        })?;
    let line_of = |n: roxmltree::Node<'_, '_>| u64::from(doc.text_pos_at(n.range().start).row);
    let mut records = Vec::new();
    let mut skipped = 0;
    for entry in doc.descendants().filter(|n| n.has_tag_name("entry")) {
        let malformed = |n: roxmltree::Node<'_, '_>, message: String| DataError::Malformed {
            path: name.to_path_buf(),
            line: line_of(n),
            message,
        };
        let mut triples = Vec::new();
        for set in entry
            .children()
            .filter(|n| n.has_tag_name("modifiedtripleset"))
        {
            for m in set.children().filter(|n| n.has_tag_name("mtriple")) {
                let t = element_text(m);
                let mut parts = t.splitn(3, " | ");
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(s), Some(p), Some(o)) => triples.push(Triple {
                        subject: s.to_string(),
                        predicate: p.to_string(),
                        object: o.to_string(),
                    }),
                    _ => {
                        return Err(malformed(
                            m,
                            format!("<mtriple> `{t}` is not `subject | predicate | object`"),
                        ));
                    }
                }
            }
        }
        if triples.is_empty() {
            return Err(malformed(entry, "<entry> has no <mtriple>".to_string()));
        }
        let source = linearize(&triples);
        let mut n_lex = 0;
        for lex in entry.children().filter(|n| n.has_tag_name("lex")) {
            let t = element_text(lex);
            if t.trim().is_empty() {
                skipped += 1;
                continue;
            }
            n_lex += 1;
            records.push(D2tRecord {
                id: records.len(),
                source: source.clone(),
                target: t,
            });
        }
        if n_lex == 0 {
            return Err(malformed(
                entry,
                "<entry> has no non-empty <lex>".to_string(),
            ));
        }
    }
    finish(name, records, skipped)
}

fn element_text(n: roxmltree::Node<'_, '_>) -> String {
    n.descendants()
        .filter(|d| d.is_text())
        .filter_map(|d| d.text())
        .collect::<String>()
}
