//! Which columns of a table hold the text and the label, told from the file itself (the
//! one-command `raptor train --data train.csv` and `raptor init`).
//!
//! The rule, in order (each step reported in [`Detection::assumptions`]):
//!
//! 1. A column given by the caller is used as it is (it must exist).
//! 2. **By name** (case-insensitive): the text column is the first header in [`TEXT_NAMES`], the
//!    label column the first in [`LABEL_NAMES`] that holds at least 2 distinct values.
//! 3. **By shape**, for whichever is still missing: the label is the column, other than the text
//!    column, with the fewest distinct values among those with 2 to [`max_label_values`] of
//!    them (ties: the shorter values, then the leftmost column); the text is the column, other
//!    than the label column, with the longest values on average (ties: the leftmost).
//!
//! A table with fewer than two columns, or with no column that can be a label, is a
//! [`DataError::Undetectable`] that lists the columns with their distinct counts and says how to
//! name the columns. Every row of the file is read (the same bound as [`crate::read_table`]);
//! values are taken as written (JSONL numbers and booleans as their JSON text).
//!
//! ```
//! use raptor_data::detect::detect_columns_from;
//! use raptor_data::Format;
//! let csv = "id,review,stars\n1,\"a slow, heavy film\",2\n2,a delight from start to end,5\n\
//!            3,fine,4\n4,not for me at all,2\n5,a gem,5\n6,\"long, and dull\",2\n";
//! let d = detect_columns_from(csv.as_bytes(), "r.csv".as_ref(), Format::Csv, None, None)?;
//! assert_eq!((d.text.as_str(), d.label.as_str()), ("review", "stars"));
//! assert_eq!(d.labels, ["2", "4", "5"]);
//! # Ok::<(), raptor_data::DataError>(())
//! ```

use std::collections::BTreeSet;
use std::io::{BufReader, Read};
use std::path::Path;

use serde::Serialize;

use crate::{DataError, Format, MAX_TABLE_BYTES};

/// Header names taken for the text column (case-insensitive), in order of preference.
pub const TEXT_NAMES: [&str; 14] = [
    "text",
    "sentence",
    "content",
    "review",
    "tweet",
    "document",
    "body",
    "message",
    "comment",
    "utterance",
    "question",
    "quote",
    "abstract",
    "title",
];

/// Header names taken for the label column (case-insensitive), in order of preference.
pub const LABEL_NAMES: [&str; 12] = [
    "label",
    "labels",
    "class",
    "category",
    "target",
    "sentiment",
    "y",
    "tag",
    "topic",
    "intent",
    "emotion",
    "stance",
];

/// Distinct values counted per column at most (a column past it is not a label candidate).
const DISTINCT_CAP: usize = 10_000;

/// The most distinct values a column may have to be taken for the label by its shape:
/// `min(100, max(2, rows / 2))`.
///
/// ```
/// assert_eq!(raptor_data::detect::max_label_values(10), 5);
/// assert_eq!(raptor_data::detect::max_label_values(3), 2);
/// assert_eq!(raptor_data::detect::max_label_values(100_000), 100);
/// ```
pub fn max_label_values(rows: usize) -> usize {
    (rows / 2).clamp(2, 100)
}

/// One column as [`detect_columns`] saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ColumnSummary {
    /// The header.
    pub name: String,
    /// Distinct values (at most 10,000 are counted: `10000` means "that many or more").
    pub distinct: usize,
    /// Mean length of the values in characters.
    pub mean_chars: f64,
    /// Empty (or whitespace-only) values.
    pub empty: usize,
}

/// What [`detect_columns`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detection {
    /// The text column.
    pub text: String,
    /// The label column.
    pub label: String,
    /// The distinct values of the label column, sorted: the label set (read from the file, so
    /// it is what a run reveals about the labels).
    pub labels: Vec<String>,
    /// Data rows read.
    pub rows: usize,
    /// Every column, in header order.
    pub columns: Vec<ColumnSummary>,
    /// What was assumed, one sentence each (which rule chose each column, the columns left
    /// out).
    pub assumptions: Vec<String>,
}

