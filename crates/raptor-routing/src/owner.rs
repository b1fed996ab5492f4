//! Owner maps: one owning expert per record (RAPTOR's pre-pass).
//!
//! Computed once, before training, from the frozen router at initialization; fixed for the
//! whole run. Each record's owner depends on that record alone (given the public pretrained
//! model), so the owner groups partition the records independently of one another, which is
//! what lets the expert streams of a layer compose in parallel. The default rule is the RAPTOR
//! paper's gate-weighted plurality over the router's top-k choices (ties to the lowest index, a
//! record without valid tokens to expert 0); the public Python implementation of RAPTOR counts
//! top-1 tokens instead for Switch models, which [`OwnerRule::TokenCount`] reproduces.

use half::f16;
use rayon::prelude::*;

use crate::RoutingError;
use crate::layer::{ExpertIds, GateWeights, LayerRouting};

/// How a record's owner is chosen from its tokens' router choices.
///
/// Both rules take the argmax over experts of a per-record score, **ties to the lowest expert
/// index**; a record with no valid token (or whose scores are all zero) is owned by expert 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OwnerRule {
    /// Gate-weighted plurality (the default; the RAPTOR paper's rule, §5.2, and the public code's OLMoE
    /// path): `score[e] = Σ_{valid t} Σ_{slot k} w[t,k] · 1[sel[t,k] = e]`.
    #[default]
    GateWeighted,
    /// Token-count plurality over each valid token's top-1 choice (the public code's Switch
    /// path): `score[e] = #{valid t : top1(t) = e}`, where `top1(t)` is the selected expert with
    /// the largest gate weight (ties: lowest expert index). With top-1 routing this is the
    /// plain count of tokens routed to `e`.
    TokenCount,
}

/// The owner of every record for one layer, plus the number of experts.
///
/// Owner maps of private records are themselves private: use them inside the trainer, never
/// log or release them (nor their [`OwnerMap::counts`]). See [`crate::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerMap {
    owners: Vec<u32>,
    num_experts: usize,
}

impl OwnerMap {
    /// Build from explicit owners (e.g. a stored map). Errors when an owner is `≥ num_experts`
    /// or `num_experts` is 0.
    pub fn from_owners(owners: Vec<u32>, num_experts: usize) -> Result<Self, RoutingError> {
        if num_experts == 0 {
            return Err(RoutingError::NoExperts(0));
        }
        if let Some((r, &o)) = owners
            .iter()
            .enumerate()
            .find(|&(_, &o)| o as usize >= num_experts)
        {
            return Err(RoutingError::ExpertOutOfRange {
                token: r,
                slot: 0,
                index: i64::from(o),
                num_experts,
            });
        }
        Ok(Self {
            owners,
            num_experts,
        })
    }

    /// The owner of each record, in record order.
    pub fn owners(&self) -> &[u32] {
        &self.owners
    }

    /// The owner of record `r` (`None` when out of range).
    pub fn owner(&self, r: usize) -> Option<u32> {
        self.owners.get(r).copied()
    }

    /// Number of experts `E`.
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    /// Number of records.
    pub fn num_records(&self) -> usize {
        self.owners.len()
    }

    /// Number of records owned by each expert (length `E`).
    pub fn counts(&self) -> Vec<u64> {
        let mut c = vec![0u64; self.num_experts];
        for &o in &self.owners {
            c[o as usize] += 1;
        }
        c
    }

    /// The record indices owned by each expert (length `E`, each in increasing order).
    pub fn groups(&self) -> Vec<Vec<usize>> {
        let mut g = vec![Vec::new(); self.num_experts];
        for (r, &o) in self.owners.iter().enumerate() {
            g[o as usize].push(r);
        }
        g
    }
}

/// The owner map of a layer under `rule`. Parallel over records (rayon); each owner depends
/// only on its own record, so the result does not depend on batching, order or thread count.
pub fn owner_map(layer: &LayerRouting, rule: OwnerRule) -> OwnerMap {
    let owners = match (&layer.experts, &layer.weights) {
        (ExpertIds::U8(e), GateWeights::F32(w)) => owners_typed(layer, e, w, rule),
        (ExpertIds::U8(e), GateWeights::F16(w)) => owners_typed(layer, e, w, rule),
        (ExpertIds::U16(e), GateWeights::F32(w)) => owners_typed(layer, e, w, rule),
        (ExpertIds::U16(e), GateWeights::F16(w)) => owners_typed(layer, e, w, rule),
        (ExpertIds::U32(e), GateWeights::F32(w)) => owners_typed(layer, e, w, rule),
        (ExpertIds::U32(e), GateWeights::F16(w)) => owners_typed(layer, e, w, rule),
    };
    OwnerMap {
        owners,
        num_experts: layer.num_experts(),
    }
}

