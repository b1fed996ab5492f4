//! Tests of the driver that need its internals (the program is a binary crate, so they live
//! inside it): the paper and backbones parts end to end at the `quick` scale on explicit test
//! inputs, and the command line. The program as a whole is run by `tests/cli.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use proptest::prelude::*;
use raptor_testkit::{argv, fuzz};

use crate::Cli;

mod backbones;
mod dpmuon;
mod paper;

/// The `raptor-reproduce` program cargo built beside this test binary (the unit tests run from
/// `target/<profile>/deps/`, the program is in `target/<profile>/`): the worker processes of a
/// parallel run. `cargo test -p raptor-reproduce` builds it before running any test, because
/// the crate's integration test (`tests/cli.rs`) needs it.
pub(crate) fn worker_exe() -> PathBuf {
    let me = std::env::current_exe().unwrap();
    let exe = me
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("raptor-reproduce");
    assert!(
        exe.is_file(),
        "{} is missing: run `cargo test -p raptor-reproduce` (which builds the program for its \
         integration test) or `cargo build -p raptor-reproduce` first",
        exe.display()
    );
    exe
}

#[test]
fn the_command_definition_is_consistent() {
    Cli::command().debug_assert();
    // The runner starts workers with this name: the hidden subcommand must carry it.
    let cmd = Cli::command();
    let worker = cmd
        .find_subcommand(crate::paper::runs::WORKER_COMMAND)
        .expect("the worker subcommand");
    assert!(worker.is_hide_set());
    let v = argv::vocabulary(&cmd);
    for w in [
        "--out",
        "--root",
        "--quick",
        "--full",
        "--only",
        "--cache",
        "--d2t-data",
        "--device",
        "--jobs",
        "--json",
    ] {
        assert!(v.iter().any(|x| x == w), "{w} missing from {v:?}");
    }
}

/// The flags and defaults of the former `raptor reproduce`, unchanged.
#[test]
fn flags_keep_their_defaults() {
    let cli = Cli::try_parse_from(["raptor-reproduce"]).unwrap();
    assert!(cli.worker.is_none());
    let a = cli.args;
    assert_eq!(a.out, PathBuf::from("results"));
    assert_eq!(a.root, PathBuf::from("."));
    assert!(!a.quick && !a.full && !a.json);
    assert!(a.only.is_empty() && a.cache.is_none() && a.d2t_data.is_none());
    assert_eq!(a.device, raptor_train::config::DeviceSpec::Cpu);
    assert_eq!(a.jobs, None);
    let cli = Cli::try_parse_from([
        "raptor-reproduce",
        "--only",
        "paper",
        "--only",
        "muon",
        "--quick",
        "--jobs",
        "3",
        "--device",
        "cuda:1",
    ])
    .unwrap();
    assert_eq!(cli.args.only, ["paper", "muon"]);
    assert_eq!(cli.args.jobs, Some(3));
    assert_eq!(
        cli.args.device,
        raptor_train::config::DeviceSpec::Cuda(Some(1))
    );
    assert!(Cli::try_parse_from(["raptor-reproduce", "--device", "gpu"]).is_err());
    assert!(Cli::try_parse_from(["raptor-reproduce", "--quick", "--full"]).is_err());
    // The worker's arguments do not mix with a reproduction's.
    let w = Cli::try_parse_from(["raptor-reproduce", "run-one", "--config", "a", "--dir", "b"])
        .unwrap();
    assert!(matches!(w.worker, Some(crate::Worker::RunOne { .. })));
    assert!(
        Cli::try_parse_from([
            "raptor-reproduce",
            "--quick",
            "run-one",
            "--config",
            "a",
            "--dir",
            "b"
        ])
        .is_err()
    );
}

proptest! {
    #![proptest_config(fuzz::config(2000))]

    /// The argument parser never panics on arbitrary command lines.
    #[test]
    fn command_lines_never_panic(
        line in argv::command_lines(
            "raptor-reproduce",
            &Cli::command(),
            &["paper", "nope", "cpu", "cuda:7"],
            0..10,
        ),
    ) {
        let _ = Cli::try_parse_from(&line);
    }
}
