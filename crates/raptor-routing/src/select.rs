//! Public-corpus layer selection (the RAPTOR paper, §4.3 and §5.1): choose the sparse layer
//! whose owner distribution on a **public** corpus has the highest entropy. Costs no privacy budget because
//! it never touches private records.

use std::fmt;

use serde::Serialize;

use crate::stats::{Public, RoutingStats};
use crate::{LayerRouting, OwnerMap, OwnerRule, RoutingError, owner_map};

/// Router outputs of candidate sparse layers on a **public** corpus.
///
/// Constructing one is the caller's statement that these records are public (not the private
/// training set): statistics derived from it are [`Public`] and free to print.
#[derive(Debug, Clone, Default)]
pub struct PublicCorpus {
    layers: Vec<(usize, LayerRouting)>,
}

impl PublicCorpus {
    /// An empty corpus.
    pub fn new() -> Self {
        Self::default()
    }

    /// A corpus whose candidate layers are numbered `0..layers.len()` (sparse-layer ids).
    pub fn from_layers(layers: Vec<LayerRouting>) -> Result<Self, RoutingError> {
        let mut c = Self::new();
        for (i, l) in layers.into_iter().enumerate() {
            c.add_layer(i, l)?;
        }
        Ok(c)
    }

    /// Add candidate layer `id` (any numbering, e.g. the block index of a sparse layer). All
    /// layers must hold the same number of records (the same corpus).
    pub fn add_layer(&mut self, id: usize, routing: LayerRouting) -> Result<(), RoutingError> {
        if self.layers.iter().any(|(i, _)| *i == id) {
            return Err(RoutingError::DuplicateLayer(id));
        }
        if let Some((_, first)) = self.layers.first()
            && first.num_records() != routing.num_records()
        {
            return Err(RoutingError::Mismatch {
                what: "num_records of candidate layers",
                left: first.num_records(),
                right: routing.num_records(),
            });
        }
        self.layers.push((id, routing));
        self.layers.sort_by_key(|(i, _)| *i);
        Ok(())
    }

    /// The candidate layers, by increasing id.
    pub fn layers(&self) -> &[(usize, LayerRouting)] {
        &self.layers
    }

    /// Number of records in the corpus (0 when it has no layer).
    pub fn num_records(&self) -> usize {
        self.layers.first().map_or(0, |(_, l)| l.num_records())
    }

    /// Owner maps of every candidate layer (of public records).
    pub fn owner_maps(&self, rule: OwnerRule) -> Vec<(usize, OwnerMap)> {
        self.layers
            .iter()
            .map(|(i, l)| (*i, owner_map(l, rule)))
            .collect()
    }

    /// Public statistics of every candidate layer. Errors when the corpus has no record.
    pub fn layer_stats(
        &self,
        rule: OwnerRule,
    ) -> Result<Vec<(usize, RoutingStats<Public>)>, RoutingError> {
        self.owner_maps(rule)
            .iter()
            .map(|(i, m)| Ok((*i, RoutingStats::from_counts(&m.counts())?)))
            .collect()
    }
}

/// Settings of [`select_layer`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SelectionConfig {
    /// Owner rule used on the public corpus (default gate-weighted).
    pub rule: OwnerRule,
    /// Warn when the winner's entropy margin over the runner-up is below this (nats; 0.05).
    pub min_margin_nats: f64,
    /// Warn when the corpus has fewer records than this (1000).
    pub min_records: usize,
    /// A variant we inferred (the paper does not state it): when the argmax does not beat
    /// the **last** candidate layer by more than `min_margin_nats`, choose the last layer.
    /// Off by default (the plain argmax is chosen, with a warning when the margin is small).
    pub prefer_last_within_margin: bool,
}

impl Default for SelectionConfig {
    fn default() -> Self {
        Self {
            rule: OwnerRule::GateWeighted,
            min_margin_nats: 0.05,
            min_records: 1000,
            prefer_last_within_margin: false,
        }
    }
}

/// Why a layer was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelectionReason {
    /// Highest owner entropy on the public corpus.
    MaxEntropy,
    /// The argmax did not beat the last layer by the margin (`prefer_last_within_margin`).
    LastWithinMargin,
    /// No public corpus: the last sparse layer (the public code's default).
    NoPublicCorpus,
}

/// A caveat attached to a selection.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SelectionWarning {
    /// The winner beats the runner-up by less than the threshold: the choice is fragile.
    SmallMargin {
        /// Entropy margin (nats).
        margin: f64,
        /// Threshold (nats).
        threshold: f64,
    },
    /// The public corpus is smaller than recommended.
    SmallCorpus {
        /// Records in the corpus.
        records: usize,
        /// Recommended minimum.
        min: usize,
    },
    /// Only one candidate layer: no margin.
    SingleCandidate,
    /// No public corpus was given; the default (last sparse layer) was used.
    NoPublicCorpus,
}

