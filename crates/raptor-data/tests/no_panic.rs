//! Arbitrary bytes never make a reader panic (a short stable fuzz harness; the long runs are in
//! `docs/fuzzing.md`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use proptest::prelude::*;
use raptor_data::{
    Format, TableSpec, read_dart_json_str, read_dart_xml_str, read_e2e_from, read_table_from,
};

fn bytes_like(header: &'static str) -> impl Strategy<Value = Vec<u8>> {
    // Mostly structural characters, so the inputs reach deep into the parsers.
    let alphabet = prop::sample::select(b"ab,\t\n\r\"{}[]:| <>/=&;x0\\\xff\xc3".to_vec());
    proptest::collection::vec(alphabet, 0..200).prop_map(move |mut v| {
        let mut b = header.as_bytes().to_vec();
        b.append(&mut v);
        b
    })
}

/// Cases per target: 2,000 by default (under a second), `RAPTOR_FUZZ_CASES` for a long run.
fn cases() -> u32 {
    std::env::var("RAPTOR_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn tables(b in bytes_like("text,label\n"), raw in proptest::collection::vec(any::<u8>(), 0..200)) {
        let spec = TableSpec::new("text", Some("label")).with_text_pair("label");
        for f in [Format::Csv, Format::Tsv, Format::Jsonl] {
            for input in [b.as_slice(), raw.as_slice()] {
                // Either a typed error, or a non-empty dataset of non-empty texts with
                // increasing ids.
                if let Ok(ds) = read_table_from(input, Path::new("f"), f, &spec) {
                    prop_assert!(!ds.is_empty());
                    prop_assert!(ds.records.iter().all(|r| !r.text.trim().is_empty()));
                    prop_assert!(ds.records.windows(2).all(|w| w[0].id < w[1].id));
                }
            }
        }
        let _ = read_e2e_from(b.as_slice(), Path::new("f"));
    }

    #[test]
    fn jsonl(b in bytes_like("{\"text\": \"a\", \"label\": 1}\n")) {
        let _ = read_table_from(b.as_slice(), Path::new("f"), Format::Jsonl, &TableSpec::new("text", Some("label")));
    }

    #[test]
    fn dart(b in bytes_like("[{\"tripleset\": [[\"a\",\"b\",\"c\"]], \"annotations\": "),
            x in bytes_like("<benchmark><entry><modifiedtripleset><mtriple>a | b")) {
        for ds in [
            read_dart_json_str(&String::from_utf8_lossy(&b), Path::new("f")),
            read_dart_xml_str(&String::from_utf8_lossy(&x), Path::new("f")),
        ].into_iter().flatten() {
            prop_assert!(!ds.is_empty());
            prop_assert!(ds.group_by_source().iter().map(|g| g.references.len()).sum::<usize>() == ds.len());
        }
    }
}
