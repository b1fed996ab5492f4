//! Synthetic per-example gradients for benchmarks, examples and `raptor reproduce`: the same
//! deterministic data wherever the kernels are timed, so figures from different tools compare.

use crate::slice::{Block, Grouping};

/// `n` deterministic pseudo-random entries (xorshift64 from `seed`), uniform in ±0.005.
///
/// ```
/// let g = raptor_clip::workload::synthetic_gradients(1000, 7);
/// assert_eq!(g, raptor_clip::workload::synthetic_gradients(1000, 7));
/// assert!(g.iter().all(|v| v.abs() <= 0.005));
/// ```
pub fn synthetic_gradients(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.01
        })
        .collect()
}

/// RAPTOR-shaped grouped workload: `B` records whose `P` coordinates are split into a shared
/// block of `P/2` and four expert blocks of about `P/8`, each block its own group, with bounds
/// `0.0029·√width` (so that about half of the records are clipped in each group).
#[derive(Debug, Clone)]
pub struct GroupedWorkload {
    /// Records `B`.
    pub records: usize,
    /// Widths of the five blocks (they sum to `P`).
    pub widths: [usize; 5],
    /// Row-major `B × width` data of each block.
    pub data: Vec<Vec<f32>>,
}

impl GroupedWorkload {
    /// Block and group names, in order.
    pub const NAMES: [&'static str; 5] = ["shared", "e0", "e1", "e2", "e3"];

    /// The workload for `records` records of `coords` coordinates in all.
    ///
    /// ```
    /// use raptor_clip::{clip_blocks, workload::GroupedWorkload};
    /// let w = GroupedWorkload::new(8, 1000);
    /// assert_eq!(w.widths.iter().sum::<usize>(), 1000);
    /// let out = clip_blocks(&w.blocks(), &w.grouping(), None)?;
    /// assert_eq!(out.sums().len(), 5);
    /// # Ok::<(), raptor_clip::ClipError>(())
    /// ```
    pub fn new(records: usize, coords: usize) -> Self {
        let p = coords;
        let widths = [p / 2, p / 8, p / 8, p / 8, p - p / 2 - 3 * (p / 8)];
        let data = widths
            .iter()
            .enumerate()
            .map(|(k, &w)| synthetic_gradients(records * w, k as u64 + 7))
            .collect();
        Self {
            records,
            widths,
            data,
        }
    }

    /// The five blocks, borrowing the data.
    pub fn blocks(&self) -> Vec<Block<'_>> {
        (0..5)
            .map(|k| Block::new(Self::NAMES[k], &self.data[k], self.widths[k]))
            .collect()
    }

    /// One group per block (group k is block k, named `NAMES[k]`), each with its own bound.
    pub fn grouping(&self) -> Grouping {
        Grouping::Grouped {
            groups: (0..5).map(|k| vec![k]).collect(),
            bounds: self
                .widths
                .iter()
                .map(|&w| (w as f64).sqrt() * 0.0029)
                .collect(),
        }
    }
}
