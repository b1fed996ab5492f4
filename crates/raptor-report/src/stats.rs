//! Means over seeds with Student-t confidence intervals, and the ordering of two methods over
//! the cells of a table.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::error::{ReportError, Result};

/// Serializes an `f64` that may be NaN as `null` (JSON has no NaN) and reads `null` back as
/// NaN, so an [`Estimate`] over one seed round-trips through JSON.
mod nan_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &f64,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        if value.is_nan() {
            serializer.serialize_none()
        } else {
            serializer.serialize_f64(*value)
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
    }
}

/// Mean over seeds and a two-sided Student-t confidence interval
/// `mean ± t_{(1+level)/2, n−1} · sd / √n` (95 % from [`estimate`]).
///
/// With one value the interval is undefined: `half_width` and `sd` are NaN (`null` in JSON),
/// never a made-up number.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Mean of the values.
    pub mean: f64,
    /// Half-width of the confidence interval; NaN when `n < 2`.
    #[serde(with = "nan_as_null")]
    pub half_width: f64,
    /// Number of values (seeds).
    pub n: usize,
    /// Sample standard deviation (divisor `n − 1`); NaN when `n < 2`.
    #[serde(with = "nan_as_null")]
    pub sd: f64,
}

/// Mean and 95 % Student-t interval of `values` (one per seed). See [`estimate_at`].
///
/// # Errors
/// [`ReportError::Empty`] for no values, [`ReportError::InvalidValue`] for a NaN or infinite
/// one.
pub fn estimate(values: &[f64]) -> Result<Estimate> {
    estimate_at(values, 0.95)
}

/// The Student-t quantile `t_{(1+level)/2, df}` of a two-sided interval at `level` (statrs'
/// inverse CDF: within 1e-9 of tabulated values for the few degrees of freedom of seeds;
/// it degrades to about 1e-5 beyond 10⁵ degrees of freedom).
///
/// # Errors
/// [`ReportError::OutOfRange`] for a level outside (0, 1) or `df` of 0.
pub fn t_quantile(level: f64, df: usize) -> Result<f64> {
    check_level(level)?;
    let t = StudentsT::new(0.0, 1.0, df as f64).map_err(|_| ReportError::OutOfRange {
        what: "degrees of freedom",
        value: df as f64,
        expected: "at least 1",
    })?;
    Ok(t.inverse_cdf(0.5 + level / 2.0))
}

fn check_level(level: f64) -> Result<()> {
    if level.is_finite() && level > 0.0 && level < 1.0 {
        Ok(())
    } else {
        Err(ReportError::OutOfRange {
            what: "confidence level",
            value: level,
            expected: "strictly between 0 and 1",
        })
    }
}

/// Mean and two-sided Student-t interval at `level` (e.g. 0.95) of `values` (one per seed):
/// `half_width = t_{(1+level)/2, n−1} · sd / √n` with the sample standard deviation `sd`
/// (divisor `n − 1`). One value gives NaN `half_width` and `sd`.
///
/// ```
/// use raptor_report::estimate_at;
/// let e = estimate_at(&[80.0, 82.0, 84.0], 0.95)?;
/// assert!((e.mean - 82.0).abs() < 1e-12);
/// // t_{0.975, 2} = 4.302652729911275, sd = 2, n = 3.
/// assert!((e.half_width - 4.302652729911275 * 2.0 / 3f64.sqrt()).abs() < 1e-9);
/// assert_eq!(e.fmt(1), "82.0 ± 5.0");
/// # Ok::<(), raptor_report::ReportError>(())
/// ```
///
/// # Errors
/// [`ReportError::Empty`] for no values, [`ReportError::InvalidValue`] for a NaN or infinite
/// one, [`ReportError::OutOfRange`] for a level outside (0, 1).
pub fn estimate_at(values: &[f64], level: f64) -> Result<Estimate> {
    check_level(level)?;
    if values.is_empty() {
        return Err(ReportError::Empty {
            what: "estimate values".into(),
        });
    }
    check_finite("estimate values", values)?;
    let n = values.len();
    let (min, max) = values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    // Rounding can push the computed mean of nearly equal values just outside [min, max].
    let mean = (values.iter().sum::<f64>() / n as f64).clamp(min, max);
    if n < 2 {
        return Ok(Estimate {
            mean,
            half_width: f64::NAN,
            n,
            sd: f64::NAN,
        });
    }
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1) as f64;
    let sd = var.sqrt();
    let t = t_quantile(level, n - 1)?;
    Ok(Estimate {
        mean,
        half_width: t * sd / (n as f64).sqrt(),
        n,
        sd,
    })
}

/// Rejects NaN and infinite values, naming the first.
pub(crate) fn check_finite(what: &str, values: &[f64]) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(ReportError::InvalidValue {
            what: what.into(),
            index,
            value: values[index],
        }),
        None => Ok(()),
    }
}