/// Detects the text and label columns of a table file (format from the extension); `text` and
/// `label` name columns to use as they are.
///
/// # Errors
/// An unreadable or malformed file, an unknown extension, a named column that is not there, or
/// a table whose columns cannot be told apart ([`DataError::Undetectable`]).
pub fn detect_columns(
    path: &Path,
    text: Option<&str>,
    label: Option<&str>,
) -> Result<Detection, DataError> {
    let format = Format::from_path(path)?;
    let file = std::fs::File::open(path).map_err(|e| DataError::io(path, &e))?;
    let len = file.metadata().map_err(|e| DataError::io(path, &e))?.len();
    if len > MAX_TABLE_BYTES {
        return Err(DataError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_TABLE_BYTES,
        });
    }
    detect_columns_from(BufReader::new(file), path, format, text, label)
}

/// [`detect_columns`] on any reader; `name` is used in messages.
///
/// # Errors
/// As [`detect_columns`].
pub fn detect_columns_from<R: Read>(
    reader: R,
    name: &Path,
    format: Format,
    text: Option<&str>,
    label: Option<&str>,
) -> Result<Detection, DataError> {
    let (headers, rows) = match format {
        Format::Csv => read_delimited(reader, name, b',', true)?,
        Format::Tsv => read_delimited(reader, name, b'\t', false)?,
        Format::Jsonl => read_jsonl(reader, name)?,
    };
    detect_in(&headers, &rows, name, text, label)
}

/// Per-column accumulators.
struct Acc {
    distinct: BTreeSet<String>,
    saturated: bool,
    chars: u64,
    empty: usize,
}

