//! The `raptor-reproduce` program as users run it: `--json` output, bad input (exit code 2, no
//! panic), the help text, and the hidden worker subcommand. (This integration test is also what
//! makes `cargo test -p raptor-reproduce` build the program that the unit tests' parallel runs
//! start as workers.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn reproduce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_raptor-reproduce"))
        .args(args)
        .output()
        .unwrap()
}

/// `raptor-reproduce --json` prints the tables as one JSON array (progress stays on stderr) and
/// still writes them under `--out`; an unknown part is a clear error with exit code 2.
#[test]
fn json_prints_the_tables() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("results");
    let o = reproduce(&[
        "--only",
        "environment",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["slug"], "environment");
    assert!(out.join("environment.json").exists() && out.join("README.md").exists());
    let bad = reproduce(&["--only", "nope", "--out", out.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown part"));
}

/// The help lists the flags of a reproduction, not the worker subcommand; the worker with a
/// config that does not exist is a clear error (exit code 2) that names the file.
#[test]
fn help_shows_the_flags_and_hides_the_worker() {
    let o = reproduce(&["--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for flag in [
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
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    assert!(!help.contains("run-one"), "{help}");
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("job.toml");
    let o = reproduce(&[
        "run-one",
        "--config",
        missing.to_str().unwrap(),
        "--dir",
        dir.path().join("run").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("job.toml") && !err.contains("panicked"),
        "{err}"
    );
}
