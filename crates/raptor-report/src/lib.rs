//! # raptor-report
//!
//! Turns the results of many training runs (several seeds per cell) into report material,
//! without tensors or libtorch:
//!
//! - [`Table`]: a result table written as GitHub-flavoured Markdown and pretty JSON
//!   ([`Table::write`], atomic writes);
//! - [`estimate`] / [`estimate_at`]: mean over seeds with a two-sided Student-t interval
//!   ([`Estimate`], `"81.2 ± 1.3"`), and [`ordering`]: how method A compares with method B
//!   over the cells of a table, as counts and one computed sentence ([`OrderingSummary`]);
//! - [`line_plot`] and [`bar_plot`]: 800×500 PNG plots (accuracy vs ε with CI bars, training
//!   curves with ε spent on a secondary axis, per-expert or per-layer bars grouped by
//!   method). Text uses an embedded DejaVu Sans, so no system font is needed.
//!
//! ```
//! use raptor_report::{LinePlot, Series, Table, estimate, line_plot};
//! let dir = tempfile::tempdir().map_err(|e| raptor_report::ReportError::Io {
//!     path: "tempdir".into(),
//!     source: e,
//! })?;
//! let raptor = estimate(&[81.0, 82.5, 80.9])?;
//! let table = Table {
//!     slug: "sst2".into(),
//!     title: "SST-2 accuracy (%)".into(),
//!     columns: vec!["method".into(), "ε = 8".into()],
//!     rows: vec![vec!["RAPTOR".into(), raptor.fmt(1)]],
//!     notes: vec![format!("{} seeds, 95 % t interval", raptor.n)],
//! };
//! table.write(dir.path())?;
//! assert!(dir.path().join("sst2.md").exists() && dir.path().join("sst2.json").exists());
//! let plot = LinePlot {
//!     title: "Accuracy vs ε".into(),
//!     x_label: "ε".into(),
//!     y_label: "accuracy (%)".into(),
//!     series: vec![
//!         Series::new("RAPTOR", vec![(1.0, 78.0), (8.0, raptor.mean)])
//!             .with_err(vec![1.5, raptor.half_width]),
//!     ],
//!     x_log: true,
//!     secondary: None,
//! };
//! line_plot(&dir.path().join("accuracy.png"), &plot)?;
//! # Ok::<(), raptor_report::ReportError>(())
//! ```

mod error;
mod io;
mod plot;
mod stats;
mod table;

pub use error::{ReportError, Result};
pub use plot::{BarPlot, LinePlot, PLOT_HEIGHT, PLOT_WIDTH, Series, bar_plot, line_plot};
pub use stats::{Estimate, OrderingSummary, estimate, estimate_at, ordering, t_quantile};
pub use table::Table;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
