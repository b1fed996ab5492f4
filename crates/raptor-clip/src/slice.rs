//! Pure-Rust backend on slices (rayon): per-example clipping of gradient rows and blocks.

use crate::ClipError;
use crate::kernel::{BoundMode, Seg, fused_clip_sum};

/// Result of clipping gradient rows with one bound ([`clip_rows`]).
///
/// The fields are private: only the clipping functions build one, so the bound that
/// [`crate::Privatizer::release_rows`] calibrates its noise to is the one the records were
/// clipped to, and the sum holds nothing but clipped records.
///
/// A record with a non-finite entry (NaN or ±inf) contributes nothing: its factor is 0 and its
/// norm is reported as the non-finite value. Which records those are is private information.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipOutput {
    sum: Vec<f32>,
    norms: Vec<f64>,
    factors: Vec<f64>,
    bound: f64,
}

impl ClipOutput {
    /// Number of records clipped.
    pub fn batch(&self) -> usize {
        self.norms.len()
    }
    /// L2 sensitivity of the clipped sum under add/remove of one record: C.
    pub fn sensitivity(&self) -> f64 {
        self.bound
    }
    /// The bound C.
    pub fn bound(&self) -> f64 {
        self.bound
    }
    /// Σ_i factors_i · g_i, length P.
    pub fn sum(&self) -> &[f32] {
        &self.sum
    }
    /// Per record: the norm the bound is compared with, ‖w_i g_i‖ = w_i ‖g_i‖ (w_i = 1 when no
    /// weights are given; non-finite for a record with a non-finite entry).
    pub fn norms(&self) -> &[f64] {
        &self.norms
    }
    /// Per record: the multiplier applied to the raw gradient, w_i · min(1, C / (w_i ‖g_i‖))
    /// (0 for a non-finite record), so that record i contributes `factors[i] · g_i`.
    pub fn factors(&self) -> &[f64] {
        &self.factors
    }
    /// The norm of record `i` (`None` past the batch).
    pub fn norm(&self, i: usize) -> Option<f64> {
        self.norms.get(i).copied()
    }
    /// The factor of record `i` (`None` past the batch).
    pub fn factor(&self, i: usize) -> Option<f64> {
        self.factors.get(i).copied()
    }
}

pub(crate) fn check_bound(name: &str, value: f64) -> Result<(), ClipError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(ClipError::InvalidBound {
            name: name.to_string(),
            value,
        })
    }
}

pub(crate) fn check_weights(weights: Option<&[f64]>, batch: usize) -> Result<(), ClipError> {
    if let Some(w) = weights {
        if w.len() != batch {
            return Err(ClipError::ShapeMismatch {
                what: "weights".into(),
                expected: format!("{batch} (one per record)"),
                got: w.len().to_string(),
            });
        }
        for (index, &value) in w.iter().enumerate() {
            if !(0.0..=1.0).contains(&value) {
                return Err(ClipError::InvalidWeight { index, value });
            }
        }
    }
    Ok(())
}

/// Clip each row of a row-major `B × width` matrix to L2 norm `bound` and sum the rows.
///
/// With `weights` (w_i ∈ [0, 1], weight-then-clip), record i is first multiplied by w_i and the
/// product is clipped: it contributes `w_i · min(1, C / (w_i ‖g_i‖)) · g_i`. An empty `rows`
/// (zero records) gives a zero sum of length `width`.
///
/// One pass over memory (see the crate docs); norms are accumulated in f64, sums in f32.
///
/// ```
/// let g = [3.0f32, 4.0, 0.3, 0.4]; // two records of width 2, norms 5 and 0.5
/// let out = raptor_clip::clip_rows(&g, 2, 1.0, None).unwrap();
/// assert!((out.sum()[0] - (0.6 + 0.3)).abs() < 1e-6);
/// assert!((out.factors()[0] - 0.2).abs() < 1e-12 && out.factors()[1] == 1.0);
/// ```
pub fn clip_rows(
    rows: &[f32],
    width: usize,
    bound: f64,
    weights: Option<&[f64]>,
) -> Result<ClipOutput, ClipError> {
    check_bound("bound", bound)?;
    if width == 0 || !rows.len().is_multiple_of(width) {
        return Err(ClipError::ShapeMismatch {
            what: "rows".into(),
            expected: format!("a positive multiple of width {width}"),
            got: rows.len().to_string(),
        });
    }
    let batch = rows.len() / width;
    check_weights(weights, batch)?;
    let segs = [Seg {
        data: rows,
        width,
        group: 0,
    }];
    let bounds = [bound];
    let f = fused_clip_sum(&segs, batch, 1, BoundMode::PerGroup(&bounds), weights)?;
    let mut sums = f.sums;
    Ok(ClipOutput {
        sum: sums.remove(0),
        norms: f.norms,
        factors: f.factors,
        bound,
    })
}

