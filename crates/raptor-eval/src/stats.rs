//! Accuracy, mean ± confidence interval over seeds, the Wilson interval, NLL and perplexity.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

use crate::EvalError;

fn check_level(level: f64) -> Result<(), EvalError> {
    if level.is_finite() && level > 0.0 && level < 1.0 {
        Ok(())
    } else {
        Err(EvalError::OutOfRange {
            what: "confidence level",
            value: level,
            expected: "0 < level < 1",
        })
    }
}

pub(crate) fn check_finite(what: &'static str, xs: &[f64]) -> Result<(), EvalError> {
    match xs.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(EvalError::InvalidValue {
            what,
            index,
            value: xs[index],
        }),
        None => Ok(()),
    }
}

/// Fraction of positions where `predictions[i] == labels[i]`.
///
/// ```
/// assert_eq!(raptor_eval::accuracy(&[0, 1, 2, 1], &[0, 1, 1, 1])?, 0.75);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn accuracy(predictions: &[usize], labels: &[usize]) -> Result<f64, EvalError> {
    if predictions.len() != labels.len() {
        return Err(EvalError::LengthMismatch {
            what: "predictions and labels",
            left: predictions.len(),
            right: labels.len(),
        });
    }
    if labels.is_empty() {
        return Err(EvalError::Empty { what: "labels" });
    }
    let correct = predictions
        .iter()
        .zip(labels)
        .filter(|(p, l)| p == l)
        .count();
    Ok(correct as f64 / labels.len() as f64)
}

/// A mean with a two-sided confidence interval `mean ± half_width`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MeanCi {
    /// Number of values.
    pub n: usize,
    /// Sample mean.
    pub mean: f64,
    /// Sample standard deviation (denominator n − 1; NaN for n = 1).
    pub std: f64,
    /// Half-width of the interval; **NaN when n = 1** (undefined: one seed says nothing about
    /// the spread), never a made-up number.
    pub half_width: f64,
    /// Confidence level, e.g. 0.95.
    pub level: f64,
}

impl MeanCi {
    /// Lower end (`mean − half_width`; NaN when undefined).
    pub fn lower(&self) -> f64 {
        self.mean - self.half_width
    }
    /// Upper end (`mean + half_width`; NaN when undefined).
    pub fn upper(&self) -> f64 {
        self.mean + self.half_width
    }
    /// Whether the half-width is defined (n ≥ 2).
    pub fn is_defined(&self) -> bool {
        self.half_width.is_finite()
    }

    /// Whether the two intervals overlap (closed intervals); `None` when either is undefined.
    ///
    /// ```
    /// use raptor_eval::mean_ci;
    /// let a = mean_ci(&[0.80, 0.82, 0.84], 0.95)?;
    /// let b = mean_ci(&[0.70, 0.71, 0.72], 0.95)?;
    /// assert_eq!(a.overlaps(&b), Some(false));
    /// assert_eq!(a.overlaps(&mean_ci(&[0.8], 0.95)?), None);
    /// # Ok::<(), raptor_eval::EvalError>(())
    /// ```
    pub fn overlaps(&self, other: &MeanCi) -> Option<bool> {
        if !self.is_defined() || !other.is_defined() {
            return None;
        }
        Some(self.lower() <= other.upper() && other.lower() <= self.upper())
    }
}

impl std::fmt::Display for MeanCi {
    /// `mean ± half` with 2 decimals, or `mean ± undefined (n = 1)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_defined() {
            write!(f, "{:.2} ± {:.2}", self.mean, self.half_width)
        } else {
            write!(f, "{:.2} ± undefined (n = {})", self.mean, self.n)
        }
    }
}

/// Mean over seeds with a Student-t interval: `half_width = t_{(1+level)/2, n−1} · s / √n`.
///
/// ```
/// use raptor_eval::mean_ci;
/// let ci = mean_ci(&[0.80, 0.82, 0.84], 0.95)?;
/// assert!((ci.mean - 0.82).abs() < 1e-12);
/// assert!((ci.half_width - 0.049683).abs() < 1e-6); // t_{0.975,2} = 4.302653 · 0.02 / √3
/// assert!(mean_ci(&[0.8], 0.95)?.half_width.is_nan());
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn mean_ci(values: &[f64], level: f64) -> Result<MeanCi, EvalError> {
    check_level(level)?;
    if values.is_empty() {
        return Err(EvalError::Empty { what: "values" });
    }
    check_finite("values", values)?;
    let n = values.len();
    let mean = values.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return Ok(MeanCi {
            n,
            mean,
            std: f64::NAN,
            half_width: f64::NAN,
            level,
        });
    }
    let var = values.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
    let std = var.sqrt();
    let t = StudentsT::new(0.0, 1.0, (n - 1) as f64)
        .map_err(|_| EvalError::Empty { what: "values" })?
        .inverse_cdf(0.5 + level / 2.0);
    Ok(MeanCi {
        n,
        mean,
        std,
        half_width: t * std / (n as f64).sqrt(),
        level,
    })
}

