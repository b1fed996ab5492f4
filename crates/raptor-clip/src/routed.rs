//! Per-record gradients of a linear weight over rows grouped by record (the routed rows of a
//! mixture-of-experts expert, or any ragged token layout), without padding.
//!
//! A record `b` owns rows `offsets[b]..offsets[b + 1]` of the input rows `a` (`rows × d_in`)
//! and of the output-gradient rows `g` (`rows × d_out`). Its gradient of the weight
//! `[d_out, d_in]` is `G_b = Σ_t g_t a_tᵀ` over its rows. [`routed_linear_grads`] writes every
//! `G_b` and its squared Frobenius norm, touching each row once: the padded form (every record
//! widened to the largest record's row count, then one batched product) reads and writes
//! `max_b rows_b / mean_b rows_b` times more, which is several times for routed experts.
//!
//! ```
//! use raptor_clip::routed::routed_linear_grads;
//!
//! // Two records: rows 0..2 belong to the first, row 2 to the second; d_in = 2, d_out = 1.
//! let a = [1.0f32, 0.0, 0.0, 2.0, 3.0, 4.0];
//! let g = [1.0f32, 1.0, 2.0];
//! let mut grads = [0.0f32; 4];
//! let mut sq = [0.0f64; 2];
//! routed_linear_grads(&a, 2, &g, 1, &[0, 2, 3], &mut grads, &mut sq, false)?;
//! assert_eq!(grads, [1.0, 2.0, 6.0, 8.0]);
//! assert_eq!(sq, [5.0, 100.0]);
//! # Ok::<(), raptor_clip::ClipError>(())
//! ```

use rayon::prelude::*;

use crate::ClipError;
use crate::kernel::{ghost_sq_rows, outer_sum_rows, sq_norm};