/// One named block of per-example gradients: `data` is `B × width`, row-major (record i's
/// part of this parameter is `data[i*width..(i+1)*width]`).
#[derive(Debug, Clone, Copy)]
pub struct Block<'a> {
    /// Parameter name (diagnostics and error messages).
    pub name: &'a str,
    /// `B × width` values.
    pub data: &'a [f32],
    /// Number of entries of this parameter.
    pub width: usize,
}

impl<'a> Block<'a> {
    /// A block named `name` with `width` entries per record.
    pub fn new(name: &'a str, data: &'a [f32], width: usize) -> Self {
        Block { name, data, width }
    }
}

/// How blocks are grouped and bounded. Every form must cover each block exactly once.
///
/// The kernels know groups by position: group `g` of [`Grouping::Grouped`] and
/// [`Grouping::GlobalOverGroups`] is `groups[g]` (the indices of its blocks), [`Grouping::Flat`]
/// has one group and [`Grouping::PerBlock`] one per block, in block order. A caller who keys
/// groups by their own type builds this form with [`crate::ParamGroups::grouping`], which also
/// returns each position's key.
#[derive(Debug, Clone, PartialEq)]
pub enum Grouping {
    /// One bound over all blocks together (the monolithic baselines).
    Flat {
        /// The bound C.
        bound: f64,
    },
    /// Each group clipped to its own bound (RAPTOR: the shared stream and each expert stream).
    Grouped {
        /// The groups (a partition of the blocks): group `g` holds the block indices
        /// `groups[g]`.
        groups: Vec<Vec<usize>>,
        /// One bound per group.
        bounds: Vec<f64>,
    },
    /// Each block clipped to its own bound (DP-Muon's per-matrix clipping).
    PerBlock {
        /// One bound per block.
        bounds: Vec<f64>,
    },
    /// One factor from the norm over all groups, bound C, applied to every group (the
    /// matched-scope global clip baseline); per-group norms are still reported.
    GlobalOverGroups {
        /// The groups (a partition of the blocks): group `g` holds the block indices
        /// `groups[g]`.
        groups: Vec<Vec<usize>>,
        /// The bound C.
        bound: f64,
    },
}

/// Result of [`clip_blocks`].
///
/// The fields are private (read them with the getters): only [`clip_blocks`] builds one, so the
/// sensitivities a [`crate::Privatizer`] calibrates to are the bounds the records were clipped
/// to. A record with a non-finite entry contributes nothing in any group (factor 0, norms
/// non-finite); which records those are is private information.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockClipOutput {
    block_names: Vec<String>,
    sums: Vec<Vec<f32>>,
    block_group: Vec<usize>,
    group_bounds: Vec<f64>,
    batch: usize,
    norms: Vec<f64>,
    total_norms: Vec<f64>,
    factors: Vec<f64>,
    sensitivity: f64,
}