/// The detection rule on rows already read (`rows[r][c]` is column `c` of row `r`; a missing
/// field is empty).
fn detect_in(
    headers: &[String],
    rows: &[Vec<String>],
    path: &Path,
    text: Option<&str>,
    label: Option<&str>,
) -> Result<Detection, DataError> {
    let undetectable = |message: String| DataError::Undetectable {
        path: path.to_path_buf(),
        message,
    };
    let mut acc: Vec<Acc> = headers
        .iter()
        .map(|_| Acc {
            distinct: BTreeSet::new(),
            saturated: false,
            chars: 0,
            empty: 0,
        })
        .collect();
    for row in rows {
        for (c, a) in acc.iter_mut().enumerate() {
            let v = row.get(c).map_or("", String::as_str);
            a.chars += v.chars().count() as u64;
            if v.trim().is_empty() {
                a.empty += 1;
            }
            if !a.saturated && !a.distinct.contains(v) {
                if a.distinct.len() >= DISTINCT_CAP {
                    a.saturated = true;
                } else {
                    a.distinct.insert(v.to_string());
                }
            }
        }
    }
    let n = rows.len();
    let columns: Vec<ColumnSummary> = headers
        .iter()
        .zip(&acc)
        .map(|(h, a)| ColumnSummary {
            name: h.clone(),
            distinct: if a.saturated {
                DISTINCT_CAP
            } else {
                a.distinct.len()
            },
            mean_chars: if n == 0 {
                0.0
            } else {
                a.chars as f64 / n as f64
            },
            empty: a.empty,
        })
        .collect();
    let listing = || {
        columns
            .iter()
            .map(|c| format!("`{}` ({} distinct)", c.name, c.distinct))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if n == 0 {
        return Err(undetectable(
            "the table has a header but no data row".into(),
        ));
    }
    if headers.len() < 2 {
        return Err(undetectable(format!(
            "a classification table needs a text and a label column; found only {}",
            listing()
        )));
    }
    let find = |name: &str, what: &str| -> Result<usize, DataError> {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| DataError::MissingColumn {
                column: name.to_string(),
                path: path.to_path_buf(),
                line: None,
                available: headers.to_vec(),
            })
            .map_err(|e| match e {
                DataError::MissingColumn { .. } => undetectable(format!(
                    "the {what} column `{name}` is not in the header (columns: {})",
                    headers.join(", ")
                )),
                other => other,
            })
    };
    let by_name = |names: &[&str], skip: Option<usize>, min_distinct: usize| {
        names.iter().find_map(|want| {
            headers.iter().enumerate().position(|(i, h)| {
                Some(i) != skip
                    && h.trim().eq_ignore_ascii_case(want)
                    && columns[i].distinct >= min_distinct
            })
        })
    };
    let mut assumptions = Vec::new();
    let mut text_i = match text {
        Some(t) => {
            let i = find(t, "text")?;
            assumptions.push(format!("text column `{t}`: as given"));
            Some(i)
        }
        None => None,
    };
    let mut label_i = match label {
        Some(l) => {
            let i = find(l, "label")?;
            assumptions.push(format!("label column `{l}`: as given"));
            Some(i)
        }
        None => None,
    };
    if text_i.is_none()
        && let Some(i) = by_name(&TEXT_NAMES, label_i, 1)
    {
        assumptions.push(format!(
            "text column `{}`: named like a text column (mean {:.0} characters)",
            headers[i], columns[i].mean_chars
        ));
        text_i = Some(i);
    }
    if label_i.is_none()
        && let Some(i) = by_name(&LABEL_NAMES, text_i, 2)
    {
        assumptions.push(format!(
            "label column `{}`: named like a label column ({} distinct values)",
            headers[i], columns[i].distinct
        ));
        label_i = Some(i);
    }
    if label_i.is_none() {
        let max = max_label_values(n);
        let best = (0..headers.len())
            .filter(|&i| Some(i) != text_i && (2..=max).contains(&columns[i].distinct))
            .min_by(|&a, &b| {
                columns[a]
                    .distinct
                    .cmp(&columns[b].distinct)
                    .then(columns[a].mean_chars.total_cmp(&columns[b].mean_chars))
                    .then(a.cmp(&b))
            });
        match best {
            Some(i) => {
                assumptions.push(format!(
                    "label column `{}`: the column with the fewest distinct values ({}; at most {max} allowed for {n} rows)",
                    headers[i], columns[i].distinct
                ));
                label_i = Some(i);
            }
            None => {
                return Err(undetectable(format!(
                    "no column can be the label: a label column holds between 2 and {max} distinct values in {n} rows; columns: {}. Name the columns (--text-column, --label-column)",
                    listing()
                )));
            }
        }
    }
    if text_i.is_none() {
        let best = (0..headers.len())
            .filter(|&i| Some(i) != label_i)
            .max_by(|&a, &b| {
                columns[a]
                    .mean_chars
                    .total_cmp(&columns[b].mean_chars)
                    .then(b.cmp(&a))
            });
        if let Some(i) = best {
            assumptions.push(format!(
                "text column `{}`: the column with the longest values (mean {:.0} characters)",
                headers[i], columns[i].mean_chars
            ));
            text_i = Some(i);
        }
    }
    let (Some(t), Some(l)) = (text_i, label_i) else {
        return Err(undetectable(format!(
            "cannot tell the text and label columns apart; columns: {}. Name them (--text-column, --label-column)",
            listing()
        )));
    };
    if t == l {
        return Err(undetectable(format!(
            "the text and the label would be the same column `{}`; name them (--text-column, --label-column)",
            headers[t]
        )));
    }
    if columns[l].distinct < 2 {
        return Err(undetectable(format!(
            "the label column `{}` holds fewer than two distinct values",
            headers[l]
        )));
    }
    let others: Vec<String> = headers
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != t && i != l)
        .map(|(_, h)| format!("`{h}`"))
        .collect();
    if !others.is_empty() {
        assumptions.push(format!("left out: {}", others.join(", ")));
    }
    if columns[t].empty > 0 {
        assumptions.push(format!(
            "{} rows have an empty text: training stops with an error naming the first",
            columns[t].empty
        ));
    }
    if columns[l].empty > 0 {
        assumptions.push(format!(
            "{} rows have an empty label, which counts as a label of its own",
            columns[l].empty
        ));
    }
    let labels: Vec<String> = acc[l].distinct.iter().cloned().collect();
    Ok(Detection {
        text: headers[t].clone(),
        label: headers[l].clone(),
        labels,
        rows: n,
        columns,
        assumptions,
    })
}

fn malformed(path: &Path, line: u64, message: String) -> DataError {
    DataError::Malformed {
        path: path.to_path_buf(),
        line,
        message,
    }
}

type Rows = (Vec<String>, Vec<Vec<String>>);

