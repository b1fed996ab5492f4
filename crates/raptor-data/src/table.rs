//! Classification tables: CSV, TSV and JSON lines.
//!
//! A [`TableSpec`] names the text column, an optional second text column (sentence pairs) and
//! an optional label column; [`read_table`] reads a file into a [`Dataset`] of [`Record`]s.
//!
//! **Record ids** are the 0-based index of the data row in the file (the header of a CSV/TSV
//! file is not a record; in JSONL every non-blank line is a record). Nothing is dropped before
//! ids are given, so ids are stable: a record skipped by [`EmptyText::Skip`] leaves a gap, and the
//! id of every other record stays the same whatever the policy.
//!
//! **Formats.** A UTF-8 byte-order mark at the start of a file is ignored. CSV follows RFC 4180 (quoted fields may hold commas, quotes and newlines). TSV
//! is the plain tab-separated convention: no quoting, so a field can hold neither a tab nor a
//! newline (a `"` is an ordinary character). JSONL is one JSON object per line; blank lines are
//! ignored and do not count as records; a text field must be a string, a label field a string,
//! a number or a boolean (numbers and booleans are turned into their JSON text, e.g. `1`).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::DataError;

/// The largest file [`read_table`] reads (4 GiB): a guard against unbounded inputs.
pub const MAX_TABLE_BYTES: u64 = 4 << 30;

/// File format of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Comma-separated values with a header row (RFC 4180 quoting).
    Csv,
    /// Tab-separated values with a header row, no quoting.
    Tsv,
    /// One JSON object per line.
    Jsonl,
}

impl Format {
    /// The format a file name implies: `.csv`, `.tsv`, `.jsonl` or `.ndjson` (case-insensitive).
    ///
    /// ```
    /// use raptor_data::Format;
    /// assert_eq!(Format::from_path("data/train.TSV".as_ref())?, Format::Tsv);
    /// assert!(Format::from_path("data/train.txt".as_ref()).is_err());
    /// # Ok::<(), raptor_data::DataError>(())
    /// ```
    pub fn from_path(path: &Path) -> Result<Self, DataError> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        match ext.as_str() {
            "csv" => Ok(Format::Csv),
            "tsv" => Ok(Format::Tsv),
            "jsonl" | "ndjson" => Ok(Format::Jsonl),
            _ => Err(DataError::UnknownFormat {
                path: path.to_path_buf(),
            }),
        }
    }
}

/// What to do with a record whose text (or second text) is empty or only whitespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmptyText {
    /// Fail with [`DataError::EmptyText`] naming the line (the default).
    #[default]
    Error,
    /// Skip the record and count it in [`Dataset::skipped`].
    Skip,
}

/// Which columns of a table hold what.
///
/// Deserializes from a config section such as `{text = "sentence", label = "label"}`: only
/// `text` is required, unknown fields are an error naming the field.
///
/// ```
/// let spec: raptor_data::TableSpec =
///     serde_json::from_str(r#"{"text": "sentence", "label": "y", "empty_text": "skip"}"#).unwrap();
/// assert_eq!(spec.label.as_deref(), Some("y"));
/// let err = serde_json::from_str::<raptor_data::TableSpec>(r#"{"text": "t", "lable": "y"}"#);
/// assert!(err.unwrap_err().to_string().contains("unknown field `lable`"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    /// The text column.
    pub text: String,
    /// An optional second text column (sentence-pair tasks).
    #[serde(default)]
    pub text_pair: Option<String>,
    /// The label column; `None` for unlabelled (e.g. public) text.
    #[serde(default)]
    pub label: Option<String>,
    /// The format; `None` means "from the file extension".
    #[serde(default)]
    pub format: Option<Format>,
    /// Policy for empty texts.
    #[serde(default)]
    pub empty_text: EmptyText,
}

