//! Tables: Markdown (snapshot), JSON round trip, checks and atomic writes.

use raptor_report::{ReportError, Table, estimate};

fn sample() -> Result<Table, ReportError> {
    let raptor = estimate(&[81.04, 82.31, 80.52])?;
    let adam = estimate(&[78.9, 80.2, 79.4])?;
    let single = estimate(&[77.25])?;
    Ok(Table {
        slug: "sst2-accuracy".into(),
        title: "SST-2 accuracy (%), ε = 8".into(),
        columns: vec!["method".into(), "accuracy".into(), "seeds".into()],
        rows: vec![
            vec!["RAPTOR".into(), raptor.fmt(1), raptor.n.to_string()],
            vec!["DP-Adam | LoRA".into(), adam.fmt(1), adam.n.to_string()],
            vec!["DP-SGD\nfull".into(), single.fmt(2), single.n.to_string()],
        ],
        notes: vec![
            "mean ± 95 % Student-t half-width over seeds".into(),
            "one seed: no interval".into(),
        ],
    })
}

#[test]
fn markdown_snapshot() -> Result<(), ReportError> {
    insta::assert_snapshot!(sample()?.to_markdown());
    Ok(())
}

#[test]
fn markdown_layout_without_notes() {
    let table = Table {
        slug: "t".into(),
        title: "T".into(),
        columns: vec!["a".into(), "b".into()],
        rows: vec![vec!["1".into(), "x|y".into()]],
        notes: vec![],
    };
    assert_eq!(
        table.to_markdown(),
        "## T\n\n| a | b |\n|---|---|\n| 1 | x\\|y |\n"
    );
}

#[test]
fn json_round_trip() -> Result<(), ReportError> {
    let table = sample()?;
    let json = serde_json::to_string_pretty(&table)?;
    let back: Table = serde_json::from_str(&json)?;
    assert_eq!(back, table);
    Ok(())
}

#[test]
fn check_rejects_bad_slugs_and_ragged_rows() -> Result<(), ReportError> {
    let good = sample()?;
    good.check()?;
    for slug in ["", "Upper", "with space", "under_score", "dot.md", "é"] {
        let table = Table {
            slug: slug.into(),
            ..good.clone()
        };
        let err = table.check().err();
        assert!(
            matches!(err, Some(ReportError::InvalidTable { .. })),
            "slug {slug:?}: {err:?}"
        );
    }
    let mut ragged = good.clone();
    ragged.rows[1].pop();
    match ragged.check() {
        Err(ReportError::InvalidTable { reason, .. }) => {
            assert!(reason.contains("row 1 has 2 cells, expected 3"), "{reason}");
        }
        other => panic!("ragged row accepted: {other:?}"),
    }
    let mut long = good.clone();
    long.rows[0].push("extra".into());
    assert!(long.check().is_err());
    let no_columns = Table {
        columns: vec![],
        rows: vec![],
        ..good
    };
    assert!(no_columns.check().is_err());
    Ok(())
}

#[test]
fn write_creates_dir_and_both_files_atomically() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("nested").join("tables");
    let table = sample()?;
    table.write(&dir)?;
    let md = std::fs::read_to_string(dir.join("sst2-accuracy.md"))?;
    assert_eq!(md, table.to_markdown());
    let json = std::fs::read_to_string(dir.join("sst2-accuracy.json"))?;
    assert!(
        json.contains("\n  \"slug\": \"sst2-accuracy\""),
        "not pretty: {json}"
    );
    let back: Table = serde_json::from_str(&json)?;
    assert_eq!(back, table);
    // Overwriting works and leaves no temporary file behind.
    let mut changed = table.clone();
    changed.notes.push("rewritten".into());
    changed.write(&dir)?;
    assert!(std::fs::read_to_string(dir.join("sst2-accuracy.md"))?.ends_with("- rewritten\n"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    assert_eq!(names, ["sst2-accuracy.json", "sst2-accuracy.md"]);
    Ok(())
}

#[test]
fn write_rejects_invalid_table_before_touching_disk() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("out");
    let bad = Table {
        slug: "Bad".into(),
        ..sample()?
    };
    assert!(matches!(
        bad.write(&dir),
        Err(ReportError::InvalidTable { .. })
    ));
    assert!(!dir.exists());
    Ok(())
}

#[test]
fn write_reports_io_errors() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x")?;
    // A folder cannot be created under a file.
    let err = sample()?.write(&file.join("sub")).err();
    assert!(matches!(err, Some(ReportError::Io { .. })), "{err:?}");
    Ok(())
}
