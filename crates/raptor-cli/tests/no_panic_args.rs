//! Arbitrary command lines never make the argument parser panic (a stable proptest fuzz harness;
//! the long runs are in `docs/fuzzing.md`): words drawn from every subcommand and flag of the
//! program (clap's own description of it), numbers at and past their limits, and random strings, in any order.
//! 2,000 cases by default; `RAPTOR_FUZZ_CASES=N` for a long run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::{CommandFactory, Parser};
use proptest::prelude::*;

/// `raptor_cli`'s subcommands at the top level, as the `raptor-acct` program has them.
#[derive(Parser, Debug)]
#[command(name = "raptor-acct")]
struct Acct {
    #[command(subcommand)]
    command: raptor_cli::Command,
}

fn cases() -> u32 {
    std::env::var("RAPTOR_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// One word of a command line: a subcommand or flag of the program, a value, or anything.
fn word(vocabulary: Vec<String>) -> impl Strategy<Value = String> {
    let values = prop::sample::select(vec![
        "0",
        "1",
        "-1",
        "0.5",
        "1e-5",
        "1e308",
        "-0",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "1e-400",
        "18446744073709551616",
        "9223372036854775807",
        "",
        " ",
        "=",
        "--",
        "-",
        "x.toml",
        "/nonexistent",
        "additive",
        "joint",
        "🦖",
    ]);
    prop_oneof![
        4 => prop::sample::select(vocabulary),
        3 => values.prop_map(str::to_string),
        1 => any::<f64>().prop_map(|v| v.to_string()),
        1 => any::<u64>().prop_map(|v| v.to_string()),
        1 => ".{0,12}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn command_lines_never_panic(
        words in proptest::collection::vec(word(raptor_cli::argv_vocabulary(&Acct::command())), 0..12),
        glue in proptest::collection::vec(any::<bool>(), 12),
    ) {
        // Sometimes `--flag=value` instead of `--flag value`.
        let mut argv = vec!["raptor-acct".to_string()];
        for (i, w) in words.iter().enumerate() {
            match argv.last_mut() {
                Some(last) if glue[i] && last.starts_with("--") && !w.starts_with('-') => {
                    last.push('=');
                    last.push_str(w);
                }
                _ => argv.push(w.clone()),
            }
        }
        // An error (usage, help, version) or a parsed command: never a panic.
        let _ = Acct::try_parse_from(&argv);
    }
}

#[test]
fn the_vocabulary_holds_every_subcommand_and_flag() {
    let v = raptor_cli::argv_vocabulary(&Acct::command());
    for w in [
        "account",
        "calibrate",
        "plan",
        "routing",
        "--q",
        "--sigma",
        "--steps",
        "--json",
    ] {
        assert!(v.iter().any(|x| x == w), "{w} missing from {v:?}");
    }
}
