//! Deterministic splits of record ids: validation hold-outs and public/private partitions.
//!
//! **Method.** Each id gets a 64-bit key: the first 8 bytes (big-endian) of
//! `SHA-256(tag ‖ seed as u64 little-endian ‖ id as u64 little-endian)`, where `tag` is
//! `b"raptor-data/validation/v1"` for [`validation_split`] and `b"raptor-data/public/v1"` for
//! [`public_private_split`] (so the two never coincide for the same seed). The ids are sorted by
//! (key, id) and the first `round(fraction · n)` go to the held-out side (validation, or
//! public); `round` rounds half away from zero. Both sides are returned in increasing id order.
//!
//! Consequences (all property-tested): the two sides are disjoint and cover the input; the
//! held-out size is exactly `round(fraction · n)`; the result depends only on the *set* of ids
//! and the seed (never on their order, nor on the texts); different seeds give different splits.
//! Duplicate ids in the input are an error.

use sha2::{Digest, Sha256};

use crate::DataError;

const VALIDATION_TAG: &[u8] = b"raptor-data/validation/v1";
const PUBLIC_TAG: &[u8] = b"raptor-data/public/v1";

/// A split of ids into two disjoint sides, each in increasing order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Split {
    /// The kept side (training, or private).
    pub kept: Vec<usize>,
    /// The held-out side (validation, or public): exactly `round(fraction · n)` ids.
    pub held_out: Vec<usize>,
}

/// The 64-bit key of `id` under `tag` and `seed` (see the module docs).
pub fn split_key(tag: &[u8], seed: u64, id: usize) -> u64 {
    let mut h = Sha256::new();
    h.update(tag);
    h.update(seed.to_le_bytes());
    h.update((id as u64).to_le_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_be_bytes(b)
}

/// The number of held-out ids for `n` ids and `fraction`: `round(fraction · n)`.
pub fn held_out_size(n: usize, fraction: f64) -> usize {
    ((fraction * n as f64).round() as usize).min(n)
}

fn split_tagged(
    ids: &[usize],
    fraction: f64,
    seed: u64,
    tag: &[u8],
    what: &'static str,
) -> Result<Split, DataError> {
    if !fraction.is_finite() || !(0.0..=1.0).contains(&fraction) {
        return Err(DataError::InvalidFraction {
            what,
            value: fraction,
        });
    }
    let mut keyed: Vec<(u64, usize)> = ids
        .iter()
        .map(|&id| (split_key(tag, seed, id), id))
        .collect();
    keyed.sort_unstable();
    let mut sorted_ids: Vec<usize> = ids.to_vec();
    sorted_ids.sort_unstable();
    if let Some(w) = sorted_ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(DataError::DuplicateId(w[0]));
    }
    let k = held_out_size(ids.len(), fraction);
    let mut held_out: Vec<usize> = keyed[..k].iter().map(|&(_, id)| id).collect();
    let mut kept: Vec<usize> = keyed[k..].iter().map(|&(_, id)| id).collect();
    held_out.sort_unstable();
    kept.sort_unstable();
    Ok(Split { kept, held_out })
}

/// Hold out `round(fraction · n)` of `ids` for validation (`held_out`), the rest for training
/// (`kept`).
///
/// ```
/// use raptor_data::validation_split;
/// let ids: Vec<usize> = (0..10).collect();
/// let s = validation_split(&ids, 0.2, 42)?;
/// assert_eq!(s.held_out.len(), 2);
/// assert_eq!(s.kept.len(), 8);
/// // Order of the input does not matter.
/// let rev: Vec<usize> = (0..10).rev().collect();
/// assert_eq!(validation_split(&rev, 0.2, 42)?, s);
/// # Ok::<(), raptor_data::DataError>(())
/// ```
pub fn validation_split(ids: &[usize], fraction: f64, seed: u64) -> Result<Split, DataError> {
    split_tagged(ids, fraction, seed, VALIDATION_TAG, "validation fraction")
}

/// Mark `round(public_fraction · n)` of `ids` as public (`held_out`: e.g. for routing statistics
/// and layer selection, never trained on privately), the rest private (`kept`).
pub fn public_private_split(
    ids: &[usize],
    public_fraction: f64,
    seed: u64,
) -> Result<Split, DataError> {
    split_tagged(ids, public_fraction, seed, PUBLIC_TAG, "public fraction")
}
