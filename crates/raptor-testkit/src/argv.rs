//! Arbitrary command lines for the argument-parser harnesses of the workspace's programs
//! (`raptor-acct`, `raptor`, `raptor-reproduce`): words drawn from the program's own description
//! (every subcommand and flag, [`vocabulary`]), values at and past the limits of what the flags
//! take, numbers, and random strings, in any order, sometimes glued as `--flag=value`.
//!
//! ```
//! use clap::{CommandFactory, Parser};
//! use proptest::prelude::*;
//! use raptor_testkit::{argv, fuzz};
//!
//! #[derive(Parser, Debug)]
//! struct Cli {
//!     #[arg(long)]
//!     steps: Option<u64>,
//! }
//!
//! proptest! {
//!     #![proptest_config(fuzz::config(2000))]
//!
//!     // `#[test]` here in a test file.
//!     fn command_lines_never_panic(
//!         line in argv::command_lines("prog", &Cli::command(), &["cpu"], 0..12),
//!     ) {
//!         // A usage error or a parsed command: never a panic.
//!         let _ = Cli::try_parse_from(&line);
//!     }
//! }
//! command_lines_never_panic();
//! ```

use proptest::collection::{SizeRange, vec};
use proptest::prelude::*;

/// Values every program's harness tries in place of a flag's value: numbers at and past the
/// limits of the types flags parse into (zero and signed zero, NaN and infinities in two
/// spellings, an f64 overflow and underflow, 2^64 and i64::MAX), empty and blank words, lone
/// `=`, `--` and `-`, a file that does not exist, and a word outside ASCII.
pub const EDGE_VALUES: [&str; 22] = [
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
    "🦖",
];

/// Every word a command line of `cmd` can hold: the names of its subcommands (recursively, with
/// their aliases) and the `--long` and `-s` forms of their arguments, sorted, without
/// duplicates.
pub fn vocabulary(cmd: &clap::Command) -> Vec<String> {
    let mut words = Vec::new();
    for arg in cmd.get_arguments() {
        if let Some(l) = arg.get_long() {
            words.push(format!("--{l}"));
        }
        if let Some(s) = arg.get_short() {
            words.push(format!("-{s}"));
        }
    }
    for sub in cmd.get_subcommands() {
        words.push(sub.get_name().to_string());
        words.extend(sub.get_all_aliases().map(str::to_string));
        words.extend(vocabulary(sub));
    }
    words.sort();
    words.dedup();
    words
}

/// One word of a command line, with weights 4 : 3 : 1 : 1 : 1: a word of `vocabulary`, one of
/// [`EDGE_VALUES`] or `values` (the program's own meaningful values, such as `cuda:7` or a part
/// name), any `f64` or `u64` printed, or a string of up to 12 arbitrary characters.
///
/// # Panics
///
/// When `vocabulary` is empty (when the strategy is built).
pub fn word(
    vocabulary: Vec<String>,
    values: &[&'static str],
) -> impl Strategy<Value = String> + use<> {
    let mut all: Vec<&'static str> = EDGE_VALUES.to_vec();
    all.extend_from_slice(values);
    prop_oneof![
        4 => prop::sample::select(vocabulary),
        3 => prop::sample::select(all).prop_map(str::to_string),
        1 => any::<f64>().prop_map(|v| v.to_string()),
        1 => any::<u64>().prop_map(|v| v.to_string()),
        1 => ".{0,12}",
    ]
}

/// A command line of the program `cmd`: `program`, then a number of [`word`]s in `words` (from
/// `cmd`'s [`vocabulary`] and `values`). A value that follows a `--flag` is sometimes glued to
/// it as `--flag=value`, the other spelling clap accepts.
///
/// # Panics
///
/// When `cmd` has neither arguments nor subcommands (when the strategy is built).
pub fn command_lines<N: Into<SizeRange>>(
    program: &'static str,
    cmd: &clap::Command,
    values: &[&'static str],
    words: N,
) -> impl Strategy<Value = Vec<String>> + use<N> {
    vec((word(vocabulary(cmd), values), any::<bool>()), words).prop_map(move |words| {
        let mut line = vec![program.to_string()];
        for (w, glue) in words {
            match line.last_mut() {
                Some(last) if glue && last.starts_with("--") && !w.starts_with('-') => {
                    last.push('=');
                    last.push_str(&w);
                }
                _ => line.push(w),
            }
        }
        line
    })
}

#[cfg(test)]
mod tests {
    use clap::{Arg, Command};
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    use super::*;

    fn program() -> Command {
        Command::new("prog")
            .arg(Arg::new("json").long("json").short('j'))
            .subcommand(
                Command::new("account")
                    .visible_alias("acct")
                    .arg(Arg::new("q").long("q"))
                    .subcommand(Command::new("deep").arg(Arg::new("x").long("x"))),
            )
    }

    #[test]
    fn the_vocabulary_holds_every_subcommand_alias_and_flag_once() {
        assert_eq!(
            vocabulary(&program()),
            ["--json", "--q", "--x", "-j", "account", "acct", "deep"]
        );
    }

    #[test]
    fn command_lines_start_with_the_program_and_draw_from_the_vocabulary() {
        let mut runner = TestRunner::deterministic();
        let s = command_lines("prog", &program(), &["cuda:7"], 0..6);
        let (mut glued, mut flags, mut extra) = (0, 0, 0);
        for _ in 0..500 {
            let line = s.new_tree(&mut runner).unwrap().current();
            assert_eq!(line[0], "prog");
            assert!(line.len() <= 6);
            glued += line
                .iter()
                .filter(|w| w.starts_with("--") && w.contains('='))
                .count();
            flags += line
                .iter()
                .filter(|w| *w == "--json" || *w == "--q")
                .count();
            extra += line.iter().filter(|w| *w == "cuda:7").count();
        }
        assert!(
            glued > 0 && flags > 0 && extra > 0,
            "{glued} {flags} {extra}"
        );
    }
}
