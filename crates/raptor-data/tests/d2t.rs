//! Data-to-text readers on hand-made fixtures, and on the real E2E / DART files when present.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use raptor_data::{
    DataError, read_d2t, read_dart_json, read_dart_json_str, read_dart_xml, read_dart_xml_str,
    read_e2e, read_e2e_from,
};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

#[test]
fn e2e_pairs_and_groups() {
    let ds = read_e2e(&data("e2e_small.csv")).unwrap();
    assert_eq!(ds.len(), 4);
    assert_eq!(ds.records[3].id, 3);
    assert_eq!(
        ds.records[3].target,
        "There's Alimentum — city centre, \"café\" style."
    );
    assert_eq!(ds.num_sources(), 2);
    let g = ds.group_by_source();
    assert_eq!(g.len(), 2);
    assert_eq!(g[0].source, "name[Alimentum], area[city centre]");
    assert_eq!(g[0].ids, vec![0, 1, 3]);
    assert_eq!(g[0].references.len(), 3);
    assert_eq!(g[1].references, vec!["Aromi is a coffee shop."]);
}

#[test]
fn e2e_errors() {
    let err = read_e2e_from("meaning,ref\na,b\n".as_bytes(), Path::new("e2e.csv")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "missing column `mr` in e2e.csv (columns: meaning, ref)"
    );
    let err = read_e2e_from("mr,ref\na,b\nc,\n".as_bytes(), Path::new("e2e.csv")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "e2e.csv, line 3 (record 1): column `ref` is empty"
    );
    let err = read_e2e_from("mr,ref\n".as_bytes(), Path::new("e2e.csv")).unwrap_err();
    assert!(matches!(err, DataError::EmptyDataset { .. }));
}

#[test]
fn dart_json_linearized_and_grouped() {
    let ds = read_dart_json(&data("dart_small.json")).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(
        ds.records[0].source,
        "Mars Hill College : JOINED : 1973 | Mars Hill College : LOCATION : Mars Hill, North Carolina"
    );
    assert_eq!(ds.records[2].source, "Ålesund : COUNTRY : Norway | Europe");
    let g = ds.group_by_source();
    assert_eq!(g.len(), 2);
    assert_eq!(g[0].references.len(), 2);
    assert_eq!(g[1].ids, vec![2]);
}