impl BlockClipOutput {
    /// Number of groups (the groups are those of the [`Grouping`], by position).
    pub fn n_groups(&self) -> usize {
        self.group_bounds.len()
    }
    /// Number of records.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// Block names, in input order.
    pub fn block_names(&self) -> &[String] {
        &self.block_names
    }
    /// Per block: Σ_i factor(i, group of block) · block row i.
    pub fn sums(&self) -> &[Vec<f32>] {
        &self.sums
    }
    /// Group of each block.
    pub fn block_group(&self) -> &[usize] {
        &self.block_group
    }
    /// Per group bound (GlobalOverGroups and Flat: the one bound for every group).
    pub fn group_bounds(&self) -> &[f64] {
        &self.group_bounds
    }
    /// `batch × n_groups`, row-major: norm of the weighted record restricted to the group.
    pub fn norms(&self) -> &[f64] {
        &self.norms
    }
    /// Per record: norm of the weighted record over all blocks.
    pub fn total_norms(&self) -> &[f64] {
        &self.total_norms
    }
    /// `batch × n_groups`, row-major: multiplier applied to the raw record in the group.
    pub fn factors(&self) -> &[f64] {
        &self.factors
    }
    /// L2 sensitivity of releasing all sums jointly (sqrt(Σ_g C_g²) for per-group bounds, C for
    /// Flat and GlobalOverGroups).
    pub fn sensitivity(&self) -> f64 {
        self.sensitivity
    }
    /// Row-major index of (record `i`, group `g`), if both are in range.
    fn index(&self, i: usize, g: usize) -> Option<usize> {
        let ng = self.n_groups();
        if i < self.batch && g < ng {
            i.checked_mul(ng)?.checked_add(g)
        } else {
            None
        }
    }
    /// Norm of weighted record `i` in group `g` (`None` when `i` or `g` is out of range).
    pub fn norm(&self, i: usize, g: usize) -> Option<f64> {
        self.index(i, g).and_then(|k| self.norms.get(k).copied())
    }
    /// Multiplier applied to raw record `i` in group `g` (`None` when out of range).
    pub fn factor(&self, i: usize, g: usize) -> Option<f64> {
        self.index(i, g).and_then(|k| self.factors.get(k).copied())
    }
    /// L2 sensitivity of releasing the sums of group `g` alone: its bound (`None` when `g` is
    /// not a group).
    pub fn group_sensitivity(&self, g: usize) -> Option<f64> {
        self.group_bounds.get(g).copied()
    }
}

/// Resolved grouping: (block → group, per-group bound, joint bound); the number of groups is
/// the number of bounds.
pub(crate) type Resolved = (Vec<usize>, Vec<f64>, Option<f64>);

/// Validate a grouping against the blocks named `names`; returns (block→group, per-group
/// bound, mode bound for Joint).
pub(crate) fn resolve(grouping: &Grouping, names: &[&str]) -> Result<Resolved, ClipError> {
    let n_blocks = names.len();
    let partition = |groups: &[Vec<usize>]| -> Result<Vec<usize>, ClipError> {
        let mut of = vec![usize::MAX; n_blocks];
        for (g, grp) in groups.iter().enumerate() {
            for &b in grp {
                if b >= n_blocks {
                    return Err(ClipError::InvalidGrouping {
                        reason: format!("group {g} names block {b}, only {n_blocks} blocks"),
                    });
                }
                if of[b] != usize::MAX {
                    return Err(ClipError::InvalidGrouping {
                        reason: format!("block {} ({}) is in two groups", b, names[b]),
                    });
                }
                of[b] = g;
            }
        }
        if let Some(b) = of.iter().position(|&g| g == usize::MAX) {
            return Err(ClipError::InvalidGrouping {
                reason: format!("block {} ({}) is in no group", b, names[b]),
            });
        }
        Ok(of)
    };
    match grouping {
        Grouping::Flat { bound } => {
            check_bound("bound", *bound)?;
            Ok((vec![0; n_blocks], vec![*bound], Some(*bound)))
        }
        Grouping::Grouped { groups, bounds } => {
            if groups.len() != bounds.len() {
                return Err(ClipError::ShapeMismatch {
                    what: "group bounds".into(),
                    expected: format!("{} (one per group)", groups.len()),
                    got: bounds.len().to_string(),
                });
            }
            for (g, &b) in bounds.iter().enumerate() {
                check_bound(&format!("group {g}"), b)?;
            }
            let of = partition(groups)?;
            Ok((of, bounds.clone(), None))
        }
        Grouping::PerBlock { bounds } => {
            if bounds.len() != n_blocks {
                return Err(ClipError::ShapeMismatch {
                    what: "block bounds".into(),
                    expected: format!("{n_blocks} (one per block)"),
                    got: bounds.len().to_string(),
                });
            }
            for (n, &b) in names.iter().zip(bounds) {
                check_bound(n, b)?;
            }
            Ok(((0..n_blocks).collect(), bounds.clone(), None))
        }
        Grouping::GlobalOverGroups { groups, bound } => {
            check_bound("bound", *bound)?;
            let of = partition(groups)?;
            Ok((of, vec![*bound; groups.len()], Some(*bound)))
        }
    }
}

