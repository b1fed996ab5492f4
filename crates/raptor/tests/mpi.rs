//! Data-parallel private training over MPI (cargo feature `mpi`; `cargo xtask test` enables it
//! when an MPI library is installed, which `.ci/run` ensures): `mpirun -np 2` trains the same
//! parameters as one process, the ledger has exactly one entry per release, only rank 0 writes,
//! and a rank that dies ends the whole job with a non-zero status and the checkpoint intact.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

// The trainer tests' shared helpers (one copy, in raptor-train's tests).
#[path = "../../raptor-train/tests/common/mod.rs"]
mod common;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("raptor-mpi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A seeded (NOT private) toy config, so one process and two ranks draw the same samples and
/// the same noise.
fn config(dir: &Path, method: &str, steps: u64) -> PathBuf {
    let text = common::toy_config(
        method,
        &format!(
            "batch_size = 32.0\nsteps = {steps}\nlr = 0.02\nmicro_batch = 16\ncheckpoint_every = 5\ninsecure_seed = 11"
        ),
    );
    let p = dir.join(format!("{method}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

/// `mpirun -np <n> raptor <args>` (root allowed: CI containers run as root; oversubscribing
/// allowed: the CI machine has 2 cores).
fn mpirun(n: usize, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(n.to_string())
        .arg(env!("CARGO_BIN_EXE_raptor"))
        .args(args)
        .env("OMP_NUM_THREADS", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .expect("mpirun not found: the `mpi` feature needs Open MPI (openmpi-bin) on PATH")
}

fn single(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_raptor"))
        .args(args)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap()
}

fn only_run(dir: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(
        runs.len(),
        1,
        "exactly one run folder (only rank 0 writes): {runs:?}"
    );
    runs.into_iter().next().unwrap()
}

fn params(run: &Path) -> BTreeMap<String, Vec<f32>> {
    raptor_run::checkpoint_tensors(run)
        .unwrap()
        .into_iter()
        .map(|(name, t)| {
            let v = Vec::<f32>::try_from(t.to_kind(tch::Kind::Float).flatten(0, -1)).unwrap();
            (name, v)
        })
        .collect()
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed ({}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Two ranks train RAPTOR (shared stream + one expert stream per expert, parallel composition)
/// to the same parameters as one process (to 1e-5 relative: only the summation order of the
/// clipped sums differs), with the identical ledger: one entry per update, charged once.
#[test]
fn two_ranks_match_one_process() {
    let d = tmp("match");
    let cfg = config(&d, "raptor", 8);
    let (one, two) = (d.join("one"), d.join("two"));
    let o = single(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--runs-dir",
        one.to_str().unwrap(),
    ]);
    ok(&o, "one process");
    let o = mpirun(
        2,
        &[
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--runs-dir",
            two.to_str().unwrap(),
        ],
        &[],
    );
    ok(&o, "mpirun -np 2");
    // Only rank 0 prints the summary.
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.matches("run folder:").count(), 1, "{out}");
    let (r1, r2) = (only_run(&one), only_run(&two));
    let (p1, p2) = (params(&r1), params(&r2));
    assert_eq!(p1.keys().collect::<Vec<_>>(), p2.keys().collect::<Vec<_>>());
    let mut worst = 0.0f64;
    let mut moved = 0.0f64;
    for (name, a) in &p1 {
        let b = &p2[name];
        assert_eq!(a.len(), b.len(), "{name}");
        let scale = a.iter().map(|x| x.abs() as f64).fold(1e-3, f64::max);
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((*x as f64 - *y as f64).abs() / scale);
            moved = moved.max(x.abs() as f64);
        }
    }
    assert!(
        moved > 0.0,
        "the parameters never moved: nothing was compared"
    );
    assert!(worst <= 1e-5, "largest relative difference {worst:e}");
    let l1: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r1.join("checkpoint/ledger.json")).unwrap()).unwrap();
    let l2: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r2.join("checkpoint/ledger.json")).unwrap()).unwrap();
    assert_eq!(l1, l2, "the ledgers differ");
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r2.join("record.json")).unwrap()).unwrap();
    let e1: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r1.join("record.json")).unwrap()).unwrap();
    assert_eq!(rec["epsilon"]["steps"], e1["epsilon"]["steps"]);
    assert_eq!(
        rec["epsilon"]["steps"].as_u64(),
        Some(8),
        "one ledger entry per update"
    );
    assert_eq!(rec["epsilon"]["upper"], e1["epsilon"]["upper"]);
    // The same samples were drawn: the per-update sample sizes agree (private metrics).
    let private = |run: &std::path::Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(run.join("private").join("record.json")).unwrap())
            .unwrap()
    };
    let sizes = |r: &serde_json::Value| -> Vec<u64> {
        r["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["sampled"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(sizes(&private(&r2)), sizes(&private(&r1)));
    let notes = rec["notes"].to_string();
    assert!(notes.contains("data-parallel over 2 MPI ranks"), "{notes}");
}

/// A rank that dies mid-run ends the whole job with a non-zero status; the checkpoint rank 0
/// wrote before is intact, and the run resumes from it to the end.
#[test]
fn a_dying_rank_ends_the_job_and_the_checkpoint_survives() {
    let d = tmp("fault");
    let cfg = config(&d, "dp-adam", 10);
    let runs = d.join("runs");
    let o = mpirun(
        2,
        &[
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--runs-dir",
            runs.to_str().unwrap(),
        ],
        &[("RAPTOR_MPI_FAULT", "1:7")],
    );
    assert!(!o.status.success(), "the job survived a dead rank");
    let run = only_run(&runs);
    let state: serde_json::Value =
        raptor_run::read_checked_json(&run.join("checkpoint/state.json")).unwrap();
    assert_eq!(state["update"].as_u64(), Some(5), "{state}");
    assert!(!run.join("record.json").exists());
    // mpirun may return while it is still killing rank 0 (which holds the run folder's lock):
    // wait for that process to be gone, as a user would.
    if let Ok(pid) = std::fs::read_to_string(run.join("lock")) {
        let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
        let t0 = std::time::Instant::now();
        while proc_dir.exists() && t0.elapsed() < std::time::Duration::from_secs(60) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    // The checkpoint is whole: a single process resumes it and finishes.
    let o = single(&["train", "--resume", run.to_str().unwrap()]);
    ok(&o, "resume");
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("record.json")).unwrap()).unwrap();
    assert_eq!(rec["updates"].as_u64(), Some(10));
    assert!(rec["epsilon"]["steps"].as_u64().unwrap() >= 10);
}

