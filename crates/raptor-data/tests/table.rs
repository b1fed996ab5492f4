//! Classification tables: CSV, TSV, JSONL readers and their errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use raptor_data::{DataError, EmptyText, Format, LabelMap, TableSpec, read_table, read_table_from};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn read_str(s: &str, format: Format, spec: &TableSpec) -> Result<raptor_data::Dataset, DataError> {
    read_table_from(s.as_bytes(), Path::new("mem"), format, spec)
}

#[test]
fn csv_with_quotes_and_newlines() {
    let ds = read_table(&data("sst.csv"), &TableSpec::new("sentence", Some("label"))).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(ds.ids(), vec![0, 1, 2]);
    assert_eq!(ds.records[0].text, "a gorgeous, witty, seductive movie.");
    assert_eq!(ds.records[1].text, "the story is \"thin\"");
    assert_eq!(ds.records[2].text, "multi\nline review");
    assert_eq!(ds.records[2].label.as_deref(), Some("1"));
    assert!(ds.skipped.is_empty());
}

#[test]
fn tsv_sentence_pairs_without_quoting() {
    let spec = TableSpec::new("premise", Some("label")).with_text_pair("hypothesis");
    let ds = read_table(&data("pairs.tsv"), &spec).unwrap();
    assert_eq!(ds.len(), 2);
    assert_eq!(ds.records[1].text, "A dog \"barks\".");
    assert_eq!(ds.records[1].text_pair.as_deref(), Some("A cat meows."));
    let map = LabelMap::from_records(&ds.records).unwrap();
    assert_eq!(map.labels(), ["contradiction", "entailment"]);
    assert_eq!(map.encode_all(&ds.records).unwrap(), vec![1, 0]);
}

#[test]
fn jsonl_skips_blank_lines_and_stringifies_numeric_labels() {
    let ds = read_table(
        &data("reviews.jsonl"),
        &TableSpec::new("text", Some("label")),
    )
    .unwrap();
    assert_eq!(ds.ids(), vec![0, 1, 2]);
    assert_eq!(ds.records[1].text, "awful");
    assert_eq!(ds.records[2].label.as_deref(), Some("3"));
}

#[test]
fn unlabelled_text() {
    let ds = read_table(&data("sst.csv"), &TableSpec::new("sentence", None)).unwrap();
    assert!(ds.records.iter().all(|r| r.label.is_none()));
    let err = LabelMap::from_records(&ds.records).unwrap_err();
    assert_eq!(err, DataError::MissingLabel { record: 0 });
}

#[test]
fn explicit_format_overrides_extension() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("train.txt");
    std::fs::write(&p, "text\tlabel\nhello\ta\n").unwrap();
    let spec = TableSpec::new("text", Some("label"));
    assert!(matches!(
        read_table(&p, &spec),
        Err(DataError::UnknownFormat { .. })
    ));
    let ds = read_table(&p, &spec.with_format(Format::Tsv)).unwrap();
    assert_eq!(ds.records[0].text, "hello");
}

#[test]
fn missing_file_names_the_file() {
    let err = read_table(
        Path::new("/nonexistent/train.csv"),
        &TableSpec::new("text", None),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("/nonexistent/train.csv: "), "{msg}");
    // A folder is not a table: an I/O error naming it, not a parse error.
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("data.csv");
    std::fs::create_dir(&sub).unwrap();
    let err = read_table(&sub, &TableSpec::new("text", None)).unwrap_err();
    assert!(matches!(err, DataError::Io { .. }), "{err}");
    assert!(
        err.to_string().starts_with(&sub.display().to_string()),
        "{err}"
    );
}

#[test]
fn missing_column_lists_the_columns() {
    let err = read_table(&data("sst.csv"), &TableSpec::new("text", Some("sentiment"))).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "missing column `text` in {} (columns: sentence, label, extra)",
            data("sst.csv").display()
        )
    );
    let err = read_str(
        "text,label\na,b\n",
        Format::Csv,
        &TableSpec::new("text", Some("sentiment")),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "missing column `sentiment` in mem (columns: text, label)"
    );
    let err = read_str(
        "{\"text\": \"a\", \"label\": \"x\"}\n{\"txt\": \"b\", \"label\": \"y\"}\n",
        Format::Jsonl,
        &TableSpec::new("text", Some("label")),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "missing column `text` in mem, line 2 (columns: label, txt)"
    );
}