/// The minimum detectable effect of a two-sided paired t-test: the smallest true mean
/// difference that `n` paired differences with standard deviation `sd` detect at level `alpha`
/// with probability `power`, by the usual approximation
/// `(t_{1−α/2, n−1} + t_{power, n−1}) · sd / √n` (the central t in place of the non-central
/// one: a slight under-statement of the effect needed at small n).
///
/// ```
/// use raptor_eval::min_detectable_effect;
/// // 8 paired seeds, SD 1: (2.364624 + 0.896030) / √8 (scipy's t quantiles).
/// let m = min_detectable_effect(1.0, 8, 0.05, 0.8)?;
/// assert!((m - 1.152818).abs() < 1e-5);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
///
/// # Errors
/// Fewer than 2 pairs, a negative or non-finite `sd`, `alpha` outside (0, 1) or `power`
/// outside (0, 1).
pub fn min_detectable_effect(sd: f64, n: usize, alpha: f64, power: f64) -> Result<f64, EvalError> {
    if n < 2 {
        return Err(EvalError::OutOfRange {
            what: "pairs",
            value: n as f64,
            expected: "at least 2",
        });
    }
    if !(sd.is_finite() && sd >= 0.0) {
        return Err(EvalError::OutOfRange {
            what: "sd",
            value: sd,
            expected: "finite and >= 0",
        });
    }
    for (what, v) in [("alpha", alpha), ("power", power)] {
        if !(v > 0.0 && v < 1.0) {
            return Err(EvalError::OutOfRange {
                what,
                value: v,
                expected: "in (0, 1)",
            });
        }
    }
    let t =
        StudentsT::new(0.0, 1.0, (n - 1) as f64).map_err(|_| EvalError::Empty { what: "pairs" })?;
    Ok((t.inverse_cdf(1.0 - alpha / 2.0) + t.inverse_cdf(power)) * sd / (n as f64).sqrt())
}

/// A proportion with an interval `[lower, upper]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProportionCi {
    /// Successes / trials.
    pub estimate: f64,
    /// Lower end.
    pub lower: f64,
    /// Upper end.
    pub upper: f64,
    /// Confidence level.
    pub level: f64,
}

/// Wilson score interval for `successes` out of `trials` (e.g. one accuracy on a test set):
/// with `z = Φ⁻¹((1+level)/2)`, `p̂ = k/n`,
/// `center = (p̂ + z²/2n) / (1 + z²/n)`, `half = z/(1 + z²/n) · √(p̂(1−p̂)/n + z²/4n²)`.
///
/// ```
/// let ci = raptor_eval::wilson_interval(90, 100, 0.95)?;
/// assert!((ci.lower - 0.825634).abs() < 1e-6 && (ci.upper - 0.944771).abs() < 1e-6);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn wilson_interval(successes: u64, trials: u64, level: f64) -> Result<ProportionCi, EvalError> {
    check_level(level)?;
    if trials == 0 {
        return Err(EvalError::Empty { what: "trials" });
    }
    if successes > trials {
        return Err(EvalError::InvalidCounts(format!(
            "successes {successes} > trials {trials}"
        )));
    }
    let z = Normal::new(0.0, 1.0)
        .map_err(|_| EvalError::Empty { what: "trials" })?
        .inverse_cdf(0.5 + level / 2.0);
    let n = trials as f64;
    let p = successes as f64 / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let half = z / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    Ok(ProportionCi {
        estimate: p,
        lower: (center - half).max(0.0),
        upper: (center + half).min(1.0),
        level,
    })
}

/// Mean negative log-likelihood per token and perplexity from summed token NLLs (in nats).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Nll {
    /// Number of tokens.
    pub tokens: u64,
    /// Mean NLL per token (nats).
    pub nll: f64,
    /// `exp(nll)`.
    pub perplexity: f64,
}

/// Combine per-batch sums of token NLLs (nats) and token counts into a mean NLL and perplexity.
///
/// ```
/// let r = raptor_eval::nll_perplexity(&[(6.0, 3), (2.0, 1)])?;
/// assert_eq!(r.tokens, 4);
/// assert_eq!(r.nll, 2.0);
/// assert!((r.perplexity - 2f64.exp()).abs() < 1e-12);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn nll_perplexity(batches: &[(f64, u64)]) -> Result<Nll, EvalError> {
    let mut sum = 0.0;
    let mut tokens = 0u64;
    for (i, &(s, c)) in batches.iter().enumerate() {
        if !s.is_finite() || s < 0.0 {
            return Err(EvalError::InvalidValue {
                what: "NLL sum",
                index: i,
                value: s,
            });
        }
        sum += s;
        tokens = tokens.saturating_add(c);
    }
    if tokens == 0 {
        return Err(EvalError::Empty { what: "tokens" });
    }
    let nll = sum / tokens as f64;
    Ok(Nll {
        tokens,
        nll,
        perplexity: nll.exp(),
    })
}