impl TableSpec {
    /// A spec with a text and a label column, format from the extension, empty text an error.
    ///
    /// ```
    /// use raptor_data::TableSpec;
    /// let spec = TableSpec::new("sentence", Some("label"));
    /// assert_eq!(spec.text, "sentence");
    /// ```
    pub fn new(text: &str, label: Option<&str>) -> Self {
        TableSpec {
            text: text.to_string(),
            text_pair: None,
            label: label.map(str::to_string),
            format: None,
            empty_text: EmptyText::Error,
        }
    }

    /// Set a second text column.
    #[must_use]
    pub fn with_text_pair(mut self, column: &str) -> Self {
        self.text_pair = Some(column.to_string());
        self
    }

    /// Set the format explicitly.
    #[must_use]
    pub fn with_format(mut self, format: Format) -> Self {
        self.format = Some(format);
        self
    }

    /// Set the empty-text policy.
    #[must_use]
    pub fn with_empty_text(mut self, policy: EmptyText) -> Self {
        self.empty_text = policy;
        self
    }
}

/// One record of a classification table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// 0-based index of the data row in its file (stable: see the module docs).
    pub id: usize,
    /// The text.
    pub text: String,
    /// The second text of a sentence pair.
    pub text_pair: Option<String>,
    /// The label as written in the file (`None` when the spec has no label column).
    pub label: Option<String>,
}

/// The records of one table, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dataset {
    /// The file the records came from.
    pub path: PathBuf,
    /// The records (ids increasing).
    pub records: Vec<Record>,
    /// Ids of the records skipped for empty text (empty unless [`EmptyText::Skip`]).
    pub skipped: Vec<usize>,
}

impl Dataset {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether there are no records (never true for a dataset returned by [`read_table`]).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The ids of the records, in order.
    pub fn ids(&self) -> Vec<usize> {
        self.records.iter().map(|r| r.id).collect()
    }

    /// Split into (training, validation) datasets by [`crate::validation_split`] of the record
    /// ids: `round(fraction · n)` records go to validation. Both keep the file path and record
    /// ids; `skipped` stays with the training side.
    ///
    /// ```
    /// use raptor_data::{read_table_from, Format, TableSpec};
    /// let csv = "text,label\na,x\nb,y\nc,x\nd,y\n";
    /// let ds = read_table_from(csv.as_bytes(), "t.csv".as_ref(), Format::Csv, &TableSpec::new("text", Some("label")))?;
    /// let (train, val) = ds.split_validation(0.25, 1)?;
    /// assert_eq!((train.len(), val.len()), (3, 1));
    /// # Ok::<(), raptor_data::DataError>(())
    /// ```
    pub fn split_validation(
        &self,
        fraction: f64,
        seed: u64,
    ) -> Result<(Dataset, Dataset), DataError> {
        let s = crate::validation_split(&self.ids(), fraction, seed)?;
        Ok(self.two_sides(&s))
    }

    /// Split into (private, public) datasets by [`crate::public_private_split`]:
    /// `round(public_fraction · n)` records are public.
    pub fn split_public(
        &self,
        public_fraction: f64,
        seed: u64,
    ) -> Result<(Dataset, Dataset), DataError> {
        let s = crate::public_private_split(&self.ids(), public_fraction, seed)?;
        Ok(self.two_sides(&s))
    }

    fn two_sides(&self, s: &crate::Split) -> (Dataset, Dataset) {
        let kept = Dataset {
            path: self.path.clone(),
            records: self.select(&s.kept),
            skipped: self.skipped.clone(),
        };
        let held_out = Dataset {
            path: self.path.clone(),
            records: self.select(&s.held_out),
            skipped: Vec::new(),
        };
        (kept, held_out)
    }

    /// The records whose ids are in `ids` (any order; unknown ids are ignored), in file order.
    pub fn select(&self, ids: &[usize]) -> Vec<Record> {
        let mut wanted = ids.to_vec();
        wanted.sort_unstable();
        self.records
            .iter()
            .filter(|r| wanted.binary_search(&r.id).is_ok())
            .cloned()
            .collect()
    }
}

