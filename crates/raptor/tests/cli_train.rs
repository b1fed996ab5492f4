//! `raptor train` / `raptor eval` end to end on the toy data shipped in `examples/toy`: learning,
//! resume after SIGKILL, and bad input (exit code 2, no panic, nothing half-written).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn raptor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_raptor"))
        .args(args)
        .output()
        .unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("raptor-cli-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A config over the toy data with the given method and overrides (TOML lines per table).
fn config(dir: &Path, method: &str, steps: u64, extra_train: &str) -> PathBuf {
    let toy = root().join("examples/toy");
    let text = format!(
        r#"[data]
train = "{train}"
validation = "{valid}"
public = "{public}"
max_length = 40

[model]
kind = "switch"
tokenizer = "bytes"
d_model = 32
layers = 4
heads = 2
d_ff = 64
experts = 4

[method]
name = "{method}"

[privacy]
epsilon = 8.0

[train]
batch_size = 64.0
steps = {steps}
lr = 0.05
micro_batch = 64
checkpoint_every = 5
{extra_train}
"#,
        train = toy.join("train.csv").display(),
        valid = toy.join("valid.csv").display(),
        public = toy.join("public.csv").display(),
    );
    let p = dir.join(format!("{method}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

fn record(dir: &Path) -> serde_json::Value {
    let runs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    serde_json::from_slice(&std::fs::read(runs[0].join("record.json")).unwrap()).unwrap()
}

/// `lora` (non-private) and `raptor` at ε = 8 both learn the toy task well above chance
/// (the sampler and noise are seeded here: NOT private, for a reproducible test). A seeded run
/// is reproducible for a given libtorch thread count but its accuracy moves with it (summation
/// order; `cargo xtask test` runs with one thread): `lora` seed 7 reaches 0.79 with one thread
/// and 0.975 with two, seeds 8 and 9 0.895 and 0.97 with one. So `lora` is judged by the
/// median over three seeds, `raptor` (0.895 / 0.885) by one run.
#[test]
fn lora_and_raptor_learn_the_toy_task() {
    let d = tmp("learn");
    let mut lora_accs = Vec::new();
    for (method, seed, steps, min_acc) in [
        ("lora", 7u64, 60u64, 0.8),
        ("lora", 8, 60, 0.8),
        ("lora", 9, 60, 0.8),
        ("raptor", 7, 80, 0.7),
    ] {
        let runs = d.join(format!("{method}-{seed}"));
        let cfg = config(&d, method, steps, &format!("insecure_seed = {seed}"));
        let out = raptor(&[
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--runs-dir",
            runs.to_str().unwrap(),
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if method == "raptor" {
            // The start report says where the time before the first update went, RAPTOR's
            // layer choice on the public corpus and its owner maps included.
            let err = String::from_utf8_lossy(&out.stderr);
            let line = err
                .lines()
                .find(|l| l.trim_start().starts_with("prepared in "))
                .unwrap_or_else(|| panic!("no `prepared in` line:\n{err}"));
            for part in [
                "model ",
                "public routing ",
                "privacy plan ",
                "owner maps ",
                "probe ",
            ] {
                assert!(line.contains(part), "{part:?} missing from {line:?}");
            }
        }
        let rec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // What was computed from private records without noise is under private/, never in
        // the publishable record.
        let run_dir = std::fs::read_dir(&runs)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let on_disk: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run_dir.join("record.json")).unwrap()).unwrap();
        assert_eq!(on_disk, rec, "--json prints record.json");
        for private_key in [
            "metrics",
            "membership_inference",
            "diagnostics",
            "validation_metrics",
            "eval",
            "eval_curve",
        ] {
            assert!(
                rec.get(private_key).is_none(),
                "record.json has {private_key}"
            );
        }
        assert!(!run_dir.join("metrics.jsonl").exists());
        let private: serde_json::Value = serde_json::from_slice(
            &std::fs::read(run_dir.join("private").join("record.json")).unwrap(),
        )
        .unwrap();
        assert!(
            private["notice"]
                .as_str()
                .unwrap()
                .starts_with("not differentially private"),
            "{}",
            private["notice"]
        );
        // The validation file is not declared public: its metrics are private.
        assert_eq!(rec["validation"]["public"], false, "{}", rec["validation"]);
        assert_eq!(rec["validation"]["metrics_in"], "private/record.json");
        let acc = private["validation_metrics"]["eval"]["accuracy"]
            .as_f64()
            .unwrap();
        let per_update = std::fs::read_to_string(run_dir.join("private").join("metrics.jsonl"))
            .unwrap()
            .lines()
            .count() as u64;
        assert_eq!(per_update, steps);
        assert_eq!(private["metrics"].as_array().unwrap().len() as u64, steps);
        // summary.json: the run in brief for scripts, by the same rule (the private batches'
        // losses and the private validation records' metrics under private/).
        let read = |p: std::path::PathBuf| -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
        };
        let summary = read(run_dir.join("summary.json"));
        let private_summary = read(run_dir.join("private").join("summary.json"));
        assert_eq!(summary["method"], method);
        assert_eq!(summary["updates"].as_u64(), Some(steps));
        assert!(summary["peak_rss_mib"].as_f64().unwrap() > 0.0);
        assert_eq!(summary["epsilon"], rec["epsilon"]["upper"]);
        for key in ["accuracy", "loss", "eval_curve", "loss_curve", "snr"] {
            assert!(summary.get(key).is_none(), "summary.json has {key}");
        }
        assert_eq!(private_summary["accuracy"].as_f64(), Some(acc));
        assert_eq!(
            private_summary["loss_curve"].as_array().unwrap().len() as u64,
            steps
        );
        // The label set came from the private training file, and the record says so.
        assert!(
            rec["labels_source"]
                .as_str()
                .unwrap()
                .starts_with("read from the private training file"),
            "{}",
            rec["labels_source"]
        );
        assert!(
            rec["validation"]["source"]
                .as_str()
                .unwrap()
                .starts_with("the validation file"),
            "{}",
            rec["validation"]
        );
        // The loss-threshold attack ran on equal numbers of members and held-out records.
        let mia = &private["membership_inference"];
        let n = rec["train_records"]
            .as_u64()
            .unwrap()
            .min(private["validation_metrics"]["records"].as_u64().unwrap())
            .min(1000);
        assert_eq!(mia["members"].as_u64(), Some(n), "{mia}");
        assert_eq!(mia["non_members"].as_u64(), Some(n), "{mia}");
        let auc = mia["auc"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&auc), "{mia}");
        if method == "lora" {
            lora_accs.push(acc);
            if lora_accs.len() == 3 {
                lora_accs.sort_by(f64::total_cmp);
                assert!(
                    lora_accs[1] >= min_acc,
                    "lora: median validation accuracy over seeds 7-9 {} ({lora_accs:?}; chance 0.5)",
                    lora_accs[1]
                );
            }
        } else {
            assert!(
                acc >= min_acc,
                "{method}: validation accuracy {acc} (chance 0.5)"
            );
        }
        if method == "raptor" {
            let e = rec["epsilon"]["upper"].as_f64().unwrap();
            assert!(e <= 8.0 && e > 1.0, "epsilon {e}");
            assert!(rec["insecure_seeded"].as_bool().unwrap());
            assert!(
                rec["noise_source"]
                    .as_str()
                    .unwrap()
                    .starts_with("seeded (NOT private"),
                "{}",
                rec["noise_source"]
            );
            // Both streams train something; the diagnostics cover the chosen layer's 4 experts.
            let trainable = rec["trainable_parameters"].as_object().unwrap();
            assert_eq!(trainable.len(), 2, "{trainable:?}");
            assert!(trainable.values().all(|n| n.as_i64().unwrap() > 0));
            let diag = &private["diagnostics"];
            assert_eq!(diag["layer"], rec["layer"]["layer"], "{diag}");
            assert_eq!(diag["snr"].as_array().unwrap().len(), 4, "{diag}");
            let m_role = diag["role_mismatch"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&m_role), "{diag}");
            // eval on the test file agrees in kind
            let run = run_dir.clone();
            let test = root().join("examples/toy/test.csv");
            let ev = raptor(&[
                "eval",
                "--run",
                run.to_str().unwrap(),
                "--data",
                test.to_str().unwrap(),
                "--json",
            ]);
            assert!(
                ev.status.success(),
                "{}",
                String::from_utf8_lossy(&ev.stderr)
            );
            let m: serde_json::Value = serde_json::from_slice(&ev.stdout).unwrap();
            assert!(m["metrics"]["accuracy"].as_f64().unwrap() >= min_acc - 0.1);
        } else {
            assert!(
                rec["epsilon"].is_null(),
                "a non-private method reports no finite epsilon"
            );
            assert!(
                private["diagnostics"].is_null(),
                "diagnostics are for private runs"
            );
        }
    }
}

/// A run killed mid-training (real child process, SIGKILL) and resumed has a ledger with at
/// least as many steps as updates applied, and a final ε no smaller than an uninterrupted run.
#[test]
fn killed_and_resumed_run_never_undercounts() {
    let d = tmp("resume");
    let steps = 40u64;
    let cfg = config(&d, "dp-adam-lora", steps, "");
    // Uninterrupted.
    let full_runs = d.join("full");
    let out = raptor(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--runs-dir",
        full_runs.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let full = record(&full_runs);
    let full_eps = full["epsilon"]["upper"].as_f64().unwrap();
    // Killed.
    let runs = d.join("killed");
    let mut child = Command::new(env!("CARGO_BIN_EXE_raptor"))
        .args([
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--runs-dir",
            runs.to_str().unwrap(),
            "--json",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until some updates were charged, then kill.
    let start = std::time::Instant::now();
    loop {
        let charged = std::fs::read_dir(&runs)
            .ok()
            .and_then(|mut it| it.next())
            .and_then(|e| std::fs::read(e.ok()?.path().join("private").join("metrics.jsonl")).ok());
        if charged.is_some_and(|m| m.iter().filter(|&&b| b == b'\n').count() >= 12) {
            break;
        }
        assert!(
            start.elapsed().as_secs() < 300,
            "the child made no progress"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    let _ = child.wait();
    let run = std::fs::read_dir(&runs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(!run.join("record.json").exists());
    let ledger: raptor_accountant::Ledger =
        raptor_run::read_checked_json(&run.join("checkpoint/ledger.json")).unwrap();
    let state: serde_json::Value =
        raptor_run::read_checked_json(&run.join("checkpoint/state.json")).unwrap();
    let applied = state["update"].as_u64().unwrap();
    assert!(
        ledger.len() >= applied,
        "ledger {} < applied {applied}",
        ledger.len()
    );
    // A --config beside --resume that is not the run's own: refused, naming the field, and
    // the run folder is left as it was.
    let changed = d.join("changed");
    std::fs::create_dir_all(&changed).unwrap();
    let changed_cfg = config(&changed, "dp-adam-lora", steps + 5, "");
    let out = raptor(&[
        "train",
        "--config",
        changed_cfg.to_str().unwrap(),
        "--resume",
        run.to_str().unwrap(),
    ]);
    assert_bad(&out, "train.steps");
    assert!(!run.join("record.json").exists());
    let after: serde_json::Value =
        raptor_run::read_checked_json(&run.join("checkpoint/state.json")).unwrap();
    assert_eq!(after, state);
    // Resume (the stale lock of the killed process is taken over).
    let out = raptor(&["train", "--resume", run.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rec["updates"].as_u64().unwrap(), steps);
    assert_eq!(rec["resumed"].as_u64().unwrap(), 1);
    let eps = rec["epsilon"]["upper"].as_f64().unwrap();
    assert!(
        eps >= full_eps * (1.0 - 1e-12),
        "resumed {eps} < uninterrupted {full_eps}"
    );
    assert!(rec["epsilon"]["steps"].as_u64().unwrap() >= steps);
    // The run's own config beside --resume is accepted (the finished run is reported again).
    let out = raptor(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--resume",
        run.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["updates"].as_u64().unwrap(), steps);
}

fn assert_bad(out: &Output, needle: &str) {
    assert_eq!(
        out.status.code(),
        Some(2),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_input_is_a_clear_error_with_exit_code_2_and_nothing_written() {
    let d = tmp("bad");
    let runs = d.join("runs");
    let good = std::fs::read_to_string(config(&d, "raptor", 5, "")).unwrap();
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            write("typo.toml", &good.replace("batch_size", "batchsize")),
            "batchsize",
        ),
        (
            write("eps.toml", &good.replace("epsilon = 8.0", "epsilon = 0.0")),
            "privacy.epsilon",
        ),
        (
            write(
                "negeps.toml",
                &good.replace("epsilon = 8.0", "epsilon = -1.0"),
            ),
            "privacy.epsilon",
        ),
        (
            write(
                "big.toml",
                &good.replace("batch_size = 64.0", "batch_size = 100000.0"),
            ),
            "batch_size",
        ),
        (
            write(
                "missing.toml",
                &good.replace("train.csv", "no-such-file.csv"),
            ),
            "no-such-file.csv",
        ),
    ];
    for (cfg, needle) in cases {
        let out = raptor(&[
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--runs-dir",
            runs.to_str().unwrap(),
        ]);
        assert_bad(&out, needle);
        assert!(
            !runs.exists() || std::fs::read_dir(&runs).unwrap().next().is_none(),
            "a run folder was written for {}",
            cfg.display()
        );
    }
    // An empty dataset.
    let empty = write("empty.csv", "text,label\n");
    let out = raptor(&[
        "train",
        "--config",
        write(
            "empty.toml",
            &good.replace(
                &root().join("examples/toy/train.csv").display().to_string(),
                &empty.display().to_string(),
            ),
        )
        .to_str()
        .unwrap(),
        "--runs-dir",
        runs.to_str().unwrap(),
    ]);
    assert_bad(&out, "empty.csv");
    // A missing config file.
    assert_bad(
        &raptor(&["train", "--config", d.join("nope.toml").to_str().unwrap()]),
        "nope.toml",
    );
}

#[test]
fn eval_with_an_unseen_label_is_an_error() {
    let d = tmp("unseen");
    let runs = d.join("runs");
    let cfg = config(&d, "lora", 3, "");
    let out = raptor(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--runs-dir",
        runs.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = std::fs::read_dir(&runs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bad = d.join("bad.csv");
    std::fs::write(&bad, "text,label\ngood film,positive\nodd film,neutral\n").unwrap();
    let out = raptor(&[
        "eval",
        "--run",
        run.to_str().unwrap(),
        "--data",
        bad.to_str().unwrap(),
    ]);
    assert_bad(&out, "neutral");
}

#[test]
fn print_default_config_parses() {
    let out = raptor(&["train", "--print-default-config"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("[privacy]"));
    let parsed = raptor_train::config::RunConfig::from_toml(&text).unwrap();
    assert_eq!(parsed, raptor_train::config::RunConfig::default());
}

/// `raptor info --json` is one JSON object whose versions come from the build and the loaded
/// libtorch (not constants that could drift from what actually runs).
#[test]
fn info_json_reports_the_loaded_versions() {
    let out = raptor(&["info", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tch"], "0.24.0");
    let lt = v["libtorch"].as_str().unwrap();
    assert!(lt.starts_with("2.11.0"), "{lt}");
    assert_eq!(v["cuda_linked"].as_bool(), Some(raptor_models::CUDA_LINKED));
    let build = if raptor_models::CUDA_LINKED {
        "cuda"
    } else {
        "cpu"
    };
    assert_eq!(v["libtorch_build"], build);
    if build == "cpu" {
        // A CPU-only build can never report a usable GPU.
        assert_eq!(v["cuda_available"].as_bool(), Some(false));
        assert_eq!(v["cuda_devices"].as_i64(), Some(0));
    }
    assert!(v["cuda_devices"].as_i64().is_some());
}

/// `raptor reproduce` runs the `raptor-reproduce` program beside `raptor` with the arguments
/// unchanged (`--help` included) and exits with its code; without that program it is a clear
/// error (exit code 2, no panic) that names the command building it. (The driver itself is
/// tested in the `raptor-reproduce` crate.)
#[test]
fn reproduce_forwards_to_the_program_beside_raptor() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let exe = dir.path().join("raptor");
    // A hard link keeps the path this process sees as its own (`current_exe`); a copy where
    // the temporary folder is on another file system.
    if std::fs::hard_link(env!("CARGO_BIN_EXE_raptor"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_raptor"), &exe).unwrap();
    }
    let run = |args: &[&str]| Command::new(&exe).args(args).output().unwrap();
    let o = run(&["reproduce", "--only", "environment"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("raptor-reproduce")
            && err.contains("cargo build -p raptor-reproduce")
            && !err.contains("panicked"),
        "{err}"
    );
    // A stand-in program that prints its arguments, one a line, and exits with 7.
    let fake = dir.path().join("raptor-reproduce");
    std::fs::write(
        &fake,
        "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\nexit 7\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let args = [
        "--quick",
        "--only",
        "accountant",
        "--out",
        "a b",
        "--help",
        "--json",
    ];
    let o = run(&[&["reproduce"][..], &args[..]].concat());
    assert_eq!(
        o.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let printed: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(printed, args);
    // No arguments at all pass through too.
    let o = run(&["reproduce"]);
    assert_eq!(o.status.code(), Some(7));
    assert!(o.stdout.is_empty());
    // The worker subcommand moved to `raptor-reproduce`.
    assert_eq!(run(&["reproduce-run"]).status.code(), Some(2));
}

/// Every checkpoint file carries a checksum that resume verifies: a flipped byte in the
/// trainable tensors, the optimizer state, the state file or the ledger is an error naming the
/// file (exit code 2), never a silently different model or a shorter ledger (an under-reported
/// ε). Only the newest checkpoint's tensor files are kept.
#[test]
fn a_flipped_byte_in_any_checkpoint_file_is_a_clear_error() {
    let d = tmp("checksum");
    let runs = d.join("runs");
    let cfg = config(&d, "dp-adam", 10, "insecure_seed = 3");
    let out = raptor(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--runs-dir",
        runs.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = std::fs::read_dir(&runs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let ck = run.join("checkpoint");
    let state: serde_json::Value = raptor_run::read_checked_json(&ck.join("state.json")).unwrap();
    assert_eq!(state["update"].as_u64(), Some(10));
    let mut files: Vec<String> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "ledger.json",
            "optimizer-10.safetensors",
            "state.json",
            "trainable-10.safetensors"
        ],
        "the checkpoint at update 5 was replaced"
    );
    // A resume of the intact run succeeds (nothing left to train).
    let ok = raptor(&["train", "--resume", run.to_str().unwrap(), "--json"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    for (file, at) in [
        ("trainable-10.safetensors", 0.9),
        ("optimizer-10.safetensors", 0.9),
        ("state.json", 0.0),
        ("ledger.json", 0.0),
    ] {
        let path = ck.join(file);
        let original = std::fs::read(&path).unwrap();
        let mut bytes = original.clone();
        // JSON: change a digit (still valid JSON, a different number); tensors: a data byte.
        let i = if at == 0.0 {
            let content = original
                .windows(9)
                .position(|w| w == b"\"content\"")
                .unwrap();
            content
                + bytes[content..]
                    .iter()
                    .position(|b| b.is_ascii_digit() && *b != b'9')
                    .unwrap()
        } else {
            (bytes.len() as f64 * at) as usize
        };
        bytes[i] = if at == 0.0 {
            bytes[i] + 1
        } else {
            bytes[i] ^ 0x10
        };
        std::fs::write(&path, &bytes).unwrap();
        let out = raptor(&["train", "--resume", run.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{file}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(file) && err.contains("corrupt"),
            "{file}: {err}"
        );
        std::fs::write(&path, &original).unwrap();
    }
}
