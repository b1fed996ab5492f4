//! `RAPTOR_WISDOM` pointing at a corrupt file: ignored with a warning, never a panic, and a
//! file that is not wisdom is never overwritten. (Its own process: the variable is read once.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[test]
fn corrupt_env_wisdom_is_ignored_with_a_warning_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let garbage = "my precious notes\n\u{0}\u{fffd}\tnot wisdom\n";
    std::fs::write(&path, garbage).unwrap();
    // SAFETY: the only test in this process; no other thread reads the environment yet.
    unsafe { std::env::set_var(raptor_plan::WISDOM_ENV, &path) };
    assert_eq!(raptor_plan::lookup("clip b2^8 p2^20 s1 g1 t2"), None);
    let w = raptor_plan::warnings();
    assert!(
        w.iter()
            .any(|m| m.contains("ignoring") && m.contains("not overwriting")),
        "{w:?}"
    );
    raptor_plan::remember("some class", "some-choice");
    assert_eq!(
        raptor_plan::lookup("some class").as_deref(),
        Some("some-choice")
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), garbage);
}