/// Per-example clipping of gradients given as named blocks, in any [`Grouping`], with optional
/// weight-then-clip weights (w_i ∈ [0, 1] multiplies record i before its norms are taken).
///
/// All blocks must have the same number of records B (`data.len() == B · width`). Returns the
/// clipped sum of every block plus per-record, per-group norms and factors.
///
/// ```
/// use raptor_clip::{Block, Grouping, clip_blocks};
/// // two records; a "shared" block of width 2 and an "expert" block of width 1
/// let shared = [3.0f32, 4.0, 0.0, 0.1];
/// let expert = [1.0f32, 2.0];
/// let blocks = [Block::new("shared", &shared, 2), Block::new("expert", &expert, 1)];
/// let grouping = Grouping::Grouped {
///     groups: vec![vec![0], vec![1]], // group 0: the shared block; group 1: the expert's
///     bounds: vec![1.0, 1.5],
/// };
/// let out = clip_blocks(&blocks, &grouping, None).unwrap();
/// assert!((out.factor(0, 0).unwrap() - 0.2).abs() < 1e-12); // shared norm 5 clipped to 1
/// assert!((out.factor(1, 1).unwrap() - 0.75).abs() < 1e-12); // expert norm 2 clipped to 1.5
/// assert!((out.sums()[1][0] - 2.5).abs() < 1e-6); // 1 + 0.75·2
/// assert_eq!(out.factor(2, 0), None); // no third record
/// ```
pub fn clip_blocks(
    blocks: &[Block<'_>],
    grouping: &Grouping,
    weights: Option<&[f64]>,
) -> Result<BlockClipOutput, ClipError> {
    if blocks.is_empty() {
        return Err(ClipError::InvalidGrouping {
            reason: "no blocks given".into(),
        });
    }
    let names: Vec<&str> = blocks.iter().map(|b| b.name).collect();
    let (block_group, group_bounds, joint) = resolve(grouping, &names)?;
    let mut batch = None;
    for b in blocks {
        if b.width == 0 || !b.data.len().is_multiple_of(b.width) {
            return Err(ClipError::ShapeMismatch {
                what: format!("block {}", b.name),
                expected: format!("a multiple of width {}", b.width),
                got: b.data.len().to_string(),
            });
        }
        let bb = b.data.len() / b.width;
        match batch {
            None => batch = Some(bb),
            Some(x) if x != bb => {
                return Err(ClipError::ShapeMismatch {
                    what: format!("records in block {}", b.name),
                    expected: x.to_string(),
                    got: bb.to_string(),
                });
            }
            _ => {}
        }
    }
    let batch = batch.unwrap_or(0);
    check_weights(weights, batch)?;
    let segs: Vec<Seg<'_>> = blocks
        .iter()
        .zip(&block_group)
        .map(|(b, &g)| Seg {
            data: b.data,
            width: b.width,
            group: g,
        })
        .collect();
    let mode = match joint {
        Some(c) => BoundMode::Joint(c),
        None => BoundMode::PerGroup(&group_bounds),
    };
    let f = fused_clip_sum(&segs, batch, group_bounds.len(), mode, weights)?;
    let sensitivity = match joint {
        Some(c) => c,
        None => group_bounds.iter().map(|c| c * c).sum::<f64>().sqrt(),
    };
    Ok(BlockClipOutput {
        block_names: names.iter().map(|s| s.to_string()).collect(),
        sums: f.sums,
        block_group,
        group_bounds,
        batch,
        norms: f.norms,
        total_norms: f.total_norms,
        factors: f.factors,
        sensitivity,
    })
}

/// The joint L2 sensitivity sqrt(Σ C²) of a release of several independently clipped parts
/// (e.g. DP-Muon's per-matrix bounds).
pub fn joint_sensitivity(bounds: &[f64]) -> f64 {
    bounds.iter().map(|c| c * c).sum::<f64>().sqrt()
}