impl Estimate {
    /// Whether the interval is defined (`n ≥ 2` and a finite half-width).
    #[must_use]
    pub fn has_interval(&self) -> bool {
        self.n >= 2 && self.half_width.is_finite()
    }

    /// Lower end `mean − half_width` (NaN when `n < 2`).
    #[must_use]
    pub fn lo(&self) -> f64 {
        self.mean - self.half_width
    }

    /// Upper end `mean + half_width` (NaN when `n < 2`).
    #[must_use]
    pub fn hi(&self) -> f64 {
        self.mean + self.half_width
    }

    /// Whether the two intervals intersect (closed intervals, so touching counts). When
    /// either has no interval (`n < 2`) only the means are compared: true exactly when they
    /// are equal.
    #[must_use]
    pub fn overlaps(&self, other: &Estimate) -> bool {
        if self.has_interval() && other.has_interval() {
            self.lo() <= other.hi() && other.lo() <= self.hi()
        } else {
            self.mean == other.mean
        }
    }

    /// `mean ± half_width` with `digits` decimals (e.g. `"81.2 ± 1.3"`); just the mean when
    /// there is no interval (`n < 2`).
    #[must_use]
    pub fn fmt(&self, digits: usize) -> String {
        if self.has_interval() {
            format!(
                "{:.digits$} ± {:.digits$}",
                self.mean,
                self.half_width,
                digits = digits
            )
        } else {
            format!("{:.digits$}", self.mean, digits = digits)
        }
    }
}

/// How method A compares with method B over the cells of a table (higher is better; for a
/// metric where lower is better, such as NLL, pass the pairs as (B, A) or negate the values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderingSummary {
    /// Number of cells compared.
    pub cells: usize,
    /// Cells where A's mean is at least B's.
    pub a_ge_b: usize,
    /// Cells where the intervals intersect ([`Estimate::overlaps`]; without intervals: equal
    /// means).
    pub overlapping: usize,
    /// Cells where both have intervals, they are disjoint and A's is higher.
    pub a_significantly_better: usize,
    /// Cells where both have intervals, they are disjoint and B's is higher.
    pub b_significantly_better: usize,
    /// Cells where A or B has no interval (a single seed): never counted as significant.
    pub without_interval: usize,
}

/// Counts, over the cells `(A, B)` (the two methods' estimates in the same cell), how often A
/// is at least B, how often the intervals overlap and how often either is significantly better
/// (disjoint intervals). Cells where either side has a single seed are never significant.
///
/// ```
/// use raptor_report::{estimate, ordering};
/// let a = estimate(&[81.0, 82.0, 83.0])?;
/// let b = estimate(&[70.0, 71.0, 72.0])?;
/// let summary = ordering(&[(a, b), (b, b)]);
/// assert_eq!(
///     summary.sentence("RAPTOR", "DP-Adam"),
///     "RAPTOR ≥ DP-Adam in 2 of 2 cells (CIs overlap in 1; significantly better in 1, worse in 0)"
/// );
/// # Ok::<(), raptor_report::ReportError>(())
/// ```
#[must_use]
pub fn ordering(pairs: &[(Estimate, Estimate)]) -> OrderingSummary {
    let mut summary = OrderingSummary {
        cells: pairs.len(),
        a_ge_b: 0,
        overlapping: 0,
        a_significantly_better: 0,
        b_significantly_better: 0,
        without_interval: 0,
    };
    for (a, b) in pairs {
        if a.mean >= b.mean {
            summary.a_ge_b += 1;
        }
        let overlap = a.overlaps(b);
        if overlap {
            summary.overlapping += 1;
        }
        if !(a.has_interval() && b.has_interval()) {
            summary.without_interval += 1;
        } else if !overlap {
            if a.mean > b.mean {
                summary.a_significantly_better += 1;
            } else {
                summary.b_significantly_better += 1;
            }
        }
    }
    summary
}

impl OrderingSummary {
    /// One sentence, computed from the counts, e.g. `"RAPTOR ≥ DP-Adam LoRA in 5 of 6 cells
    /// (CIs overlap in 2; significantly better in 3, worse in 0)"`, with `"; N without an
    /// interval (one seed)"` added inside the brackets when such cells exist, and
    /// `"no cell to compare"` for no cells.
    #[must_use]
    pub fn sentence(&self, a: &str, b: &str) -> String {
        if self.cells == 0 {
            return "no cell to compare".into();
        }
        let unit = if self.cells == 1 { "cell" } else { "cells" };
        let mut out = format!(
            "{a} ≥ {b} in {} of {} {unit} (CIs overlap in {}; significantly better in {}, worse in {}",
            self.a_ge_b,
            self.cells,
            self.overlapping,
            self.a_significantly_better,
            self.b_significantly_better
        );
        if self.without_interval > 0 {
            out.push_str(&format!(
                "; {} without an interval (one seed)",
                self.without_interval
            ));
        }
        out.push(')');
        out
    }
}
