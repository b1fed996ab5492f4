//! Arbitrary bytes never make the routing JSONL reader panic, hang or allocate without bound (a
//! stable proptest fuzz harness, as in `raptor-data`; long runs in `docs/fuzzing.md`). Brief
//! by default (a few seconds); `RAPTOR_FUZZ_CASES=N` for a long run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use raptor_routing::WeightPrecision;
use raptor_routing::jsonl::read_jsonl;
use raptor_testkit::fuzz;

/// Bytes after a valid-looking prefix, mostly structural characters and digits so that inputs
/// reach deep into the reader (huge indices, negative numbers, NaN-like tokens, bad UTF-8).
fn bytes_like(prefix: &'static str) -> impl Strategy<Value = Vec<u8>> {
    fuzz::bytes_after(
        prefix,
        b"{}[]:,\" \n01239-.eE+truefalsnmaskxpwigh\\\xff\xc3",
        0..240,
    )
}

fn check(input: &[u8]) -> Result<(), TestCaseError> {
    for e in [None, Some(1), Some(4), Some(300)] {
        for p in [WeightPrecision::F32, WeightPrecision::F16] {
            if let Ok(c) = read_jsonl(input, e, p) {
                // A corpus that reads is consistent.
                prop_assert!(c.num_experts >= 1);
                for l in &c.layers {
                    prop_assert_eq!(l.num_records(), c.num_records);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(fuzz::config(2000))]

    #[test]
    fn routing_jsonl(
        b in bytes_like("{\"layers\": [{\"experts\": [[3, 1], [0, "),
        m in bytes_like("{\"layers\": [{\"experts\": [[1]], \"weights\": [[0.5]], \"mask\": ["),
        raw in fuzz::arbitrary_bytes(0..240),
    ) {
        check(&b)?;
        check(&m)?;
        check(&raw)?;
    }
}