/// Read a table from a file.
///
/// ```no_run
/// use raptor_data::{read_table, TableSpec};
/// let train = read_table("data/train.csv".as_ref(), &TableSpec::new("text", Some("label")))?;
/// println!("{} records", train.len());
/// # Ok::<(), raptor_data::DataError>(())
/// ```
pub fn read_table(path: &Path, spec: &TableSpec) -> Result<Dataset, DataError> {
    let format = match spec.format {
        Some(f) => f,
        None => Format::from_path(path)?,
    };
    let file = std::fs::File::open(path).map_err(|e| DataError::io(path, &e))?;
    let len = file.metadata().map_err(|e| DataError::io(path, &e))?.len();
    if len > MAX_TABLE_BYTES {
        return Err(DataError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_TABLE_BYTES,
        });
    }
    read_table_from(BufReader::new(file), path, format, spec)
}

/// Read a table from any reader; `name` is used in error messages.
///
/// ```
/// use raptor_data::{read_table_from, Format, TableSpec};
/// let csv = "text,label\n\"good, really\",pos\nbad,neg\n";
/// let ds = read_table_from(csv.as_bytes(), "inline.csv".as_ref(), Format::Csv,
///                          &TableSpec::new("text", Some("label")))?;
/// assert_eq!(ds.records[0].text, "good, really");
/// assert_eq!(ds.records[1].label.as_deref(), Some("neg"));
/// # Ok::<(), raptor_data::DataError>(())
/// ```
pub fn read_table_from<R: Read>(
    reader: R,
    name: &Path,
    format: Format,
    spec: &TableSpec,
) -> Result<Dataset, DataError> {
    let mut builder = Builder::new(name, spec);
    match format {
        Format::Csv => read_delimited(reader, name, b',', true, spec, &mut builder)?,
        Format::Tsv => read_delimited(reader, name, b'\t', false, spec, &mut builder)?,
        Format::Jsonl => read_jsonl(reader, name, spec, &mut builder)?,
    }
    builder.finish()
}

struct Builder<'a> {
    path: &'a Path,
    spec: &'a TableSpec,
    records: Vec<Record>,
    skipped: Vec<usize>,
    next_id: usize,
}

impl<'a> Builder<'a> {
    fn new(path: &'a Path, spec: &'a TableSpec) -> Self {
        Builder {
            path,
            spec,
            records: Vec::new(),
            skipped: Vec::new(),
            next_id: 0,
        }
    }

    fn push(
        &mut self,
        line: u64,
        text: String,
        text_pair: Option<String>,
        label: Option<String>,
    ) -> Result<(), DataError> {
        let id = self.next_id;
        self.next_id += 1;
        let empty_col = if text.trim().is_empty() {
            Some(self.spec.text.clone())
        } else if text_pair.as_deref().is_some_and(|t| t.trim().is_empty()) {
            self.spec.text_pair.clone()
        } else {
            None
        };
        if let Some(column) = empty_col {
            return match self.spec.empty_text {
                EmptyText::Error => Err(DataError::EmptyText {
                    path: self.path.to_path_buf(),
                    line,
                    record: id,
                    column,
                }),
                EmptyText::Skip => {
                    self.skipped.push(id);
                    Ok(())
                }
            };
        }
        self.records.push(Record {
            id,
            text,
            text_pair,
            label,
        });
        Ok(())
    }

    fn finish(self) -> Result<Dataset, DataError> {
        if self.records.is_empty() {
            return Err(DataError::EmptyDataset {
                path: self.path.to_path_buf(),
                skipped: self.skipped.len(),
            });
        }
        Ok(Dataset {
            path: self.path.to_path_buf(),
            records: self.records,
            skipped: self.skipped,
        })
    }
}

fn csv_error(path: &Path, e: &csv::Error) -> DataError {
    if let csv::ErrorKind::Io(io) = e.kind() {
        return DataError::io(path, io);
    }
    let line = e.position().map(csv::Position::line).unwrap_or(0);
    let message = match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("expected {expected_len} fields (as in the header), found {len}"),
        csv::ErrorKind::Utf8 { err, .. } => {
            format!("field {} is not valid UTF-8", err.field() + 1)
        }
        _ => e.to_string(),
    };
    DataError::Malformed {
        path: path.to_path_buf(),
        line,
        message,
    }
}

