//! Nothing computed from private records without noise leaves a run folder outside `private/`:
//! a unique string planted in training records and in validation records (held out of the
//! training file, or a separate validation file not declared public) appears nowhere in the run
//! folder outside `private/`, in what `raptor train` prints, or in `raptor export`'s output; the
//! validation metrics are in `record.json` only when the validation file is declared public.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The planted string: unique, and made of bytes the toy texts never hold.
const SECRET: &str = "qzxplantedsecretvkw";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn raptor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_raptor"))
        .env("OMP_NUM_THREADS", "1")
        .args(args)
        .output()
        .unwrap()
}

/// Copies the CSV `from` to `to` with `SECRET` put into every fifth record's first column (so
/// that both sides of a held-out split get some).
fn planted_csv(from: &Path, to: &Path) {
    let text = std::fs::read_to_string(from).unwrap();
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        if i > 0 && i % 5 == 0 {
            if let Some(rest) = line.strip_prefix('"') {
                out.push_str(&format!("\"{SECRET} {rest}"));
            } else {
                out.push_str(&format!("{SECRET} {line}"));
            }
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    assert!(out.contains(SECRET));
    std::fs::write(to, out).unwrap();
}

/// Every file under `dir` (recursively) except those under a folder named `private`.
fn public_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "private") {
                continue;
            }
            out.extend(public_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Fails naming the file when `SECRET` appears in a file under `dir` outside `private/`; returns
/// how many files were read.
fn assert_no_secret(dir: &Path) -> usize {
    let files = public_files(dir);
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        assert!(
            !contains(&bytes, SECRET.as_bytes()),
            "{} holds a private record's text",
            f.display()
        );
    }
    files.len()
}

fn the_run(runs: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.pop().unwrap()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Trains `config` (written into `dir`), checks the run folder and the program's output, and
/// returns the run folder and its (publishable) record.
fn train_and_check(dir: &Path, config: &str) -> (PathBuf, serde_json::Value) {
    let cfg = dir.join("run.toml");
    std::fs::write(&cfg, config).unwrap();
    let runs = dir.join("runs");
    let out = raptor(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--runs-dir",
        runs.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (what, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        assert!(
            !contains(text, SECRET.as_bytes()),
            "raptor train's {what} holds a private record's text"
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("/private/"),
        "the end of run names private/: {stdout}"
    );
    let run = the_run(&runs);
    assert!(assert_no_secret(&run) >= 3);
    // The private folder is where the text went (the test can see a leak).
    let record = json(&run.join("record.json"));
    (run, record)
}

const TOY_MODEL: &str = r#"[model]
kind = "switch"
tokenizer = "bytes"
d_model = 32
layers = 2
heads = 2
d_ff = 64
experts = 4
"#;

/// Classification: records held out of the training file, and a separate validation file (not
/// declared public, then declared public). The export of the separate-file run holds no record
/// text either.
#[test]
fn classification_runs_publish_no_private_value_or_text() {
    let d = tempfile::tempdir().unwrap();
    let toy = root().join("examples/toy");
    let (train, valid) = (d.path().join("train.csv"), d.path().join("valid.csv"));
    planted_csv(&toy.join("train.csv"), &train);
    planted_csv(&toy.join("valid.csv"), &valid);
    let run_config = |data: &str| {
        format!(
            "[data]\ntrain = \"{}\"\n{data}\nmax_length = 40\n\n{TOY_MODEL}\n[method]\nname = \"dp-adam\"\nscope = \"full\"\n\n[privacy]\nepsilon = 8.0\n\n[train]\nbatch_size = 32.0\nsteps = 2\nmicro_batch = 32\ninsecure_seed = 1\n",
            train.display()
        )
    };
    let cases = [
        ("held-out", "validation_fraction = 0.2".to_string(), false),
        (
            "separate",
            format!("validation = \"{}\"", valid.display()),
            false,
        ),
        (
            "public",
            format!(
                "validation = \"{}\"\nvalidation_public = true",
                valid.display()
            ),
            true,
        ),
    ];
    for (name, data, public) in cases {
        let dir = d.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let (run, rec) = train_and_check(&dir, &run_config(&data));
        assert_eq!(rec["validation"]["public"], public, "{name}: {rec}");
        let private = json(&run.join("private").join("record.json"));
        if public {
            assert_eq!(rec["validation"]["metrics_in"], "record.json", "{name}");
            assert!(rec["validation_metrics"]["eval"]["accuracy"].is_number());
            assert!(private["validation_metrics"].is_null(), "{name}");
        } else {
            assert_eq!(rec["validation"]["metrics_in"], "private/record.json");
            for key in ["validation_metrics", "eval", "eval_curve", "generation"] {
                assert!(rec.get(key).is_none(), "{name}: record.json has {key}");
            }
            assert!(
                private["validation_metrics"]["eval"]["accuracy"].is_number(),
                "{name}: {private}"
            );
        }
        if name == "separate" {
            let out = dir.join("export");
            let o = raptor(&[
                "export",
                "--run",
                run.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert!(assert_no_secret(&out) >= 2);
            assert!(
                !out.join("private").exists(),
                "an export never includes private/"
            );
        }
    }
}

/// Data-to-text: the generation samples (source, generated text, reference) are record text,
/// so they go to the private record only, and the BLEU / NLL of held-out records with them.
#[test]
fn data_to_text_runs_publish_no_generated_or_source_text() {
    let d = tempfile::tempdir().unwrap();
    let train = d.path().join("train.csv");
    let mut text = String::from("mr,ref\n");
    // Every record names the secret, so every generation sample's source holds it.
    for i in 0..120 {
        let name = format!("Place{}", i % 7);
        text.push_str(&format!(
            "\"name[{name}], food[Thai], near[{SECRET}]\",\"{name} serves Thai food near {SECRET}.\"\n"
        ));
    }
    std::fs::write(&train, text).unwrap();
    let config = format!(
        r#"[data]
format = "e2e"
train = "{}"
validation_fraction = 0.3
max_length = 80

[model]
kind = "gpt2"
tokenizer = "bytes"
d_model = 32
layers = 1
heads = 2
d_ff = 64

[method]
name = "dp-adam"
scope = "full"

[privacy]
epsilon = 8.0

[train]
batch_size = 16.0
steps = 2
micro_batch = 16
insecure_seed = 2

[eval]
beams = 1
max_new_tokens = 8
max_sources = 5
"#,
        train.display()
    );
    let (run, rec) = train_and_check(d.path(), &config);
    assert!(rec.get("generation").is_none() && rec.get("validation_metrics").is_none());
    let private = json(&run.join("private").join("record.json"));
    assert!(private["validation_metrics"]["generation"]["bleu"].is_number());
    let samples = private["generation_samples"].as_array().unwrap();
    assert!(!samples.is_empty());
    // The planted text reached the private samples: a leak would have been seen.
    let all = serde_json::to_string(samples).unwrap();
    assert!(all.contains(SECRET), "{all}");
}
