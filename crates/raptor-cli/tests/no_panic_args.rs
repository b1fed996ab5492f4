//! Arbitrary command lines never make the argument parser panic (a stable proptest fuzz harness;
//! the long runs are in `docs/fuzzing.md`): words drawn from every subcommand and flag of the
//! program (clap's own description of it), numbers at and past their limits, and random strings,
//! in any order (`raptor_testkit::argv`).
//! 2,000 cases by default; `RAPTOR_FUZZ_CASES=N` for a long run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::{CommandFactory, Parser};
use proptest::prelude::*;
use raptor_testkit::{argv, fuzz};

/// `raptor_cli`'s subcommands at the top level, as the `raptor-acct` program has them.
#[derive(Parser, Debug)]
#[command(name = "raptor-acct")]
struct Acct {
    #[command(subcommand)]
    command: raptor_cli::Command,
}

proptest! {
    #![proptest_config(fuzz::config(2000))]

    #[test]
    fn command_lines_never_panic(
        line in argv::command_lines("raptor-acct", &Acct::command(), &["additive", "joint"], 0..12),
    ) {
        // An error (usage, help, version) or a parsed command: never a panic.
        let _ = Acct::try_parse_from(&line);
    }
}

#[test]
fn the_vocabulary_holds_every_subcommand_and_flag() {
    let v = argv::vocabulary(&Acct::command());
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
