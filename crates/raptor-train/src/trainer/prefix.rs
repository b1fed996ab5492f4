//! The trainer's side of the frozen-prefix cache: each pass over cached records starts from
//! their hidden states after the frozen blocks (crate `raptor-run`'s `prefix` decides whether a
//! run has a cache and where it is kept).

use raptor_models::{Model, PrefixCache};
use tch::Device;

use crate::error::Result;

/// The hidden states of the records `chunk` (positions in `data`, the cache's record set)
/// from `cache`, computing those not cached yet: `(layers, [B, T, d])` for
/// `raptor_models::ForwardCtx::prefix`. None without a cache.
pub(crate) fn cached_prefix(
    cache: Option<&mut PrefixCache>,
    model: &dyn Model,
    data: &[super::Example],
    chunk: &[usize],
    pad_id: i64,
    device: Device,
) -> Result<Option<(usize, tch::Tensor)>> {
    let Some(cache) = cache else {
        return Ok(None);
    };
    let tokens: Vec<&[i64]> = chunk.iter().map(|&i| data[i].tokens.as_slice()).collect();
    let h = cache.hidden(model, chunk, &tokens, pad_id, device)?;
    Ok(Some((cache.layers(), h)))
}