impl fmt::Display for SelectionWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SelectionWarning::SmallMargin { margin, threshold } => write!(
                f,
                "entropy margin to the runner-up is {margin:.4} nats, below {threshold} nats: the choice is fragile"
            ),
            SelectionWarning::SmallCorpus { records, min } => {
                write!(
                    f,
                    "public corpus has {records} records, fewer than the recommended {min}"
                )
            }
            SelectionWarning::SingleCandidate => f.write_str("only one candidate layer"),
            SelectionWarning::NoPublicCorpus => {
                f.write_str("no public corpus: defaulting to the last sparse layer")
            }
        }
    }
}

/// The chosen layer and the evidence for it (all public).
#[derive(Debug, Clone, Serialize)]
pub struct LayerSelection {
    /// The chosen layer id.
    pub layer: usize,
    /// Why.
    pub reason: SelectionReason,
    /// The best other layer by entropy (`None` with fewer than two candidates or no corpus).
    pub runner_up: Option<usize>,
    /// `H(argmax) − H(runner-up)` in nats (`None` as for `runner_up`).
    pub margin_nats: Option<f64>,
    /// Caveats.
    pub warnings: Vec<SelectionWarning>,
    /// Per-candidate public statistics, by increasing layer id (empty without a corpus).
    pub stats: Vec<(usize, RoutingStats<Public>)>,
}

/// Pick the candidate layer of highest owner entropy `H` (nats) on the public corpus.
///
/// Entropies are compared in nats, not normalized (layers of one model share `E`; compare
/// [`RoutingStats::normalized_entropy`] yourself if yours do not). Exact ties go to the later
/// layer, i.e. towards the no-corpus default. Warnings: margin below
/// [`SelectionConfig::min_margin_nats`], corpus smaller than [`SelectionConfig::min_records`],
/// single candidate.
///
/// ```
/// use raptor_routing::{select_layer, LayerRouting, PublicCorpus, SelectionConfig};
/// let mut skewed = LayerRouting::new(2, 1)?;
/// let mut balanced = LayerRouting::new(2, 1)?;
/// for r in 0..10u32 {
///     skewed.push_record(&[u32::from(r == 0)], &[1.0], &[true])?; // owners: 1, 0, 0, ...
///     balanced.push_record(&[r % 2], &[1.0], &[true])?; // owners alternate
/// }
/// let corpus = PublicCorpus::from_layers(vec![balanced, skewed])?;
/// let sel = select_layer(&corpus, &SelectionConfig::default())?;
/// assert_eq!(sel.layer, 0);
/// assert!(!sel.warnings.is_empty()); // 10 records < 1000
/// # Ok::<(), raptor_routing::RoutingError>(())
/// ```
pub fn select_layer(
    corpus: &PublicCorpus,
    config: &SelectionConfig,
) -> Result<LayerSelection, RoutingError> {
    if corpus.layers().is_empty() {
        return Err(RoutingError::NoCandidateLayers);
    }
    let stats = corpus.layer_stats(config.rule)?;
    // Argmax with ties to the later layer (>=).
    let mut best = 0;
    for (j, (_, s)) in stats.iter().enumerate() {
        if s.entropy() >= stats[best].1.entropy() {
            best = j;
        }
    }
    let runner = (0..stats.len())
        .filter(|&j| j != best)
        .fold(None, |acc: Option<usize>, j| match acc {
            Some(a) if stats[a].1.entropy() > stats[j].1.entropy() => Some(a),
            _ => Some(j),
        });
    let margin = runner.map(|j| stats[best].1.entropy() - stats[j].1.entropy());
    let mut warnings = Vec::new();
    match margin {
        None => warnings.push(SelectionWarning::SingleCandidate),
        Some(m) if m < config.min_margin_nats => warnings.push(SelectionWarning::SmallMargin {
            margin: m,
            threshold: config.min_margin_nats,
        }),
        Some(_) => {}
    }
    if corpus.num_records() < config.min_records {
        warnings.push(SelectionWarning::SmallCorpus {
            records: corpus.num_records(),
            min: config.min_records,
        });
    }
    let last = stats.len() - 1;
    let (chosen, reason) = if config.prefer_last_within_margin
        && best != last
        && stats[best].1.entropy() - stats[last].1.entropy() <= config.min_margin_nats
    {
        (last, SelectionReason::LastWithinMargin)
    } else {
        (best, SelectionReason::MaxEntropy)
    };
    Ok(LayerSelection {
        layer: stats[chosen].0,
        reason,
        runner_up: runner.map(|j| stats[j].0),
        margin_nats: margin,
        warnings,
        stats,
    })
}

/// The selection without a public corpus: the last of `sparse_layers` (by value), with a
/// [`SelectionWarning::NoPublicCorpus`] warning.
pub fn default_layer(sparse_layers: &[usize]) -> Result<LayerSelection, RoutingError> {
    let layer = sparse_layers
        .iter()
        .copied()
        .max()
        .ok_or(RoutingError::NoCandidateLayers)?;
    Ok(LayerSelection {
        layer,
        reason: SelectionReason::NoPublicCorpus,
        runner_up: None,
        margin_nats: None,
        warnings: vec![SelectionWarning::NoPublicCorpus],
        stats: Vec::new(),
    })
}