#[test]
fn malformed_lines_are_named() {
    let spec = TableSpec::new("text", Some("label"));
    let err = read_str("text,label\na,b\nc,d,e\n", Format::Csv, &spec).unwrap_err();
    assert_eq!(
        err.to_string(),
        "mem, line 3: expected 2 fields (as in the header), found 3"
    );
    let err = read_str("text\tlabel\na\tb\nc\n", Format::Tsv, &spec).unwrap_err();
    assert!(matches!(err, DataError::Malformed { line: 3, .. }), "{err}");
    let err = read_str(
        "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\",\n",
        Format::Jsonl,
        &spec,
    )
    .unwrap_err();
    assert!(matches!(err, DataError::Malformed { line: 2, .. }), "{err}");
    let err = read_str("[1, 2]\n", Format::Jsonl, &spec).unwrap_err();
    assert_eq!(err.to_string(), "mem, line 1: expected a JSON object");
    let err = read_str("{\"text\": 5, \"label\": \"x\"}\n", Format::Jsonl, &spec).unwrap_err();
    assert_eq!(
        err.to_string(),
        "mem, line 1: field `text` must be a string, found a number"
    );
    let err = read_str("{\"text\": \"a\", \"label\": null}\n", Format::Jsonl, &spec).unwrap_err();
    assert_eq!(
        err.to_string(),
        "mem, line 1: field `label` must be a string, a number or a boolean, found null"
    );
    let bytes: &[u8] = b"text,label\n\xff\xfe,a\n";
    let err = read_table_from(bytes, Path::new("mem"), Format::Csv, &spec).unwrap_err();
    assert!(matches!(err, DataError::Malformed { line: 2, .. }), "{err}");
}

#[test]
fn empty_text_is_an_error_or_skipped_with_stable_ids() {
    let src = "text,label\na,x\n  ,y\nc,z\n,w\n";
    let spec = TableSpec::new("text", Some("label"));
    let err = read_str(src, Format::Csv, &spec).unwrap_err();
    assert_eq!(
        err.to_string(),
        "mem, line 3 (record 1): column `text` is empty"
    );
    let ds = read_str(
        src,
        Format::Csv,
        &spec.clone().with_empty_text(EmptyText::Skip),
    )
    .unwrap();
    assert_eq!(ds.ids(), vec![0, 2]);
    assert_eq!(ds.skipped, vec![1, 3]);
    assert_eq!(ds.records[1].text, "c");
    // Empty second text too.
    let spec2 = TableSpec::new("a", None).with_text_pair("b");
    let err = read_str("a,b\nx,\n", Format::Csv, &spec2).unwrap_err();
    assert_eq!(
        err.to_string(),
        "mem, line 2 (record 0): column `b` is empty"
    );
}

#[test]
fn empty_datasets_are_errors() {
    let spec = TableSpec::new("text", None);
    let err = read_str("text\n", Format::Csv, &spec).unwrap_err();
    assert_eq!(err.to_string(), "mem: the dataset is empty");
    let err = read_str("", Format::Csv, &spec).unwrap_err();
    assert!(matches!(err, DataError::EmptyDataset { .. }), "{err}");
    let err = read_str("\n\n", Format::Jsonl, &spec).unwrap_err();
    assert!(matches!(err, DataError::EmptyDataset { .. }), "{err}");
    let err = read_str(
        "text\n \n",
        Format::Csv,
        &spec.with_empty_text(EmptyText::Skip),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "mem: the dataset is empty (1 records skipped)"
    );
}

#[test]
fn select_keeps_file_order() {
    let ds = read_table(&data("sst.csv"), &TableSpec::new("sentence", Some("label"))).unwrap();
    let sel = ds.select(&[2, 0, 99]);
    assert_eq!(sel.iter().map(|r| r.id).collect::<Vec<_>>(), vec![0, 2]);
}

#[test]
fn byte_order_marks_and_crlf() {
    let spec = TableSpec::new("text", Some("label"));
    let ds = read_str("\u{feff}text,label\r\na,x\r\nb,y\r\n", Format::Csv, &spec).unwrap();
    assert_eq!(ds.records[1].text, "b");
    assert_eq!(ds.records[1].label.as_deref(), Some("y"));
    let ds = read_str("\u{feff}text\tlabel\r\na\tx\r\n", Format::Tsv, &spec).unwrap();
    assert_eq!(ds.records[0].label.as_deref(), Some("x"));
    let ds = read_str(
        "\u{feff}{\"text\": \"a\", \"label\": \"x\"}\r\n",
        Format::Jsonl,
        &spec,
    )
    .unwrap();
    assert_eq!(ds.records[0].text, "a");
}

#[test]
fn ambiguous_columns_are_errors() {
    let spec = TableSpec::new("text", Some("label"));
    let err = read_str("text,label,text\na,b,c\n", Format::Csv, &spec).unwrap_err();
    assert_eq!(
        err.to_string(),
        "mem, line 1: column `text` appears more than once in the header"
    );
    // A duplicated column that is not used is fine.
    let ds = read_str("text,label,x,x\na,b,c,d\n", Format::Csv, &spec).unwrap();
    assert_eq!(ds.len(), 1);
}

#[test]
fn dataset_splits_match_the_id_splits() {
    let rows: String = (0..50).map(|i| format!("t{i},l{}\n", i % 3)).collect();
    let ds = read_str(
        &format!("text,label\n{rows}"),
        Format::Csv,
        &TableSpec::new("text", Some("label")),
    )
    .unwrap();
    let (train, val) = ds.split_validation(0.2, 9).unwrap();
    let s = raptor_data::validation_split(&ds.ids(), 0.2, 9).unwrap();
    assert_eq!(train.ids(), s.kept);
    assert_eq!(val.ids(), s.held_out);
    assert_eq!(val.len(), 10);
    let (private, public) = ds.split_public(0.3, 9).unwrap();
    assert_eq!(public.len(), 15);
    assert_eq!(private.len() + public.len(), ds.len());
    assert_ne!(public.ids(), val.ids());
}
