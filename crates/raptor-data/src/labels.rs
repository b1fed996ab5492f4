//! String labels to class indices.

use serde::{Deserialize, Serialize};

use crate::{DataError, Record};

/// An ordered list of class labels; the index of a label in the list is its class index.
///
/// Built from training records ([`LabelMap::from_records`]: the sorted unique labels, so the
/// same data always gives the same map) or from an explicit list ([`LabelMap::from_list`]).
/// Serializes as `{"labels": [...]}`, so a run folder can store it and evaluation can use the
/// training run's map.
///
/// ```
/// use raptor_data::{LabelMap, Record};
/// let rec = |id, l: &str| Record { id, text: "t".into(), text_pair: None, label: Some(l.into()) };
/// let map = LabelMap::from_records(&[rec(0, "rotten"), rec(1, "fresh"), rec(2, "rotten")])?;
/// assert_eq!(map.labels(), &["fresh", "rotten"]);
/// assert_eq!(map.encode(&rec(7, "rotten"))?, 1);
/// assert!(map.encode(&rec(8, "meh")).is_err()); // names the label and record 8
/// let json = serde_json::to_string(&map).unwrap();
/// assert_eq!(json, r#"{"labels":["fresh","rotten"]}"#);
/// # Ok::<(), raptor_data::DataError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "LabelList", into = "LabelList")]
pub struct LabelMap {
    labels: Vec<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LabelList {
    labels: Vec<String>,
}

impl TryFrom<LabelList> for LabelMap {
    type Error = DataError;
    fn try_from(l: LabelList) -> Result<Self, DataError> {
        LabelMap::from_list(l.labels)
    }
}

impl From<LabelMap> for LabelList {
    fn from(m: LabelMap) -> Self {
        LabelList { labels: m.labels }
    }
}

impl LabelMap {
    /// The map of the sorted (byte-wise) unique labels of `records`.
    ///
    /// Errors: [`DataError::MissingLabel`] for a record without a label;
    /// [`DataError::InvalidLabels`] when there are no records.
    pub fn from_records(records: &[Record]) -> Result<Self, DataError> {
        let mut labels = Vec::with_capacity(8);
        for r in records {
            match &r.label {
                Some(l) => labels.push(l.clone()),
                None => return Err(DataError::MissingLabel { record: r.id }),
            }
        }
        labels.sort_unstable();
        labels.dedup();
        Self::from_list(labels)
    }

    /// A map with the given labels in the given order.
    ///
    /// Errors: [`DataError::InvalidLabels`] for an empty list or a duplicate label.
    pub fn from_list(labels: Vec<String>) -> Result<Self, DataError> {
        if labels.is_empty() {
            return Err(DataError::InvalidLabels(
                "a label map needs at least one label".to_string(),
            ));
        }
        let mut sorted: Vec<&String> = labels.iter().collect();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(DataError::InvalidLabels(format!(
                "label `{}` appears twice",
                w[0]
            )));
        }
        Ok(LabelMap { labels })
    }

    /// The labels in index order.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The number of classes.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Always false (a label map has at least one label).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The index of a label, if known.
    pub fn index(&self, label: &str) -> Option<usize> {
        self.labels.iter().position(|l| l == label)
    }

    /// The label of a class index.
    pub fn name(&self, index: usize) -> Option<&str> {
        self.labels.get(index).map(String::as_str)
    }

    /// The class index of a record's label.
    ///
    /// Errors: [`DataError::MissingLabel`], or [`DataError::UnknownLabel`] naming the label and
    /// the record.
    pub fn encode(&self, record: &Record) -> Result<usize, DataError> {
        let label = record
            .label
            .as_deref()
            .ok_or(DataError::MissingLabel { record: record.id })?;
        self.index(label).ok_or_else(|| DataError::UnknownLabel {
            label: label.to_string(),
            record: record.id,
            known: self.labels.clone(),
        })
    }

    /// The class indices of all records (the first unknown label is an error).
    pub fn encode_all(&self, records: &[Record]) -> Result<Vec<usize>, DataError> {
        records.iter().map(|r| self.encode(r)).collect()
    }
}
