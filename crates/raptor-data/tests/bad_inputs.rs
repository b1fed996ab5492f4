//! The corpus of nasty inputs under `fixtures/bad-inputs/raptor-data/`: each gives a typed
//! error whose message contains the expected text (and names the file).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use raptor_data::{TableSpec, read_dart_json, read_dart_xml, read_e2e, read_table};

#[test]
fn every_bad_input_gives_its_error() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/bad-inputs/raptor-data");
    let table = std::fs::read_to_string(dir.join("expected.tsv")).unwrap();
    let mut checked = 0;
    for line in table.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        let [file, reader, expected] = cols[..] else {
            panic!("bad line in expected.tsv: {line:?}");
        };
        let path = dir.join(file);
        let err = match reader {
            "table" => read_table(&path, &TableSpec::new("text", Some("label"))).map(|_| ()),
            "dart_json" => read_dart_json(&path).map(|_| ()),
            "dart_xml" => read_dart_xml(&path).map(|_| ()),
            "e2e" => read_e2e(&path).map(|_| ()),
            other => panic!("unknown reader {other}"),
        }
        .expect_err(file);
        let msg = err.to_string();
        assert!(
            msg.contains(expected),
            "{file}: {msg:?} does not contain {expected:?}"
        );
        assert!(
            msg.contains(file),
            "{file}: the message does not name the file: {msg:?}"
        );
        checked += 1;
    }
    // Every file of the folder is listed.
    let files = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name();
            n != "expected.tsv" && n != "README.md"
        })
        .count();
    assert_eq!(checked, files);
}
