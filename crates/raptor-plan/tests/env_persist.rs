//! `RAPTOR_WISDOM` pointing at a missing file: created on the first choice, rewritten on each
//! new one, and readable back. (Its own process: the variable is read once.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[test]
fn env_wisdom_file_is_written_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wisdom");
    // SAFETY: the only test in this process; no other thread reads the environment yet.
    unsafe { std::env::set_var(raptor_plan::WISDOM_ENV, &path) };
    assert_eq!(raptor_plan::lookup("k1"), None);
    assert!(!path.exists());
    raptor_plan::remember("k1", "rows(8)");
    raptor_plan::remember("k2", "two-pass");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with(raptor_plan::WISDOM_HEADER));
    assert!(text.contains("k1\trows(8)\n") && text.contains("k2\ttwo-pass\n"));
    raptor_plan::forget("");
    assert_eq!(raptor_plan::lookup("k1"), None);
    assert_eq!(raptor_plan::load_wisdom(&path).unwrap(), 2);
    assert_eq!(raptor_plan::lookup("k2").as_deref(), Some("two-pass"));
    assert!(raptor_plan::warnings().is_empty());
}