fn find_column(headers: &csv::StringRecord, column: &str, path: &Path) -> Result<usize, DataError> {
    let mut found = headers.iter().enumerate().filter(|(_, h)| *h == column);
    let first = found.next().map(|(i, _)| i);
    if found.next().is_some() {
        return Err(DataError::Malformed {
            path: path.to_path_buf(),
            line: 1,
            message: format!("column `{column}` appears more than once in the header"),
        });
    }
    first.ok_or_else(|| DataError::MissingColumn {
        column: column.to_string(),
        path: path.to_path_buf(),
        line: None,
        available: headers.iter().map(str::to_string).collect(),
    })
}

fn read_delimited<R: Read>(
    reader: R,
    path: &Path,
    delimiter: u8,
    quoting: bool,
    spec: &TableSpec,
    builder: &mut Builder<'_>,
) -> Result<(), DataError> {
    let mut rdr = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .quoting(quoting)
        .has_headers(true)
        .from_reader(reader);
    let headers = rdr.headers().map_err(|e| csv_error(path, &e))?.clone();
    if headers.is_empty() || (headers.len() == 1 && headers.get(0) == Some("")) {
        return Err(DataError::EmptyDataset {
            path: path.to_path_buf(),
            skipped: 0,
        });
    }
    let text_col = find_column(&headers, &spec.text, path)?;
    let pair_col = spec
        .text_pair
        .as_deref()
        .map(|c| find_column(&headers, c, path))
        .transpose()?;
    let label_col = spec
        .label
        .as_deref()
        .map(|c| find_column(&headers, c, path))
        .transpose()?;
    let mut row = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut row) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(csv_error(path, &e)),
        }
        let line = row.position().map(csv::Position::line).unwrap_or(0);
        let field = |i: usize| row.get(i).unwrap_or_default().to_string();
        builder.push(
            line,
            field(text_col),
            pair_col.map(field),
            label_col.map(field),
        )?;
    }
    Ok(())
}

fn read_jsonl<R: Read>(
    reader: R,
    path: &Path,
    spec: &TableSpec,
    builder: &mut Builder<'_>,
) -> Result<(), DataError> {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    let mut line = 0u64;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| DataError::io(path, &e))?;
        if n == 0 {
            break;
        }
        line += 1;
        let malformed = |message: String| DataError::Malformed {
            path: path.to_path_buf(),
            line,
            message,
        };
        // A UTF-8 byte-order mark at the start of the file is not part of the data.
        let bytes = if line == 1 {
            buf.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&buf)
        } else {
            &buf
        };
        let text = std::str::from_utf8(bytes).map_err(|e| {
            malformed(format!(
                "not valid UTF-8 (byte {} of the line)",
                e.valid_up_to() + 1
            ))
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| malformed(format!("invalid JSON at column {}: {e}", e.column())))?;
        let serde_json::Value::Object(obj) = value else {
            return Err(malformed("expected a JSON object".to_string()));
        };
        let get = |column: &str, text_field: bool| -> Result<String, DataError> {
            match obj.get(column) {
                None => Err(DataError::MissingColumn {
                    column: column.to_string(),
                    path: path.to_path_buf(),
                    line: Some(line),
                    available: obj.keys().cloned().collect(),
                }),
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)))
                    if !text_field =>
                {
                    Ok(v.to_string())
                }
                Some(v) => Err(malformed(format!(
                    "field `{column}` must be a string{}, found {}",
                    if text_field {
                        ""
                    } else {
                        ", a number or a boolean"
                    },
                    json_kind(v)
                ))),
            }
        };
        let text = get(&spec.text, true)?;
        let pair = spec
            .text_pair
            .as_deref()
            .map(|c| get(c, true))
            .transpose()?;
        let label = spec.label.as_deref().map(|c| get(c, false)).transpose()?;
        builder.push(line, text, pair, label)?;
    }
    Ok(())
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
