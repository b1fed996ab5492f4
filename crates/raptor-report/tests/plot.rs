//! Plots: valid PNGs of the documented size, with text and the series' colours drawn, and
//! clear errors (no panic) on empty or non-finite data.

use std::path::Path;

use raptor_report::{
    BarPlot, LinePlot, PLOT_HEIGHT, PLOT_WIDTH, ReportError, Series, bar_plot, line_plot,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
/// The first two plot colours (Tableau 10 blue and orange).
const BLUE: [u8; 3] = [31, 119, 180];
const ORANGE: [u8; 3] = [255, 127, 14];

/// A decoded RGB image.
struct Image {
    width: u32,
    height: u32,
    rgb: Vec<u8>,
}

impl Image {
    fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = 3 * (y as usize * self.width as usize + x as usize);
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    /// Pixels of exactly `colour` in rows `rows`.
    fn count(&self, colour: [u8; 3], rows: std::ops::Range<u32>) -> usize {
        rows.flat_map(|y| (0..self.width).map(move |x| (x, y)))
            .filter(|&(x, y)| self.pixel(x, y) == colour)
            .count()
    }

    /// Pixels that are not white in rows `rows`.
    fn ink(&self, rows: std::ops::Range<u32>) -> usize {
        rows.flat_map(|y| (0..self.width).map(move |x| (x, y)))
            .filter(|&(x, y)| self.pixel(x, y) != [255, 255, 255])
            .count()
    }
}

/// Checks the signature and the IHDR size by hand, then decodes with the `png` crate.
fn read_png(path: &Path) -> Result<Image, Box<dyn std::error::Error>> {
    let bytes = std::fs::read(path)?;
    assert!(
        bytes.len() > 2_000,
        "suspiciously small PNG: {} bytes",
        bytes.len()
    );
    assert_eq!(bytes[..8], PNG_SIGNATURE);
    assert_eq!(&bytes[12..16], b"IHDR");
    let width = u32::from_be_bytes(bytes[16..20].try_into()?);
    let height = u32::from_be_bytes(bytes[20..24].try_into()?);
    assert_eq!((width, height), (PLOT_WIDTH, PLOT_HEIGHT));
    assert_eq!((width, height), (800, 500));
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info()?;
    let mut rgb = vec![0; reader.output_buffer_size().ok_or("no buffer size")?];
    let info = reader.next_frame(&mut rgb)?;
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!((info.width, info.height), (width, height));
    rgb.truncate(info.buffer_size());
    Ok(Image { width, height, rgb })
}

fn accuracy_plot() -> LinePlot {
    LinePlot {
        title: "SST-2 accuracy vs ε".into(),
        x_label: "ε".into(),
        y_label: "accuracy (%)".into(),
        series: vec![
            Series::new("RAPTOR", vec![(1.0, 78.1), (3.0, 80.4), (8.0, 82.0)])
                .with_err(vec![1.2, 0.8, 0.6]),
            Series::new("DP-Adam LoRA", vec![(1.0, 75.0), (3.0, 78.9), (8.0, 80.7)])
                .with_err(vec![1.5, 1.1, 0.9]),
        ],
        x_log: true,
        secondary: None,
    }
}

#[test]
fn line_plot_writes_png_with_text_and_series() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("accuracy.png");
    line_plot(&path, &accuracy_plot())?;
    let image = read_png(&path)?;
    assert!(
        image.count(BLUE, 0..image.height) > 100,
        "first series missing"
    );
    assert!(
        image.count(ORANGE, 0..image.height) > 100,
        "second series missing"
    );
    // The caption is drawn in the top band; without a title that band stays white.
    assert!(image.ink(0..35) > 50, "no title text drawn");
    let untitled = dir.path().join("untitled.png");
    line_plot(
        &untitled,
        &LinePlot {
            title: String::new(),
            ..accuracy_plot()
        },
    )?;
    assert_eq!(read_png(&untitled)?.ink(0..12), 0);
    // Only the two PNGs: no temporary file left behind.
    assert_eq!(std::fs::read_dir(dir.path())?.count(), 2);
    Ok(())
}

