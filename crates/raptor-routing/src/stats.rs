//! Routing statistics of an owner distribution, and ownership stability, with a type-level
//! record of where the data came from.
//!
//! # Private versus public statistics
//!
//! Statistics computed from the owner map of **private** records (the training set) are a
//! function of the private data: releasing them — printing, logging, writing them to a run
//! record — is a release that no privacy accountant covers. The public Python code logs entropy
//! and χ² of the private owner map; we do not.
//!
//! The marker type parameter `P` ([`Private`] or [`Public`]) makes this explicit:
//! - [`RoutingStats::<Private>`](RoutingStats) (from [`private_stats`] or
//!   [`OwnerMap::stats`]) has the same accessors for use **inside** the process, but no
//!   `Serialize` and no `Display`; its `Debug` prints `<redacted private routing statistics>`.
//! - [`RoutingStats::<Public>`](RoutingStats) comes only from a [`crate::PublicCorpus`] (whose
//!   construction is the caller's statement that its records are public), from counts the caller
//!   asserts to be public or synthetic ([`RoutingStats::from_public_counts`]), or from an explicit
//!   [`RoutingStats::declassify_without_dp`] — the single, greppable place where a private value
//!   is knowingly released without a privacy guarantee.
//!
//! The same holds for [`Stability`].
//!
//! # Definitions
//!
//! With `n` records, `E` experts, `c_e` records owned by expert `e` and `q_e = c_e / n`:
//! - entropy `H = −Σ_e q_e ln q_e` (nats, `0 ln 0 = 0`), normalized entropy `H / ln E`
//!   (defined as 1 when `E = 1`: the one-expert distribution is uniform), deficit `ln E − H`;
//! - `χ²(q‖u) = E·Σ_e q_e² − 1 = Σ_e (q_e − 1/E)² / (1/E)`;
//! - load CV `= sqrt(mean_e (q_e − 1/E)²) / (1/E)` (population standard deviation over mean);
//!   algebraically `CV² = χ²`, we compute both independently and the tests check the identity;
//! - min/max `q_e`, and the number of experts that own no record.

use std::fmt;
use std::marker::PhantomData;

use serde::ser::{Serialize, SerializeStruct, Serializer};

use crate::{OwnerMap, RoutingError};

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Private {}
    impl Sealed for super::Public {}
}

/// Marker: where the records behind a statistic came from. Implemented only by [`Private`] and
/// [`Public`].
pub trait Provenance: sealed::Sealed + fmt::Debug + Clone + Copy + 'static {
    /// `"private"` or `"public"`.
    const LABEL: &'static str;
}

/// Marker: computed from private records; must not be logged or released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Private {}

/// Marker: computed from public (or synthetic) records; free to print and release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Public {}

impl Provenance for Private {
    const LABEL: &'static str = "private";
}
impl Provenance for Public {
    const LABEL: &'static str = "public";
}

/// Statistics of one layer's owner distribution (see the [module docs](self)).
#[derive(Clone, PartialEq)]
pub struct RoutingStats<P: Provenance> {
    counts: Vec<u64>,
    fractions: Vec<f64>,
    entropy: f64,
    normalized_entropy: f64,
    chi2: f64,
    load_cv: f64,
    min_q: f64,
    max_q: f64,
    empty_experts: usize,
    _provenance: PhantomData<P>,
}

/// Statistics of the owner map of private records (the trainer's map). Not printable; see the
/// [module docs](self).
pub fn private_stats(map: &OwnerMap) -> Result<RoutingStats<Private>, RoutingError> {
    RoutingStats::from_counts(&map.counts())
}

impl OwnerMap {
    /// The statistics of this owner map, marked [`Private`] (an owner map does not know where
    /// its records came from, so the conservative marker is used; public-corpus statistics come
    /// from [`crate::PublicCorpus::layer_stats`]).
    pub fn stats(&self) -> Result<RoutingStats<Private>, RoutingError> {
        private_stats(self)
    }
}

impl<P: Provenance> RoutingStats<P> {
    pub(crate) fn from_counts(counts: &[u64]) -> Result<Self, RoutingError> {
        if counts.is_empty() {
            return Err(RoutingError::NoExperts(0));
        }
        let n: u64 = counts.iter().sum();
        if n == 0 {
            return Err(RoutingError::EmptyOwnerMap);
        }
        let e = counts.len() as f64;
        let fractions: Vec<f64> = counts.iter().map(|&c| c as f64 / n as f64).collect();
        let entropy = -fractions
            .iter()
            .filter(|&&q| q > 0.0)
            .map(|&q| q * q.ln())
            .sum::<f64>();
        // Clamp rounding: H ∈ [0, ln E].
        let entropy = entropy.clamp(0.0, e.ln());
        let normalized_entropy = if counts.len() == 1 {
            1.0
        } else {
            entropy / e.ln()
        };
        let chi2 = (e * fractions.iter().map(|q| q * q).sum::<f64>() - 1.0).max(0.0);
        let u = 1.0 / e;
        let var = fractions.iter().map(|q| (q - u) * (q - u)).sum::<f64>() / e;
        let load_cv = var.sqrt() / u;
        let min_q = fractions.iter().copied().fold(f64::INFINITY, f64::min);
        let max_q = fractions.iter().copied().fold(0.0, f64::max);
        let empty_experts = counts.iter().filter(|&&c| c == 0).count();
        Ok(Self {
            counts: counts.to_vec(),
            fractions,
            entropy,
            normalized_entropy,
            chi2,
            load_cv,
            min_q,
            max_q,
            empty_experts,
            _provenance: PhantomData,
        })
    }