fn read_delimited<R: Read>(
    reader: R,
    path: &Path,
    delimiter: u8,
    quoting: bool,
) -> Result<Rows, DataError> {
    let mut rdr = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .quoting(quoting)
        .has_headers(true)
        .flexible(false)
        .from_reader(reader.take(MAX_TABLE_BYTES));
    let text_of = |e: &csv::Error| -> DataError {
        match e.kind() {
            csv::ErrorKind::Io(io) => DataError::io(path, io),
            _ => malformed(
                path,
                e.position().map_or(0, csv::Position::line),
                e.to_string(),
            ),
        }
    };
    let headers: Vec<String> = rdr
        .headers()
        .map_err(|e| text_of(&e))?
        .iter()
        .map(|h| h.trim_start_matches('\u{feff}').to_string())
        .collect();
    if headers.is_empty() || (headers.len() == 1 && headers[0].is_empty()) {
        return Err(malformed(path, 1, "the header row is empty".into()));
    }
    let mut seen = BTreeSet::new();
    for h in &headers {
        if !seen.insert(h.as_str()) {
            return Err(malformed(
                path,
                1,
                format!("column `{h}` appears more than once in the header"),
            ));
        }
    }
    let mut rows = Vec::new();
    for r in rdr.records() {
        let r = r.map_err(|e| text_of(&e))?;
        rows.push(r.iter().map(str::to_string).collect());
    }
    Ok((headers, rows))
}