/// The owner of a single record, without storing it (same rule and validation as
/// [`LayerRouting::push_record`] followed by [`owner_map`]).
///
/// ```
/// use raptor_routing::{record_owner, OwnerRule};
/// // top-1, 4 tokens: experts 2, 1, 2, 1 with weights .9, .8, .1, .8 (token 3 is padding)
/// let (e, w, m) = ([2, 1, 2, 1], [0.9, 0.8, 0.1, 0.8], [true, true, true, false]);
/// assert_eq!(record_owner(&e, &w, &m, 3, 1, OwnerRule::GateWeighted)?, 2); // 1.0 vs 0.8
/// assert_eq!(record_owner(&e, &w, &m, 3, 1, OwnerRule::TokenCount)?, 2); // 2 tokens vs 1
/// # Ok::<(), raptor_routing::RoutingError>(())
/// ```
pub fn record_owner(
    experts: &[u32],
    weights: &[f32],
    mask: &[bool],
    num_experts: usize,
    top_k: usize,
    rule: OwnerRule,
) -> Result<u32, RoutingError> {
    let mut layer = LayerRouting::new(num_experts, top_k)?;
    layer.push_record(experts, weights, mask)?;
    Ok(owner_map(&layer, rule).owners[0])
}

/// Stored weights, converted to `f32` one record at a time.
trait Weight: Copy + Sync {
    /// `out[i] = src[i] as f32` (`out.len() == src.len()`).
    fn convert(src: &[Self], out: &mut Vec<f32>);
}
impl Weight for f32 {
    #[inline]
    fn convert(src: &[Self], out: &mut Vec<f32>) {
        out.clear();
        out.extend_from_slice(src);
    }
}
impl Weight for f16 {
    #[inline]
    fn convert(src: &[Self], out: &mut Vec<f32>) {
        use half::slice::HalfFloatSliceExt;
        out.clear();
        out.resize(src.len(), 0.0);
        src.convert_to_f32_slice(out);
    }
}

/// Dense score arrays up to this many experts; above, only the touched experts are visited.
const DENSE_MAX_EXPERTS: usize = 1024;

fn owners_typed<I, W>(layer: &LayerRouting, ids: &[I], w: &[W], rule: OwnerRule) -> Vec<u32>
where
    I: Copy + Into<u32> + Sync,
    W: Weight,
{
    let n = layer.num_records();
    let e = layer.num_experts();
    (0..n)
        .into_par_iter()
        .with_min_len(256)
        .map_init(
            || (vec![0f64; e], Vec::new()),
            |(scores, wbuf), r| owner_of(layer, ids, w, rule, r, scores, wbuf),
        )
        .collect()
}

/// Owner of record `r`. `scores` is all-zero on entry and on exit; `wbuf` is scratch.
#[inline]
fn owner_of<I, W>(
    layer: &LayerRouting,
    ids: &[I],
    w: &[W],
    rule: OwnerRule,
    r: usize,
    scores: &mut [f64],
    wbuf: &mut Vec<f32>,
) -> u32
where
    I: Copy + Into<u32>,
    W: Weight,
{
    let k = layer.top_k();
    let (start, end) = (layer.offsets[r], layer.offsets[r + 1]);
    let valid = |pos: usize| (layer.mask[pos / 64] >> (pos % 64)) & 1 == 1;
    let rec_ids = &ids[start * k..end * k];
    W::convert(&w[start * k..end * k], wbuf);
    let rec_w: &[f32] = wbuf;
    // Accumulate.
    match rule {
        // Padding tokens are stored as (expert 0, weight +0.0) and adding +0.0 leaves every
        // score unchanged, so the gate-weighted sum needs no mask test.
        OwnerRule::GateWeighted => {
            for (&i, &x) in rec_ids.iter().zip(rec_w) {
                scores[i.into() as usize] += f64::from(x);
            }
        }
        OwnerRule::TokenCount => {
            for (t, (ids_t, w_t)) in rec_ids
                .chunks_exact(k)
                .zip(rec_w.chunks_exact(k))
                .enumerate()
            {
                if !valid(start + t) {
                    continue;
                }
                let mut best = (ids_t[0].into(), w_t[0]);
                for (&i, &x) in ids_t.iter().zip(w_t).skip(1) {
                    let i = i.into();
                    if x > best.1 || (x == best.1 && i < best.0) {
                        best = (i, x);
                    }
                }
                scores[best.0 as usize] += 1.0;
            }
        }
    }
    // Argmax, ties to the lowest index; all-zero scores give expert 0.
    let owner = if scores.len() <= DENSE_MAX_EXPERTS {
        let mut best = 0usize;
        for (j, &s) in scores.iter().enumerate().skip(1) {
            if s > scores[best] {
                best = j;
            }
        }
        scores.iter_mut().for_each(|s| *s = 0.0);
        best
    } else {
        // Only experts chosen by a valid token can have a positive score.
        let mut best = (0usize, scores[0]);
        for pos in (start..end).filter(|&p| valid(p)) {
            for &i in &ids[pos * k..pos * k + k] {
                let j = i.into() as usize;
                if scores[j] > best.1 || (scores[j] == best.1 && j < best.0) {
                    best = (j, scores[j]);
                }
            }
        }
        for pos in (start..end).filter(|&p| valid(p)) {
            for &i in &ids[pos * k..pos * k + k] {
                scores[i.into() as usize] = 0.0;
            }
        }
        best.0
    };
    // owner < num_experts ≤ u32::MAX (checked at construction).
    #[allow(clippy::cast_possible_truncation)]
    let owner = owner as u32;
    owner
}