    /// Number of records `n`.
    pub fn num_records(&self) -> u64 {
        self.counts.iter().sum()
    }
    /// Number of experts `E`.
    pub fn num_experts(&self) -> usize {
        self.counts.len()
    }
    /// Records owned by each expert.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }
    /// Owner fractions `q_e`.
    pub fn fractions(&self) -> &[f64] {
        &self.fractions
    }
    /// Entropy `H` in nats.
    pub fn entropy(&self) -> f64 {
        self.entropy
    }
    /// `H / ln E` (1 when `E = 1`).
    pub fn normalized_entropy(&self) -> f64 {
        self.normalized_entropy
    }
    /// Entropy deficit `ln E − H` (nats).
    pub fn deficit(&self) -> f64 {
        ((self.counts.len() as f64).ln() - self.entropy).max(0.0)
    }
    /// `χ²(q‖u) = E·Σq² − 1`.
    pub fn chi2(&self) -> f64 {
        self.chi2
    }
    /// Load coefficient of variation (population std / mean of `q`).
    pub fn load_cv(&self) -> f64 {
        self.load_cv
    }
    /// Smallest owner fraction.
    pub fn min_q(&self) -> f64 {
        self.min_q
    }
    /// Largest owner fraction (the dominant expert's share).
    pub fn max_q(&self) -> f64 {
        self.max_q
    }
    /// Number of experts that own no record.
    pub fn empty_experts(&self) -> usize {
        self.empty_experts
    }
    /// `"private"` or `"public"`.
    pub fn provenance(&self) -> &'static str {
        P::LABEL
    }
}

impl RoutingStats<Public> {
    /// Statistics of counts that the caller asserts come from public or synthetic records (or a
    /// planted distribution). Errors on `E = 0` or zero records.
    pub fn from_public_counts(counts: &[u64]) -> Result<Self, RoutingError> {
        Self::from_counts(counts)
    }
}

impl RoutingStats<Private> {
    /// Release private statistics **without** any privacy guarantee. Call only when you accept
    /// that the values leak information about the private records (e.g. a non-private debugging
    /// run). This is the only way from `Private` to `Public`.
    pub fn declassify_without_dp(self) -> RoutingStats<Public> {
        RoutingStats {
            counts: self.counts,
            fractions: self.fractions,
            entropy: self.entropy,
            normalized_entropy: self.normalized_entropy,
            chi2: self.chi2,
            load_cv: self.load_cv,
            min_q: self.min_q,
            max_q: self.max_q,
            empty_experts: self.empty_experts,
            _provenance: PhantomData,
        }
    }
}

impl fmt::Debug for RoutingStats<Private> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted private routing statistics>")
    }
}

impl fmt::Debug for RoutingStats<Public> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutingStats<Public>")
            .field("counts", &self.counts)
            .field("entropy", &self.entropy)
            .field("normalized_entropy", &self.normalized_entropy)
            .field("chi2", &self.chi2)
            .field("load_cv", &self.load_cv)
            .field("min_q", &self.min_q)
            .field("max_q", &self.max_q)
            .field("empty_experts", &self.empty_experts)
            .finish()
    }
}

impl Serialize for RoutingStats<Public> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("RoutingStats", 13)?;
        st.serialize_field("provenance", Public::LABEL)?;
        st.serialize_field("num_records", &self.num_records())?;
        st.serialize_field("num_experts", &self.num_experts())?;
        st.serialize_field("counts", &self.counts)?;
        st.serialize_field("fractions", &self.fractions)?;
        st.serialize_field("entropy", &self.entropy)?;
        st.serialize_field("normalized_entropy", &self.normalized_entropy)?;
        st.serialize_field("deficit", &self.deficit())?;
        st.serialize_field("chi2", &self.chi2)?;
        st.serialize_field("load_cv", &self.load_cv)?;
        st.serialize_field("min_q", &self.min_q)?;
        st.serialize_field("max_q", &self.max_q)?;
        st.serialize_field("empty_experts", &self.empty_experts)?;
        st.end()
    }
}

impl fmt::Display for RoutingStats<Public> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "n={} E={} H={:.4} H/lnE={:.4} deficit={:.4} chi2={:.4} CV={:.4} min_q={:.4} max_q={:.4} empty={}",
            self.num_records(),
            self.num_experts(),
            self.entropy,
            self.normalized_entropy,
            self.deficit(),
            self.chi2,
            self.load_cv,
            self.min_q,
            self.max_q,
            self.empty_experts
        )
    }
}