#[test]
fn axis_labels_change_the_image() -> TestResult {
    let dir = tempfile::tempdir()?;
    let a = dir.path().join("a.png");
    let b = dir.path().join("b.png");
    line_plot(&a, &accuracy_plot())?;
    line_plot(
        &b,
        &LinePlot {
            x_label: "privacy budget".into(),
            ..accuracy_plot()
        },
    )?;
    let (a, b) = (read_png(&a)?, read_png(&b)?);
    let bottom = PLOT_HEIGHT - 40..PLOT_HEIGHT;
    assert_ne!(a.ink(bottom.clone()), b.ink(bottom), "x label not drawn");
    Ok(())
}

#[test]
fn training_curve_with_secondary_axis() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("curve.png");
    let steps: Vec<f64> = (0..50).map(|s| s as f64 * 10.0).collect();
    let plot = LinePlot {
        title: "training loss".into(),
        x_label: "step".into(),
        y_label: "loss".into(),
        series: vec![Series::new(
            "loss",
            steps
                .iter()
                .map(|&s| (s, 2.0 * (-s / 200.0).exp() + 0.3))
                .collect(),
        )],
        x_log: false,
        secondary: Some((
            "ε spent".into(),
            vec![Series::new(
                "ε",
                steps.iter().map(|&s| (s, 0.016 * s.sqrt())).collect(),
            )],
        )),
    };
    line_plot(&path, &plot)?;
    let image = read_png(&path)?;
    assert!(image.count(BLUE, 0..image.height) > 100);
    assert!(
        image.count(ORANGE, 0..image.height) > 50,
        "dashed ε series missing"
    );
    Ok(())
}

#[test]
fn single_point_and_flat_series_plot() -> TestResult {
    let dir = tempfile::tempdir()?;
    for (name, points, x_log) in [
        ("one.png", vec![(1.0, 5.0)], false),
        ("one-log.png", vec![(8.0, 5.0)], true),
        ("zero.png", vec![(0.0, 0.0)], false),
        ("flat.png", vec![(0.0, 2.0), (1.0, 2.0), (2.0, 2.0)], false),
        ("tiny.png", vec![(1e-9, 1e-12), (2e-9, 3e-12)], false),
        ("huge.png", vec![(-1e12, 1e15), (1e12, -1e15)], false),
    ] {
        let path = dir.path().join(name);
        let plot = LinePlot {
            title: name.into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![Series::new("s", points)],
            x_log,
            secondary: None,
        };
        line_plot(&path, &plot)?;
        let image = read_png(&path)?;
        assert!(image.count(BLUE, 0..image.height) > 10, "{name}: no marker");
    }
    Ok(())
}

#[test]
fn line_plot_rejects_bad_data() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bad.png");
    let with = |series: Vec<Series>, x_log: bool| LinePlot {
        series,
        x_log,
        ..accuracy_plot()
    };
    let cases: Vec<(&str, LinePlot)> = vec![
        ("no series", with(vec![], false)),
        ("no points", with(vec![Series::new("s", vec![])], false)),
        (
            "NaN y",
            with(vec![Series::new("s", vec![(1.0, f64::NAN)])], false),
        ),
        (
            "inf x",
            with(vec![Series::new("s", vec![(f64::INFINITY, 1.0)])], false),
        ),
        (
            "zero x on log axis",
            with(vec![Series::new("s", vec![(0.0, 1.0)])], true),
        ),
        (
            "err length",
            with(
                vec![Series::new("s", vec![(1.0, 1.0)]).with_err(vec![])],
                false,
            ),
        ),
        (
            "negative err",
            with(
                vec![Series::new("s", vec![(1.0, 1.0)]).with_err(vec![-1.0])],
                false,
            ),
        ),
        (
            "NaN err",
            with(
                vec![Series::new("s", vec![(1.0, 1.0)]).with_err(vec![f64::NAN])],
                false,
            ),
        ),
        (
            "overflowing range",
            with(
                vec![Series::new("s", vec![(0.0, -f64::MAX), (1.0, f64::MAX)])],
                false,
            ),
        ),
        (
            "bad secondary",
            LinePlot {
                secondary: Some(("y2".into(), vec![Series::new("e", vec![(1.0, f64::NAN)])])),
                ..accuracy_plot()
            },
        ),
        (
            "empty secondary",
            LinePlot {
                secondary: Some(("y2".into(), vec![])),
                ..accuracy_plot()
            },
        ),
    ];
    for (what, plot) in cases {
        let err = line_plot(&path, &plot).err();
        assert!(
            matches!(
                err,
                Some(
                    ReportError::Empty { .. }
                        | ReportError::InvalidValue { .. }
                        | ReportError::LengthMismatch { .. }
                        | ReportError::OutOfRange { .. }
                )
            ),
            "{what}: {err:?}"
        );
        assert!(!path.exists(), "{what}: file written");
    }
    Ok(())
}

