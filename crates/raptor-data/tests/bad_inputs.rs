//! The corpus of nasty inputs under `fixtures/bad-inputs/raptor-data/`: each gives a typed
//! error whose message contains the expected text (and names the file); every file of the folder
//! is listed in `expected.tsv`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use raptor_data::{TableSpec, read_dart_json, read_dart_xml, read_e2e, read_table};
use raptor_testkit::bad_inputs;

#[test]
fn every_bad_input_gives_its_error() {
    let spec = TableSpec::new("text", Some("label"));
    let checked = bad_inputs::check("raptor-data", |input| {
        let path = &input.path;
        match input.setting.as_str() {
            "table" => read_table(path, &spec).map(|_| ()),
            "dart_json" => read_dart_json(path).map(|_| ()),
            "dart_xml" => read_dart_xml(path).map(|_| ()),
            "e2e" => read_e2e(path).map(|_| ()),
            other => panic!("unknown reader {other}"),
        }
    });
    for (input, msg) in checked {
        assert!(
            msg.contains(&input.file),
            "{}: the message does not name the file: {msg:?}",
            input.file
        );
    }
}