/// Column headers of [`stats_table`].
pub const TABLE_COLUMNS: [&str; 11] = [
    "layer", "n", "E", "H", "H/lnE", "deficit", "chi2", "CV", "min q", "max q", "empty",
];

/// One row of cells (4 decimals) for [`TABLE_COLUMNS`].
pub fn stats_row(layer: usize, s: &RoutingStats<Public>) -> Vec<String> {
    vec![
        layer.to_string(),
        s.num_records().to_string(),
        s.num_experts().to_string(),
        format!("{:.4}", s.entropy()),
        format!("{:.4}", s.normalized_entropy()),
        format!("{:.4}", s.deficit()),
        format!("{:.4}", s.chi2()),
        format!("{:.4}", s.load_cv()),
        format!("{:.4}", s.min_q()),
        format!("{:.4}", s.max_q()),
        s.empty_experts().to_string(),
    ]
}

/// A fixed-width text table of public per-layer statistics (one row per `(layer id, stats)`).
pub fn stats_table(rows: &[(usize, RoutingStats<Public>)]) -> String {
    let cells: Vec<Vec<String>> = rows.iter().map(|(l, s)| stats_row(*l, s)).collect();
    let widths: Vec<usize> = TABLE_COLUMNS
        .iter()
        .enumerate()
        .map(|(j, h)| {
            cells
                .iter()
                .map(|r| r[j].len())
                .chain([h.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |r: &[String]| {
        let mut s = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        s.push('\n');
        s
    };
    let header: Vec<String> = TABLE_COLUMNS.iter().map(|s| s.to_string()).collect();
    let mut out = line(&header);
    for r in &cells {
        out.push_str(&line(r));
    }
    out
}

/// How much an owner map changed (e.g. before versus after training).
#[derive(Clone, PartialEq)]
pub struct Stability<P: Provenance> {
    num_records: usize,
    changed: usize,
    l1: f64,
    _provenance: PhantomData<P>,
}

/// Stability between two owner maps of the same records (same length and `E`), marked
/// [`Private`] like every statistic of an owner map.
///
/// `fraction_changed = #{r : before[r] ≠ after[r]} / n` and `l1 = ‖q̃ − q‖₁ = Σ_e |q̃_e − q_e|`
/// (in `[0, 2]`; `l1 ≤ 2·fraction_changed`).
pub fn stability(before: &OwnerMap, after: &OwnerMap) -> Result<Stability<Private>, RoutingError> {
    if before.num_records() != after.num_records() {
        return Err(RoutingError::Mismatch {
            what: "num_records",
            left: before.num_records(),
            right: after.num_records(),
        });
    }
    if before.num_experts() != after.num_experts() {
        return Err(RoutingError::Mismatch {
            what: "num_experts",
            left: before.num_experts(),
            right: after.num_experts(),
        });
    }
    let n = before.num_records();
    if n == 0 {
        return Err(RoutingError::EmptyOwnerMap);
    }
    let changed = before
        .owners()
        .iter()
        .zip(after.owners())
        .filter(|(a, b)| a != b)
        .count();
    let (ca, cb) = (before.counts(), after.counts());
    let l1 = ca
        .iter()
        .zip(&cb)
        .map(|(&a, &b)| (a as f64 - b as f64).abs())
        .sum::<f64>()
        / n as f64;
    Ok(Stability {
        num_records: n,
        changed,
        l1,
        _provenance: PhantomData,
    })
}

impl<P: Provenance> Stability<P> {
    /// Number of records compared.
    pub fn num_records(&self) -> usize {
        self.num_records
    }
    /// Number of records whose owner changed.
    pub fn changed(&self) -> usize {
        self.changed
    }
    /// Fraction of records whose owner changed.
    pub fn fraction_changed(&self) -> f64 {
        self.changed as f64 / self.num_records as f64
    }
    /// `‖q̃ − q‖₁`.
    pub fn l1(&self) -> f64 {
        self.l1
    }
}

impl Stability<Private> {
    /// Release without any privacy guarantee (see [`RoutingStats::declassify_without_dp`]).
    pub fn declassify_without_dp(self) -> Stability<Public> {
        Stability {
            num_records: self.num_records,
            changed: self.changed,
            l1: self.l1,
            _provenance: PhantomData,
        }
    }
}

impl fmt::Debug for Stability<Private> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted private ownership stability>")
    }
}

impl fmt::Debug for Stability<Public> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stability<Public>")
            .field("num_records", &self.num_records)
            .field("changed", &self.changed)
            .field("l1", &self.l1)
            .finish()
    }
}

impl Serialize for Stability<Public> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Stability", 5)?;
        st.serialize_field("provenance", Public::LABEL)?;
        st.serialize_field("num_records", &self.num_records)?;
        st.serialize_field("changed", &self.changed)?;
        st.serialize_field("fraction_changed", &self.fraction_changed())?;
        st.serialize_field("l1", &self.l1)?;
        st.end()
    }
}

impl fmt::Display for Stability<Public> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "changed {}/{} ({:.4}), |q~ - q|_1 = {:.4}",
            self.changed,
            self.num_records,
            self.fraction_changed(),
            self.l1
        )
    }
}