fn mismatch(what: &str, expected: usize, got: usize) -> ClipError {
    ClipError::ShapeMismatch {
        what: what.to_string(),
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

/// Per-record gradients `G_b = Σ_{t ∈ rows of b} g_t a_tᵀ` (`[d_out, d_in]` row-major, record
/// after record, into `grads`: `n · d_out · d_in` entries) and their squared norms (`sq_norms`,
/// `n` entries, accumulated in f64) for `n = offsets.len() − 1` records.
///
/// `a`: `rows × d_in` row-major, `g`: `rows × d_out` row-major, `offsets`: `n + 1`
/// non-decreasing row offsets from 0 to `rows`. A record without rows gets zeros. A record
/// whose rows hold NaN gets a NaN norm, one with ±inf (and no NaN) an infinite one, so callers
/// can drop it. With `parallel`, records are spread over the rayon pool.
///
/// # Errors
/// [`ClipError::ShapeMismatch`] when the slices or offsets disagree.
#[allow(clippy::too_many_arguments)]
pub fn routed_linear_grads(
    a: &[f32],
    d_in: usize,
    g: &[f32],
    d_out: usize,
    offsets: &[usize],
    grads: &mut [f32],
    sq_norms: &mut [f64],
    parallel: bool,
) -> Result<(), ClipError> {
    let n = check(a, d_in, g, d_out, offsets)?;
    let per = d_out
        .checked_mul(d_in)
        .ok_or_else(|| mismatch("per-record gradient entries", usize::MAX, usize::MAX))?;
    if Some(grads.len()) != n.checked_mul(per) {
        return Err(mismatch(
            "per-record gradients (n · d_out · d_in)",
            n.saturating_mul(per),
            grads.len(),
        ));
    }
    if sq_norms.len() != n {
        return Err(mismatch("squared norms (records)", n, sq_norms.len()));
    }
    if per == 0 {
        sq_norms.fill(0.0);
        return Ok(());
    }
    let record = |b: usize, out: &mut [f32], sq: &mut f64, tmp: &mut Vec<f32>| {
        let (lo, hi) = (offsets[b], offsets[b + 1]);
        if tmp.len() != per {
            tmp.resize(per, 0.0);
        }
        outer_sum_rows(
            &a[lo * d_in..hi * d_in],
            d_in,
            &g[lo * d_out..hi * d_out],
            d_out,
            out,
            tmp,
        );
        *sq = sq_norm(out);
    };
    if parallel {
        grads
            .par_chunks_mut(per)
            .zip(sq_norms.par_iter_mut())
            .enumerate()
            .for_each_init(Vec::new, |tmp, (b, (out, sq))| record(b, out, sq, tmp));
    } else {
        let mut tmp = Vec::new();
        for (b, (out, sq)) in grads.chunks_mut(per).zip(sq_norms.iter_mut()).enumerate() {
            record(b, out, sq, &mut tmp);
        }
    }
    Ok(())
}

/// Squared norms (`sq_norms`, `n` entries) of the per-record gradients of
/// [`routed_linear_grads`] without forming them, by the ghost identity over each record's own
/// rows: `‖G_b‖² = Σ_{t,t'} (a_t·a_t')(g_t·g_t')`, about `rows_b² (d_in + d_out) / 2`
/// multiply-adds per record (see [`ragged_cost`] for when that is the cheaper way). Same
/// arguments, errors and NaN/inf behaviour as [`routed_linear_grads`].
///
/// # Errors
/// [`ClipError::ShapeMismatch`] when the slices or offsets disagree.
pub fn routed_linear_sq_norms(
    a: &[f32],
    d_in: usize,
    g: &[f32],
    d_out: usize,
    offsets: &[usize],
    sq_norms: &mut [f64],
    parallel: bool,
) -> Result<(), ClipError> {
    let n = check(a, d_in, g, d_out, offsets)?;
    if sq_norms.len() != n {
        return Err(mismatch("squared norms (records)", n, sq_norms.len()));
    }
    let record = |b: usize| {
        let (lo, hi) = (offsets[b], offsets[b + 1]);
        ghost_sq_rows(
            &a[lo * d_in..hi * d_in],
            d_in,
            &g[lo * d_out..hi * d_out],
            d_out,
        )
    };
    if parallel {
        sq_norms
            .par_iter_mut()
            .enumerate()
            .for_each(|(b, sq)| *sq = record(b));
    } else {
        for (b, sq) in sq_norms.iter_mut().enumerate() {
            *sq = record(b);
        }
    }
    Ok(())
}

/// Work of the two ways to the squared norms of per-record gradients over ragged rows
/// (`rows[b]` rows for record b), in multiply-adds and entries moved: `(ghost, materialized)`.
/// Ghost: `Σ_b rows_b (rows_b + 1) / 2 · (d_in + d_out)`. Materialized: `Σ_b rows_b · d_in ·
/// d_out` plus `3 · n · d_in · d_out` for writing, squaring and later summing the gradients.
pub fn ragged_cost(rows: &[usize], d_in: usize, d_out: usize) -> (f64, f64) {
    let (di, dout) = (d_in as f64, d_out as f64);
    let ghost: f64 = rows
        .iter()
        .map(|&t| (t as f64) * (t as f64 + 1.0) / 2.0 * (di + dout))
        .sum();
    let mat: f64 = rows.iter().map(|&t| t as f64 * di * dout).sum::<f64>()
        + 3.0 * rows.len() as f64 * di * dout;
    (ghost, mat)
}

/// Checks the shared arguments; returns the number of records.
fn check(
    a: &[f32],
    d_in: usize,
    g: &[f32],
    d_out: usize,
    offsets: &[usize],
) -> Result<usize, ClipError> {
    if offsets.is_empty() {
        return Err(mismatch("routed offsets (records + 1)", 1, 0));
    }
    if offsets[0] != 0 {
        return Err(mismatch("first routed offset", 0, offsets[0]));
    }
    if let Some(w) = offsets.windows(2).find(|w| w[1] < w[0]) {
        return Err(ClipError::ShapeMismatch {
            what: "routed offsets (non-decreasing)".into(),
            expected: format!(">= {}", w[0]),
            got: w[1].to_string(),
        });
    }
    let n = offsets.len() - 1;
    let rows = offsets[n];
    if Some(a.len()) != rows.checked_mul(d_in) {
        return Err(mismatch(
            "input rows (rows · d_in)",
            rows.saturating_mul(d_in),
            a.len(),
        ));
    }
    if Some(g.len()) != rows.checked_mul(d_out) {
        return Err(mismatch(
            "output-gradient rows (rows · d_out)",
            rows.saturating_mul(d_out),
            g.len(),
        ));
    }
    Ok(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious triple loop in f64.
    fn slow(
        a: &[f32],
        d_in: usize,
        g: &[f32],
        d_out: usize,
        offsets: &[usize],
    ) -> (Vec<f64>, Vec<f64>) {
        let n = offsets.len() - 1;
        let mut grads = vec![0f64; n * d_out * d_in];
        let mut sq = vec![0f64; n];
        for b in 0..n {
            for t in offsets[b]..offsets[b + 1] {
                for o in 0..d_out {
                    for i in 0..d_in {
                        grads[(b * d_out + o) * d_in + i] +=
                            f64::from(g[t * d_out + o]) * f64::from(a[t * d_in + i]);
                    }
                }
            }
            sq[b] = grads[b * d_out * d_in..(b + 1) * d_out * d_in]
                .iter()
                .map(|x| x * x)
                .sum();
        }
        (grads, sq)
    }

    fn case() -> impl Strategy<Value = (usize, usize, Vec<usize>, Vec<f32>, Vec<f32>, bool)> {
        (
            1usize..40,
            1usize..40,
            prop::collection::vec(0usize..11, 0..7),
            any::<bool>(),
        )
            .prop_flat_map(|(d_in, d_out, counts, par)| {
                let mut offsets = vec![0usize];
                for c in &counts {
                    offsets.push(offsets.last().copied().unwrap_or(0) + c);
                }
                let rows = *offsets.last().unwrap_or(&0);
                (
                    Just(d_in),
                    Just(d_out),
                    Just(offsets),
                    prop::collection::vec(-4.0f32..4.0, rows * d_in),
                    prop::collection::vec(-4.0f32..4.0, rows * d_out),
                    Just(par),
                )
            })
    }

    proptest! {
        #[test]
        fn matches_the_triple_loop((d_in, d_out, offsets, a, g, par) in case()) {
            let n = offsets.len() - 1;
            let mut grads = vec![f32::NAN; n * d_out * d_in];
            let mut sq = vec![f64::NAN; n];
            routed_linear_grads(&a, d_in, &g, d_out, &offsets, &mut grads, &mut sq, par).unwrap();
            let (want, want_sq) = slow(&a, d_in, &g, d_out, &offsets);
            let rows_max = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0) as f64;
            for (x, y) in grads.iter().zip(&want) {
                // f32 sums of ≤ rows_max products of magnitude ≤ 16.
                prop_assert!((f64::from(*x) - y).abs() <= 1e-5 * 16.0 * rows_max.max(1.0), "{x} vs {y}");
            }
            for (b, (s, w)) in sq.iter().zip(&want_sq).enumerate() {
                let of_out: f64 = grads[b * d_out * d_in..(b + 1) * d_out * d_in]
                    .iter()
                    .map(|&x| f64::from(x) * f64::from(x))
                    .sum();
                prop_assert!((s - of_out).abs() <= 1e-9 * of_out.max(1.0), "norm of the output");
                prop_assert!((s - w).abs() <= 1e-4 * w.max(1.0), "{s} vs {w}");
            }
            let mut ghost = vec![f64::NAN; n];
            routed_linear_sq_norms(&a, d_in, &g, d_out, &offsets, &mut ghost, par).unwrap();
            for (b, (s, w)) in ghost.iter().zip(&want_sq).enumerate() {
                // Rounding of f32 dot products: relative to (Σ_t ‖a_t‖‖g_t‖)², which bounds
                // the sum of the absolute values of every pair's term.
                let scale: f64 = (offsets[b]..offsets[b + 1])
                    .map(|t| {
                        let na: f64 = a[t * d_in..(t + 1) * d_in].iter().map(|&x| f64::from(x).powi(2)).sum();
                        let ng: f64 = g[t * d_out..(t + 1) * d_out].iter().map(|&x| f64::from(x).powi(2)).sum();
                        (na * ng).sqrt()
                    })
                    .sum::<f64>()
                    .powi(2);
                prop_assert!(*s >= 0.0 && (s - w).abs() <= 1e-5 * scale + 1e-12, "{s} vs {w}");
            }
        }
    }

    #[test]
    fn ragged_cost_counts_the_pairs_and_the_products() {
        let (g, m) = ragged_cost(&[0, 1, 4], 8, 128);
        assert_eq!(g, (0.0 + 1.0 + 10.0) * 136.0);
        assert_eq!(m, 5.0 * 1024.0 + 9.0 * 1024.0);
        let (g, m) = ragged_cost(&[], 8, 8);
        assert_eq!((g, m), (0.0, 0.0));
    }

    #[test]
    fn records_without_rows_are_zero_and_non_finite_rows_show_in_the_norm() {
        let (d_in, d_out) = (3, 2);
        let offsets = [0, 0, 1, 2, 2];
        let a = [1.0, f32::NAN, 0.0, f32::INFINITY, 1.0, 1.0];
        let g = [1.0, 1.0, 1.0, 1.0];
        let mut grads = vec![7.0f32; 4 * 6];
        let mut sq = vec![7.0f64; 4];
        routed_linear_grads(&a, d_in, &g, d_out, &offsets, &mut grads, &mut sq, false).unwrap();
        assert!(grads[..6].iter().all(|&x| x == 0.0));
        assert!(grads[18..].iter().all(|&x| x == 0.0));
        assert_eq!(sq[0], 0.0);
        assert!(sq[1].is_nan());
        assert_eq!(sq[2], f64::INFINITY);
        assert_eq!(sq[3], 0.0);
        let mut ghost = vec![7.0f64; 4];
        routed_linear_sq_norms(&a, d_in, &g, d_out, &offsets, &mut ghost, false).unwrap();
        assert_eq!(ghost[0], 0.0);
        assert!(ghost[1].is_nan());
        assert_eq!(ghost[2], f64::INFINITY);
        assert_eq!(ghost[3], 0.0);
    }

    #[test]
    fn inconsistent_shapes_are_errors() {
        let a = [0.0f32; 6];
        let g = [0.0f32; 4];
        let mut grads = [0.0f32; 12];
        let mut sq = [0.0f64; 2];
        let run = |off: &[usize], grads: &mut [f32], sq: &mut [f64]| {
            routed_linear_grads(&a, 3, &g, 2, off, grads, sq, false)
        };
        assert!(run(&[0, 1, 2], &mut grads, &mut sq).is_ok());
        assert!(run(&[], &mut grads, &mut sq).is_err());
        assert!(run(&[1, 1, 2], &mut grads, &mut sq).is_err());
        assert!(run(&[0, 2, 1], &mut grads, &mut sq).is_err());
        assert!(run(&[0, 1, 3], &mut grads, &mut sq).is_err());
        assert!(run(&[0, 1, 2], &mut grads[..6], &mut sq).is_err());
        assert!(run(&[0, 1, 2], &mut grads, &mut sq[..1]).is_err());
        let ghost =
            |off: &[usize], sq: &mut [f64]| routed_linear_sq_norms(&a, 3, &g, 2, off, sq, false);
        assert!(ghost(&[0, 1, 2], &mut sq).is_ok());
        assert!(ghost(&[0, 2, 1], &mut sq).is_err());
        assert!(ghost(&[0, 1, 3], &mut sq).is_err());
        assert!(ghost(&[0, 1, 2], &mut sq[..1]).is_err());
    }
}
