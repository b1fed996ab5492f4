//! Arbitrary bytes never make the run-config parser panic or hang (a stable proptest fuzz harness,
//! as in `raptor-data`; long runs in `docs/fuzzing.md`): random bytes, and the example configs with
//! bytes spliced in, through `RunConfig::from_toml` and the config's own validation. Brief by
//! default; `RAPTOR_FUZZ_CASES=N` for a long run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use raptor_config::RunConfig;
use raptor_testkit::fuzz;

/// The example configs shipped in `examples/`.
fn examples() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "toml").then(|| std::fs::read_to_string(p).ok())?
        })
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no example configs in {}", dir.display());
    v
}

fn check(text: &str) {
    if let Ok(cfg) = RunConfig::from_toml(text) {
        let _ = cfg.validate();
        let _ = cfg.to_toml();
    }
}

proptest! {
    #![proptest_config(fuzz::config(2000))]

    #[test]
    fn run_config(
        which in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        cut in any::<prop::sample::Index>(),
        splice in proptest::collection::vec(
            prop::sample::select(b"[]=\"'.,-+0123456789eEinfnatrue\n #{}_\\\xff".to_vec()), 0..40),
        raw in fuzz::arbitrary_bytes(0..300),
    ) {
        thread_local!(static EX: Vec<String> = examples());
        let base = EX.with(|e| e[which.index(e.len())].clone()).into_bytes();
        // Splice bytes into an example at a random place, removing a random stretch.
        let i = at.index(base.len() + 1);
        let j = (i + cut.index(32)).min(base.len());
        let mut m = base[..i].to_vec();
        m.extend_from_slice(&splice);
        m.extend_from_slice(&base[j..]);
        check(&String::from_utf8_lossy(&m));
        check(&String::from_utf8_lossy(&raw));
    }
}