fn read_jsonl<R: Read>(reader: R, path: &Path) -> Result<Rows, DataError> {
    use std::io::BufRead;
    let mut headers: Vec<String> = Vec::new();
    let mut objects: Vec<serde_json::Map<String, serde_json::Value>> = Vec::new();
    let buf = BufReader::new(reader.take(MAX_TABLE_BYTES));
    for (i, line) in buf.lines().enumerate() {
        let line_no = i as u64 + 1;
        let line = line.map_err(|e| DataError::io(path, &e))?;
        let line = if i == 0 {
            line.trim_start_matches('\u{feff}').to_string()
        } else {
            line
        };
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| malformed(path, line_no, format!("not JSON: {e}")))?;
        let serde_json::Value::Object(obj) = v else {
            return Err(malformed(path, line_no, "not a JSON object".into()));
        };
        for k in obj.keys() {
            if !headers.contains(k) {
                headers.push(k.clone());
            }
        }
        objects.push(obj);
    }
    if headers.is_empty() {
        return Err(malformed(path, 1, "no JSON object with a field".into()));
    }
    let rows = objects
        .iter()
        .map(|o| {
            headers
                .iter()
                .map(|h| match o.get(h) {
                    None | Some(serde_json::Value::Null) => String::new(),
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                })
                .collect()
        })
        .collect();
    Ok((headers, rows))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn csv(text: &str) -> Result<Detection, DataError> {
        detect_columns_from(text.as_bytes(), "t.csv".as_ref(), Format::Csv, None, None)
    }

    #[test]
    fn names_win_over_shape() {
        let d = csv("label,text\npos,good\nneg,bad\npos,fine\n").unwrap();
        assert_eq!((d.text.as_str(), d.label.as_str()), ("text", "label"));
        assert_eq!(d.labels, ["neg", "pos"]);
        assert_eq!(d.rows, 3);
        assert!(d.assumptions[0].contains("named like a text column"));
        // Case and surrounding spaces of the header do not matter for the names.
        let d = csv("Sentiment, Tweet \n1,so happy today\n0,meh\n1,yay\n0,no\n").unwrap();
        assert_eq!(
            (d.text.as_str(), d.label.as_str()),
            (" Tweet ", "Sentiment")
        );
    }

    #[test]
    fn shape_decides_for_unknown_names() {
        // A review-site shape: a quoted long text and a 5-way label, neither with a known name.
        let mut s = String::from("id,stars,body_of_work,source\n");
        for i in 0..40 {
            s.push_str(&format!(
                "{i},{},\"a long text, with commas, number {i} of many\",web\n",
                i % 5
            ));
        }
        let d = csv(&s).unwrap();
        // `source` has 1 distinct value: not a label; `stars` has 5; `id` 40 (> 40/2).
        assert_eq!(
            (d.text.as_str(), d.label.as_str()),
            ("body_of_work", "stars")
        );
        assert!(d.assumptions.iter().any(|a| a.contains("fewest distinct")));
        assert!(
            d.assumptions
                .iter()
                .any(|a| a.contains("left out: `id`, `source`"))
        );
    }

    #[test]
    fn bad_tables_are_errors_that_say_what_to_do() {
        let e = csv("text\nonly one column\n").unwrap_err().to_string();
        assert!(e.contains("needs a text and a label column"), "{e}");
        let e = csv("a,b\n1,x\n2,y\n3,z\n4,w\n").unwrap_err().to_string();
        assert!(e.contains("--label-column"), "{e}");
        let e = csv("text,label\n").unwrap_err().to_string();
        assert!(e.contains("no data row"), "{e}");
        let e = detect_columns_from(
            "text,label\na,b\n".as_bytes(),
            "t.csv".as_ref(),
            Format::Csv,
            Some("review"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`review` is not in the header"), "{e}");
        let e = csv("text,label\na,b,c\n").unwrap_err();
        assert!(matches!(e, DataError::Malformed { line: 2, .. }), "{e}");
        let e = csv("text,text\na,b\n").unwrap_err().to_string();
        assert!(e.contains("more than once"), "{e}");
    }

    #[test]
    fn jsonl_and_tsv_are_read_too() {
        let j = "{\"review\": \"great stuff here\", \"score\": 1}\n\n{\"review\": \"poor\", \"score\": 0}\n{\"review\": \"ok then\", \"score\": 1}\n";
        let d = detect_columns_from(j.as_bytes(), "t.jsonl".as_ref(), Format::Jsonl, None, None)
            .unwrap();
        assert_eq!((d.text.as_str(), d.label.as_str()), ("review", "score"));
        assert_eq!(d.labels, ["0", "1"]);
        let t = "words\tcls\nsome \"quoted\" words\ta\nmore\tb\n";
        let d =
            detect_columns_from(t.as_bytes(), "t.tsv".as_ref(), Format::Tsv, None, None).unwrap();
        assert_eq!((d.text.as_str(), d.label.as_str()), ("words", "cls"));
    }

    /// A column name drawn from names that are neither text nor label names.
    fn plain_name() -> impl Strategy<Value = String> {
        "[a-z]{3,8}_[0-9]".prop_map(|s| s)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Arbitrary bytes never panic, in any format.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            for f in [Format::Csv, Format::Tsv, Format::Jsonl] {
                let _ = detect_columns_from(bytes.as_slice(), "x".as_ref(), f, None, None);
            }
        }

        /// A table of a long text column, a k-way label column and a unique id column, under
        /// names that say nothing, in any column order: the shape rule finds the text and the
        /// label, and the label set is exactly the values written.
        #[test]
        fn shape_rule_finds_text_and_label(
            names in proptest::collection::hash_set(plain_name(), 3),
            k in 2usize..8,
            rows in 20usize..60,
            order in Just([0usize, 1, 2]).prop_shuffle(),
            words in proptest::collection::vec("[a-z]{2,9}", 5..12),
        ) {
            let names: Vec<String> = names.into_iter().collect();
            let (text, label, id) = (&names[0], &names[1], &names[2]);
            let cols = [text, label, id];
            let header: Vec<&str> = order.iter().map(|&i| cols[i].as_str()).collect();
            let mut s = header.join(",") + "\n";
            for r in 0..rows {
                let text_v = format!("\"{} {r}\"", words.join(" "));
                let vals = [text_v, format!("c{}", r % k), format!("{r}")];
                let line: Vec<&str> = order.iter().map(|&i| vals[i].as_str()).collect();
                s.push_str(&line.join(","));
                s.push('\n');
            }
            let d = csv(&s).unwrap();
            prop_assert_eq!(&d.text, text);
            prop_assert_eq!(&d.label, label);
            let want: BTreeSet<String> = (0..k).map(|c| format!("c{c}")).collect();
            prop_assert_eq!(d.labels.iter().cloned().collect::<BTreeSet<_>>(), want);
            prop_assert_eq!(d.rows, rows);
        }
    }
}