/// A rank that panics (a bug in the program rather than a crash) ends the whole job too, and
/// quickly: `Mpi::init`'s panic hook calls `MPI_Abort`. Without it the panicking rank unwinds
/// alone while the other waits forever in its next collective; the test gives the job 180 s
/// and kills it (and fails) after that.
#[test]
fn a_panicking_rank_ends_the_job_instead_of_hanging() {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let d = tmp("panic");
    let cfg = config(&d, "dp-adam", 10);
    let runs = d.join("runs");
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(env!("CARGO_BIN_EXE_raptor"))
        .args([
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--runs-dir",
            runs.to_str().unwrap(),
        ])
        .env("OMP_NUM_THREADS", "1")
        .env("RAPTOR_MPI_FAULT", "1:7:panic")
        // Files, not pipes: nobody reads a pipe while the test waits.
        .stdout(Stdio::from(
            std::fs::File::create(d.join("stdout")).unwrap(),
        ))
        .stderr(Stdio::from(
            std::fs::File::create(d.join("stderr")).unwrap(),
        ))
        // Its own process group, so that a hung job can be killed whole.
        .process_group(0);
    let mut child = cmd.spawn().expect("mpirun not found");
    let t0 = std::time::Instant::now();
    let limit = std::time::Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let pgid = child.id() as libc::pid_t;
            // SAFETY: kill(2) on the process group this test started.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let _ = child.wait();
            panic!("the job hung for {limit:?} after a rank panicked");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let err = std::fs::read_to_string(d.join("stderr")).unwrap();
    assert!(!status.success(), "the job survived a panicking rank");
    assert!(
        err.contains("panics before update 7") && err.contains("MPI_Abort"),
        "the panic and the abort are reported:\n{err}"
    );
    let run = only_run(&runs);
    let state: serde_json::Value =
        raptor_run::read_checked_json(&run.join("checkpoint/state.json")).unwrap();
    assert_eq!(state["update"].as_u64(), Some(5), "{state}");
    assert!(!run.join("record.json").exists());
}

/// An MPMD launch of two ranks: rank 0 trains with config `a`, rank 1 with config `b`.
fn mpmd_train(a: &Path, b: &Path, runs: &Path) -> Output {
    let rank = |cfg: &Path| -> Vec<String> {
        vec![
            env!("CARGO_BIN_EXE_raptor").to_string(),
            "train".into(),
            "--config".into(),
            cfg.display().to_string(),
            "--runs-dir".into(),
            runs.display().to_string(),
        ]
    };
    Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "1"])
        .args(rank(a))
        .args([":", "-np", "1"])
        .args(rank(b))
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap()
}

/// Ranks that built different frozen weights (here: another initialization seed) are refused
/// before any update, instead of averaging gradients of different models.
#[test]
fn ranks_with_different_models_are_refused() {
    let d = tmp("mismatch");
    let a = config(&d, "dp-adam", 4);
    let text = std::fs::read_to_string(&a)
        .unwrap()
        .replace("[train]\n", "[train]\nseed = 99\n");
    let b = d.join("other-seed.toml");
    std::fs::write(&b, text).unwrap();
    let o = mpmd_train(&a, &b, &d.join("runs"));
    assert!(
        !o.status.success(),
        "ranks with different models trained together"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("different model than rank 0"), "{err}");
}

/// Ranks whose training sets differ (rank 0 holds one record more, the last one) are refused
/// as soon as rank 0 samples a record the other rank does not have, with an error naming the
/// cause, instead of indexing past the end of rank 1's data.
#[test]
fn ranks_with_different_training_sets_are_refused() {
    let d = tmp("datasets");
    let toy = std::fs::read_to_string(common::root().join("examples/toy/train.csv")).unwrap();
    let lines: Vec<&str> = toy.lines().collect();
    // header + 40 records for rank 1; rank 0 also has the 41st (index 40).
    let small = lines[..41].join("\n") + "\n";
    let large = lines[..42].join("\n") + "\n";
    std::fs::write(d.join("small.csv"), small).unwrap();
    std::fs::write(d.join("large.csv"), large).unwrap();
    let base = config(&d, "dp-adam", 6);
    let text = std::fs::read_to_string(&base).unwrap();
    let train = common::root().join("examples/toy/train.csv");
    let with = |file: &str, name: &str| -> PathBuf {
        let t = text.replace(
            &format!("train = \"{}\"", train.display()),
            &format!("train = \"{}\"", d.join(file).display()),
        );
        assert_ne!(t, text, "the config names the toy training file");
        let p = d.join(name);
        std::fs::write(&p, t).unwrap();
        p
    };
    let a = with("large.csv", "large.toml");
    let b = with("small.csv", "small.toml");
    let o = mpmd_train(&a, &b, &d.join("runs"));
    assert!(
        !o.status.success(),
        "ranks with different training sets trained together"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("sampled record 40 of 40: the ranks hold different training sets"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