#[test]
fn dart_json_errors() {
    let p = Path::new("dart.json");
    let err = read_dart_json_str(
        r#"[{"tripleset": [["a","b"]], "annotations": [{"source":"s","text":"t"}]}]"#,
        p,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "dart.json, entry 0: triple 0 has 2 parts, expected 3"
    );
    let err = read_dart_json_str(
        r#"[{"tripleset": [], "annotations": [{"source":"s","text":"t"}]}]"#,
        p,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("entry 0: empty tripleset"),
        "{err}"
    );
    let err = read_dart_json_str(r#"[{"tripleset": [["a","b","c"]], "annotations": []}]"#, p)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no annotation with a non-empty text"),
        "{err}"
    );
    let ds = read_dart_json_str(r#"[{"tripleset": [["a","b","c"]], "annotations": [{"source":"s","text":" "},{"source":"s","text":"t"}]}]"#, p).unwrap();
    assert_eq!((ds.len(), ds.skipped_empty), (1, 1));
    let err = read_dart_json_str("[\n{\"tripleset\": 5}\n]", p).unwrap_err();
    assert!(matches!(err, DataError::Malformed { line: 2, .. }), "{err}");
    let err = read_dart_json_str("[]", p).unwrap_err();
    assert!(matches!(err, DataError::EmptyDataset { .. }));
}

#[test]
fn dart_xml_linearized_and_grouped() {
    let ds = read_dart_xml(&data("dart_small.xml")).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(
        ds.records[0].source,
        "Hawaii Five-O : NOTES : Episode: The Flight of the Jewels | [TABLECONTEXT] : [TITLE] : Jeff Daniels & co | more"
    );
    assert_eq!(
        ds.records[0].target,
        "Jeff Daniels played in \"Hawaii Five-O\"."
    );
    assert_eq!(
        ds.records[1].target,
        "Daniels — in The Flight of the Jewels."
    );
    assert_eq!(ds.records[2].source, "Aromi : eatType : coffee shop");
    assert_eq!(ds.group_by_source().len(), 2);
}

#[test]
fn dart_xml_errors() {
    let p = Path::new("dart.xml");
    let err = read_dart_xml_str("<benchmark>\n<entry>\n<modifiedtripleset><mtriple>a | b</mtriple></modifiedtripleset><lex>x</lex></entry></benchmark>", p).unwrap_err();
    assert_eq!(
        err.to_string(),
        "dart.xml, line 3: <mtriple> `a | b` is not `subject | predicate | object`"
    );
    let err = read_dart_xml_str("<b><entry>\n<modifiedtripleset><mtriple>a | b | c</mtriple></modifiedtripleset></entry></b>", p).unwrap_err();
    assert_eq!(
        err.to_string(),
        "dart.xml, line 1: <entry> has no non-empty <lex>"
    );
    let ds = read_dart_xml_str("<b><entry><modifiedtripleset><mtriple>a | b | c</mtriple></modifiedtripleset><lex/><lex>t</lex></entry></b>", p).unwrap();
    assert_eq!((ds.len(), ds.skipped_empty, ds.records[0].id), (1, 1, 0));
    let err = read_dart_xml_str("<b><entry><lex>x</lex></entry></b>", p).unwrap_err();
    assert!(err.to_string().contains("has no <mtriple>"), "{err}");
    let err = read_dart_xml_str("<b>\n<entry>\n</b>", p).unwrap_err();
    assert!(matches!(err, DataError::Malformed { line: 3, .. }), "{err}");
    let err = read_dart_xml_str("<!DOCTYPE x [<!ENTITY a \"aaaa\">]><b>&a;</b>", p).unwrap_err();
    assert!(
        matches!(err, DataError::Malformed { .. }),
        "DTDs are refused: {err}"
    );
}

/// The real files in the shared data folder (`../shared/data` beside the workspace root, the
/// nearest ancestor's `shared/data` for a nested worktree, or `$RAPTOR_SHARED_DATA`), when they
/// exist. The
/// expected counts were computed independently with Python (csv, json, xml.etree).
#[test]
fn real_files_when_present() {
    let Some(shared) = raptor_testkit::paths::shared_data_dir() else {
        println!("skipped: no shared/data folder beside the workspace (nor RAPTOR_SHARED_DATA)");
        return;
    };
    let e2e_dev = shared.join("e2e/devel-fixed.no-ol.csv");
    let e2e_test = shared.join("e2e/test-fixed.csv");
    let dart_dev = shared.join("dart/dart-v1.1.1-full-dev.json");
    let dart_test = shared.join("dart/dart-v1.1.1-full-test.xml");
    let mut ran = 0;
    for (p, read, rows, sources, skipped) in [
        (
            &e2e_dev,
            read_e2e as fn(&Path) -> Result<_, _>,
            4299,
            1484,
            0,
        ),
        (&e2e_test, read_e2e, 4693, 1847, 0),
        (&dart_dev, read_dart_json, 6980, 2721, 0),
        (&dart_test, read_dart_xml, 12551, 4159, 1),
    ] {
        if !p.exists() {
            println!("skipped: {} not present", p.display());
            continue;
        }
        let ds = read(p).unwrap();
        println!(
            "{}: {} records, {} distinct sources",
            p.display(),
            ds.len(),
            ds.num_sources()
        );
        assert_eq!(
            (ds.len(), ds.num_sources(), ds.skipped_empty),
            (rows, sources, skipped),
            "{}",
            p.display()
        );
        assert!(
            ds.records
                .iter()
                .all(|r| !r.source.is_empty() && !r.target.trim().is_empty())
        );
        assert_eq!(
            ds.group_by_source()
                .iter()
                .map(|g| g.references.len())
                .sum::<usize>(),
            ds.len()
        );
        ran += 1;
    }
    if ran == 0 {
        println!(
            "skipped: no real data-to-text files under {}",
            shared.display()
        );
    }
}

/// `read_d2t` dispatches by format and, for DART, by the file's extension (any case).
#[test]
fn read_d2t_picks_the_reader_by_format_and_extension() {
    let same = |a: &raptor_data::D2tDataset, b: &raptor_data::D2tDataset| {
        a.records
            .iter()
            .map(|r| (&r.source, &r.target))
            .collect::<Vec<_>>()
            == b.records
                .iter()
                .map(|r| (&r.source, &r.target))
                .collect::<Vec<_>>()
    };
    let e2e = data("e2e_small.csv");
    assert!(same(
        &read_d2t("e2e", &e2e).unwrap(),
        &read_e2e(&e2e).unwrap()
    ));
    let xml = data("dart_small.xml");
    assert!(same(
        &read_d2t("dart", &xml).unwrap(),
        &read_dart_xml(&xml).unwrap()
    ));
    let json = data("dart_small.json");
    assert!(same(
        &read_d2t("dart", &json).unwrap(),
        &read_dart_json(&json).unwrap()
    ));
    // An upper-case extension is still XML.
    let dir = tempfile::tempdir().unwrap();
    let upper = dir.path().join("DART.XML");
    std::fs::copy(&xml, &upper).unwrap();
    assert!(same(
        &read_d2t("dart", &upper).unwrap(),
        &read_dart_xml(&xml).unwrap()
    ));
    // An E2E file read as DART is DART's error, not a silent E2E read.
    assert!(read_d2t("dart", &e2e).is_err());
}
