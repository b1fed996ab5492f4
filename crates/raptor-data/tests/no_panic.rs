//! Arbitrary bytes never make a reader panic (a short stable fuzz harness, 2,000 cases per target;
//! `RAPTOR_FUZZ_CASES=N` for a long run; the long runs are in `docs/fuzzing.md`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use proptest::prelude::*;
use raptor_data::{
    Format, TableSpec, read_dart_json_str, read_dart_xml_str, read_e2e_from, read_table_from,
};
use raptor_testkit::fuzz;

/// Bytes after a header, mostly structural characters, so the inputs reach deep into the
/// parsers.
fn bytes_like(header: &'static str) -> impl Strategy<Value = Vec<u8>> {
    fuzz::bytes_after(header, b"ab,\t\n\r\"{}[]:| <>/=&;x0\\\xff\xc3", 0..200)
}

proptest! {
    #![proptest_config(fuzz::config(2000))]

    #[test]
    fn tables(b in bytes_like("text,label\n"), raw in fuzz::arbitrary_bytes(0..200)) {
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
