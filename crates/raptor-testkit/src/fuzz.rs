//! The no-panic fuzz harnesses' shared pieces: how many cases a harness runs, and the byte
//! generators that feed parsers.
//!
//! Every harness runs [`fuzz_cases`]`(default)` cases: its own default in an ordinary
//! `cargo test`, or `RAPTOR_FUZZ_CASES` cases for a long run (the long runs are logged in
//! `docs/fuzzing.md`). [`config`] is the `ProptestConfig` with that count:
//!
//! ```
//! use proptest::prelude::*;
//! use raptor_testkit::fuzz;
//!
//! proptest! {
//!     #![proptest_config(fuzz::config(2000))]
//!
//!     // `#[test]` here in a test file.
//!     fn never_panics(
//!         json in fuzz::bytes_after("{\"a\": ", b"{}[]:,\" 0123456789.eE-\xff", 0..300),
//!         raw in fuzz::arbitrary_bytes(0..300),
//!     ) {
//!         for input in [&json, &raw] {
//!             let _ = std::str::from_utf8(input).map(str::parse::<f64>);
//!         }
//!     }
//! }
//! never_panics();
//! ```

use std::ffi::OsStr;

use proptest::collection::{SizeRange, vec};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// The environment variable that sets the number of cases of every fuzz harness.
pub const FUZZ_CASES_VAR: &str = "RAPTOR_FUZZ_CASES";

/// The number of cases a fuzz harness runs: `RAPTOR_FUZZ_CASES` when it is set, else `default`.
///
/// # Panics
///
/// When `RAPTOR_FUZZ_CASES` is set but is not a positive whole number (at most `u32::MAX`): a
/// long run asked for with a typo must not quietly run the short default. Also when `default`
/// is 0 (a harness that runs nothing tests nothing).
#[track_caller]
pub fn fuzz_cases(default: u32) -> u32 {
    cases_from(std::env::var_os(FUZZ_CASES_VAR).as_deref(), default)
}

/// [`fuzz_cases`] on the variable's value (`None`: unset).
#[track_caller]
fn cases_from(value: Option<&OsStr>, default: u32) -> u32 {
    assert!(
        default > 0,
        "a fuzz harness's default case count must be positive"
    );
    let Some(value) = value else {
        return default;
    };
    match value.to_str().map(|v| v.trim().parse::<u32>()) {
        Some(Ok(n)) if n > 0 => n,
        _ => panic!(
            "{FUZZ_CASES_VAR} must be a positive whole number of cases (at most {}), got {value:?}; \
             unset it for each harness's default",
            u32::MAX
        ),
    }
}

/// The proptest configuration of a fuzz harness: [`fuzz_cases`]`(default)` cases, everything
/// else proptest's default.
///
/// # Panics
///
/// As [`fuzz_cases`].
#[track_caller]
pub fn config(default: u32) -> Config {
    Config {
        cases: fuzz_cases(default),
        ..Config::default()
    }
}

/// Bytes after a valid-looking `prefix`: the prefix, then a number of bytes in `len` drawn from
/// `alphabet`. An alphabet of the format's structural characters and digits (with a few bytes
/// of broken UTF-8 such as `\xff` and a lone `\xc3`) makes inputs reach deep into a parser
/// instead of failing at its first byte.
///
/// # Panics
///
/// When `alphabet` is empty (when the strategy is built).
pub fn bytes_after(
    prefix: &'static str,
    alphabet: &'static [u8],
    len: impl Into<SizeRange>,
) -> impl Strategy<Value = Vec<u8>> {
    vec(prop::sample::select(alphabet), len).prop_map(move |tail| {
        let mut bytes = prefix.as_bytes().to_vec();
        bytes.extend_from_slice(&tail);
        bytes
    })
}

/// Arbitrary bytes, as many as `len` allows.
pub fn arbitrary_bytes(len: impl Into<SizeRange>) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), len)
}

#[cfg(test)]
mod tests {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    use super::*;

    #[test]
    fn unset_gives_the_default() {
        assert_eq!(cases_from(None, 2000), 2000);
        assert_eq!(cases_from(None, 200), 200);
    }

    #[test]
    fn a_positive_number_overrides_the_default() {
        assert_eq!(cases_from(Some(OsStr::new("500000")), 2000), 500_000);
        assert_eq!(cases_from(Some(OsStr::new(" 7\n")), 2000), 7);
        assert_eq!(cases_from(Some(OsStr::new("4294967295")), 1), u32::MAX);
    }

    #[test]
    fn anything_else_panics_with_a_clear_message() {
        for bad in ["0", "-3", "", "1e6", "ten", "1_000", "4294967296", "2.5"] {
            let got = std::panic::catch_unwind(|| cases_from(Some(OsStr::new(bad)), 2000));
            let err = got.expect_err(bad);
            let msg = err
                .downcast_ref::<String>()
                .map(String::as_str)
                .unwrap_or_default();
            assert!(
                msg.contains("RAPTOR_FUZZ_CASES must be a positive whole number")
                    && msg.contains(&format!("{bad:?}")),
                "{bad:?}: {msg:?}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "default case count must be positive")]
    fn a_zero_default_panics() {
        cases_from(None, 0);
    }

    #[test]
    fn the_config_carries_the_count() {
        // The variable is not set in an ordinary test run; when it is, the count is its value.
        let want = fuzz_cases(1234);
        assert_eq!(config(1234).cases, want);
        assert_eq!(
            config(1234).max_shrink_iters,
            Config::default().max_shrink_iters
        );
    }

    #[test]
    fn bytes_after_keep_the_prefix_and_the_alphabet() {
        let mut runner = TestRunner::deterministic();
        let s = bytes_after("{\"a\": ", b"01x", 0..5);
        for _ in 0..200 {
            let v = s.new_tree(&mut runner).unwrap().current();
            let tail = v.strip_prefix(b"{\"a\": ").expect("the prefix");
            assert!(tail.len() < 5);
            assert!(tail.iter().all(|b| b"01x".contains(b)), "{v:?}");
        }
    }

    #[test]
    fn arbitrary_bytes_respect_the_length() {
        let mut runner = TestRunner::deterministic();
        let s = arbitrary_bytes(3..=4);
        for _ in 0..100 {
            let n = s.new_tree(&mut runner).unwrap().current().len();
            assert!((3..=4).contains(&n));
        }
    }
}
