//! The corpus of nasty inputs under `fixtures/bad-inputs/raptor-routing/`: each gives a typed
//! error whose message contains the expected text in `expected.tsv` (never a panic, never a
//! silent result), and every file of the folder is listed there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufReader;

use raptor_routing::WeightPrecision;
use raptor_routing::jsonl::read_jsonl;
use raptor_testkit::bad_inputs;

#[test]
fn every_bad_input_gives_its_error() {
    bad_inputs::check("raptor-routing", |input| {
        let e: Option<usize> = match input.setting.as_str() {
            "-" => None,
            n => Some(n.parse().unwrap()),
        };
        let f = std::fs::File::open(&input.path).unwrap();
        read_jsonl(BufReader::new(f), e, WeightPrecision::F32)
    });
}
