#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `raptor-acct account / calibrate / plan / routing`: output forms and error handling.
//!
//! The `raptor` crate's `tests/cli_account.rs` includes this file to run the same cases on the
//! `raptor` program, which embeds these subcommands (one copy of the cases, two programs).

use std::process::Command;

/// The program under test: `raptor-acct` in this crate's tests, `raptor` in the raptor crate's.
fn program() -> &'static str {
    option_env!("CARGO_BIN_EXE_raptor-acct")
        .or(option_env!("CARGO_BIN_EXE_raptor"))
        .expect("built as a test of raptor-cli or raptor")
}

fn acct(args: &[&str]) -> std::process::Output {
    Command::new(program()).args(args).output().unwrap()
}

/// Fails the test with the program's stderr when it did not exit with success.
fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The output shown in raptor-cli's README for its first example is what the program prints
/// (the documented digits are checked, not copied by hand).
#[test]
fn readme_example_output_is_current() {
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../raptor-cli/README.md"
    ))
    .unwrap();
    let out = acct(&[
        "account", "--q", "0.01", "--sigma", "1.0", "--steps", "10000", "--delta", "1e-5",
    ]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    for prefix in ["epsilon (PRV):", "epsilon (RDP):"] {
        let shown = readme
            .lines()
            .find_map(|l| l.strip_prefix("#   ").filter(|l| l.starts_with(prefix)))
            .unwrap_or_else(|| panic!("README shows no {prefix} line"));
        let printed = text
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in {text}"));
        assert_eq!(shown.trim_end(), printed.trim_end());
    }
}