fn snr_plot() -> BarPlot {
    BarPlot {
        title: "per-expert SNR".into(),
        y_label: "SNR".into(),
        categories: (0..8).map(|e| format!("expert {e}")).collect(),
        groups: vec![
            Series::new(
                "RAPTOR",
                (0..8).map(|e| (0.0, 1.0 + e as f64 * 0.3)).collect(),
            )
            .with_err(vec![0.2; 8]),
            Series::new(
                "DP-Adam",
                (0..8).map(|e| (0.0, 0.5 + e as f64 * 0.1)).collect(),
            ),
        ],
    }
}

#[test]
fn bar_plot_writes_grouped_bars() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("snr.png");
    bar_plot(&path, &snr_plot())?;
    let image = read_png(&path)?;
    assert!(
        image.count(BLUE, 0..image.height) > 2_000,
        "first group missing"
    );
    assert!(
        image.count(ORANGE, 0..image.height) > 1_000,
        "second group missing"
    );
    assert!(image.ink(0..35) > 50, "no title text drawn");
    Ok(())
}

#[test]
fn bar_plot_edge_cases() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cases = [
        (
            "one",
            vec!["layer 0".to_string()],
            vec![Series::new("H", vec![(0.0, 1.5)])],
        ),
        (
            "zeros",
            vec!["a".into(), "b".into()],
            vec![Series::new("H", vec![(0.0, 0.0); 2])],
        ),
        (
            "negative",
            vec!["a".into(), "b".into()],
            vec![Series::new("Δ", vec![(0.0, -1.0), (0.0, 2.0)]).with_err(vec![0.5, 0.5])],
        ),
        (
            "many",
            (0..64).map(|e| format!("expert number {e}")).collect(),
            vec![Series::new("s", (0..64).map(|e| (0.0, e as f64)).collect())],
        ),
    ];
    for (name, categories, groups) in cases {
        let path = dir.path().join(format!("{name}.png"));
        bar_plot(
            &path,
            &BarPlot {
                title: name.into(),
                y_label: "value".into(),
                categories,
                groups,
            },
        )?;
        read_png(&path)?;
    }
    Ok(())
}

#[test]
fn bar_plot_rejects_bad_data() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bad.png");
    let mut cases: Vec<(&str, BarPlot)> = vec![
        (
            "no categories",
            BarPlot {
                categories: vec![],
                ..snr_plot()
            },
        ),
        (
            "no groups",
            BarPlot {
                groups: vec![],
                ..snr_plot()
            },
        ),
    ];
    let mut short = snr_plot();
    short.groups[1].points.pop();
    cases.push(("short group", short));
    let mut nan = snr_plot();
    nan.groups[0].points[3].1 = f64::NAN;
    cases.push(("NaN height", nan));
    let mut bad_err = snr_plot();
    bad_err.groups[0].err = Some(vec![0.1; 7]);
    cases.push(("err length", bad_err));
    for (what, plot) in cases {
        let err = bar_plot(&path, &plot).err();
        assert!(
            matches!(
                err,
                Some(
                    ReportError::Empty { .. }
                        | ReportError::InvalidValue { .. }
                        | ReportError::LengthMismatch { .. }
                )
            ),
            "{what}: {err:?}"
        );
        assert!(!path.exists(), "{what}: file written");
    }
    // x values of bars are ignored, even when not finite.
    let mut nan_x = snr_plot();
    nan_x.groups[0].points[0].0 = f64::NAN;
    bar_plot(&path, &nan_x)?;
    Ok(())
}

#[test]
fn plot_creates_its_folder_and_reports_io_errors() -> TestResult {
    let dir = tempfile::tempdir()?;
    let nested = dir.path().join("plots").join("sst2").join("p.png");
    line_plot(&nested, &accuracy_plot())?;
    read_png(&nested)?;
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x")?;
    let err = line_plot(&file.join("p.png"), &accuracy_plot()).err();
    assert!(matches!(err, Some(ReportError::Io { .. })), "{err:?}");
    Ok(())
}
