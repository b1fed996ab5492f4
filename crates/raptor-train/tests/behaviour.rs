//! Behaviour pinned across refactors: seeded toy runs of every training family (RAPTOR
//! alternating and simultaneous, its baselines, the monolithic DP methods, DP-Muon and
//! DP-MuonBC, and a non-private reference), each summarized by its privacy plan (q, σ per
//! release kind, updates), its certified ε and its validation loss after training.
//!
//! The runs use `insecure_seed`, so the sampler, the noise and the initialization are fixed:
//! any change to what a release adds, in which order noise is drawn, which parameters a stream
//! owns, how a plan is calibrated or how the ledger is charged moves at least one number here.
//! Values are rounded (σ and ε to 6 significant digits, the loss to 4) so that another CPU's
//! floating-point round-off cannot move them. A change that is meant to alter behaviour updates
//! the snapshot in the same commit and says why.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;

use raptor_train::config::RunConfig;

mod common;

/// `x` to `digits` significant digits, as text.
fn sig(x: f64, digits: usize) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    if x == 0.0 {
        return "0".into();
    }
    format!("{:.*e}", digits - 1, x)
}

/// The toy config of `method` on `kind` with `extra` appended to `[method]`.
fn config(kind: &str, method: &str, extra: &str) -> RunConfig {
    let text = common::toy_config(
        method,
        "batch_size = 32.0\nsteps = 4\nlr = 0.05\nmicro_batch = 32\ninsecure_seed = 11",
    )
    .replace("kind = \"switch\"", &format!("kind = \"{kind}\""))
    .replace(
        &format!("name = \"{method}\"\n"),
        &format!("name = \"{method}\"\n{extra}\n"),
    );
    RunConfig::from_toml(&text).unwrap()
}

/// One line per run: the plan, the certified ε and the validation loss.
fn summary(kind: &str, method: &str, extra: &str) -> String {
    let cfg = config(kind, method, extra);
    let d = tempfile::tempdir().unwrap();
    let (_, rec) = common::train_quietly(&cfg, &d.path().join("run")).unwrap();
    let plan = &rec.privacy_plan;
    let sigmas: Vec<String> = plan
        .sigmas
        .iter()
        .map(|(k, v)| format!("{k}={}", sig(v, 6)))
        .collect();
    let phases: Vec<String> = plan
        .phase_updates
        .iter()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect();
    let eps = rec.epsilon.as_ref().map_or("none".to_string(), |e| {
        format!("{} ({} releases)", sig(e.upper, 6), e.releases)
    });
    let eval = rec.eval().expect("the toy runs have a validation file");
    format!(
        "{kind} {method} [{extra}]\n  q={} updates={} phases=[{}] split={}\n  sigmas=[{}] planned={}\n  eps={eps} loss={} acc={}\n",
        sig(plan.q, 6),
        plan.updates,
        phases.join(" "),
        plan.split,
        sigmas.join(" "),
        sig(plan.planned_epsilon, 6),
        sig(eval.loss, 4),
        eval.accuracy.map_or("-".to_string(), |a| sig(a, 4)),
    )
}

/// The families run on the toy Switch encoder (and Llama for the DP-Muon family), pinned.
#[test]
fn seeded_runs_of_every_family_are_unchanged() {
    let cases: [(&str, &str, &str); 11] = [
        ("switch", "raptor", ""),
        ("switch", "raptor", "alternate = false"),
        ("switch", "shared-only", ""),
        ("switch", "expert-only", ""),
        ("switch", "matched-scope", ""),
        ("switch", "dp-adam-lora", ""),
        ("switch", "dp-sgd", ""),
        ("switch", "lora", ""),
        ("llama", "dp-adam", ""),
        ("llama", "dp-muon", "scope = \"full\""),
        ("llama", "dp-muonbc", "scope = \"full\""),
    ];
    let mut out = String::new();
    for (kind, method, extra) in cases {
        write!(out, "{}", summary(kind, method, extra)).unwrap();
    }
    insta::assert_snapshot!(out);
}
