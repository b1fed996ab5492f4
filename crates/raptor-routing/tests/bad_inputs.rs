//! The corpus of nasty inputs under `fixtures/bad-inputs/raptor-routing/`: each gives a typed
//! error whose message contains the expected text in `expected.tsv` (never a panic, never a
//! silent result).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufReader;
use std::path::Path;

use raptor_routing::WeightPrecision;
use raptor_routing::jsonl::read_jsonl;

#[test]
fn every_bad_input_gives_its_error() {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/bad-inputs/raptor-routing");
    let table = std::fs::read_to_string(dir.join("expected.tsv")).unwrap();
    let mut listed = Vec::new();
    for line in table.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        let [file, experts, expected] = cols[..] else {
            panic!("bad line in expected.tsv: {line:?}");
        };
        let e: Option<usize> = match experts {
            "-" => None,
            n => Some(n.parse().unwrap()),
        };
        let f = std::fs::File::open(dir.join(file)).unwrap();
        let err = read_jsonl(BufReader::new(f), e, WeightPrecision::F32).expect_err(file);
        let msg = err.to_string();
        assert!(
            msg.contains(expected),
            "{file}: {msg:?} does not contain {expected:?}"
        );
        listed.push(file.to_string());
    }
    // Every input file of the folder is listed.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".jsonl") {
            assert!(listed.contains(&name), "{name} is not in expected.tsv");
        }
    }
}