#[test]
fn account_json_matches_the_library() {
    let out = acct(&[
        "account", "--q", "0.01", "--sigma", "1", "--steps", "1000", "--delta", "1e-5", "--json",
    ]);
    assert_success(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = &v["epsilon"];
    let (up, est, low) = (
        e["upper"].as_f64().unwrap(),
        e["estimate"].as_f64().unwrap(),
        e["lower"].as_f64().unwrap(),
    );
    assert!(low <= est && est <= up);
    let c = raptor_accountant::Composition::single(
        raptor_accountant::SubsampledGaussian::new(0.01, 1.0).unwrap(),
        1000,
    )
    .unwrap();
    let lib = raptor_accountant::PrvAccountant::default()
        .epsilon(&c, 1e-5)
        .unwrap();
    // same computation (the JSON text may drop the last bit)
    assert!(
        (up - lib.upper).abs() <= 1e-12 * lib.upper,
        "{up} vs {}",
        lib.upper
    );
    assert!(v["rdp"]["epsilon"].as_f64().unwrap() >= low);
}

#[test]
fn account_two_streams_and_text_output() {
    let out = acct(&[
        "account",
        "--mech",
        "0.01,1.0,500",
        "--mech",
        "0.05,2.0,500",
        "--delta",
        "1e-5",
    ]);
    assert_success(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("epsilon (PRV): upper") && text.contains("epsilon (RDP)"),
        "{text}"
    );
    assert_eq!(text.matches("mechanism:").count(), 2);
}

#[test]
fn calibrate_and_plan() {
    let out = acct(&[
        "calibrate",
        "--epsilon",
        "2",
        "--delta",
        "1e-5",
        "--q",
        "0.01",
        "--steps",
        "500",
        "--json",
    ]);
    assert_success(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["sigma"].as_f64().unwrap() > 0.3);
    assert!(v["epsilon"]["upper"].as_f64().unwrap() <= 2.0);
    let out = acct(&[
        "plan",
        "--epsilon",
        "4",
        "--delta",
        "1e-5",
        "--rho",
        "0.9",
        "--shared",
        "0.02,300",
        "--expert",
        "0.02,300",
        "--layers",
        "1",
    ]);
    assert_success(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("additive") && text.contains("joint"),
        "{text}"
    );
}

#[test]
fn bad_input_exits_with_code_2_and_a_message() {
    for args in [
        &[
            "account", "--q", "1.5", "--sigma", "1", "--steps", "10", "--delta", "1e-5",
        ][..],
        &[
            "account", "--q", "0.1", "--sigma", "1", "--steps", "10", "--delta", "0",
        ][..],
        &["account", "--delta", "1e-5"][..],
        &["account", "--mech", "0.1,1", "--delta", "1e-5"][..],
        &[
            "calibrate",
            "--epsilon",
            "-1",
            "--delta",
            "1e-5",
            "--q",
            "0.01",
            "--steps",
            "10",
        ][..],
        &[
            "plan",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--rho",
            "1.5",
            "--shared",
            "0.1,10",
            "--expert",
            "0.1,10",
        ][..],
    ] {
        let out = acct(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
    let out = acct(&[
        "account", "--q", "1.5", "--sigma", "1", "--steps", "10", "--delta", "1e-5",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("1.5"));
}

#[test]
fn epsilon_zero_states_the_rule() {
    for cmd in [
        &[
            "calibrate",
            "--epsilon",
            "0",
            "--delta",
            "1e-5",
            "--q",
            "0.01",
            "--steps",
            "10",
        ][..],
        &[
            "plan",
            "--epsilon",
            "0",
            "--delta",
            "1e-5",
            "--shared",
            "0.1,10",
            "--expert",
            "0.1,10",
        ][..],
    ] {
        let out = acct(cmd);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("epsilon = 0"), "{err}");
        assert!(err.contains("> 0 as the target"), "{err}");
        assert!(!err.contains("must be finite and >= 0\n"), "{err}");
    }
}

#[test]
fn routing_selects_a_layer_of_the_example_corpus() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/routing/example.jsonl"
    );
    let out = acct(&["routing", "--input", example, "--json"]);
    assert_success(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["corpus"], "public");
    let layers = v["num_layers"].as_u64().unwrap();
    assert!(v["selection"]["layer"].as_u64().unwrap() < layers);
    let out = acct(&["routing", "--input", example]);
    assert_success(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("selected layer:"));
}

#[test]
fn routing_bad_input_exits_with_code_2() {
    let dir = std::env::temp_dir().join(format!("raptor-acct-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"layers\": [{\"experts\": 3}]}\n").unwrap();
    let missing = dir.join("missing.jsonl");
    for (path, needle) in [(&bad, "line 1"), (&missing, "cannot open")] {
        let out = acct(&["routing", "--input", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2));
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_lists_the_four_subcommands() {
    let out = acct(&["--help"]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in ["account", "calibrate", "plan", "routing"] {
        assert!(text.contains(sub), "{text}");
    }
}

/// How `raptor` (crate `raptor`) embeds the subcommands: flattened beside its own.
mod embedding {
    use clap::{CommandFactory, Parser, Subcommand};

    #[derive(Parser)]
    struct Host {
        #[command(subcommand)]
        command: HostCommand,
    }

    #[derive(Subcommand)]
    enum HostCommand {
        /// A subcommand of the host program.
        Info,
        #[command(flatten)]
        Acct(raptor_cli::Command),
    }

    #[test]
    fn flattened_into_another_program_the_subcommands_parse() {
        Host::command().debug_assert();
        let host = Host::try_parse_from([
            "host",
            "calibrate",
            "--epsilon",
            "2",
            "--delta",
            "1e-5",
            "--q",
            "0.01",
            "--steps",
            "100",
        ])
        .unwrap();
        assert!(matches!(
            host.command,
            HostCommand::Acct(raptor_cli::Command::Calibrate(_))
        ));
        assert!(matches!(
            Host::try_parse_from(["host", "info"]).unwrap().command,
            HostCommand::Info
        ));
        let names: Vec<String> = Host::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        for sub in ["info", "account", "calibrate", "plan", "routing"] {
            assert!(names.iter().any(|n| n == sub), "{names:?}");
        }
    }
}
